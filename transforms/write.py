"""Beam writers of a run's files: ``WriteParquetFile`` and ``WriteJsonLines`` write one part per
bundle beside the target (``PATH.parts/``) and join the parts into the one file after the
pipeline (:func:`join_parquet_parts`, :func:`join_text_parts`), through Beam's FileSystems so a
target may be local or any URL Beam can write. The readers are in :mod:`.io` and :mod:`.read`.
"""
from __future__ import annotations

import os
import shutil
import uuid
from typing import Any, Callable, Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from ldp_beam.jsonio import json_line as to_json_line


#: where a single-file write stages its part files: ``PATH`` + this + ``/part-UUID.parquet``
PARTS_SUFFIX = ".ldp-beam-parts"


class WriteParquetFile(beam.PTransform):
    """Record batches -> exactly one Parquet file at ``path`` (schema kept, metadata included,
    one row group per batch), in memory that does not grow with the data.

    Each bundle streams its batches into a part file of its own as they arrive
    (``PATH.ldp-beam-parts/part-UUID.parquet``; runner-chosen sharding: nothing is grouped under
    one key, so no runner holds the data in memory); a last step, once every bundle has
    finished, joins the parts into ``PATH``: a single part is renamed, several are streamed into
    one file a row group at a time, in part-name order; then the parts folder is removed. Both
    run in the pipeline (workers, through Beam's FileSystems), never through the launcher. A
    part's name is emitted when the bundle opens it (a runner may drop what a bundle emits when
    it finishes: Beam's Dask runner does) and a retried bundle writes a new part, so only the
    parts of committed bundles are joined. Returns a PCollection holding ``path`` once complete.
    """

    def __init__(self, path: str, schema: pa.Schema) -> None:
        super().__init__()
        self.path, self.schema = path, schema

    def expand(self, pcoll):
        return (pcoll | "WriteParts" >> beam.ParDo(WritePartFn(self.path, self.schema))
                | "AllParts" >> beam.combiners.ToList()
                | "JoinParts" >> beam.Map(join_parquet_parts, self.path, self.schema))


def _parts_folder(path: str) -> str:
    return path + PARTS_SUFFIX


def _sep(path: str) -> str:
    return "/" if "://" in path else os.sep


def fs_open(path: str, mode: str = "r"):
    """A binary stream reading (``mode="r"``) or writing (``"w"``) a local path or any Beam
    FileSystems URL, as stored (no compression guessed from the name)."""
    fn = FileSystems.create if mode == "w" else FileSystems.open
    return fn(path, compression_type=CompressionTypes.UNCOMPRESSED)


class WritePartFn(beam.DoFn):
    """Writes each bundle's elements into a part file of its own (Parquet record batches when
    ``schema`` is given, else text lines: ``line(element)``, or the element itself), emitting
    the part's name when it opens it."""

    def __init__(self, path: str, schema: pa.Schema | None = None,
                 line: Callable[[Any], str] | None = None) -> None:
        self.path, self.schema, self.line = path, schema, line

    def start_bundle(self):
        self.fh = self.writer = None

    def _open(self) -> str:
        name = (_parts_folder(self.path) + _sep(self.path) + "part-" + uuid.uuid4().hex
                + (".parquet" if self.schema is not None else ".jsonl"))
        self.fh = fs_open(name, "w")
        if self.schema is not None:
            self.writer = pq.ParquetWriter(self.fh, self.schema, **_PARQUET_ENCODING)
        return name

    def process(self, element: Any):
        if self.fh is None:
            yield self._open()
        if self.schema is None:
            text = element if self.line is None else self.line(element)
            self.fh.write(text.encode("utf-8") + b"\n")
        else:
            table = element if isinstance(element, pa.Table) else pa.Table.from_batches([element])
            if not table.schema.equals(self.schema, check_metadata=False):
                table = table.cast(self.schema)
            self.writer.write_table(table)

    def finish_bundle(self):
        if self.writer is not None:
            self.writer.close()
        if self.fh is not None:
            self.fh.close()
        self.fh = self.writer = None


#: how parts and joined files are encoded: uncompressed, dictionary-encoded (a report column
#: of a few codes takes a few bits a row; without dictionaries the reports were 6-27x larger)
_PARQUET_ENCODING = {"compression": "none", "use_dictionary": True}


def _join_parts(parts: Sequence[str], path: str, stream: Callable[[list[str], Any], None]) -> str:
    """Join the part files ``parts`` into ``path`` (``stream(parts, out)`` writes them into the
    open output; no part: an empty file), then remove the parts folder (with any part a failed
    bundle attempt left). Safe to retry: parts are removed only once ``path`` is complete, so a
    missing part with ``path`` present means an earlier attempt finished."""
    parts = sorted(set(parts))
    present = [p for p in parts if FileSystems.exists(p)]
    if len(present) < len(parts):
        if not FileSystems.exists(path):
            missing = sorted(set(parts) - set(present))
            raise OSError(f"part file {missing[0]} of {path} is missing and {path} was not "
                          "written")
    elif len(parts) == 1:
        if FileSystems.exists(path):
            FileSystems.delete([path])
        FileSystems.rename(parts, [path])
    else:
        with fs_open(path, "w") as out:
            stream(present, out)
    folder = _parts_folder(path)
    try:
        left = [m.path for m in FileSystems.match([folder + _sep(path) + "*"])[0].metadata_list]
    except Exception:  # noqa: BLE001 - nothing there to match
        left = []
    if left:
        FileSystems.delete(left)
    if "://" not in path and os.path.isdir(folder):
        os.rmdir(folder)
    return path


def join_parquet_parts(parts: Sequence[str], path: str, schema: pa.Schema) -> str:
    """Join Parquet part files into one file at ``path``, a row group at a time (flat memory);
    see :class:`WriteParquetFile`."""

    def stream(files: list[str], out: Any) -> None:
        writer = pq.ParquetWriter(out, schema, **_PARQUET_ENCODING)
        try:
            for f in files:
                with fs_open(f) as fh:
                    pf = pq.ParquetFile(fh)
                    for i in range(pf.num_row_groups):
                        writer.write_table(pf.read_row_group(i))
        finally:
            writer.close()

    return _join_parts(parts, path, stream)


def join_text_parts(parts: Sequence[str], path: str) -> str:
    """Concatenate text part files into one file at ``path`` (streamed; see
    :class:`WriteJsonLines`)."""
    def stream(files: list[str], out: Any) -> None:
        for f in files:
            with fs_open(f) as fh:
                shutil.copyfileobj(fh, out, 1 << 22)

    return _join_parts(parts, path, stream)


class WriteJsonLines(beam.PTransform):
    """Dicts -> one JSON-lines file at ``path`` (created even when empty), in memory that does
    not grow with the data: each bundle writes a part file of its own, then a last step
    concatenates the parts into ``path``, as :class:`WriteParquetFile` does. Returns a
    PCollection holding ``path`` once it is complete.

    Apply it to a tuple of PCollections (``(a, b) | WriteJsonLines(path)``) rather than to
    their ``beam.Flatten()``: each is then written where it is produced and only the part
    names are flattened, whereas Beam's DirectRunner materializes a multi-input Flatten in
    memory (it never fuses one), i.e. would hold every line."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def expand(self, pcolls):
        if not isinstance(pcolls, (tuple, list)):
            pcolls = (pcolls,)
        names = [pc | f"WriteParts{i or ''}" >> beam.ParDo(WritePartFn(self.path,
                                                                         line=to_json_line))
                 for i, pc in enumerate(pcolls)]
        names = names[0] if len(names) == 1 else tuple(names) | "PartNames" >> beam.Flatten()
        return (names | "AllParts" >> beam.combiners.ToList()
                | "JoinParts" >> beam.Map(join_text_parts, self.path))
