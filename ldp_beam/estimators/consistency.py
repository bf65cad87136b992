"""Post-processing of frequency estimates (free of privacy cost: it reads only the estimate)."""
from __future__ import annotations

import numpy as np


def project_simplex(f: np.ndarray, total: float = 1.0) -> np.ndarray:
    """Euclidean projection of ``f`` (any shape, flattened) onto {g >= 0, sum g = total}.

    This is Norm-Sub (Wang et al., "Locally Differentially Private Frequency Estimation with
    Consistency", NDSS 2020): subtract one constant from every cell and set what falls below zero
    to zero, the constant chosen so the cells sum to ``total``. Sort-based, O(K log K).
    """
    v = np.asarray(f, dtype=float)
    flat = v.ravel()
    if flat.size == 0:
        return v.copy()
    if not np.all(np.isfinite(flat)):
        raise ValueError("project_simplex needs finite values")
    u = np.sort(flat)[::-1]
    css = np.cumsum(u) - total
    k = np.arange(1, flat.size + 1)
    rho = np.flatnonzero(u - css / k > 0)[-1]
    theta = css[rho] / (rho + 1.0)
    return np.maximum(flat - theta, 0.0).reshape(v.shape)
