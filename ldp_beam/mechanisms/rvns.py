"""RVNS: the real-valued negative survey (spec: shared/specs/rvns.md; paper:
shared/papers/rvns_real_value_negative_survey.txt).

A user with value x in [lower, upper] = [a, b] picks one window W of width d that contains x and
reports k values drawn uniformly from [a, b] outside W ("what my value is not"). Algorithm 1 as
printed has typos; this is the restatement of the spec, which reproduces Eqs. (2)-(4):

1. the offset d1 of x from the window's left end is uniform on [lo, hi] =
   [max(0, x + d - b), min(d, x - a)], so W = [x - d1, x - d1 + d] lies inside [a, b];
2. k values y_j ~ U([a, b] minus W), independently, all with the same window.

Report (wire form): ``y1`` ... ``yk`` (float64, in [a, b]).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import Mechanism, Reasons, Reports, Role, check_interval
from ..errors import ParameterError
from ..privacy import NEIGHBOURHOOD_LDP, PrivacyGuarantee


def rvns_density(x: np.ndarray, y: np.ndarray, a: float, b: float, d: float) -> np.ndarray:
    """Transition density p(x, y) of one report (Eqs. 2-4 in one formula, any d < b - a).

    y falls inside the window iff d1 is in [x - y, x - y + d], so
    p(x, y) = (1 - |[lo, hi] and [x - y, x - y + d]| / (hi - lo)) / (b - a - d), with the
    degenerate hi == lo (x at a boundary) giving an indicator. Broadcasts over x and y.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    lo = np.maximum(0.0, x + d - b)
    hi = np.minimum(d, x - a)
    s, e = x - y, x - y + d
    overlap = np.clip(np.minimum(hi, e) - np.maximum(lo, s), 0.0, None)
    width = hi - lo
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = np.where(width > 0, overlap / np.where(width > 0, width, 1.0),
                          ((lo >= s) & (lo <= e)).astype(float))
    dens = (1.0 - inside) / (b - a - d)
    return np.where((y >= a) & (y <= b), dens, 0.0)


@dataclass(frozen=True)
class RVNS(Mechanism):
    """Real-valued negative survey: k reports of where the value is *not*.

    ``delta`` is the neighbourhood size of the relaxed guarantee (outputs closer than delta count
    as the same output); it changes nothing in the perturbation, only what the guarantee states.
    """

    NAME: ClassVar[str] = "rvns"
    family: ClassVar[str] = "rvns"
    roles: ClassVar[tuple[Role, ...]] = (Role("value", help="the number, in [lower, upper]"),)

    lower: float = 0.0
    upper: float = 1.0
    d: float = 0.2
    k: int = 1
    delta: float | None = None

    def __post_init__(self) -> None:
        check_interval(self.lower, self.upper)
        span = self.upper - self.lower
        if isinstance(self.d, bool) or not isinstance(self.d, (int, float)) \
                or not 0 < self.d < span:
            raise ParameterError("d", self.d, f"a window width in (0, upper - lower = {span:g})")
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) \
                or not 1 <= self.k <= 1000:
            raise ParameterError("k", self.k, "an integer in [1, 1000]")
        if self.delta is not None and (isinstance(self.delta, bool) or not 0 < self.delta <= span):
            raise ParameterError("delta", self.delta,
                                 f"a neighbourhood size in (0, upper - lower = {span:g}] or None")

    @property
    def neighbourhood(self) -> float:
        """delta, defaulting to 1% of the domain."""
        return self.delta if self.delta is not None else (self.upper - self.lower) / 100

    @property
    def report_fields(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        """y1 .. yk: float64 in [lower, upper]"""
        return tuple((f"y{j + 1}", "float64") for j in range(self.k))

    @property
    def draws(self) -> int:
        return 1 + self.k  # window offset, then one uniform per report

    @property
    def guarantee(self) -> PrivacyGuarantee:
        claim = self.k * math.log(4 * self.d / self.neighbourhood)
        return PrivacyGuarantee(
            NEIGHBOURHOOD_LDP, claim, notes="the paper's Theorem: k ln(4d/delta); not yet audited",
            claim=f"k ln(4d/delta) = {claim:.4g}", params={"delta": self.neighbourhood})

    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        v = cols["value"]
        reasons.flag(np.isnan(v), "value: missing (null/NaN)")
        reasons.flag(~np.isnan(v) & ~((v >= self.lower) & (v <= self.upper)),
                     lambda i: f"value: {v[i].item()!r} outside [{self.lower:g}, {self.upper:g}]")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        a, b, d = self.lower, self.upper, self.d
        x = cols["value"]
        lo = np.maximum(0.0, x + d - b)
        hi = np.minimum(d, x - a)
        left = x - (lo + u[:, 0] * (hi - lo))  # window [left, left + d] inside [a, b]
        out = {}
        for j in range(self.k):
            y = a + u[:, 1 + j] * (b - a - d)
            out[f"y{j + 1}"] = np.where(y < left, y, y + d)
        return out

    def density(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """p(x, y) of one report; see :func:`rvns_density`."""
        return rvns_density(x, y, self.lower, self.upper, self.d)
