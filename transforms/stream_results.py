"""Where a stream's published panes go besides ``OUT/estimates.jsonl``: sinks a downstream
reader consumes, each idempotent by (window, pane).

``ldp-beam stream --results DEST`` (repeatable) and ``--results-topic projects/P/topics/T``:

* a folder (``DIR/`` or ``file:///DIR``): one JSON file per pane,
  ``window=<start ISO>.pane=<n>.json``, written to a temporary name, fsynced and renamed; a file
  already there is kept (never overwritten);
* ``duckdb:///FILE.db?table=T`` or ``postgresql://...?table=T``: one row per pane in table T
  (created if missing) with columns ``window_start`` and ``window_end`` (UTC timestamps),
  ``pane``, ``timing``, ``run`` and ``result`` (the published row as JSON text), primary key
  (``window_start``, ``pane``): a pane already there is kept (``ON CONFLICT DO NOTHING``);
* a Pub/Sub topic: one message per pane, the row as JSON, with attributes ``window_start``,
  ``pane`` and ``release_id`` = "<window_start>/<pane>". Pub/Sub cannot refuse a duplicate: a
  pane re-sent after a crash has the same ``release_id``, by which a subscriber deduplicates
  (Dataflow's ``id_label="release_id"`` does it for a Beam reader).

The stream writes a pane to ``estimates.jsonl`` first, then to each sink. A restart re-sends to
the sinks every published pane whose window the stream had not settled (those a crash may have
left undelivered); the sinks keep the first copy, so each (window, pane) is delivered once in
effect. What goes to a sink is exactly the published row (never the curator's counts).
"""
from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator, Mapping

from ldp_beam.errors import ParameterError

from .sinks import _duckdb_path, _pg_connect, _table_setting, tidy_format
from .sources import quote_ident, redact


class FolderResults:
    """One JSON file per pane in a folder (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path[len("file://"):] if path.startswith("file://") else path
        os.makedirs(self.path, exist_ok=True)

    def write(self, row: Mapping[str, Any]) -> bool:
        name = f"window={row['window_start']}.pane={row['pane']['index']}.json"
        final = os.path.join(self.path, name)
        if os.path.exists(final):
            return False
        tmp = os.path.join(self.path, f".{name}.{os.getpid()}.tmp")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(row, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, final)  # atomic and never over an existing file
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    def close(self) -> None:
        return None


_COLUMNS = ("window_start TIMESTAMP NOT NULL, window_end TIMESTAMP NOT NULL, pane INTEGER NOT "
            "NULL, timing TEXT, run TEXT, result TEXT NOT NULL, "
            "PRIMARY KEY (window_start, pane)")


def _values(row: Mapping[str, Any]) -> tuple:
    def ts(epoch: float) -> datetime:
        return datetime.fromtimestamp(float(epoch), tz=timezone.utc).replace(tzinfo=None)

    return (ts(row["window_start_epoch"]), ts(row["window_end_epoch"]),
            int(row["pane"]["index"]), row["pane"].get("timing"), row.get("run"),
            json.dumps(row, sort_keys=True))


class DuckDBResults:
    def __init__(self, url: str) -> None:
        import duckdb  # lazy: optional dependency (the [duckdb] extra)

        self.table = ".".join(quote_ident(p) for p in _table_setting(url).split("."))
        self.con = duckdb.connect(_duckdb_path(url))
        self.con.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({_COLUMNS})")

    def write(self, row: Mapping[str, Any]) -> bool:
        added = self.con.execute(f"INSERT INTO {self.table} VALUES (?, ?, ?, ?, ?, ?) "
                                 "ON CONFLICT DO NOTHING RETURNING pane", _values(row))
        return bool(added.fetchall())

    def close(self) -> None:
        self.con.close()


class PostgresResults:
    def __init__(self, url: str) -> None:
        self.table = ".".join(quote_ident(p) for p in _table_setting(url).split("."))
        self.con = _pg_connect(url)
        with self.con.cursor() as cur:
            cur.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({_COLUMNS})")
        self.con.commit()

    def write(self, row: Mapping[str, Any]) -> bool:
        with self.con.cursor() as cur:
            cur.execute(f"INSERT INTO {self.table} VALUES ($1, $2, $3, $4, $5, $6) "
                        "ON CONFLICT DO NOTHING RETURNING pane", _values(row))
            added = cur.fetchone() is not None
        self.con.commit()
        return added

    def close(self) -> None:
        self.con.close()


class TopicResults:
    def __init__(self, topic: str, timeout: float = 60.0) -> None:
        # lazy: ldp_beam.client costs 7 ms at import (measured), only --results-topic needs it
        from ldp_beam.client import topic_path

        from google.cloud import pubsub_v1  # lazy: optional dependency (the [pubsub] extra)

        self.topic, self.timeout = topic_path(topic), timeout
        self.publisher = pubsub_v1.PublisherClient()

    def write(self, row: Mapping[str, Any]) -> bool:
        start, pane = row["window_start"], row["pane"]["index"]
        fut = self.publisher.publish(self.topic, json.dumps(row, sort_keys=True).encode(),
                                     window_start=str(start), pane=str(pane),
                                     release_id=f"{start}/{pane}")
        fut.result(timeout=self.timeout)
        return True

    def close(self) -> None:
        stop = getattr(self.publisher, "stop", None)
        if stop is not None:
            stop()


def check_results(dests: Iterable[str], topic: str | None) -> None:
    """Refuse a results destination that cannot be one, before anything runs."""
    for d in dests:
        if "://" in d and not d.startswith("file://"):
            scheme = d.split("://", 1)[0].lower()
            if scheme not in ("duckdb", "postgresql", "postgres"):
                raise ParameterError("--results", redact(d), "a local folder, "
                                     "duckdb:///FILE?table=T or postgresql://...?table=T")
            try:
                _table_setting(d)
            except ParameterError:
                raise ParameterError("--results", redact(d), "a database URL with table=NAME "
                                     "only") from None
        elif d.lower().endswith((".parquet", ".csv", ".json", ".jsonl")):
            raise ParameterError("--results", d, "a folder (one JSON file per window and "
                                 "pane), duckdb:///FILE?table=T or postgresql://...?table=T")
    if topic is not None:
        from ldp_beam.client import topic_path  # lazy: 7 ms (measured), only for a results topic

        topic_path(topic)


def open_results(dests: Iterable[str], topic: str | None) -> list:
    out: list = []
    try:
        for d in dests:
            fmt = tidy_format(d) if "://" in d and not d.startswith("file://") else "folder"
            out.append(DuckDBResults(d) if fmt == "duckdb" else
                       PostgresResults(d) if fmt == "postgresql" else FolderResults(d))
        if topic is not None:
            out.append(TopicResults(topic))
    except BaseException:
        for s in out:
            s.close()
        raise
    return out


def jsonl_rows(path: str) -> Iterator[dict]:
    """The rows of a JSON-lines file such as ``estimates.jsonl`` (none when it does not exist;
    blank lines skipped)."""
    if os.path.exists(path):
        with open(path) as fh:
            yield from (json.loads(line) for line in fh if line.strip())


def unsettled_rows(estimates: str, settled_us: int | None) -> list[dict]:
    """The published rows of windows that end after the settled watermark (a crash may have left
    them undelivered to the sinks); every row when nothing was settled."""
    return [row for row in jsonl_rows(estimates) if settled_us is None
            or int(round(float(row["window_end_epoch"]) * 1_000_000)) > settled_us]
