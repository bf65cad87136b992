"""The RVNS paper's baselines: Laplace-DP, Gaussian-pDP (generalized Gaussian), square wave + EMS.

Every random check uses a fixed seed; goodness-of-fit tests reject at p < 1e-4 (a false alarm
once in 10,000 seeds); accuracy tolerances come from sampling-error bounds stated where used.
"""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from scipy import integrate, stats

from ldp_beam import InvalidRecordsError, ParameterError, RandomSource
from ldp_beam.estimators.continuous_baselines import (NoiseKDEEstimator, SquareWaveEMSEstimator,
                                                      binomial_smooth, buckets_to_grid, ems,
                                                      sw_transition_matrix)
from ldp_beam.estimators.density import DensityGrid, kde_on_grid, wasserstein_grid
from ldp_beam.mechanisms.continuous_baselines import (GeneralizedGaussianNoise, LaplaceNoise,
                                                      SquareWave, calibrate_gg_sigma,
                                                      gaussian_analytic_delta, gg_delta,
                                                      gg_noise_from_uniform, gg_pdp_delta,
                                                      square_wave_b)

P_MIN = 1e-4
N = 50_000


def beta_data(seed: int = 1, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).beta(2, 5, n)


def true_cells(grid: DensityGrid) -> np.ndarray:
    return np.diff(stats.beta(2, 5).cdf(grid.edges))


def w1(grid: DensityGrid, est) -> float:
    """W1 in data units between the Beta(2,5) cell masses and an estimate's density."""
    return wasserstein_grid(true_cells(grid), est["density"].value * grid.width) * grid.width


# --------------------------------------------------------------------------- noise distributions
def test_laplace_noise_matches_its_cdf():
    mech = LaplaceNoise(1.0, 0.0, 10.0)
    x = np.full(20_000, 3.0)
    z = mech.perturb(x, rng=11)["y"] - 3.0
    assert stats.kstest(z, stats.laplace(scale=10.0).cdf).pvalue > P_MIN
    assert mech.scale == 10.0 and mech.draws == 1


@pytest.mark.parametrize("p", [1.0, 1.5, 2.0, 3.5])
def test_generalized_gaussian_noise_matches_gennorm(p):
    mech = GeneralizedGaussianNoise(1.0, 0.0, 1.0, p=p, delta=None, sigma=0.7)
    z = mech.perturb(np.full(20_000, 0.25), rng=int(10 * p))["y"] - 0.25
    assert stats.kstest(z, stats.gennorm(p, scale=0.7).cdf).pvalue > P_MIN
    # the standard deviation used to size the estimator's range
    assert mech.noise_sd == pytest.approx(stats.gennorm(p, scale=0.7).std(), rel=1e-12)


def test_inverse_cdf_is_exact_symmetric_and_finite_at_the_grid_ends():
    u = np.array([0.0, 1e-9, 0.25, 0.5 - 2**-53, 0.5, 0.75, 1 - 1e-9, 1 - 2**-53])
    for p in (1.0, 2.0, 3.0):
        z = gg_noise_from_uniform(u, 1.3, p)
        assert np.all(np.isfinite(z))
        # u and 1 - u (both on the 2^-53 grid) give opposite noise; it is sorted in u
        assert z[0] == -z[-1] and z[1] == pytest.approx(-z[-2], rel=1e-6)
        assert z[2] == pytest.approx(-z[5], rel=1e-13)  # two branches of the inverse
        assert np.all(np.diff(z) > 0)
        mid = u[1:-1]  # away from the half-cell shift, the quantile function itself
        assert np.allclose(z[1:-1], stats.gennorm.ppf(mid, p, scale=1.3), rtol=1e-7, atol=1e-12)


# --------------------------------------------------------------------------- square wave
def test_square_wave_b_and_privacy_ratio():
    for eps in (1e-4, 0.01, 0.0999, 0.1, 0.5, 1.0, 5.0, 20.0):
        m = SquareWave(eps, 0.0, 1.0)
        assert m.p / m.q == pytest.approx(math.exp(eps), rel=1e-13)
        assert 2 * m.b * m.p + m.q * 1.0 == pytest.approx(1.0, rel=1e-13)  # total mass
    # closed forms: eps = 1 gives b = 1/(2e(e - 2)); b -> 1/2 as eps -> 0 (b = 1/2 - eps/3 + ...)
    assert square_wave_b(1.0) == pytest.approx(1 / (2 * math.e * (math.e - 2)), rel=1e-14)
    assert square_wave_b(1e-6) == pytest.approx(0.5 - 1e-6 / 3, rel=1e-11)
    # the small-eps series and the direct formula agree where they meet
    assert square_wave_b(0.1 - 1e-12) == pytest.approx(square_wave_b(0.1), rel=1e-9)
    # b decreases with eps
    bs = [square_wave_b(e) for e in (0.01, 0.1, 1, 3, 10)]
    assert all(a > b for a, b in zip(bs, bs[1:]))
    # density ratio over inputs and outputs: exactly e^eps at worst
    m = SquareWave(2.0, 10.0, 20.0)
    x = np.linspace(10, 20, 41)[:, None]
    y = np.linspace(-m.b, 1 + m.b, 401)[None, :]
    d = m.density(y, x)
    assert d.min() > 0
    assert (d.max(axis=0) / d.min(axis=0)).max() == pytest.approx(math.exp(2.0), rel=1e-12)
    assert m.guarantee.epsilon == 2.0 and m.guarantee.delta == 0.0


@pytest.mark.parametrize("v", [0.0, 0.3, 1.0])
def test_square_wave_output_matches_p_q_form(v):
    m = SquareWave(1.5, 0.0, 1.0)
    y = m.perturb(np.full(40_000, v), rng=int(100 * v) + 7)["y"]
    assert y.min() >= -m.b and y.max() <= 1 + m.b
    edges = np.linspace(-m.b, 1 + m.b, 41)
    obs = np.histogram(y, edges)[0]
    exp = np.diff(m.cdf(edges, v)) * y.size
    assert exp.sum() == pytest.approx(y.size)
    assert stats.chisquare(obs, exp).pvalue > P_MIN
    assert stats.kstest(y, lambda t: m.cdf(t, v)).pvalue > P_MIN


def test_sw_transition_matrix_is_stochastic_and_matches_simulation():
    m = SquareWave(1.0, 0.0, 1.0)
    for d, d_out in ((100, 100), (50, 137), (7, 3)):
        M = sw_transition_matrix(m.b, m.p, m.q, d, d_out)
        assert M.shape == (d_out, d) and M.min() > 0
        assert np.allclose(M.sum(axis=0), 1.0, atol=1e-12)
    M = sw_transition_matrix(m.b, m.p, m.q, 10, 13)
    x = np.random.default_rng(3).uniform(0.3, 0.4, 200_000)  # input bucket 3
    obs = np.histogram(m.perturb(x, rng=4)["y"], np.linspace(-m.b, 1 + m.b, 14))[0]
    assert stats.chisquare(obs, M[:, 3] * x.size).pvalue > P_MIN


# --------------------------------------------------------------------------- Laplace / GG privacy
def test_laplace_density_ratio_is_bounded_by_e_eps_and_tight():
    m = LaplaceNoise(0.7, -2.0, 3.0)
    x = np.linspace(-2, 3, 51)
    y = np.linspace(-40, 45, 2001)
    logd = stats.laplace.logpdf(y[None, :] - x[:, None], scale=m.scale)
    worst = (logd.max(axis=0) - logd.min(axis=0)).max()
    assert worst <= 0.7 * (1 + 1e-12) and worst == pytest.approx(0.7, rel=1e-9)
    g = m.guarantee
    assert (g.kind, g.epsilon, g.delta) == ("LDP", 0.7, 0.0)


def test_gaussian_delta_is_the_analytic_gaussian_mechanism():
    for eps, sd in ((0.5, 2.0), (1.0, 3.7), (3.0, 0.8), (8.0, 0.3)):
        sigma = math.sqrt(2) * sd  # GG scale of a Gaussian with this standard deviation
        assert gg_delta(eps, 1.0, sigma, 2.0) == pytest.approx(
            gaussian_analytic_delta(eps, 1.0, sd), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("p", [1.0, 1.5, 3.0])
def test_gg_delta_is_the_hockey_stick_divergence(p):
    """delta = int (f(y) - e^eps f(y - D))_+ dy, by quadrature, against the closed form."""
    eps, D, sigma = 1.0, 1.0, 1.2
    f = stats.gennorm(p, scale=sigma).pdf
    val, _ = integrate.quad(lambda y: max(f(y) - math.exp(eps) * f(y - D), 0.0), -60, 60,
                            points=[0.0, D / 2, D], limit=400, epsabs=1e-13)
    assert gg_delta(eps, D, sigma, p) == pytest.approx(val, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("p", [1.5, 2.0, 3.0])
def test_gg_delta_grows_with_input_distance(p):
    """For log-concave noise the worst pair of inputs is the farthest: delta is nondecreasing in
    the shift, so the delta at upper - lower covers every pair in the domain."""
    ds = [gg_delta(1.0, t, 1.0, p) for t in np.linspace(0.05, 2.0, 40)]
    assert all(b >= a - 1e-15 for a, b in zip(ds, ds[1:]))


def test_gg_calibration_is_tight_and_orders_the_notions():
    for p in (1.5, 2.0, 3.0):
        for eps, delta in ((0.5, 1e-6), (1.0, 1e-5), (4.0, 1e-3)):
            s = calibrate_gg_sigma(eps, delta, 1.0, p)
            assert gg_delta(eps, 1.0, s, p) <= delta
            assert gg_delta(eps, 1.0, s * (1 - 1e-6), p) > delta  # smallest such sigma
            s_pdp = calibrate_gg_sigma(eps, delta, 1.0, p, "pdp")
            assert gg_pdp_delta(eps, 1.0, s_pdp, p) <= delta
            # pDP is the stronger requirement: more noise, and it implies (eps, delta)-DP
            assert s_pdp >= s and gg_delta(eps, 1.0, s_pdp, p) <= delta
            assert gg_pdp_delta(eps, 1.0, s, p) >= gg_delta(eps, 1.0, s, p)
    s_cl = calibrate_gg_sigma(0.5, 1e-5, 1.0, 2.0, "classical")
    assert s_cl >= calibrate_gg_sigma(0.5, 1e-5, 1.0, 2.0)  # the classical bound is looser
    assert gg_delta(0.5, 1.0, s_cl, 2.0) <= 1e-5


def test_gg_guarantees_stated_honestly():
    m = GeneralizedGaussianNoise(1.0, 0.0, 10.0)  # p = 2, delta = 1e-5, calibrated
    g = m.guarantee
    assert (g.kind, g.epsilon, g.delta) == ("LDP", 1.0, 1e-5)
    assert g.params["exact_delta"] <= 1e-5 and "no pure epsilon" in g.notes
    # sensitivity scales sigma: analytic Gaussian sd for (1, 1e-5) is ~3.73 per unit of range
    assert m.noise_sd == pytest.approx(10 * 3.7306, rel=1e-4)
    # p > 1: the log density ratio of the two ends grows without bound in the tail
    y = -np.array([10.0, 100.0, 1000.0]) * m.scale
    ratio = stats.gennorm.logpdf(y, 2.0, scale=m.scale) - stats.gennorm.logpdf(
        y - 10.0, 2.0, scale=m.scale)
    assert np.all(np.diff(ratio) > 0) and ratio[-1] > 100 * m.epsilon
    # p = 1 with delta = 0 is pure epsilon-LDP with the Laplace scale
    lap = GeneralizedGaussianNoise(0.5, 0.0, 2.0, p=1.0, delta=0.0)
    assert lap.scale == pytest.approx(4.0) and lap.guarantee.delta == 0.0
    assert lap.exact_delta == 0.0 and "pure epsilon-LDP" in lap.guarantee.notes
    # sigma given, delta None: the guarantee states the exact delta of that sigma
    given = GeneralizedGaussianNoise(1.0, 0.0, 1.0, delta=None, sigma=2.0)
    assert given.guarantee.delta == pytest.approx(gg_delta(1.0, 1.0, 2.0, 2.0))
    # pDP calibration keeps Liu's statement as the claim
    pdp = GeneralizedGaussianNoise(1.0, 0.0, 1.0, calibration="pdp")
    assert "probabilistic DP" in pdp.guarantee.claim
    assert pdp.guarantee.params["pdp_delta"] <= 1e-5


# --------------------------------------------------------------------------- estimators
def test_noise_kde_wasserstein_decreases_with_epsilon():
    """Beta(2,5) on [0,1], n = 50,000. Each W1 carries a sampling error whose mean is at most
    sqrt(2/pi) * 0.5 / sqrt(n_in) (the largest CDF standard error of the n_in reports inside
    [0, 1], integrated over the unit domain); successive W1 must differ by more than the sum of
    these bounds. (Over 8 seeds the observed standard deviation was about 1e-3.)"""
    grid = DensityGrid(0.0, 1.0, 100)
    x = beta_data()
    for cls, epss in ((LaplaceNoise, (0.5, 4.0, 32.0)),
                      (GeneralizedGaussianNoise, (0.5, 8.0, 64.0))):
        ws, bounds = [], []
        for k, eps in enumerate(epss):
            mech = cls(eps, 0.0, 1.0)
            est = NoiseKDEEstimator(mech).estimate(mech.perturb(x, rng=20 + k))
            ws.append(w1(grid, est))
            n_in = N - est["reports_outside"].value
            bounds.append(math.sqrt(2 / math.pi) * 0.5 / math.sqrt(n_in))
        for i in range(2):
            assert ws[i] - ws[i + 1] > bounds[i] + bounds[i + 1], (cls.__name__, ws, bounds)


def test_noise_kde_accounts_for_outside_mass_and_beyond_grid_reports():
    mech = LaplaceNoise(0.5, 0.0, 1.0)
    est = NoiseKDEEstimator(mech, m=50)
    b = est.binned
    assert b.lo < -8 * mech.noise_sd + 1e-9 and b.hi > 1 + 8 * mech.noise_sd - 1e-9
    y = mech.perturb(beta_data(2, 20_000), rng=5)["y"]
    far = np.array([b.lo - 0.1, b.lo - 50.0, b.hi + 3.0])  # legitimate, if rare, reports
    acc = est.add(est.create(), {"y": np.concatenate([y, far])})
    stats_ = est.statistics(acc)
    n = y.size + far.size
    assert est.n_reports(acc) == n
    assert stats_["reports_beyond_grid"].value == int(np.sum((y < b.lo) | (y > b.hi))) + 3
    assert stats_["reports_outside"].value == int(np.sum((y < 0) | (y > 1))) + 3
    h = stats_["bandwidth"].value
    # the binned KDE equals the exact KDE of all reports to O(bin width^2 / h^2) ...
    z = est.grid.points
    allv = np.concatenate([y, far])
    exact = stats.norm.pdf((z[:, None] - allv[None, :]) / h).sum(axis=1) / (n * h)
    binned = kde_on_grid(b, acc, z, h)
    assert np.max(np.abs(binned - exact) / exact) < 5 * (b.width / h) ** 2
    # ... and the reports beyond the grid carry negligible kernel weight on [lower, upper]
    beyond = allv[(allv < b.lo) | (allv > b.hi)]
    contrib = stats.norm.pdf((z[:, None] - beyond[None, :]) / h).sum(axis=1) / (n * h)
    bound = float(stats_["reports_beyond_grid"].note.split("at most ")[1].split(" ")[0])
    assert contrib.max() <= bound * (1 + 1e-6) + 1e-300
    assert bound < 1e-12 * exact.min()
    # the discarded KDE mass, binned vs exact
    mass = np.mean(stats.norm.cdf((0 - allv) / h) + stats.norm.cdf((allv - 1) / h))
    assert stats_["kde_mass_outside"].value == pytest.approx(mass, abs=1e-3)
    # released in RVNS's form: normalized density on the grid of [lower, upper]
    assert np.sum(stats_["density"].value) * est.grid.width == pytest.approx(1.0)
    for key in ("cdf", "quantiles", "mean", "std", "mode", "median", "skewness", "kurtosis"):
        assert key in stats_


def test_ems_recovers_beta_at_large_epsilon():
    """W1(EMS, truth) <= W1(fixed point, truth) + 3 E[sampling error].

    The fixed point is EMS run on the *expected* report counts n M theta (smoothing bias, no
    sampling noise). The sampling term: the report CDF G has standard error sqrt(G(1-G)/n) and
    the input CDF is recovered as (G - background)/(1 - q(1 + 2b)), so E|F_hat - F| is at most
    sqrt(2/pi) sqrt(G(1-G)/n)/(1 - q(1 + 2b)); integrated over the report range it bounds E[W1]
    (in units of [0, 1]; here the data range)."""
    grid = DensityGrid(0.0, 1.0, 100)
    mech = SquareWave(8.0, 0.0, 1.0)
    est_ = SquareWaveEMSEstimator(mech)
    est = est_.estimate(mech.perturb(beta_data(), rng=31))
    assert est["iterations"].note == "converged"
    M = est_.transition
    theta = true_cells(grid)
    fixed, _, conv, _ = ems(N * (M @ theta), M, 1e-9, 100_000)
    bias = wasserstein_grid(theta, fixed) * grid.width
    G = np.clip(np.cumsum(M @ theta), 0.0, 1.0)
    informative = 1 - mech.q * (1 + 2 * mech.b)
    width_out = (1 + 2 * mech.b) / M.shape[0]
    sampling = math.sqrt(2 / math.pi) * np.sum(np.sqrt(G * (1 - G) / N)) * width_out / informative
    w = w1(grid, est)
    assert w <= bias + 3 * sampling, (w, bias, sampling)
    assert bias < grid.width  # smoothing bias below one cell at this epsilon
    # and much better than at a small epsilon
    low = SquareWave(0.5, 0.0, 1.0)
    assert w1(grid, SquareWaveEMSEstimator(low).estimate(low.perturb(beta_data(), rng=32))) > 5 * w


def test_ems_helpers():
    t = np.array([0.1, 0.2, 0.4, 0.3])
    s = binomial_smooth(t)
    assert s.sum() == pytest.approx(1.0) and np.all(s > 0)
    g = DensityGrid(2.0, 4.0, 4)
    assert np.allclose(buckets_to_grid(t, g), t / g.width)
    g8 = DensityGrid(2.0, 4.0, 8)  # finer grid: each bucket split evenly
    assert np.allclose(buckets_to_grid(t, g8), np.repeat(t, 2) / 2 / g8.width)
    # plain EM (no smoothing) on exact counts from a known theta recovers it
    m = SquareWave(3.0, 0.0, 1.0)
    M = sw_transition_matrix(m.b, m.p, m.q, 4, 12)
    th, it, conv, _ = ems(1e6 * (M @ t), M, 1e-12, 200_000, smoothing=False)
    assert np.allclose(th, t, atol=2e-3)


# --------------------------------------------------------------------------- accumulators
@pytest.mark.parametrize("make", [
    lambda: LaplaceNoise(1.0, 0.0, 10.0),
    lambda: GeneralizedGaussianNoise(2.0, 0.0, 10.0, p=1.5),
    lambda: SquareWave(1.0, 0.0, 10.0),
])
def test_split_merge_invariance(make):
    mech = make()
    est = (SquareWaveEMSEstimator if isinstance(mech, SquareWave) else NoiseKDEEstimator)(mech)
    reports = mech.perturb(10 * beta_data(4, 6000), rng=9)
    whole = est.add(est.create(), reports)
    rng = np.random.default_rng(0)
    idx = rng.permutation(6000)
    parts = np.split(idx, [1000, 3500])
    accs = [est.add(est.create(), {"y": reports["y"][p]}) for p in parts]
    accs = [pickle.loads(pickle.dumps(a)) for a in accs]
    for merged in (est.merge(accs), est.merge(accs[::-1]),
                   est.merge([est.merge(accs[:2]), accs[2]])):
        k = est.binned.bins + 3  # counts, below, above, n: exact
        assert np.array_equal(merged[:k], whole[:k])
        bound = 6000 * 2.0**-52 * np.abs(reports["y"]).sum() * np.abs(reports["y"]).max()
        assert np.allclose(merged[k:], whole[k:], rtol=0, atol=bound)
        a, b = est.finalize(merged), est.finalize(whole)
        assert np.allclose(a["density"].value, b["density"].value, rtol=1e-9)
        assert a.n_reports == 6000 and a.guarantee == mech.guarantee
    assert est.create().size == est.binned.bins + 5  # independent of n


def test_seeded_perturbation_does_not_depend_on_batching():
    x = 10 * beta_data(5, 1000)
    for mech in (LaplaceNoise(1.0, 0, 10), GeneralizedGaussianNoise(1.0, 0, 10),
                 SquareWave(1.0, 0, 10)):
        whole = mech.perturb(x, rng=RandomSource(7), stream=3, offset=0)["y"]
        a = mech.perturb(x[:400], rng=RandomSource(7), stream=3, offset=0)["y"]
        b = mech.perturb(x[400:], rng=RandomSource(7), stream=3, offset=400)["y"]
        assert np.array_equal(whole, np.concatenate([a, b]))


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("build, name", [
    (lambda: LaplaceNoise(0.0, 0.0, 1.0), "epsilon"),
    (lambda: LaplaceNoise(float("nan"), 0.0, 1.0), "epsilon"),
    (lambda: LaplaceNoise(1.0, 2.0, 2.0), "lower"),
    (lambda: SquareWave(-1.0, 0.0, 1.0), "epsilon"),
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, p=0.5), "p"),
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, p=True), "p"),
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, sigma=-1.0), "sigma"),
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, sigma=float("inf")), "sigma"),
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, delta=1.5), "delta"),
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, delta=0.0), "delta"),  # p = 2: no pure bound
    # nothing to calibrate from; too little noise
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, delta=None), "delta"),
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, sigma=0.1, delta=1e-5), "sigma"),
    (lambda: GeneralizedGaussianNoise(1.0, 0.0, 1.0, calibration="bogus"), "calibration"),
    (lambda: GeneralizedGaussianNoise(2.0, 0.0, 1.0, calibration="classical"), "epsilon"),
    (lambda: GeneralizedGaussianNoise(0.5, 0.0, 1.0, p=3.0, calibration="classical"),
     "calibration"),
    (lambda: NoiseKDEEstimator(LaplaceNoise(1.0, 0.0, 1.0), m=1), "m"),
    (lambda: NoiseKDEEstimator(LaplaceNoise(1.0, 0.0, 1.0), bins=3), "bins"),
    (lambda: NoiseKDEEstimator(LaplaceNoise(1.0, 0.0, 1.0), bandwidth=0.0), "bandwidth"),
    (lambda: NoiseKDEEstimator(LaplaceNoise(1.0, 0.0, 1.0), tail_sds=-1), "tail_sds"),
    (lambda: NoiseKDEEstimator(SquareWave(1.0, 0.0, 1.0)), "mechanism"),
    (lambda: SquareWaveEMSEstimator(SquareWave(1.0, 0.0, 1.0), d=1), "d"),
    (lambda: SquareWaveEMSEstimator(SquareWave(1.0, 0.0, 1.0), output_bins=True), "output_bins"),
    (lambda: SquareWaveEMSEstimator(SquareWave(1.0, 0.0, 1.0), tolerance=-1.0), "tolerance"),
    (lambda: SquareWaveEMSEstimator(SquareWave(1.0, 0.0, 1.0), smoothing="yes"), "smoothing"),
    (lambda: SquareWaveEMSEstimator(LaplaceNoise(1.0, 0.0, 1.0)), "mechanism"),
])
def test_bad_parameters_raise(build, name):
    with pytest.raises(ParameterError) as info:
        build()
    assert info.value.name == name
    assert repr(info.value.value) in str(info.value) and "expected" in str(info.value)


@pytest.mark.parametrize("mech", [LaplaceNoise(1.0, 0, 10), GeneralizedGaussianNoise(1.0, 0, 10),
                                  SquareWave(1.0, 0, 10)])
def test_bad_values_are_flagged(mech):
    data = np.array([5.0, np.nan, 10.5, -0.1, "abc", None, 0.0, 10.0], dtype=object)
    cols, reasons = mech.check(data)
    assert reasons.bad.tolist() == [False, True, True, True, True, True, False, False]
    msgs = reasons.as_dict()
    assert "missing" in msgs[1] and "outside" in msgs[2] and "non-numeric" in msgs[4]
    with pytest.raises(InvalidRecordsError):
        mech.perturb(data)


def test_bad_reports_are_flagged():
    lap = NoiseKDEEstimator(LaplaceNoise(1.0, 0.0, 1.0))
    # -1e6 is ~7e5 noise standard deviations (sd = sqrt 2) below the domain [0, 1]: no honest
    # report is that far (probability e^-1e6), so it is flagged too; -1000 (~707 sds) is not
    r = lap.check_reports({"y": np.array([0.5, np.inf, np.nan, -1e6, "x", -1000.0],
                                         dtype=object)})
    assert r.bad.tolist() == [False, True, True, True, True, False]
    sw = SquareWave(1.0, 0.0, 1.0)
    est = SquareWaveEMSEstimator(sw)
    r = est.check_reports({"y": np.array([-sw.b, 1 + sw.b, -sw.b - 1e-9, 2.0, np.nan])})
    assert r.bad.tolist() == [False, False, True, True, True]
    assert est.check_reports({}, n=2).bad.all()  # the field is missing


def test_square_wave_refuses_epsilon_beyond_float_precision():
    """Beyond epsilon = 32 the wave is narrower than 2e-13 of the domain and EMS breaks down."""
    import pytest as _pytest

    from ldp_beam.errors import ParameterError as _PE
    from ldp_beam.mechanisms.continuous_baselines import SquareWave as _SW

    assert _SW(epsilon=32.0, lower=0.0, upper=1.0).b < 1e-12
    with _pytest.raises(_PE, match=r"parameter 'epsilon' = 33.0 is invalid: expected a number in "
                                   r"\(0, 32\]"):
        _SW(epsilon=33.0, lower=0.0, upper=1.0)
