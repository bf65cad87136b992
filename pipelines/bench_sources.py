"""Database sources and the portable runner for ``ldp-beam bench --only sources``.

For each size, one synthetic table (a numeric column ``x`` for ``bisample``, the same values
everywhere) is written to a Parquet file, to a DuckDB database file and to a PostgreSQL table on
a throw-away server the benchmark starts itself (from the machine's PostgreSQL binaries; loaded
by ADBC's bulk ingest, i.e. binary COPY, then ``VACUUM (FREEZE, ANALYZE)`` as a warehouse load
would finish). The same ``ReadTable(url) | Perturb | EstimateGlobally`` pipeline then runs on
each in a fresh child process on the DirectRunner; the runs are interleaved (Parquet, DuckDB,
PostgreSQL, then again) and repeated, each source's median time kept, so the ratios to Parquet
compare runs made under the same load (``ratio_to_parquet``: the median of each repeat's ratio
to the Parquet run just before it). Target: a database source within 1.5x of Parquet.

Wall times on a shared machine move with its load; CPU seconds much less. Each record also has
``cpu_seconds`` (the pipeline process, all threads, median), for PostgreSQL
``server_cpu_seconds`` (the server's processes during the run, from /proc) and
``wall_floor_seconds``: the CPU seconds over the machine's cores, the least wall time the work
can take here however well client and server overlap (see
:class:`~ldp_beam.transforms.sources.PostgresSource` for what that means for the target).

The portable-runner record runs the Parquet pipeline at the smallest size on Beam's
PortableRunner, submitted to Beam's own Python job service (``local_job_service_main``) with an
external worker pool (``worker_pool_main``), both started here, each run paired with a
DirectRunner run just before it; ``ratio_to_direct`` is that path's overhead over the
DirectRunner (no target).

Every child reports the reports it estimated from and the reader's dead letters, so a record
shows the rows it stands for; a source whose engine or client is missing gives a record with
``skipped`` and the reason, never a failure of the whole benchmark.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ldp_beam.pipelines.records import PEAK_RSS_SOURCE, make_record

from .postgres_server import PostgresServer, PostgresStartError, free_port, missing

MECHANISM = "bisample"
PARAMS = {"epsilon": 1.0, "lower": 0.0, "upper": 100.0}
COLUMNS = {"value": "x"}
TARGET = 1.5
SOURCES = ("parquet", "duckdb", "postgresql")
STARTUP_SECONDS = 60
NOTE = ("ReadTable(url) | Perturb | EstimateGlobally on the DirectRunner in a fresh process, "
        "start-up included; seconds: the median of the repeats; ratio_to_parquet: the median "
        "of each repeat's ratio to the Parquet run made just before it; the same rows in "
        "each source")

_CHILD = r'''
import json, resource, sys, time

import apache_beam as beam
from ldp_beam import build_mechanism, estimator_for
from ldp_beam.pipelines.common import run_pipeline
from ldp_beam.transforms import EstimateGlobally, Perturb, ReadTable


def main():
    cfg = json.loads(sys.argv[1])
    mech = build_mechanism(cfg["mechanism"], **cfg["params"])

    def build(p):
        read = p | ReadTable(cfg["url"])
        r = read.batches | Perturb(mech, columns=cfg["columns"])
        n = (r.reports | EstimateGlobally(estimator_for(mech))
             | beam.Map(lambda e: json.dumps({"reports": e.n_reports})))
        dead = ((read.dead_letter, r.dead_letter) | "DeadLetters" >> beam.Flatten()
                | beam.combiners.Count.Globally()
                | beam.Map(lambda k: json.dumps({"dead_letters": k})))
        return [(n, dead) | "Counts" >> beam.Flatten()
                | beam.io.WriteToText(cfg["out"], num_shards=1, shard_name_template="")]

    t, c = time.perf_counter(), cpu()
    run_pipeline(build, cfg["beam_args"])
    secs, cpu_secs = time.perf_counter() - t, cpu() - c
    got = {}
    with open(cfg["out"]) as fh:
        for line in fh:
            if line.strip():
                got.update(json.loads(line))
    print(json.dumps({"seconds": secs, "cpu_seconds": cpu_secs, "peak_rss_mb": peak_rss_mb(),
                      **got}))


def cpu():
    """CPU seconds of this process so far, all its threads (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


''' + PEAK_RSS_SOURCE + r'''

if __name__ == "__main__":
    main()
'''


def run(sizes: tuple[int, ...], tmp: str, progress=None, *,
        repeats: int | None = None) -> list[dict]:
    """Records for each size in ``sizes``: Parquet, DuckDB and PostgreSQL (or ``skipped``), then
    one portable-runner record at the smallest size. ``tmp``: a folder for the data and the
    child's outputs. ``repeats``: runs per source and size (default 3 from 10^6 rows, else 1)."""
    script = os.path.join(tmp, "bench_sources_child.py")
    with open(script, "w") as fh:
        fh.write(_CHILD)
    out: list[dict] = []
    with contextlib.ExitStack() as stack:
        server: _PostgresServer | None = None
        pg_skip = postgres_unavailable()
        for n in sizes:
            reps = repeats if repeats is not None else (3 if n >= 1_000_000 else 1)
            _note(progress, f"sources: writing {n:,} rows to Parquet, DuckDB and PostgreSQL")
            table = _table(n)
            skipped: dict[str, str] = {}
            parquet = os.path.join(tmp, f"sources-{n}.parquet")
            pq.write_table(table, parquet, row_group_size=250_000)  # as pipelines/bench.py does
            urls = {"parquet": parquet}
            why = duckdb_unavailable()
            if why:
                skipped["duckdb"] = why
            else:
                urls["duckdb"] = _write_duckdb(table, os.path.join(tmp, f"sources-{n}.duckdb"))
            if pg_skip:
                skipped["postgresql"] = pg_skip
            else:
                try:
                    if server is None:
                        server = stack.enter_context(_PostgresServer.running())
                    urls["postgresql"] = server.load(table, f"t{n}")
                except PostgresStartError as exc:
                    pg_skip = skipped["postgresql"] = str(exc)
            del table
            times: dict[str, list[float]] = {s: [] for s in urls}
            cpus: dict[str, list[float]] = {s: [] for s in urls}
            server_cpus: list[float] = []
            last: dict[str, dict] = {}
            for rep in range(reps):
                for source, url in urls.items():
                    _note(progress, f"sources: {source} ({n:,} rows, run {rep + 1} of {reps})")
                    before = server.cpu_seconds() if source == "postgresql" and server else None
                    got = _child(script, url, ["--runner=DirectRunner"], tmp)
                    if before is not None:
                        after = server.cpu_seconds(settle=True)
                        if after is not None:
                            server_cpus.append(after - before)
                    _check_rows(got, n, source)
                    times[source].append(got["seconds"])
                    cpus[source].append(got["cpu_seconds"])
                    last[source] = got
            for source in SOURCES:
                if source in skipped:
                    out.append(_record(source, n, None, {}, reps, skipped=skipped[source]))
                    continue
                secs = statistics.median(times[source])
                rec = _record(source, n, secs, last[source], reps, all_seconds=times[source])
                _cpu_fields(rec, cpus[source], server_cpus if source == "postgresql" else None)
                if source != "parquet":  # each run against the Parquet run next to it
                    ratio = statistics.median(
                        a / b for a, b in zip(times[source], times["parquet"]))
                    rec.update(ratio_to_parquet=ratio, target=TARGET,
                               meets_target=bool(ratio <= TARGET))
                out.append(rec)
    out.append(_portable(min(sizes), tmp, script, progress,
                         repeats if repeats is not None else
                         (3 if min(sizes) >= 1_000_000 else 1)))
    return out


def _cpu_fields(rec: dict, cpus: list[float], server_cpus: list[float] | None) -> None:
    """CPU accounting of a record: ``cpu_seconds`` (the pipeline process, all its threads,
    median of the repeats), for PostgreSQL ``server_cpu_seconds`` (the server's processes
    during each run, median), and ``wall_floor_seconds``: their sum over the machine's cores,
    the least wall time that work can take here however well it overlaps."""
    rec["cpu_seconds"] = total = statistics.median(cpus)
    if server_cpus is not None:
        rec["server_cpu_seconds"] = statistics.median(server_cpus) if server_cpus else None
        total += rec["server_cpu_seconds"] or 0.0
    rec.update(cores=os.cpu_count(), wall_floor_seconds=total / (os.cpu_count() or 1))


def _note(progress, text: str) -> None:
    if progress is not None:
        progress.note(text)


def _record(source: str, n: int, secs: float | None, got: dict, reps: int, *,
            runner: str = "DirectRunner", all_seconds: list[float] | None = None,
            skipped: str | None = None, note: str = NOTE) -> dict:
    rate = None if not secs else n / secs
    rec = make_record("bench", "synthetic", MECHANISM, PARAMS["epsilon"],
                      f"pipeline rows/s ({source})", rate, stage="sources", runner=runner,
                      source=source, rows=n, seconds=secs, rows_per_second=rate,
                      peak_rss_mb=got.get("peak_rss_mb"), mode="batched", path="api",
                      repeats=reps, note=note)
    if skipped is not None:
        rec["skipped"] = skipped
    else:
        rec.update(all_seconds=list(all_seconds or []), reports=got["reports"],
                   dead_letters=got["dead_letters"])
    return rec


def _check_rows(got: dict, n: int, source: str) -> None:
    """Every row is a report or a dead letter (nothing silently dropped)."""
    if got.get("reports") is None or got["reports"] + got.get("dead_letters", 0) < n \
            or got["reports"] > n:
        raise RuntimeError(f"benchmark source {source}: {n:,} rows written, the pipeline "
                           f"estimated from {got.get('reports')} reports with "
                           f"{got.get('dead_letters')} dead letters")


def _child(script: str, url: str, beam_args: list[str], tmp: str) -> dict:
    """One pipeline in a fresh process: its seconds, peak RSS, reports and dead letters."""
    fd, out = tempfile.mkstemp(prefix="child-", suffix=".jsonl", dir=tmp)
    os.close(fd)
    cfg = {"mechanism": MECHANISM, "params": PARAMS, "columns": COLUMNS, "url": url,
           "beam_args": beam_args, "out": out}
    try:
        r = subprocess.run([sys.executable, script, json.dumps(cfg)], capture_output=True,
                           text=True, timeout=3600)
    finally:
        with contextlib.suppress(OSError):
            os.remove(out)
    if r.returncode != 0:
        raise RuntimeError(f"benchmark pipeline on {_redact(url)} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _redact(url: str) -> str:
    # lazy: Beam (ldp_beam.transforms) costs 1.3 s at import (measured); every `ldp-beam bench`
    # imports this module (bench_stream takes stop_processes from it), `--no-pipeline` included,
    # and only a failed child's message needs it
    from ldp_beam.transforms.sources import is_source_url, redact

    return redact(url) if is_source_url(url) else url


# ------------------------------------------------------------------------------ the data
def _table(n: int):
    """The benchmark's table: ``x`` uniform on [0, 100), seeded by its size (so every source of
    one size holds the same values, and runs are comparable)."""
    return pa.table({"x": np.random.default_rng(n).uniform(0.0, 100.0, n)})


def duckdb_unavailable() -> str | None:
    try:
        import duckdb  # noqa: F401  # lazy: optional dependency (the [duckdb] extra)
    except ImportError:
        return "the duckdb package is not installed (pip install 'ldp-beam[duckdb]')"
    return None


def _write_duckdb(table, path: str) -> str:
    import duckdb  # lazy: optional dependency (the [duckdb] extra)

    if os.path.exists(path):
        os.remove(path)
    con = duckdb.connect(path)
    try:
        con.register("src", table)
        con.execute("CREATE TABLE t AS SELECT * FROM src")
        con.unregister("src")
    finally:
        con.close()
    return f"duckdb://{os.path.abspath(path)}?table=t"


# ------------------------------------------------------------------------------ PostgreSQL
class _PostgresServer(PostgresServer):
    """The benchmark's throw-away server (:mod:`ldp_beam.pipelines.postgres_server`), set up
    for bulk loads: nothing in it needs to survive a crash."""

    SETTINGS = {**PostgresServer.SETTINGS, "shared_buffers": "128MB", "fsync": "off",
                "synchronous_commit": "off", "full_page_writes": "off"}
    START_TIMEOUT = STARTUP_SECONDS

    def load(self, table, name: str) -> str:
        """``table`` as the PostgreSQL table ``name`` (bulk ingest, binary COPY), vacuumed and
        analyzed; returns its source URL."""
        import adbc_driver_postgresql.dbapi as pg  # lazy: optional dependency ([postgresql])

        with pg.connect(self.url(), autocommit=True) as con:
            with con.cursor() as cur:
                cur.execute(f'DROP TABLE IF EXISTS "{name}"')
                cur.adbc_ingest(name, table, mode="create")
                cur.execute(f'VACUUM (FREEZE, ANALYZE) "{name}"')
        return f"{self.url()}?table={name}"


def postgres_unavailable() -> str | None:
    """Why the PostgreSQL source cannot be measured here, or None."""
    try:
        import adbc_driver_postgresql.dbapi  # noqa: F401  # lazy: optional ([postgresql] extra)
    except ImportError:
        return ("adbc-driver-postgresql is not installed (pip install "
                "'ldp-beam[postgresql]')")
    return missing()


# ------------------------------------------------------------------------------ portable runner
def _wait_for_port(port: int, proc: subprocess.Popen, what: str, log: str) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {_tail(log)}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {STARTUP_SECONDS} s: "
                       f"{_tail(log)}")


def _tail(log: str) -> str:
    try:
        with open(log, errors="replace") as fh:
            return fh.read()[-2000:]
    except OSError:
        return "(no log)"


def stop_processes(procs: list, wait: float = 15.0) -> None:
    """SIGTERM every process still running, then SIGKILL whichever has not exited ``wait``
    seconds later (each is waited for: no zombies, no stray servers)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


@contextlib.contextmanager
def portable_services(tmp: str) -> Iterator[list[str]]:
    """Beam's Python job service and an external worker pool (``sys.executable``), each its own
    process; yields the PortableRunner arguments that submit to them. Both are stopped on the
    way out."""
    # lazy: Beam (pipelines.common) costs 1.3 s at import (measured; see _redact), only the
    # portable section needs it
    from .common import worker_pool_env

    procs: list[subprocess.Popen] = []
    try:
        job_port, pool_port = free_port(), free_port()
        job_log, pool_log = (os.path.join(tmp, "job-service.log"),
                             os.path.join(tmp, "worker-pool.log"))
        with open(job_log, "w") as jl:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
                 f"--port={job_port}"], stdout=jl, stderr=subprocess.STDOUT))
        with open(pool_log, "w") as pl:  # its workers run this interpreter, not PATH's python
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                 f"--service_port={pool_port}"], stdout=pl, stderr=subprocess.STDOUT,
                env=worker_pool_env(os.path.join(tmp, "pool-bin"))))
        _wait_for_port(job_port, procs[0], "the Beam job service", job_log)
        _wait_for_port(pool_port, procs[1], "the Beam worker pool", pool_log)
        yield ["--runner=PortableRunner", f"--job_endpoint=localhost:{job_port}",
               "--environment_type=EXTERNAL", f"--environment_config=localhost:{pool_port}"]
    finally:
        stop_processes(procs)


def _portable(n: int, tmp: str, script: str, progress, reps: int) -> dict:
    """The Parquet pipeline on the PortableRunner (job service + external worker pool), each
    run paired with a DirectRunner run of the same pipeline just before it (same load)."""
    path = os.path.join(tmp, f"sources-{n}.parquet")
    runner = "PortableRunner (Python job service, external worker pool)"
    note = ("ReadTable(parquet) | Perturb | EstimateGlobally submitted to Beam's Python job "
            "service with an external worker pool (both started before timing); "
            "ratio_to_direct: the median of each run's ratio to a DirectRunner run made just "
            "before it")
    times, direct = [], []
    got: dict = {}
    with portable_services(tmp) as args:
        for rep in range(reps):
            _note(progress, f"sources: parquet on the DirectRunner, then the PortableRunner "
                            f"({n:,} rows, run {rep + 1} of {reps})")
            ref = _child(script, path, ["--runner=DirectRunner"], tmp)
            _check_rows(ref, n, "parquet")
            direct.append(ref["seconds"])
            got = _child(script, path, args, tmp)
            _check_rows(got, n, "parquet (portable)")
            times.append(got["seconds"])
    secs = statistics.median(times)
    rec = _record("parquet", n, secs, got, reps, runner=runner, all_seconds=times, note=note)
    rec.update(ratio_to_direct=statistics.median(a / b for a, b in zip(times, direct)),
               direct_seconds=direct)
    return rec
