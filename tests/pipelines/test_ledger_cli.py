"""The budget ledger through the commands (issue 14): collections and releases are recorded, a
budget refuses a run before any noise is drawn, a crashed-and-rerun release is re-published
instead of drawn again, an unreachable ledger stops a run before it starts, and `ldp-beam ledger`
shows what was spent."""
from __future__ import annotations

import json
import os
import socket

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ldp_beam_test_helpers import run_cli

GRR = ("-m", "grr", "--epsilon", "1", "-p", "domain=a,b,c")
HIST = ("-m", "laplace-histogram", "--epsilon", "0.5", "-p", "categories=a,b,c")


def _table(path, n=500, seed=0):
    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({"v": rng.choice(list("abc"), n)}), path)
    return str(path)


def test_a_budget_refuses_the_run_that_would_exceed_it(tmp_path):
    src = _table(tmp_path / "t.parquet")
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    ok = run_cli("collect", "-i", src, "-c", "v", *GRR, "--ledger", led, "--budget", "1.5",
                 "-o", str(tmp_path / "r1.parquet"))
    assert ok[0] == 0, ok[2]
    code, _, se = run_cli("collect", "-i", src, "-c", "v", *GRR, "--ledger", led,
                          "-o", str(tmp_path / "r2.parquet"))  # the budget is remembered
    assert code == 2 and "--budget" in se and "grr" in se and "1.5" in se
    assert not (tmp_path / "r2.parquet").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".ldp-beam-staging")]
    code, so, _ = run_cli("ledger", "--ledger", led, "--json")
    assert code == 0
    entries = json.loads(so)["entries"]
    (entry,) = [e for e in entries if e["status"] == "committed"]
    assert entry["mechanism"] == "grr" and entry["epsilon"] == 1.0
    assert entry["uri"].endswith("t.parquet") and entry["started"]


def test_a_copy_of_the_data_under_the_same_dataset_name_spends_the_same_budget(tmp_path):
    """A dataset is a name (issue 23): a copy read under the same --dataset spends its budget;
    without --dataset, each location is its own dataset (its canonical path)."""
    src = _table(tmp_path / "t.parquet")
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / "t.parquet"
    copy.write_bytes(open(src, "rb").read())
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    code, so, se = run_cli("collect", "-i", src, "-c", "v", *GRR, "--ledger", led, "--budget",
                           "1", "--dataset", "survey", "-o", str(tmp_path / "r1.parquet"))
    assert code == 0, se
    assert f"ledger {led}: dataset survey has spent epsilon=1 of budget 1 (0 left)" in so
    code, _, se = run_cli("collect", "-i", str(copy), "-c", "v", *GRR, "--ledger", led,
                          "--dataset", "survey", "-o", str(tmp_path / "r2.parquet"))
    assert code == 2 and "--budget" in se and "survey" in se
    code, _, se = run_cli("collect", "-i", str(copy), "-c", "v", *GRR, "--ledger", led,
                          "-o", str(tmp_path / "r3.parquet"))
    assert code == 0, se
    code, so, _ = run_cli("ledger", "--ledger", led, "--json")
    totals = {t["dataset"]: t["spent"]["epsilon"] for t in json.loads(so)["totals"]}
    assert totals == {"survey": 1.0, os.path.realpath(copy): 1.0}


def test_a_rerun_release_is_republished_not_drawn_again(tmp_path):
    src = _table(tmp_path / "t.parquet")
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    out = tmp_path / "h.json"
    assert run_cli("estimate", "-i", src, "-c", "v", *HIST, "--ledger", led, "--budget", "0.5",
                   "-o", str(out))[0] == 0
    first = json.loads(out.read_text())
    for p in tmp_path.glob("h.json*"):  # the published files are lost (a crash, a cleanup)
        p.unlink()
    code, so, se = run_cli("estimate", "-i", src, "-c", "v", *HIST, "--ledger", led,
                           "-o", str(out))
    assert code == 0, se
    assert "re-published" in so
    again = json.loads(out.read_text())
    assert again["estimate"] == first["estimate"]  # the recorded numbers, no new noise
    # and the budget (0.5, all spent) was not charged again: the re-publication costs nothing
    code, so, _ = run_cli("ledger", "--ledger", led, "--json")
    spent = [e["epsilon"] for e in json.loads(so)["entries"] if e["status"] == "committed"]
    assert sorted(spent) == [0.0, 0.5]


def test_an_unreachable_ledger_stops_the_run_before_it_starts(tmp_path):
    src = _table(tmp_path / "t.parquet")
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, se = run_cli("estimate", "-i", src, "-c", "v", *HIST, "--ledger",
                          f"postgresql://nobody@127.0.0.1:{port}/ledger", "-o",
                          str(tmp_path / "h.json"))
    assert code == 2 and "--ledger" in se
    assert sorted(os.listdir(tmp_path)) == ["t.parquet"]
