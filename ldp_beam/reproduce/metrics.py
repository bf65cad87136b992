"""Utility metrics of the BiSample paper (Eq. 21) and helpers around them.

Over T repetitions with true value x and estimates x*_t:
AE = (1/T) sum |x - x*_t| (average absolute error) and Var = (1/T) sum (x - x*_t)^2 (the paper
calls this the variance; it is the mean squared error around the truth, not around the mean of
the estimates). The truth may differ per repetition (e.g. a missing set drawn per repetition).
"""
from __future__ import annotations

import numpy as np


def _mean_error(truth, estimates, loss, ignore_nan: bool) -> float:
    est = np.asarray(estimates, dtype=np.float64).reshape(-1)
    tru = np.broadcast_to(np.asarray(truth, dtype=np.float64), est.shape)
    if est.size == 0:
        raise ValueError("no estimates: need at least one repetition")
    err = loss(tru - est)
    if ignore_nan:
        err = err[~np.isnan(err)]
    return float(err.mean()) if err.size else float("nan")


def absolute_error(truth, estimates, *, ignore_nan: bool = False) -> float:
    """AE of Eq. 21: mean of |truth - estimate|. With ``ignore_nan`` undefined estimates (NaN)
    are left out (NaN if all are); otherwise a NaN estimate makes the result NaN."""
    return _mean_error(truth, estimates, np.abs, ignore_nan)


def squared_error(truth, estimates, *, ignore_nan: bool = False) -> float:
    """Var of Eq. 21: mean of (truth - estimate)^2 (a mean squared error)."""
    return _mean_error(truth, estimates, np.square, ignore_nan)


# The paper's names.
AE = absolute_error
Var = squared_error


def harmony_worst_case_variance(epsilon: float, n: int) -> float:
    """Worst-case variance of Harmony's (and BiSample's) mean over n users on [-1, 1] (Eq. 14):
    ((e^eps + 1)/(e^eps - 1))^2 / n."""
    k = np.expm1(epsilon) / (np.exp(epsilon) + 1.0)  # 2p - 1
    return float(1.0 / (k * k) / n)


def bisample_variance(epsilon: float, values: np.ndarray) -> float:
    """Exact variance of BiSample's (and Harmony's) mean over the given values:
    (1/(2p - 1)^2 - mean(v^2)) / n. Eq. 14 writes m^2 for mean(v^2); the two agree only when all
    values are equal, and mean(v^2) >= m^2, so Eq. 14 / n is an upper bound."""
    v = np.asarray(values, dtype=np.float64)
    k = np.expm1(epsilon) / (np.exp(epsilon) + 1.0)
    return float((1.0 / (k * k) - np.mean(v * v)) / v.size)


def pm_variance(epsilon: float, values: np.ndarray) -> float:
    """Exact variance of the Piecewise Mechanism's mean (Wang et al. 2019, Lemma 1): per user
    t^2/(e^(eps/2) - 1) + (e^(eps/2) + 3)/(3 (e^(eps/2) - 1)^2), averaged and divided by n."""
    v = np.asarray(values, dtype=np.float64)
    a = np.expm1(epsilon / 2.0)
    per_user = np.mean(v * v) / a + (a + 4.0) / (3.0 * a * a)
    return float(per_user / v.size)


def chi2_interval(expected: float, dof: int, alpha: float = 1e-3) -> tuple[float, float]:
    """Two-sided (1 - alpha) range of a mean of ``dof`` squared N(0, expected) errors:
    expected * chi2(dof) / dof. Used to judge an empirical Var(m) against theory."""
    # lazy: scipy.stats costs 0.85 s at import (measured, after this module's imports); only
    # this interval needs it: `ldp-beam demo` and dphr_recipe import this module (range_query_mse)
    from scipy.stats import chi2

    return (float(expected * chi2.ppf(alpha / 2, dof) / dof),
            float(expected * chi2.ppf(1 - alpha / 2, dof) / dof))


# --------------------------------------------------------------------------- histograms
def range_sums(hist: np.ndarray, length: int) -> np.ndarray:
    """Answers of every range query of ``length`` consecutive buckets (n - length + 1 of them),
    by prefix sums."""
    h = np.asarray(hist, dtype=float)
    if not 1 <= length <= h.size:
        raise ValueError(f"range length {length} must be in [1, {h.size}]")
    c = np.concatenate([[0.0], np.cumsum(h)])
    return c[length:] - c[:-length]


def range_query_mse(true: np.ndarray, published: np.ndarray, lengths) -> np.ndarray:
    """MSE of range-query answers (DPHR paper, Section 6.2): for each length, the mean over *all*
    n - length + 1 ranges of (Q(published) - Q(true))^2, i.e. the expectation over a uniformly
    random range of that length (no sampling error from drawing ranges)."""
    return np.array([float(np.mean((range_sums(published, L) - range_sums(true, L)) ** 2))
                     for L in lengths])
