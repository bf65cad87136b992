"""``central-sum``: the sum of values in [lower, upper] per key (PipelineDP's SUM), exact on a
fixed grid, with exact discrete Laplace noise.

Sensitivity (no midpoint shift): one unit has at most m = L0 x Linf rows over all keys after
bounding, each |v| <= B = max(|lower|, |upper|), so removing it changes the sums of all keys by
at most m B in L1. The values are summed exactly as integers on the grid g (a power of two, 40
bits below B: :class:`~ldp_beam.central.aggregation.Lattice`), so the sensitivity is m D grid
units (D = rint(B / g)) and the noise is the discrete Laplace of scale >= m D / epsilon, in grid
units. Rounding to the grid moves each value by at most g/2 (stated, not in the stderr; below 1%
of the noise SD up to the number of rows the guarantee states).

``clipped``: the sum post-processed to its sign when the domain has one (>= 0 when
lower >= 0, <= 0 when upper <= 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import CentralRelease, Reports, Role, Statistic
from ..privacy import PrivacyGuarantee
from .aggregation import NEVER_CLIPPED, Aggregation, AggregationEstimator, Lattice, get_wide
from .mean import BoundedParameters


@dataclass(frozen=True)
class CentralSum(Aggregation, CentralRelease, BoundedParameters):
    """Central sum per key of values in [lower, upper] (PipelineDP's SUM), exact on a grid.

    Exact on a 2^-40 grid, + exact discrete Laplace noise of scale >= L0 x Linf x
    max(|lower|, |upper|) / epsilon; out-of-domain values are dead-lettered, not clamped."""

    NAME: ClassVar[str] = "central-sum"
    roles: ClassVar[tuple[Role, ...]] = (Role("value", help="a number in [lower, upper]"),)
    report_fields: ClassVar[tuple] = (("units", "int64"),)
    ACC_SIZE: ClassVar[int] = 3  # rows, sum (two limbs)
    LIMBS: ClassVar[tuple[int, ...]] = (1,)

    def __post_init__(self) -> None:
        self._check_common()
        self.lattice  # the grid and the noise scale exist

    @property
    def lattice(self) -> Lattice:
        """The sum's grid, sensitivity and noise scale."""
        return self.memo("lattice", lambda: Lattice.of(
            max(abs(self.lower), abs(self.upper)), self.unit_sensitivity, self.epsilon,
            "sum (max(|lower|, |upper|))"))

    @property
    def sensitivity(self) -> float:
        """L0 x Linf x max(|lower|, |upper|), in data units."""
        return self.unit_sensitivity * self.lattice.bound

    @property
    def guarantee(self) -> PrivacyGuarantee:
        lat, m = self.lattice, self.unit_sensitivity
        return self.unit_guarantee(
            f"sum of the values + exact discrete Laplace noise: L1 sensitivity L0 x Linf x "
            f"max(|lower|, |upper|) = {m} x {lat.bound:g} (no midpoint shift); "
            + lat.describe("the sum") + f"; {NEVER_CLIPPED}.",
            {"sensitivity": {"sum": self.sensitivity}, "budget": {"sum": self.epsilon},
             "grid": {"sum": lat.params()}},
            realized=lat.realized_epsilon)

    def report_bounds(self) -> dict[str, tuple[int, int]]:
        return {"units": (-self.lattice.units, self.lattice.units)}

    def prepare(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return {"units": self.lattice.encode(cols["value"])}

    def release_from(self, acc: np.ndarray, gen: np.random.Generator
                     ) -> tuple[dict[str, Statistic], dict]:
        lat = self.lattice
        total = get_wide(acc, 1)
        value = float(lat.noisy(total, gen)) * lat.grid
        clipped = max(value, 0.0) if self.lower >= 0 else \
            (min(value, 0.0) if self.upper <= 0 else None)
        stat = Statistic(value, lat.noise_sd, clipped=clipped, note=(
            "sum of the values (after contribution bounding) + exact discrete Laplace noise on "
            f"the grid g = {lat.grid:.6g}; stderr: the noise's; grid rounding: at most g/2 per "
            f"row, not in the stderr (below 1% of it up to {lat.negligible_rows:.3g} rows)"
            + ("; clipped: to the sign of the domain" if clipped is not None else "")))
        return {"sum": stat}, {"rows": int(acc[0]), "sum": float(total) * lat.grid}


class CentralSumEstimator(AggregationEstimator):
    """Accumulates the row count and the exact grid sum (two int64 limbs); releases once."""


__all__ = ["CentralSum", "CentralSumEstimator"]
