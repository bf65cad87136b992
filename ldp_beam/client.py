"""The device side of live telemetry: perturb on the device, publish reports to Pub/Sub.

A :class:`Reporter` holds one LDP mechanism (built from a registered name and parameters, a reports
schema's metadata as ``collect`` writes it, or an instance) and turns a device's true values into
reports *on the device*: only the mechanism's report fields (and, if asked, a memo slot id and the
device id as a privacy unit) are published, never the values themselves. A central-DP family is
refused: its "reports" are the raw values bucketed, which must not leave a trusted curator.

**Wire format.** A Pub/Sub message's data is UTF-8 JSON lines, one report per line::

    {"v": 3, "report_id": "9f2c...e1", "ts": "2026-01-27T01:43:23.123456Z"}

(the report fields of the mechanism, ``report_id``, ``ts``; ``memo_id`` when memoizing; the
unit field when ``unit_field`` is set). With ``reports_per_message=1`` (the default) each
message holds one report and carries its ``report_id`` and ``ts`` as attributes too, which is
what Beam's ``ReadFromPubSub(id_label="report_id", timestamp_attribute="ts")`` reads on
Dataflow. With ``reports_per_message=N > 1`` a message holds up to N lines (fewer if they would
exceed ~900 KB): every line carries its own ``report_id`` and ``ts``; the message's attributes
are ``report_id`` = a digest of its lines' ids (so a re-published message has the same id),
``ts`` = the earliest event time of its lines and ``reports`` = the line count. The collector
(:class:`ldp_beam.transforms.pubsub_lander.Lander`) reads both forms; batching is the fast
form (far fewer messages per report), one report per message the form Beam's own Pub/Sub
source can window without a flattening step.

**Event times** travel as RFC 3339 UTC text with microseconds (``...Z``): what the spool's
``event_micros`` and Beam's ``timestamp_attribute`` both accept.

**Report ids.** Report number ``seq`` of device ``D`` has id ``sha256("D:seq")`` in hex (with
``id_key``: the keyed 256-bit BLAKE2b of :func:`ldp_beam.prf.keyed_digest` under a sub-key of it, so
that whoever knows a device id cannot recognise its reports by enumerating sequence numbers). The id
never depends on the value. Sequence numbers come from :class:`SequenceStore`: with ``seq_store`` (a
directory on the device) they are reserved durably in blocks before use, so a restarted device never
reuses one (it skips the unused rest of a block); without it they start at a random 63-bit number
each process (unique with overwhelming probability, but nothing survives a restart).

**Retries reuse ids and reports.** Each publish batch (``batch_size`` reports) is perturbed
once, encoded once, and — with ``seq_store`` — written to ``seq_store/outbox/`` (fsynced)
before it is published; it is removed once the broker has accepted every message of it. A batch
that fails (an RPC error, a timeout, a crash of the device) stays there and is published again,
byte for byte, by the next :meth:`Reporter.flush` (also after a restart): the same report ids,
which the collector counts once, and the same noise, so a retry spends no privacy (a fresh
randomization of the same value would). Delivery from the device is therefore at least once.

**Memoization** (``memoize``): RAPPOR's permanent randomized response
(:class:`ldp_beam.longitudinal.Memoized`) with the device id as the unit: a repeated value sends
the same report and its ``memo_id``, which ``ldp-beam stream --privacy-unit FIELD --memo-field``
charges once. ``memoize=True`` keeps a 32-byte device secret in ``seq_store/secret`` (created
once, mode 0600); bytes give the secret directly. The secret never leaves the device.

This module imports neither Apache Beam nor, until it publishes, the Google Cloud client.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Mapping, Sequence

import numpy as np

from . import registry
from .core import CentralRelease, Mechanism
from .errors import InvalidRecordsError, ParameterError
from .jsonio import encoder
from .longitudinal import Memoized
from .prf import derive_key, keyed_digest
from .rng import RandomSource

#: the key of the mechanism metadata in a reports schema (``ldp_beam.transforms.batches``
#: writes it; repeated here so that the client does not import the Beam layer)
SCHEMA_KEY = b"ldp_beam"
REPORT_ID, TS, REPORTS, MEMO_ID = "report_id", "ts", "reports", "memo_id"
MAX_MESSAGE_BYTES = 900_000  # a batched message's data, at most (Pub/Sub's limit is 10 MB, the
# collector's 1 MiB: a message larger than that is dead-lettered there)
SEQ_BLOCK = 1 << 16  # sequence numbers reserved per durable write (a restart skips the rest)
_TOPIC = re.compile(r"^projects/([^/]+)/topics/([^/]+)$")
_ENCODE = encoder(compact=True, sort_keys=False)  # NaN: _json_value refuses it first


class PublishError(RuntimeError):
    """A batch could not be published; it is kept (in the outbox with ``seq_store``) and sent
    again, with the same ids and reports, by the next :meth:`Reporter.flush`."""


def topic_path(topic: str) -> str:
    """``projects/P/topics/T`` (or ``P/T``) -> ``projects/P/topics/T``; ValueError otherwise."""
    if not isinstance(topic, str) or not topic:
        raise ParameterError("topic", topic, "projects/PROJECT/topics/TOPIC")
    if _TOPIC.match(topic):
        return topic
    parts = topic.split("/")
    if len(parts) == 2 and all(parts):
        return f"projects/{parts[0]}/topics/{parts[1]}"
    raise ParameterError("topic", topic, "projects/PROJECT/topics/TOPIC")


# --------------------------------------------------------------------------- event times
_MIN = datetime(1, 1, 2, tzinfo=timezone.utc).timestamp()
_MAX = datetime(9999, 12, 30, tzinfo=timezone.utc).timestamp()


def event_seconds(value: Any) -> float:
    """An event time as epoch seconds: a number (epoch seconds), numeric text, ISO 8601 / RFC
    3339 text (a naive time is UTC), a ``datetime`` (naive = UTC) or a numpy datetime64."""
    if isinstance(value, bool) or value is None:
        raise ParameterError("event_time", value, "epoch seconds, ISO 8601 text or a datetime")
    if isinstance(value, np.datetime64):
        value = value.astype("datetime64[us]").astype(np.int64).item() / 1e6
    if isinstance(value, datetime):
        sec = (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    elif isinstance(value, (int, float, np.integer, np.floating)):
        sec = float(value)
    elif isinstance(value, str):
        try:
            sec = float(value)
        except ValueError:
            try:
                dt = datetime.fromisoformat(value.strip())
            except ValueError:
                raise ParameterError("event_time", value, "epoch seconds or ISO 8601 text") \
                    from None
            sec = (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    else:
        raise ParameterError("event_time", type(value).__name__,
                             "epoch seconds, ISO 8601 text or a datetime")
    if not (math.isfinite(sec) and _MIN <= sec <= _MAX):
        raise ParameterError("event_time", value, "a time between the years 1 and 9999")
    return sec


def rfc3339(seconds: float) -> str:
    """Epoch seconds -> RFC 3339 UTC text with microseconds, ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    return iso_micros(int(round(seconds * 1_000_000)))


def rfc3339_many(seconds: np.ndarray) -> list[str]:
    """:func:`rfc3339` of many times at once (numpy's datetime64 formatting)."""
    us = np.round(np.asarray(seconds, dtype=float) * 1_000_000).astype(np.int64)
    return [t + "Z" for t in np.datetime_as_string(us.astype("datetime64[us]"), unit="us").tolist()]


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def iso_micros(us: int) -> str:
    """Epoch microseconds -> ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, exactly (integer arithmetic)."""
    dt = _EPOCH + timedelta(seconds=us // 1_000_000)
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:" \
        f"{dt.second:02d}.{us % 1_000_000:06d}Z"


# --------------------------------------------------------------------------- durable files
def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically and durably: a temporary dot-name in the same
    folder, fsynced, renamed over ``path``, the folder fsynced."""
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(folder)


class SequenceStore:
    """Per-device report sequence numbers. With ``path`` (a file), numbers are reserved
    ``block`` at a time by durably recording the next unreserved number before any of a block
    is used: a restart continues after the last block reserved, so no number is ever handed out
    twice (the unused rest of a block is skipped). Without ``path``, numbers start at a random
    63-bit value: unique with overwhelming probability, not stable across restarts."""

    def __init__(self, path: str | None = None, block: int = SEQ_BLOCK) -> None:
        if not (isinstance(block, int) and block >= 1):
            raise ParameterError("block", block, "an integer >= 1")
        self.path, self.block = path, block
        self._lock = threading.Lock()
        self._next = secrets.randbits(63) if path is None else self._read()
        self._reserved = None if path is None else self._next

    def _read(self) -> int:
        try:
            with open(self.path) as fh:
                text = fh.read().strip()
        except FileNotFoundError:
            return 0
        try:
            value = int(text)
        except ValueError:
            raise ParameterError("seq_store", self.path, "a sequence file holding one integer "
                                 f"(it holds {text[:40]!r}): refusing to guess, which could "
                                 "reuse report ids") from None
        if value < 0:
            raise ParameterError("seq_store", self.path, "a non-negative sequence number")
        return value

    def take(self, n: int) -> int:
        """Reserve ``n`` consecutive numbers; returns the first."""
        with self._lock:
            first = self._next
            end = first + n
            if self._reserved is not None and end > self._reserved:
                reserve = end + self.block
                write_durably(self.path, f"{reserve}\n".encode())
                self._reserved = reserve
            self._next = end
            return first


# --------------------------------------------------------------------------- the mechanism
def mechanism_from(spec: Any, params: Mapping[str, Any] | None = None,
                   allow_no_guarantee: bool = False) -> Mechanism:
    """A Mechanism from an instance, a registered name (with ``params``), a reports schema's
    metadata (a dict with ``mechanism`` and ``params``), a pyarrow Schema carrying it, or the path
    of a reports Parquet file written by ``collect``."""
    if isinstance(spec, Mechanism):
        if params:
            raise ParameterError("params", dict(params), "no parameters with a mechanism "
                                 "instance (they are its own)")
        return spec
    meta = None
    if isinstance(spec, str) and (spec.endswith(".parquet") or os.path.sep in spec) \
            and os.path.exists(spec):
        # lazy: pyarrow.parquet costs 0.11 s at import (measured, after this module's imports);
        # the device client loads no pyarrow, and only a reports file's path needs it
        import pyarrow.parquet as pq

        spec = pq.read_schema(spec)
    if hasattr(spec, "metadata") and not isinstance(spec, Mapping):  # a pyarrow Schema
        raw = (spec.metadata or {}).get(SCHEMA_KEY)
        if not raw:
            raise ParameterError("mechanism_or_schema", "a schema without ldp-beam metadata",
                                 "a reports schema written by collect, or a mechanism name")
        meta = json.loads(raw)
    elif isinstance(spec, Mapping):
        meta = dict(spec)
    if meta is not None:
        if "mechanism" not in meta:
            raise ParameterError("mechanism_or_schema", sorted(meta), "metadata with "
                                 "'mechanism' and 'params'")
        merged = dict(meta.get("params") or {})
        merged.update(params or {})
        return registry.get_registry().build(meta["mechanism"], merged,
                                             allow_no_guarantee=allow_no_guarantee)
    if isinstance(spec, str):
        return registry.get_registry().build(spec, dict(params or {}),
                                             allow_no_guarantee=allow_no_guarantee)
    raise ParameterError("mechanism_or_schema", type(spec).__name__,
                         "a Mechanism, a registered name, a reports schema or its metadata")


def _take(column: Any, rows: np.ndarray) -> np.ndarray:
    arr = column if isinstance(column, np.ndarray) else np.asarray(list(column), dtype=object)
    return arr[rows]


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"a report value {v!r} is not finite: not sent")
    return v


@dataclass
class Receipt:
    """What :meth:`Reporter.report_many` did: ``ids`` (one per input row, None for an invalid
    row when skipped), ``invalid`` (row -> reason), ``published`` (reports the broker accepted
    in this call, retried batches included)."""

    ids: list = field(default_factory=list)
    invalid: dict = field(default_factory=dict)
    published: int = 0


@dataclass
class _Batch:
    name: str
    messages: list  # [(data bytes, attributes dict)]
    n_reports: int


class Reporter:
    """Perturb values on the device and publish the reports (see the module docstring).

    ``mechanism_or_schema``: a Mechanism, a registered name (with ``params``), a reports schema
    or its metadata (:func:`mechanism_from`). ``device_id``: this device's stable id (a non-empty
    string; it enters the report ids, and is sent only as the ``unit_field`` when that is set).
    ``topic``: ``projects/P/topics/T``. ``publisher``: a :class:`BatchPublisher` (the default,
    made on first use; honours ``PUBSUB_EMULATOR_HOST``), anything with its
    ``publish_batch(topic, [(data, attributes)], timeout)``, or anything with Pub/Sub's
    ``PublisherClient.publish(topic, data, **attributes) -> future``. ``batch_size``: reports
    per publish batch (perturbed, stored and retried together). ``reports_per_message``:
    reports per Pub/Sub message (1: attributes per report). ``memoize``: None, True (secret
    kept in ``seq_store``) or the device secret (bytes).
    ``seq_store``: the device's state directory (``seq``: the sequence counter; ``outbox/``:
    batches not yet accepted by the broker; ``secret``: the memoization secret). ``timeout``: the
    longest a batch's publish is waited for. Thread-safe (one lock)."""

    def __init__(self, mechanism_or_schema: Any, *, device_id: str, topic: str | None = None,
                 publisher: Any = None, batch_size: int = 1000, memoize: Any = None,
                 seq_store: str | None = None, params: Mapping[str, Any] | None = None,
                 reports_per_message: int = 1, unit_field: str | None = None,
                 id_key: bytes | None = None, allow_no_guarantee: bool = False,
                 timeout: float = 60.0) -> None:
        mech = mechanism_from(mechanism_or_schema, params, allow_no_guarantee)
        if isinstance(mech, CentralRelease):
            raise ParameterError("mechanism", mech.name, "an LDP mechanism: a central-DP "
                                 "family's reports are the raw values bucketed, which must not "
                                 "leave a trusted curator")
        if mech.draws < 1:
            raise ParameterError("mechanism", mech.name, "a mechanism that randomizes (draws "
                                 "noise) on the device")
        if not isinstance(device_id, str) or not device_id or "\n" in device_id:
            raise ParameterError("device_id", device_id, "a non-empty one-line string")
        for name, v in (("batch_size", batch_size), ("reports_per_message", reports_per_message)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParameterError(name, v, "an integer >= 1")
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ParameterError("timeout", timeout, "seconds > 0")
        reserved = {REPORT_ID, TS, MEMO_ID} | {f for f, _ in mech.report_fields}
        if unit_field is not None and (not isinstance(unit_field, str) or not unit_field
                                       or unit_field in reserved):
            raise ParameterError("unit_field", unit_field,
                                 f"a field name not among {sorted(reserved)}")
        if id_key is not None and (not isinstance(id_key, (bytes, bytearray)) or len(id_key) < 16):
            raise ParameterError("id_key", "<key>", "at least 16 bytes")
        self.mechanism = mech
        self.device_id = device_id
        self.topic = None if topic is None else topic_path(topic)
        self.batch_size = batch_size
        self.reports_per_message = reports_per_message
        self.unit_field = unit_field
        self.timeout = float(timeout)
        self._id_key = None if id_key is None else derive_key(bytes(id_key), "report-id")
        self._publisher = publisher
        self._own_publisher = publisher is None
        self._lock = threading.RLock()
        self._buffer: list[tuple[Any, float]] = []
        self._unsent: list[_Batch] = []  # batches not yet accepted (in memory, no seq_store)
        self.published = 0  # reports the broker accepted (retries included)
        self.state_dir = None if seq_store is None else os.path.abspath(seq_store)
        if self.state_dir is not None:
            os.makedirs(os.path.join(self.state_dir, "outbox"), exist_ok=True)
        self.seq = SequenceStore(None if self.state_dir is None
                                 else os.path.join(self.state_dir, "seq"))
        self._memo = None if memoize is None or memoize is False else \
            Memoized(mech, self._secret(memoize))
        self._source = RandomSource()  # OS entropy: a device never seeds its noise

    def __repr__(self) -> str:
        return (f"Reporter({self.mechanism.describe()}, device_id={self.device_id!r}, "
                f"topic={self.topic!r})")

    # -- state
    def _secret(self, memoize: Any) -> bytes:
        if isinstance(memoize, (bytes, bytearray)):
            return bytes(memoize)
        if memoize is not True:
            raise ParameterError("memoize", type(memoize).__name__, "None, True or the device "
                                 "secret (bytes)")
        if self.state_dir is None:
            raise ParameterError("memoize", True, "a seq_store directory to keep the device "
                                 "secret in (or the secret itself, as bytes)")
        path = os.path.join(self.state_dir, "secret")
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            secret = os.urandom(32)
            write_durably(path, secret, mode=0o600)
            return secret

    @property
    def guarantee(self):
        """One report's guarantee (memoization noted)."""
        return self._memo.guarantee if self._memo is not None else self.mechanism.guarantee

    def report_id(self, seq: int) -> str:
        """The id of this device's report number ``seq``."""
        text = f"{self.device_id}:{seq}".encode()
        if self._id_key is not None:
            return keyed_digest(self._id_key, text, 32).hex()
        return hashlib.sha256(text).hexdigest()

    def pending(self) -> int:
        """Reports not yet accepted by the broker (buffered, unsent or in the outbox)."""
        with self._lock:
            return len(self._buffer) + sum(b.n_reports for b in self._batches_to_send())

    # -- reporting
    def report(self, value: Any, event_time: Any = None) -> None:
        """Queue one value (its event time: now by default); perturbed and published with the
        others when ``batch_size`` are queued, or by :meth:`flush` / :meth:`close`. An invalid
        value raises :class:`~ldp_beam.errors.InvalidRecordsError` here, before it is queued."""
        sec = time.time() if event_time is None else event_seconds(event_time)
        self._check([value])
        with self._lock:
            self._buffer.append((value, sec))
            if len(self._buffer) >= self.batch_size:
                self.flush()

    def report_many(self, values: Any, event_times: Any = None, *,
                    skip_invalid: bool = False) -> Receipt:
        """Perturb ``values`` (a sequence, or a mapping role -> column for a multi-role
        mechanism) and publish them now, ``batch_size`` at a time, after any earlier queued or
        unsent batches. ``event_times``: one per value, or one for all, or None (now). Invalid
        values raise :class:`~ldp_beam.errors.InvalidRecordsError` before anything is sent,
        unless ``skip_invalid`` (then they are left out and listed in the receipt)."""
        cols = self._columns(values)
        n = len(next(iter(cols.values()))) if cols else 0
        secs = self._times(event_times, n)
        _, reasons = self.mechanism.check(cols)
        invalid = reasons.as_dict()
        if invalid and not skip_invalid:
            raise InvalidRecordsError(invalid, n)
        ok = np.flatnonzero(~reasons.bad)
        receipt = Receipt(ids=[None] * n, invalid=invalid)
        with self._lock:
            before = self.published
            self.flush()
            for lo in range(0, len(ok), self.batch_size):
                rows = ok[lo:lo + self.batch_size]
                batch, ids = self._make_batch({k: _take(c, rows) for k, c in cols.items()},
                                              secs[rows])
                for r, rid in zip(rows.tolist(), ids):
                    receipt.ids[r] = rid
                self._send(batch)
            receipt.published = self.published - before
        return receipt

    def flush(self) -> int:
        """Publish the queued values and every batch not yet accepted (outbox first, in the
        order they were made); returns the reports the broker accepted. Raises
        :class:`PublishError` if a batch fails (it is kept and retried next time)."""
        with self._lock:
            before = self.published
            for batch in self._batches_to_send():
                self._publish(batch)
            if self._buffer:
                values = [v for v, _ in self._buffer]
                secs = np.array([s for _, s in self._buffer], dtype=float)
                batch, _ = self._make_batch(self._columns(values), secs)
                self._buffer = []
                self._send(batch)
            return self.published - before

    def close(self) -> None:
        """Flush, then shut the publisher down if this reporter made it."""
        with self._lock:
            try:
                self.flush()
            finally:
                if self._own_publisher and self._publisher is not None:  # a BatchPublisher
                    self._publisher.stop()
                    self._publisher = None

    def __enter__(self) -> "Reporter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- encoding
    def _columns(self, values: Any) -> dict:
        if isinstance(values, Mapping):
            return dict(values)
        if isinstance(values, np.ndarray):
            arr = values
        else:
            values = list(values)
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                arr = np.asarray(values, dtype=float)
        return {self.mechanism.roles[0].name: arr}

    def _check(self, values: list) -> None:
        _, reasons = self.mechanism.check(self._columns(values))
        if reasons.bad.any():
            raise InvalidRecordsError(reasons.as_dict(), len(values))

    @staticmethod
    def _times(event_times: Any, n: int) -> np.ndarray:
        if event_times is None:
            return np.full(n, time.time())
        if isinstance(event_times, (str, int, float, datetime, np.datetime64)):
            return np.full(n, event_seconds(event_times))
        seq = list(event_times)
        if len(seq) != n:
            raise ParameterError("event_times", f"{len(seq)} times", f"one per value ({n})")
        return np.array([event_seconds(t) for t in seq], dtype=float)

    def _make_batch(self, cols: dict, secs: np.ndarray) -> tuple[_Batch, list[str]]:
        """Perturb one batch, give its reports their ids and encode its messages."""
        n = len(secs)
        if self._memo is not None:
            units = [self.device_id] * n
            reports = self._memo.perturb(cols, units)
            memo_ids = self._memo.memo_ids(cols, units).tolist()
        else:
            reports = self.mechanism.perturb(cols, self._source)
            memo_ids = None
        first = self.seq.take(n)
        ids = [self.report_id(first + i) for i in range(n)]
        names = [f for f, _ in self.mechanism.report_fields]
        columns = [np.asarray(reports[f]).tolist() for f in names]
        stamps = rfc3339_many(secs)
        lines = []
        for i in range(n):
            rec = {f: _json_value(c[i]) for f, c in zip(names, columns)}
            if memo_ids is not None:
                rec[MEMO_ID] = memo_ids[i]
            if self.unit_field is not None:
                rec[self.unit_field] = self.device_id
            rec[REPORT_ID] = ids[i]
            rec[TS] = stamps[i]
            lines.append(_ENCODE(rec).encode())
        messages = []
        if self.reports_per_message == 1:
            messages = [(line, {REPORT_ID: rid, TS: ts})
                        for line, rid, ts in zip(lines, ids, stamps)]
        else:
            start = 0
            while start < n:
                end, size = start, 0
                while end < n and end - start < self.reports_per_message and (
                        end == start or size + len(lines[end]) + 1 <= MAX_MESSAGE_BYTES):
                    size += len(lines[end]) + 1
                    end += 1
                part = ids[start:end]
                digest = hashlib.sha256("\n".join(part).encode()).hexdigest()
                earliest = rfc3339(float(secs[start:end].min()))
                messages.append((b"\n".join(lines[start:end]),
                                 {REPORT_ID: digest, TS: earliest, REPORTS: str(end - start)}))
                start = end
        return _Batch(f"{first:020d}", messages, n), ids

    # -- publishing
    def _outbox(self, name: str = "") -> str:
        return os.path.join(self.state_dir, "outbox", name)

    def _batches_to_send(self) -> list[_Batch]:
        if self.state_dir is None:
            return list(self._unsent)
        out = []
        for name in sorted(os.listdir(self._outbox())):
            if not name.endswith(".json") or name.startswith("."):
                continue
            with open(self._outbox(name), "rb") as fh:
                doc = json.loads(fh.read())
            out.append(_Batch(name[:-5], [(m["data"].encode(), m["attributes"])
                                          for m in doc["messages"]], doc["reports"]))
        return out

    def _send(self, batch: _Batch) -> None:
        if self.state_dir is not None:  # durable before the broker sees any of it
            doc = {"reports": batch.n_reports, "topic": self.topic,
                   "messages": [{"data": d.decode(), "attributes": a} for d, a in batch.messages]}
            write_durably(self._outbox(batch.name + ".json"), json.dumps(doc).encode())
        else:
            self._unsent.append(batch)
        self._publish(batch)

    def _client(self) -> Any:
        if self._publisher is None:
            self._publisher = BatchPublisher()
        return self._publisher

    def _publish(self, batch: _Batch) -> None:
        """Publish every message of ``batch`` and wait (at most ``timeout``) until the broker
        has accepted them all; then forget the batch. Raises PublishError, keeping it."""
        if self.topic is None:
            raise ParameterError("topic", None, "a topic to publish to (projects/P/topics/T)")
        client = self._client()
        deadline = time.monotonic() + self.timeout
        try:
            if hasattr(client, "publish_batch"):
                client.publish_batch(self.topic, batch.messages, timeout=self.timeout)
            else:  # Pub/Sub's PublisherClient API: one future per message
                futures = [client.publish(self.topic, data, **attrs)
                           for data, attrs in batch.messages]
                for fut in futures:
                    fut.result(timeout=max(0.001, deadline - time.monotonic()))
        except Exception as exc:
            raise PublishError(f"publishing {batch.n_reports} report(s) to {self.topic} failed "
                               f"({type(exc).__name__}: {exc}); the batch is kept and sent "
                               "again, with the same report ids, by the next flush") from exc
        if self.state_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._outbox(batch.name + ".json"))
        else:
            self._unsent = [b for b in self._unsent if b is not batch]
        self.published += batch.n_reports


class BatchPublisher:
    """The default publisher: Pub/Sub's ``Publish`` RPC called directly with up to
    ``max_messages`` messages (and ~``max_bytes``) per request, built as plain protobuf
    messages. The library's batching ``PublisherClient.publish`` builds a future and proto-plus
    wrappers per message (~20,000 messages/s here); one RPC per 1,000 messages runs at ~150,000.
    Transient RPC errors are retried with backoff within the batch's ``timeout``; what still
    fails raises (the reporter keeps the batch). Honours ``PUBSUB_EMULATOR_HOST`` (through the
    library's client, which it wraps; made on first use, with the import)."""

    def __init__(self, client: Any = None, max_messages: int = 1000,
                 max_bytes: int = 8_000_000) -> None:
        self._client = client
        self.max_messages, self.max_bytes = max_messages, max_bytes

    def publish_batch(self, topic: str, messages: Sequence[tuple[bytes, Mapping[str, str]]],
                      timeout: float = 60.0) -> list[str]:
        # lazy: optional dependency (the [pubsub] extra); google-cloud-pubsub also costs 0.54 s
        # at import (measured), which `import ldp_beam.client` does not pay until it publishes
        from google.api_core import exceptions as gexc
        from google.api_core import retry as gretry
        from google.pubsub_v1.types import PublishRequest

        if self._client is None:
            # lazy: optional dependency (the [pubsub] extra)
            from google.cloud import pubsub_v1

            self._client = pubsub_v1.PublisherClient()
        retry = gretry.Retry(predicate=gretry.if_exception_type(
            gexc.ServiceUnavailable, gexc.DeadlineExceeded, gexc.InternalServerError,
            gexc.Aborted, gexc.ResourceExhausted, gexc.Unknown), initial=0.1, maximum=2.0,
            timeout=timeout)
        deadline = time.monotonic() + timeout
        ids: list[str] = []
        raw = PublishRequest.pb()
        i = 0
        while i < len(messages):
            req, size = raw(topic=topic), 0
            while i < len(messages) and len(req.messages) < self.max_messages and (
                    not req.messages or size + len(messages[i][0]) <= self.max_bytes):
                data, attrs = messages[i]
                m = req.messages.add()
                m.data = data
                for k, v in attrs.items():
                    m.attributes[k] = v
                size += len(data) + 100
                i += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"publishing took longer than {timeout:g} s")
            resp = self._client.api.publish(request=PublishRequest.wrap(req), retry=retry,
                                            timeout=min(left, 30.0))
            ids.extend(resp.message_ids)
        return ids

    def stop(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client = None
