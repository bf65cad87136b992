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

import numpy as np


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
