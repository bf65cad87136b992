"""Shared machinery for estimators that release a density on [lower, upper].

* :class:`BinnedDensity` — the mergeable accumulator: counts of real-valued reports on a fine,
  fixed grid (plus the counts below and above it, and n, sum, sum of squares). Its size depends
  on the grid only; any KDE bandwidth can be chosen at finalize.
* :func:`kde_on_grid` — a Gaussian kernel density estimate at points of interest from the binned
  counts, optionally with reflection at the domain's ends (the boundary correction).
* :class:`DensityGrid` and :func:`density_statistics` — the released density on m cells of
  [lower, upper], with its CDF, quantiles and the six indicators of the RVNS paper
  (Section V-B2), and :func:`sample_density` to draw a synthetic sample from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..core import Estimator, Statistic, sum_of_squares
from ..errors import ParameterError
from ..limits import check_cap

#: Entries of one block of a kernel matrix (points x non-empty bins): 32 MiB of float64, so the
#: few temporaries of a block stay small whatever the grid and the bins.
KERNEL_BLOCK = 1 << 22
QUANTILES = (0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
_TAIL = 5  # below, above, n, sum, sumsq


@dataclass(frozen=True)
class BinnedDensity:
    """Counts of values on ``bins`` equal bins over [lo, hi] (accumulator layout:
    ``[count_0 .. count_{bins-1}, below, above, n, sum, sumsq]``, float64; counts are exact
    integers up to 2^53). Values below ``lo`` or above ``hi`` are counted, never dropped."""

    lo: float
    hi: float
    bins: int = 4096

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            raise ParameterError("lo", self.lo, f"a finite number < hi = {self.hi!r}")
        if isinstance(self.bins, bool) or not isinstance(self.bins, int) or self.bins < 2:
            raise ParameterError("bins", self.bins, "an integer >= 2")
        check_cap("cells", self.bins, "bins")

    @property
    def width(self) -> float:
        return (self.hi - self.lo) / self.bins

    @property
    def centres(self) -> np.ndarray:
        return self.lo + (np.arange(self.bins) + 0.5) * self.width

    def create(self) -> np.ndarray:
        return np.zeros(self.bins + _TAIL, dtype=np.float64)

    def add(self, acc: np.ndarray, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64).ravel()
        if y.size == 0:
            return acc
        t = np.subtract(y, self.lo)  # floor((y - lo) / width), in one buffer
        t /= self.width
        np.floor(t, out=t)
        idx = t.astype(np.int64)
        idx[y == self.hi] = self.bins - 1  # the closed right end belongs to the last bin
        np.clip(idx, -1, self.bins, out=idx)  # -1: below the grid, bins: above it
        idx += 1
        counts = np.bincount(idx, minlength=self.bins + 2)
        acc[: self.bins] += counts[1:-1]
        acc[self.bins] += counts[0]
        acc[self.bins + 1] += counts[-1]
        acc[self.bins + 2] += y.size
        acc[self.bins + 3] += y.sum()
        acc[self.bins + 4] += sum_of_squares(y, t)
        return acc

    def counts(self, acc: np.ndarray) -> np.ndarray:
        return acc[: self.bins]

    def n(self, acc: np.ndarray) -> int:
        return int(acc[self.bins + 2])

    def outside(self, acc: np.ndarray) -> tuple[int, int]:
        return int(acc[self.bins]), int(acc[self.bins + 1])

    def moments(self, acc: np.ndarray) -> tuple[float, float]:
        """Mean and (population) standard deviation of all accumulated values."""
        n = acc[self.bins + 2]
        mean = acc[self.bins + 3] / n
        var = max(acc[self.bins + 4] / n - mean * mean, 0.0)
        return float(mean), math.sqrt(var)

    def silverman_bandwidth(self, acc: np.ndarray) -> float:
        """Silverman's rule of thumb h = 1.06 sd n^(-1/5), floored at one bin width."""
        _, sd = self.moments(acc)
        return max(1.06 * sd * self.n(acc) ** -0.2, self.width)


class BinnedEstimator(Estimator):
    """An estimator whose accumulator is the :class:`BinnedDensity` ``self.binned`` (set in
    ``__init__``) of all its mechanism's report fields: one field (``y``) for the noise-adding
    baselines, k fields for RVNS's k reports per user. ``n_reports`` counts users."""

    binned: BinnedDensity

    def create(self) -> np.ndarray:
        return self.binned.create()

    def add(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        for name, _ in self.mechanism.report_fields:
            self.binned.add(acc, np.asarray(reports[name], dtype=np.float64))
        return acc

    def n_reports(self, acc: np.ndarray) -> int:
        return int(round(self.binned.n(acc) / len(self.mechanism.report_fields)))


def kde_on_grid(binned: BinnedDensity, acc: np.ndarray, z: np.ndarray, bandwidth: float,
                reflect: tuple[float, float] | None = None) -> np.ndarray:
    """Gaussian KDE at points ``z`` from binned counts (bin centres stand for their values; the
    error is O(bin width^2 / h^2)). ``reflect=(a, b)`` adds the mirror images of the data in a
    and b, the reflection boundary correction for data supported on [a, b]. Values counted below
    or above the grid carry no position and are left out of the kernel sum, but still count in n.
    """
    if not bandwidth > 0:
        raise ParameterError("bandwidth", bandwidth, "a number > 0")
    c = binned.centres
    w = binned.counts(acc)
    keep = w > 0
    c, w = c[keep], w[keep]
    z = np.asarray(z, dtype=float)
    n = binned.n(acc)
    norm = 1.0 / (n * bandwidth * math.sqrt(2 * math.pi))
    out = np.zeros(z.shape, dtype=float)
    sources = [c] if reflect is None else [c, 2 * reflect[0] - c, 2 * reflect[1] - c]
    # bounded memory: at most 512 points of z at a time, and fewer when there are many non-empty
    # bins, so that a block of the kernel matrix has at most KERNEL_BLOCK entries
    step = max(1, min(512, KERNEL_BLOCK // max(c.size, 1)))
    for src in sources:
        for start in range(0, z.size, step):
            zz = z[start:start + step]
            u = (zz[:, None] - src[None, :]) / bandwidth
            out[start:start + step] += np.exp(-0.5 * u * u) @ w
    return out * norm


@dataclass(frozen=True)
class DensityGrid:
    """m equal cells on [lower, upper]; a density is one value per cell (piecewise constant)."""

    lower: float
    upper: float
    m: int = 100

    def __post_init__(self) -> None:
        if isinstance(self.m, bool) or not isinstance(self.m, int) or self.m < 2:
            raise ParameterError("m", self.m, "an integer >= 2")
        check_cap("cells", self.m, "m")

    @property
    def width(self) -> float:
        return (self.upper - self.lower) / self.m

    @property
    def points(self) -> np.ndarray:
        """The points of interest Z: cell midpoints."""
        return self.lower + (np.arange(self.m) + 0.5) * self.width

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.lower, self.upper, self.m + 1)


def normalize_density(v: np.ndarray, width: float) -> np.ndarray:
    """Clip negatives to 0 and rescale so the density integrates to 1 on the grid."""
    v = np.clip(np.asarray(v, dtype=float), 0.0, None)
    total = v.sum() * width
    if not total > 0:
        raise ParameterError("density", "all zero", "a density with positive mass")
    return v / total


def indicators(grid: DensityGrid, v: np.ndarray) -> dict[str, float]:
    """The six indicators of a piecewise-constant density: mean, std, mode, median, skewness,
    (excess) kurtosis — exact for the piecewise-uniform distribution on the cells."""
    p = v * grid.width
    p = p / p.sum()
    e = grid.edges
    lo, hi = e[:-1], e[1:]
    m1 = float(np.sum(p * (lo + hi) / 2))
    # raw moments of a uniform on [lo, hi]: E[X^k] = (hi^(k+1) - lo^(k+1)) / ((k+1)(hi - lo))
    raw = [float(np.sum(p * (hi ** (k + 1) - lo ** (k + 1)) / ((k + 1) * (hi - lo))))
           for k in (1, 2, 3, 4)]
    var = raw[1] - m1 ** 2
    sd = math.sqrt(max(var, 0.0))
    mu3 = raw[2] - 3 * m1 * raw[1] + 2 * m1 ** 3
    mu4 = raw[3] - 4 * m1 * raw[2] + 6 * m1 ** 2 * raw[1] - 3 * m1 ** 4
    return {"mean": m1, "std": sd, "mode": float(grid.points[int(np.argmax(v))]),
            "median": float(quantile(grid, v, 0.5)),
            "skewness": mu3 / sd ** 3 if sd > 0 else 0.0,
            "kurtosis": mu4 / sd ** 4 - 3.0 if sd > 0 else 0.0}


def quantile(grid: DensityGrid, v: np.ndarray, q: float | np.ndarray) -> np.ndarray:
    """Quantiles of the piecewise-uniform distribution (linear inside each cell)."""
    cdf = np.concatenate([[0.0], np.cumsum(v * grid.width)])
    cdf /= cdf[-1]
    return np.interp(q, cdf, grid.edges)


def density_statistics(grid: DensityGrid, v: np.ndarray, note: str = "") -> dict[str, Statistic]:
    """The released statistics of a density estimate ``v`` on ``grid`` (already normalized)."""
    v = np.asarray(v, dtype=float)
    cdf = np.cumsum(v * grid.width)
    out = {"grid": Statistic(grid.points), "density": Statistic(v, note=note),
           "cdf": Statistic(cdf / cdf[-1]),
           "quantiles": Statistic(quantile(grid, v, np.asarray(QUANTILES)),
                                  note=f"at probabilities {list(QUANTILES)}")}
    for k, val in indicators(grid, v).items():
        out[k] = Statistic(val)
    return out


def sample_density(grid: DensityGrid, v: np.ndarray, n: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` values from the piecewise-uniform density (a synthetic sample of the data)."""
    check_cap("cells", n, "n (synthetic sample size)")
    p = np.clip(v, 0, None) * grid.width
    p = p / p.sum()
    cell = rng.choice(grid.m, size=n, p=p)
    return grid.edges[cell] + rng.random(n) * grid.width


def wasserstein_grid(p: np.ndarray, q: np.ndarray) -> float:
    """Eq. 19 of the RVNS paper: sum over grid points of |F_R(i) - F_S(i)| for two discrete
    distributions on the same grid (each normalized to sum 1). Multiply by the cell width for
    the W1 distance in the data's units."""
    p = np.asarray(p, float) / np.sum(p)
    q = np.asarray(q, float) / np.sum(q)
    return float(np.abs(np.cumsum(p) - np.cumsum(q)).sum())
