"""`ldp-beam demo --stream`: Google's Pub/Sub emulator, simulated devices and the collector, live.

The demo runs as the user runs it (a subprocess of the installed command line, ~35 s). Every
window it prints must hold as many estimated reports as the devices published in it, and each
answer's estimated share must lie within 4 of its printed standard errors of the true share:
the GRR estimate of a window of ~4,000 reports is close to normal, so with 4 windows x 4
answers a 4-sigma miss by chance has probability about 16 x 6.3e-5 = 0.001 per run. Skipped
only without Java or the emulator (.ci/run fails in that case); without them the demo says, in
one line, what to install.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ldp_beam.pipelines import demo_stream
from ldp_beam.pipelines.pubsub_emulator import unavailable

WINDOW = re.compile(r"^window (\S+)-(\S+) UTC: ([\d,]+) reports estimated, ([\d,]+) published$")
ROW = re.compile(r"^  (\w+) +([\d,]+) +([\d.]+) +(-?[\d.]+) \+/- ([\d.]+) +(-?[\d,]+)$")
TOTALS = re.compile(r"^  ([\d,]+) reports published by \d+ devices; ([\d,]+) landed \((\d+) "
                    r"duplicates, (\d+) dead-lettered\); ([\d,]+) estimated in (\d+) window\(s\);"
                    r" the collector's books reconcile: (\w+)$")


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def parse(out: str) -> tuple[list[dict], re.Match | None]:
    windows: list[dict] = []
    totals = None
    for line in out.splitlines():
        m = WINDOW.match(line)
        if m:
            windows.append({"start": m[1], "estimated": _num(m[3]), "published": _num(m[4]),
                            "rows": {}})
            continue
        m = ROW.match(line)
        if m and windows:
            windows[-1]["rows"][m[1]] = {"true": _num(m[2]), "share": float(m[3]),
                                         "estimate": float(m[4]), "se": float(m[5])}
            continue
        m = TOTALS.match(line)
        if m:
            totals = m
    return windows, totals


@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_demo_stream_prints_every_window_beside_the_truth(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ldp_beam.pipelines.cli", "demo", "--stream",
                        "--out", str(tmp_path / "out"), "--seed", "7"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    windows, totals = parse(r.stdout)
    assert len(windows) == demo_stream.WINDOWS, r.stdout
    assert "stopped before" not in r.stdout
    for win in windows:
        assert win["published"] > 0 and win["estimated"] == win["published"], win
        assert set(win["rows"]) == set(demo_stream.LABELS), win
        assert sum(row["true"] for row in win["rows"].values()) == win["published"]
        for label, row in win["rows"].items():
            assert row["se"] > 0
            assert abs(row["estimate"] - row["share"]) <= 4 * row["se"], (win["start"], label,
                                                                          row)
    # the estimates follow the shifting truth: each window's most common answer is found
    for k, win in enumerate(windows):
        shares = demo_stream.SHARES[k % len(demo_stream.SHARES)]
        top = demo_stream.LABELS[shares.index(max(shares))]
        assert max(win["rows"], key=lambda a: win["rows"][a]["estimate"]) == top
    assert totals is not None, r.stdout
    published, landed, dups, dead, estimated, n_windows, reconciles = totals.groups()
    assert _num(published) == _num(landed) == _num(estimated) == \
        sum(w["published"] for w in windows)
    assert (dups, dead, _num(n_windows), reconciles) == ("0", "0", demo_stream.WINDOWS, "True")
    assert (tmp_path / "out" / "estimates.jsonl").exists()


def test_demo_stream_without_java_says_what_to_install_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME",
                                                            "PUBSUB_EMULATOR_LAUNCHER")}
    env["PATH"] = str(tmp_path)  # no java on it
    r = subprocess.run([sys.executable, "-m", "ldp_beam.pipelines.cli", "demo", "--stream"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ldp-beam demo: error: demo --stream needs"), err
    assert "java is not installed" in err[0] and "apt-get install" in err[0]
