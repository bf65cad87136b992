"""Schema'd elements in and out of the Beam layer: ``beam.Row``, NamedTuple rows, pandas frames.

* :func:`as_record`: a ``beam.Row`` or a NamedTuple instance (including the ``BeamSchema_...``
  types Beam generates when it decodes schema'd rows) as a plain dict, the single-record form
  :class:`~ldp_beam.transforms.Perturb` takes;
* :func:`as_arrow`: a pandas DataFrame as a bare Arrow table (a batch keyed by its content);
* :func:`report_row_type` / :class:`ReportsAsRows`: reports as ``beam.Row`` elements of a schema
  with the mechanism's report fields (and kept columns), what ``Perturb(..., output="rows")``
  emits, so reports flow into any schema-aware sink or Beam SQL;
* :class:`EstimatesAsRows`: estimates (``Estimate``, ``EstimateFailure`` or ``(key, estimate)``
  pairs from EstimateGlobally / EstimatePerKey) as schema'd rows, one per scalar statistic and
  one per cell of an array statistic (with its flat ``index``).
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Mapping, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.typehints.schemas import named_fields_from_element_type

from ldp_beam.core import Estimate, Mechanism

from .batches import EstimateFailure, is_batch


def as_record(element: Any) -> dict | None:
    """The fields of a ``beam.Row`` or NamedTuple as a dict (a schema'd row of a Beam user);
    None for anything else."""
    if isinstance(element, beam.Row):
        return dict(element.as_dict())
    if isinstance(element, tuple) and hasattr(element, "_asdict") and \
            hasattr(type(element), "_fields"):
        return dict(element._asdict())
    return None


def is_dataframe(element: Any) -> bool:
    pd = sys.modules.get("pandas")  # never imported here: a DataFrame means it is loaded
    return pd is not None and isinstance(element, pd.DataFrame)


def as_arrow(frame: Any) -> pa.Table:
    """A pandas DataFrame as an Arrow table (its index dropped: row positions identify rows)."""
    return pa.Table.from_pandas(frame, preserve_index=False)


# --------------------------------------------------------------------------- report rows
def dtype_type(dtype: Any) -> type:
    """The Python type of a schema field holding values of a numpy dtype."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return bool
    if dt.kind in "iu":
        return int  # int64 in the Beam schema; report codes are small
    if dt.kind == "f":
        return float
    if dt.kind in "US":
        return str if dt.kind == "U" else bytes
    raise TypeError(f"no Beam schema type for report dtype {dt}")


def arrow_type(t: pa.DataType) -> type:
    """The Python type of a schema field holding values of an Arrow type."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return bool
    if pa.types.is_integer(t):
        return int
    if pa.types.is_floating(t):
        return float
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return str
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes
    raise TypeError(f"no Beam schema type for Arrow type {t}")


def report_row_type(mechanism: Mechanism,
                    kept: Iterable[tuple[str, Any]] = ()) -> RowTypeConstraint:
    """The schema of report rows: the mechanism's report fields (never null) then the kept
    columns with their given types."""
    fields = [(name, dtype_type(dt)) for name, dt in mechanism.report_fields]
    fields += list(kept)
    return RowTypeConstraint.from_fields(fields)


def kept_types(keep: tuple[str, ...], element_type: Any = None,
               passthrough: pa.Schema | None = None) -> list[tuple[str, Any]]:
    """The schema types of kept columns: from ``passthrough`` (an Arrow schema), else from the
    input PCollection's schema. Raises ValueError when neither says."""
    if not keep:
        return []
    if passthrough is not None:
        out = []
        for c in keep:
            f = passthrough.field(c)
            t = arrow_type(f.type)
            out.append((c, Optional[t] if f.nullable else t))
        return out
    try:
        named = dict(named_fields_from_element_type(element_type))
    except Exception:  # noqa: BLE001 - not a schema'd type (Any, a batch, a dict)
        named = {}
    missing = [c for c in keep if c not in named]
    if missing:
        raise ValueError(
            f"output='rows' with keep={list(keep)}: the type of kept column {missing[0]!r} is "
            "unknown; give passthrough_schema (an Arrow schema of the kept columns) or a "
            "schema'd input PCollection (beam.Row or NamedTuple elements) that has it")
    return [(c, named[c]) for c in keep]


class ReportsAsRows(beam.DoFn):
    """Report batches (Arrow or dicts of arrays) and single reports (dicts) -> ``beam.Row`` per
    report with the fields ``names``, in that order."""

    def __init__(self, names: list[str]) -> None:
        self.names = list(names)

    def process(self, element: Any):
        names = self.names
        if isinstance(element, (pa.RecordBatch, pa.Table)):
            cols = {c: element.column(c).to_pylist() for c in names}
            n = element.num_rows
        elif isinstance(element, Mapping) and is_batch(element):
            cols = {c: np.asarray(element[c]).tolist() for c in names}
            n = len(next(iter(cols.values()))) if cols else 0
        else:
            yield beam.Row(**{c: _plain(element[c]) for c in names})
            return
        for i in range(n):
            yield beam.Row(**{c: cols[c][i] for c in names})


def _plain(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v


# --------------------------------------------------------------------------- estimate rows
ESTIMATE_ROW = RowTypeConstraint.from_fields([
    ("key", Optional[str]), ("mechanism", str), ("statistic", Optional[str]),
    ("index", Optional[int]), ("value", Optional[float]), ("stderr", Optional[float]),
    ("n_reports", Optional[int]), ("guarantee", Optional[str]), ("error", Optional[str])])


def _num(x: Any) -> float | None:
    if x is None:
        return None
    return float(x)


def estimate_rows(element: Any) -> list[beam.Row]:
    """One estimate (or ``(key, estimate)``) -> its rows (see :class:`EstimatesAsRows`)."""
    key = None
    if isinstance(element, tuple) and len(element) == 2 and \
            not isinstance(element, (Estimate, EstimateFailure)):
        key, element = element
        key = None if key is None else str(key)
    if isinstance(element, EstimateFailure):
        return [beam.Row(key=key, mechanism=element.mechanism, statistic=None, index=None,
                         value=None, stderr=None, n_reports=int(element.n_reports),
                         guarantee=None, error=element.reason)]
    if not isinstance(element, Estimate):
        raise TypeError(f"EstimatesAsRows: expected an Estimate, an EstimateFailure or a (key, "
                        f"estimate) pair, got {type(element).__name__}")
    g = element.guarantee.describe() if element.guarantee is not None else None
    n = None if element.n_reports is None else int(element.n_reports)
    rows = []
    for name, st in element.statistics.items():
        value = st.value
        if value is None or np.ndim(value) == 0:
            se = st.stderr
            rows.append(beam.Row(key=key, mechanism=element.mechanism, statistic=name,
                                 index=None, value=_num(value),
                                 stderr=None if se is None or np.ndim(se) else _num(se),
                                 n_reports=n, guarantee=g, error=None))
            continue
        vals = np.asarray(value, dtype=float).ravel()
        ses = None if st.stderr is None else \
            np.broadcast_to(np.asarray(st.stderr, dtype=float), np.shape(value)).ravel()
        for i, v in enumerate(vals.tolist()):
            rows.append(beam.Row(key=key, mechanism=element.mechanism, statistic=name, index=i,
                                 value=v, stderr=None if ses is None else float(ses[i]),
                                 n_reports=n, guarantee=g, error=None))
    return rows


class EstimatesAsRows(beam.PTransform):
    """Estimates -> schema'd ``beam.Row``: ``key`` (per-key estimates; else None),
    ``mechanism``, ``statistic``, ``index`` (the flat cell of an array statistic; None for a
    scalar), ``value``, ``stderr``, ``n_reports``, ``guarantee`` (its summary) and ``error``
    (an EstimateFailure's reason, on a row without statistic)."""

    def expand(self, pcoll):
        return pcoll | "EstimateRows" >> beam.FlatMap(estimate_rows).with_output_types(
            ESTIMATE_ROW)
