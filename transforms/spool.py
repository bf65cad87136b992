"""Telemetry from a spool directory of JSON-lines files: an unbounded source for the DirectRunner
and a bounded one for backfills.

A *spool directory* ``D`` receives files of JSON lines, one report (or raw record) per line, each
with an event time in a field (``ts`` by default: epoch seconds, or ISO 8601 text; a naive ISO time
is read as UTC). Only names ending in ``.jsonl`` and not starting with ``.`` or ``_`` are read;
any other name (``.x.jsonl``, ``_x.jsonl``, ``x.jsonl.tmp``, ``x.jsonl.part``) is a temporary
one, never read nor moved. The recommended way to produce is to write the file under a temporary
name (in ``D``, or elsewhere on the same file system), fsync it, close it, and rename it into
``D`` when it is complete: a rename is atomic, so the file appears whole, and it is claimed at
first sight (:mod:`ldp_beam.transforms.pubsub_lander` lands Pub/Sub messages so). A file written
in place in ``D`` is read too, but only once it is complete (see "Complete files only"). The
source keeps its bookkeeping next to the files::

    D/*.jsonl      new files, taken in name order (once complete)
    D/.claimed/    files being read, or read and feeding windows that are still open
    D/.done/       files every record of which is in a window's final pane, or dead-lettered
    D/.failed/     files that could not be opened or read, and entries that are not regular
                   files (symbolic links, pipes, directories: never followed nor read); a dead
                   letter and a ledger entry say why
    D/.watermark   the settled watermark (microseconds): every window that closed before it has
                   had all of its panes written by the sink
    D/.lock        held (flock) by the one process reading D

**Reading a file.** Only a regular file is read: it is opened with ``O_NOFOLLOW`` and checked with
``fstat`` on what was opened (:func:`open_regular`), so a symbolic link is never followed and
nothing can be swapped in between a check and the open. Lines are read by :func:`read_lines`, which
never holds more than ``MAX_LINE_BYTES`` + 2 bytes of a line: a longer line is skipped to its end
unread and dead-lettered (its size, file, line number and first 1,000 bytes), and reading resumes at
the next line. Each record carries its file and line number through the pipeline, so a record
dead-lettered later (by the estimator's or mechanism's validation) names them too.

**Complete files only.** A new entry is claimed only when nothing says it is still being
written, checked just before the rename that claims it (:meth:`SpoolDirectory.claim`):

* no process has it open for writing: Linux refuses a read lease (``F_SETLEASE``) on a file that any
  process (of any user, in any container on this kernel) has open for writing, so the reader asks
  for one and drops it at once (:func:`open_for_writing`, a few system calls; the lease-break signal
  is set to SIGURG, ignored by default, so the microseconds the lease is held cannot end the
  process);
* no writer holds a ``flock`` on it (:func:`flocked`): a writer that locks its file while it writes
  is waited for even where leases are unavailable (on NFS, flock is a lock the server knows);
* and it is *settled*: quiet for ``settle`` seconds (a keyword of :class:`SpoolDirectory`, default
  ``SETTLE_SECONDS`` = 1 s: its modification time is that old, or its size and modification time did
  not change between two looks that far apart), or else no process has it open for writing and it
  ends with a newline. So a file renamed in, or one whose writer has closed it after a whole line,
  is claimed at first sight, with no added latency; a file being written in place waits until its
  writer closes it (and, if it ends mid-line, ``settle`` seconds more).

An entry that is not settled stays in ``D`` for a later poll (the live source logs it once, and
judges it late or on time against the watermark of the poll that claims it, as any new file). A
bounded read (``--once``, :class:`ReadSpoolOnce`) waits up to ``settle_wait`` seconds (default 2 x
``settle``) for such entries; those still not settled then, or at a live run's stop, are left in
``D`` for the next run, each with a ledger entry ``{"kind": "unread", "file", "reason"}`` that the
sink logs. A writer that closes its file between appends of whole lines (``echo ... >> D/x.jsonl``)
may have it claimed between two appends: the next append creates a new ``x.jsonl``, claimed on its
own later (as ``x~1.jsonl``), so every line is still read once and whole.

Why a lease and not a look at ``/proc/*/fd`` for open writers: that costs a readlink for every
open file of every process at every look, sees only the processes this user may inspect, and
needs ``fdinfo`` to tell writers from readers; the lease is a few system calls on the file
itself and is exact for every writer on this machine. What remains uncertain: where leases are not
supported (NFS and other network or FUSE file systems) or not permitted (a file of another owner,
without ``CAP_LEASE``), the quiet period and flock are the only signs, so a writer that pauses
longer than ``settle`` mid-file can have its file claimed early: use the rename convention there.

**A file that changes while it is read.** A writer that opened a file in the instant before it
was claimed writes on into the claimed file, so the reader reads on while the file grows, and
holds back a last line without its newline while the file is still being written (open for
writing or flocked, or, where that cannot be told, modified less than ``settle`` ago), for at
most ``WRITER_WAIT_SECONDS``.

**A truncated last line.** A last line without its newline, in a file no longer being written,
is dead-lettered as ``truncated last line (no newline at end of file)`` with its file, line
number and first 1,000 bytes (withheld in a privacy-unit stream), even if it happens to parse:
a writer that stopped mid-record must not pass for a complete one. It counts as a line read, so
the summary reconciles (lines read = records + dead-lettered + skipped as settled): never a
silent loss, never half a record.

**Protocol.** A poll lists the new entries and claims them one at a time, in name order, by an
atomic ``os.rename`` into ``.claimed/`` (under the lock, so two readers never both read a file),
reading each whole before claiming the next: it emits its records grouped by window (one element
per group, at the group's earliest event time), a dead letter per bad line (with file, line
number and reason) and a ledger entry for the file. After at most ``CHUNK_ITEMS`` items (a
*chunk*) it sends a *heartbeat* and a watermark; the sink (``ldp_beam.pipelines.stream``) sets
an event-time timer on the heartbeat, and when the timer fires every pane of every window closed
before that watermark has been written, so the sink records it in ``D/.watermark``. That is
also the source's acknowledgment: it sends no chunk before the one two back is acknowledged, so
a backlog streams in bounded steps instead of queueing whole in the runner. Within one listing
the watermark moves one microsecond per chunk (so every file of a listing is judged late or on
time against the watermark in force when it was listed); once the listing is read it moves to
the wall clock. A claimed file moves to ``.done/`` once the settled watermark has passed the
heartbeat that followed its read *and* the close (end + allowed lateness) of every window its
records fell in: from then on nothing that file fed can change. A clean stop (``duration``
elapsed, the stop event set, SIGINT/SIGTERM in the CLI) takes effect after the file being read:
the stream ends, the runner fires every open window, the claimed files move to ``.done/`` after
the pipeline has finished, and the entries not yet claimed stay in ``D`` for the next run.

**Restarts and guarantees.** A file in ``.done/`` is never read again. A file still in ``.claimed/``
at start-up is a crash's leftover: it is re-read from its first line, before any watermark, and its
records whose window had closed before the settled watermark are skipped and counted in the ledger
(each was either in a window written before the crash, or too late when first read); the others
re-form their windows, which were still open and so never had a final pane — every file that fed
them is still claimed, so the re-estimate is complete. Records are therefore read at least once and
estimated *effectively once per window* across a crash: a window open at the crash may have an
earlier, incomplete pane in ``estimates.jsonl`` from the crashed run (rows carry the run id; the
later row supersedes it). Dead letters and ledger lines of a re-read file are at-least-once (they
may repeat). The DirectRunner keeps window state in memory; what makes the above hold is that no
file leaves ``.claimed/`` before its windows are written, and that a file is claimed only when it is
about to be read. A window still open at a clean stop fires then, over what it has; records for it
that a later run reads form that run's own estimate of the window (rows differ in ``run``), and
records for windows closed before the stop are too late in the next run.

**Privacy units.** With a privacy-unit field (``unit_field``, ``ldp-beam stream
--privacy-unit``), the reader replaces each record's unit id by a keyed hash as it parses the
line (:func:`ldp_beam.longitudinal.unit_hash`, under a key of the stream's per-unit state that
stays on the trusted side), so no raw id travels further or reaches an output: a record without
the field, or whose id is not a string or an integer, is dead-lettered at the source with the
field withheld, and a line that cannot be parsed (which may hold an id) is dead-lettered with
its file, line number and size but not its text.

**Late data.** The live source's watermark is the wall clock once a poll's listing is read, less
``watermark_lag`` (and never behind the settled watermark of an earlier run). A record whose
window closed before the watermark in force when its file was listed (``watermark > window end
+ allowed lateness``, Beam's own rule for dropping) is dead-lettered as too late, with the window
and the watermark; everything the source emits is therefore on time or within the allowed
lateness, and Beam's windowing never drops a record silently. The files of a run's first listing
on a fresh spool (a backlog) are all on time.

The live source is Beam's ``TestStream`` fed, as it runs, through Beam's ``TestStreamService``
(the channel Interactive Beam streams through): the only unbounded source on the Python
DirectRunner whose watermark follows the data. ``PeriodicImpulse`` also runs there, but that
runner holds a splittable DoFn's output watermark at -infinity until it finishes, so no window
would fire before the end of the run. The bounded source (:class:`ReadSpoolOnce`) reads what is
there once on any runner.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import signal
import stat
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from datetime import datetime, timezone
from typing import Any, Iterator

import apache_beam as beam
from apache_beam import coders
from apache_beam.portability.api import beam_runner_api_pb2 as runner_api
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.test_stream_service import TestStreamServiceController
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Duration, Timestamp

from ldp_beam.locks import flocked
from ldp_beam.longitudinal import UnitHasher

CLAIMED, DONE, FAILED = ".claimed", ".done", ".failed"
WATERMARK_FILE, LOCK_FILE = ".watermark", ".lock"
SUFFIX = ".jsonl"
TEMP_PREFIXES = (".", "_")  # a new entry named so is a temporary one: never read nor moved
SETTLE_SECONDS = 1.0  # the quiet period of a file written in place (see "Complete files only")
WRITER_WAIT_SECONDS = 10.0  # the longest a read holds back a last line its writer may still end
TRUNCATED = "truncated last line (no newline at end of file)"
MAX_LINE_BYTES = 1 << 20  # a longer line is dead-lettered, not parsed (nor held whole)
SKIP_BYTES = 1 << 16  # what the reader holds while skipping the rest of an over-long line
EVENT_BYTES = 3 << 20  # payload per TestStream event, at most (gRPC's default limit: 4 MiB)
EVENT_ELEMENTS = 5000
CHUNK_ITEMS = 5_000  # items sent between two acknowledgment points of the live source
ACK_SECONDS = 20.0  # the longest the live source waits for an acknowledgment (see _events)
MAX_POLL_SECONDS = 10.0  # the DirectRunner stops a TestStream that is silent for 30 s
MIN_WATERMARK_US = MIN_TIMESTAMP.micros  # a TestStream's watermark before its first advance

GROUP_ROWS, GROUP_BYTES = 4096, 1 << 18  # the most records (and their bytes) in one RECORDS item

# Kinds of the items a spool source emits: (RECORD, record, source, line) at the record's event
# time; (RECORDS, source, [(record, line), ...]): records of one file in one window, at the
# earliest of their event times (the live source sends records so, one Beam element per group
# rather than per record); (DEAD, dead letter), (LEDGER, entry), (HEARTBEAT, µs) and (MARK,
# window start µs): a window of a central release's range (:mod:`ldp_beam.pipelines.stream`),
# at its start.
RECORD, RECORDS, DEAD, LEDGER, HEARTBEAT, MARK = ("record", "records", "dead", "ledger",
                                                  "heartbeat", "mark")

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


@dataclass(frozen=True)
class Line:
    """One line of a spool file as :func:`read_lines` yields it: ``raw`` without its end
    (``\\n``, ``\\r\\n``), or, for a line longer than the limit, only its first 1,000 bytes
    (``too_long``); ``size``: the line's length in bytes, without its end; ``start``: the offset
    of its first byte; ``ended``: whether it ends with ``\\n`` (only a last line may not)."""

    number: int
    raw: bytes
    size: int
    too_long: bool = False
    start: int = 0
    ended: bool = True


def read_lines(fh: Any, limit: int = MAX_LINE_BYTES, number: int = 0,
               offset: int = 0) -> Iterator[Line]:
    """The lines of a binary file object, holding at most ``limit + 2`` bytes of a line at a time
    (a line of ``limit`` bytes and its ``\\r\\n``): a longer line is not read whole but skipped to
    its end ``SKIP_BYTES`` at a time and yielded as ``too_long``, and reading resumes at the next
    line. Every request to ``fh`` is a ``readline(n)`` with ``n <= limit + 2``. ``number``,
    ``offset``: the number of the line before the first one read and the offset reading starts
    at (to resume reading a file)."""
    pos = offset
    while True:
        chunk = fh.readline(limit + 2)
        if not chunk:
            return
        number += 1
        start = pos
        pos += len(chunk)
        if chunk.endswith(b"\n") or len(chunk) < limit + 2:  # a whole line (the last may lack \n)
            ended = chunk.endswith(b"\n")
            raw = chunk.rstrip(b"\r\n") if ended else chunk
            too_long = len(raw) > limit  # limit + 1 bytes and its \n
            yield Line(number, raw[:1000] if too_long else raw, len(raw), too_long, start, ended)
            continue
        head, size, tail = chunk[:1000], len(chunk), chunk[-2:]
        del chunk
        while True:  # skip the rest of the over-long line
            part = fh.readline(SKIP_BYTES)
            if not part:
                break
            size += len(part)
            pos += len(part)
            tail = (tail + part)[-2:]
            if part.endswith(b"\n"):
                break
        ended = tail.endswith(b"\n")
        size -= 2 if tail == b"\r\n" else 1 if ended else 0
        yield Line(number, head, size, True, start, ended)


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


# read an entry itself, never through a symbolic link, and never wait for a pipe's writer
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)


class NotRegularFile(OSError):
    """A spool entry that is not a regular file (a symbolic link, a directory, a pipe...)."""


def open_regular(path: str):
    """Open ``path`` for reading as a binary file only if it is a regular file itself: a symbolic
    link is not followed (``O_NOFOLLOW``), and a pipe, socket, device or directory is refused
    after ``fstat`` of what was opened (``O_NONBLOCK``, so that opening a pipe does not wait for
    a writer), so nothing can be swapped in between a check and the open. Raises
    :class:`NotRegularFile` saying what it is."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "a symbolic link", path) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, _kind(mode), path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


_F_SETSIG = getattr(fcntl, "F_SETSIG", None)
_F_SETLEASE = getattr(fcntl, "F_SETLEASE", None)


def open_for_writing(fd: int) -> bool | None:
    """Whether any process has the regular file open (``fd``: opened read-only) for writing:
    Linux refuses a read lease then (``EAGAIN``). The lease, when granted, is dropped at once;
    its break signal is set to SIGURG (ignored by default) first, so that a writer opening the
    file in that instant cannot end this process with SIGIO. None when it cannot be told: no
    leases on this system or file system (NFS, FUSE), or not permitted (a file of another owner
    without ``CAP_LEASE``)."""
    if _F_SETLEASE is None or _F_SETSIG is None:
        return None
    try:
        fcntl.fcntl(fd, _F_SETSIG, int(signal.SIGURG))
        fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        return True if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK) else None
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETLEASE, fcntl.F_UNLCK)
    return False


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
        w, a = self.window_seconds, self.allowed_lateness
        if not (isinstance(w, (int, float)) and math.isfinite(w) and w > 0):
            raise ValueError(f"window = {w!r}: expected seconds > 0")
        if not (isinstance(a, (int, float)) and math.isfinite(a) and a >= 0):
            raise ValueError(f"allowed lateness = {a!r}: expected seconds >= 0")
        if Duration.of(w).micros <= 0:
            raise ValueError(f"window = {w!r}: shorter than a microsecond")

    @cached_property
    def size_us(self) -> int:
        return Duration.of(self.window_seconds).micros  # what beam.window.FixedWindows uses

    @cached_property
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


WITHHELD = "<withheld: a privacy-unit stream does not copy a line it cannot parse, which may " \
    "hold a unit id; see the file and line>"


def pseudonymize(record: dict, unit_field: str, hasher: UnitHasher) -> str | None:
    """Replace ``record[unit_field]`` by its keyed hash, in place; returns the reason it cannot
    (the field is absent, or not a string or integer id: then its value is replaced by
    ``"<withheld>"``, so a dead letter never shows it), else None."""
    if unit_field not in record:
        return f"record has no privacy-unit field {unit_field!r}"
    value = record[unit_field]
    try:
        record[unit_field] = hasher(value)
    except ValueError:
        record[unit_field] = "<withheld>"
        what = ("null" if value is None else "empty or only whitespace"
                if isinstance(value, str) else f"a {type(value).__name__}")
        return (f"privacy-unit field {unit_field!r} is {what}, not a string or an integer id "
                "(its value is withheld)")
    return None


class SpoolDirectory:
    """A spool directory opened for reading by one process (see the module docstring).
    ``unit_field``, ``unit_key``: the privacy-unit field, whose ids are replaced by keyed hashes
    as records are read (see "Privacy units"). ``settle``: the quiet period, in seconds, of a
    file that may still be written (see "Complete files only"; 0: only open or flocked files
    wait); ``settle_wait``: the longest a bounded read waits for such files (None: twice
    ``settle``). ``waiting``: the new entries last found not settled, with the reason."""

    def __init__(self, path: str, clock: WindowClock, timestamp_field: str = "ts",
                 unit_field: str | None = None, unit_key: bytes | None = None, *,
                 settle: float = SETTLE_SECONDS, settle_wait: float | None = None) -> None:
        if not timestamp_field:
            raise ValueError("timestamp field: expected a field name")
        if (unit_field is None) != (unit_key is None):
            raise ValueError("unit_field and unit_key go together (the key hashes the ids)")
        for what, value in (("settle", settle), ("settle_wait", settle_wait)):
            if value is not None and not (isinstance(value, (int, float)) and
                                          math.isfinite(value) and value >= 0):
                raise ValueError(f"{what} = {value!r}: expected seconds >= 0")
        self.path = os.path.abspath(path)
        self.clock = clock
        self.timestamp_field = timestamp_field
        self.unit_field, self.unit_key = unit_field, unit_key
        self.settle = float(settle)
        self.settle_wait = 2 * self.settle if settle_wait is None else float(settle_wait)
        self.waiting: dict[str, str] = {}
        self._seen: dict[str, tuple[tuple, float]] = {}  # name -> (its stat, first seen so)
        self._hasher = None if unit_key is None else UnitHasher(unit_key)
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
    def settled(self) -> int | None:
        """The settled watermark in µs (see the module docstring), or None if never recorded."""
        return read_settled(self.path)

    # -- files
    def _sub(self, sub: str, name: str = "") -> str:
        return os.path.join(self.path, sub, name) if name else os.path.join(self.path, sub)

    def leftovers(self) -> list[FileState]:
        """Files a crashed run left in ``.claimed/``, to be re-read from the start."""
        names = sorted(f for f in os.listdir(self._sub(CLAIMED))
                       if f.endswith(SUFFIX) and not f.startswith("."))
        return [FileState(self._sub(CLAIMED, n), n, True) for n in names]

    def new_names(self) -> list[str]:
        """The names of the new entries (``*.jsonl``, not starting with ``.`` or ``_``), in
        name order. Whatever they are: one that is not a regular file is claimed like a file and
        then set aside by :meth:`read` (a symbolic link is never followed)."""
        with os.scandir(self.path) as it:
            names = sorted(e.name for e in it if e.name.endswith(SUFFIX)
                           and not e.name.startswith(TEMP_PREFIXES))
        present = set(names)
        for memo in (self._seen, self.waiting):
            for gone in [n for n in memo if n not in present]:
                del memo[gone]
        return names

    def why_unsettled(self, name: str) -> str | None:
        """Why the new entry ``name`` may still be being written (see "Complete files only" in
        the module docstring), or None if it may be claimed now: it is not open for writing
        (:func:`open_for_writing`) nor flocked (:func:`flocked`), and it has been quiet for
        ``settle`` seconds or, with no writer, ends with a newline. An entry that is not a
        regular file, or cannot be opened, may be claimed (:meth:`read` says what it is)."""
        try:
            fd = os.open(os.path.join(self.path, name), _READ_FLAGS)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            if flocked(fd):
                return "locked (flock) by its writer"
            writing = open_for_writing(fd)
            if writing:
                return "open for writing by a process"
            now = time.monotonic()
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            seen = self._seen.get(name)
            if seen is None or seen[0] != key:
                seen = self._seen[name] = (key, now)
            age = time.time() - st.st_mtime
            if age >= self.settle or now - seen[1] >= self.settle:
                return None  # quiet for the settle period
            if writing is False and st.st_size and os.pread(fd, 1, st.st_size - 1) == b"\n":
                return None  # no writer, and it ends with a whole line
            what = "empty" if not st.st_size else "its last line not ended" \
                if writing is False else "whether a process writes it cannot be told here"
            return f"changed {max(age, 0.0):.1f} s ago, {what}"
        finally:
            os.close(fd)

    def claim(self, name: str) -> FileState | None:
        """Claim one new entry by an atomic rename into ``.claimed/`` (a symbolic link is moved as
        the link itself), if it is settled (:meth:`why_unsettled`); None if not (then
        ``waiting[name]`` says why) or if another process took or removed it since the listing."""
        why = self.why_unsettled(name)
        if why is not None:
            self.waiting[name] = why
            return None
        self.waiting.pop(name, None)
        self._seen.pop(name, None)
        dst = _free_name(self._sub(CLAIMED), name)
        try:
            os.rename(os.path.join(self.path, name), dst)
        except FileNotFoundError:
            return None
        return FileState(dst, name, False)

    def claim_new(self, wait: float = 0.0) -> list[FileState]:
        """Claim every new entry, in name order (see :meth:`claim`); entries not settled yet
        are tried again until they are or ``wait`` seconds have passed. Those left are in
        ``waiting``, with the reason."""
        names = self.new_names()
        out = [s for s in map(self.claim, names) if s is not None]
        left = [n for n in names if n in self.waiting]
        give_up = time.monotonic() + wait
        pause = 0.02
        while left and time.monotonic() < give_up:
            time.sleep(min(pause, max(0.0, give_up - time.monotonic())))
            pause = min(pause * 2, 0.2)
            for name in left:
                if os.path.lexists(os.path.join(self.path, name)):
                    state = self.claim(name)
                    if state is not None:
                        out.append(state)
                else:
                    self.waiting.pop(name, None)
            left = [n for n in left if n in self.waiting]
        return out

    def finish(self, state: FileState) -> None:
        """Move a claimed file to ``.done/`` (every record of it is settled)."""
        os.rename(state.path, _free_name(self._sub(DONE), os.path.basename(state.path)))

    def finish_existing(self, states: list) -> int:
        """Move every one of ``states`` still in ``.claimed/`` to ``.done/``; returns how many."""
        left = [s for s in states  # not one set aside in .failed/
                if os.path.dirname(s.path) == self._sub(CLAIMED) and os.path.lexists(s.path)]
        for state in left:
            self.finish(state)
        return len(left)

    def fail(self, state: FileState) -> str:
        """Move a claimed entry to ``.failed/``; returns where it is now."""
        try:
            dst = _free_name(self._sub(FAILED), os.path.basename(state.path))
            os.rename(state.path, dst)
            return dst
        except OSError:
            return state.path  # left in .claimed/: tried again at the next start

    # -- reading
    def read(self, state: FileState, watermark_us: int | None, settled_us: int | None
             ) -> Iterator[tuple]:
        """The items of one claimed file: ``(RECORD, record, event µs, line, bytes)`` and
        ``(DEAD, dead letter)`` per line, then ``(LEDGER, entry)``. ``watermark_us``: the watermark
        in force (records whose window closed before it are too late); ``settled_us``: for a re-read
        leftover, records whose window closed before it are skipped (counted in the ledger).

        Only a regular file is read; anything else is moved to ``.failed/`` unread, with a dead
        letter and a ledger entry saying what it is (see "Reading a file" in the module
        docstring)."""
        tally = ReadTally()
        try:
            fh = open_regular(state.path)
        except OSError as exc:
            if isinstance(exc, NotRegularFile):
                tally.error = (f"not a regular file ({exc.strerror}): not followed or read")
            else:
                tally.error = f"unreadable file: {type(exc).__name__}: {exc}"
            where = self.fail(state)
            if where != state.path:
                tally.error += f"; moved to {os.path.join(FAILED, os.path.basename(where))}"
            state.path = where
            yield DEAD, _dead(tally.error, None, state.name, None)
            yield LEDGER, self._ledger(state, tally)
            return
        with fh:
            try:
                for line, still_open in self._lines(fh):
                    if not line.too_long and not line.raw.strip():
                        continue  # a blank line is not a record
                    tally.lines += 1
                    record, why = None, None
                    if line.too_long:
                        why = (f"line of {line.size:,} bytes is longer than the limit of "
                               f"{MAX_LINE_BYTES:,}: not parsed" + (
                                   "" if self.unit_field else " (record: its first 1,000 bytes)"))
                    elif not line.ended:  # the file's last line, and no writer will end it
                        why = TRUNCATED + (f"; the file was still being written after "
                                           f"{WRITER_WAIT_SECONDS:g} s" if still_open else "")
                    else:
                        try:
                            record, t_us = parse_line(line.raw, self.timestamp_field)
                        except ValueError as exc:
                            why = str(exc)
                        else:
                            why = None if self.unit_field is None else \
                                pseudonymize(record, self.unit_field, self._hasher)
                    if why is None:
                        close = self.clock.close(t_us)
                        if state.recovered and settled_us is not None and close < settled_us:
                            tally.skipped += 1
                            continue
                        if self.clock.too_late(t_us, watermark_us):
                            tally.too_late += 1
                            start, end = self.clock.window(t_us)
                            why = (f"too late: event time {iso(t_us)} is in window "
                                   f"[{iso(start)}, {iso(end)}), closed at {iso(close)} (its end "
                                   f"plus the allowed lateness); the watermark was "
                                   f"{iso(watermark_us)}")
                    if why is not None:
                        tally.dead_lettered += 1
                        yield DEAD, _dead(why, self._unparsed(line.raw) if record is None
                                          else record, state.name, line.number)
                        continue
                    tally.records += 1
                    state.max_close_us = close if state.max_close_us is None \
                        else max(state.max_close_us, close)
                    yield RECORD, record, t_us, line.number, line.size
            except OSError as exc:  # an I/O error part-way: what was read stands
                tally.error = (f"read failed after {tally.lines} lines: "
                               f"{type(exc).__name__}: {exc}")
                yield DEAD, _dead(tally.error, None, state.name, None)
        yield LEDGER, self._ledger(state, tally)

    def _still_written(self, fd: int) -> bool:
        """Whether a claimed file is still being written: open for writing, flocked, or (when
        neither can be told) modified less than ``settle`` seconds ago."""
        if flocked(fd):
            return True
        writing = open_for_writing(fd)
        if writing is not None:
            return writing
        return time.time() - os.fstat(fd).st_mtime < self.settle

    def _lines(self, fh: Any) -> Iterator[tuple[Line, bool]]:
        """:func:`read_lines` of a claimed file, read on while it grows, as ``(line, still
        written)``: a last line without its newline is held back while the file is still being
        written (:meth:`_still_written`), for at most ``WRITER_WAIT_SECONDS``, then yielded
        (``ended`` False) with whether it was still being written then."""
        fd = fh.fileno()
        number, give_up, pause = 0, None, 0.01
        while True:
            held = None
            for line in read_lines(fh, number=number, offset=fh.tell()):
                if not line.ended and not line.too_long:
                    held = line  # the last line for now: the file ends there
                    break
                number = line.number
                yield line, False
            grew = os.fstat(fd).st_size > fh.tell()
            if held is None and not grew:
                return
            if held is not None:
                if not grew:
                    still = self._still_written(fd)
                    if give_up is None:
                        give_up = time.monotonic() + WRITER_WAIT_SECONDS
                    if not still or time.monotonic() >= give_up:
                        yield held, still
                        return
                    time.sleep(pause)
                    pause = min(pause * 2, 0.1)
                else:
                    give_up, pause = None, 0.01
                fh.seek(held.start)  # read the line again, with what was added to it

    def _unparsed(self, raw: bytes) -> str:
        """What a dead letter shows of a line that was not parsed: its first 1,000 bytes, or
        nothing in a privacy-unit stream (the text may hold a unit id)."""
        return WITHHELD if self.unit_field is not None else _shown(raw)

    def _ledger(self, state: FileState, tally: ReadTally) -> dict:
        return {"kind": "file", "file": state.name, "recovered": state.recovered,
                "lines": tally.lines, "records": tally.records,
                "dead_lettered": tally.dead_lettered, "too_late": tally.too_late,
                "skipped_settled": tally.skipped, **({"error": tally.error} if tally.error else {})}


def grouped(items: Iterator[tuple], source: str, window_us: int) -> Iterator[tuple]:
    """The items of one file (:meth:`SpoolDirectory.read`) with its records grouped by window
    (at most ``GROUP_ROWS`` records, ``GROUP_BYTES`` of lines, per group): yields ``(item, event
    µs or None, items read)`` — ``(RECORDS, source, [(record, line), ...])`` at the earliest
    event time of the group, other items as they are (None), each group before the file's
    ledger entry."""
    groups: dict[int, list] = {}  # window start -> [earliest µs, rows, bytes, items]
    for item in items:
        if item[0] == RECORD:
            _, record, t_us, number, nbytes = item
            w = t_us - t_us % window_us
            g = groups.setdefault(w, [t_us, [], 0, 0])
            g[0] = min(g[0], t_us)
            g[1].append((record, number))
            g[2] += nbytes
            g[3] += 1
            if len(g[1]) >= GROUP_ROWS or g[2] >= GROUP_BYTES:
                del groups[w]
                yield (RECORDS, source, g[1]), g[0], g[3]
            continue
        if item[0] == LEDGER:  # the file's last item
            for g in groups.values():
                yield (RECORDS, source, g[1]), g[0], g[3]
            groups = {}
        yield item, None, 1
    for g in groups.values():
        yield (RECORDS, source, g[1]), g[0], g[3]


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


def read_settled(spool_path: str) -> int | None:
    """The settled watermark in µs recorded in a spool directory, or None if never recorded."""
    try:
        with open(os.path.join(spool_path, WATERMARK_FILE)) as fh:
            return int(fh.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def record_settled(spool_path: str, watermark_us: int) -> None:
    """Record the settled watermark (atomically; it only moves forward). Called by the sink."""
    path = os.path.join(spool_path, WATERMARK_FILE)
    settled = read_settled(spool_path)
    if settled is not None and settled >= watermark_us:
        return
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{int(watermark_us)}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------- the live source
class SpoolSource(beam.PTransform):
    """The live spool source (DirectRunner, streaming): ``(kind, ...)`` items, each record at
    its event time. Use it as a context manager around the pipeline run: entering starts the
    local TestStreamService that feeds it (and the ``duration`` clock), leaving stops it.

    ``poll_seconds``: how often new files are looked for (at most 10 s); ``duration``: stop
    cleanly after this many seconds (None: until ``stop`` is set); ``watermark_lag``: seconds the
    watermark trails the wall clock (how long a window waits for stragglers before its on-time
    pane). ``stop``: a threading.Event that ends the stream cleanly. ``mark_from_us``: for a
    central-DP release, the start of its range: every window from the one containing it is
    marked (a ``(MARK, window start)`` item) once the wall clock reaches its start, up to the
    run's last poll or ``mark_until_us`` (None: no marks).

    At the stop, ``unsettled`` maps each new file left still being written to why (each gets an
    ``unread`` ledger entry). At most about two chunks are ever in flight ("Protocol" in the module
    docstring), so a stop takes effect after the file being read, with little queued behind it."""

    def __init__(self, spool: SpoolDirectory, poll_seconds: float = 1.0,
                 duration: float | None = None, watermark_lag: float = 0.0,
                 stop: threading.Event | None = None, say: Any = None,
                 mark_from_us: int | None = None, mark_until_us: int | None = None) -> None:
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
        self.claimed: list[FileState] = []  # the files read and not yet settled
        self.error: BaseException | None = None
        self.last_watermark_us: int | None = None
        self.mark_from_us = None if mark_from_us is None else spool.clock.window(mark_from_us)[0]
        self.mark_until_us = mark_until_us
        self.marked: tuple[int, int] | None = None  # [first, end) of the windows marked
        self.deadline: float | None = None
        self.unsettled: dict[str, str] = {}  # at the stop: new files left still being written
        self._told: set[str] = set()
        self._controller = None

    # -- the TestStreamService
    def __enter__(self) -> "SpoolSource":
        if self.duration is not None:
            self.deadline = time.monotonic() + self.duration
        self._controller = TestStreamServiceController(self)
        self._controller.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def expand(self, pbegin):
        if self._controller is None:
            raise RuntimeError("SpoolSource must be entered (with source: ...) before the "
                               "pipeline is built: that starts the service feeding it")
        # items travel as plain tuples (FastPrimitivesCoder), each record at its event time
        return pbegin | "Watch" >> TestStream(coder=self.coder,
                                              endpoint=self._controller.endpoint)

    # -- what the service calls: the stream of events
    def read_multiple(self, unused_tags: Any) -> Iterator[Any]:
        return self._events()

    def _stopping(self) -> bool:
        return self.stop.is_set() or (self.deadline is not None and
                                      time.monotonic() >= self.deadline)

    def _wait(self, seconds: float) -> None:
        if self.deadline is not None:
            seconds = min(seconds, max(0.0, self.deadline - time.monotonic()))
        self.stop.wait(seconds)

    def _await_ack(self, watermark_us: int | None) -> None:
        """Wait until the sink has settled ``watermark_us`` (everything sent before it is
        written), a stop, or ``ACK_SECONDS``."""
        if watermark_us is None:
            return
        give_up = time.monotonic() + ACK_SECONDS
        pause = 0.002
        while not self._stopping() and time.monotonic() < give_up:
            settled = self.spool.settled()
            if settled is not None and settled >= watermark_us:
                return
            self.stop.wait(pause)
            pause = min(pause * 2, 0.05)

    def _marks(self, watermark_us: int | None, now_us: int) -> list[int]:
        """The starts of the windows to mark now (``now_us``: the wall clock, never behind the
        watermark about to be sent): those of the range that start before it and are not marked
        yet, less those already closed at the watermark in force (an earlier run's). Marks go
        by the wall clock, not the lagged watermark, so a window is marked as soon as records
        for it can be on time, before its first firing."""
        if self.mark_from_us is None:
            return []
        new_us = now_us if self.mark_until_us is None else min(now_us, self.mark_until_us)
        size = self.spool.clock.size_us
        first = self.mark_from_us if self.marked is None else self.marked[1]
        starts = [s for s in range(first, new_us, size)
                  if not self.spool.clock.too_late(s, watermark_us)]
        if first < new_us:
            end = first + -(-(new_us - first) // size) * size
            self.marked = (self.mark_from_us if self.marked is None else self.marked[0], end)
        return starts

    def _events(self) -> Iterator[Any]:
        ev = runner_api.TestStreamPayload.Event
        settled0 = self.spool.settled()
        watermark = settled0  # in force for the too-late rule (a fresh spool: none yet)
        last_tick = time.monotonic()
        clock_us = self.spool.clock.size_us
        pending: deque = deque()  # leftovers (FileState) and new names of the current listing
        first = True
        sent: list[int] = []  # the acknowledgment points sent (watermarks)
        batch: list = []
        size = 0

        def flush() -> list:
            nonlocal batch, size
            out = [ev(element_event=ev.AddElements(elements=batch, tag="None"))] if batch else []
            batch, size = [], 0
            return out

        def add(value, t_us) -> list:
            """Add an element to the batch; returns the events to send first (the batch, when
            the element would take it past EVENT_BYTES or EVENT_ELEMENTS)."""
            nonlocal size
            enc = self.coder.encode(value)
            out = flush() if size + len(enc) > EVENT_BYTES or len(batch) >= EVENT_ELEMENTS \
                else []
            batch.append(runner_api.TestStreamPayload.TimestampedElement(encoded_element=enc,
                                                                  timestamp=t_us))
            size += len(enc)
            return out

        try:
            while True:
                stopping = self._stopping()
                if not pending and not stopping:
                    if first:
                        pending.extend(self.spool.leftovers())
                        first = False
                    pending.extend(self.spool.new_names())
                stamp = watermark if watermark is not None else 0
                n_items, files = 0, []
                while pending and n_items < CHUNK_ITEMS and not stopping:
                    entry = pending.popleft()
                    state = entry if isinstance(entry, FileState) else self.spool.claim(entry)
                    if state is None:
                        self._note_waiting(entry)
                        continue
                    files.append(state)
                    self.claimed.append(state)
                    for value, t_us, n_read in grouped(
                            self.spool.read(state, watermark, settled0), state.name, clock_us):
                        n_items += n_read
                        yield from add(value, stamp if t_us is None else t_us)
                    stopping = self._stopping()
                final = stopping or self._stopping()
                if final:  # new files still being written stay for the next run: say so
                    for entry in self._left():
                        yield from add((LEDGER, entry), stamp)
                # the watermark: within a listing, one microsecond on (an acknowledgment point);
                # once it is read, the wall clock less the lag. Strictly increasing, never
                # behind the settled watermark of an earlier run.
                floor = max((x for x in (watermark, self.last_watermark_us) if x is not None),
                            default=MIN_WATERMARK_US)
                new = floor + 1 if pending and not stopping else \
                    max(int(time.time() * 1_000_000) - self.lag_us, floor + 1)
                for s in self._marks(watermark, max(new, int(time.time() * 1_000_000))):
                    yield from add((MARK, s), s)
                yield from add((HEARTBEAT, new), new)
                yield from flush()
                for state in files:
                    state.read_at_us = new
                tick = time.monotonic()
                yield ev(processing_time_event=ev.AdvanceProcessingTime(
                    advance_duration=max(1, int((tick - last_tick) * 1_000_000))))
                last_tick = tick
                yield ev(watermark_event=ev.AdvanceWatermark(new_watermark=new, tag="None"))
                watermark = self.last_watermark_us = new
                sent.append(new)
                self.settle()
                if final:
                    break
                if pending:  # more of this listing: go on once the chunk two back is written
                    self._await_ack(sent[-2] if len(sent) > 1 else None)
                else:
                    self._wait(self.poll_seconds)
        except GeneratorExit:  # the runner went away (a failed pipeline): stop quietly
            raise
        except BaseException as exc:  # reported by the driver once the pipeline has ended
            self.error = exc
            self.say(f"spool source failed: {type(exc).__name__}: {exc}")

    def _note_waiting(self, name: str) -> None:
        """Log, once per file, that a new file is not settled yet (still being written)."""
        why = self.spool.waiting.get(name)
        if why is not None and name not in self._told:
            self._told.add(name)
            self.say(f"{name} is still being written ({why}): not read yet")

    def _left(self) -> list[dict]:
        """At the stop: the new files found still being written (``unsettled``), left in the
        spool for the next run, as ledger entries (the sink logs them)."""
        self.unsettled = {n: why for n, why in self.spool.waiting.items()
                          if os.path.lexists(os.path.join(self.spool.path, n))}
        return unread_entries(self.unsettled, "at the stop")

    def settle(self) -> list[FileState]:
        """Move to ``.done/`` the claimed files the settled watermark has passed."""
        settled = self.spool.settled()
        if settled is None:
            return []
        moved, keep = [], []
        for state in self.claimed:
            if not os.path.lexists(state.path) or not state.path.startswith(
                    self.spool._sub(CLAIMED)):
                continue  # set aside (.failed/) or gone
            done = state.read_at_us is not None and settled >= state.read_at_us and (
                state.max_close_us is None or state.max_close_us < settled)
            if done:
                self.spool.finish(state)
            (moved if done else keep).append(state)
        self.claimed = keep
        return moved

    def finish_all(self) -> int:
        """After the pipeline has finished cleanly: every file read is settled."""
        n = self.spool.finish_existing(self.claimed)
        self.claimed = []
        return n


def unread_entries(unsettled: dict[str, str], when: str) -> list[dict]:
    """Ledger entries ``{"kind": "unread", "file", "reason"}`` of the new files left in the
    spool still being written (``unsettled``: name -> why) ``when`` the source gave up on them."""
    return [{"kind": "unread", "file": name, "reason": f"still being written {when} ({why}): "
             "left in the spool for the next run"} for name, why in sorted(unsettled.items())]


def file_line(entry: dict) -> str:
    """A ledger entry of a file read (or left unread: ``kind`` "unread"), for people."""
    if entry.get("kind") == "unread":
        return f"not read {entry['file']}: {entry['reason']}"
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
    """A claimed file -> its items, its records grouped by window (:func:`grouped`), each group
    timestamped with its earliest event time. Nothing is too late in a bounded read; re-read
    leftovers skip what was settled before the restart."""

    def __init__(self, spool: SpoolDirectory, settled_us: int | None) -> None:
        self.spool_path = spool.path
        self.clock = spool.clock
        self.timestamp_field = spool.timestamp_field
        self.unit_field, self.unit_key = spool.unit_field, spool.unit_key
        self.settle = spool.settle
        self.settled_us = settled_us
        self._spool: SpoolDirectory | None = None

    def process(self, state: tuple):
        path, name, recovered = state
        if self._spool is None:  # one per instance: its unit hasher remembers ids across files
            self._spool = SpoolDirectory(self.spool_path, self.clock, self.timestamp_field,
                                         self.unit_field, self.unit_key, settle=self.settle)
        items = self._spool.read(FileState(path, name, recovered), None, self.settled_us)
        for value, t_us, _ in grouped(items, name, self.clock.size_us):
            yield value if t_us is None else TimestampedValue(value, Timestamp(micros=t_us))


class ReadSpoolOnce(beam.PTransform):
    """The bounded spool source: claim what is in the directory now (and any leftovers), read it
    once. The caller moves the claimed files to ``.done/`` with :meth:`finish_all` after the
    pipeline has succeeded; if it fails they stay claimed and are re-read at the next start. New
    files still being written are waited for up to the spool's ``settle_wait`` seconds, then left
    for the next run ("Complete files only" in the module docstring): ``unsettled`` maps each to
    the reason, and each gets a ledger entry ``{"kind": "unread", "file", "reason"}``."""

    def __init__(self, spool: SpoolDirectory) -> None:
        super().__init__()
        self.spool = spool
        self.settled_us = spool.settled()
        self.claimed = spool.leftovers() + spool.claim_new(wait=spool.settle_wait)
        self.unsettled = dict(spool.waiting)

    def expand(self, pbegin):
        units = [(s.path, s.name, s.recovered) for s in self.claimed]
        files = pbegin | "Files" >> beam.Create(units)
        if len(units) > 1:
            files = files | "Spread" >> beam.Reshuffle()
        items = files | "Read" >> beam.ParDo(ReadClaimedFn(self.spool, self.settled_us))
        if not self.unsettled:
            return items
        left = pbegin | "Unsettled" >> beam.Create([(LEDGER, e) for e in unread_entries(
            self.unsettled, f"after waiting {self.spool.settle_wait:g} s")])
        return (items, left) | "WithUnsettled" >> beam.Flatten()

    def finish_all(self) -> int:
        return self.spool.finish_existing(self.claimed)
