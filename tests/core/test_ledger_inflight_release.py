"""An identical central release in progress (ldp_beam.ledger.store, ``Ledger.reserve``): two
identical releases started at the same moment both passed ``find_release`` (neither was committed
yet), both reserved and both drew: each was charged, so the accounting held, but the budget was
spent twice for the same answer. Now a reservation of a request that another run reserved on the
same data and has not settled is refused, under the lock that serialises reservations, and
records nothing. On a SQLite file and on a real PostgreSQL server (``ledger_url``)."""
from __future__ import annotations

import re
import sqlite3
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam.ledger import BudgetExceeded, Ledger, LedgerError, release_request
from ldp_beam.ledger import ReleaseInProgress
from ldp_beam.pipelines.datasets import dataset_identity
from ldp_beam_test_helpers import reserve, run_cli

REQ = release_request("dphr", {"epsilon": 0.5, "bins": 10, "lower": 0, "upper": 100},
                      {"value": "age"}, {}, unit="record")
RELEASE = {"mechanism": "dphr", "estimate": {"histogram": [3, 0, 7]},
           "guarantee": {"epsilon": 0.5}}


def release(led, run_id, ds, req=REQ, eps=0.5, **kw):
    return reserve(led, run_id, ds, eps, command="release", mechanism="dphr", request=req, **kw)


def _count(led):
    return len(led.entries())


def test_a_second_identical_release_while_the_first_is_pending_is_refused(ledger_url, data):
    with Ledger.open(ledger_url) as led:
        first = release(led, "rel-1", data, budget=2.0)
        n, spent = _count(led), led.spent(data["dataset"]).epsilon
        with pytest.raises(ReleaseInProgress) as ei:
            release(led, "rel-2", data)
        err = ei.value
        assert isinstance(err, LedgerError) and err.run_id == "rel-1"
        msg = str(err)
        assert "\n" not in msg
        for part in ("an identical release is in progress", "run rel-1", "still pending",
                     "nothing was spent", "before any noise was drawn", "Wait for run rel-1",
                     "re-published at no cost", "ldp-beam ledger --resolve rel-1 --as aborted",
                     data["fingerprint"][:19], led.url):
            assert part in msg, (part, msg)
        # nothing recorded: no entry, nothing spent, the run id is free
        assert _count(led) == n and led.spent(data["dataset"]).epsilon == spent
        assert [e["run_id"] for e in led.entries()] == ["rel-1"]
        # a prepared (still pending) first run blocks too
        first.prepare({"release": {"path": "/o/h.json"}}, RELEASE)
        with pytest.raises(ReleaseInProgress):
            release(led, "rel-2", data)
        assert _count(led) == n
        # the refusal comes before the budget: a release that would not fit is told to wait
        with pytest.raises(ReleaseInProgress):
            release(led, "rel-3", data, eps=5.0)


def test_after_the_first_aborts_the_second_reserves(ledger_url, data):
    with Ledger.open(ledger_url) as led:
        release(led, "rel-1", data).abort("failed")
        second = release(led, "rel-2", data)
        assert second.status == "pending"
        assert led.spent(data["dataset"]).epsilon == 0.5
        # resolved as aborted by an operator (the process is gone): not blocking either
        second.leave_pending("killed")
        with pytest.raises(ReleaseInProgress, match="rel-2"):
            release(led, "rel-3", data)
        led.resolve("rel-2", "aborted", "the process is gone")
        release(led, "rel-3", data).commit({}, RELEASE)
        assert [e["status"] for e in led.entries()] == ["aborted", "aborted", "committed"]


def test_after_the_first_commits_find_release_returns_it_and_a_republication_is_free(
        ledger_url, data):
    with Ledger.open(ledger_url) as led:
        first = release(led, "rel-1", data, budget=0.5)
        assert led.find_release(data["fingerprint"], REQ) is None  # pending: not found
        with pytest.raises(ReleaseInProgress):
            release(led, "rel-2", data)
        first.commit({"release": {"path": "/o/h.json"}}, RELEASE)
        found = led.find_release(data["fingerprint"], REQ)
        assert found["run_id"] == "rel-1" and found["release"] == RELEASE
        # the re-run re-publishes at no cost, even at the budget; re-publications never block
        # each other (they spend nothing)
        a = release(led, "rel-2", data, eps=0.0, republished_from="rel-1")
        b = release(led, "rel-3", data, eps=0.0, republished_from="rel-1")
        a.commit({}, RELEASE)
        b.commit({}, RELEASE)
        assert led.spent(data["dataset"]).epsilon == 0.5
        assert led.find_release(data["fingerprint"], REQ)["run_id"] == "rel-1"
        # a committed release never blocks a fresh draw of it (find_release comes first; a
        # caller that draws anyway is charged, as before)
        with pytest.raises(BudgetExceeded):
            release(led, "rel-4", data)


def test_other_requests_other_data_and_collections_are_not_blocked(ledger_url, data, tmp_path):
    other_data = tmp_path / "other.csv"
    other_data.write_text("uid,age\n1,30\n2,40\n")
    other = dataset_identity(str(other_data))
    with Ledger.open(ledger_url) as led:
        release(led, "rel-1", data)
        # another epsilon, other columns, another seed: another request
        release(led, "eps", data, req=dict(REQ, params=dict(REQ["params"], epsilon=0.25)),
                eps=0.25)
        release(led, "cols", data, req=release_request("dphr", REQ["params"],
                                                        {"value": "uid"}))
        release(led, "seed", data, req=dict(REQ, seed="7"))
        # the same request on other data
        release(led, "data", other)
        # a reservation that is not a release (request=None) is never blocked
        reserve(led, "col-1", data, 0.1)
        reserve(led, "col-2", data, 0.1, command="release", mechanism="dphr")
        assert _count(led) == 7
        assert {e["status"] for e in led.entries()} == {"pending"}


def test_the_same_data_under_another_dataset_name_is_the_same_release(ledger_url, data):
    """find_release matches by fingerprint whatever the dataset's name, so the check does too."""
    renamed = dict(data, dataset="survey-copy")
    with Ledger.open(ledger_url) as led:
        release(led, "rel-1", data)
        with pytest.raises(ReleaseInProgress,
                           match=f"run rel-1 .*dataset {re.escape(data['dataset'])}"):
            release(led, "rel-2", renamed)
        assert _count(led) == 1
        assert led.spent("survey-copy").epsilon == 0


def test_a_database_table_is_not_checked(ledger_url):
    """A table's fingerprint is of its name, not its content: its releases are never
    re-published (Run.prior_release), so a second one is not told to wait for one."""
    table = dataset_identity("duckdb:///tmp/warehouse.duckdb?table=survey")
    with Ledger.open(ledger_url) as led:
        release(led, "t-1", table)
        release(led, "t-2", table)
        assert _count(led) == 2


# -------------------------------------------------------------------------- concurrency
def _race(url, contenders, ds, prefix):
    """``contenders`` threads, each with its own Ledger (one object per thread), reserve the
    identical request on ``ds`` at once: the run ids that reserved, and the others' errors."""
    barrier = threading.Barrier(contenders)
    won, lost, other = [], [], []

    def go(i):
        with Ledger.open(url, timeout=30.0) as led:
            barrier.wait()
            try:
                release(led, f"{prefix}-{i}", ds)
            except ReleaseInProgress as exc:
                lost.append(exc)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                other.append(exc)
            else:
                won.append(f"{prefix}-{i}")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not other, other
    return won, lost


def test_identical_releases_started_at_once_only_one_reserves(ledger_url, data):
    """Eight runs, each with its own connection (on SQLite: one ledger file), reserve the
    identical release at once, three rounds: exactly one reserves each time."""
    Ledger.open(ledger_url).close()  # created before the race
    for rnd in range(3):
        won, lost = _race(ledger_url, 8, data, f"r{rnd}")
        assert len(won) == 1 and len(lost) == 7, (won, lost)
        assert {e.run_id for e in lost} == set(won)
        with Ledger.open(ledger_url) as led:
            assert [e["run_id"] for e in led.entries(status="pending")] == won
            assert led.spent(data["dataset"]).pending == 1
            led.abort(won[0], "next round")  # the next round races again
            assert _count(led) == rnd + 1  # the losers recorded nothing


def test_identical_releases_under_two_dataset_names_at_once_only_one_reserves(ledger_url,
                                                                              data):
    """Two names take two dataset locks: on PostgreSQL the request's advisory lock serialises
    them (SQLite's write lock covers the whole file). The first holds its transaction open
    between its check and its insert while the second reserves."""
    _two_names_race(ledger_url, data)


def test_a_server_defaulting_to_repeatable_read_still_serialises_them(fresh_pg_url, data):
    """Under REPEATABLE READ the second's snapshot, taken before it waits for the lock, would
    not see the first's insert: the ledger's transactions ask for READ COMMITTED."""
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(fresh_pg_url, autocommit=True) as con:
        db = con.execute("SELECT current_database()").fetchone()[0]
        con.execute(f"ALTER DATABASE {db} SET default_transaction_isolation TO "
                    "'repeatable read'")
    with psycopg.connect(fresh_pg_url) as con:
        assert con.execute("SHOW transaction_isolation").fetchone()[0] == "repeatable read"
    _two_names_race(fresh_pg_url, data)


def _two_names_race(ledger_url, data):
    renamed = dict(data, dataset="survey-copy")
    inside, go_on = threading.Event(), threading.Event()
    out: dict = {}

    def first():
        with Ledger.open(ledger_url, timeout=30.0) as led:
            real = led._budget_row  # called after the check, before the insert

            def hold(tx, name):
                inside.set()
                go_on.wait(10)
                return real(tx, name)

            led._budget_row = hold
            try:
                out["first"] = release(led, "rel-1", data).run_id
            except Exception as exc:  # noqa: BLE001
                out["first"] = exc

    def second():
        with Ledger.open(ledger_url, timeout=30.0) as led:
            try:
                out["second"] = release(led, "rel-2", renamed).run_id
            except Exception as exc:  # noqa: BLE001
                out["second"] = exc

    t1 = threading.Thread(target=first)
    t1.start()
    assert inside.wait(10)
    t2 = threading.Thread(target=second)
    t2.start()
    t2.join(1.5)  # without a lock covering it, the second reserves meanwhile
    go_on.set()
    t1.join(30)
    t2.join(30)
    assert out["first"] == "rel-1", out
    assert isinstance(out["second"], ReleaseInProgress) and out["second"].run_id == "rel-1", out
    with Ledger.open(ledger_url) as led:
        assert [e["run_id"] for e in led.entries()] == ["rel-1"]


# ------------------------------------------------------------------------ the command line
def test_the_command_line_refuses_in_one_line_and_spends_nothing(tmp_path):
    """`estimate -m dphr` while an identical release is pending (its entry set back to pending,
    as a run still in progress leaves it): exit 2, one line naming the run, no output, no
    entry."""
    src = tmp_path / "t.parquet"
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"v": rng.uniform(0, 10, 500)}), src)
    db = tmp_path / "l.db"
    args = ("estimate", "-i", str(src), "-m", "dphr", "-p", "epsilon=0.5", "-p", "bins=4",
            "-p", "lower=0", "-p", "upper=10", "-c", "v", "--ledger", f"sqlite:///{db}",
            "--seed", "3")
    code, _, se = run_cli(*args, "-o", str(tmp_path / "a.json"))
    assert code == 0, se
    con = sqlite3.connect(db, isolation_level=None)
    (first,) = [r[0] for r in con.execute("SELECT run_id FROM ldp_beam_entries")]
    con.execute("UPDATE ldp_beam_entries SET status = 'pending', finished = NULL")
    code, _, se = run_cli(*args, "-o", str(tmp_path / "b.json"))
    assert code == 2, se
    assert len(se.strip().splitlines()) == 1 and "Traceback" not in se, se
    assert "an identical release is in progress" in se and f"run {first}" in se, se
    assert f"ldp-beam ledger --resolve {first} --as aborted" in se, se
    assert not (tmp_path / "b.json").exists()
    assert con.execute("SELECT COUNT(*) FROM ldp_beam_entries").fetchone()[0] == 1
    # resolved as committed (its outputs were published), the run re-publishes it at no cost
    code, _, se = run_cli("ledger", "--ledger", f"sqlite:///{db}", "--resolve", first, "--as",
                          "committed")
    assert code == 0, se
    code, _, se = run_cli(*args, "-o", str(tmp_path / "b.json"))
    assert code == 0, se
    rows = con.execute("SELECT epsilon, republished_from FROM ldp_beam_entries ORDER BY "
                       "started").fetchall()
    assert rows == [(0.5, None), (0.0, first)], rows
