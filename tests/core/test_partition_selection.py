"""Per-key central releases (issue 14): contribution bounding, private partition selection by
discrete-Laplace thresholding, public keys, and the composed guarantee (ldp_beam.central.partition).

The stated delta is checked by exact computation: the probability that a key of a single unit is
released, summed from the discrete Laplace pmf in 60-digit arithmetic (mpmath), must be at most
the per-partition delta 1 - (1 - delta)^(1/L0), so that 1 - (1 - p1)^L0 <= delta; and the threshold
is the smallest that does it. Simulations use a fixed seed with tolerances from the binomial and
chi-square distributions (Bonferroni over the cells tested together); nothing is tuned to the
seed.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from ldp_beam import ParameterError
from ldp_beam.central.histogram import (HistogramReleaseEstimator, IdentityLaplace,
                                        release_source)
from ldp_beam.central.partition import (PartitionSelection, PublicPartitions,
                                        bound_contributions, distinct_unit_counts,
                                        per_key_guarantee, release_per_key, selection_source)
from ldp_beam.noise import discrete_laplace_pmf, discrete_laplace_scale
from ldp_beam.privacy import CENTRAL, PrivacyGuarantee, compose_dp, compose_epsilon_delta

SEED = 20250514
mpmath.mp.dps = 60


def exact_tail(T_minus_c: int, scale: Fraction) -> mpmath.mpf:
    """P(Z >= T - c) for Z discrete Laplace of ``scale``, summed term by term from the pmf
    (1-q)/(1+q) q^|z| in 60-digit arithmetic (the tail after 20000 terms is added in closed
    form; it is below q^20000)."""
    t = mpmath.mpf(scale.numerator) / scale.denominator
    q = mpmath.exp(-1 / t)
    c = (1 - q) / (1 + q)
    start = int(T_minus_c)
    terms = 20000
    s = mpmath.fsum(c * q ** abs(z) for z in range(start, start + terms))
    if start >= 0:
        s += c * q ** (start + terms) / (1 - q)
    else:
        s += c * q ** (start + terms) / (1 - q)  # start + terms > 0 here
    return s


CASES = [(eps, delta, l0) for eps in (0.1, 0.5, 1.0, 3.0) for delta in (1e-3, 1e-6, 1e-10)
         for l0 in (1, 4, 25)]


@pytest.mark.parametrize("eps, delta, l0", CASES)
def test_stated_delta_holds_exactly_and_the_threshold_is_the_smallest(eps, delta, l0):
    sel = PartitionSelection(eps, delta, l0)
    t = sel.scale
    assert t == discrete_laplace_scale(l0, eps) and l0 / t <= Fraction(eps)
    T = sel.threshold
    p1 = exact_tail(T - 1, t)  # a key whose only unit is the one removed
    dp = 1 - (1 - mpmath.mpf(delta)) ** (mpmath.mpf(1) / l0)
    assert p1 <= dp
    assert 1 - (1 - p1) ** l0 <= delta  # some of her <= L0 keys released
    assert float(p1) == pytest.approx(sel.single_unit_probability, rel=1e-9)
    assert sel.realized_delta <= delta
    if T > 1:  # one lower would not meet the per-partition delta (beyond the 1e-9 margin)
        assert exact_tail(T - 2, t) > dp * (1 - mpmath.mpf(1e-9))


def test_threshold_approaches_googles_continuous_laplace_threshold():
    """For large scales the discrete rule tends to 1 + (L0/eps) ln(1/(2 delta_p)) (Google's
    LaplacePartitionSelection): 1 + q -> 2 and the ceiling adds at most 1; ln(1 + q) =
    ln 2 - 1/(2t) + O(t^-2) adds about 1/2."""
    for eps, delta, l0 in [(0.1, 1e-6, 1), (1.0, 1e-8, 20), (0.5, 1e-5, 10)]:
        sel = PartitionSelection(eps, delta, l0)
        tau = 1 + (l0 / eps) * math.log(1 / (2 * sel.partition_delta))
        assert tau <= sel.threshold <= tau + 2, (sel.threshold, tau)


def test_keep_probabilities_from_the_pmf_and_by_simulation():
    sel = PartitionSelection(0.8, 1e-4, 2)
    T, t = sel.threshold, sel.scale
    z = np.arange(-4000, 4001)
    pmf = discrete_laplace_pmf(z, t)
    counts = np.arange(0, 2 * T + 10)
    for c in counts:  # P(c + Z >= T) summed from the pmf; keep + drop = 1 (each accurate)
        assert sel.keep_probability(c) == pytest.approx(pmf[z >= T - c].sum(), rel=1e-9,
                                                        abs=1e-300)
        assert sel.drop_probability(c) == pytest.approx(pmf[z < T - c].sum(), rel=1e-9,
                                                        abs=1e-300)
    # empirically: 20000 keys per count near the threshold
    g = np.random.default_rng(SEED)
    cs = np.arange(T - 8, T + 9)
    n = 20000
    kept = sel.select(np.repeat(cs, n), g).reshape(cs.size, n).sum(axis=1)
    p = sel.keep_probability(cs)
    z_crit = stats.norm.ppf(1 - 0.001 / (2 * cs.size))
    assert np.all(np.abs(kept - n * p) <= z_crit * np.sqrt(n * p * (1 - p)) + 1)


def test_epsilon_on_keys_present_with_and_without_the_unit():
    """Counts c vs c + 1 in each of the unit's L0 keys: per key the keep/drop log ratio is at
    most 1/t (exactly 1/t wherever both are away from 0 and 1), so L0/t <= eps in all."""
    for eps, l0 in [(1.0, 1), (0.3, 5), (2.0, 3)]:
        sel = PartitionSelection(eps, 1e-6, l0)
        t = float(sel.scale)
        worst = 0.0
        for c in range(0, 3 * sel.threshold):
            for a, b in ((sel.keep_probability(c + 1), sel.keep_probability(c)),
                         (sel.drop_probability(c), sel.drop_probability(c + 1))):
                worst = max(worst, abs(math.log(a / b)))
        assert worst == pytest.approx(1 / t, rel=1e-9)
        assert l0 * worst <= eps * (1 + 1e-12)
        assert sel.realized_epsilon == pytest.approx(l0 / t) and sel.realized_epsilon <= eps


def test_selection_noise_is_os_entropy_by_default_and_addressed_per_key_when_seeded():
    sel = PartitionSelection(0.1, 1e-6, 1)
    counts = np.full(400, sel.threshold)  # each kept with probability 1/(1+q) ~ 1/2
    a, b = sel.select(counts), sel.select(counts)
    assert not np.array_equal(a, b)  # fresh noise (P(equal) = about 2^-400)
    keep = [sel.keep(sel.threshold, selection_source(7, f"k{i}")) for i in range(200)]
    again = [sel.keep(sel.threshold, selection_source(7, f"k{i}")) for i in range(200)]
    assert keep == again and 40 < sum(keep) < 160  # reproducible per key, not shared
    assert selection_source(None, "k") is None


def test_bad_parameters_name_the_parameter():
    for kw, name in [(dict(epsilon=0.0, delta=1e-5), "epsilon"),
                     (dict(epsilon=1.0, delta=0.0), "delta"),
                     (dict(epsilon=1.0, delta=1.0), "delta"),
                     (dict(epsilon=1.0, delta=float("nan")), "delta"),
                     (dict(epsilon=1.0, delta=1e-5, max_partitions_per_unit=0),
                      "max_partitions_per_unit"),
                     (dict(epsilon=1.0, delta=1e-5, max_partitions_per_unit=2.0),
                      "max_partitions_per_unit"),
                     (dict(epsilon=1.0, delta=1e-5, max_partitions_per_unit=True),
                      "max_partitions_per_unit"),
                     (dict(epsilon=1.0, delta=1e-5, max_partitions_per_unit=10 ** 6 + 1),
                      "max_partitions_per_unit")]:
        with pytest.raises(ParameterError) as e:
            PartitionSelection(**kw)
        assert e.value.name == name and ("integer" in e.value.valid or name != kw.get("x"))
    sel = PartitionSelection(1.0, 1e-5)
    for bad in (np.array([-1, 2]), np.array([1.5]), np.array([[1]])):
        with pytest.raises(ParameterError, match="counts"):
            sel.select(bad)


# --------------------------------------------------------------------------- bounding
def test_bounding_enforces_both_bounds_and_leaves_small_units_alone():
    g = np.random.default_rng(SEED)
    n = 5000
    units = g.integers(0, 300, n)
    parts = g.integers(0, 12, n)
    for l0, linf in [(1, 1), (2, 3), (5, 1), (12, 1000)]:
        keep = bound_contributions(units, parts, l0, linf, g)
        for u in range(300):
            mine = keep & (units == u)
            kp, per = np.unique(parts[mine], return_counts=True)
            assert kp.size <= l0 and (per.size == 0 or per.max() <= linf)
            allp = np.unique(parts[units == u])
            # as many partitions as allowed are kept, each with as many rows as allowed
            assert kp.size == min(l0, allp.size)
            for p_ in kp:
                assert per[kp == p_][0] == min(linf, int(((units == u) & (parts == p_)).sum()))
    assert bound_contributions(units, parts, 12, 1000, g).all()  # within bounds: all kept


def test_bounding_chooses_partitions_and_rows_uniformly():
    """One unit with rows in 4 partitions (1, 2, 3, 4 rows), L0 = 1: each partition is kept
    with probability 1/4 whatever its rows; Linf = 1 inside: each of its rows with 1/rows."""
    g = np.random.default_rng(SEED)
    parts = np.repeat(np.arange(4), [1, 2, 3, 4])
    units = np.zeros(parts.size, dtype=int)
    reps = 8000
    chosen = np.empty(reps, dtype=int)
    row = np.empty(reps, dtype=int)
    for r in range(reps):
        keep = bound_contributions(units, parts, 1, 1, g)
        (i,) = np.flatnonzero(keep)
        chosen[r], row[r] = parts[i], i
    obs = np.bincount(chosen, minlength=4)
    assert stats.chisquare(obs).pvalue > 0.001
    in3 = row[chosen == 3]  # partition 3's rows 6..9
    assert stats.chisquare(np.bincount(in3 - 6, minlength=4)).pvalue > 0.001


def test_bounding_with_public_keys_drops_other_rows_before_bounding():
    units = np.array([1, 1, 1, 2])
    parts = np.array(["secret", "a", "b", "secret"])
    keep = bound_contributions(units, parts, 1, 1, np.random.default_rng(1), keys=("a", "b"))
    assert not keep[0] and not keep[3] and keep[1] + keep[2] == 1  # L0 not spent on "secret"
    with pytest.raises(ParameterError, match="keys"):
        bound_contributions(units, None, 1, 1, keys=("a",))
    with pytest.raises(ParameterError, match="max_rows_per_partition"):
        bound_contributions(units, parts, 1, 0)


def test_distinct_unit_counts():
    units = np.array(["u", "u", "v", "w", "w", "w"])
    parts = np.array([1, 1, 1, 2, 1, 2])
    keys, counts = distinct_unit_counts(units, parts)
    assert keys.tolist() == [1, 2] and counts.tolist() == [3, 1]


# --------------------------------------------------------------------------- public keys
def test_public_partitions_validation_and_cost():
    for bad in ((), ("a", "a"), ([1], [2])):
        with pytest.raises(ParameterError, match="keys"):
            PublicPartitions(bad)
    pub = PublicPartitions(["a", "b", "c"])
    assert pub.keys == ("a", "b", "c") and pub.absent(["b", "zz"]) == ("a", "c")
    assert pub.mask(np.array(["a", "zz", "c"])).tolist() == [True, False, True]
    g = pub.guarantee
    assert g.kind == CENTRAL and g.epsilon == 0.0 and g.delta == 0.0


def test_per_key_release_with_public_keys():
    """Listed keys without rows are released as noisy empty histograms (with their own noise),
    unlisted keys are not released, and equal counts under two keys get different noise."""
    mech = IdentityLaplace(epsilon=0.5, bins=6, lower=0, upper=1, max_partitions_per_unit=2,
                           max_rows_per_partition=3)
    est = HistogramReleaseEstimator(mech, seed=11)
    same = np.array([3, 0, 1, 2, 0, 5])
    accs = {"a": same, "b": same.copy(), "hidden": np.array([9, 9, 9, 9, 9, 9])}
    out = release_per_key(est, accs, PublicPartitions(("a", "b", "absent1", "absent2")))
    assert out.selected == ("a", "b", "absent1", "absent2") and "hidden" not in out.estimates
    ha, hb = out.estimates["a"]["histogram"].value, out.estimates["b"]["histogram"].value
    assert not np.array_equal(ha, hb)  # the key is part of the noise's address
    e1, e2 = out.estimates["absent1"]["histogram"].value, out.estimates["absent2"][
        "histogram"].value
    assert not np.array_equal(e1, e2)
    zeros = np.zeros(6, dtype=np.int64)
    ref = mech.release_counts(zeros, release_source(11, zeros, "absent1"))["histogram"]
    np.testing.assert_array_equal(e1, ref.value)
    # empty releases are noise of scale m/eps = 12: their spread over many keys matches it
    keys = [f"k{i}" for i in range(300)]
    many = release_per_key(est, {}, PublicPartitions(keys))
    vals = np.concatenate([many.estimates[k]["histogram"].value for k in keys])
    var = ref.stderr[0] ** 2
    # the sample variance of 1800 draws: its SE is sqrt((k4 + 2 var^2) / n) (k4 = 12 t^4 at most)
    se = math.sqrt((12 * float(mech.scale) ** 4 + 2 * var ** 2) / vals.size)
    assert abs(vals.var() - var) <= 4 * se and abs(vals.mean()) <= 4 * math.sqrt(var / vals.size)
    g = out.guarantee
    assert g.kind == CENTRAL and g.epsilon == 0.5 and g.delta == 0.0
    assert g.params["accounting"] == "exact sum (pure epsilon)"
    assert g.params["contribution_bounds"] == {"max_partitions_per_unit": 2,
                                               "max_rows_per_partition": 3}


def test_per_key_release_with_private_selection():
    mech = IdentityLaplace(epsilon=0.9, bins=3, lower=0, upper=1, max_partitions_per_unit=2)
    est = HistogramReleaseEstimator(mech, seed=5)
    sel = PartitionSelection(0.4, 1e-6, 2)
    n = 3000
    accs = {f"single{i}": np.array([1, 0, 0]) for i in range(n)}
    accs["big"] = np.array([500, 300, 200])
    counts = {k: 1 for k in accs}
    counts["big"] = 1000
    out = release_per_key(est, accs, sel, counts)
    assert "big" in out.selected
    # keys of one unit: kept with probability p1 <= delta_p (about 5e-7): none of 3000 expected
    assert sum(k.startswith("single") for k in out.selected) <= stats.binom.ppf(
        0.999, n, sel.single_unit_probability)
    g = out.guarantee
    # (0.4 + 0.9, 1e-6) by dp_accounting's PLD composition (exact here, no slack)
    assert g.delta == 1e-6 and g.epsilon == pytest.approx(1.3, abs=1e-9)
    assert "dp_accounting" in g.params["accounting"]
    assert g.params["selection"]["threshold"] == sel.threshold
    assert g.params["partitions_per_unit"] == 2
    with pytest.raises(ParameterError, match="unit_counts"):
        release_per_key(est, accs, sel)
    with pytest.raises(ParameterError, match="max_partitions_per_unit"):
        release_per_key(est, accs, PartitionSelection(0.4, 1e-6, 1), counts)


def test_composition_uses_dp_accounting_with_delta_and_exact_sums_without():
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    pure = [PrivacyGuarantee(CENTRAL, e) for e in (0.1, 0.2, 0.3)]
    assert compose_dp(pure).epsilon == 0.1 + 0.2 + 0.3 and compose_dp(pure).delta == 0.0
    # fifty (0.1, 1e-7) releases judged at delta = 1e-4 > 5e-6: the PLD (optimal composition
    # of the worst-case pairs; advanced composition alone gives about 3.6) is well below basic
    # composition's 5
    parts = [PrivacyGuarantee(CENTRAL, 0.1, 1e-7)] * 50
    got = compose_dp(parts, delta=1e-4)
    # the same discretization (eps_sum / 20000), composed by self_compose rather than one by
    # one: equal up to the FFT's floating-point rounding
    direct = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(0.1, 1e-7),
                                         value_discretization_interval=5.0 / 20000
                                         ).self_compose(50)
    assert got.epsilon == pytest.approx(direct.get_epsilon_for_delta(1e-4), abs=1e-9)
    assert got.epsilon < 4.0 and got.delta == 1e-4
    eps, how = compose_epsilon_delta([(0.5, 1e-6), (1.0, 0.0)], 1e-6)
    assert eps == pytest.approx(1.5, abs=1e-9) and "dp_accounting" in how
    # per_key_guarantee refuses a non-central release and states the selection's L0
    with pytest.raises(ParameterError, match="release"):
        per_key_guarantee(PrivacyGuarantee(CENTRAL, 1.0))
