"""Exact privacy audits of mechanisms with a finite transition matrix.

``Q[w, u]`` is the probability of output ``w`` given input ``u`` (columns sum to one). These
functions return the smallest epsilon for which a definition holds (``math.inf`` when no finite
epsilon does), computed from the matrix itself, so a test can compare a mechanism's reported
``guarantee`` with what its probabilities actually give.

* :func:`ldp_epsilon`: eps-LDP, max over outputs of ln(max_u Q[w, u] / min_u Q[w, u]).
* :func:`uldp_epsilon`: (X_S, eps)-ULDP of Murakami & Kawamoto (USENIX Security 2019). An output
  reachable from exactly one input is *invertible*: allowed only if that input is non-sensitive.
  Every other output is *protected*: its ratio over all inputs must be at most e^eps.
* :func:`uldp2d_epsilon`: the two-dimensional ULDP of the JuRR/CPRR paper (Definition 3) on a
  product domain. An output may reveal a coordinate (all inputs that reach it share that
  coordinate's value) only if that value is non-sensitive; among the inputs that agree with every
  revealed coordinate, the ratio must be at most e^eps, and none of them may have probability 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .noise import discrete_laplace_pmf


def _log_ratio(p: np.ndarray) -> float:
    """ln(max/min) of a vector of probabilities (inf if some are 0 and some are not)."""
    hi, lo = float(p.max()), float(p.min())
    if hi == 0.0:
        return 0.0
    return math.inf if lo <= 0.0 else math.log(hi / lo)


def _check(q: np.ndarray) -> np.ndarray:
    q = np.asarray(q, dtype=float)
    if q.ndim != 2 or np.any(q < -1e-15) or not np.allclose(q.sum(axis=0), 1.0, atol=1e-9):
        raise ValueError("a transition matrix Q[output, input] with columns summing to one")
    return np.clip(q, 0.0, None)


def ldp_epsilon(q: np.ndarray) -> float:
    """The exact LDP epsilon of a mechanism with transition matrix ``q``."""
    q = _check(q)
    return max(_log_ratio(row) for row in q)


def uldp_epsilon(q: np.ndarray, sensitive: np.ndarray) -> float:
    """The exact (X_S, eps)-ULDP epsilon; ``sensitive`` is a boolean mask over inputs."""
    q = _check(q)
    sensitive = np.asarray(sensitive, dtype=bool)
    eps = 0.0
    for row in q:
        reach = np.flatnonzero(row > 0)
        if reach.size == 1:  # invertible output
            if sensitive[reach[0]]:
                return math.inf
            continue
        eps = max(eps, _log_ratio(row))
    return eps


def uldp2d_epsilon(q: np.ndarray, x_sensitive: np.ndarray, y_sensitive: np.ndarray) -> float:
    """The exact epsilon of the paper's two-dimensional ULDP (Definition 3) on a product domain
    with cell codes ``i * |Y| + j``; the masks say which x and y labels are sensitive."""
    q = _check(q)
    xs, ys = np.asarray(x_sensitive, dtype=bool), np.asarray(y_sensitive, dtype=bool)
    nx, ny = xs.size, ys.size
    if q.shape[1] != nx * ny:
        raise ValueError(f"Q has {q.shape[1]} inputs, expected |X||Y| = {nx * ny}")
    eps = 0.0
    for row in q:
        r = row.reshape(nx, ny)
        reach = r > 0
        if not reach.any():
            continue
        xi = np.flatnonzero(reach.any(axis=1))
        yj = np.flatnonzero(reach.any(axis=0))
        x_rev, y_rev = xi.size == 1 and nx > 1, yj.size == 1 and ny > 1
        if (x_rev and xs[xi[0]]) or (y_rev and ys[yj[0]]):
            return math.inf  # a sensitive value is revealed
        rows = xi if x_rev else np.arange(nx)
        cols = yj if y_rev else np.arange(ny)
        eps = max(eps, _log_ratio(r[np.ix_(rows, cols)].ravel()))
    return eps


# =============================================================================== statistical audits
# An empirical *lower* bound on epsilon from samples of a mechanism on two inputs (or of a central
# algorithm on two neighbouring datasets). For any event E, eps >= ln((P1(E) - delta) / P2(E)).
# With n samples per input, Clopper-Pearson gives a one-sided lower bound on P1(E) and a one-sided
# upper bound on P2(E), each at level 1 - alpha/2; by the union bound both hold together with
# probability >= 1 - alpha, and then so does eps >= ln((p_lower - delta) / q_upper).
#
# The event must not be chosen on the samples that evaluate it (that would be a multiple-testing
# bias): :func:`audit_samples` splits each sample in two halves, picks the event (and direction)
# with the largest bound on the first halves and evaluates that one event on the second
# halves. Only one event is tested at the reported level, so no Bonferroni correction is needed;
# the price is half the samples.


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """One-sided Clopper-Pearson bounds at level 1 - alpha each: (lower, upper) with
    P(p < lower) <= alpha and P(p > upper) <= alpha for k successes in n trials (exact)."""
    # lazy: scipy.stats costs 720 ms at import (measured); only the sampled audits' bounds need
    # it, not the exact audits of a transition matrix
    from scipy.stats import beta

    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n, n >= 1 (k={k}, n={n})")
    lo = 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1.0 - alpha, k + 1, n - k))
    return lo, hi


def epsilon_lower_bound(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05,
                        delta: float = 0.0) -> float:
    """A (1 - alpha)-confidence lower bound on epsilon from event counts: k1 of n1 samples on the
    first input, k2 of n2 on the second; ln((P1_lower - delta) / P2_upper), floored at 0."""
    p_lo, _ = clopper_pearson(k1, n1, alpha / 2)
    _, q_hi = clopper_pearson(k2, n2, alpha / 2)
    if p_lo - delta <= 0.0:
        return 0.0
    return max(0.0, math.log((p_lo - delta) / q_hi))


def _bound_vec(k1, n1, k2, n2, alpha, delta):
    """:func:`epsilon_lower_bound` vectorized over event counts (without the floor at 0)."""
    from scipy.stats import beta  # lazy: scipy.stats, 720 ms (measured; see clopper_pearson)

    k1, k2 = np.asarray(k1, float), np.asarray(k2, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_lo = np.where(k1 > 0, beta.ppf(alpha / 2, k1, n1 - k1 + 1), 0.0)
        q_hi = np.where(k2 < n2, beta.ppf(1 - alpha / 2, k2 + 1, n2 - k2), 1.0)
        p_lo = np.nan_to_num(p_lo) - delta
        return np.where(p_lo > 0, np.log(np.maximum(p_lo, 1e-300) / q_hi), -np.inf)


def audit_samples(s1: np.ndarray, s2: np.ndarray, events, alpha: float = 0.05,
                  delta: float = 0.0, directions: tuple[int, ...] = (0, 1)) -> dict:
    """Empirical lower bound on epsilon from outputs ``s1`` (input 1) and ``s2`` (input 2).

    ``events``: a function mapping an output array to a boolean matrix (events, samples), the
    candidate events (the same family on both halves). ``directions``: 0 tests P1(E)/P2(E), 1
    tests P2(E)/P1(E) (one-sided guarantees use one). The event and direction are chosen on the
    first half of each sample (the largest confidence bound there), then the bound is
    computed on the second halves only: valid at confidence 1 - alpha.
    Returns {epsilon_lower, confidence, samples, event, direction, p, q}.
    """
    s1, s2 = np.asarray(s1), np.asarray(s2)
    h1, h2 = len(s1) // 2, len(s2) // 2
    a1, a2 = events(s1[:h1]).sum(axis=1), events(s2[:h2]).sum(axis=1)
    best, choice = -np.inf, (0, 0)
    for direction in directions:
        num, den, nn, nd = (a1, a2, h1, h2) if direction == 0 else (a2, a1, h2, h1)
        # score: the same confidence bound on the first halves, so the event chosen is one
        # that is likely to certify on the second halves (not merely the largest plug-in ratio)
        score = _bound_vec(num, nn, den, nd, alpha, delta)
        j = int(np.argmax(score)) if score.size else 0
        if score.size and score[j] > best:
            best, choice = float(score[j]), (j, direction)
    j, direction = choice
    e1 = events(s1[h1:])[j]
    e2 = events(s2[h2:])[j]
    k1, k2, n1, n2 = int(e1.sum()), int(e2.sum()), len(e1), len(e2)
    if direction == 1:
        k1, k2, n1, n2 = k2, k1, n2, n1
    lower = epsilon_lower_bound(k1, n1, k2, n2, alpha, delta)
    return {"epsilon_lower": lower, "confidence": 1.0 - alpha, "samples": len(s1) + len(s2),
            "event": j, "direction": direction, "p": k1 / n1, "q": k2 / n2}


def threshold_events(reference: np.ndarray, m: int = 64):
    """Candidate events {y <= t} and {y > t} for t at ``m`` quantiles of ``reference`` (fixed
    before the evaluation samples are looked at)."""
    ts = np.unique(np.quantile(np.asarray(reference, float), np.linspace(0.002, 0.998, m)))

    def events(y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, float)[None, :]
        le = y <= ts[:, None]
        return np.concatenate([le, ~le])
    return events


def singleton_events(codes: np.ndarray):
    """Candidate events {output == c} for each c in ``codes``."""
    codes = np.asarray(codes)

    def events(y: np.ndarray) -> np.ndarray:
        return np.asarray(y)[None, :] == codes[:, None]
    return events


def allowed_inputs(q: np.ndarray, definition: str = "ldp", x_sensitive=None,
                   y_sensitive=None) -> list[np.ndarray | None]:
    """For each output row of ``q``: the boolean mask of inputs among which the definition
    bounds the probability ratio (None: the output carries no ratio constraint, e.g. a
    revealing output of a non-sensitive input). Mirrors :func:`ldp_epsilon`,
    :func:`uldp_epsilon` and :func:`uldp2d_epsilon`."""
    q = _check(q)
    out: list[np.ndarray | None] = []
    for row in q:
        if definition == "ldp":
            out.append(np.ones(row.size, dtype=bool))
        elif definition == "uldp":
            out.append(None if np.count_nonzero(row > 0) == 1 else np.ones(row.size, dtype=bool))
        else:
            xs, ys = np.asarray(x_sensitive, bool), np.asarray(y_sensitive, bool)
            nx, ny = xs.size, ys.size
            reach = row.reshape(nx, ny) > 0
            if not reach.any():
                out.append(None)
                continue
            xi, yj = np.flatnonzero(reach.any(axis=1)), np.flatnonzero(reach.any(axis=0))
            x_rev, y_rev = xi.size == 1 and nx > 1, yj.size == 1 and ny > 1
            mask = np.zeros((nx, ny), dtype=bool)
            mask[np.ix_(xi if x_rev else np.arange(nx), yj if y_rev else np.arange(ny))] = True
            out.append(mask.ravel())
    return out


def worst_pair(q: np.ndarray, allowed: list[np.ndarray | None]) -> tuple[int, int, float, list]:
    """The input pair (i1, i2) and output attaining the largest allowed ratio Q[w, i1]/Q[w, i2];
    returns (i1, i2, log ratio, outputs w whose allowed set contains both inputs)."""
    q = _check(q)
    best = (0, 1 if q.shape[1] > 1 else 0, -1.0)
    for w, (row, mask) in enumerate(zip(q, allowed)):
        if mask is None or mask.sum() < 2:
            continue
        idx = np.flatnonzero(mask)
        r = row[idx]
        hi, lo = idx[int(np.argmax(r))], idx[int(np.argmin(r))]
        val = _log_ratio(r)
        if val > best[2]:
            best = (int(hi), int(lo), val)
    i1, i2, val = best
    outs = [w for w, m in enumerate(allowed) if m is not None and m[i1] and m[i2]]
    return i1, i2, val, outs


# =============================================================================== person level
# Issue 14: neighbouring datasets differ by ALL rows of one privacy unit. For releases whose noise
# is independent discrete Laplace on integer statistics (LPA's counts), the exact privacy loss
# between the two datasets follows from the pmf: the statistics shift by an integer vector d, and
# the output's log likelihood ratio is a sum over coordinates.


def discrete_laplace_shift_epsilon(shift, scale) -> float:
    """The exact privacy loss of releasing integer statistics plus independent discrete Laplace
    noise of ``scale`` t when the two datasets' statistics differ by the integer vector
    ``shift``: max over outputs of |ln P(out | D) / P(out | D')|, computed from the pmf
    (:func:`ldp_beam.noise.discrete_laplace_pmf`) on a window of outputs that contains the
    maximizers. Per coordinate the ratio pmf(z)/pmf(z - d) = q^(|z| - |z - d|) is largest,
    e^(|d|/t), at any z beyond both 0 and d; the outputs are a product space with independent
    coordinates, so the joint maximum is the sum of the per-coordinate maxima: ||shift||_1 / t."""
    d = np.abs(np.asarray(shift, dtype=np.int64).ravel())
    d = d[d > 0]
    total = 0.0
    for v in np.unique(d):
        z = np.arange(-2 * int(v) - 2, 2 * int(v) + 3)
        with np.errstate(divide="ignore"):
            lr = np.log(discrete_laplace_pmf(z, scale)) - np.log(discrete_laplace_pmf(z - v, scale))
        total += float(np.abs(lr).max()) * int(np.count_nonzero(d == v))
    return total


def release_probability_epsilon(p_keep_1, p_keep_2, p_drop_1=None, p_drop_2=None) -> float:
    """The exact privacy loss of one yes/no output (a key kept or dropped) with probabilities
    ``p_keep_1`` and ``p_keep_2`` on two datasets: max(|ln p1/p2|, |ln (1-p1)/(1-p2)|). Pass the
    drop probabilities where 1 - p would cancel (p close to 1)."""
    p1, p2 = float(p_keep_1), float(p_keep_2)
    d1 = 1.0 - p1 if p_drop_1 is None else float(p_drop_1)
    d2 = 1.0 - p2 if p_drop_2 is None else float(p_drop_2)
    out = 0.0
    for a, b in ((p1, p2), (d1, d2)):
        if (a > 0) != (b > 0):
            return math.inf
        if a > 0:
            out = max(out, abs(math.log(a / b)))
    return out


# =============================================================================== plugins
@dataclass(frozen=True)
class AuditProfile:
    """What ``ldp-beam audit`` needs to audit an LDP mechanism it has no built-in audit for (a
    plugin's): returned by the mechanism's ``audit_profile()`` (docs/plugins.md, "Planning and
    auditing a plugin").

    * ``matrix``: ``Q[output, input]``, the exact probabilities the mechanism's ``randomize``
      implements, one column per entry of ``inputs`` (columns sum to one). The exact epsilon is
      :func:`ldp_epsilon` of it.
    * ``inputs``: one input record per column, ``{role name: value}`` as ``perturb`` takes it
      (raw values: numbers, or labels of a category role), covering the extremes of the domain
      (and the missing value, if the mechanism accepts one).
    * ``output_code``: reports (the dict of report columns ``perturb`` returns) -> an integer
      array of row indices of ``matrix``, one per report.

    The empirical lower bound samples ``perturb`` itself on the matrix's worst-case pair of
    inputs: a matrix that misstates the sampler can cost the audit power, never produce a false
    violation.
    """

    matrix: Any
    inputs: Sequence[Mapping[str, Any]]
    output_code: Callable[[Mapping[str, np.ndarray]], np.ndarray]

    def check(self) -> np.ndarray:
        """The validated matrix; ``ValueError`` saying what is wrong otherwise."""
        try:
            q = _check(self.matrix)
        except ValueError as exc:
            raise ValueError(f"audit_profile().matrix: expected {exc}") from None
        if q.shape[1] < 2:
            raise ValueError("audit_profile().matrix: expected at least two inputs (columns)")
        if len(self.inputs) != q.shape[1]:
            raise ValueError(f"audit_profile().inputs: {len(self.inputs)} records for the "
                             f"matrix's {q.shape[1]} inputs (columns)")
        if not all(isinstance(x, Mapping) and x for x in self.inputs):
            raise ValueError("audit_profile().inputs: expected {role name: value} records")
        if not callable(self.output_code):
            raise ValueError("audit_profile().output_code: expected a function of the reports")
        return q
