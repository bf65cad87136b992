"""Server side of the BiSample family: the four-count accumulator and its estimators.

Accumulator: counts of the report codes 2s + b, i.e. [#(s=0,b=0), n_neg1, #(s=1,b=0), n_pos1]
(so n_neg = acc[0] + acc[1], n_pos = acc[2] + acc[3]); f_POS = n_pos1/n_pos, f_NEG = n_neg1/n_neg
(Eqs. 9-10). Standard errors use the plug-in binomial variances Var f = f(1 - f)/n_dir (with the
Agresti-Coull adjustment, see ``binomial_variance``), which
reproduce the paper's Var[m*] = ((e^eps + 1)/(e^eps - 1))^2 - m^2 (Eq. 14, per user) and are
slightly conservative (the split into directions is random, not stratified).
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..core import Statistic
from ..errors import EmptyAccumulatorError
from ..mechanisms.bisample import BiSampleMD
from .counting import CodedCountEstimator, binomial_variance


class BiSampleEstimator(CodedCountEstimator):
    """Mean (Eq. 11) for BiSample; for BiSample-MD the missing rate (Eq. 18), the sum of the
    answering users' values (Eq. 18, mapped to [L, U]) and their mean (Eq. 20)."""

    n_cells = 4
    field_values = {"s": (0, 1), "b": (0, 1)}

    def cells(self, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        return 2 * np.asarray(reports["s"], np.int64) + np.asarray(reports["b"], np.int64)

    def frequencies(self, acc: np.ndarray) -> tuple[float, float, float, float]:
        n_neg, n_pos = int(acc[0] + acc[1]), int(acc[2] + acc[3])
        if n_neg == 0 or n_pos == 0:
            raise EmptyAccumulatorError(
                f"{self.mechanism.name}: an estimate needs reports in both sampling directions "
                f"(got n_neg={n_neg}, n_pos={n_pos})")
        f_pos, f_neg = acc[3] / n_pos, acc[1] / n_neg
        return (f_pos, f_neg, binomial_variance(acc[3], n_pos), binomial_variance(acc[1], n_neg))

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        m = self.mechanism
        L, U, p = m.lower, m.upper, m.p
        k = 2 * p - 1
        n = int(acc.sum())
        f_pos, f_neg, var_pos, var_neg = self.frequencies(acc)
        half = (U - L) / 2
        if not isinstance(m, BiSampleMD):
            x = (f_pos - f_neg) / k  # Eq. 11, normalized scale
            se = math.sqrt(var_pos + var_neg) / k
            mean = m.denormalize(x)
            return {"mean": Statistic(mean, se * half, float(np.clip(mean, L, U)),
                                      domain=(L, U)),
                    "sum": Statistic(n * mean, n * se * half,
                                     float(np.clip(n * mean, n * L, n * U)))}
        miss = (1 - f_pos - f_neg) / k  # Eq. 18
        se_miss = math.sqrt(var_pos + var_neg) / k
        answering = n * (1 - miss)
        # Sum over answering users in [L, U]: (U-L)/2 s* + (U+L)/2 n(1 - f*) = n/k [U f_P + L f_N
        # + (U + L)(p - 1)], linear in (f_P, f_N).
        total = n / k * (U * f_pos + L * f_neg + (U + L) * (p - 1))
        se_total = n / k * math.sqrt(U * U * var_pos + L * L * var_neg)
        stats = {
            "missing_rate": Statistic(miss, se_miss, float(np.clip(miss, 0, 1)), domain=(0, 1)),
            "answering_count": Statistic(answering, n * se_miss, float(np.clip(answering, 0, n))),
            "sum": Statistic(total, se_total, float(np.clip(total, n * min(L, 0), n * max(U, 0)))),
        }
        den = f_pos + f_neg + 2 * p - 2  # (2p - 1)(1 - f*), Eq. 20
        if den <= 0:
            stats["mean"] = Statistic(None, None, None, note="undefined: the estimated share of "
                                      "answering users is <= 0 (too few reports for this epsilon)")
        else:
            num = f_pos - f_neg
            x = num / den
            g_pos, g_neg = (den - num) / den**2, (-den - num) / den**2  # delta method
            se = math.sqrt(g_pos**2 * var_pos + g_neg**2 * var_neg) * half
            mean = m.denormalize(x)
            stats["mean"] = Statistic(mean, se, float(np.clip(mean, L, U)),
                                      note="mean of the answering users (Eq. 20, ratio estimator)",
                                      domain=(L, U))
        return stats
