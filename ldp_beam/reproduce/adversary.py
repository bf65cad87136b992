"""The RVNS paper's privacy metric (Section V-B1, Eqs. 16-18): an adversary's inference, and the
Euclidean distance between the true and the inferred data.

* :func:`infer_rvns` is the adversary of Eqs. 17-18: it knows p(x, y) and, for each user i,
  returns x_infer = argmax_{x in [a, b]} of the likelihood of the user's k reports. Two
  likelihoods:

  - ``"marginal"`` (the paper's Eq. 17, the default): prod_j p(x, y_ij), as if the k reports were
    independent;
  - ``"joint"``: the true likelihood p(x, y_i1..y_ik) of :func:`~ldp_beam.mechanisms.rvns.
    rvns_joint_density`. The k reports share one window, so they are not independent: the joint
    likelihood is zero wherever no single window of width d containing x misses all k reports
    (for example when two reports lie less than d apart on both sides of x), which the product of
    marginals does not see. It is the stronger (Bayes-consistent) adversary.

  The maximum is searched on a uniform grid of ``grid`` points over [a, b] (resolution
  (b - a)/(grid - 1)), vectorized over users in chunks of bounded memory. The likelihood is often
  flat at its maximum (every x at distance >= d from all reports has the same marginal
  likelihood), so ties are broken deterministically: ``tie="median"`` (default) returns the median
  grid point of the maximizing set (the lower one of the two middle points for an even count),
  which is always a maximizer; ``tie="mean"`` returns the mean of the maximizing grid points (the
  posterior mean under a flat prior restricted to the maximizing set: smaller squared error, but
  not necessarily a maximizer when the set is not an interval). Grid points count as tied when
  their likelihood is within a relative 1e-9 of the maximum. ``point="posterior_mean"`` is an
  extra, stronger adversary (not the paper's): the posterior mean under a flat prior.

* :func:`euclidean_distance` is Eq. 16, dis(X, X') = sqrt(sum_i (x_i - x'_i)^2) (larger = more
  private). The paper reports it unnormalized, so it grows like sqrt(n); divide by sqrt(n) for a
  per-user root-mean-square error.

* :func:`noise_adding_inferred`: for the noise-adding baselines (Laplace-DP, Gaussian-pDP, ...)
  the paper takes the perturbed values themselves as the inferred data. It does not clip them to
  [a, b] (Section V-C1: these methods "do not restrict the range of values for the perturbed
  data"), so the default is ``clip=False``; ``clip=True`` projects onto [a, b], a free
  post-processing that any adversary knowing the domain would apply (it only shrinks the
  distance, i.e. it is the stronger adversary).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..errors import ParameterError
from ..mechanisms.rvns import RVNS

LIKELIHOODS = ("marginal", "joint")
TIES = ("median", "mean")
POINTS = ("argmax", "posterior_mean")
_TIE_RTOL = 1e-9


def reports_matrix(reports: Any, k: int | None = None) -> np.ndarray:
    """Reports as an (n, k) float array: accepts the wire form (a mapping with ``y1``..``yk``)
    or an array of shape (n, k) (or (n,) for k = 1)."""
    if isinstance(reports, Mapping):
        names = sorted((c for c in reports if c[:1] == "y" and c[1:].isdigit()),
                       key=lambda c: int(c[1:]))
        if k is not None:
            missing = [f"y{j + 1}" for j in range(k) if f"y{j + 1}" not in reports]
            if missing:
                raise ParameterError("reports", sorted(reports), f"fields y1..y{k}")
            names = [f"y{j + 1}" for j in range(k)]
        if not names:
            raise ParameterError("reports", sorted(reports), "report fields y1, y2, ...")
        return np.column_stack([np.asarray(reports[c], dtype=np.float64) for c in names])
    arr = np.asarray(reports, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or (k is not None and arr.shape[1] != k):
        raise ParameterError("reports", arr.shape, f"an (n, {k if k else 'k'}) array")
    return arr


def _loglik_marginal(xg: np.ndarray, y: np.ndarray, a: float, b: float, d: float) -> np.ndarray:
    """sum_j log((b - a - d) p(x, y_j)) for x on the grid: shape (users, grid)."""
    lo = np.maximum(0.0, xg + d - b)
    hi = np.minimum(d, xg - a)
    width = hi - lo
    deg = width <= 0  # x = a or x = b: the window is fixed
    inv = np.where(deg, 0.0, 1.0 / np.where(deg, 1.0, width))
    out = np.zeros((y.shape[0], xg.size))
    for j in range(y.shape[1]):
        s = xg[None, :] - y[:, j:j + 1]  # the window contains y iff d1 in [s, s + d]
        ov = np.minimum(hi, s + d)
        ov -= np.maximum(lo, s)
        np.clip(ov, 0.0, None, out=ov)
        np.subtract(width, ov, out=ov)  # exactly 0 where the window always covers y
        ov *= inv
        if deg.any():
            cols = np.flatnonzero(deg)
            sc = s[:, cols]
            ov[:, cols] = (sc > lo[cols]) | (lo[cols] > sc + d)
        with np.errstate(divide="ignore"):
            out += np.log(ov)
    return out


def _loglik_joint(xg: np.ndarray, y: np.ndarray, a: float, b: float, d: float) -> np.ndarray:
    """log((b - a - d)^k p(x, y_1..y_k)) for x on the grid (see rvns_joint_density)."""
    u0, u1 = np.maximum(xg - d, a), np.minimum(xg, b - d)
    g_l = np.full((y.shape[0], xg.size), -np.inf)
    g_r = np.full((y.shape[0], xg.size), np.inf)
    for j in range(y.shape[1]):
        yj = y[:, j:j + 1]
        left = yj <= xg[None, :]
        np.maximum(g_l, np.where(left, yj, -np.inf), out=g_l)
        np.minimum(g_r, np.where(yj >= xg[None, :], yj, np.inf), out=g_r)
    free = np.minimum(u1, g_r - d)
    free -= np.maximum(u0, g_l)
    np.clip(free, 0.0, None, out=free)
    width = u1 - u0
    deg = width <= 0
    free *= np.where(deg, 0.0, 1.0 / np.where(deg, 1.0, width))
    for c in np.flatnonzero(deg):
        free[:, c] = np.all((y < u0[c]) | (y > u0[c] + d), axis=1)
    with np.errstate(divide="ignore"):
        return np.log(free)


def _pick(ll: np.ndarray, xg: np.ndarray, tie: str, point: str) -> np.ndarray:
    top = ll.max(axis=1, keepdims=True)
    if point == "posterior_mean":  # flat prior on the grid; all-zero likelihood -> flat posterior
        w = np.exp(ll - np.where(np.isfinite(top), top, 0.0))
        w[~np.isfinite(top[:, 0])] = 1.0
        return (w * xg).sum(axis=1) / w.sum(axis=1)
    # tied: within a relative 1e-9 of the maximum likelihood (log scale: an absolute 1e-9)
    tied = ll >= np.where(np.isfinite(top), top - _TIE_RTOL, -np.inf)
    cnt = tied.sum(axis=1)
    if tie == "mean":
        return (tied * xg).sum(axis=1) / cnt
    rank = np.cumsum(tied, axis=1)
    idx = np.argmax(rank > ((cnt - 1) // 2)[:, None], axis=1)
    return xg[idx]


def infer_rvns(mechanism: RVNS, reports: Any, *, grid: int = 1001,
               likelihood: str = "marginal", tie: str = "median", point: str = "argmax",
               prior: Any = None, max_elements: int = 1 << 21) -> np.ndarray:
    """The adversary of Eqs. 17-18: each user's maximum-likelihood value on a grid over [a, b].

    ``reports``: the mechanism's wire form (``y1``..``yk``) or an (n, k) array. ``likelihood``:
    ``"marginal"`` (the paper's prod_j p(x, y_j)) or ``"joint"`` (the true likelihood with the
    shared window). ``tie``: ``"median"`` or ``"mean"`` of the maximizing grid points (see the
    module docstring). ``point="posterior_mean"`` replaces the argmax by the posterior mean under
    a flat prior on the grid (not the paper's adversary; the best guess for squared error when
    values are uniform, used to show what the paper's metric leaves out). ``prior``: optional
    non-negative weights of the ``grid`` points (e.g. the collector's own estimate of the value
    distribution); with it the argmax is a MAP estimate and the posterior mean is Bayes-optimal
    for squared error under that prior. The paper's adversary uses no prior. Memory is bounded
    by ``max_elements`` float64 values per chunk. Returns float64 values of shape (n,), each on
    the grid (``point="argmax"``) or in [a, b].
    """
    if not isinstance(mechanism, RVNS):
        raise ParameterError("mechanism", mechanism, "an RVNS instance")
    for name, value, allowed in (("likelihood", likelihood, LIKELIHOODS), ("tie", tie, TIES),
                                 ("point", point, POINTS)):
        if value not in allowed:
            raise ParameterError(name, value, f"one of {allowed}")
    if isinstance(grid, bool) or not isinstance(grid, (int, np.integer)) or grid < 2:
        raise ParameterError("grid", grid, "an integer >= 2")
    a, b, d = float(mechanism.lower), float(mechanism.upper), float(mechanism.d)
    y = reports_matrix(reports, mechanism.k)
    bad = ~((y >= a) & (y <= b))
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ParameterError("reports", float(y[i, j]), f"reports in [{a:g}, {b:g}] (row {i})")
    xg = np.linspace(a, b, int(grid))
    logprior = None
    if prior is not None:
        w = np.asarray(prior, dtype=np.float64)
        if w.shape != xg.shape or not np.all(w >= 0) or not w.sum() > 0:
            raise ParameterError("prior", w.shape, f"{xg.size} non-negative weights, not all 0")
        with np.errstate(divide="ignore"):
            logprior = np.log(w / w.sum())
    loglik = _loglik_marginal if likelihood == "marginal" else _loglik_joint
    out = np.empty(y.shape[0])
    step = max(1, int(max_elements) // xg.size)
    for s in range(0, y.shape[0], step):
        ll = loglik(xg, y[s:s + step], a, b, d)
        if logprior is not None:
            ll += logprior
        out[s:s + step] = _pick(ll, xg, tie, point)
    return out


def euclidean_distance(true: Any, inferred: Any) -> float:
    """Eq. 16: dis(X, X') = sqrt(sum_i (x_i - x'_i)^2). Larger means more private."""
    t = np.asarray(true, dtype=np.float64).reshape(-1)
    f = np.asarray(inferred, dtype=np.float64).reshape(-1)
    if t.shape != f.shape:
        raise ParameterError("inferred", f.shape, f"the shape of the true data {t.shape}")
    return float(np.sqrt(np.sum((t - f) ** 2)))


def noise_adding_inferred(perturbed: Any, lower: float | None = None, upper: float | None = None,
                          *, clip: bool = False) -> np.ndarray:
    """Inferred data for a noise-adding baseline: the perturbed values themselves (the paper).

    ``clip=False`` (default) follows the paper, which leaves them unclipped; ``clip=True``
    projects them onto [lower, upper] (both required then).
    """
    out = np.array(perturbed, dtype=np.float64).reshape(-1)
    if clip:
        if lower is None or upper is None or not lower < upper:
            raise ParameterError("lower/upper", (lower, upper), "lower < upper when clip=True")
        np.clip(out, lower, upper, out=out)
    return out


def rvns_privacy_metric(mechanism: RVNS, values: Any, reports: Any, **options: Any) -> float:
    """Eq. 16 for RVNS: euclidean_distance(values, infer_rvns(mechanism, reports, **options))."""
    return euclidean_distance(values, infer_rvns(mechanism, reports, **options))
