"""``ReadTable``: one reader for every input, files (:mod:`.io`: Parquet, CSV, local or any
Beam FileSystems URL, hive partitions) and databases (:mod:`.sources`: DuckDB, PostgreSQL,
Iceberg). It lives apart from both so that neither imports the other: the file machinery
(:mod:`.io`) is below the database sources, and this facade is above them.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import apache_beam as beam
from apache_beam.pipeline import PipelineVisitor
import pyarrow as pa

from ldp_beam.errors import ParameterError

from .io import (DEFAULT_BATCH_ROWS, DEFAULT_NULL_VALUES, ReadUnitFn, beam_flags, check_columns,
                 check_object_store, csv_settings, input_schema, is_remote, list_input,
                 plan_units)
from .perturb import dead_letter_outputs
from .runners import one_local_worker
from .sources import ReadSourceFn, is_source_url, open_source


class ReadTable(beam.PTransform):
    """A table -> :class:`KeyedBatch` elements (``.batches``) and the reader's dead letters
    (``.dead_letter``): unreadable parts and malformed CSV rows, each saying how many input
    rows it stands for (see the module docstring for the contract).

    ``url`` names the table:

    * a local path, glob or directory, or ``s3://bucket/prefix`` (also a glob or one object;
      ``gs://`` and any other Beam FileSystems scheme work the same way): Parquet and CSV
      (``.csv.gz`` too) files; a directory or prefix is read recursively with
      ``pyarrow.dataset`` semantics (hive ``column=value`` folders become columns; non-table
      and hidden files are skipped with a note in :attr:`skipped` and the log);
    * ``duckdb:///PATH.db?table=T`` or ``duckdb:///PATH.db?query=SELECT ...``;
    * ``postgresql://USER@HOST:PORT/DB?table=T`` (or ``query=``);
    * ``iceberg:///PATH/catalog.db?table=NS.T`` (a pyiceberg SQL catalog in SQLite) or
      ``iceberg://NAME?table=NS.T`` (a catalog configured for pyiceberg).

    Databases are described in :mod:`ldp_beam.transforms.sources` (splits, record identity,
    errors). Whatever the source, problems that can be seen before the pipeline starts
    (missing file, unreachable server or object store, missing credentials, an unknown table,
    a query returning no rows unless ``allow_empty``) raise :class:`SourceError` (or
    FileNotFoundError / ValueError for local files) here, naming the source.

    ``batch_rows``: rows per batch at most. ``null_values``: the texts that mean a missing value
    in a CSV cell (default only the empty cell; also applied to Parquet and database string
    columns). ``csv_options``: a dict of :class:`CsvOptions` settings (delimiter, quote_char,
    escape_char, double_quote, encoding, block_size, max_record_bytes). ``options``: Beam
    options or arguments; their ``--s3_*`` settings (endpoint, credentials, region) configure
    object stores, else the environment does (see :func:`beam_flags`). ``table``, ``query``,
    ``order_by``, ``split_rows``, ``snapshot``: database settings, as in the URL.

    ``columns``: a projection (files only): batches carry only these columns (those the input
    has), with the same rows, record identities and reader dead letters as a whole read. Parquet
    decodes only them, so a read of one column costs a fraction of a whole one (a page of
    another column that is damaged is then not seen); CSV rows are still parsed whole (a row's
    validity depends on all its cells) and projected after. :meth:`with_columns` gives a
    projected copy of a reader.
    """

    def __init__(self, url: str, batch_rows: int = DEFAULT_BATCH_ROWS,
                 null_values: Sequence[str] = DEFAULT_NULL_VALUES,
                 csv_options: Mapping[str, Any] | None = None, *, options: Any = None,
                 table: str | None = None, query: str | None = None,
                 order_by: str | Sequence[str] | None = None, split_rows: int | None = None,
                 snapshot: int | None = None, allow_empty: bool = False,
                 columns: Sequence[str] | None = None) -> None:
        super().__init__()
        self.url = url
        self.columns = check_columns(columns)
        self.flags = beam_flags(options)
        self.batch_rows = batch_rows
        self.skipped: list[dict] = []
        self.files: list[str] = []
        self._schema: pa.Schema | None = None
        if is_source_url(url):
            if self.columns is not None:
                raise _no_projection(columns)
            self.source = open_source(url, table=table, query=query, order_by=order_by,
                                      split_rows=split_rows, snapshot=snapshot,
                                      allow_empty=allow_empty)
            self.kind = self.source.kind
            self.source_name = self.source.name
            self.fn = ReadSourceFn(self.source, batch_rows, null_values)
            self.units = list(self.source.units)
            self._schema = self.source.schema
            self.null_values = self.fn.null_values
            self.csv_options = csv_settings(csv_options)
            return
        for name, value in (("table", table), ("query", query), ("order_by", order_by),
                            ("split_rows", split_rows), ("snapshot", snapshot)):
            if value is not None:
                raise ParameterError(name, value, "None for files (it applies to duckdb://, "
                                     "postgresql:// and iceberg:// sources)")
        self.source = None
        self.kind = "files"
        self.source_name = url
        if is_remote(url):
            check_object_store(url, self.flags)
        listing = list_input(url, self.flags)
        self.fn = ReadUnitFn(batch_rows, null_values, csv_options, listing.partition_fields,
                             self.flags, self.columns)  # validates the options
        self.inputs = listing.files
        self.files = [f.path for f in listing.files]
        self.partition_fields = listing.partition_fields
        self.skipped = listing.skipped
        self.units = plan_units(listing.files, self.flags)
        self.null_values = self.fn.null_values
        self.csv_options = self.fn.csv

    @property
    def schema(self) -> pa.Schema:
        if self._schema is None:
            self._schema = input_schema(self.inputs, self.csv_options, self.partition_fields,
                                        self.flags)
        return self._schema

    def with_columns(self, columns: Sequence[str]) -> "ReadTable":
        """A copy of this reader that reads only ``columns`` (see ``columns``): the same files,
        plan and options. Database sources have no projection: a ParameterError."""
        if self.source is not None:
            raise _no_projection(columns)
        out = copy.copy(self)
        out.columns = check_columns(columns)
        out.fn = copy.copy(self.fn)
        out.fn.columns = out.columns
        return out

    def expand(self, pbegin):
        # beam.Create reshuffles its elements itself when it has more than one (MaybeReshuffle),
        # which spreads the units over workers (a Reshuffle of our own would only add a stage).
        # With one worker there is nothing to spread over: no reshuffle (4 steps, 1 shuffle fewer)
        units = pbegin | "Units" >> beam.Create(
            self.units, reshuffle=not one_local_worker(pbegin.pipeline))
        return dead_letter_outputs(units, "Read", self.fn, "batches")


def _no_projection(columns: Any) -> ParameterError:
    return ParameterError("columns", columns, "None for duckdb://, postgresql:// and iceberg:// "
                         "sources (select the columns in query=)")


def read_steps(pipeline: Any) -> list:
    """``(ReadTable, its read step's main output)`` of every :class:`ReadTable` applied to
    ``pipeline`` (for progress: the rows read are counted there). The read step is the ParDo of
    a :class:`~ldp_beam.transforms.io.ReadUnitFn` inside a ReadTable; its main output holds the
    batches (and, on Dask, the dead letters too). Best effort: ``[]`` if the graph cannot be
    walked."""
    found: list = []

    class _Visit(PipelineVisitor):
        def visit_transform(self, node):
            fn = getattr(node.transform, "fn", None)
            if not isinstance(node.transform, beam.ParDo) or not isinstance(fn, ReadUnitFn):
                return
            owner = node.parent
            while owner is not None and not isinstance(owner.transform, ReadTable):
                owner = owner.parent
            if owner is not None:
                found.append((owner.transform, node.outputs.get(None)))

    try:
        pipeline.visit(_Visit())
    except Exception:  # progress is best effort: never fail a run over it
        return []
    return found
