"""The budget ledger over a deployment's lifetime (issue 23, DESIGN.md "A deployment over time").

Each finding of the operator's report is a regression test here:

* a table that grew by one row was a new dataset, so its people's budget reset: a dataset is now
  a *name* (``--dataset``, else the input's canonical location), whatever its content becomes;
* a larger ``--budget`` on any run silently replaced the recorded one: a run may only set,
  confirm or lower a budget; raising it is ``Ledger.set_budget``, recorded with who and why;
* a ledger deleted, replaced or corrupted between a run's reserve and its commit let the run
  publish with its spend in no ledger: ``Reservation.prepare`` checks that the ledger is the one
  the run reserved in before anything is published;
* simultaneous first opens of a new SQLite ledger failed at once with a false "locked for more
  than 5 s": the WAL switch and the schema creation are retried up to the timeout;
* ``ldp-beam ledger`` pointed at a path that does not exist created an empty ledger: reading
  never creates.

Also: the schema-1 -> 2 migration (SQLite and PostgreSQL), the prepare/commit split, the
``--set-budget`` command, the dataset status line.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import socket
import sqlite3
import threading
import time

import pytest

from ldp_beam.errors import ParameterError
from ldp_beam.ledger import (RAISE_HINT, SCHEMA_VERSION, BudgetExceeded, Ledger, LedgerError,
                             LedgerNotFound, LedgerUnavailable, canonical_location,
                             release_request)
from ldp_beam.pipelines.datasets import dataset_identity
from ldp_beam_test_helpers import ledger_cli, reserve

# fixtures ledger_url (SQLite and PostgreSQL) and fresh_pg_url: tests/conftest.py


def _csv(path, rows: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("uid,v\n" + "".join(f"{i},{i % 3}\n" for i in range(rows)))
    return str(path)


# --------------------------------------------------------- 1. a dataset is a name, not bytes
def test_a_table_that_grows_by_a_row_keeps_its_budget(ledger_url, tmp_path):
    """Issue 23: 20,000 customers spent 2.5 against a budget of 2, because the table that grew
    by one row had a new content hash and so a fresh budget."""
    path = tmp_path / "customers.csv"
    _csv(path, 20000)
    first = dataset_identity(str(path))
    with Ledger.open(ledger_url) as led:
        reserve(led, "monday", first, 1.5, budget=2.0).commit()
        _csv(path, 20001)  # one new customer
        grown = dataset_identity(str(path))
        assert grown["dataset"] == first["dataset"] == os.path.realpath(path)
        assert grown["fingerprint"] != first["fingerprint"]
        with pytest.raises(BudgetExceeded) as ei:
            reserve(led, "tuesday", grown, 1.0)
        assert "already spent epsilon=1.5" in str(ei.value) and "monday" in str(ei.value)
        assert [e["run_id"] for e in led.entries()] == ["monday"]
        reserve(led, "tuesday-small", grown, 0.5).commit()  # what still fits, fits
        (t,) = led.summary()
        assert t["dataset"] == first["dataset"] and t["spent"]["epsilon"] == pytest.approx(2.0)
        assert t["fingerprints"] == [first["fingerprint"], grown["fingerprint"]]
        assert led.spent(first["dataset"]).epsilon == pytest.approx(2.0)
        assert led.dataset_status(grown)["remaining"] == pytest.approx(0.0)


def test_a_grown_table_keeps_its_budget_through_collect(tmp_path):
    """The same through the command line: the second collect on the grown table is refused
    before any noise is drawn, and each run says which ledger it wrote to and what is left."""
    from ldp_beam_test_helpers import run_cli

    src = tmp_path / "t.csv"
    src.write_text("v\n" + "a\nb\nc\n" * 100)
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    grr = ("-m", "grr", "--epsilon", "1.5", "-p", "domain=a,b,c")
    code, so, se = run_cli("collect", "-i", str(src), "-c", "v", *grr, "--ledger", led,
                           "--budget", "2", "-o", str(tmp_path / "r1.parquet"))
    assert code == 0, se
    assert f"ledger {led}: dataset {os.path.realpath(src)} has spent epsilon=1.5 of budget 2 " \
           "(0.5 left)" in so
    with open(src, "a") as fh:
        fh.write("a\n")  # one more row
    code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *grr, "--ledger", led,
                          "-o", str(tmp_path / "r2.parquet"))
    assert code == 2 and "--budget" in se and "already spent epsilon=1.5" in se, se
    assert not (tmp_path / "r2.parquet").exists()


def test_an_explicit_dataset_name_is_validated_and_kept(tmp_path):
    path = _csv(tmp_path / "a.csv", 3)
    ident = dataset_identity(path, name="crm/customers (EU)")
    assert ident["dataset"] == "crm/customers (EU)" and ident["uri"] == os.path.realpath(path)
    assert set(ident) == {"dataset", "uri", "fingerprint", "files", "bytes"}
    for bad in ("", "   ", "x" * 201, "two\nlines", "tab\there", "zero\u200bwidth",
                " padded", "padded "):
        with pytest.raises(ParameterError, match="--dataset") as ei:
            dataset_identity(path, name=bad)
        assert "200 characters" in str(ei.value)
    assert dataset_identity(path, name="x" * 200)["dataset"] == "x" * 200


def test_the_default_name_is_the_canonical_location(tmp_path, monkeypatch):
    real = tmp_path / "real" / "sub"
    real.mkdir(parents=True)
    _csv(tmp_path / "real" / "x.csv", 2)
    _csv(real / "y.csv", 2)
    os.symlink(real, tmp_path / "lnk")
    monkeypatch.chdir(tmp_path)
    # link/../x is the x beside the link's *target* (as the kernel reads it), not tmp_path/x
    assert dataset_identity("lnk/../x.csv")["dataset"] == str(tmp_path / "real" / "x.csv")
    assert dataset_identity("lnk/y.csv")["dataset"] == str(real / "y.csv")
    assert dataset_identity(str(real / "y.csv"))["dataset"] == str(real / "y.csv")
    assert dataset_identity("./real/sub")["dataset"] == str(real)
    # a glob: the real path of its folder part joined with its pattern
    assert dataset_identity("lnk/*.csv")["dataset"] == str(real / "*.csv")
    assert canonical_location("lnk/../*.csv") == str(tmp_path / "real" / "*.csv")
    # a URL: without credentials (user part dropped entirely, password/key parameters removed)
    assert canonical_location("s3://AKIAXYZ:s3cr3t@Bucket/data/t.parquet?region=eu&"
                              "password=pw&secret_key=k") == "s3://bucket/data/t.parquet?region=eu"
    assert canonical_location("gs://b/p/") == "gs://b/p/"
    # a database table: its existing canonical URL (password hidden, parameters sorted)
    db = dataset_identity("postgresql://ana:pw@db.example:5432/crm?table=people&schema=eu")
    assert db["dataset"] == db["uri"] == \
        "postgresql://ana:***@db.example:5432/crm?schema=eu&table=people"
    assert "pw" not in db["dataset"].replace("***", "")


def test_a_prefetched_identity_takes_the_name_given(tmp_path):
    from ldp_beam.pipelines import datasets as L

    path = _csv(tmp_path / "p.csv", 5)
    L.prefetch_dataset_identity(path, name="people")
    got = L.dataset_identity(path, name="people")
    assert got["dataset"] == "people" and got["fingerprint"] == L._dataset_identity(path)[
        "fingerprint"]
    L.prefetch_dataset_identity(path)
    assert L.dataset_identity(path)["dataset"] == os.path.realpath(path)


def test_a_copy_is_another_dataset_unless_given_the_same_name(tmp_path):
    a = _csv(tmp_path / "a" / "t.csv", 10)
    b = tmp_path / "b" / "t.csv"
    b.parent.mkdir()
    b.write_bytes(open(a, "rb").read())
    with Ledger.open("sqlite:///" + str(tmp_path / "l.db")) as led:
        reserve(led, "r1", dataset_identity(a), 1.0, budget=1.0).commit()
        reserve(led, "r2", dataset_identity(str(b)), 1.0).commit()  # another location
        reserve(led, "r3", dataset_identity(a, name="t"), 1.0, budget=1.0).commit()
        with pytest.raises(BudgetExceeded):
            reserve(led, "r4", dataset_identity(str(b), name="t"), 0.1)
        with pytest.raises(ParameterError, match="not a data fingerprint"):
            led.spent(dataset_identity(a)["fingerprint"])  # the key before schema 2


# ----------------------------------------------------- 2. budgets change only on purpose
def test_a_run_cannot_raise_the_recorded_budget(ledger_url, tmp_path):
    """Issue 23: `--budget 100` on a run replaced a recorded 1.5, silently."""
    ds = dataset_identity(_csv(tmp_path / "d.csv", 10))
    with Ledger.open(ledger_url) as led:
        reserve(led, "first", ds, 0.5, budget=1.5).commit()
        with pytest.raises(BudgetExceeded) as ei:
            reserve(led, "greedy", ds, 0.5, budget=100.0)
        err = ei.value
        assert err.name == "--budget" and err.value == 100.0 and isinstance(err, ParameterError)
        msg = str(err)
        for part in ("--budget 100", "epsilon=1.5", "set by run", RAISE_HINT, ds["dataset"],
                     "before any noise"):
            assert part in msg, (part, msg)
        assert led.budget(ds["dataset"]) == (1.5, None)
        assert [e["run_id"] for e in led.entries()] == ["first"]
        reserve(led, "same", ds, 0.2, budget=1.5).commit()  # confirming it is fine
        reserve(led, "lower", ds, 0.2, budget=1.2).commit()  # lowering it is recorded
        assert led.budget(ds["dataset"]) == (1.2, None)
        with pytest.raises(BudgetExceeded, match="epsilon=1.2"):
            reserve(led, "back-up", ds, 0.1, budget=1.5)  # lowered stays lowered
        changes = led.budget_changes(ds["dataset"])
        assert [(c["why"], c["epsilon"], c["previous_epsilon"], c["run_id"]) for c in changes] \
            == [("set by run", 1.5, None, "first"), ("lowered by run", 1.2, 1.5, "lower")]
        # raising is its own recorded act: who, where, when, why
        change = led.set_budget(ds["dataset"], 3.0, why="owner agreed, ticket PRIV-7")
        assert (change["epsilon"], change["previous_epsilon"]) == (3.0, 1.2)
        assert change["spent"]["epsilon"] == pytest.approx(0.9)
        last = led.budget_changes(ds["dataset"])[-1]
        assert last["why"] == "owner agreed, ticket PRIV-7" and last["run_id"] is None
        assert last["host"] == socket.gethostname() and last["os_user"]
        assert last["changed"].endswith("Z")
        reserve(led, "later", ds, 1.5).commit()  # fits the raised budget
        assert led.set_budget(ds["dataset"], 0.5, why="tightened")["epsilon"] == 0.5
        with pytest.raises(BudgetExceeded):  # lowered below what was spent: nothing fits
            reserve(led, "after", ds, 0.01)


def test_a_run_cannot_raise_the_recorded_delta(ledger_url, tmp_path):
    ds = dataset_identity(_csv(tmp_path / "d.csv", 10))
    with Ledger.open(ledger_url) as led:
        reserve(led, "g1", ds, 0.3, delta=1e-8, budget=2.0, budget_delta=1e-6).commit()
        with pytest.raises(BudgetExceeded) as ei:
            reserve(led, "g2", ds, 0.3, delta=1e-8, budget=2.0, budget_delta=1e-3)
        assert ei.value.name == "--budget-delta" and "delta=1e-06" in str(ei.value)
        assert RAISE_HINT in str(ei.value)
        # without --budget-delta, a run keeps the recorded delta
        reserve(led, "g3", ds, 0.3, delta=1e-8, budget=2.0).commit()
        assert led.budget(ds["dataset"]) == (2.0, 1e-6)
        reserve(led, "g4", ds, 0.3, delta=1e-8, budget=2.0, budget_delta=5e-7).commit()
        assert led.budget(ds["dataset"]) == (2.0, 5e-7)
        assert led.budget_changes(ds["dataset"])[-1]["why"] == "lowered by run"
        # a delta where the recorded budget has none may be set (and is recorded)
        pure = dataset_identity(_csv(tmp_path / "pure.csv", 3))
        reserve(led, "p1", pure, 0.3, budget=1.0).commit()
        reserve(led, "p2", pure, 0.3, delta=1e-7, budget=1.0, budget_delta=1e-6).commit()
        assert led.budget_changes(pure["dataset"])[-1]["why"] == "set by run"
        assert led.budget(pure["dataset"]) == (1.0, 1e-6)


def test_set_budget_checks_what_it_is_given(tmp_path):
    with Ledger.open("sqlite:///" + str(tmp_path / "l.db")) as led:
        for kw, name in (({"why": ""}, "--why"), ({"why": "  "}, "--why"),
                         ({"why": None}, "--why")):
            with pytest.raises(ParameterError) as ei:
                led.set_budget("d", 1.0, **kw)
            assert ei.value.name == name
        for eps in (-1.0, math.inf, math.nan, "1"):
            with pytest.raises(ParameterError) as ei:
                led.set_budget("d", eps, why="x")
            assert ei.value.name == "--set-budget" and "finite epsilon >= 0" in str(ei.value)
        with pytest.raises(ParameterError, match="--budget-delta"):
            led.set_budget("d", 1.0, 1.0, why="x")
        with pytest.raises(ParameterError, match="--dataset"):
            led.set_budget("bad\nname", 1.0, why="x")
        # a budget may be set before the first run, on a name no run used yet
        led.set_budget("planned", 2.0, 1e-6, why="before the first run")
        assert led.budget("planned") == (2.0, 1e-6)
        assert led.dataset_status("planned")["remaining"] == 2.0
        assert [t["dataset"] for t in led.summary()] == ["planned"]


# -------------------------------------- 3. the ledger a run commits to is the one it reserved in
def _settle_files(path):
    return [path + s for s in ("", "-wal", "-shm") if os.path.exists(path + s)]


@pytest.mark.parametrize("what", ["deleted", "replaced", "garbage", "damaged-body"])
def test_a_ledger_changed_between_reserve_and_prepare_publishes_nothing(tmp_path, what):
    """Issue 23: a ledger deleted, replaced or corrupted between a run's reserve and its commit
    let the run publish with its spend in no ledger (the open handle wrote to the unlinked
    file). Now prepare (before anything is published) refuses, and no ledger says committed."""
    path = str(tmp_path / "ledger.db")
    ds = dataset_identity(_csv(tmp_path / "d.csv", 10))
    published = []
    with Ledger.open(path) as led:
        reserve(led, "before", ds, 0.1).commit()
        with pytest.raises(LedgerUnavailable) as ei:
            with reserve(led, "victim", ds, 0.5, budget=1.0) as res:
                if what == "deleted":
                    for f in _settle_files(path):
                        os.unlink(f)
                elif what == "replaced":
                    for f in _settle_files(path):
                        os.rename(f, f.replace("ledger.db", "old.db"))
                    Ledger.open(path).close()  # someone made a fresh ledger there
                elif what == "garbage":
                    size = os.path.getsize(path)
                    with open(path, "r+b") as fh:
                        fh.write(b"\xde\xad\xbe\xef" * (size // 4))
                else:  # the header intact, every page after it overwritten
                    con = sqlite3.connect(path)
                    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    con.close()
                    size = os.path.getsize(path)
                    with open(path, "r+b") as fh:
                        fh.seek(100)
                        fh.write(b"\x00\xff" * ((size - 100) // 2))
                res.prepare({"reports": {"path": "/out/r.parquet"}})
                published.append("reports")  # never reached
        msg = str(ei.value)
        assert "the ledger is not the one this run reserved in" in msg, msg
        assert "nothing was published" in msg and f"--ledger {path}" in msg
        assert not published and res.status != "committed"
    if what == "deleted":
        assert not os.path.exists(path)  # the stale handle did not bring it back
    elif what == "replaced":
        with Ledger.open(path, create=False) as fresh:
            assert fresh.entries() == []  # the run is not in the new ledger
        with Ledger.open(str(tmp_path / "old.db"), create=False) as old:
            statuses = {e["run_id"]: e["status"] for e in old.entries()}
        assert statuses == {"before": "committed", "victim": "aborted"}
    else:  # SQLite may still read it through its WAL, or not at all: never as committed
        try:
            with Ledger.open(path, create=False) as after:
                statuses = {e["run_id"]: e["status"] for e in after.entries()}
        except LedgerError:
            statuses = {}
        assert statuses.get("victim") != "committed"


def test_commit_checks_the_ledger_again(tmp_path):
    """A ledger replaced between prepare and commit: commit refuses (the entry stays pending in
    the ledger it was reserved in; the caller warns that the run must be resolved)."""
    path = str(tmp_path / "ledger.db")
    ds = dataset_identity(_csv(tmp_path / "d.csv", 10))
    with Ledger.open(path) as led:
        with reserve(led, "r", ds, 0.5) as res:
            res.prepare({"reports": {"path": "/o/r.parquet", "bytes": 3, "sha256": "ab"}})
            for f in _settle_files(path):
                os.rename(f, f.replace("ledger.db", "old.db"))
            Ledger.open(path).close()
            with pytest.raises(LedgerUnavailable, match="was not marked committed"):
                res.commit()
    with Ledger.open(str(tmp_path / "old.db"), create=False) as old:
        (e,) = old.entries()
    assert e["status"] == "pending" and e["outputs"]["reports"]["path"] == "/o/r.parquet"
    assert "may have published" in e["note"]


def test_postgres_ledger_replaced_between_reserve_and_prepare(pg_server, fresh_pg_url, tmp_path):
    import psycopg

    name = fresh_pg_url.rsplit("/", 1)[1]
    ds = dataset_identity(_csv(tmp_path / "d.csv", 10))
    with Ledger.open(fresh_pg_url) as led:
        res = reserve(led, "victim", ds, 0.5)
        with psycopg.connect(pg_server.admin_url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                          "datname = %s", (name,))
            admin.execute(f"DROP DATABASE {name}")
            admin.execute(f"CREATE DATABASE {name}")
        Ledger.open(fresh_pg_url).close()  # a fresh, empty ledger under the same URL
        with pytest.raises(LedgerUnavailable, match="not the one this run reserved in"):
            res.prepare({})
        with pytest.raises(LedgerUnavailable, match="not the one this run reserved in"):
            res.commit({})
    with Ledger.open(fresh_pg_url) as fresh:
        assert fresh.entries() == []


def test_prepare_then_commit_and_leave_pending(ledger_url, tmp_path):
    ds = dataset_identity(_csv(tmp_path / "d.csv", 10))
    req = release_request("dphr", {"epsilon": 0.5}, {"value": "v"})
    release = {"estimate": {"histogram": [1, 2]}, "mechanism": "dphr"}
    with Ledger.open(ledger_url) as led:
        # prepare stores outputs and release; the entry stays pending until commit
        with reserve(led, "rel", ds, 0.5, command="release", mechanism="dphr",
                     request=req) as res:
            res.prepare({"release": {"path": "/o/h.json"}}, release)
            (e,) = led.entries()
            assert e["status"] == "pending" and e["outputs"] == {"release": {"path": "/o/h.json"}}
            assert led.find_release(ds["fingerprint"], req) is None  # not committed yet
            res.commit()  # keeps what prepare stored
        (e,) = led.entries()
        assert e["status"] == "committed" and e["release"] == release
        assert led.find_release(ds["fingerprint"], req)["run_id"] == "rel"
        # a run that may have partly published: pending, with a note, never aborted
        with reserve(led, "partial", ds, 0.2) as res:
            res.prepare({"reports": {"path": "/o/r.parquet"}})
            res.leave_pending("publishing failed after some outputs were moved into place")
        e = led.entries(status="pending")[0]
        assert e["run_id"] == "partial" and "publishing failed" in e["note"]
        # an error after prepare leaves it pending too (its outputs may be in place)
        with pytest.raises(RuntimeError):
            with reserve(led, "crashed", ds, 0.2) as res:
                res.prepare({})
                raise RuntimeError("rename failed")
        (e,) = led.entries(status="pending", dataset=ds["dataset"])[1:]
        assert e["run_id"] == "crashed" and "may have published" in e["note"]
        assert led.spent(ds["dataset"]).epsilon == pytest.approx(0.9)
        # an error before prepare aborts it, as before
        with pytest.raises(RuntimeError):
            with reserve(led, "failed", ds, 0.2):
                raise RuntimeError("pipeline failed")
        assert led.entries(status="aborted")[0]["run_id"] == "failed"
        # prepare of an entry an operator settled meanwhile is refused: publish nothing
        res = reserve(led, "slow", ds, 0.1)
        led.resolve("slow", "aborted", "looked dead")
        with pytest.raises(LedgerError, match="must not publish"):
            res.prepare({})
        with pytest.raises(LedgerError, match="no reservation"):
            led.prepare("never-reserved")


# ------------------------------------------------------------ 4. concurrent first opens
def test_a_first_open_waits_for_a_lock_instead_of_failing_at_once(tmp_path):
    """The cause of the false 'locked for more than 5 s': switching a new file to WAL while
    another connection holds its write lock fails at once, without SQLite's busy timeout."""
    path = tmp_path / "new.db"
    holder = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.5, lambda: holder.execute("ROLLBACK"))
    release.start()
    try:
        t0 = time.monotonic()
        with Ledger.open("sqlite:///" + str(path), timeout=5) as led:
            assert led.ledger_id
        assert 0.4 < time.monotonic() - t0 < 5
    finally:
        release.join()
        holder.close()
    holder = sqlite3.connect(str(tmp_path / "held.db"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # held past the timeout: a true "locked", after it
    try:
        t0 = time.monotonic()
        with pytest.raises(LedgerUnavailable, match="locked by another process"):
            Ledger.open("sqlite:///" + str(tmp_path / "held.db"), timeout=0.6)
        assert 0.5 < time.monotonic() - t0 < 3
    finally:
        holder.close()


def _schema_once(path):
    con = sqlite3.connect(path)
    try:
        tables = con.execute("SELECT name, COUNT(*) FROM sqlite_master WHERE type = 'table' "
                             "GROUP BY name").fetchall()
        meta = con.execute("SELECT key, COUNT(*) FROM ldp_beam_meta GROUP BY key").fetchall()
        ids = con.execute("SELECT value FROM ldp_beam_meta WHERE key = 'ledger_id'").fetchall()
    finally:
        con.close()
    assert all(n == 1 for _, n in tables) and all(n == 1 for _, n in meta)
    assert {"ldp_beam_entries", "ldp_beam_datasets", "ldp_beam_budget_changes",
            "ldp_beam_unit_spend", "ldp_beam_meta"} <= {t for t, _ in tables}
    return ids[0][0]


def test_200_threads_open_a_new_ledger_at_once(tmp_path):
    """Issue 23: 25 of 200 simultaneous first opens failed at once."""
    path = str(tmp_path / "new" / "ledger.db")
    n = 200
    barrier = threading.Barrier(n)
    ids, errors = [], []

    def open_it():
        barrier.wait(60)
        try:
            with Ledger.open("sqlite:///" + path, timeout=30) as led:
                ids.append(led.ledger_id)
        except Exception as exc:  # noqa: BLE001 - collected and shown
            errors.append(repr(exc))

    threads = [threading.Thread(target=open_it) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(ids) == n, errors[:3]
    assert set(ids) == {_schema_once(path)}


_OPEN_IN_A_PROCESS = """
from ldp_beam.ledger import Ledger
barrier.wait(120)
try:
    with Ledger.open(url, timeout=60) as led:
        results.put(("ok", led.ledger_id))
except BaseException as exc:
    results.put(("error", repr(exc)))
"""


def test_20_processes_open_a_new_ledger_at_once(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    path = str(tmp_path / "ledger.db")
    n = 20
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=exec, args=(_OPEN_IN_A_PROCESS, {
        "barrier": barrier, "results": results, "url": "sqlite:///" + path}))
        for _ in range(n)]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=180) for _ in range(n)]
    finally:
        for p in procs:
            p.join(60)
    assert [g for g in got if g[0] != "ok"] == []
    assert {g[1] for g in got} == {_schema_once(path)}


# --------------------------------------------------------------- 5. reading never creates
def test_reading_a_ledger_that_does_not_exist_creates_nothing(tmp_path):
    """Issue 23: `ldp-beam ledger` pointed at a path that does not exist created an empty
    ledger (and its folder)."""
    missing = tmp_path / "no-such-folder" / "ledger.db"
    for url in (str(missing), "sqlite:///" + str(missing)):
        with pytest.raises(LedgerNotFound, match=f"no ledger at {missing}") as ei:
            Ledger.open(url, create=False)
        assert "--ledger" in str(ei.value) and "nothing was created" in str(ei.value)
    with pytest.raises(LedgerNotFound, match="no ledger at"):
        ledger_cli("--ledger", str(missing))
    with pytest.raises(LedgerNotFound):
        ledger_cli("--ledger", str(missing), "--json")
    with pytest.raises(LedgerNotFound):
        ledger_cli("--ledger", str(missing), "--resolve", "x", "--as", "aborted")
    assert not (tmp_path / "no-such-folder").exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    with pytest.raises(LedgerNotFound, match="holds no ldp-beam ledger"):
        Ledger.open(str(empty), create=False)
    assert empty.read_bytes() == b"" and sorted(os.listdir(tmp_path)) == ["empty.db"]
    other = tmp_path / "other.db"  # somebody else's SQLite database: not changed
    con = sqlite3.connect(str(other))
    con.execute("CREATE TABLE t (a)")
    con.commit()
    con.close()
    before = other.read_bytes()
    with pytest.raises(LedgerNotFound):
        Ledger.open(str(other), create=False)
    assert other.read_bytes() == before
    # through the command line: exit status 2, one line naming --ledger, and nothing created
    from ldp_beam_test_helpers import run_cli

    code, _, se = run_cli("ledger", "--ledger", str(missing))
    assert code == 2 and "--ledger" in se and "no ledger at" in se
    assert not (tmp_path / "no-such-folder").exists()


def test_reading_a_postgres_database_without_a_ledger_creates_nothing(fresh_pg_url):
    import psycopg

    with pytest.raises(LedgerNotFound, match="no ldp-beam ledger tables"):
        Ledger.open(fresh_pg_url, create=False)
    with psycopg.connect(fresh_pg_url) as con:
        assert con.execute("SELECT to_regclass('ldp_beam_meta')").fetchone()[0] is None
    Ledger.open(fresh_pg_url).close()  # a run creates it
    with Ledger.open(fresh_pg_url, create=False) as led:
        assert led.entries() == []


# ---------------------------------------------------------------------- 6. migration
def _v1_rows(uri_a, uri_b, uri_b_copy, spool):
    """A schema-1 ledger's content: two versions of table A (budgets 2.0 then 1.5), table B read
    at two paths (one fingerprint, budget 3.0, with delta), a stream with per-unit spend."""
    common = dict(finished="2026-01-01T01:00:00.000000Z", unit="record", kind="LDP",
                  params="{}", accounting=None, request_key=None, release=None, outputs=None,
                  republished_from=None, seeded=0, host="h", pid=1, os_user="u", note=None)
    entries = [
        dict(common, run_id="a1", status="committed", started="2026-01-01T00:00:00.000000Z",
             command="collect", fingerprint="sha256:aaa1", uri=uri_a, mechanism="grr",
             epsilon=1.0, delta=0.0, budget_epsilon=2.0, budget_delta=None),
        dict(common, run_id="a2", status="pending", started="2026-01-02T00:00:00.000000Z",
             command="collect", fingerprint="sha256:aaa2", uri=uri_a, mechanism="grr",
             epsilon=0.5, delta=0.0, budget_epsilon=1.5, budget_delta=None),
        dict(common, run_id="a3", status="aborted", started="2026-01-03T00:00:00.000000Z",
             command="collect", fingerprint="sha256:aaa2", uri=uri_a, mechanism="grr",
             epsilon=0.5, delta=0.0, budget_epsilon=1.5, budget_delta=None),
        dict(common, run_id="b1", status="committed", started="2026-01-04T00:00:00.000000Z",
             command="release", fingerprint="sha256:bbb", uri=uri_b, mechanism="dphr",
             epsilon=0.7, delta=1e-7, budget_epsilon=3.0, budget_delta=1e-6,
             request_key="k", release='{"estimate": 1}'),
        dict(common, run_id="b2", status="committed", started="2026-01-05T00:00:00.000000Z",
             command="collect", fingerprint="sha256:bbb", uri=uri_b_copy, mechanism="grr",
             epsilon=0.4, delta=0.0, budget_epsilon=3.0, budget_delta=1e-6),
    ]
    datasets = [("sha256:aaa1", uri_a, "2026-01-01T00:00:00.000000Z", 2.0, None,
                 "2026-01-01T00:00:00.000000Z"),
                ("sha256:aaa2", uri_a, "2026-01-02T00:00:00.000000Z", 1.5, None,
                 "2026-01-02T00:00:00.000000Z"),
                ("sha256:bbb", uri_b, "2026-01-04T00:00:00.000000Z", 3.0, 1e-6,
                 "2026-01-04T00:00:00.000000Z"),
                ("stream:sss", spool, "2026-01-06T00:00:00.000000Z", None, None, None)]
    spend = [("stream:sss", f"u{i}", f"w{w}", 0.5, "s1", "2026-01-06T00:00:00.000000Z")
             for i in range(3) for w in range(2)]
    return entries, datasets, spend


def _build_v1(execute, executemany, placeholder="?"):
    from ldp_beam.ledger.migrate import _SCHEMA_V1, _V1_ENTRY_COLUMNS

    for stmt in _SCHEMA_V1:
        execute(stmt)
    q = lambda n: ", ".join([placeholder] * n)  # noqa: E731
    for key, value in (("schema_version", "1"), ("unit_salt", "00" * 16),
                       ("created", "2026-01-01T00:00:00.000000Z")):
        execute(f"INSERT INTO ldp_beam_meta (key, value) VALUES ({q(2)})", (key, value))
    entries, datasets, spend = _v1_rows("/data/a.csv", "/data/b.csv", "/copy/b.csv", "/spool")
    executemany("INSERT INTO ldp_beam_datasets (fingerprint, uri, first_seen, budget_epsilon, "
                f"budget_delta, budget_set) VALUES ({q(6)})", datasets)
    executemany(f"INSERT INTO ldp_beam_entries ({', '.join(_V1_ENTRY_COLUMNS)}) VALUES "
                f"({q(len(_V1_ENTRY_COLUMNS))})",
                [[e[c] for c in _V1_ENTRY_COLUMNS] for e in entries])
    executemany("INSERT INTO ldp_beam_unit_spend (fingerprint, unit_hash, window_id, epsilon, "
                f"run_id, recorded) VALUES ({q(6)})", spend)


def _check_migrated(url):
    with Ledger.open(url, create=False) as led:  # reading migrates it too: nothing is created
        assert led.ledger_id
        entries = {e["run_id"]: e for e in led.entries()}
        assert sorted(entries) == ["a1", "a2", "a3", "b1", "b2"]
        assert {k: (e["dataset"], e["status"]) for k, e in entries.items()} == {
            "a1": ("/data/a.csv", "committed"), "a2": ("/data/a.csv", "pending"),
            "a3": ("/data/a.csv", "aborted"), "b1": ("/data/b.csv", "committed"),
            "b2": ("/copy/b.csv", "committed")}
        assert entries["a2"]["fingerprint"] == "sha256:aaa2"
        assert entries["b1"]["release"] == {"estimate": 1}
        # A's two fingerprints had budgets 2.0 and 1.5: the smallest is kept, and said
        assert led.budget("/data/a.csv") == (1.5, None)
        assert led.spent("/data/a.csv").epsilon == pytest.approx(1.5)  # a1 + pending a2
        # B's budget applied to its fingerprint, wherever it was read: both locations keep it
        assert led.budget("/data/b.csv") == (3.0, 1e-6)
        assert led.budget("/copy/b.csv") == (3.0, 1e-6)
        assert led.budget("/spool") == (None, None)
        with led._tx(write=False) as tx:  # a v1 ledger's per-unit rows survive the migration
            spend = tx.all("SELECT unit_hash, SUM(epsilon) FROM ldp_beam_unit_spend WHERE "
                           "dataset = ? GROUP BY unit_hash", ("/spool",))
        assert {u: float(e) for u, e in spend} == {"u0": 1.0, "u1": 1.0, "u2": 1.0}
        changes = {c["dataset"]: c for c in led.budget_changes()}
        assert sorted(changes) == ["/copy/b.csv", "/data/a.csv", "/data/b.csv"]
        assert all(c["why"].startswith("migrated from schema 1") for c in changes.values())
        assert "epsilon=1.5; epsilon=2" in changes["/data/a.csv"]["why"]
        assert changes["/data/b.csv"]["why"] == "migrated from schema 1"
        # and it works as a schema-2 ledger: the budget holds, runs are recorded
        with pytest.raises(BudgetExceeded):
            led.reserve("a4", {"dataset": "/data/a.csv", "uri": "/data/a.csv",
                               "fingerprint": "sha256:aaa3"}, command="collect",
                        mechanism="grr", epsilon=0.1)
        led.reserve("b3", {"dataset": "/data/b.csv", "uri": "/data/b.csv",
                           "fingerprint": "sha256:bbb"}, command="collect", mechanism="grr",
                    epsilon=0.1).commit()
    with Ledger.open(url) as again:  # opened again: migrated once
        assert len(again.entries()) == 6 and len(again.budget_changes()) == 3


def test_a_schema_1_sqlite_ledger_is_migrated_in_place(tmp_path):
    path = str(tmp_path / "v1.db")
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode = WAL")
    _build_v1(con.execute, con.executemany)
    con.close()
    _check_migrated("sqlite:///" + path)
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    version = con.execute("SELECT value FROM ldp_beam_meta WHERE key = 'schema_version'")
    assert version.fetchone()[0] == str(SCHEMA_VERSION) == "2"
    con.close()
    assert not [t for t in tables if "v1" in t]


def test_a_schema_1_postgres_ledger_is_migrated_in_place(fresh_pg_url):
    import psycopg

    with psycopg.connect(fresh_pg_url, autocommit=True) as con:
        with con.transaction():
            _build_v1(con.execute, lambda sql, rows: con.cursor().executemany(sql, rows), "%s")
    _check_migrated(fresh_pg_url)
    with psycopg.connect(fresh_pg_url) as con:
        assert con.execute("SELECT to_regclass('ldp_beam_v1_entries')").fetchone()[0] is None


def test_a_failed_migration_changes_nothing(tmp_path, monkeypatch):
    from ldp_beam.ledger import store as L  # where Ledger looks _migrate_v1 up

    path = str(tmp_path / "v1.db")
    con = sqlite3.connect(path, isolation_level=None)
    _build_v1(con.execute, con.executemany)
    con.close()
    real = L._migrate_v1

    def broken(tx, url):
        real(tx, url)
        tx.execute("DELETE FROM ldp_beam_entries WHERE run_id = 'a3'")
        raise LedgerError("simulated failure after the copy")

    monkeypatch.setattr(L, "_migrate_v1", broken)
    with pytest.raises(LedgerError, match="simulated"):
        Ledger.open(path)
    con = sqlite3.connect(path)
    assert con.execute("SELECT value FROM ldp_beam_meta WHERE key = 'schema_version'"
                       ).fetchone()[0] == "1"
    assert con.execute("SELECT COUNT(*) FROM ldp_beam_entries").fetchone()[0] == 5
    con.close()
    monkeypatch.setattr(L, "_migrate_v1", real)
    _check_migrated("sqlite:///" + path)


def test_a_ledger_newer_than_this_code_is_still_refused(tmp_path):
    path = str(tmp_path / "l.db")
    Ledger.open(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE ldp_beam_meta SET value = '3' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(LedgerError, match="version is 3.*upgrade"):
        Ledger.open(path)


# ----------------------------------------------------------- 7. status, and the CLI
def test_dataset_status_and_the_ledger_line(tmp_path):
    from ldp_beam.pipelines.ledger_cli import ledger_line

    url = "sqlite:///" + str(tmp_path / "l.db")
    ds = dataset_identity(_csv(tmp_path / "d.csv", 5), name="people")
    with Ledger.open(url) as led:
        st = led.dataset_status("people")
        assert st == {"dataset": "people", "budget": None, "spent": st["spent"],
                      "remaining": None, "runs": 0, "pending": 0}
        assert ledger_line(led.url, st, False) == \
            f"ledger {url}: dataset people has spent epsilon=0 (no budget)"
        reserve(led, "r1", ds, 0.75, budget=2.0).commit()
        reserve(led, "r2", ds, 0.25)  # pending
        st = led.dataset_status(ds)
        assert st["budget"] == {"epsilon": 2.0, "delta": None} and st["runs"] == 2
        assert st["spent"]["epsilon"] == 1.0 and st["remaining"] == 1.0 and st["pending"] == 1
        line = ledger_line(led.url, st, True)
    assert line.startswith(f"ledger {url}: dataset people has spent epsilon=1 of budget 2 "
                           "(1 left)")
    assert "1 pending" in line
    assert line.endswith("(the default ledger; pass --ledger or set LDP_BEAM_LEDGER)")


def test_run_options_carry_the_dataset_name():
    from ldp_beam.pipelines.ledger_cli import add_ledger_options, ledger_args

    ap = argparse.ArgumentParser()
    add_ledger_options(ap)
    helps = {a.dest: a.help for a in ap._actions}
    assert helps["dataset"] == ("the dataset's name in the ledger: its budget follows the "
                                "people in it however its content changes (default: the "
                                "input's canonical location)")
    assert ledger_args(ap.parse_args(["--dataset", "crm", "--budget", "2"])) == {
        "ledger": None, "budget": 2.0, "budget_delta": None, "dataset": "crm"}
    assert ledger_args(ap.parse_args([]))["dataset"] is None


def test_set_budget_through_the_command(ledger_url, tmp_path):
    src = _csv(tmp_path / "d.csv", 5)
    ds = dataset_identity(src)
    with Ledger.open(ledger_url) as led:
        reserve(led, "r1", ds, 1.0, budget=1.5).commit()
    for args, name in ((("--set-budget", "3"), "--dataset"),
                       (("--set-budget", "3", "--dataset", "x"), "--why"),
                       (("--set-budget", "3", "--dataset", "x", "--why", " "), "--why"),
                       (("--budget-delta", "1e-6",), "--budget-delta"),
                       (("--why", "because"), "--why"),
                       (("--set-budget", "-1", "--dataset", "x", "--why", "w"), "--set-budget")):
        with pytest.raises(ParameterError) as ei:
            ledger_cli("--ledger", ledger_url, *args)
        assert ei.value.name == name, (args, ei.value)
    # by its path (its default name is the canonical location), raised, with why
    code, out = ledger_cli("--ledger", ledger_url, "--set-budget", "3", "--dataset", src,
                           "--why", "owner agreed (PRIV-7)")
    assert code == 0
    assert f"dataset {ds['dataset']}: budget epsilon=1.5 -> epsilon=3" in out
    assert "owner agreed (PRIV-7)" in out and "has spent epsilon=1 of budget 3 (2 left)" in out
    code, out = ledger_cli("--ledger", ledger_url, "--set-budget", "0.5", "--budget-delta",
                           "1e-6", "--dataset", ds["dataset"], "--why", "tightened")
    assert "epsilon=3 -> epsilon=0.5 delta=1e-06" in out and "no further run" in out
    with Ledger.open(ledger_url) as led:
        assert led.budget(ds["dataset"]) == (0.5, 1e-6)
        assert [c["why"] for c in led.budget_changes()] == [
            "set by run", "owner agreed (PRIV-7)", "tightened"]
    # the listing shows the dataset's name, its data's fingerprint and the budget history
    code, out = ledger_cli("--ledger", ledger_url)
    row = next(line for line in out.splitlines() if " r1 " in line)
    assert f"{ds['dataset']} [{ds['fingerprint'][7:19]}]" in row
    assert "budget epsilon=1.5 -> epsilon=3" not in out  # history lines read was -> now:
    assert "none -> epsilon=1.5 by" in out and "(run r1): set by run" in out
    assert "epsilon=1.5 -> epsilon=3 by" in out and ": owner agreed (PRIV-7)" in out
    doc = json.loads(ledger_cli("--ledger", ledger_url, "--json")[1])
    (t,) = doc["totals"]
    assert [c["why"] for c in t["budget_changes"]][-1] == "tightened"


def test_the_listing_filters_and_totals_by_dataset_name(tmp_path):
    url = "sqlite:///" + str(tmp_path / "l.db")
    v1 = _csv(tmp_path / "exports" / "monday.csv", 5)
    v2 = _csv(tmp_path / "exports" / "tuesday.csv", 6)
    other = _csv(tmp_path / "other.csv", 3)
    with Ledger.open(url) as led:
        reserve(led, "m", dataset_identity(v1, name="crm"), 0.5, budget=2.0).commit()
        reserve(led, "t", dataset_identity(v2, name="crm"), 0.5).commit()
        reserve(led, "o", dataset_identity(other), 1.0).commit()
    code, out = ledger_cli("--ledger", url, "--dataset", "crm", "--json")
    doc = json.loads(out)
    assert [e["run_id"] for e in doc["entries"]] == ["m", "t"]
    (t,) = doc["totals"]
    assert t["dataset"] == "crm" and t["spent"]["epsilon"] == 1.0 and t["remaining"] == 1.0
    assert len(t["fingerprints"]) == 2 and t["uris"] == sorted(
        [os.path.realpath(v1), os.path.realpath(v2)])
    # still by a path it was read from, or a fingerprint prefix (totals: the whole dataset)
    fp = dataset_identity(v2)["fingerprint"]
    for sel in (v2, fp[7:20]):
        doc = json.loads(ledger_cli("--ledger", url, "--dataset", sel, "--json")[1])
        assert [e["run_id"] for e in doc["entries"]] == ["t"]
        assert [(t["dataset"], t["spent"]["epsilon"]) for t in doc["totals"]] == [("crm", 1.0)]
    code, out = ledger_cli("--ledger", url)
    assert "  crm: spent epsilon=1 " in out and "2 versions of its data" in out
    assert f"  {os.path.realpath(other)}: spent epsilon=1 " in out
