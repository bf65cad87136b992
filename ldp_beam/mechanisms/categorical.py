"""One-attribute categorical randomizers: generalized randomized response (GRR) and the
utility-optimized randomized response uRR (Murakami & Kawamoto, "Utility-Optimized Local
Differential Privacy Mechanisms for Distribution Estimation", USENIX Security 2019).

Both are reusable on their own and are the building blocks of the joint family
(:mod:`ldp_beam.mechanisms.joint`): CPRR is uRR on the product domain, JD-GRR is GRR on it, TDRR
runs uRR on each attribute.

Input: a column of labels from the declared ``domain`` (any type; compared as text, see
:func:`ldp_beam.core.category_text`). Report (wire form): ``v`` (uint16), the position of the
reported label in ``domain``; the output domain equals the input domain.

uRR with sensitive set S (|S| = s >= 1) and budget eps, with a = e^eps/(e^eps + s - 1),
b = 1/(e^eps + s - 1), t = (e^eps - 1)/(e^eps + s - 1):

* x in S: report x with probability a, each other label of S with probability b;
* x not in S: report x with probability t (this *reveals* x, which is allowed because x is not
  sensitive), each label of S with probability b.

GRR is uRR with S = the whole domain (then it is eps-LDP).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..core import (Mechanism, Reasons, Reports, Role, check_epsilon, check_labels,
                    check_subset)
from ..errors import ParameterError
from ..limits import check_cap, product
from ..privacy import LDP, ULDP, PrivacyGuarantee

MAX_LABELS = 65535  # codes travel as uint16
CODE = "uint16"


# --------------------------------------------------------------------------- shared pieces
def urr_probabilities(epsilon: float, s: int) -> tuple[float, float, float]:
    """(a, b, t) of uRR with ``s`` sensitive labels: keep a sensitive label, move to one given
    other sensitive label, keep a non-sensitive label."""
    e = math.exp(epsilon)
    den = e + s - 1.0
    return e / den, 1.0 / den, (e - 1.0) / den


def sensitive_positions(k: int, sensitive_codes: np.ndarray) -> np.ndarray:
    """pos[c] = index of code c in ``sensitive_codes`` (-1 when c is not sensitive)."""
    pos = np.full(k, -1, dtype=np.int64)
    pos[sensitive_codes] = np.arange(sensitive_codes.size)
    return pos


def urr_tables(k: int, sens: np.ndarray, epsilon: float) -> tuple[np.ndarray, ...]:
    """Per-label lookup tables of uRR with sensitive codes ``sens`` (in order): the keep
    probability (a or t), how many labels a move chooses among (s - 1 or s), and the position a
    move skips (the label's own position among the sensitive ones; s, i.e. none, otherwise)."""
    a, _, t = urr_probabilities(epsilon, sens.size)
    s = sens.size
    is_s = np.zeros(k, dtype=bool)
    is_s[sens] = True
    skip = np.full(k, s, dtype=np.int64)
    skip[sens] = np.arange(s)
    return np.where(is_s, a, t), np.where(is_s, s - 1.0, float(s)), skip


def urr_sample(codes: np.ndarray, tables: tuple[np.ndarray, ...], sens: np.ndarray,
               u0: np.ndarray, u1: np.ndarray) -> np.ndarray:
    """uRR on integer codes, vectorized: two uniforms per record (keep?, which other label);
    ``tables`` from :func:`urr_tables`. A sensitive label moves to one of the s - 1 *other*
    sensitive labels (drawn among s - 1, skipping its own position); a non-sensitive one to any
    of the s sensitive labels."""
    keep_p, choices, skip = tables
    it = index_type(sens.size)
    if sens.size == keep_p.shape[0]:  # every label sensitive (GRR, JD-GRR): constant tables
        # the same arithmetic without the per-row lookups: choices = s - 1, skip[c] = c and
        # sens[j] = j (sens = 0..s-1), keep_p = a
        s = sens.size
        j = (u1 * choices[0]).astype(it)
        j += j >= codes
        np.minimum(j, s - 1, out=j)
        return np.where(u0 < keep_p[0], codes, j)
    # (take: numpy's fancy indexing costs ~40% more on these small tables)
    j = (u1 * choices.take(codes)).astype(it)  # truncation = floor: u1 * choices >= 0
    j += j >= skip.take(codes)
    np.minimum(j, sens.size - 1, out=j)
    return np.where(u0 < keep_p.take(codes), codes, sens.take(j))


def index_type(size: int) -> type:
    """The integer type of positions below ``size``: int32 where it holds them (a float's
    conversion to int32 costs a quarter of one to int64), else int64. The values are the same."""
    return np.int32 if size <= np.iinfo(np.int32).max else np.int64


def urr_matrix(k: int, sens_codes: np.ndarray, epsilon: float) -> np.ndarray:
    """uRR's transition matrix Q[output, input] (columns sum to one)."""
    a, b, t = urr_probabilities(epsilon, sens_codes.size)
    q = np.zeros((k, k))
    is_s = np.zeros(k, dtype=bool)
    is_s[sens_codes] = True
    q[np.ix_(is_s, np.arange(k))] = b  # every input reaches every sensitive output with b ...
    q[np.flatnonzero(is_s), np.flatnonzero(is_s)] = a  # ... except its own label (a) ...
    ns = np.flatnonzero(~is_s)
    q[ns, ns] = t  # ... and a non-sensitive label reveals itself with t
    return q


def check_domain_size(labels: tuple[str, ...], name: str) -> None:
    if len(labels) > MAX_LABELS:
        raise ParameterError(name, f"{len(labels)} labels", f"at most {MAX_LABELS} labels")


def count_labels(labels: Any) -> int | None:
    """How many labels a declared domain holds, cheaply and before it is validated (so that size
    limits are checked before the O(labels) work of :func:`~ldp_beam.core.check_labels`); None
    when that cannot be told without iterating (a generator: then it is checked after)."""
    if isinstance(labels, str):
        return sum(1 for x in labels.split(",") if x.strip())
    if isinstance(labels, np.ndarray):
        return int(labels.size)
    try:
        return len(labels)
    except TypeError:
        return None


def precheck_domain(labels: Any, name: str) -> None:
    """The wire limit (uint16 codes) on a declared domain, checked before it is validated."""
    n = count_labels(labels)
    if n is not None and n > MAX_LABELS:
        raise ParameterError(name, f"{n} labels", f"at most {MAX_LABELS} labels (codes travel "
                             "as uint16)")


def check_matrix_size(k: int, param: str) -> None:
    """A dense k x k transition matrix is about to be built: k^2 cells within the cells cap."""
    check_cap("cells", product(k, k), f"transition matrix of {param} ({k:,} x {k:,})")


# --------------------------------------------------------------------------- the mechanisms
@dataclass(frozen=True)
class GRR(Mechanism):
    """Generalized randomized response on a declared domain: eps-LDP frequency oracle."""

    NAME: ClassVar[str] = "grr"
    family: ClassVar[str] = "uldp"
    roles: ClassVar[tuple[Role, ...]] = (Role("value", kind="category",
                                              help="a label of the declared domain"),)
    report_fields: ClassVar[tuple] = (("v", CODE),)
    #: frequency: one row per label of the domain, with its consistent (simplex) value
    tidy_cells: ClassVar[tuple[str, ...]] = ("i", "label", "clipped")

    epsilon: float
    domain: tuple[str, ...]

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        precheck_domain(self.domain, "domain")
        object.__setattr__(self, "domain", check_labels(self.domain, "domain", min_size=2))
        check_domain_size(self.domain, "domain")

    def labels(self, role: str = "value") -> tuple[str, ...]:
        return self.domain

    @property
    def sensitive_codes(self) -> np.ndarray:
        return np.arange(len(self.domain))

    @property
    def draws(self) -> int:
        return 2

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(LDP, self.epsilon, notes="GRR: keep/move ratio e^eps; tight")

    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        pass  # domain membership is checked by Mechanism.check for 'category' roles

    def probabilities(self) -> tuple[float, float, float]:
        return urr_probabilities(self.epsilon, self.sensitive_codes.size)

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        sens, *tables = self.memo("urr", self._sampler_tables)
        v = urr_sample(cols["value"], tuple(tables), sens, u[:, 0], u[:, 1])
        return {"v": v.astype(np.uint16)}

    def _sampler_tables(self) -> tuple[np.ndarray, ...]:
        """(sensitive codes, keep probability, choices, skip): what :func:`urr_sample` reads."""
        sens = self.sensitive_codes
        return (sens, *urr_tables(len(self.domain), sens, self.epsilon))

    def transition_matrix(self) -> np.ndarray:
        """Q[output code, input code]; every column sums to one. Dense |domain|^2: for audits
        and tests (checked against the cells cap)."""
        check_matrix_size(len(self.domain), "domain")
        return urr_matrix(len(self.domain), self.sensitive_codes, self.epsilon)


@dataclass(frozen=True)
class URR(GRR):
    """Utility-optimized randomized response uRR, (X_S, eps)-ULDP (Murakami & Kawamoto 2019).

    Sensitive labels get eps-LDP against every other label; a non-sensitive label may be
    reported as itself (revealed)."""

    NAME: ClassVar[str] = "urr"

    sensitive: tuple[str, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "sensitive", check_subset(self.sensitive, "sensitive",
                                                           self.domain, "domain"))

    @property
    def sensitive_codes(self) -> np.ndarray:
        return np.array(sorted(self.domain.index(s) for s in self.sensitive), dtype=np.int64)

    @property
    def guarantee(self) -> PrivacyGuarantee:
        a, b, t = self.probabilities()
        note = ("(X_S, eps)-ULDP (Murakami & Kawamoto 2019): a sensitive label is protected by "
                "eps-LDP against every other label")
        if len(self.sensitive) < len(self.domain):
            note += (f"; a non-sensitive label is reported as itself, i.e. revealed, with "
                     f"probability t = {t:.4g}")
        return PrivacyGuarantee(ULDP, self.epsilon, notes=note,
                                params={"sensitive": list(self.sensitive)})
