"""BiSample and BiSample-MD (Sun et al., "BiSample: Bidirectional Sampling for Handling Missing
Data with Local Differential Privacy"; spec: shared/specs/bisample.md).

Report (wire form): two bits per user, ``s`` (uint8, 1 = positive sampling) and ``b`` (uint8).
The paper's scaled form ``((U - L)/2) b + (U + L)/2`` is only a presentation of ``b``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import Reports
from ..privacy import LDP, PrivacyGuarantee
from .numeric import ForcedAnswerMechanism, NumericMechanism

BITS = (("s", "uint8"), ("b", "uint8"))


def _bisample(x: np.ndarray, missing: np.ndarray | None, p: float, u: np.ndarray) -> Reports:
    """Algorithm 2 (and 4 for missing users) on normalized values x in [-1, 1]."""
    s = u[:, 0] < 0.5  # direction: 1 = positive sampling, uniform
    sign = np.where(s, 1.0, -1.0)
    q = 0.5 + (2.0 * p - 1.0) * sign * x / 2.0  # Pr[b = 1]: Alg. 2 lines 3 and 5
    if missing is not None and missing.any():
        q = np.where(missing, 1.0 - p, q)  # Alg. 4: a null value gives b = 1 w.p. 1/(e^eps + 1)
    b = u[:, 1] < q
    return {"s": s.astype(np.uint8), "b": b.astype(np.uint8)}


def debias_reach(epsilon: float) -> float:
    """1/(2p - 1) with p = e^eps/(e^eps + 1), i.e. (e^eps + 1)/(e^eps - 1) = coth(eps/2): the
    factor by which randomized response's estimates are debiased (computed without overflow)."""
    t = math.tanh(float(epsilon) / 2.0)
    return math.inf if t == 0.0 else 1.0 / t


def bisample_output_probabilities(x: np.ndarray, p: float) -> np.ndarray:
    """P[(s, b) | x] for normalized x in [-1, 1] (NaN = bottom). Columns: codes 2s + b."""
    x = np.atleast_1d(np.asarray(x, dtype=float))
    q_pos = np.where(np.isnan(x), 1 - p, 0.5 + (2 * p - 1) * x / 2)
    q_neg = np.where(np.isnan(x), 1 - p, 0.5 - (2 * p - 1) * x / 2)
    return 0.5 * np.stack([1 - q_neg, q_neg, 1 - q_pos, q_pos], axis=1)


class _BiSampleBits:
    """What BiSample and BiSample-MD share: the two-bit report and its estimates' reach."""

    family: ClassVar[str] = "bisample"
    report_fields: ClassVar[tuple] = BITS

    @property
    def normalized_reach(self) -> float:
        """The unclipped estimate (f_pos - f_neg)/(2p - 1) reaches 1/(2p - 1) = coth(eps/2);
        BiSample-MD's ratio estimate of the answering users' mean exceeds it only when their
        estimated share is near 0, whatever the bounds."""
        return debias_reach(self.epsilon)

    def output_probabilities(self, x: np.ndarray) -> np.ndarray:
        return bisample_output_probabilities(x, self.p)


@dataclass(frozen=True)
class BiSample(_BiSampleBits, ForcedAnswerMechanism):
    """BiSample (Algorithm 2): epsilon-LDP mean estimation by bidirectional sampling.

    Everyone must answer; users who would not (missing source value with ``allow_missing``, or
    eps_u < epsilon) fake an answer (``fake``), which biases the mean: use BiSample-MD instead.
    """

    NAME: ClassVar[str] = "bisample"

    @property
    def draws(self) -> int:
        return 3  # direction, Bernoulli, fake value

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(LDP, self.epsilon, notes="Theorem 3.1; exact (tight at v = +-1)")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return _bisample(self.answers(cols, u), None, self.p, u)


@dataclass(frozen=True)
class BiSampleMD(_BiSampleBits, NumericMechanism):
    """BiSample-MD (Algorithms 3-4): users who do not answer send a report of the null value.

    The output space is the same two bits; the guarantee is epsilon-LDP over [L, U] and the null
    value together (Theorem 4.1). Null source values count as missing by default here
    (``allow_missing=True``); set it to False to dead-letter them instead.
    """

    NAME: ClassVar[str] = "bisample-md"
    allow_missing: bool = True

    @property
    def draws(self) -> int:
        return 2

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(LDP, self.epsilon,
                                notes="Theorem 4.1; over [L, U] and the null value; tight")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        miss = self.missing(cols)
        x = np.where(miss, 0.0, self.normalize(cols["value"]))
        return _bisample(x, miss, self.p, u)
