"""Guarantees per privacy unit (issue 14, central side): contribution bounds on every central
release, sensitivities scaled to them, per-unit statements, and audits of a person with 50 rows.

Exact where the mechanism allows it: LPA's privacy loss between two datasets is computed from the
discrete Laplace pmf (the noise is exact, so this is the loss of the code as run), OSPDPRR's and
OsdpRR's from their output distributions (mixtures over the sampled rows, summed exactly on the
integer lattice). DPHR's grouping has no closed form: it gets a Monte Carlo audit with
Clopper-Pearson bounds at a fixed seed. The defaults reproduce the releases made before this
change bit for bit (digests recorded from the code before it).
"""
from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from scipy.special import logsumexp

from ldp_beam import ParameterError
from ldp_beam import audit as A
from ldp_beam.central.dphr import DPHR
from ldp_beam.central.histogram import (HistogramReleaseEstimator, IdentityLaplace,
                                        count_noise_variance)
from ldp_beam.central.histogram_baselines import AHP, StructureFirst
from ldp_beam.central.osdprr import OsdpRR, OsdpRREstimator
from ldp_beam.central.ospdprr import (OSPDPRR, OSPDPRREstimator, noise_scales, personal_epsilon,
                                      statistic_lattice, unit_personal_epsilon)
from ldp_beam.central.partition import bound_contributions
from ldp_beam.reproduce import audit_recipe as R
from ldp_beam.noise import discrete_laplace_pmf, discrete_laplace_scale, discrete_laplace_variance
from ldp_beam.privacy import (CENTRAL, LDP, NONE, PER_RECORD_TEXT, ContributionBounds,
                              PrivacyGuarantee, per_unit)
from ldp_beam.registry import build_mechanism
from ldp_beam.rng import RandomSource
from ldp_beam_test_helpers import ScriptedNoise

SEED = 20250514
BASE = np.array([12, 3, 0, 7, 7, 1, 20, 4])
ROWS = 50


def person_dataset(rows_in=(0,) * ROWS):
    """Rows of single-row units with the counts BASE, plus one person (unit -1) whose rows are
    in the buckets ``rows_in``: (buckets, units)."""
    buckets = np.concatenate([np.repeat(np.arange(BASE.size), BASE), np.asarray(rows_in)])
    units = np.concatenate([np.arange(BASE.sum()), np.full(len(rows_in), -1)])
    return buckets, units


def bounded_counts(buckets, units, l0, linf, gen):
    keep = bound_contributions(units, None, l0, linf, gen)
    return np.bincount(buckets[keep], minlength=BASE.size)


def pmf_loss(shift, scale):
    """The LPA privacy loss between counts c + shift and c, from the pmf directly: for each bucket
    the largest |log P(z - d) / P(z)| over a wide window of outputs, summed over the independent
    buckets (a check of ldp_beam.audit.discrete_laplace_shift_epsilon that does not share its
    code)."""
    z = np.arange(-400, 401)
    total = 0.0
    for d in np.asarray(shift).ravel():
        if d:
            total += float(np.max(np.abs(np.log(discrete_laplace_pmf(z - d, scale))
                                         - np.log(discrete_laplace_pmf(z, scale)))))
    return total


# --------------------------------------------------------------------------- the issue's test
def test_a_person_with_50_rows_bounded_gets_the_stated_epsilon_not_50x():
    eps = 1.0
    mech = IdentityLaplace(epsilon=eps)  # L0 = Linf = 1: one row per unit
    g = np.random.default_rng(SEED)
    buckets, units = person_dataset()
    with_p = bounded_counts(buckets, units, 1, 1, g)
    shift = with_p - BASE
    assert shift.tolist() == [1, 0, 0, 0, 0, 0, 0, 0]  # one of her 50 rows survives
    stated = per_unit(mech.guarantee, "person", mech.contribution_bounds)
    exact = pmf_loss(shift, mech.scale)
    assert exact == pytest.approx(A.discrete_laplace_shift_epsilon(shift, mech.scale), abs=1e-12)
    assert exact == pytest.approx(mech.realized_epsilon, abs=1e-12)
    assert exact <= stated.epsilon + 1e-12 and stated.epsilon == eps
    assert stated.params["unit"] == "person"
    # without bounding, the same 50 rows: the exact loss is 50 times the per-record epsilon
    unbounded = np.bincount(buckets, minlength=BASE.size) - BASE
    assert pmf_loss(unbounded, mech.scale) == pytest.approx(50 * mech.realized_epsilon, rel=1e-9)
    assert 50 * mech.realized_epsilon >= 50 * eps * (1 - eps * 2 ** -20)


def test_a_person_spread_over_buckets_stays_within_the_bound_whatever_rows_are_kept():
    """Her 50 rows over 5 buckets, Linf = 3: whichever 3 rows the bounding keeps, the shift has
    L1 = 3 and the loss is 3/t <= eps (noise calibrated to m = 3)."""
    mech = IdentityLaplace(epsilon=0.7, max_rows_per_partition=3)
    assert mech.scale == discrete_laplace_scale(3, 0.7)
    buckets, units = person_dataset(np.repeat([0, 2, 3, 5, 7], 10))
    g = np.random.default_rng(SEED)
    for _ in range(200):
        shift = bounded_counts(buckets, units, 1, 3, g) - BASE
        assert np.abs(shift).sum() == 3
        assert A.discrete_laplace_shift_epsilon(shift, mech.scale) <= 0.7 + 1e-12
    full = np.bincount(buckets, minlength=BASE.size) - BASE
    assert A.discrete_laplace_shift_epsilon(full, mech.scale) == pytest.approx(
        50 / 3 * mech.realized_epsilon, rel=1e-9)


def test_per_key_lpa_is_calibrated_to_the_units_total_over_keys():
    """L0 = 2 keys x Linf = 3 rows: every key's histogram gets noise of sensitivity 6, so the
    person's 6 kept rows over her 2 keys cost 6/t <= eps in all."""
    mech = IdentityLaplace(epsilon=0.5, max_partitions_per_unit=2, max_rows_per_partition=3)
    g = np.random.default_rng(SEED)
    keys = np.repeat(["x", "y", "z"], [20, 20, 10])
    units = np.full(50, -1)
    for _ in range(100):
        keep = bound_contributions(units, keys, 2, 3, g)
        per_key = [int((keep & (keys == k)).sum()) for k in "xyz"]
        assert sorted(per_key) == [0, 3, 3]
        assert A.discrete_laplace_shift_epsilon(per_key, mech.scale) <= 0.5 + 1e-12
    assert mech.realized_epsilon == pytest.approx(6 / float(mech.scale))


def test_dphr_person_level_monte_carlo(monkeypatch):
    """DPHR (sound), bounded to L0 = Linf = 1: the Clopper-Pearson lower bound (confidence 0.99)
    stays below the stated epsilon; the same 50 rows unbounded give a bound far above it (> 4 eps;
    with 1500 evaluation releases a side no bound can exceed about ln(1500 / 5.3) = 5.6, and the
    two output distributions barely overlap)."""
    monkeypatch.setattr(R, "ALPHA", 0.01)
    mech = DPHR(epsilon=1.0)
    g = np.random.default_rng(SEED)
    _, res, _ = R._person_hist(mech, 3000, g, bounded=True)
    assert res["epsilon_lower"] <= 1.0
    _, res_u, _ = R._person_hist(mech, 3000, g, bounded=False)
    assert res_u["epsilon_lower"] > 4.0


# --------------------------------------------------------------------------- the scaling
def test_every_histogram_release_scales_its_noise_to_the_unit(monkeypatch):
    """With L0 = 2, Linf = 3 (m = 6) every Laplace draw of every histogram family has integer
    sensitivity 6 at the unchanged budgets; the planning parameters use eps / 6."""
    h = np.random.default_rng(3).integers(0, 30, 20)
    b = dict(max_partitions_per_unit=2, max_rows_per_partition=3)
    for mech in (IdentityLaplace(epsilon=0.8, **b), DPHR(epsilon=0.8, **b),
                 DPHR(epsilon=0.8, variant="paper", **b), AHP(epsilon=0.8, **b),
                 StructureFirst(epsilon=0.8, k=3, F=40.0, **b)):
        noise = ScriptedNoise(monkeypatch)
        mech.release_counts(h, np.random.default_rng(1))
        assert noise.calls and all(s == 6 for s, _, _ in noise.calls), (mech.name, noise.calls)
        assert mech.unit_sensitivity == 6
        assert mech.guarantee.epsilon == 0.8 or mech.guarantee.kind == NONE  # paper variant
        assert mech.guarantee.params["unit_sensitivity"] == 6
        assert "per privacy unit (at most 2 partitions x 3 rows each)" in mech.guarantee.notes
        se = mech.release_counts(h, np.random.default_rng(2))["histogram"].stderr
        assert se is not None and np.all(np.asarray(se) ** 2 > 0)
    # DPHR's grouping plans with the noise its group means get: eps2 / 6
    from ldp_beam.central import dphr as D

    seen = []
    real = D.optimal_grouping
    monkeypatch.setattr(D, "optimal_grouping", lambda v, e: seen.append(e) or real(v, e))
    DPHR(epsilon=0.8, **b).release_counts(h, np.random.default_rng(1))
    assert seen == [pytest.approx(0.4 / 6)]
    # StructureFirst's score sensitivity: 6 (2F + 1)
    from ldp_beam.central import histogram_baselines as HB

    sens = []
    real_em = HB.exponential_mechanism
    monkeypatch.setattr(HB, "exponential_mechanism",
                        lambda s, e, d, g: sens.append(d) or real_em(s, e, d, g))
    StructureFirst(epsilon=0.8, k=3, F=40.0, **b).release_counts(h, np.random.default_rng(1))
    assert sens and all(d == 6 * 81.0 for d in sens)


def test_scaled_lpa_noise_has_the_calibrated_variance():
    mech = IdentityLaplace(epsilon=1.0, max_rows_per_partition=4)
    zeros = np.zeros(200_000, dtype=np.int64)
    z = mech.release_counts(zeros, np.random.default_rng(SEED))["histogram"].value
    var = count_noise_variance(1.0, 4)
    assert var == discrete_laplace_variance(discrete_laplace_scale(4, 1.0))
    # Var of the sample variance ~ (k4 + 2 var^2) / n, with k4 <= 12 t^4 (continuous Laplace)
    se = math.sqrt((12 * 4.0 ** 4 + 2 * var ** 2) / zeros.size)
    assert abs(z.var() - var) <= 4 * se and var > 2 * 4.0 ** 2 * 0.99


def test_ospdprr_scales_every_sensitivity_and_states_the_unit_bound():
    b = dict(max_partitions_per_unit=2, max_rows_per_partition=3)
    mech = OSPDPRR(t=0.6, query="cv", k=2, lower=1.0, upper=5.0, **b)
    base = OSPDPRR(t=0.6, query="cv", k=2, lower=1.0, upper=5.0)
    assert mech.noise_scales() == pytest.approx({s: 6 * v for s, v in base.noise_scales().items()})
    assert noise_scales("sum", 2, 0, 1, 0.5, 6) == {"S": pytest.approx(24.0)}
    for s, (grid, sens) in statistic_lattice("cv", 2, 1.0, 5.0, 6).items():
        assert sens == 6 * statistic_lattice("cv", 2, 1.0, 5.0)[s][1]
    g = mech.guarantee
    assert g.kind == CENTRAL and g.epsilon == 0.6 and g.params["unit_epsilon"] == 0.6
    assert "t-DP per privacy unit" in g.notes and g.params["unit_sensitivity"] == 6
    pi = np.array([0.2, 1.0, 0.7, 1.0, 0.0, 0.5])
    assert unit_personal_epsilon(pi, 0.6, 6) <= 0.6 + 1e-12
    assert unit_personal_epsilon(np.ones(6), 0.6, 6) == pytest.approx(0.6)
    np.testing.assert_allclose(personal_epsilon(pi, 0.6), np.log1p(pi * math.expm1(0.6)))
    with pytest.raises(ParameterError, match="pi_rows"):
        unit_personal_epsilon(np.ones(7), 0.6, 6)


def _count_log_pmf(y, base, pis, scale):
    """log P(N = y) for N = base + (number of rows sampled) + discrete Laplace noise: a mixture
    over how many of the person's rows are sampled (independent, probabilities ``pis``)."""
    dist = np.array([1.0])
    for p in pis:  # Poisson-binomial by convolution
        dist = np.convolve(dist, [1 - p, p])
    terms = [np.log(w) + np.log(discrete_laplace_pmf(y - base - j, scale))
             for j, w in enumerate(dist) if w > 0]
    return logsumexp(np.stack(terms), axis=0)


@pytest.mark.parametrize("t", [0.5, 1.0])
def test_ospdprr_person_exact_loss_bounded_vs_unbounded(t):
    """query='count', k = 1: a person with 50 rows (weights giving pi = 0.6, 1, ...) among 5
    users; Linf = 3. Bounded (3 rows kept) the exact log ratio of the output pmfs (mixture over
    her sampled rows, on the integer lattice) is at most sum ln(1 + pi (e^(t/3) - 1)) <= t; all
    50 rows unbounded exceed t many times."""
    mech = OSPDPRR(t=t, query="count", lower=0.0, upper=1.0, max_rows_per_partition=3)
    (scale_n,) = [discrete_laplace_scale(sens, t)
                  for _, sens in statistic_lattice("count", 1, 0.0, 1.0, 3).values()]
    w = np.array([[0.0], [0.3], [0.9], [0.1], [0.0]])  # the others (sampled independently of her)
    _, _, pi_others = mech.sampling(w)
    w_person = np.linspace(0.0, 0.6, ROWS)[:, None]
    _, _, pi_person = mech.sampling(w_person)  # sound-self: each row's pi is its own
    y = np.arange(-300, 400)
    without = _count_log_pmf(y, 0, pi_others, scale_n)
    g = np.random.default_rng(SEED)
    keep = bound_contributions(np.full(ROWS, -1), None, 1, 3, g)
    kept = pi_person[keep]
    assert kept.size == 3
    with_b = _count_log_pmf(y, 0, np.concatenate([pi_others, kept]), scale_n)
    loss = np.max(np.abs(with_b - without))
    bound = unit_personal_epsilon(kept, t, 3)
    assert loss <= bound + 1e-9 and bound <= t + 1e-12
    with_all = _count_log_pmf(y, 0, np.concatenate([pi_others, pi_person]), scale_n)
    assert np.max(np.abs(with_all - without)) > 5 * t


def test_osdp_rr_person_exact_exclusion_ratio(monkeypatch):
    """OsdpRR at Linf = 2: each record kept with probability 1 - e^(-eps/2). A person's 2 kept
    rows sensitive (never released) vs non-sensitive: the probability that none of hers is
    released is 1 vs e^(-eps): ratio exactly e^eps. All 50 unbounded: e^(25 eps)."""
    eps = 0.8
    mech = OsdpRR(epsilon=eps, query="count", lower=0.0, upper=1.0, max_rows_per_partition=2)
    q = mech.keep_probability
    assert q == pytest.approx(-math.expm1(-eps / 2))
    assert math.log(1 / (1 - q) ** 2) == pytest.approx(eps)
    assert math.log(1 / (1 - q) ** ROWS) == pytest.approx(25 * eps)
    g = mech.guarantee
    assert g.epsilon == eps and g.params["unit_epsilon"] == eps
    assert g.params["record_epsilon"] == pytest.approx(eps / 2)
    assert OsdpRR(epsilon=eps, k=3, lower=0.0, upper=1.0).guarantee.params["unit_epsilon"] == \
        pytest.approx(3 * eps)
    # Monte Carlo on the released count (one-sided direction), Clopper-Pearson at 0.01
    monkeypatch.setattr(R, "ALPHA", 0.01)
    _, res, _ = R._person_osdp(mech, 4000, np.random.default_rng(SEED))
    assert res["epsilon_lower"] <= eps


# --------------------------------------------------------------------------- defaults
#: sha256 digests of seeded releases made by the code *before* issue 14 (histogram families:
#: the published arrays; OSPDPRR/OsdpRR: every statistic's value, stderr and clipped value)
GOLDEN = {
    "ahp": "fab3c0d1a9828419", "ahp/var": "cc2779e759484f1d",
    "dphr": "cf14e4d63c8042e2", "dphr/var": "de2adc2cade7beaf",
    "dphr-paper": "f8b7064d87c0ee52", "dphr-paper/var": "6c97b933aa992b35",
    "lpa": "7afea31cadb67a48", "lpa/var": "ee371e9fccbacf6d",
    "sf": "683e40d7324f2d73", "sf/var": "00ffbaca9ee09b69",
}


def _digest(obj):
    h = hashlib.sha256()
    for k in sorted(obj):
        v = obj[k]
        if isinstance(v, np.ndarray):
            h.update(k.encode())
            h.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, (int, float, str, tuple)):
            h.update(k.encode())
            h.update(repr(v).encode())
    return h.hexdigest()[:16]


def _stats_digest(rel):
    text = json.dumps({k: [s.value, s.stderr, s.clipped] for k, s in rel.statistics.items()},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: the OSPDPRR/OsdpRR digests (of the JSON of their statistics) before issue 14
GOLDEN_STATS = {
    "osdp/count": "2a486788fcde0299", "osdp/mean": "c6aeea3a788e9066",
    "osdp/sum": "e1dc6d908b1cf97c",
    "osp/paper/count": "6b8ec5c572aa3d1a", "osp/paper/cv": "9cdb923e209e528f",
    "osp/paper/mean": "c6185a0a4ea09b5f", "osp/paper/sum": "a6df3602d223e05e",
    "osp/paper/variance": "e81e858f99c9555f",
    "osp/sound-public/count": "9abf877675fb6c24", "osp/sound-public/cv": "a2c12d50fe9b1331",
    "osp/sound-public/mean": "d95a485c3d563555", "osp/sound-public/sum": "b235725eb1d8eec8",
    "osp/sound-public/variance": "a2b6034ecd6410c5",
    "osp/sound-self/count": "4d5a0365f4cd612f", "osp/sound-self/cv": "af252587d41dab1c",
    "osp/sound-self/mean": "1a540d2afa1b1ff9", "osp/sound-self/sum": "0b36dbe672f0158c",
    "osp/sound-self/variance": "8efb261ea33af078",
}


def test_defaults_reproduce_the_releases_before_issue_14_bit_for_bit():
    g = np.random.default_rng(7)
    counts = g.integers(0, 30, 40)
    mechs = {"lpa": IdentityLaplace(epsilon=0.7), "dphr": DPHR(epsilon=0.9),
             "dphr-paper": DPHR(epsilon=0.9, variant="paper"), "ahp": AHP(epsilon=0.5),
             "sf": StructureFirst(epsilon=0.8, k=4, F=40.0)}
    for name, m in mechs.items():
        for explicit in (False, True):
            if explicit:  # (1, 1) given explicitly is the same release
                m = type(m)(**{**m.params(), "max_partitions_per_unit": 1,
                               "max_rows_per_partition": 1})
            # the algorithm's raw arrays (dtypes and budget tuple included), bit for bit
            raw = m._publish(counts, RandomSource(f"golden/{name}"))
            var = np.asarray(m._noise_variance(raw))
            # (LPA's raw dict now carries its noise_var, which noise_variance() used to compute
            # apart: the "/var" digest checks it)
            old = {k: v for k, v in raw.items() if not (name == "lpa" and k == "noise_var")}
            assert _digest(old) == GOLDEN[name], name
            assert _digest({"v": var}) == GOLDEN[name + "/var"]
            # ... and the public release is exactly them (stderr: the noise's, sqrt(var))
            rel = m.release_counts(counts, RandomSource(f"golden/{name}"))
            np.testing.assert_array_equal(rel["histogram"].value, raw["histogram"])
            np.testing.assert_array_equal(rel["histogram"].stderr, np.sqrt(var))
            for k, v in raw.items():
                if k not in ("histogram", "noise_var"):
                    np.testing.assert_array_equal(rel[k].value, v)
    vals = g.uniform(0, 1, (200, 2))
    w = g.uniform(0, 1, (200, 3))
    w[:50] = 0
    got = {}
    for mode in ("sound-self", "sound-public", "paper"):
        for q in ("sum", "mean", "cv", "count", "variance"):
            kw = dict(mean_floor=0.1) if q == "cv" else {}
            m = OSPDPRR(t=0.7, query=q, k=3, target=(1, 3), lower=0.0, upper=1.0, mode=mode, **kw)
            got[f"osp/{mode}/{q}"] = _stats_digest(
                m.release(vals, w, RandomSource(f"golden/{mode}/{q}")))
    sens = (w[:, :2] > 0.5).astype(int)
    for q in ("sum", "mean", "count"):
        m = OsdpRR(epsilon=0.6, query=q, k=2, lower=0.0, upper=1.0)
        got[f"osdp/{q}"] = _stats_digest(m.release(vals, sens, RandomSource(f"golden/osdp/{q}")))
    assert got == GOLDEN_STATS


# --------------------------------------------------------------------------- statements
def test_per_unit_statements_central():
    mech = IdentityLaplace(epsilon=1.0, max_partitions_per_unit=2, max_rows_per_partition=3)
    g = mech.guarantee
    assert g.params["contribution_bounds"] == {"max_partitions_per_unit": 2,
                                               "max_rows_per_partition": 3}
    assert g.params["unit"] == "privacy unit"
    u = per_unit(g, "user_id", ContributionBounds(2, 3))
    assert u.epsilon == 1.0 and u.params["unit"] == "user_id"
    assert "Per privacy unit 'user_id' (at most 2 partitions x 3 rows each" in u.notes
    assert per_unit(g, "user_id", (3, 2)).epsilon == 1.0  # same L1: covered
    with pytest.raises(ParameterError, match="bounds"):
        per_unit(g, "user_id", ContributionBounds(2, 4))  # more than the noise covers
    with pytest.raises(ParameterError, match="bounds"):
        per_unit(g, "user_id")
    r = per_unit(IdentityLaplace(epsilon=1.0).guarantee, None)
    assert r.params["unit"] == "record" and PER_RECORD_TEXT in r.notes
    assert "per record only" in IdentityLaplace(epsilon=1.0).guarantee.notes
    # OsdpRR with 3 target items: 3 eps per unit
    o = per_unit(OsdpRR(epsilon=0.5, k=3, lower=0.0, upper=1.0).guarantee, "uid", (1, 1))
    assert o.epsilon == pytest.approx(1.5)
    # no guarantee stays none
    n = per_unit(DPHR(epsilon=1.0, variant="paper").guarantee, "uid", (1, 1))
    assert n.kind == NONE and math.isinf(n.epsilon)


def test_per_unit_statements_ldp():
    grr = build_mechanism("grr", epsilon=0.5, domain=("a", "b", "c"))
    u = per_unit(grr.guarantee, "device", 4)
    assert u.kind == LDP and u.epsilon == 2.0 and u.params["reports_per_unit"] == 4
    assert u.params["accounting"] == "exact sum (pure epsilon)"
    g = PrivacyGuarantee(LDP, 0.3, 1e-7)
    d = per_unit(g, "device", 20)
    assert d.delta == pytest.approx(2e-6) and d.epsilon <= 20 * 0.3 + 1e-12
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    direct = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(0.3, 1e-7),
                                         value_discretization_interval=1e-4).self_compose(20)
    assert d.epsilon == pytest.approx(min(6.0, direct.get_epsilon_for_delta(2e-6)), abs=1e-9)
    assert "dp_accounting" in d.params["accounting"]
    many = per_unit(PrivacyGuarantee(LDP, 0.05, 1e-9), "device", 400)  # many small reports:
    assert many.epsilon < 0.8 * 400 * 0.05  # the accountant's composition beats the sum
    with pytest.raises(ParameterError, match="bounds"):
        per_unit(grr.guarantee, "device")
    with pytest.raises(ParameterError, match="reports_per_unit"):
        per_unit(grr.guarantee, "device", 0)
    assert per_unit(grr.guarantee, None).epsilon == 0.5


def test_bounds_are_validated_with_the_parameter_named():
    ctors = [lambda **b: IdentityLaplace(epsilon=1.0, **b), lambda **b: DPHR(epsilon=1.0, **b),
             lambda **b: AHP(epsilon=1.0, **b),
             lambda **b: StructureFirst(epsilon=1.0, k=2, F=5.0, **b),
             lambda **b: OSPDPRR(t=0.5, lower=0.0, upper=1.0, **b),
             lambda **b: OsdpRR(epsilon=0.5, lower=0.0, upper=1.0, **b)]
    for make in ctors:
        for name in ("max_partitions_per_unit", "max_rows_per_partition"):
            for bad in (0, -1, 1.5, 2.0, True, "2", None, 10 ** 6 + 1):
                with pytest.raises(ParameterError) as e:
                    make(**{name: bad})
                assert e.value.name == name and "[1, 1,000,000]" in e.value.valid
            assert make(**{name: 7}).contribution_bounds.l1 == 7
    # from the command line: strings are converted, bad ones named
    m = build_mechanism("laplace-histogram", epsilon=1.0, max_rows_per_partition="4")
    assert m.max_rows_per_partition == 4
    with pytest.raises(ParameterError, match="max_rows_per_partition"):
        build_mechanism("laplace-histogram", epsilon=1.0, max_rows_per_partition="x")
    # bounds that need noise beyond the exact sampler's range are refused with their name
    with pytest.raises(ParameterError, match="max_rows_per_partition"):
        OSPDPRR(t=0.01, query="cv", lower=1.0, upper=2.0, max_partitions_per_unit=10 ** 6,
                max_rows_per_partition=10 ** 6)


def test_finalize_key_addresses_noise_by_key_and_releases_empty_keys():
    mech = IdentityLaplace(epsilon=1.0, bins=4, lower=0, upper=1)
    est = HistogramReleaseEstimator(mech, seed=3)
    acc = np.array([5, 0, 2, 1])
    a, b = est.finalize_key(acc, "a"), est.finalize_key(acc, "b")
    assert not np.array_equal(a["histogram"].value, b["histogram"].value)
    np.testing.assert_array_equal(a["histogram"].value,
                                  est.finalize_key(acc.copy(), "a")["histogram"].value)
    np.testing.assert_array_equal(est.finalize(acc)["histogram"].value,
                                  est.finalize(acc)["histogram"].value)
    assert est.finalize_key(None, "empty")["histogram"].value.shape == (4,)
    osp = OSPDPRR(t=0.5, query="mean", lower=0.0, upper=1.0)
    e = OSPDPRREstimator(osp, seed=3).finalize_key(None, "empty")
    assert math.isfinite(e["sample_count"].value)
    pub = OSPDPRR(t=0.5, query="sum", lower=0.0, upper=1.0, mode="sound-public")
    assert OSPDPRREstimator(pub, seed=3).finalize_key(None, "k")["ratio_factor"].value == 1.0
    od = OsdpRR(epsilon=0.5, query="count", lower=0.0, upper=1.0)
    assert OsdpRREstimator(od, seed=3).finalize_key(None, "k")["released_records"].value == 0
