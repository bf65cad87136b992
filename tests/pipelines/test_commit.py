"""Commit or nothing, nothing spent twice (issue 13): outputs staged and committed together with
the manifest last; inputs never overwritten; --force; no temp or staging folder survives; a Dask
run that re-executes stages and loses a worker still sends each record's one report; a seeded run
says it is not private."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import read_jsonl, run_cli
from ldp_beam.pipelines.outputs import STAGING_PREFIX, verify

GRR = ("-m", "grr", "--epsilon", "1", "-p", "domain=a,b,c,d")


def _table(path, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({"v": rng.choice(list("abcd"), n), "region": rng.choice(["n", "s"], n),
                             "uid": np.arange(n)}), path)
    return path


def _snapshot(folder) -> dict:
    return {p: open(p, "rb").read() for p in sorted(glob.glob(os.path.join(folder, "*")))
            if os.path.isfile(p)}


def _no_staging(folder) -> bool:
    return not glob.glob(os.path.join(folder, STAGING_PREFIX + "*")) and \
        not glob.glob(os.path.join(folder, "**", "beam-temp-*"), recursive=True)


def test_output_equal_to_or_inside_an_input_is_refused(tmp_path):
    src = _table(tmp_path / "t.parquet")
    before = src.read_bytes()
    code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(src))
    assert code == 2 and "is an input" in se and src.read_bytes() == before
    d = tmp_path / "in"
    d.mkdir()
    _table(d / "part.parquet")
    code, _, se = run_cli("collect", "-i", str(d), "-c", "v", *GRR, "-o", str(d / "r.parquet"))
    assert code == 2 and "inside an input" in se and os.listdir(d) == ["part.parquet"]
    rep = tmp_path / "r.parquet"
    assert run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(rep))[0] == 0
    rep_bytes = rep.read_bytes()
    code, _, se = run_cli("estimate", "-i", str(rep), "-o", str(rep), "--force")
    assert code == 2 and "is an input" in se and rep.read_bytes() == rep_bytes


def test_existing_outputs_need_force_and_the_manifest_covers_the_files(tmp_path):
    src = _table(tmp_path / "t.parquet")
    out = tmp_path / "o" / "r.parquet"
    code, so, _ = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(out))
    assert code == 0
    man = json.loads((tmp_path / "o" / "r.parquet.manifest.json").read_text())
    assert man["run_id"] in so and set(man["files"]) == {"reports", "dead_letter"}
    assert verify(str(tmp_path / "o" / "r.parquet.manifest.json")) == []
    first = _snapshot(tmp_path / "o")
    code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(out))
    assert code == 2 and "--force" in se and _snapshot(tmp_path / "o") == first
    code, so, _ = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(out), "--force")
    assert code == 0
    man2 = json.loads((tmp_path / "o" / "r.parquet.manifest.json").read_text())
    assert man2["run_id"] != man["run_id"] and verify(str(out) + ".manifest.json") == []
    assert man2["files"]["reports"]["sha256"] != man["files"]["reports"]["sha256"]  # new noise
    assert _no_staging(tmp_path / "o")


def test_a_failed_rerun_leaves_the_previous_outputs_untouched(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    _table(d / "a.parquet")
    out = tmp_path / "o" / "r.parquet"
    assert run_cli("collect", "-i", str(d), "-c", "v", *GRR, "-o", str(out))[0] == 0
    before = _snapshot(tmp_path / "o")
    (d / "b.parquet").write_bytes(b"PAR1 not parquet")  # the re-run cannot read all its input
    code, _, se = run_cli("collect", "-i", str(d), "-c", "v", *GRR, "-o", str(out), "--force")
    assert code == 1 and "nothing was committed" in se
    assert _snapshot(tmp_path / "o") == before and _no_staging(tmp_path / "o")


def _big_input(path, n=3_000_000):
    rng = np.random.default_rng(1)
    pq.write_table(pa.table({"v": rng.choice(list("abcd"), n)}), path, row_group_size=100_000)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_killed_run_leaves_the_previous_outputs_and_no_staging(tmp_path, how):
    """Killed mid-run (kill -9 or a polite SIGTERM): the previous reports and manifest are
    untouched (never an old manifest beside new reports). SIGTERM cleans its staging folder; a
    kill -9 cannot, and the next run in that folder removes it."""
    src = tmp_path / "t.parquet"
    _big_input(src)
    out = tmp_path / "o" / "r.parquet"
    assert run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(out))[0] == 0
    before = _snapshot(tmp_path / "o")
    proc = subprocess.Popen([sys.executable, "-m", "ldp_beam.pipelines.cli", "collect", "-i",
                             str(src), "-c", "v", *GRR, "-o", str(out), "--force"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not glob.glob(str(tmp_path / "o" / STAGING_PREFIX / "*")) and \
            not glob.glob(str(tmp_path / "o" / (STAGING_PREFIX + "*"))):
        assert proc.poll() is None and time.time() < deadline, "the run ended before staging"
        time.sleep(0.05)
    # mid-run: the staging folder is made before the pipeline starts; on this machine the run
    # commits ~1.4 s later (its reports' part file appears at ~0.8 s), so 0.2 s is well inside
    time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed mid-run"
    proc.send_signal(getattr(signal, how))
    proc.wait(timeout=60)
    assert _snapshot(tmp_path / "o") == before
    staged = glob.glob(str(tmp_path / "o" / (STAGING_PREFIX + "*")))
    if how == "SIGTERM":
        assert staged == [] and proc.returncode != 0
        return
    assert len(staged) == 1  # kill -9 leaves it; the next run sweeps it
    assert run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o",
                   str(tmp_path / "o" / "other.parquet"))[0] == 0
    assert _no_staging(tmp_path / "o")


def test_no_temp_folder_survives_estimates_and_releases(tmp_path, monkeypatch):
    """Estimates and central releases gather nothing in /tmp (exact curator counts were left
    there) and leave no staging or beam-temp folder beside their outputs."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    src = _table(tmp_path / "t.parquet")
    out = tmp_path / "o"
    assert run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o", str(out / "r.parquet"))[0] == 0
    assert run_cli("estimate", "-i", str(out / "r.parquet"), "-o", str(out / "e.json"))[0] == 0
    code, _, se = run_cli("estimate", "-i", str(src), "-c", "v", "-m", "laplace-histogram",
                          "--epsilon", "1", "-p", "categories=a,b,c,d", "-o", str(out / "h.json"))
    assert code == 0, se
    assert _no_staging(out)
    assert not glob.glob(str(scratch / "ldp-beam-*"))
    for name in ("e.json", "h.json"):
        assert verify(str(out / (name + ".manifest.json"))) == []


def test_seeded_runs_say_not_private_everywhere(tmp_path):
    src = _table(tmp_path / "t.parquet")
    rep = tmp_path / "r.parquet"
    code, so, _ = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "--seed", "42",
                          "-o", str(rep))
    assert code == 0 and "seeded" in so and "not private" in so
    meta = json.loads(pq.read_schema(rep).metadata[b"ldp_beam"])
    assert meta["seeded"] is True and "not private" in meta["guarantee"]["summary"]
    code, so, _ = run_cli("estimate", "-i", str(rep), "-o", str(tmp_path / "e.json"))
    est = json.loads((tmp_path / "e.json").read_text())
    assert code == 0 and "not private" in so
    assert "seeded" in est["estimate"]["guarantee"]["summary"]
    assert "not private" in est["estimate"]["guarantee"]["summary"]
    code, so, _ = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "-o",
                          str(tmp_path / "u.parquet"))
    assert code == 0 and "not private" not in so and "LDP with epsilon=1" in so
    code, so, _ = run_cli("estimate", "-i", str(src), "-c", "v", "-m", "laplace-histogram",
                          "--epsilon", "1", "-p", "categories=a,b,c,d", "--seed", "3",
                          "-o", str(tmp_path / "h.json"))
    assert code == 0 and "not private" in so


def test_keep_needs_a_public_declaration_and_never_takes_an_input(tmp_path):
    src = _table(tmp_path / "t.parquet")
    rep = tmp_path / "r.parquet"
    code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "--keep", "region",
                          "-o", str(rep))
    assert code == 2 and "--public region" in se and not rep.exists()
    code, _, se = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "--keep", "v",
                          "--public", "v", "-o", str(rep))
    assert code == 2 and "input of grr's role 'value'" in se and not rep.exists()
    code, so, _ = run_cli("collect", "-i", str(src), "-c", "v", *GRR, "--keep", "region",
                          "--public", "region", "-o", str(rep))
    assert code == 0 and "region" in so
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    assert man["public_columns"] == ["region"] and "region" in man["guarantee"]["summary"]
    assert pq.read_schema(rep).names == ["v", "region"]


def test_dead_letters_show_the_input_columns_with_file_and_row(tmp_path):
    t = pa.table({"v": ["a", "zz", "b"], "uid": [1, 2, 3], "salary": [9, 8, 7]})
    pq.write_table(t, tmp_path / "t.parquet")
    out = tmp_path / "r.parquet"
    assert run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR,
                   "-o", str(out))[0] == 0
    (dead,) = read_jsonl(str(out) + ".deadletter.jsonl")
    assert dead["record"] == {"v": "zz"} and dead["row"] == 1
    assert dead["source"].endswith("t.parquet")
    assert run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR, "-o", str(out),
                   "--force", "--dead-letter-all-columns")[0] == 0
    (dead,) = read_jsonl(str(out) + ".deadletter.jsonl")
    assert dead["record"] == {"v": "zz", "uid": 2, "salary": 8}


# --------------------------------------------------------------------------- Dask re-execution
def _dofns():
    """DoFns defined in a function, so they are pickled by value for the Dask workers (this test
    module is not importable there)."""

    class KillOnce(beam.DoFn):
        """Kills its worker process the first time it runs (a worker lost mid-run)."""

        def __init__(self, marker: str) -> None:
            self.marker = marker

        def process(self, x):
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                yield x
                return
            os.close(fd)
            os._exit(1)

    class LogBatch(beam.DoFn):
        def __init__(self, path: str) -> None:
            self.path = path

        def process(self, b):
            with open(self.path, "a") as fh:
                fh.write(f"{b.offset}\n")
            yield b

    def values(b):
        return json.dumps(b.column(0).to_pylist())

    return KillOnce, LogBatch, values


def test_dask_reexecution_and_a_killed_worker_send_one_report_per_record(tmp_path):
    """Beam's Dask runner re-executes the perturbation for each consumer and reschedules the
    work of a dead worker; with noise keyed by the run's secret and the record, every copy of a
    record's report is identical, so nobody's budget is spent twice (before, two consumers got
    independent draws: 29% of pairs agreed)."""
    from ldp_beam.pipelines.common import run_pipeline
    from ldp_beam.registry import build_mechanism
    from ldp_beam.transforms import Perturb, ReadTable

    rng = np.random.default_rng(0)
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"value": rng.integers(0, 8, 100_000).astype(str)}), src,
                   row_group_size=20_000)
    mech = build_mechanism("grr", epsilon=1.0, domain=[str(i) for i in range(8)])
    log, marker = str(tmp_path / "log.txt"), str(tmp_path / "killed")
    KillOnce, LogBatch, values = _dofns()

    def build(p):
        rd = p | ReadTable(str(src), batch_rows=20_000)
        out = rd.batches | beam.ParDo(LogBatch(log)) | Perturb(mech)  # unseeded: a secret key
        a = (out.reports | "A" >> beam.Map(values) | "Kill" >> beam.ParDo(KillOnce(marker))
             | "WA" >> beam.io.WriteToText(str(tmp_path / "a"), shard_name_template=""))
        b = (out.reports | "B" >> beam.Map(values)
             | "WB" >> beam.io.WriteToText(str(tmp_path / "b"), shard_name_template=""))
        return [a, b]

    run_pipeline(build, ["--runner=dask", "--dask_workers=2"])
    assert os.path.exists(marker)  # a worker died mid-run
    executions = len(open(log).read().split())
    assert executions > 5  # 5 batches, perturbed more than once each: re-execution happened
    a = sorted((tmp_path / "a").read_text().split("\n"))
    b = sorted((tmp_path / "b").read_text().split("\n"))
    assert len([x for x in a if x]) == 5 and a == b


def test_a_reexecuted_central_release_is_bit_identical(tmp_path):
    """The release's noise is a function of the run's secret and the accumulator: executing the
    release again (a retry, a re-run of the same run) publishes the same numbers."""
    from ldp_beam.pipelines.estimate import run_estimate
    from ldp_beam.registry import build_mechanism
    from ldp_beam.rng import RunKey

    src = _table(tmp_path / "t.parquet")
    # 16 cells (12 of them empty): two independent discrete Laplace draws of scale 1/epsilon = 1
    # agree in a cell with probability sum_k p(k)^2 = 0.280 (less at a larger scale), so in all
    # 16 with at most 0.280^16 = 1.5e-9 (with the 4 data cells alone it was 0.6%, and the
    # "fresh noise" check below failed once in CI)
    mech = build_mechanism("laplace-histogram", epsilon=1.0, categories=list("abcdefghijklmnop"))
    key = RunKey.new()
    # two ledgers: the pipeline itself runs twice under one run key (not a re-published copy)
    one = run_estimate(str(src), str(tmp_path / "1.json"), mech, columns={"value": "v"},
                       run_key=key, ledger=str(tmp_path / "l1.db"))
    two = run_estimate(str(src), str(tmp_path / "2.json"), mech, columns={"value": "v"},
                       run_key=key, ledger=str(tmp_path / "l2.db"))
    assert one["estimate"] == two["estimate"] and not one["seeded"]
    other = run_estimate(str(src), str(tmp_path / "3.json"), mech, columns={"value": "v"},
                         ledger=str(tmp_path / "another-ledger.db"))
    assert other["estimate"] != one["estimate"]  # another run, unrecorded here: fresh noise


def test_no_finite_guarantee_needs_the_opt_in_and_says_so(tmp_path):
    """RVNS with delta <= d has no finite epsilon: refused (exit 2, nothing written) unless
    --allow-no-guarantee, and then the CLI, the manifest and the estimate all say so."""
    pq.write_table(pa.table({"x": np.linspace(0, 100, 500)}), tmp_path / "t.parquet")
    args = ("collect", "-i", str(tmp_path / "t.parquet"), "-c", "x", "-m", "rvns", "-p",
            "lower=0", "-p", "upper=100", "-p", "d=20", "-p", "delta=10",
            "-o", str(tmp_path / "r.parquet"))
    code, _, se = run_cli(*args)
    assert code == 2 and "--allow-no-guarantee" in se and "delta" in se
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]
    code, so, _ = run_cli(*args, "--allow-no-guarantee")
    assert code == 0 and "no finite guarantee" in so
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    assert man["guarantee"]["summary"].startswith("no finite guarantee")
    code, so, _ = run_cli("estimate", "-i", str(tmp_path / "r.parquet"), "-o",
                          str(tmp_path / "e.json"))
    assert code == 0 and "no finite guarantee" in so
    est = json.loads((tmp_path / "e.json").read_text())
    assert est["estimate"]["guarantee"]["summary"].startswith("no finite guarantee")


def test_a_commit_whose_table_cannot_be_written_leaves_the_previous_run(tmp_path):
    """A table output that cannot be written at commit (a staged table that cannot be read; the
    DuckDB file's path became a folder) stops the commit; the previous files and manifest are
    as they were and the staging folder is removed."""
    pytest.importorskip("duckdb")
    from ldp_beam.pipelines.outputs import OutputError, RunOutputs
    from ldp_beam.transforms import SourceError
    from ldp_beam.transforms.sinks import tidy_bytes

    dead, man = tmp_path / "x.deadletter.jsonl", tmp_path / "x.manifest.json"
    outs = RunOutputs({"dead_letter": str(dead)}, str(man), "run-1")
    with outs:
        outs.write(outs.staged("dead_letter"), b'{"old": 1}\n')
        outs.commit({"command": "test"})
    assert json.loads(man.read_text())["run_id"] == "run-1" and verify(str(man)) == []
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database" * 200)
    url = f"duckdb://{junk}?table=t"
    with pytest.raises(SourceError, match="junk.duckdb"):  # checked before anything runs
        RunOutputs({"estimate": url, "dead_letter": str(dead)}, str(man), "run-2", force=True)
    db = tmp_path / "ok.duckdb"
    url = f"duckdb://{db}?table=t"
    tidy = tidy_bytes([{"statistic": "mean", "value": 0.5}], "parquet")
    # a staged table that cannot be read: the commit stops before touching anything
    outs = RunOutputs({"estimate": url, "dead_letter": str(dead)}, str(man), "run-3", force=True)
    with outs:
        outs.write(outs.staged("dead_letter"), b'{"new": 1}\n')
        outs.write(outs.staged("estimate"), b"PAR1 not parquet")
        with pytest.raises(Exception):
            outs.commit({"command": "test"})
    assert json.loads(man.read_text())["run_id"] == "run-1" and verify(str(man)) == []
    # the database cannot be written at commit (its path became a folder)
    outs = RunOutputs({"estimate": url, "dead_letter": str(dead)}, str(man), "run-4", force=True)
    with outs:
        outs.write(outs.staged("dead_letter"), b'{"new": 1}\n')
        outs.write(outs.staged("estimate"), tidy)
        db.mkdir()
        with pytest.raises(OutputError, match="ok.duckdb"):
            outs.commit({"command": "test"})
    assert json.loads(man.read_text())["run_id"] == "run-1" and verify(str(man)) == []
    assert dead.read_bytes() == b'{"old": 1}\n'
    assert _no_staging(tmp_path)
    with pytest.raises(OutputError, match="not a database table"):
        RunOutputs({"dead_letter": str(dead)}, url, "run-5", force=True)
