"""OSPDPRR and OsdpRR (spec: shared/specs/ospdprr.md): the three stages against hand-computed and
closed-form values, the sampling probabilities against Jorgensen's formula and empirical inclusion
frequencies, the Laplace scales, the sensitivities of §6, exact privacy audits (sound-self bounded
by e^min(M_u, t); the paper rule's ratio unbounded; OsdpRR's exclusion bound e^eps), the
estimators' releases, and bad input.

Tolerances come from sampling distributions (binomial, Kolmogorov-Smirnov) at a fixed seed, with
Bonferroni corrections where many cells are tested at once; nothing is tuned to the seed.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as st
from scipy.special import logsumexp

from ldp_beam import EmptyAccumulatorError, InvalidRecordsError, ParameterError
from ldp_beam.central.osdprr import (OsdpRR, OsdpRREstimator, osdp_epsilon_for_threshold,
                                     osdp_keep_probability)
from ldp_beam.central.ospdprr import (OSPDPRR, QUERY_STATISTICS, OSPDPRREstimator,
                                      comprehensive_weight, exact_answer,
                                      importance_times_level, noise_scales, normalize_weights,
                                      personal_budgets, personal_epsilon, query_answer,
                                      sampling_probabilities, sensitivities)
from ldp_beam.core import CentralRelease, Mechanism
from ldp_beam.privacy import CENTRAL, NONE, ULDP

SEED = 20250827


U = dict(lower=0.0, upper=1.0)  # the unit domain (lower/upper are required)

def table(n, k, g, lower=0.0, upper=100.0, sensitive=0.4, importance=True):
    """A column table for the mechanisms: value1..k, level1..k, importance1..k."""
    data = {f"value{i}": g.uniform(lower, upper, n) for i in range(1, k + 1)}
    for i in range(1, k + 1):
        data[f"level{i}"] = np.where(g.random(n) < sensitive, g.uniform(0.001, 1.0, n), 0.0)
        if importance:
            data[f"importance{i}"] = g.uniform(0.05, 1.0, n)
    return data


def rows_of(mech, data):
    """Validated rows -> (values (n, k_T), weights (n, k) or sensitivity flags (n, k_T)), as
    the mechanism's check computes them (sound-self reports carry the sampling decision
    instead of the weights)."""
    cols, reasons = mech.check(data)
    assert not reasons.bad.any(), reasons.as_dict()
    other = ([f"weight{i}" for i in range(1, mech.k + 1)] if isinstance(mech, OSPDPRR)
             else [f"sensitive{i}" for i in mech.target])
    vals = np.column_stack([cols[f"value{i}"] for i in mech.target]).astype(float)
    return vals, np.column_stack([cols[f] for f in other]).astype(float)


# --------------------------------------------------------------------------- stage 1
W = np.array([[0.2, 0.4], [0.5, 0.1], [0.8, 0.0]])


def test_topsis_vector_normalization_by_hand():
    # column norms sqrt(0.93) and sqrt(0.17); normalized rows (0.2073903, 0.9701425),
    # (0.5184758, 0.2425356), (0.8295614, 0); w+ = (0.2073903, 0), w- = (0.8295614, 0.9701425);
    # D+ = (0.9701425, 0.3944588, 0.6221711), D- = (0.6221711, 0.7913191, 0.9701425)
    wb = normalize_weights(W, "vector")
    np.testing.assert_allclose(wb[:, 0], [0.2073903, 0.5184758, 0.8295614], atol=1e-7)
    np.testing.assert_allclose(wb[:, 1], [0.9701425, 0.2425356, 0.0], atol=1e-7)
    m = comprehensive_weight(W, "data", "vector")
    np.testing.assert_allclose(m, [0.3907339, 0.6673418, 0.6092661], atol=1e-6)


def test_topsis_minmax_and_fixed_references_by_hand():
    # minmax: columns (0, 0.5, 1) and (1, 0.25, 0); ideals (0, 0) and (1, 1);
    # D+ = (1, sqrt(0.3125), 1), D- = (1, sqrt(0.8125), 1)
    np.testing.assert_allclose(comprehensive_weight(W, "data", "minmax"),
                               [0.5, 0.9013878 / (0.5590170 + 0.9013878), 0.5], atol=1e-6)
    # fixed: raw weights against 0 and 1: D+ = (sqrt(.2), sqrt(.26), .8),
    # D- = (1, sqrt(1.06), sqrt(1.04))
    np.testing.assert_allclose(comprehensive_weight(W, "fixed", None),
                               [0.6909830, 0.6687798, 0.5603923], atol=1e-6)
    # edge cases: a column of zeros stays 0; a constant profile gives M = 0.5; extremes
    np.testing.assert_array_equal(normalize_weights(np.zeros((3, 2)), "vector"), 0.0)
    np.testing.assert_array_equal(comprehensive_weight(np.zeros((3, 2)), "data"), 0.5)
    np.testing.assert_allclose(comprehensive_weight(np.array([[0.0, 0.0], [1.0, 1.0]]),
                                                    "fixed", None), [1.0, 0.0])
    with pytest.raises(ParameterError, match="'norm'"):
        comprehensive_weight(W, "fixed", "vector")
    with pytest.raises(ParameterError, match="'ref'"):
        comprehensive_weight(W, "other")


def test_default_sensitivity_function_is_relative_importance_times_level():
    imp = np.array([[0.5, 0.25], [1.0, 1.0]])
    lvl = np.array([[0.4, 1.0], [0.0, 0.7]])
    # importance relative to the user's most important item: (1, 0.5) and (1, 1)
    np.testing.assert_allclose(importance_times_level(imp, lvl), [[0.4, 0.5], [0.0, 0.7]])


# --------------------------------------------------------------------------- stage 2
def test_sampling_probabilities_are_jorgensens_formula():
    eps = np.linspace(0, 1, 101)
    for t in (0.6, 0.7, 0.8, 0.9, 1.0):
        pi = sampling_probabilities(eps, t)
        expect = np.where(eps < t, (np.exp(eps) - 1) / (np.exp(t) - 1), 1.0)
        np.testing.assert_allclose(pi, expect, rtol=1e-12)
        assert pi[0] == 0.0 and np.all(np.diff(pi) >= 0) and pi.max() == 1.0
        # amplification: ln(1 + pi (e^t - 1)) = min(eps_u, t)
        np.testing.assert_allclose(personal_epsilon(pi, t), np.minimum(eps, t), atol=1e-12)


def test_personal_budgets_rescale_with_a_and_b():
    m = np.array([0.2, 0.5, 0.8])
    np.testing.assert_allclose(personal_budgets(m, True), [0.0, 0.5, 1.0])
    np.testing.assert_allclose(personal_budgets(m, False), m)
    np.testing.assert_array_equal(personal_budgets(np.full(4, 0.3), True), 1.0)  # A = B


@pytest.mark.parametrize("mode", ["sound-self", "sound-public", "paper"])
def test_empirical_inclusion_frequencies_match_pi(mode):
    g = np.random.default_rng(SEED)
    mech = OSPDPRR(t=0.7, k=3, lower=0, upper=100, mode=mode)
    vals, w = rows_of(mech, table(12, 3, g, sensitive=0.6))
    _, _, pi = mech.sampling(w)
    assert np.any((pi > 0) & (pi < 1))
    reps = 3000
    counts = np.zeros(12)
    gen = np.random.default_rng(SEED + 1)
    for _ in range(reps):
        counts += mech.release(vals, w, gen).curator["sample"]
    # two-sided binomial test per user, Bonferroni over 12 users at 1 %
    for c, p in zip(counts, pi):
        if p in (0.0, 1.0):
            assert c == reps * p
            continue
        lo, hi = st.binom.interval(1 - 0.01 / 12, reps, p)
        assert lo <= c <= hi, (c, p)


# --------------------------------------------------------------------------- stage 3
def test_sensitivities_and_budget_split_of_section_6():
    assert sensitivities("count", 3, -2.0, 5.0) == {"N": 3.0}
    assert sensitivities("sum", 3, -2.0, 5.0) == {"S": 15.0}
    assert sensitivities("mean", 2, -7.0, 5.0) == {"N": 2.0, "S": 14.0}
    assert sensitivities("variance", 1, 0.0, 10.0) == {"N": 1.0, "S": 10.0, "Q": 100.0}
    assert sensitivities("cv", 3, 1.0, 10.0) == {"N": 3.0, "S": 30.0, "Q": 300.0}
    sc = noise_scales("cv", 3, 1.0, 10.0, 0.6)  # t/3 each
    assert sc == pytest.approx({"N": 3 / 0.2, "S": 30 / 0.2, "Q": 300 / 0.2})
    sc = noise_scales("mean", 1, 0.0, 10.0, 0.8)  # t/2 each
    assert sc == pytest.approx({"N": 1 / 0.4, "S": 10 / 0.4})


def test_query_answer_formulas():
    v, c = query_answer("mean", 4.0, 10.0, None, 0.0, 2.0)
    assert v == 2.5 and c == 2.0  # clipped to [lower, upper]
    v, c = query_answer("mean", -3.0, 1.0, None, 0.0, 2.0)  # N <- max(N, 1)
    assert v == 1.0
    v, c = query_answer("variance", 4.0, 4.0, 10.0, 0.0, 4.0)  # 10/4 - 1 = 1.5
    assert v == pytest.approx(1.5) and c == pytest.approx(1.5)
    v, c = query_answer("variance", 4.0, 4.0, 100.0, 0.0, 4.0)  # clipped to (4 - 0)^2 / 4
    assert c == pytest.approx(4.0)
    v, c = query_answer("cv", 4.0, 4.0, 10.0, 0.5, 4.0)
    assert v == pytest.approx(math.sqrt(1.5)) == c
    v, c = query_answer("cv", 4.0, -4.0, 10.0, -1.0, 4.0, mean_floor=0.5)  # mean floored
    assert v == pytest.approx(math.sqrt(1.5) / 0.5)  # mean -1 -> floored to 0.5
    x = np.array([1.0, 2.0, 3.0, 6.0])
    assert exact_answer("cv", x) == pytest.approx(np.std(x) / np.mean(x))
    assert exact_answer("count", x) == 4 and exact_answer("sum", x) == 12


def _reports(mech, vals, w, seed):
    """The reports of validated rows, as the pipeline makes them: prepare with the rows'
    uniforms (sound-self: the sampling decision; the other modes: the weights)."""
    cols = {f"value{i}": vals[:, j] for j, i in enumerate(mech.target)}
    cols.update({f"weight{i}": w[:, i - 1] for i in range(1, mech.k + 1)})
    return mech.prepare(cols, np.random.default_rng(seed).random((len(vals), mech.draws)))


def _laplace_draws(mech, vals, w, reps, seed):
    """``reps`` finalizes through the estimator (fresh seeds): answer - exact sample sum."""
    est = OSPDPRREstimator(mech)
    acc = est.add(est.create(), _reports(mech, vals, w, seed))
    truth = vals.sum()
    out = np.empty(reps)
    for r in range(reps):
        e = OSPDPRREstimator(mech, seed=seed + r).finalize(acc)
        out[r] = e["sample_sum"].value - truth
    return out


def test_laplace_scale_is_delta_over_t_in_the_sound_modes():
    """Every user non-sensitive -> M = 1 -> pi = 1: the release is the exact sum plus
    Laplace(k_T Bmax / t); the KS test compares the whole distribution."""
    g = np.random.default_rng(SEED)
    vals = g.uniform(0, 100, (50, 2))
    w = np.zeros((50, 2))
    for mode in ("sound-self", "sound-public"):
        mech = OSPDPRR(t=0.6, k=2, lower=0, upper=100, mode=mode)
        assert mech.noise_scales() == {"S": pytest.approx(200 / 0.6)}
        d = _laplace_draws(mech, vals, w, 400, SEED)
        assert st.kstest(d, st.laplace(scale=200 / 0.6).cdf).pvalue > 0.001
        rel = mech.release(vals, w, 1)
        assert rel.curator["epsilon"] == 0.6 and rel.curator["pi"].min() == 1.0
        # the released stderr is the noise's: sqrt(2) Delta / t
        assert rel.statistics["sum"].stderr == pytest.approx(math.sqrt(2) * 200 / 0.6)


def test_laplace_scale_is_delta_over_e_to_the_m_in_paper_mode():
    """Paper mode, every weight 0: the normalized matrix is 0, M = 0.5 for all, A = B so pi = 1,
    m = 0.5 and the noise is Laplace(k_T Bmax / e^0.5) whatever t."""
    g = np.random.default_rng(SEED)
    vals = g.uniform(0, 100, (50, 2))
    w = np.zeros((50, 2))
    mech = OSPDPRR(t=0.6, k=2, lower=0, upper=100, mode="paper")
    rel = mech.release(vals, w, 2)
    assert rel.curator["m"] == 0.5 and rel.curator["epsilon"] == pytest.approx(math.exp(0.5))
    assert rel.curator["scales"]["S"] == pytest.approx(200 / math.exp(0.5))
    assert rel.statistics["paper_epsilon"].value == pytest.approx(math.exp(0.5))
    d = _laplace_draws(mech, vals, w, 400, SEED + 10_000)
    assert st.kstest(d, st.laplace(scale=200 / math.exp(0.5)).cdf).pvalue > 0.001
    assert mech.guarantee.kind == NONE and math.isinf(mech.guarantee.epsilon)


# --------------------------------------------------------------------------- privacy audits
def _log_density(y, users, pi, value_of, scale_of, query_sum=True):
    """log p(y) of a one-statistic release: enumerate every sample X (P(X) from pi), add the
    Laplace density of scale ``scale_of(X)`` centred at ``value_of(X)``."""
    terms = []
    n = len(users)
    for bits in itertools.product((0, 1), repeat=n):
        x = np.array(bits, dtype=bool)
        p = np.prod(np.where(x, pi, 1 - pi))
        if p == 0:
            continue
        b = scale_of(x)
        terms.append(math.log(p) - math.log(2 * b) - np.abs(y - value_of(x)) / b)
    return logsumexp(np.stack(terms), axis=0)


def _grid(points, spread):
    pts = np.asarray(sorted(points), dtype=float)
    return np.unique(np.concatenate([pts, np.linspace(pts[0] - spread, pts[-1] + spread, 4001)]))


@pytest.mark.parametrize("query", ["sum", "count"])
def test_exact_audit_sound_self_add_remove_bounded_by_min_m_t(query):
    """sound-self on n = 4 users (k = 2): for every user u, the output densities with and
    without u differ by at most a factor e^min(M_u, t) everywhere (grid through every kink plus
    the exact tail limits), and a user with the largest possible contribution attains it."""
    t = 0.7
    mech = OSPDPRR(t=t, query=query, k=2, lower=0, upper=10)
    vals = np.array([[10.0, 10.0], [3.0, 7.0], [0.5, 9.0], [6.0, 2.0]])
    w = np.array([[0.3, 0.9], [0.0, 0.0], [1.0, 0.6], [0.2, 0.1]])
    m, eps, pi = mech.sampling(w)
    np.testing.assert_allclose(eps, m)  # no cross-user rescaling in sound-self
    stat = "S" if query == "sum" else "N"
    b = mech.noise_scales()[stat]
    contrib = vals.sum(axis=1) if query == "sum" else np.full(4, 2.0)
    for u in range(4):
        keep = np.arange(4) != u
        # removing u leaves every other user's M (and pi) unchanged: fixed references
        _, _, pi_rest = mech.sampling(w[keep])
        np.testing.assert_allclose(pi_rest, pi[keep])
        f_d = lambda x: contrib[x].sum()  # noqa: E731
        f_r = lambda x, c=contrib[keep]: c[x].sum()  # noqa: E731
        sums = [contrib[np.array(bits, bool)].sum()
                for bits in itertools.product((0, 1), repeat=4)]
        y = _grid(sums, 40 * b)
        ld = _log_density(y, range(4), pi, f_d, lambda x: b)
        lr = _log_density(y, range(3), pi[keep], f_r, lambda x: b)
        bound = min(m[u], t)
        assert np.max(np.abs(ld - lr)) <= bound + 1e-9, (u, np.max(np.abs(ld - lr)), bound)
        # the upper tail: ratio -> 1 - pi + pi e^(contrib/b), equal to e^bound iff the user's
        # contribution is the sensitivity
        tail = math.log1p(pi[u] * math.expm1(contrib[u] / b))
        assert tail <= bound + 1e-12
        if contrib[u] == mech.noise_scales()[stat] * t:
            assert tail == pytest.approx(bound, abs=1e-12)
    assert min(m[0], t) == pytest.approx(math.log1p(pi[0] * math.expm1(t)))


def test_exact_audit_sound_self_replacement_within_2t():
    """Replacing one user's items (values and weights): bounded by min(M_u, t) + min(M'_u, t)
    <= 2t, hence (P, 2t)-one-sided DP for any policy."""
    t = 0.9
    mech = OSPDPRR(t=t, k=2, lower=0, upper=10)
    vals = np.array([[1.0, 2.0], [3.0, 7.0], [0.5, 9.0]])
    w = np.array([[0.0, 0.0], [1.0, 0.6], [0.2, 0.1]])
    new_vals, new_w = np.array([10.0, 10.0]), np.array([0.0, 0.0])  # a non-sensitive user
    b = mech.noise_scales()["S"]
    for u in range(3):
        v2, w2 = vals.copy(), w.copy()
        v2[u], w2[u] = new_vals, new_w
        m1, _, p1 = mech.sampling(w)
        m2, _, p2 = mech.sampling(w2)
        y = _grid([0.0, 60.0], 40 * b)
        l1 = _log_density(y, range(3), p1, lambda x, s=vals.sum(1): s[x].sum(), lambda x: b)
        l2 = _log_density(y, range(3), p2, lambda x, s=v2.sum(1): s[x].sum(), lambda x: b)
        gap = np.max(np.abs(l1 - l2))
        assert gap <= min(m1[u], t) + min(m2[u], t) + 1e-9 <= 2 * t + 1e-9


def test_paper_mode_density_ratio_is_unbounded_in_the_tails():
    """The literal rule eps = e^m: with u sampled the noise is wider than any component without
    u, so log p_D(y) - log p_D'(y) grows linearly in |y| (spec §4.2)."""
    t = 0.9
    mech = OSPDPRR(t=t, k=2, lower=0, upper=10, mode="paper")
    vals = np.array([[5.0, 5.0], [5.0, 5.0], [5.0, 5.0], [5.0, 5.0]])
    # user 0: the most sensitive (M' = 0, never sampled); user 1 = u: moderately sensitive;
    # users 2, 3: not sensitive (M = 1)
    w = np.array([[1.0, 1.0], [0.5, 0.3], [0.0, 0.0], [0.0, 0.0]])

    def log_density(vals, w, y):
        m, eps, pi = mech.sampling(w)
        s = vals.sum(axis=1)

        def scale(x):  # step 8: eps = e^(min of M over the sample); empty sample: over all
            return mech.noise_scales(math.exp(m[x].min() if x.any() else m.min()))["S"]
        return _log_density(y, range(len(s)), pi, lambda x: s[x].sum(), scale), pi

    keep = np.array([True, False, True, True])
    delta = 20.0
    y = 20.0 + delta * np.array([1, 10, 100, 1000, 10_000], dtype=float)
    ld, pi = log_density(vals, w, y)
    lr, _ = log_density(vals[keep], w[keep], y)
    assert 0 < pi[1] < 1
    gap = ld - lr
    assert np.all(np.diff(gap) > 0)  # strictly growing with |y|
    assert gap[-1] > 100 * t and gap[-1] > 1000  # beyond any finite budget on this grid
    # the growth is linear: slope = 1/b_u - 1/b_narrowest (difference of inverse scales)
    slope = (gap[-1] - gap[-2]) / (y[-1] - y[-2])
    m, _, _ = mech.sampling(w)
    m_rest, _, _ = mech.sampling(w[keep])
    expect = (math.exp(m[1]) - math.exp(m_rest[1:].min())) / 20.0
    assert slope == pytest.approx(abs(expect), rel=1e-6)


def test_sound_public_with_private_weights_has_no_guarantee():
    """The counterexample of docs/ospdprr_privacy.md: removing user 0 (pi = 0, contributes
    nothing) moves six other users' pi from 0.64 to 0 under the data references, and the output
    density ratio reaches e^3.0 > e^t; sound-self on the same data does not move at all."""
    t = 0.7
    w = np.array([[1.0, 1.0]] + [[0.5, 0.5]] * 6 + [[0.0, 0.0]])
    v = np.array([[0.0, 0.0]] + [[10.0, 10.0]] * 6 + [[0.0, 0.0]])
    keep = np.arange(8) != 0
    y = np.linspace(-400, 600, 2001)
    gaps = {}
    for mode in ("sound-public", "sound-self"):
        mech = OSPDPRR(t=t, k=2, lower=0, upper=10, mode=mode)
        b = mech.noise_scales()["S"]
        _, _, pi = mech.sampling(w)
        _, _, pi_r = mech.sampling(w[keep])
        assert pi[0] == 0.0
        s = v.sum(axis=1)
        ld = _log_density(y, range(8), pi, lambda x: s[x].sum(), lambda x: b)
        lr = _log_density(y, range(7), pi_r, lambda x, s=s[keep]: s[x].sum(), lambda x: b)
        gaps[mode] = float(np.max(np.abs(ld - lr)))
        if mode == "sound-public":
            np.testing.assert_allclose(pi[1:7], (math.exp(0.5) - 1) / math.expm1(t))
            np.testing.assert_array_equal(pi_r[:6], 0.0)
    assert gaps["sound-public"] > 4 * t  # no t-DP without the public-weights assumption
    assert gaps["sound-self"] <= 1e-12    # user 0 has M = 0: she costs nothing


def test_osdprr_exclusion_attack_bound_by_enumeration():
    """OsdpRR on 3 records: replacing the sensitive record r by any record r' changes the
    probability of every output by at most e^eps in the one-sided direction (equality where r'
    is suppressed); outputs that release r' have probability 0 under D, so the other direction
    is unbounded (one-sided)."""
    eps = 0.8
    q = OsdpRR(epsilon=eps, **U).keep_probability
    assert q == pytest.approx(1 - math.exp(-eps)) == osdp_keep_probability(eps)

    def dist(sensitive):
        """Every output (set of released record indices) -> probability."""
        out = {}
        for bits in itertools.product((0, 1), repeat=len(sensitive)):
            p = 1.0
            for released, s in zip(bits, sensitive):
                keep = 0.0 if s else q
                p *= keep if released else 1 - keep
            out[bits] = p
        return out

    d = dist([True, False, False])      # r = record 0, sensitive
    for other in ([False, False, False], [True, False, False]):  # r' non-sensitive / sensitive
        d2 = dist(other)
        for o, p in d.items():
            if p > 0:
                assert p <= math.exp(eps) * d2[o] + 1e-15
        worst = max(p / d2[o] for o, p in d.items() if p > 0)
        assert worst == pytest.approx(math.exp(eps) if not other[0] else 1.0)
    # the exclusion attack: P(r absent | sensitive) / P(r absent | non-sensitive) = e^eps
    assert 1.0 / (1 - q) == pytest.approx(math.exp(eps))
    # and the one-sidedness: an output releasing r' is impossible under D
    assert dist([True, False, False])[(1, 0, 0)] == 0 < dist([False, False, False])[(1, 0, 0)]


def test_osdprr_release_never_releases_sensitive_records():
    g = np.random.default_rng(SEED)
    mech = OsdpRR(epsilon=0.6, k=3, lower=0, upper=100)
    vals, sens = rows_of(mech, table(400, 3, g, importance=False))
    reps = 300
    counts = np.zeros(vals.shape)
    gen = np.random.default_rng(SEED + 2)
    for _ in range(reps):
        counts += mech.release(vals, sens, gen).curator["kept"]
    assert counts[sens.astype(bool)].sum() == 0
    total = counts[~sens.astype(bool)].sum()
    m = int((~sens.astype(bool)).sum()) * reps
    lo, hi = st.binom.interval(0.999, m, mech.keep_probability)
    assert lo <= total <= hi


# --------------------------------------------------------------------------- the guarantees
def test_guarantees_per_mode():
    g = OSPDPRR(t=0.8, **U).guarantee
    assert g.kind == CENTRAL and g.epsilon == 0.8
    assert g.params["osdp_epsilon"] == pytest.approx(1.6) and g.params["assumption"] == "none"
    assert "min(M_u, t)" in g.notes and "(P, 1.6)-one-sided DP" in g.notes
    g = OSPDPRR(t=0.8, mode="sound-public", **U).guarantee
    assert g.kind == CENTRAL and g.notes.startswith("CONDITIONAL on the public-weights")
    assert "NO guarantee" in g.notes and g.params["assumption"] == "the weight matrix is public"
    g = OSPDPRR(t=0.8, mode="paper", **U).guarantee
    assert g.kind == NONE and math.isinf(g.epsilon) and "Replication only" in g.notes
    assert "e^m" in g.claim
    g = OsdpRR(epsilon=0.7, **U).guarantee
    assert g.kind == ULDP and g.epsilon == 0.7 and "NOT DP for non-sensitive" in g.notes
    assert "record level" in g.notes
    assert "t/3 each" in OSPDPRR(t=0.6, query="cv", lower=1, upper=2).guarantee.notes


def test_budget_matching_of_section_7_2():
    assert osdp_epsilon_for_threshold(0.6) == 0.6
    assert osdp_epsilon_for_threshold(0.6, "keep-probability") == pytest.approx(-math.log(0.4))
    assert OsdpRR.matched(0.7, "keep-probability", **U).keep_probability == pytest.approx(0.7)
    assert OsdpRR.matched(0.7, **U).epsilon == 0.7
    with pytest.raises(ParameterError, match="'t'"):
        osdp_epsilon_for_threshold(1.0, "keep-probability")
    with pytest.raises(ParameterError, match="'matching'"):
        osdp_epsilon_for_threshold(0.5, "other")


# --------------------------------------------------------------------------- the estimators
def _acc(mech, data, est=None):
    est = est or (OSPDPRREstimator(mech) if isinstance(mech, OSPDPRR) else OsdpRREstimator(mech))
    return est, est.add(est.create(), mech.records(data))


def test_estimate_statistics_and_ratio_estimator():
    g = np.random.default_rng(SEED)
    data = table(500, 3, g)
    mech = OSPDPRR(t=0.6, k=3, lower=0, upper=100, mode="sound-public")
    est, acc = _acc(mech, data)
    e = OSPDPRREstimator(mech, seed=1).finalize(acc)
    assert e.n_reports is None  # the number of users is not released
    assert set(e.statistics) == {"sum", "sum_raw", "sum_ratio", "sample_sum", "ratio_factor"}
    assert mech.estimator == "ratio" and e["sum"] is e["sum_ratio"]
    f = e["ratio_factor"].value
    assert e["sum_ratio"].value == pytest.approx(e["sum_raw"].value * f)
    assert e["sum_raw"].value == e["sample_sum"].value
    _, _, pi = mech.sampling(est.canonical(acc)[:, 3:])
    assert f == pytest.approx(500 / pi.sum())
    # sound-self: raw only, no public factor
    self_ = OSPDPRR(t=0.6, k=3, lower=0, upper=100, query="mean")
    e = OSPDPRREstimator(self_, seed=1).finalize(_acc(self_, data)[1])
    assert set(e.statistics) == {"mean", "sample_count", "sample_sum"}
    assert 0 <= e["mean"].clipped <= 100
    cv = OSPDPRR(t=0.6, k=3, lower=1, upper=100, query="cv", clip=True)
    e = OSPDPRREstimator(cv, seed=1).finalize(_acc(cv, data)[1])
    assert set(e.statistics) == {"cv", "sample_count", "sample_sum", "sample_sumsq"}
    # the baseline
    base = OsdpRR(epsilon=0.6, k=3, lower=0, upper=100)
    data_b = {k: v for k, v in data.items() if not k.startswith("importance")}
    e = OsdpRREstimator(base, seed=1).finalize(_acc(base, data_b)[1])
    assert set(e.statistics) == {"sum", "sum_raw", "sum_scaled", "released_records"}
    assert e["sum_scaled"].value == pytest.approx(e["sum_raw"].value / base.keep_probability)
    assert e["sum"] is e["sum_scaled"] and e.n_reports is None


def test_ratio_estimator_is_unbiased_through_the_estimator():
    """sound-public ratio sum through finalize, 400 releases: the mean error is within 4
    standard errors of 0 when values do not depend on sensitivity (exact variance: sampling +
    Laplace)."""
    g = np.random.default_rng(SEED)
    mech = OSPDPRR(t=0.6, k=2, lower=0, upper=10, mode="sound-public")
    data = table(300, 2, g, upper=10, sensitive=0.5)
    est, acc = _acc(mech, data)
    rows = est.canonical(acc)
    vals, w = rows[:, :2], rows[:, 2:]
    _, _, pi = mech.sampling(w)
    f = 300 / pi.sum()
    s = vals.sum(axis=1)
    # E[ratio] = f sum(pi s), not exactly the total: compare with that expectation
    expect = f * (pi @ s)
    var = f * f * (pi * (1 - pi) @ s ** 2 + 2 * mech.noise_scales()["S"] ** 2)
    draws = np.array([OSPDPRREstimator(mech, seed=SEED + r).finalize(acc)["sum"].value
                      for r in range(400)])
    assert abs(draws.mean() - expect) <= 4 * math.sqrt(var / 400)
    assert abs(expect - s.sum()) < 0.05 * s.sum()  # and close to the full-data sum


def test_seeded_release_does_not_depend_on_split_or_merge_order():
    g = np.random.default_rng(SEED)
    mech = OSPDPRR(t=0.7, k=3, lower=0, upper=100, mode="sound-public", query="mean")
    rep = mech.records(table(200, 3, g))
    est = OSPDPRREstimator(mech, seed=7)
    one = est.add(est.create(), rep)
    parts = [{k: v[i::3] for k, v in rep.items()} for i in range(3)]
    accs = [est.add(est.create(), p) for p in reversed(parts)]
    merged = est.merge([accs[1], est.merge([accs[2], est.create()]), accs[0]])
    assert est.n_reports(merged) == 200
    np.testing.assert_array_equal(est.canonical(merged), est.canonical(one))
    assert est.finalize(merged).to_dict() == est.finalize(one).to_dict()
    # unseeded: OS entropy, a fresh release each time
    free = OSPDPRREstimator(mech)
    assert free.finalize(one)["mean"].value != free.finalize(one)["mean"].value
    assert est.merge([]).shape == (0, 6) and est.n_reports(est.create()) == 0


def test_an_empty_dataset_is_released_as_noise_and_the_bare_mechanism_refuses_it():
    """The estimator's one release does not refuse an empty input (a fixed error for no users,
    where one user gives a noisy answer, would be a difference no epsilon bounds); the bare
    mechanism's release, which callers use directly, still says there is nothing to release
    unless asked to release from nothing."""
    for mech in (OSPDPRR(t=0.6, k=2, **U), OsdpRR(epsilon=0.6, k=2, **U)):
        est = OSPDPRREstimator(mech) if isinstance(mech, OSPDPRR) else OsdpRREstimator(mech)
        acc = est.add(est.create(), mech.empty_reports())
        rel = est.finalize(acc)
        assert rel.n_reports is None and rel.statistics
    with pytest.raises(EmptyAccumulatorError, match="no reports"):
        OSPDPRR(t=0.6, **U).release(np.empty((0, 1)), np.empty((0, 1)))


def test_one_user_releases():
    for mode in ("sound-self", "sound-public", "paper"):
        mech = OSPDPRR(t=0.6, mode=mode, lower=0, upper=10)
        est = OSPDPRREstimator(mech, seed=1)
        acc = est.add(est.create(), _reports(mech, np.array([[5.0]]), np.array([[0.4]]), 1))
        assert est.n_reports(acc) == 1
        assert np.isfinite(est.finalize(acc)["sum"].value)


def test_custom_sensitivity_function_is_pluggable():
    mech = OSPDPRR(t=0.6, k=2, lower=0, upper=10, sensitivity=max_level)
    data = {"value1": [1.0, 2.0], "value2": [3.0, 4.0], "level1": [0.2, 0.0],
            "level2": [0.7, 0.0]}
    cols, _ = mech.check(data)
    np.testing.assert_allclose(cols["weight1"], [0.7, 0.0])
    np.testing.assert_allclose(cols["weight2"], [0.7, 0.0])
    assert mech.params()["sensitivity"].endswith("test_ospdprr.max_level")
    lv = OSPDPRR(t=0.6, k=2, lower=0, upper=10, sensitivity="level", mode="sound-public"
                 ).records({**data, "importance1": [0.5, 1.0], "importance2": [1.0, 1.0]})
    np.testing.assert_allclose(lv["weight2"], [0.7, 0.0])
    # a function that returns weights outside [0, 1]: those rows are dead-lettered
    bad = OSPDPRR(t=0.6, k=2, lower=0, upper=10, sensitivity=doubled)
    _, reasons = bad.check(data)
    assert list(reasons.as_dict()) == [0]
    assert reasons.as_dict()[0].endswith("doubled' gave weights [0.4, 1.4]: every weight must "
                                         "be in [0, 1]")


def max_level(importance, level):
    """A user's weight for every item: her largest level."""
    return np.repeat(level.max(axis=1, keepdims=True), level.shape[1], axis=1)


def doubled(importance, level):
    return 2 * level


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("params, name, valid", [
    (dict(t=0), "t", "(0, 1]"), (dict(t=1.2), "t", "(0, 1]"), (dict(t=-0.5), "t", "(0, 1]"),
    (dict(t=float("nan")), "t", "(0, 1]"), (dict(t=True), "t", "(0, 1]"),
    (dict(t=0.5, query="median"), "query", "one of"),
    (dict(t=0.5, k=0), "k", "integer >= 1"),
    (dict(t=0.5, k=2, target=(3,)), "target", "1..2"),
    (dict(t=0.5, k=2, target=(1, 1)), "target", "distinct"),
    (dict(t=0.5, lower=1, upper=1), "lower", "< upper"),
    (dict(t=0.5, mode="liberal"), "mode", "one of"),
    (dict(t=0.5, norm="minmax"), "norm", "None with mode='sound-self'"),
    (dict(t=0.5, mode="paper", norm="zscore"), "norm", "one of"),
    (dict(t=0.5, estimator="ratio"), "estimator", "'raw'"),
    (dict(t=0.5, mode="sound-public", query="mean", estimator="ratio"), "estimator", "'raw'"),
    (dict(t=0.5, sensitivity="sum"), "sensitivity", "one of"),
    (dict(t=0.5, sensitivity=3), "sensitivity", "a callable"),
    (dict(t=0.5, paper_m="raw"), "paper_m", "None unless mode='paper'"),
    (dict(t=0.5, mode="paper", paper_m="min"), "paper_m", "one of"),
    (dict(t=0.5, query="cv", lower=0, upper=10), "lower", "> 0 for query='cv'"),
    (dict(t=0.5, query="cv", lower=-1, upper=10, mean_floor=0), "mean_floor", "> 0"),
    (dict(t=0.5, query="sum", mean_floor=1.0), "mean_floor", "None unless query='cv'"),
    (dict(t=0.5, clip="yes"), "clip", "True or False"),
])
def test_bad_parameters_name_the_parameter_and_range(params, name, valid):
    with pytest.raises(ParameterError) as exc:
        OSPDPRR(**{**U, **params})
    assert exc.value.name == name and valid in str(exc.value)


def test_bad_osdprr_parameters():
    for params, name in ((dict(epsilon=0), "epsilon"), (dict(epsilon=math.inf), "epsilon"),
                         (dict(epsilon=1, query="mean", estimator="scaled"), "estimator"),
                         (dict(epsilon=1, query="cv"), "lower")):
        with pytest.raises(ParameterError) as exc:
            OsdpRR(**{**U, **params})
        assert exc.value.name == name
    # the cv is accepted once the mean is bounded away from 0
    assert OsdpRR(epsilon=1, query="cv", lower=-1, upper=1, mean_floor=0.1).query == "cv"
    assert OSPDPRR(t=1, query="cv", lower=2, upper=3).resolved_mean_floor == 2.0


def test_bad_records_are_dead_lettered_with_reasons():
    mech = OSPDPRR(t=0.6, k=2, lower=0, upper=10)
    data = {"value1": np.array([1.0, 11.0, None, 2.0, 3.0, 4.0, "x", 5.0], dtype=object),
            "value2": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            "level1": [0.0, 0.0, 0.0, 1.5, np.nan, 0.5, 0.0, 0.5],
            "level2": [0.0, 0.0, 0.0, 0.0, 0.0, -0.1, 0.0, 0.5],
            "importance1": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
            "importance2": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}
    _, reasons = mech.check(data)
    r = reasons.as_dict()
    assert list(r) == [1, 2, 3, 4, 5, 6, 7]
    assert r[1] == ("value1: 11.0 is outside the declared interval [0, 10] (not clipped; set "
                    "clip=True to clip)")
    assert r[2] == "value1: missing value (a number is required)"
    assert r[3] == "level1: sensitivity level 1.5 is outside [0, 1]"
    assert r[4] == "level1: missing sensitivity level (a number in [0, 1] is required)"
    assert r[5] == "level2: sensitivity level -0.1 is outside [0, 1]"
    assert r[6] == "value1: non-numeric value 'x'"
    assert r[7] == "importance1: importance 0.0 is outside (0, 1]"
    with pytest.raises(InvalidRecordsError, match="7 of 8 records are invalid"):
        mech.records(data)
    # clipping only when asked for
    clipped = OSPDPRR(t=0.6, k=2, lower=0, upper=10, clip=True)
    cols, reasons = clipped.check(data)
    assert 1 not in reasons.as_dict() and cols["value1"][1] == 10.0
    # the baseline: same value and level checks; reports flag sensitivity
    base = OsdpRR(epsilon=0.6, k=2, lower=0, upper=10)
    _, rb = base.check({k: v for k, v in data.items() if not k.startswith("importance")})
    assert list(rb.as_dict()) == [1, 2, 3, 4, 5, 6]
    data_b = {"value1": [1.0, 2.0], "value2": [3.0, 4.0], "level1": [0.0, 0.3],
              "level2": [0.2, 0.0]}
    cols, _ = base.check(data_b)
    np.testing.assert_array_equal(cols["sensitive1"], [0, 1])
    assert cols["sensitive1"].dtype == np.uint8
    # reports: each record's released decision, drawn where the row is read (u < q, and never
    # for a sensitive record); u = 0 keeps every non-sensitive record
    rep = base.prepare(cols, np.zeros((2, base.draws)))
    np.testing.assert_array_equal(rep["released1"], [1, 0])
    np.testing.assert_array_equal(rep["released2"], [0, 1])
    assert rep["released1"].dtype == np.uint8 and base.draws == 2


def test_check_reports_flags_malformed_reports():
    mech = OSPDPRR(t=0.6, k=1, lower=0, upper=10, mode="sound-public")
    est = OSPDPRREstimator(mech)
    r = est.check_reports({"value1": np.array([1.0, 12.0, np.nan]),
                           "weight1": np.array([0.5, 0.5, 2.0])}).as_dict()
    assert list(r) == [1, 2] and "not in [0, 10]" in r[1]
    r = est.check_reports({"value1": np.array([1.0])}).as_dict()
    assert r == {0: "report field 'weight1' is missing"}
    # sound-self reports: values and the 0/1 sampling decision
    one = OSPDPRREstimator(OSPDPRR(t=0.6, k=1, lower=0, upper=10))
    r = one.check_reports({"value1": np.array([1.0, 2.0, 11.0]),
                           "sampled": np.array([1, 2, 0])}).as_dict()
    assert r == {1: "report field 'sampled': 2.0 is not 0 or 1",
                 2: "report field 'value1': 11.0 is not in [0, 10]"}
    assert one.check_reports({"value1": np.array([1.0])}).as_dict() == {
        0: "report field 'sampled' is missing"}
    base = OsdpRREstimator(OsdpRR(epsilon=1.0, lower=0, upper=10))
    r = base.check_reports({"value1": np.array([1.0, 2.0]),
                            "released1": np.array([1, 3])}).as_dict()
    assert r == {1: "report field 'released1': 3.0 is not 0 or 1"}


def test_roles_follow_k_and_target():
    mech = OSPDPRR(t=0.6, k=3, target=(2,), **U)
    names = [r.name for r in mech.roles]
    assert names == ["value2", "level1", "level2", "level3", "importance1", "importance2",
                     "importance3"]
    assert [r.required for r in mech.roles][-3:] == [False] * 3
    # sound-self: the row's sampling decision (one uniform per row); the other modes: weights
    assert [f for f, _ in mech.report_fields] == ["value2", "sampled"] and mech.draws == 1
    public = OSPDPRR(t=0.6, k=3, target=(2,), mode="sound-public", **U)
    assert [f for f, _ in public.report_fields] == ["value2", "weight1", "weight2", "weight3"]
    assert public.draws == 0
    assert mech.k_target == 1 and mech.target == (2,)
    assert OSPDPRR(t=0.6, k=2, **U).target == (1, 2)
    assert [r.name for r in OsdpRR(epsilon=1, k=2, **U).roles] == ["value1", "value2",
                                                                  "level1", "level2"]
    assert OSPDPRR.roles[0].name == "value<i>"  # the class shows a template
    assert isinstance(mech, CentralRelease) and not isinstance(mech, Mechanism)


def test_the_bounds_keep_the_sums_each_release_computes_finite():
    """OsdpRR's count computes N only, its mean S (values up to 1e200 sum finitely over 2^63
    rows), its sum S and Q (squares of 1e200 overflow): each mechanism declares its sums
    (``sums_used``) and the shared bound check refuses only what would overflow."""
    big = dict(lower=0.0, upper=1e200)
    assert OsdpRR(epsilon=1.0, k=1, query="count", **big).sums_used == {"N"}
    assert OsdpRR(epsilon=1.0, k=1, query="mean", **big).sums_used == {"N", "S"}
    with pytest.raises(ParameterError, match="squared values must stay finite"):
        OsdpRR(epsilon=1.0, k=1, query="sum", **big)
    assert OSPDPRR(t=0.5, k=1, query="count", lower=0.0, upper=1.0).sums_used == \
        set(QUERY_STATISTICS["count"])
