"""The portable path, as Flink, Spark and Dataflow run a pipeline: the launcher submits it to a job
service (Beam's own Python one here, ``local_job_service_main``) over gRPC, and an external worker
pool (``worker_pool_main``) in separate processes runs the code. Also a Dask cluster whose worker
processes each have a private working directory, temp directory and ``--local-directory`` (and,
run as root, a private ``/tmp`` of their own in a mount namespace: separate hosts simulated on one
machine). With a seed, reports, estimates and every count equal the DirectRunner's.

Inputs and outputs live in a directory outside ``/tmp`` standing for the shared storage (an object
store or a network file system) that real workers on other hosts write to; nothing a worker
writes to its own temp directory may be needed by the launcher."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam import build_mechanism
from ldp_beam.pipelines.collect import run_collect
from ldp_beam.pipelines.bench_sources import _tail, _wait_for_port, stop_processes  # the bench's own service start-up
from ldp_beam.pipelines.common import worker_pool_env
from ldp_beam.pipelines.estimate import run_estimate

STARTUP_SECONDS = 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _under_tmp(path: str) -> bool:
    return os.path.realpath(path).startswith("/tmp/")


def _can_unshare() -> bool:
    """Can a process get a private /tmp of its own (root, and mount namespaces allowed)? Not
    when the code it must import lives under /tmp (a checkout or a venv there): a private /tmp
    would hide it; the workers then get private directories without a mount namespace."""
    import ldp_beam

    if any(_under_tmp(p) for p in (ldp_beam.__file__, sys.prefix, sys.executable, __file__)):
        return False
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs tmpfs /tmp"], capture_output=True, timeout=30)
    return r.returncode == 0


PRIVATE_TMP = _can_unshare()


def _private_host(cmd: list[str], home: str) -> list[str]:
    """``cmd`` as if on another host: in its own mount namespace with a private, empty /tmp
    (when allowed), its temp directory and working directory ``home`` created there."""
    if not PRIVATE_TMP:
        return cmd
    script = ('mount -t tmpfs tmpfs /tmp && mkdir -p "$0" && cd "$0" && exec "$@"')
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", script, home, *cmd]


@contextlib.contextmanager
def _processes():
    """Started processes, terminated (then killed) on the way out, whatever happened."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        stop_processes(procs)


@pytest.fixture(scope="module")
def shared():
    """Shared storage: outside /tmp, so a worker with a private /tmp still sees it."""
    d = tempfile.mkdtemp(prefix="ldp-beam-portable-", dir="/var/tmp" if os.path.isdir(
        "/var/tmp") else None)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="module")
def portable_args(logs, shared):
    """Beam's Python job service and an external worker pool, each its own process (the pool on
    a private /tmp when allowed); the PortableRunner options that submit to them."""
    job_port, pool_port = _free_port(), _free_port()
    with _processes() as procs:
        job_log, pool_log = str(logs / "job.log"), str(logs / "pool.log")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
             f"--port={job_port}"], stdout=open(job_log, "w"), stderr=subprocess.STDOUT))
        home = "/tmp/pool-home"
        env = {**os.environ, "TMPDIR": home} if PRIVATE_TMP else os.environ
        # the pool starts each worker as PATH's `python`: make it this interpreter (issue 23)
        env = worker_pool_env(os.path.join(shared, "pool-bin"), env)
        procs.append(subprocess.Popen(
            _private_host([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                           f"--service_port={pool_port}"], home),
            stdout=open(pool_log, "w"), stderr=subprocess.STDOUT, env=env))
        _wait_for_port(job_port, procs[0], "the Beam job service", job_log)
        _wait_for_port(pool_port, procs[1], "the Beam worker pool", pool_log)
        args = ["--runner=PortableRunner", f"--job_endpoint=localhost:{job_port}",
                "--environment_type=EXTERNAL", f"--environment_config=localhost:{pool_port}"]
        _check_runs_elsewhere(args, shared)
        yield args


def _check_runs_elsewhere(args, shared):
    """The code runs in the pool's processes, not the launcher's, and (when allowed) does not
    see the launcher's /tmp."""
    import apache_beam as beam

    from ldp_beam.pipelines.common import run_pipeline

    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="launcher-only-") as marker:
        seen = os.path.join(shared, "seen")  # written by the pool
        run_pipeline(lambda p: [p | beam.Create([marker.name]) | beam.Map(
            lambda m: f"{os.getpid()} {os.path.exists(m)}") | beam.io.WriteToText(
                seen, shard_name_template="")], args)
        pid, exists = open(seen).read().split()
    assert int(pid) != os.getpid()
    assert exists == str(not PRIVATE_TMP)


@pytest.fixture(scope="module")
def dask_args(logs, shared):
    """A Dask scheduler and two single-threaded worker processes started as separate commands,
    each with its own working directory, TMPDIR and --local-directory (on a private /tmp of its
    own when allowed)."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=0, processes=True,
                                       dashboard_address="127.0.0.1:0")
    try:
        with _processes() as procs:
            for i in range(2):
                home = (f"/tmp/dask-worker-{i}" if PRIVATE_TMP
                        else os.path.join(shared, f"dask-worker-{i}"))
                if not PRIVATE_TMP:  # (in its own namespace, the worker's script makes it)
                    os.makedirs(home, exist_ok=True)
                log = str(logs / f"dask-worker-{i}.log")
                cmd = [sys.executable, "-m", "distributed.cli.dask_worker",
                       cluster.scheduler_address, "--nworkers=1", "--nthreads=1",
                       "--no-dashboard", f"--local-directory={home}/dask",
                       f"--name=private-{i}"]
                procs.append(subprocess.Popen(
                    _private_host(cmd, home), cwd=None if PRIVATE_TMP else home, env={**os.environ, "TMPDIR": home},
                    stdout=open(log, "w"), stderr=subprocess.STDOUT))
            with distributed.Client(cluster.scheduler_address) as client:
                try:
                    client.wait_for_workers(2, timeout=STARTUP_SECONDS)
                except Exception as exc:
                    raise RuntimeError("the Dask workers did not start: " + " | ".join(
                        _tail(str(logs / f"dask-worker-{i}.log")) for i in range(2))) from exc
                where = client.run(lambda: (os.getcwd(), tempfile.gettempdir()))
            assert len({w for w in where.values()}) == 2, where  # private to each worker
            yield ["--runner=dask", f"--dask_client_address={cluster.scheduler_address}"]
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def table_dir(shared):
    """Two small Parquet files of several row groups, a few bad rows."""
    d = os.path.join(shared, "table")
    os.makedirs(d)
    rng = np.random.default_rng(5)
    for part, n in (("a", 1500), ("b", 900)):
        x = rng.gamma(3.0, 10.0, n)
        x[:2] = [np.nan, 500.0]
        emp = rng.choice(["employed", "retired", "unemployed"], n)
        pq.write_table(pa.table({"uid": np.arange(n) + (0 if part == "a" else 10**6), "x": x,
                                 "emp": emp}),
                       os.path.join(d, f"{part}.parquet"), row_group_size=400)
    return d


FAMILIES = {
    "bisample-md": (dict(epsilon=1.0, lower=0.0, upper=100.0), {"value": "x"}),
    "grr": (dict(epsilon=1.0, domain=("employed", "retired", "unemployed")), {"value": "emp"}),
}


def _collect_and_estimate(name, table_dir, out, args, ledger):
    params, cols = FAMILIES[name]
    mech = build_mechanism(name, **params)
    rep = os.path.join(out, "r.parquet")
    # uid is kept only to align the runners' reports row by row (declared public for the test)
    man = run_collect(table_dir, rep, mech, cols, keep=("uid",), public=("uid",), seed=11,
                      batch_rows=300, beam_args=args, ledger=ledger, force=True)
    est = run_estimate(rep, os.path.join(out, "e.json"), beam_args=args, ledger=ledger,
                       force=True)
    return pq.read_table(rep).sort_by("uid"), man, est


def _same_as_direct(name, table_dir, shared, tmp_path, label, args):
    results, seconds = {}, {}
    for run, run_args in (("direct", []), (label, args)):
        out = os.path.join(shared, f"{name}-{label}-{run}")
        t0 = time.perf_counter()
        results[run] = _collect_and_estimate(name, table_dir, out, run_args,
                                             str(tmp_path / f"{run}.db"))
        seconds[run] = time.perf_counter() - t0
    ref_reports, ref_man, ref_est = results["direct"]
    reports, man, est = results[label]
    assert ref_man["records"]["reconciles"] and ref_man["records"]["counted_from"] == "data"
    assert reports.num_rows == ref_reports.num_rows > 0
    assert reports.equals(ref_reports)
    assert man["records"]["reconciles"], man["records"]
    assert man["records"] == ref_man["records"]  # every count
    assert est["estimate"] == ref_est["estimate"]
    assert {k: v for k, v in est["reports"].items() if k != "dead_letter"} == \
        {k: v for k, v in ref_est["reports"].items() if k != "dead_letter"}
    print(f"\n{name}: DirectRunner {seconds['direct']:.1f} s, {label} {seconds[label]:.1f} s")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_portable_runner_with_external_worker_pool(name, table_dir, shared, tmp_path,
                                                   portable_args):
    _same_as_direct(name, table_dir, shared, tmp_path, "portable", portable_args)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_dask_workers_with_private_directories(name, table_dir, shared, tmp_path, dask_args):
    _same_as_direct(name, table_dir, shared, tmp_path, "dask", dask_args)


T0 = 1_700_000_000  # a multiple of the window length


def _stream_once(mech, records, root, args):
    """A bounded (``--once``) stream over a spool of one file: (estimates, summary)."""
    import json

    from ldp_beam.pipelines.stream import run_stream

    spool, out = os.path.join(root, "spool"), os.path.join(root, "out")
    os.makedirs(spool)
    with open(os.path.join(spool, ".a.jsonl.tmp"), "w") as fh:
        for i, r in enumerate(records):
            fh.write(json.dumps({**r, "ts": T0 + (1 if i < 35 else 25)}) + "\n")
        fh.write("{not json\n")
    os.rename(os.path.join(spool, ".a.jsonl.tmp"), os.path.join(spool, "a.jsonl"))
    s = run_stream(out, mech, spool=spool, window_seconds=20, once=True, progress=False,
                   beam_args=args)
    assert os.listdir(os.path.join(spool, ".done")) == ["a.jsonl"]
    with open(os.path.join(out, "estimates.jsonl")) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return sorted(({k: v for k, v in r.items() if k != "run"} for r in rows),
                  key=lambda r: r["window_start_epoch"]), s


def test_stream_once_on_the_portable_runner(shared, portable_args):
    mech = build_mechanism("bisample-md", epsilon=2.0, lower=0, upper=100)
    rep = mech.perturb({"value": np.random.default_rng(1).uniform(18, 90, 60)}, rng=1)
    records = [{"s": int(s), "b": int(b)} for s, b in zip(rep["s"], rep["b"])]
    ref_rows, ref = _stream_once(mech, records, os.path.join(shared, "stream-direct"), [])
    rows, s = _stream_once(mech, records, os.path.join(shared, "stream-portable"), portable_args)
    assert [(r["window_start_epoch"], r["n_reports"]) for r in rows] == [(T0, 35), (T0 + 20, 25)]
    assert rows == ref_rows
    assert s["reconciles"] and s["records"] == ref["records"]
    assert s["records"]["lines"] == 61 and s["records"]["dead_lettered_at_source"] == 1


def test_worker_pool_env_runs_workers_on_this_interpreter(tmp_path):
    """Issue 23: Beam's worker pool starts each worker as PATH's `python`; with a PATH whose
    first `python` has no Beam (a venv not on PATH), the job hung 300 s and failed. The pool's
    environment puts this interpreter first, and the `python` it finds imports Beam."""
    bad = tmp_path / "bad-bin"
    bad.mkdir()
    (bad / "python").write_text("#!/bin/sh\necho 'No module named apache_beam' >&2\nexit 1\n")
    (bad / "python").chmod(0o755)
    base = {**os.environ, "PATH": f"{bad}{os.pathsep}{os.environ.get('PATH', '')}"}
    assert shutil.which("python", path=base["PATH"]) == str(bad / "python")
    env = worker_pool_env(str(tmp_path / "pool-bin"), base)
    assert shutil.which("python", path=env["PATH"]) == str(tmp_path / "pool-bin" / "python")
    out = subprocess.run(["python", "-c", "import apache_beam, sys; print(sys.prefix)"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == sys.prefix  # this environment's packages, not another's
    assert worker_pool_env(str(tmp_path / "pool-bin"), base) == env  # idempotent


def test_worker_pool_python_stays_in_a_virtual_environment(tmp_path, monkeypatch):
    """The pool's `python` was a link to ``sys.executable``; started through a link in another
    folder, a venv's interpreter does not see its ``pyvenv.cfg`` and runs as the base
    interpreter, without the venv's packages (the workers ran whatever the base Python had)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    venv_python = venv / "bin" / "python"
    monkeypatch.setattr(sys, "executable", str(venv_python))
    env = worker_pool_env(str(tmp_path / "pool-bin"))
    out = subprocess.run(["python", "-c", "import sys; print(sys.prefix)"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(venv)
