"""The three core contracts: Mechanism (client), Estimator (server), Estimate (what is released).

A *mechanism* is a frozen dataclass of validated parameters. It perturbs a whole batch at once:
``perturb(data, rng) -> reports``, where ``data`` is a numpy array (single-column mechanisms) or a
mapping from role name to column, and reports are a dict of equal-length numpy columns whose names
and dtypes are ``report_fields`` (the wire form; ``ldp_beam.transforms`` maps it to Arrow). Each
mechanism consumes exactly ``draws`` uniforms per record, which is what makes seeded runs
independent of batching (see :mod:`ldp_beam.rng`).

An *estimator* folds report batches into a small accumulator (``create/add/merge``) and turns it
into an :class:`Estimate` (``finalize``). Accumulators are numpy arrays whose size does not depend on
the number of users; ``merge`` is a sum, so it is associative and commutative.

Nothing here imports Apache Beam: a device or an ingestion edge needs only this package.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping

import numpy as np

from .errors import EmptyAccumulatorError, InvalidRecordsError, ParameterError
from .privacy import PrivacyGuarantee
from .rng import RngLike, as_source, draw_uniforms

Reports = dict[str, np.ndarray]


# --------------------------------------------------------------------------- parameter checks
def _finite_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float, np.floating, np.integer)) \
        and math.isfinite(v)


def check_epsilon(eps: float, name: str = "epsilon") -> float:
    if not _finite_number(eps) or eps <= 0:
        raise ParameterError(name, eps, "a finite number > 0")
    return float(eps)


#: the valid range of a pair of bounds, as every bounds check states it
INTERVAL_RANGE = ("lower and upper finite with upper - lower finite (at most ~1.8e308: "
                  "the largest float64)")


def check_interval(lower: float, upper: float, lname: str = "lower", uname: str = "upper",
                   reach: float = 0.0, computes: str = "", power: int = 1) -> None:
    """Bounds ``lower < upper``, both finite numbers, whose width ``upper - lower`` is finite
    too (bounds such as -1e308..1e308 are refused: their width overflows, so every scaled
    value, report and estimate would be inf or NaN).

    ``reach`` (>= 0): the mechanism's largest computation in data units is at most
    ``F = max(|lower|, |upper|) + reach * (upper - lower)`` (a noise tail, an unclipped estimate
    ``reach`` widths beyond the bounds); ``2 F**power`` must be finite as well (twice: ``2v``,
    ``lower + upper``; ``power``: the highest power of a data value the mechanism or its
    estimator computes, e.g. 2 for a sum of squares). ``computes`` says what that computation
    is, for the message. Raises :class:`ParameterError` naming the parameter and the valid
    range."""
    for n, v in ((lname, lower), (uname, upper)):
        if not _finite_number(v):
            raise ParameterError(n, v, "a finite number")
    if not lower < upper:
        raise ParameterError(lname, lower, f"a number < {uname} = {upper!r}")
    lo, hi = float(lower), float(upper)
    width = hi - lo
    if not math.isfinite(width):
        raise ParameterError(f"{lname}, {uname}", (lower, upper),
                             INTERVAL_RANGE.replace("lower", lname).replace("upper", uname),
                             f"{uname} - {lname} = {width!r} overflows")
    big = max(abs(lo), abs(hi))
    far = big + float(reach) * width
    limit = (sys.float_info.max / 2) ** (1.0 / power)
    if not (math.isfinite(far) and far <= limit):
        what = f" ({computes})" if computes else ""
        span = f" + {float(reach):.4g} ({uname} - {lname})" if reach else ""
        raise ParameterError(
            f"{lname}, {uname}", (lower, upper),
            f"bounds with max(|{lname}|, |{uname}|){span} at most {limit:.3g}, so that the "
            f"mechanism's computations stay finite{what}",
            f"they would reach {far!r}; narrow the bounds" + (" or raise epsilon" if reach
                                                             else ""))


def check_choice(value: str, name: str, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ParameterError(name, value, f"one of {choices}")


# --------------------------------------------------------------------------- input columns
@dataclass(frozen=True)
class Role:
    """One input column a mechanism reads: its role name, whether it must be mapped, its kind."""

    name: str
    required: bool = True
    kind: str = "numeric"  # 'numeric' (float, NaN = missing) or 'category' (declared labels -> codes)
    help: str = ""


def coerce_numeric(raw: Any) -> tuple[np.ndarray, np.ndarray]:
    """Column -> (float64 values with NaN for missing, mask of non-numeric entries).

    Numeric dtypes convert directly; strings or objects are parsed; ``None``/NaN and the empty
    string become NaN and are *missing*, not non-numeric (an empty CSV cell, an empty Parquet
    string and ``""`` in a Python array are the same missing answer). Any other text that is not
    a number is non-numeric, ``"NaN"``, ``"n/a"`` and ``"None"`` included: text is never a
    missing value here (a reader may map chosen tokens to null before, see ``null_values`` of
    :class:`~ldp_beam.transforms.ReadTable`). Booleans are not numbers here.
    """
    arr = np.asarray(raw).reshape(-1)
    if arr.dtype.kind in "iuf":
        return arr.astype(np.float64, copy=False), np.zeros(arr.shape[0], dtype=bool)
    # lazy: pandas costs 280 ms at import (measured); the device client (ldp_beam.client) imports
    # this module and needs pandas only for values that are not numbers
    import pandas as pd

    ser = pd.Series(arr, dtype=object)
    kind = ser.map(_value_kind).to_numpy(dtype=np.int8)  # one pass: 1 boolean, 2 empty text
    isbool, empty = kind == 1, kind == 2
    vals = pd.to_numeric(ser.where(~(isbool | empty), None), errors="coerce"
                         ).to_numpy(dtype=np.float64)
    present = ser.notna().to_numpy(dtype=bool) & ~empty
    return vals, (present & np.isnan(vals)) | isbool


def _value_kind(x: Any) -> int:
    if isinstance(x, (bool, np.bool_)):
        return 1
    return 2 if isinstance(x, str) and x == "" else 0


def category_text(value: Any) -> str | None:
    """The canonical text of a category label (None for a missing value: None, NaN or the empty
    string, as an empty CSV cell is): labels are compared as text, so ``3``, ``3.0``,
    ``np.int8(3)`` and ``"3"`` are the same category; booleans stay ``"True"``/``"False"``; any
    other text, ``"NA"`` included, is a label."""
    if value is None or (isinstance(value, str) and value == ""):
        return None
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return None
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def check_labels(labels: Any, name: str, min_size: int = 1) -> tuple[str, ...]:
    """Validate a declared category domain: a non-empty sequence of distinct labels (a
    comma-separated string is split). Returns the canonical labels (see :func:`category_text`)."""
    items = _label_items(labels, name)
    labels = items if isinstance(labels, str) else labels  # (the value the errors show)
    out = tuple(category_text(v) for v in items)
    if any(v is None or v == "" for v in out):
        raise ParameterError(name, labels, "labels that are not null or empty")
    if len(out) < min_size:
        raise ParameterError(name, labels, f"at least {min_size} label(s)")
    if len(set(out)) != len(out):
        dup = sorted(v for v, c in collections.Counter(out).items() if c > 1)
        raise ParameterError(name, labels, f"distinct labels (repeated: {dup})")
    return out


def _label_items(labels: Any, name: str) -> list:
    if isinstance(labels, str):
        return [x.strip() for x in labels.split(",") if x.strip()]
    try:
        return list(labels)
    except TypeError:
        raise ParameterError(name, labels, "a sequence of category labels") from None


def check_subset(subset: Any, name: str, domain: tuple[str, ...], domain_name: str,
                 min_size: int = 1) -> tuple[str, ...]:
    """Validate a subset of a declared domain (e.g. the sensitive categories)."""
    items = _label_items(subset, name)
    subset = items if isinstance(subset, str) else subset
    out = check_labels(items, name, min_size=0) if items else ()
    if len(out) < min_size:
        raise ParameterError(name, subset, f"at least {min_size} label(s) of {domain_name}")
    extra = [v for v in out if v not in domain]
    if extra:
        raise ParameterError(name, subset, f"a subset of {domain_name} = {list(domain)} "
                             f"(not in it: {extra})")
    return out


def encode_categories(values: Any, labels: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray,
                                                                      np.ndarray]:
    """Map a column of labels to codes ``0..len(labels)-1`` (the order of ``labels``).

    Returns ``(codes, missing, unknown)``: ``codes`` is int64 with -1 where the value is missing
    (None/NaN, the empty text) or not a declared label; the two masks say which. Labels compare
    as text (:func:`category_text`); the result is always that of
    :func:`encode_categories_reference`, computed faster where the column's type allows:

    * integer columns (and integral floats, e.g. a nullable integer column read as float): a
      direct lookup table over the range of the integer labels (a sorted search when that range
      is wide), no text conversion;
    * Arrow string columns: one hash lookup per row against the labels
      (``pyarrow.compute.index_in``); Arrow dictionary columns: each dictionary entry once;
    * anything else (objects, booleans, non-integral floats): factorized once, so the cost is
      one hash per row plus one :func:`category_text` per distinct value.
    """
    if _is_arrow(values):
        return _encode_arrow(values, labels)
    arr = np.asarray(values).reshape(-1)
    if arr.dtype.kind in "iu":
        codes = _encode_ints(arr, labels)
        return codes, np.zeros(arr.shape[0], dtype=bool), codes < 0
    if arr.dtype.kind == "f":
        return _encode_floats(arr, labels)
    return encode_categories_reference(arr, labels)


def encode_categories_reference(values: Any, labels: tuple[str, ...]
                                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference semantics of :func:`encode_categories`: every distinct value through
    :func:`category_text` (factorized once). The fast paths must agree with it exactly."""
    arr = np.asarray(values).reshape(-1)
    index = {lab: i for i, lab in enumerate(labels)}
    import pandas as pd  # lazy: pandas, 280 ms at import (measured; see coerce_numeric)

    fcodes, uniques = pd.factorize(arr, use_na_sentinel=True)
    texts = [category_text(u) for u in uniques]
    lookup = np.array([-2 if t is None else index.get(t, -1) for t in texts] + [-2],
                      dtype=np.int64)
    codes = lookup[fcodes]  # fcodes == -1 (NA) indexes the trailing -2
    missing = codes == -2
    unknown = codes == -1
    codes[missing] = -1
    return codes, missing, unknown


_LOOKUP_SPAN = 1 << 16  # integer labels spanning at most this many values: a lookup table


def _int_keys(labels: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(integer value, code) of the labels that are the text of an integer in int64's range."""
    known = [(int(lab), i) for i, lab in enumerate(labels) if _is_int_text(lab)]
    known = [(k, i) for k, i in known if -(1 << 63) <= k < (1 << 63)]
    return (np.array([k for k, _ in known], dtype=np.int64),
            np.array([i for _, i in known], dtype=np.int64))


def _encode_ints(arr: np.ndarray, labels: tuple[str, ...]) -> np.ndarray:
    """Codes of an integer array (-1: not a label). An integer's text is ``str(int(v))``, so it
    can only match labels that are integer texts."""
    n = arr.shape[0]
    keys, vals = _int_keys(labels)
    if keys.size == 0 or n == 0:
        return np.full(n, -1, dtype=np.int64)
    big = None
    if arr.dtype == np.uint64:  # values above int64's range match no label
        big = arr > np.uint64((1 << 63) - 1)
        a = arr.view(np.int64)
    else:
        a = arr.astype(np.int64, copy=False)
    lo, hi = int(keys.min()), int(keys.max())
    if hi - lo < _LOOKUP_SPAN:
        # off = (v - lo) mod 2^64 is below span exactly for v in [lo, hi] (v, lo, hi in int64's
        # range); every other value lands on the table's last slot (-1)
        span = hi - lo + 1
        table = np.full(span + 1, -1, dtype=np.int64)
        table[keys - lo] = vals
        off = np.subtract(a, np.int64(lo)).view(np.uint64)
        np.minimum(off, np.uint64(span), out=off)
        codes = table[off]
    else:
        order = np.argsort(keys)
        keys, vals = keys[order], vals[order]
        pos = np.searchsorted(keys, a)
        np.minimum(pos, keys.size - 1, out=pos)
        hit = keys[pos] == a
        codes = np.where(hit, vals[pos], -1)
    if big is not None and big.any():
        codes[big] = -1
    return codes


_EXACT_INT_FLOAT = float(1 << 53)


def _encode_floats(arr: np.ndarray, labels: tuple[str, ...]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Floats: NaN is missing; an integral value v with |v| <= 2^53 has the text ``str(int(v))``
    (``-0.0`` included: "0"), so it is looked up as an integer; the other values (fractions,
    huge or infinite ones) go through the reference, once per distinct value."""
    x = arr.astype(np.float64, copy=False)
    missing = np.isnan(x)
    with np.errstate(invalid="ignore"):
        integral = (np.abs(x) <= _EXACT_INT_FLOAT) & (np.floor(x) == x)
    rest = ~(integral | missing)
    if integral.all():
        codes = _encode_ints(x.astype(np.int64), labels)
    else:
        codes = np.full(x.shape[0], -1, dtype=np.int64)
        idx = np.flatnonzero(integral)
        if idx.size:
            codes[idx] = _encode_ints(x[idx].astype(np.int64), labels)
        idx = np.flatnonzero(rest)
        if idx.size:
            codes[idx] = encode_categories_reference(x[idx], labels)[0]
    unknown = (codes < 0) & ~missing
    return codes, missing, unknown


def _is_arrow(values: Any) -> bool:
    mod = type(values).__module__
    return mod.startswith("pyarrow") and hasattr(values, "type") and hasattr(values, "null_count")


def _encode_arrow(col: Any, labels: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray,
                                                             np.ndarray]:
    """An Arrow array or chunked array: strings by one hash lookup per row, dictionaries by
    their entries, integers and floats as numpy, anything else as Python values."""
    # lazy: pyarrow and pyarrow.compute cost 100 ms at import (measured); the device client
    # imports this module, and an Arrow column comes only from a caller that loaded pyarrow
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = col.type
    n = len(col)
    if pa.types.is_dictionary(t):
        dcodes, dmissing, _ = encode_categories(col.dictionary, labels)
        ind = col.indices
        if not ind.null_count and (dcodes >= 0).all():  # every entry a declared label
            # (indexing, not ndarray.take: 4x faster with int32 indices)
            return (dcodes[ind.to_numpy(zero_copy_only=False)], np.zeros(n, dtype=bool),
                    np.zeros(n, dtype=bool))
        table = np.append(np.where(dmissing, -2, dcodes), -2)  # last slot: a null index
        idx = ind.fill_null(len(dcodes)) if ind.null_count else ind
        codes = table[idx.to_numpy(zero_copy_only=False)]
        missing = codes == -2
        codes[missing] = -1
        return codes, missing, (codes < 0) & ~missing
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        found = pc.index_in(col, value_set=_label_array(labels, t))
        if not found.null_count:  # every row a declared label: nothing missing or unknown
            return (found.to_numpy(zero_copy_only=False).astype(np.int64),
                    np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))
        found = found.fill_null(-1)  # unknown labels or nulls: -1
        codes = found.to_numpy(zero_copy_only=False).astype(np.int64)
        missing = np.zeros(n, dtype=bool)
        bad = np.flatnonzero(codes < 0)
        if bad.size:  # null or "" is a missing value, any other text an unknown label
            sub = col.take(pa.array(bad))
            empty = pc.equal(sub, "").fill_null(True).to_numpy(zero_copy_only=False)
            missing[bad] = empty
        return codes, missing, (codes < 0) & ~missing
    if pa.types.is_integer(t):
        if col.null_count:
            missing = col.is_null().to_numpy(zero_copy_only=False)
            codes = _encode_ints(col.fill_null(0).to_numpy(zero_copy_only=False), labels)
            codes[missing] = -1
            return codes, missing, (codes < 0) & ~missing
        codes = _encode_ints(col.to_numpy(zero_copy_only=False), labels)
        return codes, np.zeros(n, dtype=bool), codes < 0
    if pa.types.is_floating(t):
        return _encode_floats(col.to_numpy(zero_copy_only=False), labels)
    return encode_categories_reference(_arrow_numpy(col), labels)  # (as Python objects)


@functools.lru_cache(maxsize=64)
def _label_array(labels: tuple[str, ...], t: Any) -> Any:
    """The declared labels as an Arrow array of text type ``t`` (the value set of a lookup),
    made once per domain instead of once per batch."""
    import pyarrow as pa  # lazy: pyarrow (see _encode_arrow)

    return pa.array(list(labels), type=t)


def _arrow_numpy(col: Any) -> np.ndarray:
    """An Arrow column as numpy the way the Beam layer reads one (numbers with nulls as NaN,
    anything else as Python objects with nulls as None)."""
    import pyarrow as pa  # lazy: pyarrow (see _encode_arrow)

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    out = col.to_numpy(zero_copy_only=False)
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        return out.astype(np.float64, copy=False) if col.null_count else out
    return out if out.dtype == object else out.astype(object)


def _is_table(data: Any) -> bool:
    """A pandas DataFrame or a pyarrow Table / RecordBatch (mapped by role)."""
    mod = type(data).__module__
    return (mod.startswith("pandas") and hasattr(data, "iloc")) or \
        (mod.startswith("pyarrow") and hasattr(data, "column_names"))


def _as_column(values: Any, kind: str | None) -> Any:
    """A role's input column: numpy, or an Arrow array kept as is for a 'category' role (read
    by :func:`encode_categories` without converting every string to a Python object)."""
    if _is_arrow(values):
        return values if kind == "category" else _arrow_numpy(values)
    return np.asarray(values)


#: a value quoted in a reason (a dead letter's "why") shows at most this many characters: the
#: same cap as a dead-lettered record's text cells (``transforms.perturb.RECORD_TEXT_CHARS``),
#: so a 20 MB cell does not become a 20 MB reason
QUOTED_VALUE_CHARS = 2000
#: a whole reason is at most this many characters (:meth:`Reasons.flag` cuts a longer one, e.g.
#: a message built by a plugin, and says so)
REASON_CHARS = 8 * QUOTED_VALUE_CHARS


def quote_value(v: Any, limit: int = QUOTED_VALUE_CHARS) -> str:
    """``repr(v)`` for a reason, at most ``limit`` characters of it: a longer text (or bytes)
    shows its first ``limit`` characters and says how long it is,
    ``'abc...'... (20,000,000 characters)``; the text is cut before it is quoted (no copy of a
    huge cell is made)."""
    if isinstance(v, (str, bytes)) and len(v) > limit:
        unit = "characters" if isinstance(v, str) else "bytes"
        head = str(v[:limit]) if isinstance(v, str) else bytes(v[:limit])
        return f"{head!r}... ({len(v):,} {unit})"
    r = repr(v)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r):,} characters)"


def cap_reason(reason: str, limit: int = REASON_CHARS) -> str:
    """A reason cut to ``limit`` characters, saying so when it was cut."""
    if len(reason) <= limit:
        return reason
    return f"{reason[:limit]}... (reason cut: {len(reason):,} characters)"


def value_at(column: Any, i: int) -> Any:
    """Row ``i`` of a column as a Python/numpy value (an Arrow scalar as its Python value)."""
    v = column[i]
    return v.as_py() if _is_arrow(column) else v


def _is_int_text(s: str) -> bool:
    try:
        return str(int(s)) == s
    except ValueError:
        return False


class Reasons:
    """Collects one reason per invalid row, built only for the rows that fail (vectorized checks)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.bad = np.zeros(n, dtype=bool)
        self._msg: dict[int, str] = {}

    def flag(self, mask: np.ndarray, message: Any, replace: bool = False) -> None:
        """Mark rows in ``mask``; ``message`` is a str or ``f(row) -> str``. A row keeps its first
        reason unless ``replace`` (for a reason that explains the others, e.g. an absent field)."""
        mask = np.asarray(mask, dtype=bool)
        if not mask.any():  # the common case: nothing to flag (one pass)
            return
        new = np.flatnonzero(mask if replace else mask & ~self.bad)
        if new.size == 0:
            return
        self.bad[new] = True
        if not callable(message):
            self._msg.update(dict.fromkeys(new.tolist(), cap_reason(str(message))))
            return
        for i in new.tolist():
            self._msg[i] = cap_reason(message(i))

    def as_dict(self) -> dict[int, str]:
        return dict(sorted(self._msg.items()))

    def array(self) -> np.ndarray:
        out = np.full(self.n, None, dtype=object)
        out[list(self._msg)] = list(self._msg.values())
        return out


# --------------------------------------------------------------------------- the mechanism
class Configured(ABC):
    """What a client mechanism and a central release share: frozen validated parameters, input
    roles, and ``check`` (coerce the input columns, flag invalid rows with their reasons).
    Subclasses are frozen dataclasses validated in ``__post_init__``."""

    family: ClassVar[str] = ""
    roles: ClassVar[tuple[Role, ...]] = (Role("value"),)
    report_fields: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: The tidy table's cell columns (:mod:`ldp_beam.transforms.sinks`) this family's statistics
    #: fill, among ``i``, ``j``, ``label``, ``x_label``, ``y_label``, ``bin_low``, ``bin_high``,
    #: ``grid_x``, ``probability``, ``value_text`` and ``clipped``. With the core columns (and
    #: the group or window columns of a grouped or streamed output) they make the family's tidy
    #: schema, the same whatever the data, so a table appended to run after run keeps its
    #: columns. ``None`` (the default: a plugin that declares nothing) means every cell column.
    #: A row that fills a cell column its family does not declare is refused when the table is
    #: built, never dropped. A subclass inherits its base's declaration; every built-in family's
    #: is listed in docs/guides/outputs.md (a test keeps the two equal).
    tidy_cells: ClassVar[tuple[str, ...] | None] = None

    @property
    @abstractmethod
    def guarantee(self) -> PrivacyGuarantee:
        """The privacy promise, stated as we can defend it (and for which unit)."""

    @property
    @abstractmethod
    def draws(self) -> int:
        """Uniforms consumed per record (fixed, so seeded runs do not depend on batching)."""

    @abstractmethod
    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        """Flag rows of already-coerced columns that cannot be used."""

    @abstractmethod
    def rows(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        """What the Beam layer emits for valid rows, given an ``(n, draws)`` array of uniforms:
        a mechanism's reports (:meth:`Mechanism.randomize`) or a central release's encoded true
        values (:meth:`CentralRelease.prepare`)."""

    def labels(self, role: str) -> tuple[str, ...]:
        """The declared labels of a 'category' role (codes are positions in this tuple)."""
        raise NotImplementedError(f"{type(self).__name__} declares no domain for role {role!r}")

    # -- shared behaviour
    @property
    def name(self) -> str:
        return type(self).registry_name()

    @classmethod
    def registry_name(cls) -> str:
        return getattr(cls, "NAME", cls.__name__.lower())

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore

    def columns(self, data: Any, roles: Mapping[str, str] | None = None) -> dict[str, np.ndarray]:
        """The input columns by role, from a 1-D array (the first role), a mapping role ->
        column, or a table (a pandas DataFrame or a pyarrow Table) of any number of columns,
        mapped by role: ``roles`` (role -> column name) where given, else the column named
        after each role; its other columns are ignored."""
        if _is_table(data):
            data = self._table_columns(data, roles)
        elif roles:
            raise ParameterError("roles", dict(roles), "a mapping for a table input (a pandas "
                                 "DataFrame or a pyarrow Table); give an array or a mapping "
                                 "role -> column otherwise")
        elif not isinstance(data, Mapping):
            data = {self.roles[0].name: data}
        kinds = {r.name: r.kind for r in self.roles}
        cols = {k: _as_column(v, kinds.get(k)) for k, v in data.items()}
        known = {r.name for r in self.roles}
        unknown = set(cols) - known
        if unknown:
            raise ParameterError("columns", sorted(unknown), f"roles among {sorted(known)}")
        for r in self.roles:
            if r.required and r.name not in cols:
                raise ParameterError("columns", sorted(cols), f"a column for role {r.name!r}")
        lens = {len(v) for v in cols.values()}
        if len(lens) > 1:
            raise ParameterError("columns", {k: len(v) for k, v in cols.items()}, "equal lengths")
        return cols

    def _table_columns(self, table: Any, roles: Mapping[str, str] | None) -> dict[str, Any]:
        names = [str(c) for c in (table.columns if hasattr(table, "iloc")
                                  else table.column_names)]
        known = {r.name for r in self.roles}
        mapping = dict(roles or {})
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise ParameterError("roles", unknown, f"roles among {sorted(known)}")
        for r in self.roles:
            if r.name not in mapping and r.name in names:
                mapping[r.name] = r.name
        absent = sorted(c for c in mapping.values() if c not in names)
        if absent:
            raise ParameterError("roles", absent, f"columns of the table: {names}")
        for r in self.roles:
            if r.required and r.name not in mapping:
                raise ParameterError(
                    "roles", dict(mapping), f"a column for role {r.name!r}: name one with "
                    f"roles={{{r.name!r}: COLUMN}} (the table's columns: {names})")
        if hasattr(table, "iloc"):  # pandas
            return {role: table[col].to_numpy() for role, col in mapping.items()}
        return {role: table.column(col) for role, col in mapping.items()}

    def check(self, data: Any, roles: Mapping[str, str] | None = None
              ) -> tuple[dict[str, np.ndarray], Reasons]:
        """Coerce the input columns (see :meth:`columns`) and find invalid rows. Returns
        (columns, reasons)."""
        cols = self.columns(data, roles)
        n = len(next(iter(cols.values()))) if cols else 0
        reasons = Reasons(n)
        out: dict[str, np.ndarray] = {}
        for r in self.roles:
            if r.name not in cols:
                continue
            if r.kind == "numeric":
                vals, nonnum = coerce_numeric(cols[r.name])
                reasons.flag(nonnum, lambda i, c=cols[r.name], nm=r.name:
                             f"{nm}: non-numeric value {quote_value(c[i])}")
                out[r.name] = vals
            else:
                labels = self.labels(r.name)
                raw = cols[r.name]
                codes, missing, unknown = encode_categories(raw, labels)
                shown = list(labels) if len(labels) <= 12 else list(labels[:12]) + ["..."]
                reasons.flag(missing, f"{r.name}: missing value (a category of the declared "
                             "domain is required)")
                reasons.flag(unknown, lambda i, c=raw, nm=r.name, lb=shown:
                             f"{nm}: {quote_value(value_at(c, i))} is not in the declared "
                             f"domain {lb}")
                out[r.name] = codes
        self.validate(out, reasons)
        return out, reasons

    def empty_reports(self) -> Reports:
        return {name: np.empty(0, dtype=dt) for name, dt in self.report_fields}

    def memo(self, name: str, make: Callable[[], Any]) -> Any:
        """A value derived from this (frozen) mechanism's parameters, e.g. a sampler's lookup
        tables, made once per instance by ``make()``: ``randomize`` runs once per slice of a
        batch (:class:`~ldp_beam.transforms.PerturbFn`), so its fixed cost counts. Arrays are
        made read-only (shared by every call). Not pickled: a copy makes its own."""
        cache = self.__dict__.get("_memo")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_memo", cache)  # frozen: not a field, never compared
        try:
            return cache[name]
        except KeyError:
            value = make()
            for v in (value if isinstance(value, tuple) else (value,)):
                if isinstance(v, np.ndarray):
                    v.flags.writeable = False
            cache[name] = value
            return value

    def __getstate__(self) -> Any:
        state = super().__getstate__()  # (slots of a plugin's subclass included)
        if isinstance(state, dict) and "_memo" in state:
            state = {k: v for k, v in state.items() if k != "_memo"}
        return state

    def describe(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{self.name}({ps})"


class Mechanism(Configured):
    """Client-side randomizer: turns true values into reports (LDP), each carrying
    :attr:`guarantee` on its own."""

    @abstractmethod
    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        """Perturb valid rows given an ``(n, draws)`` array of uniforms. Vectorized."""

    def rows(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return self.randomize(cols, u)

    def perturb(self, data: Any, rng: RngLike = None, *, stream: int | None = None,
                offset: int | None = None, roles: Mapping[str, str] | None = None,
                on_invalid: str = "raise") -> Any:
        """Perturb a batch: an array, a mapping role -> column, or a table mapped by role (see
        :meth:`columns`; ``roles``: role -> column name).

        ``on_invalid="raise"`` (the default): raises :class:`InvalidRecordsError` if any row is
        invalid, perturbing nothing. ``on_invalid="return"``: returns ``(reports, dead)``, the
        reports of the valid rows (in input order) and ``dead``, ``{row index: reason}`` of the
        others, so one bad row does not stop a batch (nothing is dropped silently: every input
        row is in one of the two).

        ``rng``: None (OS entropy), a seed, a :class:`~ldp_beam.rng.RandomSource` or a numpy
        Generator. ``stream``/``offset`` key the records for seeded, batch-independent noise.
        """
        check_choice(on_invalid, "on_invalid", ("raise", "return"))
        cols, reasons = self.check(data, roles)
        bad = reasons.bad
        if on_invalid == "raise" and bad.any():
            raise InvalidRecordsError(reasons.as_dict(), reasons.n)
        if not bad.any():
            out = self.perturb_valid(cols, rng, stream=stream, offset=offset)
            return out if on_invalid == "raise" else (out, {})
        if bad.all():
            return self.empty_reports(), reasons.as_dict()
        ok = ~bad
        valid = {k: (v[ok] if isinstance(v, np.ndarray) else v.filter(ok)) for k, v in
                 cols.items()}
        return self.perturb_valid(valid, rng, stream=stream, offset=offset), reasons.as_dict()

    def perturb_valid(self, cols: dict[str, np.ndarray], rng: RngLike = None, *,
                      stream: int | None = None, offset: int | None = None) -> Reports:
        n = len(next(iter(cols.values())))
        u = draw_uniforms(as_source(rng), n, self.draws, stream=stream, offset=offset)
        return self.randomize(cols, u)



class CentralRelease(Configured):
    """Curator-side (central DP) release: the curator sees true values. ``check`` validates raw
    records, :meth:`prepare` encodes the valid ones for the accumulator (no noise: e.g. bucket
    codes), the paired estimator (:meth:`estimator`) folds them into a small mergeable
    accumulator and releases once, adding noise from a :class:`~ldp_beam.rng.RandomSource`
    addressed by the accumulator (and the partition key of a per-key release), returning the
    same :class:`Estimate` as an LDP estimator. Nothing is released per record, so a release
    is not a :class:`Mechanism`: it has no ``randomize`` and no reports a device could send.

    ``draws``: uniforms per record for curator-side randomness that depends on the record
    (0 for most; sampling releases draw per record, keyed so a retry draws the same)."""

    @property
    def draws(self) -> int:
        return 0

    @abstractmethod
    def prepare(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        """Encode valid rows' true values as the accumulator's input (``report_fields``)."""

    def rows(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return self.prepare(cols, u)

    def records(self, data: Any, rng: RngLike = None) -> Reports:
        """Check and encode a batch (curator side). Raises :class:`InvalidRecordsError` if any
        row is invalid."""
        cols, reasons = self.check(data)
        if reasons.bad.any():
            raise InvalidRecordsError(reasons.as_dict(), reasons.n)
        n = len(next(iter(cols.values())))
        return self.prepare(cols, draw_uniforms(as_source(rng), n, self.draws))

    def estimator(self, **options: Any) -> "Estimator":
        """The estimator that accumulates and releases (registered with this release)."""
        # lazy: the registry imports every family's module; a release built by hand needs it
        # only when it asks for its estimator
        from .registry import get_registry

        return get_registry().estimator_for(self, **options)


# --------------------------------------------------------------------------- the release
#: normal quantiles of the default interval levels: scipy.special.ndtri(0.5 + level / 2), the
#: value scipy.stats.norm.ppf returns, so writing an estimate imports no scipy (scipy.stats cost
#: ~0.7 s of every `ldp-beam estimate`); tests/test_core_contracts.py checks them against scipy
_Z = {0.95: 1.959963984540054}


@dataclass(frozen=True)
class Statistic:
    """One released number (or array): the raw value, its standard error and, where the raw
    value can leave its valid range, a post-processed ``clipped`` value (privacy-free).

    The raw value is the mechanism's estimator before any post-processing into range. It is
    unbiased where it is linear in the noise: counts, sums and frequencies (noise of mean 0 added
    to, or debiased from, the exact statistic). A ratio of noisy quantities (a mean S/N, a
    variance Q/N - (S/N)^2, a coefficient of variation) is consistent but biased at small n, by
    O(noise variance / n^2): e.g. ``central-variance`` is low by about Var(noise of S) / n^2 from
    the squared mean alone, and the noisy denominator adds a term of the same order that depends
    on the unknown data, so no free correction removes the bias. ``clipped`` is biased wherever
    the clipping binds."""

    value: Any
    stderr: Any = None
    clipped: Any = None
    note: str = ""
    #: the declared range of the estimand, where the mechanism declares one (a mean: [lower,
    #: upper]; a frequency: [0, 1]); None where it has none. A group whose interval is wider
    #: than half of it says nothing useful (see :meth:`Estimate.uninformative`).
    domain: tuple[float, float] | None = None

    def ci(self, level: float = 0.95) -> tuple[float, float] | None:
        """Normal-approximation confidence interval, or None where no standard error exists."""
        if self.stderr is None or self.value is None:
            return None
        z = _Z.get(level)
        if z is None:
            # lazy: scipy.special costs 210 ms at import (measured), only for a level other
            # than 0.95; ndtri is what scipy.stats.norm.ppf computes, lighter
            from scipy.special import ndtri

            z = float(ndtri(0.5 + level / 2))
        return (self.value - z * self.stderr, self.value + z * self.stderr)

    def to_dict(self) -> dict:
        def j(x: Any) -> Any:
            if isinstance(x, np.ndarray):
                return x.tolist()
            if isinstance(x, (np.floating, np.integer)):
                return x.item()
            return x

        d = {"value": j(self.value), "stderr": j(self.stderr), "clipped": j(self.clipped)}
        ci = self.ci() if np.ndim(self.value) == 0 else None
        if ci is not None:
            d["ci95"] = [float(ci[0]), float(ci[1])]
        if self.note:
            d["note"] = self.note
        return d


@dataclass(frozen=True)
class Estimate:
    """What finalize releases: statistics, the number of reports and the guarantee they carry.

    ``curator``: exact counts for the curator's bookkeeping that must NOT be published (they
    are statistics of the private data), e.g. a central release's ``values_clipped``. They are
    left out of :meth:`to_dict` (what is published) unless asked for with
    ``to_dict(curator=True)``, which puts them under the key ``"curator"`` for a pipeline to
    move into its curator file."""

    mechanism: str
    n_reports: int | None  # None for central-DP releases: the exact record count is not released
    statistics: dict[str, Statistic]
    guarantee: PrivacyGuarantee
    params: dict = field(default_factory=dict)
    curator: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> Statistic:
        try:
            return self.statistics[name]
        except KeyError:
            raise KeyError(f"no statistic {name!r}; available: {sorted(self.statistics)}") from None

    def uninformative(self, level: float = 0.95) -> str | None:
        """Why this estimate says nothing useful, or None: the first statistic with a declared
        domain whose CI half-width (at ``level``, largest over its cells) exceeds half of the
        domain's width, i.e. whose interval is wider than the whole range it estimates in. A
        function of the released statistics only (post-processing: no privacy cost)."""
        for name, st in self.statistics.items():
            if st.domain is None or st.stderr is None or st.value is None:
                continue
            se = np.asarray(st.stderr, dtype=float)
            if se.size == 0 or not np.isfinite(se).all():
                continue
            lo, hi = st.domain
            ci = st.ci(level)
            half = float(np.max((np.asarray(ci[1], dtype=float) - np.asarray(ci[0], dtype=float))
                                / 2))
            if half > (hi - lo) / 2:
                return (f"{name}: the {level:.0%} CI half-width {half:.3g} exceeds half of the "
                        f"declared domain [{lo:g}, {hi:g}] ({(hi - lo) / 2:g}): too few "
                        f"reports{'' if self.n_reports is None else f' ({self.n_reports})'} for "
                        "this epsilon")
        return None

    def with_design_effect(self, k: int, why: str) -> "Estimate":
        """Standard errors widened by sqrt(k), for reports that come up to ``k`` at a time from
        one privacy unit. Reports of one unit may be correlated in any way, and for a sum of k
        terms Var(X_1 + ... + X_k) <= k (Var X_1 + ... + Var X_k) (Cauchy-Schwarz), so a linear
        estimator's variance is at most k times the variance computed as if all reports were
        independent (to first order, the delta method's linearization, for the others): a
        conservative standard error, exact when k = 1."""
        if k <= 1:
            return self
        f = math.sqrt(k)
        stats = {}
        for name, st in self.statistics.items():
            se = None if st.stderr is None else np.asarray(st.stderr, dtype=float) * f
            if se is not None and se.ndim == 0:
                se = float(se)
            note = (st.note + " " if st.note else "") + \
                f"stderr x sqrt({k}): {why} (conservative)"
            stats[name] = dataclasses.replace(st, stderr=se, note=note)
        return dataclasses.replace(self, statistics=stats)

    def to_dict(self, curator: bool = False) -> dict:
        """The estimate as JSON-ready data; ``curator=True`` adds the curator-only counts under
        ``"curator"`` (only when there are some), which a release must remove before it is
        published."""
        out = {"mechanism": self.mechanism, "n_reports": self.n_reports,
               "params": {k: (list(v) if isinstance(v, tuple) else v)
                          for k, v in self.params.items()},
               "guarantee": self.guarantee.to_dict(),
               "statistics": {k: s.to_dict() for k, s in self.statistics.items()}}
        if curator and self.curator:
            out["curator"] = dict(self.curator)
        return out

    def to_frame(self) -> Any:
        """The statistics as a pandas DataFrame, one row per statistic and cell, in the order of
        :attr:`statistics` (a cell's order: by index, row by row for a matrix). Columns:

        ``statistic``  the statistic's name (``mean``, ``frequency``, ``joint``, ...)
        ``cell``       None for a scalar; for a vector its label where the parameters name one
                       (``domain``/``categories``, ``x_domain`` for ``marginal_x``, ``y_domain``
                       for ``marginal_y``), a histogram bucket's interval where the parameters
                       give ``bucket_edges`` (a :class:`pandas.Interval`, ``[low, high)``, the
                       last bucket ``[low, high]``), else its index ``i``; for a matrix
                       ``(x label, y label)`` where ``x_domain``/``y_domain`` give them, else
                       ``(i, j)``
        ``value``      the raw value (see :class:`Statistic`) as a float (a boolean as
                       1.0/0.0), or the text of a text statistic (e.g. ``method``; the column
                       is then of object dtype)
        ``stderr``     its standard error, NaN where there is none
        ``ci_low``, ``ci_high``  the normal 95% interval value -/+ 1.96 stderr (for a scalar
                       :meth:`Statistic.ci`), NaN without a standard error
        ``clipped``    the post-processed value (e.g. projected into its valid range) where the
                       estimator gives one, else NaN

        The guarantee, ``n_reports`` and the parameters are not repeated in the rows; they are
        in ``frame.attrs`` (``mechanism``, ``n_reports``, ``guarantee``: its one-line
        description). Post-processing of the released statistics: no privacy cost. Needs pandas
        (a dependency of ldp-beam; imported here, not by the core)."""
        import pandas as pd  # lazy: the core stays light for a device

        z = _Z[0.95]

        def num(x: Any) -> Any:
            if x is None:
                return math.nan
            if isinstance(x, (bool, np.bool_, int, float, np.integer, np.floating)):
                return float(x)
            return x  # text

        def at(a: np.ndarray, idx: Any) -> Any:
            x = a[idx]
            return x.item() if isinstance(x, (np.generic, np.ndarray)) else x

        def labels(name: str, n: int) -> list | None:
            key = ("x_domain" if name == "marginal_x" else "y_domain" if name == "marginal_y"
                   else None)
            for k in ((key,) if key else ("domain", "categories")):
                seq = self.params.get(k)
                if isinstance(seq, (list, tuple)) and len(seq) == n:
                    return [str(v) for v in seq]
            edges = self.params.get("bucket_edges")
            if key is None and isinstance(edges, (list, tuple)) and len(edges) == n + 1:
                return [pd.Interval(float(edges[k]), float(edges[k + 1]),
                                    closed="both" if k == n - 1 else "left") for k in range(n)]
            return None

        rows: list[dict] = []
        for name, st in self.statistics.items():
            value = st.value if not isinstance(st.value, (list, tuple)) else np.asarray(st.value)
            arr = np.asarray(value) if isinstance(value, np.ndarray) else None
            if arr is None or arr.ndim == 0:
                v = num(at(arr, ()) if arr is not None else value)
                se = num(None if st.stderr is None else np.asarray(st.stderr).item())
                ci = st.ci() if isinstance(v, float) and not math.isnan(se) else None
                rows.append({"statistic": name, "cell": None, "value": v, "stderr": se,
                             "ci_low": ci[0] if ci else math.nan,
                             "ci_high": ci[1] if ci else math.nan,
                             "clipped": num(None if st.clipped is None
                                            else np.asarray(st.clipped).item())})
                continue
            if arr.ndim > 2:
                raise ValueError(f"statistic {name!r} has {arr.ndim} dimensions; to_frame takes "
                                 "scalars, vectors and matrices")
            se_arr = None if st.stderr is None else np.broadcast_to(
                np.asarray(st.stderr, dtype=float), arr.shape)
            cl_arr = None if st.clipped is None else np.asarray(st.clipped)
            if arr.ndim == 1:
                labs = labels(name, arr.shape[0])
                cells = [((i,), labs[i] if labs else i) for i in range(arr.shape[0])]
            else:
                xl, yl = self.params.get("x_domain"), self.params.get("y_domain")
                named = (isinstance(xl, (list, tuple)) and len(xl) == arr.shape[0]
                         and isinstance(yl, (list, tuple)) and len(yl) == arr.shape[1])
                cells = [((i, j), (str(xl[i]), str(yl[j])) if named else (i, j))
                         for i in range(arr.shape[0]) for j in range(arr.shape[1])]
            for idx, cell in cells:
                v = num(at(arr, idx))
                se = math.nan if se_arr is None else float(se_arr[idx])
                ok = isinstance(v, float) and math.isfinite(v) and math.isfinite(se)
                c = num(at(cl_arr, idx)) if cl_arr is not None and cl_arr.shape == arr.shape \
                    else math.nan
                rows.append({"statistic": name, "cell": cell, "value": v, "stderr": se,
                             "ci_low": v - z * se if ok else math.nan,
                             "ci_high": v + z * se if ok else math.nan, "clipped": c})
        cols = ["statistic", "cell", "value", "stderr", "ci_low", "ci_high", "clipped"]
        frame = pd.DataFrame({c: pd.Series([r[c] for r in rows], dtype=(
            object if c in ("cell", "value") else str if c == "statistic" else float))
            for c in cols}, columns=cols)
        if frame["value"].map(lambda x: isinstance(x, float)).all():
            frame["value"] = frame["value"].astype(float)
        frame.attrs.update({"mechanism": self.mechanism, "n_reports": self.n_reports,
                            "guarantee": self.guarantee.describe()})
        return frame


# --------------------------------------------------------------------------- the estimator
class Estimator(ABC):
    """Server-side: ``create() -> acc``, ``add(acc, reports) -> acc``, ``merge(accs) -> acc``,
    ``finalize(acc) -> Estimate``. Built from the mechanism whose reports it reads."""

    def __init__(self, mechanism: Mechanism) -> None:
        self.mechanism = mechanism

    @abstractmethod
    def create(self) -> np.ndarray: ...

    @abstractmethod
    def add(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray: ...

    def merge(self, accs: Iterable[np.ndarray]) -> np.ndarray:
        accs = list(accs)
        if not accs:
            return self.create()
        return np.sum(np.stack(accs), axis=0)

    @abstractmethod
    def n_reports(self, acc: np.ndarray) -> int: ...

    @abstractmethod
    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]: ...

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        """Find malformed reports (telemetry from untrusted clients): missing fields, bad codes.
        ``n`` is the number of reports (needed when ``reports`` holds no field at all)."""
        if n is None:
            n = len(next(iter(reports.values()))) if reports else 0
        reasons = Reasons(n)
        for name, _ in self.mechanism.report_fields:
            if name not in reports:
                reasons.flag(np.ones(n, dtype=bool), f"report field {name!r} is missing")
        return reasons

    def finalize(self, acc: np.ndarray) -> Estimate:
        n = self.n_reports(acc)
        if n == 0:
            raise EmptyAccumulatorError(f"{self.mechanism.name}: no reports were accumulated; "
                                        "an estimate needs at least one report")
        return Estimate(self.mechanism.name, n, self.statistics(acc),
                        self.mechanism.guarantee, self.mechanism.params())

    def estimate(self, reports: Mapping[str, np.ndarray]) -> Estimate:
        """Convenience: create, add one batch, finalize."""
        return self.finalize(self.add(self.create(), reports))


class CountEstimator(Estimator):
    """Estimators whose accumulator is a vector of cell counts (int64): ``cells(reports)`` maps
    each report to a cell code in ``[0, n_cells)``; add is a bincount, merge a sum (exact)."""

    n_cells: int = 0

    def create(self) -> np.ndarray:
        return np.zeros(self.n_cells, dtype=np.int64)

    @abstractmethod
    def cells(self, reports: Mapping[str, np.ndarray]) -> np.ndarray: ...

    def add(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        codes = np.asarray(self.cells(reports), dtype=np.int64)
        if codes.size:
            bad = codes.max() >= self.n_cells
            if not bad:
                try:
                    counts = np.bincount(codes, minlength=self.n_cells)
                except ValueError:  # a negative code
                    bad = True
            if bad:
                raise ValueError(f"{self.mechanism.name}: report codes outside [0, {self.n_cells})"
                                 " — validate reports with check_reports() first")
            acc += counts
        return acc

    def n_reports(self, acc: np.ndarray) -> int:
        return int(acc.sum())


def sum_of_squares(y: np.ndarray, out: np.ndarray | None = None) -> float:
    """sum(y * y) by numpy's pairwise summation (``out``: a spare buffer of y's shape).

    Not ``np.dot(y, y)``: a BLAS call, which OpenBLAS spreads over its threads; on a busy
    machine (or one process per core, as Beam's workers are) their hand-offs cost ~15 ms for
    65,536 values instead of ~50 us, and the rounding of the sum would follow the thread count.
    """
    return float(np.multiply(y, y, out=out).sum())


class MomentEstimator(Estimator):
    """Estimators of a mean from real-valued reports: accumulator ``[n, sum, sum of squares]``.

    Float sums are associative only up to rounding: splits and merge orders agree to within
    ``n * 2**-52 * sum|x|`` (the tests check that bound), not bit for bit.
    """

    value_field: str = "y"

    def create(self) -> np.ndarray:
        return np.zeros(3, dtype=np.float64)

    def add(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        y = np.asarray(reports[self.value_field], dtype=np.float64)
        acc += (y.size, y.sum(), sum_of_squares(y))
        return acc

    def n_reports(self, acc: np.ndarray) -> int:
        return int(round(acc[0]))
