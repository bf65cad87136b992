"""gs:// inputs and outputs (issue 24) against gcp-storage-emulator (PyPI), started here in its
own process on a free loopback port, as the s3:// tests run against moto: `collect` reads a
gs:// Parquet file and a gs:// CSV folder through Beam's GCS FileSystem and commits its reports
into the bucket, with the same seeded reports as the same bytes read locally; `estimate` reads
those reports from the bucket and writes its estimates there, equal to the estimate of a local
copy; the ledger's fingerprint of a gs:// input (pyarrow's GCS client, sent to the emulator)
equals the local one; an unreachable or silent endpoint fails in one line within a bounded time,
and SIGTERM ends a process waiting on a remote read. The clients find the emulator through
``STORAGE_EMULATOR_HOST``, as Google's own clients do; nothing is mocked."""
from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import free_port, run_cli
from ldp_beam.pipelines.bench_sources import stop_processes

pytest.importorskip("gcp_storage_emulator", reason="the gs:// tests need gcp-storage-emulator "
                    "(pip install 'ldp-beam[test]')")
storage = pytest.importorskip("google.cloud.storage", reason="Beam's GCS FileSystem needs "
                              "google-cloud-storage (pip install 'ldp-beam[test]')")

GRR = ("-m", "grr", "--epsilon", "1", "-p", "domain=a,b,c,d")
START_TIMEOUT = 30.0  # the emulator answers in ~1 s here
HANG_GUARD = 90  # seconds: a subprocess still running then has hung (the bounds are ~15-30 s)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator's URL, with STORAGE_EMULATOR_HOST set for the module. Google's application
    default credentials point at a stub file with a long-lived token: with Beam's full GCP extra
    (google-auth-httplib2) Beam would otherwise retry finding credentials for ~25 s per process
    before it connects anonymously (the emulator ignores the token)."""
    d = tmp_path_factory.mktemp("gcs")
    adc = d / "adc.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "ldp-beam-test",
                               "client_secret": "test", "refresh_token": "test",
                               "token": "test-token", "expiry": "2999-01-01T00:00:00Z"}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(d / "emulator.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start",
                             "--host=127.0.0.1", f"--port={port}", "--in-memory", "--quiet"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(url + "/", timeout=1) as r:
                    if r.read() == b"OK":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"gcp-storage-emulator did not answer on {url} within "
                            f"{START_TIMEOUT} s: {(d / 'emulator.log').read_text()[-2000:]}")
            time.sleep(0.1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("STORAGE_EMULATOR_HOST", url)
            mp.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
            yield url
    finally:
        stop_processes([proc], wait=10)
        log.close()
        from apache_beam.io.filesystems import FileSystems
        from apache_beam.options.pipeline_options import PipelineOptions

        FileSystems.set_options(PipelineOptions([]))


@pytest.fixture
def bucket(gcs):
    client = storage.Client.create_anonymous_client()
    client.project = "ldp-beam-test"
    return client.create_bucket(f"b{time.time_ns()}")


def _objects(bucket, prefix="") -> list[str]:
    return sorted(b.name for b in bucket.client.list_blobs(bucket.name, prefix=prefix))


def _get(bucket, key) -> bytes:
    return bucket.blob(key).download_as_bytes()


def _put(bucket, key, body: bytes, local=None) -> str:
    bucket.blob(key).upload_from_string(body)
    if local is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(body)
    return f"gs://{bucket.name}/{key}"


def _table(n, seed, bad=0) -> pa.Table:
    rng = np.random.default_rng(seed)
    v = rng.choice(list("abcd"), n).astype(object)
    v[:bad] = "zz"  # not in the domain: dead-lettered
    return pa.table({"v": v, "g": rng.choice(["n", "s"], n)})


def _parquet(t: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(t, buf)
    return buf.getvalue()


def _csv(t: pa.Table) -> bytes:
    buf = io.BytesIO()
    pacsv.write_csv(t, buf)
    return buf.getvalue()


def _ledger_fingerprints() -> list[str]:
    from ldp_beam.ledger import Ledger

    with Ledger.open() as led:
        return [e["fingerprint"] for e in led.entries()]


def test_collect_then_estimate_through_the_bucket(bucket, tmp_path):
    """Parquet in, reports out, estimates out: all in the bucket; the seeded reports are those of
    the same bytes read locally (the reader keys records by file name and row, not location), so
    the estimates from them are equal too; the ledger fingerprinted the gs:// input through
    pyarrow (a hang here before: from_uri ignored STORAGE_EMULATOR_HOST)."""
    from ldp_beam.pipelines.datasets import dataset_identity
    from ldp_beam.pipelines.outputs import verify

    local = tmp_path / "local" / "t.parquet"
    src = _put(bucket, "in/t.parquet", _parquet(_table(1500, 0, bad=7)), local)
    out = f"gs://{bucket.name}/out/r.parquet"
    seeded = ("--seed", "7", "--keep", "g", "--public", "g")
    code, so, se = run_cli("collect", "-i", src, "-c", "v", *GRR, *seeded, "-o", out)
    assert code == 0, se
    assert _objects(bucket, "out/") == ["out/r.parquet", "out/r.parquet.deadletter.jsonl",
                                        "out/r.parquet.manifest.json"]
    man = json.loads(_get(bucket, "out/r.parquet.manifest.json"))
    assert man["output"] == out and man["records"]["input"] == 1500
    assert man["records"]["reconciles"] is True
    reports = pq.read_table(io.BytesIO(_get(bucket, "out/r.parquet")))
    dead = _get(bucket, "out/r.parquet.deadletter.jsonl").decode().splitlines()
    assert reports.num_rows == 1493 and len(dead) == 7
    assert verify(out + ".manifest.json", []) == []
    assert _ledger_fingerprints() == [dataset_identity(str(local))["fingerprint"]]

    code, _, se = run_cli("collect", "-i", str(local), "-c", "v", *GRR, *seeded,
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 0, se
    mine = pq.read_table(tmp_path / "r.parquet")
    cols = [c for c in reports.column_names if c != "run_id"]
    assert reports.select(cols).equals(mine.select(cols))

    # estimates of the reports in the bucket, into the bucket: the nested JSON and the tidy CSV
    for name, extra in (("e.json", ()), ("g.csv", ("--by", "g"))):
        code, _, se = run_cli("estimate", "-i", out, "-o", f"gs://{bucket.name}/est/{name}",
                              *extra)
        assert code == 0, se
        assert verify(f"gs://{bucket.name}/est/{name}.manifest.json", []) == []
        code, _, se = run_cli("estimate", "-i", str(tmp_path / "r.parquet"),
                              "-o", str(tmp_path / name), *extra)
        assert code == 0, se
    nested = json.loads(_get(bucket, "est/e.json"))["estimate"]
    assert nested["n_reports"] == 1493
    # the same reports give the same estimate (an LDP estimate adds no noise of its own)
    assert nested["statistics"] == json.loads((tmp_path / "e.json").read_text())[
        "estimate"]["statistics"]
    grouped = pacsv.read_csv(io.BytesIO(_get(bucket, "est/g.csv"))).drop_columns("run_id")
    assert grouped.equals(pacsv.read_csv(tmp_path / "g.csv").drop_columns("run_id"))
    assert sum({r["group"]: r["n_reports"] for r in grouped.to_pylist()}.values()) == 1493
    keys = _objects(bucket)
    assert not [k for k in keys if ".ldp-beam-staging-" in k or "beam-temp" in k], keys


def test_collect_reads_a_csv_folder(bucket, tmp_path):
    """A gs:// prefix of CSV files (hive partitions, a _SUCCESS marker skipped) read through
    Beam, fingerprinted through pyarrow as the local folder holding the same bytes is."""
    from ldp_beam.pipelines.datasets import dataset_identity

    local = tmp_path / "local"
    for day, seed in ((1, 1), (2, 2)):
        _put(bucket, f"in/day={day}/part-0.csv", _csv(_table(400, seed)),
             local / f"day={day}" / "part-0.csv")
    _put(bucket, "in/day=2/_SUCCESS", b"", local / "day=2" / "_SUCCESS")
    out = f"gs://{bucket.name}/out/r.parquet"
    code, so, se = run_cli("collect", "-i", f"gs://{bucket.name}/in/", "-c", "v", *GRR,
                           "--keep", "day", "--public", "day", "-o", out)
    assert code == 0, se
    reports = pq.read_table(io.BytesIO(_get(bucket, "out/r.parquet")))
    assert reports.num_rows == 800
    assert sorted(set(reports.column("day").to_pylist())) == [1, 2]
    fp = dataset_identity(str(local))
    assert fp["files"] == 2 and _ledger_fingerprints() == [fp["fingerprint"]]


def test_fingerprint_of_gs_inputs_equals_the_local_one(bucket, tmp_path):
    """A file, and a folder with hidden entries, fingerprint as their local copies do (a single
    file by its content only, a folder by names relative to it); changing one byte changes it."""
    from ldp_beam.pipelines.datasets import dataset_identity

    local = tmp_path / "local"
    body = _parquet(_table(300, 5))
    _put(bucket, "d/a.parquet", body, local / "a.parquet")
    _put(bucket, "d/sub/b.csv", _csv(_table(50, 6)), local / "sub" / "b.csv")
    _put(bucket, "d/_SUCCESS", b"", local / "_SUCCESS")
    _put(bucket, "d/.hidden", b"x", local / ".hidden")
    remote = dataset_identity(f"gs://{bucket.name}/d/")
    assert remote["uri"] == f"gs://{bucket.name}/d/"
    mine = dataset_identity(str(local))
    assert (remote["fingerprint"], remote["files"], remote["bytes"]) == \
        (mine["fingerprint"], 2, mine["bytes"])
    one = dataset_identity(f"gs://{bucket.name}/d/a.parquet")
    assert one["fingerprint"] == dataset_identity(str(local / "a.parquet"))["fingerprint"]
    changed = bytearray(body)
    changed[len(changed) // 2] ^= 1
    _put(bucket, "d/a.parquet", bytes(changed))
    assert dataset_identity(f"gs://{bucket.name}/d/a.parquet")["fingerprint"] != \
        one["fingerprint"]


def _run(argv: list, emulator: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *argv],
                            env={**os.environ, "STORAGE_EMULATOR_HOST": emulator},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _python(code: str, emulator: str) -> subprocess.Popen:
    return _run(["-c", textwrap.dedent(code)], emulator)


def _cli(*args: str, emulator: str) -> subprocess.Popen:
    return _run(["-m", "ldp_beam.pipelines.cli", *args], emulator)


def _kill(procs) -> None:
    """A process left running by a failed assertion or a hang guard is killed, not leaked."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


@pytest.fixture
def silent_store():
    """A loopback endpoint that accepts connections and never answers (a hung store): yields
    (its URL, a function waiting until a client has connected)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def connected(timeout: float = 60.0) -> None:
        srv.settimeout(timeout)
        held.append(srv.accept()[0])  # raises socket.timeout if no client came

    def drain() -> None:
        """Take the connections already queued (an earlier client may open several): the next
        :func:`connected` then waits for a new client, not an old one's leftover."""
        srv.setblocking(False)
        try:
            while True:
                held.append(srv.accept()[0])
        except BlockingIOError:
            pass
        finally:
            srv.setblocking(True)

    connected.drain = drain
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}", connected
    finally:
        for c in held:
            c.close()
        srv.close()


def test_unreachable_and_silent_endpoints_fail_in_one_line(gcs, silent_store, tmp_path):
    """Before: `collect -i gs://...` waited on Beam's retries for 120 s and ended in a traceback,
    and the fingerprint waited up to 15 minutes, deaf to SIGTERM. Now: one line naming the input,
    exit 2, within the bounds the timeouts set (connection refused: at once; silent: the 15 s
    read timeout of the check before the pipeline; the fingerprint: its retry limit, or its
    stall limit, shortened here to 3 s). HANG_GUARD only catches a hang."""
    closed = f"http://127.0.0.1:{free_port()}"
    silent, _ = silent_store
    args = ("collect", "-i", "gs://bkt/in/t.parquet", "-c", "v", *GRR,
            "-o", str(tmp_path / "r.parquet"), "--ledger", f"sqlite:///{tmp_path / 'l.db'}")
    fingerprint = """
        import sys, ldp_beam.pipelines.datasets as L
        L.REMOTE_STALL_SECONDS = 3
        try:
            L.dataset_identity("gs://bkt/in/t.parquet")
        except L.ParameterError as exc:
            print(exc, file=sys.stderr)
            sys.exit(2)
        """
    local = tmp_path / "t.parquet"
    pq.write_table(_table(50, 9), local)
    out_args = ("collect", "-i", str(local), "-c", "v", *GRR, "-o", "gs://bkt/out/r.parquet",
                "--ledger", f"sqlite:///{tmp_path / 'l2.db'}")
    procs = {"cli-closed": _cli(*args, emulator=closed),
             "cli-output-closed": _cli(*out_args, emulator=closed),
             "cli-silent": _cli(*args, emulator=silent),
             "fingerprint-closed": _python(fingerprint, closed),
             "fingerprint-silent": _python(fingerprint, silent)}
    try:
        for what, proc in procs.items():
            _, se = proc.communicate(timeout=HANG_GUARD)
            lines = [ln for ln in se.splitlines() if ln.strip()]
            assert proc.returncode == 2 and len(lines) == 1, (what, se)
            where = "gs://bkt/out/r.parquet" if "output" in what else "gs://bkt/in/t.parquet"
            assert where in lines[0] and "Traceback" not in se, (what, se)
            if what.startswith("cli"):
                assert lines[0].startswith("ldp-beam collect: error:") and \
                    "cannot be reached" in lines[0], se
            else:
                assert "parameter '--input'" in lines[0], se
    finally:
        _kill(procs.values())


def test_sigterm_ends_a_process_waiting_on_a_remote_read(gcs, silent_store, tmp_path):
    """SIGTERM while the store is silent: the CLI (in the listing request before the pipeline)
    ends with its one interrupted line and 143; a fingerprint (pyarrow's GCS client inside C++,
    run on a worker thread) ends the process too, with nothing committed."""
    silent, connected = silent_store
    started: list[subprocess.Popen] = []
    try:
        _sigterm_cli(silent, connected, tmp_path, started)
        _sigterm_fingerprint(silent, connected, started)
    finally:
        _kill(started)


def _sigterm_cli(silent, connected, tmp_path, started) -> None:
    proc = _cli("collect", "-i", "gs://bkt/in/t.parquet", "-c", "v", *GRR,
                "-o", str(tmp_path / "r.parquet"), "--ledger", f"sqlite:///{tmp_path / 'l.db'}",
                emulator=silent)
    started.append(proc)
    connected()  # the CLI's request reached the store and waits for an answer
    proc.send_signal(signal.SIGTERM)
    _, se = proc.communicate(timeout=HANG_GUARD)
    lines = [ln for ln in se.splitlines() if ln.strip()]
    assert proc.returncode == 143 and len(lines) == 1 and "SIGTERM" in lines[0], se
    assert not (tmp_path / "r.parquet").exists()


def _sigterm_fingerprint(silent, connected, started) -> None:
    # the CLI before may have left connections queued: under load, accepting one of those let
    # the signal land before this child had installed its handlers (it then died of SIGTERM, -15)
    connected.drain()
    proc = _python("""
        import sys
        from ldp_beam.pipelines.datasets import dataset_identity
        from ldp_beam.pipelines.lifecycle import Interrupted, install_signal_handlers
        install_signal_handlers()
        try:
            dataset_identity("gs://bkt/in/t.parquet")
        except Interrupted as exc:
            print(exc, file=sys.stderr)
            sys.exit(exc.exit_code)
        """, silent)
    started.append(proc)
    connected()
    time.sleep(0.5)  # inside pyarrow's request
    proc.send_signal(signal.SIGTERM)
    _, se = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 143 and se.strip() == "interrupted by SIGTERM", se
