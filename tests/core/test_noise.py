"""The exact discrete Laplace sampler (ldp_beam/noise.py) behind every central Laplace release.

Distribution checks are chi-square goodness-of-fit tests against the exact pmf at the 0.999
quantile, or z = 5 bounds from standard errors, with fixed seeds."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import chi2

from ldp_beam.central.ospdprr import (LATTICE_BITS, noisy_statistics, statistic_lattice,
                                      statistic_units)
from ldp_beam.errors import ParameterError
from ldp_beam.noise import (MAX_DENOMINATOR, _bernoulli_exp, discrete_laplace,
                            discrete_laplace_cumulants, discrete_laplace_pmf,
                            discrete_laplace_scale, discrete_laplace_variance, lattice_laplace,
                            realized_epsilon, to_units)

CHI2_Q = 0.999


def _chi2_fits(z: np.ndarray, scale) -> bool:
    """Pearson chi-square of the draws against the exact pmf, the tails beyond +-L pooled."""
    t = float(scale)
    lim = max(3, int(6 * t))
    k = np.arange(-lim, lim + 1)
    p = discrete_laplace_pmf(k, scale)
    tail = (1.0 - p.sum()) / 2  # P(Z < -L) = P(Z > L)
    p[0] += tail
    p[-1] += tail
    obs = np.bincount(np.clip(z, -lim, lim) + lim, minlength=k.size)
    expected = p * z.size
    stat = float(((obs - expected) ** 2 / expected).sum())
    return stat <= chi2.ppf(CHI2_Q, k.size - 1)


@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(1), Fraction(7, 3), Fraction(10)])
def test_draws_follow_the_exact_pmf(scale):
    z = discrete_laplace(np.random.default_rng(11), scale, 100_000)
    assert z.dtype == np.int64 and z.shape == (100_000,)
    assert _chi2_fits(z, scale)


def test_one_scale_per_draw():
    """An array of scales (one per draw, as in the OSPDPRR recipe's paper mode) samples each
    draw at its own scale."""
    gen = np.random.default_rng(5)
    scales = np.array([Fraction(1, 2), Fraction(4)] * 50_000, dtype=object)
    z = discrete_laplace(gen, scales)
    assert _chi2_fits(z[0::2], Fraction(1, 2)) and _chi2_fits(z[1::2], Fraction(4))


def test_the_sampler_draws_only_integers():
    """Exactness rests on integer arithmetic: the sampler must never ask the generator for a
    floating-point variate."""

    class IntegersOnly(np.random.Generator):
        def __getattribute__(self, name):
            if name in ("random", "uniform", "laplace", "exponential", "standard_exponential",
                        "geometric", "normal", "standard_normal", "gumbel"):
                raise AssertionError(f"floating-point draw: {name}")
            return super().__getattribute__(name)

    z = discrete_laplace(IntegersOnly(np.random.PCG64(1)), Fraction(5, 2), 1000)
    assert z.dtype == np.int64


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 7), Fraction(1, 2), Fraction(1)])
def test_bernoulli_exp_is_exact(gamma):
    n = 200_000
    a = np.full(n, gamma.numerator, dtype=np.int64)
    b = np.full(n, gamma.denominator, dtype=np.int64)
    hits = _bernoulli_exp(np.random.default_rng(3), a, b)
    p = math.exp(-gamma)
    assert abs(hits.mean() - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12


@pytest.mark.parametrize("eps", [0.1, 1 / 3, 1.0, math.e, 7.5, 1e-3])
@pytest.mark.parametrize("sens", [1, 3, 3 << 20])
def test_scale_is_rounded_up_so_the_realized_epsilon_is_within_the_claim(eps, sens):
    t = discrete_laplace_scale(sens, eps)
    exact = Fraction(sens) / Fraction(eps)
    assert t >= exact and t - exact < Fraction(1, MAX_DENOMINATOR)
    assert t.denominator <= MAX_DENOMINATOR
    real = realized_epsilon(sens, t)
    assert Fraction(real) >= Fraction(sens) / t  # rounded up, never under-reported
    assert real <= eps  # within the claim
    # t < exact + 2^-20, so the relative loss of budget is below 2^-20 / exact = eps / (sens 2^20)
    assert real >= eps * (1 - eps / (sens * MAX_DENOMINATOR)) * (1 - 1e-15)


def test_privacy_ratio_of_neighbouring_outputs_is_exactly_bounded():
    """Statistics differing by the sensitivity Delta: the log-ratio of the two output pmfs is
    at most Delta/t = the realized epsilon <= eps, attained for every output beyond both."""
    for eps, sens in ((0.5, 1), (1.3, 4)):
        t = discrete_laplace_scale(sens, eps)
        z = np.arange(-60, 61)
        ratio = np.log(discrete_laplace_pmf(z, t)) - np.log(discrete_laplace_pmf(z - sens, t))
        assert ratio.max() <= realized_epsilon(sens, t) + 1e-12 <= eps + 1e-12
        assert ratio.max() == pytest.approx(sens / float(t), rel=1e-9)


@pytest.mark.parametrize("scale", [Fraction(7, 10), Fraction(3), Fraction(40)])
def test_cumulants_against_the_pmf(scale):
    z = np.arange(-4000, 4001)
    p = discrete_laplace_pmf(z, scale)
    m2 = float((p * z ** 2.0).sum())
    m4 = float((p * z ** 4.0).sum())
    k2, k4 = discrete_laplace_cumulants(scale)
    assert k2 == pytest.approx(m2, rel=1e-9) and discrete_laplace_variance(scale) == k2
    assert k4 == pytest.approx(m4 - 3 * m2 * m2, rel=1e-9)
    t = float(scale)
    assert k2 < 2 * t * t  # below the continuous Laplace's variance
    assert k4 == pytest.approx(12 * t ** 4, rel=1 / t)  # and close to its 12 t^4


def test_sample_moments_match():
    t = Fraction(5, 2)
    z = discrete_laplace(np.random.default_rng(8), t, 200_000).astype(float)
    k2, k4 = discrete_laplace_cumulants(t)
    assert abs(z.mean()) <= 5 * math.sqrt(k2 / z.size)
    var_se = math.sqrt((k4 + 2 * k2 * k2) / z.size)
    assert abs(z.var() - k2) <= 5 * var_se


def test_lattice_laplace_with_one_budget_per_entry():
    units = np.arange(6, dtype=np.int64).reshape(2, 3)
    eps = np.array([[0.5, 0.5, 0.5], [2.0, 2.0, 2.0]])
    noisy, scale = lattice_laplace(units, 2, eps, np.random.default_rng(0))
    assert noisy.shape == (2, 3) and noisy.dtype == np.int64
    assert scale[0, 0] == discrete_laplace_scale(2, 0.5)
    assert scale[1, 2] == discrete_laplace_scale(2, 2.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, "1", True])
def test_bad_epsilon_is_named(bad):
    with pytest.raises(ParameterError, match="epsilon"):
        discrete_laplace_scale(1, bad)


@pytest.mark.parametrize("bad", [0, -2, 1.5, math.inf, True])
def test_bad_sensitivity_is_named(bad):
    with pytest.raises(ParameterError, match="sensitivity"):
        discrete_laplace_scale(bad, 1.0)


def test_tiny_budgets_beyond_the_integer_range_are_refused():
    with pytest.raises(ParameterError, match="epsilon"):
        discrete_laplace_scale(1 << 40, 1e-12)


def test_fixed_point_units_respect_the_bound():
    """Rounding is monotone: values bounded by B have at most round(B / grid) units, so the
    lattice sensitivity is exact."""
    b = 37.3
    grid = b / (1 << LATTICE_BITS)
    v = np.concatenate([np.linspace(-b, b, 10_001), [b, -b, np.nextafter(b, 0)]])
    u = to_units(v, grid)
    assert np.abs(u).max() == 1 << LATTICE_BITS
    assert np.all(np.diff(to_units(np.sort(v), grid)) >= 0)
    assert np.abs(u * grid - v).max() <= grid / 2 * (1 + 1e-9)


def test_ospdprr_statistics_are_exact_lattice_sums_plus_integer_noise():
    lo, hi = -20.0, 100.0
    lattice = statistic_lattice("cv", 3, lo, hi)
    gs, sens_s = lattice["S"]
    assert gs == 100.0 / 2 ** 20 and sens_s == 3 << 20 and lattice["N"] == (1.0, 3)
    vals = np.random.default_rng(2).uniform(lo, hi, (500, 3))
    vals[0] = hi  # users at the bounds reach the sensitivity exactly
    vals[1] = lo
    units = statistic_units(vals, lattice)
    assert units[0, 1] == sens_s and units[0, 2] == lattice["Q"][1]
    assert np.abs(units[:, 1]).max() <= sens_s and np.abs(units[:, 2]).max() <= lattice["Q"][1]
    assert abs(units[:, 1].sum() * gs - vals.sum()) <= 500 * 3 * gs / 2
    noisy, var = noisy_statistics(units.sum(axis=0), "cv", 3, lo, hi, 0.9,
                                  np.random.default_rng(4))
    for s, (grid, sens) in lattice.items():
        k = noisy[s] / grid
        assert k == pytest.approx(round(float(k)), abs=1e-6)  # on the lattice
        t = discrete_laplace_scale(sens, 0.9 / 3)
        assert var[s] == pytest.approx(grid * grid * discrete_laplace_variance(t), rel=1e-12)
