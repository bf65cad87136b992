"""A third-party plugin: Warner's randomized response on a yes/no answer, with its estimator.

It uses only ldp-beam's public contracts; nothing in ldp-beam knows about it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ldp_beam.core import CountEstimator, Mechanism, Reasons, Statistic, check_epsilon
from ldp_beam.privacy import LDP, PrivacyGuarantee


@dataclass(frozen=True)
class CoinFlip(Mechanism):
    """Warner's randomized response on a 0/1 answer."""

    NAME: ClassVar[str] = "coinflip"
    family: ClassVar[str] = "coinflip"
    report_fields: ClassVar[tuple] = (("r", "uint8"),)
    epsilon: float = 1.0

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)

    @property
    def draws(self) -> int:
        return 1

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(LDP, self.epsilon)

    def validate(self, cols, reasons: Reasons) -> None:
        v = cols["value"]
        reasons.flag(~np.isin(v, (0.0, 1.0)), lambda i: f"value: {v[i].item()!r} is not 0 or 1")

    def randomize(self, cols, u):
        keep = u[:, 0] < math.exp(self.epsilon) / (1 + math.exp(self.epsilon))
        v = cols["value"].astype(bool)
        return {"r": np.where(keep, v, ~v).astype(np.uint8)}


class CoinFlipEstimator(CountEstimator):
    n_cells = 2

    def cells(self, reports):
        return np.asarray(reports["r"], np.int64)

    def statistics(self, acc):
        n = int(acc.sum())
        p = math.exp(self.mechanism.epsilon) / (1 + math.exp(self.mechanism.epsilon))
        f = acc[1] / n
        return {"share_yes": Statistic((f + p - 1) / (2 * p - 1),
                                       math.sqrt(f * (1 - f) / n) / (2 * p - 1))}


def register(registry) -> None:
    registry.register("coinflip", CoinFlip, CoinFlipEstimator, source="ldp-beam-coinflip")
