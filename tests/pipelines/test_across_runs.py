"""Issue 23, end to end through the command line: a failed run is never recorded as committed,
every command says which ledger it wrote to and what its dataset has left, and a dataset's budget
follows its people when its table grows."""
from __future__ import annotations

import sqlite3

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import run_cli

GRR = ("-m", "grr", "-p", "epsilon=0.5", "-p", "domain=a,b,c")


def _table(path, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({"v": rng.choice(list("abc"), n), "uid": np.arange(n)}), path)
    return path


def _statuses(db) -> list[str]:
    return [r[0] for r in sqlite3.connect(db).execute(
        "SELECT status FROM ldp_beam_entries ORDER BY started")]


@pytest.mark.parametrize("name", ["newdir/", "x" * 240 + ".parquet", "out.csv", "out.json"])
def test_an_output_that_cannot_be_written_spends_nothing(tmp_path, name):
    """`-o newdir/`, a 240-character name and a suffix that is not Parquet were each charged
    epsilon as *committed* (traceback, or Parquet bytes under a .csv name); now each is refused
    in one line before the ledger is touched, and nothing is left behind."""
    src = _table(tmp_path / "t.parquet")
    db = tmp_path / "l.db"
    before = sorted(p.name for p in tmp_path.iterdir())
    code, so, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR,
                           "-o", str(tmp_path / name), "--ledger", f"sqlite:///{db}")
    assert code == 2, se
    assert len(se.strip().splitlines()) == 1 and "Traceback" not in se
    assert "committed" not in _statuses(db) if db.exists() else True
    after = sorted(p.name for p in tmp_path.iterdir() if p.name != "l.db"
                   and not p.name.startswith("l.db-"))
    assert after == before


def test_a_publish_that_fails_settles_the_entry_as_aborted(tmp_path, monkeypatch):
    """The outputs fail to move into place after the pipeline ran: the ledger entry is aborted
    (nothing was published), never committed; the previous output is untouched."""
    from ldp_beam.pipelines import outputs

    src = _table(tmp_path / "t.parquet")
    db = tmp_path / "l.db"
    out = tmp_path / "r.parquet"
    out.write_bytes(b"previous")

    def refuse(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "_move", refuse)
    code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(out),
                          "--force", "--ledger", f"sqlite:///{db}")
    assert code == 2 and "No space left" in se, se
    assert _statuses(db) == ["aborted"]
    assert out.read_bytes() == b"previous"


def test_every_command_says_which_ledger_and_what_is_left(tmp_path, monkeypatch):
    """`estimate` without --ledger wrote to the default ledger without a word; now collect and
    estimate name the ledger (and that it is the default), the dataset and what it has left."""
    monkeypatch.delenv("LDP_BEAM_LEDGER", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    src = _table(tmp_path / "t.parquet")
    rep = tmp_path / "r.parquet"
    code, so, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(rep),
                           "--budget", "2", "--dataset", "customers")
    assert code == 0, se
    line = so.strip().splitlines()[-1]
    assert "ledger.db" in line and "default" in line and "customers" in line, line
    assert "epsilon=0.5" in line and "1.5" in line, line  # spent 0.5 of 2: 1.5 left
    code, so, se = run_cli("estimate", "-i", str(rep), "-o", str(tmp_path / "e.json"))
    assert code == 0, se
    assert "ledger.db" in so and "default" in so
    assert (tmp_path / "xdg" / "ldp-beam" / "ledger.db").exists()


def test_a_table_that_grows_keeps_its_budget_and_a_run_cannot_raise_it(tmp_path):
    """Appending one row made a new dataset (its people spent 2.5 against a budget of 2); a
    larger --budget silently replaced the recorded one. Now the budget follows the table's
    location, a raise is refused, and `ledger --set-budget` is the recorded way."""
    db = f"sqlite:///{tmp_path / 'l.db'}"
    src = tmp_path / "t.parquet"
    for i, grow in enumerate([0, 1, 2, 3]):
        _table(src, n=2000 + grow, seed=i)  # the table grows between runs
        code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR,
                              "-o", str(tmp_path / f"r{i}.parquet"), "--ledger", db,
                              "--budget", "1.5")
        if i < 3:
            assert code == 0, se
        else:  # 4 x 0.5 > 1.5
            assert code == 2 and "1.5" in se, se
    code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR,
                          "-o", str(tmp_path / "r9.parquet"), "--ledger", db, "--budget", "100")
    assert code == 2 and "--set-budget" in se, se
    code, so, se = run_cli("ledger", "--ledger", db, "--set-budget", "2", "--dataset", str(src),
                           "--why", "owner approved a fourth release")
    assert code == 0, se
    code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR,
                          "-o", str(tmp_path / "r3.parquet"), "--ledger", db)
    assert code == 0, se
    code, so, _ = run_cli("ledger", "--ledger", db, "--json")
    import json

    listing = json.loads(so)
    assert {e["status"] for e in listing["entries"]} == {"committed"}
    assert len(listing["entries"]) == 4
