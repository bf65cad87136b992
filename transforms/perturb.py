"""The generic perturbation DoFn: any registered mechanism, element or batch at a time.

Valid rows are perturbed with one vectorized call per batch; invalid rows go to the
``dead_letter`` output as ``{"reason", "record", "source", "row"}``, where ``record`` holds only
the columns the mechanism reads (``dead_letter_columns="all"``: the whole row). A dead letter
stays small: a text cell of ``record`` shows at most :data:`RECORD_TEXT_CHARS` (2,000)
characters, a value quoted in ``reason`` at most :data:`~ldp_beam.core.QUOTED_VALUE_CHARS`
(2,000, then ``... (N characters)``), the reason at most :data:`~ldp_beam.core.REASON_CHARS`
(16,000) before the note on cut cells: a 20 MB cell makes a dead letter of about 4 KB. Beam
counters in namespace ``ldp_beam`` (``records_in``, ``records_valid``, ``records_invalid``)
always satisfy in = valid + invalid.

**Retry-proof noise.** Every draw is a function of the run's secret key (:class:`RunKey`, fresh
OS entropy unless seeded) and the record's stable identity, so a runner that re-executes a bundle
or a stage (all of them do, on failure or speculatively) reproduces the same reports:

* ``KeyedBatch`` (from ``ReadTable``): record ``offset + i`` of the stream named after its file;
* a bare Arrow batch or dict of arrays: the batch's content digest and the row's position in it
  (a re-executed bundle re-reads the same batch); refused for seeded runs, whose promise of
  runner-independent output needs keys that do not depend on batching;
* a single record (dict, ``beam.Row`` or NamedTuple: the fields of a schema'd PCollection): the
  value of ``key_column``, a stable record id; a mechanism that draws noise refuses single
  records without one, since nothing else identifies a retried record;
* a pandas DataFrame: a bare Arrow batch (``pa.Table.from_pandas``, index dropped).

``Perturb(..., output="rows")`` emits each report as a ``beam.Row`` of a schema'd PCollection
(the report fields, then the kept columns) instead of report batches.
"""
from __future__ import annotations

import bisect
import copy
import hashlib
from typing import Any, Iterable, Mapping

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.windowed_value import WindowedValue

from ldp_beam.core import Mechanism, cap_reason
from ldp_beam.rng import RunKey, stream_id

from .batches import (KeyedBatch, column_names, get_column, is_batch, num_rows,
                      report_schema, reports_batch, row_dict, take)
from .rows import (ReportsAsRows, as_arrow, as_record, is_dataframe, kept_types,
                   report_row_type)
from .runners import separates_tagged_outputs

DEAD_LETTER = "dead_letter"
REPORTS = "reports"
ELEMENT_BUFFER = 4096  # single records perturbed together (per bundle, at most this many)
_MASK64 = (1 << 64) - 1
SUBSET_GAP = 256  # a subset's records further apart than this are drawn in separate runs
RANDOMIZE_ROWS = 16384  # rows of a batch perturbed together (see PerturbFn._randomize)


class DeadLetterRecord(dict):
    """A dead-letter entry travelling in a DoFn's single output until :func:`split_dead_letters`
    separates it from the main elements."""


RECORD_TEXT_CHARS = 2000  # a text cell of a dead-lettered record, at most (the reason says so)


def clipped_record(record: dict) -> tuple[dict, str]:
    """A dead-lettered record with long texts cut, and a note for the reason ("" if none)."""
    long = {k: v for k, v in record.items()
            if isinstance(v, (str, bytes)) and len(v) > RECORD_TEXT_CHARS}
    out = {k: v[:RECORD_TEXT_CHARS] if k in long else v for k, v in record.items()}
    cut = [f"field {k!r} shows the first {RECORD_TEXT_CHARS:,} of {len(v):,} "
           f"{'characters' if isinstance(v, str) else 'bytes'}" for k, v in long.items()]
    return out, (f" ({'; '.join(cut)})" if cut else "")


def dead_letter(reason: str, record: Any, source: str = "", row: int | None = None) -> dict:
    """A dead-letter entry: a record's text cells are cut to ``RECORD_TEXT_CHARS`` (the reason
    says so) and the reason to :data:`~ldp_beam.core.REASON_CHARS` before that note (see the
    module docstring)."""
    reason = cap_reason(str(reason))
    if isinstance(record, dict):
        record, note = clipped_record(record)
        reason += note
    return DeadLetterRecord(reason=reason, record=record, source=source, row=row)


class DeadLetteringFn(beam.DoFn):
    """A DoFn whose :meth:`outputs` yields its main elements and :class:`DeadLetterRecord`
    entries, routed by ``tagged`` (set by :func:`dead_letter_outputs`): each dead letter as a
    ``TaggedOutput`` of :data:`DEAD_LETTER` holding a plain dict, else unchanged for
    :func:`split_dead_letters`. A subclass's own ``process`` emits them through :meth:`_dead`."""

    tagged = False

    def process(self, element: Any):
        return self._routed(self.outputs(element))

    def _routed(self, items: Iterable[Any]) -> Iterable[Any]:
        """``items`` with each dead letter emitted through :meth:`_dead`."""
        if not self.tagged:
            return items
        return (self._dead(x) if isinstance(x, DeadLetterRecord) else x for x in items)

    def outputs(self, element: Any) -> Iterable[Any]:
        raise NotImplementedError

    def _dead(self, entry: Any) -> Any:
        """A dead letter (or a windowed one) as this DoFn emits it (see ``tagged``)."""
        if not self.tagged:
            return entry
        if isinstance(entry, WindowedValue):
            return TaggedOutput(DEAD_LETTER, entry.with_value(dict(entry.value)))
        return TaggedOutput(DEAD_LETTER, dict(entry))


def _main_part(element: Any) -> list:
    return [] if isinstance(element, DeadLetterRecord) else [element]


def _dead_part(element: Any) -> list:
    return [dict(element)] if isinstance(element, DeadLetterRecord) else []


class Outputs:
    """The two outputs of a validating step: ``getattr(out, main)`` and ``out.dead_letter``
    (also by item, ``out["dead_letter"]``)."""

    def __init__(self, main_name: str, main: Any, dead: Any) -> None:
        self._items = {main_name: main, DEAD_LETTER: dead}
        setattr(self, main_name, main)
        self.dead_letter = dead

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __iter__(self):
        return iter(self._items.values())


def split_dead_letters(pcoll: Any, main_name: str) -> Outputs:
    """Split a DoFn's single output into its main elements and its dead letters: what
    :func:`dead_letter_outputs` does where the runner does not separate tagged outputs (Beam's
    Dask runner gives each branch every element), one output plus two filters."""
    return Outputs(main_name, pcoll | f"{main_name.title()}" >> beam.FlatMap(_main_part),
                   pcoll | "DeadLetters" >> beam.FlatMap(_dead_part))


def content_stream(table: Any, columns: list[str]) -> int:
    """A 64-bit stream number from the content of ``columns`` of a bare batch: the identity of a
    batch that arrives without one, stable when a runner re-executes the bundle."""
    h = hashlib.blake2b(digest_size=8, person=b"ldp-beam-batch")
    for c in columns:
        h.update(c.encode() + b"\x00")
        if isinstance(table, (pa.RecordBatch, pa.Table)):
            col = table.column(c)
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            h.update(pa.RecordBatch.from_arrays([col], ["c"]).serialize())  # offsets respected
        else:
            arr = np.asarray(table[c])
            h.update(arr.tobytes() if arr.dtype.kind in "biuf" else
                     "\x1f".join(map(repr, arr.tolist())).encode())
    return int.from_bytes(h.digest(), "big")


class PerturbFn(DeadLetteringFn):
    """Perturb elements with ``mechanism``; ``columns`` maps each role to an input column name
    (default: role 'value' -> column 'value'); ``keep`` lists columns copied to the reports
    unprotected (e.g. a public grouping key: never an input column of the mechanism).

    Noise: ``run_key`` (a :class:`RunKey`; default a fresh one, or one derived from ``seed``)
    addresses every record's draws by its identity (see the module docstring), so re-executions
    reproduce them. ``seed`` makes the run reproducible and says so: not private."""

    def __init__(self, mechanism: Mechanism, columns: Mapping[str, str] | None = None,
                 keep: tuple[str, ...] = (), seed: Any = None, key_column: str | None = None,
                 passthrough_schema: pa.Schema | None = None, run_key: RunKey | None = None,
                 dead_letter_columns: str = "mapped") -> None:
        self.mechanism = mechanism
        self.columns = dict(columns or {r.name: r.name for r in mechanism.roles if r.required})
        roles = {r.name for r in mechanism.roles}
        unknown = set(self.columns) - roles
        if unknown:
            raise ValueError(f"columns maps unknown roles {sorted(unknown)}; "
                             f"{mechanism.name} has roles {sorted(roles)}")
        for r in mechanism.roles:
            if r.required and r.name not in self.columns:
                raise ValueError(f"columns must map the required role {r.name!r}")
        self.keep = tuple(keep)
        inputs = {c: r for r, c in self.columns.items()}
        for c in self.keep:
            if c in inputs:
                raise ValueError(f"keep: column {c!r} is the input of {mechanism.name}'s role "
                                 f"{inputs[c]!r}; kept columns are copied into the reports "
                                 "unprotected, so a mechanism's input can never be kept")
        if dead_letter_columns not in ("mapped", "all"):
            raise ValueError(f"dead_letter_columns={dead_letter_columns!r}: one of 'mapped' "
                             "(the mechanism's input columns) or 'all' (whole rows)")
        if run_key is not None and seed is not None:
            raise ValueError("give a seed or a run_key, not both")
        self.run_key = run_key or RunKey.new(seed)
        self.seed = self.run_key.seed
        self.key_column = key_column
        self.dead_letter_columns = dead_letter_columns
        self._shown = None if dead_letter_columns == "all" else \
            list(dict.fromkeys(self.columns.values()))
        # the fields a buffered single record keeps: its id, the mechanism's inputs, the kept
        self._fields = list(dict.fromkeys(([key_column] if key_column else [])
                                          + list(self.columns.values()) + list(self.keep)))
        self.passthrough_schema = passthrough_schema
        self.schema = report_schema(mechanism, passthrough_schema, seeded=self.run_key.seeded) \
            if passthrough_schema or not self.keep else None  # else: from the first batch
        self._key_needed = bool(mechanism.draws)  # single records need key_column
        # roles read as Arrow: 'category' roles of mechanisms that use the generic check
        self._arrow_roles = frozenset(
            r.name for r in mechanism.roles if r.kind == "category") \
            if type(mechanism).check is Mechanism.check else frozenset()
        self.n_in = Metrics.counter("ldp_beam", "records_in")
        self.n_valid = Metrics.counter("ldp_beam", "records_valid")
        self.n_invalid = Metrics.counter("ldp_beam", "records_invalid")

    def setup(self) -> None:
        self.source = self.run_key.source()

    # -- batch path
    def _uniforms(self, n: int, stream: int, offset: int, rows: np.ndarray | None) -> np.ndarray:
        """The draws of records ``offset .. offset + n - 1`` of ``stream`` (or of the record
        numbers ``rows``, a subset: drawn over their span and picked, so every record keeps the
        noise it would have had in the full stream)."""
        draws = self.mechanism.draws
        if rows is None or n == 0:
            return self.source.uniforms(n, draws, stream=stream, offset=offset)
        keyed = getattr(self.source, "keyed_uniforms", None)
        if keyed is not None and draws and int(rows[0]) >= 0 and \
                int(rows[-1]) - int(rows[0]) + 1 > 2 * n:
            # a sparse subset (e.g. the rows a privacy-unit bound kept): only its records'
            # counter blocks, in one AES call (the same draws, bit for bit)
            return keyed(np.full(n, int(stream) & _MASK64, np.uint64), rows, draws)
        # draw the span of each cluster of records (gaps of up to GAP records drawn and
        # discarded: AES runs at ~350M uniforms/s, a generator costs ~30 us to set up)
        breaks = np.flatnonzero(np.diff(rows) > SUBSET_GAP) + 1
        parts = []
        for r in np.split(rows, breaks):
            lo = int(r[0])
            u = self.source.uniforms(int(r[-1]) - lo + 1, draws, stream=stream, offset=lo)
            parts.append(u[r - lo])
        return np.asfortranarray(np.vstack(parts))

    def _perturb_batch(self, table: Any, stream: int | None, offset: int | None, source: str,
                       rows: np.ndarray | None = None, keyed: KeyedBatch | None = None):
        n = num_rows(table)
        self.n_in.inc(n)
        names = set(column_names(table))
        absent = [c for c in list(self.columns.values()) + list(self.keep) if c not in names]
        if absent:
            for i in range(n):
                yield dead_letter(
                    f"input has no column {absent[0]!r}",
                    row_dict(table, i, [c for c in self._shown or names if c in names]),
                    source, _row_number(offset, rows, i))
            self.n_invalid.inc(n)
            return
        raw = {role: self._input_column(table, role, col, keyed)
               for role, col in self.columns.items()}
        cols, reasons = self.mechanism.check(raw)
        if stream is None and self.mechanism.draws:  # a bare batch: its content is its identity
            stream, offset = content_stream(table, list(self.columns.values())), 0
        u = self._uniforms(n, stream, offset, rows)
        bad = reasons.bad
        n_bad = int(np.count_nonzero(bad))
        if n_bad:
            msgs = reasons.as_dict()
            for i in np.flatnonzero(bad).tolist():
                yield dead_letter(msgs[i], row_dict(table, i, self._shown), source,
                                  _row_number(offset, rows, i))
            ok = np.flatnonzero(~bad)
            cols = {k: v[ok] for k, v in cols.items()}
            u = u[ok]
            kept = take(table, ok)
        else:
            kept = table
        self.n_invalid.inc(n_bad)
        self.n_valid.inc(n - n_bad)
        if n_bad == n:
            return
        reports = self._randomize(cols, u)
        del u
        yield reports_batch(reports, self._schema_for(table), kept if self.keep else None)

    def _randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> dict[str, np.ndarray]:
        """The mechanism's reports of the valid rows ``cols`` with their uniforms ``u``,
        ``RANDOMIZE_ROWS`` rows at a time. A report depends only on its row and its uniforms, so
        the slices' reports are the whole batch's; the mechanism's temporaries stay a slice
        long, in cache, instead of a dozen arrays of the whole batch (GRR on 65,536 rows: 0.58 ms
        at once, 4 x 48 us in slices of 16,384). A mechanism whose reports are not per-row arrays
        of one dtype per field is run on the whole batch at once."""
        n = u.shape[0]
        step = RANDOMIZE_ROWS
        if n <= step:
            return self.mechanism.rows(cols, u)
        parts = []
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            part = self.mechanism.rows({k: v[lo:hi] for k, v in cols.items()}, u[lo:hi])
            if parts and part.keys() != parts[0].keys() or not all(
                    isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == hi - lo
                    and (not parts or v.dtype == parts[0][k].dtype) for k, v in part.items()):
                return self.mechanism.rows(cols, u)
            parts.append(part)
        return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}

    def _input_column(self, table: Any, role: str, name: str,
                      keyed: KeyedBatch | None = None) -> Any:
        """A role's column: Arrow text (or text dictionary) columns of 'category' roles go to
        the mechanism as Arrow, encoded without a Python string per row
        (:func:`~ldp_beam.core.encode_categories`): as the dictionary the reader decoded the
        column from when ``keyed`` has it (:meth:`KeyedBatch.dictionary`: the same values, each
        distinct label looked up once); anything else as numpy."""
        if role in self._arrow_roles and isinstance(table, (pa.RecordBatch, pa.Table)):
            col = table.column(name)
            t = col.type
            if pa.types.is_dictionary(t):
                t = t.value_type
            if pa.types.is_string(t) or pa.types.is_large_string(t):
                coded = keyed.dictionary(name, col) if keyed is not None else None
                return col if coded is None else coded
        return get_column(table, name)

    def _schema_for(self, table: Any) -> pa.Schema:
        if self.schema is None:
            if isinstance(table, (pa.RecordBatch, pa.Table)):
                kept = pa.schema([table.schema.field(c) for c in self.keep])
            else:
                kept = pa.schema([(c, pa.array(np.asarray(table[c])).type) for c in self.keep])
            kept = pa.schema([pa.field(f.name, f.type.value_type)
                              if pa.types.is_dictionary(f.type) else f for f in kept])
            self.schema = report_schema(self.mechanism, kept, seeded=self.run_key.seeded)
        return self.schema

    # -- element path: single records are buffered per bundle and perturbed together
    def start_bundle(self) -> None:
        self._buffer = _RecordBuffer(self._fields, keep_records=self._shown is None)

    def _flush(self) -> Any:
        """Perturb the buffered single records together: their outputs (dead letters first,
        then reports in record order), each with its record's timestamp, windows and pane. The
        reports are computed at once, their elements made one at a time as Beam takes them (a
        generator), so none outlives its trip downstream (see :class:`_RecordBuffer`)."""
        buf = self._buffer
        if not buf.n:
            return ()
        self._buffer = _RecordBuffer(self._fields, keep_records=self._shown is None)
        n = buf.n
        self.n_in.inc(n)
        values = buf.columns()
        needed = list(self.columns.values()) + list(self.keep)
        present = np.ones(n, dtype=bool)
        absent: dict[int, str] = {}
        for c in dict.fromkeys(needed):  # the first needed field a record lacks, in order
            col = values[c]
            for i in [i for i, v in enumerate(col) if v is _ABSENT]:
                if i not in absent:
                    present[i] = False
                    absent[i] = c
        raw = {role: _column(_present_values(values[col]) if absent else values[col])
               for role, col in self.columns.items()}
        cols, reasons = self.mechanism.check(raw)
        reasons.flag(~present, lambda i: f"record has no field {absent[i]!r}", replace=True)
        bad = reasons.bad
        ok = np.flatnonzero(~bad)
        dead: list = []
        if bad.any():
            msgs = reasons.as_dict()
            shown = None if self._shown is None else (
                [self.key_column] if self.key_column else []) + self._shown  # id: its row
            for i in np.flatnonzero(bad).tolist():
                if shown is None:
                    rec = dict(buf.records[i])
                else:
                    rec = {c: values[c][i] for c in shown if values[c][i] is not _ABSENT}
                dead.append(self._dead(buf.windowed(i).with_value(dead_letter(msgs[i], rec))))
        self.n_invalid.inc(int(bad.sum()))
        self.n_valid.inc(int(ok.size))
        if ok.size == 0:
            return dead
        whole = ok.size == n
        okl = ok.tolist()
        draws = self.mechanism.draws
        if draws:  # each record's own stream, named by its id: one vectorized AES call
            ids = values[self.key_column]
            u = self.source.keyed_uniforms(_streams(ids if whole else [ids[i] for i in okl]),
                                           0, draws)
        else:  # a mechanism that draws no noise (central-DP inputs are only checked here)
            u = np.empty((len(okl), 0), order="F")
        if not whole:
            cols = {k: v[ok] for k, v in cols.items()}
        rep = self.mechanism.rows(cols, u)
        del u
        names = list(rep)
        columns = [v.tolist() for v in rep.values()]
        for c in self.keep:
            columns.append(values[c] if whole else [values[c][i] for i in okl])
        names += list(self.keep)
        return _windowed_outputs(dead, names, columns, buf.windowed_runs(None if whole else ok))

    def process(self, element: Any, windowed=beam.DoFn.WindowedValueParam, window=None):
        """One element -> an iterable of outputs (empty while single records are buffered).
        Beam passes the element's WindowedValue (a single record's report keeps its
        timestamp, windows and pane); a caller driving the DoFn by hand may pass
        ``(element, timestamp, window)`` instead."""
        if window is not None:
            windowed = WindowedValue(None, windowed, (window,))
        if type(element) is dict and not isinstance(next(iter(element.values()), None),
                                                    np.ndarray):
            return self._buffered(element, windowed)  # a single record: the common case
        record = as_record(element)  # a schema'd row (beam.Row, NamedTuple): one record
        if record is not None:
            element = record
        elif is_dataframe(element):  # a pandas frame: a bare Arrow batch
            element = as_arrow(element)
        if isinstance(element, KeyedBatch):
            rows = None if element.rows is None else element.record_ids()
            out = self._perturb_batch(element.table, element.stream, element.offset,
                                      element.source, rows, element)
        elif is_batch(element):
            if self.run_key.seeded:
                raise ValueError("seeded perturbation needs keyed batches (KeyedBatch, as "
                                 "emitted by ReadTable): a bare batch's identity depends on how "
                                 "the runner batched it, so a seeded run would not be "
                                 "reproducible across runners")
            out = self._perturb_batch(element, None, None, "")
        elif isinstance(element, Mapping):
            return self._buffered(element, windowed)
        else:
            self.n_in.inc()
            self.n_invalid.inc()
            out = [dead_letter(
                f"unsupported element type {type(element).__name__}", repr(element)[:200])]
        return self._routed(out)

    def _buffered(self, record: Mapping, windowed: Any) -> Any:
        """Buffer one record; perturb the buffer when full (outputs), else nothing yet."""
        if self._key_needed and (self.key_column is None or self.key_column not in record):
            self._refuse_unkeyed()
        if self._buffer.add(record, windowed) >= ELEMENT_BUFFER:
            return self._flush()
        return ()

    def _refuse_unkeyed(self) -> None:
        raise ValueError(
            f"{self.mechanism.name} perturbs single records only with key_column naming "
            "a stable record id present in every record (missing here): the noise of a "
            "record is addressed by it, so that a runner's retry of the bundle sends "
            "the same report instead of spending the person's budget again; batches "
            "from ReadTable carry their own identity")

    def finish_bundle(self):
        yield from self._flush()


_ABSENT = object()  # a field a buffered record does not have


class _RecordBuffer:
    """Single records waiting to be perturbed together, kept as what the flush reads: one list
    of values per field it needs (``_ABSENT`` where a record lacks one) and, for each run of
    consecutive records with the same timestamp, windows and pane, its first record's windowed
    value. Whole records are kept only when dead letters show whole records.

    Not the records with their windowed values: containers that survive young collections are
    promoted, and enough promotions trigger a full collection over every object of the process
    (Beam's few hundred thousand): a dict, a tuple and a windowed value per record cost one per
    ~30,000 records, more than the perturbation; field values are not tracked by the collector."""

    __slots__ = ("fields", "lists", "records", "starts", "wins", "n")

    def __init__(self, fields: list[str], keep_records: bool) -> None:
        self.fields = fields
        self.lists = [(f, []) for f in fields]
        self.records: list | None = [] if keep_records else None
        self.starts: list[int] = []
        self.wins: list = []
        self.n = 0

    def add(self, record: Mapping, windowed: Any) -> int:
        """Keep one record; returns how many are buffered."""
        if type(record) is dict:  # (a Mapping's __getitem__ may make up missing fields)
            try:
                for f, col in self.lists:
                    col.append(record[f])
            except KeyError:  # a field missing: the flush dead-letters the record
                self._add_absent(record)
        else:
            self._add_absent(record)
        if self.records is not None:
            self.records.append(record)
        wins = self.wins
        if not wins or not _same_window(windowed, wins[-1]):
            self.starts.append(self.n)
            wins.append(windowed)
        self.n += 1
        return self.n

    def _add_absent(self, record: Mapping) -> None:
        n = self.n
        for f, col in self.lists:
            del col[n:]
            col.append(record.get(f, _ABSENT))

    def columns(self) -> dict[str, list]:
        """Field -> its values, in record order."""
        return dict(self.lists)

    def windowed(self, i: int) -> Any:
        """The windowed value whose timestamp, windows and pane record ``i`` has."""
        return self.wins[bisect.bisect_right(self.starts, i) - 1]

    def windowed_runs(self, rows: np.ndarray | None) -> list:
        """The windowed value of each record (of ``rows``, when given), in order."""
        wins, starts = self.wins, self.starts
        if len(wins) == 1:
            return wins * (self.n if rows is None else len(rows))
        if rows is None:
            rows = np.arange(self.n)
        run = np.searchsorted(np.asarray(starts), rows, side="right") - 1
        return [wins[j] for j in run.tolist()]


def _same_window(a: Any, b: Any) -> bool:
    """Whether two windowed values have the same timestamp, windows and pane (the elements of
    one bundle usually share the very same window and pane objects)."""
    return (a.timestamp_micros == b.timestamp_micros
            and (a.windows is b.windows or a.windows == b.windows)
            and (a.pane_info is b.pane_info or a.pane_info == b.pane_info))


def _present_values(values: list) -> list:
    return [None if v is _ABSENT else v for v in values]


def _windowed_outputs(dead: list, names: list[str], columns: list[list], wins: list):
    """Dead letters, then one report per record (a dict of ``names``) with its windowed value."""
    yield from dead
    if len(names) == 1:
        f = names[0]
        for v, w in zip(columns[0], wins):
            yield w.with_value({f: v})
        return
    for vals, w in zip(zip(*columns), wins):
        yield w.with_value(dict(zip(names, vals)))


def _row_number(offset: int | None, rows: np.ndarray | None, i: int) -> int | None:
    if rows is not None:
        return int(rows[i])
    return None if offset is None else offset + i


def _streams(ids: list) -> np.ndarray:
    """``stream_id`` of every record id (uint64): integer ids as their 64-bit two's
    complement at once, anything else one hash each."""
    if set(map(type, ids)) == {int}:
        try:
            return np.array(ids, dtype=np.int64).view(np.uint64)
        except OverflowError:  # beyond int64: stream_id masks to 64 bits
            pass
    return np.fromiter((stream_id(k) for k in ids), dtype=np.uint64, count=len(ids))


def _column(values: list) -> np.ndarray:
    """A column from record fields: numeric when every value is a (non-bool) number."""
    if all(issubclass(t, _NUMBER) and not issubclass(t, bool) for t in set(map(type, values))):
        return np.asarray(values, dtype=np.float64)
    return np.asarray(values, dtype=object)


_NUMBER = (int, float, np.integer, np.floating)


def dead_letter_outputs(pcoll: Any, label: str, fn: Any, main_name: str) -> Outputs:
    """``pcoll | label >> ParDo(fn)`` as its main elements and its dead letters: a tagged
    dead-letter output where the runner separates tagged outputs (one step), else
    :func:`split_dead_letters` (three). Sets ``tagged`` on a copy of ``fn`` (one transform may
    be applied to pipelines on different runners)."""
    fn = copy.copy(fn)
    if not separates_tagged_outputs(pcoll.pipeline):
        fn.tagged = False
        return split_dead_letters(pcoll | label >> beam.ParDo(fn), main_name)
    fn.tagged = True
    res = pcoll | label >> beam.ParDo(fn).with_outputs(DEAD_LETTER, main=main_name)
    return Outputs(main_name, res[main_name], res[DEAD_LETTER])


OUTPUTS = ("batches", "rows")


class Perturb(beam.PTransform):
    """``pcoll | Perturb(mechanism, ...)`` -> outputs with ``.reports`` and ``.dead_letter``.

    ``output="batches"`` (default): reports as Arrow batches (dicts for single records);
    ``output="rows"``: one ``beam.Row`` per report, the PCollection schema'd with the
    mechanism's report fields then the kept columns (their types from ``passthrough_schema`` or
    from the input PCollection's schema)."""

    def __init__(self, mechanism: Mechanism, columns: Mapping[str, str] | None = None,
                 keep: tuple[str, ...] = (), seed: Any = None, key_column: str | None = None,
                 passthrough_schema: pa.Schema | None = None, run_key: RunKey | None = None,
                 dead_letter_columns: str = "mapped", output: str = "batches") -> None:
        super().__init__()
        if output not in OUTPUTS:
            raise ValueError(f"output={output!r}: one of 'batches' (report batches) or 'rows' "
                             "(one schema'd beam.Row per report)")
        self.output = output
        self.fn = PerturbFn(mechanism, columns, keep, seed, key_column, passthrough_schema,
                            run_key, dead_letter_columns)

    @property
    def run_key(self) -> RunKey:
        return self.fn.run_key

    def expand(self, pcoll):
        row_type = None
        if self.output == "rows":  # the schema is known before the pipeline runs
            fn = self.fn
            row_type = report_row_type(fn.mechanism, kept_types(
                fn.keep, pcoll.element_type, fn.passthrough_schema))
        out = dead_letter_outputs(pcoll, "Perturb", self.fn, REPORTS)
        if row_type is None:
            return out
        names = [n for n, _ in row_type._fields]
        rows = out.reports | "AsRows" >> beam.ParDo(ReportsAsRows(names)).with_output_types(
            row_type)
        return Outputs(REPORTS, rows, out.dead_letter)
