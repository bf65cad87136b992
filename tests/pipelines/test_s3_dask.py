"""Run outputs on an object store from the Dask runner (issue 15): `collect -o s3://...` and
`estimate -o s3://...` on a Dask cluster whose two workers are separate processes, each started
in its own private working directory with its own TMPDIR and Dask local directory (as workers on
other machines would be: nothing of the launcher's disk is theirs), against moto's standalone S3
server. With a seed, the committed objects and the manifest are the DirectRunner's: the same
reports, the same dead letters, the same counts, the same estimate, and no staging or Beam temp
object is left in the bucket."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam.pipelines.bench_sources import stop_processes
from ldp_beam_test_helpers import aws_env_only, run_cli, s3_bucket, s3_get, s3_keys

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")
distributed = pytest.importorskip("distributed")

MECH = ("-m", "bisample", "--epsilon", "1", "-p", "lower=0", "-p", "upper=100")


@pytest.fixture(scope="module")
def aws_env(s3_server, tmp_path_factory):
    """Credentials from the environment only (the launcher's and the workers')."""
    with pytest.MonkeyPatch.context() as mp:
        yield aws_env_only(mp, tmp_path_factory.mktemp("aws"), AWS_ENDPOINT_URL_S3=s3_server)


@pytest.fixture(scope="module")
def private_dask(aws_env, tmp_path_factory):
    """A scheduler here and two `dask worker` processes, each with its own working directory,
    TMPDIR and local directory (none of them the launcher's)."""
    cluster = distributed.LocalCluster(n_workers=0, processes=True,
                                       dashboard_address="127.0.0.1:0")
    procs: list[subprocess.Popen] = []
    dirs = []
    try:
        for i in range(2):
            home = tmp_path_factory.mktemp(f"dask-worker-{i}")
            (home / "tmp").mkdir()
            dirs.append(home)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
            env.update(aws_env, TMPDIR=str(home / "tmp"))
            env.pop("LDP_BEAM_LEDGER", None)  # the launcher's ledger is not the workers'
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address,
                 "--nworkers", "1", "--nthreads", "1", "--no-dashboard", "--name", f"w{i}",
                 "--local-directory", str(home / "dask")],
                cwd=home, env=env, stdout=open(home / "worker.log", "wb"),
                stderr=subprocess.STDOUT))
        with distributed.Client(cluster.scheduler_address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        yield [f"--dask_client_address={cluster.scheduler_address}", "--runner=dask"], dirs
    finally:
        stop_processes(procs, wait=20)
        cluster.close()


@pytest.fixture
def bucket(s3_server, aws_env):
    yield from s3_bucket(s3_server)


_keys, _get = s3_keys, s3_get


def _comparable(man: dict, label: str) -> dict:
    """A manifest without what differs between two runs by construction: their own paths (the
    prefix), run ids, times, runner and Beam arguments."""
    text = json.dumps(man, sort_keys=True).replace(f"/{label}/", "/RUN/")
    out = json.loads(text)
    for k in ("run_id", "created", "started", "finished", "seconds", "beam_args", "runner",
              "argv", "command_line", "host", "pid", "ledger", "runs", "verification"):
        out.pop(k, None)
    reports = out.get("files", {}).get("reports")
    if reports:  # the reports' metadata names their run (estimate ties them to the manifest)
        reports.pop("bytes", None)
        reports.pop("sha256", None)
    return out


def test_collect_and_estimate_on_dask_commit_what_the_direct_runner_commits(
        bucket, private_dask, tmp_path):
    client, name, opts = bucket
    dask_args, worker_dirs = private_dask
    rng = np.random.default_rng(3)
    n = 6000
    x = rng.uniform(0.0, 100.0, n)
    x[:5] = [np.nan, 150.0, -1.0, np.inf, 101.0]  # dead letters
    for part, sl in (("a", slice(0, 3500)), ("b", slice(3500, n))):
        buf = io.BytesIO()
        pq.write_table(pa.table({"uid": np.arange(n)[sl], "x": x[sl],
                                 "g": rng.choice(["n", "s"], n)[sl]}), buf, row_group_size=900)
        client.put_object(Bucket=name, Key=f"in/{part}.parquet", Body=buf.getvalue())
    src = f"s3://{name}/in/"
    committed = {}
    for label, runner in (("direct", ["--runner=DirectRunner"]), ("dask", dask_args)):
        out = f"s3://{name}/{label}/r.parquet"
        code, so, se = run_cli("collect", "-i", src, "-c", "x", *MECH, "--seed", "17",
                               "--keep", "uid", "--keep", "g", "--public", "uid",
                               "--public", "g", "-o", out, *opts, *runner)
        assert code == 0, se
        code, so, se = run_cli("estimate", "-i", out, "-o", f"s3://{name}/{label}/e.json",
                               *opts, *runner)
        assert code == 0, se
        committed[label] = {k.split("/", 1)[1]: _get(client, name, k)
                            for k in _keys(client, name, f"{label}/")}
    direct, dask = committed["direct"], committed["dask"]
    assert sorted(dask) == sorted(direct) == [
        "e.json", "e.json.deadletter.jsonl", "e.json.manifest.json", "r.parquet",
        "r.parquet.deadletter.jsonl", "r.parquet.manifest.json"]
    # the same reports, row for row (the order of the rows in the file may differ)
    ref = pq.read_table(io.BytesIO(direct["r.parquet"])).sort_by("uid")
    got = pq.read_table(io.BytesIO(dask["r.parquet"])).sort_by("uid")
    assert ref.num_rows == n - 5 and got.equals(ref)
    assert sorted(dask["r.parquet.deadletter.jsonl"].splitlines()) == \
        sorted(direct["r.parquet.deadletter.jsonl"].splitlines())
    assert len(direct["r.parquet.deadletter.jsonl"].splitlines()) == 5
    # the collect manifest whole (the reports' bytes included); the estimate's, but for the
    # estimate file's own digest (the file names its run)
    a = _comparable(json.loads(direct["r.parquet.manifest.json"]), "direct")
    assert _comparable(json.loads(dask["r.parquet.manifest.json"]), "dask") == a
    a = _comparable(json.loads(direct["e.json.manifest.json"]), "direct")
    b = _comparable(json.loads(dask["e.json.manifest.json"]), "dask")
    for m in (a, b):
        assert set(m["files"]["estimate"]) == {"path", "bytes", "sha256"}
        del m["files"]["estimate"]["bytes"], m["files"]["estimate"]["sha256"]
    assert b == a
    ea, eb = json.loads(direct["e.json"]), json.loads(dask["e.json"])
    assert ea["estimate"] == eb["estimate"]
    assert {k: v for k, v in ea["reports"].items() if k != "dead_letter"} == \
        {k: v for k, v in eb["reports"].items() if k != "dead_letter"}  # (its own path)
    assert ea["reports"]["reconciles"] is True
    assert ea["estimate"]["n_reports"] == n - 5
    rec = json.loads(direct["r.parquet.manifest.json"])["records"]
    assert rec["reconciles"] is True and rec["input"] == n and rec["reported"] == n - 5
    keys = _keys(client, name)
    assert not [k for k in keys if ".ldp-beam-staging-" in k or "beam-temp" in k], keys
    # the workers did the work, in their own directories: nothing of the run was left there
    for home in worker_dirs:
        assert not [p for p in (home / "tmp").rglob("*") if p.is_file()], home
