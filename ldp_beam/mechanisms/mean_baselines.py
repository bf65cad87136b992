"""The BiSample paper's baselines for mean and missing-rate estimation.

* Harmony (Nguyen et al. 2016; Algorithm 1 of the BiSample paper).
* The Piecewise Mechanism, PM (Wang et al., ICDE 2019).
* PrivKVM (Ye et al., S&P 2019) on the key-value encoding <1, v> / <0, ->, as the BiSample paper
  uses it for the missing rate: one real round, virtual rounds on the server.

Harmony and PM force an answer, so missing users fake one (``fake='top'`` or ``'rnd'``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import Reports
from ..errors import ParameterError
from ..privacy import FLOAT_OUTPUT_NOTE, LDP, PrivacyGuarantee
from .bisample import debias_reach
from .numeric import ForcedAnswerMechanism, NumericMechanism


@dataclass(frozen=True)
class Harmony(ForcedAnswerMechanism):
    """Harmony: discretize v to +-1 w.p. (1 +- v)/2, then randomized response (epsilon-LDP).

    Report: ``y`` (int8, +-1). The paper's adjusted output is ``y * (e^eps + 1)/(e^eps - 1)``; the
    two steps collapse to one draw, Pr[y = 1] = 1/2 + (2p - 1) v / 2.
    """

    NAME: ClassVar[str] = "harmony"
    family: ClassVar[str] = "bisample"
    report_fields: ClassVar[tuple] = (("y", "int8"),)

    @property
    def draws(self) -> int:
        return 2  # Bernoulli, fake value

    @property
    def normalized_reach(self) -> float:
        """The adjusted outputs +-(e^eps + 1)/(e^eps - 1) = +-coth(eps/2) bound the estimate."""
        return debias_reach(self.epsilon)

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(LDP, self.epsilon, notes="randomized response on a +-1 bit; tight")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        x = self.answers(cols, u)
        plus = u[:, 0] < 0.5 + (2 * self.p - 1) * x / 2
        return {"y": np.where(plus, 1, -1).astype(np.int8)}

    def output_probabilities(self, x: np.ndarray) -> np.ndarray:
        """P[y | x] for normalized x; columns: y = -1, y = +1."""
        q = 0.5 + (2 * self.p - 1) * np.atleast_1d(np.asarray(x, float)) / 2
        return np.stack([1 - q, q], axis=1)


@dataclass(frozen=True)
class PiecewiseMechanism(ForcedAnswerMechanism):
    """The Piecewise Mechanism (Wang et al. 2019, Algorithm 2): epsilon-LDP, continuous output.

    With C = (e^(eps/2) + 1)/(e^(eps/2) - 1), l(t) = (C + 1) t / 2 - (C - 1)/2 and r(t) = l(t) + C - 1:
    y ~ U[l, r] w.p. e^(eps/2)/(e^(eps/2) + 1), else y ~ U([-C, l) u (r, C]). E[y] = t.
    Report: ``y`` (float64, normalized scale [-C, C]).
    """

    NAME: ClassVar[str] = "pm"
    family: ClassVar[str] = "bisample"
    report_fields: ClassVar[tuple] = (("y", "float64"),)

    @property
    def C(self) -> float:
        e = math.exp(self.epsilon / 2)
        return (e + 1) / (e - 1)

    @property
    def draws(self) -> int:
        return 3  # region, position, fake value

    @property
    def normalized_reach(self) -> float:
        """Reports (and their mean) lie in [-C, C], C = coth(eps/4) (no overflow for large
        epsilon, where the C property's e^(eps/2) would)."""
        return debias_reach(self.epsilon / 2.0)

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(LDP, self.epsilon,
                                notes="density ratio e^(eps/2) * (C+1)/(C-1) = e^eps; tight."
                                      + FLOAT_OUTPUT_NOTE)

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        t = self.answers(cols, u)
        C = self.C
        e = math.exp(self.epsilon / 2)
        left = (C + 1) / 2 * t - (C - 1) / 2
        right = left + C - 1
        centre = u[:, 0] < e / (e + 1)
        y_in = left + u[:, 1] * (C - 1)
        w = u[:, 1] * (C + 1)  # position along the two outer pieces, total length C + 1
        y_out = np.where(w < left + C, -C + w, right + (w - (left + C)))
        return {"y": np.where(centre, y_in, y_out)}

    def density(self, y: np.ndarray, t: float) -> np.ndarray:
        """The output density p(y | t) on [-C, C] (for audits)."""
        C, e = self.C, math.exp(self.epsilon / 2)
        left = (C + 1) / 2 * t - (C - 1) / 2
        inside = (y >= left) & (y <= left + C - 1)
        hi = e / (e + 1) / (C - 1)
        lo = 1 / (e + 1) / (C + 1)
        return np.where(np.abs(y) <= C, np.where(inside, hi, lo), 0.0)


@dataclass(frozen=True)
class PrivKVM(NumericMechanism):
    """PrivKVM on the key-value encoding: a user with a value holds <1, v>, a missing user <0, ->.

    One real round of PrivKV's perturbation (Ye et al. 2019, Algorithm 'LPP'): the key is kept with
    probability p1 = e^eps1/(e^eps1 + 1); a kept value is discretized to +-1 and sent through
    randomized response with eps2; a missing user who flips its key to 1 sends a uniform fake value
    (discretized, then perturbed). eps1 = key_fraction * epsilon, eps2 = epsilon - eps1.
    Report: ``k`` (uint8) and ``v`` (int8: +-1 when k = 1, 0 when k = 0).
    The estimator runs ``virtual_iterations`` server-side virtual rounds (PrivKVM*).
    """

    NAME: ClassVar[str] = "privkvm"
    family: ClassVar[str] = "bisample"
    report_fields: ClassVar[tuple] = (("k", "uint8"), ("v", "int8"))
    allow_missing: bool = True
    key_fraction: float = 0.5
    virtual_iterations: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.key_fraction, bool) or not isinstance(
                self.key_fraction, (int, float, np.integer, np.floating)) \
                or not (0 < self.key_fraction < 1):
            raise ParameterError("key_fraction", self.key_fraction, "a number in (0, 1)")
        if isinstance(self.virtual_iterations, bool) or not isinstance(self.virtual_iterations, int) \
                or not 0 <= self.virtual_iterations <= 1000:
            raise ParameterError("virtual_iterations", self.virtual_iterations,
                                 "an integer in [0, 1000]")

    @property
    def eps1(self) -> float:
        return self.epsilon * self.key_fraction

    @property
    def eps2(self) -> float:
        return self.epsilon - self.eps1

    @property
    def p1(self) -> float:
        return math.exp(self.eps1) / (math.exp(self.eps1) + 1)

    @property
    def p2(self) -> float:
        return math.exp(self.eps2) / (math.exp(self.eps2) + 1)

    @property
    def draws(self) -> int:
        return 3  # key, discretization, value RR

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            LDP, self.epsilon, notes="eps1 (key) + eps2 (value) by composition; the exact worst "
            "case is smaller (ldp-beam audit computes it)",
            params={"eps1": self.eps1, "eps2": self.eps2})

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        miss = self.missing(cols)
        x = np.where(miss, 0.0, self.normalize(cols["value"]))  # fake uniform: Pr[+1] = 1/2
        has_key = ~miss
        key_out = np.where(has_key, u[:, 0] < self.p1, u[:, 0] >= self.p1)
        disc = u[:, 1] < (1 + x) / 2  # discretize to +1 w.p. (1 + x)/2
        keep = u[:, 2] < self.p2
        v = np.where(disc == keep, 1, -1)
        return {"k": key_out.astype(np.uint8), "v": np.where(key_out, v, 0).astype(np.int8)}

    def output_probabilities(self, x: np.ndarray) -> np.ndarray:
        """P[report | x] for normalized x (NaN = missing). Columns: <0,0>, <1,-1>, <1,+1>."""
        x = np.atleast_1d(np.asarray(x, float))
        miss = np.isnan(x)
        pk = np.where(miss, 1 - self.p1, self.p1)
        q = np.where(miss, 0.5, (1 + np.nan_to_num(x)) / 2)  # Pr[discretized = +1]
        plus = q * self.p2 + (1 - q) * (1 - self.p2)
        return np.stack([1 - pk, pk * (1 - plus), pk * plus], axis=1)


