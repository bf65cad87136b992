"""A stream records what it spends in the team's budget ledger (issue 25: the stream had its
own per-unit store and nothing in the ledger). Each run of a deployment (an output folder)
records what it added to the largest loss any one unit has taken, so the entries of a
deployment sum to that loss however many runs it takes; the dataset's budget caps every unit,
checked before anything is read (pipelines/stream_account.py)."""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time

import pytest

from ldp_beam_test_helpers import LiveStream, read_jsonl, run_cli, write_file
from ldp_beam.ledger import BudgetExceeded, Ledger
from ldp_beam.errors import ParameterError
from ldp_beam.longitudinal import UnitState
from ldp_beam.pipelines.stream import run_stream
from ldp_beam.pipelines.stream_account import StreamAccount, stream_dataset
from ldp_beam.registry import build_mechanism
from ldp_beam.transforms.windowed import PrivacyUnit, StreamConfigError

T0 = 1_700_000_000  # a multiple of the 10 s windows below
DOMAIN = ["a", "b", "c"]


@pytest.fixture(scope="module")
def grr():
    return build_mechanism("grr", epsilon=1.0, domain=DOMAIN)


def records(windows, units=("u0", "u1", "u2")):
    """One report (a GRR report: the index of a domain value) per unit in each of ``windows``
    (10 s each)."""
    return [{"v": i % 3, "device": u, "ts": T0 + 10 * w + 1}
            for w in windows for i, u in enumerate(units)]


def once(tmp_path, mech, name, recs, **kw):
    """A bounded run over a spool holding one new file ``name`` of ``recs``."""
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    write_file(spool, name, recs)
    kw.setdefault("ledger", f"sqlite:///{tmp_path / 'ledger.db'}")
    return run_stream(str(tmp_path / "out"), mech, spool=str(spool), window_seconds=10,
                      once=True, progress=False, **kw)


def entries(tmp_path, dataset=None):
    with Ledger.open(f"sqlite:///{tmp_path / 'ledger.db'}") as led:
        rows = led.entries(dataset=dataset or os.path.realpath(tmp_path / "spool"))
    return sorted(rows, key=lambda e: e["started"])


def test_a_per_record_stream_records_its_epsilon_once_per_deployment(tmp_path, grr):
    """Without a privacy unit the guarantee is per record: each record is estimated once by the
    deployment, so its first run that publishes records epsilon and later runs (new records)
    record 0; a run that publishes nothing gives its reservation back."""
    s1 = once(tmp_path, grr, "a.jsonl", records([0, 1]))
    s2 = once(tmp_path, grr, "b.jsonl", records([2]))
    s3 = once(tmp_path, grr, "c.jsonl", [])  # reads an empty file: nothing published
    e = entries(tmp_path)
    assert [x["command"] for x in e] == ["stream"] * 3
    assert [x["run_id"] for x in e] == [s1["run"], s2["run"], s3["run"]]
    assert [(x["status"], x["epsilon"], x["unit"]) for x in e] == [
        ("committed", 1.0, "record"), ("committed", 0.0, "record"), ("aborted", 0.0, "record")]
    assert e[0]["fingerprint"] == "stream:" + os.path.realpath(tmp_path / "out")
    assert s1["ledger"]["run_epsilon"] == 1.0 and s2["ledger"]["run_epsilon"] == 0.0
    assert s2["ledger"]["spent"]["epsilon"] == 1.0  # the dataset's total: one epsilon
    assert s3["ledger"]["run_epsilon"] is None
    on_disk = json.loads((tmp_path / "out" / "curator" / "summary.json").read_text())
    assert on_disk["ledger"]["run_epsilon"] is None and on_disk["run"] == s3["run"]


def test_per_unit_entries_sum_to_the_largest_loss_of_a_unit(tmp_path, grr):
    """u0 reports in windows 0-2 (run 1) and 3-4 (run 2), the others in fewer: each run
    records the increase of the largest unit loss (3, then 2), which sums to u0's loss, 5,
    exactly what the per-unit state holds."""
    s1 = once(tmp_path, grr, "a.jsonl", records([0, 1, 2], ("u0",)) + records([0], ("u1",)),
              privacy_unit="device")
    s2 = once(tmp_path, grr, "b.jsonl", records([3, 4], ("u0", "u1")), privacy_unit="device")
    e = entries(tmp_path)
    assert [(x["status"], x["epsilon"], x["unit"]) for x in e] == [
        ("committed", 3.0, "device"), ("committed", 2.0, "device")]
    state = UnitState(str(tmp_path / "out" / "units.sqlite"), "device")
    assert sorted(state.spent().values()) == [3.0, 5.0]
    assert sum(x["epsilon"] for x in e) == max(state.spent().values())
    assert s2["ledger"]["deployment_max_unit_loss"] == 5.0
    assert s1["ledger"]["reserved"] == float("inf")  # no unit cap and no budget: unbounded
    assert s2["privacy_unit"]["estimated"] == 4


def test_the_dataset_budget_caps_every_unit_and_is_checked_before_reading(tmp_path, grr):
    """A budget of 2 on the stream's dataset: no unit loses more than 2 (a unit cap of 5 is
    lowered to it, and the guarantee says so); the entry records 2; the next run finds nothing
    left and is refused before it reads anything."""
    s = once(tmp_path, grr, "a.jsonl", records([0, 1, 2, 3]), privacy_unit="device",
             unit_budget=5.0, budget=2.0)
    assert s["ledger"]["unit_cap_from_budget"] == 2.0 and s["ledger"]["reserved"] == 2.0
    assert s["privacy_unit"]["estimated"] == 6 and s["privacy_unit"]["over_budget"] == 6
    assert s["privacy_unit"]["unit_budget"] == 2.0 and s["reconciles"]
    assert "cumulative loss capped at 2)" in s["guarantee"]["summary"]
    rows = read_jsonl(tmp_path / "out" / "estimates.jsonl")
    assert all("capped at 2)" in r["guarantee"]["summary"] for r in rows)
    assert [(x["status"], x["epsilon"]) for x in entries(tmp_path)] == [("committed", 2.0)]
    with pytest.raises(StreamConfigError, match="budget epsilon=2 is spent"):
        once(tmp_path, grr, "b.jsonl", records([5]), privacy_unit="device")
    assert len(read_jsonl(tmp_path / "out" / "estimates.jsonl")) == len(rows)
    assert (tmp_path / "spool" / "b.jsonl").exists()  # not claimed: nothing was read


def test_a_per_record_stream_over_the_budget_is_refused_before_any_noise(tmp_path, grr):
    with pytest.raises(BudgetExceeded):
        once(tmp_path, grr, "a.jsonl", records([0]), budget=0.5)
    assert not (tmp_path / "out" / "estimates.jsonl").exists()
    assert entries(tmp_path) == []


def test_a_failed_run_commits_what_its_units_were_charged(tmp_path, grr):
    """The per-unit state is durable and written as reports are admitted, so a run that fails
    after charging has spent that: the entry is committed at the charge, not given back."""
    out = tmp_path / "out"
    out.mkdir()
    state = UnitState(str(out / "units.sqlite"), "device")
    unit = PrivacyUnit("device", state, 1, None, None)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    acc = StreamAccount(url, stream_dataset(str(tmp_path), str(out)), str(out), "run-1",
                        mechanism=grr, guarantee={"epsilon": 1.0, "delta": 0.0, "kind": "LDP"},
                        unit=unit, seeded=False, budget=10.0).open()
    assert acc.cap_from_budget == 10.0
    state.admit(0, "run-1", {"h1": (1, [(1, "s1", None, "d1", None)])}, k=1, epsilon=1.0)
    state.admit(10, "run-1", {"h1": (1, [(1, "s2", None, "d2", None)])}, k=1, epsilon=1.0)
    said = acc.settle(failed=RuntimeError("the pipeline failed"))
    assert said["run_epsilon"] == 2.0 and acc.settle() is None  # settled once
    with Ledger.open(url) as led:
        (e,) = led.entries()
    assert (e["status"], e["epsilon"]) == ("committed", 2.0)


def test_a_commit_never_records_more_than_was_reserved(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ds = {"dataset": "d", "uri": "d", "fingerprint": "stream:x"}
    with Ledger.open(url) as led:
        r = led.reserve("run-1", ds, command="stream", mechanism="grr", epsilon=1.0)
        with pytest.raises(ParameterError, match="at most the 1 run run-1 reserved"):
            r.commit(epsilon=1.5)
        r.commit(epsilon=0.25)
        assert led.spent("d").epsilon == 0.25


def test_the_cli_records_the_stream_under_its_dataset_name(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    write_file(spool, "a.jsonl", records([0, 1]))
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    code, so, se = run_cli("stream", "--spool", str(spool), "-o", str(tmp_path / "out"),
                           "-m", "grr", "--epsilon", "1", "-p", "domain=a,b,c", "--window", "10",
                           "--once", "--privacy-unit", "device", "--ledger", led,
                           "--dataset", "telemetry", "--budget", "4")
    assert code == 0, se
    assert "this run recorded epsilon=2 (what it added to the largest loss of one unit); " \
        f"ledger {led}: dataset telemetry has spent epsilon=2 of budget 4 (2 left)" in so, so
    code, so, _ = run_cli("ledger", "--ledger", led, "--dataset", "telemetry", "--json")
    assert code == 0
    assert '"command": "stream"' in so and '"epsilon": 2.0' in so


def test_a_restart_settles_a_killed_run_at_what_its_units_were_charged(tmp_path):
    """A live stream with a privacy unit, killed with SIGKILL after it charged each of 3 units
    one epsilon, leaves its reservation pending (unbounded: no cap, no budget); the next run of
    the deployment commits it at exactly 1 (the largest unit loss), and gives its own back."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    led = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = ["--spool", str(spool), "-m", "grr", "--epsilon", "1", "-p",
            "domain=a,b,c", "--window", "2", "--poll", "0.2", "--privacy-unit", "device",
            "--ledger", led, "-q", "-o", str(out)]
    with LiveStream(tmp_path, *args, "--duration", "120", timeout=90) as live:
        live.wait(lambda: (out / "units.sqlite").exists())
        now = time.time()
        write_file(spool, "a.jsonl", [{"v": i, "device": f"u{i}", "ts": now} for i in range(3)])
        live.wait(lambda: (out / "estimates.jsonl").exists() and
                  bool(read_jsonl(out / "estimates.jsonl")))
    (killed,) = entries(tmp_path)
    assert (killed["status"], killed["epsilon"]) == ("pending", float("inf"))
    s = run_stream(str(out), build_mechanism("grr", epsilon=1.0, domain=DOMAIN),
                   spool=str(spool), window_seconds=2, once=True, progress=False,
                   privacy_unit="device", ledger=led)
    killed, restart = entries(tmp_path)
    assert (killed["status"], killed["epsilon"]) == ("committed", 1.0)
    assert f"settled by the restart {s['run']}" in killed["note"]
    assert restart["status"] == "aborted"  # it published and charged nothing
    assert s["ledger"]["settled_killed_runs"] == [
        {"run": killed["run_id"], "as": "committed", "epsilon": 1.0}]
    assert s["ledger"]["spent"]["epsilon"] == 1.0


def test_a_ledger_gone_at_the_end_leaves_the_entry_pending_and_says_so(tmp_path, grr):
    """The ledger file replaced while the stream ran: its entry cannot be settled; the run's
    own outcome is kept, and the line says the entry stays pending, counted at its reservation
    (never less than the run spent)."""
    from ldp_beam.pipelines.stream_account import settle_or_say

    out = tmp_path / "out"
    out.mkdir()
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    acc = StreamAccount(url, stream_dataset(str(tmp_path), str(out)), str(out), "run-1",
                        mechanism=grr, guarantee={"epsilon": 1.0, "delta": 0.0, "kind": "LDP"},
                        unit=None, seeded=False).open()
    (out / "estimates.jsonl").write_text(json.dumps({"run": "run-1"}) + "\n")  # published
    with contextlib.closing(sqlite3.connect(tmp_path / "ledger.db")) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the entry into the file moved next
    os.replace(tmp_path / "ledger.db", tmp_path / "moved.db")
    said = []
    got = settle_or_say(acc, said.append)
    assert got["pending"] == "run-1" and said == [got["error"]]
    assert "stays pending and counts at what the run reserved" in got["error"]
    with Ledger.open(f"sqlite:///{tmp_path / 'moved.db'}") as led:
        (e,) = led.entries()
    assert (e["status"], e["epsilon"]) == ("pending", 1.0)


def test_a_pane_a_killed_run_had_published_is_not_this_runs_publication(tmp_path):
    """A restart that computes again the pane a killed run published (the file was not settled)
    writes nothing (``already_published``): its summary counts no pane published by it, so
    its ledger entry, having charged nothing, is given back rather than committed."""
    from ldp_beam.pipelines.stream import summarize
    from ldp_beam.transforms.windowed import LEDGER_FILE

    pane = {"kind": "pane", "window_start": "2026-11-27T00:00:00Z", "pane": 0, "count": 3,
            "timing": "ON_TIME", "released": True}
    rows = [{**pane, "run": "killed"}, {**pane, "run": "restart", "already_published": True},
            {**pane, "run": "restart", "window_start": "2026-11-27T00:00:02Z"}]
    (tmp_path / LEDGER_FILE).parent.mkdir(exist_ok=True)
    (tmp_path / LEDGER_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(str(tmp_path), "restart")
    assert (s["panes"], s["panes_withheld"], s["panes_published"]) == (2, 0, 1)
    rows.pop()
    (tmp_path / LEDGER_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = summarize(str(tmp_path), "restart")
    assert (s["panes"], s["panes_withheld"], s["panes_published"]) == (1, 0, 0)
