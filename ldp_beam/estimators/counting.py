"""Count accumulators for mechanisms with a finite report alphabet."""
from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from ..core import CountEstimator, Reasons, coerce_numeric


def binomial_variance(successes: float, trials: float) -> float:
    """Variance of a proportion's estimate, plug-in with the Agresti-Coull adjustment
    f~ = (x + 1)/(n + 2), so that 0 or n successes in few trials do not give a zero-width
    interval; for large n it equals f(1 - f)/n to O(1/n)."""
    f = (successes + 1.0) / (trials + 2.0)
    return f * (1.0 - f) / trials


class CodedCountEstimator(CountEstimator):
    """A CountEstimator whose report fields take values in small declared sets.

    ``check_reports`` validates untrusted reports (telemetry) against ``field_values`` so that only
    well-formed reports reach the bincount; the Beam layer sends the others to the dead letter.
    """

    field_values: ClassVar[dict[str, tuple[int, ...]]] = {}

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        for name, allowed in self.field_values.items():
            if name not in reports:
                continue
            raw = reports[name]
            vals, nonnum = coerce_numeric(raw)
            ok = np.isin(vals, np.asarray(allowed, dtype=float))
            reasons.flag(~ok, lambda i, r=raw, nm=name, a=allowed:
                         f"report field {nm!r}: {r[i]!r} not in {list(a)}")
        return reasons
