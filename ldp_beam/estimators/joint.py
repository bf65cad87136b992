"""Server side of the categorical family: frequency estimates from uRR/GRR reports and joint
tables from JuRR, CPRR, JD-GRR and TDRR reports (spec: shared/specs/uldp_joint.md).

The accumulator is the output-frequency table (int64 counts, one per cell of the output domain;
any labels are mapped to codes once, on the client side). Every estimator here is *linear* in the
normalized counts P = c / N: f^ = A P, with A the inverse of the transition matrix Q written in
closed form (the paper's equations, corrected as the spec lists). So each estimator implements

* ``unbias(P, power)``: sum_k A[i, k]^power P[k] for every cell i. ``power=1`` is the estimate;
  ``power=2`` gives the exact multinomial variance Var f^_i = (sum_k A_ik^2 pi_k - f_i^2) / N,
  estimated by plugging in P for pi (the constant terms of the closed forms are written as
  multiples of sum(P) = 1, so A is exactly Q^-1 and the formula holds);
* ``adjoint(W)``: A^T W for a stack of weight tables, which gives the variance of any linear
  functional (marginals) the same way.

Tests check A Q = I, closed forms = ``solve(Q, P)``, the variances against simulation, and that
``adjoint`` is the transpose of ``unbias``.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from ..core import CountEstimator, Reasons, Statistic, coerce_numeric
from ..mechanisms.categorical import GRR, urr_probabilities
from ..mechanisms.joint import CPRR, JDGRR, JointMechanism, JuRR
from .consistency import project_simplex


#: Cells of one block of stacked weight tables (the generic marginal route): 32 MiB of float64
_STACK_BLOCK = 1 << 22


# --------------------------------------------------------------------------- uRR along an axis
def urr_inverse(p: np.ndarray, axis: int, sens: np.ndarray, epsilon: float,
                power: int = 1) -> np.ndarray:
    """Apply the (elementwise ``power`` of the) inverse uRR matrix along ``axis`` of ``p``.

    Sensitive label i: f_i = (P_i - b sum P) / (a - b) (Murakami & Kawamoto, Eq. 19 of the JuRR
    paper's CPRR estimator); non-sensitive label i: f_i = P_i / t. ``sens`` masks that axis.
    """
    a, b, t = urr_probabilities(epsilon, int(sens.sum()))
    w_self, w_other = (1 - b) / (a - b), -b / (a - b)
    p = np.moveaxis(np.asarray(p, dtype=float), axis, -1)
    total = p.sum(axis=-1, keepdims=True)
    out = np.where(sens, w_self ** power * p + w_other ** power * (total - p),
                   (1 / t) ** power * p)
    return np.moveaxis(out, -1, axis)


def urr_inverse_adjoint(w: np.ndarray, axis: int, sens: np.ndarray,
                        epsilon: float) -> np.ndarray:
    """The transpose of :func:`urr_inverse` (power 1) applied along ``axis`` of ``w``."""
    a, b, t = urr_probabilities(epsilon, int(sens.sum()))
    w_self, w_other = (1 - b) / (a - b), -b / (a - b)
    w = np.moveaxis(np.asarray(w, dtype=float), axis, -1)
    s_sum = np.where(sens, w, 0.0).sum(axis=-1, keepdims=True)
    out = w_other * s_sum + np.where(sens, (w_self - w_other) * w, w / t)
    return np.moveaxis(out, -1, axis)


# --------------------------------------------------------------------------- the base
class LinearFrequencyEstimator(CountEstimator):
    """Counts over the output cells; a linear unbiased estimate with per-cell standard errors, a
    consistent version (projection onto the simplex) and the count of reports."""

    shape: tuple[int, ...] = ()
    fields: tuple[tuple[str, int], ...] = ()  # report field -> number of codes

    def __init__(self, mechanism: Any) -> None:
        super().__init__(mechanism)
        self.n_cells = int(np.prod(self.shape))

    def cells(self, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        (first, _), rest = self.fields[0], self.fields[1:]
        code = np.array(reports[first], dtype=np.int64)  # a copy, updated in place
        for name, size in rest:
            code *= size
            code += np.asarray(reports[name], dtype=np.int64)
        return code

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        for name, size in self.fields:
            if name not in reports:
                continue
            raw = reports[name]
            vals, _ = coerce_numeric(raw)
            ok = (vals >= 0) & (vals < size) & (np.floor(vals) == vals)
            reasons.flag(~ok, lambda i, r=raw, nm=name, k=size:
                         f"report field {nm!r}: {r[i]!r} is not a code in [0, {k})")
        return reasons

    # -- what each mechanism provides
    def unbias(self, p: np.ndarray, power: int = 1) -> np.ndarray:
        raise NotImplementedError

    def adjoint(self, w: np.ndarray) -> np.ndarray:
        """A^T applied to a stack of weight tables ``w`` of shape (B, *shape)."""
        raise NotImplementedError

    # -- generic pieces
    def table(self, acc: np.ndarray) -> np.ndarray:
        return np.asarray(acc).reshape(self.shape)

    def estimate_table(self, acc: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """(raw unbiased estimate, its per-cell standard error, N)."""
        n = int(acc.sum())
        p = self.table(acc) / n
        f = self.unbias(p, 1)
        var = (self.unbias(p, 2) - f * f) / n
        return f, np.sqrt(np.maximum(var, 0.0)), n

    def functional_stderr(self, weights: np.ndarray, acc: np.ndarray, f: np.ndarray) -> np.ndarray:
        """Standard errors of the linear functionals sum(W_b * f^) for a stack ``weights``."""
        n = int(acc.sum())
        p = self.table(acc) / n
        g = self.adjoint(weights)
        axes = tuple(range(1, g.ndim))
        second = (g * g * p).sum(axis=axes)
        first = (weights * f).sum(axis=axes)
        return np.sqrt(np.maximum(second - first * first, 0.0) / n)

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        f, se, _ = self.estimate_table(acc)
        return {"frequency": Statistic(f, se, project_simplex(f), note=NOTE_CONSISTENT,
                                       domain=(0, 1))}


NOTE_CONSISTENT = ("value: unbiased, may be negative; clipped: the consistent estimate, the "
                   "Euclidean projection onto the probability simplex (Norm-Sub)")


class CategoricalEstimator(LinearFrequencyEstimator):
    """Label frequencies from GRR or uRR reports (one field ``v``)."""

    def __init__(self, mechanism: GRR) -> None:
        self.shape = (len(mechanism.domain),)
        self.fields = (("v", len(mechanism.domain)),)
        super().__init__(mechanism)
        self.sens = np.zeros(len(mechanism.domain), dtype=bool)
        self.sens[mechanism.sensitive_codes] = True

    def unbias(self, p: np.ndarray, power: int = 1) -> np.ndarray:
        return urr_inverse(p, 0, self.sens, self.mechanism.epsilon, power)

    def adjoint(self, w: np.ndarray) -> np.ndarray:
        return urr_inverse_adjoint(w, 1, self.sens, self.mechanism.epsilon)


# --------------------------------------------------------------------------- joint tables
class JointEstimator(LinearFrequencyEstimator):
    """Joint table, marginals and conditionals from a joint mechanism's (x, y) reports."""

    def __init__(self, mechanism: JointMechanism) -> None:
        self.shape = mechanism.shape
        self.fields = (("x", mechanism.nx), ("y", mechanism.ny))
        super().__init__(mechanism)
        self.xs, self.ys = mechanism.sensitive_masks()
        self._plans: dict[int, dict | None] = {}

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        f, se, _ = self.estimate_table(acc)
        out = {"joint": Statistic(f, se, project_simplex(f), note=NOTE_CONSISTENT, domain=(0, 1))}
        out.update(self.derived(f, acc, out["joint"].clipped))
        return out

    def derived(self, f: np.ndarray, acc: np.ndarray,
                consistent: np.ndarray) -> dict[str, Statistic]:
        """Marginals (with standard errors) and conditionals of a joint estimate."""
        se_x, se_y = self.marginal_stderr(acc, f, 0), self.marginal_stderr(acc, f, 1)
        mx, my = f.sum(axis=1), f.sum(axis=0)
        cx, cy = consistent.sum(axis=1), consistent.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            y_given_x = np.where(cx[:, None] > 0, consistent / cx[:, None], np.nan)
            x_given_y = np.where(cy[None, :] > 0, consistent / cy[None, :], np.nan)
        cond_note = ("from the consistent joint; NaN where the conditioning label has estimated "
                     "frequency 0; no standard error (a ratio of estimates)")
        note = ("value: sum of the unbiased joint (unbiased); clipped: from the consistent joint")
        return {
            "marginal_x": Statistic(mx, se_x, cx, note, domain=(0, 1)),
            "marginal_y": Statistic(my, se_y, cy, note, domain=(0, 1)),
            "y_given_x": Statistic(y_given_x, None, None,
                                   "rows: x labels, columns: P(y | x); " + cond_note),
            "x_given_y": Statistic(x_given_y, None, None,
                                   "rows: x labels, columns: P(x | y); " + cond_note),
        }

    # -- marginal standard errors in O(|X||Y|)
    def marginal_stderr(self, acc: np.ndarray, f: np.ndarray, axis: int) -> np.ndarray:
        """Standard errors of the marginal sums of the raw joint along ``axis`` (0: one per x).

        The variance of marginal i is (sum_k g_ik^2 pi_k - m_i^2) / N with g_i = A^T (indicator
        of line i). For these mechanisms g_i is constant on classes of cells (same line or not,
        sensitive line or not, sensitive cross label or not), and lines of one class are
        interchangeable, so two adjoint evaluations (one representative line per class) and the
        class masses give every marginal's variance in O(|X||Y|). The plan is built and checked
        once per estimator; if a mechanism lacks that symmetry, the generic route (one adjoint
        per line) is used instead.
        """
        if axis not in self._plans:
            self._plans[axis] = self._marginal_plan(axis)
        plan = self._plans[axis]
        n = int(acc.sum())
        p = self.table(acc) / n
        m = f.sum(axis=1 - axis)
        if plan is None:  # one indicator table per line, a block of lines at a time (the
            # whole stack would be k x |X||Y| cells, cubic in the domain)
            k = self.shape[axis]
            step = max(1, _STACK_BLOCK // self.n_cells)
            out = np.empty(k)
            for start in range(0, k, step):
                lines = np.arange(start, min(k, start + step))
                w = np.zeros((lines.size,) + self.shape)
                rows = np.arange(lines.size)
                w[(rows, lines, slice(None)) if axis == 0 else (rows, slice(None), lines)] = 1.0
                out[lines] = self.functional_stderr(w, acc, f)
            return out
        line_cls, cross_cls = self._classes(axis)
        pl = p if axis == 0 else p.T
        line_mass = {cc: pl[:, cross_cls == cc].sum(axis=1) for cc in (True, False)}
        block = {(rc, cc): line_mass[cc][line_cls == rc].sum()
                 for rc in (True, False) for cc in (True, False)}
        second = np.zeros(self.shape[axis])
        for rc, (same, other) in plan.items():
            lines = line_cls == rc
            acc2 = np.zeros(int(lines.sum()))
            for cc, v in same.items():
                acc2 += v * v * line_mass[cc][lines]
            for (rc2, cc), v in other.items():
                acc2 += v * v * (block[(rc2, cc)] - (line_mass[cc][lines] if rc2 == rc else 0.0))
            second[lines] = acc2
        return np.sqrt(np.maximum(second - m * m, 0.0) / n)

    def _classes(self, axis: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.xs, self.ys) if axis == 0 else (self.ys, self.xs)

    def _marginal_plan(self, axis: int) -> dict | None:
        line_cls, cross_cls = self._classes(axis)
        plan = {}
        for rc in (True, False):
            lines = np.flatnonzero(line_cls == rc)
            if lines.size == 0:
                continue
            i = lines[0]
            g = self._line_adjoint(axis, i)
            same, other = {}, {}
            for cc in (True, False):
                cols = cross_cls == cc
                if not cols.any():
                    continue
                v = _constant(g[i, cols])
                if v is None:
                    return None
                same[cc] = v
                for rc2 in (True, False):
                    rows = line_cls == rc2
                    rows[i] = False
                    if not rows.any():
                        continue
                    v = _constant(g[np.ix_(rows, cols)])
                    if v is None:
                        return None
                    other[(rc2, cc)] = v
            plan[rc] = (same, other)
        # the class values must rebuild g exactly, for the representative and for the last line of
        # each class (lines of a class are interchangeable), else the generic route is used
        for rc, (same, other) in plan.items():
            lines = np.flatnonzero(line_cls == rc)
            for j in {int(lines[0]), int(lines[-1])}:
                if not np.allclose(self._line_adjoint(axis, j),
                                   _rebuild(same, other, j, line_cls, cross_cls),
                                   rtol=1e-10, atol=1e-12):
                    return None
        return plan

    def _line_adjoint(self, axis: int, i: int) -> np.ndarray:
        """A^T (indicator of line i along ``axis``), with lines as rows."""
        w = np.zeros((1,) + self.shape)
        if axis == 0:
            w[0, i, :] = 1.0
        else:
            w[0, :, i] = 1.0
        g = self.adjoint(w)[0]
        return g if axis == 0 else g.T


def _rebuild(same: dict, other: dict, i: int, line_cls: np.ndarray,
             cross_cls: np.ndarray) -> np.ndarray:
    """The table g_i from its class values (lines as rows)."""
    g = np.zeros((line_cls.size, cross_cls.size))
    for (rc2, cc), v in other.items():
        g[np.ix_(line_cls == rc2, cross_cls == cc)] = v
    for cc, v in same.items():
        g[i, cross_cls == cc] = v
    return g


def _constant(values: np.ndarray) -> float | None:
    """The common value of an array, or None if its entries differ."""
    v = values.ravel()
    if v.size == 0:
        return 0.0
    if np.allclose(v, v[0], rtol=1e-12, atol=1e-12):
        return float(v[0])
    return None


class ProductURREstimator(JointEstimator):
    """CPRR and JD-GRR: the uRR / GRR inverse on the flattened product domain (CPRR, Eq. 39)."""

    def __init__(self, mechanism: CPRR | JDGRR) -> None:
        super().__init__(mechanism)
        cells = mechanism.sensitive_cells() if isinstance(mechanism, CPRR) \
            else mechanism.all_cells()
        self.sens_cells = np.zeros(self.n_cells, dtype=bool)
        self.sens_cells[cells] = True

    def unbias(self, p: np.ndarray, power: int = 1) -> np.ndarray:
        flat = np.asarray(p, dtype=float).reshape(self.n_cells)
        return urr_inverse(flat, 0, self.sens_cells, self.mechanism.epsilon,
                           power).reshape(self.shape)

    def adjoint(self, w: np.ndarray) -> np.ndarray:
        b = w.shape[0]
        flat = urr_inverse_adjoint(w.reshape(b, self.n_cells), 1, self.sens_cells,
                                   self.mechanism.epsilon)
        return flat.reshape(w.shape)


class TDRREstimator(JointEstimator):
    """TDRR: the joint by Kronecker inversion (unbiased, no independence assumption) as
    ``joint``, and the paper's product of the two estimated marginals as ``joint_independent``
    (biased unless x and y are independent)."""

    def unbias(self, p: np.ndarray, power: int = 1) -> np.ndarray:
        e2 = self.mechanism.epsilon / 2  # (Qx kron Qy)^-1 = Qx^-1 kron Qy^-1, one axis at a time
        return urr_inverse(urr_inverse(p, 0, self.xs, e2, power), 1, self.ys, e2, power)

    def adjoint(self, w: np.ndarray) -> np.ndarray:
        e2 = self.mechanism.epsilon / 2
        return urr_inverse_adjoint(urr_inverse_adjoint(w, 1, self.xs, e2), 2, self.ys, e2)

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        out = super().statistics(acc)
        n = int(acc.sum())
        p = self.table(acc) / n
        e2 = self.mechanism.epsilon / 2
        px, py = p.sum(axis=1), p.sum(axis=0)
        fx, fy = urr_inverse(px, 0, self.xs, e2), urr_inverse(py, 0, self.ys, e2)
        vx = np.maximum(urr_inverse(px, 0, self.xs, e2, 2) - fx * fx, 0) / n
        vy = np.maximum(urr_inverse(py, 0, self.ys, e2, 2) - fy * fy, 0) / n
        prod = np.outer(fx, fy)
        # delta method, treating the two marginal estimates as independent (the model's premise)
        var = np.outer(vx, fy * fy) + np.outer(fx * fx, vy) + np.outer(vx, vy)
        out["joint_independent"] = Statistic(
            prod, np.sqrt(var), project_simplex(prod),
            note="the paper's TDRR estimate: product of the two estimated marginals; biased "
                 "unless x and y are independent; stderr by the delta method under independence")
        return out


class JuRREstimator(JointEstimator):
    """JuRR's closed form (Section 5.1.2 as corrected in the spec: the P x P cells use a and b,
    and every count is divided by N)."""

    def __init__(self, mechanism: JuRR) -> None:
        super().__init__(mechanism)
        pr = mechanism.probabilities()
        a, b, p, q, m, n, t = (pr[k] for k in "abpqmnt")
        sx, sy = mechanism.sx, mechanism.sy
        r, r2 = p + (sx - 1) * q, m + (sy - 1) * n
        w = {}
        w["pp_self"], w["pp_other"] = (1 - b) / (a - b), -b / (a - b)
        w["nn"] = 1 / t if t > 0 else math.nan  # t only enters when X_N x Y_N is non-empty
        # P x I cell (i in X_S, j in Y_N): f = P_ij/(p-q) - q S_j/(r(p-q)) - q N_j/(r t), where
        # S_j, N_j sum column j over X_S, X_N (the spec's FS_j/FN_j route, expanded)
        w["pi_s"] = -q / (r * (p - q))
        w["pi_self"] = 1 / (p - q) + w["pi_s"]
        w["pi_n"] = -q / (r * t) if t > 0 else math.nan
        w["ip_s"] = -n / (r2 * (m - n))
        w["ip_self"] = 1 / (m - n) + w["ip_s"]
        w["ip_n"] = -n / (r2 * t) if t > 0 else math.nan
        self.w = w
        xs, ys = self.xs[:, None], self.ys[None, :]
        self.pp, self.nn = xs & ys, ~xs & ~ys
        self.pi, self.ip = xs & ~ys, ~xs & ys

    def unbias(self, p: np.ndarray, power: int = 1) -> np.ndarray:
        w = {k: v ** power for k, v in self.w.items()}
        p = np.asarray(p, dtype=float)
        xs, ys = self.xs[:, None], self.ys[None, :]
        col_s = np.where(xs, p, 0).sum(axis=0, keepdims=True)  # per column, over X_S
        col_n = np.where(xs, 0, p).sum(axis=0, keepdims=True)
        row_s = np.where(ys, p, 0).sum(axis=1, keepdims=True)  # per row, over Y_S
        row_n = np.where(ys, 0, p).sum(axis=1, keepdims=True)
        total = p.sum()
        out = np.zeros(p.shape)
        out = np.where(self.pp, w["pp_self"] * p + w["pp_other"] * (total - p), out)
        if self.nn.any():
            out = np.where(self.nn, w["nn"] * p, out)
        out = np.where(self.pi, w["pi_self"] * p + w["pi_s"] * (col_s - p)
                       + (w["pi_n"] * col_n if self.nn.any() else 0.0), out)
        out = np.where(self.ip, w["ip_self"] * p + w["ip_s"] * (row_s - p)
                       + (w["ip_n"] * row_n if self.nn.any() else 0.0), out)
        return out

    def adjoint(self, wt: np.ndarray) -> np.ndarray:
        w = self.w
        wt = np.asarray(wt, dtype=float)
        pp, nn, pi, ip = self.pp, self.nn, self.pi, self.ip
        xs, ys = self.xs[None, :, None], self.ys[None, None, :]
        # P x P rows: other * sum over the P x P weights everywhere, (self - other) on their cell
        out = w["pp_other"] * np.where(pp, wt, 0).sum(axis=(1, 2), keepdims=True) \
            + np.where(pp, (w["pp_self"] - w["pp_other"]) * wt, 0)
        if nn.any():
            out = out + np.where(nn, w["nn"] * wt, 0)
        # P x I rows feed column j: X_S cells and (if any) X_N cells of that column
        s_pi = np.where(pi, wt, 0).sum(axis=1, keepdims=True)
        out = out + np.where(xs & ~ys, w["pi_s"] * s_pi + (w["pi_self"] - w["pi_s"]) * wt, 0)
        if nn.any():
            out = out + np.where(~xs & ~ys, w["pi_n"] * s_pi, 0)
        s_ip = np.where(ip, wt, 0).sum(axis=2, keepdims=True)
        out = out + np.where(~xs & ys, w["ip_s"] * s_ip + (w["ip_self"] - w["ip_s"]) * wt, 0)
        if nn.any():
            out = out + np.where(~xs & ~ys, w["ip_n"] * s_ip, 0)
        return out
