"""``central-count`` and ``privacy-id-count``: noisy row counts and distinct-unit counts per key
(PipelineDP's COUNT and PRIVACY_ID_COUNT), with exact discrete Laplace noise.

* :class:`CentralCount` counts the rows of each key after contribution bounding: one unit has at
  most Linf rows in each of at most L0 keys, so removing it changes the counts of all keys
  together by at most m = L0 x Linf (L1), and each key's count gets discrete Laplace noise of
  scale t >= m / epsilon.
* :class:`PrivacyIdCount` counts the distinct privacy units of each key. It fixes Linf = 1: the
  pipeline keeps one row per unit per key, so the rows left *are* the units, and removing a unit
  changes at most L0 counts by 1: sensitivity L0.

The input column (role ``value``) is only counted: any column, any type, a missing value
included (nothing is dead-lettered by the count itself). Standard error: the noise's,
sqrt(2q/(1 - q)^2) with q = exp(-1/t). ``clipped``: the count at least 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Mapping

import numpy as np

from ..core import CentralRelease, Reports, Role, Statistic
from ..errors import ParameterError
from ..noise import discrete_laplace_scale, discrete_laplace_variance, realized_epsilon
from ..privacy import PrivacyGuarantee
from .aggregation import Aggregation, AggregationEstimator, draw_noise

_COUNTED = Role("value", help="any column of the rows counted (only its rows are counted; any "
                              "type, missing values included)")


class _Counting(Aggregation):
    NUMERIC: ClassVar[bool] = False
    roles: ClassVar[tuple[Role, ...]] = (_COUNTED,)
    report_fields: ClassVar[tuple] = (("row", "int8"),)
    ACC_SIZE: ClassVar[int] = 1
    #: the name of the published statistic
    STATISTIC: ClassVar[str] = "count"

    @property
    def sensitivity(self) -> int:
        """The L1 change of all keys' counts when one unit is removed."""
        return self.unit_sensitivity

    @property
    def scale(self):
        """The rational scale t >= sensitivity / epsilon of the exact discrete Laplace noise."""
        return self.memo("scale", lambda: discrete_laplace_scale(self.sensitivity, self.epsilon))

    @property
    def realized_epsilon(self) -> float:
        return realized_epsilon(self.sensitivity, self.scale)

    @property
    def noise_variance(self) -> float:
        return self.memo("noise_variance", lambda: float(discrete_laplace_variance(self.scale)))

    def prepare(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return {"row": np.ones(len(cols["value"]), dtype=np.int8)}

    def fold(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        acc[0] += int(np.asarray(reports["row"]).size)
        return acc

    def release_from(self, acc: np.ndarray, gen: np.random.Generator
                     ) -> tuple[dict[str, Statistic], dict]:
        n = int(acc[0])
        noisy = n + draw_noise(gen, [self.scale])[0]
        se = math.sqrt(self.noise_variance)
        stat = Statistic(noisy, se, clipped=max(noisy, 0), note=self.STATISTIC_NOTE
                         + f"; stderr: the noise's (discrete Laplace of scale "
                           f"{float(self.scale):.6g}); clipped: at least 0")
        return {self.STATISTIC: stat}, {self.STATISTIC: n}

    STATISTIC_NOTE: ClassVar[str] = ""


@dataclass(frozen=True)
class CentralCount(_Counting, CentralRelease):
    """Central count of rows per key (PipelineDP's COUNT), with exact discrete Laplace noise.

    Rows after bounding + noise of scale >= L0 x Linf / epsilon (sensitivity L0 x Linf)."""

    NAME: ClassVar[str] = "central-count"
    STATISTIC_NOTE: ClassVar[str] = "the number of rows (after contribution bounding) + noise"

    epsilon: float
    max_partitions_per_unit: int = 1
    max_rows_per_partition: int = 1

    def __post_init__(self) -> None:
        self._check_common()
        self.scale  # in the exact sampler's range

    @property
    def guarantee(self) -> PrivacyGuarantee:
        m = self.sensitivity
        return self.unit_guarantee(
            f"count of rows + exact discrete Laplace noise of scale t = {float(self.scale):.6g}"
            f" >= L0 x Linf / epsilon = {m}/{self.epsilon:g} (L1 sensitivity L0 x Linf = {m}: "
            "removing a unit's bounded rows changes all keys' counts by at most that); the "
            "input column is only counted (nothing is dead-lettered by the count).",
            {"sensitivity": {"count": m}, "budget": {"count": self.epsilon}},
            realized=self.realized_epsilon)


@dataclass(frozen=True)
class PrivacyIdCount(_Counting, CentralRelease):
    """Distinct privacy units per key (PipelineDP's PRIVACY_ID_COUNT), exact discrete Laplace.

    Linf = 1 (one row per unit per key after bounding, so the rows are the units) + noise of
    scale >= L0 / epsilon (sensitivity L0)."""

    NAME: ClassVar[str] = "privacy-id-count"
    STATISTIC: ClassVar[str] = "privacy_id_count"
    STATISTIC_NOTE: ClassVar[str] = ("the number of distinct privacy units (one row per unit per "
                                     "key after bounding; per record without --privacy-unit: "
                                     "the rows) + noise")

    epsilon: float
    max_partitions_per_unit: int = 1
    #: fixed at 1: one row per unit per key, so that the rows counted are the distinct units
    max_rows_per_partition: int = 1

    def __post_init__(self) -> None:
        self._check_common()
        if self.max_rows_per_partition != 1:
            raise ParameterError("max_rows_per_partition", self.max_rows_per_partition,
                                 "1: privacy-id-count keeps one row per unit per key, so that "
                                 "the rows it counts are the distinct units (use central-count "
                                 "to count rows)")
        self.scale

    @property
    def sensitivity(self) -> int:
        """L0: a unit counts once in each of at most L0 keys."""
        return self.max_partitions_per_unit

    @property
    def guarantee(self) -> PrivacyGuarantee:
        L0 = self.max_partitions_per_unit
        return self.unit_guarantee(
            f"count of distinct privacy units + exact discrete Laplace noise of scale t = "
            f"{float(self.scale):.6g} >= L0 / epsilon = {L0}/{self.epsilon:g} (Linf is fixed "
            f"at 1: one row per unit per key, so the rows are the units; removing a unit "
            f"changes at most L0 = {L0} keys' counts by 1: L1 sensitivity {L0}); the input "
            "column is only counted.",
            {"sensitivity": {"privacy_id_count": L0},
             "budget": {"privacy_id_count": self.epsilon}},
            realized=self.realized_epsilon)


class CentralCountEstimator(AggregationEstimator):
    """Accumulates the row count (int64) and releases it once (``central-count`` and
    ``privacy-id-count``)."""


__all__ = ["CentralCount", "PrivacyIdCount", "CentralCountEstimator"]
