"""Estimators for the BiSample paper's baselines: Harmony, PM and PrivKVM."""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..core import MomentEstimator, Reasons, Statistic, coerce_numeric
from .counting import CodedCountEstimator, binomial_variance


def _mean_stats(m: Any, x: float, se: float | None, n: int) -> dict[str, Statistic]:
    """Mean and sum in [L, U] from a normalized mean x and its standard error."""
    half = (m.upper - m.lower) / 2
    mean = m.denormalize(x)
    se_o = None if se is None else se * half
    return {"mean": Statistic(mean, se_o, float(np.clip(mean, m.lower, m.upper)),
                              domain=(m.lower, m.upper)),
            "sum": Statistic(n * mean, None if se_o is None else n * se_o,
                             float(np.clip(n * mean, n * m.lower, n * m.upper)))}


class HarmonyEstimator(CodedCountEstimator):
    """Mean of the adjusted outputs y (e^eps + 1)/(e^eps - 1): accumulator [#(y=-1), #(y=+1)]."""

    n_cells = 2
    field_values = {"y": (-1, 1)}

    def cells(self, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        return (np.asarray(reports["y"], np.int64) + 1) // 2

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        n = int(acc.sum())
        k = 2 * self.mechanism.p - 1
        ybar = (acc[1] - acc[0]) / n  # = 2 f - 1 with f the share of +1 reports
        return _mean_stats(self.mechanism, ybar / k, 2 * math.sqrt(binomial_variance(acc[1], n)) / k,
                           n)


class PiecewiseEstimator(MomentEstimator):
    """Mean of PM outputs (unbiased); standard error from the sample variance."""

    value_field = "y"

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        if "y" in reports:
            y, nonnum = coerce_numeric(reports["y"])
            C = self.mechanism.C
            reasons.flag(~(np.abs(y) <= C), lambda i, r=reports["y"]:
                         f"report field 'y': {r[i]!r} not a number in [-{C:g}, {C:g}]")
        return reasons

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        n, s, ss = acc
        mean = s / n
        se = math.sqrt(max(ss / n - mean**2, 0.0) * n / (n - 1) / n) if n > 1 else None
        return _mean_stats(self.mechanism, mean, se, int(round(n)))


class PrivKVMEstimator(CodedCountEstimator):
    """PrivKV frequency and mean with ``virtual_iterations`` virtual rounds (PrivKVM*).

    Accumulator: counts of <0,->, <1,-1>, <1,+1>. Key frequency (Eq. 3 with eps1):
    f_k = (f_1 + p1 - 1)/(2p1 - 1), missing rate 1 - f_k. Mean: PrivKV calibrates the +-1 counts
    with eps2 (clipped to [0, N]) giving S = n+* - n-*. The N key-1 reports include about
    n_fake = n (1 - f_k)(1 - p1) fakes whose values had mean 0 in the real round; a virtual round
    replays them with the current mean m_t: m_{t+1} = (S + n_fake m_t) / N, starting from S / N.
    (Our reading of the virtual iteration; it converges to S / (N - n_fake), the unbiased ratio.)
    """

    n_cells = 3
    field_values = {"k": (0, 1), "v": (-1, 0, 1)}

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        if "k" in reports and "v" in reports:  # the wire form: v = +-1 iff k = 1, v = 0 iff k = 0
            k, _ = coerce_numeric(reports["k"])
            v, _ = coerce_numeric(reports["v"])
            reasons.flag((k == 1) != (v != 0), lambda i, rk=reports["k"], rv=reports["v"]:
                         f"report <k, v> = <{rk[i]!r}, {rv[i]!r}>: v must be +-1 when k = 1 "
                         "and 0 when k = 0")
        return reasons

    def cells(self, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        k = np.asarray(reports["k"], np.int64)
        v = np.asarray(reports["v"], np.int64)
        return k * (1 + (v + 1) // 2)

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        m = self.mechanism
        n = int(acc.sum())
        p1, p2 = m.p1, m.p2
        f1 = (acc[1] + acc[2]) / n
        fk = (f1 + p1 - 1) / (2 * p1 - 1)
        se_fk = math.sqrt(binomial_variance(acc[1] + acc[2], n)) / (2 * p1 - 1)
        stats = {"missing_rate": Statistic(1 - fk, se_fk, float(np.clip(1 - fk, 0, 1)),
                                           domain=(0, 1))}
        N = int(acc[1] + acc[2])
        if N == 0:
            stats["mean"] = Statistic(None, None, None, note="undefined: no report carries key 1")
            return stats
        plus = np.clip(((p2 - 1) * N + acc[2]) / (2 * p2 - 1), 0, N)
        minus = np.clip(((p2 - 1) * N + acc[1]) / (2 * p2 - 1), 0, N)
        S = plus - minus
        n_fake = float(np.clip(n * (1 - np.clip(fk, 0, 1)) * (1 - p1), 0, N))
        mt = S / N
        for _ in range(m.virtual_iterations):
            mt = (S + n_fake * mt) / N
        mean = m.denormalize(float(mt))
        stats["mean"] = Statistic(mean, None, float(np.clip(mean, m.lower, m.upper)),
                                  note=f"after {m.virtual_iterations} virtual iterations; "
                                  "no closed-form standard error")
        return stats
