"""``central-mean``: the mean of values in [lower, upper] per key (PipelineDP's MEAN), from a noisy
count and a noisy *normalized* sum, with exact discrete Laplace noise.

Budget split (PipelineDP's): epsilon/2 to the count N (L1 sensitivity m = L0 x Linf rows) and
epsilon/2 to the normalized sum S = sum(v - mid), mid = (lower + upper)/2, whose terms are within
+-(upper - lower)/2: L1 sensitivity m (upper - lower)/2, half of what the raw sum would need.
Sequential composition: epsilon. The sum is exact on the grid g (a power of two, 40 bits below
(upper - lower)/2: :class:`~ldp_beam.central.aggregation.Lattice`), so the mean's grid rounding is
at most g/2 whatever the number of rows.

Released: ``mean`` = mid + S / max(N, 1) (``value``, raw) and ``clipped`` into [lower, upper]
(post-processing); ``count`` = N (its own statistic: it is part of the release). Standard error:
the noise only (the rows are fixed: the estimand is the mean of the rows released from), by the
delta method at the released values, sqrt(Var S + mu^2 Var N) / max(N, 1) with mu = the clipped
mean - mid; accurate when N is well above its noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import CentralRelease, Reports, Role, Statistic
from ..noise import discrete_laplace_scale, discrete_laplace_variance, realized_epsilon
from ..privacy import PrivacyGuarantee
from .aggregation import (NEVER_CLIPPED, Aggregation, AggregationEstimator, Lattice,
                          budget_part, draw_noise, get_wide, positive_denominator)


@dataclass(frozen=True)
class BoundedParameters:
    """The parameters of the central releases of values in [lower, upper] (sum, mean, variance),
    a frozen dataclass base that declares them once: the budget ``epsilon``, the value domain
    and the contribution bounds L0 and Linf (validated by :meth:`Aggregation._check_common`)."""

    epsilon: float
    lower: float
    upper: float
    max_partitions_per_unit: int = 1
    max_rows_per_partition: int = 1


class Normalized(Aggregation):
    """Releases built from a noisy count and midpoint-normalized sums, each with ``1/PARTS`` of
    epsilon (mean: count + sum; variance: count + sum + sum of squares)."""

    PARTS: ClassVar[int] = 2
    roles: ClassVar[tuple[Role, ...]] = (Role("value", help="a number in [lower, upper]"),)

    @property
    def part_epsilon(self) -> float:
        return budget_part(self.epsilon, self.PARTS)

    @property
    def count_scale(self):
        return self.memo("count_scale", lambda: discrete_laplace_scale(self.unit_sensitivity,
                                                                       self.part_epsilon))

    @property
    def count_variance(self) -> float:
        return self.memo("count_variance",
                         lambda: float(discrete_laplace_variance(self.count_scale)))

    @property
    def sum_lattice(self) -> Lattice:
        """The normalized sum's grid: terms v - mid within +-(upper - lower)/2."""
        return self.memo("sum_lattice", lambda: Lattice.of(
            self.half_width, self.unit_sensitivity, self.part_epsilon,
            "normalized sum ((upper - lower)/2)"))

    def noisy_parts(self, n: int, totals: list[int], lattices: list[Lattice],
                    gen: np.random.Generator) -> tuple[int, list[float]]:
        """The noisy count (integer) and the noisy sums (data units): every part plus its own
        exact discrete Laplace draw (the count's scale >= m / part, each sum's its lattice's),
        drawn in one sampler call."""
        z = draw_noise(gen, [self.count_scale] + [lat.scale for lat in lattices])
        sums = [float(t + zi) * lat.grid for t, zi, lat in zip(totals, z[1:], lattices)]
        return int(n) + z[0], sums

    def normalized_units(self, values: np.ndarray) -> np.ndarray:
        return self.sum_lattice.encode(np.asarray(values, dtype=np.float64) - self.midpoint)

    def count_statistic(self, noisy: int) -> Statistic:
        return Statistic(noisy, math.sqrt(self.count_variance), clipped=max(noisy, 0),
                         note=f"the noisy row count (epsilon/{self.PARTS} of the budget) the "
                              "release divides by; stderr: the noise's; clipped: at least 0")

    def count_params(self) -> dict:
        return {"sensitivity": self.unit_sensitivity, "epsilon": self.part_epsilon,
                "scale": str(self.count_scale)}

    @property
    def count_realized_epsilon(self) -> float:
        return realized_epsilon(self.unit_sensitivity, self.count_scale)


@dataclass(frozen=True)
class CentralMean(Normalized, CentralRelease, BoundedParameters):
    """Central mean per key of values in [lower, upper] (PipelineDP's MEAN), exact noise.

    mid + (noisy normalized sum) / (noisy count), epsilon split in two halves, exact discrete
    Laplace noise; out-of-domain values are dead-lettered, not clamped."""

    NAME: ClassVar[str] = "central-mean"
    report_fields: ClassVar[tuple] = (("units", "int64"),)
    ACC_SIZE: ClassVar[int] = 3  # rows, normalized sum (two limbs)
    LIMBS: ClassVar[tuple[int, ...]] = (1,)
    PARTS: ClassVar[int] = 2

    def __post_init__(self) -> None:
        self._check_common()
        self.count_scale, self.sum_lattice  # both in the exact sampler's range

    @property
    def guarantee(self) -> PrivacyGuarantee:
        m, lat = self.unit_sensitivity, self.sum_lattice
        e = self.part_epsilon
        return self.unit_guarantee(
            f"mean = mid + S / max(N, 1), mid = (lower + upper)/2 = {self.midpoint:g} "
            f"(PipelineDP's normalized sum). Budget split: epsilon/2 = {e:g} to the count N "
            f"(L1 sensitivity L0 x Linf = {m}; discrete Laplace of scale "
            f"{float(self.count_scale):.6g}) and epsilon/2 = {e:g} to the normalized sum "
            f"S = sum(v - mid) (L1 sensitivity L0 x Linf x (upper - lower)/2 = {m} x "
            f"{lat.bound:g}; " + lat.describe("S") + "); both exact discrete Laplace on "
            f"integers, composed: epsilon = {self.epsilon:g}; {NEVER_CLIPPED}.",
            {"budget": {"count": e, "normalized_sum": e},
             "sensitivity": {"count": m, "normalized_sum": m * lat.bound},
             "midpoint": self.midpoint, "count": self.count_params(),
             "grid": {"normalized_sum": lat.params()}},
            realized=self.count_realized_epsilon + lat.realized_epsilon)

    def report_bounds(self) -> dict[str, tuple[int, int]]:
        return {"units": (-self.sum_lattice.units, self.sum_lattice.units)}

    def prepare(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return {"units": self.normalized_units(cols["value"])}

    def release_from(self, acc: np.ndarray, gen: np.random.Generator
                     ) -> tuple[dict[str, Statistic], dict]:
        lat = self.sum_lattice
        n, total = int(acc[0]), get_wide(acc, 1)
        noisy_n, (s,) = self.noisy_parts(n, [total], [lat], gen)
        den = positive_denominator(noisy_n)
        raw = self.midpoint + s / den
        clipped = min(max(raw, self.lower), self.upper)
        mu = clipped - self.midpoint
        se = math.sqrt(lat.noise_sd ** 2 + mu * mu * self.count_variance) / den
        stats = {"mean": Statistic(raw, se, clipped=clipped, note=(
            "mid + S / max(N, 1) from the noisy normalized sum S and the noisy count N "
            "(epsilon/2 each); stderr: the noise only, delta method at the released values: "
            "sqrt(Var S + mu^2 Var N) / max(N, 1), mu = clipped - mid; clipped: into "
            f"[lower, upper]; grid rounding at most g/2 = {lat.grid / 2:.3g} (not in the "
            "stderr)"), domain=(self.lower, self.upper)),
            "count": self.count_statistic(noisy_n)}
        exact = {"rows": n, "normalized_sum": float(total) * lat.grid,
                 "mean": self.midpoint + float(total) * lat.grid / n if n else None}
        return stats, exact


class CentralMeanEstimator(AggregationEstimator):
    """Accumulates the row count and the exact normalized grid sum; releases once."""


__all__ = ["BoundedParameters", "CentralMean", "CentralMeanEstimator", "Normalized"]
