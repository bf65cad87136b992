"""Issue 23: a run stopped by SIGINT or SIGTERM ends with one line and exit 130/143 after
cleaning up (no staging folder, the ledger entry aborted, the previous outputs untouched); a
failure of ours inside a Beam bundle (a size cap) is reported in one line, without Beam's ERROR
traceback before it."""
from __future__ import annotations

import glob
import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

ROWS = 3_000_000  # a CSV that takes seconds to read here, so the signal lands mid-run


@pytest.fixture(scope="module")
def big_csv(tmp_path_factory):
    d = tmp_path_factory.mktemp("signals")
    rng = np.random.default_rng(3)
    path = d / "in.csv"
    pacsv.write_csv(pa.table({"age": rng.integers(18, 90, ROWS).astype(float),
                              "uid": rng.integers(0, 200_000, ROWS)}), str(path))
    return path


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ldp_beam.pipelines.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_a_run_cleanly(big_csv, tmp_path, sig, code):
    out = tmp_path / "reports.parquet"
    out.write_bytes(b"previous reports")  # a previous output: must stay as it was
    led = tmp_path / "ledger.db"
    proc = _cli("collect", "-i", str(big_csv), "-c", "age", "-m", "bisample",
                "-p", "epsilon=1", "-p", "lower=0", "-p", "upper=100", "-o", str(out),
                "--force", "--privacy-unit", "uid", "--ledger", f"sqlite:///{led}")
    deadline = time.monotonic() + 120
    while not glob.glob(str(tmp_path / ".ldp-beam-staging-*")):  # reserved, pipeline starting
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(sig)
    so, se = proc.communicate(timeout=120)
    assert proc.returncode == code, se
    lines = [ln for ln in se.splitlines() if ln.strip()]
    assert len(lines) == 1, se  # one line, no traceback, no Beam ERROR log
    assert signal.Signals(sig).name in lines[0] and "nothing was committed" in lines[0]
    assert "Traceback" not in se
    assert out.read_bytes() == b"previous reports"
    assert not glob.glob(str(tmp_path / ".ldp-beam-staging-*"))
    assert not os.path.exists(str(out) + ".manifest.json")
    rows = sqlite3.connect(led).execute("SELECT status, note FROM ldp_beam_entries").fetchall()
    assert len(rows) == 1 and rows[0][0] == "aborted", rows
    assert signal.Signals(sig).name in rows[0][1]


def test_a_size_cap_inside_a_bundle_is_one_line(tmp_path):
    """The units cap fails inside the bounding step (a LimitError raised in a Beam bundle):
    Beam used to log it at ERROR with a traceback before the clean message."""
    rng = np.random.default_rng(4)
    src = tmp_path / "in.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"age": rng.integers(18, 90, 5000).astype(float),
                             "uid": np.arange(5000)}), str(src))
    proc = _cli("collect", "-i", str(src), "-c", "age", "-m", "bisample", "-p", "epsilon=1",
                "-p", "lower=0", "-p", "upper=100", "-o", str(tmp_path / "r.parquet"),
                "--privacy-unit", "uid", "--ledger", f"sqlite:///{tmp_path / 'l.db'}",
                env={**os.environ, "LDP_BEAM_MAX_UNITS": "100"})
    so, se = proc.communicate(timeout=300)
    assert proc.returncode == 2, se
    lines = [ln for ln in se.splitlines() if ln.strip()]
    assert len(lines) == 1 and "LDP_BEAM_MAX_UNITS" in lines[0], se
    assert "Traceback" not in se and "ERROR" not in se
    status = sqlite3.connect(tmp_path / "l.db").execute(
        "SELECT status FROM ldp_beam_entries").fetchall()
    assert status == [("aborted",)]
