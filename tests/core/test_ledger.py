"""The budget ledger (ldp_beam.ledger, `ldp-beam ledger`) on a SQLite file and on a real
PostgreSQL server started from the machine's packages (tests/postgres_server.py)."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam.errors import ParameterError
from ldp_beam.ledger import (BudgetExceeded, Ledger, LedgerError, LedgerUnavailable, compose,
                             default_url, release_request)
from ldp_beam.pipelines.datasets import dataset_identity
from ldp_beam_test_helpers import ledger_cli, reserve

_spec = importlib.util.spec_from_file_location(
    "ldp_beam_postgres_server",
    Path(__file__).resolve().parents[1] / "postgres_server.py")  # tests/postgres_server.py
pgs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pgs)


# ------------------------------------------------------------------------------ fixtures
# fixtures ledger_url (SQLite and PostgreSQL) and fresh_pg_url: tests/conftest.py; data:
# tests/core/conftest.py


# ------------------------------------------------------------------------ the two phases
def test_reserve_commit_records_everything(ledger_url, data):
    with Ledger.open(ledger_url) as led:
        res = reserve(led, "run-1", data, 0.5, params={"epsilon": 0.5, "domain": "a,b"},
                      unit="uid", kind="LDP", budget=2.0)
        assert res.status == "pending" and res.spent_before.epsilon == 0
        res.commit({"reports": {"path": "/x/r.parquet", "bytes": 10, "sha256": "ab" * 32}})
        (e,) = led.entries()
    assert e["run_id"] == "run-1" and e["status"] == "committed" and e["command"] == "collect"
    assert e["fingerprint"] == data["fingerprint"] and e["uri"] == data["uri"]
    assert e["unit"] == "uid" and e["mechanism"] == "grr" and e["kind"] == "LDP"
    assert e["params"] == {"epsilon": 0.5, "domain": "a,b"}
    assert (e["epsilon"], e["delta"], e["budget_epsilon"]) == (0.5, 0.0, 2.0)
    assert e["outputs"]["reports"]["sha256"] == "ab" * 32 and e["release"] is None
    assert e["started"] <= e["finished"] and e["started"].endswith("Z")
    assert e["host"] == socket.gethostname() and e["pid"] == os.getpid()


def test_budget_refusal_names_what_was_spent(ledger_url, data):
    with Ledger.open(ledger_url) as led:
        reserve(led, "run-a", data, 0.5, budget=1.0).commit()
        reserve(led, "run-b", data, 0.3, command="estimate", mechanism="dphr")  # pending
        with pytest.raises(BudgetExceeded) as ei:
            reserve(led, "run-c", data, 0.25, mechanism="pm")
        msg = str(ei.value)
        for part in ("--budget", "1", "already spent epsilon=0.8", "run-a collect grr "
                     "epsilon=0.5", "run-b estimate dphr epsilon=0.3 PENDING",
                     "this run (collect pm) asks epsilon=0.25", "1.05", data["uri"],
                     "before any noise"):
            assert part in msg, (part, msg)
        assert ei.value.name == "--budget" and ei.value.value == 1.0
        assert isinstance(ei.value, ParameterError)
        assert ei.value.spent.epsilon == pytest.approx(0.8) and ei.value.asked == (0.25, 0.0)
        assert [e["run_id"] for e in led.entries()] == ["run-a", "run-b"]  # nothing recorded
        reserve(led, "run-d", data, 0.2).commit()  # what still fits, fits (0.8 + 0.2 = 1)
        assert led.spent(data["dataset"]).epsilon == pytest.approx(1.0)


def test_budget_is_remembered_per_dataset_and_a_copy_spends_it(tmp_path, data):
    """Issue 23: a dataset is a name. A copy read under the same --dataset name spends the same
    budget; a run cannot raise it (only set_budget can, recorded)."""
    url = "sqlite:///" + str(tmp_path / "l.db")
    copy = tmp_path / "elsewhere" / "renamed.csv"
    copy.parent.mkdir()
    shutil.copy(data["uri"], copy)
    data = dataset_identity(data["uri"], name="survey")
    other = dataset_identity(str(copy), name="survey")
    assert other["fingerprint"] == data["fingerprint"] and other["uri"] != data["uri"]
    with Ledger.open(url) as led:
        reserve(led, "r1", data, 0.7, budget=1.0).commit()
        with pytest.raises(BudgetExceeded, match="recorded for this dataset"):
            reserve(led, "r2", other, 0.5)  # no --budget given: the recorded one applies
        with pytest.raises(BudgetExceeded, match="--set-budget"):
            reserve(led, "r3", other, 0.5, budget=1.5)  # a run cannot raise it
        led.set_budget("survey", 1.5, why="the owner agreed")  # the recorded act can
        reserve(led, "r3", other, 0.5).commit()
        assert led.budget("survey") == (1.5, None)
        (t,) = led.summary()
        assert t["spent"]["epsilon"] == pytest.approx(1.2) and t["remaining"] == pytest.approx(0.3)
        assert t["uris"] == sorted([data["uri"], other["uri"]])


def test_a_failed_run_gives_its_reservation_back(ledger_url, data):
    with Ledger.open(ledger_url) as led:
        with pytest.raises(RuntimeError):
            with reserve(led, "failed", data, 0.9, budget=1.0):
                raise RuntimeError("pipeline failed")
        (e,) = led.entries()
        assert e["status"] == "aborted" and "pipeline failed" in e["note"]
        assert led.spent(data["dataset"]).epsilon == 0
        with reserve(led, "ok", data, 0.9) as res:
            res.commit({})
        assert led.spent(data["dataset"]).epsilon == pytest.approx(0.9)
        with pytest.raises(LedgerError, match="committed"):
            led.abort("ok")
        with pytest.raises(LedgerError, match="already in the ledger"):
            reserve(led, "ok", data, 0.0)


def test_a_crashed_run_counts_as_spent_until_resolved(ledger_url, data, tmp_path):
    """A process killed between reserve and commit leaves its reservation pending: it counts,
    the listing shows it, and only an operator's --resolve gives it back."""
    script = ("import os, signal, sys\n"
              "from ldp_beam.ledger import Ledger\n"
              "led = Ledger.open(sys.argv[1])\n"
              "led.reserve('crashed-run', eval(sys.argv[2]), command='estimate', "
              "mechanism='dphr', epsilon=0.6, budget=1.0)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", script, ledger_url, repr(data)], timeout=120,
                       capture_output=True, text=True)
    assert r.returncode == -9, r.stderr
    with Ledger.open(ledger_url) as led:
        spent = led.spent(data["dataset"])
        assert (spent.epsilon, spent.pending) == (pytest.approx(0.6), 1)
        with pytest.raises(BudgetExceeded, match="crashed-run estimate dphr epsilon=0.6 PENDING"):
            reserve(led, "rerun", data, 0.6)
        with pytest.raises(LedgerError, match="no reservation"):
            led.commit("rerun")  # never recorded: it can never be committed
    code, out = ledger_cli("--ledger", ledger_url)
    assert code == 0 and "crashed-run" in out and "pending" in out
    code, out = ledger_cli("--ledger", ledger_url, "--resolve", "crashed-run", "--as", "aborted",
                           "--note", "killed before its pipeline finished")
    assert code == 0 and "resolved as aborted" in out
    with Ledger.open(ledger_url) as led:
        assert led.spent(data["dataset"]).epsilon == 0
        reserve(led, "rerun", data, 0.6).commit()
        with pytest.raises(ParameterError, match="--resolve"):
            led.resolve("rerun", "aborted")  # only pending runs are resolved


def test_commit_after_an_operator_aborted_the_run_is_refused(ledger_url, data):
    with Ledger.open(ledger_url) as led:
        res = reserve(led, "slow", data, 0.5)
        led.resolve("slow", "aborted", "looked dead")
        with pytest.raises(LedgerError, match="aborted.*must not publish"):
            res.commit({})


# ------------------------------------------------------------------------- re-publishing
def test_find_release_returns_the_committed_release(ledger_url, data):
    req = release_request("dphr", {"epsilon": 0.5, "bins": 10, "lower": 0, "upper": 100},
                          {"value": "age"}, {}, unit="record")
    # as written (key order kept, so a re-publication is byte for byte the same file; NaN kept)
    release = {"mechanism": "dphr", "estimate": {"statistics": {"histogram": {
        "value": [3, 0, 7]}, "mean": {"value": float("nan")}}}, "guarantee": {"epsilon": 0.5}}
    with Ledger.open(ledger_url) as led:
        assert led.find_release(data["fingerprint"], req) is None
        reserve(led, "rel-1", data, 0.5, command="release", mechanism="dphr", request=req,
                budget=0.5).commit({"release": {"path": "/o/h.json"}}, release)
        found = led.find_release(data["fingerprint"], req)
        assert found["run_id"] == "rel-1"
        assert json.dumps(found["release"]) == json.dumps(release)
        assert found["outputs"]["release"]["path"] == "/o/h.json"
        # another request (other bounds, unit, columns) or other data: not the same release
        for other in (release_request("dphr", {"epsilon": 0.5, "bins": 10, "lower": 0,
                                               "upper": 90}, {"value": "age"}),
                      release_request("dphr", req["params"], {"value": "age"}, unit="uid"),
                      release_request("dphr", req["params"], {"value": "income"})):
            assert led.find_release(data["fingerprint"], other) is None
        assert led.find_release("sha256:" + "0" * 64, req) is None
        # an aborted release is not found; the re-publication costs nothing, even at the budget
        with pytest.raises(RuntimeError):
            with reserve(led, "rel-2", data, 0.0, command="release", mechanism="dphr",
                         request=dict(req, seed="7")):
                raise RuntimeError("killed")
        assert led.find_release(data["fingerprint"], dict(req, seed="7")) is None
        reserve(led, "rel-1-again", data, 0.0, command="release", mechanism="dphr",
                request=req, republished_from="rel-1").commit({}, release)
        assert led.find_release(data["fingerprint"], req)["run_id"] == "rel-1"
        assert led.spent(data["dataset"]).epsilon == 0.5
        with pytest.raises(BudgetExceeded) as ei:  # the re-publication spent nothing: not named
            reserve(led, "rel-3", data, 0.1, command="release", mechanism="dphr")
        assert "by 1 run(s) [rel-1 release dphr epsilon=0.5" in str(ei.value)
        assert "rel-1-again" not in str(ei.value)
        code, out = ledger_cli("--ledger", ledger_url)
        assert "committed (re-published)" in out


# ---------------------------------------------------------------------------- concurrency
def test_concurrent_reservations_never_both_pass(ledger_url, tmp_path):
    """Two runs on two connections race for a budget that holds one of them: in every round
    exactly one is recorded (the dataset's row is locked through the check and the insert)."""
    rounds = 6
    for rnd in range(rounds):
        p = tmp_path / f"d{rnd}.csv"
        p.write_text(f"x\n{rnd}\n")
        ds = dataset_identity(str(p))
        with Ledger.open(ledger_url) as led:
            reserve(led, f"seed-{rnd}", ds, 0.1, budget=1.0).commit()
        barrier = threading.Barrier(2)
        results: dict[str, object] = {}

        def attempt(name):
            led = Ledger.open(ledger_url, timeout=30)
            try:
                barrier.wait()
                results[name] = reserve(led, f"{name}-{rnd}", ds, 0.6)
            except BudgetExceeded as exc:
                results[name] = exc
            finally:
                led.close()

        threads = [threading.Thread(target=attempt, args=(n,)) for n in ("one", "two")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        kinds = sorted(type(v).__name__ for v in results.values())
        assert kinds == ["BudgetExceeded", "Reservation"], results
        with Ledger.open(ledger_url) as led:
            assert led.spent(ds["dataset"]).epsilon == pytest.approx(0.7)


def test_a_reservation_waits_for_one_in_flight_and_counts_it(ledger_url, data):
    """Deterministic interleaving: another process is mid-reservation (its transaction holds the
    dataset and has inserted its pending row, not yet committed). Our reserve must wait for it
    and then count it: reading what was spent before the other commits would let both pass."""
    from ldp_beam.ledger.backends import _ENTRY_COLUMNS

    with Ledger.open(ledger_url) as led:
        reserve(led, "seed", data, 0.1, budget=1.0).commit()
    row = {c: None for c in _ENTRY_COLUMNS}
    row.update(run_id="other-process", status="pending", started="2026-01-01T00:00:00.000000Z",
               command="estimate", dataset=data["dataset"], fingerprint=data["fingerprint"],
               uri=data["uri"], unit="record", mechanism="dphr", params="{}", epsilon=0.6,
               delta=0.0, seeded=0)
    insert = (f"INSERT INTO ldp_beam_entries ({', '.join(_ENTRY_COLUMNS)}) VALUES "
              f"({', '.join('?' * len(_ENTRY_COLUMNS))})")
    if ledger_url.startswith("sqlite"):
        holder = sqlite3.connect(ledger_url[len("sqlite:///"):], isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        holder.execute(insert, [row[c] for c in _ENTRY_COLUMNS])
        finish = lambda: (holder.execute("COMMIT"), holder.close())  # noqa: E731
    else:
        import psycopg

        holder = psycopg.connect(ledger_url)
        holder.execute("SELECT 1 FROM ldp_beam_datasets WHERE dataset = %s FOR UPDATE",
                       (data["dataset"],))
        holder.execute(insert.replace("?", "%s"), [row[c] for c in _ENTRY_COLUMNS])
        finish = lambda: (holder.commit(), holder.close())  # noqa: E731
    result: list = []

    def ours():
        with Ledger.open(ledger_url, timeout=20) as led:
            try:
                result.append(reserve(led, "ours", data, 0.6))
            except BudgetExceeded as exc:
                result.append(exc)

    t = threading.Thread(target=ours)
    t.start()
    time.sleep(0.8)
    assert t.is_alive() and not result  # waiting for the other transaction
    finish()
    t.join(30)
    assert len(result) == 1 and isinstance(result[0], BudgetExceeded), result
    assert "other-process estimate dphr epsilon=0.6 PENDING" in str(result[0])


def test_sqlite_locked_beyond_the_timeout_is_unavailable(tmp_path, data):
    path = tmp_path / "locked.db"
    url = "sqlite:///" + str(path)
    Ledger.open(url).close()
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process mid-write, holding the lock
    try:
        with Ledger.open(url, timeout=0.5) as led:
            t0 = time.monotonic()
            with pytest.raises(LedgerUnavailable) as ei:
                reserve(led, "blocked", data, 0.1)
            waited = time.monotonic() - t0
        assert 0.4 < waited < 5, waited
        assert "--ledger" in str(ei.value) and "locked" in str(ei.value)
        assert "no noise was drawn" in str(ei.value)
        fresh = "sqlite:///" + str(tmp_path / "fresh.db")
        holder2 = sqlite3.connect(str(tmp_path / "fresh.db"), isolation_level=None)
        holder2.execute("BEGIN EXCLUSIVE")
        with pytest.raises(LedgerUnavailable, match="locked"):
            Ledger.open(fresh, timeout=0.3)  # cannot even create the schema
        holder2.execute("ROLLBACK")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Ledger.open(url) as led:  # released: it works, and nothing was recorded meanwhile
        assert led.entries() == []
        reserve(led, "after", data, 0.1).commit()


def test_postgres_locked_beyond_the_timeout_is_unavailable(fresh_pg_url, data):
    import psycopg

    with Ledger.open(fresh_pg_url) as led:
        reserve(led, "first", data, 0.1).commit()
    holder = psycopg.connect(fresh_pg_url)
    holder.execute("SELECT 1 FROM ldp_beam_datasets WHERE dataset = %s FOR UPDATE",
                   (data["dataset"],))  # another run's reservation, mid-transaction
    try:
        with Ledger.open(fresh_pg_url, timeout=1.0) as led:
            t0 = time.monotonic()
            with pytest.raises(LedgerUnavailable, match="locked by another run") as ei:
                reserve(led, "blocked", data, 0.1)
            assert 0.9 < time.monotonic() - t0 < 6
            assert "--ledger postgresql://ldpbeam@127.0.0.1" in str(ei.value)
    finally:
        holder.rollback()
        holder.close()
    with Ledger.open(fresh_pg_url) as led:
        assert [e["run_id"] for e in led.entries()] == ["first"]


def test_postgres_reconnects_after_losing_an_idle_connection(fresh_pg_url, data):
    """A long pipeline: the server closed the launcher's idle connection meanwhile."""
    import psycopg

    with Ledger.open(fresh_pg_url) as led:
        res = reserve(led, "long-run", data, 0.5)
        with psycopg.connect(fresh_pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                          "application_name = 'ldp-beam ledger'")
        res.commit({})
        assert led.entries()[0]["status"] == "committed"


def test_a_ledger_lost_before_commit_publishes_nothing_and_stays_pending(pg_server,
                                                                         fresh_pg_url,
                                                                         data):
    """The ledger becomes unreachable while the run computes: commit raises LedgerUnavailable
    (the run must then publish nothing) and the reservation stays pending, counted as spent."""
    import psycopg

    name = fresh_pg_url.rsplit("/", 1)[1]
    published = []
    with Ledger.open(fresh_pg_url) as led:
        with pytest.raises(LedgerUnavailable, match="cannot reach"):
            with reserve(led, "orphan", data, 0.5, budget=1.0) as res:
                with psycopg.connect(pg_server.admin_url(), autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                  "datname = %s", (name,))
                    admin.execute(f"ALTER DATABASE {name} RENAME TO {name}_gone")
                res.commit({})
                published.append("outputs")  # never reached
    assert not published
    with psycopg.connect(pg_server.admin_url(), autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name}_gone RENAME TO {name}")
    with Ledger.open(fresh_pg_url) as led:
        (e,) = led.entries()
        assert e["status"] == "pending" and led.spent(data["dataset"]).epsilon == 0.5


def test_unreachable_postgres_fails_within_seconds_without_the_password():
    port = pgs.free_port()  # nothing listens there: refused
    t0 = time.monotonic()
    with pytest.raises(LedgerUnavailable) as ei:
        Ledger.open(f"postgresql://alice:s3cret-pw@127.0.0.1:{port}/ledger", timeout=3)
    assert time.monotonic() - t0 < 5
    msg = str(ei.value)
    assert "--ledger postgresql://alice:***@127.0.0.1:%d/ledger" % port in msg
    assert "s3cret-pw" not in msg and "no noise was drawn" in msg


def test_a_postgres_server_that_never_answers_times_out():
    """A port that accepts TCP connections but never speaks (a hung server): libpq's
    connect_timeout bounds the wait."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)  # the kernel completes the handshake; nobody ever answers
    port = srv.getsockname()[1]
    try:
        t0 = time.monotonic()
        with pytest.raises(LedgerUnavailable, match="cannot reach the PostgreSQL ledger"):
            Ledger.open(f"postgresql://u@127.0.0.1:{port}/db", timeout=2)
        assert 1.5 < time.monotonic() - t0 < 6
    finally:
        srv.close()


# ---------------------------------------------------------------------------- composition
def test_pure_epsilon_sums_are_exact(tmp_path, data):
    entries = [{"epsilon": 0.1, "delta": 0.0}] * 10
    s = compose(entries)
    assert s.epsilon == 1.0 and s.delta == 0.0 and s.method.startswith("exact sum")
    assert compose([{"epsilon": e, "delta": 0} for e in (0.3, 0.25, 1e-9)]).epsilon == \
        math.fsum([0.3, 0.25, 1e-9])
    with Ledger.open("sqlite:///" + str(tmp_path / "l.db")) as led:
        for i in range(10):
            reserve(led, f"r{i}", data, 0.1, budget=1.0).commit()  # ten tenths fit exactly
        with pytest.raises(BudgetExceeded):
            reserve(led, "r10", data, 1e-6)
        assert led.spent(data["dataset"]).epsilon == 1.0


def test_generic_eps_delta_composition_is_the_optimal_one():
    """k runs of a generic (eps, delta)-DP mechanism compose (dp_accounting PLD) to the optimal
    composition theorem's values (Kairouz, Oh, Viswanath 2015): (k eps, 1-(1-delta)^k) and
    ((k-2) eps, 1-(1-delta)^k (1-delta_1)), delta_1 = (e^{k eps} - e^{(k-2) eps})/(1+e^eps)^k."""
    k, eps, delta = 3, 0.5, 1e-6
    entries = [{"epsilon": eps, "delta": delta}] * k
    d0 = 1 - (1 - delta) ** k
    d1 = (math.exp(k * eps) - math.exp((k - 2) * eps)) / (1 + math.exp(eps)) ** k
    s0 = compose(entries, d0)
    assert s0.epsilon == pytest.approx(k * eps, abs=1e-3)
    s1 = compose(entries, 1 - (1 - delta) ** k * (1 - d1))
    assert (k - 2) * eps - 1e-9 <= s1.epsilon <= (k - 2) * eps + 2e-3, s1
    assert "dp_accounting PLD" in s1.method
    # below the entries' own delta no finite epsilon holds
    assert math.isinf(compose(entries, delta / 2).epsilon)


def _gaussian_delta(eps: float, mu: float) -> float:
    """Exact delta(eps) of a Gaussian mechanism with sensitivity/sigma = mu (Balle & Wang 2018)."""
    from scipy.stats import norm

    return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)


def test_gaussian_runs_compose_through_their_exact_privacy_loss():
    """k Gaussian releases with sigma compose exactly like one with sigma / sqrt(k); the ledger's
    PLD result matches that closed form (pessimistic, within 1%)."""
    from scipy.optimize import brentq

    sigma, k, target = 4.0, 8, 1e-6
    entries = [{"epsilon": 1.2, "delta": 1e-6,
                "accounting": [{"noise": "gaussian", "sigma": sigma, "sensitivity": 1.0}]}] * k
    exact = brentq(lambda e: _gaussian_delta(e, math.sqrt(k) / sigma) - target, 1e-6, 50)
    got = compose(entries, target).epsilon
    assert exact <= got <= exact * 1.01, (got, exact)
    assert got < 8 * 1.2  # far below the basic composition of the stated (1.2, 1e-6)
    # the same through a ledger, mixed with pure runs: composed, not summed
    mixed = entries[:2] + [{"epsilon": 0.1, "delta": 0.0}] * 3
    s = compose(mixed, target)
    assert s.epsilon < s.epsilon_sum and s.delta == target


def test_a_run_without_a_finite_guarantee_never_fits_a_budget(tmp_path, data):
    with Ledger.open("sqlite:///" + str(tmp_path / "l.db")) as led:
        with pytest.raises(BudgetExceeded, match="asks epsilon=inf"):
            reserve(led, "paper-variant", data, math.inf, budget=100.0)
    with Ledger.open("sqlite:///" + str(tmp_path / "m.db")) as led:
        reserve(led, "paper-variant", data, math.inf).commit()  # no budget: recorded as is
        assert math.isinf(led.spent(data["dataset"]).epsilon)
    code, out = ledger_cli("--ledger", "sqlite:///" + str(tmp_path / "m.db"), "--json")
    doc = json.loads(out)  # strict JSON: no Infinity
    assert doc["entries"][0]["epsilon"] is None and doc["totals"][0]["spent"]["epsilon"] is None
    code, out = ledger_cli("--ledger", "sqlite:///" + str(tmp_path / "m.db"))
    assert "spent epsilon=inf" in out


def test_a_budget_without_delta_refuses_a_run_with_delta(ledger_url, data):
    with Ledger.open(ledger_url) as led:
        reserve(led, "pure", data, 0.2, budget=1.0).commit()
        with pytest.raises(BudgetExceeded) as ei:
            reserve(led, "gauss", data, 0.3, delta=1e-6, mechanism="gaussian-histogram")
        assert ei.value.name == "--budget-delta" and "--budget-delta" in str(ei.value)
        res = reserve(led, "gauss", data, 0.3, delta=1e-6, mechanism="gaussian-histogram",
                      budget=1.0, budget_delta=1e-5,
                      accounting={"noise": "gaussian", "sigma": 6.0, "sensitivity": 1.0})
        res.commit()
        s = led.spent(data["dataset"])
        assert s.delta == 1e-5 and "dp_accounting" in s.method and s.epsilon <= 0.5 + 1e-9
        with pytest.raises(ParameterError, match="accounting"):
            reserve(led, "bad", data, 0.1, accounting={"noise": "gaussian", "sigma": -1})


# ----------------------------------------------------------------------- dataset identity
def _footer(path) -> bytes:
    raw = Path(path).read_bytes()
    n = int.from_bytes(raw[-8:-4], "little")
    return raw[-8 - n:]


def test_fingerprint_follows_the_data_not_the_path(tmp_path):
    rng = np.random.default_rng(3)
    t = pa.table({"uid": np.arange(1000), "income": rng.uniform(0, 100, 1000)})
    a = tmp_path / "a" / "survey.parquet"
    a.parent.mkdir()
    opts = dict(compression="none", use_dictionary=False)
    pq.write_table(t, a, **opts)
    b = tmp_path / "b" / "copy_of_survey.parquet"
    b.parent.mkdir()
    shutil.copy(a, b)
    fa, fb = dataset_identity(str(a)), dataset_identity(str(b))
    assert fa["fingerprint"] == fb["fingerprint"] and fa["uri"] != fb["uri"]
    assert fa["files"] == 1 and fa["bytes"] == a.stat().st_size
    # one value that is neither the minimum nor the maximum: same size, same footer (row counts,
    # statistics), different data -> a different fingerprint
    income = t.column("income").to_numpy().copy()
    mid = int(np.argsort(income)[500])
    income[mid] += 1e-6
    c = tmp_path / "c" / "survey.parquet"
    c.parent.mkdir()
    pq.write_table(t.set_column(1, "income", pa.array(income)), c, **opts)
    assert c.stat().st_size == a.stat().st_size and _footer(c) == _footer(a)
    assert dataset_identity(str(c))["fingerprint"] != fa["fingerprint"]
    # file:// URIs are read through pyarrow.fs and agree with the local path
    assert dataset_identity(a.resolve().as_uri())["fingerprint"] == fa["fingerprint"]


def test_fingerprint_of_csv_folders_and_globs(tmp_path):
    d = tmp_path / "parts"
    d.mkdir()
    (d / "p1.csv").write_text("age\n1\n2\n")
    (d / "p2.csv").write_text("age\n3\n4\n")
    (d / "_SUCCESS").write_text("")
    (d / ".hidden").write_text("ignored")
    whole = dataset_identity(str(d))
    assert whole["files"] == 2
    e = tmp_path / "copy"
    shutil.copytree(d, e)
    (e / ".hidden").write_text("other hidden text")
    assert dataset_identity(str(e))["fingerprint"] == whole["fingerprint"]
    assert dataset_identity(str(e / "*.csv"))["fingerprint"] == dataset_identity(
        str(d / "*.csv"))["fingerprint"]
    (e / "p2.csv").write_text("age\n3\n5\n")  # one value
    assert dataset_identity(str(e))["fingerprint"] != whole["fingerprint"]
    (e / "p2.csv").write_text("age\n3\n4\n")
    os.rename(e / "p2.csv", e / "p3.csv")  # record keys follow file names: another dataset
    assert dataset_identity(str(e))["fingerprint"] != whole["fingerprint"]
    with pytest.raises(ParameterError, match="--input"):
        dataset_identity(str(tmp_path / "nothing*.csv"))


# ---------------------------------------------------------------------------- the command
def test_ledger_command_lists_spending_per_dataset_unit_and_time(ledger_url, data, tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("x\n1\n")
    ods = dataset_identity(str(other))
    with Ledger.open(ledger_url) as led:
        reserve(led, "c1", data, 1.0, unit="uid", budget=3.0).commit()
        reserve(led, "c2", data, 0.5, command="estimate", mechanism="dphr").commit()
        reserve(led, "c3", ods, 2.0, mechanism="bisample-md").commit()
        with pytest.raises(RuntimeError):
            with reserve(led, "c4", ods, 2.0, mechanism="pm"):
                raise RuntimeError("x")
    code, out = ledger_cli("--ledger", ledger_url)
    assert code == 0
    lines = out.splitlines()
    row = next(line for line in lines if " c2 " in line)
    for part in ("estimate", "committed", data["uri"], data["fingerprint"][7:19], "dphr", "0.5",
                 time.strftime("%Y-%m-%d", time.gmtime())):
        assert part in row, (part, row)
    assert any(" aborted " in line and " c4 " in line for line in lines)
    total = next(line for line in lines if line.strip().startswith(data["uri"]))
    assert "spent epsilon=1.5" in total and "budget epsilon=3" in total \
        and "remaining 1.5" in total
    assert "unit uid: epsilon=1 (1 run(s))" in out and "unit record: epsilon=0.5" in out
    code, out = ledger_cli("--ledger", ledger_url, "--json", "--dataset", ods["fingerprint"][7:20])
    doc = json.loads(out)
    assert [e["run_id"] for e in doc["entries"]] == ["c3", "c4"]
    (t,) = doc["totals"]
    assert t["spent"]["epsilon"] == 2.0 and t["aborted"] == 1 and t["budget"] is None
    assert list(t["days"].values())[0]["epsilon"] == 2.0
    with pytest.raises(ParameterError, match="--as"):
        ledger_cli("--ledger", ledger_url, "--resolve", "c1")


# ------------------------------------------------------------------------------ bad input
def test_bad_ledger_urls_name_the_option(tmp_path):
    for url, match in (("mysql://u@h/db", "--ledger"), ("sqlite:///:memory:", "outlive"),
                       ("sqlite://", "outlive")):
        with pytest.raises(ParameterError, match=match):
            Ledger.open(url)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(LedgerUnavailable, match="--ledger"):
        Ledger.open("sqlite:///" + str(blocker / "ledger.db"))  # its folder is a file
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(LedgerUnavailable, match="junk.db"):
        Ledger.open(str(junk))


def test_a_ledger_from_a_newer_version_is_refused(tmp_path):
    url = "sqlite:///" + str(tmp_path / "l.db")
    Ledger.open(url).close()
    con = sqlite3.connect(str(tmp_path / "l.db"))
    con.execute("UPDATE ldp_beam_meta SET value = '99' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    with pytest.raises(LedgerError, match="version is 99.*upgrade"):
        Ledger.open(url)


def test_default_location_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("LDP_BEAM_LEDGER", str(tmp_path / "team.db"))
    assert default_url() == "sqlite://" + str(tmp_path / "team.db")  # the path as written
    with Ledger.open() as led:
        assert led.backend == "sqlite"
    assert (tmp_path / "team.db").exists()
    monkeypatch.delenv("LDP_BEAM_LEDGER")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_url() == "sqlite://" + str(tmp_path / "xdg" / "ldp-beam" / "ledger.db")


def test_the_ledger_imports_no_beam():
    code = ("import sys, ldp_beam.ledger\n"
            "assert not [m for m in sys.modules if m.startswith('apache_beam')]\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_prefetched_fingerprint_is_the_same_and_a_changed_file_is_hashed_again(tmp_path):
    """The command line hashes a local input in the background while Beam is imported: the
    identity is the one computed on the spot, and a file changed after it was hashed (size,
    time or inode) is hashed again rather than trusted."""
    import os

    from ldp_beam.pipelines import datasets as L

    f = tmp_path / "d.csv"
    f.write_text("x\n1\n2\n")
    direct = L.dataset_identity(str(f))
    L.prefetch_dataset_identity(str(f))
    assert str(f) in L._PREFETCHED
    assert L.dataset_identity(str(f)) == direct
    assert str(f) not in L._PREFETCHED  # taken once
    L.prefetch_dataset_identity(str(f))
    L._PREFETCHED[str(f)][0].join()
    f.write_text("x\n1\n3\n")  # same size, new content
    st = os.stat(f)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    changed = L.dataset_identity(str(f))
    assert changed["fingerprint"] != direct["fingerprint"]
    assert changed == L._dataset_identity(str(f))
    L.prefetch_dataset_identity(str(tmp_path / "missing.csv"))  # its error is reported on use
    with pytest.raises(ParameterError, match="--input"):
        L.dataset_identity(str(tmp_path / "missing.csv"))
    L.prefetch_dataset_identity("s3://bucket/key")  # remote: not prefetched
    assert "s3://bucket/key" not in L._PREFETCHED
