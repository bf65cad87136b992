"""The budget ledger itself (see :mod:`ldp_beam.ledger`): :class:`Ledger`, opened on a SQLite
file or a PostgreSQL database, which reserves, settles and reads runs' entries and datasets'
budgets, and :class:`Reservation`, a run's pending entry."""
from __future__ import annotations

import contextlib
import os
import shlex
import socket
import sqlite3
import threading
import time
from typing import Any, Iterator, Mapping

from ..errors import ParameterError
from ..urls import check_new_file
from .accounting import (BudgetExceeded, Spent, _budget_text, _check_budget_args,
                         _check_eps_delta, _remaining, check_accounting, compose)
from .backends import _CHANGE_COLUMNS, _ENTRY_COLUMNS, _SCHEMA, _nap, _Postgres, _SQLite, _Tx
from .base import (_ADVISORY_KEY, _NOTHING_RUN, BUDGET_TOLERANCE, DEFAULT_TIMEOUT, RAISE_HINT,
                   SCHEMA_VERSION, STATUSES, LedgerError, LedgerNotFound, LedgerUnavailable,
                   _dumps, _loads, _now, _user)
from .migrate import _migrate_v1
from .names import (_name_of, by_content, canonical_location, check_dataset_name,
                    default_url, redact, request_key, sqlite_path)

#: The first key of the PostgreSQL advisory lock (two-int form) that a central release's
#: reservation takes on its request (the second key: from the request key), so that identical
#: releases on datasets of different names are serialised too (see :meth:`Ledger.reserve`).
_RELEASE_LOCK_CLASS = 0x6C6470  # "ldp"


class ReleaseInProgress(LedgerError):
    """:meth:`Ledger.reserve` of a central release refused because another run reserved the
    identical request (the same data fingerprint and the same
    :func:`~ldp_beam.ledger.release_request`) and is still pending: the two would draw twice,
    and each be charged, for the same answer. Nothing was recorded, spent or drawn. ``run_id``
    is the other run's id: once it commits, a run of the same request re-publishes its release
    at no cost (:meth:`Ledger.find_release`); if its process is gone, an operator settles it
    (``ldp-beam ledger --resolve RUN_ID --as aborted``)."""

    def __init__(self, message: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id

    def __reduce__(self):  # picklable, as the ledger's other errors
        return (type(self), (str(self), self.run_id))


# ----------------------------------------------------------------------------------- ledger
class Reservation:
    """A pending ledger entry (see :meth:`Ledger.reserve`).

    Its life: :meth:`prepare` before anything is published (the ledger is still the one the run
    reserved in and the entry still pending; its outputs and release are stored, it stays
    pending), then :meth:`commit` once the outputs are in place. :meth:`leave_pending` (a run
    that may have published part of its outputs) and :meth:`abort` (nothing was published)
    settle it otherwise. As a context manager, leaving it unsettled (an error, an interrupt)
    aborts it if it was not prepared (nothing was published) and leaves it pending, with a note,
    if it was (it may have published: it counts as spent until an operator resolves it). A
    process killed outright leaves it pending, and it counts as spent until resolved."""

    def __init__(self, ledger: "Ledger", run_id: str, entry: dict, spent: Spent,
                 budget: tuple[float | None, float | None]) -> None:
        self.ledger, self.run_id, self.entry = ledger, run_id, entry
        self.dataset = entry.get("dataset")
        self.spent_before, self.budget = spent, budget
        self.status = "pending"
        self.prepared = False
        self.left_pending = False

    def prepare(self, outputs: Mapping[str, Any] | None = None,
                release: Mapping[str, Any] | None = None) -> None:
        """Before anything is published: see :meth:`Ledger.prepare`. If it raises, publish
        nothing."""
        self.ledger.prepare(self.run_id, outputs, release)
        self.prepared = True

    def commit(self, outputs: Mapping[str, Any] | None = None,
               release: Mapping[str, Any] | None = None, *,
               epsilon: float | None = None) -> None:
        """After publishing: see :meth:`Ledger.commit` (``outputs``/``release`` given here
        replace those stored by :meth:`prepare`; omitted, those are kept; ``epsilon``: what the
        run turned out to spend, at most what it reserved)."""
        self.ledger.commit(self.run_id, outputs, release, epsilon=epsilon)
        self.status = "committed"

    def leave_pending(self, note: str) -> None:
        """Record ``note`` and leave the entry pending (it counts as spent until an operator
        resolves it): for a run that may have published part of its outputs."""
        self.ledger.leave_pending(self.run_id, note)
        self.left_pending = True

    def abort(self, reason: str = "") -> None:
        self.ledger.abort(self.run_id, reason)
        self.status = "aborted"

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.status != "pending" or self.left_pending:
            return
        why = f"run failed: {exc_type.__name__}: {exc}" if exc_type else "left without commit"
        try:
            if self.prepared:  # its outputs may be (partly) in place: never claim it was not
                self.leave_pending(f"{why}, after it was prepared to publish: it may have "
                                   "published")
            else:
                self.abort(why)
        except LedgerError:
            pass  # cannot reach the ledger: the entry stays pending and counts as spent

    def __repr__(self) -> str:
        return f"Reservation({self.run_id!r}, {self.status})"


class Ledger:
    """A budget ledger on SQLite or PostgreSQL (see :mod:`ldp_beam.ledger`). Open with
    :meth:`open`; one object per thread; close it (or use it as a context manager).

    ``ledger_id`` is the ledger's random id (``ldp_beam_meta``), read when it was opened;
    ``opened`` when that was (UTC)."""

    def __init__(self, backend: Any, url: str) -> None:
        self._db = backend
        self.url = redact(url)
        self._lock = threading.RLock()
        self.ledger_id: str | None = None
        self._file_id: tuple[int, int] | None = None
        self.opened = _now()

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, url: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
             create: bool = True) -> "Ledger":
        """Open the ledger at ``url`` (default: :func:`default_url`), creating it if absent
        when ``create`` (a run), never when not (reading, listing: then a SQLite path that does
        not exist or holds no ledger, or a PostgreSQL database without the ledger's tables,
        raises :class:`LedgerNotFound` and creates no file, no folder and no table). A schema-1
        ledger is migrated in place (see :mod:`ldp_beam.ledger`).

        Raises :class:`LedgerUnavailable` if it cannot be reached or opened within ``timeout``
        seconds (every step of opening a SQLite file, its switch to WAL and its tables'
        creation included, is retried while another process holds the lock, up to the
        timeout), :class:`~ldp_beam.errors.ParameterError` naming ``--ledger`` for a URL of an
        unknown form, :class:`LedgerError` for a ledger written by a newer ldp-beam."""
        if isinstance(url, Ledger):
            return url
        url = default_url() if url is None or url == "" else str(url)
        if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ParameterError("timeout", timeout, "a number of seconds > 0")
        deadline = time.monotonic() + timeout
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        before = None
        if scheme in ("postgresql", "postgres"):
            backend: Any = _Postgres(url, timeout)
        elif scheme in ("sqlite", ""):
            path = sqlite_path(url) if scheme else url
            if not path or path == ":memory:" or path.startswith("file:"):
                raise ParameterError("--ledger", url, "a SQLite file (sqlite://FILE): the "
                                     "ledger must outlive the run")
            path = os.path.expanduser(path)
            if create and scheme:
                check_new_file(url, path, "--ledger")
            if not create and not os.path.isfile(path):
                raise LedgerNotFound(f"--ledger {redact(url)}: no ledger at {path} ("
                                     + ("not a file" if os.path.exists(path) else
                                        "no such file") + "); nothing was created")
            with contextlib.suppress(OSError):
                st = os.stat(path)
                before = (st.st_dev, st.st_ino)
            backend = _SQLite(path, url, timeout, create)
        else:
            raise ParameterError("--ledger", redact(url), "sqlite://PATH, a file path or "
                                 "postgresql://USER@HOST:PORT/DATABASE")
        led = cls(backend, url)
        try:
            attempt = 0
            while True:  # every step of opening together within the timeout
                backend.wait_at_most(max(0.001, deadline - time.monotonic()))
                try:
                    led._ensure_schema(create)
                    break
                except LedgerUnavailable as exc:
                    if not exc.busy or time.monotonic() >= deadline:
                        raise
                    _nap(deadline, attempt)
                    attempt += 1
            backend.wait_at_most(timeout)
            led._remember_identity(before)
        except BaseException:
            backend.close()
            raise
        return led

    def _where(self) -> str:
        return self._db.path if isinstance(self._db, _SQLite) else self.url

    def _ensure_schema(self, create: bool) -> None:
        db = self._db
        try:
            present = db.has_schema()
        except db.errors() as exc:
            raise db.unavailable(exc) from None
        if not present:
            if not create:
                raise LedgerNotFound(f"--ledger {self.url}: no ledger at {self._where()} (it "
                                     "holds no ldp-beam ledger tables); nothing was created")
            with self._tx(write=True) as tx:
                if tx.pg:
                    tx.execute(f"SELECT pg_advisory_xact_lock({_ADVISORY_KEY})")
                if not db.has_schema_tx(tx):  # another process may have made it meanwhile
                    for stmt in _SCHEMA:
                        tx.execute(stmt)
                    for key, value in (("schema_version", str(SCHEMA_VERSION)),
                                       ("unit_salt", os.urandom(16).hex()),
                                       ("created", _now()), ("ledger_id", os.urandom(16).hex())):
                        tx.execute("INSERT INTO ldp_beam_meta (key, value) VALUES (?, ?) "
                                   "ON CONFLICT (key) DO NOTHING", (key, value))
        version = self._version()
        if version == 1:
            with self._tx(write=True) as tx:
                if tx.pg:
                    tx.execute(f"SELECT pg_advisory_xact_lock({_ADVISORY_KEY})")
                row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = 'schema_version'")
                if row and int(row[0]) == 1:  # not migrated by another process meanwhile
                    _migrate_v1(tx, self.url)
            version = self._version()
        if version != SCHEMA_VERSION:
            raise LedgerError(f"--ledger {self.url}: the ledger's schema version is {version}, "
                              f"this ldp-beam reads version {SCHEMA_VERSION}"
                              + ("; upgrade ldp-beam" if version > SCHEMA_VERSION else ""))

    def _version(self) -> int:
        with self._tx(write=False) as tx:
            row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = ?", ("schema_version",))
        return int(row[0]) if row else 0

    def _remember_identity(self, before: tuple[int, int] | None) -> None:
        with self._tx(write=False) as tx:
            row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = 'ledger_id'")
        if row is None:
            raise LedgerError(f"--ledger {self.url}: the ledger has no ledger_id in "
                              "ldp_beam_meta (damaged?)")
        self.ledger_id = row[0]
        self._file_id = self._db.file_id()
        if isinstance(self._db, _SQLite) and (
                self._file_id is None or (before is not None and before != self._file_id)):
            raise LedgerUnavailable(f"--ledger {self.url}: {self._db.path} was deleted or "
                                    f"replaced while it was being opened; {_NOTHING_RUN}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.url!r})"

    @property
    def backend(self) -> str:
        return "postgresql" if isinstance(self._db, _Postgres) else "sqlite"

    @contextlib.contextmanager
    def _tx(self, write: bool = True) -> Iterator[_Tx]:
        with self._lock, self._db.transaction(write) as tx:
            yield tx

    # ------------------------------------------------------------------ identity
    def _not_the_same(self, problems: list[str], consequence: str) -> LedgerUnavailable:
        err = LedgerUnavailable(
            f"--ledger {self.url}: the ledger is not the one this run reserved in (deleted, "
            f"replaced or damaged since it was opened at {self.opened}: {'; '.join(problems)}); "
            f"{consequence}")
        err.identity = True
        return err

    def _check_identity(self, tx: _Tx, consequence: str) -> None:
        """Inside a transaction: the ledger is the one opened (SQLite: the same file by device
        and inode, still a SQLite database; both: the same ``ledger_id``), else raise."""
        problems = self._db.file_problems(self._file_id)
        if not problems:
            try:
                row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = 'ledger_id'")
            except self._db.errors() as exc:
                problems = [f"its ledger id cannot be read ({type(exc).__name__}: {exc})"]
            else:
                if row is None or row[0] != self.ledger_id:
                    problems = [f"its ledger id is {row[0] if row else 'missing'}, not "
                                f"{self.ledger_id}"]
        if problems:
            raise self._not_the_same(problems, consequence)

    @contextlib.contextmanager
    def _settling(self, consequence: str, check: bool = True) -> Iterator[_Tx]:
        """A write transaction on the ledger this object opened, checked first
        (:meth:`_check_identity`) when ``check``. A damaged file, or a failure while the file is
        not the one opened, raises :class:`LedgerUnavailable` saying so and what it means
        (``consequence``). Without ``check`` (abort, leave_pending: they only ever give back or
        annotate the run's own entry) the write goes to the ledger the entry is in, whatever
        is at its path now."""
        try:
            with self._tx(write=True) as tx:
                if check:
                    self._check_identity(tx, consequence)
                yield tx
        except LedgerUnavailable as exc:
            if getattr(exc, "identity", False):
                raise
            problems = self._db.file_problems(self._file_id)
            cause = exc.__cause__
            if not problems and isinstance(cause, sqlite3.DatabaseError) \
                    and not isinstance(cause, sqlite3.OperationalError):
                problems = [f"it cannot be read as a SQLite database ({cause})"]
            if problems:
                raise self._not_the_same(problems, consequence) from exc
            if consequence == _NOTHING_RUN:
                raise
            again = LedgerUnavailable(str(exc).replace(_NOTHING_RUN, consequence))
            again.busy = exc.busy
            raise again from exc

    # ------------------------------------------------------------------ datasets
    def _dataset_row(self, tx: _Tx, name: str) -> None:
        tx.execute("INSERT INTO ldp_beam_datasets (dataset, first_seen) VALUES (?, ?) "
                   "ON CONFLICT (dataset) DO NOTHING", (name, _now()))

    @contextlib.contextmanager
    def _locked(self, name: str, consequence: str = _NOTHING_RUN) -> Iterator[_Tx]:
        """A write transaction holding dataset ``name``'s row (created if new), on the ledger
        this object opened."""
        with self._settling(consequence) as tx:
            self._dataset_row(tx, name)
            if tx.pg:  # the dataset's row serialises reservations and admissions on it
                tx.execute("SELECT dataset FROM ldp_beam_datasets WHERE dataset = ? FOR UPDATE",
                           (name,))
            yield tx

    def _budget_row(self, tx: _Tx, name: str) -> tuple[float | None, float | None]:
        rec = tx.one("SELECT budget_epsilon, budget_delta FROM ldp_beam_datasets WHERE "
                     "dataset = ?", (name,))
        return (rec[0], rec[1]) if rec else (None, None)

    def _not_a_fingerprint(self, tx: _Tx, name: str) -> None:
        """Spending is kept by dataset name: a data fingerprint given instead (the key before
        schema 2) would read as a dataset with nothing spent, so it is refused."""
        if not name.startswith(("sha256:", "stream:")):
            return
        if tx.one("SELECT 1 FROM ldp_beam_datasets WHERE dataset = ?", (name,)) is None and \
                tx.one("SELECT 1 FROM ldp_beam_entries WHERE fingerprint = ? LIMIT 1", (name,)):
            raise ParameterError("dataset", name, "a dataset's name (dataset_identity(...)"
                                 "['dataset']), not a data fingerprint: budgets and spending "
                                 "are kept per dataset name")

    def _record_budget(self, tx: _Tx, name: str, epsilon: float, delta: float | None,
                       previous: tuple[float | None, float | None], why: str,
                       run_id: str | None) -> dict:
        change = {"dataset": name, "epsilon": epsilon, "delta": delta,
                  "previous_epsilon": previous[0], "previous_delta": previous[1],
                  "changed": _now(), "os_user": _user(), "host": socket.gethostname(),
                  "why": why, "run_id": run_id}
        tx.execute("UPDATE ldp_beam_datasets SET budget_epsilon = ?, budget_delta = ?, "
                   "budget_set = ? WHERE dataset = ?", (epsilon, delta, change["changed"], name))
        tx.execute(f"INSERT INTO ldp_beam_budget_changes ({', '.join(_CHANGE_COLUMNS)}) VALUES "
                   f"({', '.join('?' * len(_CHANGE_COLUMNS))})",
                   [change[c] for c in _CHANGE_COLUMNS])
        return change

    def _last_change(self, tx: _Tx, name: str) -> dict | None:
        row = tx.one(f"SELECT {', '.join(_CHANGE_COLUMNS)} FROM ldp_beam_budget_changes WHERE "
                     "dataset = ? ORDER BY changed DESC LIMIT 1", (name,))
        return None if row is None else dict(zip(_CHANGE_COLUMNS, row))

    def datasets(self) -> list[str]:
        """Every dataset name the ledger knows (with an entry, a budget or stream spending)."""
        with self._tx(write=False) as tx:
            return [r[0] for r in tx.all("SELECT dataset FROM ldp_beam_datasets ORDER BY "
                                         "dataset")]

    # ------------------------------------------------------------------ budget
    def reserve(self, run_id: str, dataset: Mapping[str, Any], *, command: str, mechanism: str,
                epsilon: float, delta: float = 0.0, params: Mapping[str, Any] | None = None,
                unit: str | None = None, kind: str | None = None,
                accounting: Any = None, budget: float | None = None,
                budget_delta: float | None = None, request: Mapping[str, Any] | None = None,
                seeded: bool = False, republished_from: str | None = None,
                note: str = "") -> Reservation:
        """Record that run ``run_id`` is about to spend ``epsilon`` (and ``delta``) on
        ``dataset`` (from :func:`~ldp_beam.pipelines.datasets.dataset_identity`: spending is kept against its ``"dataset"``
        name; its ``"fingerprint"`` and ``"uri"`` are recorded with the entry), after checking
        the budget, in one transaction. Call it before any noise is drawn.

        ``budget``/``budget_delta``: the run's ``--budget``/``--budget-delta``. Where the
        dataset has no budget recorded, it becomes the dataset's budget; where it has one, it
        may confirm it or lower it (recorded in :meth:`budget_changes` with this run's id), never
        raise it: a ``budget`` (or ``budget_delta``) above the recorded one raises
        :class:`BudgetExceeded` naming ``--budget`` (``--budget-delta``), the recorded budget and
        how to raise it (:meth:`set_budget`). A ``budget_delta`` where the recorded budget has no
        delta sets it. Omitted, the budget recorded applies (none: no limit, still recorded).
        Raises :class:`BudgetExceeded` (naming the parameter, the budget, what was spent and by
        which runs, and what this run asks) if the composed spending with this run would exceed
        the budget; :class:`LedgerUnavailable` if the ledger cannot be reached or locked in time,
        or is no longer the one this object opened. ``request`` (from
        :func:`~ldp_beam.ledger.release_request`) marks a central release that
        :meth:`find_release` can find again; ``republished_from`` a 0-epsilon re-publication.

        An identical release in progress is refused: with a ``request`` (and no
        ``republished_from``), if another run reserved the same request on the same data
        fingerprint (whatever its dataset's name) and is still pending (neither committed nor
        aborted), this raises :class:`ReleaseInProgress` naming that run, and records nothing.
        The check is made in the same transaction and under the same lock as the insert (on
        PostgreSQL also under an advisory lock on the request, for datasets of different names),
        so of two identical releases started at once exactly one reserves; the other, run
        again once the first has committed, re-publishes its release at no cost. Aborted and
        committed entries never block (a committed one is what :meth:`find_release` finds
        before reserving); re-publications and inputs identified by name, not content (a
        database table or query, whose releases are drawn anew every time) are not checked."""
        if not isinstance(run_id, str) or not run_id:
            raise ParameterError("run_id", run_id, "a non-empty string (RunKey.run_id)")
        if not isinstance(dataset, Mapping):
            raise ParameterError("dataset", dataset, "the dict from dataset_identity")
        name = _name_of(dataset)
        for what, v in (("dataset.fingerprint", dataset.get("fingerprint")),
                        ("dataset.uri", dataset.get("uri"))):
            if not isinstance(v, str) or not v:
                raise ParameterError(what, v, "a non-empty string (from dataset_identity)")
        epsilon, delta = _check_eps_delta(epsilon, delta)
        budget, budget_delta = _check_budget_args(budget, budget_delta, "--budget")
        if budget_delta is not None and budget is None:
            raise ParameterError("--budget-delta", budget_delta, "given with --budget EPS")
        comps = check_accounting(accounting)
        unit = unit or "record"
        entry = {"run_id": run_id, "status": "pending", "started": _now(), "finished": None,
                 "command": command, "dataset": name, "fingerprint": dataset["fingerprint"],
                 "uri": dataset["uri"], "unit": unit, "mechanism": mechanism, "kind": kind,
                 "params": _dumps(dict(params or {})), "epsilon": epsilon, "delta": delta,
                 "accounting": _dumps(comps), "budget_epsilon": None, "budget_delta": None,
                 "request_key": None if request is None else request_key(
                     dataset["fingerprint"], request),
                 "release": None, "outputs": None, "republished_from": republished_from,
                 "seeded": int(bool(seeded)), "host": socket.gethostname(), "pid": os.getpid(),
                 "os_user": _user(), "note": note or None}
        with self._locked(name) as tx:
            if tx.one("SELECT 1 FROM ldp_beam_entries WHERE run_id = ?", (run_id,)):
                raise LedgerError(f"run {run_id} is already in the ledger {self.url}: a run id "
                                  "is recorded once (RunKey.new() makes a fresh one)")
            if entry["request_key"] is not None and republished_from is None \
                    and by_content(entry["uri"]):
                self._no_release_in_progress(tx, entry)
            rec = self._budget_row(tx, name)
            b_eps, b_delta, why = self._run_budget(tx, name, rec, budget, budget_delta)
            rows = self._live(tx, name)
            before = compose(rows, b_delta)
            if b_eps is not None and (epsilon > 0 or delta > 0):
                self._check_budget(dataset, rows, before, entry, b_eps, b_delta,
                                   given=budget is not None)
            if why:
                self._record_budget(tx, name, b_eps, b_delta, rec, why, run_id)
            entry["budget_epsilon"], entry["budget_delta"] = b_eps, b_delta
            tx.execute(f"INSERT INTO ldp_beam_entries ({', '.join(_ENTRY_COLUMNS)}) VALUES "
                       f"({', '.join('?' * len(_ENTRY_COLUMNS))})",
                       [entry[c] for c in _ENTRY_COLUMNS])
        return Reservation(self, run_id, entry, before, (b_eps, b_delta))

    def _no_release_in_progress(self, tx: _Tx, entry: dict) -> None:
        """Inside :meth:`reserve`'s transaction: raise :class:`ReleaseInProgress` if a run that
        reserved ``entry``'s request on the same data (any dataset name) is still pending.

        Serialised with every other reservation of the same request: on SQLite by the
        database's write lock (``BEGIN IMMEDIATE``, all datasets); on PostgreSQL by the
        dataset's row (same name) and, for names that differ, a transaction-scoped advisory
        lock on the request key, taken after the dataset's row and held until the insert
        commits (READ COMMITTED: the next holder's query sees that insert). Each reservation
        takes one dataset row and then at most this one advisory lock, so no two wait on each
        other in a cycle."""
        key, fp = entry["request_key"], entry["fingerprint"]
        if tx.pg:
            sub = int.from_bytes(bytes.fromhex(key[:8]), "big", signed=True)
            tx.execute(f"SELECT pg_advisory_xact_lock({_RELEASE_LOCK_CLASS}, {sub})")
        row = tx.one("SELECT run_id, command, mechanism, dataset, started, host FROM "
                     "ldp_beam_entries WHERE request_key = ? AND fingerprint = ? AND status = "
                     "'pending' AND republished_from IS NULL ORDER BY started, run_id LIMIT 1",
                     (key, fp))
        if row is None:
            return
        other, command, mechanism, dataset, started, host = row
        raise ReleaseInProgress(
            f"an identical release is in progress: run {other} ({command} {mechanism} on "
            f"dataset {dataset}, started {started[:19].replace('T', ' ')} UTC on {host}) "
            f"reserved the same request on the same data (fingerprint {fp[:19]}) in {self.url} "
            f"and is still pending. This run was refused before any noise was drawn: nothing "
            f"was spent. Wait for run {other} to finish and run again (once it has committed, its "
            f"release is re-published at no cost); if that run is gone and none of its outputs "
            f"was ever in place, resolve it first: ldp-beam ledger --resolve {other} --as "
            f"aborted (if one was, even for a moment: --as committed)", other)

    def _run_budget(self, tx: _Tx, name: str, rec: tuple[float | None, float | None],
                    budget: float | None, budget_delta: float | None
                    ) -> tuple[float | None, float | None, str | None]:
        """The budget a run holds to, and why it changes the recorded one (None: it does
        not): a run may set a budget where none is recorded, confirm it or lower it."""
        r_eps, r_delta = rec
        if budget is None:
            return r_eps, r_delta, None
        if r_eps is None:
            return budget, budget_delta, "set by run"
        raised = [("--budget", budget, f"epsilon={r_eps:g}")] if budget > r_eps else []
        if budget_delta is not None and r_delta is not None and budget_delta > r_delta:
            raised.append(("--budget-delta", budget_delta, f"delta={r_delta:g}"))
        if raised:
            last = self._last_change(tx, name)
            since = ("" if last is None else
                     f", {last['why']} by {last['os_user']}@{last['host']} on "
                     f"{last['changed'][:19].replace('T', ' ')} UTC"
                     + (f" (run {last['run_id']})" if last.get("run_id") else ""))
            what, value, _ = raised[0]
            shown = " and ".join(f"{w} {v:g}" for w, v, _ in raised)
            raise BudgetExceeded(
                what, value,
                f"{shown} is above the budget recorded for dataset {name} in {self.url} "
                f"({_budget_text(r_eps, r_delta)}{since}): a run's --budget may set a budget "
                "where none is recorded, confirm the recorded one or lower it, never raise it; "
                f"{RAISE_HINT} (here --dataset {shlex.quote(name)}"
                + (", with --budget-delta DELTA" if what == "--budget-delta" else "")
                + "). Refused before any noise was drawn")
        new_delta = r_delta if budget_delta is None else budget_delta
        if budget == r_eps and new_delta == r_delta:
            return r_eps, r_delta, None
        lowered = budget < r_eps or (r_delta is not None and new_delta < r_delta)
        return budget, new_delta, "lowered by run" if lowered else "set by run"

    def _live(self, tx: _Tx, name: str) -> list[dict]:
        cols = ("run_id", "command", "mechanism", "epsilon", "delta", "accounting", "status",
                "started", "unit", "seeded")
        rows = tx.all(f"SELECT {', '.join(cols)} FROM ldp_beam_entries WHERE dataset = ? "
                      "AND status IN ('pending', 'committed') ORDER BY started, run_id",
                      (name,))
        return [dict(zip(cols, r)) for r in rows]

    def _check_budget(self, ds, rows, before: Spent, entry: dict, b_eps: float,
                      b_delta: float | None, given: bool) -> None:
        eps, delta = entry["epsilon"], entry["delta"]
        src = "--budget" if given else "--budget (recorded for this dataset)"
        name, uri = entry["dataset"], ds["uri"]
        where = (f"dataset {name} ({'read from ' + uri + ', ' if uri != name else ''}data "
                 f"fingerprint {ds['fingerprint'][:19]})")
        asked = f"this run ({entry['command']} {entry['mechanism']}) asks epsilon={eps:g}" + (
            f", delta={delta:g}" if delta else "")
        if (delta > 0 or before.delta_sum > 0) and not b_delta:
            raise BudgetExceeded(
                "--budget-delta", b_delta,
                f"--budget-delta: the budget of {where} is epsilon={b_eps:g} with no delta, "
                f"which cannot hold a run with delta > 0: {asked}"
                + (f"; earlier runs spent delta={before.delta_sum:g}" if before.delta_sum else "")
                + ". Give --budget-delta DELTA (the delta the total epsilon holds at). Refused "
                "before any noise was drawn", before, (eps, delta))
        after = compose(rows + [entry], b_delta)
        if after.epsilon <= b_eps * (1 + BUDGET_TOLERANCE) + 1e-12:
            return
        runs = [r for r in before.entries if r["epsilon"] or r["delta"]]  # not re-publications
        shown = "; ".join(
            f"{r['run_id']} {r['command']} {r['mechanism']} epsilon={r['epsilon']:g}"
            + (f" delta={r['delta']:g}" if r["delta"] else "")
            + (" PENDING (counts until `ldp-beam ledger --resolve`)" if r["status"] == "pending"
               else f" {r['started'][:19]}") for r in runs[-10:])
        more = f"{len(runs) - 10} earlier runs; " if len(runs) > 10 else ""
        how = ("sum" if after.delta == 0 else
               f"composed with dp_accounting's PLD accountant at delta={after.delta:g}")
        spent = ("nothing spent yet" if not runs else
                 f"already spent epsilon={before.epsilon:g}"
                 + (f" at delta={before.delta:g}" if before.delta else "")
                 + f" by {len(runs)} run(s) [{more}{shown}]")
        raise BudgetExceeded(
            "--budget", b_eps,
            f"{src} {b_eps:g} for {where} would be exceeded: {spent}; {asked}; together "
            f"epsilon={after.epsilon:g} ({how}) > {b_eps:g}. Refused before any noise was "
            f"drawn; {RAISE_HINT} (here --dataset {shlex.quote(name)}), only if the dataset's "
            "owner agrees", before, (eps, delta))

    def set_budget(self, dataset: str, epsilon: float, delta: float | None = None, *, why: str,
                   run_id: str | None = None) -> dict:
        """Set, raise or lower dataset ``dataset``'s budget: the recorded act (``ldp-beam
        ledger --set-budget EPS [--budget-delta D] --dataset NAME --why TEXT``), with the OS
        user and host, the time and ``why`` (required). Returns the change recorded
        (:meth:`budget_changes`' form) with ``"spent"`` (:meth:`Spent.to_dict`) so far. A
        budget below what was already spent is recorded (no further run fits it)."""
        name = _name_of(dataset, "--dataset")
        with self._tx(write=False) as tx:
            known = tx.one("SELECT 1 FROM ldp_beam_datasets WHERE dataset = ?", (name,))
        if not known:  # a new name is checked; a known one (a long path, say) is kept as is
            check_dataset_name(name)
        epsilon, delta = _check_budget_args(epsilon, delta, "--set-budget")
        if epsilon is None:
            raise ParameterError("--set-budget", epsilon, "a finite epsilon >= 0")
        if not isinstance(why, str) or not why.strip():
            raise ParameterError("--why", why, "a non-empty reason, recorded with the change "
                                 "(who agreed, a ticket)")
        with self._locked(name, "nothing was changed") as tx:
            rec = self._budget_row(tx, name)
            change = self._record_budget(tx, name, epsilon, delta, rec, why.strip(), run_id)
            spent = compose(self._live(tx, name), delta)
        return {**change, "spent": spent.to_dict()}

    def budget_changes(self, dataset: str | None = None) -> list[dict]:
        """Every budget change (of ``dataset``, a name, or of all datasets), oldest first:
        ``{"dataset", "epsilon", "delta", "previous_epsilon", "previous_delta", "changed",
        "os_user", "host", "why", "run_id"}``."""
        sql = f"SELECT {', '.join(_CHANGE_COLUMNS)} FROM ldp_beam_budget_changes"
        args: tuple = ()
        if dataset is not None:
            sql += " WHERE dataset = ?"
            args = (_name_of(dataset),)
        with self._tx(write=False) as tx:
            rows = tx.all(sql + " ORDER BY changed, dataset", args)
        return [dict(zip(_CHANGE_COLUMNS, r)) for r in rows]

    def spent(self, dataset: str, unit: str | None = None, delta: float | None = None
              ) -> Spent:
        """What dataset ``dataset`` (its name, or a :func:`~ldp_beam.pipelines.datasets.dataset_identity` dict), or one
        privacy ``unit`` of it, has spent: committed and pending entries, composed (at
        ``delta``, default the dataset's budget delta)."""
        name = _name_of(dataset)
        with self._tx(write=False) as tx:
            self._not_a_fingerprint(tx, name)
            rows = self._live(tx, name)
            rec = self._budget_row(tx, name)
        if unit is not None:
            rows = [r for r in rows if r["unit"] == unit]
        return compose(rows, delta if delta is not None else rec[1])

    def budget(self, dataset: str) -> tuple[float | None, float | None]:
        """The budget recorded for a dataset (its name): (epsilon, delta), (None, None) if
        none."""
        name = _name_of(dataset)
        with self._tx(write=False) as tx:
            self._not_a_fingerprint(tx, name)
            return self._budget_row(tx, name)

    def dataset_status(self, dataset: str) -> dict:
        """What a dataset (its name) has: ``{"dataset", "budget": {"epsilon", "delta"} or None,
        "spent": Spent.to_dict(), "remaining": epsilon left (None without a budget; 0 once a
        run without a finite guarantee counts), "runs", "pending"}``."""
        name = _name_of(dataset)
        with self._tx(write=False) as tx:
            self._not_a_fingerprint(tx, name)
            rows = self._live(tx, name)
            b_eps, b_delta = self._budget_row(tx, name)
        total = compose(rows, b_delta)
        return {"dataset": name,
                "budget": None if b_eps is None else {"epsilon": b_eps, "delta": b_delta},
                "spent": total.to_dict(), "remaining": _remaining(b_eps, total),
                "runs": total.runs, "pending": total.pending}

    # ------------------------------------------------------------------ outcome
    def _pending(self, tx: _Tx, run_id: str) -> None:
        row = tx.one("SELECT status FROM ldp_beam_entries WHERE run_id = ?", (run_id,))
        if row is None:
            raise LedgerError(f"run {run_id} has no reservation in {self.url}: reserve "
                              "before the run draws any noise")
        if row[0] != "pending":
            raise LedgerError(f"run {run_id} is {row[0]} in {self.url}, not pending: it "
                              "must not publish (an operator resolved it, or it ran twice)")

    def prepare(self, run_id: str, outputs: Mapping[str, Any] | None = None,
                release: Mapping[str, Any] | None = None) -> None:
        """Before anything of ``run_id`` is published: in one transaction, check that the ledger
        is still the one this object opened (the one the run reserved in) and that the entry is
        still pending, and store its ``outputs`` (role -> path, bytes, sha256) and, for a
        central release, the ``release`` as it will be published. The entry stays pending.
        Raises :class:`LedgerUnavailable` (the ledger deleted, replaced, damaged or unreachable)
        or :class:`LedgerError` (not pending): then publish nothing."""
        with self._settling("nothing was published") as tx:
            self._pending(tx, run_id)
            tx.execute("UPDATE ldp_beam_entries SET outputs = COALESCE(?, outputs), "
                       "release = COALESCE(?, release) WHERE run_id = ? AND status = 'pending'",
                       (_dumps(outputs), _dumps(release, sort_keys=False), run_id))

    def commit(self, run_id: str, outputs: Mapping[str, Any] | None = None,
               release: Mapping[str, Any] | None = None, *,
               epsilon: float | None = None) -> None:
        """Mark ``run_id``'s reservation committed, on the ledger it was reserved in (checked
        as :meth:`prepare` does), with its ``outputs`` and ``release`` (given here, they replace
        what :meth:`prepare` stored; omitted, that is kept). Call :meth:`prepare` before
        publishing and this after; called alone (before the outputs are moved into place) it
        does both: if it raises, publish nothing.

        ``epsilon``: what the run turned out to spend, when it is known only at the end (a
        stream reserves the most its units can lose and spends what they did): never more than
        it reserved, since the budget was checked against the reservation (omitted: the
        reservation)."""
        with self._settling("its entry was not marked committed") as tx:
            self._pending(tx, run_id)
            self._spent_less(tx, run_id, epsilon)
            tx.execute("UPDATE ldp_beam_entries SET status = 'committed', finished = ?, "
                       "outputs = COALESCE(?, outputs), release = COALESCE(?, release) "
                       "WHERE run_id = ? AND status = 'pending'",
                       (_now(), _dumps(outputs), _dumps(release, sort_keys=False), run_id))

    def _spent_less(self, tx: _Tx, run_id: str, epsilon: float | None) -> None:
        """Record that pending run ``run_id`` spent ``epsilon`` (None: what it reserved), never
        more than it reserved: its budget check was for that."""
        if epsilon is None:
            return
        epsilon = _check_eps_delta(epsilon, 0.0)[0]
        reserved = float(tx.one("SELECT epsilon FROM ldp_beam_entries WHERE run_id = ?",
                                (run_id,))[0])
        if epsilon > reserved * (1 + BUDGET_TOLERANCE) + 1e-12:
            raise ParameterError("epsilon", epsilon, f"at most the {reserved:g} run {run_id} "
                                 "reserved (its budget check was for that)")
        tx.execute("UPDATE ldp_beam_entries SET epsilon = ? WHERE run_id = ? AND status = "
                   "'pending'", (min(epsilon, reserved), run_id))

    def leave_pending(self, run_id: str, note: str) -> None:
        """Record ``note`` on ``run_id``'s pending entry and leave it pending: it counts as
        spent until an operator resolves it (a run that may have published part of its
        outputs)."""
        with self._settling("its entry stays as it was", check=False) as tx:
            self._pending(tx, run_id)
            tx.execute("UPDATE ldp_beam_entries SET note = CASE WHEN note IS NULL THEN ? ELSE "
                       "note || '; ' || ? END WHERE run_id = ? AND status = 'pending'",
                       (str(note), str(note), run_id))

    def abort(self, run_id: str, reason: str = "") -> bool:
        """Give back a pending reservation of a run that published nothing. Returns False if it
        was already aborted; raises :class:`LedgerError` for a committed run (spent for good)."""
        with self._settling("its reservation was not given back", check=False) as tx:
            row = tx.one("SELECT status FROM ldp_beam_entries WHERE run_id = ?", (run_id,))
            if row is None:
                raise LedgerError(f"run {run_id} has no entry in {self.url}")
            if row[0] == "aborted":
                return False
            if row[0] == "committed":
                raise LedgerError(f"run {run_id} is committed in {self.url}: what it published "
                                  "stays spent")
            tx.execute("UPDATE ldp_beam_entries SET status = 'aborted', finished = ?, note = ? "
                       "WHERE run_id = ? AND status = 'pending'", (_now(), reason or None,
                                                                   run_id))
        return True

    def resolve(self, run_id: str, status: str, note: str = "", *,
                epsilon: float | None = None) -> None:
        """An operator's decision on a pending run whose process is gone: ``committed`` (it may
        have published: stays spent) or ``aborted`` (it certainly published nothing).
        ``epsilon`` (committed only): what it is known to have spent, at most its reservation
        (a stream's restart knows it from the stream's per-unit state)."""
        if status not in ("committed", "aborted"):
            raise ParameterError("--as", status, "committed or aborted")
        if epsilon is not None and status != "committed":
            raise ParameterError("epsilon", epsilon, "given only to resolve as committed")
        with self._settling("nothing was changed") as tx:
            row = tx.one("SELECT status, note FROM ldp_beam_entries WHERE run_id = ?", (run_id,))
            if row is None:
                raise ParameterError("--resolve", run_id, "the run id of a pending entry",
                                     hint=f"no such run in {self.url}")
            if row[0] != "pending":
                raise ParameterError("--resolve", run_id, "the run id of a pending entry",
                                     hint=f"it is {row[0]}")
            said = f"resolved as {status} by {_user()}" + (f": {note}" if note else "")
            self._spent_less(tx, run_id, epsilon)
            tx.execute("UPDATE ldp_beam_entries SET status = ?, finished = ?, note = ? WHERE "
                       "run_id = ? AND status = 'pending'",
                       (status, _now(), said if not row[1] else f"{row[1]}; {said}", run_id))

    def find_release(self, fingerprint: str, request: Mapping[str, Any]) -> dict | None:
        """The committed release of an identical request (same data fingerprint, whatever the
        dataset's name, and the same :func:`~ldp_beam.ledger.release_request`), most recent
        first: ``{"run_id", "release", "outputs", "finished"}``; None if there is none. A re-run
        publishes it again instead of drawing new noise (recorded with epsilon 0 and
        ``republished_from``). Only committed releases are found: an identical release still
        pending is not, and :meth:`reserve` refuses a second reservation of it
        (:class:`ReleaseInProgress`), so two identical releases started at once never both
        draw."""
        key = request_key(fingerprint, request)
        with self._tx(write=False) as tx:
            row = tx.one("SELECT run_id, release, outputs, finished FROM ldp_beam_entries WHERE "
                         "request_key = ? AND fingerprint = ? AND status = 'committed' AND "
                         "release IS NOT NULL AND republished_from IS NULL "
                         "ORDER BY finished DESC LIMIT 1", (key, fingerprint))
        if row is None:
            return None
        return {"run_id": row[0], "release": _loads(row[1]), "outputs": _loads(row[2]),
                "finished": row[3]}

    # ------------------------------------------------------------------ reading
    def _filter(self, tx: _Tx, dataset: str) -> tuple[str, list]:
        """SQL selecting the entries ``dataset`` names: a dataset name or the location an entry
        was read from (a path is taken to its canonical location), else (a prefix of) a data
        fingerprint."""
        try:
            loc = canonical_location(dataset)
        except ParameterError:
            loc = dataset
        by_name = "(dataset = ? OR dataset = ? OR uri = ? OR uri = ?)"
        args: list = [dataset, loc, dataset, loc]
        if tx.one(f"SELECT 1 FROM ldp_beam_entries WHERE {by_name} LIMIT 1", args):
            return by_name, args
        prefix = dataset.replace("%", "").replace("_", "")
        return ("(fingerprint = ? OR fingerprint LIKE ? OR fingerprint LIKE ?)",
                [dataset, prefix + "%", "sha256:" + prefix + "%"])

    def entries(self, dataset: str | None = None, status: str | None = None) -> list[dict]:
        """Every entry, oldest first (``dataset``: a dataset name, a location it was read from,
        or (a prefix of) a data fingerprint)."""
        sql = f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM ldp_beam_entries"
        args: list[Any] = []
        where = []
        if status and status not in STATUSES:
            raise ParameterError("--status", status, " or ".join(STATUSES))
        with self._tx(write=False) as tx:
            if dataset:
                clause, more = self._filter(tx, dataset)
                where.append(clause)
                args += more
            if status:
                where.append("status = ?")
                args.append(status)
            if where:
                sql += " WHERE " + " AND ".join(where)
            rows = tx.all(sql + " ORDER BY started, run_id", args)
        out = [dict(zip(_ENTRY_COLUMNS, r)) for r in rows]
        for e in out:
            e.update({k: _loads(e[k]) for k in ("params", "accounting", "release", "outputs")},
                     seeded=bool(e["seeded"]))
        return out

    def summary(self, dataset: str | None = None) -> list[dict]:
        """Totals per dataset name (every entry of each dataset ``dataset`` selects, as
        :meth:`entries` does; all datasets without it, those with only a budget too), with its
        budget, what remains and its budget history, per privacy unit and per day (UTC); each
        total composed as :meth:`spent` does."""
        matched = self.entries(dataset)
        names = list(dict.fromkeys(e["dataset"] for e in matched))
        with self._tx(write=False) as tx:
            budgets = {r[0]: (r[1], r[2]) for r in tx.all(
                "SELECT dataset, budget_epsilon, budget_delta FROM ldp_beam_datasets")}
        if dataset is None:
            names += sorted(n for n, b in budgets.items() if b[0] is not None and n not in names)
            everything = matched
        else:
            if not names and dataset in budgets:
                names = [dataset]
            everything = [e for e in self.entries() if e["dataset"] in set(names)]
        changes: dict[str, list] = {}
        for c in self.budget_changes():
            changes.setdefault(c["dataset"], []).append(c)
        by_name: dict[str, list[dict]] = {n: [] for n in names}
        for e in everything:
            by_name.setdefault(e["dataset"], []).append(e)
        out = []
        for name, es in by_name.items():
            b_eps, b_delta = budgets.get(name, (None, None))
            live = [e for e in es if e["status"] != "aborted"]
            total = compose(live, b_delta)
            units, days = {}, {}
            for key, group in (("unit", units), ("day", days)):
                sel: dict[str, list] = {}
                for e in live:
                    sel.setdefault(e["unit"] if key == "unit" else e["started"][:10], []).append(e)
                for k, v in sorted(sel.items()):
                    group[k] = compose(v, b_delta).to_dict()
            out.append({"dataset": name,
                        "uris": sorted({e["uri"] for e in es}),
                        "fingerprints": list(dict.fromkeys(e["fingerprint"] for e in es)),
                        "budget": None if b_eps is None else {"epsilon": b_eps,
                                                               "delta": b_delta},
                        "spent": total.to_dict(),
                        "remaining": _remaining(b_eps, total),
                        "aborted": sum(1 for e in es if e["status"] == "aborted"),
                        "units": units, "days": days,
                        "budget_changes": changes.get(name, [])})
        return out


def open_ledger(url: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                create: bool = True) -> Ledger:
    """``Ledger.open(url)``: the ledger named by ``--ledger`` (default: :func:`default_url`)."""
    return Ledger.open(url, timeout=timeout, create=create)
