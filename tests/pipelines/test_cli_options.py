"""The command line's options (issue 15): a misspelled option is an error naming the closest
valid one, never passed on to Beam and ignored; Beam's own options still pass; --version works;
output piped into a reader that stops early ends quietly."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import run_cli

GRR = ("-m", "grr", "--epsilon", "1", "-p", "domain=a,b")


@pytest.mark.parametrize("typo, meant", [("--kep=region", "--keep"), ("--sed=4", "--seed"),
                                         ("--dask_worker=4", "--dask_workers"),
                                         ("--runer=dask", "--runner")])
def test_a_misspelled_option_names_the_closest(tmp_path, typo, meant):
    pq.write_table(pa.table({"v": ["a", "b"]}), tmp_path / "t.parquet")
    code, _, se = run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR,
                          typo, "-o", str(tmp_path / "r.parquet"))
    assert code == 2 and f"did you mean {meant}?" in se, se
    assert not (tmp_path / "r.parquet").exists()


def test_beam_options_still_pass(tmp_path):
    pq.write_table(pa.table({"v": np.array(["a", "b"] * 50)}), tmp_path / "t.parquet")
    code, _, se = run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR,
                          "--direct_num_workers=1", "--runner=DirectRunner",
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 0, se


def test_version():
    out = subprocess.run([sys.executable, "-m", "ldp_beam.pipelines.cli", "--version"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("ldp-beam ")


def test_output_piped_to_head_ends_quietly():
    """The reader goes away before the command writes (as `| head` does once it has its lines):
    no BrokenPipeError traceback, the shell's 141 for SIGPIPE."""
    proc = subprocess.Popen([sys.executable, "-m", "ldp_beam.pipelines.cli", "list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # long before the interpreter has started and printed anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert "BrokenPipeError" not in err and "Traceback" not in err, err
