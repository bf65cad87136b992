"""Land Pub/Sub messages durably into a spool directory, then acknowledge them.

The :class:`Lander` is the collector's front door for live telemetry: it pulls messages from a
Pub/Sub subscription with the synchronous ``pull`` RPC (bounded, stoppable: no streaming pull),
writes each pulled batch as **one** new spool file (JSON lines, the format
:mod:`ldp_beam.transforms.spool` reads, every line carrying its report id and its event time in
the spool's timestamp field) and acknowledges the batch only once that file is durable. The
spool stream (``ldp-beam stream --spool D``) then windows and estimates it with everything the
spool source guarantees (claims that survive restarts, watermarks from the data, dead letters).

**Messages.** A message's data is UTF-8 JSON lines (:mod:`ldp_beam.client` writes them): one
JSON object per line, each a report. A line's report id is its ``report_id`` field or, for a
message of one line without it, the message's ``report_id`` attribute; likewise its event time
is its ``ts`` field or the ``ts`` attribute (epoch seconds or ISO 8601 / RFC 3339 text, what
:func:`~ldp_beam.transforms.spool.event_micros` accepts); it is written as ISO text with
microseconds. A message of several lines needs both on every line (its attributes describe the
batch). Attribute and field names are options (``report_id_attribute``,
``timestamp_attribute``, ``report_id_field``, ``timestamp_field``).

**One batch, in order** (:meth:`Lander.land_once`):

1. pull at most ``max_messages``: one pull (bounded by ``pull_timeout``), then, while messages keep
   coming, more pulls (each bounded by ``gather_timeout``) for at most ``gather_seconds`` and
   ``max_batch_bytes`` of data (the emulator hands out at most 100 messages a pull; one file and one
   commit per ~1000 messages is what makes landing cost little over a plain pull);
2. sort each message into *poison* (data over ``max_message_bytes``, not UTF-8, a line that is not a
   JSON object, no report id or event time, an invalid one), *duplicate* (its report id was landed
   before, or earlier in this batch) and *new*;
3. write the new lines to ``D/.landing-NAME`` (a dot-name the spool ignores), fsync it;
4. commit, in one SQLite transaction of the *landed record* (``D/.lander/landed.sqlite``, WAL,
   ``synchronous=FULL``), every new report id with a digest of its line and the batch as *pending*
   with its file name;
5. rename ``D/.landing-NAME`` to ``D/NAME.jsonl`` and fsync ``D``: from here the spool may read it;
6. append the batch's dead letters to ``D/.lander/deadletter.jsonl`` (fsynced);
7. acknowledge every message of the batch (new, duplicate and poison alike), in RPCs bounded by
   ``ack_timeout``. The batch's *pending* mark is cleared in the next batch's transaction (or at
   :meth:`Lander.close`).

**Delivery guarantee.** Pub/Sub delivers at least once: a message not acknowledged within its
ack deadline (a crash, a lost ack, a slow lander) is delivered again, and a device whose publish
timed out publishes its batch again (:class:`~ldp_beam.client.Reporter` keeps the same ids).
Landing is idempotent by report id: a report whose id is in the landed record is acknowledged
and not written again. So every report a device published is written to the spool exactly once
*in effect*, and never lost after it was acknowledged, because

* a message is acknowledged only after step 5, so an acknowledged report is in a durable spool
  file (or, poison, in the durable dead-letter file): acknowledgment never outruns durability;
* a report is written to a spool file only if its id was not in the record, and its id enters
  the record (step 4) in the same batch that writes it: a redelivery after the record holds it
  (ack lost, kill -9 between 5 and 7, a device's re-publish) is a duplicate;
* a crash between steps 4 and 5 is repaired at start-up (:meth:`Lander.open`) from the pending
  mark: if ``D/.landing-NAME`` is there it is renamed in (its ids are recorded, the file is
  complete and fsynced); if the file already reached ``D`` (or the spool moved it to
  ``.claimed/``, ``.done/`` or ``.failed/``) nothing is to be done; if neither exists (only
  possible if the folder entry of the temporary file was lost with the machine) its ids are
  removed from the record, which is correct because none of its messages was acknowledged, so
  they will be delivered again. A crash before step 4 leaves only a temporary file, removed at
  start-up; its messages were not acknowledged. Within one batch, the order "file fsynced,
  record committed, file renamed, folder fsynced, ack" is what makes both halves hold.

**Limits.** Exactly-once *in effect* rests on the landed record: it must live as long as a report
can come back. Pub/Sub redelivers only within the subscription's retention (7 days by default) but a
device may re-publish from its outbox after any outage; the record keeps every id (about 100 bytes
per report) unless ``retention_seconds`` prunes batches landed longer ago, after which a re-publish
of such a report is landed again. Losing or restoring an older copy of ``landed.sqlite`` loses the
dedup of what it forgot (messages redelivered or re-published after that are landed twice); deleting
spool files that the record names (e.g. emptying ``.done/``) does not re-land anything, but then a
crash between steps 4 and 5 cannot be told apart from a lost temporary file (see above). One lander
per spool directory (``D/.lander/lock``); two landers on one subscription but different spool
folders each dedup only their own landings (Pub/Sub gives each message to one of them at a time, but
a redelivery may reach the other). A report id reused by a device for a different report is not
landed: it is dead-lettered as a conflict (its line's digest differs from the recorded one).
Ordering is not preserved (the spool windows by event time). Acks that fail after landing are
counted (``ack_failures``): those messages come back and are dropped as duplicates. Durability is
the local disk's: fsync and ``synchronous=FULL`` survive a crash or a power cut on a file system
that honours fsync, not the loss of the disk that holds both the spool and the record. The chain is
only as good as its ends: a device without a ``seq_store`` (no outbox) loses, never duplicates, the
batch in hand when it crashes; past the spool, the stream's own guarantee applies (each record
estimated effectively once per window across its restarts, a window open at a crash possibly leaving
an earlier, superseded pane: :mod:`ldp_beam.transforms.spool`).

**Crash points for tests.** The environment variable ``LDP_BEAM_LANDER_CRASH`` set to
``before-commit``, ``after-commit`` or ``after-rename`` makes the lander kill itself with
SIGKILL at that point of the first batch that reaches it (between steps 3 and 4, 4 and 5, 5 and
7): tests use it to prove the argument above with a real ``kill -9``.

Poison messages are written to the dead-letter file with their reason, message id, attributes
(values cut at 200 characters), size and first 1,000 bytes, and acknowledged: never retried forever.
A dead letter is written (fsynced) before its message's ack, so dead letters are at least once: a
crash between the two writes it again when the message comes back. Every RPC has a timeout;
transient RPC errors (unavailable, deadline exceeded, ...) are retried with backoff for at most
``error_budget`` seconds in a row, then raise :class:`LanderError`.

Run it from the command line with ``python -m ldp_beam.transforms.pubsub_lander --subscription
projects/P/subscriptions/S --spool D [--duration SECONDS]`` (SIGINT/SIGTERM stop it after the
current batch).
"""
from __future__ import annotations

from ldp_beam.errors import LdpBeamError

import argparse
import fcntl
import hashlib
import json
import math
import os
import signal
import sqlite3
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from ldp_beam.client import _fsync_dir, iso_micros
from ldp_beam.jsonio import dumps, encoder
from ldp_beam.transforms.spool import MAX_LINE_BYTES, SUFFIX, event_micros

LANDER_DIR = ".lander"
TEMP_PREFIX = ".landing-"
CRASH_ENV = "LDP_BEAM_LANDER_CRASH"
CRASH_POINTS = ("before-commit", "after-commit", "after-rename")
SPOOL_SUBDIRS = ("", ".claimed", ".done", ".failed")  # where a landed file may be now
MAX_ID_CHARS = 256
ACK_CHUNK = 1000  # ack ids per acknowledge RPC


class LanderError(LdpBeamError, RuntimeError):
    """The lander cannot go on (a persistent RPC error, a spool folder in use by another
    lander, ...)."""


def subscription_path(sub: str) -> str:
    """``projects/P/subscriptions/S`` (or ``P/S``) -> ``projects/P/subscriptions/S``."""
    if isinstance(sub, str) and sub.startswith("projects/"):
        parts = sub.split("/")
        if len(parts) == 4 and parts[2] == "subscriptions" and parts[1] and parts[3]:
            return sub
    elif isinstance(sub, str):
        parts = sub.split("/")
        if len(parts) == 2 and all(parts):
            return f"projects/{parts[0]}/subscriptions/{parts[1]}"
    raise ValueError(f"subscription {sub!r}: expected projects/PROJECT/subscriptions/SUB or "
                     "PROJECT/SUB")


@dataclass
class LandStats:
    """Counts of a lander's run (cumulative over :meth:`Lander.land_once` calls)."""

    pulls: int = 0  # batches gathered (each of one or more pull RPCs)
    messages: int = 0  # messages pulled (redeliveries included)
    landed: int = 0  # reports written to spool files
    duplicates: int = 0  # reports already landed (or twice in one batch): acked, not written
    dead_lettered: int = 0  # poison messages or lines
    files: int = 0  # spool files written
    acked: int = 0
    ack_failures: int = 0
    recovered: int = 0  # pending batches repaired at start-up
    seconds: float = 0.0  # time spent in land_once


def _cut(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _transient() -> tuple:
    from google.api_core import exceptions as gexc  # lazy: optional dependency (the [pubsub] extra)

    return (gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.InternalServerError,
            gexc.Aborted, gexc.ResourceExhausted, gexc.Unknown, gexc.RetryError)


class Lander:
    """Pull from ``subscription``, land into ``spool_dir``, then ack (see the module docstring).

    ``subscriber``: a ``google.cloud.pubsub_v1.SubscriberClient`` (default: made here; honours
    ``PUBSUB_EMULATOR_HOST``). ``state_dir``: where the landed record, the dead letters and the
    lock live (default ``spool_dir/.lander``, a dot-folder the spool ignores). ``dead_letter``:
    the dead-letter JSONL file (default ``state_dir/deadletter.jsonl``). ``pull_timeout``,
    ``ack_timeout``: bounds of each RPC (a stop waits at most for the pull in flight).
    ``retention_seconds``: forget the ids of batches landed longer ago (None: keep all)."""

    def __init__(self, subscription: str, spool_dir: str, *,
                 report_id_attribute: str = "report_id", timestamp_attribute: str = "ts",
                 report_id_field: str = "report_id", timestamp_field: str = "ts",
                 max_messages: int = 1000, max_message_bytes: int = MAX_LINE_BYTES,
                 pull_timeout: float = 5.0, ack_timeout: float = 10.0,
                 gather_seconds: float = 1.0, gather_timeout: float = 0.25,
                 max_batch_bytes: int = 8 << 20,
                 error_budget: float = 60.0, idle_wait: float = 0.2,
                 subscriber: Any = None, state_dir: str | None = None,
                 dead_letter: str | None = None, retention_seconds: float | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self.subscription = subscription_path(subscription)
        for name, v in (("max_messages", max_messages), ("max_message_bytes", max_message_bytes),
                        ("max_batch_bytes", max_batch_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} = {v!r}: expected an integer >= 1")
        for name, v in (("pull_timeout", pull_timeout), ("ack_timeout", ack_timeout),
                        ("error_budget", error_budget), ("gather_seconds", gather_seconds),
                        ("gather_timeout", gather_timeout)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{name} = {v!r}: expected seconds > 0")
        for name, v in (("report_id_attribute", report_id_attribute),
                        ("timestamp_attribute", timestamp_attribute),
                        ("report_id_field", report_id_field), ("timestamp_field", timestamp_field)):
            if not isinstance(v, str) or not v:
                raise ValueError(f"{name} = {v!r}: expected a non-empty name")
        self.spool_dir = os.path.abspath(spool_dir)
        self.id_attr, self.ts_attr = report_id_attribute, timestamp_attribute
        self.id_field, self.ts_field = report_id_field, timestamp_field
        self.max_messages = max_messages
        self.max_message_bytes = max_message_bytes
        self.pull_timeout, self.ack_timeout = float(pull_timeout), float(ack_timeout)
        self.gather_seconds, self.gather_timeout = float(gather_seconds), float(gather_timeout)
        self.max_batch_bytes = max_batch_bytes
        self.error_budget = float(error_budget)
        self.idle_wait = float(idle_wait)
        self.retention_seconds = retention_seconds
        self.state_dir = os.path.abspath(state_dir or os.path.join(self.spool_dir, LANDER_DIR))
        self.dead_letter_path = os.path.abspath(dead_letter or os.path.join(self.state_dir,
                                                                            "deadletter.jsonl"))
        self.db_path = os.path.join(self.state_dir, "landed.sqlite")
        self.say = say or (lambda msg: None)
        self.stats = LandStats()
        self._subscriber = subscriber
        self._own_subscriber = subscriber is None
        self._stop = threading.Event()
        self._db: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._pending: int | None = None  # the batch whose pending mark is still set
        self._crash = os.environ.get(CRASH_ENV) or None
        if self._crash is not None and self._crash not in CRASH_POINTS:
            raise ValueError(f"{CRASH_ENV}={self._crash!r}: expected one of {CRASH_POINTS}")
        self._last_prune = 0.0

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> "Lander":
        """Create the folders, take the lock, open the landed record and repair a batch a
        crash left between its commit and its rename (see the module docstring)."""
        if self._db is not None:
            return self
        os.makedirs(self.spool_dir, exist_ok=True)
        os.makedirs(self.state_dir, exist_ok=True)
        fd = os.open(os.path.join(self.state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LanderError(f"another lander is landing into {self.spool_dir} (it holds "
                              f"{os.path.join(self.state_dir, 'lock')})") from None
        self._lock_fd = fd
        # used by one thread at a time (a caller may open here and land in a thread)
        db = sqlite3.connect(self.db_path, isolation_level=None, timeout=30,
                             check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE IF NOT EXISTS landed (report_id TEXT PRIMARY KEY, digest BLOB "
                   "NOT NULL, batch INTEGER NOT NULL) WITHOUT ROWID")
        db.execute("CREATE TABLE IF NOT EXISTS batches (batch INTEGER PRIMARY KEY, file TEXT "
                   "NOT NULL, landed_at REAL NOT NULL, reports INTEGER NOT NULL, pending "
                   "INTEGER NOT NULL)")
        self._db = db
        _fsync_dir(self.state_dir)
        self._recover()
        return self

    def close(self) -> None:
        """Clear the last pending mark, close the record, release the lock and the client."""
        if self._db is not None:
            if self._pending is not None:
                self._db.execute("UPDATE batches SET pending = 0 WHERE batch = ?",
                                 (self._pending,))
                self._pending = None
            self._db.close()
            self._db = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._own_subscriber and self._subscriber is not None:  # a SubscriberClient
            self._subscriber.close()
            self._subscriber = None

    def __enter__(self) -> "Lander":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stop(self) -> None:
        """Stop :meth:`run` after the batch in hand (landed and acked); a pull in flight ends
        within ``pull_timeout``."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _client(self) -> Any:
        if self._subscriber is None:
            try:
                from google.cloud import pubsub_v1  # lazy: optional dependency (the [pubsub] extra)
            except ImportError as exc:
                raise LanderError(f"--subscription {self.subscription}: reading Pub/Sub needs "
                                  "the Pub/Sub client: pip install 'ldp-beam[pubsub]'") from exc
            try:
                self._subscriber = pubsub_v1.SubscriberClient()
            except Exception as exc:  # google.auth's DefaultCredentialsError, a bad endpoint
                raise LanderError(
                    f"--subscription {self.subscription}: cannot open a Pub/Sub client "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0]}); set "
                    "PUBSUB_EMULATOR_HOST=HOST:PORT for an emulator, or Google's Application "
                    "Default Credentials for Pub/Sub") from None
        return self._subscriber

    # ------------------------------------------------------------------ recovery
    def _landed_somewhere(self, name: str) -> bool:
        return any(os.path.lexists(os.path.join(self.spool_dir, sub, name))
                   for sub in SPOOL_SUBDIRS)

    def _recover(self) -> None:
        db = self._db
        for batch, name in db.execute("SELECT batch, file FROM batches WHERE pending = 1 "
                                      "ORDER BY batch").fetchall():
            temp = os.path.join(self.spool_dir, TEMP_PREFIX + name)
            if self._landed_somewhere(name):
                what = "already in the spool"
            elif os.path.exists(temp):
                os.rename(temp, os.path.join(self.spool_dir, name))
                _fsync_dir(self.spool_dir)
                what = "renamed into the spool"
            else:
                db.execute("BEGIN IMMEDIATE")
                db.execute("DELETE FROM landed WHERE batch = ?", (batch,))
                db.execute("DELETE FROM batches WHERE batch = ?", (batch,))
                db.execute("COMMIT")
                self.say(f"lander: batch {batch} ({name}) was recorded but its file is gone; "
                         "its ids are forgotten (its messages were never acknowledged and will "
                         "be delivered again)")
                self.stats.recovered += 1
                continue
            db.execute("UPDATE batches SET pending = 0 WHERE batch = ?", (batch,))
            self.say(f"lander: repaired batch {batch} left by a crash: {name} {what}")
            self.stats.recovered += 1
        known = {name for (name,) in db.execute("SELECT file FROM batches WHERE pending = 1")}
        for entry in os.listdir(self.spool_dir):  # temporary files of batches never recorded
            if entry.startswith(TEMP_PREFIX) and entry[len(TEMP_PREFIX):] not in known:
                os.unlink(os.path.join(self.spool_dir, entry))

    # ------------------------------------------------------------------ RPCs
    def _rpc(self, what: str, call: Callable[[], Any]) -> Any:
        """Run an RPC, retrying transient errors with backoff for at most ``error_budget``
        seconds (and not past a stop); raises LanderError when the budget is spent."""
        transient = _transient()
        give_up = time.monotonic() + self.error_budget
        pause = 0.1
        while True:
            try:
                return call()
            except transient as exc:
                if time.monotonic() + pause > give_up:
                    raise LanderError(f"{what} on {self.subscription} kept failing for "
                                      f"{self.error_budget:g} s: {type(exc).__name__}: {exc}") \
                        from exc
                self.say(f"lander: {what} failed ({type(exc).__name__}); retrying")
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _pull(self, max_messages: int, timeout: float) -> list:
        from google.api_core import exceptions as gexc  # lazy: optional (the [pubsub] extra)

        client = self._client()
        request = {"subscription": self.subscription, "max_messages": max_messages}
        try:
            resp = client.pull(request=request, timeout=timeout, retry=None)
        except gexc.DeadlineExceeded:  # nothing arrived within the timeout
            return []
        except _transient() as exc:
            if self.stopping:
                return []
            self.say(f"lander: pull failed ({type(exc).__name__}); retrying")
            resp = self._rpc("pull", lambda: client.pull(request=request, timeout=timeout,
                                                         retry=None))
        return _raw(resp)

    def _gather(self) -> list:
        """One batch: a pull (at most ``pull_timeout``), then, while messages keep coming,
        more pulls (each at most ``gather_timeout``) until ``max_messages`` or
        ``gather_seconds`` or ``max_batch_bytes`` of data: a broker that hands out few
        messages per pull (the emulator: 100) still lands them in one file and one commit."""
        received = self._pull(self.max_messages, self.pull_timeout)
        self.caught_up = not received  # whether a pull came back empty: the backlog is landed
        if not received:
            return received
        give_up = time.monotonic() + self.gather_seconds
        size = sum(len(rm.message.data) for rm in received)
        while len(received) < self.max_messages and size < self.max_batch_bytes and \
                time.monotonic() < give_up and not self.stopping:
            more = self._pull(self.max_messages - len(received), self.gather_timeout)
            if not more:
                self.caught_up = True
                break
            received.extend(more)
            size += sum(len(rm.message.data) for rm in more)
        return received

    def _ack(self, ack_ids: list[str]) -> None:
        client = self._client()
        for lo in range(0, len(ack_ids), ACK_CHUNK):
            part = ack_ids[lo:lo + ACK_CHUNK]
            try:
                self._rpc("acknowledge", lambda: client.acknowledge(
                    request={"subscription": self.subscription, "ack_ids": part},
                    timeout=self.ack_timeout, retry=None))
                self.stats.acked += len(part)
            except LanderError as exc:  # they come back and are dropped as duplicates
                self.stats.ack_failures += len(part)
                self.say(f"lander: {len(part)} acknowledgment(s) failed ({exc}); those messages "
                         "will be delivered again and counted as duplicates")

    # ------------------------------------------------------------------ parsing
    def _dead(self, out: list, reason: str, msg: Any, line: int | None = None,
              raw: bytes | None = None) -> None:
        data = msg.data if raw is None else raw
        out.append({"stage": "land", "reason": reason, "subscription": self.subscription,
                    "message_id": msg.message_id,
                    "publish_time": _publish_time(msg),
                    "attributes": {_cut(k): _cut(v) for k, v in msg.attributes.items()},
                    "line": line, "size": len(data),
                    "data": data[:1000].decode("utf-8", "replace"),
                    "landed_at": _now_iso()})

    def _parse(self, msg: Any, dead: list) -> list[tuple[str, bytes]]:
        """One message -> ``[(report id, spool line)]`` (records with the id and the ISO event
        time set; a line that already has both, as the client sends them, is kept byte for
        byte), its poison lines dead-lettered."""
        data = msg.data
        if len(data) > self.max_message_bytes:
            self._dead(dead, f"message of {len(data):,} bytes is larger than the limit of "
                       f"{self.max_message_bytes:,}", msg)
            return []
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._dead(dead, f"data is not UTF-8 text ({exc.reason} at byte {exc.start})", msg)
            return []
        lines = [(i + 1, ln) for i, ln in enumerate(text.split("\n")) if ln.strip()]
        if not lines:
            self._dead(dead, "empty message: no report", msg)
            return []
        attrs = msg.attributes
        single = len(lines) == 1
        out = []
        for number, line in lines:
            line = line.strip()
            raw = line.encode()
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                self._dead(dead, f"corrupt JSON: {exc.msg} (column {exc.colno})", msg, number, raw)
                continue
            if not isinstance(rec, dict):
                self._dead(dead, f"a JSON {type(rec).__name__}, not an object (one report per "
                           "line)", msg, number, raw)
                continue
            rid = rec.get(self.id_field)
            as_is = isinstance(rid, str)
            if rid is None and single:
                rid = attrs.get(self.id_attr)
            if rid is None:
                self._dead(dead, f"no report id: neither a {self.id_field!r} field" + (
                    f" nor a {self.id_attr!r} attribute" if single else
                    " (a message of several lines needs one on every line)"), msg, number, raw)
                continue
            if isinstance(rid, int) and not isinstance(rid, bool):
                rid = str(rid)
            if not isinstance(rid, str) or not rid or len(rid) > MAX_ID_CHARS or \
                    not rid.isprintable():
                self._dead(dead, f"invalid report id {_cut(repr(rid), 80)}: expected printable "
                           f"text of 1 to {MAX_ID_CHARS} characters", msg, number, raw)
                continue
            ts = rec.get(self.ts_field)
            as_is = as_is and _canonical(ts)
            where = f"field {self.ts_field!r}"
            if ts is None and single:
                ts, where = attrs.get(self.ts_attr), f"attribute {self.ts_attr!r}"
            if ts is None:
                self._dead(dead, f"no event time: neither a {self.ts_field!r} field" + (
                    f" nor a {self.ts_attr!r} attribute" if single else
                    " (a message of several lines needs one on every line)"), msg, number, raw)
                continue
            try:
                t_us = event_micros(ts, where)
            except ValueError as exc:
                self._dead(dead, str(exc), msg, number, raw)
                continue
            if not as_is:
                rec[self.id_field] = rid
                rec[self.ts_field] = ts if _canonical(ts) else iso_micros(t_us)
                raw = _dumps(rec).encode()
            out.append((rid, raw))
        return out

    # ------------------------------------------------------------------ one batch
    def _crash_at(self, point: str) -> None:
        if self._crash == point:  # a test's kill -9 at this exact point (module docstring)
            os.kill(os.getpid(), signal.SIGKILL)

    def _known(self, ids: list[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for lo in range(0, len(ids), 500):
            part = ids[lo:lo + 500]
            q = "SELECT report_id, digest FROM landed WHERE report_id IN (%s)" % \
                ",".join("?" * len(part))
            found.update(self._db.execute(q, part).fetchall())
        return found

    def land_once(self) -> int:
        """Pull one batch, land it, acknowledge it; returns the number of messages pulled."""
        if self._db is None:
            self.open()
        t0 = time.perf_counter()
        received = self._gather()
        self.stats.pulls += 1
        if not received:
            self.stats.seconds += time.perf_counter() - t0
            return 0
        dead: list[dict] = []
        new: list[tuple[str, bytes, bytes]] = []  # (id, line, digest)
        parsed = [p for rm in received for p in self._parse(rm.message, dead)]
        known = self._known(list({rid for rid, _ in parsed}))
        seen: dict[str, bytes] = {}  # id -> digest of the line landed in this batch
        for rid, line in parsed:
            digest = hashlib.sha256(line).digest()[:16]
            prior = known.get(rid, seen.get(rid))
            if prior is not None:
                if prior != digest:
                    dead.append({"stage": "land", "reason": "report id already landed with a "
                                 "different report (a device reused an id): not landed",
                                 "subscription": self.subscription, "report_id": rid,
                                 "landed_at": _now_iso()})
                else:
                    self.stats.duplicates += 1
                continue
            seen[rid] = digest
            new.append((rid, line, digest))
        if new:
            self._land(new)
        if dead:
            with open(self.dead_letter_path, "ab") as fh:
                fh.write(b"".join(dumps(d, sort_keys=False, ensure_ascii=False).encode() + b"\n"
                                  for d in dead))
                fh.flush()
                os.fsync(fh.fileno())
            self.stats.dead_lettered += len(dead)
        self._ack([rm.ack_id for rm in received])
        self.stats.messages += len(received)
        self.stats.seconds += time.perf_counter() - t0
        if self.retention_seconds is not None and time.time() - self._last_prune > 3600:
            self.prune()
        return len(received)

    def _land(self, new: list[tuple[str, bytes, bytes]]) -> None:
        db = self._db
        now = time.time()
        batch = (db.execute("SELECT COALESCE(MAX(batch), 0) FROM batches").fetchone()[0]) + 1
        stamp = datetime.fromtimestamp(now, tz=timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        name = f"{stamp}-{batch:010d}{SUFFIX}"
        temp = os.path.join(self.spool_dir, TEMP_PREFIX + name)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            data = memoryview(b"".join(line + b"\n" for _, line, _ in new))
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        self._crash_at("before-commit")
        db.execute("BEGIN IMMEDIATE")
        try:
            if self._pending is not None:
                db.execute("UPDATE batches SET pending = 0 WHERE batch = ?", (self._pending,))
            db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, 1)", (batch, name, now, len(new)))
            db.executemany("INSERT INTO landed VALUES (?, ?, ?)",
                           ((rid, digest, batch) for rid, _, digest in new))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            os.unlink(temp)
            raise
        self._pending = batch
        self._crash_at("after-commit")
        os.rename(temp, os.path.join(self.spool_dir, name))
        _fsync_dir(self.spool_dir)
        self._crash_at("after-rename")
        self.stats.landed += len(new)
        self.stats.files += 1

    # ------------------------------------------------------------------ loops
    def run(self, duration: float | None = None, *, idle_seconds: float | None = None,
            stop_when: Callable[["Lander"], bool] | None = None) -> LandStats:
        """Land batches until :meth:`stop`, ``duration`` seconds, ``idle_seconds`` without a
        message, or ``stop_when(self)`` is true (checked after each batch); returns the
        stats. Each stop takes effect after the batch in hand is landed and acknowledged."""
        self.open()
        start = time.monotonic()
        last = start
        while not self.stopping:
            now = time.monotonic()
            if duration is not None and now - start >= duration:
                break
            n = self.land_once()
            now = time.monotonic()
            if n:
                last = now
            if stop_when is not None and stop_when(self):
                break
            if idle_seconds is not None and not n and now - last >= idle_seconds:
                break
            if not n:
                self._stop.wait(self.idle_wait)
        return self.stats

    def prune(self) -> int:
        """Forget the ids of batches landed more than ``retention_seconds`` ago (see Limits);
        returns how many ids were forgotten."""
        self._last_prune = time.time()
        if self.retention_seconds is None or self._db is None:
            return 0
        cutoff = time.time() - self.retention_seconds
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        old = db.execute("SELECT MAX(batch) FROM batches WHERE landed_at < ? AND pending = 0",
                         (cutoff,)).fetchone()[0]
        n = 0
        if old is not None:
            n = db.execute("DELETE FROM landed WHERE batch <= ?", (old,)).rowcount
        db.execute("COMMIT")
        return n

    def landed_ids(self) -> set[str]:
        """Every report id in the landed record (for tests and audits)."""
        self.open()
        return {r for (r,) in self._db.execute("SELECT report_id FROM landed")}


# a record re-encoded as it came: its field order, its text, a NaN json.loads accepted
_dumps = encoder(compact=True, sort_keys=False, ensure_ascii=False)


def _raw(resp: Any) -> list:
    """The received messages of a pull response as plain protobuf messages: proto-plus's
    wrappers cost ~5x more per field read than the fields themselves."""
    pb = getattr(type(resp), "pb", None)
    return list((pb(resp) if callable(pb) else resp).received_messages)


def _canonical(ts: Any) -> bool:
    """Already ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (what the client sends): kept as it is."""
    return isinstance(ts, str) and len(ts) == 27 and ts[4] == "-" and ts[10] == "T" and \
        ts[19] == "." and ts[26] == "Z"


def _now_iso() -> str:
    return iso_micros(time.time_ns() // 1000)


def _publish_time(msg: Any) -> str | None:
    pt = getattr(msg, "publish_time", None)
    if pt is None:
        return None
    if hasattr(pt, "ToJsonString"):  # a protobuf Timestamp
        return pt.ToJsonString()
    try:
        return pt.isoformat().replace("+00:00", "Z")
    except AttributeError:
        return str(pt)


# --------------------------------------------------------------------------- a plain client
def drain_plain(subscription: str, *, expected: int, max_messages: int = 1000,
                timeout: float = 60.0, subscriber: Any = None) -> tuple[int, float]:
    """The broker's own rate, for comparison: pull and ack (no parsing, no disk) until
    ``expected`` messages were received or ``timeout``; returns ``(messages, seconds)``."""
    # lazy: optional dependency (the [pubsub] extra)
    from google.api_core import exceptions as gexc
    from google.cloud import pubsub_v1

    client = subscriber or pubsub_v1.SubscriberClient()
    path = subscription_path(subscription)
    got, t0 = 0, time.perf_counter()
    give_up = time.monotonic() + timeout
    while got < expected and time.monotonic() < give_up:
        try:
            resp = client.pull(request={"subscription": path, "max_messages": max_messages},
                               timeout=5.0, retry=None)
        except gexc.DeadlineExceeded:
            continue
        ids = [m.ack_id for m in _raw(resp)]
        if not ids:
            continue
        for lo in range(0, len(ids), ACK_CHUNK):
            client.acknowledge(request={"subscription": path, "ack_ids": ids[lo:lo + ACK_CHUNK]},
                               timeout=10.0, retry=None)
        got += len(ids)
    seconds = time.perf_counter() - t0
    if subscriber is None:
        client.close()
    return got, seconds


# --------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ldp_beam.transforms.pubsub_lander",
                                 description="Land Pub/Sub messages into a spool directory "
                                 "(durably, then ack; deduplicated by report id).")
    ap.add_argument("--subscription", required=True, help="projects/P/subscriptions/S")
    ap.add_argument("--spool", required=True, help="the spool directory to land into")
    ap.add_argument("--duration", type=float, help="stop after this many seconds")
    ap.add_argument("--idle", type=float, help="stop after this many seconds without a message")
    ap.add_argument("--max-messages", type=int, default=1000)
    ap.add_argument("--report-id-attribute", default="report_id")
    ap.add_argument("--timestamp-attribute", default="ts")
    ap.add_argument("--quiet", "-q", action="store_true")
    a = ap.parse_args(argv)
    say = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        lander = Lander(a.subscription, a.spool, max_messages=a.max_messages,
                        report_id_attribute=a.report_id_attribute,
                        timestamp_attribute=a.timestamp_attribute, say=say)
    except ValueError as exc:
        print(f"pubsub_lander: error: {exc}", file=sys.stderr)
        return 2
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: lander.stop())
    try:
        with lander:
            stats = lander.run(a.duration, idle_seconds=a.idle)
    except LanderError as exc:
        print(f"pubsub_lander: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
