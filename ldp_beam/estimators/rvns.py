"""Server side of RVNS: reconstruct the density of the true values from negative reports
(spec: shared/specs/rvns.md, "Reconstruction"; paper: Section III-C, Eqs. 5-11, Algorithm 2).

Accumulator: :class:`~ldp_beam.estimators.density.BinnedDensity` counts of *all* k reports of every
user on ``bins`` fine bins of [lower, upper] (plus n, sum, sum of squares). It is mergeable by
summation, exact for the counts, and its size does not depend on the number of users. Every
reconstruction below reads only these counts, so its cost depends on m and ``bins``, never on n.

Two reconstructions of the density on m equal cells Z of [lower, upper]:

* ``method="em"`` (the default): maximum likelihood of the report histogram under the model
  "x has a piecewise-constant density V on the cells", solved by EM with a smoothing step after
  every iteration (EMS, as Li et al. SIGMOD 2020 do for square-wave reports) and accelerated by
  SQUAREM (Varadhan & Roland 2008). The transition matrix is exact: entry (r, i) is the
  probability that a report lands in report bin r when x is uniform in cell i, from the
  closed-form report CDF (:func:`report_cdf`). No kernel density estimate is involved, so EM has
  no KDE bandwidth and no KDE boundary artefact. The smoothing step is an implicit diffusion of
  variance ``smoothing**2`` (data units, so the same value means the same thing for every m);
  the default (:meth:`RVNSEstimator.default_smoothing`) shrinks as the number of reports grows,
  which makes the estimate consistent.
* ``method="paper"``: Algorithm 2 as published: G = Gaussian KDE of the reports at Z (Eqs. 5-6,
  optionally with reflection at the domain's ends), P = [p(z_i, z_j) w] (the rectangle rule of
  Eq. 7), and scipy's SLSQP on Eq. 9-11: minimize KL(G, PV) + KL(PV, G) + regularization subject
  to sum_i v_i w = 1 and v >= 0 (the KLs between G and PV normalized to discrete distributions),
  with the analytic gradient. The paper's L1 and L2 terms are available as ``reg_l1``/``reg_l2``;
  on the feasible set the L1 term is the constant ``reg_l1 / w`` and cannot change the solution,
  and the L2 term pulls towards the flat density. The paper's stated aim, smoothness, is what
  ``reg_smooth`` (a penalty on squared differences of V, scaled as the integral of f'^2 on the
  unit interval) provides; it is on by default (:meth:`RVNSEstimator.default_reg_smooth`). The
  paper's bound v_i <= 1 is not imposed (a density may exceed 1).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..core import Reasons, Statistic, check_choice, coerce_numeric
from ..errors import EmptyAccumulatorError, ParameterError
from ..limits import check_cap, product
from ..mechanisms.rvns import RVNS, rvns_density
from .density import (BinnedDensity, BinnedEstimator, DensityGrid, density_statistics,
                      kde_on_grid)

METHODS = ("em", "paper")
BOUNDARIES = ("reflect", "none")

#: EM defaults (chosen by the measurements in docs/rvns_reconstruction.md)
EM_SMOOTHING_C = 0.65  # smoothing = C (upper - lower) (d / ((upper - lower) n k))^POWER
EM_SMOOTHING_POWER = 0.4
EM_TOL = 1e-8  # L1 change of the cell probabilities between two EMS steps
EM_MAX_ITER = 5000  # EMS map evaluations
#: paper-method defaults
PAPER_REG_SMOOTH_C = 0.01  # reg_smooth = C (d / ((upper - lower) n k))^PAPER_REG_SMOOTH_POWER
PAPER_REG_SMOOTH_POWER = 0.6
PAPER_BANDWIDTH = 0.005  # default KDE bandwidth, as a fraction of upper - lower (m=100: w / 2)
PAPER_TOL = 1e-10  # SLSQP ftol
PAPER_MAX_ITER = 500


#: Entries of one block of report CDFs when the EM matrix is built (see transition_matrix)
_CDF_BLOCK = 1 << 22


# --------------------------------------------------------------------------- the transition model
def _psi(s: np.ndarray, d: float) -> np.ndarray:
    """Antiderivative of clip(s, 0, d) with psi(0) = 0."""
    s = np.clip(s, 0.0, None)
    return np.where(s <= d, 0.5 * s * s, d * (s - 0.5 * d))


def report_cdf(x: np.ndarray, t: np.ndarray, a: float, b: float, d: float) -> np.ndarray:
    """Pr(Y <= t | x) for one RVNS report, in closed form (broadcasts over x and t).

    Integrating p(x, y) of the spec over y in [a, t]: Y is uniform on [a, b] minus the window
    [L, L + d], whose left end L = x - d1 is uniform on [x - hi, x - lo], so
    Pr(Y <= t | x) = ((t - a) - E|[a, t] and [L, L + d]|) / (b - a - d), and because the window
    lies inside [a, b] the overlap is clip(t - L, 0, d), whose mean over L is a difference of the
    antiderivative psi divided by the width of L's range (or the value itself when x is at a
    boundary and L is fixed).
    """
    x = np.asarray(x, dtype=float)
    t = np.clip(np.asarray(t, dtype=float), a, b)
    lo = np.maximum(0.0, x + d - b)
    hi = np.minimum(d, x - a)
    l0, l1 = x - hi, x - lo
    width = l1 - l0
    fixed = width <= 1e-12 * (b - a)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_overlap = np.where(fixed, np.clip(t - l0, 0.0, d),
                                (_psi(t - l0, d) - _psi(t - l1, d)) / np.where(fixed, 1.0, width))
    return ((t - a) - mean_overlap) / (b - a - d)


def transition_matrix(report_edges: np.ndarray, cell_edges: np.ndarray, a: float, b: float,
                      d: float, quad: int = 4) -> np.ndarray:
    """(R x m) matrix: entry (r, i) = Pr(report in [report_edges[r], report_edges[r+1]) | x
    uniform in cell i), exact in y (the closed-form CDF) and averaged in x over the midpoints of
    ``quad`` equal sub-cells of each cell. Columns sum to 1 when the report edges span [a, b]."""
    cell_edges = np.asarray(cell_edges, dtype=float)
    m = cell_edges.size - 1
    sub = (np.arange(quad) + 0.5) / quad
    xs = (cell_edges[:-1, None] + sub[None, :] * np.diff(cell_edges)[:, None]).ravel()
    out = np.empty((len(report_edges) - 1, m))
    # bounded memory: (R + 1) x (step quad) x-points at a time, at most 256 cells and about
    # _CDF_BLOCK entries per block (report_cdf makes a few temporaries of a block's size)
    step = max(1, min(256, _CDF_BLOCK // (len(report_edges) * quad)))
    for start in range(0, m, step):
        cols = slice(start * quad, min(m, start + step) * quad)
        cdf = report_cdf(xs[None, cols], np.asarray(report_edges, float)[:, None], a, b, d)
        out[:, start:start + step] = np.diff(cdf, axis=0).reshape(len(report_edges) - 1, -1,
                                                                   quad).mean(axis=2)
    return out


def point_matrix(z: np.ndarray, width: float, a: float, b: float, d: float) -> np.ndarray:
    """The paper's P(Z) with the rectangle rule of Eq. 7: entry (j, i) = p(z_i, z_j) w, so that
    (P V)_j is the report density at z_j implied by the density values V at Z."""
    z = np.asarray(z, dtype=float)
    return rvns_density(z[None, :], z[:, None], a, b, d) * width


# --------------------------------------------------------------------------- EM (EMS + SQUAREM)
#: Above this many matrix entries EM's matrix-vector products avoid multi-threaded BLAS: when
#: other processes share the cores (Beam workers), OpenBLAS's threads oversubscribe them and a
#: 2000 x 1000 product measured 6.5 ms instead of 0.26 ms; numpy's einsum column sums are
#: single-threaded, 0.36 ms here whatever the load. Small products stay on BLAS (single-threaded
#: there anyway, and faster).
_BLAS_MAX = 1 << 17


def diffusion_smoother(m: int, width: float, sigma: float):
    """The EMS smoothing step: one implicit diffusion step (I - tau L)^-1 with reflecting ends,
    tau = sigma^2 / (2 width^2) in cells, i.e. a (two-sided exponential) kernel of variance
    sigma^2 in data units. It is a nonnegative matrix whose columns sum to 1, so it keeps v >= 0
    and the total mass.

    Grids of up to :data:`_DENSE_SMOOTHER_CELLS` cells (the default grid has 100) apply that
    inverse as a dense matrix, made once by :func:`_tridiagonal_inverse` in numpy: one small
    matrix-vector product per EM step and no scipy import, which cost ~0.14 s of every
    RVNS release (scipy.linalg's import pulls in numpy.f2py), 40x the EM itself at 10^6
    reports. Larger grids solve the banded system each step (scipy.linalg.solve_banded, O(m))."""
    tau = 0.5 * (sigma / width) ** 2
    if tau <= 0:
        return lambda v: v
    diag = np.full(m, 1 + 2 * tau)
    diag[0] = diag[-1] = 1 + tau
    if m <= _DENSE_SMOOTHER_CELLS:
        inverse = _tridiagonal_inverse(diag, -tau)
        return lambda v: inverse @ v
    # lazy: scipy.linalg costs 0.16 s at import (measured, after this module's imports); only
    # grids above _DENSE_SMOOTHER_CELLS need it: the default EM release (100 cells) never does
    from scipy.linalg import solve_banded

    ab = np.empty((3, m))
    ab[0, :] = -tau
    ab[2, :] = -tau
    ab[1, :] = diag
    return lambda v: solve_banded((1, 1), ab, v, check_finite=False)


#: grids of at most this many cells smooth with a dense inverse (at most _BLAS_MAX entries:
#: a single-threaded product; see diffusion_smoother)
_DENSE_SMOOTHER_CELLS = 362


def _tridiagonal_inverse(diag: np.ndarray, off: float) -> np.ndarray:
    """The inverse of the symmetric tridiagonal matrix with diagonal ``diag`` and constant
    off-diagonal ``off``, by Gaussian elimination without pivoting on the identity's columns
    (LAPACK gtsv's arithmetic; no row is exchanged because the matrix is strictly diagonally
    dominant: every pivot before the last stays >= 1 + tau > |off| = tau). Numpy only, no LAPACK call: a threaded
    solve measured 0.1 s for m = 100 on a busy machine, this ~1 ms."""
    m = diag.shape[0]
    d = diag.astype(np.float64, copy=True)
    b = np.eye(m)
    for i in range(m - 1):  # forward elimination: row i + 1 -= (off / d[i]) * row i
        fact = off / d[i]
        d[i + 1] -= fact * off
        b[i + 1] -= fact * b[i]
    b[m - 1] /= d[m - 1]
    for i in range(m - 2, -1, -1):  # back substitution
        b[i] -= off * b[i + 1]
        b[i] /= d[i]
    return b


def em_reconstruct(A: np.ndarray, counts: np.ndarray, smooth, tol: float = EM_TOL,
                   max_iter: int = EM_MAX_ITER) -> tuple[np.ndarray, int, bool, float]:
    """EMS on binned reports, SQUAREM-accelerated. ``A``: (R x m) transition matrix, ``counts``:
    (R,) report counts, ``smooth``: the smoothing step. Returns (cell probabilities pi, map
    evaluations, converged, mean log-likelihood per report of the histogram under A pi).

    One EMS step: pi <- S(pi * A^T (r / A pi)) with r = counts / N: the EM step for a mixture
    with known components A[:, i], then S, the smoothing. Stop when the L1 change of one step is
    < tol.
    """
    r = counts / counts.sum()
    nz = r > 0
    A_nz, r_nz = A[nz], r[nz]  # empty report bins do not enter the likelihood or its gradient
    m = A.shape[1]
    if A_nz.size <= _BLAS_MAX:
        forward, adjoint = (lambda p: A_nz @ p), (lambda u: A_nz.T @ u)
    else:  # large: single-threaded products (see _BLAS_MAX), both as column sums
        A_t = np.ascontiguousarray(A_nz.T)
        forward = lambda p: np.einsum("ij,i->j", A_t, p)  # noqa: E731
        adjoint = lambda u: np.einsum("ij,i->j", A_nz, u)  # noqa: E731

    def step(p: np.ndarray) -> np.ndarray:
        new = smooth(p * adjoint(r_nz / np.maximum(forward(p), 1e-300)))
        new = np.maximum(new, 0.0)
        return new / new.sum()

    p = np.full(m, 1.0 / m)
    evals, converged = 0, False
    while evals < max_iter:
        p1 = step(p)
        res1 = p1 - p
        evals += 1
        if np.abs(res1).sum() < tol:
            p, converged = p1, True
            break
        p2 = step(p1)
        evals += 1
        v = p2 - 2 * p1 + p
        vn = np.linalg.norm(v)
        alpha = -np.linalg.norm(res1) / vn if vn > 0 else -1.0
        if alpha > -1.0:  # SQUAREM never steps shorter than the plain double step
            alpha = -1.0
        cand = p - 2 * alpha * res1 + alpha * alpha * v
        cand = np.maximum(cand, 0.0)
        total = cand.sum()
        if not (np.isfinite(total) and total > 0):
            p = p2
            continue
        cand /= total
        p3 = step(cand)  # the stabilization step keeps the iterate an EMS image
        evals += 1
        # SQUAREM without a merit function (EMS maximizes none): the extrapolation is kept
        # unless it blows up (residual at cand > 10x the residual at the cycle's start); a
        # stricter "residual must not grow" rule rejected 75-99% of them and needed 4-20x more
        # steps for the same answer (docs/rvns_reconstruction.md).
        p = p3 if np.abs(p3 - cand).sum() <= 10 * np.abs(res1).sum() else p2
    loglik = float(np.dot(r_nz, np.log(np.maximum(A_nz @ p, 1e-300))))
    return p, evals, converged, loglik


# --------------------------------------------------------------------------- the paper's SQP
def paper_objective(v: np.ndarray, P: np.ndarray, g: np.ndarray, width: float, span: float,
                    reg_l1: float = 0.0, reg_l2: float = 0.0,
                    reg_smooth: float = 0.0) -> tuple[float, np.ndarray]:
    """Eq. 9 and its gradient: KL(g, q) + KL(q, g) + reg_l1 ||V||_1 + reg_l2 ||V||_2^2
    + reg_smooth span^3 sum_i (v_{i+1} - v_i)^2 / w, where g is the KDE at Z normalized to sum 1
    and q = P V normalized to sum 1. The smoothness term approximates reg_smooth times the
    integral of u'^2 for the density u rescaled to [0, 1], so its weight means the same for
    every m and every domain.

    With s = P V, S = sum s, q = s / S: J = sum (g - q)(log g - log q), dJ/dq_j = log(q_j / g_j)
    - g_j / q_j + 1 =: t_j, dJ/ds_k = (t_k - t . q) / S, dJ/dV = P^T dJ/ds.
    """
    s = np.maximum(P @ v, 1e-300)
    S = s.sum()
    q = s / S
    lq, lg = np.log(q), np.log(g)
    val = float(np.sum((g - q) * (lg - lq)))
    t = (lq - lg) - g / q + 1.0
    grad = P.T @ ((t - np.dot(t, q)) / S)
    if reg_l1:
        val += reg_l1 * float(np.abs(v).sum())
        grad = grad + reg_l1 * np.sign(v)
    if reg_l2:
        val += reg_l2 * float(np.dot(v, v))
        grad = grad + 2 * reg_l2 * v
    if reg_smooth:
        c = reg_smooth * span ** 3 / width
        dv = np.diff(v)
        val += c * float(np.dot(dv, dv))
        gd = np.zeros_like(v)
        gd[:-1] -= dv
        gd[1:] += dv
        grad = grad + 2 * c * gd
    return val, grad


def paper_reconstruct(P: np.ndarray, G: np.ndarray, width: float, span: float, reg_l1: float,
                      reg_l2: float, reg_smooth: float, tol: float = PAPER_TOL,
                      max_iter: int = PAPER_MAX_ITER) -> tuple[np.ndarray, int, bool, float, str]:
    """SLSQP on Eq. 9-11 from the flat density. Returns (V, iterations, converged, objective,
    SLSQP's message)."""
    # lazy: scipy.optimize costs 0.37 s at import (measured, after this module's imports); only
    # the paper method needs it: the default EM release and the device side never do
    from scipy.optimize import minimize

    m = G.size
    g = np.maximum(np.asarray(G, float), 1e-300)
    g = g / g.sum()
    cons = {"type": "eq", "fun": lambda v: np.sum(v) * width - 1.0,  # Eq. 11 (area)
            "jac": lambda v: np.full(m, width)}
    res = minimize(paper_objective, np.full(m, 1.0 / span), jac=True, method="SLSQP",
                   args=(P, g, width, span, reg_l1, reg_l2, reg_smooth),
                   bounds=[(0.0, None)] * m, constraints=[cons],
                   options={"maxiter": max_iter, "ftol": tol})
    return res.x, int(res.nit), bool(res.success), float(res.fun), str(res.message)


# --------------------------------------------------------------------------- the estimator
@dataclass
class Reconstruction:
    """A reconstructed density on ``grid`` with how it was obtained."""

    grid: DensityGrid
    density: np.ndarray
    method: str
    iterations: int
    converged: bool
    objective: float
    objective_note: str
    bandwidth: float | None = None
    smoothing: float | None = None
    seconds: float = 0.0
    details: dict = field(default_factory=dict)


def _number(name: str, value: Any, lo: float, lo_open: bool = True, integer: bool = False,
            hi: float = math.inf) -> Any:
    ok_type = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, ok_type) or not math.isfinite(value) \
            or (value <= lo if lo_open else value < lo) or value > hi:
        rng = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{']' if hi < math.inf else ')'}"
        raise ParameterError(name, value, f"{'an integer' if integer else 'a number'} in {rng}")
    return int(value) if integer else float(value)


class RVNSEstimator(BinnedEstimator):
    """Density of the true values on m equal cells of [lower, upper] from RVNS reports.

    * ``m``: number of cells (points of interest Z = cell midpoints), >= 2.
    * ``method``: "em" (EMS on the binned reports, fast, default) or "paper" (Algorithm 2: KDE +
      SLSQP on Eq. 9-11).
    * ``bins``: fine bins of the accumulator (any reconstruction can be run on the same
      accumulator; a change of ``bins`` changes the accumulator's layout).
    * ``bandwidth``, ``boundary`` (paper only): Gaussian KDE bandwidth of the reports (default
      0.005 (upper - lower), half a cell at m = 100) and its boundary correction, "reflect"
      (default) or "none".
    * ``smoothing``, ``report_bins`` (em only): the EMS smoothing kernel's standard deviation in
      data units (default 0.65 (b - a) (d / ((b - a) n k))^0.4 for n users of k reports; 0 =
      plain EM) and the number of report bins EM fits (default min(bins, max(m, 200)), as
      accurate as all 4096 fine bins in our measurements; fine bins are grouped, never split).
    * ``reg_l1``, ``reg_l2``, ``reg_smooth`` (paper only): the weights of the paper's L1 and L2
      terms (default 0: the first is constant on the feasible set, the second pulls towards the
      flat density) and of the smoothness term (default 0.01 (d / ((b - a) n k))^0.6).
    * ``tol``, ``max_iter``: stopping rule (em: L1 change of the cell probabilities < tol, at
      most max_iter EMS steps; paper: SLSQP's ftol and maxiter).

    ``statistics`` releases the density, CDF, quantiles and six indicators of
    :func:`~ldp_beam.estimators.density.density_statistics`, plus ``method``, ``iterations``,
    ``converged``, ``objective``, ``bandwidth`` and ``smoothing``. ``n_reports`` counts users.
    """

    def __init__(self, mechanism: RVNS, m: int = 100, method: str = "em", bins: int = 4096,
                 bandwidth: float | None = None, boundary: str | None = None, *,
                 smoothing: float | None = None, report_bins: int | None = None,
                 reg_l1: float | None = None, reg_l2: float | None = None,
                 reg_smooth: float | None = None, tol: float | None = None,
                 max_iter: int | None = None) -> None:
        super().__init__(mechanism)
        if not isinstance(mechanism, RVNS):
            raise ParameterError("mechanism", mechanism, "an RVNS mechanism")
        check_choice(method, "method", METHODS)
        self.method = method
        self.grid = DensityGrid(mechanism.lower, mechanism.upper,
                                _number("m", m, 2, lo_open=False, integer=True))
        self.binned = BinnedDensity(mechanism.lower, mechanism.upper,
                                    _number("bins", bins, 2, lo_open=False, integer=True))
        em_only = {"smoothing": smoothing, "report_bins": report_bins}
        paper_only = {"bandwidth": bandwidth, "boundary": boundary, "reg_l1": reg_l1,
                      "reg_l2": reg_l2, "reg_smooth": reg_smooth}
        for name, val in (paper_only if method == "em" else em_only).items():
            if val is not None:
                raise ParameterError(name, val, f"None: it is not used by method={method!r}")
        self.bandwidth = None if bandwidth is None else _number("bandwidth", bandwidth, 0)
        if boundary is not None:
            check_choice(boundary, "boundary", BOUNDARIES)
        self.boundary = boundary or "reflect"
        self.smoothing = None if smoothing is None else _number("smoothing", smoothing, 0,
                                                                lo_open=False)
        self.report_bins = (min(self.binned.bins, max(self.grid.m, 200)) if report_bins is None
                            else _number("report_bins", report_bins, 2, lo_open=False,
                                         integer=True, hi=self.binned.bins))
        # the reconstruction matrix, before it is ever built: report bins x m for EM, m x m for
        # the paper's method (P(Z), and SLSQP's dense m x m working matrices)
        gm = self.grid.m
        if method == "em":
            check_cap("cells", product(self.report_bins, gm),
                      f"m x report_bins (EM's transition matrix, {gm:,} x {self.report_bins:,})")
        else:
            check_cap("cells", product(gm, gm), f"m (the paper method's m x m matrices, "
                      f"{gm:,} x {gm:,})")
            check_cap("cells", product(gm, self.binned.bins),
                      f"m x bins (the KDE's kernel matrix, {gm:,} x {self.binned.bins:,})")
        self.reg_l1 = 0.0 if reg_l1 is None else _number("reg_l1", reg_l1, 0, lo_open=False)
        self.reg_l2 = 0.0 if reg_l2 is None else _number("reg_l2", reg_l2, 0, lo_open=False)
        self.reg_smooth = (None if reg_smooth is None else
                           _number("reg_smooth", reg_smooth, 0, lo_open=False))
        default_tol, default_iter = ((EM_TOL, EM_MAX_ITER) if method == "em" else
                                     (PAPER_TOL, PAPER_MAX_ITER))
        self.tol = default_tol if tol is None else _number("tol", tol, 0)
        self.max_iter = default_iter if max_iter is None else _number(
            "max_iter", max_iter, 1, lo_open=False, integer=True, hi=10 ** 7)
        self._cache: dict = {}

    # -- pickling (Beam ships estimators to workers): the matrices are rebuilt on demand
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    def options(self) -> dict:
        """The resolved options (what a release was computed with)."""
        out = {"m": self.grid.m, "method": self.method, "bins": self.binned.bins,
               "tol": self.tol, "max_iter": self.max_iter}
        if self.method == "em":
            out.update(smoothing=self.smoothing, report_bins=self.report_bins)
        else:
            out.update(bandwidth=self.bandwidth, boundary=self.boundary, reg_l1=self.reg_l1,
                       reg_l2=self.reg_l2, reg_smooth=self.reg_smooth)
        return out

    # -- accumulator
    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        a, b = self.mechanism.lower, self.mechanism.upper
        for name, _ in self.mechanism.report_fields:
            if name not in reports:
                continue
            raw = reports[name]
            y, _ = coerce_numeric(raw)
            reasons.flag(~((y >= a) & (y <= b)), lambda i, r=raw, nm=name:
                         f"report field {nm!r}: {r[i]!r} not a number in [{a:g}, {b:g}]")
        return reasons

    # -- reconstruction
    def default_smoothing(self, n_users: int) -> float:
        """The EMS smoothing rule 0.65 (b - a) (d / ((b - a) n k))^0.4, n users, k reports each
        (fitted to the chi-squared experiments, see docs/rvns_reconstruction.md). It shrinks as
        the number of reports grows, so the estimate is consistent, and grows with d: a wider
        window blurs the reports more, and the likelihood then constrains short scales less."""
        mech = self.mechanism
        span = mech.upper - mech.lower
        reports = max(n_users, 1) * mech.k
        return EM_SMOOTHING_C * span * (mech.d / (span * reports)) ** EM_SMOOTHING_POWER

    def default_bandwidth(self) -> float:
        """The paper method's KDE bandwidth: 0.005 (upper - lower) (fitted, see the docs)."""
        return PAPER_BANDWIDTH * (self.mechanism.upper - self.mechanism.lower)

    def default_reg_smooth(self, n_users: int) -> float:
        """The paper method's smoothness weight 0.01 (d / ((b - a) n k))^0.6 (fitted)."""
        mech = self.mechanism
        reports = max(n_users, 1) * mech.k
        return PAPER_REG_SMOOTH_C * (mech.d / ((mech.upper - mech.lower) * reports)) \
            ** PAPER_REG_SMOOTH_POWER

    def _report_grouping(self) -> tuple[np.ndarray, np.ndarray]:
        """Fine-bin start indices of the report bins EM fits, and their edges."""
        key = ("groups", self.report_bins)
        if key not in self._cache:
            idx = np.unique(np.round(np.linspace(0, self.binned.bins,
                                                 self.report_bins + 1)).astype(np.int64))
            edges = self.binned.lo + idx * self.binned.width
            edges[-1] = self.binned.hi
            self._cache[key] = (idx, edges)
        return self._cache[key]

    def em_matrix(self) -> np.ndarray:
        """The (report bins x m) transition matrix of EM, built once per estimator."""
        key = ("A", self.report_bins)
        if key not in self._cache:
            mech = self.mechanism
            _, edges = self._report_grouping()
            # x-quadrature per cell: fine enough that p changes little between points (p varies
            # on the scale of d); 2..16 points.
            quad = int(np.clip(math.ceil(16 * self.grid.width / mech.d), 2, 16))
            self._cache[key] = transition_matrix(edges, self.grid.edges, mech.lower, mech.upper,
                                                 mech.d, quad)
        return self._cache[key]

    def paper_matrix(self) -> np.ndarray:
        if "P" not in self._cache:
            mech = self.mechanism
            self._cache["P"] = point_matrix(self.grid.points, self.grid.width, mech.lower,
                                            mech.upper, mech.d)
        return self._cache["P"]

    def reconstruct(self, acc: np.ndarray) -> Reconstruction:
        """The density estimate from an accumulator (``statistics`` releases it)."""
        t0 = time.perf_counter()
        n_users = self.n_reports(acc)
        counts = self.binned.counts(acc)
        if not counts.sum() > 0:
            raise EmptyAccumulatorError(f"{self.mechanism.name}: no report inside "
                                        f"[{self.mechanism.lower:g}, {self.mechanism.upper:g}]")
        grid, span = self.grid, self.mechanism.upper - self.mechanism.lower
        if self.method == "em":
            sigma = self.default_smoothing(n_users) if self.smoothing is None else self.smoothing
            idx, _ = self._report_grouping()
            grouped = np.add.reduceat(counts, idx[:-1])
            pi, it, conv, loglik = em_reconstruct(
                self.em_matrix(), grouped, diffusion_smoother(grid.m, grid.width, sigma),
                self.tol, self.max_iter)
            v = pi / grid.width
            out = Reconstruction(grid, v, "em", it, conv, loglik,
                                 "mean log-likelihood per report of the binned reports",
                                 smoothing=sigma)
        else:
            h = self.default_bandwidth() if self.bandwidth is None else self.bandwidth
            a, b = self.mechanism.lower, self.mechanism.upper
            G = kde_on_grid(self.binned, acc, grid.points, h,
                            reflect=(a, b) if self.boundary == "reflect" else None)
            lam = self.default_reg_smooth(n_users) if self.reg_smooth is None \
                else self.reg_smooth
            v, it, conv, obj, msg = paper_reconstruct(
                self.paper_matrix(), G, grid.width, span, self.reg_l1, self.reg_l2, lam,
                self.tol, self.max_iter)
            out = Reconstruction(grid, np.maximum(v, 0.0), "paper", it, conv, obj,
                                 "Eq. 9: KL(G, PV) + KL(PV, G) + regularization",
                                 bandwidth=h, details={"message": msg, "reg_smooth": lam})
        out.density = out.density / (out.density.sum() * grid.width)
        out.seconds = time.perf_counter() - t0
        return out

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        rec = self.reconstruct(acc)
        if rec.method == "em":
            note = (f"EMS on {len(self._report_grouping()[0]) - 1} report bins, smoothing sd "
                    f"{rec.smoothing:.4g}, SQUAREM")
            smoothing = Statistic(rec.smoothing, note="EMS smoothing sd (data units)")
        else:
            note = (f"Algorithm 2: KDE (h={rec.bandwidth:.4g}, boundary={self.boundary}) + SLSQP "
                    f"on Eq. 9-11 (reg_smooth={rec.details['reg_smooth']:.3g}, "
                    f"reg_l1={self.reg_l1:g}, reg_l2={self.reg_l2:g})")
            smoothing = Statistic(rec.details["reg_smooth"],
                                  note="reg_smooth: weight of the smoothness term")
        stats = density_statistics(rec.grid, rec.density, note=note)
        stats["method"] = Statistic(rec.method, note=note)
        stats["iterations"] = Statistic(rec.iterations, note="EMS steps" if rec.method == "em"
                                        else "SLSQP iterations")
        stats["converged"] = Statistic(rec.converged, note=rec.details.get("message", ""))
        stats["objective"] = Statistic(rec.objective, note=rec.objective_note)
        stats["bandwidth"] = Statistic(rec.bandwidth, note="KDE bandwidth of the reports" if
                                       rec.method == "paper" else "not used: EM fits the "
                                       "binned reports directly, no KDE")
        stats["smoothing"] = smoothing
        return stats
