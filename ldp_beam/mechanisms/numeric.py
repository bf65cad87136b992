"""Shared client-side behaviour of the numeric mean mechanisms (BiSample family and baselines).

A value v in [lower, upper] is mapped to v' = (2v - (lower + upper)) / (upper - lower) in [-1, 1]
(BiSample paper, Section 3). A user does not give the real value (is *missing*) when

* the source value is null/NaN and the mechanism was built with ``allow_missing=True`` (otherwise
  such a record is invalid and goes to the dead-letter output), or
* the user's privacy preference eps_u (a ``preference`` column, or the fixed ``preference``
  parameter) is below the system budget ``epsilon`` (Algorithm 3, PV).

What a missing user sends depends on the mechanism: BiSample-MD and PrivKVM encode the missing
value itself (bottom / key 0); mechanisms that force an answer fake one (``fake='top'``: the upper
bound; ``fake='rnd'``: a uniform value), as in the paper's TOP and RND user behaviours.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import Mechanism, Reasons, Role, check_choice, check_epsilon, check_interval
from ..errors import ParameterError

VALUE = Role("value", help="the sensitive number, in [lower, upper]")
PREFERENCE = Role("preference", required=False,
                  help="the user's privacy preference eps_u in [0, inf]; the user answers iff "
                       "eps_u >= epsilon (0: never, inf: always)")


@dataclass(frozen=True)
class NumericMechanism(Mechanism):
    """Base: epsilon, the domain [lower, upper], preferences and missing-value handling.

    ``lower`` and ``upper`` are required: a default domain (the papers' [-1, 1]) cannot fit
    arbitrary data, and every value outside it would be dead-lettered; the estimates are mapped
    back to [lower, upper]. Bounds are refused (:func:`~ldp_beam.core.check_interval`) when
    ``upper - lower`` overflows or when the scaled values or the unclipped estimates (up to
    :attr:`normalized_reach` on the [-1, 1] scale) would not be finite."""

    epsilon: float
    lower: float  # required: no fixed domain fits arbitrary data (values outside are invalid)
    upper: float
    preference: float | None = None
    allow_missing: bool = False

    roles: ClassVar[tuple[Role, ...]] = (VALUE, PREFERENCE)
    #: scalars (mean, sum, missing_rate, ...), each with its consistent value
    tidy_cells: ClassVar[tuple[str, ...]] = ("clipped",)

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        # values are scaled to [-1, 1] (2v - (lower + upper)) and estimates back from up to
        # normalized_reach on that scale: both must stay finite (check_interval's reach is in
        # widths, and denormalize(x) = lower + (x + 1)/2 (upper - lower))
        r = self.normalized_reach
        check_interval(self.lower, self.upper, reach=r / 2.0,
                       computes=f"values scaled to [-1, 1] and unclipped estimates of up to "
                       f"{r:.4g} on that scale mapped back: lower + (x + 1)/2 (upper - lower)")
        if self.preference is not None:
            if isinstance(self.preference, bool) or not isinstance(self.preference, (int, float)) \
                    or not self.preference >= 0:
                raise ParameterError("preference", self.preference,
                                     "an epsilon in [0, inf] (or None: every user answers)")
        if not isinstance(self.allow_missing, bool):
            raise ParameterError("allow_missing", self.allow_missing, "True or False")

    # -- helpers shared by the family
    @property
    def normalized_reach(self) -> float:
        """The largest |x| on the normalized scale [-1, 1] that the mechanism's reports or its
        estimator's unclipped estimates reach (1 here; more where the estimator debiases by a
        factor, e.g. 1/(2p - 1)); the bounds are checked so that ``denormalize(+-reach)`` is
        finite."""
        return 1.0

    @property
    def p(self) -> float:
        """Keep probability of randomized response with budget epsilon (Eq. 2)."""
        return math.exp(self.epsilon) / (math.exp(self.epsilon) + 1.0)

    def normalize(self, v: np.ndarray) -> np.ndarray:
        return (2.0 * v - (self.lower + self.upper)) / (self.upper - self.lower)

    def denormalize(self, x: float) -> float:
        return (x * (self.upper - self.lower) + (self.upper + self.lower)) / 2.0

    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        v = cols["value"]
        nan = np.isnan(v)
        if not self.allow_missing:
            reasons.flag(nan, "value: missing (null/NaN) and allow_missing=False")
        reasons.flag(~nan & ~((v >= self.lower) & (v <= self.upper)),
                     lambda i: f"value: {v[i].item()!r} outside [{self.lower:g}, {self.upper:g}]")
        if "preference" in cols:
            pref = cols["preference"]
            reasons.flag(~(pref >= 0), lambda i: f"preference: {pref[i].item()!r} is not an "
                         "epsilon in [0, inf] (missing or negative)")

    def missing(self, cols: dict[str, np.ndarray]) -> np.ndarray:
        """Users who do not give their real value: null source value or eps_u < epsilon."""
        miss = np.isnan(cols["value"])
        if "preference" in cols:
            miss |= cols["preference"] < self.epsilon
        elif self.preference is not None and self.preference < self.epsilon:
            miss = np.ones_like(miss)
        return miss


@dataclass(frozen=True)
class ForcedAnswerMechanism(NumericMechanism):
    """Mechanisms that need a value from everyone: a missing user fakes it (paper, Section 5.2).

    ``fake='top'`` sends the upper bound, ``fake='rnd'`` a uniform value in [lower, upper]. The last
    uniform column of every record is reserved for the RND fake, so ``draws`` is fixed.
    """

    fake: str = "rnd"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.fake, "fake", ("top", "rnd"))

    def answers(self, cols: dict[str, np.ndarray], u: np.ndarray) -> np.ndarray:
        """Normalized values in [-1, 1] with missing users' fake answers filled in."""
        x = self.normalize(cols["value"])
        miss = self.missing(cols)
        if miss.any():
            x = np.where(miss, 1.0 if self.fake == "top" else 2.0 * u[:, -1] - 1.0, x)
        return x
