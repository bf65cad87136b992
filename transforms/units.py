"""Contribution bounding per privacy unit: at most so many rows of each person reach a mechanism.

``BoundContributions(unit_column, run_key, max_partitions_per_unit=L0,
max_rows_per_partition=Linf, partition_fn=None)`` takes :class:`KeyedBatch` elements (raw rows
with their identities, as :class:`~ldp_beam.transforms.ReadTable` emits them) and keeps, for
every privacy unit (a distinct value of ``unit_column``):

* **LDP collection** (``partition_fn=None``): one partition, so at most ``Linf`` (the
  collection's ``max_reports_per_unit``) of the unit's rows, chosen uniformly at random among them
  (all of them when it has fewer);
* **central release** (``partition_fn(table)`` gives each row an integer partition, e.g. its
  histogram bucket or a (key, bucket) code): at most ``L0`` of the unit's partitions, chosen
  uniformly among its partitions, and at most ``Linf`` rows in each, chosen uniformly among its
  rows there (contribution bounding as in PipelineDP). Rows with a negative partition are rows the
  mechanism will reject: they never count against a bound and pass through, so the mechanism's
  validation dead-letters them with its own reason.

Outputs (:class:`BoundedRows`): ``.batches`` (``KeyedBatch.subset`` of the input batches: every
kept row keeps its record identity, hence its noise in :class:`~ldp_beam.transforms.Perturb`),
``.dead_letter`` (rows without a unit: ``{"reason", "record", "source", "row"}`` with ``record`` =
``{unit_column: value}``) and ``.dropped`` (``{"bounded_out": n}`` per batch that lost rows to the
bounds). Nothing is dropped uncounted: input rows = rows of ``.batches`` + dead letters + the sum
of ``bounded_out``.

The algorithm, and every part of it that does not need Beam, is :mod:`ldp_beam.bounding`
(pure: numpy and pyarrow): why the choice is uniform and retry-proof, the keyed unit hashes,
the sketch, its memory and the ``units`` cap (:class:`~ldp_beam.bounding.UnitLimitError`).
This module is its Beam shell: pass 1 (:class:`CandidatesFn`: a batch -> its candidates),
the sketch (:class:`BoundingCombineFn`, a ``CombineGlobally`` whose output is a side input),
pass 2 (:class:`FilterFn`: each batch keeps its rows found there) and
:class:`BoundContributions`, which wires them.

The second pass reads its input after the first has finished, so a runner that keeps
PCollections in memory between stages (the DirectRunner) would hold every batch meanwhile.
``p | BoundContributions(..., source=ReadTable(url))`` reads the input twice instead (the first
read only feeds the combine, the second streams through the filter): memory grows with the
units, not the rows. A row whose unit or partition differs between the reads (the source
changed) is dead-lettered, not kept. The first read decodes only the unit column, so a Parquet
page damaged in another column is seen by the second alone: its rows are the reader's dead
letters (in ``.read``), and a unit whose kept row was among them keeps none.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from ldp_beam.bounding import (_MASK64, _SHARD_MIN, U64, KeptRows, MISSING_UNIT_REASON, _Acc,
                               _concat, _Rows, _Spec, check_bound, reduce_candidates,
                               row_priorities, shard_of, unit_fingerprint, units_cap)
from ldp_beam.errors import ParameterError
from ldp_beam.minsketch import _MinSketch, _trim_heap
from ldp_beam.rng import RunKey

from .batches import KeyedBatch
from .perturb import dead_letter

BOUNDED_OUT = "bounded_out"


def _require_keyed(element: Any) -> KeyedBatch:
    if not isinstance(element, KeyedBatch):
        raise TypeError(f"BoundContributions takes KeyedBatch elements (rows with their record "
                        f"identities, as ReadTable emits them), not {type(element).__name__}: "
                        "the rows kept are chosen by their identities, which a bare batch "
                        "does not carry")
    return element


def _nbytes(x: Any) -> int:
    """The bytes of the numpy arrays in ``x`` (nested in dicts, lists, tuples, slots)."""
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(v) for v in x)
    if isinstance(x, _MinSketch):
        return 24 * (x.units + sum(x.queued))
    if isinstance(x, _Acc):
        return _nbytes(x.shards)
    if isinstance(x, KeptRows):
        return x.nbytes
    return 64


class _ArraysCoder(beam.coders.Coder):
    """Pickles the bounding's own elements (candidates, sketches), with a size estimate from
    their arrays' byte counts: Beam samples every PCollection's element sizes by encoding
    elements, which for these would pickle megabytes (a sketch: tens of them) only to count
    the bytes."""

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> Any:
        return pickle.loads(encoded)

    def is_deterministic(self) -> bool:
        return False

    def estimate_size(self, value: Any) -> int:
        return _nbytes(value)

    def to_type_hint(self):
        return Any


# KeptRows (the sketch's output, a side input) are encoded once: Beam's default coder for them
# (pickle) would also encode each one twice more only to estimate its size for its metrics.
beam.coders.registry.register_coder(KeptRows, _ArraysCoder)


class Candidates(dict):
    """A batch's bounding candidates: field name -> numpy array (see :class:`CandidatesFn`)."""


beam.coders.registry.register_coder(Candidates, _ArraysCoder)


@beam.typehints.with_output_types(KeptRows)  # its coder (below): one encode, no size encodes
class BoundingCombineFn(beam.CombineFn):
    """Merges candidates into the bounding sketch and returns :class:`KeptRows`.

    The sketch is split into 64 shards by unit hash; a shard is reduced when its unreduced
    entries exceed twice its reduced ones (and 4,096): each entry is sorted O(1) times on
    average, a reduction works on ~1/64 of the sketch (in cache, and no large temporary), and
    the sketch holds at most ~3x its reduced size. Every reduction checks the units counted so
    far against the cap: a part of the data never has more units than the whole, so an excess
    is caught while the sketch is at most ~3x the cap."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec

    def get_accumulator_coder(self) -> beam.coders.Coder:
        return _ArraysCoder()

    def create_accumulator(self) -> _Acc | _MinSketch:
        return _MinSketch(self.spec.row_aes_key) if self.spec.one_row else _Acc()

    def _keyed(self, acc: Any) -> Any:
        """A sketch decoded without its row key gets it back (it is never encoded)."""
        if isinstance(acc, _MinSketch):
            acc.key = self.spec.row_aes_key
        return acc

    def _reduce_shard(self, acc: _Acc, shard: int) -> None:
        sh = acc.shards[shard]
        c, units = reduce_candidates(_concat(sh[0], self.spec.partitioned), self.spec.l0,
                                     self.spec.linf, self.spec.partitioned)
        acc.shards[shard] = [[c], 0, int(c["u"].size), units]
        self.spec.too_many(sum(x[3] for x in acc.shards.values()))

    def _maybe_reduce(self, acc: _Acc, shard: int, force: bool = False) -> None:
        parts, pending, reduced, _ = acc.shards[shard]
        if pending == 0 and len(parts) <= 1:
            return
        if force or pending > max(_SHARD_MIN, 2 * reduced):
            self._reduce_shard(acc, shard)

    def add_input(self, acc: _Acc | _MinSketch, c: dict) -> _Acc | _MinSketch:
        if c["u"].size == 0:
            return acc
        if isinstance(acc, _MinSketch):
            units = self._keyed(acc).add(c["u"], c["rh"], c["s"], c["rid"])
            if units is not None:  # with the C insert: the units before this batch
                self.spec.too_many(units)
            return acc
        shard = shard_of(c["u"])
        order = np.argsort(shard, kind="stable")  # a radix sort for 8-bit keys
        shard = shard[order]
        c = {f: v[order] for f, v in c.items()}
        cuts = np.flatnonzero(np.diff(shard)) + 1
        for a, b in zip(np.concatenate([[0], cuts]).tolist(),
                        np.concatenate([cuts, [shard.size]]).tolist()):
            k = int(shard[a])
            acc.add(k, {f: v[a:b] for f, v in c.items()})  # views of one sorted copy
            self._maybe_reduce(acc, k)
        return acc

    def merge_accumulators(self, accs) -> _Acc | _MinSketch:
        accs = iter(accs)
        out = self._keyed(next(accs))
        for a in accs:
            if isinstance(out, _MinSketch):
                out.merge(self._keyed(a))
                self.spec.too_many(out.units)
                continue
            for k, (parts, pending, reduced, units) in a.shards.items():
                if reduced:
                    out.add(k, parts[0], reduced=True, units=units)
                for part in parts[1:] if reduced else parts:
                    out.add(k, part)
                self._maybe_reduce(out, k)
        return out

    def compact(self, acc: _Acc | _MinSketch) -> _Acc | _MinSketch:
        if isinstance(acc, _MinSketch):
            self._keyed(acc).freeze()  # its tables' slots are freed before Beam encodes it
            return acc
        for k in list(acc.shards):
            self._maybe_reduce(acc, k, force=True)
        return acc

    def extract_output(self, acc: _Acc | _MinSketch) -> KeptRows:
        if isinstance(acc, _MinSketch):
            self.spec.too_many(acc.units)
            kept = self._keyed(acc).kept_rows()
            _trim_heap()  # the merge's decoding left garbage: back before the side input's
            return kept
        self.compact(acc)
        units = sum(x[3] for x in acc.shards.values())
        self.spec.too_many(units)
        c = _concat([x[0][0] for x in acc.shards.values() if x[0]], self.spec.partitioned)
        return KeptRows.of(c, units, self.spec.partitioned)


# --------------------------------------------------------------------------- the two passes
class CandidatesFn(beam.DoFn):
    """Pass 1: a batch -> its bounding candidates (keyed hashes and priorities only)."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec

    def process(self, element: Any):
        b = _require_keyed(element)
        rows = _Rows(self.spec, b)
        idx = np.flatnonzero(rows.cand)
        if idx.size == 0:
            return
        spec = self.spec
        ids = rows.ids if idx.size == rows.n else rows.ids[idx]
        stream = U64(int(b.stream) & _MASK64)
        c = {"u": rows.units(spec, idx), "rh": row_priorities(spec.row_key, b.stream, ids),
             "rid": ids}
        if spec.one_row:  # the table takes the batch as it is (a reduction would sort it)
            c["s"] = np.full(1, stream)  # one stream for all the rows
            yield Candidates(c)
            return
        c["s"] = np.full(idx.size, stream)
        if spec.partitioned:
            c["p"] = rows.parts[idx]
            c["pp"] = spec.part_priorities(c["u"], c["p"])
        yield Candidates(reduce_candidates(c, spec.l0, spec.linf, spec.partitioned)[0])


_DEAD, _DROPPED = "dead_letter", "dropped"  # the filter's tagged outputs


class FilterFn(beam.DoFn):
    """Pass 2: a batch -> the subset kept (main output), the dead letters of rows without a unit
    (tagged ``dead_letter``) and the count of rows bounded out (tagged ``dropped``): one step
    with three outputs, not one output split by three more steps."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec
        self.n_in = Metrics.counter("ldp_beam", "bounding_rows_in")
        self.n_kept = Metrics.counter("ldp_beam", "bounding_rows_kept")
        self.n_out = Metrics.counter("ldp_beam", "bounding_rows_bounded_out")
        self.n_dead = Metrics.counter("ldp_beam", "bounding_rows_dead_lettered")

    def process(self, element: Any, kept: KeptRows):
        b = _require_keyed(element)
        spec = self.spec
        rows = _Rows(spec, b)
        n = rows.n
        self.n_in.inc(n)
        if n == 0:
            return
        keep = np.zeros(n, bool)
        changed = np.zeros(n, bool)
        hit, entry = kept.lookup(b.stream, rows.ids)
        if entry is not None:
            # a kept row must still be a row of the same unit (and partition): a source read
            # twice that changed in between is caught here, not trusted
            hits = np.flatnonzero(hit)
            sel = rows.cand[hits]
            hi = hits[sel]
            same = unit_fingerprint(rows.units(spec, hi)) == entry[0][sel]
            if spec.partitioned:
                same &= rows.parts[hi] == entry[1][sel]
            keep[hi[same]] = True
            changed[hi[~same]] = True
        if spec.partitioned:  # a unit and a partition < 0: the mechanism rejects the row
            keep |= ~rows.missing & ~rows.cand
        bounded = rows.cand & ~keep & ~changed
        dead = np.flatnonzero(rows.missing | changed)
        if dead.size:
            for d in self._dead_letters(b, rows, dead, changed):
                yield beam.pvalue.TaggedOutput(_DEAD, dict(d))
        n_keep = int(keep.sum())
        n_bounded = int(bounded.sum())
        self.n_kept.inc(n_keep)
        self.n_out.inc(n_bounded)
        self.n_dead.inc(int(dead.size))
        if n_keep == n:
            yield b
        elif n_keep:
            yield b.subset(np.flatnonzero(keep))
        if n_bounded:
            yield beam.pvalue.TaggedOutput(_DROPPED, {BOUNDED_OUT: n_bounded})

    def _dead_letters(self, b: KeyedBatch, rows: _Rows, dead: np.ndarray, changed: np.ndarray):
        col = self.spec.unit_column
        if rows.absent:
            reason = f"input has no privacy-unit column {col!r}"
            for i in dead.tolist():
                yield dead_letter(reason, {}, b.source, int(rows.ids[i]))
            return
        values = b.table.column(col).take(pa.array(dead)).to_pylist()
        for i, v in zip(dead.tolist(), values):
            if rows.bad_type is not None:
                reason = rows.bad_type
            elif changed[i]:
                reason = (f"privacy-unit column {col!r}: the row's unit or partition differs "
                          "from the first pass over the input (the source changed while it was "
                          "read); not kept")
            else:
                reason = MISSING_UNIT_REASON.format(col=col)
            yield dead_letter(reason, {col: v}, b.source, int(rows.ids[i]))


class BoundedRows:
    """The outputs of :class:`BoundContributions`: ``.batches`` (kept rows), ``.dead_letter``
    (rows without a unit), ``.dropped`` (``{"bounded_out": n}`` counts) and, with ``source=``,
    ``.read`` (the source's outputs of the read that was filtered: its ``.batches`` are the rows
    read, its ``.dead_letter`` the reader's own dead letters)."""

    def __init__(self, batches, dead_letter, dropped, read=None) -> None:
        self.batches, self.dead_letter, self.dropped, self.read = \
            batches, dead_letter, dropped, read

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)


class BoundContributions(beam.PTransform):
    """Bound each privacy unit's contribution (see the module docstring).

    ``unit_column``: the column naming each row's privacy unit (a person). ``run_key``: the
    run's :class:`RunKey` (the one its noise uses; there is no default: a bounding not tied to
    the run would be reproducible by whoever sees the code). ``max_partitions_per_unit`` (L0)
    and ``max_rows_per_partition`` (Linf): integers >= 1; for an LDP collection
    ``max_rows_per_partition`` is its ``max_reports_per_unit``. ``partition_fn(table)`` -> one
    int64/uint64 partition code per row (negative: a row the mechanism rejects, passed through
    uncounted); None for one partition. ``max_units``: the most distinct units allowed (default
    the ``units`` cap, ``LDP_BEAM_MAX_UNITS``). ``source``: a transform that reads the input
    from the pipeline's root (e.g. a :class:`ReadTable`); the input is then read twice and
    memory stays flat (apply as ``p | BoundContributions(..., source=...)``).

    Output: :class:`BoundedRows` (``.batches``, ``.dead_letter``, ``.dropped``, ``.read``).
    """

    def __init__(self, unit_column: str, run_key: RunKey, max_partitions_per_unit: int = 1,
                 max_rows_per_partition: int = 1,
                 partition_fn: Callable[[Any], np.ndarray] | None = None,
                 max_units: int | None = None, *, source: beam.PTransform | None = None) -> None:
        super().__init__()
        if not isinstance(unit_column, str) or not unit_column:
            raise ParameterError("unit_column", unit_column, "the name of the privacy-unit "
                                 "column (non-empty text)")
        if not isinstance(run_key, RunKey):
            raise ParameterError("run_key", run_key, "the run's RunKey (RunKey.new(), the key "
                                 "its noise uses)")
        l0 = check_bound("max_partitions_per_unit", max_partitions_per_unit)
        linf = check_bound("max_rows_per_partition", max_rows_per_partition)
        if partition_fn is not None and not callable(partition_fn):
            raise ParameterError("partition_fn", partition_fn, "None or a function of a batch's "
                                 "table returning one integer partition code per row")
        if max_units is None:
            cap, explicit = units_cap(), False
        else:
            cap, explicit = check_bound("max_units", max_units), True
        if source is not None:
            names = _source_columns(source)
            if names is not None and unit_column not in names:
                raise ParameterError("unit_column", unit_column,
                                     f"a column of the input (its columns: {names})")
        self.unit_column = unit_column
        self.max_partitions_per_unit, self.max_rows_per_partition = l0, linf
        self.max_units = cap
        self.source = source
        self.spec = _Spec(unit_column, run_key, l0, linf, partition_fn, cap, explicit)

    def _first_read(self) -> beam.PTransform:
        """The first read only feeds the sketch: without ``partition_fn`` it needs the unit
        column alone (Parquet then decodes nothing else); ``partition_fn`` may read any."""
        if self.spec.partitioned:
            return self.source
        return _projected(self.source, [self.unit_column])

    def expand(self, pvalue):
        read = None
        if self.source is not None:
            if not isinstance(pvalue, beam.pvalue.PBegin):
                raise TypeError("BoundContributions(source=...) reads its input itself: apply "
                                "it to the pipeline (p | BoundContributions(...))")
            first = _batches(pvalue | "ReadUnits" >> self._first_read())
            read = pvalue | "ReadRows" >> self.source
            rows = _batches(read)
        else:
            first = rows = pvalue
        kept = (first | "Candidates" >> beam.ParDo(CandidatesFn(self.spec))
                .with_output_types(Candidates)
                | "Sketch" >> beam.CombineGlobally(BoundingCombineFn(self.spec))
                .without_defaults().with_output_types(KeptRows))
        out = rows | "Filter" >> beam.ParDo(
            FilterFn(self.spec), beam.pvalue.AsSingleton(kept, default_value=KeptRows())
        ).with_outputs(_DEAD, _DROPPED, main="batches")
        return BoundedRows(out.batches, out[_DEAD], out[_DROPPED], read)


def _projected(source: Any, columns: list[str]) -> Any:
    """``source`` reading only ``columns`` when it can (a file :class:`ReadTable`), else
    ``source`` itself."""
    project = getattr(source, "with_columns", None)
    if project is None or getattr(source, "source", None) is not None:
        return source
    return project(columns)


def _batches(out: Any) -> Any:
    return getattr(out, "batches", out)


def _source_columns(source: Any) -> list[str] | None:
    try:
        schema = source.schema
    except Exception:  # a source that cannot tell its schema before it runs
        return None
    return list(schema.names) if isinstance(schema, pa.Schema) else None


__all__ = ["BOUNDED_OUT", "BoundContributions", "BoundedRows", "BoundingCombineFn", "Candidates",
           "CandidatesFn", "FilterFn"]
