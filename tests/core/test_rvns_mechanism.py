"""RVNS mechanism: density, perturbation, shared window, privacy analysis, the paper's adversary.

Tolerances: Monte Carlo checks use chi-square / binomial tests at p = 1e-4 (or 4.5 standard
errors) with fixed seeds; exact computations are compared at rounding level (1e-9 or tighter).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from ldp_beam.errors import InvalidRecordsError, ParameterError
from ldp_beam.mechanisms import rvns as R
from ldp_beam.mechanisms.rvns import (RVNS, WorstCase, rvns_box_probability, rvns_density,
                                      rvns_interval_probability, rvns_joint_density,
                                      rvns_neighbourhood_epsilon, rvns_paper_epsilon,
                                      rvns_worst_case)
from ldp_beam.privacy import NEIGHBOURHOOD_LDP
from ldp_beam.reproduce.adversary import (euclidean_distance, infer_rvns, noise_adding_inferred,
                                          reports_matrix, rvns_privacy_metric)

# (a, b, d): a typical case, d > (b - a)/2, a unit domain, a shifted domain
CONFIGS = [(0.0, 10.0, 2.0), (0.0, 10.0, 7.0), (0.0, 1.0, 0.3), (-5.0, 5.0, 0.5)]
P_MIN = 1e-4


def probe_points(a, b, d):
    """Inputs that exercise every case: both boundaries (degenerate window), just inside them,
    the kinks a + d and b - d, the middle, and a generic point."""
    return [a, a + 1e-9, a + 0.3 * d, a + d, (a + b) / 2, b - d, b - 0.1 * d, b - 1e-9, b,
            a + 0.37 * (b - a)]


def _kinks(x, a, b, d, extra=()):
    """Where p(x, .) can change slope or jump: a, b and the ends of the window's travel."""
    lo, hi = max(0.0, x + d - b), min(d, x - a)
    pts = np.array([a, b, x - hi, x - lo, x + d - hi, x + d - lo, *extra])
    return np.unique(np.clip(pts, a, b))


def integrate_density(x, lo, hi, a, b, d):
    """Integral of rvns_density(x, .) over [lo, hi] by the midpoint rule on each piece between
    kinks: exact for a piecewise-linear function, and never evaluates at a jump."""
    pts = _kinks(x, a, b, d, (lo, hi))
    pts = pts[(pts >= lo) & (pts <= hi)]
    mids = (pts[1:] + pts[:-1]) / 2
    return float(np.sum(np.diff(pts) * rvns_density(x, mids, a, b, d)))


# --------------------------------------------------------------------------- the density
@pytest.mark.parametrize("a,b,d", CONFIGS)
def test_density_integrates_to_one(a, b, d):
    for x in probe_points(a, b, d):
        assert integrate_density(x, a, b, a, b, d) == pytest.approx(1.0, abs=1e-12), x
        # the same without knowing the kinks: a fine trapezoid (error O(h) at the jump of x = a, b)
        y = np.linspace(a, b, 200_001)
        assert np.trapezoid(rvns_density(x, y, a, b, d), y) == pytest.approx(1.0, abs=1e-4)
        assert rvns_interval_probability(x, a, b, a, b, d) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("a,b,d", CONFIGS)
def test_interval_probability_is_the_integral_of_the_density(a, b, d):
    rng = np.random.default_rng(3)
    ends = np.sort(rng.uniform(a, b, (40, 2)), axis=1)
    for x in probe_points(a, b, d):
        exact = rvns_interval_probability(x, ends[:, 0], ends[:, 1], a, b, d)
        ref = [integrate_density(x, lo, hi, a, b, d) for lo, hi in ends]
        np.testing.assert_allclose(exact, ref, rtol=0, atol=1e-12)


def test_density_is_zero_where_every_window_covers_y():
    a, b, d = 0.0, 10.0, 2.0
    assert np.all(rvns_density(a, np.linspace(a, a + d, 50), a, b, d) == 0)  # x = a: [a, a + d]
    assert np.all(rvns_density(b, np.linspace(b - d, b, 50), a, b, d) == 0)
    a, b, d = 0.0, 10.0, 7.0  # d > (b - a)/2: every input excludes [b - d, a + d] = [3, 7]
    for x in probe_points(a, b, d):
        assert rvns_interval_probability(x, b - d, a + d, a, b, d) == pytest.approx(0, abs=1e-15)


# --------------------------------------------------------------------------- the perturbation
def _chi2_pvalue(sample, x, a, b, d, bins=50):
    edges = np.linspace(a, b, bins + 1)
    counts = np.histogram(sample, edges)[0]
    probs = rvns_interval_probability(x, edges[:-1], edges[1:], a, b, d)
    zero = probs < 1e-12
    assert counts[zero].sum() == 0, "reports where the density vanishes"
    exp = probs[~zero] / probs[~zero].sum() * counts[~zero].sum()
    stat = float(np.sum((counts[~zero] - exp) ** 2 / exp))
    return stats.chi2.sf(stat, int((~zero).sum()) - 1)


@pytest.mark.parametrize("a,b,d", [(0.0, 10.0, 2.0), (0.0, 10.0, 7.0), (0.0, 1.0, 0.3)])
def test_perturb_matches_the_density(a, b, d):
    for i, x in enumerate([a, a + 0.3 * d, (a + b) / 2, b - 0.1 * d, b]):
        m = RVNS(lower=a, upper=b, d=d, k=1)
        rep = m.perturb(np.full(100_000, x), rng=100 + i)["y1"]
        assert _chi2_pvalue(rep, x, a, b, d) > P_MIN, x
    # with k = 3 every report has the same marginal density
    m = RVNS(lower=a, upper=b, d=d, k=3)
    x = a + 0.4 * (b - a)
    rep = m.perturb(np.full(60_000, x), rng=7)
    for j in (1, 2, 3):
        assert _chi2_pvalue(rep[f"y{j}"], x, a, b, d) > P_MIN


@pytest.mark.parametrize("a,b,d", CONFIGS)
def test_reports_avoid_the_window_and_stay_in_the_domain(a, b, d):
    m = RVNS(lower=a, upper=b, d=d, k=4)
    rng = np.random.default_rng(5)
    n = 50_000
    x = np.concatenate([np.full(100, a), np.full(100, b), rng.uniform(a, b, n - 200)])
    u = rng.random((n, m.draws))
    rep = m.randomize({"value": x}, u)
    lo, hi = np.maximum(0.0, x + d - b), np.minimum(d, x - a)
    left = x - (lo + u[:, 0] * (hi - lo))  # the window the mechanism drew
    assert np.all((left >= a - 1e-12) & (left + d <= b + 1e-12) & (left <= x) & (x <= left + d))
    for j in range(m.k):
        y = rep[f"y{j + 1}"]
        assert y.dtype == np.float64
        assert np.all((y >= a) & (y <= b))
        assert np.all((y < left) | (y >= left + d))
    # through perturb(): the boundary inputs' windows are fixed
    ya = m.perturb(np.full(20_000, a), rng=1)
    yb = m.perturb(np.full(20_000, b), rng=2)
    for j in range(m.k):
        assert ya[f"y{j + 1}"].min() >= a + d
        assert yb[f"y{j + 1}"].max() <= b - d


def test_reports_share_one_window():
    """For x in the middle, a window containing x that misses y1 < x < y2 needs y2 - y1 > d.
    With one shared window no user ever has two reports straddling x closer than d; with a
    window per report (k independent runs) that happens to about 0.5% of users."""
    a, b, d, x, n = 0.0, 10.0, 2.0, 5.0, 100_000

    def straddling(y1, y2):
        lo, hi = np.minimum(y1, y2), np.maximum(y1, y2)
        return int(np.sum((lo < x) & (x < hi) & (hi - lo < d)))

    shared = RVNS(lower=a, upper=b, d=d, k=2).perturb(np.full(n, x), rng=11)
    assert straddling(shared["y1"], shared["y2"]) == 0
    one = RVNS(lower=a, upper=b, d=d, k=1)
    ind1, ind2 = one.perturb(np.full(n, x), rng=12)["y1"], one.perturb(np.full(n, x), rng=13)["y1"]
    assert straddling(ind1, ind2) > 100


def test_box_probability_matches_monte_carlo_with_shared_window():
    a, b, d, n = 0.0, 10.0, 2.0, 200_000
    m = RVNS(lower=a, upper=b, d=d, k=3)
    boxes = [([4.0, 5.5, 0.0], [4.9, 6.5, 10.0]), ([3.0, 0.0, 6.0], [5.0, 4.0, 7.0]),
             ([0.0, 0.0, 0.0], [2.5, 2.5, 2.5]), ([4.2, 4.2, 5.1], [4.8, 5.0, 5.9])]
    for i, x in enumerate([a, 1.0, 5.0, 9.5, b]):
        rep = m.perturb(np.full(n, x), rng=20 + i)
        y = np.column_stack([rep["y1"], rep["y2"], rep["y3"]])
        for lo, hi in boxes:
            lo, hi = np.array(lo), np.array(hi)
            p = float(rvns_box_probability(x, lo, hi, a, b, d))
            hits = int(np.all((y >= lo) & (y <= hi), axis=1).sum())
            if p == 0:
                assert hits == 0
            else:
                assert stats.binomtest(hits, n, p).pvalue > P_MIN, (x, lo, hi, hits / n, p)


def test_joint_density_is_not_the_product_of_marginals():
    a, b, d = 0.0, 10.0, 2.0
    rng = np.random.default_rng(8)
    # k = 1: the joint density is the density
    xs, ys = rng.uniform(a, b, 500), rng.uniform(a, b, 500)
    np.testing.assert_allclose(rvns_joint_density(xs, ys[:, None], a, b, d),
                               rvns_density(xs, ys, a, b, d), atol=1e-12)
    for x in (a, b):
        np.testing.assert_allclose(rvns_joint_density(x, ys[:, None], a, b, d),
                                   rvns_density(x, ys, a, b, d), atol=1e-12)
    # two reports 1 apart around x = 5: impossible with one window, likely with two
    y = np.array([4.5, 5.5])
    assert rvns_joint_density(5.0, y, a, b, d) == 0
    assert np.prod(rvns_density(5.0, y, a, b, d)) > 0
    # the joint density integrates to the box probability (2-D midpoint rule, O(h) at jumps)
    g = (np.arange(400) + 0.5) / 400
    for x in (a, 3.0, 5.0):
        for lo, hi in [((3.0, 5.0), (5.0, 8.0)), ((0.0, 0.0), (10.0, 10.0))]:
            y1 = lo[0] + (hi[0] - lo[0]) * g
            y2 = lo[1] + (hi[1] - lo[1]) * g
            Y = np.stack(np.meshgrid(y1, y2, indexing="ij"), axis=-1)
            num = rvns_joint_density(x, Y, a, b, d).mean() * (hi[0] - lo[0]) * (hi[1] - lo[1])
            assert num == pytest.approx(float(rvns_box_probability(x, lo, hi, a, b, d)),
                                        rel=0.01, abs=1e-4)


# --------------------------------------------------------------------------- privacy analysis
# (a, b, d, delta) -> the closed form: inf iff delta <= d, else ln(min(delta, b-a-d)/(delta-d))
EPS_CASES = [(0.0, 10.0, 2.0, 0.1), (0.0, 10.0, 2.0, 2.0), (0.0, 10.0, 2.0, 3.0),
             (0.0, 10.0, 2.0, 4.0), (0.0, 10.0, 2.0, 9.0), (0.0, 10.0, 7.0, 8.0),
             (0.0, 10.0, 4.0, 8.0), (0.0, 1.0, 0.3, 0.5), (0.0, 10.0, 0.5, 10.0)]


@pytest.mark.parametrize("a,b,d,delta", EPS_CASES)
@pytest.mark.parametrize("centers", ["domain", "interior"])
def test_numerical_worst_case_matches_the_closed_form(a, b, d, delta, centers):
    exact = rvns_neighbourhood_epsilon(a, b, d, delta, centers=centers)
    wc = rvns_worst_case(a, b, d, delta, centers=centers)
    assert isinstance(wc, WorstCase)
    if math.isinf(exact):
        assert math.isinf(wc.epsilon)
    else:
        assert wc.epsilon == pytest.approx(exact, abs=1e-9)
    short = min(delta if centers == "domain" else 2 * delta, b - a)
    assert math.isinf(exact) == (short <= d)


def test_closed_form_values_and_the_papers_claim():
    e = rvns_neighbourhood_epsilon
    assert e(0, 10, 2, 3) == pytest.approx(math.log(3))  # delta/(delta - d)
    assert e(0, 10, 2, 3, k=4) == pytest.approx(4 * math.log(3))
    assert e(0, 10, 7, 8) == pytest.approx(math.log(3 / 1))  # (b - a - d)/(delta - d)
    assert e(0, 10, 2, 10) == 0
    # where delta + d <= b - a the true value is >= the claim, with equality only at delta = 2d
    for delta in np.linspace(2.05, 8.0, 40):
        assert e(0, 10, 2, delta) >= rvns_paper_epsilon(2, delta) - 1e-12
    assert e(0, 10, 2, 4) == pytest.approx(rvns_paper_epsilon(2, 4))
    assert e(0, 10, 4, 8) < rvns_paper_epsilon(4, 8)  # delta + d > b - a: can hold


def _ratio_by_quadrature(x1, x2, lo, hi, a, b, d):
    return integrate_density(x1, lo, hi, a, b, d) / integrate_density(x2, lo, hi, a, b, d)


def test_worst_case_against_an_independent_brute_force():
    """Interval probabilities by quadrature of rvns_density itself (not the analysis code) on a
    grid of inputs and neighbourhood centres: the largest ratio equals the computed worst case
    and nothing exceeds it."""
    a, b, d, delta = 0.0, 10.0, 2.0, 3.0
    xs = np.unique(np.r_[np.linspace(a, b, 21), a + d, b - d])
    ys = np.linspace(a, b, 41)
    probs = np.array([[integrate_density(x, max(a, y - delta), min(b, y + delta), a, b, d)
                       for y in ys] for x in xs])
    brute = math.log(np.max(probs.max(axis=0) / probs.min(axis=0)))
    assert brute == pytest.approx(rvns_worst_case(a, b, d, delta).epsilon, abs=1e-9)
    assert brute == pytest.approx(math.log(3), abs=1e-9)


def test_worst_case_by_monte_carlo():
    """delta = 3 > d = 2 on [0, 10]: the neighbourhood of y = 0 is [0, 3]; x = 0 lands there with
    probability 1/8 and x = 10 with 3/8, so epsilon = ln 3 (the paper claims ln(8/3))."""
    a, b, d, delta, n = 0.0, 10.0, 2.0, 3.0, 400_000
    m = RVNS(lower=a, upper=b, d=d, k=1)
    p0 = np.mean(m.perturb(np.full(n, a), rng=31)["y1"] <= a + delta)
    p1 = np.mean(m.perturb(np.full(n, b), rng=32)["y1"] <= a + delta)
    se = math.sqrt((1 - p0) / (n * p0) + (1 - p1) / (n * p1))
    assert abs(math.log(p1 / p0) - math.log(3)) < 4.5 * se
    assert math.log(p1 / p0) > rvns_paper_epsilon(d, delta) + 10 * se


def test_no_finite_epsilon_when_delta_is_at_most_d():
    a, b, d, delta, n = 0.0, 10.0, 2.0, 1.0, 200_000
    m = RVNS(lower=a, upper=b, d=d, k=1)
    # x = a never reports within delta of y = a; x = b does, a quarter of the time... 1/8 here
    assert np.sum(m.perturb(np.full(n, a), rng=41)["y1"] <= a + delta) == 0
    hits = np.sum(m.perturb(np.full(n, b), rng=42)["y1"] <= a + delta)
    assert stats.binomtest(int(hits), n, delta / (b - a - d)).pvalue > P_MIN
    # not an artefact of the boundary point: for x2 = a + e the ratio is exactly 2 delta / e
    for e in (1e-1, 1e-2, 1e-3):
        r = float(rvns_interval_probability(b, a, a + delta, a, b, d)
                  / rvns_interval_probability(a + e, a, a + delta, a, b, d))
        assert r == pytest.approx(2 * delta / e, rel=1e-9)
        assert _ratio_by_quadrature(b, a + e, a, a + delta, a, b, d) == pytest.approx(r, rel=1e-9)
    # and with interior neighbourhoods only, 2 delta <= d still leaves a zero-probability one
    assert math.isinf(rvns_worst_case(a, b, d, 0.9, centers="interior").epsilon)


def test_k_reports_worst_case_is_k_times_one_report():
    for a, b, d, delta in [(0.0, 10.0, 2.0, 3.0), (0.0, 10.0, 7.0, 8.0)]:
        wc = rvns_worst_case(a, b, d, delta, k=2)
        assert wc.epsilon == pytest.approx(rvns_neighbourhood_epsilon(a, b, d, delta, k=2),
                                           abs=1e-9)
        assert wc.epsilon == pytest.approx(2 * rvns_neighbourhood_epsilon(a, b, d, delta),
                                           abs=1e-9)
    wc3 = rvns_worst_case(0.0, 10.0, 2.0, 5.0, k=3, nx=41, ny=11)
    assert wc3.epsilon == pytest.approx(3 * math.log(5 / 3), abs=1e-9)


def test_interior_inputs_one_report_finite_but_shared_window_breaks_k2():
    """Inputs restricted to [a + d, b - d]: one report gives ln(2d/delta) (when b - a >= 3d +
    delta); two reports in [x - 2 delta, x] x [x, x + 2 delta] rule x out when 4 delta <= d."""
    a, b, d = 0.0, 10.0, 2.0
    inner = (a + d, b - d)
    for delta in (0.25, 0.5, 1.0):
        wc = rvns_worst_case(a, b, d, delta, inputs=inner)
        assert wc.epsilon == pytest.approx(math.log(2 * d / delta), abs=1e-9)
    wc2 = rvns_worst_case(a, b, d, 0.5, k=2, inputs=inner)
    assert math.isinf(wc2.epsilon)
    x = wc2.x2
    assert float(rvns_box_probability(x, [x - 1.0, x], [x, x + 1.0], a, b, d)) == 0


def test_guarantee_reports_the_analysis():
    g = RVNS(lower=0.0, upper=1.0, d=0.2, delta=0.01).guarantee  # the old defaults: delta <= d
    assert g.kind == NEIGHBOURHOOD_LDP and math.isinf(g.epsilon)
    assert "No finite epsilon" in g.notes and "delta > d" in g.notes
    assert g.params["neighbourhood_delta"] == 0.01 and "delta" not in g.params
    assert g.claim == f"k ln(4d/delta) = {math.log(4 * 0.2 / 0.01):.4g}"
    json.dumps(g.to_dict(), allow_nan=False)

    g = RVNS(lower=0.0, upper=10.0, d=2.0, k=3, delta=3.0).guarantee
    assert g.epsilon == pytest.approx(3 * math.log(3))
    assert "violated" in g.notes and g.params["paper_epsilon"] == pytest.approx(3 * math.log(8 / 3))
    g = RVNS(lower=0.0, upper=10.0, d=2.0, k=1, delta=4.0).guarantee
    assert g.epsilon == pytest.approx(math.log(2)) and "tight" in g.notes
    g = RVNS(lower=0.0, upper=10.0, d=4.0, k=1, delta=8.0).guarantee
    assert g.epsilon == pytest.approx(math.log(1.5)) and "holds" in g.notes
    g = RVNS(lower=0.0, upper=10.0, d=2.0, k=2, delta=0.1).guarantee
    assert "4 delta <= d" in g.notes and f"{math.log(40):.4g}" in g.notes
    json.dumps(g.to_dict(), allow_nan=False)


def test_guarantee_is_cached():
    m = RVNS(lower=0.0, upper=7.0, d=1.5, k=2, delta=0.25)
    before = R._guarantee_terms.cache_info().hits
    g1, g2 = m.guarantee, m.guarantee
    assert R._guarantee_terms.cache_info().hits == before + 1
    assert g1 == g2 and g1.params is not g2.params  # a fresh params dict per call


def test_analysis_parameters_are_validated():
    with pytest.raises(ParameterError, match="'delta'"):
        rvns_neighbourhood_epsilon(0, 10, 2, 0)
    with pytest.raises(ParameterError, match="'d'"):
        rvns_worst_case(0, 10, 10, 1)
    with pytest.raises(ParameterError, match="'centers'"):
        rvns_worst_case(0, 10, 2, 1, centers="all")
    with pytest.raises(ParameterError, match="'inputs'"):
        rvns_worst_case(0, 10, 2, 1, inputs=(-1, 5))
    with pytest.raises(ParameterError, match="'k'"):
        rvns_neighbourhood_epsilon(0, 10, 2, 1, k=0)


# --------------------------------------------------------------------------- the adversary
def test_adversary_likelihood_is_the_density_product():
    from ldp_beam.reproduce.adversary import _loglik_joint, _loglik_marginal

    a, b, d = 0.0, 10.0, 2.0
    m = RVNS(lower=a, upper=b, d=d, k=3)
    y = reports_matrix(m.perturb(np.random.default_rng(2).uniform(a, b, 60), rng=3), 3)
    xg = np.linspace(a, b, 201)
    c = b - a - d
    with np.errstate(divide="ignore"):
        marg = np.log(np.prod(rvns_density(xg[None, :, None], y[:, None, :], a, b, d) * c, -1))
        joint = np.log(rvns_joint_density(xg[None, :], y[:, None, :], a, b, d) * c ** 3)
    np.testing.assert_allclose(_loglik_marginal(xg, y, a, b, d), marg, atol=1e-9)
    np.testing.assert_allclose(_loglik_joint(xg, y, a, b, d), joint, atol=1e-9)


def test_adversary_ties_are_broken_deterministically():
    m = RVNS(lower=0.0, upper=10.0, d=1.0, k=1)
    # y = 5: every x at distance >= 1 from 5 is a maximizer: [0, 4] and [6, 10]
    assert infer_rvns(m, np.array([5.0]))[0] == pytest.approx(4.0)  # median: a maximizer
    assert infer_rvns(m, np.array([5.0]), tie="mean")[0] == pytest.approx(5.0)  # not one
    # y = 0.5: maximizers [1.5, 10]
    assert infer_rvns(m, np.array([0.5]))[0] == pytest.approx(5.75)
    # chunking does not change the answer
    m3 = RVNS(lower=0.0, upper=10.0, d=2.0, k=3)
    rep = m3.perturb(np.random.default_rng(4).uniform(0, 10, 500), rng=5)
    for lik in ("marginal", "joint"):
        np.testing.assert_array_equal(infer_rvns(m3, rep, likelihood=lik),
                                      infer_rvns(m3, rep, likelihood=lik, max_elements=3000))


def test_adversary_error_shrinks_with_k():
    """Uniform values on [0, 10], d = 2. Guessing the midpoint has RMSE 10/sqrt(12) = 2.89.
    With many reports the gap around x is pinned down and the error falls well below that."""
    a, b, d, n = 0.0, 10.0, 2.0, 3000
    x = np.random.default_rng(9).uniform(a, b, n)
    chance = (b - a) / math.sqrt(12)
    rmse = {}
    for k in (1, 20, 50):
        m = RVNS(lower=a, upper=b, d=d, k=k)
        rep = m.perturb(x, rng=10 + k)
        for lik in ("marginal", "joint"):
            rmse[k, lik] = euclidean_distance(x, infer_rvns(m, rep, grid=501,
                                                            likelihood=lik)) / math.sqrt(n)
        post = infer_rvns(m, rep, grid=501, likelihood="joint", point="posterior_mean")
        rmse[k, "posterior"] = euclidean_distance(x, post) / math.sqrt(n)
    for lik in ("marginal", "joint", "posterior"):
        assert rmse[1, lik] > 0.9 * chance  # one "not here" report says little
        assert rmse[20, lik] < chance / 2
        assert rmse[50, lik] < rmse[20, lik]
    assert rmse[50, "posterior"] < rmse[50, "marginal"]


def test_metric_and_noise_adding_helper():
    assert euclidean_distance([1.0, 2.0, 3.0], [1.0, 0.0, 7.0]) == pytest.approx(math.sqrt(20))
    assert euclidean_distance(np.zeros(4), np.ones(4)) == pytest.approx(2.0)
    noisy = np.array([-1.0, 5.0, 12.0])
    np.testing.assert_array_equal(noise_adding_inferred(noisy), noisy)  # the paper: unclipped
    np.testing.assert_array_equal(noise_adding_inferred(noisy, 0, 10, clip=True), [0, 5, 10])
    assert euclidean_distance([0, 5, 10], noise_adding_inferred(noisy)) == pytest.approx(
        math.sqrt(5))
    with pytest.raises(ParameterError):
        noise_adding_inferred(noisy, clip=True)
    with pytest.raises(ParameterError):
        euclidean_distance([1, 2], [1, 2, 3])
    m = RVNS(lower=0.0, upper=10.0, d=2.0, k=2)
    x = np.array([1.0, 4.0, 9.0])
    rep = m.perturb(x, rng=1)
    assert rvns_privacy_metric(m, x, rep) == euclidean_distance(x, infer_rvns(m, rep))


def test_adversary_rejects_bad_input():
    m = RVNS(lower=0.0, upper=10.0, d=2.0, k=2)
    with pytest.raises(ParameterError, match="'reports'"):
        infer_rvns(m, np.array([[1.0, 11.0]]))
    with pytest.raises(ParameterError, match="'reports'"):
        infer_rvns(m, np.array([[1.0, 2.0, 3.0]]))
    with pytest.raises(ParameterError, match="'reports'"):
        infer_rvns(m, {"y1": np.array([1.0])})
    with pytest.raises(ParameterError, match="'likelihood'"):
        infer_rvns(m, np.array([[1.0, 2.0]]), likelihood="product")
    with pytest.raises(ParameterError, match="'mechanism'"):
        infer_rvns(object(), np.array([[1.0, 2.0]]))


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs,name", [
    (dict(d=0.0), "d"), (dict(d=-0.1), "d"), (dict(d=1.0), "d"), (dict(d=1.5), "d"),
    (dict(k=0), "k"), (dict(k=2.5), "k"), (dict(k=True), "k"), (dict(k=-1), "k"),
    (dict(delta=0.0), "delta"), (dict(delta=-0.01), "delta"), (dict(delta=1.5), "delta"),
    (dict(delta=True), "delta"), (dict(lower=1.0, upper=0.0), "lower"),
    (dict(upper=float("nan")), "upper")])
def test_parameter_validation(kwargs, name):
    with pytest.raises(ParameterError) as e:
        RVNS(**{"lower": 0.0, "upper": 1.0, **kwargs})
    assert e.value.name == name
    assert repr(name) in str(e.value)


def test_bad_values_are_flagged():
    m = RVNS(lower=0.0, upper=10.0, d=2.0, k=2)
    cols, reasons = m.check(np.array([0.0, 10.0, 5.0, np.nan, -0.1, 10.5, np.inf]))
    np.testing.assert_array_equal(reasons.bad, [False, False, False, True, True, True, True])
    msgs = reasons.as_dict()
    assert "missing" in msgs[3] and "outside" in msgs[4] and "outside" in msgs[6]
    with pytest.raises(InvalidRecordsError):
        m.perturb(np.array([1.0, np.nan]), rng=1)
    assert [f for f, _ in m.report_fields] == ["y1", "y2"]


def test_adversary_prior():
    m = RVNS(lower=0.0, upper=10.0, d=1.0, k=1)
    prior = np.zeros(1001)
    prior[300] = 1.0  # all mass on x = 3, where a report y = 8 has positive likelihood
    for point in ("argmax", "posterior_mean"):
        assert infer_rvns(m, np.array([8.0]), prior=prior, point=point)[0] == pytest.approx(3.0)
    with pytest.raises(ParameterError, match="'prior'"):
        infer_rvns(m, np.array([8.0]), prior=np.ones(10))
    with pytest.raises(ParameterError, match="'point'"):
        infer_rvns(m, np.array([8.0]), point="mode")
