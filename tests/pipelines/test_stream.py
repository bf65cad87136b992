"""`ldp-beam stream`: windowed streaming estimation (TestStream), the spool source's durability,
and the command end to end on a live spool directory."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue

from ldp_beam_test_helpers import read_jsonl, run_cli, write_file
from ldp_beam.estimators import estimator_for
from ldp_beam.registry import build_mechanism
from ldp_beam.pipelines.stream import run_stream, summarize
from ldp_beam.transforms.windowed import (StreamConfigError, StreamSink, WindowedEstimate,
                                          estimate_stream)
from ldp_beam.transforms.spool import (CLAIMED, DONE, MARK, RECORD, SpoolDirectory, SpoolError,
                                       WindowClock, event_micros, parse_line, record_settled)

T0 = 1_700_000_000  # a multiple of the window lengths used below
EPS = 2.0


@pytest.fixture(scope="module")
def bisample():
    return build_mechanism("bisample-md", epsilon=EPS, lower=0, upper=100)


def reports(mech, n, seed):
    """n BiSample-MD reports (10% missing answers) from the core API, as telemetry records."""
    rng = np.random.default_rng(seed)
    ages = rng.uniform(18, 90, n)
    ages[rng.random(n) < 0.1] = np.nan
    rep = mech.perturb({"value": ages}, rng=seed)
    return [{"s": int(s), "b": int(b)} for s, b in zip(rep["s"], rep["b"])]


def columns_of(records):
    return {k: np.array([r[k] for r in records]) for k in ("s", "b")}


def at(records, t):
    return [TimestampedValue((RECORD, r), t) for r in records]


def mark(t):
    """A central release's range mark for the window starting at t."""
    return TimestampedValue((MARK, t * 1_000_000), t)


def run_teststream(tmp_path, stream, estimate):
    """Run TestStream -> WindowedEstimate -> the stream sink; return (estimates, dead letters,
    ledger) as written."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    sink = StreamSink(str(out), "test", estimate.central, progress=False)
    with beam.Pipeline(options=PipelineOptions(["--streaming"])) as p:
        estimate_stream(p | stream, estimate, sink)

    def rows(name):
        return read_jsonl(out / name) if (out / name).exists() else []
    return rows("estimates.jsonl"), rows("curator/deadletter.jsonl"), rows("curator/ledger.jsonl")


def panes(rows):
    return sorted((r["window_start_epoch"], r["pane"]["index"]) for r in rows)


# --------------------------------------------------------------------------- windows
def test_per_window_estimates_equal_the_batch_estimates(tmp_path, bisample):
    w1, w2 = reports(bisample, 400, 1), reports(bisample, 300, 2)
    stream = (TestStream()
              .add_elements(at(w1[:250], T0 + 1) + at(w2[:100], T0 + 12))
              .advance_processing_time(1)
              .add_elements(at(w1[250:], T0 + 9.5))
              .advance_watermark_to(T0 + 10)
              .add_elements(at(w2[100:], T0 + 19.999))
              .advance_watermark_to_infinity())
    rows, dead, _ = run_teststream(tmp_path, stream, WindowedEstimate(bisample, 10))
    assert dead == []
    by_start = {r["window_start_epoch"]: r for r in rows}
    assert sorted(by_start) == [T0, T0 + 10] and len(rows) == 2
    est = estimator_for(bisample)
    for start, recs in ((T0, w1), (T0 + 10, w2)):
        row = by_start[start]
        batch = est.estimate(columns_of(recs)).to_dict()
        assert row["n_reports"] == len(recs) == batch["n_reports"]
        assert row["statistics"] == json.loads(json.dumps(batch["statistics"]))
        assert row["guarantee"]["epsilon"] == EPS and row["guarantee"]["kind"] == "LDP"


def test_window_bounds_counts_and_pane_marks(tmp_path, bisample):
    recs = reports(bisample, 90, 3)
    bad = [{"s": 7, "b": 0, "id": "x"}, {"s": 1, "id": "y"}, {"s": "1", "b": "zero"}]
    stream = (TestStream().add_elements(at(recs[:30], T0 + 0) + at(recs[30:], T0 + 25)
                                        + at(bad, T0 + 3))
              .advance_watermark_to_infinity())
    rows, dead, ledger = run_teststream(tmp_path, stream, WindowedEstimate(bisample, 20))
    # malformed reports are dead-lettered whole, with the estimator's reason
    assert sorted((d["record"].get("id", ""), d["reason"], d["stage"]) for d in dead) == [
        ("", "report field 'b': 'zero' not in [0, 1]", "validate"),
        ("x", "report field 's': 7 not in [0, 1]", "validate"),
        ("y", "report field 'b' is missing", "validate")]
    rows.sort(key=lambda r: r["window_start_epoch"])
    assert [(r["window_start_epoch"], r["window_end_epoch"], r["n_reports"]) for r in rows] == \
        [(T0, T0 + 20, 30), (T0 + 20, T0 + 40, 60)]
    assert rows[0]["window_start"] == "2023-11-14T22:13:20Z"
    assert rows[0]["window_end"] == "2023-11-14T22:13:40Z"
    assert all(r["pane"] == {"index": 0, "timing": "on_time"} and r["run"] == "test"
               for r in rows)
    assert sorted(p["count"] for p in ledger if p["kind"] == "pane") == [30, 60]


def test_late_data_within_lateness_fires_a_late_pane_and_beyond_it_is_dropped(tmp_path,
                                                                            bisample):
    recs = reports(bisample, 115, 4)
    stream = (TestStream()
              .add_elements(at(recs[:100], T0 + 1))
              .advance_watermark_to(T0 + 11)  # past the end: the on-time pane
              .add_elements(at(recs[100:110], T0 + 2))  # late, within the 5 s lateness
              .advance_watermark_to(T0 + 16)  # past end + lateness: the window is closed
              .add_elements(at(recs[110:], T0 + 3))  # too late: Beam drops these
              .advance_watermark_to_infinity())
    rows, _, ledger = run_teststream(tmp_path, stream,
                                     WindowedEstimate(bisample, 10, allowed_lateness=5))
    rows.sort(key=lambda r: r["pane"]["index"])
    assert [(r["pane"]["index"], r["pane"]["timing"], r["n_reports"]) for r in rows] == \
        [(0, "on_time", 100), (1, "late", 110)]  # accumulating: the late pane has all 110
    est = estimator_for(bisample).estimate(columns_of(recs[:110])).to_dict()
    assert rows[1]["statistics"] == json.loads(json.dumps(est["statistics"]))
    # Beam drops the 5 silently; the run's accounting still counts them
    out = tmp_path / "out"
    s = summarize(str(out), "test", records_read=115)
    assert s["records"]["in_windows"] == 110 and s["records"]["dropped_by_windowing"] == 5
    assert s["reconciles"] is False


def test_early_firings_on_processing_time(tmp_path, bisample):
    recs = reports(bisample, 80, 5)
    stream = (TestStream()
              .add_elements(at(recs[:50], T0 + 1))
              .advance_processing_time(6)  # 6 s of processing time: an early pane
              .add_elements(at(recs[50:], T0 + 2))
              .advance_watermark_to_infinity())
    rows, _, _ = run_teststream(tmp_path, stream, WindowedEstimate(bisample, 10, early_seconds=5))
    rows.sort(key=lambda r: r["pane"]["index"])
    assert [(r["pane"]["timing"], r["n_reports"]) for r in rows] == [("early", 50),
                                                                     ("on_time", 80)]


# --------------------------------------------------------------------------- central releases
@pytest.fixture(scope="module")
def histogram():
    return build_mechanism("laplace-histogram", epsilon=1.0, bins=4, lower=0, upper=1)


def test_central_release_refuses_refiring_triggers_unless_budgeted(histogram):
    with pytest.raises(StreamConfigError, match="--releases-per-window"):
        WindowedEstimate(histogram, 10, allowed_lateness=5)
    with pytest.raises(StreamConfigError, match="--releases-per-window"):
        WindowedEstimate(histogram, 10, early_seconds=2)
    assert WindowedEstimate(histogram, 10).guarantee.epsilon == 1.0  # fires once: no budget
    assert WindowedEstimate(histogram, 10, 5, releases_per_window=3).guarantee.epsilon == 3.0
    with pytest.raises(StreamConfigError, match="central-DP releases"):
        WindowedEstimate(build_mechanism("grr", epsilon=1, domain="a,b"), 10,
                         releases_per_window=2)


def test_central_release_budget_composes_and_withholds_extra_firings(tmp_path, histogram):
    vals = [{"value": v} for v in np.random.default_rng(6).uniform(0, 1, 60)]
    stream = (TestStream()
              .add_elements(at(vals[:40] + [{"value": 1.5}, {"other": 0.2}], T0 + 1)
                            + [mark(T0)])  # the window is in the release range
              .advance_watermark_to(T0 + 11)  # release 1 (on time)
              .add_elements(at(vals[40:50], T0 + 2))  # late: release 2
              .advance_watermark_to(T0 + 12)
              .add_elements(at(vals[50:], T0 + 3))  # late again: past the budget of 2
              .advance_watermark_to_infinity())
    est = WindowedEstimate(histogram, 10, allowed_lateness=5, releases_per_window=2)
    rows, dead, ledger = run_teststream(tmp_path, stream, est)
    rows.sort(key=lambda r: r["release"]["index"])
    assert [r["release"] for r in rows] == [{"index": 1, "of": 2}, {"index": 2, "of": 2}]
    assert all(r["guarantee"]["epsilon"] == 2.0 and r["guarantee_per_release"]["epsilon"] == 1.0
               and r["n_reports"] is None for r in rows)
    assert "composition of 2" in rows[0]["guarantee"]["notes"]
    withheld = [d for d in dead if d["stage"] == "release"]
    assert len(withheld) == 1 and "release 3 of a budget of 2" in withheld[0]["reason"]
    assert sorted(d["reason"] for d in dead if d["stage"] == "validate") == [
        "record has no field 'value'", "value: 1.5 is outside the declared domain [0, 1] "
        "(not clipped)"]
    assert sorted((p["count"], p["released"]) for p in ledger if p["kind"] == "pane") == \
        [(40, True), (50, True), (60, False)]


# --------------------------------------------------------------------------- parsing
def test_event_times_and_bad_lines():
    assert event_micros(1700000000.5) == 1700000000_500000
    assert event_micros("2023-11-14T22:13:20Z") == T0 * 1_000_000
    assert event_micros("2023-11-14T23:13:20+01:00") == T0 * 1_000_000
    assert event_micros("2023-11-14T22:13:20") == T0 * 1_000_000  # naive: UTC
    assert event_micros("1700000000") == T0 * 1_000_000
    for bad in (True, None, float("nan"), "yesterday", [1], 1e20):
        with pytest.raises(ValueError, match="timestamp field 'ts'"):
            event_micros(bad)
    rec, t = parse_line(b'{"s": 1, "b": 0, "ts": 1700000000}', "ts")
    assert rec == {"s": 1, "b": 0, "ts": T0} and t == T0 * 1_000_000
    for raw, why in ((b'{"s": 1', "corrupt JSON"), (b"[1, 2]", "not an object"),
                     (b'{"s": 1}', "no timestamp field 'ts'"), (b"\xff\xfe", "not UTF-8")):
        with pytest.raises(ValueError, match=why):
            parse_line(raw, "ts")
    clock = WindowClock(10, 5)
    assert clock.window(T0 * 10**6 + 3) == (T0 * 10**6, (T0 + 10) * 10**6)
    assert not clock.too_late(T0 * 10**6, (T0 + 15) * 10**6)  # Beam drops only past end + L
    assert clock.too_late(T0 * 10**6, (T0 + 15) * 10**6 + 1)


# --------------------------------------------------------------------------- the spool
def test_bounded_run_dead_letters_bad_lines_and_never_rereads_done_files(tmp_path, bisample):
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    recs = reports(bisample, 50, 7)
    write_file(spool, "a.jsonl", [{**r, "ts": T0 + 1} for r in recs[:30]]
               + ["{not json", json.dumps({"s": 1, "b": 1}), "", json.dumps({"s": 1, "b": 9,
                                                                              "ts": T0 + 2})])
    write_file(spool, "b.jsonl", [{**r, "ts": "2023-11-14T22:13:45Z"} for r in recs[30:]])
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=20, once=True,
                   progress=False)
    assert sorted(os.listdir(spool / DONE)) == ["a.jsonl", "b.jsonl"]
    assert os.listdir(spool / CLAIMED) == [] and not list(spool.glob("*.jsonl"))
    rows = read_jsonl(out / "estimates.jsonl")
    assert sorted((r["window_start_epoch"], r["n_reports"]) for r in rows) == \
        [(T0, 30), (T0 + 20, 20)]  # 22:13:45Z is T0 + 25
    dead = read_jsonl(out / "curator" / "deadletter.jsonl")
    src = sorted((d["source"], d["row"], d["stage"], d["reason"][:22]) for d in dead
                 if d["stage"] == "source")
    assert src == [("a.jsonl", 31, "source", "corrupt JSON: Expectin"),
                   ("a.jsonl", 32, "source", "record has no timestam")]
    assert [d["stage"] for d in dead if d["stage"] != "source"] == ["validate"]  # b = 9
    assert s["reconciles"] and s["records"]["read"] == 51 and s["records"]["lines"] == 53
    # a restart reads nothing again: the files are in .done/
    s2 = run_stream(str(out), bisample, spool=str(spool), window_seconds=20, once=True,
                    progress=False)
    assert s2["files"] == 0 and s2["windows"] == 0 and len(read_jsonl(out / "estimates.jsonl")) == 2
    # a producer reusing a name is read too, and nothing in .done/ is replaced
    write_file(spool, "a.jsonl", [{**r, "ts": T0 + 61} for r in recs[:5]])
    s3 = run_stream(str(out), bisample, spool=str(spool), window_seconds=20, once=True,
                    progress=False)
    assert s3["records"]["in_windows"] == 5
    assert sorted(os.listdir(spool / DONE)) == ["a.jsonl", "a~1.jsonl", "b.jsonl"]


def test_leftover_claimed_file_is_reread_skipping_settled_windows(tmp_path, bisample):
    """A crash between claim and done leaves a file in .claimed/: the next start reads it again
    from the first line. Its records in windows settled before the crash (written then, with
    them in it) are skipped and counted; the rest are estimated."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    (spool / CLAIMED).mkdir()
    recs = reports(bisample, 40, 8)
    write_file(spool / CLAIMED, "crashed.jsonl", [{**r, "ts": T0 + 1} for r in recs[:25]]
               + [{**r, "ts": T0 + 31} for r in recs[25:]])
    record_settled(str(spool), (T0 + 21) * 1_000_000)  # window [T0, T0+20) had settled
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=20, once=True,
                   progress=False)
    assert s["records"]["skipped_settled"] == 25 and s["records"]["in_windows"] == 15
    assert s["reconciles"]
    ledger = [x for x in read_jsonl(out / "curator" / "ledger.jsonl") if x["kind"] == "file"]
    assert ledger[0]["recovered"] is True and ledger[0]["file"] == "crashed.jsonl"
    assert os.listdir(spool / DONE) == ["crashed.jsonl"]
    # the settled watermark recorded by the sink only moves forward
    record_settled(str(spool), T0 * 1_000_000)
    assert SpoolDirectory(str(spool), WindowClock(20)).settled() == (T0 + 21) * 1_000_000


def test_recovered_central_window_does_not_release_twice(tmp_path, histogram):
    """A central window released before a crash is not released again from the re-read file:
    the releases already in estimates.jsonl count against the window's budget."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    (spool / CLAIMED).mkdir(parents=True)
    out.mkdir()
    write_file(spool / CLAIMED, "crashed.jsonl", [{"value": 0.3, "ts": T0 + 1}] * 5
               + [{"value": 0.6, "ts": T0 + 15}] * 4)
    with open(out / "estimates.jsonl", "w") as fh:  # the crashed run released [T0, T0 + 10)
        fh.write(json.dumps({"run": "crashed", "window_start_epoch": T0,
                             "window_end_epoch": T0 + 10, "pane": {"index": 0,
                                                                    "timing": "on_time"},
                             "release": {"index": 1, "of": 1}}) + "\n")
    s = run_stream(str(out), histogram, spool=str(spool), window_seconds=10, once=True,
                   columns={"value": "value"}, progress=False)
    rows = [r for r in read_jsonl(out / "estimates.jsonl") if r["run"] == s["run"]]
    assert [r["window_start_epoch"] for r in rows] == [T0 + 10]
    withheld = [d for d in read_jsonl(out / "curator" / "deadletter.jsonl") if d["stage"] == "release"]
    assert len(withheld) == 1 and "release 2 of a budget of 1" in withheld[0]["reason"]
    assert s["panes_withheld"] == 1 and s["records"]["in_releases"] == 4


def test_one_reader_per_spool(tmp_path):
    with SpoolDirectory(str(tmp_path), WindowClock(10)):
        with pytest.raises(SpoolError, match="being read by another process"):
            SpoolDirectory(str(tmp_path), WindowClock(10)).open()
    with SpoolDirectory(str(tmp_path), WindowClock(10)):  # released on close
        pass
    with pytest.raises(SpoolError, match="does not exist"):
        SpoolDirectory(str(tmp_path / "nope"), WindowClock(10)).open()


def test_live_spool_settles_files_while_running_and_restarts_cleanly(tmp_path, bisample):
    """In a live run a file moves to .done/ as soon as the windows it fed are written (not only
    at the end); a stopped run settles the rest; a restart reads only new files, and records for
    windows the previous run closed are dead-lettered as too late instead of being split."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    recs = reports(bisample, 60, 9)
    old = time.time() - 30  # a backlog: on time in a fresh spool's first poll
    write_file(spool, "backlog.jsonl", [{**r, "ts": old} for r in recs[:20]])
    stop = threading.Event()
    result = {}
    t = threading.Thread(target=lambda: result.update(run_stream(
        str(out), bisample, spool=str(spool), window_seconds=1, poll_seconds=0.2,
        stop=stop, progress=False)))
    t.start()
    try:
        deadline = time.time() + 20
        while not (spool / DONE / "backlog.jsonl").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert (spool / DONE / "backlog.jsonl").exists()  # settled while running
    finally:
        stop.set()
        t.join(60)
    assert result["reconciles"] and result["records"]["in_windows"] == 20
    # restart: the backlog is not read again; a late straggler for its window is too late;
    # a crash's leftover in .claimed/ is re-read, skipping what its settled windows took
    soon = time.time() + 0.5
    write_file(spool, "next.jsonl", [{**r, "ts": old} for r in recs[20:25]]
               + [{**r, "ts": soon} for r in recs[25:]])
    write_file(spool / CLAIMED, "crashed.jsonl", [{**r, "ts": old} for r in recs[:4]]
               + [{**r, "ts": soon} for r in recs[4:7]])
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=1, poll_seconds=0.2,
                   duration=1.5, progress=False)
    assert s["files"] == 2 and s["records"]["too_late"] == 5
    assert s["records"]["skipped_settled"] == 4 and s["records"]["in_windows"] == 35 + 3
    assert s["reconciles"]
    too_late = [d for d in read_jsonl(out / "curator" / "deadletter.jsonl") if d["run"] == s["run"]]
    assert len(too_late) == 5 and all(d["reason"].startswith("too late") and
                                      d["source"] == "next.jsonl" for d in too_late)
    assert sorted(os.listdir(spool / DONE)) == ["backlog.jsonl", "crashed.jsonl", "next.jsonl"]


# --------------------------------------------------------------------------- the command
def test_cli_errors_name_the_option(tmp_path):
    code, _, se = run_cli("stream", "--spool", str(tmp_path), "-m", "laplace-histogram",
                          "-p", "epsilon=1", "-p", "bins=4", "-p", "lower=0", "-p", "upper=1",
                          "-c", "value",
                          "--allowed-lateness", "5", "-o", str(tmp_path / "o"))
    assert code == 2 and "--releases-per-window" in se
    code, _, se = run_cli("stream", "--subscription", "proj/sub", "-m", "grr", "-p",
                          "epsilon=1", "-p", "domain=a,b", "-o", str(tmp_path / "o"))
    assert code == 2 and ("apache-beam[gcp]" in se or "Pub/Sub" in se)
    code, _, se = run_cli("stream", "--spool", str(tmp_path / "missing"), "-m", "grr", "-p",
                          "epsilon=1", "-p", "domain=a,b", "-o", str(tmp_path / "o"))
    assert code == 2 and "does not exist" in se
    code, _, se = run_cli("stream", "--spool", str(tmp_path), "-m", "grr", "-p", "epsilon=1",
                          "-p", "domain=a,b", "--poll", "60", "-o", str(tmp_path / "o"))
    assert code == 2 and "poll" in se


def test_cli_once_takes_the_mechanism_from_a_reports_schema(tmp_path, bisample):
    import pyarrow.parquet as pq

    from ldp_beam.transforms import report_schema

    schema_file = tmp_path / "reports.parquet"
    pq.write_table(report_schema(bisample).empty_table(), schema_file)
    spool = tmp_path / "spool"
    spool.mkdir()
    write_file(spool, "a.jsonl", [{**r, "ts": T0 + 5} for r in reports(bisample, 40, 12)])
    code, so, se = run_cli("stream", "--spool", str(spool), "--reports-schema", str(schema_file),
                           "--window", "60", "--once", "-q", "-o", str(tmp_path / "out"))
    assert code == 0, se
    assert "1 window(s), 1 pane(s)" in so and "LDP with epsilon=2" in so
    (row,) = read_jsonl(tmp_path / "out" / "estimates.jsonl")
    assert row["mechanism"] == "bisample-md" and row["n_reports"] == 40
    assert row["params"]["upper"] == 100


def test_stream_command_end_to_end(tmp_path, bisample):
    """`ldp-beam stream` on a live spool directory: two files dropped while it runs, per-window
    estimates read from its output; SIGINT stops it cleanly."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ldp_beam.pipelines.cli", "stream", "--spool", str(spool),
         "-m", "bisample-md", "-p", f"epsilon={EPS}", "-p", "lower=0", "-p", "upper=100",
         "--window", "2", "--poll", "0.2", "--duration", "60", "-o", str(out)],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        for line in proc.stderr:  # wait until it is running
            lines.append(line)
            if "estimates ->" in line:
                break
        time.sleep(0.5)
        a, b = reports(bisample, 120, 10), reports(bisample, 80, 11)
        t1 = time.time()
        write_file(spool, "a.jsonl", [{**r, "ts": t1} for r in a] + ["{oops"])
        time.sleep(2.2)
        t2 = time.time()
        write_file(spool, "b.jsonl", [{**r, "ts": t2} for r in b])
        deadline = time.time() + 20
        while not ((spool / DONE / "a.jsonl").exists() and not (spool / "b.jsonl").exists()) \
                and time.time() < deadline:
            time.sleep(0.1)  # a settled while running; b claimed (its window is still open)
        proc.send_signal(signal.SIGINT)  # a clean stop: open windows fire first
        so, se = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    se = "".join(lines) + se
    assert proc.returncode == 0, se
    assert "SIGINT: stopping cleanly" in se and "read a.jsonl: 120 records, 1 dead-lettered" in se
    rows = read_jsonl(out / "estimates.jsonl")
    assert sum(r["n_reports"] for r in rows) == 200 and len(rows) == 2, se
    w1, w2 = (int(t1 // 2) * 2, int(t2 // 2) * 2)
    assert {r["window_start_epoch"]: r["n_reports"] for r in rows} == {w1: 120, w2: 80}
    for r in rows:
        assert r["window_end_epoch"] - r["window_start_epoch"] == 2
        # without a privacy unit the guarantee says it holds per record only
        assert r["guarantee"]["summary"] == (
            f"LDP with epsilon={EPS:g}; per record only: a person who sends several reports "
            "spends it once per report, and a device reporting every window spends it again "
            "every window") and r["guarantee"]["unit"] == "record"
        assert set(r["statistics"]) >= {"mean", "missing_rate"}
    dead = read_jsonl(out / "curator" / "deadletter.jsonl")
    assert [(d["source"], d["row"]) for d in dead] == [("a.jsonl", 121)]
    assert sorted(os.listdir(spool / DONE)) == ["a.jsonl", "b.jsonl"]
    summary = json.loads((out / "curator" / "summary.json").read_text())
    assert summary["reconciles"] and summary["records"]["read"] == 200
    assert "2 window(s), 2 pane(s)" in so and "per record only" in so
