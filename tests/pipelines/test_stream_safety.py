"""`ldp-beam stream` safety (issue 13): early firings run, a backlog is read in acknowledged
chunks that honour --duration and survive kill -9, long lines are never held whole, symlinks are
not followed, validate-stage dead letters name their file and line, and a central-DP stream
releases every window of its range, empty or not."""
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream

from ldp_beam_test_helpers import LiveStream, read_jsonl, run_cli, write_file
from ldp_beam.central.histogram import HistogramReleaseEstimator, count_noise_variance
from ldp_beam.noise import discrete_laplace_scale
from ldp_beam.pipelines.stream import run_stream
from ldp_beam.transforms.windowed import (ParseMessagesFn, StreamConfigError, StreamSink,
                                          WindowedEstimate, empty_release, estimate_stream)
from ldp_beam.registry import build_mechanism
from ldp_beam.transforms.spool import CLAIMED, DONE, FAILED, MAX_LINE_BYTES, read_lines

T0 = 1_700_000_000  # a multiple of the window lengths used below
EPS = 2.0


@pytest.fixture(scope="module")
def bisample():
    return build_mechanism("bisample-md", epsilon=EPS, lower=0, upper=100)


@pytest.fixture(scope="module")
def histogram():
    return build_mechanism("laplace-histogram", epsilon=1.0, bins=4, lower=0, upper=1)


def reports(mech, n, seed):
    rng = np.random.default_rng(seed)
    rep = mech.perturb({"value": rng.uniform(18, 90, n)}, rng=seed)
    return [{"s": int(s), "b": int(b)} for s, b in zip(rep["s"], rep["b"])]


def run_rows(out, name, run):
    path = out / name
    return [r for r in read_jsonl(path) if r["run"] == run] if path.exists() else []


# --------------------------------------------------------------------------- --early
def test_early_firings_run_live_and_fractions_are_refused(tmp_path, bisample):
    """`--early 1` used to fail to translate (a float delay reached AfterProcessingTime). A
    live run with it fires early panes before the on-time one."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    soon = time.time() + 20  # a window still open when the run stops: no on-time pane before
    recs = reports(bisample, 60, 1)
    write_file(spool, "a.jsonl", [{**r, "ts": soon} for r in recs])
    code, so, se = run_cli("stream", "--spool", str(spool), "-m", "bisample-md", "-p",
                           f"epsilon={EPS}", "-p", "lower=0", "-p", "upper=100", "--window",
                           "60", "--early", "1", "--poll", "0.2", "--duration", "4", "-o",
                           str(out))
    assert code == 0, se
    rows = read_jsonl(out / "estimates.jsonl")
    timings = [r["pane"]["timing"] for r in sorted(rows, key=lambda r: r["pane"]["index"])]
    assert timings[0] == "early" and timings[-1] == "on_time", timings
    assert all(r["n_reports"] == 60 for r in rows)
    for bad in ("1.5", "0", "-2"):
        code, _, se = run_cli("stream", "--spool", str(spool), "-m", "bisample-md", "-p",
                              f"epsilon={EPS}", "-p", "lower=0", "-p", "upper=100", "--early",
                              bad, "--duration", "1", "-o", str(out))
        assert code == 2 and f"--early {float(bad)!r}" in se and "whole number of seconds" in se


# --------------------------------------------------------------------------- backlog
def test_duration_is_honoured_with_a_backlog_and_the_rest_is_read_next_time(tmp_path,
                                                                           bisample):
    """A backlog far larger than a run of 1.5 s can read: the run stops, every file it claimed
    is done, the others are untouched in the spool, and the next run reads exactly those."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    n_files = 12_000
    old = time.time() - 60
    rec = reports(bisample, 1, 2)[0]
    for i in range(n_files):
        write_file(spool, f"f{i:05d}.jsonl", [{**rec, "ts": old, "id": i}])
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=1, poll_seconds=0.2,
                   duration=1.5, progress=False)
    done = sorted(os.listdir(spool / DONE))
    left = sorted(f for f in os.listdir(spool) if f.endswith(".jsonl"))
    assert os.listdir(spool / CLAIMED) == []
    assert left and len(done) + len(left) == n_files  # stopped with a backlog remaining
    assert s["files"] == len(done) and s["records"]["in_windows"] == len(done)
    assert s["reconciles"] and s["seconds"] < 1.5 + 30  # (loose: not a speed test)
    assert done == [f"f{i:05d}.jsonl" for i in range(len(done))]  # name order, no gaps
    s2 = run_stream(str(out), bisample, spool=str(spool), window_seconds=1, once=True,
                    progress=False)
    assert s2["files"] == len(left) and s2["records"]["in_windows"] == len(left)
    assert len(os.listdir(spool / DONE)) == n_files


def test_kill_9_during_a_backlog_neither_loses_nor_rereads(tmp_path, bisample):
    """kill -9 while a live run reads a backlog in chunks: files settled before the crash are
    not read again, files claimed are re-read whole, unclaimed ones are read, and every record
    is in exactly one estimate."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    rec = reports(bisample, 1, 3)[0]
    old = time.time() - 120
    for i in range(100):  # settled while the first run is still running
        write_file(spool, f"a{i:04d}.jsonl", [{**rec, "ts": old, "id": i}] * 3)
    with LiveStream(tmp_path, "--spool", str(spool), "-m", "bisample-md", "-p",
                    f"epsilon={EPS}", "-p", "lower=0", "-p", "upper=100", "--window", "1",
                    "--poll", "0.2", "--duration", "120", "-q", "-o", str(out)) as live:
        live.wait(lambda: len(os.listdir(spool / DONE) if (spool / DONE).exists() else [])
                  >= 100)
        future = time.time() + 3600  # windows that stay open: claimed files stay claimed
        for i in range(4000):
            write_file(spool, f"b{i:04d}.jsonl", [{**rec, "ts": future, "id": i}] * 3)
        live.wait(lambda: bool(os.listdir(spool / CLAIMED)), every=0.005)
    claimed = set(os.listdir(spool / CLAIMED))
    assert claimed and all(f.startswith("b") for f in claimed)
    first = read_jsonl(out / "estimates.jsonl")
    assert sum(r["n_reports"] for r in first) == 300  # only the settled backlog's windows
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=1, once=True,
                   progress=False)
    files = [x for x in run_rows(out, "curator/ledger.jsonl", s["run"]) if x["kind"] == "file"]
    assert sorted(x["file"] for x in files) == [f"b{i:04d}.jsonl" for i in range(4000)]
    assert {x["file"] for x in files if x["recovered"]} == claimed
    assert s["records"]["in_windows"] == 12_000 and s["reconciles"]
    assert sum(r["n_reports"] for r in run_rows(out, "estimates.jsonl", s["run"])) == 12_000
    assert len(os.listdir(spool / DONE)) == 4100 and os.listdir(spool / CLAIMED) == []


# --------------------------------------------------------------------------- long lines
class CountingFile:
    """A binary file that records the size of every readline request."""

    def __init__(self, fh):
        self.fh, self.requests = fh, []

    def readline(self, size=-1):
        self.requests.append(size)
        return self.fh.readline(size)


def test_the_line_reader_never_asks_for_more_than_the_limit(tmp_path):
    path = tmp_path / "a.jsonl"
    with open(path, "wb") as fh:
        fh.write(b'{"ts": 1}\n' + b"x" * (3 * MAX_LINE_BYTES + 17) + b"\r\n"
                 + b"y" * MAX_LINE_BYTES + b"\n" + b"z" * (MAX_LINE_BYTES + 1) + b"\n"
                 + b'{"ts": 2}')
    with open(path, "rb") as raw:
        fh = CountingFile(raw)
        lines = list(read_lines(fh))
    assert all(0 < n <= MAX_LINE_BYTES + 2 for n in fh.requests)
    assert [(x.number, x.size, x.too_long) for x in lines] == [
        (1, 9, False), (2, 3 * MAX_LINE_BYTES + 17, True), (3, MAX_LINE_BYTES, False),
        (4, MAX_LINE_BYTES + 1, True), (5, 9, False)]
    assert lines[1].raw == b"x" * 1000 and lines[4].raw == b'{"ts": 2}'


def test_a_huge_line_is_dead_lettered_without_being_held(tmp_path):
    """A 64 MiB line: dead-lettered with its file and line, the next line is read, and the
    reading process's peak memory grows by far less than the line (bound: 16 MiB, against a
    reader that holds at most the 1 MiB limit + 2 bytes and its 8 KiB buffer)."""
    spool = tmp_path / "spool"
    (spool / CLAIMED).mkdir(parents=True)
    with open(spool / CLAIMED / "big.jsonl", "wb") as fh:
        fh.write(b'{"v": 1, "ts": 1700000000}\n{"pad": "')
        block = b"a" * (1 << 20)
        for _ in range(64):
            fh.write(block)
        fh.write(b'"}\n{"v": 2, "ts": 1700000001}\n')
    child = textwrap.dedent(f"""
        import json, sys
        from ldp_beam.transforms.spool import FileState, SpoolDirectory, WindowClock

        def hwm():
            with open("/proc/self/status") as fh:
                return next(int(l.split()[1]) for l in fh if l.startswith("VmHWM")) * 1024

        spool = SpoolDirectory({str(spool)!r}, WindowClock(10))
        before = hwm()
        items = list(spool.read(FileState({str(spool / CLAIMED / "big.jsonl")!r}, "big.jsonl",
                                          False), None, None))
        grew = hwm() - before
        print(json.dumps({{"grew": grew, "items": [[i[0], i[1] if i[0] != "record" else
                                                   [i[1], i[3]]] for i in items]}}))
    """)
    res = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["grew"] < 16 * (1 << 20), got["grew"]
    kinds = [i[0] for i in got["items"]]
    assert kinds == ["record", "dead", "record", "ledger"]
    dead = got["items"][1][1]
    assert (dead["source"], dead["row"]) == ("big.jsonl", 2)
    assert f"longer than the limit of {MAX_LINE_BYTES:,}" in dead["reason"]
    assert got["items"][2][1] == [{"v": 2, "ts": 1700000001}, 3]
    ledger = got["items"][3][1]
    assert (ledger["lines"], ledger["records"], ledger["dead_lettered"]) == (3, 2, 1)


# --------------------------------------------------------------------------- not regular files
def test_symlinks_and_other_non_files_are_not_followed(tmp_path, bisample):
    spool, out, elsewhere = tmp_path / "spool", tmp_path / "out", tmp_path / "secret"
    spool.mkdir()
    elsewhere.mkdir()
    recs = reports(bisample, 30, 4)
    write_file(elsewhere, "target.jsonl", [{**r, "ts": T0 + 1} for r in recs])
    os.symlink(elsewhere / "target.jsonl", spool / "link.jsonl")
    os.symlink(tmp_path / "nowhere.jsonl", spool / "dangling.jsonl")
    os.mkfifo(spool / "pipe.jsonl")  # opening it must not wait for a writer
    (spool / "dir.jsonl").mkdir()
    write_file(spool, "real.jsonl", [{**r, "ts": T0 + 1} for r in recs[:10]])
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=20, once=True,
                   progress=False)
    assert s["records"]["in_windows"] == 10 and s["files"] == 5 and s["reconciles"]
    assert os.listdir(spool / DONE) == ["real.jsonl"]
    failed = sorted(os.listdir(spool / FAILED))
    assert failed == ["dangling.jsonl", "dir.jsonl", "link.jsonl", "pipe.jsonl"]
    assert os.path.islink(spool / FAILED / "link.jsonl")  # moved as the link itself
    assert len(read_jsonl(elsewhere / "target.jsonl")) == 30  # the target is untouched
    dead = {d["source"]: d["reason"] for d in read_jsonl(out / "curator" / "deadletter.jsonl")}
    assert "a symbolic link" in dead["link.jsonl"] and "not followed" in dead["link.jsonl"]
    assert "a symbolic link" in dead["dangling.jsonl"]
    assert "a named pipe" in dead["pipe.jsonl"] and "a directory" in dead["dir.jsonl"]
    ledger = {x["file"]: x for x in read_jsonl(out / "curator" / "ledger.jsonl") if x["kind"] == "file"}
    assert ledger["link.jsonl"]["records"] == 0 and "moved to .failed" in \
        ledger["link.jsonl"]["error"]


# --------------------------------------------------------------------------- validate stage
def test_validate_stage_dead_letters_name_their_file_and_line(tmp_path, bisample, histogram):
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    recs = reports(bisample, 8, 5)
    write_file(spool, "a.jsonl", [{**r, "ts": T0 + 1} for r in recs[:3]]
               + [{"s": 1, "b": 7, "ts": T0 + 2}, {"s": 1, "ts": T0 + 2}]
               + [{**r, "ts": T0 + 3} for r in recs[3:]])
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=20, once=True,
                   progress=False)
    assert s["records"]["invalid"] == 2 and s["reconciles"]
    dead = sorted((d["stage"], d["source"], d["row"], d["reason"])
                  for d in read_jsonl(out / "curator" / "deadletter.jsonl"))
    assert dead == [("validate", "a.jsonl", 4, "report field 'b': 7 not in [0, 1]"),
                    ("validate", "a.jsonl", 5, "report field 'b' is missing")]
    # a central family's raw records too (only the mapped field is shown)
    cspool, cout = tmp_path / "cspool", tmp_path / "cout"
    cspool.mkdir()
    write_file(cspool, "c.jsonl", [{"value": 0.5, "ts": T0 + 1, "name": "x"},
                                   {"value": 2.5, "ts": T0 + 1, "name": "y"},
                                   {"other": 1, "ts": T0 + 1}])
    run_stream(str(cout), histogram, spool=str(cspool), window_seconds=20, once=True,
               start=T0, end=T0 + 20, progress=False)
    dead = sorted((d["source"], d["row"], d["record"], d["reason"][:28])
                  for d in read_jsonl(cout / "curator" / "deadletter.jsonl"))
    assert dead == [("c.jsonl", 2, {"value": 2.5}, "value: 2.5 is outside the de"),
                    ("c.jsonl", 3, {}, "record has no field 'value'")]
    # and a live run, whose records travel grouped by window
    lspool, lout = tmp_path / "lspool", tmp_path / "lout"
    lspool.mkdir()
    now = time.time()
    write_file(lspool, "l.jsonl", [{**r, "ts": now} for r in recs[:2]] + ["{bad", ""]
               + [{"s": 0, "b": 2, "ts": now}])
    s = run_stream(str(lout), bisample, spool=str(lspool), window_seconds=1, poll_seconds=0.2,
                   duration=1.5, progress=False)
    dead = sorted((d["stage"], d["source"], d["row"]) for d in read_jsonl(lout / "curator" /
                                                                          "deadletter.jsonl"))
    assert dead == [("source", "l.jsonl", 3), ("validate", "l.jsonl", 5)]


def test_pubsub_records_carry_their_message_line(tmp_path, bisample):
    msg = b'{"s": 1, "b": 0, "ts": 1700000001}\n\n{"s": 3, "b": 0, "ts": 1700000002}\n'
    items = list(ParseMessagesFn("ts", "pubsub:projects/p/subscriptions/s").process(msg))
    assert [i.value[2:] for i in items] == [("pubsub:projects/p/subscriptions/s", 1),
                                            ("pubsub:projects/p/subscriptions/s", 3)]
    stream = TestStream().add_elements(items).advance_watermark_to_infinity()
    out = tmp_path / "out"
    out.mkdir()
    with beam.Pipeline(options=PipelineOptions(["--streaming"])) as p:
        estimate_stream(p | stream, WindowedEstimate(bisample, 10),
                        StreamSink(str(out), "t", False, progress=False))
    (dead,) = read_jsonl(out / "curator" / "deadletter.jsonl")
    assert (dead["stage"], dead["source"], dead["row"]) == (
        "validate", "pubsub:projects/p/subscriptions/s", 3)


# --------------------------------------------------------------------------- central windows
def shape(obj):
    """A JSON value with every number replaced by its kind: the form of a release."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(v) for v in obj]
    return "number" if isinstance(obj, (int, float)) and not isinstance(obj, bool) else obj


def released(out, run):
    return {r["window_start_epoch"]: r for r in run_rows(out, "estimates.jsonl", run)}


def central_once(tmp_path, histogram, name, rows, **kw):
    spool, out = tmp_path / f"{name}-spool", tmp_path / f"{name}-out"
    spool.mkdir()
    write_file(spool, "a.jsonl", rows)
    s = run_stream(str(out), histogram, spool=str(spool), window_seconds=10, once=True,
                   columns={"value": "value"}, progress=False, **kw)
    return s, out


def test_central_stream_releases_the_gap_window_like_any_other(tmp_path, histogram):
    rows = [{"value": 0.2, "ts": T0 + 1}] * 5 + [{"value": 0.7, "ts": T0 + 25}] * 3
    for kw in ({"start": T0, "end": T0 + 40}, {}):  # declared; from the first to the last record
        s, out = central_once(tmp_path, histogram, f"gap{len(kw)}", rows, **kw)
        rel = released(out, s["run"])
        want = [T0, T0 + 10, T0 + 20] + ([T0 + 30] if kw else [])
        assert sorted(rel) == want, sorted(rel)
        gap = rel[T0 + 10]
        assert gap.keys() == rel[T0].keys() and gap["n_reports"] is None
        for key in ("statistics", "guarantee", "release", "params"):  # the same form
            assert shape(gap[key]) == shape(rel[T0][key]), key
        assert len(gap["statistics"]["histogram"]["value"]) == 4
        assert s["release_range"]["windows"] == len(want)
        assert s["release_range"]["declared"] == {"start": bool(kw), "end": bool(kw)}
        ledger = [x for x in run_rows(out, "curator/ledger.jsonl", s["run"]) if x["kind"] == "pane"]
        assert sorted((x["window_start_epoch"], x["count"]) for x in ledger) == \
            sorted([(T0, 5), (T0 + 10, 0), (T0 + 20, 3)] + ([(T0 + 30, 0)] if kw else []))


def test_released_windows_do_not_depend_on_one_record(tmp_path, histogram):
    base = [{"value": 0.2, "ts": T0 + 1}, {"value": 0.4, "ts": T0 + 41}]
    runs = {}
    for name, extra in (("without", []), ("with", [{"value": 0.9, "ts": T0 + 22}]),
                        ("outside", [{"value": 0.9, "ts": T0 + 95}])):
        s, out = central_once(tmp_path, histogram, name, base + extra, start=T0, end=T0 + 60)
        runs[name] = (s, out)
        assert sorted(released(out, s["run"])) == [T0 + 10 * i for i in range(6)], name
    s, out = runs["outside"]  # a record after the range: withheld, and said so
    assert s["release_range"]["windows_outside"] == 1 and s["panes_withheld"] == 1
    (dead,) = [d for d in read_jsonl(out / "curator" / "deadletter.jsonl") if d["stage"] == "release"]
    assert "outside the run's release range" in dead["reason"]
    assert dead["record"]["window_start_epoch"] == T0 + 90
    assert s["records"]["in_windows"] == 3 and s["records"]["in_releases"] == 2


def test_empty_window_releases_are_noise_with_the_stated_variance(tmp_path, histogram):
    """200 empty windows of a 4-bucket histogram: the 800 released counts are discrete
    Laplace noise around 0 with the variance the release states (5-sigma bounds on the mean
    and the variance, from the noise's second and fourth moments)."""
    s, out = central_once(tmp_path, histogram, "noise", [{"value": 0.5, "ts": T0 + 5}],
                          start=T0 + 10, end=T0 + 2010)
    rel = released(out, s["run"])
    assert len(rel) == 200 and s["release_range"]["windows_outside"] == 1
    x = np.array([r["statistics"]["histogram"]["value"] for r in rel.values()]).ravel()
    var = count_noise_variance(1.0)
    assert all(np.allclose(r["statistics"]["histogram"]["stderr"], math.sqrt(var))
               for r in rel.values())
    q = math.exp(-1 / discrete_laplace_scale(1, 1.0))
    k = np.arange(-400, 401)
    p = q ** np.abs(k) * (1 - q) / (1 + q)
    m2, m4 = float(np.sum(p * k ** 2)), float(np.sum(p * k ** 4))
    assert m2 == pytest.approx(var, rel=1e-9)
    n = x.size
    assert abs(x.mean()) < 5 * math.sqrt(m2 / n)
    assert abs(np.mean(x ** 2) - m2) < 5 * math.sqrt((m4 - m2 ** 2) / n)


def test_empty_release_has_the_form_of_finalize(histogram):
    """The stream's release of an empty window is made as finalize makes any other."""
    est = HistogramReleaseEstimator(histogram, seed=7)
    acc = est.create()
    full = est.finalize(est.add(est.create(), {"bucket": np.array([0, 1, 1, 3])})).to_dict()
    empty = empty_release(est)(acc).to_dict()
    assert empty.keys() == full.keys() and empty["n_reports"] is None
    assert empty["guarantee"] == full["guarantee"] and empty["params"] == full["params"]
    assert {k: {f: type(v) for f, v in st.items()} for k, st in empty["statistics"].items()} \
        == {k: {f: type(v) for f, v in st.items()} for k, st in full["statistics"].items()}
    dphr = build_mechanism("dphr", epsilon=1.0, bins=6, lower=0, upper=1)
    dest = HistogramReleaseEstimator(dphr)
    de = empty_release(dest)(dest.create()).to_dict()
    df = dest.finalize(dest.add(dest.create(), {"bucket": np.array([0, 2, 5])})).to_dict()
    assert de["statistics"].keys() == df["statistics"].keys()


def test_live_central_stream_releases_every_window_from_its_start(tmp_path, histogram):
    """A live central stream with a declared start and a backlog with a gap: every window from
    the start's to the stop is released once; a record far in the future is withheld."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    now = time.time()
    start = math.floor(now) - 8
    write_file(spool, "a.jsonl", [{"value": 0.3, "ts": start + 0.5}] * 3
                                 + [{"value": 0.6, "ts": start + 4.5}] * 2  # gaps between
                                 + [{"value": 0.1, "ts": now + 3600}])
    stop = threading.Event()
    timer = threading.Timer(2.5, stop.set)
    timer.start()
    try:
        s = run_stream(str(out), histogram, spool=str(spool), window_seconds=1,
                       poll_seconds=0.2, columns={"value": "value"}, start=start, stop=stop,
                       progress=False)
    finally:
        timer.cancel()
    rel = released(out, s["run"])
    starts = sorted(rel)
    assert starts[0] == start and starts == list(range(start, start + len(starts)))
    assert starts[-1] >= math.floor(now) and len(starts) == s["release_range"]["windows"]
    assert all(r["release"] == {"index": 1, "of": 1} for r in rel.values())
    assert {start + 1, start + 2, start + 3} <= set(starts)  # the empty ones
    assert s["release_range"]["windows_outside"] == 1 and s["reconciles"]
    ledger = {x["window_start_epoch"]: x for x in run_rows(out, "curator/ledger.jsonl", s["run"])
              if x["kind"] == "pane"}
    assert ledger[start]["count"] == 3 and ledger[start + 4]["count"] == 2
    assert ledger[math.floor(now + 3600)]["in_range"] is False


def test_central_range_options_are_checked(tmp_path, histogram, bisample):
    spool = tmp_path / "spool"
    spool.mkdir()
    with pytest.raises(StreamConfigError, match="--start 'yesterday'"):
        run_stream(str(tmp_path / "o"), histogram, spool=str(spool), once=True,
                   start="yesterday", progress=False)
    with pytest.raises(StreamConfigError, match="--end .* is not after --start"):
        run_stream(str(tmp_path / "o"), histogram, spool=str(spool), once=True, start=T0 + 10,
                   end=T0, progress=False)
    with pytest.raises(StreamConfigError, match=r"--start .*more than 100,000.*--window"):
        run_stream(str(tmp_path / "o"), histogram, spool=str(spool), window_seconds=1,
                   start=T0, progress=False)
    with pytest.raises(StreamConfigError, match="central-DP stream; bisample-md is LDP"):
        run_stream(str(tmp_path / "o"), bisample, spool=str(spool), once=True, start=T0,
                   progress=False)
    with pytest.raises(StreamConfigError, match="stream central releases from --spool"):
        run_stream(str(tmp_path / "o"), histogram, subscription="p/s", progress=False)
    # a family that cannot release an empty window cannot stream (its windows would leak);
    # ospdprr (sound-self) and osdp-rr also draw their sampling per record now (issue 16), which
    # the central stream refuses first
    for name, kw in (("ospdprr", dict(t=0.7)), ("osdp-rr", dict(epsilon=1.0))):
        mech = build_mechanism(name, k=1, lower=0.0, upper=10.0, **kw)
        with pytest.raises(StreamConfigError,
                           match="no release of an empty window|draws randomness per record"):
            WindowedEstimate(mech, 10)


def test_live_central_marks_by_the_clock_not_the_lagged_watermark(tmp_path, histogram):
    """With a watermark lag, windows between the watermark and the clock get records on time:
    they are in the range (marked by the wall clock) and released at the stop, not withheld."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    now = time.time()
    write_file(spool, "a.jsonl", [{"value": 0.3, "ts": now}] * 2)
    stop = threading.Event()
    timer = threading.Timer(2.0, stop.set)
    timer.start()
    try:
        s = run_stream(str(out), histogram, spool=str(spool), window_seconds=1,
                       poll_seconds=0.2, watermark_lag=30, columns={"value": "value"},
                       stop=stop, progress=False)
    finally:
        timer.cancel()
    assert s["panes_withheld"] == 0 and s["release_range"]["windows_outside"] == 0
    ledger = {x["window_start_epoch"]: x for x in run_rows(out, "curator/ledger.jsonl", s["run"])
              if x["kind"] == "pane"}
    assert ledger[math.floor(now)]["count"] == 2 and ledger[math.floor(now)]["released"]
    rel = sorted(int(w) for w in released(out, s["run"]))  # from the run's start less the lag
    assert rel == list(range(rel[0], rel[0] + len(rel)))
    assert rel[0] - math.floor(now - 30) in (0, 1) and rel[-1] >= math.floor(now)


# --------------------------------------------------------------------------- privacy units
# Issue 14: a stream with a privacy unit estimates at most k reports per unit and window, tracks
# each unit's cumulative loss across windows and restarts (OUT/units.sqlite), drops what would
# pass its cap, and says per what its guarantee holds. Without one, it says "per record only".
DOMAIN5 = ["a", "b", "c", "d", "e"]
ALPHA = 1e-4


@pytest.fixture(scope="module")
def grr():
    return build_mechanism("grr", epsilon=1.0, domain=DOMAIN5)


def grr_counts(row, mech):
    """The report counts behind a GRR estimate row: the unbiased frequencies are A P with A the
    inverse of the transition matrix, so P = Q f (exact up to rounding)."""
    f = np.asarray(row["statistics"]["frequency"]["value"])
    return np.rint(row["n_reports"] * (mech.transition_matrix() @ f)).astype(int)


def unit_run(tmp_path, mech, files, name="out", **kw):
    """Write ``files`` ({name: records}) into a spool and run a bounded privacy-unit stream."""
    spool, out = tmp_path / "spool", tmp_path / name
    spool.mkdir(exist_ok=True)
    for fname, recs in files.items():
        write_file(spool, fname, recs)
    kw.setdefault("privacy_unit", "device")
    s = run_stream(str(out), mech, spool=str(spool), window_seconds=10, once=True,
                   progress=False, **kw)
    return s, out


def test_a_unit_with_50_reports_in_a_window_gets_k_estimated(tmp_path, grr):
    """k = 2: the chatty unit's 50 reports (all 'e') give exactly 2 estimated reports; the other
    ten units' single reports ('a') all count; the estimate is the estimator's over exactly those
    12 reports, with standard errors widened by sqrt(2) for reports of one unit."""
    chatty = [{"v": 4, "device": "chatty", "ts": T0 + 1 + i / 100} for i in range(50)]
    quiet = [{"v": 0, "device": f"q{i}", "ts": T0 + 2} for i in range(10)]
    s, out = unit_run(tmp_path, grr, {"a.jsonl": chatty + quiet}, max_reports_per_unit=2)
    (row,) = read_jsonl(out / "estimates.jsonl")
    u = row["privacy_unit"]
    assert (row["n_reports"], u["estimated"], u["bounded_out"], u["over_budget"]) == \
        (12, 12, 48, 0) and u["units"] == 11
    assert grr_counts(row, grr).tolist() == [10, 0, 0, 0, 2]
    from ldp_beam.estimators import estimator_for
    est = estimator_for(grr).estimate({"v": np.array([0] * 10 + [4] * 2, dtype=np.uint16)})
    f = est.statistics["frequency"]
    assert np.allclose(row["statistics"]["frequency"]["value"], f.value)
    assert np.allclose(row["statistics"]["frequency"]["stderr"], np.sqrt(2) * f.stderr)
    assert "per privacy unit device" in row["estimand"] and "at most 2" in row["estimand"]
    assert s["reconciles"] and s["privacy_unit"]["reconciles"]
    assert s["privacy_unit"]["estimated"] + s["privacy_unit"]["bounded_out"] == 60


def test_the_estimated_report_is_uniform_among_a_units_reports(tmp_path, grr):
    """1,000 units send 5 reports each in one window, the j-th with value j: with k = 1 the
    value estimated for a unit is uniform over the five (chi-square at level ALPHA)."""
    recs = [{"v": j, "device": f"d{u}", "ts": T0 + 1} for u in range(1000) for j in range(5)]
    s, out = unit_run(tmp_path, grr, {"a.jsonl": recs})
    (row,) = read_jsonl(out / "estimates.jsonl")
    counts = grr_counts(row, grr)
    assert counts.sum() == 1000 and s["privacy_unit"]["bounded_out"] == 4000
    from scipy import stats
    assert stats.chisquare(counts).pvalue > ALPHA, counts


def memo_device_records(mech, secret, windows, memo=True, device="dev", value="c"):
    """One device reporting ``value`` in every window, memoized (with its memo id) or not."""
    from ldp_beam.longitudinal import Memoized
    m = Memoized(mech, secret)
    out = []
    for w in range(windows):
        if memo:
            v = int(m.perturb([value], [device])["v"][0])
            rec = {"v": v, "memo_id": m.memo_ids([value], [device])[0]}
        else:
            rec = {"v": int(mech.perturb([value], rng=100 + w)["v"][0])}
        out.append({**rec, "device": device, "ts": T0 + 10 * w + 3})
    return out


def test_a_memoized_device_reporting_every_window_spends_epsilon_once(tmp_path, grr):
    """Six windows: the memoized device's unchanged value costs epsilon once (and stays under a
    cap of 1.5 epsilon in every window); a device randomizing afresh spends epsilon per window and
    is dropped once past the cap; a memo id that comes back with another report is charged."""
    from ldp_beam.longitudinal import UnitState
    secret = b"device secret, 32 bytes long...."
    files = {"a.jsonl": memo_device_records(grr, secret, 6, device="memo")
             + memo_device_records(grr, secret, 6, memo=False, device="fresh")}
    s, out = unit_run(tmp_path, grr, files, unit_budget=1.5, memoize=True)
    rows = sorted(read_jsonl(out / "estimates.jsonl"), key=lambda r: r["window_start_epoch"])
    assert [r["privacy_unit"]["estimated"] for r in rows] == [2] + [1] * 5
    assert [r["privacy_unit"]["over_budget"] for r in rows] == [0] + [1] * 5
    assert [r["privacy_unit"]["memo_repeats"] for r in rows] == [0] + [1] * 5
    state = UnitState(str(out / "units.sqlite"), "device")
    assert sorted(state.spent().values()) == [1.0, 1.0]  # each device: one epsilon
    assert s["privacy_unit"]["max_unit_loss"] == 1.0 and s["privacy_unit"]["units_at_cap"] == 2
    # the same memo id with a different report cannot be a memoized copy: it is charged
    forged = memo_device_records(grr, b"another device secret.........!!", 1, device="memo")
    forged[0]["ts"] = T0 + 100
    forged[0]["memo_id"] = files["a.jsonl"][0]["memo_id"]
    forged[0]["v"] = (files["a.jsonl"][0]["v"] + 1) % 5
    s2, _ = unit_run(tmp_path, grr, {"b.jsonl": forged}, unit_budget=1.5, memoize=True)
    assert s2["privacy_unit"]["memo_mismatch"] == 1 and s2["privacy_unit"]["over_budget"] == 1


def test_per_unit_state_survives_a_restart_and_the_cap_holds_across_runs(tmp_path, grr):
    """Two runs over successive spool files: the loss the first run charged counts in the
    second, which drops (and counts) the reports past the cap of 3 epsilon; the second run is
    live (the spool source), the first bounded."""
    def file(windows):
        return [{"v": u % 5, "device": f"u{u}", "ts": T0 + 10 * w + 1}
                for w in windows for u in range(8)]
    s1, out = unit_run(tmp_path, grr, {"a.jsonl": file([0, 1])}, unit_budget=3.0)
    assert s1["privacy_unit"]["estimated"] == 16 and s1["privacy_unit"]["over_budget"] == 0
    write_file(tmp_path / "spool", "b.jsonl", file([2, 3]))
    s2 = run_stream(str(out), grr, spool=str(tmp_path / "spool"), window_seconds=10,
                    poll_seconds=0.2, duration=4, privacy_unit="device", unit_budget=3.0,
                    progress=False)
    rows = {r["window_start_epoch"]: r for r in read_jsonl(out / "estimates.jsonl")}
    assert [rows[T0 + 10 * w]["privacy_unit"]["estimated"] for w in range(4)] == [8, 8, 8, 0]
    assert rows[T0 + 30]["privacy_unit"]["over_budget"] == 8
    assert "error" in rows[T0 + 30]  # nothing left to estimate: no estimate, said so
    assert s2["reconciles"] and s2["privacy_unit"]["over_budget"] == 8
    assert s2["privacy_unit"]["max_unit_loss"] == 3.0 and s2["privacy_unit"]["units_at_cap"] == 8
    # a third run in the same folder with another unit field is refused
    with pytest.raises(StreamConfigError, match="tracks privacy unit 'device'"):
        run_stream(str(out), grr, spool=str(tmp_path / "spool"), window_seconds=10, once=True,
                   privacy_unit="user", progress=False)


def test_selection_is_the_same_on_every_direct_runner_mode_with_a_seed(tmp_path, grr):
    """A seeded per-unit state keys the unit hashes and priorities from the seed: the default
    DirectRunner and two worker processes select the same reports (and so the same estimates)."""
    from ldp_beam.longitudinal import UnitState
    recs = [{"v": (u * 7 + j) % 5, "device": f"u{u % 40}", "ts": T0 + 1 + (j % 3) * 10}
            for u in range(200) for j in range(4)]
    files = {f"p{i}.jsonl": recs[i::3] for i in range(3)}
    multi = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    picked, stats_ = [], []
    for name, args in (("one", []), ("multi", multi)):
        spool = tmp_path / f"spool-{name}"
        spool.mkdir()
        for f, r in files.items():
            write_file(spool, f, r)
        out = tmp_path / name
        s = run_stream(str(out), grr, spool=str(spool), window_seconds=10, once=True,
                       privacy_unit="device", max_reports_per_unit=2, seed=1234,
                       beam_args=args, progress=False)
        assert s["reconciles"] and s["privacy_unit"]["seeded"] is True
        picked.append([r[:3] for r in UnitState(str(out / "units.sqlite"), "device")
                       .recorded()])
        stats_.append(sorted((r["window_start_epoch"], json.dumps(r["statistics"]))
                             for r in read_jsonl(out / "estimates.jsonl")))
    assert picked[0] == picked[1] and len(picked[0]) == 3 * 40 * 2
    assert stats_[0] == stats_[1]
    # unseeded, the key is fresh: another folder selects independently
    spool = tmp_path / "spool-fresh"
    spool.mkdir()
    for f, r in files.items():
        write_file(spool, f, r)
    run_stream(str(tmp_path / "fresh"), grr, spool=str(spool), window_seconds=10, once=True,
               privacy_unit="device", max_reports_per_unit=2, progress=False)
    fresh = [r[:3] for r in UnitState(str(tmp_path / "fresh" / "units.sqlite"), "device")
             .recorded()]
    assert {r[2] for r in fresh}.isdisjoint({r[2] for r in picked[0]})


def test_no_raw_unit_id_reaches_any_output(tmp_path, grr):
    ids = ["alice@example.org", "device-00042", "bob-the-phone"]
    recs = [{"v": i % 5, "device": d, "ts": T0 + 1} for i, d in enumerate(ids * 3)]
    recs += [{"v": 9, "device": ids[0], "ts": T0 + 2},  # invalid report: validate dead letter
             {"v": 1, "device": ids[1], "ts": T0 + 10**9},  # an event time far ahead: fine
             '{"v": 1, "device": "%s", "ts": ' % ids[2],  # unparseable, holds an id
             {"v": 1, "device": [ids[0]], "ts": T0 + 3}]  # not an id
    s, out = unit_run(tmp_path, grr, {"a.jsonl": recs})
    dead = read_jsonl(out / "curator" / "deadletter.jsonl")
    assert sorted(d["stage"] for d in dead) == ["source", "source", "validate"]
    assert all(d["record"]["device"].startswith("u") for d in dead if d["stage"] == "validate")
    blob = b"".join(p.read_bytes() for p in out.iterdir() if p.is_file())
    assert not any(i.encode() in blob for i in ids)
    assert s["reconciles"]


def test_guarantee_texts_say_per_record_or_per_unit(tmp_path, grr, histogram):
    """Every output's guarantee: "per record only" without a unit (a device reporting every window
    spends it every window), "per privacy unit FIELD (at most k ... per window; cumulative loss
    capped at B)" with one; a central release states its epsilon per unit and window."""
    rec = [{"v": 1, "value": 0.5, "device": "d", "ts": T0 + 1}]
    runs = {
        "plain": (grr, {}),
        "unit": (grr, {"privacy_unit": "device", "max_reports_per_unit": 3,
                       "unit_budget": 4.0}),
        "uncapped": (grr, {"privacy_unit": "device"}),
        "central": (histogram, {"privacy_unit": "device", "max_reports_per_unit": 2,
                                "unit_budget": 5.0, "start": T0, "end": T0 + 10}),
        "central-plain": (histogram, {"start": T0, "end": T0 + 10}),
    }
    texts = {}
    for name, (mech, kw) in runs.items():
        spool, out = tmp_path / f"spool-{name}", tmp_path / name
        spool.mkdir()
        write_file(spool, "a.jsonl", rec)
        s = run_stream(str(out), mech, spool=str(spool), window_seconds=10, once=True,
                       progress=False, **kw)
        (row,) = read_jsonl(out / "estimates.jsonl")
        assert row["guarantee"] == s["guarantee"]  # every output says the same
        texts[name] = s["guarantee"]["summary"]
    assert texts["plain"] == ("LDP with epsilon=1; per record only: a person who sends several "
                              "reports spends it once per report, and a device reporting every "
                              "window spends it again every window")
    assert texts["unit"] == ("LDP with epsilon=1; per privacy unit device (at most 3 reports per "
                             "window; cumulative loss capped at 4)")
    assert texts["uncapped"].endswith("per privacy unit device (at most 1 report per window; "
                                      "cumulative loss not capped: up to 1 more in every window "
                                      "the unit reports in)")
    assert texts["central"] == ("central-DP with epsilon=1; per privacy unit device (at most 2 "
                                "records per window, so at most 2 per unit and window; "
                                "cumulative loss capped at 5)")
    assert "per record only" in texts["central-plain"]


def test_central_release_keeps_k_records_per_unit_and_publishes_no_counts(tmp_path, histogram):
    """A central-DP stream with a privacy unit: per window each unit keeps one record (of its
    many) before the release, its loss is the window's epsilon per record kept; the release row
    states the unit and its bound but no counts (they are in the ledger)."""
    from ldp_beam.longitudinal import UnitState
    recs = [{"value": 0.1 + 0.2 * (j % 4), "device": f"d{u}", "ts": T0 + 1 + w * 10}
            for w in range(2) for u in range(30) for j in range(u % 4 + 1)]
    s, out = unit_run(tmp_path, histogram, {"a.jsonl": recs}, start=T0, end=T0 + 30)
    rows = sorted(read_jsonl(out / "estimates.jsonl"), key=lambda r: r["window_start_epoch"])
    assert len(rows) == 3  # the range's empty third window is released too
    assert all(r["privacy_unit"] == {"field": "device", "max_records_per_unit": 1,
                                     "unit_budget": None} for r in rows)
    assert not any("estimated" in json.dumps(r) for r in rows)
    panes = [p for p in read_jsonl(out / "curator" / "ledger.jsonl") if p["kind"] == "pane"]
    units = sorted((p["window_start_epoch"], p["units"]["estimated"], p["units"]["bounded_out"])
                   for p in panes if "units" in p)
    assert units[:2] == [(T0, 30, len(recs) // 2 - 30), (T0 + 10, 30, len(recs) // 2 - 30)]
    spent = UnitState(str(out / "units.sqlite"), "device").spent()
    assert len(spent) == 30 and set(spent.values()) == {2.0}  # 1 per window, two windows
    assert s["reconciles"]


def test_early_panes_never_estimate_more_than_k_reports_of_a_unit(tmp_path, bisample):
    """An early pane selects a unit's report; reports that arrive later do not add to it: the
    window's later pane estimates at most k reports of the unit in all (what earlier panes used
    counts), and the state records at most k per unit and window."""
    from ldp_beam.longitudinal import UnitState
    from ldp_beam.transforms.windowed import PrivacyUnit
    from apache_beam.transforms.window import TimestampedValue
    from ldp_beam.transforms.spool import RECORD
    state = UnitState(str(tmp_path / "units.sqlite"), "device")
    recs = reports(bisample, 60, 21)
    first = [TimestampedValue((RECORD, {**r, "device": f"d{i % 10}"}), T0 + 1)
             for i, r in enumerate(recs[:30])]
    later = [TimestampedValue((RECORD, {**r, "device": f"d{i % 10}"}), T0 + 2)
             for i, r in enumerate(recs[30:])]
    stream = (TestStream().add_elements(first).advance_processing_time(6)
              .add_elements(later).advance_watermark_to_infinity())
    est = WindowedEstimate(bisample, 10, early_seconds=5,
                           unit=PrivacyUnit("device", state, max_reports=2))
    out = tmp_path / "out"
    out.mkdir()
    with beam.Pipeline(options=PipelineOptions(["--streaming"])) as p:
        estimate_stream(p | stream, est, StreamSink(str(out), "t", False, progress=False))
    rows = sorted(read_jsonl(out / "estimates.jsonl"), key=lambda r: r["pane"]["index"])
    assert [r["pane"]["timing"] for r in rows] == ["early", "on_time"]
    assert [r["privacy_unit"]["reports"] for r in rows] == [30, 60]
    assert all(r["n_reports"] <= 20 for r in rows)
    per_unit: dict = {}
    for unit, *_ in state.recorded(T0 * 1_000_000):
        per_unit[unit] = per_unit.get(unit, 0) + 1
    assert len(per_unit) == 10 and max(per_unit.values()) == 2


def test_privacy_unit_options_are_checked(tmp_path, grr, histogram):
    spool = tmp_path / "spool"
    spool.mkdir()
    base = dict(spool=str(spool), window_seconds=10, once=True, progress=False)
    for kw, match in (({"unit_budget": 1.0}, "--unit-budget applies to a stream with a "
                       "privacy unit"),
                      ({"max_reports_per_unit": 2}, "--max-reports-per-unit applies"),
                      ({"memoize": True}, "--memo-field applies"),
                      ({"seed": 3}, "--seed applies"),
                      ({"privacy_unit": "device", "max_reports_per_unit": 0},
                       "--max-reports-per-unit 0"),
                      ({"privacy_unit": "device", "unit_budget": -1.0}, "--unit-budget -1.0"),
                      ({"privacy_unit": "v"}, "--privacy-unit 'v' is one of grr's report"),
                      ({"privacy_unit": "device", "memoize": "device"}, "--memo-field")):
        with pytest.raises(StreamConfigError, match=match):
            run_stream(str(tmp_path / "o1"), grr, **base, **kw)
    with pytest.raises(StreamConfigError, match="memoized reports are LDP's"):
        run_stream(str(tmp_path / "o2"), histogram, **base, privacy_unit="device",
                   memoize=True, start=T0, end=T0 + 10)
    run_stream(str(tmp_path / "o3"), grr, **base, privacy_unit="device", seed=1)
    with pytest.raises(StreamConfigError, match="another key"):  # a seed needs a fresh folder
        run_stream(str(tmp_path / "o3"), grr, **base, privacy_unit="device", seed=2)


def test_pubsub_messages_hash_the_unit_at_the_source():
    key = b"k" * 32
    msg = (b'{"v": 1, "device": "alice", "ts": 1700000001}\n{"v": 1, "ts": 1700000002}\n'
           b'{"device": "bob", broken\n')
    items = list(ParseMessagesFn("ts", "pubsub:p", "device", key).process(msg))
    rec = items[0].value[1]
    assert rec["device"].startswith("u") and "alice" not in json.dumps(rec)
    dead = [i[1] for i in items[1:]]
    assert dead[0]["reason"] == "record has no privacy-unit field 'device'"
    assert "bob" not in json.dumps(dead[1]) and dead[1]["record"].startswith("<withheld")


def test_central_release_calibrated_to_k_rows_charges_a_unit_once_per_window(tmp_path):
    """A histogram release calibrated to 2 rows per unit (max_rows_per_partition=2): a unit's two
    records in a window cost it one epsilon (the release covers them), three windows three."""
    from ldp_beam.longitudinal import UnitState
    mech = build_mechanism("laplace-histogram", epsilon=1.0, bins=4, lower=0, upper=1,
                           max_rows_per_partition=2)
    recs = [{"value": 0.2 + 0.5 * j, "device": "d", "ts": T0 + 1 + 10 * w}
            for w in range(3) for j in range(2)]
    s, out = unit_run(tmp_path, mech, {"a.jsonl": recs}, max_reports_per_unit=2,
                      start=T0, end=T0 + 30)
    assert "at most 2 records per window, so at most 1 per unit and window" in \
        s["guarantee"]["summary"] and s["guarantee"]["unit_window_epsilon"] == 1.0
    assert list(UnitState(str(out / "units.sqlite"), "device").spent().values()) == [3.0]
    assert s["privacy_unit"]["estimated"] == 6 and s["reconciles"]


def test_central_window_releases_are_addressed_by_their_window():
    """Empty windows (equal counts) never share noise, and a re-executed firing of one window
    publishes the same numbers (issue 13: retry-proof noise, LDP or central)."""
    from ldp_beam.estimators import estimator_for
    from ldp_beam.transforms.windowed import release_window
    from ldp_beam.registry import build_mechanism
    from ldp_beam.transforms.combine import EstimatorCombineFn

    mech = build_mechanism("laplace-histogram", epsilon=1.0, categories=["a", "b", "c", "d"])
    inner = EstimatorCombineFn(estimator_for(mech, seed=2**200 + 7), on_empty="report")
    acc = inner.create_accumulator()
    first = [release_window(inner, acc, 0, w * 10_000_000)["histogram"].value for w in range(6)]
    again = release_window(inner, acc, 0, 3 * 10_000_000)["histogram"].value
    assert np.array_equal(first[3], again)
    assert len({tuple(h) for h in first}) == 6
