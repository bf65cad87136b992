"""``ldp-beam stream``: windowed streaming estimation of telemetry.

Records with event times (from a spool directory, :mod:`ldp_beam.transforms.spool`, or Pub/Sub)
are windowed into fixed event-time windows, validated and estimated per window: raw records of a
central-DP family are first checked and bucketed by the mechanism (:class:`Perturb`, which adds
no noise: the release does, once per firing); LDP reports are checked by the estimator's
``check_reports`` (what :class:`ValidateReports` applies) on one column batch per window and
bundle (:class:`BatchPerWindowFn`), so both are folded a batch at a time. Each firing of a window (a
*pane*) is one line of ``OUT/estimates.jsonl`` with the window's bounds (ISO and epoch seconds),
the pane's index and timing, the estimate (statistics, ``n_reports`` for LDP) and the guarantee.

**Triggers.** A window fires when the watermark passes its end (the on-time pane); with
``allowed_lateness`` > 0, every late record within the lateness fires it again (a late pane,
accumulating: each pane is the estimate over everything the window has received); ``early``
adds speculative panes every so many seconds of processing time. For LDP families a pane is
post-processing of the same reports: it costs no privacy, and the last pane of a window
supersedes the earlier ones. For central-DP families every pane is a fresh noisy release over
overlapping records, so a configuration that can fire a window more than once is refused unless
``releases_per_window`` N is given; then every release states the composition over N releases
(:func:`ldp_beam.privacy.compose`) and a window's firings past the N-th are not released (a
dead-letter line says which). Without late or early firings a central window releases once.
After a crash, the releases already in ``estimates.jsonl`` count against the budget of the
windows the re-read files feed, so a window is not released again from the same records.

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
from typing import Any, Iterable, Mapping

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger as tr
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import FixedWindows, GlobalWindows, TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from ldp_beam.core import Mechanism
from ldp_beam.estimators import estimator_for
from ldp_beam.privacy import compose
from ldp_beam.transforms import Perturb
from ldp_beam.transforms.batches import num_rows
from ldp_beam.transforms.perturb import dead_letter, split_dead_letters
from ldp_beam.transforms.combine import EstimateFailure, EstimatorCombineFn
from ldp_beam.transforms.io import to_json_line
from ldp_beam.transforms.spool import (DEAD, HEARTBEAT, LEDGER, RECORD, ReadSpoolOnce,
                                       SpoolDirectory, SpoolSource, WindowClock, file_line,
                                       iso, parse_line, record_settled)

from .common import counters, run_pipeline, runner_args, runner_name, say, write_json

PANE = "pane"
ESTIMATES, DEAD_LETTERS, LEDGER_FILE, SUMMARY = ("estimates.jsonl", "deadletter.jsonl",
                                                 "ledger.jsonl", "summary.json")
TIMING = {0: "early", 1: "on_time", 2: "late", 3: "unknown"}
DIRECT_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


class StreamConfigError(ValueError):
    """A streaming configuration that cannot be run as asked (the message names the option)."""


# --------------------------------------------------------------------------- per-window estimate
class CountingCombineFn(beam.CombineFn):
    """An :class:`EstimatorCombineFn` that also counts the records it folded: outputs
    ``(estimate or EstimateFailure, count)``. The count is the curator's bookkeeping (a central
    release does not publish it)."""

    def __init__(self, inner: EstimatorCombineFn) -> None:
        self.inner = inner

    def create_accumulator(self):
        return [self.inner.create_accumulator(), 0]

    def add_input(self, acc, element):
        acc[0] = self.inner.add_input(acc[0], element)
        acc[1] += num_rows(element)
        return acc

    def merge_accumulators(self, accs):
        accs = list(accs)
        return [self.inner.merge_accumulators([a[0] for a in accs]), sum(a[1] for a in accs)]

    def extract_output(self, acc):
        return self.inner.extract_output(acc[0]), acc[1]


def window_fields(start_us: int, end_us: int) -> dict:
    return {"window_start": iso(start_us), "window_end": iso(end_us),
            "window_start_epoch": start_us / 1e6, "window_end_epoch": end_us / 1e6}


def result_dict(est: Any, central: bool) -> dict:
    if isinstance(est, EstimateFailure):
        return {"error": est.reason} if central else {"error": est.reason,
                                                      "n_reports": est.n_reports}
    return est.to_dict()


class PaneFn(beam.DoFn):
    """``(estimate, count)`` of one firing -> a pane element: the published row (or, for a
    central release past the window's budget, the reason it is withheld) and the count."""

    def __init__(self, central: bool, releases: int, guarantee: dict,
                 prior_releases: Mapping[int, int] | None = None) -> None:
        self.central, self.releases, self.guarantee = central, releases, guarantee
        self.prior = dict(prior_releases or {})

    def process(self, element, window=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        est, count = element
        start, end = window.start.micros, window.end.micros
        index, timing = int(pane.index), TIMING.get(int(pane.timing), "unknown")
        out = {"window_start_us": start, "window_end_us": end, "index": index,
               "timing": timing, "count": int(count), "row": None, "refused": None}
        row = {**window_fields(start, end), "pane": {"index": index, "timing": timing}}
        if self.central:
            release = self.prior.get(start, 0) + index + 1
            if release > self.releases:
                out["refused"] = (
                    f"release refused: firing {index + 1} of window [{iso(start)}, {iso(end)}) "
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


class BatchPerWindowFn(beam.DoFn):
    """Windowed single reports -> one column batch per window per bundle (at most ``max_rows``
    rows), so the estimator folds a batch with one vectorized call instead of one per record.

    With ``estimator`` (LDP report records from untrusted clients) the reports are validated
    here, vectorized, by the estimator's own ``check_reports`` — the check
    :class:`ValidateReports` applies, which on single records costs a call per record: a record
    missing a report field, or with a malformed one, is dead-lettered whole, with the reason.
    Counters ``reports_in`` / ``reports_invalid`` (namespace ``ldp_beam``)."""

    def __init__(self, fields: tuple, estimator: Any = None, max_rows: int = 4096) -> None:
        self.fields = tuple(name for name, _ in fields)
        self.estimator = estimator
        self.max_rows = max_rows
        self.n_in = Metrics.counter("ldp_beam", "reports_in")
        self.n_bad = Metrics.counter("ldp_beam", "reports_invalid")

    def start_bundle(self) -> None:
        self._groups: dict[Any, list] = {}

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                window=beam.DoFn.WindowParam):
        if not isinstance(element, Mapping):
            self.n_in.inc()
            self.n_bad.inc()
            yield WindowedValue(dead_letter(f"unsupported report type {type(element).__name__}",
                                            repr(element)[:200]), timestamp, (window,))
            return
        group = self._groups.setdefault(window, [])
        group.append((element, timestamp))
        if len(group) >= self.max_rows:
            yield from self._flush(window)

    def finish_bundle(self):
        for window in list(self._groups):
            yield from self._flush(window)

    def _flush(self, window):
        group = self._groups.pop(window, [])
        if not group:
            return
        records = [r for r, _ in group]
        n = len(records)
        absent = [next((f for f in self.fields if f not in r), None) for r in records]
        cols = {f: _report_column([r.get(f) for r in records]) for f in self.fields}
        ok = np.ones(n, dtype=bool)
        if self.estimator is not None:
            self.n_in.inc(n)
            reasons = self.estimator.check_reports(cols, n)
            reasons.flag(np.array([a is not None for a in absent]),
                         lambda i: f"report field {absent[i]!r} is missing", replace=True)
            msgs = reasons.as_dict()
            for i in np.flatnonzero(reasons.bad).tolist():
                yield WindowedValue(dead_letter(msgs[i], dict(records[i])), group[i][1],
                                    (window,))
            self.n_bad.inc(int(reasons.bad.sum()))
            ok = ~reasons.bad
        if ok.any():
            idx = np.flatnonzero(ok)
            batch = {f: c[idx] for f, c in cols.items()}
            first = min(group[i][1] for i in idx.tolist())
            yield WindowedValue(batch, first, (window,))


class WindowedOutputs:
    def __init__(self, panes: Any, dead_letter: Any) -> None:
        self.panes, self.dead_letter = panes, dead_letter


class WindowedEstimate(beam.PTransform):
    """Timestamped records -> ``.panes`` (one element per firing of each fixed window, see
    :class:`PaneFn`) and ``.dead_letter`` (records that failed validation, with the reason).

    ``mechanism``: LDP families read report records (validated by the estimator); central-DP
    families (``mechanism.central``) read raw records, mapped by ``columns`` (role -> field).
    ``window_seconds``, ``allowed_lateness``, ``early_seconds``: the windowing and triggers (see
    the module docstring); ``releases_per_window``: the release budget per window of a central
    family (required when a window can fire more than once); ``prior_releases``: releases
    already made per window start (µs), e.g. before a crash, that count against it.
    """

    def __init__(self, mechanism: Mechanism, window_seconds: float,
                 allowed_lateness: float = 0.0, early_seconds: float | None = None,
                 releases_per_window: int | None = None,
                 columns: Mapping[str, str] | None = None,
                 options: Mapping[str, Any] | None = None,
                 prior_releases: Mapping[int, int] | None = None) -> None:
        super().__init__()
        self.clock = WindowClock(window_seconds, allowed_lateness)
        if early_seconds is not None and not (math.isfinite(early_seconds) and early_seconds > 0):
            raise StreamConfigError(f"--early {early_seconds!r}: expected seconds > 0")
        if releases_per_window is not None and (isinstance(releases_per_window, bool) or
                                                not isinstance(releases_per_window, int) or
                                                releases_per_window < 1):
            raise StreamConfigError(f"--releases-per-window {releases_per_window!r}: expected "
                                    "an integer >= 1")
        self.mechanism = mechanism
        self.central = bool(getattr(mechanism, "central", False))
        self.window_seconds, self.allowed_lateness = window_seconds, allowed_lateness
        self.early_seconds = early_seconds
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
        self.estimator = estimator_for(mechanism, **dict(options or {}))
        self.prior = dict(prior_releases or {})

    @property
    def trigger(self):
        late = tr.AfterCount(1) if self.allowed_lateness > 0 else None
        early = tr.AfterProcessingTime(self.early_seconds) if self.early_seconds else None
        if late is None and early is None:
            return tr.AfterWatermark()
        return tr.AfterWatermark(early=early, late=late)

    def expand(self, records):
        dead = []
        if self.central:  # raw records: checked and bucketed (no noise yet) by the mechanism
            checked = records | "CheckRecords" >> Perturb(self.mechanism, columns=self.columns)
            records, dead = checked.reports, [checked.dead_letter]
        windowed = records | "Window" >> beam.WindowInto(
            FixedWindows(self.window_seconds), trigger=self.trigger,
            accumulation_mode=tr.AccumulationMode.ACCUMULATING,
            allowed_lateness=Duration.of(self.allowed_lateness))
        batched = split_dead_letters(windowed | "Batch" >> beam.ParDo(BatchPerWindowFn(
            self.mechanism.report_fields, None if self.central else self.estimator)), "batches")
        combine = CountingCombineFn(EstimatorCombineFn(self.estimator, on_empty="report"))
        panes = (batched.batches
                 | "EstimatePerWindow" >> beam.CombineGlobally(combine).without_defaults()
                 | "Panes" >> beam.ParDo(PaneFn(self.central, self.releases,
                                                self.guarantee.to_dict(), self.prior)))
        dead.append(batched.dead_letter | "UnwindowDeadLetters" >> beam.WindowInto(
            GlobalWindows()))
        return WindowedOutputs(panes, dead[0] if len(dead) == 1 else
                               tuple(dead) | "AllInvalid" >> beam.Flatten())


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
            return f"window {span} {what}: release withheld (budget spent)"
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
            yield TimestampedValue((RECORD, record), Timestamp(micros=t_us))


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
    return [item[1]] if item[0] == RECORD else []


def _others(item):
    return [] if item[0] == RECORD else [item]


def _tag_invalid(d):
    return DEAD, {**d, "stage": "validate"}


def _tag_pane(p):
    return PANE, p


def _keyed(x):
    return 0, x


def estimate_stream(items: Any, estimate: WindowedEstimate, sink: StreamSink) -> Any:
    """``(kind, payload)`` items (records at their event times, dead letters, ledger entries,
    heartbeats) -> windowed estimates -> the sink. Returns the sink's (empty) output."""
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
               progress: bool = True) -> dict:
    """Run a streaming estimation (see the module docstring) until ``duration`` seconds have
    passed, ``stop`` is set, SIGINT/SIGTERM arrives (when run on the main thread) or, with
    ``once``, the spool's present files are read. Outputs go to ``output_dir`` (appended to, so a
    restarted run continues them); returns the run's summary (also ``OUT/summary.json``)."""
    if (spool is None) == (subscription is None):
        raise StreamConfigError("give exactly one source: --spool DIR or --subscription "
                                "PROJECT/SUB")
    if once and spool is None:
        raise StreamConfigError("--once reads a spool directory once; it does not apply to "
                                "--subscription")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise StreamConfigError(f"--duration {duration!r}: expected seconds > 0")
    central = bool(getattr(mechanism, "central", False))
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
            source = SpoolSource(spool_dir, poll_seconds, duration, watermark_lag, stop, log)
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

        def build(p):
            items = p | "Read" >> source
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
        write_json(os.path.join(out_dir, SUMMARY), summary)
        log(summary_line(summary))
        return summary
    finally:
        if spool_dir is not None:
            spool_dir.close()


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
        line += f"; {s['panes_withheld']} release(s) withheld (budget spent)"
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
