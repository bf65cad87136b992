"""Telemetry from a spool directory of JSON-lines files: an unbounded source for the DirectRunner
and a bounded one for backfills.

A *spool directory* ``D`` receives files of JSON lines, one report (or raw record) per line, each
with an event time in a field (``ts`` by default: epoch seconds, or ISO 8601 text; a naive ISO time
is read as UTC). Producers write a file under another name (a dot-name, or one not ending in
``.jsonl``) and rename it into ``D`` when it is complete: a rename is atomic, so a half-written
file is never read. The source keeps its bookkeeping next to the files::

    D/*.jsonl      new files, taken in name order
    D/.claimed/    files being read, or read and feeding windows that are still open
    D/.done/       files every record of which is in a window's final pane, or dead-lettered
    D/.failed/     files that could not be opened or read (a dead letter says why)
    D/.watermark   the settled watermark (microseconds): every window that closed before it has
                   had all of its panes written by the sink
    D/.lock        held (flock) by the one process reading D

**Protocol.** A poll claims each new file by an atomic ``os.rename`` into ``.claimed/`` (under the
lock, so two readers never both read a file), reads all of its lines and emits one element per
record with its event time, a dead letter per bad line (with file, line number and reason), and a
ledger entry for the file. Then, after every watermark it emits, it sends a *heartbeat*; the sink
(``ldp_beam.pipelines.stream``) sets an event-time timer on it, and when the timer fires every
pane of every window closed before that watermark has been written, so the sink records it in
``D/.watermark``. A claimed file moves to ``.done/`` once that settled watermark has passed the
heartbeat that followed its read *and* the close (end + allowed lateness) of every window its
records fell in: from then on nothing that file fed can change. A clean stop (``duration``
elapsed, the stop event set, SIGINT/SIGTERM in the CLI) ends the stream, the runner fires every
open window, and the remaining claimed files move to ``.done/`` after the pipeline has finished.

**Restarts and guarantees.** A file in ``.done/`` is never read again. A file still in
``.claimed/`` at start-up is a crash's leftover: it is re-read from its first line, before any
watermark, and its records whose window had closed before the settled watermark are skipped and
counted in the ledger (each was either in a window written before the crash, or too late when
first read); the others re-form their windows, which were still open and so never had a final
pane — every file that fed them is still claimed, so the re-estimate is complete. Records are
therefore read at least once and estimated *effectively once per window* across a crash: a
window open at the crash may have an earlier, incomplete pane in ``estimates.jsonl`` from the
crashed run (rows carry the run id; the later row supersedes it). Dead letters and ledger lines
of a re-read file are at-least-once (they may repeat). The DirectRunner keeps window state in
memory; what makes the above hold is that no file leaves ``.claimed/`` before its windows are
written. A window still open at a clean stop fires then, over what it has; records for it that a
later run reads form that run's own estimate of the window (rows differ in ``run``), and records
for windows closed before the stop are too late in the next run.

**Late data.** The live source's watermark is the wall clock at each poll, less ``watermark_lag``
(and never behind the settled watermark of an earlier run). A record whose window closed before
the watermark in force when it is read (``watermark > window end + allowed lateness``, Beam's own
rule for dropping) is dead-lettered as too late, with the window and the watermark; everything
the source emits is therefore on time or within the allowed lateness, and Beam's windowing never
drops a record silently. Records read before the first watermark of a run on a fresh spool (a
backlog) are all on time.

The live source is Beam's ``TestStream`` fed, as it runs, through Beam's ``TestStreamService``
(the channel Interactive Beam streams through): the only unbounded source on the Python
DirectRunner whose watermark follows the data. ``PeriodicImpulse`` also runs there, but that
runner holds a splittable DoFn's output watermark at -infinity until it finishes, so no window
would fire before the end of the run. The bounded source (:class:`ReadSpoolOnce`) reads what is
there once on any runner.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator

import apache_beam as beam
from apache_beam import coders
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Duration, Timestamp

CLAIMED, DONE, FAILED = ".claimed", ".done", ".failed"
WATERMARK_FILE, LOCK_FILE = ".watermark", ".lock"
SUFFIX = ".jsonl"
MAX_LINE_BYTES = 1 << 20  # a longer line is dead-lettered, not parsed
EVENT_BYTES = 1 << 20  # payload per TestStream event (gRPC's default message limit is 4 MiB)
EVENT_ELEMENTS = 5000
MAX_POLL_SECONDS = 10.0  # the DirectRunner stops a TestStream that is silent for 30 s

# Kinds of the (kind, payload) items a spool source emits.
RECORD, DEAD, LEDGER, HEARTBEAT = "record", "dead", "ledger", "heartbeat"

# datetime's range, in seconds: what an event time may be.
MIN_EVENT_SECONDS = datetime(1, 1, 2, tzinfo=timezone.utc).timestamp()
MAX_EVENT_SECONDS = datetime(9999, 12, 30, tzinfo=timezone.utc).timestamp()


class SpoolError(ValueError):
    """The spool directory cannot be used (missing, locked by another reader)."""


# --------------------------------------------------------------------------- parsing
def event_micros(value: Any, name: str = "ts") -> int:
    """An event time in microseconds since the epoch from epoch seconds (a number, or numeric
    text) or ISO 8601 text (``Z`` or an offset; a naive time is UTC). Raises ValueError naming the
    field and the value."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"timestamp field {name!r} is {value!r}: expected epoch seconds or "
                         "ISO 8601 text")
    if isinstance(value, (int, float)):
        sec = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            sec = float(text)
        except ValueError:
            try:
                dt = datetime.fromisoformat(text)
            except ValueError:
                raise ValueError(f"timestamp field {name!r} = {value!r} is neither epoch seconds "
                                 "nor ISO 8601 text") from None
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            sec = dt.timestamp()
    else:
        raise ValueError(f"timestamp field {name!r} is a {type(value).__name__}: expected epoch "
                         "seconds or ISO 8601 text")
    if not math.isfinite(sec) or not MIN_EVENT_SECONDS <= sec <= MAX_EVENT_SECONDS:
        raise ValueError(f"timestamp field {name!r} = {value!r} is not a time between the years "
                         "1 and 9999")
    return int(round(sec * 1_000_000))


def parse_line(raw: bytes, timestamp_field: str) -> tuple[dict, int]:
    """One JSON line -> ``(record, event time in µs)``; ValueError with the reason otherwise."""
    if len(raw) > MAX_LINE_BYTES:
        raise ValueError(f"line of {len(raw):,} bytes is longer than the limit of "
                         f"{MAX_LINE_BYTES:,}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"line is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"corrupt JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"a JSON {type(record).__name__}, not an object (one record per line)")
    if timestamp_field not in record:
        raise ValueError(f"record has no timestamp field {timestamp_field!r}")
    return record, event_micros(record[timestamp_field], timestamp_field)


def _shown(raw: bytes) -> str:
    return raw[:1000].decode("utf-8", "replace")


def iso(micros: int) -> str:
    """UTC ISO 8601 text of a time in microseconds (``...Z``)."""
    dt = datetime.fromtimestamp(micros / 1e6, tz=timezone.utc)
    return dt.isoformat().replace("+00:00", "Z")


# --------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class WindowClock:
    """Beam's FixedWindows arithmetic in microseconds, and when a window closes: at its end plus
    the allowed lateness; a record is too late once the watermark is past that."""

    window_seconds: float
    allowed_lateness: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.window_seconds, (int, float)) and
                math.isfinite(self.window_seconds) and self.window_seconds > 0):
            raise ValueError(f"window = {self.window_seconds!r}: expected seconds > 0")
        if not (isinstance(self.allowed_lateness, (int, float)) and
                math.isfinite(self.allowed_lateness) and self.allowed_lateness >= 0):
            raise ValueError(f"allowed lateness = {self.allowed_lateness!r}: expected seconds "
                             ">= 0")
        if Duration.of(self.window_seconds).micros <= 0:
            raise ValueError(f"window = {self.window_seconds!r}: shorter than a microsecond")

    @property
    def size_us(self) -> int:
        return Duration.of(self.window_seconds).micros  # what beam.window.FixedWindows uses

    @property
    def lateness_us(self) -> int:
        return Duration.of(self.allowed_lateness).micros

    def window(self, t_us: int) -> tuple[int, int]:
        start = t_us - t_us % self.size_us
        return start, start + self.size_us

    def close(self, t_us: int) -> int:
        """The last watermark at which the record's window still accepts it."""
        return self.window(t_us)[1] + self.lateness_us

    def too_late(self, t_us: int, watermark_us: int | None) -> bool:
        return watermark_us is not None and watermark_us > self.close(t_us)


# --------------------------------------------------------------------------- the directory
@dataclass
class FileState:
    """What the source knows about a claimed file: the windows it fed and when it was read."""

    path: str
    name: str
    recovered: bool
    max_close_us: int | None = None  # the latest close of a window it fed (None: fed none)
    read_at_us: int | None = None  # the watermark sent right after it was read


@dataclass
class ReadTally:
    records: int = 0
    dead_lettered: int = 0
    too_late: int = 0
    skipped: int = 0
    lines: int = 0
    error: str = ""
    extra: dict = field(default_factory=dict)


class SpoolDirectory:
    """A spool directory opened for reading by one process (see the module docstring)."""

    def __init__(self, path: str, clock: WindowClock, timestamp_field: str = "ts") -> None:
        if not timestamp_field:
            raise ValueError("timestamp field: expected a field name")
        self.path = os.path.abspath(path)
        self.clock = clock
        self.timestamp_field = timestamp_field
        self._lock_fd: int | None = None

    # -- lifecycle
    def open(self) -> "SpoolDirectory":
        if not os.path.isdir(self.path):
            raise SpoolError(f"spool directory {self.path!r} does not exist")
        for sub in (CLAIMED, DONE, FAILED):
            os.makedirs(os.path.join(self.path, sub), exist_ok=True)
        fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise SpoolError(f"spool directory {self.path!r} is being read by another process "
                             f"(it holds {os.path.join(self.path, LOCK_FILE)})") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        return self

    def close(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "SpoolDirectory":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the settled watermark
    @property
    def watermark_path(self) -> str:
        return os.path.join(self.path, WATERMARK_FILE)

    def settled(self) -> int | None:
        """The settled watermark in µs (see the module docstring), or None if never recorded."""
        try:
            with open(self.watermark_path) as fh:
                return int(fh.read().strip())
        except (FileNotFoundError, ValueError):
            return None

    # -- files
    def _sub(self, sub: str, name: str = "") -> str:
        return os.path.join(self.path, sub, name) if name else os.path.join(self.path, sub)

    def leftovers(self) -> list[FileState]:
        """Files a crashed run left in ``.claimed/``, to be re-read from the start."""
        names = sorted(f for f in os.listdir(self._sub(CLAIMED))
                       if f.endswith(SUFFIX) and not f.startswith("."))
        return [FileState(self._sub(CLAIMED, n), n, True) for n in names]

    def claim_new(self) -> list[FileState]:
        """Claim every new ``*.jsonl`` file, in name order, by an atomic rename."""
        out = []
        for name in sorted(os.listdir(self.path)):
            if not name.endswith(SUFFIX) or name.startswith("."):
                continue
            src = os.path.join(self.path, name)
            if not os.path.isfile(src):
                continue
            dst = _free_name(self._sub(CLAIMED), name)
            try:
                os.rename(src, dst)
            except FileNotFoundError:  # taken (or removed) since the listing
                continue
            out.append(FileState(dst, name, False))
        return out

    def finish(self, state: FileState) -> None:
        """Move a claimed file to ``.done/`` (every record of it is settled)."""
        os.rename(state.path, _free_name(self._sub(DONE), os.path.basename(state.path)))

    def finish_existing(self, states: list) -> int:
        """Move every one of ``states`` still in ``.claimed/`` to ``.done/``; returns how many."""
        n = 0
        for state in states:
            if os.path.exists(state.path):
                self.finish(state)
                n += 1
        return n

    def fail(self, state: FileState) -> None:
        try:
            os.rename(state.path, _free_name(self._sub(FAILED), os.path.basename(state.path)))
        except OSError:
            pass  # left in .claimed/: tried again at the next start

    # -- reading
    def read(self, state: FileState, watermark_us: int | None, settled_us: int | None
             ) -> Iterator[tuple]:
        """The items of one claimed file: ``(RECORD, record, event µs)`` and ``(DEAD, dead
        letter)`` per line, then ``(LEDGER, entry)``. ``watermark_us``: the watermark in force
        (records whose window closed before it are too late); ``settled_us``: for a re-read
        leftover, records whose window closed before it are skipped (counted in the ledger)."""
        tally = ReadTally()
        try:
            fh = open(state.path, "rb")
        except OSError as exc:
            tally.error = f"unreadable file: {type(exc).__name__}: {exc}"
            yield DEAD, _dead(tally.error, None, state.name, None)
            yield LEDGER, self._ledger(state, tally)
            self.fail(state)
            return
        with fh:
            try:
                for lineno, raw in enumerate(fh, 1):
                    raw = raw.rstrip(b"\r\n")
                    if not raw.strip():
                        continue  # a blank line is not a record
                    tally.lines += 1
                    try:
                        record, t_us = parse_line(raw, self.timestamp_field)
                    except ValueError as exc:
                        tally.dead_lettered += 1
                        yield DEAD, _dead(str(exc), _shown(raw), state.name, lineno)
                        continue
                    close = self.clock.close(t_us)
                    if state.recovered and settled_us is not None and close < settled_us:
                        tally.skipped += 1
                        continue
                    if self.clock.too_late(t_us, watermark_us):
                        tally.dead_lettered += 1
                        tally.too_late += 1
                        start, end = self.clock.window(t_us)
                        yield DEAD, _dead(
                            f"too late: event time {iso(t_us)} is in window [{iso(start)}, "
                            f"{iso(end)}), closed at {iso(close)} (its end plus the allowed "
                            f"lateness); the watermark was {iso(watermark_us)}",
                            record, state.name, lineno)
                        continue
                    tally.records += 1
                    state.max_close_us = close if state.max_close_us is None \
                        else max(state.max_close_us, close)
                    yield RECORD, record, t_us
            except OSError as exc:  # an I/O error part-way: what was read stands
                tally.error = f"read failed after {tally.lines} lines: {type(exc).__name__}: {exc}"
                yield DEAD, _dead(tally.error, None, state.name, None)
        yield LEDGER, self._ledger(state, tally)

    def _ledger(self, state: FileState, tally: ReadTally) -> dict:
        out = {"kind": "file", "file": state.name, "recovered": state.recovered,
               "lines": tally.lines, "records": tally.records,
               "dead_lettered": tally.dead_lettered, "too_late": tally.too_late,
               "skipped_settled": tally.skipped}
        if tally.error:
            out["error"] = tally.error
        return out


def _free_name(folder: str, name: str) -> str:
    """``folder/name``, or ``folder/stem~N.jsonl`` when that exists (a producer reused a name):
    a rename never replaces a file."""
    dst = os.path.join(folder, name)
    stem = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name
    n = 1
    while os.path.exists(dst):
        dst = os.path.join(folder, f"{stem}~{n}{SUFFIX}")
        n += 1
    return dst


def _dead(reason: str, record: Any, source: str, row: int | None) -> dict:
    return {"reason": reason, "record": record, "source": source, "row": row}


def record_settled(spool_path: str, watermark_us: int) -> None:
    """Record the settled watermark (atomically; it only moves forward). Called by the sink."""
    path = os.path.join(spool_path, WATERMARK_FILE)
    try:
        with open(path) as fh:
            if int(fh.read().strip()) >= watermark_us:
                return
    except (FileNotFoundError, ValueError):
        pass
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{int(watermark_us)}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- the live source
class SpoolSource(beam.PTransform):
    """The live spool source (DirectRunner, streaming): ``(kind, payload)`` items, each record at
    its event time. Use it as a context manager around the pipeline run: entering starts the
    local TestStreamService that feeds it, leaving stops it.

    ``poll_seconds``: how often new files are looked for (at most 10 s); ``duration``: stop
    cleanly after this many seconds (None: until ``stop`` is set); ``watermark_lag``: seconds the
    watermark trails the wall clock (how long a window waits for stragglers before its on-time
    pane). ``stop``: a threading.Event that ends the stream cleanly.
    """

    def __init__(self, spool: SpoolDirectory, poll_seconds: float = 1.0,
                 duration: float | None = None, watermark_lag: float = 0.0,
                 stop: threading.Event | None = None, say: Any = None) -> None:
        super().__init__()
        if not (isinstance(poll_seconds, (int, float)) and 0 < poll_seconds <= MAX_POLL_SECONDS):
            raise ValueError(f"poll = {poll_seconds!r}: expected seconds in (0, "
                             f"{MAX_POLL_SECONDS:g}] (the DirectRunner ends a TestStream that is "
                             "silent for 30 s)")
        if duration is not None and not (math.isfinite(duration) and duration > 0):
            raise ValueError(f"duration = {duration!r}: expected seconds > 0")
        if not (math.isfinite(watermark_lag) and watermark_lag >= 0):
            raise ValueError(f"watermark lag = {watermark_lag!r}: expected seconds >= 0")
        self.spool = spool
        self.poll_seconds = float(poll_seconds)
        self.duration = duration
        self.lag_us = Duration.of(watermark_lag).micros
        self.stop = stop or threading.Event()
        self.say = say or (lambda msg: None)
        self.coder = coders.FastPrimitivesCoder()
        self.claimed: list[FileState] = []  # every file this run read (settled or not)
        self.error: BaseException | None = None
        self.last_watermark_us: int | None = None
        self._controller = None

    # -- the TestStreamService
    def __enter__(self) -> "SpoolSource":
        from apache_beam.testing.test_stream_service import TestStreamServiceController

        self._controller = TestStreamServiceController(self)
        self._controller.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def expand(self, pbegin):
        from apache_beam.testing.test_stream import TestStream

        if self._controller is None:
            raise RuntimeError("SpoolSource must be entered (with source: ...) before the "
                               "pipeline is built: that starts the service feeding it")
        # items travel as plain tuples (FastPrimitivesCoder), each record at its event time
        return pbegin | "Watch" >> TestStream(coder=self.coder,
                                              endpoint=self._controller.endpoint)

    # -- what the service calls: the stream of events
    def read_multiple(self, unused_tags: Any) -> Iterator[Any]:
        return self._events()

    def _events(self) -> Iterator[Any]:
        from apache_beam.portability.api import beam_runner_api_pb2 as api

        ev = api.TestStreamPayload.Event
        settled0 = self.spool.settled()
        watermark = settled0  # in force for the too-late rule (a fresh spool: none yet)
        deadline = None if self.duration is None else time.monotonic() + self.duration
        last_tick = time.monotonic()
        first = True
        try:
            while not self.stop.is_set():
                files = (self.spool.leftovers() if first else []) + self.spool.claim_new()
                first = False
                for state in files:
                    self.claimed.append(state)
                    stamp = watermark if watermark is not None else 0
                    batch, size = [], 0
                    for item in self.spool.read(state, watermark, settled0):
                        if item[0] == RECORD:
                            value, t_us = (RECORD, item[1]), item[2]
                        else:
                            value, t_us = item, stamp
                        enc = self.coder.encode(value)
                        batch.append(api.TestStreamPayload.TimestampedElement(
                            encoded_element=enc, timestamp=t_us))
                        size += len(enc)
                        if size >= EVENT_BYTES or len(batch) >= EVENT_ELEMENTS:
                            yield ev(element_event=ev.AddElements(elements=batch, tag="None"))
                            batch, size = [], 0
                    if batch:
                        yield ev(element_event=ev.AddElements(elements=batch, tag="None"))
                # the watermark: wall clock less the lag, strictly increasing, never behind the
                # settled watermark of an earlier run
                now_us = int(time.time() * 1_000_000) - self.lag_us
                floor = max(x for x in (watermark, self.last_watermark_us, -1) if x is not None)
                new = max(now_us, floor + 1)
                for state in files:
                    state.read_at_us = new
                beat = self.coder.encode((HEARTBEAT, new))
                yield ev(element_event=ev.AddElements(elements=[
                    api.TestStreamPayload.TimestampedElement(encoded_element=beat,
                                                             timestamp=new)], tag="None"))
                tick = time.monotonic()
                yield ev(processing_time_event=ev.AdvanceProcessingTime(
                    advance_duration=max(1, int((tick - last_tick) * 1_000_000))))
                last_tick = tick
                yield ev(watermark_event=ev.AdvanceWatermark(new_watermark=new, tag="None"))
                watermark = self.last_watermark_us = new
                self.settle()
                if deadline is not None and time.monotonic() >= deadline:
                    break
                wait = self.poll_seconds if deadline is None else \
                    min(self.poll_seconds, max(0.0, deadline - time.monotonic()))
                self.stop.wait(wait)
        except GeneratorExit:  # the runner went away (a failed pipeline): stop quietly
            raise
        except BaseException as exc:  # reported by the driver once the pipeline has ended
            self.error = exc
            self.say(f"spool source failed: {type(exc).__name__}: {exc}")

    def settle(self) -> list[FileState]:
        """Move to ``.done/`` the claimed files the settled watermark has passed."""
        settled = self.spool.settled()
        moved = []
        if settled is None:
            return moved
        for state in self.claimed:
            if not os.path.exists(state.path) or state.read_at_us is None:
                continue
            if settled >= state.read_at_us and (state.max_close_us is None or
                                                state.max_close_us < settled):
                self.spool.finish(state)
                moved.append(state)
        self.claimed = [s for s in self.claimed if s not in moved]
        return moved

    def finish_all(self) -> int:
        """After the pipeline has finished cleanly: every file read is settled."""
        n = self.spool.finish_existing(self.claimed)
        self.claimed = []
        return n


def file_line(entry: dict) -> str:
    """A ledger entry of a file read, for people."""
    parts = [f"{entry['records']:,} records"]
    if entry["dead_lettered"]:
        parts.append(f"{entry['dead_lettered']:,} dead-lettered"
                     + (f" ({entry['too_late']:,} too late)" if entry["too_late"] else ""))
    if entry["skipped_settled"]:
        parts.append(f"{entry['skipped_settled']:,} skipped (their windows were settled before "
                     "the restart)")
    what = "re-read leftover" if entry["recovered"] else "read"
    return f"{what} {entry['file']}: " + ", ".join(parts) + \
        (f"; {entry['error']}" if entry.get("error") else "")


# --------------------------------------------------------------------------- the bounded source
class ReadClaimedFn(beam.DoFn):
    """A claimed file -> its items, each record timestamped with its event time. Nothing is too
    late in a bounded read; re-read leftovers skip what was settled before the restart."""

    def __init__(self, spool: SpoolDirectory, settled_us: int | None) -> None:
        self.spool_path = spool.path
        self.clock = spool.clock
        self.timestamp_field = spool.timestamp_field
        self.settled_us = settled_us

    def process(self, state: tuple):
        path, name, recovered = state
        spool = SpoolDirectory(self.spool_path, self.clock, self.timestamp_field)
        for item in spool.read(FileState(path, name, recovered), None, self.settled_us):
            if item[0] == RECORD:
                yield TimestampedValue((RECORD, item[1]), Timestamp(micros=item[2]))
            else:
                yield item


class ReadSpoolOnce(beam.PTransform):
    """The bounded spool source: claim what is in the directory now (and any leftovers), read it
    once. The caller moves the claimed files to ``.done/`` with :meth:`finish_all` after the
    pipeline has succeeded; if it fails they stay claimed and are re-read at the next start."""

    def __init__(self, spool: SpoolDirectory) -> None:
        super().__init__()
        self.spool = spool
        self.settled_us = spool.settled()
        self.claimed = spool.leftovers() + spool.claim_new()

    def expand(self, pbegin):
        units = [(s.path, s.name, s.recovered) for s in self.claimed]
        files = pbegin | "Files" >> beam.Create(units)
        if len(units) > 1:
            files = files | "Spread" >> beam.Reshuffle()
        return files | "Read" >> beam.ParDo(ReadClaimedFn(self.spool, self.settled_us))

    def finish_all(self) -> int:
        return self.spool.finish_existing(self.claimed)
