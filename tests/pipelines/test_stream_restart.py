"""Restarts of a live stream (issue 24): a central-DP stream killed with ``kill -9`` while a
window is open, then restarted plainly (no ``--start``), continues the release range the killed
run recorded, so the open window is released by the restart from the records it re-reads;
no window is ever released twice; what is published is kept apart from the curator's exact
counts."""
import json
import os
import threading
import time

import pytest

from ldp_beam_test_helpers import LiveStream, read_jsonl, write_file
from ldp_beam.pipelines.stream import StreamConfigError, run_stream  # (re-exported)
from ldp_beam.registry import build_mechanism
from ldp_beam.transforms.spool import CLAIMED

WINDOW = 4


@pytest.fixture(scope="module")
def histogram():
    return build_mechanism("laplace-histogram", epsilon=1.0, bins=4, lower=0, upper=1)


def _window_with_room(room: float = 2.5) -> int:
    """The start of the current window, once at least ``room`` seconds of it remain."""
    while True:
        now = time.time()
        start = int(now // WINDOW) * WINDOW
        if start + WINDOW - now >= room:
            return start
        time.sleep(start + WINDOW - now + 0.05)


def test_a_killed_central_stream_restarted_plainly_releases_the_open_window(tmp_path,
                                                                          histogram):
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    with LiveStream(tmp_path, "--spool", str(spool), "-m", "laplace-histogram", "-p",
                    "epsilon=1", "-p", "bins=4", "-p", "lower=0", "-p", "upper=1", "-c", "value",
                    "--window", str(WINDOW), "--poll", "0.2", "--duration", "120", "-q", "-o",
                    str(out)) as live:
        live.wait(lambda: (out / "curator" / "release_range.json").exists())
        first_range = json.loads((out / "curator" / "release_range.json").read_text())
        w = _window_with_room()
        write_file(spool, "open.jsonl", [{"value": 0.3, "ts": w + 0.5}] * 64)
        live.wait(lambda: (spool / CLAIMED / "open.jsonl").exists(), every=0.01)
        time.sleep(0.3)  # read and in the window, which is still open
        assert time.time() < w + WINDOW
    before = read_jsonl(out / "estimates.jsonl") if (out / "estimates.jsonl").exists() else []
    assert w not in {r["window_start_epoch"] for r in before}  # the killed run never fired it

    time.sleep(max(0.0, w + WINDOW + 0.5 - time.time()))  # restarted after the window's end
    stop = threading.Event()
    timer = threading.Timer(max(0.0, w + 2 * WINDOW + 1 - time.time()), stop.set)
    timer.start()
    try:
        s = run_stream(str(out), histogram, spool=str(spool), window_seconds=WINDOW,
                       poll_seconds=0.2, columns={"value": "value"}, stop=stop,
                       progress=False)
    finally:
        timer.cancel()
    rows = read_jsonl(out / "estimates.jsonl")
    starts = [int(r["window_start_epoch"]) for r in rows]
    assert len(starts) == len(set(starts)), "a window was released twice"
    # one contiguous range from the killed run's start, the open window included
    assert sorted(starts) == list(range(first_range["start_us"] // 1_000_000,
                                        max(starts) + WINDOW, WINDOW))
    assert w in starts and max(starts) >= w + WINDOW
    panes = {p["window_start_epoch"]: p for p in read_jsonl(out / "curator" / "ledger.jsonl")
             if p["kind"] == "pane" and p["run"] == s["run"]}
    assert panes[w]["count"] == 64 and panes[w]["released"] and panes[w]["in_range"]
    assert s["records"]["in_windows"] == 64 and s["reconciles"]
    assert s["release_range"]["windows_outside"] == 0
    rec = json.loads((out / "curator" / "release_range.json").read_text())
    assert rec["start_us"] == first_range["start_us"] and rec["run"] == first_range["run"]
    # published and curator-only files are apart, and the curator folder says what it is
    assert sorted(os.listdir(out)) == ["curator", "estimates.jsonl"]
    assert "never publish" in (out / "curator" / "CURATOR-ONLY.txt").read_text()
    assert all("count" not in r for r in rows)  # no exact count in a central release
    # the team's ledger: the killed run's reservation was settled by the restart, and the
    # deployment spent its per-record epsilon once (whichever of the two runs published first)
    assert s["ledger"]["pending"] == 0 and s["ledger"]["spent"]["epsilon"] == 1.0
    assert [r["as"] for r in s["ledger"]["settled_killed_runs"]] in (["committed"], ["aborted"])


def test_a_central_range_cannot_change_its_windows(tmp_path, histogram):
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    run_stream(str(out), histogram, spool=str(spool), window_seconds=2, poll_seconds=0.2,
               columns={"value": "value"}, duration=0.5, progress=False)
    with pytest.raises(StreamConfigError, match=r"--window 3: .* windows of 2s"):
        run_stream(str(out), histogram, spool=str(spool), window_seconds=3, poll_seconds=0.2,
                   columns={"value": "value"}, duration=0.5, progress=False)
