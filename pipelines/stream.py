"""``ldp-beam stream``: windowed streaming estimation of telemetry.

Records with event times (from a spool directory, :mod:`ldp_beam.transforms.spool`, or Pub/Sub)
are windowed into fixed event-time windows, validated and estimated per window, on one column
batch per window and bundle (:class:`BatchPerWindowFn`), so they are folded a batch at a time:
raw records of a central-DP family are checked and bucketed by the mechanism (``check`` and
``randomize``, as ``Perturb`` does, adding no noise: the release does, once per firing); LDP
reports are checked by the estimator's ``check_reports`` (what :class:`ValidateReports`
applies). Each firing of a window (a *pane*) is one line of ``OUT/estimates.jsonl`` with the
window's bounds (ISO and epoch seconds), the pane's index and timing, the estimate (statistics,
``n_reports`` for LDP) and the guarantee.

**Triggers.** A window fires when the watermark passes its end (the on-time pane); with
``allowed_lateness`` > 0, every late record within the lateness fires it again (a late pane,
accumulating: each pane is the estimate over everything the window has received); ``early``
adds speculative panes every so many seconds of processing time (a whole number: Beam's runner
API carries the delay in whole seconds). For LDP families a pane is
post-processing of the same reports: it costs no privacy, and the last pane of a window
supersedes the earlier ones. For central-DP families every pane is a fresh noisy release over
overlapping records, so a configuration that can fire a window more than once is refused unless
``releases_per_window`` N is given; then every release states the composition over N releases
(:func:`ldp_beam.privacy.compose`) and a window's firings past the N-th are not released (a
dead-letter line says which). Without late or early firings a central window releases once.
After a crash, the releases already in ``estimates.jsonl`` count against the budget of the
windows the re-read files feed, so a window is not released again from the same records.

**Release range (central-DP).** Whether a window is released must not depend on its records:
if only windows with records were released, the existence of a release would reveal that someone
reported in it. A central-DP stream therefore releases exactly the windows of its *release
range* — every window in it, those without records as the noisy release of all-zero counts, made
exactly as any other release (:func:`empty_release`) — and withholds every window outside it (a
``release`` dead letter says so; its record count stays in the ledger). The range is fixed by the
operator and the clock, not the data:

* it starts at the window containing ``start`` (``--start``) when declared. Otherwise a live run
  starts at the window containing the run's start (wall clock less the watermark lag): records
  of a backlog older than that are withheld (declare ``--start`` to release their windows); a
  ``--once`` run starts at the window of the earliest record read, which then reveals that
  window has a record (so declare ``--start``);
* it ends with the last window starting before ``end`` (``--end``) when declared, else, live,
  before the wall clock at the run's last poll (its stop): a window after it, fed by event times
  ahead of the clock, is withheld; a ``--once`` run without ``--end`` ends with the window of
  the latest record read (the same caveat as for its start);
* a restarted live run does not mark windows already closed at the settled watermark of the
  previous run (they were that run's to release); a range has at most ``MAX_RANGE_WINDOWS``
  windows.

The source marks every window of the range (a ``MARK`` item at its start, sent once the wall
clock reaches it, so before the watermark does; :class:`WindowMark`), so each fires whether or
not it has records, and :class:`PaneFn` releases only marked windows. What the range does not hide: with late or early
firings (``--allowed-lateness``, ``--early``) the *number* of releases of a window (at most N)
depends on when its records arrive — a late pane exists only because a late record did. Each
release states the composition over N regardless; a stream whose release pattern must reveal
nothing uses neither, and releases each window of its range exactly once. The Pub/Sub source
cannot mark a range here, so central-DP streams read a spool; a family whose estimator has no
release of an empty window (OSPDPRR's) is refused.

**Accounting.** Nothing is dropped silently: every record is in a window's panes, dead-lettered
(``OUT/deadletter.jsonl``, with the stage, the reason and, from a spool, the file and line), or
counted. ``OUT/ledger.jsonl`` is the curator's bookkeeping (one line per file read and per pane,
with exact record counts — not for publication for central-DP families), and the end-of-run
summary reconciles: lines read = records + dead-lettered at the source + skipped as settled
before a restart; records = records in the windows' last panes + invalid records (+ records
Beam's windowing dropped as later than the allowed lateness, which the spool source prevents by
dead-lettering them itself; with Pub/Sub they can only be counted, as this difference).
"""
from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from datetime import datetime, timezone
from importlib import import_module
from typing import Any, Iterable, Mapping, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger as tr
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import FixedWindows, GlobalWindows, TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from ldp_beam.core import Estimate, Mechanism, Statistic
from ldp_beam.estimators import estimator_for
from ldp_beam.privacy import compose
from ldp_beam.transforms.batches import num_rows
from ldp_beam.transforms.perturb import dead_letter, split_dead_letters
from ldp_beam.transforms.combine import EstimateFailure, EstimatorCombineFn
from ldp_beam.transforms.io import to_json_line
from ldp_beam.transforms.spool import (DEAD, HEARTBEAT, LEDGER, MARK, RECORD, RECORDS,
                                       ReadSpoolOnce,
                                       SpoolDirectory, SpoolSource, WindowClock, event_micros,
                                       file_line, iso, parse_line, record_settled)

from .common import counters, run_pipeline, runner_args, runner_name, say, write_json

PANE = "pane"
ESTIMATES, DEAD_LETTERS, LEDGER_FILE, SUMMARY = ("estimates.jsonl", "deadletter.jsonl",
                                                 "ledger.jsonl", "summary.json")
TIMING = {0: "early", 1: "on_time", 2: "late", 3: "unknown"}
MAX_RANGE_WINDOWS = 100_000  # windows in a central release range (each is a release)
DIRECT_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


class StreamConfigError(ValueError):
    """A streaming configuration that cannot be run as asked (the message names the option)."""


# --------------------------------------------------------------------------- per-window estimate
class WindowMark:
    """An element that puts its window into a central release's range: the window is released
    (once its trigger fires), records or not; a window never marked is withheld. It carries no
    rows. Sources mark every window of their range (:func:`mark_windows`)."""

    __slots__ = ()

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, WindowMark)

    def __hash__(self) -> int:
        return 0

    def __reduce__(self):
        return WindowMark, ()

    def __repr__(self) -> str:
        return "WINDOW_MARK"


WINDOW_MARK = WindowMark()


def empty_release(estimator: Any):
    """The release of an empty window for ``estimator`` (a central-DP family's), or None when it
    has none. A histogram release of no records is the noisy release of all-zero counts, made
    exactly as ``HistogramReleaseEstimator.finalize`` makes any other (which refuses an empty
    accumulator: standalone, an empty histogram is a mistake; in a stream it is a window like any
    other, whose release must not differ in form — a test holds the two to the same shape)."""
    from ldp_beam.central.histogram import HistogramReleaseEstimator, release_source

    if not isinstance(estimator, HistogramReleaseEstimator):
        return None

    def release(acc: np.ndarray) -> Estimate:
        mech = estimator.mechanism
        rel = mech.publish(acc, release_source(estimator.seed, acc))
        var = mech.noise_variance(rel)
        stats = {"histogram": Statistic(
            np.asarray(rel["histogram"]), None if var is None else np.sqrt(var),
            note="the published counts in bucket order; stderr: the noise alone (grouping "
                 "methods add a reconstruction bias it does not include)")}
        if "groups" in rel:
            stats["groups"] = Statistic(np.asarray(rel["groups"]),
                                        note="group id of every bucket (part of the release)")
        return Estimate(mech.name, None, stats, mech.guarantee, mech.params())

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
            acc[2] = True
            return acc
        acc[0] = self.inner.add_input(acc[0], element)
        acc[1] += num_rows(element)
        return acc

    def merge_accumulators(self, accs):
        accs = list(accs)
        return [self.inner.merge_accumulators([a[0] for a in accs]), sum(a[1] for a in accs),
                any(a[2] for a in accs)]

    def extract_output(self, acc):
        inner, count, marked = acc
        if not self.central:
            return self.inner.extract_output(inner), count, marked
        if not marked:
            return None, count, False
        if count == 0 and self.release_empty is not None:
            return self.release_empty(inner), count, True
        return self.inner.extract_output(inner), count, True


def window_fields(start_us: int, end_us: int) -> dict:
    return {"window_start": iso(start_us), "window_end": iso(end_us),
            "window_start_epoch": start_us / 1e6, "window_end_epoch": end_us / 1e6}


def result_dict(est: Any, central: bool) -> dict:
    if isinstance(est, EstimateFailure):
        return {"error": est.reason} if central else {"error": est.reason,
                                                      "n_reports": est.n_reports}
    return est.to_dict()


class PaneFn(beam.DoFn):
    """``(estimate, count, marked)`` of one firing -> a pane element: the published row (or,
    for a central release outside the range or past the window's budget, the reason it is
    withheld) and the count."""

    def __init__(self, central: bool, releases: int, guarantee: dict,
                 prior_releases: Mapping[int, int] | None = None) -> None:
        self.central, self.releases, self.guarantee = central, releases, guarantee
        self.prior = dict(prior_releases or {})

    def process(self, element, window=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        est, count, marked = element
        start, end = window.start.micros, window.end.micros
        index, timing = int(pane.index), TIMING.get(int(pane.timing), "unknown")
        out = {"window_start_us": start, "window_end_us": end, "index": index,
               "timing": timing, "count": int(count), "row": None, "refused": None}
        row = {**window_fields(start, end), "pane": {"index": index, "timing": timing}}
        if self.central:
            out["in_range"] = bool(marked)
            span = f"[{iso(start)}, {iso(end)})"
            if not marked:
                out["refused"] = (
                    f"release withheld: window {span} is outside the run's release range (not "
                    "marked as part of it when it fired; see release_range in summary.json): a "
                    "central-DP stream releases exactly the windows of its range, so that "
                    "whether a window is released reveals nothing about its records (their "
                    "count is in the ledger)")
                yield out
                return
            release = self.prior.get(start, 0) + index + 1
            if release > self.releases:
                out["refused"] = (
                    f"release refused: firing {index + 1} of window {span} "
                    f"would be release {release} of a budget of {self.releases} "
                    "(--releases-per-window)")
                yield out
                return
            res = result_dict(est, True)
            per_release = res.pop("guarantee", None)
            row.update(res)
            row["release"] = {"index": release, "of": self.releases}
            row["guarantee"] = self.guarantee
            if self.releases > 1 and per_release is not None:
                row["guarantee_per_release"] = per_release
        else:
            row.update(result_dict(est, False))
        out["row"] = row
        yield out


def _report_column(values: list) -> np.ndarray:
    """A column from record fields: int64 when every value is an int, float64 when every value
    is a number (booleans are not), otherwise object (parsed, or flagged, by the validation)."""
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        try:
            return np.asarray(values, dtype=np.int64)
        except OverflowError:
            pass
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
                 columns: Mapping[str, str] | None = None, max_rows: int = 4096) -> None:
        self.mechanism = mechanism
        self.central = bool(getattr(mechanism, "central", False))
        self.fields = tuple(name for name, _ in mechanism.report_fields)
        self.estimator = estimator
        self.columns = dict(columns or {r.name: r.name for r in mechanism.roles if r.required})
        self.shown = list(dict.fromkeys(self.columns.values()))
        self.max_rows = max_rows
        what = "records" if self.central else "reports"
        self.n_in = Metrics.counter("ldp_beam", f"{what}_in")
        self.n_bad = Metrics.counter("ldp_beam", f"{what}_invalid")

    def start_bundle(self) -> None:
        self._groups: dict[Any, list] = {}

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

    def _dead(self, reasons: Any, group: list, window: Any, shown: list | None):
        msgs = reasons.as_dict()
        for i in np.flatnonzero(reasons.bad).tolist():
            record, ts, source, line = group[i]
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
        if self.central:
            absent = [next((c for c in self.shown if c not in r), None) for r in records]
            raw = {role: _raw_column([r.get(col) for r in records])
                   for role, col in self.columns.items()}
            cols, reasons = self.mechanism.check(raw)
            reasons.flag(np.array([a is not None for a in absent]),
                         lambda i: f"record has no field {absent[i]!r}", replace=True)
            yield from self._dead(reasons, group, window, self.shown)
            ok = np.flatnonzero(~reasons.bad)
            if ok.size:
                batch = self.mechanism.randomize({k: v[ok] for k, v in cols.items()},
                                                 np.empty((int(ok.size), 0)))
                yield WindowedValue(batch, min(group[i][1] for i in ok.tolist()), (window,))
            return
        absent = [next((f for f in self.fields if f not in r), None) for r in records]
        cols = {f: _report_column([r.get(f) for r in records]) for f in self.fields}
        reasons = self.estimator.check_reports(cols, n)
        reasons.flag(np.array([a is not None for a in absent]),
                     lambda i: f"report field {absent[i]!r} is missing", replace=True)
        yield from self._dead(reasons, group, window, None)
        ok = np.flatnonzero(~reasons.bad)
        if ok.size:
            batch = {f: c[ok] for f, c in cols.items()}
            yield WindowedValue(batch, min(group[i][1] for i in ok.tolist()), (window,))


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
    the windowing and triggers (see the module docstring); ``releases_per_window``: the release
    budget per window of a central family (required when a window can fire more than once);
    ``prior_releases``: releases already made per window start (µs), e.g. before a crash, that
    count against it.
    """

    def __init__(self, mechanism: Mechanism, window_seconds: float,
                 allowed_lateness: float = 0.0, early_seconds: float | None = None,
                 releases_per_window: int | None = None,
                 columns: Mapping[str, str] | None = None,
                 options: Mapping[str, Any] | None = None,
                 prior_releases: Mapping[int, int] | None = None) -> None:
        super().__init__()
        self.clock = WindowClock(window_seconds, allowed_lateness)
        if early_seconds is not None:
            ok = (isinstance(early_seconds, (int, float)) and not isinstance(early_seconds, bool)
                  and math.isfinite(early_seconds) and early_seconds >= 1
                  and float(early_seconds).is_integer())
            if not ok:
                raise StreamConfigError(
                    f"--early {early_seconds!r}: expected a whole number of seconds >= 1 (Beam's "
                    "processing-time trigger delay is carried in whole seconds)")
        if releases_per_window is not None and (isinstance(releases_per_window, bool) or
                                                not isinstance(releases_per_window, int) or
                                                releases_per_window < 1):
            raise StreamConfigError(f"--releases-per-window {releases_per_window!r}: expected "
                                    "an integer >= 1")
        self.mechanism = mechanism
        self.central = bool(getattr(mechanism, "central", False))
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
                raise StreamConfigError(f"{mechanism.name} draws noise per record; a central "
                                        "stream only checks and buckets raw records")
        self.estimator = estimator_for(mechanism, **dict(options or {}))
        self.release_empty = empty_release(self.estimator) if self.central else None
        if self.central and self.release_empty is None:
            raise StreamConfigError(
                f"{mechanism.name} cannot be streamed: a central-DP stream releases every window "
                "of its range, those without records too (so that whether a window is released "
                "reveals nothing), and its estimator has no release of an empty window; stream "
                "a histogram release (laplace-histogram, dphr, ahp, structure-first) or run "
                "`ldp-beam estimate` on a fixed batch")
        self.prior = dict(prior_releases or {})

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
            self.mechanism, None if self.central else self.estimator, self.columns)), "batches")
        combine = CountingCombineFn(EstimatorCombineFn(self.estimator, on_empty="report"),
                                    self.central, self.release_empty)
        panes = (batched.batches
                 | "EstimatePerWindow" >> beam.CombineGlobally(combine).without_defaults()
                 | "Panes" >> beam.ParDo(PaneFn(self.central, self.releases,
                                                self.guarantee.to_dict(), self.prior)))
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
                 progress: bool = True) -> None:
        self.out_dir, self.run_id, self.central = out_dir, run_id, central
        self.spool_path, self.progress = spool_path, progress
        self._fds: dict[str, int] | None = None

    def _fd(self, name: str) -> int:
        if self._fds is None:
            self._fds = {}
        if name not in self._fds:
            self._fds[name] = os.open(os.path.join(self.out_dir, name),
                                      os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fds[name]

    def teardown(self) -> None:
        for fd in (self._fds or {}).values():
            os.close(fd)
        self._fds = None

    def _say(self, msg: str) -> None:
        if self.progress:
            say(f"ldp-beam stream: {msg}")

    def process(self, keyed, settle=beam.DoFn.TimerParam(SETTLE)):
        kind, payload = keyed[1]
        run = {"run": self.run_id}
        if kind == PANE:
            p = payload
            ledger = {"kind": "pane", **run, **window_fields(p["window_start_us"],
                                                             p["window_end_us"]),
                      "pane": p["index"], "timing": p["timing"], "count": p["count"],
                      "released": p["row"] is not None}
            if "in_range" in p:
                ledger["in_range"] = p["in_range"]
            if p["row"] is not None:
                _append(self._fd(ESTIMATES), {**run, **p["row"]})
            else:
                _append(self._fd(DEAD_LETTERS), {
                    **run, "stage": "release", "reason": p["refused"], "source": "release",
                    "row": None, "record": {**window_fields(p["window_start_us"],
                                                            p["window_end_us"]),
                                            "pane": {"index": p["index"],
                                                     "timing": p["timing"]}}})
            _append(self._fd(LEDGER_FILE), ledger)
            self._say(self._pane_line(p))
        elif kind == DEAD:
            _append(self._fd(DEAD_LETTERS), {**run, "stage": payload.get("stage", "source"),
                                             **payload})
        elif kind == LEDGER:
            _append(self._fd(LEDGER_FILE), {**run, **payload})
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
        if self.central:
            r = p["row"]["release"]
            return f"window {span} {what}: release {r['index']} of {r['of']}"
        return f"window {span} {what}: {p['count']:,} reports"


# --------------------------------------------------------------------------- Pub/Sub
class ParseMessagesFn(beam.DoFn):
    """Pub/Sub message payloads (JSON lines, one record or more) -> items, each record at its
    event time."""

    def __init__(self, timestamp_field: str, source: str) -> None:
        self.timestamp_field, self.source = timestamp_field, source
        self.n_records = Metrics.counter("ldp_beam", "stream_records")
        self.n_lines = Metrics.counter("ldp_beam", "stream_lines")

    def process(self, data: bytes):
        for i, raw in enumerate(bytes(data).splitlines(), 1):
            if not raw.strip():
                continue
            self.n_lines.inc()
            try:
                record, t_us = parse_line(raw, self.timestamp_field)
            except ValueError as exc:
                yield DEAD, {"reason": str(exc), "record": raw[:1000].decode("utf-8", "replace"),
                             "source": self.source, "row": i}
                continue
            self.n_records.inc()
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
    """``beam.io.ReadFromPubSub(subscription=...)`` -> items. Needs Beam's GCP extras."""

    def __init__(self, subscription: str, timestamp_field: str) -> None:
        super().__init__()
        self.path = subscription_path(subscription)
        self.timestamp_field = timestamp_field
        try:
            import_module("google.cloud.pubsub_v1")  # what ReadFromPubSub needs at run time
        except ImportError:
            raise StreamConfigError(
                "--subscription reads Pub/Sub, which needs Apache Beam's GCP extras: "
                "pip install 'apache-beam[gcp]'") from None

    def expand(self, pbegin):
        return (pbegin | "PubSub" >> beam.io.ReadFromPubSub(subscription=self.path)
                | "Parse" >> beam.ParDo(ParseMessagesFn(self.timestamp_field,
                                                        f"pubsub:{self.path}")))


# --------------------------------------------------------------------------- the pipeline
def _records(item):
    """An item -> the element of the estimate: ``(record, source, line)`` (a bare record for an
    item without provenance), or a window mark."""
    kind = item[0]
    if kind == RECORDS:
        return [RecordRows(item[1], item[2])]
    if kind == RECORD:
        return [item[1] if len(item) == 2 else (item[1], item[2], item[3])]
    return [WINDOW_MARK] if kind == MARK else []


def _others(item):
    return [] if item[0] in (RECORD, RECORDS, MARK) else [item]


def _tag_invalid(d):
    return DEAD, {**d, "stage": "validate"}


def _tag_pane(p):
    return PANE, p


def _keyed(x):
    return 0, x


def estimate_stream(items: Any, estimate: WindowedEstimate, sink: StreamSink) -> Any:
    """Items (records at their event times, with their file and line, window marks at their
    window's start, dead letters, ledger entries, heartbeats) -> windowed estimates -> the sink.
    Returns the sink's (empty) output."""
    records = items | "Records" >> beam.FlatMap(_records)
    others = items | "Bookkeeping" >> beam.FlatMap(_others)
    out = records | "Estimate" >> estimate
    panes = (out.panes | "TagPanes" >> beam.Map(_tag_pane)
             | "Unwindow" >> beam.WindowInto(GlobalWindows()))
    invalid = out.dead_letter | "TagInvalid" >> beam.Map(_tag_invalid)
    return ((others, invalid, panes) | "ToSink" >> beam.Flatten()
            | "OneWriter" >> beam.Map(_keyed) | "Write" >> beam.ParDo(sink))


def prior_releases(path: str) -> dict[int, int]:
    """Releases per window start (µs) already in an estimates file (every run's)."""
    out: dict[int, int] = {}
    if not os.path.exists(path):
        return out
    with open(path) as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                if "release" in row:
                    key = int(round(row["window_start_epoch"] * 1e6))
                    out[key] = out.get(key, 0) + 1
    return out


def _read_run(path: str, run_id: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        rows = (json.loads(line) for line in fh if line.strip())
        return [r for r in rows if r.get("run") == run_id]


def summarize(out_dir: str, run_id: str, records_read: int | None = None,
              from_files: bool = False) -> dict:
    """Reconcile one run from its outputs (see the module docstring). ``from_files``: a spool
    run, whose file ledger counts what was read; otherwise ``records_read`` (None: unknown)."""
    ledger = _read_run(os.path.join(out_dir, LEDGER_FILE), run_id)
    dead = _read_run(os.path.join(out_dir, DEAD_LETTERS), run_id)
    files = [r for r in ledger if r["kind"] == "file"]
    last: dict[str, dict] = {}
    last_released: dict[str, dict] = {}
    n_panes = n_withheld = 0
    for p in (r for r in ledger if r["kind"] == "pane"):
        n_panes += 1
        n_withheld += not p["released"]
        w = p["window_start"]
        if w not in last or p["pane"] > last[w]["pane"]:
            last[w] = p
        if p["released"] and (w not in last_released or p["pane"] > last_released[w]["pane"]):
            last_released[w] = p
    src = {k: sum(f[k] for f in files) for k in ("lines", "records", "dead_lettered",
                                                   "too_late", "skipped_settled")}
    in_windows = sum(p["count"] for p in last.values())
    released_from = sum(p["count"] for p in last_released.values())
    invalid = sum(1 for d in dead if d.get("stage") == "validate")
    records = src["records"] if from_files else records_read
    at_source = src["dead_lettered"] if from_files else \
        sum(1 for d in dead if d.get("stage") == "source")
    out = {"run": run_id, "files": len(files), "windows": len(last), "panes": n_panes,
           "panes_withheld": n_withheld,
           "records": {"lines": src["lines"] if from_files else None, "read": records,
                       "dead_lettered_at_source": at_source,
                       "too_late": src["too_late"], "skipped_settled": src["skipped_settled"],
                       "invalid": invalid, "in_windows": in_windows,
                       "in_releases": released_from if n_withheld else in_windows}}
    ranged = [p for p in last.values() if "in_range" in p]
    if ranged:  # a central release: the windows of its range, and those withheld outside it
        inside = [p for p in ranged if p["in_range"]]
        out["release_range"] = {
            "windows": len(inside), "windows_outside": len(ranged) - len(inside),
            "first_window_start": min((p["window_start"] for p in inside), default=None),
            "last_window_end": max((p["window_end"] for p in inside), default=None)}
    if records is not None:
        dropped = records - in_windows - invalid
        out["records"]["dropped_by_windowing"] = dropped
        ok = dropped == 0
        if from_files:
            ok = ok and src["lines"] == src["records"] + src["dead_lettered"] + \
                src["skipped_settled"]
        out["reconciles"] = bool(ok)
    else:
        out["reconciles"] = None
    return out


def run_stream(output_dir: str, mechanism: Mechanism, *, spool: str | None = None,
               subscription: str | None = None, window_seconds: float = 60.0,
               allowed_lateness: float = 0.0, early_seconds: float | None = None,
               releases_per_window: int | None = None,
               columns: Mapping[str, str] | None = None,
               options: Mapping[str, Any] | None = None, timestamp_field: str = "ts",
               poll_seconds: float = 1.0, watermark_lag: float = 0.0,
               duration: float | None = None, once: bool = False,
               beam_args: Iterable[str] = (), stop: threading.Event | None = None,
               progress: bool = True, start: Any = None, end: Any = None) -> dict:
    """Run a streaming estimation (see the module docstring) until ``duration`` seconds have
    passed, ``stop`` is set, SIGINT/SIGTERM arrives (when run on the main thread) or, with
    ``once``, the spool's present files are read. Outputs go to ``output_dir`` (appended to, so a
    restarted run continues them); returns the run's summary (also ``OUT/summary.json``).

    ``start``, ``end`` (epoch seconds or ISO 8601 text): the release range of a central-DP
    stream (see "Release range" in the module docstring)."""
    if (spool is None) == (subscription is None):
        raise StreamConfigError("give exactly one source: --spool DIR or --subscription "
                                "PROJECT/SUB")
    if once and spool is None:
        raise StreamConfigError("--once reads a spool directory once; it does not apply to "
                                "--subscription")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise StreamConfigError(f"--duration {duration!r}: expected seconds > 0")
    central = bool(getattr(mechanism, "central", False))
    start_us, end_us = _range_bound(start, "--start"), _range_bound(end, "--end")
    if not central and (start_us is not None or end_us is not None):
        raise StreamConfigError(f"--start/--end set the release range of a central-DP stream; "
                                f"{mechanism.name} is {mechanism.guarantee.kind}, whose windows "
                                "are estimated from the reports they have")
    if central and subscription is not None:
        raise StreamConfigError(
            f"{mechanism.name} is a central-DP release, which must release every window of its "
            "range (so that whether a window is released reveals nothing); the Pub/Sub source "
            "cannot mark that range here: stream central releases from --spool")
    if start_us is not None and end_us is not None and end_us <= start_us:
        raise StreamConfigError(f"--end {end!r} is not after --start {start!r}")
    os.makedirs(output_dir, exist_ok=True)
    out_dir = os.path.abspath(output_dir)
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ") + f"-{os.getpid()}"
    args = runner_args(beam_args)
    stop = stop or threading.Event()
    clock = WindowClock(window_seconds, allowed_lateness)
    spool_dir = SpoolDirectory(spool, clock, timestamp_field) if spool else None
    if spool_dir is not None:
        spool_dir.open()
    try:
        if central:  # the release range: declared, or (live) from the run's start
            size = clock.size_us
            if once:
                range_start, range_end = start_us, end_us
            else:
                range_start = start_us if start_us is not None else \
                    int(time.time() * 1_000_000) - Duration.of(watermark_lag).micros
                range_end = end_us
            if range_start is not None and (range_end is not None or not once):
                horizon = range_end if range_end is not None else \
                    int(time.time() * 1_000_000) + size
                n = max(0, -(-(horizon - clock.window(range_start)[0]) // size))
                if n > MAX_RANGE_WINDOWS:
                    raise StreamConfigError(
                        f"--start {start!r}: the release range would have {n:,} windows of "
                        f"--window {window_seconds:g}s"
                        + ("" if once else " before now") + f", more than {MAX_RANGE_WINDOWS:,} "
                        "(each is a release): give a later --start"
                        + (" or an earlier --end" if once else "") + " or a longer --window")
        recovered = spool_dir.leftovers() if spool_dir else []
        prior = prior_releases(os.path.join(out_dir, ESTIMATES)) if central and recovered \
            else {}
        estimate = WindowedEstimate(
            mechanism, window_seconds, 0.0 if once else allowed_lateness,
            None if once else early_seconds, releases_per_window, columns, options, prior)
        log = (lambda m: say(f"ldp-beam stream: {m}")) if progress else (lambda m: None)
        if once:
            source: Any = ReadSpoolOnce(spool_dir)
            what = f"spool {spool_dir.path}, once ({len(source.claimed)} file(s))"
        elif spool_dir is not None:
            if runner_name(args) not in DIRECT_RUNNERS:
                raise StreamConfigError(
                    f"--spool streams on the DirectRunner only (not {runner_name(args)}): use "
                    "--once for a bounded read on other runners, or --subscription")
            source = SpoolSource(spool_dir, poll_seconds, duration, watermark_lag, stop, log,
                                 mark_from_us=range_start if central else None,
                                 mark_until_us=range_end if central else None)
            what = f"spool {spool_dir.path} every {poll_seconds:g}s"
        else:
            source = ReadPubSubRecords(subscription, timestamp_field)
            what = f"Pub/Sub {source.path}"
        if not once and "--streaming" not in args:
            args = args + ["--streaming"]
        sink = StreamSink(out_dir, run_id, central,
                          spool_dir.path if (spool_dir and not once) else None, progress)
        windows = f"windows of {window_seconds:g}s"
        if not once and allowed_lateness:
            windows += f", allowed lateness {allowed_lateness:g}s"
        if once and (allowed_lateness or early_seconds):
            log("--once: a bounded read fires every window once, at the end; --allowed-lateness "
                "and --early do not apply")
        if recovered:
            log(f"{len(recovered)} file(s) left in {os.path.join(spool_dir.path, '.claimed')} "
                "by an interrupted run: re-reading them from the start")
        log(f"run {run_id}: {mechanism.name} ({estimate.guarantee.describe()}"
            + (" per window" if central else " per report") + f") on {what}, {windows}; "
            f"estimates -> {os.path.join(out_dir, ESTIMATES)}"
            + ("" if once or duration else "; Ctrl-C stops cleanly"))

        if central:
            log(_range_line(once, range_start, range_end, start_us is not None))

        def build(p):
            items = p | "Read" >> source
            if central and once:
                items = (items, items | "Marks" >> MarkRange(clock, range_start, range_end)) \
                    | "WithMarks" >> beam.Flatten()
            return [estimate_stream(items, estimate, sink)]

        started = time.monotonic()
        with _stop_on_signals(stop, log, enabled=spool_dir is not None and not once):
            if isinstance(source, SpoolSource):
                with source:
                    result = run_pipeline(build, args)
            else:
                result = run_pipeline(build, args)
        if spool_dir is not None:
            source.finish_all()  # the pipeline finished: every file read is settled
        if getattr(source, "error", None) is not None:  # it ended the stream early
            raise RuntimeError(f"the spool source failed: {source.error}") from source.error
        records_read = counters(result).get("stream_records") if subscription else None
        summary = summarize(out_dir, run_id, records_read, from_files=spool_dir is not None)
        summary.update({"mechanism": mechanism.name, "params": mechanism.params(),
                        "guarantee": estimate.guarantee.to_dict(),
                        "seconds": round(time.monotonic() - started, 3),
                        "outputs": {k: os.path.join(out_dir, v) for k, v in (
                            ("estimates", ESTIMATES), ("dead_letter", DEAD_LETTERS),
                            ("ledger", LEDGER_FILE))}})
        if central:
            rr = summary.setdefault("release_range", {"windows": 0, "windows_outside": 0})
            rr.update({"start": iso(range_start) if range_start is not None else None,
                       "end": iso(range_end) if range_end is not None else None,
                       "declared": {"start": start_us is not None, "end": end_us is not None},
                       "rule": _range_line(once, range_start, range_end,
                                           start_us is not None)})
        write_json(os.path.join(out_dir, SUMMARY), summary)
        log(summary_line(summary))
        return summary
    finally:
        if spool_dir is not None:
            spool_dir.close()


def _range_bound(value: Any, option: str) -> int | None:
    if value is None:
        return None
    try:
        return event_micros(value, option)
    except ValueError:
        raise StreamConfigError(f"{option} {value!r}: expected epoch seconds or ISO 8601 text "
                                "(a time between the years 1 and 9999)") from None


def _range_line(once: bool, start_us: int | None, end_us: int | None, declared: bool) -> str:
    """The release range of a central-DP run, for people (logged, and in summary.json)."""
    first = (f"the window containing {iso(start_us)}" + ("" if declared else
                                                         " (the run's start)")
             if start_us is not None else
             "the window of the earliest record read (no --start: this end of the range "
             "reveals that its window has a record)")
    last = (f"the last window starting before {iso(end_us)}" if end_us is not None else
            "the window of the latest record read (no --end: this end of the range reveals that "
            "its window has a record)" if once else
            "the last window starting before the run's stop")
    return (f"release range: every window from {first} to {last} is released, with or "
            "without records; windows outside it are withheld")


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
        if not spans:
            return None, None
        return min(a[0] for a in spans), max(a[1] for a in spans)

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


def summary_line(s: dict) -> str:
    r = s["records"]
    if r["read"] is None:
        return (f"{s['windows']} window(s), {s['panes']} pane(s); {r['in_windows']:,} records "
                f"in windows, {r['invalid']:,} invalid (records read: unknown, no metrics)")
    parts = [f"{r['read']:,} records read = {r['in_windows']:,} in windows + "
             f"{r['invalid']:,} invalid"]
    if r.get("dropped_by_windowing"):
        parts.append(f"+ {r['dropped_by_windowing']:,} dropped as later than the allowed "
                     "lateness")
    line = " ".join(parts)
    if r["lines"] is not None:
        line += (f"; {r['dead_lettered_at_source']:,} line(s) dead-lettered at the source "
                 f"({r['too_late']:,} too late)")
        if r["skipped_settled"]:
            line += f", {r['skipped_settled']:,} skipped as settled before the restart"
    if s["panes_withheld"]:
        outside = s.get("release_range", {}).get("windows_outside", 0)
        line += f"; {s['panes_withheld']} release(s) withheld (budget spent" + (
            f", or {outside} window(s) outside the release range)" if outside else ")")
    return (f"{s['windows']} window(s), {s['panes']} pane(s) from {s['files']} file(s); "
            + line + ("" if s["reconciles"] else "  ** DOES NOT RECONCILE **"))


class _stop_on_signals:
    """SIGINT/SIGTERM set ``stop`` (a clean stop: open windows fire, claimed files settle); a
    second SIGINT interrupts. Only on the main thread."""

    def __init__(self, stop: threading.Event, log: Any, enabled: bool) -> None:
        self.stop, self.log = stop, log
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.saved: dict = {}

    def _handle(self, signum, frame):
        self.log(f"{signal.Signals(signum).name}: stopping cleanly (open windows fire first; "
                 "press Ctrl-C again to abort)")
        self.stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __enter__(self):
        if self.enabled:
            for s in (signal.SIGINT, signal.SIGTERM):
                self.saved[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self.saved.items():
            signal.signal(s, h)
