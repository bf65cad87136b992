"""Joint distribution of two categorical attributes under utility-optimized LDP: JuRR and CPRR
(the paper in shared/papers/uldp_joint_distribution_jurr_cprr.txt; spec: shared/specs/
uldp_joint.md) and the baselines JD-GRR and TDRR.

Every user holds (x, y); each attribute's declared domain is split into sensitive labels (X_S,
Y_S) and non-sensitive ones (X_N, Y_N). Output domains equal input domains. Report (wire form):
``x`` and ``y`` (uint16), positions of the reported labels in ``x_domain`` / ``y_domain``. Cell
codes of the product domain are ``i * |Y| + j``.

What each mechanism promises (checked exactly on its transition matrix by
:mod:`ldp_beam.audit` and in the tests):

* **CPRR** is uRR on the product domain with S = every pair with at least one sensitive
  coordinate: (S, eps)-ULDP in the sense of Murakami & Kawamoto. A pair is revealed only when
  both of its values are non-sensitive.
* **JuRR** and **TDRR** satisfy the paper's two-dimensional ULDP (Definition 3): each sensitive
  coordinate keeps eps-LDP, but a *non-sensitive* coordinate may be reported exactly even when the
  other coordinate is sensitive (JuRR reports the true y of an (x in X_S, y in Y_N) user with
  probability p + (sx - 1) q). They are **not** (S, eps)-ULDP on the product domain; their
  ``guarantee`` says so.
* **JD-GRR** is eps-LDP (everything is treated as sensitive).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import (Mechanism, Reasons, Reports, Role, check_epsilon, check_labels,
                    check_subset)
from ..errors import ParameterError
from ..privacy import LDP, ULDP, PrivacyGuarantee
from ..limits import check_cap, product
from .categorical import (CODE, check_domain_size, check_matrix_size, count_labels,
                          index_type, precheck_domain, sensitive_positions, urr_matrix,
                          urr_probabilities, urr_sample, urr_tables)

ROLES = (Role("x", kind="category", help="the first attribute, a label of x_domain"),
         Role("y", kind="category", help="the second attribute, a label of y_domain"))
FIELDS = (("x", CODE), ("y", CODE))

TWO_D_NOTE = ("the paper's two-dimensional ULDP (Definition 3): a sensitive coordinate keeps "
              "eps-LDP, but a non-sensitive coordinate may be reported exactly even when the "
              "other coordinate is sensitive; this is NOT (S, eps)-ULDP on the product domain "
              "(use CPRR for that)")


@dataclass(frozen=True)
class JointMechanism(Mechanism):
    """Base of the joint family: two declared categorical domains and a budget epsilon."""

    family: ClassVar[str] = "uldp"
    roles: ClassVar[tuple[Role, ...]] = ROLES
    report_fields: ClassVar[tuple] = FIELDS
    #: joint tables and conditionals by (x, y) label pair, marginals by label
    tidy_cells: ClassVar[tuple[str, ...]] = ("i", "j", "label", "x_label", "y_label",
                                             "clipped")

    epsilon: float
    x_domain: tuple[str, ...]
    y_domain: tuple[str, ...]

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        for name in ("x_domain", "y_domain"):
            precheck_domain(getattr(self, name), name)
        nx, ny = count_labels(self.x_domain), count_labels(self.y_domain)
        if nx is not None and ny is not None:  # the product domain, before any label is read
            self._check_cells(nx, ny)
        for name in ("x_domain", "y_domain"):
            labels = check_labels(getattr(self, name), name, min_size=1)
            check_domain_size(labels, name)
            object.__setattr__(self, name, labels)
        if self.nx * self.ny < 2:
            raise ParameterError("x_domain", self.x_domain,
                                 "domains whose product has at least 2 cells")
        self._check_cells(self.nx, self.ny)

    @staticmethod
    def _check_cells(nx: int, ny: int) -> None:
        """The product domain is the size of every table: the joint counts, the per-cell lookup
        tables of the perturbation (CPRR, JD-GRR) and the estimates."""
        check_cap("cells", product(nx, ny), f"x_domain x y_domain ({nx:,} x {ny:,} labels)")

    # -- the domain
    @property
    def nx(self) -> int:
        return len(self.x_domain)

    @property
    def ny(self) -> int:
        return len(self.y_domain)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.nx, self.ny)

    def labels(self, role: str) -> tuple[str, ...]:
        return {"x": self.x_domain, "y": self.y_domain}[role]

    def sensitive_masks(self) -> tuple[np.ndarray, np.ndarray]:
        """Boolean masks over the x and y codes: which labels are sensitive."""
        return np.ones(self.nx, dtype=bool), np.ones(self.ny, dtype=bool)

    @property
    def draws(self) -> int:
        return 2  # one uniform per attribute (TDRR overrides it)

    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        pass  # membership in the declared domains is checked by Mechanism.check

    def transition_matrix(self) -> np.ndarray:
        """Q[output cell, input cell] over product codes i * |Y| + j; columns sum to one.
        Dense (|X||Y|)^2: meant for audits and tests, not for estimation (the subclasses check
        its size against the cells cap first, :meth:`check_matrix`)."""
        raise NotImplementedError

    def check_matrix(self) -> None:
        check_matrix_size(self.nx * self.ny, "x_domain x y_domain")



@dataclass(frozen=True)
class SensitiveJoint(JointMechanism):
    """A joint mechanism with declared sensitive labels on both attributes (each non-empty)."""

    x_sensitive: tuple[str, ...]
    y_sensitive: tuple[str, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, dom in (("x_sensitive", "x_domain"), ("y_sensitive", "y_domain")):
            object.__setattr__(self, name, check_subset(getattr(self, name), name,
                                                        getattr(self, dom), dom, min_size=1))

    @property
    def sx(self) -> int:
        return len(self.x_sensitive)

    @property
    def sy(self) -> int:
        return len(self.y_sensitive)

    def sensitive_masks(self) -> tuple[np.ndarray, np.ndarray]:
        xs = np.isin(np.array(self.x_domain, dtype=object), self.x_sensitive)
        ys = np.isin(np.array(self.y_domain, dtype=object), self.y_sensitive)
        return xs, ys

    def sensitive_codes(self) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = self.sensitive_masks()
        return np.flatnonzero(xs), np.flatnonzero(ys)

    def _params_note(self) -> dict:
        return {"x_sensitive": list(self.x_sensitive), "y_sensitive": list(self.y_sensitive)}


# --------------------------------------------------------------------------- CPRR and JD-GRR
def _product_tables(mech: JointMechanism, cells_s: np.ndarray, epsilon: float
                    ) -> tuple[np.ndarray, ...]:
    """uRR's tables on the product domain (:func:`urr_tables`) and the labels of the sensitive
    cells: (keep probability, choices, skip, x label, y label of sensitive cell j)."""
    k = mech.nx * mech.ny
    # cell codes go past 65535 on domains of more than 2^16 cells: divide in int64, then narrow
    # (each label code fits uint16)
    sens_x, sens_y = np.divmod(np.asarray(cells_s, dtype=np.int64), mech.ny)
    return (*urr_tables(k, cells_s, epsilon), sens_x.astype(np.uint16),
            sens_y.astype(np.uint16))


def _product_urr(mech: JointMechanism, tables: tuple[np.ndarray, ...],
                 cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
    """:func:`urr_sample` on the cells ``x * |Y| + y`` (tables from :func:`_product_tables`),
    reported as the labels of the output cell: the kept rows' own labels, the moved rows' the
    labels of sensitive cell j (table lookups, not a division per record)."""
    keep_p, choices, skip, sens_x, sens_y = tables
    x, y = cols["x"], cols["y"]
    c = x * mech.ny
    c += y
    u0, u1 = u[:, 0], u[:, 1]
    s = sens_x.shape[0]
    it = index_type(s)
    if s == keep_p.shape[0]:  # every cell sensitive (JD-GRR): constant tables, sens[j] = j
        j = (u1 * choices[0]).astype(it)
        j += j >= c
        keep = u0 < keep_p[0]
    else:  # (take: see urr_sample)
        j = (u1 * choices.take(c)).astype(it)  # truncation = floor: u1 * choices >= 0
        j += j >= skip.take(c)
        keep = u0 < keep_p.take(c)
    np.minimum(j, s - 1, out=j)
    ox, oy = sens_x.take(j), sens_y.take(j)  # moved: sensitive cell j; kept: the row's own
    np.copyto(ox, x, where=keep, casting="unsafe")  # labels fit uint16
    np.copyto(oy, y, where=keep, casting="unsafe")
    return {"x": ox, "y": oy}


@dataclass(frozen=True)
class CPRR(SensitiveJoint):
    """CPRR (Algorithms 3-4): uRR on the product domain, S = pairs with a sensitive coordinate."""

    NAME: ClassVar[str] = "cprr"

    def sensitive_cells(self) -> np.ndarray:
        xs, ys = self.sensitive_masks()
        return np.flatnonzero((xs[:, None] | ys[None, :]).ravel())

    def probabilities(self) -> dict[str, float]:
        """a', b', t' of Eqs. 33-35 with d = |S|."""
        a, b, t = urr_probabilities(self.epsilon, self.sensitive_cells().size)
        return {"a": a, "b": b, "t": t, "d": float(self.sensitive_cells().size)}

    @property
    def guarantee(self) -> PrivacyGuarantee:
        d = int(self.sensitive_cells().size)
        return PrivacyGuarantee(
            ULDP, self.epsilon, params={**self._params_note(), "sensitive_cells": d},
            notes=f"(S, eps)-ULDP on the product domain (Murakami & Kawamoto), S = the {d} pairs "
                  "with at least one sensitive value; a pair is revealed only when both values "
                  "are non-sensitive (Corollary 2; exact)")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return _product_urr(self, self.memo("product-urr", lambda: _product_tables(
            self, self.sensitive_cells(), self.epsilon)), cols, u)

    def transition_matrix(self) -> np.ndarray:
        self.check_matrix()
        return urr_matrix(self.nx * self.ny, self.sensitive_cells(), self.epsilon)


@dataclass(frozen=True)
class JDGRR(JointMechanism):
    """JD-GRR (Yilmaz et al., the paper's LDP baseline): GRR on the product domain."""

    NAME: ClassVar[str] = "jd-grr"

    def all_cells(self) -> np.ndarray:
        return np.arange(self.nx * self.ny)

    def probabilities(self) -> dict[str, float]:
        a, b, _ = urr_probabilities(self.epsilon, self.nx * self.ny)
        return {"a": a, "b": b}

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(LDP, self.epsilon,
                                notes="GRR on the |X||Y| product domain; tight")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return _product_urr(self, self.memo("product-urr", lambda: _product_tables(
            self, self.all_cells(), self.epsilon)), cols, u)

    def transition_matrix(self) -> np.ndarray:
        self.check_matrix()
        return urr_matrix(self.nx * self.ny, self.all_cells(), self.epsilon)


# --------------------------------------------------------------------------- TDRR
@dataclass(frozen=True)
class TDRR(SensitiveJoint):
    """TDRR (the paper's ULDP baseline): eps/2 per attribute, one-dimensional uRR on each."""

    NAME: ClassVar[str] = "tdrr"

    @property
    def draws(self) -> int:
        return 4

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            ULDP, self.epsilon, params=self._params_note(),
            notes=f"eps/2 + eps/2 by sequential composition; {TWO_D_NOTE}")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        xs, ys = self.sensitive_codes()
        e2 = self.epsilon / 2
        ox = urr_sample(cols["x"], urr_tables(self.nx, xs, e2), xs, u[:, 0], u[:, 1])
        oy = urr_sample(cols["y"], urr_tables(self.ny, ys, e2), ys, u[:, 2], u[:, 3])
        return {"x": ox.astype(np.uint16), "y": oy.astype(np.uint16)}

    def transition_matrix(self) -> np.ndarray:
        self.check_matrix()
        xs, ys = self.sensitive_codes()
        return np.kron(urr_matrix(self.nx, xs, self.epsilon / 2),
                       urr_matrix(self.ny, ys, self.epsilon / 2))


# --------------------------------------------------------------------------- JuRR
def jurr_valid(epsilon: float, sx: int, sy: int) -> bool:
    """Eq. 21: t > 0 iff sx * sy < (e^eps - 1)^2."""
    return sx * sy < math.expm1(epsilon) ** 2


def jurr_min_epsilon(sx: int, sy: int) -> float:
    """The smallest budget JuRR is defined for (exclusive): ln(1 + sqrt(sx sy))."""
    return math.log1p(math.sqrt(sx * sy))


@dataclass(frozen=True)
class JuRR(SensitiveJoint):
    """JuRR (Algorithm 1, Eqs. 11-20): a joint randomized response with four input quadrants.

    Defined only when sx * sy < (e^eps - 1)^2 (Eq. 21) and both attributes have non-sensitive
    labels; otherwise the probability t of keeping a fully non-sensitive pair is not positive and
    the construction is not a mechanism. Such parameters are rejected (the paper plots JuRR at
    eps = 0.5, where for sx = sy = 2 t is about -0.07).
    """

    NAME: ClassVar[str] = "jurr"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sx < self.nx and self.sy < self.ny and not jurr_valid(self.epsilon, self.sx,
                                                                      self.sy):
            raise ParameterError(
                "epsilon", self.epsilon,
                f"sx * sy < (e^epsilon - 1)^2 (Eq. 21), i.e. epsilon > ln(1 + sqrt(sx sy)) = "
                f"{jurr_min_epsilon(self.sx, self.sy):.4f} for sx = {self.sx}, sy = {self.sy}",
                hint=f"otherwise t = {self.probabilities()['t']:.4g} is not a probability")

    def probabilities(self) -> dict[str, float]:
        """a, b, p, q, m, n, t of Eqs. 15-20."""
        e = math.exp(self.epsilon)
        sx, sy = self.sx, self.sy
        d, ee, f = e + sx * sy - 1, e + sx - 1, e + sy - 1
        a, b = e / d, 1 / d
        p, q = (e * e - e) / (d * ee), (e - 1) / (d * ee)
        m, n = (e * e - e) / (d * f), (e - 1) / (d * f)
        return {"a": a, "b": b, "p": p, "q": q, "m": m, "n": n,
                "t": 1 - sx * sy * b - sx * q - sy * n}

    @property
    def guarantee(self) -> PrivacyGuarantee:
        pr = self.probabilities()
        return PrivacyGuarantee(
            ULDP, self.epsilon, params=self._params_note(),
            notes=f"{TWO_D_NOTE}. An (x in X_S, y in Y_N) user reports its true y with "
                  f"probability p + (sx-1) q = {pr['p'] + (self.sx - 1) * pr['q']:.4g} "
                  "(Corollary 1 proves exactly this weaker definition)")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        """Algorithm 1, vectorized per input quadrant (each quadrant's rows handled as one index
        set): u0 picks the branch by its cumulative probability, u1 the cell within it."""
        pr = self.probabilities()
        sx, sy = self.sx, self.sy
        xs, ys = self.sensitive_codes()
        posx, posy = sensitive_positions(self.nx, xs), sensitive_positions(self.ny, ys)
        x, y = cols["x"], cols["y"]
        ox, oy = x.astype(np.uint16), y.astype(np.uint16)  # the report dtype, copied once
        u0, u1 = u[:, 0], u[:, 1]
        ss_mass = sx * sy * pr["b"]
        # 3: X_S x Y_S, 2: X_S x Y_N, 1: X_N x Y_S, 0: X_N x Y_N (two small-table lookups)
        quadrant = (2 * (posx >= 0)).astype(np.int8)[x]
        quadrant += (posy >= 0).astype(np.int8)[y]

        cell_x, cell_y = np.repeat(xs, sy), np.tile(ys, sx)  # protected cell j -> its labels

        def to_protected(i: np.ndarray, skip_own: bool) -> None:
            """Rows i move to a uniform cell of X_S x Y_S (other than their own if skip_own)."""
            j = (u1[i] * (sx * sy - skip_own)).astype(np.int64)  # truncation = floor
            if skip_own:
                j += j >= posx[x[i]] * sy + posy[y[i]]
            np.minimum(j, sx * sy - 1, out=j)
            ox[i], oy[i] = cell_x[j], cell_y[j]

        def other_label(i: np.ndarray, pos, codes: np.ndarray, s: int) -> np.ndarray:
            """Another sensitive label than the row's own (pos(i): its position in codes)."""
            j = (u1[i] * (s - 1)).astype(np.int64)
            return codes[np.minimum(j + (j >= pos(i)), s - 1)]

        i = np.flatnonzero(quadrant == 3)  # keep with a, else another protected cell (b each)
        if sx * sy > 1:
            to_protected(i[u0[i] >= pr["a"]], True)
        for q, keep, pos, codes, s, out in ((2, pr["p"], lambda i: posx[x[i]], xs, sx, ox),
                                            (1, pr["m"], lambda i: posy[y[i]], ys, sy, oy)):
            # one coordinate sensitive: protected block (sx*sy*b), keep (p | m), else the
            # sensitive coordinate moves to another sensitive label (q | n each)
            i = np.flatnonzero(quadrant == q)
            v = u0[i]
            to_protected(i[v < ss_mass], False)
            if s > 1:
                i = i[v >= ss_mass + keep]
                out[i] = other_label(i, pos, codes, s)
        # N x N: protected block, x -> a sensitive label (q each), y -> one (n each), keep (t)
        i = np.flatnonzero(quadrant == 0)
        v = u0[i]
        to_protected(i[v < ss_mass], False)
        cut_x = ss_mass + sx * pr["q"]
        ix = i[(v >= ss_mass) & (v < cut_x)]
        ox[ix] = xs[np.minimum((u1[ix] * sx).astype(np.int64), sx - 1)]
        iy = i[(v >= cut_x) & (v < cut_x + sy * pr["n"])]
        oy[iy] = ys[np.minimum((u1[iy] * sy).astype(np.int64), sy - 1)]
        return {"x": ox, "y": oy}

    def transition_matrix(self) -> np.ndarray:
        self.check_matrix()
        pr = self.probabilities()
        xs, ys = self.sensitive_masks()
        nx, ny = self.nx, self.ny
        q4 = np.zeros((nx, ny, nx, ny))  # [out x, out y, in x, in y]
        ssb = xs[:, None] & ys[None, :]
        for i in range(nx):
            for j in range(ny):
                col = q4[:, :, i, j]
                col[ssb] = pr["b"]
                if xs[i] and ys[j]:
                    col[i, j] = pr["a"]
                elif xs[i]:  # y non-sensitive
                    col[xs, j] = pr["q"]
                    col[i, j] = pr["p"]
                elif ys[j]:
                    col[i, ys] = pr["n"]
                    col[i, j] = pr["m"]
                else:
                    col[xs, j] = pr["q"]
                    col[i, ys] = pr["n"]
                    col[i, j] = pr["t"]
        return q4.reshape(nx * ny, nx * ny)
