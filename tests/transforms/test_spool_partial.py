"""A spool file is read only once it is complete (issue 24): a file written in place, straight
into the spool, is never read half (its writer still has it open, holds a flock on it, or it
changed less than `settle` seconds ago and ends mid-line), a truncated last line is one dead
letter with its file and line (the summary reconciles), and temporary names are never read until
renamed. Everything runs through the real stream (`run_stream`, live and `--once`)."""
import fcntl
import json
import os
import threading
import time

import numpy as np
import pytest

from ldp_beam_test_helpers import read_jsonl, write_file
from ldp_beam.pipelines.stream import run_stream
from ldp_beam.registry import build_mechanism
from ldp_beam.transforms.spool import (CLAIMED, DONE, SETTLE_SECONDS, TRUNCATED, SpoolDirectory,
                                       WindowClock, open_for_writing)

EPS = 2.0
N = 101


@pytest.fixture(scope="module")
def bisample():
    return build_mechanism("bisample-md", epsilon=EPS, lower=0, upper=100)


def lines_of(mech, n, seed, ts, tag):
    """n BiSample-MD reports as JSON lines (bytes, each ending with a newline), each with a
    unique id."""
    rng = np.random.default_rng(seed)
    rep = mech.perturb({"value": rng.uniform(18, 90, n)}, rng=seed)
    return [(json.dumps({"s": int(s), "b": int(b), "ts": ts, "id": f"{tag}-{i}"}) + "\n")
            .encode() for i, (s, b) in enumerate(zip(rep["s"], rep["b"]))]


def chunks_cut_mid_line(lines, per_chunk=10, boundary_at=()):
    """The bytes of ``lines`` in chunks of about ``per_chunk`` lines, each cut in the middle of
    a line (chunk k ends at a line's end instead when k is in ``boundary_at``)."""
    data = b"".join(lines)
    ends, pos = [], 0
    for i, line in enumerate(lines):
        if i and i % per_chunk == 0:
            ends.append(pos if len(ends) in boundary_at else pos + len(line) // 2)
        pos += len(line)
    cuts = [0] + ends + [len(data)]
    return [data[a:b] for a, b in zip(cuts, cuts[1:])]


def write_in_place(path, chunks, pause, keep_open):
    """A producer that writes straight into the spool: chunk after chunk, ``pause`` seconds
    apart, keeping the file open throughout (``keep_open``) or reopening it to append each
    chunk (as ``echo ... >> file`` does)."""
    if keep_open:
        with open(path, "ab") as fh:
            for chunk in chunks:
                fh.write(chunk)
                fh.flush()
                time.sleep(pause)
    else:
        for chunk in chunks:
            with open(path, "ab") as fh:
                fh.write(chunk)
            time.sleep(pause)


def source_dead(s):
    return [d for d in read_jsonl(s["outputs"]["dead_letter"])
            if d["run"] == s["run"] and d["stage"] == "source"] \
        if os.path.exists(s["outputs"]["dead_letter"]) else []


def ledger(s, kind):
    return [x for x in read_jsonl(s["outputs"]["ledger"])
            if x["run"] == s["run"] and x["kind"] == kind]


def estimated(s):
    path = s["outputs"]["estimates"]
    return sum(r["n_reports"] for r in read_jsonl(path) if r["run"] == s["run"]) \
        if os.path.exists(path) else 0


def done_lines(spool):
    """Every line of every file the spool has read (in .done/)."""
    out = []
    for name in sorted(os.listdir(spool / DONE)):
        out += (spool / DONE / name).read_bytes().splitlines(keepends=True)
    return out


# --------------------------------------------------------------------------- the claim rules
def test_claim_waits_for_writers_and_takes_renamed_files_at_first_sight(tmp_path):
    """A file renamed in is claimed at its first look; one open for writing, one flocked by its
    writer, and one changed just now that ends mid-line are not, and say why."""
    spool = SpoolDirectory(str(tmp_path), WindowClock(60))
    with spool:
        write_file(tmp_path, "renamed.jsonl", [{"ts": 1}])
        assert spool.claim("renamed.jsonl") is not None  # at first sight: no quiet period
        (tmp_path / "locked.jsonl").write_bytes(b'{"ts": 1}\n')
        holder = open(tmp_path / "locked.jsonl", "rb")  # a lock on a read-only descriptor
        fcntl.flock(holder, fcntl.LOCK_EX)
        with open(tmp_path / "open.jsonl", "wb") as writer:
            writer.write(b'{"ts": 1}\n')
            writer.flush()
            (tmp_path / "midline.jsonl").write_bytes(b'{"ts": 1}\n{"ts"')
            claimed = spool.claim_new()
            assert claimed == []
            assert spool.waiting["open.jsonl"] == "open for writing by a process"
            assert spool.waiting["locked.jsonl"] == "locked (flock) by its writer"
            assert "its last line not ended" in spool.waiting["midline.jsonl"]
        fcntl.flock(holder, fcntl.LOCK_UN)
        holder.close()
        # the writers are gone: the complete files are claimed at once, the one ending
        # mid-line once it has been quiet for the settle period
        assert sorted(s.name for s in spool.claim_new()) == ["locked.jsonl", "open.jsonl"]
        assert set(spool.waiting) == {"midline.jsonl"}
        (state,) = spool.claim_new(wait=SETTLE_SECONDS + 1)
        assert state.name == "midline.jsonl" and spool.waiting == {}
    with open(tmp_path / ".claimed" / "open.jsonl", "rb") as fh:  # (the check itself)
        assert open_for_writing(fh.fileno()) is False


# --------------------------------------------------------------------------- live
def test_live_stream_reads_files_written_in_place_whole(tmp_path, bisample):
    """Two producers write 101 lines each straight into the spool of a live stream, in chunks
    cut mid-line over about 2.5 s: one keeps its file open, one reopens it for each chunk (with
    one chunk ending at a line's end, where the file may be claimed and the rest land in a new
    file of the same name). A third file, renamed in, ends mid-record. Every line written is
    read exactly once and whole: 202 records estimated, one dead letter (the truncated line,
    with its file and line), none half-read, and the summary reconciles. A fourth file, still
    open for writing when the stream stops, is not read: it stays whole in the spool, and the
    ledger and log say so."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    bookkeeping = [".claimed", ".done", ".failed", ".lock", ".watermark"]
    ts = time.time() + 30  # in a window still open when the stream stops (it fires then)
    kept = lines_of(bisample, N, 1, ts, "kept")
    appended = lines_of(bisample, N, 2, ts, "appended")
    cut = lines_of(bisample, 20, 3, ts, "cut")
    stop = threading.Event()
    result = {}
    stream = threading.Thread(target=lambda: result.update(run_stream(
        str(out), bisample, spool=str(spool), window_seconds=3600, poll_seconds=0.2,
        duration=60, stop=stop, progress=False)))
    held_data = b"".join(lines_of(bisample, 10, 8, ts, "held"))
    held = open(spool / "held.jsonl", "wb")
    held.write(held_data)
    held.flush()
    stream.start()
    try:
        writers = [threading.Thread(target=write_in_place, args=(
            spool / name, chunks_cut_mid_line(lines, boundary_at=bounds), 0.25, keep))
            for name, lines, keep, bounds in (("kept.jsonl", kept, True, ()),
                                              ("appended.jsonl", appended, False, (4,)))]
        for w in writers:
            w.start()
        time.sleep(0.5)
        tmp = spool / ".cut.jsonl.tmp"
        tmp.write_bytes(b"".join(cut) + b'{"s": 1, "b": 0, "ts": ')
        os.rename(tmp, spool / "cut.jsonl")
        for w in writers:
            w.join()
        deadline = time.time() + 30  # every file claimed (and so read: a stop comes after)
        while sorted(os.listdir(spool)) != sorted(bookkeeping + ["held.jsonl"]) and \
                stream.is_alive() and time.time() < deadline:
            time.sleep(0.1)
        assert sorted(os.listdir(spool)) == sorted(bookkeeping + ["held.jsonl"])
    finally:
        stop.set()
        stream.join(60)
        held.close()
    s = result
    (unread,) = ledger(s, "unread")
    assert unread["file"] == "held.jsonl" and "open for writing" in unread["reason"]
    assert (spool / "held.jsonl").read_bytes() == held_data  # whole, where it was
    assert s["reconciles"], s
    assert s["records"]["in_windows"] == 2 * N + 20 == s["records"]["read"]
    assert s["records"]["lines"] == 2 * N + 21 and s["records"]["dead_lettered_at_source"] == 1
    (dead,) = source_dead(s)
    assert (dead["reason"], dead["source"], dead["row"]) == (TRUNCATED, "cut.jsonl", 21)
    assert estimated(s) == 2 * N + 20
    # nothing half-read: the lines the spool read are exactly those written, each once
    assert sorted(done_lines(spool)) == sorted(kept + appended + cut
                                               + [b'{"s": 1, "b": 0, "ts": '])
    assert os.listdir(spool / CLAIMED) == []


# --------------------------------------------------------------------------- --once
def test_once_leaves_a_file_still_being_written_and_waits_for_one_about_to_close(
        tmp_path, bisample, capfd):
    """The case that lost 50 of 101 lines: a bounded run while a producer has written half of
    a file in place (and half of line 51) and still has it open. The run reads nothing of it
    and says so (log and ledger); the file stays in the spool. A run started while the producer
    writes its last chunks waits for it to close and reads all 101 lines."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    lines = lines_of(bisample, N, 4, 1_700_000_005, "w")
    data = b"".join(lines)
    half = len(b"".join(lines[:50])) + len(lines[50]) // 2
    third = half + (len(data) - half) // 3
    rest = [data[half:third], data[third:]]  # the rest of line 51 and a third of the others...
    resume, finished = threading.Event(), threading.Event()

    def producer():
        with open(spool / "w.jsonl", "ab") as fh:
            fh.write(data[:half])
            fh.flush()
            resume.wait(60)
            for chunk in rest:
                time.sleep(0.3)
                fh.write(chunk)
                fh.flush()
        finished.set()

    writer = threading.Thread(target=producer)
    writer.start()
    try:
        while not (spool / "w.jsonl").exists() or (spool / "w.jsonl").stat().st_size < half:
            time.sleep(0.01)
        s1 = run_stream(str(out), bisample, spool=str(spool), window_seconds=60, once=True)
        assert s1["files"] == 0 and s1["records"]["lines"] == 0 and s1["reconciles"]
        assert source_dead(s1) == [] and estimated(s1) == 0
        (unread,) = ledger(s1, "unread")
        assert unread["file"] == "w.jsonl" and "open for writing" in unread["reason"]
        assert "not read w.jsonl: still being written" in capfd.readouterr().err
        assert (spool / "w.jsonl").stat().st_size == half and os.listdir(spool / CLAIMED) == []
        resume.set()  # the producer ends its file in about 0.6 s, within the run's wait
        s2 = run_stream(str(out), bisample, spool=str(spool), window_seconds=60, once=True,
                        progress=False)
        assert finished.is_set()
    finally:
        resume.set()
        writer.join(60)
    assert s2["reconciles"] and s2["files"] == 1 and ledger(s2, "unread") == []
    assert s2["records"]["lines"] == s2["records"]["read"] == s2["records"]["in_windows"] == N
    assert source_dead(s2) == [] and estimated(s2) == N
    assert os.listdir(spool / DONE) == ["w.jsonl"]
    assert (spool / DONE / "w.jsonl").read_bytes() == data


def test_truncated_last_line_is_one_dead_letter_with_its_file_and_line(tmp_path, bisample):
    """A file (renamed in) whose last line has no newline: the line is dead-lettered as
    truncated with its file and line number, even when it happens to parse, and counted as a
    line read, so lines = records + dead letters and the summary reconciles. A file ending
    with \\r\\n is whole."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    a = lines_of(bisample, 30, 5, 1_700_000_005, "a")
    b = lines_of(bisample, 8, 6, 1_700_000_005, "b")
    c = lines_of(bisample, 5, 7, 1_700_000_005, "c")
    for name, data in (("a.jsonl", b"".join(a) + b'{"s": 1, "b": 0, "ts": 17000'),
                       ("b.jsonl", b"".join(b[:-1]) + b[-1].rstrip(b"\n")),  # a whole record
                       ("c.jsonl", b"".join(x.replace(b"\n", b"\r\n") for x in c))):
        (spool / f".{name}.part").write_bytes(data)
        os.rename(spool / f".{name}.part", spool / name)
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=60, once=True,
                   progress=False)
    assert s["reconciles"] and s["files"] == 3 and ledger(s, "unread") == []
    r = s["records"]
    assert r["lines"] == 31 + 8 + 5 and r["read"] == r["in_windows"] == 30 + 7 + 5
    assert r["dead_lettered_at_source"] == 2
    dead = sorted((d["source"], d["row"], d["reason"]) for d in source_dead(s))
    assert dead == [("a.jsonl", 31, TRUNCATED), ("b.jsonl", 8, TRUNCATED)]
    assert estimated(s) == 30 + 7 + 5
    files = {x["file"]: x for x in ledger(s, "file")}
    assert {n: (x["lines"], x["records"], x["dead_lettered"]) for n, x in files.items()} == {
        "a.jsonl": (31, 30, 1), "b.jsonl": (8, 7, 1), "c.jsonl": (5, 5, 0)}


def test_temporary_names_are_never_read_until_renamed(tmp_path, bisample):
    """Names starting with '.' or '_', or not ending in .jsonl (.tmp, .part), are temporary:
    not read nor moved. Renamed to a spool name, they are read whole by the next run."""
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    temps = {".a.jsonl": 3, "_b.jsonl": 4, "c.jsonl.tmp": 5, "d.jsonl.part": 6, "e.tmp": 7}
    for i, (name, n) in enumerate(temps.items()):
        (spool / name).write_bytes(b"".join(lines_of(bisample, n, 10 + i, 1_700_000_005, name)))
    write_file(spool, "real.jsonl", [{"s": 1, "b": 0, "ts": 1_700_000_005}] * 2)
    before = {name: (spool / name).read_bytes() for name in temps}
    s1 = run_stream(str(out), bisample, spool=str(spool), window_seconds=60, once=True,
                    progress=False)
    assert s1["reconciles"] and s1["files"] == 1 and estimated(s1) == 2
    assert {name: (spool / name).read_bytes() for name in temps} == before  # untouched
    assert os.listdir(spool / DONE) == ["real.jsonl"] and ledger(s1, "unread") == []
    for i, name in enumerate(temps):
        os.rename(spool / name, spool / f"renamed{i}.jsonl")
    s2 = run_stream(str(out), bisample, spool=str(spool), window_seconds=60, once=True,
                    progress=False)
    assert s2["reconciles"] and s2["files"] == 5 and source_dead(s2) == []
    assert s2["records"]["lines"] == estimated(s2) == sum(temps.values())
