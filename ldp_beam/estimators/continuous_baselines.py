"""Server side of the RVNS paper's baselines: a density on [lower, upper] in the same released
form as RVNS (:func:`~ldp_beam.estimators.density.density_statistics`).

* :class:`NoiseKDEEstimator` — for the noise-adding baselines (Laplace-DP, Gaussian-pDP): as in
  the RVNS paper (Section V-B2), the estimate is a Gaussian KDE of the *noisy* values evaluated
  on the grid of [lower, upper] and normalized there. This is the paper's method, not a
  deconvolution: the noise is not removed, and the KDE mass that falls outside [lower, upper]
  is discarded by the normalization (the released ``kde_mass_outside`` says how much).
* :class:`SquareWaveEMSEstimator` — EMS (Li et al., SIGMOD 2020): expectation maximization with
  binomial smoothing on d input buckets from the counts of SW reports in d' output buckets.

Both accumulate a :class:`~ldp_beam.estimators.density.BinnedDensity` (bin counts plus n, sum,
sum of squares): mergeable, of a size fixed by the options, never by the number of reports.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..core import Reasons, Statistic, coerce_numeric
from ..errors import EmptyAccumulatorError, ParameterError
from ..limits import check_cap, product
from ..mechanisms.continuous_baselines import _special
from .density import (BinnedDensity, BinnedEstimator, DensityGrid, density_statistics,
                      kde_on_grid, normalize_density)


def _check_int(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """An integer in [lo, hi] (sizes have no hi here: a size cap is checked by the caller)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value \
            or (hi is not None and value > hi):
        raise ParameterError(name, value, f"an integer >= {lo}" if hi is None
                             else f"an integer in [{lo}, {hi}]")
    return int(value)


def _check_positive(value: Any, name: str, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
            or not (math.isfinite(value) and value > 0):
        raise ParameterError(name, value, "a finite number > 0" + (" or None" if allow_none
                                                                    else ""))
    return float(value)


# --------------------------------------------------------------------------- noise + KDE
class NoiseKDEEstimator(BinnedEstimator):
    """The RVNS paper's estimate for additive-noise baselines: KDE of the noisy reports on the
    grid of [lower, upper], normalized on [lower, upper].

    Options:
      ``m`` — grid cells on [lower, upper] (default 100);
      ``bins`` — total bins of the accumulator (default 4096);
      ``bandwidth`` — KDE bandwidth in data units (None: Silverman's rule from the accumulated
      moments of the noisy values, floored at one bin width);
      ``tail_sds`` — the accumulator covers [lower - c, upper + c] with c = tail_sds noise
      standard deviations (default 8), so that lower and upper are bin edges.

    Reports beyond [lower - c, upper + c] are counted (``reports_beyond_grid``) and left out of
    the kernel sum; their largest possible kernel weight on [lower, upper] is bounded and stated
    in the statistic's note. c is capped only so that the domain keeps at least one whole bin:
    c <= (bins/2 - 1) (upper - lower) (for Laplace noise and the default bins: eps below about
    5.5e-3).

    Released statistics: those of :func:`density_statistics` plus ``reports_outside`` (noisy
    values outside [lower, upper]), ``reports_beyond_grid``, ``kde_mass_outside`` (the share of
    the KDE's mass outside [lower, upper] that the normalization discards) and ``bandwidth``.
    """

    def __init__(self, mechanism: Any, m: int = 100, bins: int = 4096,
                 bandwidth: float | None = None, tail_sds: float = 8.0) -> None:
        super().__init__(mechanism)
        for attr in ("lower", "upper", "noise_sd"):
            if not hasattr(mechanism, attr):
                raise ParameterError("mechanism", mechanism.name,
                                     f"an additive-noise mechanism (no attribute {attr!r})")
        self.grid = DensityGrid(float(mechanism.lower), float(mechanism.upper),
                                _check_int(m, "m", 2))
        self.bins = check_cap("cells", _check_int(bins, "bins", 16), "bins")
        # the KDE's kernel matrix (m points x up to bins non-empty bins; computed in blocks)
        check_cap("cells", product(self.grid.m, self.bins),
                  f"m x bins (the KDE's kernel matrix, {self.grid.m:,} x {self.bins:,})")
        self.bandwidth = _check_positive(bandwidth, "bandwidth", allow_none=True)
        self.tail_sds = _check_positive(tail_sds, "tail_sds")
        lower, upper = self.grid.lower, self.grid.upper
        span = upper - lower
        c = self.tail_sds * float(mechanism.noise_sd)
        inner = max(1, int(self.bins / (1.0 + 2.0 * c / span)))  # bins inside [lower, upper]
        w = span / inner
        j = min(int(math.ceil(c / w)), (self.bins - inner) // 2)  # bins on each side
        self.inner, self.side = inner, j
        self.reach = j * w  # c as used
        self.binned = BinnedDensity(lower - j * w, upper + j * w, inner + 2 * j)

    #: a report further than this many noise standard deviations outside [lower, upper] cannot
    #: come from an honest client (Laplace: probability e^(-1000 sqrt 2); lighter tails: less)
    PLAUSIBLE_SDS = 1000.0

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        if "y" in reports:
            y, _ = coerce_numeric(reports["y"])
            reasons.flag(~np.isfinite(y), lambda i, r=reports["y"]:
                         f"report field 'y': {r[i]!r} is not a finite number")
            g = self.grid
            reach = self.PLAUSIBLE_SDS * float(self.mechanism.noise_sd)
            with np.errstate(invalid="ignore"):
                far = (y < g.lower - reach) | (y > g.upper + reach)
            reasons.flag(far, lambda i, r=reports["y"], d=reach:
                         f"report field 'y': {r[i]!r} is more than {self.PLAUSIBLE_SDS:g} noise "
                         f"standard deviations ({d:.4g}) outside [lower, upper]: no honest "
                         "report is that far (forged or corrupted)")
        return reasons

    # -- release
    def chosen_bandwidth(self, acc: np.ndarray) -> float:
        return self.bandwidth if self.bandwidth is not None \
            else self.binned.silverman_bandwidth(acc)

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        b, g = self.binned, self.grid
        n = b.n(acc)
        h = self.chosen_bandwidth(acc)
        raw = kde_on_grid(b, acc, g.points, h)
        if not raw.sum() * g.width > 1e-12:
            raise EmptyAccumulatorError(
                f"{self.mechanism.name}: the {n} noisy report(s) put no kernel mass on "
                f"[{g.lower:g}, {g.upper:g}] (bandwidth {h:.3g}); the KDE estimate needs more "
                "reports")
        v = normalize_density(raw, g.width)
        counts = b.counts(acc)
        below, above = b.outside(acc)
        beyond = below + above
        j, inner = self.side, self.inner
        outside = int(round(counts[:j].sum() + counts[j + inner:].sum())) + beyond
        # KDE mass outside [lower, upper] (normalization discards it): binned part + beyond
        c = b.centres
        phi = _special().ndtr  # the standard normal CDF
        mass_out = float(np.dot(counts, phi((g.lower - c) / h) + phi((c - g.upper) / h)))
        mass_out = (mass_out + beyond) / n
        # largest kernel value a report beyond the grid can put on [lower, upper]
        bound = beyond * math.exp(-0.5 * (self.reach / h) ** 2) / (n * h * math.sqrt(2 * math.pi))
        out = density_statistics(
            g, v, note="KDE of the noisy reports on [lower, upper], normalized there (the RVNS "
                       "paper's method for noise-adding baselines; the noise is not removed)")
        out["reports_outside"] = Statistic(
            outside, note=f"noisy reports outside [{g.lower:g}, {g.upper:g}] (their KDE mass "
                          "there is discarded by the normalization)")
        out["reports_beyond_grid"] = Statistic(
            beyond, note=f"reports beyond [{b.lo:g}, {b.hi:g}], left out of the kernel sum; "
                         f"their kernel weight on [lower, upper] is at most {bound:.3g} "
                         "(un-normalized density units)")
        out["kde_mass_outside"] = Statistic(
            mass_out, note="share of the KDE's mass outside [lower, upper], discarded")
        out["bandwidth"] = Statistic(h, note="given" if self.bandwidth is not None
                                     else "Silverman's rule on the noisy values")
        return out


# --------------------------------------------------------------------------- SW + EMS
def sw_transition_matrix(b: float, p: float, q: float, d: int, d_out: int) -> np.ndarray:
    """M[j, i] = P(report in output bucket j | input uniform in input bucket i) for the square
    wave, with d equal input buckets on [0, 1] and d_out equal output buckets on [-b, 1 + b].

    P(y in [c0, c1] | v) = q (c1 - c0) + (p - q) |[c0, c1] and [v - b, v + b]|; averaging over v
    in [a0, a1] needs the area A of {(v, y) in [a0, a1] x [c0, c1]: |y - v| <= b}, computed
    exactly as H(b) - H(-b) with H(t) = area where y - v <= t. Columns sum to one.
    """
    a = np.linspace(0.0, 1.0, d + 1)
    c = np.linspace(-b, 1.0 + b, d_out + 1)
    a0, a1 = a[None, :-1], a[None, 1:]
    c0, c1 = c[:-1, None], c[1:, None]
    L = c1 - c0

    def G(s: np.ndarray) -> np.ndarray:  # integral of clip(u, 0, L) du from 0 to s
        s = np.clip(s, 0.0, None)
        return np.where(s <= L, 0.5 * s * s, 0.5 * L * L + L * (s - L))

    def H(t: float) -> np.ndarray:  # area of rect where y <= v + t: int clip(v + t - c0, 0, L) dv
        return G(a1 + t - c0) - G(a0 + t - c0)

    area = H(b) - H(-b)
    return q * L + (p - q) * area / (a1 - a0)


def binomial_smooth(theta: np.ndarray) -> np.ndarray:
    """One pass of the [1/4, 1/2, 1/4] binomial filter; the end rows keep their own weights
    renormalized ([2/3, 1/3] and [1/3, 2/3]), then the vector is renormalized to sum one."""
    s = np.empty_like(theta)
    s[1:-1] = 0.25 * theta[:-2] + 0.5 * theta[1:-1] + 0.25 * theta[2:]
    s[0] = (2.0 * theta[0] + theta[1]) / 3.0
    s[-1] = (theta[-2] + 2.0 * theta[-1]) / 3.0
    return s / s.sum()


def ems(counts: np.ndarray, M: np.ndarray, tolerance: float, max_iterations: int = 10_000,
        smoothing: bool = True) -> tuple[np.ndarray, int, bool, float]:
    """Expectation maximization with smoothing (EMS), Li et al. 2020.

    theta (the input-bucket distribution) starts uniform; each iteration is one EM step
    theta_i <- theta_i sum_j n_j M_ji / (M theta)_j / N, then (EMS) one binomial smoothing pass.
    It stops when the log-likelihood sum_j n_j log (M theta)_j improves by less than
    ``tolerance`` (after at least two iterations), when the L1 change of theta is at most 1/N,
    or after ``max_iterations``. Returns (theta, iterations, converged, log-likelihood).
    """
    counts = np.asarray(counts, float)
    N = counts.sum()
    d = M.shape[1]
    theta = np.full(d, 1.0 / d)
    ll_old = -math.inf
    ll = -math.inf
    for it in range(1, max_iterations + 1):
        pred = M @ theta
        new = theta * (M.T @ (counts / pred))
        new /= new.sum()
        if smoothing:
            new = binomial_smooth(new)
        change = float(np.abs(new - theta).sum())
        theta = new
        ll = float(counts @ np.log(M @ theta))
        if it > 2 and (abs(ll - ll_old) < tolerance or change <= 1.0 / N):
            return theta, it, True, ll
        ll_old = ll
    return theta, max_iterations, False, ll


def buckets_to_grid(theta: np.ndarray, grid: DensityGrid) -> np.ndarray:
    """Masses on d equal buckets of [lower, upper] -> the piecewise-constant density on ``grid``
    (the CDF of a piecewise-uniform distribution is piecewise linear, so this is exact)."""
    d = theta.size
    cdf = np.concatenate([[0.0], np.cumsum(theta)])
    cdf /= cdf[-1]
    if d == grid.m:
        mass = np.diff(cdf)
    else:
        mass = np.diff(np.interp(np.linspace(0.0, 1.0, grid.m + 1), np.linspace(0.0, 1.0, d + 1),
                                 cdf))
    return mass / grid.width


class SquareWaveEMSEstimator(BinnedEstimator):
    """EMS reconstruction for square-wave reports, released on the grid of [lower, upper].

    Options:
      ``m`` — grid cells on [lower, upper] (default 100);
      ``d`` — EMS input buckets on [0, 1] (default m);
      ``output_bins`` — d', report buckets on [-b, 1 + b] (default d, as d = d' in the paper's
      experiments); the accumulator is a BinnedDensity with these bins;
      ``tolerance`` — stop when the log-likelihood improves by less (default 1e-3; the run
      also stops when the L1 change of theta is at most 1/N). A threshold scaled as
      1e-3 e^eps stops too early at large eps (measured: at eps = 16, 3 iterations and a
      Wasserstein distance 6x the converged one), so it is not the default; pass it explicitly
      to compare;
      ``max_iterations`` (default 10000); ``smoothing`` (default True; False gives plain EM).
    """

    def __init__(self, mechanism: Any, m: int = 100, d: int | None = None,
                 output_bins: int | None = None, tolerance: float | None = None,
                 max_iterations: int = 10_000, smoothing: bool = True) -> None:
        super().__init__(mechanism)
        for attr in ("b", "p", "q", "lower", "upper"):
            if not hasattr(mechanism, attr):
                raise ParameterError("mechanism", mechanism.name,
                                     f"a square-wave mechanism (no attribute {attr!r})")
        self.grid = DensityGrid(float(mechanism.lower), float(mechanism.upper),
                                _check_int(m, "m", 2))
        self.d = _check_int(self.grid.m if d is None else d, "d", 2)
        self.output_bins = _check_int(self.d if output_bins is None else output_bins,
                                      "output_bins", 2)
        # the EMS matrix (output_bins x d), before it is built
        check_cap("cells", product(self.output_bins, self.d),
                  f"d x output_bins (the EMS matrix, {self.d:,} x {self.output_bins:,})")
        self.tolerance = _check_positive(1e-3 if tolerance is None else tolerance,
                                         "tolerance")
        self.max_iterations = _check_int(max_iterations, "max_iterations", 1, 10_000_000)
        if not isinstance(smoothing, bool):
            raise ParameterError("smoothing", smoothing, "True or False")
        self.smoothing = smoothing
        b = float(mechanism.b)
        self.binned = BinnedDensity(-b, 1.0 + b, self.output_bins)
        self._M: np.ndarray | None = None

    @property
    def transition(self) -> np.ndarray:
        if self._M is None:
            m = self.mechanism
            self._M = sw_transition_matrix(m.b, m.p, m.q, self.d, self.output_bins)
        return self._M

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        if "y" in reports:
            y, _ = coerce_numeric(reports["y"])
            b = self.mechanism.b
            reasons.flag(~((y >= -b) & (y <= 1.0 + b)), lambda i, r=reports["y"]:
                         f"report field 'y': {r[i]!r} not a number in [{-b:.6g}, {1 + b:.6g}]")
        return reasons

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        counts = self.binned.counts(acc).copy()
        below, above = self.binned.outside(acc)
        counts[0] += below  # only reachable by unchecked reports; kept rather than dropped
        counts[-1] += above
        theta, iters, converged, ll = ems(counts, self.transition, self.tolerance,
                                         self.max_iterations, self.smoothing)
        v = normalize_density(buckets_to_grid(theta, self.grid), self.grid.width)
        method = "EMS" if self.smoothing else "EM"
        out = density_statistics(self.grid, v, note=f"{method} on d = {self.d} input buckets "
                                 f"from d' = {self.output_bins} report buckets")
        out["iterations"] = Statistic(iters, note="converged" if converged
                                      else "stopped at max_iterations")
        out["log_likelihood"] = Statistic(ll, note="sum_j n_j log (M theta)_j at the estimate")
        return out


__all__ = ["NoiseKDEEstimator", "SquareWaveEMSEstimator", "sw_transition_matrix", "ems",
           "binomial_smooth", "buckets_to_grid"]
