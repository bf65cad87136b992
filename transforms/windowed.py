"""Windowed streaming estimation on Beam: the transforms behind ``ldp-beam stream``.

Records at their event times (from the spool source, :mod:`ldp_beam.transforms.spool`, or a
Pub/Sub source) are windowed into fixed event-time windows, validated and folded a batch at a
time per window (:class:`BatchPerWindowFn`), estimated or released once per firing
(:class:`PaneFn`, :class:`UnitPaneFn` with a privacy unit) and written by one
:class:`StreamSink`. What a stream promises (triggers, the release range of a central-DP stream,
privacy units, accounting) is documented with the command, :mod:`ldp_beam.pipelines.stream`,
which configures these transforms; nothing here reads options or starts a pipeline.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import hashlib
import dataclasses
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Iterable, Mapping, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger as tr
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import (FixedWindows, GlobalWindow, GlobalWindows,
                                            TimestampedValue)
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from ldp_beam.bounding import bound_candidates, fold_candidates
from ldp_beam.central.histogram import HistogramReleaseEstimator, release_source
from ldp_beam.core import CentralRelease, Estimate, Mechanism
from ldp_beam.estimators import estimator_for
from ldp_beam.longitudinal import UnitHasher, UnitState, priority
from ldp_beam.prf import keyed_digest
from ldp_beam.privacy import PrivacyGuarantee, compose
from ldp_beam.transforms.batches import num_rows, report_columns
from ldp_beam.transforms.perturb import dead_letter, split_dead_letters
from ldp_beam.transforms.combine import EstimateFailure, EstimatorCombineFn
from ldp_beam.jsonio import json_line as to_json_line
from ldp_beam.transforms.stream_results import open_results
from ldp_beam.transforms.spool import (DEAD, HEARTBEAT, LEDGER, MARK, RECORD, RECORDS, WindowClock,
                                       file_line, iso, parse_line, pseudonymize, record_settled,
                                       WITHHELD, _dead, _shown)


PANE = "pane"
# OUT/curator/ is the collector's own bookkeeping, never to publish: CURATOR_NOTE, written inside
# it, says why and what may be published instead.
CURATOR = "curator"
ESTIMATES = "estimates.jsonl"
DEAD_LETTERS, LEDGER_FILE, SUMMARY, RANGE_FILE = (
    f"{CURATOR}/deadletter.jsonl", f"{CURATOR}/ledger.jsonl", f"{CURATOR}/summary.json",
    f"{CURATOR}/release_range.json")
CURATOR_NOTE = (
    "CURATOR-ONLY. The files in this folder are the stream collector's bookkeeping: exact record\n"
    "counts per window and pane (ledger.jsonl, summary.json), the records it refused with their\n"
    "reasons (deadletter.jsonl) and the release range it keeps across restarts\n"
    "(release_range.json). For a central-DP stream the exact counts are what the releases hide:\n"
    "never publish them. What may be published is ../estimates.jsonl (and the --results sinks).\n")
TIMING = {0: "early", 1: "on_time", 2: "late", 3: "unknown"}
MAX_RANGE_WINDOWS = 100_000  # windows in a central release range (each is a release)
DIRECT_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


class StreamConfigError(ValueError):
    """A streaming configuration that cannot be run as asked (the message names the option)."""


# --------------------------------------------------------------------------- privacy units
MEMO_FIELD = "memo_id"  # the report field of a memoized report's slot, by default


@dataclass(frozen=True)
class PrivacyUnit:
    """A stream's privacy unit ("Privacy units" in :mod:`ldp_beam.pipelines.stream`): ``field``, the
    record field with the unit's id; ``state``, its durable per-unit state; at most ``max_reports``
    of a unit's reports (records, for a central release) estimated per window; its cumulative loss
    capped at ``budget`` (None: tracked, not capped); ``memo_field``: LDP, the report field naming a
    memoized report's slot (None: every report is charged)."""

    field: str
    state: UnitState | None
    max_reports: int = 1
    budget: float | None = None
    memo_field: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field:
            raise StreamConfigError(f"--privacy-unit {self.field!r}: expected a record field")
        k = self.max_reports
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise StreamConfigError(f"--max-reports-per-unit {k!r}: expected an integer >= 1")
        b = self.budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))
                              or not math.isfinite(b) or b <= 0):
            raise StreamConfigError(f"--unit-budget {b!r}: expected a finite epsilon > 0")
        m = self.memo_field
        if m is not None and (not isinstance(m, str) or not m or m == self.field):
            raise StreamConfigError(f"--memo-field {m!r}: expected a report field other than "
                                    "the privacy unit's")


def check_unit(mechanism: Mechanism, unit: PrivacyUnit,
               columns: Mapping[str, str] | None = None) -> None:
    """Refuse a privacy unit that cannot serve ``mechanism`` (StreamConfigError naming the
    option): a memo field for a central release, a unit or memo field that is one of the
    mechanism's inputs, a budget without a finite pure epsilon to charge."""
    central = isinstance(mechanism, CentralRelease)
    g = mechanism.guarantee
    if unit.memo_field is not None and central:
        raise StreamConfigError(f"--memo-field: {mechanism.name} is a central-DP release of raw "
                                "records; memoized reports are LDP's")
    if central:
        inputs = set((columns or {r.name: r.name for r in mechanism.roles
                                  if r.required}).values())
    else:
        inputs = {f for f, _ in mechanism.report_fields}
    for opt, name in (("--privacy-unit", unit.field), ("--memo-field", unit.memo_field)):
        if name in inputs:
            raise StreamConfigError(
                f"{opt} {name!r} is one of {mechanism.name}'s "
                + ("input fields" if central else "report fields")
                + f" ({sorted(inputs)}): name the record field that holds it")
    if unit.budget is not None and not math.isfinite(g.epsilon):
        raise StreamConfigError(f"--unit-budget: {mechanism.name} has no finite epsilon to "
                                "charge against a budget")
    if unit.budget is not None and g.delta > 0:
        raise StreamConfigError(f"--unit-budget caps a sum of pure epsilons; {mechanism.name}'s "
                                f"guarantee has delta = {g.delta:g}")


def calibrated_rows(g: PrivacyGuarantee) -> int:
    """The rows per unit a central release's noise is calibrated to (its contribution bounds'
    L0 x Linf when it states them, else 1: calibrated to one record)."""
    b = g.params.get("contribution_bounds") if isinstance(g.params, dict) else None
    if not isinstance(b, dict):
        return 1
    try:
        return max(1, int(b.get("max_partitions_per_unit", 1)) *
                   int(b.get("max_rows_per_partition", 1)))
    except (TypeError, ValueError):
        return 1


def unit_scope(central: bool, unit: PrivacyUnit | None, epsilon: float) -> str:
    """Per what a stream's guarantee holds, for people (in every guarantee it writes);
    ``epsilon``: what one unit may spend in one window (:func:`unit_window_epsilon`)."""
    if unit is None:
        if central:
            return ("per record only: a person with several records spends it once per record, "
                    "and again in every window in which they have records")
        return ("per record only: a person who sends several reports spends it once per "
                "report, and a device reporting every window spends it again every window")
    k = unit.max_reports
    what = ("record" if central else "report") + ("s" if k != 1 else "")
    text = f"per privacy unit {unit.field} (at most {k} {what} per window"
    if central and math.isfinite(epsilon):
        text += f", so at most {epsilon:g} per unit and window"
    if unit.budget is not None:
        text += f"; cumulative loss capped at {unit.budget:g})"
    elif math.isfinite(epsilon):
        text += (f"; cumulative loss not capped: up to {epsilon:g} more in every window the "
                 "unit reports in)")
    else:
        text += "; no finite epsilon to cap)"
    if unit.memo_field is not None:
        text += (f"; a report that repeats its unit's memoized slot ({unit.memo_field}) with "
                 "the same report costs nothing, which is only as honest as the producer's "
                 "memoization")
    return text


def stream_guarantee(g: PrivacyGuarantee, central: bool, unit: PrivacyUnit | None,
                     group: int = 1) -> dict:
    """``g`` (a report's guarantee, or a window's releases composed) as a stream states it: per
    record, or per privacy unit with its bound, its cap and the epsilon a unit spends per
    window (``unit_window_epsilon``: k x epsilon for LDP, ceil(k / L) x epsilon for a central
    release calibrated to L = ``group`` rows per unit)."""
    d = g.to_dict()
    if unit is None:
        d.update(unit="record", scope=unit_scope(central, None, g.epsilon))
    else:
        per = unit_window_epsilon(g.epsilon, unit.max_reports, group)
        d.update(unit=unit.field, max_reports_per_unit=unit.max_reports,
                 unit_budget=unit.budget, memo_field=unit.memo_field,
                 unit_window_epsilon=None if math.isinf(per) else per,
                 scope=unit_scope(central, unit, per))
    d["summary"] = f"{d['summary']}; {d['scope']}"
    return d


def unit_window_epsilon(epsilon: float, k: int, group: int = 1) -> float:
    """What one unit may spend in one window: k reports of ``epsilon`` (LDP, ``group`` 1), or
    ceil(k / L) times a window's release epsilon (central, calibrated to L = ``group`` rows per
    unit; group privacy)."""
    return -(-k // group) * epsilon


# --------------------------------------------------------------------------- per-window estimate
class WindowMark:
    """An element that puts its window into a central release's range: the window is released
    (once its trigger fires), records or not; a window never marked is withheld. It carries no
    rows. Sources mark every window of their range (:func:`mark_windows`)."""

    __slots__ = ("start",)

    def __init__(self, start: int | None = None) -> None:
        self.start = start  # the window's start (µs): the address of its release's noise

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, WindowMark)

    def __hash__(self) -> int:
        return 0

    def __reduce__(self):
        return WindowMark, (self.start,)

    def __repr__(self) -> str:
        return "WINDOW_MARK"


def empty_release(estimator: Any):
    """The release of an empty window for ``estimator`` (a central-DP family's), or None when it
    has none. A histogram release of no records is the noisy release of all-zero counts, made
    exactly as ``HistogramReleaseEstimator.finalize`` makes any other (which refuses an empty
    accumulator: standalone, an empty histogram is a mistake; in a stream it is a window like any
    other, whose release must not differ in form — a test holds the two to the same shape)."""
    if not isinstance(estimator, HistogramReleaseEstimator):
        return None

    def release(acc: np.ndarray) -> Estimate:
        acc = np.asarray(acc, dtype=np.int64)
        return estimator._release(acc, release_source(estimator.seed, acc))

    return release


class CountingCombineFn(beam.CombineFn):
    """An :class:`EstimatorCombineFn` that also counts the records it folded and whether its
    window is marked (:class:`WindowMark`): outputs ``(estimate or EstimateFailure, count,
    marked)``. The count is the curator's bookkeeping (a central release does not publish it).

    ``central``: a central-DP release, made only for a marked window (an unmarked one outputs
    ``None``: nothing is drawn for a window that is withheld), with ``release_empty`` making the
    release of a marked window without records."""

    def __init__(self, inner: EstimatorCombineFn, central: bool = False,
                 release_empty: Any = None) -> None:
        self.inner, self.central, self.release_empty = inner, central, release_empty

    def create_accumulator(self):
        return [self.inner.create_accumulator(), 0, False]

    def add_input(self, acc, element):
        if isinstance(element, WindowMark):
            acc[2] = element.start if element.start is not None else True
            return acc
        acc[0] = self.inner.add_input(acc[0], element)
        acc[1] += num_rows(element)
        return acc

    def merge_accumulators(self, accs):
        accs = list(accs)
        marks = [a[2] for a in accs if a[2] is not False]
        return [self.inner.merge_accumulators([a[0] for a in accs]), sum(a[1] for a in accs),
                marks[0] if marks else False]

    def extract_output(self, acc):
        inner, count, marked = acc
        if not self.central:
            return self.inner.extract_output(inner), count, bool(marked)
        if marked is False:
            return None, count, False
        return release_window(self.inner, inner, count, marked, self.release_empty), count, True


def release_window(inner: EstimatorCombineFn, acc: Any, count: int, start: Any,
                   release_empty: Any = None) -> Any:
    """A central window's release, its noise addressed by the window (``start``, µs): windows
    with equal counts (every empty window) never share noise, and a re-executed firing draws
    the same numbers again (the estimator's seed is a secret of the run)."""
    est = inner.estimator
    if hasattr(est, "finalize_key") and isinstance(start, int) and not isinstance(start, bool):
        return est.finalize_key(acc if count else None, ("window", start))
    if count == 0 and release_empty is not None:
        return release_empty(acc)
    return inner.extract_output(acc)


def window_fields(start_us: int, end_us: int) -> dict:
    return {"window_start": iso(start_us), "window_end": iso(end_us),
            "window_start_epoch": start_us / 1e6, "window_end_epoch": end_us / 1e6}


def result_dict(est: Any, central: bool) -> dict:
    if isinstance(est, EstimateFailure):
        return {"error": est.reason} if central else {"error": est.reason,
                                                      "n_reports": est.n_reports}
    return est.to_dict()


class PaneFn(beam.DoFn):
    """``(estimate, count, marked)`` of one firing -> a pane element: the published row (or, for a
    central release outside the range or past the window's budget, the reason it is withheld) and
    the count. ``guarantee``: the stream's (:func:`stream_guarantee`), in every row."""

    def __init__(self, central: bool, releases: int, guarantee: dict,
                 prior_releases: Mapping[int, int] | None = None) -> None:
        self.central, self.releases, self.guarantee = central, releases, guarantee
        self.prior = dict(prior_releases or {})

    # -- what a subclass changes: how an element is read and estimated
    def _count(self, element) -> int:
        return int(element[1])

    def _marked(self, element) -> bool:
        return bool(element[2])

    def _estimate(self, element, start_us: int) -> tuple[Any, dict | None]:
        """(the estimate or release, the per-unit counts or None)."""
        return element[0], None

    def _unit_row(self, units: dict | None) -> dict:
        return {}

    def process(self, element, window=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        count, marked = self._count(element), self._marked(element)
        start, end = window.start.micros, window.end.micros
        index, timing = int(pane.index), TIMING.get(int(pane.timing), "unknown")
        out = {"window_start_us": start, "window_end_us": end, "index": index,
               "timing": timing, "count": int(count), "row": None, "refused": None}
        row = {**window_fields(start, end), "pane": {"index": index, "timing": timing}}
        if self.central:
            out["in_range"] = bool(marked)
            span = f"[{iso(start)}, {iso(end)})"
            release = self.prior.get(start, 0) + index + 1
            if not marked:
                out["refused"] = (
                    f"release withheld: window {span} is outside the run's release range (not "
                    "marked as part of it when it fired; see release_range in "
                    "curator/summary.json): a central-DP stream releases exactly the windows of "
                    "its range, so that whether a window is released reveals nothing about its "
                    "records (their count is in the ledger)")
            elif release > self.releases:
                out["refused"] = (
                    f"release refused: firing {index + 1} of window {span} "
                    f"would be release {release} of a budget of {self.releases} "
                    "(--releases-per-window)")
            if out["refused"]:
                yield out
                return
        est, units = self._estimate(element, start)
        if units is not None:
            out["units"] = units
        res = result_dict(est, self.central)
        per_release = res.pop("guarantee", None)
        row.update(res, guarantee=self.guarantee)
        if self.central:
            row["release"] = {"index": release, "of": self.releases}
            if self.releases > 1 and per_release is not None:
                row["guarantee_per_release"] = per_release
        else:
            row["estimand"] = ESTIMAND_PER_REPORT
        row.update(self._unit_row(units))
        out["row"] = row
        yield out


ESTIMAND_PER_REPORT = ("per report: every valid report of the window counts once, so a unit "
                       "that sends more reports weighs more")


class UnitPaneFn(PaneFn):
    """A pane of a privacy-unit stream: ``(candidates, marked)`` (:class:`UnitCandidatesFn`)
    -> the per-unit admission of the window (:meth:`UnitState.admit`: at most k reports per
    unit, each unit's cumulative loss charged and capped), then the estimate (or release) of
    the admitted reports alone. The admission is recorded before the pane is written, so a
    crash in between over-counts (never under-counts) and a re-run selects the same reports
    again without charging them twice."""

    def __init__(self, central: bool, releases: int, guarantee: dict,
                 prior_releases: Mapping[int, int] | None, unit: PrivacyUnit, estimator: Any,
                 release_empty: Any, epsilon: float, group: int, run_id: str) -> None:
        super().__init__(central, releases, guarantee, prior_releases)
        self.unit, self.estimator, self.release_empty = unit, estimator, release_empty
        self.epsilon, self.group, self.run_id = epsilon, group, run_id
        self.report_fields = estimator.mechanism.report_fields

    def _count(self, element) -> int:
        return sum(n for n, _ in element[0].values())

    def _marked(self, element) -> bool:
        return bool(element[1])

    def _estimate(self, element, start_us: int) -> tuple[Any, dict]:
        u = self.unit
        adm = u.state.admit(start_us, self.run_id, element[0], u.max_reports, self.epsilon,
                            u.budget, self.group)
        rows = adm.rows()
        inner = EstimatorCombineFn(self.estimator, on_empty="report")
        acc = inner.create_accumulator()
        if rows:
            cols = {f: np.asarray([r[j] for r in rows]) for j, (f, _) in
                    enumerate(self.report_fields)}
            acc = self.estimator.add(acc, report_columns(cols, self.report_fields))
        if self.central:
            est = release_window(inner, acc, len(rows), start_us, self.release_empty)
        else:
            est = inner.extract_output(acc)
        if not self.central and u.max_reports > 1 and isinstance(est, Estimate):
            est = est.with_design_effect(
                u.max_reports, f"up to {u.max_reports} reports of one privacy unit "
                f"{u.field} per window, which may be correlated")
        return est, adm.counts()

    def _unit_row(self, units: dict | None) -> dict:
        u = self.unit
        if self.central:  # a central release publishes no counts
            return {"privacy_unit": {"field": u.field, "max_records_per_unit": u.max_reports,
                                     "unit_budget": u.budget}}
        k = u.max_reports
        shown = {c: units[c] for c in ("units", "reports", "estimated", "bounded_out",
                                       "over_budget", "memo_repeats", "memo_mismatch")}
        estimand = (f"per privacy unit {u.field}: each unit counts at most {k} of its reports "
                    "of the window (chosen uniformly among them), so "
                    + ("every unit that reported counts once, however many reports it sent"
                       if k == 1 else f"a unit weighs at most {k} reports"))
        if u.budget is not None:
            estimand += "; the reports of units past their budget are not in it"
        return {"estimand": estimand,
                "privacy_unit": {"field": u.field, "max_reports_per_unit": k,
                                 "unit_budget": u.budget, "memo_field": u.memo_field, **shown}}


def _report_column(values: list) -> np.ndarray:
    """A column from record fields: int64 when every value is an int, float64 when every value
    is a number (booleans are not), otherwise object (parsed, or flagged, by the validation)."""
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        with contextlib.suppress(OverflowError):
            return np.asarray(values, dtype=np.int64)
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return np.asarray(values, dtype=np.float64)
    return np.asarray(values, dtype=object)


def _raw_column(values: list) -> np.ndarray:
    """A raw-record column for a mechanism's ``check`` (as ``Perturb`` builds it): float64 when
    every value is a (non-bool) number, otherwise object."""
    if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
           for v in values):
        return np.asarray(values, dtype=np.float64)
    return np.asarray(values, dtype=object)


class RecordRows(NamedTuple):
    """Records of one source in one window, as one element: ``rows`` are ``(record, line)``."""

    source: str
    rows: list


def _checked_hash(value: Any) -> str:
    """A unit id a source has already replaced by its keyed hash (:func:`pseudonymize`): kept
    as it is, once checked to be one."""
    if isinstance(value, str) and len(value) == 33 and value.startswith("u"):
        return value
    raise ValueError("not a unit hash")


class UnitRows(NamedTuple):
    """Valid rows of one batch of a privacy-unit stream: unit hash -> ``[n, candidates]``, its
    ``n`` rows and at most k candidates ``(priority, slot, memo, digest, row)`` of smallest
    priority (``row``: the report fields' values, in ``report_fields`` order)."""

    units: dict


class UnitCandidatesFn(beam.CombineFn):
    """:class:`UnitRows` (and window marks) of a window -> ``(candidates, marked)``: per unit
    hash, ``(n, the k candidates of smallest priority)``. The choice of the k is the same
    whatever the split and order of the rows (it depends only on their keyed priorities)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def create_accumulator(self):
        return [{}, False]

    def add_input(self, acc, element):
        if isinstance(element, WindowMark):
            acc[1] = True
            return acc
        fold_candidates(acc[0], element.units, self.k)
        return acc

    def merge_accumulators(self, accs):
        out: dict = {}
        marked = False
        for units, m in accs:
            fold_candidates(out, units, self.k)
            marked = marked or m
        return [out, marked]

    def extract_output(self, acc):
        return {u: (n, list(c)) for u, (n, c) in acc[0].items()}, acc[1]


def _unpack(element: Any) -> list[tuple[Any, str, int | None]]:
    """A record element -> its ``(record, source, line)``: one for ``(record, source, line)``
    as the sources send a record, or a bare record (no provenance); one per row of a
    :class:`RecordRows`."""
    if isinstance(element, RecordRows):
        return [(record, element.source, line) for record, line in element.rows]
    if isinstance(element, tuple) and len(element) == 3 and isinstance(element[0], Mapping):
        return [element]
    return [(element, "", None)]


class BatchPerWindowFn(beam.DoFn):
    """Windowed single records -> one column batch per window per bundle (at most ``max_rows``
    rows), so the estimator folds a batch with one vectorized call instead of one per record.
    An element is a record (a mapping), ``(record, source, line)`` or :class:`RecordRows` (a
    group of those): a dead letter of a record then names its file (or Pub/Sub subscription)
    and line, like the source's. :class:`WindowMark` elements pass through.

    LDP (``mechanism`` not central): report records from untrusted clients, validated here,
    vectorized, by the estimator's own ``check_reports`` — the check :class:`ValidateReports`
    applies: a record missing a report field, or with a malformed one, is dead-lettered whole,
    with the reason. Central-DP: raw records, checked and bucketed by the mechanism (``check``
    and ``randomize``, which draw no noise for a central family, as ``Perturb`` does), mapped by
    ``columns`` (role -> field); a dead letter shows only the mapped fields. Counters
    ``reports_in`` / ``reports_invalid`` (LDP) or ``records_in`` / ``records_invalid`` (central),
    namespace ``ldp_beam``."""

    def __init__(self, mechanism: Mechanism, estimator: Any = None,
                 columns: Mapping[str, str] | None = None, max_rows: int = 4096,
                 unit: PrivacyUnit | None = None, hashed: bool = False) -> None:
        self.mechanism = mechanism
        self.central = isinstance(mechanism, CentralRelease)
        self.fields = tuple(name for name, _ in mechanism.report_fields)
        self.estimator = estimator
        self.columns = dict(columns or {r.name: r.name for r in mechanism.roles if r.required})
        self.shown = list(dict.fromkeys(self.columns.values()))
        self.max_rows = max_rows
        self.unit, self.hashed = unit, hashed
        self._keys: tuple | None = None
        what = "records" if self.central else "reports"
        self.n_in = Metrics.counter("ldp_beam", f"{what}_in")
        self.n_bad = Metrics.counter("ldp_beam", f"{what}_invalid")

    def start_bundle(self) -> None:
        self._groups: dict[Any, list] = {}

    def _unit_keys(self) -> tuple:
        """(unit, select, memo) keys of the per-unit state (read from its file where the step
        runs, not carried in the pipeline)."""
        if self._keys is None:
            st = self.unit.state
            hasher = _checked_hash if self.hashed else UnitHasher(st.key("unit"))
            self._keys = (hasher, st.key("select"), st.key("memo"))
        return self._keys

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                window=beam.DoFn.WindowParam):
        if isinstance(element, WindowMark):
            yield WindowedValue(element, timestamp, (window,))
            return
        group = self._groups.setdefault(window, [])
        for record, source, line in _unpack(element):
            if not isinstance(record, Mapping):
                self.n_in.inc()
                self.n_bad.inc()
                yield WindowedValue(dead_letter(f"unsupported record type "
                                                f"{type(record).__name__}", repr(record)[:200],
                                                source, line), timestamp, (window,))
                continue
            group.append((record, timestamp, source, line))
            if len(group) >= self.max_rows:
                yield from self._flush(window)
                group = self._groups.setdefault(window, [])

    def finish_bundle(self):
        for window in list(self._groups):
            yield from self._flush(window)

    def _dead(self, reasons: Any, group: list, window: Any, shown: list | None,
              records: list | None = None):
        msgs = reasons.as_dict()
        for i in np.flatnonzero(reasons.bad).tolist():
            record, ts, source, line = group[i]
            if records is not None:  # the records as shown (unit ids hashed)
                record = records[i]
            rec = dict(record) if shown is None else {c: record[c] for c in shown if c in record}
            yield WindowedValue(dead_letter(msgs[i], rec, source, line), ts, (window,))
        self.n_bad.inc(int(reasons.bad.sum()))

    def _flush(self, window):
        group = self._groups.pop(window, [])
        if not group:
            return
        records = [g[0] for g in group]
        n = len(records)
        self.n_in.inc(n)
        shown_records = memos = None
        if self.unit is not None:  # the unit's id -> its keyed hash, in what is shown
            units, unit_bad, records = self._pseudonymize(records)
            shown_records = records
        if self.central:
            absent = [next((c for c in self.shown if c not in r), None) for r in records]
            raw = {role: _raw_column([r.get(col) for r in records])
                   for role, col in self.columns.items()}
            cols, reasons = self.mechanism.check(raw)
            reasons.flag(np.array([a is not None for a in absent]),
                         lambda i: f"record has no field {absent[i]!r}", replace=True)
            shown = self.shown if self.unit is None else [*self.shown, self.unit.field]
        else:
            absent = [next((f for f in self.fields if f not in r), None) for r in records]
            cols = {f: _report_column([r.get(f) for r in records]) for f in self.fields}
            reasons = self.estimator.check_reports(cols, n)
            reasons.flag(np.array([a is not None for a in absent]),
                         lambda i: f"report field {absent[i]!r} is missing", replace=True)
            shown = None
            if self.unit is not None and self.unit.memo_field is not None:
                memos, memo_bad = self._memos(records)
                reasons.flag(np.array([m is not None for m in memo_bad]),
                             lambda i: memo_bad[i], replace=True)
        if self.unit is not None:
            reasons.flag(np.array([u is None for u in units]), lambda i: unit_bad[i],
                         replace=True)
        yield from self._dead(reasons, group, window, shown, shown_records)
        ok = np.flatnonzero(~reasons.bad)
        if ok.size:
            batch = {k: v[ok] for k, v in cols.items()}
            if self.central:
                batch = self.mechanism.rows(batch, np.empty((int(ok.size), 0)))
            t = min(group[i][1] for i in ok.tolist())
            if self.unit is not None:
                batch = self._candidates(batch, ok, group, units, memos)
            yield WindowedValue(batch, t, (window,))

    # -- privacy units
    def _pseudonymize(self, records: list) -> tuple[list, list, list]:
        """Each record's unit hash (None when it has no valid id: ``bad`` says why) and a copy
        of the record showing the hash in place of the id."""
        hasher, field = self._unit_keys()[0], self.unit.field
        shown = [dict(r) for r in records]
        bad = [pseudonymize(rec, field, hasher) for rec in shown]
        return [None if why else rec[field] for rec, why in zip(shown, bad)], bad, shown

    def _memos(self, records: list) -> tuple[list, list]:
        """Each report's memo slot (a keyed hash of its memo id; None when it has none) and why
        a memo id is unusable (None when it is fine)."""
        key, field = self._unit_keys()[2], self.unit.memo_field
        memos, bad = [], []
        for m in (r.get(field) for r in records):
            unusable = m is not None and (isinstance(m, bool) or not isinstance(m, (str, int))
                                          or m == "")
            memos.append(None if m is None or unusable else
                         keyed_digest(key, str(m).encode()).hex())
            bad.append(f"memo field {field!r} is a {type(m).__name__}: expected the memoized "
                       "slot's id (a string or an integer) or no field" if unusable else None)
        return memos, bad

    def _candidates(self, batch: Mapping[str, np.ndarray], ok: np.ndarray, group: list,
                    units: list, memos: list | None) -> "UnitRows":
        """The valid rows of a batch as per-unit candidates (at most k per unit, the smallest
        keyed priorities; see :class:`UnitCandidatesFn`), with every unit's count."""
        select = self._unit_keys()[1]
        k = self.unit.max_reports
        # each field as its declared dtype: a record's identity (its priority and slot) must not
        # depend on the other records of its bundle (an int column is float64 in a bundle that
        # holds a float, and 3 would be 3.0: a restart that bundles anew charges it again)
        rows = list(zip(*[np.asarray(batch[f]).astype(dt).tolist()
                          for f, dt in self.mechanism.report_fields]))
        per: dict[str, list] = {}
        for j, i in enumerate(ok.tolist()):
            _, ts, source, line = group[i]
            memo = memos[i] if memos is not None else None
            # a record's identity: where it was read, its event time, unit, memo slot and
            # report (a reused file name with other content is another record)
            prio, slot = priority(select, f"{source}\n{line}\n{ts.micros}\n{units[i]}\n"
                                          f"{memo}\n{rows[j]!r}")
            digest = None if memo is None else hashlib.blake2b(
                repr(rows[j]).encode(), digest_size=16).hexdigest()
            entry = per.setdefault(units[i], [0, []])
            entry[0] += 1
            entry[1].append((prio, slot, memo, digest, rows[j]))
        bound_candidates(per, per, k)
        return UnitRows(per)


class WindowedOutputs:
    def __init__(self, panes: Any, dead_letter: Any) -> None:
        self.panes, self.dead_letter = panes, dead_letter


class WindowedEstimate(beam.PTransform):
    """Timestamped records -> ``.panes`` (one element per firing of each fixed window, see
    :class:`PaneFn`) and ``.dead_letter`` (records that failed validation, with the reason and,
    for ``(record, source, line)`` elements, the file and line).

    ``mechanism``: LDP families read report records (validated by the estimator); central-DP
    families (``mechanism.central``) read raw records, mapped by ``columns`` (role -> field),
    and release exactly the windows that are *marked* (a :class:`WindowMark` element in the
    window, see :func:`mark_windows`), empty ones included; a window with records but no mark
    is withheld (a dead letter says so) — the source decides the range, the data does not.
    ``window_seconds``, ``allowed_lateness``, ``early_seconds`` (a whole number of seconds):
    the windowing and triggers (:mod:`ldp_beam.pipelines.stream`); ``releases_per_window``:
    the release budget per window of a central family (required when a window can fire more
    than once); ``prior_releases``: releases already made per window start (µs), e.g. before a
    crash, that count against it. ``unit``: a privacy unit (:class:`PrivacyUnit`), whose ids
    are replaced here by keyed hashes, or, with ``unit_hashed``, were replaced by the source
    (the spool and Pub/Sub readers of :func:`run_stream` do it as they parse, so no raw id
    reaches even a source's dead letter); ``run_id`` names the run in the per-unit state.
    """

    def __init__(self, mechanism: Mechanism, window_seconds: float,
                 allowed_lateness: float = 0.0, early_seconds: float | None = None,
                 releases_per_window: int | None = None,
                 columns: Mapping[str, str] | None = None,
                 options: Mapping[str, Any] | None = None,
                 prior_releases: Mapping[int, int] | None = None,
                 unit: PrivacyUnit | None = None, run_id: str = "stream",
                 unit_hashed: bool = False) -> None:
        super().__init__()
        self.clock = WindowClock(window_seconds, allowed_lateness)
        e = early_seconds
        if e is not None and not (isinstance(e, (int, float)) and not isinstance(e, bool)
                                  and math.isfinite(e) and e >= 1 and float(e).is_integer()):
            raise StreamConfigError(
                f"--early {e!r}: expected a whole number of seconds >= 1 (Beam's "
                "processing-time trigger delay is carried in whole seconds)")
        rpw = releases_per_window
        if rpw is not None and (isinstance(rpw, bool) or not isinstance(rpw, int) or rpw < 1):
            raise StreamConfigError(f"--releases-per-window {rpw!r}: expected an integer >= 1")
        self.mechanism = mechanism
        self.central = isinstance(mechanism, CentralRelease)
        self.window_seconds, self.allowed_lateness = window_seconds, allowed_lateness
        self.early_seconds = None if early_seconds is None else int(early_seconds)
        refirings = [o for o, on in (("--allowed-lateness", allowed_lateness > 0),
                                     ("--early", early_seconds is not None)) if on]
        if self.central and refirings and releases_per_window is None:
            raise StreamConfigError(
                f"{mechanism.name} is a central-DP release and {' and '.join(refirings)} can "
                "fire a window more than once: every firing is a new noisy release over "
                "overlapping records. Give --releases-per-window N to budget N releases per "
                "window (each is then stated as the composition over N; later firings are "
                "refused), or drop " + " and ".join(refirings))
        if not self.central and releases_per_window is not None:
            raise StreamConfigError(
                f"--releases-per-window applies to central-DP releases; {mechanism.name} is "
                f"{mechanism.guarantee.kind}: its panes are post-processing of the same reports "
                "and cost nothing more")
        self.releases = releases_per_window or 1
        g = mechanism.guarantee
        self.guarantee = compose([g] * self.releases) if self.releases > 1 else g
        if columns is None:
            columns = {r.name: r.name for r in mechanism.roles if r.required}
        self.columns = dict(columns)
        if self.central:
            roles = {r.name for r in mechanism.roles}
            unknown = sorted(set(self.columns) - roles)
            missing = [r.name for r in mechanism.roles if r.required and r.name not in columns]
            if unknown or missing:
                raise StreamConfigError(
                    f"columns: {mechanism.name} has roles {sorted(roles)}"
                    + (f"; unknown {unknown}" if unknown else "")
                    + (f"; the required {missing} are not mapped" if missing else ""))
            if mechanism.draws:
                raise StreamConfigError(f"{mechanism.name} draws randomness per record (noise "
                                        "or a sampling decision); a central stream only checks "
                                        "and buckets raw records")
        opts = dict(options or {})
        if self.central and opts.get("seed") is None:  # a secret of the run: retry-proof noise
            opts["seed"] = int.from_bytes(os.urandom(32), "big")
        self.estimator = estimator_for(mechanism, **opts)
        self.release_empty = empty_release(self.estimator) if self.central else None
        if self.central and self.release_empty is None:
            raise StreamConfigError(
                f"{mechanism.name} cannot be streamed: a central-DP stream releases every window "
                "of its range, those without records too (so that whether a window is released "
                "reveals nothing), and its estimator has no release of an empty window; stream "
                "a histogram release (laplace-histogram, dphr, ahp, structure-first) or run "
                "`ldp-beam estimate` on a fixed batch")
        self.prior = dict(prior_releases or {})
        self.unit, self.run_id, self.unit_hashed = unit, run_id, unit_hashed
        if unit is not None:
            check_unit(mechanism, unit, self.columns)
        self.group = calibrated_rows(mechanism.guarantee) if self.central else 1
        self.stream_guarantee = stream_guarantee(self.guarantee, self.central, unit, self.group)

    def cap_units(self, cap: float) -> None:
        """Lower the per-unit cumulative cap to ``cap`` before the pipeline is built (the room
        the team's budget leaves, :mod:`ldp_beam.pipelines.stream_account`); the stated
        guarantee says the new cap."""
        if self.unit is None or (self.unit.budget is not None and cap > self.unit.budget):
            raise ValueError(f"cap {cap!r}: lowers the unit cap of a stream with a privacy unit")
        self.unit = dataclasses.replace(self.unit, budget=cap)
        check_unit(self.mechanism, self.unit, self.columns)
        self.stream_guarantee = stream_guarantee(self.guarantee, self.central, self.unit,
                                                 self.group)

    @property
    def report_epsilon(self) -> float:
        """What one estimated report (LDP) or kept record (central: per group of the rows the
        release is calibrated to) costs its unit: the report's epsilon, or the window's release
        epsilon composed over its releases."""
        return self.guarantee.epsilon

    @property
    def trigger(self):
        late = tr.AfterCount(1) if self.allowed_lateness > 0 else None
        # Beam's runner API carries the delay in milliseconds and reads it back in whole
        # seconds: the delay is an int (a float fails to translate)
        early = tr.AfterProcessingTime(self.early_seconds) if self.early_seconds else None
        if late is None and early is None:
            return tr.AfterWatermark()
        return tr.AfterWatermark(early=early, late=late)

    def expand(self, records):
        windowed = records | "Window" >> beam.WindowInto(
            FixedWindows(self.window_seconds), trigger=self.trigger,
            accumulation_mode=tr.AccumulationMode.ACCUMULATING,
            allowed_lateness=Duration.of(self.allowed_lateness))
        batched = split_dead_letters(windowed | "Batch" >> beam.ParDo(BatchPerWindowFn(
            self.mechanism, None if self.central else self.estimator, self.columns,
            unit=self.unit, hashed=self.unit_hashed)), "batches")
        if self.unit is None:
            combine: Any = CountingCombineFn(
                EstimatorCombineFn(self.estimator, on_empty="report"), self.central,
                self.release_empty)
            pane_fn: PaneFn = PaneFn(self.central, self.releases, self.stream_guarantee,
                                     self.prior)
        else:
            combine = UnitCandidatesFn(self.unit.max_reports)
            pane_fn = UnitPaneFn(self.central, self.releases, self.stream_guarantee,
                                 self.prior, self.unit, self.estimator, self.release_empty,
                                 self.report_epsilon, self.group, self.run_id)
        panes = (batched.batches
                 | "EstimatePerWindow" >> beam.CombineGlobally(combine).without_defaults()
                 | "Panes" >> beam.ParDo(pane_fn))
        dead = batched.dead_letter | "UnwindowDeadLetters" >> beam.WindowInto(GlobalWindows())
        return WindowedOutputs(panes, dead)


def mark_windows(clock: WindowClock, start_us: int, end_us: int) -> list[int]:
    """The starts of the windows of a release range: every window from the one containing
    ``start_us`` to the last one starting before ``end_us``."""
    first = clock.window(start_us)[0]
    return list(range(first, end_us, clock.size_us))


# --------------------------------------------------------------------------- the sink
def _append(fd: int, obj: Any) -> None:
    os.write(fd, (to_json_line(obj) + "\n").encode("utf-8"))  # one O_APPEND write per line


class StreamSink(beam.DoFn):
    """The one writer of a run's outputs (all items under one key, so lines never interleave):
    pane rows to ``estimates.jsonl``, dead letters and withheld releases to ``deadletter.jsonl``,
    file and pane bookkeeping to ``ledger.jsonl``; every line carries the run id. On a
    heartbeat it sets an event-time timer; when the timer fires, every pane of every window
    closed before it has been written, and that settled watermark is recorded for the spool
    source (``settled_path``), which then retires the files those windows came from."""

    SETTLE = userstate.TimerSpec("settle", TimeDomain.WATERMARK)

    def __init__(self, out_dir: str, run_id: str, central: bool, spool_path: str | None = None,
                 progress: bool = True, results: Iterable[str] = (),
                 results_topic: str | None = None,
                 published: Iterable[tuple[int, int, Any]] = ()) -> None:
        self.out_dir, self.run_id, self.central = out_dir, run_id, central
        self.spool_path, self.progress = spool_path, progress
        self.results, self.results_topic = tuple(results), results_topic
        # window start µs -> {pane: n_reports} of the panes already in estimates.jsonl
        self.published: dict[int, dict[int, Any]] = {}
        for start, pane, n in published:
            self.published.setdefault(int(start), {})[int(pane)] = n
        self._fds: dict[str, int] = {}
        self._sinks: list | None = None

    def setup(self) -> None:
        self._sinks = open_results(self.results, self.results_topic)

    def _fd(self, name: str) -> int:
        if name not in self._fds:
            os.makedirs(os.path.dirname(os.path.join(self.out_dir, name)), exist_ok=True)
            self._fds[name] = os.open(os.path.join(self.out_dir, name),
                                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fds[name]

    def teardown(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        for sink in self._sinks or ():
            sink.close()
        self._sinks = None

    def _say(self, msg: str) -> None:
        if self.progress:
            print(f"ldp-beam stream: {msg}", file=sys.stderr, flush=True)

    def process(self, keyed, settle=beam.DoFn.TimerParam(SETTLE)):
        kind, payload = keyed[1]
        run = {"run": self.run_id}
        if kind == PANE:
            p = payload
            span = window_fields(p["window_start_us"], p["window_end_us"])
            ledger = {"kind": "pane", **run, **span, "pane": p["index"], "timing": p["timing"],
                      "count": p["count"], "released": p["row"] is not None,
                      **{k: p[k] for k in ("in_range", "units") if k in p}}
            prev = self.published.setdefault(p["window_start_us"], {})
            n = None if p["row"] is None else p["row"].get("n_reports")
            if p["row"] is not None and n is not None and prev.get(p["index"]) == n:
                # the same pane of the same reports, published by a run a crash ended before
                # it settled the window: published once, never twice (nor to the sinks)
                ledger["already_published"] = True
            elif p["row"] is not None:
                row = {**run, **p["row"]}
                if p["index"] in prev:  # a pane number an earlier run used: the next one
                    row["pane"] = {**row["pane"], "index": max(prev) + 1,
                                   "index_in_run": p["index"]}
                prev[row["pane"]["index"]] = n
                _append(self._fd(ESTIMATES), row)
                if self._sinks is None:
                    self.setup()
                for sink in self._sinks:
                    sink.write(row)
            else:
                _append(self._fd(DEAD_LETTERS), {
                    **run, "stage": "release", "reason": p["refused"], "source": "release",
                    "row": None, "record": {**span, "pane": {"index": p["index"],
                                                             "timing": p["timing"]}}})
            _append(self._fd(LEDGER_FILE), ledger)
            self._say(self._pane_line(p))
        elif kind == DEAD:
            _append(self._fd(DEAD_LETTERS), {**run, "stage": payload.get("stage", "source"),
                                             **payload})
        elif kind == LEDGER:
            _append(self._fd(LEDGER_FILE), {**run, **payload})
            if payload.get("kind") != "messages":
                self._say(file_line(payload))
        elif kind == HEARTBEAT:
            settle.set(Timestamp(micros=int(payload)))

    @userstate.on_timer(SETTLE)
    def on_settle(self, ts=beam.DoFn.TimestampParam):
        if self.spool_path is not None:
            record_settled(self.spool_path, ts.micros)

    def _pane_line(self, p: dict) -> str:
        span = f"[{iso(p['window_start_us'])}, {iso(p['window_end_us'])})"
        what = f"pane {p['index']} ({p['timing'].replace('_', ' ')})"
        if p["row"] is None:
            return f"window {span} {what}: release withheld (" + (
                "budget spent)" if p.get("in_range", True) else "outside the release range)")
        if "error" in p["row"]:
            return f"window {span} {what}: no estimate: {p['row']['error']}"
        units = ""
        if "units" in p:
            u = p["units"]
            units = (f" ({u['estimated']:,} estimated from {u['units']:,} unit(s), "
                     f"{u['bounded_out']:,} bounded out, {u['over_budget']:,} over budget)")
        if self.central:
            r = p["row"]["release"]
            return f"window {span} {what}: release {r['index']} of {r['of']}" + units
        return f"window {span} {what}: {p['count']:,} reports" + units


# --------------------------------------------------------------------------- Pub/Sub
class ParseMessagesFn(beam.DoFn):
    """Pub/Sub message payloads (JSON lines, one record or more) -> items, each record at its
    event time."""

    def __init__(self, timestamp_field: str, source: str, unit_field: str | None = None,
                 unit_key: bytes | None = None) -> None:
        self.timestamp_field, self.source = timestamp_field, source
        self.unit_field, self.unit_key = unit_field, unit_key
        self._hasher = None if unit_key is None else UnitHasher(unit_key)
        self.n_records = Metrics.counter("ldp_beam", "stream_records")
        self.n_lines = Metrics.counter("ldp_beam", "stream_lines")
        self._tally = [0, 0, 0]  # lines, records, the latest event time (µs) of the bundle

    def start_bundle(self) -> None:
        self._tally = [0, 0, 0]  # lines, records, the latest event time (µs)

    def finish_bundle(self):
        """The bundle's count, to the run's ledger (the read count of the summary: Beam's
        metrics of a cancelled DirectRunner pipeline miss its last bundles)."""
        lines, records, latest = self._tally
        if lines:
            yield WindowedValue((LEDGER, {"kind": "messages", "source": self.source,
                                          "lines": lines, "records": records}),
                                Timestamp(micros=latest), [GlobalWindow()])

    def process(self, data: bytes, timestamp=beam.DoFn.TimestampParam):
        self._tally[2] = max(self._tally[2], int(getattr(timestamp, "micros", 0)))
        for i, raw in enumerate(bytes(data).splitlines(), 1):
            if not raw.strip():
                continue
            self.n_lines.inc()
            self._tally[0] += 1
            try:
                record, t_us = parse_line(raw, self.timestamp_field)
            except ValueError as exc:
                shown = WITHHELD if self.unit_field else _shown(raw)
                yield DEAD, _dead(str(exc), shown, self.source, i)
                continue
            if self.unit_field is not None:
                why = pseudonymize(record, self.unit_field, self._hasher)
                if why is not None:
                    yield DEAD, _dead(why, record, self.source, i)
                    continue
            self.n_records.inc()
            self._tally[1] += 1
            yield TimestampedValue((RECORD, record, self.source, i), Timestamp(micros=t_us))


def subscription_path(sub: str) -> str:
    if sub.startswith("projects/"):
        return sub
    parts = sub.split("/")
    if len(parts) != 2 or not all(parts):
        raise StreamConfigError(f"--subscription {sub!r}: expected PROJECT/SUBSCRIPTION or "
                                "projects/PROJECT/subscriptions/SUBSCRIPTION")
    return f"projects/{parts[0]}/subscriptions/{parts[1]}"


class ReadPubSubRecords(beam.PTransform):
    """``beam.io.ReadFromPubSub(subscription=..., timestamp_attribute=...,
    id_label=...)`` -> items: Beam's own Pub/Sub source, for the runners where it is
    exactly-once (Dataflow deduplicates by ``id_label`` and acks after a checkpoint). On the
    DirectRunner it is at most once (it acks each pull before processing, and does not support
    ``id_label``, which is then left out: no deduplication); see :func:`run_stream`.
    ``timestamp_attribute``: the message attribute of its event time (the Reporter's ``ts``;
    each record's own ``timestamp_field`` then places it); ``id_label``: the attribute of its
    report id (the Reporter's ``report_id``; one report per message)."""

    def __init__(self, subscription: str, timestamp_field: str, unit_field: str | None = None,
                 unit_key: bytes | None = None, timestamp_attribute: str | None = "ts",
                 id_label: str | None = None) -> None:
        super().__init__()
        self.path = subscription_path(subscription)
        self.timestamp_field = timestamp_field
        self.unit_field, self.unit_key = unit_field, unit_key
        self.timestamp_attribute, self.id_label = timestamp_attribute, id_label
        try:
            import_module("google.cloud.pubsub_v1")  # what ReadFromPubSub needs at run time
        except ImportError:
            raise StreamConfigError(
                "--subscription reads Pub/Sub, which needs Apache Beam's GCP extras: "
                "pip install 'apache-beam[gcp]'") from None

    def expand(self, pbegin):
        return (pbegin | "PubSub" >> beam.io.ReadFromPubSub(
                    subscription=self.path, timestamp_attribute=self.timestamp_attribute,
                    id_label=self.id_label)
                | "Parse" >> beam.ParDo(ParseMessagesFn(self.timestamp_field,
                                                        f"pubsub:{self.path}", self.unit_field,
                                                        self.unit_key)))


# --------------------------------------------------------------------------- the pipeline
def _records(item):
    """An item -> the element of the estimate: ``(record, source, line)`` (a bare record for an
    item without provenance), or a window mark."""
    kind = item[0]
    if kind == RECORDS:
        return [RecordRows(item[1], item[2])]
    if kind == RECORD:
        return [item[1] if len(item) == 2 else (item[1], item[2], item[3])]
    return [WindowMark(item[1])] if kind == MARK else []


def estimate_stream(items: Any, estimate: WindowedEstimate, sink: StreamSink) -> Any:
    """Items (records at their event times, with their file and line, window marks at their
    window's start, dead letters, ledger entries, heartbeats) -> windowed estimates -> the sink.
    Returns the sink's (empty) output."""
    records = items | "Records" >> beam.FlatMap(_records)
    others = items | "Bookkeeping" >> beam.Filter(lambda i: i[0] not in (RECORD, RECORDS, MARK))
    out = records | "Estimate" >> estimate
    panes = (out.panes | "TagPanes" >> beam.Map(lambda p: (PANE, p))
             | "Unwindow" >> beam.WindowInto(GlobalWindows()))
    invalid = (out.dead_letter
               | "TagInvalid" >> beam.Map(lambda d: (DEAD, {**d, "stage": "validate"})))
    return ((others, invalid, panes) | "ToSink" >> beam.Flatten()
            | "OneWriter" >> beam.Map(lambda x: (0, x)) | "Write" >> beam.ParDo(sink))


class MarkRange(beam.PTransform):
    """Bounded items -> a :data:`MARK` item at the start of every window of the release range
    ``[start_us, end_us)`` (:func:`mark_windows`); an undeclared end is taken from the records'
    event times (the window of the earliest, the window of the latest, inclusive)."""

    def __init__(self, clock: WindowClock, start_us: int | None, end_us: int | None) -> None:
        super().__init__()
        self.clock, self.start_us, self.end_us = clock, start_us, end_us

    def expand(self, items):
        if self.start_us is not None and self.end_us is not None:
            bounds = items.pipeline | "Bounds" >> beam.Create([(self.start_us, self.end_us)])
        else:
            bounds = (items | "EventTimes" >> beam.FlatMap(_event_time)
                      | "Span" >> beam.CombineGlobally(_Span()).without_defaults()
                      | "Bounds" >> beam.Map(_declared_or_span, self.start_us, self.end_us))
        return bounds | "Windows" >> beam.FlatMap(_marks_of, self.clock)


def _event_time(item, ts=beam.DoFn.TimestampParam):
    """A record's event time (of a group, its earliest: the same window)."""
    return [ts.micros] if item[0] in (RECORD, RECORDS) else []


class _Span(beam.CombineFn):
    """The earliest and the latest of some times."""

    def create_accumulator(self):
        return None, None

    def add_input(self, acc, t):
        return self.merge_accumulators([acc, (t, t)])

    def merge_accumulators(self, accs):
        spans = [a for a in accs if a[0] is not None]
        return (min(a[0] for a in spans), max(a[1] for a in spans)) if spans else (None, None)

    def extract_output(self, acc):
        return acc


def _declared_or_span(span, start_us, end_us):
    if span[0] is None:
        return None, None
    return (start_us if start_us is not None else span[0],
            end_us if end_us is not None else span[1] + 1)


def _marks_of(bounds, clock: WindowClock):
    start, end = bounds
    if start is None or end <= start:
        return []
    n = -(-(end - clock.window(start)[0]) // clock.size_us)
    if n > MAX_RANGE_WINDOWS:
        raise StreamConfigError(
            f"the release range [{iso(start)}, {iso(end)}) has {n:,} windows of "
            f"{clock.window_seconds:g}s, more than {MAX_RANGE_WINDOWS:,} (each is a release): "
            "declare a narrower one (--start, --end) or a longer --window")
    return [TimestampedValue((MARK, s), Timestamp(micros=s)) for s in mark_windows(clock, start,
                                                                                   end)]
