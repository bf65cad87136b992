"""The generic estimator CombineFn: any registered estimator, globally, per key or per window.

The accumulator is the estimator's own (small numpy array); ``add_input`` folds a whole report
batch with one vectorized call. ``ValidateReports`` sends malformed reports (telemetry from
untrusted clients) to a dead-letter output before they reach the accumulator.
"""
from __future__ import annotations

from typing import Any, Mapping

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from ldp_beam.core import CountEstimator, Estimator, Reasons
from ldp_beam.errors import EmptyAccumulatorError

from .batches import (EstimateFailure, KeyedBatch, check_report_field, is_batch, key_text,
                      num_rows, report_columns, report_field_columns, row_dict, take)
from .perturb import (DeadLetteringFn, clipped_record as _clipped, dead_letter,
                      dead_letter_outputs)


class EstimatorCombineFn(beam.CombineFn):
    """create/add/merge/finalize delegate to the estimator; ``extract_output`` releases once.

    ``on_empty``: what to do when the accumulator cannot support an estimate (no reports, or
    too few): ``"raise"`` fails the pipeline with the estimator's message; ``"report"`` emits an
    :class:`EstimateFailure` instead (used by the CLI and per-key/per-window jobs, where one empty
    group must not sink the others).
    """

    def __init__(self, estimator: Estimator, on_empty: str = "raise") -> None:
        if on_empty not in ("raise", "report"):
            raise ValueError(f"on_empty = {on_empty!r}: expected 'raise' or 'report'")
        self.estimator = estimator
        self.fields = estimator.mechanism.report_fields
        self.on_empty = on_empty

    def create_accumulator(self):
        return self.estimator.create()

    def add_input(self, acc, element):
        return self.estimator.add(acc, report_columns(element, self.fields))

    def merge_accumulators(self, accs):
        return self.estimator.merge(list(accs))

    def compact(self, acc):
        return acc

    def extract_output(self, acc):
        try:
            return self.estimator.finalize(acc)
        except EmptyAccumulatorError as exc:
            if self.on_empty == "raise":
                raise
            return EstimateFailure(self.estimator.mechanism.name,
                                   self.estimator.n_reports(acc), str(exc))


FOLD_RECORDS = 1024  # single reports folded into the accumulator together


class _Folding:
    """An accumulator with the single reports not yet folded into it (see
    :class:`FoldingCombineFn`): ``pending`` holds one list of values per report field."""

    __slots__ = ("acc", "pending")

    def __init__(self, acc: Any, pending: list | None = None) -> None:
        self.acc = acc
        self.pending = pending

    def __reduce__(self):
        return (_Folding, (self.acc, self.pending))


class FoldingCombineFn(EstimatorCombineFn):
    """:class:`EstimatorCombineFn` for streams of single reports (the element path): a count
    accumulator's bincount is exact and additive, so single reports are folded
    ``FOLD_RECORDS`` at a time with one vectorized ``add`` instead of one per report; the
    accumulator is the same as if each had been added alone. Report batches, and estimators
    whose ``add`` is not the count's, are added as they come.

    Pending reports are kept as their field values, not as the report dicts: values (numbers)
    are not tracked by Python's garbage collector, dicts kept alive are (see
    :class:`~ldp_beam.transforms.perturb._RecordBuffer`)."""

    def __init__(self, estimator: Estimator, on_empty: str = "raise") -> None:
        super().__init__(estimator, on_empty)
        self.folds = type(estimator).add is CountEstimator.add
        self.names = tuple(name for name, _ in self.fields)

    def create_accumulator(self):
        return _Folding(self.estimator.create())

    def add_input(self, acc, element):
        if self.folds and type(element) is dict and not isinstance(
                next(iter(element.values()), None), np.ndarray):
            names = self.names
            if len(names) == 1:
                name = names[0]
                if name in element:
                    pending = acc.pending
                    if pending is None:
                        pending = acc.pending = [[]]
                    col = pending[0]
                    col.append(element[name])
                    if len(col) >= FOLD_RECORDS:
                        self._fold(acc)
                    return acc
            elif all(name in element for name in names):
                pending = acc.pending
                if pending is None:
                    pending = acc.pending = [[] for _ in names]
                for name, col in zip(names, pending):
                    col.append(element[name])
                if len(pending[0]) >= FOLD_RECORDS:
                    self._fold(acc)
                return acc
            # a report without every field: after those before it, alone (it fails there,
            # as it would have in a fold)
        self._fold(acc)
        acc.acc = super().add_input(acc.acc, element)
        return acc

    def _fold(self, acc: _Folding) -> None:
        pending = acc.pending
        if not pending or not pending[0]:
            return
        acc.pending = None
        cols = {}
        try:
            for (name, dtype), vals in zip(self.fields, pending):
                types = set(map(type, vals))
                if types == {int}:
                    arr = np.array(vals, dtype=np.int64)
                elif types == {float}:
                    arr = np.array(vals, dtype=np.float64)
                else:
                    raise TypeError("mixed values")
                chk = check_report_field(arr, name, dtype)
                if chk.bad.any():
                    raise TypeError("invalid values")
                cols[name] = chk.values
        except (KeyError, TypeError, OverflowError):  # one at a time, as they would have been
            for vals in zip(*pending):
                acc.acc = super().add_input(acc.acc, dict(zip(self.names, vals)))
            return
        acc.acc = self.estimator.add(acc.acc, cols)

    def merge_accumulators(self, accs):
        accs = list(accs)
        for a in accs:
            self._fold(a)
        return _Folding(self.estimator.merge([a.acc for a in accs]))

    def compact(self, acc):
        self._fold(acc)
        return acc

    def extract_output(self, acc):
        self._fold(acc)
        return super().extract_output(acc.acc)


class Accumulate(EstimatorCombineFn):
    """Like EstimatorCombineFn but outputs the raw accumulator (for checkpoints and tests)."""

    def extract_output(self, acc):
        return acc


class EstimateGlobally(beam.PTransform):
    """Report batches -> one Estimate (or one per window with ``windowed=True``)."""

    def __init__(self, estimator: Estimator, windowed: bool = False) -> None:
        super().__init__()
        self.estimator, self.windowed = estimator, windowed

    def expand(self, pcoll):
        combine = beam.CombineGlobally(FoldingCombineFn(self.estimator))
        if self.windowed:
            combine = combine.without_defaults()
        return pcoll | combine


class EstimatePerKey(beam.PTransform):
    """``(key, report batch)`` pairs -> ``(key, Estimate)``."""

    def __init__(self, estimator: Estimator) -> None:
        super().__init__()
        self.estimator = estimator

    def expand(self, pcoll):
        return pcoll | beam.CombinePerKey(FoldingCombineFn(self.estimator))


class SplitByKey(beam.DoFn):
    """A report batch -> ``(key, sub-batch)`` per distinct value of ``column`` (vectorized), the
    key as its text (:func:`~ldp_beam.transforms.batches.key_text`; a null is ``""``)."""

    def __init__(self, column: str) -> None:
        self.column = column

    def process(self, element: Any):
        table = element.table if isinstance(element, KeyedBatch) else element
        keys = key_text(table, self.column).to_numpy(zero_copy_only=False).astype(str)
        uniq, inv = np.unique(keys, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
        for j, key in enumerate(uniq.tolist()):
            yield key, take(table, order[bounds[j]:bounds[j + 1]])


class ValidateReportsFn(DeadLetteringFn):
    """Pass well-formed reports; dead-letter the rest with the reason.

    Two checks, in this order, before anything is cast: each report field's value must be a
    value of the field's declared dtype (:func:`~ldp_beam.transforms.batches.check_report_field`:
    text from CSV or JSON is parsed, never coerced, so ``"x"`` and ``"1.5"`` are not integers and
    ``"65536"`` is out of range for uint16; numbers of another dtype must fit); then the
    estimator's own check (:meth:`~ldp_beam.core.Estimator.check_reports`, e.g. codes within the
    domain) on the typed values. A row keeps its first reason.

    Emits, for a batch, the valid rows as a pyarrow RecordBatch (or dict of columns) whose report
    fields have their declared dtypes (other columns as they were); for a single report, the dict
    with typed report fields. Dead letters hold the row as read (text stays text; texts over
    2,000 characters are cut, saying so), with ``source``/``row`` when the batch is keyed.
    """

    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator
        self.fields = tuple(estimator.mechanism.report_fields)
        self.n_in = Metrics.counter("ldp_beam", "reports_in")
        self.n_bad = Metrics.counter("ldp_beam", "reports_invalid")

    def check(self, element: Any) -> tuple[Reasons, dict[str, np.ndarray], int]:
        """``(reasons, typed report-field columns, number of reports)`` of a batch or report."""
        raw, n = report_field_columns(element, self.fields)
        reasons = Reasons(n)
        typed: dict[str, np.ndarray] = {}
        for name, dtype in self.fields:
            if name not in raw:
                continue
            chk = check_report_field(raw[name], name, dtype)
            reasons.flag(chk.bad, chk.reasons.__getitem__)
            typed[name] = chk.values
        est = self.estimator.check_reports(typed, n)
        new = est.bad & ~reasons.bad
        if new.any():
            msgs = est.as_dict()
            # worded again on plain Python values (3, not np.uint16(3)): the checks are per row
            idx = np.flatnonzero(new)
            again = self.estimator.check_reports(
                {k: v[idx].astype(object) for k, v in typed.items()}, idx.size).as_dict()
            for j, i in enumerate(idx.tolist()):
                msgs[i] = again.get(j, msgs[i])
            reasons.flag(new, msgs.__getitem__)
        return reasons, typed, n

    def outputs(self, element: Any):
        """The element's valid reports and a dead letter for each invalid one."""
        keyed = element if isinstance(element, KeyedBatch) else None
        table = element.table if keyed is not None else element
        batch = is_batch(element)
        if not batch and not isinstance(element, Mapping):
            self.n_in.inc()
            self.n_bad.inc()
            yield dead_letter(
                f"unsupported report type {type(element).__name__}", repr(element)[:200])
            return
        reasons, typed, n = self.check(table)
        self.n_in.inc(n)
        bad = reasons.bad
        if bad.any():
            self.n_bad.inc(int(bad.sum()))
            msgs = reasons.as_dict()
            for i in np.flatnonzero(bad).tolist():
                rec, note = _clipped(row_dict(table, i) if batch else dict(element))
                if keyed is not None:
                    yield dead_letter(msgs[i] + note, rec, keyed.source, keyed.offset + i)
                else:
                    yield dead_letter(msgs[i] + note, rec)
        ok = np.flatnonzero(~bad)
        if not batch:
            if ok.size:
                yield {**element, **{k: v[0].item() for k, v in typed.items()}}
            return
        if ok.size:
            yield _typed_rows(table, typed, ok, self.fields)


def _typed_rows(table: Any, typed: dict[str, np.ndarray], ok: np.ndarray, fields: tuple) -> Any:
    """Rows ``ok`` of a report batch with its report fields replaced by their typed values."""
    whole = ok.size == num_rows(table)
    if isinstance(table, (pa.RecordBatch, pa.Table)):
        if isinstance(table, pa.Table):
            table = table.combine_chunks().to_batches()[0] if table.num_rows else \
                pa.RecordBatch.from_pylist([], schema=table.schema)
        dtypes = dict(fields)
        idx = None if whole else pa.array(ok)
        arrays, out_fields = [], []
        for f in table.schema:
            if f.name in typed:
                vals = typed[f.name] if whole else typed[f.name][ok]
                arr = pa.array(vals, type=pa.from_numpy_dtype(np.dtype(dtypes[f.name])))
                arrays.append(arr)
                out_fields.append(pa.field(f.name, arr.type, nullable=False))
            else:
                col = table.column(f.name)
                arrays.append(col if whole else col.take(idx))
                out_fields.append(f)
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(out_fields,
                                                                   metadata=table.schema.metadata))
    out = {k: (np.asarray(v) if whole else np.asarray(v)[ok]) for k, v in table.items()}
    for k, v in typed.items():
        out[k] = v if whole else v[ok]
    return out


class ValidateReports(beam.PTransform):
    def __init__(self, estimator: Estimator) -> None:
        super().__init__()
        self.fn = ValidateReportsFn(estimator)

    def expand(self, pcoll):
        return dead_letter_outputs(pcoll, "Validate", self.fn, "reports")


# --------------------------------------------------------------------------- per-key central releases
def per_key_part(unit: str, by: str):
    """(key, report sub-batch) -> (key, (the reports without key and unit, their units)): what
    each key's accumulator folds. A null key is the key "" (SplitByKey's), selected or listed
    like any other: its rows are never dropped unseen."""
    def part(kv):
        key, table = kv
        t = table if isinstance(table, pa.Table) else pa.Table.from_batches([table])
        units = set(t.column(unit).cast(pa.string()).to_pylist())
        return key, (t.drop_columns([by, unit]), units)
    return part


class PerKeyCombineFn(beam.CombineFn):
    """Per key: the release's accumulator and the set of distinct units (for the selection)."""

    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator

    def create_accumulator(self):
        return [self.estimator.create(), set()]

    def add_input(self, acc, element):
        table, units = element
        acc[0] = self.estimator.add(acc[0], report_columns(table, self.estimator.mechanism
                                                           .report_fields))
        acc[1] |= units
        return acc

    def merge_accumulators(self, accs):
        accs = list(accs)
        return [self.estimator.merge([a[0] for a in accs]), set().union(*(a[1] for a in accs))]

    def extract_output(self, acc):
        return acc[0], len(acc[1])


#: the result line of a per-key release with public keys counting the rows of unlisted keys
NOT_IN_KEYS = "not_in_keys"


class ReleaseKeys(beam.DoFn):
    """Select keys (public list, or private partition selection on distinct-unit counts) and
    release each kept key's histogram with noise addressed by the key."""

    def __init__(self, estimator: Any, public: tuple | None, selector: Any, seed: int,
                 rule: Any) -> None:
        self.estimator, self.public, self.selector, self.seed = estimator, public, selector, seed
        self.rule = rule  # (key, estimate) -> output row: which groups are published

    def process(self, items):
        # lazy: ldp_beam.central.partition costs 13 ms at import (measured), only per-key
        # central releases need it (not `estimate` of LDP reports)
        from ldp_beam.central.partition import selection_source

        found = dict(items)
        if self.public is not None:
            chosen = list(self.public)
            # rows of keys not listed (bounding passed them, uncounted against L0): never
            # released, counted for the curator's records
            listed = set(chosen)
            yield {NOT_IN_KEYS: {"keys": sum(k not in listed for k in found),
                                 "rows": sum(int(self.estimator.n_reports(a))
                                             for k, (a, _) in found.items() if k not in listed)}}
        else:
            chosen = [k for k in sorted(found)
                      if self.selector.keep(found[k][1], selection_source(self.seed, k))]
        for key in chosen:
            acc = found.get(key, (None, 0))[0]
            yield self.rule(key, self.estimator.finalize_key(acc, key))
