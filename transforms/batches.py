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
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pyarrow as pa

from ldp_beam import __version__
from ldp_beam.core import Mechanism, coerce_numeric

SCHEMA_KEY = b"ldp_beam"


@dataclass(frozen=True)
class KeyedBatch:
    stream: int
    offset: int
    table: Any  # pa.RecordBatch | pa.Table
    source: str = ""

    @property
    def num_rows(self) -> int:
        return self.table.num_rows


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
                  seeded: bool = False) -> pa.Schema:
    """The Arrow schema of report batches, with the mechanism and its parameters in metadata.

    ``seeded``: the reports were drawn from a caller's seed; the metadata then says so
    (``"seeded": true`` and a guarantee summary saying the reports are not private). Passthrough
    columns are listed as ``public_columns``: copied unprotected, declared public by the caller.
    """
    from ldp_beam.privacy import run_guarantee

    fields = [pa.field(name, pa.from_numpy_dtype(np.dtype(dt)), nullable=False)
              for name, dt in mechanism.report_fields]
    if passthrough is not None:
        fields += [f for f in passthrough]
    public = [f.name for f in passthrough] if passthrough is not None else []
    meta = {"mechanism": mechanism.name, "params": mechanism.params(),
            "guarantee": run_guarantee(mechanism.guarantee, seeded=seeded, public=public),
            "seeded": bool(seeded), "public_columns": public, "ldp_beam_version": __version__}
    return pa.schema(fields, metadata={SCHEMA_KEY: json.dumps(meta, default=list).encode()})


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


def report_columns(element: Any, fields: tuple) -> dict[str, np.ndarray]:
    """Report fields of a report batch / single report as numpy columns of the declared dtypes
    (reports read from CSV or JSON arrive as text; they are parsed here, after validation)."""
    if isinstance(element, KeyedBatch):
        element = element.table
    if isinstance(element, (pa.RecordBatch, pa.Table)):
        cols = {name: get_column(element, name) for name, _ in fields
                if name in element.schema.names}
    elif isinstance(element, Mapping):
        if is_batch(element):
            cols = {name: np.asarray(element[name]) for name, _ in fields if name in element}
        else:
            cols = {name: np.asarray([element[name]]) for name, _ in fields if name in element}
    else:
        raise TypeError(f"cannot read reports from a {type(element).__name__}")
    dtypes = dict(fields)
    for name, col in cols.items():
        if col.dtype.kind not in "iuf":
            cols[name] = coerce_numeric(col)[0].astype(dtypes[name])
    return cols
