"""Mends from a review of the central releases: OSPDPRR's lattice refuses bounds whose grid would
underflow, two-part budgets never exceed epsilon in exact arithmetic, OsdpRR's guarantee text
states the keep probability it prints, partition selection always counts privacy units, and the
bias of the raw values is stated as it is (unbiased sums and counts; ratios such as
central-variance biased at small n by O(noise variance / n^2), checked by Monte Carlo)."""
from __future__ import annotations

import inspect
import math
from fractions import Fraction

import numpy as np
import pytest

from ldp_beam.central.histogram import split_budget
from ldp_beam.central.osdprr import OsdpRR
from ldp_beam.central.ospdprr import OSPDPRR, OSPDPRREstimator
from ldp_beam.central.partition import PartitionSelection
from ldp_beam.core import Statistic
from ldp_beam.errors import ParameterError
from ldp_beam.registry import build_mechanism


# ----------------------------------------------------------------- 1. OSPDPRR's lattice underflow
@pytest.mark.parametrize("query,upper", [("variance", 1e-160), ("variance", 1e-80),
                                         ("sum", 1e-160), ("mean", 1e-200), ("cv", 1e-100)])
def test_ospdprr_refuses_bounds_whose_grid_underflows(query, upper):
    kw = {"mean_floor": 1e-300} if query == "cv" else {}
    lower = upper / 2 if query == "cv" else 0.0
    with pytest.raises(ParameterError, match="'lower, upper'") as err:
        OSPDPRR(t=0.8, query=query, lower=lower, upper=upper, **kw)
    assert err.value.name == "lower, upper"
    assert "at least 2^-" in err.value.valid  # the smallest allowed magnitude


def test_ospdprr_small_normal_bounds_still_release():
    up = 1e-3
    mech = OSPDPRR(t=0.8, query="variance", lower=0.0, upper=up)
    g = np.random.default_rng(7)
    n = 200
    data = {"value1": g.uniform(0.0, up, n),
            "level1": np.where(g.random(n) < 0.4, g.uniform(0.001, 1.0, n), 0.0),
            "importance1": g.random(n)}
    est = OSPDPRREstimator(mech, seed=1)
    e = est.finalize(est.add(est.create(), mech.records(data)))
    assert e["sample_sumsq"].value > 0 and e["sample_sumsq"].stderr > 0
    assert e["sample_sum"].stderr > 0
    # the smallest allowed bounds (2^-245.5 for the squares) are accepted
    OSPDPRR(t=0.8, query="variance", lower=0.0, upper=2.0 ** -245)
    OSPDPRR(t=0.8, query="count", lower=0.0, upper=1e-300)  # N only: no grid


# ------------------------------------------------------------------- 2. exact two-part budgets
def _within(epsilon, e1, e2):
    return Fraction(e1) + Fraction(e2) <= Fraction(epsilon) and e1 > 0 and e2 > 0


def test_split_budget_refuses_parts_above_epsilon_exactly():
    # 0.1 + 0.2 is 0.3000000000000000166... as doubles, above 0.29999999999999998889...
    with pytest.raises(ParameterError, match="'epsilon1'") as err:
        split_budget(0.3, 0.1, 0.2)
    assert "above epsilon" in str(err.value)
    assert split_budget(1.0, 0.4, 0.6) == (0.4, 0.6)  # exactly 1
    assert split_budget(1.0, 0.3, 0.7) == (0.3, 0.7)  # below 1, equal up to rounding
    with pytest.raises(ParameterError, match="'epsilon1'"):
        split_budget(1.0, 0.4, 0.4)  # far below: still refused


@pytest.mark.parametrize("epsilon,part", [(1.0, 0.1), (0.7, 0.1), (0.3, 0.05), (2.0, 0.45)])
def test_split_budget_rest_is_rounded_down(epsilon, part):
    # the rounded difference lands above the exact one for these values
    assert Fraction(part) + Fraction(epsilon - part) > Fraction(epsilon)
    for e1, e2 in (split_budget(epsilon, part, None), split_budget(epsilon, None, part)):
        assert _within(epsilon, e1, e2)
        assert math.isclose(e1 + e2, epsilon, rel_tol=1e-15)
    assert split_budget(epsilon, part, None)[0] == part


@pytest.mark.parametrize("epsilon", [0.1, 0.3, 0.7, 0.9])
def test_split_budget_default_fraction_stays_within_epsilon(epsilon):
    e1, e2 = split_budget(epsilon, None, None, 0.85)  # StructureFirst's default
    assert _within(epsilon, e1, e2) and e1 == epsilon * 0.85
    assert math.isclose(e1 + e2, epsilon, rel_tol=1e-15)


# ------------------------------------------------------------------- 3. OsdpRR's keep probability
def test_osdprr_guarantee_text_states_the_record_keep_probability():
    mech = OsdpRR(epsilon=0.6, lower=0.0, upper=1.0, max_rows_per_partition=2)
    q = mech.keep_probability
    assert q == pytest.approx(1 - math.exp(-0.3))
    notes = mech.guarantee.notes
    assert f"1 - e^-(eps/m) = 1 - e^-(eps/2) = {q:.4g}" in notes
    assert f"1 - e^-eps = {q:.4g}" not in notes
    one = OsdpRR(epsilon=0.6, lower=0.0, upper=1.0)
    assert f"1 - e^-eps = {one.keep_probability:.4g}" in one.guarantee.notes


# ------------------------------------------------------------------- 4. partition selection's unit
@pytest.mark.parametrize("l0", [1, 3])
def test_partition_selection_counts_privacy_units(l0):
    g = PartitionSelection(1.0, 1e-6, l0).guarantee
    assert g.params["unit"] == "privacy unit"


# ------------------------------------------------------------------- 5. what "raw" promises
def test_statistic_docstring_claims_unbiasedness_only_where_it_holds():
    doc = inspect.getdoc(Statistic)
    assert "raw unbiased value" not in doc
    assert "unbiased where it is linear in the noise" in doc
    assert "O(noise variance / n^2)" in doc


def _releases(mech, x, reps, seed):
    est = mech.estimator()
    cols, _ = mech.check(x)
    acc = est.add(est.create(), mech.prepare(cols, np.empty((x.size, 0))))
    g = np.random.default_rng(seed)
    return [mech.release_from(acc, g)[0] for _ in range(reps)]


def test_central_variance_bias_is_second_order_as_stated_and_sum_is_unbiased():
    """Monte Carlo (seeded): the raw variance's mean error matches the second-order bias
    ((a - 3 mu^2) Var N - Var S) / n^2 within 4 standard errors of the mean, and that bias is
    clearly not 0 (so "unbiased" would be false); the raw sum's mean error is within 4 SE of 0."""
    reps, n = 6000, 100
    x = np.random.default_rng(3).uniform(0.0, 1.0, n)
    mech = build_mechanism("central-variance", epsilon=1.0, lower=0.0, upper=1.0)
    released = _releases(mech, x, reps, 11)
    assert "biased at small n' by about ((a - 3 mu^2) Var N - Var S) / n'^2" in \
        released[0]["variance"].note  # the release states its bias
    vals = np.array([s["variance"].value for s in released])
    err = vals - x.var()
    sem = err.std(ddof=1) / math.sqrt(reps)
    d = x - mech.midpoint
    mu, a = d.mean(), (d * d).mean() - mech.square_shift
    bias = ((a - 3 * mu * mu) * mech.count_variance - mech.sum_lattice.noise_sd ** 2) / n ** 2
    assert abs(err.mean() - bias) < 4 * sem, (err.mean(), bias, sem)
    assert abs(bias) > 6 * sem and err.mean() < -4 * sem, (err.mean(), bias, sem)
    # the sum: linear in the noise, unbiased
    total = build_mechanism("central-sum", epsilon=1.0, lower=0.0, upper=1.0)
    sums = np.array([s["sum"].value for s in _releases(total, x, 2000, 12)])
    serr = sums - x.sum()
    assert abs(serr.mean()) < 4 * serr.std(ddof=1) / math.sqrt(sums.size)
