"""Warehouse tables as sources: DuckDB, PostgreSQL and Apache Iceberg, read as Arrow record
batches into the same batch path as files (:class:`~ldp_beam.transforms.read.ReadTable` takes
their URLs).

URLs (``duckdb://``, ``postgresql://`` or ``postgres://``, ``iceberg://``) and their settings
(``table``, ``query``, ``order_by``, ``split_rows``, ``snapshot``, ``catalog``; also
:class:`ReadTable` keywords) are described in docs/guides/sources-sinks.md ("URL rules").

A ``query=`` is exactly one read-only SELECT, checked when the source is opened: DuckDB's own
parser (``duckdb.extract_statements`` on the query alone) must find one statement, of type
SELECT; for PostgreSQL, no ``;`` may stand outside string literals, quoted identifiers, dollar
quotes and comments and the statement must start with SELECT, WITH, VALUES or TABLE (the server
refuses a second command as well: every statement is prepared). Anything else is refused with a
:class:`SourceError` naming ``query=`` and what was found; one trailing ``;`` is dropped. What
the SELECT can reach is bounded by the connection: DuckDB databases are opened read-only with
external access disabled and the configuration locked (``DUCKDB_CONFIG``: no file outside the
database is read or written, no ATTACH, no extension); every PostgreSQL connection runs
read-only transactions (``default_transaction_read_only``, set at connection and again before
each statement of a pooled connection), so the server refuses writes, DDL, ``nextval()`` and
writing functions a query calls. Functions that reach the server's files (``pg_read_file``,
``lo_export``) need superuser or ``pg_read/write_server_files`` rights that a read-only
transaction does not remove: read with a role that has neither (a ``query=`` source run as a
superuser logs a warning).

Record identity and splits (what makes seeded runs runner-independent and unseeded noise
retry-proof): each row has a stream (a stable 64-bit number from a name) and a record number,
and the work units are planned when the pipeline is built, then spread across workers by a
reshuffle, each read by one query:

* **DuckDB table**: stream ``duckdb:<file name>:<table>``, record number = the row's ``rowid``
  (its position in the table; stable while the table is not rewritten). Units are ``rowid``
  ranges of ``split_rows`` (DuckDB skips the other row groups).
* **PostgreSQL table**: stream ``postgresql:<db>:<table>``, record number = the row's position
  in physical (``ctid``) order. Units are ranges of heap pages (about ``split_rows`` rows each,
  the last one open-ended) read by TID range scans; their row counts are taken when planned,
  each by a TID range scan of its own pages (so every unit knows its first record number, and
  planning reads the table once, never once per unit). Stable while the table is not updated
  or vacuumed (``VACUUM FULL``, ``CLUSTER``): read a table that is not being written, or a copy.
* **A query, or a table with ``order_by``** (DuckDB and PostgreSQL): stream
  ``<engine>:<db>:query:<text>`` (or ``:<table>``), record number = the row's position in a
  deterministic order: the ``order_by`` columns, then every other column as a tie-breaker (so
  without ``order_by`` the rows are ordered by all their columns; rows equal in every column
  are interchangeable, so which of them gets which number changes nothing). Units are
  ``ORDER BY ... LIMIT split_rows OFFSET k`` slices of the ordered result: each unit runs the
  query again (a key with an index makes that cheap; otherwise raise ``split_rows`` for fewer
  units). A column type the database cannot sort (PostgreSQL ``json``, geometric types) is
  left out of the tie-breakers; if the order must rely on it, give ``order_by``.
* **Iceberg**: stream ``iceberg:<table>:<data file path relative to the table location>``,
  record number = the row's position in that data file after the snapshot's deletes; one unit
  per data file of the pinned snapshot (files are immutable, so this is stable for as long as
  the snapshot exists). Columns follow the table's current schema (pyiceberg's projection).

Errors (raised when the pipeline is built, naming the source; passwords are never shown): a
missing database file, an unreachable server, missing or refused credentials, an unknown table
or catalog, an invalid query, a partition/order column that does not exist. A table or query
with no rows raises :class:`EmptySourceError` unless ``allow_empty=True`` (then the run is
empty and says so through its counts). Column types are kept as Arrow; whether they fit a
mechanism is decided by its validation, which dead-letters the rows that do not fit with the
source and their record number. A unit that fails while it is read becomes a reader dead
letter ("unreadable input: ...") with the source, its first unread record number and the rows
it stands for, exactly as for files, so counts reconcile.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import queue
import re
import sqlite3
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Sequence
from urllib.parse import quote, unquote, urlsplit

import numpy as np
import pyarrow as pa

from ldp_beam.errors import ParameterError
from ldp_beam.rng import stream_id
from ldp_beam.urls import url_file

from .batches import KeyedBatch
from .io import (DEFAULT_BATCH_ROWS, DEFAULT_NULL_VALUES, EmptySourceError, ReadUnitFn,
                 SourceError, _error_text)

DEFAULT_SPLIT_ROWS = 1 << 20
log = logging.getLogger(__name__)
SCHEMES = {"duckdb": "duckdb", "postgresql": "postgresql", "postgres": "postgresql",
           "iceberg": "iceberg"}
SETTINGS = ("table", "query", "order_by", "split_rows", "snapshot", "catalog")
RECORD_COLUMN = "__ldp_record"
CONNECT_TIMEOUT = 10  # seconds, for PostgreSQL unless the URL says otherwise
# PostgreSQL types without a default btree ordering: left out of tie-breakers
_PG_UNSORTABLE = {"json", "xml", "point", "line", "lseg", "box", "path", "polygon", "circle",
                  "tsvector", "tsquery", "txid_snapshot", "pg_snapshot"}


def is_source_url(url: Any) -> bool:
    return isinstance(url, str) and url.split("://", 1)[0].lower() in SCHEMES and "://" in url


def redact(url: str) -> str:
    """The URL without a password (for messages, dead letters and manifests)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
    return url.replace(parts.netloc, netloc, 1)


def parse_settings(url: str) -> tuple[str, dict[str, str], list[tuple[str, str]]]:
    """``(the URL before '?', our settings, other parameters)``. Parameters are split on ``&``
    only before a ``name=``; values are percent-decoded but ``+`` stays a plus."""
    base, _, q = url.partition("?")
    ours: dict[str, str] = {}
    other: list[tuple[str, str]] = []
    if q:
        for part in re.split(r"&(?=[A-Za-z_][A-Za-z0-9_]*=)", q):
            k, _, v = part.partition("=")
            k, v = unquote(k), unquote(v)
            if k in SETTINGS:
                if k in ours:
                    raise SourceError(f"{redact(url)}: {k!r} is given twice")
                ours[k] = v
            else:
                other.append((k, v))
    return base, ours, other


def quote_ident(name: str) -> str:
    """``schema.table`` -> ``"schema"."table"`` (each part quoted as written)."""
    parts = name.split(".")
    if not name or any(p == "" for p in parts):
        raise ParameterError("table", name, "a table name such as T or SCHEMA.T")
    return ".".join('"' + p.replace('"', '""') + '"' for p in parts)


def _col(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _order_list(order_by: Any) -> list[str]:
    if order_by is None or order_by == "":
        return []
    cols = order_by.split(",") if isinstance(order_by, str) else list(order_by)
    cols = [c.strip() for c in cols]
    if any(not c for c in cols) or len(set(cols)) != len(cols):
        raise ParameterError("order_by", order_by, "distinct column names, e.g. 'id' or 'a,b'")
    return cols


def _split_rows(v: Any) -> int:
    if v is None:
        return DEFAULT_SPLIT_ROWS
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = -1
    if isinstance(v, bool) or n < 1 or str(n) != str(v).strip():
        raise ParameterError("split_rows", v, "a whole number of rows >= 1")
    return n


def _plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, f.nullable) for f in schema])


@dataclass(frozen=True)
class SourceUnit:
    """One work unit of a database source: ``sql`` (or an Iceberg data file in ``path``) read by
    one worker. ``offset``: the record number of its first row (row-numbered units); ``rows``:
    its rows when planned (None: unknown); ``ids``: the result's first column holds each row's
    record number (DuckDB ``rowid``)."""

    label: str
    sql: str = ""
    offset: int = 0
    rows: int | None = None
    ids: bool = False
    path: str = ""
    stream: str = ""
    pages: tuple | None = None  # PostgreSQL: the heap pages [a, b) (b None: to the end)


class Source:
    """A planned database source: ``name`` (redacted URL), ``kind``, ``schema``, ``units``,
    ``stream`` (the name keying its records) and ``rows`` (counted when planned)."""

    kind = ""
    #: attributes that stay in their process (connections, a loaded table): a pickled copy
    #: starts again from these values
    _process_local: dict = {}

    def __getstate__(self):
        return {**self.__dict__, **{k: copy.copy(v) for k, v in self._process_local.items()}}

    def __init__(self, url: str, settings: dict, allow_empty: bool) -> None:
        self.url = url
        self.name = redact(url)
        self.settings = settings
        self.split_rows = _split_rows(settings.get("split_rows"))
        self.order_by = _order_list(settings.get("order_by"))
        table, query = settings.get("table"), settings.get("query")
        if (table is None) == (query is None):
            raise SourceError(f"{self.name}: give exactly one of table=NAME or query=SELECT ...")
        if table is not None:
            quote_ident(table)
        if query is not None:
            if not query.strip():
                raise SourceError(f"{self.name}: the query is empty")
            query = self._check_query(query)
        self.table, self.query = table, query
        self.units: list[SourceUnit] = []
        self.schema: pa.Schema = pa.schema([])
        self.rows = 0
        self.plan()
        if self.rows == 0 and not allow_empty:
            what = f"table {table}" if table is not None else "the query"
            raise EmptySourceError(f"{self.name}: {what} returns no rows; nothing to read "
                                   "(pass allow_empty=True to run on an empty input)")

    # -- what subclasses provide
    def plan(self) -> None:
        raise NotImplementedError

    def _check_query(self, query: str) -> str:
        """The ``query=`` text, checked to be exactly one read-only SELECT (raises
        :class:`SourceError` naming ``query=`` and what was found); the text to run."""
        return query

    def read(self, unit: SourceUnit, batch_rows: int) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    # -- shared planning for queries (and tables with order_by)
    def _relation(self) -> str:
        # the query on lines of its own: a trailing line comment (-- ...) cannot swallow the
        # closing parenthesis
        return f"(\n{self.query}\n)" if self.query is not None else quote_ident(self.table)

    def _what(self) -> str:
        return f"query:{self.query}" if self.query is not None else self.table

    def _order_clause(self, sortable: Sequence[str]) -> str:
        for c in self.order_by:
            if c not in self.schema.names:
                raise SourceError(f"{self.name}: order_by column {c!r} is not a column of the "
                                  f"result; columns: {', '.join(self.schema.names)}")
        rest = [c for c in sortable if c not in self.order_by]
        cols = self.order_by + rest
        if not cols:
            raise SourceError(f"{self.name}: no column can order the rows; give order_by")
        return ", ".join(_col(c) for c in cols)

    def _ordered_units(self, run: Any, sortable: Sequence[str], stream: str) -> None:
        """Count the rows, then plan units of ``split_rows`` of them in a deterministic order;
        ``run``: a statement -> its rows."""
        rel = self._relation()
        self.rows = total = int(run(f"SELECT count(*) FROM {rel} AS __ldp_q")[0][0])
        order = self._order_clause(sortable)
        self.units = []
        for off in range(0, total, self.split_rows):
            n = min(self.split_rows, total - off)
            sql = (f"SELECT * FROM {rel} AS __ldp_q ORDER BY {order} "
                   f"LIMIT {n} OFFSET {off}")
            self.units.append(SourceUnit(f"rows [{off}, {off + n}) by {order}", sql, off, n,
                                         stream=stream))
        if self.units:  # an order the database cannot apply fails here, not in a worker
            run(self.units[0].sql.rsplit(" LIMIT ", 1)[0] + " LIMIT 0")


# --------------------------------------------------------------------------- DuckDB
class DuckDBSource(Source):
    kind = "duckdb"
    _process_local = {"_con": None}

    def __init__(self, url: str, settings: dict, allow_empty: bool) -> None:
        self.path = url_file(url)
        if not self.path:
            raise SourceError(f"{url}: no database file; write duckdb://PATH.db?table=T "
                              "(relative; duckdb:///abs/PATH.db absolute)")
        self._con = None
        super().__init__(url, settings, allow_empty)

    def _duckdb(self):
        try:
            import duckdb  # lazy: optional dependency (the [duckdb] extra)
        except ImportError:
            raise SourceError(f"{self.name}: reading DuckDB needs the duckdb package "
                              "(pip install 'ldp-beam[duckdb]')") from None
        return duckdb

    def _check_query(self, query: str) -> str:
        """Exactly one SELECT statement, by DuckDB's own parser on the query text alone (a
        query that closes the subquery it is read through and runs more statements is refused
        here); a trailing ``;`` is dropped."""
        text = query.rstrip()
        while text.endswith(";"):
            text = text[:-1].rstrip()
        _duck_one_select(self._duckdb(), text or query, f"{self.name}: query=")
        return text

    def _connect(self):
        duckdb = self._duckdb()
        if self._con is None:
            if not os.path.isfile(self.path):
                rel = self.path.lstrip("/")  # duckdb:///x.db read as SQLAlchemy would: x.db
                hint = (f"; {rel!r} in the current folder is duckdb://{rel} (the text after "
                        "duckdb:// is the path, relative unless it starts with /)"
                        if self.path.startswith("/") and rel and os.path.isfile(rel) else "")
                raise SourceError(f"{self.name}: the DuckDB database file {self.path!r} does "
                                  "not exist" + hint)
            try:
                self._con = duckdb.connect(self.path, read_only=True, config=DUCKDB_CONFIG)
            except Exception as exc:  # noqa: BLE001
                raise SourceError(f"{self.name}: cannot open the DuckDB database: "
                                  f"{_error_text(exc)}") from None
        return self._con

    def _checked(self, sql: str) -> str:
        """``sql`` (a statement this source built around its query) after checking that it is
        still one SELECT (a second line of defence behind :meth:`_check_query`)."""
        if self.query is not None:
            _duck_one_select(self._duckdb(), sql, f"{self.name}: query=")
        return sql

    def _sql(self, sql: str, arrow: bool = False):
        """Rows of ``sql`` (a list of tuples), or with ``arrow`` its Arrow schema."""
        sql = self._checked(sql)
        try:
            if arrow:
                return _duck_reader(self._connect().sql(sql), 1024).schema
            return self._connect().execute(sql).fetchall()
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"{self.name}: {_error_text(exc)}") from None

    def plan(self) -> None:
        rel = self._relation()
        self.schema = _plain_schema(self._sql(f"SELECT * FROM {rel} AS __ldp_q LIMIT 0",
                                              arrow=True))
        base = os.path.basename(self.path)
        if self.table is not None and not self.order_by and "rowid" not in self.schema.names \
                and self._has_rowid():
            stream = f"duckdb:{base}:{self.table}"
            t = quote_ident(self.table)
            n, lo, hi = self._sql(f"SELECT count(*), min(rowid), max(rowid) FROM {t}")[0]
            self.rows = int(n)
            if n:
                step = self.split_rows
                if n == hi - lo + 1:  # no gaps (nothing deleted): the counts follow, no scan
                    counts = {u: min(step, n - u * step) for u in range(0, -(-n // step))}
                else:
                    counts = dict(self._sql(
                        f"SELECT (rowid - {lo}) // {step} AS u, count(*) FROM {t} GROUP BY u"))
                for u in range(0, (hi - lo) // step + 1):
                    a, b = lo + u * step, lo + (u + 1) * step
                    if counts.get(u, 0):
                        self.units.append(SourceUnit(
                            f"rowid [{a}, {b})",
                            f'SELECT rowid AS "{RECORD_COLUMN}", * FROM {t} '
                            f"WHERE rowid >= {a} AND rowid < {b}",
                            a, int(counts[u]), ids=True, stream=stream))
            return
        self._ordered_units(self._sql, list(self.schema.names), f"duckdb:{base}:{self._what()}")

    def _has_rowid(self) -> bool:
        try:
            self._connect().execute(f"SELECT rowid FROM {quote_ident(self.table)} LIMIT 0")
            return True
        except Exception:  # noqa: BLE001 - a view has no rowid: read it as a query
            return False

    def read(self, unit: SourceUnit, batch_rows: int) -> Iterator[pa.RecordBatch]:
        yield from _duck_reader(self._connect().sql(self._checked(unit.sql)), batch_rows)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


#: every DuckDB source connection: read-only (``read_only=True``), and nothing outside the
#: database file is read or written (no COPY TO/FROM a file, no read_csv('/etc/...'), no ATTACH,
#: no extension loads), locked so that no statement can turn it back on. DuckDB still reads the
#: database file itself and spills large sorts to its temporary directory.
DUCKDB_CONFIG = {"enable_external_access": False, "lock_configuration": True}


def _duck_one_select(duckdb: Any, sql: str, what: str) -> None:
    """Raise :class:`SourceError` unless ``sql`` is exactly one SELECT statement (DuckDB's
    parser: ``duckdb.extract_statements``)."""
    try:
        statements = duckdb.extract_statements(sql)
    except Exception as exc:  # noqa: BLE001
        raise SourceError(f"{what} must be exactly one read-only SELECT statement; DuckDB "
                          f"cannot parse it as one: {_error_text(exc)}") from None
    kinds = [getattr(st.type, "name", str(st.type)) for st in statements]
    if kinds != ["SELECT"]:
        found = (f"{len(kinds)} statements ({', '.join(kinds)})" if len(kinds) > 1 else
                 f"a {kinds[0]} statement" if kinds else "no statement")
        raise SourceError(f"{what} must be exactly one read-only SELECT statement; found "
                          f"{found}")


def _duck_reader(rel: Any, batch_rows: int) -> pa.RecordBatchReader:
    """A DuckDB relation as Arrow batches (DuckDB 2 names it to_arrow_reader, 1.x
    fetch_arrow_reader)."""
    if hasattr(type(rel), "to_arrow_reader"):
        return rel.to_arrow_reader(batch_rows)
    return rel.fetch_arrow_reader(batch_rows)


# --------------------------------------------------------------------------- PostgreSQL
class PostgresSource(Source):
    """A PostgreSQL table or query read through ADBC (binary COPY into Arrow).

    Every connection is opened with ``options=-c default_transaction_read_only=on`` (added to
    any ``options`` the URL gives), so each transaction starts read-only; planning runs in one
    such transaction, and a pooled connection sets the option again before each unit's
    statement (a query's ``set_config()`` could otherwise have turned the session default off
    for the next statement on that connection).

    How it reads: planning counts the rows of each unit's pages (TID range scans, the
    statements spread over two connections at once); a unit's pages are then read in two
    halves, each by a thread on a pooled connection of its own into a short queue, while the
    pipeline processes the batches already read (the server scans and sends and ADBC decodes
    without the GIL, in parallel with Beam). Batches hold ~1 MiB of COPY data.

    Speed, and why 1.5x Parquet is out of reach on 2 cores at 10^7 rows (``ldp-beam bench
    --only sources``: one float64 column, ``ReadTable | Perturb | EstimateGlobally`` on the
    DirectRunner; CPU seconds by getrusage for the pipeline process, /proc for the server's
    processes; medians of 3; 2026-11, a 2-core machine shared with other benchmarks):

    ===========================================  ==========  ==========
    CPU seconds                                   10^6 rows   10^7 rows
    ===========================================  ==========  ==========
    Parquet pipeline (all of it, client only)          1.12        1.78
    PostgreSQL pipeline, client process                1.40        3.24
    PostgreSQL pipeline, server processes              0.28        2.31
    server alone: ``COPY (SELECT ...) TO '/dev/null'``             0.99
    server: planning's counts (TID range scans)                    0.54
    server: the read (TID range scans, sent)                       1.18
    client: ADBC decode alone (no Beam)                            1.38
    ===========================================  ==========  ==========

    At 10^7 rows the PostgreSQL pipeline needs 3.24 + 2.31 = 5.55 CPU seconds; on 2 cores no
    overlap can bring its wall time under 5.55 / 2 = 2.78 s, while the Parquet pipeline runs in
    about its own 1.78 CPU seconds (1.72 s wall measured in a quiet moment): the floor is
    2.78 / 1.78 = 1.56x Parquet, above the 1.5x target, before any start-up or scheduling
    cost. The extra work is inherent to the protocol: the server must read and visibility-check
    every tuple twice (once to count the units' rows for record numbers that do not depend on
    the split, once to send them) and format them as COPY rows, and the client must parse
    every row's fields (1.38 s for 10^7 values, against ~0.3 s for Parquet's column chunks).
    On a machine busy with other work, wall time follows CPU seconds and the ratio tends to
    the CPU ratio, 5.55 / 1.78 = 3.1x (measured 2.2-3.0x at load 5-10). At 10^6 rows the
    floor is (1.40 + 0.28) / 2 = 0.84 s, well within 1.5x of Parquet's ~1.1 s (measured
    1.22x). The threads overlap; they do not remove work: the read alone (no Beam, 10^7 rows)
    took 3.6 s instead of 4.6 s at the same 1.4-1.5 client CPU seconds. More cores (or a
    server on another machine) lift the limit: then only the client's 3.24 s remain on the
    client."""

    kind = "postgresql"
    _process_local = {"_con": None, "_pool": []}

    def __init__(self, url: str, settings: dict, allow_empty: bool, libpq: list) -> None:
        parts = urlsplit(url.split("?", 1)[0])
        self.database = parts.path.lstrip("/") or (parts.username or "")
        params = dict(libpq)
        params.setdefault("connect_timeout", str(CONNECT_TIMEOUT))
        # every transaction of every connection starts read-only (see the class docstring)
        opts = params.get("options", "")
        params["options"] = quote((opts + " " if opts else "") + _PG_READ_ONLY_OPTION, safe="")
        query = "&".join(f"{k}={v}" for k, v in params.items())
        self.conninfo = "postgresql://" + parts.netloc + parts.path + "?" + query
        self._con = None
        self._pool: list = []  # idle connections of the readers' threads (autocommit)
        super().__init__(url, settings, allow_empty)

    def _check_query(self, query: str) -> str:
        """Exactly one SELECT (or WITH ... SELECT, VALUES, TABLE) statement, checked as the
        module docstring says; a trailing ``;`` is dropped."""
        text = query.rstrip()
        while text.endswith(";") and _pg_split(text[:-1]) is not None:
            text = text[:-1].rstrip()
        parts = _pg_split(text)
        what = f"{self.name}: query="
        if parts is None:
            raise SourceError(f"{what} must be exactly one read-only SELECT statement; it has an "
                              "unterminated string, quoted identifier or comment")
        if len(parts) != 1:
            found = ", ".join(_pg_first_word(p) or "(empty)" for p in parts)
            raise SourceError(f"{what} must be exactly one read-only SELECT statement; found "
                              f"{len(parts)} statements ({found})")
        word = _pg_first_word(parts[0])
        if word not in _PG_QUERY_WORDS:
            raise SourceError(f"{what} must be exactly one read-only SELECT statement; found "
                              f"a statement that starts with {word!r}")
        return text

    def _connect(self):
        if self._con is None:
            self._con = self._new_connection(autocommit=False)
            if self.query is not None:
                _warn_if_superuser(self)
        return self._con

    def _new_connection(self, autocommit: bool):
        return _adbc_connect(self.conninfo, self.name, "reading", autocommit=autocommit)

    def _acquire(self):
        """An idle connection of the pool, or a new one (autocommit: no transaction is held
        open between statements). ``list.pop`` is atomic: threads may call this at once."""
        try:
            return self._pool.pop()
        except IndexError:
            return self._new_connection(autocommit=True)

    def _release(self, con, reusable: bool) -> None:
        if reusable:
            self._pool.append(con)
        else:
            with contextlib.suppress(Exception):
                con.close()

    def _query(self, sql: str, arrow: bool = False, rows: bool = True):
        cur = self._connect().cursor()
        try:
            cur.execute(sql)
            if not rows:
                return None
            return cur.fetch_arrow_table() if arrow else cur.fetchall()
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"{self.name}: {_pg_error(exc)}") from None
        finally:
            cur.close()

    def plan(self) -> None:
        rel = self._relation()
        head = self._query(f"SELECT * FROM {rel} AS __ldp_q LIMIT 0", arrow=True).schema
        self.schema = _plain_schema(head)
        sortable = [f.name for f in head
                    if (f.metadata or {}).get(b"POSTGRESQL:type", b"").decode() not in
                    _PG_UNSORTABLE]
        if self.table is not None and not self.order_by:
            self._plan_pages()
            return
        self._ordered_units(self._query, sortable, f"postgresql:{self.database}:{self._what()}")

    def _plan_pages(self) -> None:
        """Units of about ``split_rows`` rows as ranges of heap pages (the last one open-ended,
        so rows on pages added since the size was taken are in it), each unit's rows counted
        by a TID range scan of its own pages only: the counts together read the table once, in
        one statement per ``_COUNT_BATCH`` units (a plain ``count(*)`` per range may be planned
        as a scan of the whole table, once per unit)."""
        t = quote_ident(self.table)
        lit = "'" + t.replace("'", "''") + "'"
        kind, relpages, reltuples = self._query(
            f"SELECT relkind, relpages, reltuples FROM pg_class WHERE oid = {lit}::regclass")[0]
        if kind not in ("r", "m", "t"):  # a view or a foreign/partitioned table: no ctid pages
            raise SourceError(f"{self.name}: {self.table} is not a plain table (relkind "
                              f"{kind!r}); give order_by=COLUMNS to read it in a fixed order")
        pages = int(self._query(f"SELECT pg_relation_size({lit}::regclass) / "
                                "current_setting('block_size')::int")[0][0])
        per_page = self._rows_per_page(t, pages, relpages, reltuples)
        step = max(1, math.ceil(self.split_rows / per_page))
        bounds = [(a, a + step if a + step < pages else None) for a in range(0, pages, step)]
        if not bounds:  # no pages yet: one open-ended unit, counted like any other
            bounds = [(0, None)]
        # the counting statements run on _STREAMS connections at once (the server counts
        # the halves of the table in two backends: planning takes half the time on two cores)
        size = max(1, min(_COUNT_BATCH, math.ceil(len(bounds) / _STREAMS)))
        statements = []
        for i in range(0, len(bounds), size):
            part = bounds[i:i + size]
            statements.append(" UNION ALL ".join(
                f"SELECT {j}::int AS u, count(*) AS n FROM {t} WHERE {_page_range(a, b)}"
                for j, (a, b) in enumerate(part, i)))
        got: dict[int, int] = {}
        try:
            for rows in self._tid_queries(statements):
                got.update((int(u), int(k)) for u, k in rows)
        finally:
            self._close_pool()  # the launcher keeps no idle session once planned
        counts = [got[j] for j in range(len(bounds))]
        stream = f"postgresql:{self.database}:{self.table}"
        off = 0
        for (a, b), n in zip(bounds, counts):
            if n:
                label = f"pages [{a}, {b})" if b is not None else f"pages [{a}, end)"
                mid = (a + min(pages if b is None else b, pages)) // 2
                self.units.append(SourceUnit(label, _page_select(t, a, b),
                                             off, n, stream=stream,
                                             pages=(a, b, mid if a < mid else None)))
            off += n
        self.rows = off

    def _rows_per_page(self, t: str, pages: int, relpages: int, reltuples: float) -> float:
        """Rows per heap page, to size the units: the statistics' (VACUUM/ANALYZE) when there
        are some, else counted on the first pages (a TID range scan of at most 128 pages)."""
        if relpages > 0 and reltuples > 0:
            return max(float(reltuples) / relpages, 1.0)
        sample = min(pages, 128)
        if sample == 0:
            return 1.0
        with self._tid_scans():
            n = int(self._query(f"SELECT count(*) FROM {t} WHERE "
                                f"{_page_range(0, sample)}")[0][0])
        return max(n / sample, 1.0)

    def _tid_queries(self, statements: Sequence[str]) -> list[list[tuple]]:
        """The rows of each statement, run as TID range scans (never a sequential scan), the
        statements spread over up to ``_STREAMS`` pooled connections at once."""
        results: list = [None] * len(statements)
        errors: list[BaseException] = []
        todo = list(range(len(statements)))[::-1]

        def run(cur) -> None:
            while todo and not errors:
                try:
                    i = todo.pop()
                except IndexError:
                    break
                cur.execute(statements[i])
                results[i] = cur.fetchall()

        def work():  # a helper thread, on a pooled connection
            con, ok = None, False
            try:
                con = self._acquire()
                cur = con.cursor()
                try:
                    cur.execute("SET enable_seqscan = off")
                    run(cur)
                    ok = True
                finally:
                    cur.close()
            except BaseException as exc:  # noqa: BLE001 - raised below, in the caller
                errors.append(exc)
            finally:
                if con is not None:
                    self._release(con, ok)

        threads = [threading.Thread(target=work, daemon=True)
                   for _ in range(min(_STREAMS, len(statements)) - 1)]
        for th in threads:
            th.start()
        try:  # this thread on the planning connection (no connection opened for it)
            with self._tid_scans():
                cur = self._connect().cursor()
                try:
                    run(cur)
                finally:
                    cur.close()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        for th in threads:
            th.join()
        if errors:
            exc = errors[0]
            if isinstance(exc, SourceError):
                raise exc
            raise SourceError(f"{self.name}: {_pg_error(exc)}") from None
        return results

    @contextlib.contextmanager
    def _tid_scans(self):
        """Page ranges counted by TID range scans, never sequential scans (which the planner
        may choose for a wide range, reading the whole table for each)."""
        self._query("SET enable_seqscan = off", rows=False)
        try:
            yield
        finally:
            with contextlib.suppress(SourceError):  # (after a failed statement: its error)
                self._query("RESET enable_seqscan", rows=False)

    def read(self, unit: SourceUnit, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The unit's rows, in order. Each part of the unit (the two halves of its pages) is
        read by a thread of its own, on a connection of its own, into a short queue, while the
        caller (Beam) processes the batches already read: the server scans and sends, the
        driver decodes (both without the GIL) and the pipeline perturbs at the same time."""
        if unit.pages is None:
            parts = [(unit.sql, False)]
        else:
            a, b, mid = unit.pages
            t = quote_ident(self.table)
            cuts = [(a, b)] if mid is None else [(a, mid), (mid, b)]
            parts = [(_page_select(t, x, y), True) for x, y in cuts]
        readers = [_Prefetch(self, sql, tid) for sql, tid in parts]
        try:
            for r in readers:
                for b in r:
                    for s in range(0, b.num_rows, batch_rows):
                        yield b.slice(s, batch_rows)
        finally:
            for r in readers:
                r.cancel()

    def _close_pool(self) -> None:
        pool, self._pool = self._pool, []
        for con in pool:
            with contextlib.suppress(Exception):
                con.close()

    def close(self) -> None:
        self._close_pool()
        if self._con is not None:
            try:
                self._con.close()
            finally:
                self._con = None


_COUNT_BATCH = 256  # page ranges counted per planning statement
_BATCH_HINT = "adbc.postgresql.batch_size_hint_bytes"
# batches of ~1 MiB of COPY data (the driver's default, 16 MiB, waits for that much before
# handing over a batch, and the first batch of a unit comes later)
_FETCH_BYTES = 1 << 20
_STREAMS = 2  # connections reading (and counting) a table's pages at once, per reader
_QUEUE_BATCHES = 8  # batches read ahead per part (a unit of 2^20 float rows: all of it)
_END = object()


class _Prefetch:
    """One statement's Arrow stream, read by a thread on a pooled connection into a bounded
    queue; iterating gives its batches in order (and raises the reader's error, if any).
    ``cancel()`` stops the thread; a connection left mid-stream is closed, not pooled."""

    def __init__(self, source: "PostgresSource", sql: str, tid: bool) -> None:
        self.source, self.sql, self.tid = source, sql, tid
        self.queue: queue.Queue = queue.Queue(_QUEUE_BATCHES)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="ldp-beam-postgresql-reader")
        self.thread.start()

    def _put(self, item) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        con, ok = None, False
        try:
            con = self.source._acquire()
            cur = con.cursor()
            try:
                # read-only again (a query's set_config() may have changed the session default
                # on this pooled connection); this statement's transaction starts read-only
                cur.execute(_PG_SET_READ_ONLY)
                # page ranges must come in physical order: a TID range scan, never a seq scan
                cur.execute("SET enable_seqscan = off" if self.tid else "RESET enable_seqscan")
                cur.adbc_statement.set_options(**{_BATCH_HINT: str(_FETCH_BYTES)})
                cur.execute(self.sql)
                for b in cur.fetch_record_batch():
                    if not self._put(b):
                        return
                ok = True
            finally:
                cur.close()
            self._put(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._put(exc)
        finally:
            if con is not None:
                self.source._release(con, ok)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            item = self.queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> None:
        self.stop.set()
        self.thread.join()


def _page_select(table: str, a: int, b: int | None) -> str:
    """Every row on the heap pages [a, b) of ``table`` (quoted), in physical order when run as
    a TID range scan (``enable_seqscan`` off)."""
    return f"SELECT * FROM {table} WHERE {_page_range(a, b)}"


def _page_range(a: int, b: int | None) -> str:
    """The rows on heap pages [a, b) (b None: to the end of the table), as a TID range."""
    cond = f"ctid >= '({a},0)'::tid"
    return cond if b is None else f"{cond} AND ctid < '({b},0)'::tid"


_PG_READ_ONLY_OPTION = "-c default_transaction_read_only=on"
_PG_SET_READ_ONLY = "SET default_transaction_read_only = on"
#: the statements a PostgreSQL query= may be (by its first word)
_PG_QUERY_WORDS = ("SELECT", "WITH", "VALUES", "TABLE")


def _pg_split(sql: str) -> list[str] | None:
    """``sql`` cut at each ``;`` outside string literals ('...', E'...' with backslash escapes),
    quoted identifiers ("..."), dollar quotes ($tag$...$tag$) and comments (-- and nested /* */),
    the empty parts (only blanks and comments) left out; None if a literal, quoted identifier or
    comment is not terminated."""
    parts, start, i, n = [], 0, 0, len(sql)
    ident = re.compile(r"[A-Za-z0-9_\x80-\U0010ffff]")
    while i < n:
        c = sql[i]
        if c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "/" and sql.startswith("/*", i):
            depth, i = 1, i + 2
            while depth:
                a, b = sql.find("/*", i), sql.find("*/", i)
                if b < 0:
                    return None
                if 0 <= a < b:
                    depth, i = depth + 1, a + 2
                else:
                    depth, i = depth - 1, b + 2
        elif c == "'":
            escapes = i > 0 and sql[i - 1] in "eE" and (i < 2 or not ident.match(sql[i - 2]))
            i += 1
            while True:
                if i >= n:
                    return None
                if escapes and sql[i] == "\\":
                    i += 2
                elif sql[i] == "'":
                    if sql.startswith("''", i):
                        i += 2
                    else:
                        i += 1
                        break
                else:
                    i += 1
        elif c == '"':
            j = i + 1
            while True:
                k = sql.find('"', j)
                if k < 0:
                    return None
                if sql.startswith('""', k):
                    j = k + 2
                else:
                    i = k + 1
                    break
        elif c == "$" and (i == 0 or not ident.match(sql[i - 1])):
            m = re.match(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$",
                         sql[i:])
            if m is None:
                i += 1
                continue
            tag = m.group(0)
            k = sql.find(tag, i + len(tag))
            if k < 0:
                return None
            i = k + len(tag)
        elif c == ";":
            parts.append(sql[start:i])
            i += 1
            start = i
        else:
            i += 1
    parts.append(sql[start:])
    return [p for p in parts if _pg_first_word(p) != ""]


def _pg_first_word(sql: str) -> str:
    """The first keyword of a statement (upper case), after blanks, comments and opening
    parentheses; "" if there is none."""
    i, n = 0, len(sql)
    while i < n:
        if sql[i].isspace() or sql[i] == "(":
            i += 1
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif sql.startswith("/*", i):
            j = sql.find("*/", i)
            i = n if j < 0 else j + 2
        else:
            m = re.match(r"[A-Za-z_]+", sql[i:])
            return m.group(0).upper() if m else sql[i:i + 20]
    return ""


def _warn_if_superuser(source: "PostgresSource") -> None:
    """A superuser's SELECT can still reach the server's files (pg_read_file, lo_export:
    read-only transactions do not stop them): say so once, when a query= source is planned."""
    try:
        cur = source._con.cursor()
        try:
            cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            superuser = bool(cur.fetchall()[0][0])
        finally:
            cur.close()
    except Exception:  # noqa: BLE001 - only a warning; the query's own errors come later
        return
    if superuser:
        log.warning("ldp-beam: %s: the query= runs as a PostgreSQL superuser: read-only "
                    "transactions stop writes to the database, but a superuser's SELECT can "
                    "still call server file functions (pg_read_file, lo_export); read with a "
                    "role that is not a superuser and not in pg_read_server_files / "
                    "pg_write_server_files", source.name)


def _adbc_connect(conninfo: str, name: str, verb: str, **kw: Any):
    """An ADBC connection to PostgreSQL (``kw``: to ``connect``); errors are a
    :class:`SourceError` naming the source ``name`` (what ``verb`` needs when the driver is
    missing)."""
    try:
        import adbc_driver_postgresql.dbapi as pg  # lazy: optional dependency ([postgresql])
    except ImportError:
        raise SourceError(f"{name}: {verb} PostgreSQL needs adbc-driver-postgresql (pip install "
                          "'ldp-beam[postgresql]')") from None
    try:
        return pg.connect(conninfo, **kw)
    except Exception as exc:  # noqa: BLE001
        raise SourceError(f"{name}: {_pg_error(exc)}") from None


def _pg_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    low = text.lower()
    if "no password supplied" in low or "password authentication failed" in low:
        return (f"credentials missing or refused ({text}); give the password with PGPASSWORD, "
                "~/.pgpass or the URL")
    if "connection refused" in low or "could not connect" in low or "timeout expired" in low \
            or "could not translate host name" in low:
        return f"the PostgreSQL server cannot be reached ({text})"
    return text


# --------------------------------------------------------------------------- Iceberg
class IcebergSource(Source):
    kind = "iceberg"
    _process_local = {"_table": None}

    def __init__(self, url: str, settings: dict, allow_empty: bool) -> None:
        rest = url_file(url)
        if "/" in rest or rest.endswith((".db", ".sqlite")):
            self.catalog_file, self.catalog_name = rest, None
        elif rest:
            self.catalog_file, self.catalog_name = None, rest
        else:
            raise SourceError(f"{url}: no catalog; write iceberg:///ABS/PATH/catalog.db?table=NS.T"
                              " or iceberg://NAME?table=NS.T")
        if settings.get("query") is not None:
            raise SourceError(f"{url}: an Iceberg source reads a table (table=NS.T), not a query")
        if settings.get("order_by"):
            raise SourceError(f"{url}: an Iceberg table is read by data file; order_by does not "
                              "apply")
        self._table = None
        self.snapshot_id: int | None = None
        super().__init__(url, settings, allow_empty)

    def _load(self):
        if self._table is not None:
            return self._table
        try:
            from pyiceberg.catalog import load_catalog  # lazy: optional dependency ([iceberg])
        except ImportError:
            raise SourceError(f"{self.name}: reading Iceberg needs pyiceberg (pip install "
                              "'ldp-beam[iceberg]')") from None
        try:
            if self.catalog_file is not None:
                if not os.path.isfile(self.catalog_file):
                    raise SourceError(f"{self.name}: the Iceberg catalog file "
                                      f"{self.catalog_file!r} does not exist")
                from pyiceberg.catalog.sql import SqlCatalog  # lazy: optional ([iceberg] extra)

                cat = SqlCatalog(self._sqlite_catalog_name(),
                                 uri="sqlite:///" + os.path.abspath(self.catalog_file))
            else:
                cat = load_catalog(self.catalog_name)
            self._table = cat.load_table(self.table)
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"{self.name}: {_error_text(exc)}") from None
        return self._table

    def _sqlite_catalog_name(self) -> str:
        """The catalog a SQLite file holds (a SQL catalog keys its tables by catalog name):
        ``catalog=NAME`` in the URL, else the only one in the file."""
        if self.settings.get("catalog"):
            return self.settings["catalog"]
        try:
            con = sqlite3.connect(f"file:{os.path.abspath(self.catalog_file)}?mode=ro", uri=True)
            try:
                names = [r[0] for r in con.execute(
                    "SELECT DISTINCT catalog_name FROM iceberg_tables ORDER BY 1")]
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise SourceError(f"{self.name}: {self.catalog_file!r} is not a pyiceberg SQL "
                              f"catalog ({exc})") from None
        if len(names) != 1:
            raise SourceError(f"{self.name}: the catalog file holds "
                              f"{'no table' if not names else 'catalogs ' + ', '.join(names)}"
                              + ("" if not names else "; name one with catalog=NAME"))
        return names[0]

    def _scan(self):
        return self._load().scan(snapshot_id=self.snapshot_id)

    def plan(self) -> None:
        tbl = self._load()
        snap = self.settings.get("snapshot")
        if snap is not None:
            try:
                self.snapshot_id = int(snap)
            except ValueError:
                raise ParameterError("snapshot", snap, "an Iceberg snapshot id") from None
            if tbl.snapshot_by_id(self.snapshot_id) is None:
                raise SourceError(f"{self.name}: no snapshot {self.snapshot_id} in table "
                                  f"{self.table}")
        else:
            cur = tbl.current_snapshot()
            self.snapshot_id = None if cur is None else cur.snapshot_id
        from pyiceberg.io.pyarrow import schema_to_pyarrow  # lazy: optional dependency ([iceberg])

        scan = self._scan()
        self.schema = _plain_schema(schema_to_pyarrow(scan.projection(),
                                                      include_field_ids=False))
        if self.snapshot_id is None:
            return
        location = tbl.metadata.location.rstrip("/") + "/"
        total = 0
        for task in sorted(scan.plan_files(), key=lambda t: t.file.file_path):
            path = task.file.file_path
            rel = path[len(location):] if path.startswith(location) else path
            n = int(task.file.record_count)
            rows = n if not task.delete_files else None
            self.units.append(SourceUnit(f"data file {rel}", path=path, offset=0, rows=rows,
                                         stream=f"iceberg:{self.table}:{rel}"))
            total += n
        self.rows = total

    def read(self, unit: SourceUnit, batch_rows: int) -> Iterator[pa.RecordBatch]:
        # lazy: optional dependency (the [iceberg] extra)
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan

        tbl = self._load()
        scan = self._scan()
        tasks = [t for t in scan.plan_files() if t.file.file_path == unit.path]
        if not tasks:
            raise RuntimeError(f"data file {unit.path} is no longer in snapshot "
                               f"{self.snapshot_id}")
        arrow = ArrowScan(tbl.metadata, tbl.io, scan.projection(), AlwaysTrue())
        for b in arrow.to_record_batches(tasks):
            for s in range(0, b.num_rows, batch_rows):
                yield b.slice(s, batch_rows)


# --------------------------------------------------------------------------- opening
def open_source(url: str, *, table: str | None = None, query: str | None = None,
                order_by: Any = None, split_rows: int | None = None,
                snapshot: int | None = None, allow_empty: bool = False) -> Source:
    """Plan a database source from its URL (keywords override nothing: a setting given both
    in the URL and as a keyword is an error). Raises :class:`SourceError` naming the source."""
    scheme = url.split("://", 1)[0].lower()
    kind = SCHEMES.get(scheme)
    if kind is None:
        raise SourceError(f"{url}: not a database URL (duckdb://, postgresql://, iceberg://)")
    _, settings, other = parse_settings(url)
    for k, v in (("table", table), ("query", query), ("order_by", order_by),
                 ("split_rows", split_rows), ("snapshot", snapshot)):
        if v is None:
            continue
        if k in settings:
            raise SourceError(f"{redact(url)}: {k} is given in the URL and as an argument")
        settings[k] = ",".join(v) if k == "order_by" and not isinstance(v, str) else v
    for k in ("snapshot", "catalog"):
        if kind != "iceberg" and settings.get(k) is not None:
            raise SourceError(f"{redact(url)}: {k} applies to iceberg:// sources only")
    if kind == "postgresql":
        return PostgresSource(url, settings, allow_empty, other)
    if other:
        raise SourceError(f"{redact(url)}: unknown setting(s) {[k for k, _ in other]}; "
                          f"known: {', '.join(SETTINGS)}")
    if kind == "duckdb":
        src = DuckDBSource(url, settings, allow_empty)
        src.close()  # the launcher's read-only handle is not kept open during the run
        return src
    return IcebergSource(url, settings, allow_empty)


class ReadSourceFn(ReadUnitFn):
    """A :class:`SourceUnit` -> :class:`KeyedBatch` elements (record numbers as planned) or, if
    the unit fails, one reader dead letter for its unread rows (the io module's contract)."""

    def __init__(self, source: Source, batch_rows: int = DEFAULT_BATCH_ROWS,
                 null_values: Sequence[str] = DEFAULT_NULL_VALUES) -> None:
        super().__init__(batch_rows, null_values)
        self.source = source

    def teardown(self) -> None:
        self.source.close()

    def outputs(self, unit: SourceUnit):
        stream = stream_id(unit.stream)
        schema = self.source.schema
        emitted = 0
        last = None
        try:
            for b in self.source.read(unit, self.batch_rows):
                if b.num_rows == 0:
                    continue
                if unit.ids:
                    ids = b.column(0).to_numpy(zero_copy_only=False).astype(np.int64)
                    b = pa.RecordBatch.from_arrays(b.columns[1:], schema=schema)  # ids dropped
                    if ids.size > 1 and not (np.diff(ids) > 0).all():
                        order = np.argsort(ids, kind="stable")
                        ids, b = ids[order], b.take(pa.array(order))
                    table = self._null_tokens(b)
                    contiguous = ids[-1] - ids[0] == ids.size - 1
                    out = KeyedBatch(stream, int(ids[0]), table, self.source.name,
                                     None if contiguous else ids)
                    last = int(ids[-1])
                else:
                    table = self._null_tokens(pa.RecordBatch.from_arrays(b.columns, schema=schema))
                    out = KeyedBatch(stream, unit.offset + emitted, table, self.source.name)
                self.n_read.inc(table.num_rows)
                emitted += table.num_rows
                yield out
            if unit.rows is not None and emitted != unit.rows:
                raise RuntimeError(f"it returned {emitted:,} rows; {unit.rows:,} were counted "
                                   "when the pipeline was built (the source changed)")
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none is fatal
            self.source.close()  # a broken connection is opened again for the next unit
            rows = None if unit.rows is None else max(unit.rows - emitted, 0)
            row = (unit.offset if last is None else last + 1) if unit.ids else \
                unit.offset + emitted
            yield self._unreadable(f"{self.source.name} ({unit.label})",
                                   f"{unit.label}: {_error_text(exc)}", row, rows,
                                   "the unit's row count is unknown")
