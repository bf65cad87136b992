"""StructureFirst and AHP (ldp_beam/central/histogram_baselines.py): privacy accounting by
instrumentation, the v-optimal programme against brute force, the exponential mechanism's
distribution, unbiasedness of the published group sums, and bad input.

Statistical checks use fixed seeds; their tolerances come from standard errors (z = 4, two-sided
p ~ 6e-5) or chi-square quantiles (0.999), never from tuning."""
from __future__ import annotations

import dataclasses
import itertools
import math
import pickle

import numpy as np
import pytest
from scipy.stats import chi2

from ldp_beam import ParameterError
from ldp_beam.central import histogram_baselines as hb
from ldp_beam.central.histogram import HistogramReleaseEstimator, count_noise_variance
from ldp_beam.central.histogram_baselines import (AHP, StructureFirst, ahp_err_star,
                                                  ahp_greedy_cluster, ahp_threshold,
                                                  exponential_mechanism,
                                                  exponential_mechanism_probabilities,
                                                  v_optimal_table)
from ldp_beam.privacy import CENTRAL, NONE
from ldp_beam_test_helpers import ScriptedNoise

Z = 4.0
CHI2_Q = 0.999


def sse(v):
    v = np.asarray(v, dtype=float)
    return float(((v - v.mean()) ** 2).sum()) if v.size else 0.0


def brute_v_optimal(v, j, i):
    """Least total SSE of v[:i] in exactly j non-empty contiguous groups, by enumeration."""
    if i < j:
        return math.inf
    best = math.inf
    for cuts in itertools.combinations(range(1, i), j - 1):
        edges = (0, *cuts, i)
        best = min(best, sum(sse(v[a:b]) for a, b in zip(edges, edges[1:])))
    return best


def group_sums(values, groups):
    return np.bincount(groups, weights=np.asarray(values, dtype=float))


def assert_group_noise(rel, h, groups, z):
    """The released histogram's group sums are the true ones (of ``h``) moved by the draws ``z``."""
    np.testing.assert_allclose(group_sums(rel["histogram"].value, groups)
                               - group_sums(h, groups), z, atol=1e-9)


def assert_group_stderr(rel, groups, eps):
    """Each bucket's variance is its group sum's noise variance at ``eps`` over the group's size
    squared (a bucket is its group's noisy sum spread evenly)."""
    size = np.bincount(groups)
    np.testing.assert_allclose(rel["histogram"].stderr ** 2,
                               (count_noise_variance(eps) / size ** 2)[groups])


# =========================================================================== StructureFirst
def test_v_optimal_table_equals_brute_force():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 8):
        for _ in range(3):
            v = rng.integers(0, 20, n).astype(float)
            T = v_optimal_table(v, n)
            assert T[0, 0] == 0.0 and np.all(np.isinf(T[0, 1:]))
            for j in range(1, n + 1):
                for i in range(n + 1):
                    want = brute_v_optimal(v, j, i) if i >= 1 else math.inf
                    if math.isinf(want):
                        assert math.isinf(T[j, i]), (n, j, i)
                    else:
                        assert T[j, i] == pytest.approx(want, abs=1e-9), (v, j, i)


def test_v_optimal_table_fewer_layers_and_blocks(monkeypatch):
    """A partial table (max_groups < n) and a tiny block size give the same numbers."""
    v = np.random.default_rng(4).integers(0, 50, 40).astype(float)
    full = v_optimal_table(v, 6)
    monkeypatch.setattr(hb, "_BLOCK_ENTRIES", 50)  # one or two columns per block
    np.testing.assert_allclose(v_optimal_table(v, 6), full)
    np.testing.assert_allclose(v_optimal_table(v, 3), full[:4])


def test_exponential_mechanism_probabilities_are_the_softmax():
    s = np.array([0.0, -1.0, -3.0, 2.0])
    p = exponential_mechanism_probabilities(s, 1.5, 2.0)
    w = np.exp(1.5 * s / 4.0)
    np.testing.assert_allclose(p, w / w.sum())
    # huge scores do not overflow
    p = exponential_mechanism_probabilities(np.array([-1e12, -1e12 - 4.0]), 1.0, 1.0)
    np.testing.assert_allclose(p, np.array([1.0, math.exp(-2.0)]) / (1 + math.exp(-2.0)))


def test_exponential_mechanism_frequencies_match_chi_square():
    s = np.array([0.0, -1.0, -2.5, -0.5, -6.0])
    eps, sens = 2.0, 1.0
    p = exponential_mechanism_probabilities(s, eps, sens)
    gen = np.random.default_rng(11)
    R = 20000
    picks = np.array([exponential_mechanism(s, eps, sens, gen) for _ in range(R)])
    obs = np.bincount(picks, minlength=s.size)
    stat = float(((obs - R * p) ** 2 / (R * p)).sum())
    assert stat < chi2.ppf(CHI2_Q, s.size - 1)


def structure_first_choice_probs(h, k, eps1, F):
    """P(starts) of StructureFirst by the paper's rule, from brute-force errors: boundaries
    right to left, P(q_j | q_{j+1}) ∝ exp(-eps1/(k-1) * (T(j, q) + SSE(q..q_{j+1}-1)) /
    (2 (2F + 1)))."""
    c = np.minimum(h, F).astype(float)
    n = c.size
    out = {}
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        prob = 1.0
        for j in range(k - 1, 0, -1):
            right = bounds[j + 1]
            qs = np.arange(j, right)
            err = np.array([brute_v_optimal(c, j, q) + sse(c[q:right]) for q in qs])
            pj = exponential_mechanism_probabilities(-err, eps1 / (k - 1), 2 * F + 1)
            prob *= pj[list(qs).index(bounds[j])]
        out[tuple(bounds[:-1])] = prob
    return out


@pytest.mark.parametrize("k", [2, 3])
def test_structure_first_boundary_distribution_matches_exponential_mechanism(k):
    h = np.array([0, 9, 1, 12, 3, 8])
    F, eps1 = 12.0, 12.0
    mech = StructureFirst(epsilon=14.0, k=k, epsilon1=eps1, epsilon2=2.0, F=F)
    want = structure_first_choice_probs(h, k, eps1, F)
    assert sum(want.values()) == pytest.approx(1.0)
    gen = np.random.default_rng(5)
    R = 6000
    seen = [tuple(mech.release_counts(h, gen)["starts"].value) for _ in range(R)]
    keys = sorted(want)
    obs = np.array([seen.count(key) for key in keys], dtype=float)
    assert obs.sum() == R  # every structure drawn is a valid one
    exp_ = R * np.array([want[key] for key in keys])
    stat = float(((obs - exp_) ** 2 / exp_).sum())
    assert stat < chi2.ppf(CHI2_Q, len(keys) - 1)
    assert max(want.values()) < 0.9  # the example is not degenerate


def test_structure_first_privacy_accounting(monkeypatch):
    """k - 1 exponential-mechanism choices of eps1/(k-1) each with sensitivity 2F + 1, then one
    discrete Laplace draw of scale 1/eps2 per group sum; the guarantee is their sum."""
    eps, eps1, eps2, k, F = 1.0, 0.3, 0.7, 5, 50.0
    mech = StructureFirst(epsilon=eps, k=k, epsilon1=eps1, epsilon2=eps2, F=F)
    used = []
    real = hb.exponential_mechanism

    def spy(scores, epsilon, sensitivity, gen):
        used.append((epsilon, sensitivity, len(scores)))
        return real(scores, epsilon, sensitivity, gen)

    monkeypatch.setattr(hb, "exponential_mechanism", spy)
    h = np.random.default_rng(1).integers(0, 60, 30)
    z = np.array([4, -13, 22, 0, -7])
    noise = ScriptedNoise(monkeypatch, [z])
    rel = mech.release_counts(h, np.random.default_rng(2))
    assert len(used) == k - 1
    assert all(e == pytest.approx(eps1 / (k - 1)) and s == 2 * F + 1 for e, s, _ in used)
    assert sum(e for e, _, _ in used) == pytest.approx(eps1)
    # one noise call: k integer group sums of sensitivity 1 at eps2, each moved by its draw
    assert noise.calls == [(1, eps2, k)]
    groups = rel["groups"].value
    assert groups.max() + 1 == k and np.all(np.diff(groups) >= 0)  # contiguous, in order
    assert_group_noise(rel, h, groups, z)
    assert_group_stderr(rel, groups, eps2)
    g = mech.guarantee
    assert g.kind == CENTRAL and g.epsilon == pytest.approx(sum(rel["epsilon_spent"].value))
    assert tuple(rel["epsilon_spent"].value) == (eps1, eps2)
    assert g.params["epsilon1"] == eps1 and g.params["epsilon2"] == eps2


@pytest.mark.parametrize("k", [1, 6])
def test_structure_first_forced_structure_spends_all_on_the_sums(monkeypatch, k):
    monkeypatch.setattr(hb, "exponential_mechanism", lambda *a: pytest.fail("no choice"))
    h = np.array([3, 1, 4, 1, 5, 9])
    mech = StructureFirst(epsilon=0.8, k=k, F=10)
    z = np.arange(k) - k // 2
    noise = ScriptedNoise(monkeypatch, [z])
    rel = mech.release_counts(h, np.random.default_rng(0))
    assert tuple(rel["epsilon_spent"].value) == (0.0, 0.8) and noise.calls == [(1, 0.8, k)]
    assert rel["groups"].value.max() + 1 == k
    np.testing.assert_allclose(group_sums(rel["histogram"].value, rel["groups"].value),
                               group_sums(h, rel["groups"].value) + z)


def test_structure_first_default_split_is_even_and_partial_split_completes():
    assert StructureFirst(epsilon=1.0, k=2, F=5).budget == (0.5, 0.5)
    assert StructureFirst(epsilon=1.0, k=2, F=5, epsilon1=0.2).budget == pytest.approx((0.2, 0.8))
    assert StructureFirst(epsilon=1.0, k=2, F=5, epsilon2=0.9).budget == pytest.approx((0.1, 0.9))


def test_structure_first_structure_reads_counts_clipped_to_F():
    """Counts above F only enter the structure step as F: the same seed gives the same
    structure for a histogram and its clipped copy (the published values differ)."""
    h = np.array([0, 40, 2, 90, 7, 3, 55, 1])
    F = 10
    mech = StructureFirst(epsilon=2.0, k=3, F=F)
    for seed in range(20):
        a = mech.release_counts(h, seed)
        b = mech.release_counts(np.minimum(h, F), seed)
        np.testing.assert_array_equal(a["starts"].value, b["starts"].value)


def test_structure_first_without_F_has_no_established_guarantee():
    mech = StructureFirst(epsilon=1.0, k=3)
    g = mech.guarantee
    assert g.kind == NONE and math.isinf(g.epsilon)
    assert "2F + 1" in g.notes and "maximum count" in g.notes and g.claim
    rel = mech.release_counts(np.array([5, 0, 7, 7, 1, 30]), 3)  # runs, with F = max count
    assert rel["histogram"].value.shape == (6,)
    assert StructureFirst(epsilon=1.0, k=3, F=100).guarantee.kind == CENTRAL


def test_structure_first_total_is_unbiased():
    """Given the structure, the published sum of a group is its true sum + Lap(1/eps2), so the
    published total minus the true total has mean 0 and SD sqrt(2k)/eps2."""
    h = np.random.default_rng(8).integers(0, 30, 50)
    k, eps2 = 6, 0.5
    mech = StructureFirst(epsilon=1.0, k=k, F=30)
    R = 1500
    d = np.array([mech.release_counts(h, np.random.default_rng(s))["histogram"].value.sum()
                  - h.sum() for s in range(R)])
    sd = math.sqrt(2 * k) / eps2
    assert abs(d.mean()) < Z * sd / math.sqrt(R)
    # relative SE of a sample SD: sqrt((2 + excess kurtosis) / R) / 2; a sum of k Laplace draws
    # has excess kurtosis 3 / k
    assert d.std() == pytest.approx(sd, rel=Z * math.sqrt((2 + 3 / k) / R) / 2)


# =========================================================================== AHP
def reference_err_star(x, eps2):
    """A scalar transcription of AHP's err* with early termination (DPBench's loop, with the
    longest cluster n - j in the bound)."""
    n = len(x)
    c = 2.0 / eps2 ** 2
    out = []
    for j in range(n):
        bound = c / (n - j) ** 2
        best = last1 = last2 = None
        for l in range(j, n):
            length = l - j + 1
            e1 = (x[j] - np.mean(x[j:l + 1])) ** 2
            e2 = c / length ** 2
            if l > j and e1 - last1 >= last2 - bound:
                break
            best = e1 + e2 if best is None else min(best, e1 + e2)
            last1, last2 = e1, e2
        out.append(best)
    return np.array(out)


def reference_greedy(x, eps2):
    n = len(x)
    c = 2.0 / eps2 ** 2
    star = reference_err_star(x, eps2)

    def err(i, j):  # inclusive
        return sse(x[i:j + 1]) + c / (j - i + 1)

    gid, g, i = np.zeros(n, dtype=np.int64), 0, 0
    for j in range(1, n):
        if err(i, j) >= err(i, j - 1) + star[j]:
            g, i = g + 1, j
        gid[j] = g
    return gid


@pytest.mark.parametrize("seed", range(6))
def test_ahp_err_star_and_greedy_match_scalar_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    eps2 = float(rng.choice([0.05, 0.3, 1.0, 4.0]))
    x = np.sort(np.concatenate([np.zeros(n // 3), rng.gamma(1.0, 20.0, n - n // 3)]))
    np.testing.assert_allclose(ahp_err_star(x, eps2), reference_err_star(x, eps2), rtol=1e-9)
    np.testing.assert_array_equal(ahp_greedy_cluster(x, eps2), reference_greedy(x, eps2))


def test_ahp_greedy_separates_distinct_levels():
    x = np.repeat([0.0, 100.0, 1000.0], 20)
    gid = ahp_greedy_cluster(x, 1.0)
    assert gid.max() + 1 == 3 and np.all(np.diff(gid[::20]) == 1)


def test_ahp_threshold_rule():
    n, eta, eps1 = 100, 0.35, 0.5
    cut = eta * math.log(n) / eps1
    v = np.linspace(-5, 10, n)
    t = ahp_threshold(v, eta, eps1)
    np.testing.assert_array_equal(t, np.where(v <= cut, 0.0, v))
    assert np.all(t[v > cut] == v[v > cut]) and np.all(t[v <= cut] == 0)


def test_ahp_grouping_depends_on_data_only_through_the_noisy_view(monkeypatch):
    rng = np.random.default_rng(21)
    n = 64
    view = np.rint(rng.gamma(0.8, 15.0, n) + rng.laplace(0, 2, n)).astype(np.int64)
    h1 = rng.integers(0, 40, n)
    h2 = rng.integers(0, 40, n)
    mech = AHP(epsilon=0.5)
    ScriptedNoise(monkeypatch, [view - h1])
    r1 = mech.release_counts(h1, np.random.default_rng(1))
    ScriptedNoise(monkeypatch, [view - h2])
    r2 = mech.release_counts(h2, np.random.default_rng(99))
    np.testing.assert_allclose(r1["view"].value, view)
    np.testing.assert_allclose(r2["view"].value, view)
    np.testing.assert_array_equal(r1["groups"].value, r2["groups"].value)
    np.testing.assert_array_equal(r1["groups"].value, mech.group_view(view))
    assert r1["groups"].value.max() >= 1  # a non-trivial grouping
    # while the histograms differ, and so do the published group means
    assert not np.allclose(r1["histogram"].value, r2["histogram"].value)


def test_ahp_privacy_accounting(monkeypatch):
    eps = 1.0
    mech = AHP(epsilon=eps)
    e1, e2 = mech.budget
    assert (e1, e2) == pytest.approx((0.85, 0.15))  # the default split
    h = np.random.default_rng(2).integers(0, 50, 40)
    noise = ScriptedNoise(monkeypatch)
    rel = mech.release_counts(h, np.random.default_rng(4))
    groups = rel["groups"].value
    k = int(groups.max()) + 1
    # the view: noise of sensitivity 1 at eps1 per bucket; then the k group sums at eps2
    assert noise.calls == [(1, e1, h.size), (1, e2, k)]
    z = np.random.default_rng(0).integers(-20, 21, k)
    ScriptedNoise(monkeypatch, [np.rint(rel["view"].value - h), z])
    rel2 = mech.release_counts(h, np.random.default_rng(4))
    np.testing.assert_array_equal(rel2["groups"].value, groups)
    assert_group_noise(rel2, h, groups, z)
    assert_group_stderr(rel, groups, e2)
    g = mech.guarantee
    assert g.kind == CENTRAL and g.epsilon == pytest.approx(e1 + e2) and g.epsilon == eps
    assert g.params == {"epsilon1": e1, "epsilon2": e2, "eta": 0.35, "unit": "record",
                        "contribution_bounds": {"max_partitions_per_unit": 1,
                                                "max_rows_per_partition": 1},
                        "unit_sensitivity": 1}


def test_ahp_published_group_sums_are_unbiased():
    """Given the grouping (a function of the view only, independent of the eps2 draws), the
    published total minus the true total is a sum of K Laplace(1/eps2) draws: standardized by
    sqrt(2K)/eps2 it has mean 0 and variance 1."""
    h = np.random.default_rng(9).integers(0, 25, 60)
    mech = AHP(epsilon=0.4)
    _, e2 = mech.budget
    R = 1500
    t = []
    for s in range(R):
        rel = mech.release_counts(h, np.random.default_rng(s))
        k = rel["groups"].value.max() + 1
        t.append((rel["histogram"].value.sum() - h.sum()) / (math.sqrt(2 * k) / e2))
    t = np.array(t)
    assert abs(t.mean()) < Z / math.sqrt(R)


def test_ahp_on_a_flat_histogram_makes_few_groups():
    """A constant histogram with a moderate budget: the sorted view is nearly flat and the
    greedy rule merges almost everything (the Laplace-error term dominates)."""
    h = np.full(200, 30)
    rel = AHP(epsilon=1.0).release_counts(h, 3)
    assert rel["groups"].value.max() + 1 <= 20


# =========================================================================== common contracts
@pytest.mark.parametrize("mech", [StructureFirst(epsilon=0.7, k=3, F=100, bins=8, lower=0.0,
                                                 upper=1.0),
                                  AHP(epsilon=0.7, bins=8, lower=0.0, upper=1.0)],
                         ids=["structure-first", "ahp"])
def test_frozen_picklable_and_estimator_finalize(mech):
    assert dataclasses.is_dataclass(mech)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mech.epsilon = 2.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(mech)) == mech
    assert mech.params()["epsilon"] == 0.7 and mech.name in ("structure-first", "ahp")
    est = HistogramReleaseEstimator(mech, seed=5)
    acc = np.array([4, 0, 9, 9, 2, 0, 1, 30])
    out = est.finalize(acc)
    hist = out.statistics["histogram"].value
    assert hist.shape == (8,) and hist.dtype == np.float64
    assert out.guarantee == mech.guarantee
    again = HistogramReleaseEstimator(mech, seed=5).finalize(acc)
    np.testing.assert_array_equal(again.statistics["histogram"].value, hist)


@pytest.mark.parametrize("make", [lambda: StructureFirst(epsilon=1.0, k=2, F=10),
                                  lambda: AHP(epsilon=1.0)], ids=["structure-first", "ahp"])
@pytest.mark.parametrize("bad,what", [([1, -2, 3], "non-negative integer"),
                                      ([1.5, 2, 3], "non-negative integer"),
                                      ([[1, 2], [3, 4]], "1-D"), ([], "1-D"),
                                      ([1, np.nan, 3], "non-negative integer")])
def test_bad_counts_are_rejected(make, bad, what):
    with pytest.raises(ParameterError, match=what) as e:
        make().release_counts(np.array(bad), 0)
    assert e.value.name == "counts"


@pytest.mark.parametrize("kwargs,name", [
    ({"epsilon": 0.0, "k": 2}, "epsilon"),
    ({"epsilon": -1.0, "k": 2}, "epsilon"),
    ({"epsilon": math.inf, "k": 2}, "epsilon"),
    ({"epsilon": 1.0, "k": 2, "epsilon1": 0.3, "epsilon2": 0.3}, "epsilon1"),
    ({"epsilon": 1.0, "k": 2, "epsilon1": 1.0}, "epsilon1"),
    ({"epsilon": 1.0, "k": 2, "epsilon2": -0.1}, "epsilon2"),
    ({"epsilon": 1.0}, "k"),
    ({"epsilon": 1.0, "k": 0}, "k"),
    ({"epsilon": 1.0, "k": 2.0}, "k"),
    ({"epsilon": 1.0, "k": True}, "k"),
    ({"epsilon": 1.0, "k": 2, "F": 0}, "F"),
    ({"epsilon": 1.0, "k": 2, "F": -3}, "F"),
    ({"epsilon": 1.0, "k": 2, "F": math.nan}, "F"),
])
def test_structure_first_bad_parameters(kwargs, name):
    with pytest.raises(ParameterError) as e:
        StructureFirst(**kwargs)
    assert e.value.name == name and repr(name) in str(e.value)


def test_structure_first_k_above_n_at_release():
    mech = StructureFirst(epsilon=1.0, k=5, F=10)
    with pytest.raises(ParameterError, match=r"\[1, 4\]") as e:
        mech.release_counts(np.array([1, 2, 3, 4]), 0)
    assert e.value.name == "k"


@pytest.mark.parametrize("kwargs,name", [
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": 1.0, "epsilon1": 0.5, "epsilon2": 0.6}, "epsilon1"),
    ({"epsilon": 1.0, "epsilon1": 0.0}, "epsilon1"),
    ({"epsilon": 1.0, "eta": -0.1}, "eta"),
    ({"epsilon": 1.0, "eta": math.inf}, "eta"),
])
def test_ahp_bad_parameters(kwargs, name):
    with pytest.raises(ParameterError) as e:
        AHP(**kwargs)
    assert e.value.name == name
