"""``central-variance``: the variance of values in [lower, upper] per key (PipelineDP's VARIANCE),
from a noisy count, a noisy normalized sum and a noisy normalized sum of squares, with exact
discrete Laplace noise.

Budget split (PipelineDP's, in three equal parts): epsilon/3 to the count N (L1 sensitivity
m = L0 x Linf rows), epsilon/3 to the normalized sum S = sum(v - mid) (terms within +-h, h =
(upper - lower)/2: sensitivity m h) and epsilon/3 to the normalized sum of squares
Q = sum((v - mid)^2 - h^2/2) (terms within +-h^2/2: sensitivity m h^2 / 2, half of what the
unshifted squares would need). Sequential composition: epsilon. S and Q are exact on their own
grids (powers of two, 40 bits below h and h^2/2: :class:`~ldp_beam.central.aggregation.Lattice`).

Released: ``variance`` = Q / n' + h^2/2 - (S / n')^2 with n' = max(N, 1) (``value``, raw), and
``clipped`` into [0, h^2] (the largest variance a distribution on [lower, upper] can have);
``mean`` (mid + S / n', clipped into [lower, upper]) and ``count`` (N), parts of the same release.
Standard errors: the noise only (the rows are fixed: the estimand is the population variance,
mean of squares minus squared mean, of the rows released from), by the delta method at the
released values: Var(variance) ~ (Var Q + 4 mu^2 Var S + (a - 2 mu^2)^2 Var N) / n'^2 with
mu = S / n' and a = Q / n' (each clipped to its range).

Bias: the raw variance is a ratio of noisy sums, consistent but biased at small n, by about
((a - 3 mu^2) Var N - Var S) / n^2 (second order in the noise; low by Var S / n^2 from the
squared mean, plus the noisy denominator's term). It is not corrected: adding Var S / n'^2 (free,
post-processing) would remove only the first term, the second needs the unknown a and mu and is
of the same order, so the release keeps PipelineDP's formula and states the bias in its note.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import CentralRelease, Reports, Statistic
from ..privacy import PrivacyGuarantee
from .aggregation import (NEVER_CLIPPED, AggregationEstimator, Lattice, get_wide,
                          positive_denominator)
from .mean import BoundedParameters, Normalized


@dataclass(frozen=True)
class CentralVariance(Normalized, CentralRelease, BoundedParameters):
    """Central variance per key of values in [lower, upper] (PipelineDP's VARIANCE), exact noise.

    Noisy count, normalized sum and normalized sum of squares (epsilon/3 each), exact discrete
    Laplace noise; out-of-domain values are dead-lettered, not clamped."""

    NAME: ClassVar[str] = "central-variance"
    report_fields: ClassVar[tuple] = (("units", "int64"), ("square_units", "int64"))
    ACC_SIZE: ClassVar[int] = 5  # rows, normalized sum (two limbs), sum of squares (two limbs)
    LIMBS: ClassVar[tuple[int, ...]] = (1, 3)
    PARTS: ClassVar[int] = 3

    def __post_init__(self) -> None:
        self._check_common(power=2)
        self.count_scale, self.sum_lattice, self.square_lattice

    @property
    def square_shift(self) -> float:
        """h^2/2: the midpoint of the squares' range [0, h^2]."""
        return self.half_width * self.half_width / 2

    @property
    def square_lattice(self) -> Lattice:
        """The normalized squares' grid: terms (v - mid)^2 - h^2/2 within +-h^2/2."""
        return self.memo("square_lattice", lambda: Lattice.of(
            self.square_shift, self.unit_sensitivity, self.part_epsilon,
            "normalized sum of squares ((upper - lower)^2 / 8)"))

    @property
    def guarantee(self) -> PrivacyGuarantee:
        m, s, q = self.unit_sensitivity, self.sum_lattice, self.square_lattice
        e = self.part_epsilon
        return self.unit_guarantee(
            f"variance = Q/n' + h^2/2 - (S/n')^2, n' = max(N, 1), h = (upper - lower)/2 = "
            f"{s.bound:g}, mid = {self.midpoint:g} (PipelineDP's normalized sums). Budget "
            f"split in three: epsilon/3 = {e:g} to the count N (L1 sensitivity L0 x Linf = {m};"
            f" discrete Laplace of scale {float(self.count_scale):.6g}), epsilon/3 to the "
            f"normalized sum S = sum(v - mid) (sensitivity {m} x h; " + s.describe("S")
            + f"), epsilon/3 to the normalized squares Q = sum((v - mid)^2 - h^2/2) "
            f"(sensitivity {m} x h^2/2; " + q.describe("Q") + "); all exact discrete Laplace "
            f"on integers, composed: epsilon = {self.epsilon:g}; {NEVER_CLIPPED}.",
            {"budget": {"count": e, "normalized_sum": e, "normalized_sum_of_squares": e},
             "sensitivity": {"count": m, "normalized_sum": m * s.bound,
                             "normalized_sum_of_squares": m * q.bound},
             "midpoint": self.midpoint, "count": self.count_params(),
             "grid": {"normalized_sum": s.params(), "normalized_sum_of_squares": q.params()}},
            realized=self.count_realized_epsilon + s.realized_epsilon + q.realized_epsilon)

    def report_bounds(self) -> dict[str, tuple[int, int]]:
        return {"units": (-self.sum_lattice.units, self.sum_lattice.units),
                "square_units": (-self.square_lattice.units, self.square_lattice.units)}

    def prepare(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        d = np.asarray(cols["value"], dtype=np.float64) - self.midpoint
        return {"units": self.sum_lattice.encode(d),
                "square_units": self.square_lattice.encode(d * d - self.square_shift)}

    def release_from(self, acc: np.ndarray, gen: np.random.Generator
                     ) -> tuple[dict[str, Statistic], dict]:
        sl, ql = self.sum_lattice, self.square_lattice
        n, s_tot, q_tot = int(acc[0]), get_wide(acc, 1), get_wide(acc, 3)
        noisy_n, (s, q) = self.noisy_parts(n, [s_tot, q_tot], [sl, ql], gen)
        den = positive_denominator(noisy_n)
        h, shift = self.half_width, self.square_shift
        raw = q / den + shift - (s / den) ** 2
        clipped = min(max(raw, 0.0), h * h)
        mu = min(max(s / den, -h), h)
        a = min(max(q / den, -shift), shift)
        var = (ql.noise_sd ** 2 + 4 * mu * mu * sl.noise_sd ** 2
               + (a - 2 * mu * mu) ** 2 * self.count_variance) / den ** 2
        mean_raw = self.midpoint + s / den
        mean_clipped = min(max(mean_raw, self.lower), self.upper)
        mean_se = math.sqrt(sl.noise_sd ** 2 + mu * mu * self.count_variance) / den
        stats = {
            "variance": Statistic(raw, math.sqrt(var), clipped=clipped, note=(
                "Q/n' + h^2/2 - (S/n')^2, n' = max(N, 1), from the noisy count N, normalized "
                "sum S and normalized squares Q (epsilon/3 each); stderr: the noise only, delta "
                "method at the released values; biased at small n' by about ((a - 3 mu^2) "
                "Var N - Var S) / n'^2, a = Q/n', mu = S/n' (second order, not corrected); "
                "clipped: into [0, ((upper - lower)/2)^2]; grid "
                f"rounding at most {ql.grid / 2 + 2 * h * sl.grid / 2:.3g} (not in the stderr)"),
                domain=(0.0, ((self.upper - self.lower) / 2) ** 2)),
            "mean": Statistic(mean_raw, mean_se, clipped=mean_clipped, note=(
                "mid + S/n' (part of the same release); stderr: the noise only, delta method; "
                "clipped: into [lower, upper]"), domain=(self.lower, self.upper)),
            "count": self.count_statistic(noisy_n)}
        exact = {"rows": n}
        if n:
            es, eq = float(s_tot) * sl.grid / n, float(q_tot) * ql.grid / n
            exact.update(mean=self.midpoint + es, variance=eq + shift - es * es)
        return stats, exact


class CentralVarianceEstimator(AggregationEstimator):
    """Accumulates the row count and the exact normalized grid sums of values and squares;
    releases once."""


__all__ = ["CentralVariance", "CentralVarianceEstimator"]
