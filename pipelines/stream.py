"""``ldp-beam stream``: windowed streaming estimation of telemetry.

Records with event times (from a spool directory, :mod:`ldp_beam.transforms.spool`, or Pub/Sub) are
windowed into fixed event-time windows, then validated and folded a column batch per window and
bundle at a time (:class:`BatchPerWindowFn`, which says how: a central-DP family's raw records are
checked and bucketed with no noise, which the release adds, once per firing). Each firing of a
window (a *pane*) is one line of ``OUT/estimates.jsonl`` with the window's bounds (ISO and epoch
seconds), the pane's index and timing, the estimate (statistics, ``n_reports`` for LDP) and the
guarantee.

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
  continues the range recorded by the live run before it in the same output folder
  (``OUT/curator/release_range.json``; so a window left open by a stop or a ``kill -9`` is released
  by the restart, from the records it re-reads), and the first live run starts at the window
  containing the run's start (wall clock less the watermark lag): records of a backlog older than
  that are withheld (declare ``--start`` to release their windows); a ``--once`` run starts at the
  window of the earliest record read, which then reveals that window has a record (so declare
  ``--start``);
* it ends with the last window starting before ``end`` (``--end``) when declared, else, live, before
  the wall clock at the run's last poll (its stop): a window after it, fed by event times ahead of
  the clock, is withheld; a ``--once`` run without ``--end`` ends with the window of the latest
  record read (the same caveat as for its start);
* a restarted live run does not mark windows already closed at the settled watermark of the previous
  run (they were that run's to release); a range has at most ``MAX_RANGE_WINDOWS`` windows.

The source marks every window of the range (a ``MARK`` item at its start, sent once the wall clock
reaches it, so before the watermark does; :class:`WindowMark`), so each fires whether or not it has
records, and :class:`PaneFn` releases only marked windows. What the range does not hide: with late
or early firings (``--allowed-lateness``, ``--early``) the *number* of releases of a window (at most
N) depends on when its records arrive — a late pane exists only because a late record did. Each
release states the composition over N regardless; a stream whose release pattern must reveal nothing
uses neither, and releases each window of its range exactly once. The Pub/Sub source cannot mark a
range here, so central-DP streams read a spool; a family whose estimator has no release of an empty
window (OSPDPRR's) is refused.

**Privacy units.** Without one, every output's guarantee says it holds *per record only*: a
person who sends several reports spends epsilon once per report, and a device reporting every
window spends it again every window. With ``privacy_unit`` FIELD (``--privacy-unit``) every record
carries its unit's id in FIELD, which the source replaces at once by a keyed hash (the key stays
in the stream's per-unit state, ``OUT/units.sqlite``, on the trusted side: no raw id reaches an
estimate, a dead letter or the ledger); then, per window (:class:`UnitPaneFn`,
:meth:`ldp_beam.longitudinal.UnitState.admit`):

* at most ``max_reports_per_unit`` (k) of a unit's reports — raw records for a central-DP release —
  are estimated, those of smallest keyed priority (a keyed hash of the record's identity — file,
  line, event time, unit, memo slot and report — under the state's key: uniform among the unit's
  reports of the window when they are all there when it fires, deterministic under retries, runners
  and restarts); the others are counted as ``bounded_out``. Reports selected for an earlier pane of
  the window (an early pane, a run before a restart) stay selected and count against k, so no window
  ever estimates more than k reports of a unit, whatever its panes. (A limit, not a leak: a later
  pane estimates such a report again only while it is among the unit's k candidates there; one
  displaced by a later report of smaller priority, or not read by a run after a restart, leaves its
  unit out of that pane, which then under-counts the unit, with no new charge. The state keeps no
  report content to restore it from: for a central release that would be raw values at rest.);
* each estimated report costs its unit epsilon (LDP: the mechanism's; central: the window's release
  epsilon, composed over its releases, and for k > 1 records by group privacy: ceil(k / L) x epsilon
  for a release calibrated to L rows per unit), accumulated across windows and restarts; with
  ``memoize`` (the report field naming a memoized report's slot, ``memo_id`` by default;
  :meth:`ldp_beam.longitudinal.Memoized.memo_ids`) a report that repeats its unit's memo slot with
  the same report costs nothing — an honest bound only if the producer memoizes (see
  :mod:`ldp_beam.longitudinal`);
* with ``unit_budget`` B, a report that would take its unit's cumulative loss past B is counted as
  ``over_budget`` and dropped, never estimated.

Every guarantee then says "per privacy unit FIELD (at most k reports per window; cumulative loss
capped at B)". LDP estimates state their estimand (each unit counts at most k reports of the
window) and, for k > 1, widen their standard errors by sqrt(k) (reports of one unit may be
correlated; :meth:`ldp_beam.core.Estimate.with_design_effect`). The per-unit counts of a pane
are in ``ledger.jsonl`` (and, for LDP, in the estimate row; a central release publishes none).

**The budget ledger.** Every run is recorded in the team's ledger (``ledger``, ``dataset``,
``budget``), at what it added to the largest loss one unit (or, without a privacy unit, one
record) has taken in this output folder; the dataset's budget caps every unit; a killed run is
settled exactly by the next (:mod:`.stream_account`).

**Accounting.** Nothing is dropped silently: every record is in a window's panes, dead-lettered
(``OUT/curator/deadletter.jsonl``, with the stage, the reason and, from a spool, the file and line),
or counted. ``OUT/curator/ledger.jsonl`` is the curator's bookkeeping (one line per file read and
per pane, with exact record counts — never for publication: everything under ``OUT/curator/`` is
trusted-side, and says so in its ``CURATOR-ONLY.txt``), and the end-of-run summary reconciles: lines
read = records + dead-lettered at the source + skipped as settled before a restart; records =
records in the windows' last panes + invalid records (+ records Beam's windowing dropped as later
than the allowed lateness, which the spool source prevents by dead-lettering them itself; with
Pub/Sub they can only be counted, as this difference); with a privacy unit, the records of every
window's last pane = estimated + bounded out + over budget.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
from collections import Counter
from typing import Any, Iterable, Iterator, Mapping

import apache_beam as beam
from apache_beam.utils.timestamp import Duration

from ldp_beam.core import CentralRelease, Mechanism
from ldp_beam.longitudinal import UnitState, UnitStateError
from ldp_beam.transforms.sources import redact
from ldp_beam.transforms.stream_results import (check_results, jsonl_rows, open_results,
                                                unsettled_rows)
from ldp_beam.transforms.spool import (ReadSpoolOnce, SpoolDirectory, SpoolSource, WindowClock,
                                       event_micros, iso)
from ldp_beam.transforms.windowed import (CURATOR, ESTIMATES, DEAD_LETTERS, LEDGER_FILE, SUMMARY,
                                          RANGE_FILE, CURATOR_NOTE, MAX_RANGE_WINDOWS,
                                          DIRECT_RUNNERS, StreamConfigError, MEMO_FIELD,
                                          PrivacyUnit, check_unit, WindowedEstimate, StreamSink,
                                          ReadPubSubRecords, estimate_stream, MarkRange)

from .common import counters, run_pipeline, runner_args, runner_name, say, write_json
from .run import Run
from .stream_account import StreamAccount, settle_or_say


def prior_releases(path: str) -> dict[int, int]:
    """Releases per window start (µs) already in an estimates file (every run's)."""
    return dict(Counter(int(round(row["window_start_epoch"] * 1e6)) for row in jsonl_rows(path)
                        if "release" in row))


def _read_run(path: str, run_id: str) -> list[dict]:
    return [r for r in jsonl_rows(path) if r.get("run") == run_id]


def summarize(out_dir: str, run_id: str, records_read: int | None = None,
              from_files: bool = False) -> dict:
    """Reconcile one run from its outputs (see the module docstring). ``from_files``: a spool
    run, whose file ledger counts what was read; otherwise ``records_read`` (None: unknown)."""
    ledger = _read_run(os.path.join(out_dir, LEDGER_FILE), run_id)
    dead = _read_run(os.path.join(out_dir, DEAD_LETTERS), run_id)
    files = [r for r in ledger if r["kind"] == "file"]
    unread = sorted({r["file"] for r in ledger if r["kind"] == "unread"})
    messages = [r for r in ledger if r["kind"] == "messages"]
    if messages and not from_files:  # what the Pub/Sub source parsed, as the sink recorded it
        records_read = sum(r["records"] for r in messages)
    last: dict[str, dict] = {}
    last_released: dict[str, dict] = {}
    n_panes = n_withheld = n_published = 0
    for p in (r for r in ledger if r["kind"] == "pane"):
        n_panes += 1
        n_withheld += not p["released"]
        n_published += p["released"] and not p.get("already_published")
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
    out = {"run": run_id, "files": len(files), "files_unread": unread,
           "windows": len(last), "panes": n_panes,
           "panes_withheld": n_withheld,
           # released and written by this run (not a pane a killed run had published already)
           "panes_published": n_published,
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
    admitted = [p for p in last.values() if "units" in p]
    units_ok = True
    if admitted:  # a privacy-unit stream: each window's records = estimated + bounded + over
        parts = ("estimated", "bounded_out", "over_budget")
        tot = {k: sum(p["units"][k] for p in admitted) for k in (
            "reports", *parts, "memo_repeats", "memo_mismatch")}
        units_ok = all(p["units"]["reports"] == p["count"] ==
                       sum(p["units"][k] for k in parts) for p in admitted)
        out["privacy_unit"] = {**tot, "windows": len(admitted), "reconciles": units_ok}
    if records is not None:
        dropped = records - in_windows - invalid
        out["records"]["dropped_by_windowing"] = dropped
        ok = dropped == 0 and units_ok
        if from_files:
            ok = ok and src["lines"] == src["records"] + src["dead_lettered"] + \
                src["skipped_settled"]
        out["reconciles"] = bool(ok)
    else:
        out["reconciles"] = None if units_ok else False
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
               progress: bool = True, start: Any = None, end: Any = None,
               privacy_unit: str | None = None, max_reports_per_unit: int = 1,
               unit_budget: float | None = None, memoize: str | bool | None = None,
               seed: int | str | None = None, timestamp_attribute: str | None = "ts",
               report_id_attribute: str | None = "report_id", results: Iterable[str] = (),
               results_topic: str | None = None, ledger: str | None = None,
               dataset: str | None = None, budget: float | None = None,
               budget_delta: float | None = None) -> dict:
    """Run a streaming estimation (see the module docstring) until ``duration`` seconds have
    passed, ``stop`` is set, SIGINT/SIGTERM arrives (when run on the main thread) or, with
    ``once``, the spool's present files are read. Outputs go to ``output_dir`` (appended to, so a
    restarted run continues them); returns the run's summary (also ``OUT/curator/summary.json``).

    ``start``, ``end`` (epoch seconds or ISO 8601 text): the release range of a central-DP
    stream (see "Release range" in the module docstring).

    ``privacy_unit``: the record field naming each record's privacy unit (see "Privacy units" in the
    module docstring); then ``max_reports_per_unit`` (k, default 1) reports of a unit are estimated
    per window, ``unit_budget`` caps each unit's cumulative epsilon (None: not capped), ``memoize``
    names the report field of a memoized report's slot (True: ``memo_id``; None: every report is
    charged) and the per-unit state is ``OUT/units.sqlite`` (the trusted side's: it holds the key of
    the unit hashes). ``seed``: the state's key from a seed, for reproducible selection in tests:
    NOT private (the unit hashes of a guessable id space can be inverted by whoever knows the seed);
    it needs a fresh output folder.

    ``ledger``, ``dataset``, ``budget``, ``budget_delta``: the team's budget ledger, where the
    run records what it spends (see :mod:`.stream_account`), the stream's name there (default:
    the source's location) and the dataset's budget (as for every run)."""
    if (spool is None) == (subscription is None):
        raise StreamConfigError("give exactly one source: --spool DIR or --subscription "
                                "PROJECT/SUB")
    if once and spool is None:
        raise StreamConfigError("--once reads a spool directory once; it does not apply to "
                                "--subscription")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise StreamConfigError(f"--duration {duration!r}: expected seconds > 0")
    central = isinstance(mechanism, CentralRelease)
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
    if privacy_unit is None:
        for opt, given in (("--max-reports-per-unit", max_reports_per_unit != 1),
                           ("--unit-budget", unit_budget is not None),
                           ("--memo-field", memoize not in (None, False)),
                           ("--seed", seed is not None)):
            if given:
                raise StreamConfigError(f"{opt} applies to a stream with a privacy unit: give "
                                        "--privacy-unit FIELD")
    memo_field = MEMO_FIELD if memoize is True else (memoize or None)
    results = tuple(results)
    check_results(results, results_topic)
    if privacy_unit is not None:  # every option checked before the state file is created
        check_unit(mechanism, PrivacyUnit(privacy_unit, None, max_reports_per_unit,
                                          unit_budget, memo_field), columns)
    os.makedirs(os.path.join(output_dir, CURATOR), exist_ok=True)
    out_dir = os.path.abspath(output_dir)
    note = os.path.join(out_dir, CURATOR, "CURATOR-ONLY.txt")
    if not os.path.exists(note):
        with open(note, "w") as fh:
            fh.write(CURATOR_NOTE)
    # the run's identity, ledger, budget and dataset name, as every run gets them (see .run)
    run = Run("stream", spool if spool is not None else f"pubsub://{subscription}", seed=seed,
              ledger=ledger, budget=budget, budget_delta=budget_delta, dataset=dataset)
    key, run_id = run.key, run.run_id
    unit = None
    if privacy_unit is not None:
        state_path = os.path.join(out_dir, UnitState.FILE)
        secret = key.derive("privacy-units") if key.seeded else None
        try:
            state = UnitState(state_path, privacy_unit, seed_secret=secret)
        except (UnitStateError, ValueError) as exc:
            raise StreamConfigError(f"--privacy-unit {privacy_unit!r}: {exc}") from None
        unit = PrivacyUnit(privacy_unit, state, max_reports_per_unit, unit_budget, memo_field)
    unit_field = None if unit is None else unit.field
    unit_key = None if unit is None else unit.state.key("source")
    args = runner_args(beam_args)
    stop = stop or threading.Event()
    clock = WindowClock(window_seconds, allowed_lateness)
    spool_dir = SpoolDirectory(spool, clock, timestamp_field, unit_field, unit_key).open() \
        if spool else None
    account: StreamAccount | None = None

    def say_always(m: str) -> None:  # a ledger left unsettled is said even with progress off
        say(f"ldp-beam stream: {m}")

    try:
        continued: dict | None = None
        if central:  # the release range: declared, or (live) from the run's start
            size = clock.size_us
            if once:
                range_start, range_end = start_us, end_us
            else:
                continued = recorded_range(out_dir, size, window_seconds)
                range_start = start_us if start_us is not None else \
                    continued["start_us"] if continued is not None else \
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
        if central and not once:  # before anything is read: a restart continues this range
            record_range(out_dir, clock.window(range_start)[0], size,
                         continued["run"] if continued and start_us is None else run_id,
                         declared=start_us is not None or bool(continued and
                                                               continued["declared"]))
        recovered = spool_dir.leftovers() if spool_dir else []
        # every release already made (any run's) counts against its window's budget, so a
        # window released before a crash is never released again with fresh noise
        prior = prior_releases(os.path.join(out_dir, ESTIMATES)) if central else {}
        estimate = WindowedEstimate(
            mechanism, window_seconds, 0.0 if once else allowed_lateness,
            None if once else early_seconds, releases_per_window, columns, options, prior,
            unit=unit, run_id=run_id, unit_hashed=True)
        log = say_always if progress else (lambda m: None)
        account = run.stream_account(out_dir, mechanism, estimate.stream_guarantee,
                                     unit).open()
        if account.cap_from_budget is not None:
            estimate.cap_units(account.cap_from_budget)
            unit = estimate.unit
            log(f"each unit's cumulative loss is capped at {unit.budget:g}: what dataset "
                f"{account.dataset['dataset']!r} has left of its budget in the ledger, above "
                "the largest loss a unit has taken so far")
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
            direct = runner_name(args) in DIRECT_RUNNERS
            source = ReadPubSubRecords(subscription, timestamp_field, unit_field, unit_key,
                                       timestamp_attribute=timestamp_attribute,
                                       id_label=None if direct else report_id_attribute)
            what = f"Pub/Sub {source.path} through Beam's ReadFromPubSub (" + (
                "DirectRunner: at most once, no deduplication by report id; the landing path "
                "is exactly once in effect)" if direct else
                f"deduplicated by the {report_id_attribute!r} attribute)")
        if not once and "--streaming" not in args:
            args = args + ["--streaming"]
        settled = spool_dir.settled() if spool_dir is not None else None
        unsettled = unsettled_rows(os.path.join(out_dir, ESTIMATES), settled)
        published = [(int(round(r["window_start_epoch"] * 1e6)), int(r["pane"]["index"]),
                      r.get("n_reports")) for r in unsettled]
        if (results or results_topic) and unsettled and spool_dir is not None:
            resent = _resend(unsettled, results, results_topic)
            log(f"re-sent {len(unsettled)} published pane(s) of unsettled windows to the "
                f"results sinks ({resent} were missing there; the others were kept as they were)")
        sink = StreamSink(out_dir, run_id, central,
                          spool_dir.path if (spool_dir and not once) else None, progress,
                          results, results_topic, published)
        windows = f"windows of {window_seconds:g}s"
        if not once and allowed_lateness:
            windows += f", allowed lateness {allowed_lateness:g}s"
        if once and (allowed_lateness or early_seconds):
            log("--once: a bounded read fires every window once, at the end; --allowed-lateness "
                "and --early do not apply")
        if recovered:
            log(f"{len(recovered)} file(s) left in {os.path.join(spool_dir.path, '.claimed')} "
                "by an interrupted run: re-reading them from the start")
        log(f"run {run_id}: {mechanism.name} ({estimate.stream_guarantee['summary']}"
            + (", per window" if central else "") + f") on {what}, {windows}; "
            f"estimates -> {os.path.join(out_dir, ESTIMATES)}"
            + ("" if once or duration else "; Ctrl-C stops cleanly"))

        if central:
            rule = _range_line(once, range_start, range_end, start_us is not None)
            log(rule)
            if continued is not None and start_us is None:
                log(f"continuing the release range of run {continued['run']} (recorded in "
                    f"{os.path.join(out_dir, RANGE_FILE)}): windows it left open at its stop "
                    "are released by this run")

        def build(p):
            items = p | "Read" >> source
            if central and once:
                items = (items, items | "Marks" >> MarkRange(clock, range_start, range_end)) \
                    | "WithMarks" >> beam.Flatten()
            return [estimate_stream(items, estimate, sink)]

        started = time.monotonic()
        with _stop_on_signals(stop, log, enabled=not once):
            if isinstance(source, SpoolSource):
                with source:
                    result = run_pipeline(build, args)
            elif subscription is not None:
                result = run_pipeline(build, args, wait=until_stopped(
                    stop, duration, log,
                    drain=window_seconds + allowed_lateness + watermark_lag + 2.0))
            else:
                result = run_pipeline(build, args)
        if spool_dir is not None:
            source.finish_all()  # the pipeline finished: every file read is settled
        if getattr(source, "error", None) is not None:  # it ended the stream early
            raise RuntimeError(f"the spool source failed: {source.error}") from source.error
        records_read = counters(result).get("stream_records") if subscription else None
        summary = summarize(out_dir, run_id, records_read, from_files=spool_dir is not None)
        if subscription is not None:
            summary["delivery"] = (
                "at most once: Beam's ReadFromPubSub on the DirectRunner acks each pull before "
                "processing and cannot deduplicate; records read but in no window are counted "
                "as dropped_by_windowing" if source.id_label is None else
                f"as the runner gives it (deduplicated by {source.id_label!r})")
        if unit is not None:
            spent = unit.state.spent()
            cap = unit.budget
            summary.setdefault("privacy_unit", {}).update({
                "field": unit.field, "max_reports_per_unit": unit.max_reports,
                "unit_budget": cap, "memo_field": unit.memo_field,
                "seeded": unit.state.seeded, "state": unit.state.path,
                "units_tracked": len(spent),
                "max_unit_loss": max(spent.values(), default=0.0),
                "units_at_cap": None if cap is None else sum(
                    1 for v in spent.values() if v + estimate.report_epsilon > cap *
                    (1 + 1e-9) + 1e-12)})
        if results or results_topic:
            summary["results"] = {"sinks": [redact(d) for d in results],
                                  "topic": results_topic}
        summary.update({"mechanism": mechanism.name, "params": mechanism.params(),
                        "guarantee": estimate.stream_guarantee,
                        "seconds": round(time.monotonic() - started, 3),
                        "outputs": {k: os.path.join(out_dir, v) for k, v in (
                            ("estimates", ESTIMATES), ("dead_letter", DEAD_LETTERS),
                            ("ledger", LEDGER_FILE))}})
        if central:
            rr = summary.setdefault("release_range", {"windows": 0, "windows_outside": 0})
            rr.update({"start": iso(range_start) if range_start is not None else None,
                       "end": iso(range_end) if range_end is not None else None,
                       "declared": {"start": start_us is not None, "end": end_us is not None},
                       "rule": rule})
        summary["ledger"] = settle_or_say(
            account, say_always, published=summary["panes_published"] > 0)
        account = None
        write_json(os.path.join(out_dir, SUMMARY), summary)
        log(summary_line(summary))
        return summary
    except BaseException as exc:
        if account is not None:  # what the run published or charged stays spent
            settle_or_say(account, say_always, failed=exc)
        raise
    finally:
        if spool_dir is not None:
            spool_dir.close()


def recorded_range(out_dir: str, size_us: int, window_seconds: float) -> dict | None:
    """The release range a previous live run of this output folder recorded (its window-aligned
    start, the window size and the run), or None. A restart without ``--start`` continues it,
    so a window that was open when that run stopped (or was killed) is released, not withheld
    as outside the new run's range. A different ``--window`` cannot continue it."""
    path = os.path.join(out_dir, RANGE_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        rec = json.load(fh)
    if int(rec["window_us"]) != size_us:
        raise StreamConfigError(
            f"--window {window_seconds:g}: {out_dir} holds the release range of a stream with "
            f"windows of {int(rec['window_us']) / 1e6:g}s (run {rec['run']}); a central release "
            "range cannot change its windows: use the same --window or a new output folder")
    return rec


def record_range(out_dir: str, start_us: int, size_us: int, run_id: str,
                 declared: bool) -> None:
    """Record the release range's start for the runs that follow (atomically)."""
    write_json(os.path.join(out_dir, RANGE_FILE),
               {"start_us": int(start_us), "start": iso(start_us), "window_us": int(size_us),
                "run": run_id, "declared": bool(declared)})


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
    u = s.get("privacy_unit")
    if u and "estimated" in u:
        line += (f"; per privacy unit {u.get('field', '')}: {u['estimated']:,} estimated, "
                 f"{u['bounded_out']:,} bounded out (over {u.get('max_reports_per_unit', 'k')} "
                 f"per window), {u['over_budget']:,} over budget")
    if s["panes_withheld"]:
        outside = s.get("release_range", {}).get("windows_outside", 0)
        line += f"; {s['panes_withheld']} release(s) withheld (budget spent" + (
            f", or {outside} window(s) outside the release range)" if outside else ")")
    return (f"{s['windows']} window(s), {s['panes']} pane(s) from {s['files']} file(s); "
            + line + ("" if s["reconciles"] else "  ** DOES NOT RECONCILE **"))


def _resend(rows: list[dict], results: Iterable[str], topic: str | None) -> int:
    """Deliver published rows to the results sinks again (each keeps its first copy); returns
    how many a sink did not have (a topic cannot tell: it counts them all)."""
    sinks = open_results(results, topic)
    try:
        return sum(max(int(s.write(row)) for s in sinks) for row in rows)
    finally:
        for s in sinks:
            s.close()


def until_stopped(stop: threading.Event, duration: float | None, log: Any,
                  drain: float) -> Any:
    """How :func:`~.common.run_pipeline` waits for an unbounded pipeline (Beam's Pub/Sub source):
    until ``duration`` seconds, ``stop`` (SIGINT/SIGTERM) or its failure; then ``drain`` seconds
    more (a window, the allowed lateness, the watermark lag and a margin) so that the windows open
    at the stop fire as the source's wall-clock watermark passes them; then it cancels the pipeline.
    The DirectRunner implements no ``wait_until_finish(duration=)``: this is that, with the drain.
    What the source pulled during the drain into windows still open at the cancel is lost with them
    (its acks are sent): at most once, which the summary counts (records read less those in windows)
    and the module docstring states."""
    def wait(result: Any) -> None:
        failure: list[BaseException] = []
        done = threading.Event()

        def finish() -> None:
            try:
                result.wait_until_finish()
            except BaseException as exc:  # raised below, after the stop
                failure.append(exc)
            finally:
                done.set()

        threading.Thread(target=finish, name="ldp-beam-pubsub-wait", daemon=True).start()
        deadline = None if duration is None else time.monotonic() + duration
        while not (stop.is_set() or done.is_set()):
            left = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if left <= 0:
                break
            stop.wait(left)
        if not done.is_set():
            log(f"stopping: letting the open windows fire for {drain:g}s, then cancelling the "
                "pipeline")
            done.wait(drain)
            # the DirectRunner's shutdown waits for a pull in progress (up to 30 s): not long
            cancel = threading.Thread(target=result.cancel, name="ldp-beam-cancel",
                                      daemon=True)
            cancel.start()
            cancel.join(5.0)
        if failure and not isinstance(failure[0], (KeyboardInterrupt, SystemExit)):
            raise RuntimeError(f"the Pub/Sub pipeline failed: {failure[0]}") from failure[0]
    return wait


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event, log: Any, enabled: bool) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop`` (a clean stop: open windows fire, claimed files settle); a
    second SIGINT interrupts. Only on the main thread."""
    def handle(signum, frame):
        log(f"{signal.Signals(signum).name}: stopping cleanly (open windows fire first; "
            "press Ctrl-C again to abort)")
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    saved = {}
    if enabled and threading.current_thread() is threading.main_thread():
        saved = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
