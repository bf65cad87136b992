"""Batches as they travel through the Beam layer, and their conversions to core columns.

Elements a :class:`~ldp_beam.transforms.Perturb` accepts:

* ``KeyedBatch(stream, offset, table)``: a pyarrow RecordBatch/Table whose row ``i`` is record
  ``offset + i`` of stream ``stream`` (what :class:`~ldp_beam.transforms.ReadTable` emits). The
  stable key makes seeded perturbation independent of batching and runners.
* a bare ``pyarrow.RecordBatch``/``Table`` (e.g. from ``ReadFromParquetBatched``) or a dict of
  equal-length numpy arrays: fast, but only for unseeded (OS-entropy) runs;
* a dict of scalars: one telemetry record (the element path).

Report batches are ``pyarrow.RecordBatch`` with the mechanism's ``report_fields`` (the documented
Arrow schema, see :func:`report_schema`) plus any passthrough columns.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ldp_beam import __version__
from ldp_beam.bounding import whole_numbers
from ldp_beam.core import Mechanism
from ldp_beam.errors import InvalidRecordsError
from ldp_beam.privacy import run_guarantee
from ldp_beam.jsonio import dumps

SCHEMA_KEY = b"ldp_beam"


@dataclass(frozen=True)
class EstimateFailure:
    """What ``EstimatorCombineFn(on_empty="report")`` emits when no estimate is possible."""

    mechanism: str
    n_reports: int
    reason: str


@dataclass(frozen=True, eq=False)
class KeyedBatch:
    """Rows of one stream with their identities: row ``i`` of ``table`` is record ``offset + i``
    of ``stream``, or record ``rows[i]`` when ``rows`` (int64, increasing) is given — a subset
    of a stream's records, e.g. after bounding each privacy unit's contribution."""

    stream: int
    offset: int
    table: Any  # pa.RecordBatch | pa.Table
    source: str = ""
    rows: Any = None  # np.ndarray of record numbers, or None: offset + arange(num_rows)
    #: text columns the reader also has as Arrow dictionaries: name -> (the table's column as
    #: read, the same values dictionary-encoded); see :meth:`dictionary`. A hint only: not
    #: pickled, not compared, and ignored once the table's column is another array.
    coded: Any = field(default=None, compare=False, repr=False)

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def dictionary(self, name: str, column: Any) -> Any:
        """The dictionary-encoded form of ``column`` (column ``name`` of this batch's table, as
        the caller read it) if the reader gave one for that very array (same buffers, offset
        and length: Arrow arrays are immutable, so the same values), else None."""
        pair = (self.coded or {}).get(name)
        if pair is None or not isinstance(column, pa.Array):
            return None
        plain, encoded = pair
        if column.type != plain.type or len(column) != len(plain) or \
                column.offset != plain.offset:
            return None
        mine, theirs = column.buffers(), plain.buffers()
        if len(mine) != len(theirs) or any(
                (a is None) != (b is None) or (a is not None and (a.address != b.address
                                                                  or a.size != b.size))
                for a, b in zip(mine, theirs)):
            return None
        return encoded

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("coded", None)  # a hint for the fused step after the reader, not data
        return state

    def record_ids(self) -> np.ndarray:
        """The record number of every row."""
        if self.rows is not None:
            return np.asarray(self.rows, dtype=np.int64)
        return self.offset + np.arange(self.table.num_rows, dtype=np.int64)

    def subset(self, idx: np.ndarray) -> "KeyedBatch":
        """The rows at positions ``idx`` (increasing), keeping their identities."""
        idx = np.asarray(idx, dtype=np.int64)
        return KeyedBatch(self.stream, self.offset, self.table.take(pa.array(idx)), self.source,
                          self.record_ids()[idx])


def is_batch(element: Any) -> bool:
    if isinstance(element, (KeyedBatch, pa.RecordBatch, pa.Table)):
        return True
    return isinstance(element, Mapping) and bool(element) and all(
        isinstance(v, np.ndarray) and v.ndim == 1 for v in element.values())


def num_rows(element: Any) -> int:
    if isinstance(element, (KeyedBatch, pa.RecordBatch, pa.Table)):
        return element.num_rows
    if isinstance(element, Mapping):
        vals = list(element.values())
        return len(vals[0]) if vals and isinstance(vals[0], np.ndarray) else 1
    raise TypeError(f"not a batch or record: {type(element).__name__}")


def column_names(table: Any) -> list[str]:
    if isinstance(table, (pa.RecordBatch, pa.Table)):
        return list(table.schema.names)
    return list(table.keys())


def get_column(table: Any, name: str) -> np.ndarray:
    """A column as numpy (nulls become NaN for numbers, None for objects)."""
    if isinstance(table, (pa.RecordBatch, pa.Table)):
        col = table.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks()
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
            if col.null_count:
                return col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
            return col.to_numpy(zero_copy_only=False)
        out = col.to_numpy(zero_copy_only=False)  # strings, dates, ...: objects, nulls as None
        return out if out.dtype == object else out.astype(object)
    return np.asarray(table[name])


def key_text(table: Any, name: str) -> pa.Array:
    """Column ``name`` as the text a grouping key is known by (``--by``), whatever its type:
    numbers in decimal (an integral float as its integer, by the rule unit ids follow,
    :func:`~ldp_beam.bounding.whole_numbers`: ``1``, ``1.0`` and ``"1"`` are one key even where
    a null turned pandas' integers into floats), other values as Arrow writes them, a null or a
    float NaN as ``""``. Bounding (its partition codes) and the release (its groups) both key on
    this text, so one key is one partition and one group."""
    if isinstance(table, (pa.RecordBatch, pa.Table)):
        col = table.column(name)
    else:
        col = pa.array(np.asarray(table[name]), from_pandas=True)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    text = col if pa.types.is_string(col.type) else pc.cast(col, pa.string())
    if pa.types.is_floating(col.type):
        v = col.to_numpy(zero_copy_only=False)  # nulls as NaN
        whole = whole_numbers(v)
        if whole.any():
            ints = pc.cast(pa.array(np.where(whole, v, 0).astype(np.int64)), pa.string())
            text = pc.if_else(pa.array(whole), ints, text)
        nan = np.isnan(v)
        if nan.any():
            text = pc.if_else(pa.array(nan), pa.scalar("", pa.string()), text)
    return text.fill_null("")


def row_dict(table: Any, i: int, columns: list[str] | None = None) -> dict:
    """Row ``i`` (only ``columns`` when given) as a JSON-friendly dict (for dead letters)."""
    if isinstance(table, (pa.RecordBatch, pa.Table)):
        if columns is not None:
            table = table.select(columns)
        return table.slice(i, 1).to_pylist()[0]
    names = list(table) if columns is None else columns
    return {k: (table[k][i].item() if hasattr(table[k][i], "item") else table[k][i])
            for k in names}


def take(table: Any, idx: np.ndarray) -> Any:
    if isinstance(table, (pa.RecordBatch, pa.Table)):
        return table.take(pa.array(idx))
    return {k: np.asarray(v)[idx] for k, v in table.items()}


def report_schema(mechanism: Mechanism, passthrough: pa.Schema | None = None,
                  seeded: bool = False, privacy_unit: dict | None = None,
                  run_id: str | None = None) -> pa.Schema:
    """The Arrow schema of report batches, with the mechanism and its parameters in metadata.

    ``privacy_unit``: ``{"column", "max_reports_per_unit"}`` when each unit sent at most that
    many reports (the column's values are never written; estimates read k from here).
    ``seeded``: the reports were drawn from a caller's seed; the metadata then says so
    (``"seeded": true`` and a guarantee summary saying the reports are not private). Passthrough
    columns are listed as ``public_columns``: copied unprotected, declared public by the caller.
    ``run_id``: the run that wrote the reports (``collect`` records it, so ``estimate`` can tie a
    reports file to the manifest that committed it).
    """
    fields = [pa.field(name, pa.from_numpy_dtype(np.dtype(dt)), nullable=False)
              for name, dt in mechanism.report_fields] + list(passthrough or [])
    public = [f.name for f in passthrough or []]
    unit = (privacy_unit or {}).get("column")
    k = (privacy_unit or {}).get("max_reports_per_unit", 1)
    meta = {"mechanism": mechanism.name, "params": mechanism.params(),
            "guarantee": run_guarantee(mechanism.guarantee, seeded=seeded, public=public,
                                       unit=unit, bounds=k if unit else None),
            "seeded": bool(seeded), "public_columns": public,
            "privacy_unit": privacy_unit, "ldp_beam_version": __version__}
    if run_id is not None:
        meta["run_id"] = str(run_id)
    return pa.schema(fields, metadata={SCHEMA_KEY: dumps(meta, sort_keys=False).encode()})


def mechanism_metadata(schema: pa.Schema) -> dict | None:
    meta = schema.metadata or {}
    raw = meta.get(SCHEMA_KEY)
    return json.loads(raw) if raw else None


def reports_batch(reports: Mapping[str, np.ndarray], schema: pa.Schema,
                  passthrough: Any = None) -> pa.RecordBatch:
    arrays = []
    for f in schema:
        if f.name in reports:
            arrays.append(pa.array(reports[f.name], type=f.type))
        else:
            col = passthrough.column(f.name) if isinstance(passthrough, (pa.RecordBatch, pa.Table)) \
                else pa.array(passthrough[f.name])
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            arrays.append(col.cast(f.type) if col.type != f.type else col)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# --------------------------------------------------------------------------- report fields
# Reports from CSV or JSON arrive as text; from Parquet or the Python API as numbers of any dtype.
# Each value is validated against the declared dtype of its report field *before* any cast:
# nothing is cast that would change it ("x" -> 0, "1.5" -> 1, "65536" -> 0 for uint16).
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NON_FINITE_TEXT = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_PLAIN_INT = r"^-?[0-9]+$"  # what the vectorized path hands to pyarrow's integer parser
_PLAIN_NUMBER = r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"


@dataclass
class FieldCheck:
    """A report field checked against its declared dtype: ``values`` (that dtype; 0 where
    ``bad``), ``bad`` (rows that cannot be that dtype) and ``reasons`` (row -> why)."""

    values: np.ndarray
    bad: np.ndarray
    reasons: dict[int, str]


def _shown(v: Any) -> str:
    if isinstance(v, np.generic):
        v = v.item()
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _dtype_range(dt: np.dtype) -> str:
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return f"{dt.name} [{info.min}, {info.max}]"
    info = np.finfo(dt)
    return f"{dt.name} (finite, magnitude at most {float(info.max):.4g})"


def _integer(v: Any, n: Any, dt: np.dtype) -> tuple[Any, str | None]:
    """:func:`report_value` of ``v``, whose integral value is ``n``, for integer dtype ``dt``."""
    info = np.iinfo(dt)
    if not info.min <= n <= info.max:
        return None, f"{_shown(v)} is out of range for {_dtype_range(dt)}"
    return int(n), None


def report_value(v: Any, dt: np.dtype) -> tuple[Any, str | None]:
    """One report value -> ``(value of dtype dt, None)`` or ``(None, why it is not one)``.

    The reference semantics of report validation (the vectorized paths agree with it, and the
    tests check that): None, NaN and the empty text are a missing value; booleans are not
    numbers; text is a decimal number (surrounding spaces allowed) or invalid. An integer field
    takes an integral value within its dtype's range (``"3"``, ``"3.0"`` and ``"3e0"`` are 3;
    ``"1.5"``, ``"x"``, ``"inf"`` and ``"65536"`` for uint16 are invalid); a float field takes a
    finite number whose conversion to its dtype is finite.
    """
    integer = dt.kind in "iu"
    what = "an integer" if integer else "a number"
    if isinstance(v, bytes):
        try:
            v = v.decode("utf-8")
        except UnicodeDecodeError:
            return None, f"{_shown(v)} is not {what} (bytes that are not UTF-8 text)"
    if v is None or (isinstance(v, str) and v == ""):
        return None, "missing value"
    if isinstance(v, (bool, np.bool_)):
        return None, f"{_shown(v)} is a boolean, not {what}"
    if isinstance(v, str):
        s = v.strip()
        if _NUMBER_TEXT.fullmatch(s):
            if integer:
                d = Decimal(s)
                if d != d.to_integral_value():
                    return None, f"{_shown(v)} is not an integer"
                return _integer(v, d, dt)
            x = float(s)
            if not np.isfinite(x):  # e.g. "1e400": a number, but beyond any float
                return None, f"{_shown(v)} is out of range for {_dtype_range(dt)}"
        elif _NON_FINITE_TEXT.fullmatch(s):
            return None, f"{_shown(v)} is not {'an integer' if integer else 'a finite number'}"
        else:
            return None, f"{_shown(v)} is not {what}"
    elif isinstance(v, (int, np.integer)):
        if integer:
            return _integer(v, int(v), dt)
        try:
            x = float(v)
        except OverflowError:
            return None, f"{_shown(v)} is out of range for {_dtype_range(dt)}"
    elif isinstance(v, (float, np.floating)):
        x = float(v)
        if np.isnan(x):
            return None, "missing value"
        if integer:
            if not np.isfinite(x) or not x.is_integer():
                return None, f"{_shown(v)} is not an integer"
            return _integer(v, int(x), dt)
    else:
        return None, f"{_shown(v)} ({type(v).__name__}) is not {what}"
    if not np.isfinite(x):
        return None, f"{_shown(v)} is not a finite number"
    with np.errstate(over="ignore"):
        y = dt.type(x)
    if not np.isfinite(y):
        return None, f"{_shown(v)} is out of range for {_dtype_range(dt)}"
    return y, None


def _check_objects(values: Any, name: str, dt: np.dtype) -> FieldCheck:
    """The reference path: every distinct value through :func:`report_value` once."""
    vals = list(values)
    out = np.zeros(len(vals), dtype=dt)
    bad = np.zeros(len(vals), dtype=bool)
    reasons: dict[int, str] = {}
    memo: dict = {}
    for i, v in enumerate(vals):
        try:
            key = (type(v), v)
            hit = memo.get(key)
        except TypeError:  # unhashable
            key, hit = None, None
        if hit is None:
            hit = report_value(v, dt)
            if key is not None and not (isinstance(v, float) and v != v):
                memo[key] = hit
        val, why = hit
        if why is None:
            out[i] = val
        else:
            bad[i] = True
            reasons[i] = f"report field {name!r}: {why}"
    return FieldCheck(out, bad, reasons)


def _check_numeric(arr: np.ndarray, missing: np.ndarray | None, name: str,
                   dt: np.dtype) -> FieldCheck:
    """Vectorized for numeric arrays; the reasons come from :func:`report_value`."""
    n = arr.shape[0]
    if missing is None and arr.dtype == dt and dt.kind in "iu":  # already the declared type
        return FieldCheck(arr, np.zeros(n, dtype=bool), {})
    if arr.dtype.kind in "iu":
        ok = np.ones(n, dtype=bool)
        if dt.kind in "iu":
            src, dst = np.iinfo(arr.dtype), np.iinfo(dt)
            lo, hi = max(src.min, dst.min), min(src.max, dst.max)
            if lo > src.min:
                ok &= arr >= np.asarray(lo, dtype=arr.dtype)
            if hi < src.max:
                ok &= arr <= np.asarray(hi, dtype=arr.dtype)
        else:
            with np.errstate(over="ignore"):
                ok &= np.isfinite(arr.astype(dt))
    else:  # floating
        with np.errstate(invalid="ignore", over="ignore"):
            if dt.kind in "iu":
                info = np.iinfo(dt)
                # bounds as exact floats: min and max + 1 are powers of two (or 0)
                ok = (np.isfinite(arr) & (arr >= float(info.min)) & (arr < float(info.max + 1))
                      & (np.floor(arr) == arr))
            else:
                ok = np.isfinite(arr.astype(dt))
    if missing is not None:
        ok &= ~missing
    if ok.all():  # the common case: one cast (none when the dtype is already the declared one)
        return FieldCheck(arr.astype(dt, copy=False), np.zeros(n, dtype=bool), {})
    bad = ~ok
    out = np.zeros(n, dtype=dt)
    with np.errstate(invalid="ignore", over="ignore"):
        out[ok] = arr[ok].astype(dt)
    reasons: dict[int, str] = {}
    for i in np.flatnonzero(bad).tolist():
        v = None if missing is not None and missing[i] else arr[i]
        reasons[i] = f"report field {name!r}: {report_value(v, dt)[1]}"
    return FieldCheck(out, bad, reasons)


def _check_arrow(col: Any, name: str, dt: np.dtype) -> FieldCheck:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        missing = col.is_null().to_numpy(zero_copy_only=False) if col.null_count else None
        arr = (col.fill_null(0) if col.null_count else col).to_numpy(zero_copy_only=False)
        return _check_numeric(arr, missing, name, dt)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _check_text(col, name, dt)
    return _check_objects(col.to_pylist(), name, dt)


def _check_text(col: pa.Array, name: str, dt: np.dtype) -> FieldCheck:
    """Text: well-formed numbers go through pyarrow's parsers at once (exact for integers,
    correctly rounded for floats, as Python's are), everything else through the reference
    :func:`report_value`, once per distinct text."""
    n = len(col)
    values = np.zeros(n, dtype=dt)
    handled = np.zeros(n, dtype=bool)
    integer = dt.kind in "iu"
    plain = pc.match_substring_regex(col, _PLAIN_INT if integer else _PLAIN_NUMBER)
    plain = plain.fill_null(False).to_numpy(zero_copy_only=False)
    if plain.any():
        idx = np.flatnonzero(plain)
        sub = col.take(pa.array(idx)) if idx.size < n else col
        try:
            if integer:
                values[idx] = sub.cast(pa.from_numpy_dtype(dt)).to_numpy(zero_copy_only=False)
                handled[idx] = True
            else:
                with np.errstate(over="ignore"):
                    y = sub.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(dt)
                fin = np.isfinite(y)
                values[idx[fin]] = y[fin]
                handled[idx[fin]] = True
        except pa.ArrowInvalid:  # e.g. an integer out of range: the reference path says so
            pass
    bad = np.zeros(n, dtype=bool)
    reasons: dict[int, str] = {}
    if handled.all():
        return FieldCheck(values, bad, reasons)
    rest = np.flatnonzero(~handled)
    enc = col.take(pa.array(rest)).dictionary_encode()
    uniq = _check_objects(enc.dictionary.to_pylist(), name, dt)
    missing = enc.indices.is_null().to_numpy(zero_copy_only=False)
    codes = enc.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    for j, i in enumerate(rest.tolist()):
        if missing[j]:
            bad[i], reasons[i] = True, f"report field {name!r}: missing value"
        elif uniq.bad[codes[j]]:
            bad[i], reasons[i] = True, uniq.reasons[int(codes[j])]
        else:
            values[i] = uniq.values[codes[j]]
    return FieldCheck(values, bad, reasons)


def check_report_field(raw: Any, name: str, dtype: Any) -> FieldCheck:
    """Validate one report field against its declared dtype before any cast (see
    :func:`report_value` for what is valid). ``raw``: an Arrow array, a numpy array or a
    sequence of Python values."""
    dt = np.dtype(dtype)
    if isinstance(raw, (pa.Array, pa.ChunkedArray)):
        return _check_arrow(raw, name, dt)
    if isinstance(raw, (list, tuple)):  # values as they are (one may be a list or an array)
        return _check_objects(raw, name, dt)
    arr = np.asarray(raw)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    if arr.dtype.kind in "iu" or arr.dtype.kind == "f":
        missing = np.isnan(arr) if arr.dtype.kind == "f" else None
        return _check_numeric(arr, missing, name, dt)
    return _check_objects(arr.tolist() if arr.dtype.kind != "O" else arr, name, dt)


def report_field_columns(element: Any, fields: tuple) -> tuple[dict[str, Any], int]:
    """The raw report-field columns of a report batch or single report (only the fields it
    has) and its number of reports."""
    if isinstance(element, KeyedBatch):
        element = element.table
    if isinstance(element, (pa.RecordBatch, pa.Table)):
        return ({name: element.column(name) for name, _ in fields
                 if name in element.schema.names}, element.num_rows)
    if not isinstance(element, Mapping) and hasattr(element, "_asdict"):  # beam.Row, NamedTuple
        element = element._asdict()
    elif not isinstance(element, Mapping) and hasattr(element, "as_dict"):
        element = element.as_dict()
    if isinstance(element, Mapping):
        if is_batch(element):
            return ({name: element[name] for name, _ in fields if name in element},
                    num_rows(element))
        return {name: [element[name]] for name, _ in fields if name in element}, 1
    raise TypeError(f"cannot read reports from a {type(element).__name__}")


def report_columns(element: Any, fields: tuple) -> dict[str, np.ndarray]:
    """Report fields of a report batch / single report as numpy columns of the declared dtypes.

    Reports read from CSV or JSON arrive as text, others as numbers of any dtype: each value is
    checked against its field's dtype first (:func:`check_report_field`) and cast only when the
    cast keeps it. Raises :class:`~ldp_beam.errors.InvalidRecordsError` naming the rows that
    cannot be cast (dead-letter them first with
    :class:`~ldp_beam.transforms.ValidateReports`): nothing is cast that would change it."""
    raw, n = report_field_columns(element, fields)
    dtypes = dict(fields)
    cols: dict[str, np.ndarray] = {}
    reasons: dict[int, str] = {}
    for name, col in raw.items():
        chk = check_report_field(col, name, dtypes[name])
        for i, why in chk.reasons.items():
            reasons.setdefault(i, why)
        cols[name] = chk.values
    if reasons:
        raise InvalidRecordsError(dict(sorted(reasons.items())), n)
    return cols
