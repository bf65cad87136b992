"""Schema 1 of the budget ledger (budgets per content fingerprint) and its migration to schema 2
(budgets per dataset name), in place and in one transaction when a ledger is opened (see
:mod:`ldp_beam.ledger`)."""
from __future__ import annotations

import os
import socket

from .accounting import _budget_text
from .backends import _CHANGE_COLUMNS, _ENTRY_COLUMNS, _SCHEMA_TABLES, _Tx
from .base import SCHEMA_VERSION, LedgerError, _now, _user


# --------------------------------------------------------------------------------- schema 1
#: Schema 1 (budgets per content fingerprint), kept to migrate it (and to build one in a test).
_SCHEMA_V1 = [
    """CREATE TABLE IF NOT EXISTS ldp_beam_meta (
        key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS ldp_beam_datasets (
        fingerprint TEXT PRIMARY KEY, uri TEXT NOT NULL, first_seen TEXT NOT NULL,
        budget_epsilon DOUBLE PRECISION, budget_delta DOUBLE PRECISION, budget_set TEXT)""",
    """CREATE TABLE IF NOT EXISTS ldp_beam_entries (
        run_id TEXT PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('pending', 'committed', 'aborted')),
        started TEXT NOT NULL, finished TEXT, command TEXT NOT NULL,
        fingerprint TEXT NOT NULL REFERENCES ldp_beam_datasets (fingerprint),
        uri TEXT NOT NULL, unit TEXT NOT NULL, mechanism TEXT NOT NULL, kind TEXT,
        params TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        accounting TEXT, budget_epsilon DOUBLE PRECISION, budget_delta DOUBLE PRECISION,
        request_key TEXT, release TEXT, outputs TEXT, republished_from TEXT,
        seeded INTEGER NOT NULL, host TEXT, pid INTEGER, os_user TEXT, note TEXT)""",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_fp ON ldp_beam_entries (fingerprint)",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_req ON ldp_beam_entries (request_key)",
    """CREATE TABLE IF NOT EXISTS ldp_beam_unit_spend (
        fingerprint TEXT NOT NULL, unit_hash TEXT NOT NULL, window_id TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL, run_id TEXT NOT NULL, recorded TEXT NOT NULL,
        PRIMARY KEY (fingerprint, unit_hash, window_id))""",
]
_V1_ENTRY_COLUMNS = tuple(c for c in _ENTRY_COLUMNS if c != "dataset")


def _migrate_v1(tx: _Tx, url: str) -> None:
    """Schema 1 -> 2 inside the caller's transaction (see :mod:`ldp_beam.ledger`): every entry
    kept, its dataset the location it was read from; each fingerprint's budget carried to every
    location read under it (the smallest where several differ), recorded as a budget change;
    per-unit spending carried to its stream's location. Raises :class:`LedgerError` (and the
    transaction rolls back) if a count does not match."""
    n_entries = tx.one("SELECT COUNT(*) FROM ldp_beam_entries")[0]
    spend_before = float(tx.one("SELECT COALESCE(SUM(epsilon), 0) FROM ldp_beam_unit_spend")[0])
    for stmt in ("DROP INDEX IF EXISTS ldp_beam_entries_fp",
                 "DROP INDEX IF EXISTS ldp_beam_entries_req"):
        tx.execute(stmt)
    for table in ("entries", "datasets", "unit_spend"):
        tx.execute(f"ALTER TABLE ldp_beam_{table} RENAME TO ldp_beam_v1_{table}")
    for stmt in _SCHEMA_TABLES:
        tx.execute(stmt)
    stream_name = "COALESCE(d.uri, s.fingerprint)"
    stream_join = ("FROM ldp_beam_v1_unit_spend s LEFT JOIN ldp_beam_v1_datasets d ON "
                   "d.fingerprint = s.fingerprint")
    tx.execute("INSERT INTO ldp_beam_datasets (dataset, first_seen) SELECT name, MIN(seen) FROM ("
               "SELECT uri AS name, first_seen AS seen FROM ldp_beam_v1_datasets UNION ALL "
               "SELECT uri, started FROM ldp_beam_v1_entries UNION ALL "
               f"SELECT {stream_name}, s.recorded {stream_join}) AS seen_at GROUP BY name")
    cols = ", ".join(_V1_ENTRY_COLUMNS)
    tx.execute(f"INSERT INTO ldp_beam_entries (dataset, {cols}) SELECT uri, {cols} FROM "
               "ldp_beam_v1_entries")
    tx.execute("INSERT INTO ldp_beam_unit_spend (dataset, unit_hash, window_id, epsilon, run_id, "
               f"recorded) SELECT {stream_name}, s.unit_hash, s.window_id, SUM(s.epsilon), "
               f"MIN(s.run_id), MIN(s.recorded) {stream_join} GROUP BY {stream_name}, "
               "s.unit_hash, s.window_id")
    read_at: dict[str, set] = {}
    for fp, uri in tx.all("SELECT DISTINCT fingerprint, uri FROM ldp_beam_v1_entries"):
        read_at.setdefault(fp, set()).add(uri)
    per: dict[str, list] = {}
    for fp, uri, eps, delta, when in tx.all(
            "SELECT fingerprint, uri, budget_epsilon, budget_delta, budget_set FROM "
            "ldp_beam_v1_datasets WHERE budget_epsilon IS NOT NULL"):
        for where in {uri} | read_at.get(fp, set()):
            per.setdefault(where, []).append((float(eps), None if delta is None
                                              else float(delta), when or ""))
    now, user, host = _now(), _user(), socket.gethostname()
    for name, budgets in sorted(per.items()):
        eps = min(b[0] for b in budgets)
        deltas = [b[1] for b in budgets if b[1] is not None]
        delta = min(deltas) if deltas else None
        distinct = sorted({(b[0], b[1]) for b in budgets}, key=lambda b: (b[0], b[1] or 0.0))
        why = "migrated from schema 1"
        if len(distinct) > 1:
            why += (" (the smallest of the budgets of the data read there: "
                    + "; ".join(_budget_text(e, d) for e, d in distinct) + ")")
        tx.execute("UPDATE ldp_beam_datasets SET budget_epsilon = ?, budget_delta = ?, "
                   "budget_set = ? WHERE dataset = ?",
                   (eps, delta, max(b[2] for b in budgets) or now, name))
        tx.execute(f"INSERT INTO ldp_beam_budget_changes ({', '.join(_CHANGE_COLUMNS)}) VALUES "
                   f"({', '.join('?' * len(_CHANGE_COLUMNS))})",
                   (name, eps, delta, None, None, now, user, host, why, None))
    n_after = tx.one("SELECT COUNT(*) FROM ldp_beam_entries")[0]
    spend_after = float(tx.one("SELECT COALESCE(SUM(epsilon), 0) FROM ldp_beam_unit_spend")[0])
    if n_after != n_entries or abs(spend_after - spend_before) > 1e-9 * max(1.0, spend_before):
        raise LedgerError(f"--ledger {url}: migrating the ledger from schema 1 would change it "
                          f"({n_entries} entries -> {n_after}, unit spend {spend_before:g} -> "
                          f"{spend_after:g}); nothing was changed")
    for table in ("entries", "unit_spend", "datasets"):
        tx.execute(f"DROP TABLE ldp_beam_v1_{table}")
    tx.execute("UPDATE ldp_beam_meta SET value = ? WHERE key = 'schema_version'",
               (str(SCHEMA_VERSION),))
    for key, value in (("ledger_id", os.urandom(16).hex()), ("migrated_from_1", now)):
        tx.execute("INSERT INTO ldp_beam_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO "
                   "NOTHING", (key, value))
