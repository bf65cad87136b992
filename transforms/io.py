"""Reading warehouse tables into keyed batches, and writing reports and dead letters.

``ReadTable(pattern)`` lists the matching Parquet or CSV files when the pipeline is built, splits
Parquet files by row group (CSV files by file), reshuffles the units across workers and reads each
with pyarrow into :class:`KeyedBatch` elements: row ``i`` of a batch is record ``offset + i`` of a
stream named after the file, which is what makes seeded runs batch- and runner-independent.
CSV columns are read as text and parsed by the mechanism, so a stray word in a numeric column
dead-letters that one row instead of failing the file. An unreadable file goes to the dead-letter
output with its name and the reason.
"""
from __future__ import annotations

import csv
import glob
import json
import math
import os
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ldp_beam.rng import stream_id

from .batches import KeyedBatch
from .perturb import dead_letter, split_dead_letters

DEFAULT_BATCH_ROWS = 1 << 16


def table_format(path: str) -> str:
    low = path.lower()
    if low.endswith((".parquet", ".pq")):
        return "parquet"
    if low.endswith((".csv", ".csv.gz", ".txt")):
        return "csv"
    raise ValueError(f"cannot tell the format of {path!r}: use a .parquet or .csv file")


def match_files(pattern: str) -> list[str]:
    if os.path.isdir(pattern):
        files = sorted(os.path.join(pattern, f) for f in os.listdir(pattern)
                       if not f.startswith((".", "_")))
    else:
        files = sorted(glob.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no input file matches {pattern!r}")
    names = {}
    for f in files:
        sid = stream_id(os.path.basename(f))
        if sid in names:
            raise ValueError(f"input files {names[sid]!r} and {f!r} share a base name; record keys "
                             "are derived from it, so rename one")
        names[sid] = f
    return files


def csv_header(path: str) -> list[str]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return next(csv.reader(fh), [])


def input_schema(files: list[str]) -> pa.Schema:
    """The schema rows will have (CSV: every column as text), from the first readable file
    (unreadable ones are dead-lettered by the reader); an error if none can be read."""
    errors = []
    for f in files:
        try:
            if table_format(f) == "parquet":
                return pq.read_schema(f).remove_metadata()
            return pa.schema([pa.field(c, pa.string()) for c in csv_header(f)])
        except (OSError, ValueError, pa.ArrowException, UnicodeDecodeError) as exc:
            errors.append(f"{f}: {exc}")
    raise ValueError("no input file is readable: " + "; ".join(errors[:3]))


def count_rows(path: str) -> int:
    """Rows of a table file without reading its data: Parquet metadata, or CSV records (quoted
    newlines respected) minus the header. Raises for an unreadable file."""
    if table_format(path) == "parquet":
        return pq.ParquetFile(path).metadata.num_rows
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return max(sum(1 for _ in csv.reader(fh)) - 1, 0)


@dataclass(frozen=True)
class ReadUnit:
    path: str
    row_group: int | None  # None: the whole file
    offset: int


def plan_units(files: list[str]) -> list[ReadUnit]:
    units = []
    for f in files:
        if table_format(f) == "parquet":
            try:
                meta = pq.ParquetFile(f).metadata
            except Exception:  # unreadable: let the reader dead-letter it
                units.append(ReadUnit(f, None, 0))
                continue
            off = 0
            for rg in range(meta.num_row_groups):
                units.append(ReadUnit(f, rg, off))
                off += meta.row_group(rg).num_rows
        else:
            units.append(ReadUnit(f, None, 0))
    return units


class ReadUnitFn(beam.DoFn):
    def __init__(self, batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        self.batch_rows = batch_rows
        self.n_unreadable = Metrics.counter("ldp_beam", "files_unreadable")

    def process(self, unit: ReadUnit):
        stream = stream_id(os.path.basename(unit.path))
        try:
            if table_format(unit.path) == "parquet":
                pf = pq.ParquetFile(unit.path)
                groups = None if unit.row_group is None else [unit.row_group]
                batches = pf.iter_batches(batch_size=self.batch_rows, row_groups=groups)
            else:
                names = csv_header(unit.path)
                reader = pacsv.open_csv(
                    unit.path,
                    read_options=pacsv.ReadOptions(block_size=1 << 22, encoding="utf-8",
                                                     column_names=names, skip_rows=1),
                    convert_options=pacsv.ConvertOptions(
                        column_types={c: pa.string() for c in names}, strings_can_be_null=True))
                batches = (b for b in reader)
            off = unit.offset
            for b in batches:
                if b.schema.metadata:
                    b = b.replace_schema_metadata(None)
                yield KeyedBatch(stream, off, b, unit.path)
                off += b.num_rows
        except Exception as exc:
            self.n_unreadable.inc()
            yield dead_letter(
                f"unreadable input: {type(exc).__name__}: {exc}", None, unit.path,
                None if unit.row_group is None else unit.offset)


class ReadTable(beam.PTransform):
    """Parquet/CSV files -> KeyedBatch elements (main) and unreadable files (``dead_letter``)."""

    def __init__(self, pattern: str, batch_rows: int = DEFAULT_BATCH_ROWS) -> None:
        super().__init__()
        self.files = match_files(pattern)
        self.units = plan_units(self.files)
        self.batch_rows = batch_rows

    @property
    def schema(self) -> pa.Schema:
        return input_schema(self.files)

    def expand(self, pbegin):
        units = pbegin | "Units" >> beam.Create(self.units)
        if len(self.units) > 1:
            units = units | "Spread" >> beam.Reshuffle()
        return split_dead_letters(units | "Read" >> beam.ParDo(ReadUnitFn(self.batch_rows)),
                                  "batches")


def _to_table(batch: Any) -> pa.Table:
    return batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])


class WriteParquetFile(beam.PTransform):
    """Record batches -> exactly one Parquet file at ``path`` (schema kept, metadata included)."""

    def __init__(self, path: str, schema: pa.Schema) -> None:
        super().__init__()
        self.path, self.schema = path, schema

    def expand(self, pcoll):
        return (pcoll | "ToTable" >> beam.Map(_to_table)
                | "Write" >> beam.io.WriteToParquetBatched(
                    self.path, self.schema, num_shards=1, shard_name_template=""))


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (bytes, bytearray)):
        return x.decode("utf-8", "replace")
    return str(x)


def _strict(x: Any) -> Any:
    """NaN and infinities (e.g. a missing value in a dead-lettered record) become null, so every
    line is standard JSON."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return _strict(x.item())
    if hasattr(x, "tolist"):
        return _strict(x.tolist())
    return x


def to_json_line(obj: Any) -> str:
    return json.dumps(_strict(obj), default=_json_default, sort_keys=True, allow_nan=False)


class WriteJsonLines(beam.PTransform):
    """Dicts -> one JSON-lines file at ``path`` (created even when empty)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def expand(self, pcoll):
        return (pcoll | "Json" >> beam.Map(to_json_line)
                | "Write" >> beam.io.WriteToText(self.path, num_shards=1, shard_name_template=""))
