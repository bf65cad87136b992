"""The generic estimator CombineFn: any registered estimator, globally, per key or per window.

The accumulator is the estimator's own (small numpy array); ``add_input`` folds a whole report
batch with one vectorized call. ``ValidateReports`` sends malformed reports (telemetry from
untrusted clients) to a dead-letter output before they reach the accumulator.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from ldp_beam.core import Estimator
from ldp_beam.errors import EmptyAccumulatorError

from .batches import KeyedBatch, get_column, is_batch, num_rows, report_columns, row_dict, take
from .perturb import dead_letter, split_dead_letters


@dataclass(frozen=True)
class EstimateFailure:
    """What ``EstimatorCombineFn(on_empty="report")`` emits when no estimate is possible."""

    mechanism: str
    n_reports: int
    reason: str


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


class Accumulate(beam.CombineFn):
    """Like EstimatorCombineFn but outputs the raw accumulator (for checkpoints and tests)."""

    def __init__(self, estimator: Estimator) -> None:
        self.inner = EstimatorCombineFn(estimator)

    def create_accumulator(self):
        return self.inner.create_accumulator()

    def add_input(self, acc, element):
        return self.inner.add_input(acc, element)

    def merge_accumulators(self, accs):
        return self.inner.merge_accumulators(accs)

    def extract_output(self, acc):
        return acc


class EstimateGlobally(beam.PTransform):
    """Report batches -> one Estimate (or one per window with ``windowed=True``)."""

    def __init__(self, estimator: Estimator, windowed: bool = False) -> None:
        super().__init__()
        self.estimator, self.windowed = estimator, windowed

    def expand(self, pcoll):
        combine = beam.CombineGlobally(EstimatorCombineFn(self.estimator))
        if self.windowed:
            combine = combine.without_defaults()
        return pcoll | combine


class EstimatePerKey(beam.PTransform):
    """``(key, report batch)`` pairs -> ``(key, Estimate)``."""

    def __init__(self, estimator: Estimator) -> None:
        super().__init__()
        self.estimator = estimator

    def expand(self, pcoll):
        return pcoll | beam.CombinePerKey(EstimatorCombineFn(self.estimator))


class SplitByKey(beam.DoFn):
    """A report batch -> ``(key, sub-batch)`` per distinct value of ``column`` (vectorized)."""

    def __init__(self, column: str) -> None:
        self.column = column

    def process(self, element: Any):
        table = element.table if isinstance(element, KeyedBatch) else element
        keys = get_column(table, self.column)
        if isinstance(keys, np.ndarray) and keys.dtype == object:
            keys = np.asarray([str(k) if k is not None else "" for k in keys])
        uniq, inv = np.unique(keys, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1))
        for j, key in enumerate(uniq.tolist()):
            yield key, take(table, order[bounds[j]:bounds[j + 1]])


class ValidateReportsFn(beam.DoFn):
    """Pass well-formed reports; dead-letter the rest with the estimator's reason."""

    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator
        self.fields = estimator.mechanism.report_fields
        self.n_in = Metrics.counter("ldp_beam", "reports_in")
        self.n_bad = Metrics.counter("ldp_beam", "reports_invalid")

    def process(self, element: Any):
        batch = is_batch(element)
        table = element.table if isinstance(element, KeyedBatch) else element
        if batch:
            cols = report_columns(table, self.fields)
        elif isinstance(element, dict):
            cols = {name: np.asarray([element[name]], dtype=object) for name, _ in self.fields
                    if name in element}
        else:
            self.n_in.inc()
            self.n_bad.inc()
            yield dead_letter(
                f"unsupported report type {type(element).__name__}", repr(element)[:200])
            return
        n = num_rows(table) if batch else 1
        reasons = self.estimator.check_reports(cols, n)
        self.n_in.inc(n)
        bad = reasons.bad
        if not bad.any():
            yield element if not isinstance(element, KeyedBatch) else table
            return
        self.n_bad.inc(int(bad.sum()))
        msgs = reasons.as_dict()
        for i in np.flatnonzero(bad).tolist():
            rec = row_dict(table, i) if batch else dict(element)
            yield dead_letter(msgs[i], rec)
        if batch:
            ok = np.flatnonzero(~bad)
            if ok.size:
                yield take(table, ok)


class ValidateReports(beam.PTransform):
    def __init__(self, estimator: Estimator) -> None:
        super().__init__()
        self.fn = ValidateReportsFn(estimator)

    def expand(self, pcoll):
        return split_dead_letters(pcoll | "Validate" >> beam.ParDo(self.fn), "reports")


def table_of(batch: Any) -> pa.Table:
    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, pa.RecordBatch):
        return pa.Table.from_batches([batch])
    return pa.table({k: np.asarray(v) for k, v in batch.items()})
