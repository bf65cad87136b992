"""Where the budget ledger (:mod:`ldp_beam.ledger`) is stored: its tables (schema 2), and its two
backends behind one transaction interface (:class:`_Tx`): a SQLite file (:class:`_SQLite`) and a
PostgreSQL database (:class:`_Postgres`, psycopg 3)."""
from __future__ import annotations

import contextlib
import math
import os
import random
import sqlite3
import time
from typing import Any, Iterator, Sequence
from urllib.parse import quote, urlsplit

from .base import _NOTHING_RUN, LedgerError, LedgerNotFound, LedgerUnavailable
from .names import redact


# ------------------------------------------------------------------------------- backends
#: Schema 2: datasets, budgets and per-unit spending keyed by the dataset's name.
_SCHEMA_META = """CREATE TABLE IF NOT EXISTS ldp_beam_meta (
        key TEXT PRIMARY KEY, value TEXT NOT NULL)"""
_SCHEMA_TABLES = [
    """CREATE TABLE IF NOT EXISTS ldp_beam_datasets (
        dataset TEXT PRIMARY KEY, first_seen TEXT NOT NULL,
        budget_epsilon DOUBLE PRECISION, budget_delta DOUBLE PRECISION, budget_set TEXT)""",
    """CREATE TABLE IF NOT EXISTS ldp_beam_entries (
        run_id TEXT PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('pending', 'committed', 'aborted')),
        started TEXT NOT NULL, finished TEXT, command TEXT NOT NULL,
        dataset TEXT NOT NULL REFERENCES ldp_beam_datasets (dataset),
        fingerprint TEXT NOT NULL, uri TEXT NOT NULL, unit TEXT NOT NULL,
        mechanism TEXT NOT NULL, kind TEXT,
        params TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        accounting TEXT, budget_epsilon DOUBLE PRECISION, budget_delta DOUBLE PRECISION,
        request_key TEXT, release TEXT, outputs TEXT, republished_from TEXT,
        seeded INTEGER NOT NULL, host TEXT, pid INTEGER, os_user TEXT, note TEXT)""",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_dataset ON ldp_beam_entries (dataset)",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_fp ON ldp_beam_entries (fingerprint)",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_req ON ldp_beam_entries (request_key)",
    """CREATE TABLE IF NOT EXISTS ldp_beam_budget_changes (
        dataset TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION,
        previous_epsilon DOUBLE PRECISION, previous_delta DOUBLE PRECISION,
        changed TEXT NOT NULL, os_user TEXT, host TEXT, why TEXT NOT NULL, run_id TEXT)""",
    "CREATE INDEX IF NOT EXISTS ldp_beam_budget_changes_dataset ON ldp_beam_budget_changes "
    "(dataset, changed)",
    """CREATE TABLE IF NOT EXISTS ldp_beam_unit_spend (
        dataset TEXT NOT NULL, unit_hash TEXT NOT NULL, window_id TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL, run_id TEXT NOT NULL, recorded TEXT NOT NULL,
        PRIMARY KEY (dataset, unit_hash, window_id))""",
]
_SCHEMA = [_SCHEMA_META] + _SCHEMA_TABLES

_ENTRY_COLUMNS = ("run_id", "status", "started", "finished", "command", "dataset",
                  "fingerprint", "uri", "unit", "mechanism", "kind", "params", "epsilon",
                  "delta", "accounting", "budget_epsilon", "budget_delta", "request_key",
                  "release", "outputs", "republished_from", "seeded", "host", "pid", "os_user",
                  "note")
_CHANGE_COLUMNS = ("dataset", "epsilon", "delta", "previous_epsilon", "previous_delta",
                   "changed", "os_user", "host", "why", "run_id")


class _Tx:
    """One transaction's statements, written with ``?`` placeholders for both backends."""

    def __init__(self, cur: Any, pg: bool) -> None:
        self.cur, self.pg = cur, pg

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        self.cur.execute(sql.replace("?", "%s") if self.pg else sql, tuple(args))
        return self.cur

    def one(self, sql: str, args: Sequence[Any] = ()) -> tuple | None:
        return self.execute(sql, args).fetchone()

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        return list(self.execute(sql, args).fetchall())


def _busy(exc: BaseException) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock (worth waiting for)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED (+ extended)
        return True
    text = str(exc)
    return "locked" in text or "busy" in text


def _nap(deadline: float, attempt: int) -> None:
    """A short, jittered sleep before retrying a busy step (never past ``deadline``)."""
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(min(left, random.uniform(0.5, 1.5) * min(0.05, 0.002 * 2 ** min(attempt, 5))))


_SQLITE_MAGIC = b"SQLite format 3\x00"


class _SQLite:
    def __init__(self, path: str, url: str, timeout: float, create: bool = True) -> None:
        self.path, self.url, self.timeout = path, url, timeout
        self.abspath = os.path.abspath(path)  # identity checks: whatever the working directory
        deadline = time.monotonic() + timeout
        folder = os.path.dirname(os.path.abspath(path))
        try:
            if create:
                os.makedirs(folder, exist_ok=True)
                self.conn = sqlite3.connect(path, timeout=timeout, isolation_level=None,
                                            check_same_thread=False)
            else:  # mode=rw: never creates the file (nor its folder)
                self.conn = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=rw",
                                            timeout=timeout, isolation_level=None,
                                            check_same_thread=False, uri=True)
        except sqlite3.OperationalError as exc:
            if not create:
                raise LedgerNotFound(f"--ledger {url}: no ledger at {path} ({exc}); nothing "
                                     "was created") from exc
            raise self.unavailable(exc) from exc
        except (sqlite3.Error, OSError) as exc:
            raise self.unavailable(exc) from exc
        # Switching to WAL takes the database's exclusive lock and can fail at once with
        # SQLITE_BUSY (without the busy handler) while another connection opens the same new
        # file: retried with short sleeps up to the timeout, like every step of opening.
        attempt = 0
        while True:
            try:
                self.conn.execute("PRAGMA foreign_keys = ON")
                if create:  # reading only: an existing ledger is in WAL mode already (and
                    # another SQLite file is not changed)
                    mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    if str(mode).lower() != "wal":
                        raise sqlite3.OperationalError(f"cannot use a WAL journal (got {mode})")
                self.conn.execute("PRAGMA synchronous = FULL")  # a committed entry survives
                break
            except sqlite3.Error as exc:
                if _busy(exc) and time.monotonic() < deadline:
                    _nap(deadline, attempt)
                    attempt += 1
                    continue
                self.close()
                raise self.unavailable(exc) from exc

    def unavailable(self, exc: BaseException) -> LedgerUnavailable:
        text = str(exc)
        if _busy(exc):
            err = LedgerUnavailable(
                f"--ledger {self.url}: the ledger is locked by another process for more than "
                f"{self.timeout:g} s ({text}); {_NOTHING_RUN}. Retry when the other run has "
                "recorded its entry")
            err.busy = True
            return err
        return LedgerUnavailable(f"--ledger {self.url}: cannot use the SQLite ledger "
                                 f"{self.path} ({type(exc).__name__}: {text}); {_NOTHING_RUN}")

    def wait_at_most(self, seconds: float) -> None:
        """The busy timeout of the next statements (what is left of an open's timeout)."""
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute(f"PRAGMA busy_timeout = {max(1, int(seconds * 1000))}")

    def file_id(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of the ledger's file now; None if there is none."""
        try:
            st = os.stat(self.abspath)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def file_problems(self, file_id: tuple[int, int] | None) -> list[str]:
        """How the file at the ledger's path differs from the one opened (``file_id``)."""
        try:
            st = os.stat(self.abspath)
        except FileNotFoundError:
            return [f"{self.path} no longer exists"]
        except OSError as exc:
            return [f"{self.path} cannot be read ({exc})"]
        if (st.st_dev, st.st_ino) != file_id:
            return [f"{self.path} is another file now (device/inode {st.st_dev}/{st.st_ino}, "
                    f"was {file_id[0]}/{file_id[1]})" if file_id else
                    f"{self.path} is another file now"]
        try:
            with open(self.abspath, "rb") as fh:
                head = fh.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            return [f"{self.path} cannot be read ({exc})"]
        if head != _SQLITE_MAGIC:
            return [f"{self.path} is no longer a SQLite database (it begins {head[:16]!r})"]
        return []

    @contextlib.contextmanager
    def transaction(self, write: bool) -> Iterator[_Tx]:
        # BEGIN IMMEDIATE takes the database's write lock at once (waiting up to the busy
        # timeout): a reservation's read of what was spent and its insert are one serial step.
        try:
            self.conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            raise self.unavailable(exc) from exc
        try:
            yield _Tx(self.conn.cursor(), False)
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.IntegrityError):
                raise LedgerError(f"--ledger {self.url}: {exc}") from exc
            if isinstance(exc, sqlite3.Error):
                raise self.unavailable(exc) from exc
            raise
        try:
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            raise self.unavailable(exc) from exc

    def has_schema(self) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                                 "'ldp_beam_meta'").fetchone() is not None

    def has_schema_tx(self, tx: "_Tx") -> bool:
        return tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                      "'ldp_beam_meta'") is not None

    def errors(self) -> tuple:
        return (sqlite3.Error,)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()


class _Postgres:
    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.shown, self.timeout = url, redact(url), timeout
        try:
            import psycopg  # lazy: optional dependency (the [postgres] extra)
        except ImportError as exc:
            raise LedgerUnavailable(f"--ledger {self.shown}: a PostgreSQL ledger needs psycopg "
                                    "(pip install 'ldp-beam[postgres]')") from exc
        self.psycopg = psycopg
        self.conn = None
        self.connect()

    def connect(self) -> None:
        try:
            # libpq's connect_timeout bounds the whole connection (a refused port fails at once,
            # a server that never answers after timeout seconds; libpq's minimum is 2 s)
            self.conn = self.psycopg.connect(self.url, autocommit=True,
                                             connect_timeout=max(2, math.ceil(self.timeout)),
                                             application_name="ldp-beam ledger")
        except self.psycopg.Error as exc:
            raise self.unavailable(exc) from None

    def unavailable(self, exc: BaseException) -> LedgerUnavailable:
        text = " ".join(str(exc).split())
        if self.url and ":" in self.url:  # never echo a password libpq may have quoted
            pw = urlsplit(self.url).password
            if pw:
                text = text.replace(pw, "***")
        errors = self.psycopg.errors
        if isinstance(exc, (errors.LockNotAvailable, errors.QueryCanceled)):
            err = LedgerUnavailable(
                f"--ledger {self.shown}: the ledger is locked by another run for more than "
                f"{self.timeout:g} s ({text}); {_NOTHING_RUN}")
            err.busy = True
            return err
        return LedgerUnavailable(f"--ledger {self.shown}: cannot reach the PostgreSQL ledger "
                                 f"({type(exc).__name__}: {text}); {_NOTHING_RUN}")

    def wait_at_most(self, seconds: float) -> None:
        pass  # lock_timeout is set per transaction

    def file_id(self) -> None:
        return None

    def file_problems(self, file_id: Any) -> list[str]:
        return []

    @contextlib.contextmanager
    def transaction(self, write: bool) -> Iterator[_Tx]:
        psycopg = self.psycopg
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.connect()  # e.g. the server closed an idle connection during a long run
        try:
            ctx = self.conn.transaction()
            ctx.__enter__()
        except psycopg.OperationalError:
            self.connect()  # one reconnection: the connection died while idle
            try:
                ctx = self.conn.transaction()
                ctx.__enter__()
            except psycopg.Error as exc:
                raise self.unavailable(exc) from None
        except psycopg.Error as exc:
            raise self.unavailable(exc) from None
        try:
            cur = self.conn.cursor()
            # the checks under a row or advisory lock must see what the previous holder
            # committed: READ COMMITTED whatever the server's default_transaction_isolation
            cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            ms = int(self.timeout * 1000)
            cur.execute(f"SET LOCAL lock_timeout = {ms}")
            cur.execute(f"SET LOCAL statement_timeout = {ms * 6}")
            yield _Tx(cur, True)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                ctx.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, psycopg.IntegrityError):
                raise LedgerError(f"--ledger {self.shown}: {exc}") from None
            if isinstance(exc, psycopg.Error):
                raise self.unavailable(exc) from None
            raise
        try:
            ctx.__exit__(None, None, None)
        except psycopg.Error as exc:
            raise self.unavailable(exc) from None

    def has_schema(self) -> bool:
        with self.conn.cursor() as cur:
            cur.execute("SELECT to_regclass('ldp_beam_meta') IS NOT NULL")
            return bool(cur.fetchone()[0])

    def has_schema_tx(self, tx: "_Tx") -> bool:
        return bool(tx.one("SELECT to_regclass('ldp_beam_meta') IS NOT NULL")[0])

    def errors(self) -> tuple:
        return (self.psycopg.Error,)

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()

