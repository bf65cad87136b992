"""Pipeline benchmarks for ``ldp-beam bench``: every path users take, as ratios to plain Beam.

The machine is shared and noisy, so every pipeline is reported as a ratio to "the reference",
measured in the same run on the same input (issue 16):

* **the reference**: a plain Beam pipeline of ~40 lines (:data:`_CHILD`, ``reference``) that reads
  the same Parquet file with ``beam.io.ReadFromParquetBatched``, applies one vectorized GRR per
  record batch with numpy and counts with a bincount ``CombineFn``;
* **the element reference**: plain Beam doing the same per-record work (a label lookup, numpy
  randomized response, a count ``CombineFn``) on records generated inside the pipeline.

Paths (``path`` in every record):

* ``api``: ``ReadTable | Perturb | EstimateGlobally`` (grr, bisample-md, cprr with string labels,
  rvns) on the DirectRunner, and at 10^6 rows the multi-process DirectRunner and a local Dask
  cluster of 2 worker processes, each against the reference on the same runner (on Dask the
  reference reads the file's row groups with pyarrow in a ``FlatMap``: Beam 2.77's Dask runner
  cannot run ``ReadFromParquetBatched``); the privacy-unit bounding runs (``--only
  bounding``) keep their ``ratio_to_unbounded``;
* ``cli``: ``ldp-beam collect`` then ``ldp-beam estimate`` as subprocesses (process start-up
  counted), and central releases from raw rows (``ldp-beam estimate -m dphr|ospdprr``); each
  command's own peak RSS comes from a tiny wrapper that reports its process's VmHWM;
* ``element``: 10^6 records generated inside the pipeline, ``Perturb(key_column=...) |
  EstimateGlobally``, against the element reference.

``ratio_to_reference`` = reference seconds / pipeline seconds (> 1: faster than the reference).
Memory records (``stage="memory"``) give each command's ``rss_growth`` = peak RSS at the largest
size / peak RSS at 10^6 - 1 (target 0.15). Every pipeline runs in a fresh child process, which
times its own run (imports excluded, the pipeline's graph construction and Beam's start-up
included) and reports its own peak RSS; CLI commands are timed from outside (start-up included).
Children run with Python's bytecode cache on, in the run's temporary directory, filled before
the first measurement (:func:`_child_env`): an installed package runs from compiled bytecode,
whatever ``PYTHONDONTWRITEBYTECODE`` the calling shell sets.

Sections (``--only`` takes their names, mechanism names, or both): ``api``, ``cli``,
``element``, ``runners`` (not with ``--quick``), ``bounding``, ``sources`` (DuckDB and
PostgreSQL beside Parquet, :mod:`ldp_beam.pipelines.bench_sources`, whose records get a
``ratio_to_reference`` here too) and ``startup`` (``import ldp_beam`` and ``ldp-beam --help`` in
a fresh process, absolute seconds against issue 16's < 0.3 s and < 0.6 s; ``stage="startup"``,
not pipeline records), ``stream`` (live telemetry through Google's Pub/Sub emulator, started
here: a plain pull client, the lander, batched reports, ``run_pubsub_stream`` end to end and
Beam's ``ReadFromPubSub``, all on backlogs published in the same run; ``stage="stream"``, see
:func:`stream_bench`; skipped, not failed, where Java or the emulator is missing) and, only when
named or with ``--soak SECONDS``, ``stream-soak`` (a live collector at a steady rate, its RSS
sampled: :func:`stream_soak`). A failing section is reported and fails the run at the end;
the other sections' records are still written.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from ldp_beam.pipelines.records import make_record

from .bench_sources import stop_processes

_CHILD = r'''
import json, resource, sys, time

LABELS = tuple(str(i) for i in range(20))


def main():
    import apache_beam as beam
    from ldp_beam.pipelines.common import run_pipeline

    cfg = json.loads(sys.argv[1])
    mode = cfg["mode"]
    if mode == "reference":
        build = lambda p: [reference(p, cfg)]
    elif mode == "reference-element":
        build = lambda p: [element_reference(p, cfg)]
    else:
        from ldp_beam import build_mechanism, estimator_for
        from ldp_beam.transforms import EstimateGlobally, Perturb, ReadTable

        mech = build_mechanism(cfg["mechanism"], **cfg["params"])
        cols, path = cfg["columns"], cfg["path"]

        def build(p):
            if mode == "api":
                batches = (p | ReadTable(path)).batches
                r = batches | Perturb(mech, columns=cols)
            elif mode == "bounded":  # one report per privacy unit (the input is read twice)
                from ldp_beam.rng import RunKey
                from ldp_beam.transforms.units import BoundContributions

                b = p | BoundContributions("uid", RunKey.new(), 1, 1, source=ReadTable(path))
                r = b.batches | Perturb(mech, columns=cols)
            else:  # element: single records generated in the pipeline, keyed by a record id
                r = (p | beam.Create(ranges(cfg["rows"])) | beam.FlatMap(gen_records)
                     | Perturb(mech, columns=cols, key_column="rid"))
            return [r.reports | EstimateGlobally(estimator_for(mech)) | beam.Map(lambda e: None)]

    t = time.perf_counter()
    run_pipeline(build, cfg["beam_args"])
    secs = time.perf_counter() - t
    print(json.dumps({"seconds": secs, "peak_rss_mb": peak_rss_mb()}))


def reference(p, cfg):
    """The reference: plain Beam on the same file, one vectorized GRR (k = 20) per record batch,
    a bincount CombineFn, debiased frequencies. Strings are coded by their label, numbers by
    bucket of [0, 100)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import apache_beam as beam

    k, column, domain = len(LABELS), cfg["ref_column"], pa.array(LABELS)
    e = np.exp(cfg["ref_epsilon"])
    keep, q = e / (e + k - 1), 1.0 / (e + k - 1)

    class GRR(beam.DoFn):
        def setup(self):
            self.rng = np.random.default_rng()

        def process(self, table):
            col = table.column(column)
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                codes = pc.fill_null(pc.index_in(col, value_set=domain), 0).to_numpy()
            else:
                codes = np.minimum((col.to_numpy() * (k / 100.0)).astype(np.int64), k - 1)
            other = self.rng.integers(0, k - 1, len(codes))
            other += other >= codes
            yield np.where(self.rng.random(len(codes)) < keep, codes, other)

    class Bincount(beam.CombineFn):
        def create_accumulator(self):
            return np.zeros(k, np.int64)

        def add_input(self, acc, reports):
            acc += np.bincount(reports, minlength=k)
            return acc

        def merge_accumulators(self, accs):
            return np.sum(list(accs), axis=0)

        def extract_output(self, acc):
            return (acc / max(int(acc.sum()), 1) - q) / (keep - q)

    if cfg.get("ref_read") == "row_groups":  # Beam's Dask runner cannot run the Read transform
        import pyarrow.parquet as pq

        def row_group(i):
            yield from pq.ParquetFile(cfg["path"]).read_row_group(i).to_batches()

        groups = range(pq.ParquetFile(cfg["path"]).num_row_groups)
        read = p | beam.Create(list(groups)) | beam.FlatMap(row_group)
    else:
        read = p | beam.io.ReadFromParquetBatched(cfg["path"])
    return (read | beam.ParDo(GRR()) | beam.CombineGlobally(Bincount())
            | beam.Map(lambda e: None))


def element_reference(p, cfg):
    """Plain Beam doing the element path's work per record: the label's code (unknown labels
    dropped), numpy randomized response (GRR, k = 20), a count CombineFn."""
    import numpy as np
    import apache_beam as beam

    k, index = len(LABELS), {label: i for i, label in enumerate(LABELS)}
    e = np.exp(cfg["ref_epsilon"])
    keep, q = e / (e + k - 1), 1.0 / (e + k - 1)

    class RR(beam.DoFn):
        def setup(self):
            self.rng = np.random.default_rng()

        def process(self, rec):
            code = index.get(rec["x"])
            if code is None:
                return
            if self.rng.random() >= keep:
                other = int(self.rng.integers(0, k - 1))
                code = other + (other >= code)
            yield code

    class Count(beam.CombineFn):
        def create_accumulator(self):
            return [0] * k

        def add_input(self, acc, code):
            acc[code] += 1
            return acc

        def merge_accumulators(self, accs):
            return [sum(c) for c in zip(*accs)]

        def extract_output(self, acc):
            n = max(sum(acc), 1)
            return [(c / n - q) / (keep - q) for c in acc]

    return (p | beam.Create(ranges(cfg["rows"])) | beam.FlatMap(gen_records)
            | beam.ParDo(RR()) | beam.CombineGlobally(Count()) | beam.Map(lambda e: None))


def ranges(n, parts=8):
    step = -(-n // parts)
    return [(s, min(n, s + step)) for s in range(0, n, step)]


def gen_records(bounds):
    """Records generated inside the pipeline (nothing pickled through beam.Create): a skewed
    label per record and its record id."""
    import numpy as np

    start, stop = bounds
    codes = np.minimum(np.random.default_rng(start).geometric(0.15, stop - start) - 1, 19)
    for rid, c in zip(range(start, stop), codes.tolist()):
        yield {"x": LABELS[c], "rid": rid}


def peak_rss_mb():
    """This process's own peak RSS: VmHWM belongs to the address space, which exec replaces
    (getrusage's ru_maxrss survives exec on Linux, so a child would report its parent's peak)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


if __name__ == "__main__":
    main()
'''

# `ldp-beam ARGS` in this process (what the console script runs), then this process's own peak
# RSS (VmHWM) written to the file named by LDP_BEAM_BENCH_RSS, whatever the exit.
_CLI = r'''
import os, sys


def _hwm():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


if __name__ == "__main__":
    sys.argv = ["ldp-beam"] + sys.argv[1:]
    try:
        from ldp_beam.pipelines.cli import entry

        code = entry()
    finally:
        with open(os.environ["LDP_BEAM_BENCH_RSS"], "w") as fh:
            fh.write(repr(_hwm()))
    sys.exit(code)
'''

RUNNERS = {
    "DirectRunner": ["--runner=DirectRunner"],
    "DirectRunner (2 processes)": ["--runner=DirectRunner", "--direct_num_workers=2",
                                   "--direct_running_mode=multi_processing"],
    "Dask (2 worker processes)": ["--runner=dask", "--dask_workers=2"],
}

#: runners measured against the reference on the same runner besides the DirectRunner
RUNNER_ROUNDS = 3  # rounds of the multi-process runners' comparisons (full bench)
RATIO_RUNNERS = ("DirectRunner (2 processes)", "Dask (2 worker processes)")
#: runners whose reference reads the file's row groups with pyarrow inside a FlatMap over
#: beam.Create(row group numbers) instead of ReadFromParquetBatched: Beam 2.77's DaskRunner
#: cannot run a Read transform ("'NoneType' object has no attribute 'map'" in its
#: transform_evaluator at run time), while Create | FlatMap runs and splits the same way
ROW_GROUP_REFERENCE = ("Dask (2 worker processes)",)
#: the issue's targets (issue 16): ratio_to_reference at least this much; rss_growth at most
TARGETS = {"api": 0.85, "cli": 0.5, "element": 0.7, "memory": 0.15}
CLI_TARGET_ROWS = 10_000_000  # the CLI's target is stated at 10^7 rows (start-up is counted)
REF_EPSILON = 2.0  # the reference's GRR epsilon (its cost does not depend on it)

_LABELS = tuple(str(i) for i in range(20))
_REGIONS = ("north", "south", "east", "west", "centre", "islands", "abroad", "unknown")


def _numeric(n: int, rng: Any) -> dict:
    """A value in [0, 100) and a public grouping column (kept by ``collect --keep``)."""
    import numpy as np

    regions = np.array(_REGIONS, dtype=object)
    return {"x": rng.uniform(0.0, 100.0, n), "region": regions[rng.integers(0, len(regions), n)]}


def _pairs(n: int, rng: Any) -> dict:
    """Two string label columns (20 labels each, skewed)."""
    import numpy as np

    labels = np.array(_LABELS, dtype=object)
    return {"x": labels[np.minimum(rng.geometric(0.15, n) - 1, 19)],
            "y": labels[np.minimum(rng.geometric(0.15, n) - 1, 19)]}


def _item_levels(n: int, rng: Any) -> dict:
    import numpy as np

    return {"x": rng.uniform(0.0, 100.0, n),
            "level": np.where(rng.random(n) < 0.6, 0.0, rng.uniform(0.01, 1.0, n))}


def _numeric_units(n: int, rng: Any) -> dict:
    """Values with a privacy unit of 10 rows each (units in random order)."""
    import numpy as np

    return {"x": rng.uniform(0.0, 100.0, n),
            "uid": rng.permutation(np.arange(n) // 10 + rng.integers(0, 2**40))}


def _numeric_units100(n: int, rng: Any) -> dict:
    """Values with a privacy unit of 100 rows each: at 10^7 rows, as many units as 10^6 rows
    of :func:`_numeric_units` (memory at a fixed number of units, ten times the rows)."""
    import numpy as np

    return {"x": rng.uniform(0.0, 100.0, n),
            "uid": rng.permutation(np.arange(n) // 100 + rng.integers(0, 2**40))}


#: input files: name -> (generator, the column the reference codes)
FILES = {"numeric": (_numeric, "x"), "labels": (_pairs, "x"), "levels": (_item_levels, "x"),
         "units": (_numeric_units, "x"), "units100": (_numeric_units100, "x")}

#: LDP mechanisms of the api and cli paths: name -> (params, role -> column, file, collect extras)
CASES = {
    "grr": ({"epsilon": 2.0, "domain": _LABELS}, {"value": "x"}, "labels", []),
    "bisample-md": ({"epsilon": 1.0, "lower": 0.0, "upper": 100.0}, {"value": "x"}, "numeric",
                    ["--keep", "region", "--public", "region"]),
    "cprr": ({"epsilon": 2.0, "x_domain": _LABELS, "y_domain": _LABELS,
              "x_sensitive": _LABELS[:5], "y_sensitive": _LABELS[:5]},
             {"x": "x", "y": "y"}, "labels", []),
    "rvns": ({"lower": 0.0, "upper": 100.0, "d": 10.0, "k": 1, "delta": 20.0}, {"value": "x"},
             "numeric", []),
}
#: central releases from raw rows through the CLI: name -> (params, role -> column, file)
RELEASES = {
    "dphr": ({"epsilon": 1.0, "bins": 256, "lower": 0.0, "upper": 100.0}, {"value": "x"},
             "numeric"),
    "ospdprr": ({"t": 0.8, "query": "sum", "k": 1, "lower": 0.0, "upper": 100.0},
                {"value1": "x", "level1": "level"}, "levels"),
}
ELEMENT_MECHANISM = "grr"
SECTIONS = ("api", "cli", "element", "runners", "bounding", "sources", "startup", "stream")
#: sections run only when named (``--only``) or asked for (``--soak``)
OPT_IN_SECTIONS = ("stream-soak",)
#: issue 16's start-up targets, absolute seconds for a fresh process (fastest of the rounds)
STARTUP_TARGETS = {"import ldp_beam": 0.3, "ldp-beam --help": 0.6}
STARTUP_ROUNDS = 5
QUICK_CLI = ("grr", "bisample-md", "dphr")  # --quick: fewer CLI runs


def _write(path: str, gen, n: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng()
    writer = None
    step = 1_000_000
    for start in range(0, n, step):  # written in slices: the benchmark measures the pipeline
        t = pa.table(gen(min(step, n - start), rng))
        if writer is None:
            writer = pq.ParquetWriter(path, t.schema)
        writer.write_table(t, row_group_size=250_000)
    writer.close()


def _machine() -> str:
    import apache_beam

    return (f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python "
            f"{platform.python_version()}, Beam {apache_beam.__version__}")


def _child_env(tmp: str) -> dict:
    """The environment of every measured child process: Python's bytecode cache on, in this
    run's temporary directory (``PYTHONPYCACHEPREFIX``), and filled before any measurement
    (:func:`_warm_bytecode`). An installed package runs from compiled bytecode (pip compiles
    it at install; an editable install caches it at first import), but a shell with
    ``PYTHONDONTWRITEBYTECODE=1`` recompiles every module of ldp-beam in every process, ~0.1-0.2
    s each (measured here): a cost of that shell, not of the commands. Nothing is written
    outside the run's temporary directory."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=os.path.join(tmp, "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _warm_bytecode(env: dict) -> None:
    """Compile ldp-beam (every module) and what a run imports (Beam, pyarrow, pandas, ...) into
    the cache of :func:`_child_env`, once, before the first measurement."""
    import importlib

    dirs = {os.path.dirname(importlib.import_module(m).__file__)
            for m in ("ldp_beam", "ldp_beam.transforms", "ldp_beam.pipelines")}
    subprocess.run([sys.executable, "-m", "compileall", "-q", *sorted(dirs)], env=env,
                   capture_output=True, timeout=600, check=True)
    subprocess.run([sys.executable, "-c", "import apache_beam, pyarrow.parquet, pandas, "
                    "ldp_beam.pipelines.cli, ldp_beam.pipelines.collect, "
                    "ldp_beam.pipelines.estimate, ldp_beam.transforms.units"],
                   env=env, capture_output=True, timeout=600, check=True)


class _Bench:
    """One run's plan and shared state: input files (written once per name and size), child
    scripts, and every reference measured so far (reused by all records of that input)."""

    def __init__(self, tmp: str, progress: Any, rounds: int) -> None:
        self.tmp = tmp
        self.progress = progress
        self.rounds = rounds  # fresh-process measurements per configuration (the fastest kept)
        self.files: dict[tuple[str, int], str] = {}
        self.refs: dict[tuple, float] = {}
        self.script = os.path.join(tmp, "child.py")
        self.cli_script = os.path.join(tmp, "cli.py")
        for path, text in ((self.script, _CHILD), (self.cli_script, _CLI)):
            with open(path, "w") as fh:
                fh.write(text)
        self.env = _child_env(tmp)
        self.env["LDP_BEAM_LEDGER"] = os.path.join(tmp, "ledger.db")
        self.stamp = {"machine": _machine(), "load_average": round(os.getloadavg()[0], 1),
                      "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                          "%Y-%m-%d %H:%M UTC")}

    def note(self, text: str) -> None:
        if self.progress is not None:
            self.progress.note(text)

    def file(self, name: str, n: int) -> str:
        if (name, n) not in self.files:
            path = os.path.join(self.tmp, f"{name}-{n}.parquet")
            self.note(f"writing {name} input ({n:,} rows)")
            _write(path, FILES[name][0], n)
            self.files[(name, n)] = path
        return self.files[(name, n)]

    def child(self, cfg: dict) -> tuple[float, float]:
        """One pipeline in a fresh process: (seconds, that process's own peak RSS in MiB)."""
        r = subprocess.run([sys.executable, self.script, json.dumps(cfg)], capture_output=True,
                           text=True, timeout=3600, env=self.env)
        if r.returncode != 0:
            raise RuntimeError(f"benchmark pipeline failed ({cfg['mode']}): {r.stderr[-2000:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        return out["seconds"], out["peak_rss_mb"]

    def best(self, cfgs: list[dict], n: int, rounds: int | None = None
             ) -> list[tuple[float, float]]:
        """Each configuration measured ``rounds`` times (default: the bench's rounds), interleaved
        so drift hits all alike; the fastest kept."""
        if rounds is None:
            rounds = self.rounds
        best: list[tuple[float, float] | None] = [None] * len(cfgs)
        for _ in range(rounds):
            for i, cfg in enumerate(cfgs):
                secs, rss = self.child(cfg)
                if best[i] is None or secs < best[i][0]:
                    best[i] = (secs, rss)
        return best  # type: ignore[return-value]

    def reference(self, file: str, n: int, runner: str = "DirectRunner") -> float:
        key = ("file", file, n, runner)
        if key not in self.refs:
            self.note(f"reference: plain Beam GRR on {file} ({n:,} rows, {runner})")
            cfg = self.ref_cfg(file, n, runner)
            self.refs[key] = self.best([cfg], n)[0][0]
        return self.refs[key]

    def ref_cfg(self, file: str, n: int, runner: str = "DirectRunner") -> dict:
        return {"mode": "reference", "path": self.file(file, n), "ref_column": FILES[file][1],
                "ref_epsilon": REF_EPSILON, "rows": n, "beam_args": RUNNERS[runner],
                "ref_read": "row_groups" if runner in ROW_GROUP_REFERENCE else "beam"}

    def cli(self, args: list[str], ledger: str | None = None) -> tuple[float, float]:
        """``ldp-beam ARGS`` as a subprocess: (wall seconds with start-up, its peak RSS).
        ``ledger``: a ledger file of its own (a repeated central release would otherwise be
        re-published from the run's ledger, not computed)."""
        rss_file = os.path.join(self.tmp, "cli-rss.txt")
        env = dict(self.env, LDP_BEAM_BENCH_RSS=rss_file)
        if ledger is not None:
            env["LDP_BEAM_LEDGER"] = ledger
        t = time.perf_counter()
        r = subprocess.run([sys.executable, self.cli_script, *args], capture_output=True,
                           text=True, timeout=3600, env=env)
        secs = time.perf_counter() - t
        if r.returncode != 0:
            raise RuntimeError(f"ldp-beam {args[0]} failed: {r.stderr[-2000:]}")
        with open(rss_file) as fh:
            return secs, float(fh.read())

    def record(self, path: str, stage: str, method: str, epsilon: Any, mode: str, n: int,
               secs: float, rss: float, ref: float, runner: str, target: float | None,
               note: str, **extra: Any) -> dict:
        ratio = ref / secs
        rec = make_record("bench", "synthetic", method, epsilon, f"pipeline rows/s ({mode})",
                          n / secs, stage=stage, path=path, runner=runner, rows=n, seconds=secs,
                          rows_per_second=n / secs, peak_rss_mb=rss, mode=mode,
                          reference_seconds=ref, ratio_to_reference=ratio,
                          target=target, target_of="ratio_to_reference",
                          meets_target=None if target is None else bool(ratio >= target),
                          note=note + "; ratio_to_reference = reference seconds / seconds "
                                      "(> 1: faster than the reference)",
                          **extra, **self.stamp)
        return rec


def _selection(only: list[str] | None) -> tuple[set[str], set[str] | None]:
    """``--only`` names -> (sections to run, mechanisms to keep or None for all). Section names
    (api, cli, element, runners, bounding, sources, startup) pick sections; mechanism names pick
    mechanisms within api, cli and element; neither kind given: all of that kind."""
    if not only:
        return set(SECTIONS), None
    names = set(only)
    mechs = names & (set(CASES) | set(RELEASES))
    sections = names & (set(SECTIONS) | set(OPT_IN_SECTIONS))
    if not sections:
        sections = {"api", "cli", "element"} if mechs else set()
    return sections, (mechs or None)


def run(quick: bool = False, progress=None, only: list[str] | None = None,
        big: bool = False, sizes: tuple[int, ...] | None = None,
        element_records: int | None = None, soak: float | None = None) -> list[dict]:
    """The pipeline benchmark's records. ``sizes`` and ``element_records`` override the rows
    (default 10^6 and 10^7 rows, 10^6 elements; ``quick``: 10^6 rows, 2x10^5 elements);
    ``big``: also ``collect --keep`` at 3x10^7 rows for the memory records; ``soak``: also
    the stream soak (``stream-soak``) for this many seconds (named without it:
    :data:`SOAK_SECONDS`)."""
    if sizes is None:
        sizes = (1_000_000,) if quick else (1_000_000, 10_000_000)
    if element_records is None:
        element_records = 200_000 if quick else 1_000_000
    sections, mechs = _selection(only)
    if soak is not None:
        if not (soak > 0):
            raise ValueError(f"--soak {soak!r}: expected seconds > 0")
        sections.add("stream-soak")
    t0 = time.perf_counter()
    out: list[dict] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ldp-beam-bench-") as tmp:
        b = _Bench(tmp, progress, rounds=1 if quick else 2)
        b.note("bytecode cache for the measured processes")
        _warm_bytecode(b.env)

        def section(name, fn):
            """One section's records; a failing section is reported, the others still run
            (their records are kept) and the bench fails at the end."""
            try:
                out.extend(fn())
            except _SectionFailed as exc:  # its records so far are kept
                out.extend(exc.records)
                failed.append(f"{name}: {exc}")
                b.note(f"section {name} FAILED: {str(exc)[-300:]}")
            except Exception as exc:  # noqa: BLE001 - re-raised below as BenchFailed
                failed.append(f"{name}: {type(exc).__name__}: {str(exc)[-1500:]}")
                b.note(f"section {name} FAILED: {type(exc).__name__}: {str(exc)[-300:]}")

        if "api" in sections:
            section("api", lambda: _api(b, sizes, mechs))
        if "element" in sections and (mechs is None or ELEMENT_MECHANISM in mechs):
            section("element", lambda: _element(b, element_records))
        if "cli" in sections:
            cli_mechs = mechs if mechs is not None else (set(QUICK_CLI) if quick else None)
            section("cli", lambda: _cli(b, sizes, cli_mechs, big))
        if "runners" in sections and not quick:
            section("runners", lambda: _runners(b, sizes[0], mechs))
        if "bounding" in sections:
            section("bounding", lambda: _bounding(sizes, tmp, b.script, progress, bench=b))
        if "startup" in sections and mechs is None:
            section("startup", lambda: _startup(b, 1 if quick else STARTUP_ROUNDS))
        if "sources" in sections:
            def sources_section():
                from ldp_beam.pipelines.bench_sources import run as sources

                recs = sources(sizes, tmp, progress, repeats=1) if quick else \
                    sources(sizes, tmp, progress)
                return _with_reference(b, recs, tmp)
            section("sources", sources_section)
        if "stream" in sections and mechs is None:
            section("stream", lambda: stream_bench(tmp, progress, quick=quick, stamp=b.stamp,
                                                   env=b.env))
        if "stream-soak" in sections and mechs is None:
            section("stream-soak", lambda: stream_soak(
                soak if soak is not None else SOAK_SECONDS, tmp, progress, stamp=b.stamp,
                env=b.env))
    total = time.perf_counter() - t0
    for r in out:
        r.setdefault("pipeline_bench_seconds", total)
    b.note(f"pipeline benchmarks: {total:.0f} s")
    if failed:
        raise BenchFailed(out, failed)
    return out


class BenchFailed(RuntimeError):
    """Some sections failed: ``records`` holds the others' records, ``failures`` each failure."""

    def __init__(self, records: list[dict], failures: list[str]) -> None:
        super().__init__("pipeline bench sections failed:\n" + "\n".join(failures))
        self.records = records
        self.failures = failures


def _with_reference(b: _Bench, recs: list[dict], tmp: str) -> list[dict]:
    """The sources bench's records (issue 15, ``bench_sources``) with ``ratio_to_reference``
    too: the reference on that bench's own Parquet file of the same size (skipped sources:
    None). Its target stays its own (``ratio_to_parquet``)."""
    refs: dict[int, float] = {}
    for r in recs:
        n, path = r["rows"], os.path.join(tmp, f"sources-{r['rows']}.parquet")
        if n not in refs and os.path.exists(path):
            b.note(f"reference: plain Beam GRR on the sources bench's Parquet ({n:,} rows)")
            cfg = {"mode": "reference", "path": path, "ref_column": "x",
                   "ref_epsilon": REF_EPSILON, "rows": n, "beam_args": RUNNERS["DirectRunner"]}
            refs[n] = b.best([cfg], n)[0][0]
        secs = r.get("seconds")
        r["reference_seconds"] = refs.get(n)
        r["ratio_to_reference"] = refs[n] / secs if secs and n in refs else None
        r.setdefault("path", "api")
        r.setdefault("target_of", "ratio_to_parquet" if "ratio_to_parquet" in r else None)
        r.update(b.stamp)
    return recs


def _api_cfg(b: _Bench, name: str, n: int, runner: str, mode: str = "api") -> dict:
    params, cols, file, _ = CASES[name]
    return {"mechanism": name, "params": params, "columns": cols, "rows": n,
            "path": b.file(file, n), "mode": mode, "beam_args": RUNNERS[runner]}


def _api(b: _Bench, sizes, mechs) -> list[dict]:
    """ReadTable | Perturb | EstimateGlobally against the reference on each input file, both
    measured in the same rounds."""
    out = []
    names = [m for m in CASES if mechs is None or m in mechs]
    for n in sizes:
        files = sorted({CASES[m][2] for m in names})
        cfgs = [b.ref_cfg(f, n) for f in files] + [_api_cfg(b, m, n, "DirectRunner")
                                                   for m in names]
        b.note(f"api: reference on {', '.join(files)} and {', '.join(names)} ({n:,} rows)")
        res = b.best(cfgs, n)
        for f, (secs, _) in zip(files, res):
            b.refs[("file", f, n, "DirectRunner")] = secs
        for m, (secs, rss) in zip(names, res[len(files):]):
            ref = b.refs[("file", CASES[m][2], n, "DirectRunner")]
            out.append(b.record("api", "pipeline", m, CASES[m][0].get("epsilon"), "batched", n,
                                secs, rss, ref, "DirectRunner", TARGETS["api"],
                                "ReadTable | Perturb | EstimateGlobally on the reference's file, "
                                "Beam's start-up included"))
    return out


def _runners(b: _Bench, n: int, mechs) -> list[dict]:
    """The batched path on the multi-process DirectRunner against the reference on the same
    runner (10^6 rows; not repeated at 10^7: the graph is the same)."""
    out = []
    names = [m for m in ("grr", "bisample-md") if mechs is None or m in mechs]
    for runner in RATIO_RUNNERS:
        for m in names:
            file = CASES[m][2]
            b.note(f"api: {m} ({n:,} rows, {runner}), with the reference on that runner")
            # interleaved with the reference, each the fastest of RUNNER_ROUNDS: two worker
            # processes on 2 cores move single runs by ±0.1 (0.84-1.01 in two quiet runs)
            (ref, _), (secs, rss) = b.best([b.ref_cfg(file, n, runner),
                                            _api_cfg(b, m, n, runner)], n,
                                           rounds=max(b.rounds, RUNNER_ROUNDS)
                                           if b.rounds > 1 else 1)
            key = ("file", file, n, runner)
            b.refs[key] = min(ref, b.refs.get(key, ref))
            ref = b.refs[key]
            out.append(b.record("api", "pipeline", m, CASES[m][0].get("epsilon"), "batched", n,
                                secs, rss, ref, runner, TARGETS["api"],
                                "ReadTable | Perturb | EstimateGlobally against the reference "
                                "on the same runner; peak RSS of the pipeline's own process"))
    return out


def _startup_commands() -> dict[str, list[str]]:
    """What users run, by this bench's Python: ``import ldp_beam``, and the installed
    ``ldp-beam`` console script with ``--help`` (run by the interpreter itself, so a launcher
    shim such as pyenv's, ~0.2 s of shell, is not timed; the same entry point if the script is
    not beside the interpreter)."""
    script = os.path.join(os.path.dirname(sys.executable), "ldp-beam")
    if os.path.isfile(script):
        with open(script, "rb") as fh:
            python_script = fh.read(2) == b"#!" and b"python" in fh.readline()
    else:
        python_script = False
    help_cmd = [sys.executable, script, "--help"] if python_script else \
        [sys.executable, "-c", "import sys; from ldp_beam.pipelines.cli import entry; "
                               "sys.argv[0] = 'ldp-beam'; sys.exit(entry())", "--help"]
    return {"import ldp_beam": [sys.executable, "-c", "import ldp_beam"],
            "ldp-beam --help": help_cmd}


def _startup(b: _Bench, rounds: int) -> list[dict]:
    """Seconds for a fresh process to ``import ldp_beam`` and to print ``ldp-beam --help`` (the
    interpreter's own start included): the fastest of ``rounds``, interleaved. Absolute seconds,
    not ratios: issue 16 states these two targets so (< 0.3 s, < 0.6 s: nothing heavy is
    imported until used)."""
    cmds = _startup_commands()
    best = dict.fromkeys(cmds, float("inf"))
    b.note(f"start-up: {', '.join(cmds)} ({rounds} rounds)")
    for _ in range(rounds):
        for name, cmd in cmds.items():
            t = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=b.env)
            secs = time.perf_counter() - t
            if r.returncode != 0:
                raise RuntimeError(f"{name} failed: {r.stderr[-2000:]}")
            best[name] = min(best[name], secs)
    out = []
    for name, secs in best.items():
        target = STARTUP_TARGETS[name]
        out.append(make_record("bench", "none", "-", None, "start-up seconds", secs,
                               stage="startup", path="cli", mode=name, seconds=secs,
                               target=target, target_of="seconds",
                               meets_target=bool(secs < target), rounds=rounds,
                               note=f"a fresh process, the fastest of {rounds}: "
                                    f"{' '.join(os.path.basename(c) for c in cmds[name][:2])}"
                                    f"{' ...' if len(cmds[name]) > 2 else ''}",
                               **b.stamp))
    return out


def _element(b: _Bench, n: int) -> list[dict]:
    """Single records generated inside the pipeline (no beam.Create of the data), perturbed with
    a record id as key and estimated, against plain Beam doing per-record numpy RR."""
    params, cols, _, _ = CASES[ELEMENT_MECHANISM]
    ref_cfg = {"mode": "reference-element", "rows": n, "ref_epsilon": REF_EPSILON,
               "beam_args": RUNNERS["DirectRunner"]}
    cfg = {"mechanism": ELEMENT_MECHANISM, "params": params, "columns": cols, "rows": n,
           "path": None, "mode": "element", "beam_args": RUNNERS["DirectRunner"]}
    b.note(f"element: plain Beam per-record reference and {ELEMENT_MECHANISM} ({n:,} records)")
    (ref, _), (secs, rss) = b.best([ref_cfg, cfg], n, rounds=1)  # seconds-long runs
    return [b.record("element", "pipeline", ELEMENT_MECHANISM, params["epsilon"], "element", n,
                     secs, rss, ref, "DirectRunner", TARGETS["element"],
                     "records generated in the pipeline | Perturb(key_column=rid) | "
                     "EstimateGlobally, against plain Beam doing per-record numpy RR and a count "
                     "CombineFn on the same records", reference="plain Beam per-record RR")]


def _pargs(params: dict) -> list[str]:
    """Mechanism parameters as ``--epsilon`` and ``-p NAME=VALUE`` (tuples comma-separated)."""
    out = []
    for k, v in params.items():
        if k == "epsilon":
            out += ["--epsilon", str(v)]
        else:
            out += ["-p", f"{k}={','.join(v) if isinstance(v, tuple) else v}"]
    return out


def _roles(params_cols: dict) -> list[str]:
    out = []
    for role, col in params_cols.items():
        out += ["--role", f"{role}={col}"]
    return out


def _cli(b: _Bench, sizes, mechs, big: bool) -> list[dict]:
    """``ldp-beam collect`` then ``ldp-beam estimate``, and central releases from raw rows, as
    subprocesses timed from outside, against the reference on the same file; then each command's
    peak RSS growth from 10^6 rows to the largest size."""
    out: list[dict] = []
    rss: dict[tuple, dict] = {}  # (command, mechanism) -> {rows: peak RSS}
    seconds: dict[tuple, float] = {}  # (command, mechanism, rows) -> wall seconds
    ldp = [m for m in CASES if mechs is None or m in mechs]
    central = [m for m in RELEASES if mechs is None or m in mechs]
    for n in sizes:
        target = TARGETS["cli"] if n >= CLI_TARGET_ROWS else None
        for m in ldp:
            params, cols, file, extra = CASES[m]
            src = b.file(file, n)
            ref = b.reference(file, n)
            reports = os.path.join(b.tmp, f"{m}-{n}.reports.parquet")
            est = os.path.join(b.tmp, f"{m}-{n}.estimate.json")
            b.note(f"cli: ldp-beam collect + estimate, {m} ({n:,} rows)")
            runs = []  # each round: (collect s, estimate s, collect RSS, estimate RSS)
            for k in range(b.rounds):
                ledger = os.path.join(b.tmp, f"ledger-{m}-{n}-{k}.db")
                c = b.cli(["collect", "-i", src, "-m", m, *_pargs(params), *_roles(cols),
                           *extra, "-o", reports], ledger)
                e = b.cli(["estimate", "-i", reports, "-o", est], ledger)
                runs.append((c[0], e[0], c[1], e[1]))
                if k + 1 < b.rounds:
                    for f in (reports, est):
                        _remove_outputs(f)
            # the fastest round's times; each command's largest peak over the rounds
            c_secs, e_secs = min(runs, key=lambda r: r[0] + r[1])[:2]
            c_rss, e_rss = max(r[2] for r in runs), max(r[3] for r in runs)
            secs = c_secs + e_secs
            rss.setdefault(("collect", m), {})[n] = c_rss
            rss.setdefault(("estimate", m), {})[n] = e_rss
            seconds[("collect", m, n)], seconds[("estimate", m, n)] = c_secs, e_secs
            out.append(b.record(
                "cli", "pipeline", m, params.get("epsilon"), "collect+estimate", n, secs,
                max(c_rss, e_rss), ref, "DirectRunner", target,
                "`ldp-beam collect` then `ldp-beam estimate` as subprocesses, start-up counted; "
                "peak_rss_mb: the larger of the two processes' own peaks" +
                ("" if target else "; the issue's target is at 10^7 rows"),
                collect_seconds=c_secs, estimate_seconds=e_secs, collect_peak_rss_mb=c_rss,
                estimate_peak_rss_mb=e_rss, command="collect+estimate",
                collect_args=" ".join(extra) or None))
            for f in (reports, est):
                _remove_outputs(f)
        for m in central:
            params, cols, file = RELEASES[m]
            src = b.file(file, n)
            ref = b.reference(file, n)
            rel = os.path.join(b.tmp, f"{m}-{n}.release.json")
            b.note(f"cli: ldp-beam estimate -m {m}, a central release from raw rows ({n:,} rows)")
            runs = []
            for k in range(b.rounds):
                runs.append(b.cli(["estimate", "-i", src, "-m", m, *_pargs(params),
                                   *_roles(cols), "-o", rel],
                                  os.path.join(b.tmp, f"ledger-{m}-{n}-{k}.db")))
                if k + 1 < b.rounds:
                    _remove_outputs(rel)
            secs, r_rss = min(x[0] for x in runs), max(x[1] for x in runs)
            rss.setdefault(("release", m), {})[n] = r_rss
            seconds[("release", m, n)] = secs
            out.append(b.record(
                "cli", "pipeline", m, params.get("epsilon"), "release", n, secs, r_rss, ref,
                "DirectRunner", target,
                "`ldp-beam estimate -m RELEASE` from raw rows as a subprocess, start-up counted" +
                ("" if target else "; the issue's target is at 10^7 rows"), command="release"))
            _remove_outputs(rel)
    if big and (mechs is None or "bisample-md" in mechs):
        n = 30_000_000
        params, cols, file, extra = CASES["bisample-md"]
        src = b.file(file, n)
        reports = os.path.join(b.tmp, f"bisample-md-{n}.reports.parquet")
        b.note(f"cli: ldp-beam collect --keep, bisample-md ({n:,} rows)")
        c_secs, c_rss = b.cli(["collect", "-i", src, "-m", "bisample-md", *_pargs(params),
                               *_roles(cols), *extra, "-o", reports])
        rss[("collect", "bisample-md")][n] = c_rss
        seconds[("collect", "bisample-md", n)] = c_secs
        _remove_outputs(reports)
        b.reference(file, n)
        os.remove(src)
    for (command, m), by_n in rss.items():
        if len(by_n) < 2 or min(by_n) != sizes[0]:
            continue
        largest = max(by_n)
        growth = by_n[largest] / by_n[sizes[0]] - 1.0
        file = (CASES[m][2] if m in CASES else RELEASES[m][2])
        ref = b.refs[("file", file, largest, "DirectRunner")]
        secs = seconds[(command, m, largest)]
        rec = make_record(
            "bench", "synthetic", m, None, f"peak RSS growth ({command})", growth, stage="memory",
            path="cli", command=command, mode=command, runner="DirectRunner", rows=largest,
            seconds=secs,
            rows_per_second=largest / secs, peak_rss_mb=by_n[largest],
            peak_rss_mb_by_rows={str(k): v for k, v in sorted(by_n.items())},
            rss_growth=growth, reference_seconds=ref, ratio_to_reference=ref / secs,
            target=TARGETS["memory"], target_of="rss_growth",
            meets_target=bool(growth <= TARGETS["memory"]),
            note=f"`ldp-beam {command}` peak RSS at {largest:,} rows / at {sizes[0]:,} - 1 (the "
                 "process's own VmHWM); ratio_to_reference: this command alone at the largest "
                 "size (reference seconds / seconds)", **b.stamp)
        out.append(rec)
    return out


def _remove_outputs(path: str) -> None:
    """A run's output and its side files (manifest, dead letters, curator notes)."""
    folder, base = os.path.split(path)
    stem = base.rsplit(".", 1)[0]
    for f in os.listdir(folder):
        if f.startswith(base) or f.startswith(stem + "."):
            full = os.path.join(folder, f)
            if os.path.isfile(full):
                os.remove(full)


BOUNDING_ROUNDS = 3  # rounds of the bounded/unbounded comparison at every size (full bench)


def _bounding(sizes, tmp: str, script: str, progress=None, bench: _Bench | None = None
              ) -> list[dict]:
    """The cost of bounding each privacy unit (10 rows per unit, one report kept) against the
    same pipeline without it, on the same file in the same run (issue 14: at most 2x, memory
    flat), and both against the reference on that file."""
    b = bench if bench is not None else _Bench(tmp, progress, rounds=1)
    params, cols = {"epsilon": 1.0, "lower": 0.0, "upper": 100.0}, {"value": "x"}
    out = []
    peak: dict[int, float] = {}  # rows -> the bounded run's peak RSS
    refs: dict[int, float] = {}  # rows -> the reference's seconds

    def cfg(path: str, n: int, mode: str) -> dict:
        return {"mechanism": "bisample", "params": params, "columns": cols, "rows": n,
                "path": path, "mode": mode, "beam_args": RUNNERS["DirectRunner"]}

    for n in sizes:
        path = b.file("units", n)
        cfgs = [b.ref_cfg("units", n)] + [cfg(path, n, mode) for mode in ("api", "bounded")]
        if progress is not None:
            progress.note(f"pipeline bisample with and without a privacy unit ({n:,} rows)")
        # a ratio of two pipelines: each the fastest of 3 interleaved fresh-process rounds at
        # every size (one round at 10^7 moved it between 1.82x and 2.14x in two quiet runs)
        (ref, _), *runs = b.best(cfgs, n, rounds=1 if b.rounds == 1 else BOUNDING_ROUNDS)
        refs[n], unbounded = ref, runs[0][0]
        for mode, (secs, rss) in zip(("batched", "bounded"), runs):
            rec = b.record("api", "bounding", "bisample", params["epsilon"], mode, n, secs,
                           rss, ref, "DirectRunner", None,
                           "ReadTable [| BoundContributions(uid, 1 report per unit)] | "
                           "Perturb | EstimateGlobally, start-up included",
                           dataset_note="synthetic, 10 rows per unit")
            if mode == "bounded":
                rec["ratio_to_unbounded"] = secs / unbounded
                rec["target"] = 2.0
                rec["target_of"] = "ratio_to_unbounded"
                rec["meets_target"] = bool(rec["ratio_to_unbounded"] <= 2.0)
                rec["units"] = n // 10
                peak[n] = rss
                if n != sizes[0]:  # ten times the units: the sketch grows with them
                    rec["rss_growth_vs_smallest"] = rss / peak[sizes[0]] - 1.0
            out.append(rec)
    big = max(sizes)
    if big > sizes[0]:
        # the rows x10 at the units of the smallest run: memory follows units, not rows
        if progress is not None:
            progress.note(f"pipeline bisample with a privacy unit, 100 rows a unit ({big:,} "
                          f"rows)")
        (secs, rss), = b.best([cfg(b.file("units100", big), big, "bounded")], big)
        growth = rss / peak[sizes[0]] - 1.0
        rec = b.record("api", "bounding", "bisample", params["epsilon"], "bounded-fixed-units",
                       big, secs, rss, refs[big],
                       "DirectRunner", None,
                       f"ReadTable | BoundContributions(uid, 1 report per unit) | Perturb | "
                       f"EstimateGlobally on {big // 100:,} units of 100 rows, against the "
                       f"bounded run on {sizes[0]:,} rows ({sizes[0] // 10:,} units of 10): the "
                       f"same units, {big // sizes[0]}x the rows; reference: the 10-rows-a-unit "
                       f"file's (same rows and value column)",
                       dataset_note="synthetic, 100 rows per unit")
        rec.update(units=big // 100, rss_growth=growth, target=0.15, target_of="rss_growth",
                   meets_target=bool(growth <= 0.15))
        out.append(rec)
    return out


# -- live telemetry through Google's Pub/Sub emulator (issue 24) ------------------------------

#: issue 24's goals: the lander at least half the plain pull client's messages/s on the same
#: backlog, and at least 20,000 reports/s with batched messages
STREAM_TARGETS = {"ratio_to_plain_pull": 0.5, "reports_per_second": 20_000}
#: backlog sizes: single-report messages (plain pull and lander, ``rounds`` interleaved
#: rounds), batched reports (``per_message`` a message), Beam's backlog (single-report
#: messages) and how long Beam may take to drain it
#: messages; 50 reports a message keep 1,000 messages (a full pull batch of the lander)
#: under its 8 MiB batch cap. The batched backlog is not a multiple of 1,000 messages: a
#: `--once` drain ends at the first batch of fewer than 1,000, so an exact multiple would
#: wait out one more (empty) pull of 5 s, a cost of that coincidence rather than of the path.
STREAM_SIZES = {
    False: {"messages": 20_000, "rounds": 3, "reports": 210_000, "per_message": 50,
            "batched_rounds": 2, "beam_messages": 5_000, "beam_seconds": 40.0},
    True: {"messages": 10_000, "rounds": 2, "reports": 105_000, "per_message": 50,
           "batched_rounds": 1, "beam_messages": 2_000, "beam_seconds": 25.0},
}
STREAM_EPSILON = 2.0
SOAK_SECONDS = 300.0  # ``--only stream-soak`` without ``--soak SECONDS``
SOAK_RATE = 500.0  # reports/s published during the soak

# Beam's ReadFromPubSub on the DirectRunner (--streaming), draining a backlog: run(), count
# what reaches a DoFn (a side file per bundle, read here), stop at the count or the deadline
# with cancel() (given 5 s: it takes ~30 s on the DirectRunner) and leave with os._exit.
_BEAM_PUBSUB_CHILD = r"""
import json, os, sys, threading, time


def main():
    cfg = json.loads(sys.argv[1])
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    side = cfg["side"]

    class Count(beam.DoFn):
        def start_bundle(self):
            self.n, self.first = 0, None

        def process(self, msg):
            if self.first is None:
                self.first = time.time()
            self.n += 1

        def finish_bundle(self):
            if self.n:
                with open(side, "a") as fh:
                    fh.write(f"{self.n} {self.first} {time.time()}\n")

    p = beam.Pipeline(options=PipelineOptions(["--streaming", "--runner=DirectRunner"]))
    _ = (p | beam.io.ReadFromPubSub(subscription=cfg["subscription"], with_attributes=True)
         | beam.ParDo(Count()))
    started = time.time()
    result = p.run()
    deadline = time.monotonic() + cfg["timeout"]
    rows = []
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            with open(side) as fh:
                rows = [line.split() for line in fh if line.strip()]
        except FileNotFoundError:
            rows = []
        if sum(int(r[0]) for r in rows) >= cfg["expected"]:
            break
    stopper = threading.Thread(target=result.cancel, daemon=True)
    stopper.start()
    stopper.join(5.0)
    with open(side) as fh:
        rows = [line.split() for line in fh if line.strip()]
    print(json.dumps({"messages": sum(int(r[0]) for r in rows), "started": started,
                      "first": min((float(r[1]) for r in rows), default=None),
                      "last": max((float(r[2]) for r in rows), default=None),
                      "bundles": len(rows)}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
"""


class _SectionFailed(RuntimeError):
    """A section failed after some of its records were measured: they are kept."""

    def __init__(self, message: str, records: list[dict]) -> None:
        super().__init__(message)
        self.records = records


def _stream_record(mode: str, metric: str, value: Any, stamp: dict, note: str,
                   target: float | None = None, target_of: str | None = None,
                   **extra: Any) -> dict:
    return make_record(
        "bench", "synthetic", "grr", STREAM_EPSILON, metric, value, stage="stream",
        path="pubsub", mode=mode, broker="Google's Pub/Sub emulator on 127.0.0.1",
        target=target, target_of=target_of,
        meets_target=None if target is None or value is None else bool(value >= target),
        note=note, **extra, **(stamp or {}))


def _stream_values(n: int, rng: Any) -> list[str]:
    """``n`` skewed labels of the 20 (as the element path's records)."""
    codes = _np().minimum(rng.geometric(0.15, n) - 1, 19)
    return [_LABELS[c] for c in codes.tolist()]


def _np():
    import numpy as np

    return np


def _publish(topic: str, mech: Any, values: list[str], per_message: int,
             event_time: float | None = None) -> float:
    """Publish ``values`` as reports (``per_message`` a message) through the device client;
    returns the seconds it took."""
    from ldp_beam.client import Reporter

    t = time.perf_counter()
    with Reporter(mech, device_id=f"bench-{os.getpid()}", topic=topic, batch_size=10_000,
                  reports_per_message=per_message) as rep:
        receipt = rep.report_many(values, event_time)
    if receipt.published != len(values):
        raise RuntimeError(f"published {receipt.published:,} of {len(values):,} reports")
    return time.perf_counter() - t


def _land(sub: str, spool: str, messages: int, subscriber: Any, timeout: float = 120.0
          ) -> tuple[Any, float]:
    """The lander on ``sub`` until ``messages`` were landed and acked: (its stats, seconds,
    the landed record's opening included)."""
    from ldp_beam.transforms.pubsub_lander import Lander

    t = time.perf_counter()
    lander = Lander(sub, spool, subscriber=subscriber)
    with lander:
        lander.run(timeout, stop_when=lambda ld: ld.stats.messages >= messages)
    secs = time.perf_counter() - t
    if lander.stats.messages < messages:
        raise RuntimeError(f"the lander received {lander.stats.messages:,} of {messages:,} "
                           f"messages in {timeout:g} s")
    return lander.stats, secs


def _stream_skipped(why: str, stamp: dict | None, mode: str = "all") -> list[dict]:
    rec = _stream_record(mode, "skipped", None, stamp or {}, f"not measured: {why}")
    rec["skipped"] = why
    return [rec]


def stream_bench(tmp: str, progress: Any = None, *, quick: bool = False,
                 sizes: dict | None = None, stamp: dict | None = None,
                 env: dict | None = None) -> list[dict]:
    """``bench --only stream``: live telemetry through Google's Pub/Sub emulator, started here
    on the loopback address (and always stopped), every rate measured in this run:

    * ``plain-pull``: a plain pull-and-ack client (:func:`~ldp_beam.transforms.pubsub_lander.
      drain_plain`: no parsing, no disk) draining a backlog of single-report messages published
      by :class:`~ldp_beam.client.Reporter`: the broker's own rate;
    * ``lander``: the :class:`~ldp_beam.transforms.pubsub_lander.Lander` landing the same
      backlog (another subscription of the same topic: pull, fsync, record the ids, rename into
      the spool, ack); its value is the ratio of its messages/s to the plain client's (goal
      >= 0.5). The two run in interleaved rounds after an unmeasured warm-up round (the
      emulator's JVM is slower at first), the fastest round of each kept;
    * ``lander-batched``: the lander on messages of ``per_message`` reports, in reports/s (goal
      >= 20,000);
    * ``end-to-end``: :func:`~ldp_beam.pipelines.pubsub_stream.run_pubsub_stream` with
      ``once=True`` on the same batched backlog: landed, then windowed and estimated by the
      spool stream (Beam's start-up included; the landing ends with one empty pull of up to
      1 s), reports/s over its wall time, beside the same goal;
    * ``beam-pubsub``: Beam's ``ReadFromPubSub`` (``--streaming`` DirectRunner, in a fresh
      process) draining a backlog of single-report messages, messages/s from its first
      element to its last (its start-up excluded), beside the plain client; no goal.

    Without Java, the emulator or the Pub/Sub client, one record says so (``skipped``)."""
    from .pubsub_emulator import PubSubEmulator, unavailable

    why = unavailable()
    if why:
        if progress is not None:
            progress.note(f"stream: skipped: {why}")
        return _stream_skipped(why, stamp)
    cfg = dict(STREAM_SIZES[bool(quick)], **(sizes or {}))
    say = progress.note if progress is not None else (lambda text: None)
    from ldp_beam.registry import build_mechanism

    mech = build_mechanism("grr", epsilon=STREAM_EPSILON, domain=_LABELS)
    rng = _np().random.default_rng()
    out: list[dict] = []
    folder = tempfile.mkdtemp(prefix="stream-", dir=tmp)
    say("stream: starting Google's Pub/Sub emulator")
    with PubSubEmulator(start_timeout=90, heap="512m") as emu:
        try:
            _stream_measure(emu, mech, cfg, folder, rng, say, out, stamp or {}, env)
        except Exception as exc:
            raise _SectionFailed(f"{type(exc).__name__}: {str(exc)[-1500:]}", out) from exc
    return out


def _stream_measure(emu: Any, mech: Any, cfg: dict, folder: str, rng: Any, say: Any,
                    out: list[dict], stamp: dict, env: dict | None) -> None:
    from google.cloud import pubsub_v1

    from ldp_beam.transforms.pubsub_lander import drain_plain

    from .pubsub_stream import run_pubsub_stream

    n, rounds = cfg["messages"], cfg["rounds"]
    client = pubsub_v1.SubscriberClient()
    try:
        # warm-up (not measured): the emulator's JVM compiles its hot paths on first use
        topic = emu.topic()
        warm = [emu.subscription(topic, ack_deadline=60) for _ in range(2)]
        _publish(topic, mech, _stream_values(n, rng), 1)
        drain_plain(warm[0], expected=n, timeout=60, subscriber=client)
        _land(warm[1], os.path.join(folder, "warm"), n, client)

        # one backlog of n single-report messages, a subscription per measured run
        topic = emu.topic()
        subs = [(emu.subscription(topic, ack_deadline=60), emu.subscription(topic,
                                                                            ack_deadline=60))
                for _ in range(rounds)]
        pub_secs = _publish(topic, mech, _stream_values(n, rng), 1)
        say(f"stream: published {n:,} single-report messages ({n / pub_secs:,.0f}/s); plain "
            f"pull client and lander, {rounds} interleaved rounds")
        plain, landed = [], []
        for k, (plain_sub, land_sub) in enumerate(subs):
            got, secs = drain_plain(plain_sub, expected=n, timeout=60, subscriber=client)
            if got != n:
                raise RuntimeError(f"the plain pull client received {got:,} of {n:,} messages")
            plain.append(secs)
            stats, secs = _land(land_sub, os.path.join(folder, f"spool-{k}"), n, client)
            if stats.landed != n:
                raise RuntimeError(f"the lander landed {stats.landed:,} of {n:,} reports")
            landed.append(secs)
        plain_rate, land_rate = n / min(plain), n / min(landed)
        ratio = land_rate / plain_rate
        goal = STREAM_TARGETS["ratio_to_plain_pull"]
        out.append(_stream_record(
            "plain-pull", "messages/s", plain_rate, stamp,
            "a plain pull-and-ack client (no parsing, no disk) draining a backlog of "
            "single-report messages: the broker's own rate; the fastest of the rounds",
            messages=n, seconds=min(plain), rounds=rounds,
            all_rates=[round(n / s) for s in plain], publish_messages_per_second=n / pub_secs))
        out.append(_stream_record(
            "lander", "ratio to plain pull", ratio, stamp,
            "the lander (pull, fsync, ids recorded, rename into the spool, ack) on the same "
            "backlog (another subscription of the topic), rounds interleaved with the plain "
            "client's; value: its messages/s over the plain client's (both the fastest round)",
            target=goal, target_of="ratio_to_plain_pull", messages=n, seconds=min(landed),
            rounds=rounds, messages_per_second=land_rate, plain_pull_messages_per_second=
            plain_rate, ratio_to_plain_pull=ratio, all_rates=[round(n / s) for s in landed]))
        say(f"stream: plain pull {plain_rate:,.0f} messages/s; lander {land_rate:,.0f} "
            f"messages/s = {ratio:.2f} of it (goal >= {goal:g}: "
            f"{'met' if ratio >= goal else 'NOT MET'})")

        # batched: m reports, per_message a message
        m, per, brounds = cfg["reports"], cfg["per_message"], cfg["batched_rounds"]
        topic = emu.topic()
        bsubs = [emu.subscription(topic, ack_deadline=60) for _ in range(brounds + 1)]
        msgs = -(-m // per)
        pub_secs = _publish(topic, mech, _stream_values(m, rng), per, time.time() - 30)
        say(f"stream: published {m:,} reports in {msgs:,} messages of {per} "
            f"({m / pub_secs:,.0f} reports/s); the lander, then run_pubsub_stream(once=True)")
        bsecs = []
        for k, sub in enumerate(bsubs[:-1]):
            stats, secs = _land(sub, os.path.join(folder, f"batched-{k}"), msgs, client)
            if stats.landed != m:
                raise RuntimeError(f"the lander landed {stats.landed:,} of {m:,} reports")
            bsecs.append(secs)
        rate = m / min(bsecs)
        goal = STREAM_TARGETS["reports_per_second"]
        out.append(_stream_record(
            "lander-batched", "reports/s", rate, stamp,
            f"the lander on messages of {per} reports (JSON lines, each with its id and event "
            f"time), landed and acked; the fastest of {brounds}",
            target=goal, target_of="reports_per_second", reports=m, messages=msgs,
            reports_per_message=per, seconds=min(bsecs), rounds=brounds,
            messages_per_second=msgs / min(bsecs), reports_per_second=rate,
            all_rates=[round(m / s) for s in bsecs], publish_reports_per_second=m / pub_secs))
        say(f"stream: lander, batched: {rate:,.0f} reports/s (goal >= {goal:,}: "
            f"{'met' if rate >= goal else 'NOT MET'})")
    finally:
        client.close()

    e2e_out = os.path.join(folder, "e2e")
    t = time.perf_counter()
    # the lander's defaults, as `ldp-beam stream --subscription --once` runs it
    summary = run_pubsub_stream(bsubs[-1], e2e_out, mech, once=True, window_seconds=60.0,
                                progress=False, drain_seconds=120.0)
    secs = time.perf_counter() - t
    in_windows = summary["records"]["in_windows"]
    if summary["lander"]["landed"] != m or in_windows != m or summary["reconciles"] is not True:
        raise RuntimeError(f"run_pubsub_stream: {m:,} reports published, "
                           f"{summary['lander']['landed']:,} landed, {in_windows:,} estimated "
                           f"(reconciles: {summary['reconciles']})")
    rate = m / secs
    out.append(_stream_record(
        "end-to-end", "reports/s", rate, stamp,
        "run_pubsub_stream(once=True) on the same batched backlog, as `ldp-beam stream "
        "--subscription --once` runs it: landed (the drain ends at the first batch of fewer "
        "than 1,000 messages), then windowed and estimated by the spool stream on the "
        "DirectRunner, Beam's start-up included; reports/s over its wall time (the 20,000 "
        "reports/s goal is the lander's: lander-batched)",
        reports=m, messages=msgs,
        reports_per_message=per, seconds=secs, reports_per_second=rate,
        landing_seconds=summary["lander"]["seconds"], stream_seconds=summary["seconds"],
        windows=summary["windows"], reconciles=summary["reconciles"]))
    say(f"stream: end to end (land, window, estimate): {rate:,.0f} reports/s in {secs:.1f} s "
        f"(landing {summary['lander']['seconds']:.1f} s, stream {summary['seconds']:.1f} s; "
        f"no goal of its own)")

    # Beam's ReadFromPubSub on the DirectRunner, in a fresh process
    nb = cfg["beam_messages"]
    topic = emu.topic()
    sub = emu.subscription(topic, ack_deadline=60)
    _publish(topic, mech, _stream_values(nb, rng), 1)
    say(f"stream: Beam's ReadFromPubSub (DirectRunner, --streaming) draining {nb:,} messages")
    script = os.path.join(folder, "beam_pubsub.py")
    with open(script, "w") as fh:
        fh.write(_BEAM_PUBSUB_CHILD)
    side = os.path.join(folder, "beam-counts.txt")
    child = {"subscription": sub, "side": side, "timeout": cfg["beam_seconds"],
             "expected": nb}
    r = subprocess.run([sys.executable, script, json.dumps(child)], capture_output=True,
                       text=True, timeout=cfg["beam_seconds"] + 120,
                       env=dict(env or os.environ, **emu.env()))
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"Beam's ReadFromPubSub child failed ({r.returncode}): "
                           f"{r.stderr[-1500:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    span = (got["last"] - got["first"]) if got["messages"] else None
    beam_rate = got["messages"] / span if span else None
    out.append(_stream_record(
        "beam-pubsub", "messages/s", beam_rate, stamp,
        "Beam's ReadFromPubSub(with_attributes=True) on the DirectRunner (--streaming, a "
        "fresh process) draining a backlog of single-report messages to a counting DoFn: "
        "messages/s from its first element to its last (start-up excluded); stopped with "
        "cancel(); at most once on the DirectRunner (it acks on pull); no goal",
        messages=got["messages"], expected=nb, seconds=span,
        seconds_with_startup=(got["last"] - got["started"]) if got["messages"] else None,
        bundles=got["bundles"], drained=got["messages"] >= nb,
        ratio_to_plain_pull=None if beam_rate is None else beam_rate / plain_rate,
        plain_pull_messages_per_second=plain_rate))
    say(f"stream: Beam's ReadFromPubSub: {got['messages']:,} of {nb:,} messages, "
        + ("none" if beam_rate is None else f"{beam_rate:,.0f} messages/s = "
           f"{beam_rate / plain_rate:.2f} of the plain pull client"))


def _rss_mb(pid: int) -> float | None:
    """A process's resident set (MiB): psutil if installed, else /proc/PID/status VmRSS."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss / 2 ** 20
        except psutil.Error:
            return None
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def rss_trend(samples: list[tuple[float, float]], warmup: float) -> dict:
    """What the soak says about memory, from ``(seconds since start, RSS MiB)`` samples.

    The samples after ``warmup`` seconds (imports, the first windows) are fitted with a least
    squares line. ``slope_mb_per_10min`` is its slope; ``growth_mb`` its rise over the fitted
    span; ``noise_mb`` the standard deviation of the samples around it (the collector's RSS
    jitters with garbage collection, bundles, the lander's batches); ``growth_se_mb`` the
    standard error of that rise. Memory is *flat* when the rise stays within what that noise
    explains, ``bound_mb`` = max(3 x noise + 3 x growth_se, 2% of the median RSS): a rise
    larger than three standard deviations of the jitter (and than its own uncertainty) is a
    trend, not noise; the 2% floor keeps a nearly noiseless run from flagging a few hundred
    KiB. ``bound_mb_per_10min`` is that bound as a slope over the fitted span."""
    np = _np()
    pts = [(t, r) for t, r in samples if t >= warmup and r is not None]
    if len(pts) < 3:
        raise ValueError(f"{len(pts)} RSS samples after the {warmup:g} s warm-up: too few to "
                         "fit a trend (a longer soak or more frequent samples)")
    t = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    tc = t - t.mean()
    sxx = float((tc ** 2).sum())
    slope = float((tc * (y - y.mean())).sum() / sxx)
    resid = y - (y.mean() + slope * tc)
    noise = float(np.sqrt((resid ** 2).sum() / (len(y) - 2)))
    span = float(t[-1] - t[0])
    growth = slope * span
    growth_se = noise / np.sqrt(sxx) * span
    bound = max(3 * noise + 3 * growth_se, 0.02 * float(np.median(y)))
    return {"samples": len(pts), "span_seconds": span, "slope_mb_per_10min": slope * 600,
            "growth_mb": growth, "noise_mb": noise, "growth_se_mb": float(growth_se),
            "bound_mb": bound, "bound_mb_per_10min": bound / span * 600 if span else None,
            "flat": bool(growth <= bound), "first_mb": float(y[0]), "last_mb": float(y[-1]),
            "max_mb": float(y.max()), "median_mb": float(np.median(y))}


def stream_soak(seconds: float, tmp: str, progress: Any = None, *, rate: float = SOAK_RATE,
                interval: float | None = None, warmup: float | None = None,
                stamp: dict | None = None, env: dict | None = None) -> list[dict]:
    """``bench --only stream-soak`` (or ``--soak SECONDS``): ``ldp-beam stream --subscription
    ... --duration SECONDS`` runs live as its own process (10 s windows, watermark lag 3 s)
    while a device publishes ``rate`` reports/s (event time now, 10 reports a message) from
    this process until ~15 s before the collector's end; the collector's RSS is sampled every
    ``interval`` seconds (default: seconds/60, within 1-10 s) and summarized by
    :func:`rss_trend` after ``warmup`` (default: 20% of the run, at most 120 s): first (after
    the warm-up), last and max RSS, the slope in MB per 10 min and whether that is flat within
    the samples' noise. The collector must estimate every published report and reconcile."""
    from .pubsub_emulator import PubSubEmulator, unavailable

    why = unavailable()
    if why:
        if progress is not None:
            progress.note(f"stream-soak: skipped: {why}")
        return _stream_skipped(why, stamp, mode="soak")
    say = progress.note if progress is not None else (lambda text: None)
    interval = interval or min(10.0, max(1.0, seconds / 60))
    warmup = min(120.0, 0.2 * seconds) if warmup is None else warmup
    folder = tempfile.mkdtemp(prefix="soak-", dir=tmp)
    out_dir = os.path.join(folder, "out")
    from ldp_beam.registry import build_mechanism

    mech = build_mechanism("grr", epsilon=STREAM_EPSILON, domain=_LABELS)
    say(f"stream-soak: starting Google's Pub/Sub emulator; then {seconds:g} s of a live "
        f"collector at {rate:g} reports/s, its RSS sampled every {interval:g} s")
    # the emulator keeps what it was sent in its JVM heap: with the default 256 MiB it stopped
    # answering (connection timeouts) after ~116k messages (1.16M reports, 38 min at 500/s),
    # twice at the same count, loaded or not; an hour at 500 reports/s is 180k messages
    with PubSubEmulator(start_timeout=90, heap="2g") as emu:
        topic = emu.topic()
        sub = emu.subscription(topic, ack_deadline=30)
        cmd = [sys.executable, "-m", "ldp_beam.pipelines.cli", "stream", "--subscription", sub,
               "-o", out_dir, "-m", "grr", "--epsilon", str(STREAM_EPSILON), "-p",
               "domain=" + ",".join(_LABELS), "--window", "10", "--watermark-lag", "3",
               "--poll", "1", "--duration", f"{seconds:g}", "--quiet"]
        log = open(os.path.join(folder, "collector.log"), "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env or os.environ,
                                                                   **emu.env()))
        stop = threading.Event()
        published: list[int] = [0]
        failure: list[BaseException] = []
        publish_until = time.monotonic() + max(1.0, seconds - 15.0)

        retries: list[int] = [0]

        def publish() -> None:
            from ldp_beam.client import PublishError, Reporter

            rng = _np().random.default_rng()
            tick = 0.2
            per_tick = max(1, int(round(rate * tick)))
            try:
                with Reporter(mech, device_id="soak-device", topic=topic, batch_size=1000,
                              reports_per_message=10) as rep:
                    nxt = time.monotonic()
                    while not stop.is_set() and time.monotonic() < publish_until:
                        try:  # counted once accepted (a retried batch may be accepted twice
                            # by the broker; the collector counts its report ids once)
                            rep.report_many(_stream_values(per_tick, rng))
                        except PublishError:
                            # as a device does: the batch is kept and sent again (same ids) by
                            # the next flush; a broker starved of CPU for a minute (a test suite
                            # on the same 2 cores) must not end the soak
                            retries[0] += 1
                            while not stop.is_set():
                                stop.wait(1.0)
                                try:
                                    rep.flush()
                                    break
                                except PublishError:
                                    retries[0] += 1
                            nxt = time.monotonic()
                        if rep.pending() == 0:
                            published[0] += per_tick
                        nxt += tick
                        stop.wait(max(0.0, nxt - time.monotonic()))
            except BaseException as exc:  # reported after the collector's end
                failure.append(exc)

        thread = threading.Thread(target=publish, name="soak-publisher", daemon=True)
        t0 = time.monotonic()
        samples: list[tuple[float, float]] = []
        try:
            thread.start()
            deadline = t0 + seconds + 120
            next_note = t0 + 60
            while proc.poll() is None and time.monotonic() < deadline:
                rss = _rss_mb(proc.pid)
                if rss is not None and proc.poll() is None:
                    samples.append((time.monotonic() - t0, rss))
                if time.monotonic() >= next_note:
                    say(f"stream-soak: {time.monotonic() - t0:.0f} s, collector RSS "
                        f"{samples[-1][1] if samples else float('nan'):.0f} MiB, "
                        f"{published[0]:,} reports published")
                    next_note += 60
                time.sleep(max(0.0, interval - (time.monotonic() - t0) % interval))
        finally:
            stop.set()
            thread.join(30)
            stop_processes([proc])
            log.close()
    with open(os.path.join(folder, "collector.log"), "rb") as fh:
        tail = fh.read()[-2000:].decode("utf-8", "replace")
    if failure:
        raise RuntimeError(f"the soak's publisher failed: {failure[0]!r}")
    if proc.returncode != 0:
        raise RuntimeError(f"the collector exited with {proc.returncode}: {tail}")
    from ldp_beam.transforms.windowed import SUMMARY

    with open(os.path.join(out_dir, SUMMARY)) as fh:
        summary = json.load(fh)
    trend = rss_trend(samples, warmup)
    in_windows = summary["records"]["in_windows"]
    rec = _stream_record(
        "soak", "RSS slope MB/10 min", trend["slope_mb_per_10min"], stamp or {},
        f"`ldp-beam stream --subscription` live for {seconds:g} s (a process of its own) while "
        f"a device published {rate:g} reports/s; its RSS every {interval:g} s; the slope of "
        f"a least-squares line through the samples after {warmup:g} s; target: the rise the "
        "samples' noise explains (rss_trend), as a slope", seconds=seconds,
        rate=rate, interval=interval, warmup=warmup, published=published[0],
        publish_retries=retries[0],
        landed=summary["lander"]["landed"], in_windows=in_windows,
        reconciles=summary["reconciles"], windows=summary["windows"],
        rss_start_mb=samples[0][1] if samples else None,
        rss_samples=[[round(t, 1), round(r, 2)] for t, r in samples], **trend)
    rec.update(target=trend["bound_mb_per_10min"], target_of="slope_mb_per_10min",
               meets_target=trend["flat"])
    say(f"stream-soak: RSS first {trend['first_mb']:.0f} MiB (after {warmup:g} s), last "
        f"{trend['last_mb']:.0f}, max {trend['max_mb']:.0f}; slope "
        f"{trend['slope_mb_per_10min']:+.2f} MB/10 min (noise {trend['noise_mb']:.2f} MB; flat "
        f"within {trend['bound_mb']:.1f} MB: {'yes' if trend['flat'] else 'NO'}); "
        f"{published[0]:,} reports published, {in_windows:,} estimated")
    if in_windows != published[0] or summary["reconciles"] is not True:
        raise _SectionFailed(f"the soak's collector estimated {in_windows:,} of "
                             f"{published[0]:,} published reports (reconciles: "
                             f"{summary['reconciles']})", [rec])
    return [rec]


# -- the README's performance table, generated from the records ------------------------------

README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


def readme_table(records: list[dict], total_seconds: float | None = None) -> str:
    """The README's performance block (between the markers) from pipeline records."""
    recs = [r for r in records if "ratio_to_reference" in r and "path" in r
            and r.get("seconds")]  # a skipped source has no time
    startup = [r for r in records if r.get("stage") == "startup"]
    if not recs:
        raise ValueError("no pipeline records (with path and ratio_to_reference) to tabulate")
    stamp = recs[0]
    lines = [f"Generated by `ldp-beam bench --readme README.md` on {stamp.get('machine', '?')}, "
             f"{stamp.get('date', '?')}"
             + (f" (load average {stamp['load_average']:g} at the start: ratios, not absolute "
                f"rates, are what compares)" if stamp.get("load_average") is not None else "")
             + (f"; the whole bench took {total_seconds / 60:.1f} min" if total_seconds else "")
             + ". Ratios are to the plain-Beam reference measured in the same run on the same "
               "input (> 1: faster than the reference); memory rows give the peak RSS growth "
               "from 10^6 rows.", "",
             "| path | mechanism | what | rows | rows/s | ratio to reference | target | met | "
             "peak RSS (MB) |", "|---|---|---|---|---|---|---|---|---|"]
    order = {"api": 0, "element": 1, "cli": 2}
    for r in sorted(recs, key=lambda r: (r["stage"] == "memory", order.get(r["path"], 3),
                                         r["stage"], r["method"], r.get("mode", ""),
                                         r.get("runner", ""), r["rows"])):
        what = r.get("mode") or ""
        if r["stage"] == "memory":
            what = f"{r['command']}: RSS growth {r['rss_growth']:+.0%}"
        elif r.get("runner", "DirectRunner") != "DirectRunner":
            what += f", {r['runner']}"
        if r.get("source"):
            what += f", {r['source']}" + (f" ({r['ratio_to_parquet']:.2f}x Parquet)"
                                          if r.get("ratio_to_parquet") else "")
        if r["stage"] == "bounding" and r.get("mode") == "bounded-fixed-units":
            what = (f"bounded, {r['units']:,} units of 100 rows (RSS {r['rss_growth']:+.0%} "
                    f"over 10^6 rows of the same units)")
        elif r["stage"] == "bounding":
            what += (f" (privacy unit, {r.get('ratio_to_unbounded', 1.0):.2f}x unbounded"
                     + (f"; RSS {r['rss_growth_vs_smallest']:+.0%} with 10x the units"
                        if r.get("rss_growth_vs_smallest") is not None else "") + ")") \
                if r.get("mode") == "bounded" else " (privacy-unit input)"
        tgt = r.get("target")
        of = r.get("target_of") or "ratio_to_reference"
        target = "—" if tgt is None else (f"≥ {tgt:g}" if of == "ratio_to_reference" else
                                          f"{of.replace('_', ' ')} ≤ {tgt:g}")
        met = {True: "yes", False: "**no**", None: "—"}[r.get("meets_target")]
        ratio = r["ratio_to_reference"]
        rss = r.get("peak_rss_mb")
        lines.append(f"| {r['path']} | {r['method']} | {what} | {_rows(r['rows'])} | "
                     f"{r['rows_per_second'] / 1e6:.2f}M | "
                     f"{'—' if ratio is None else f'{ratio:.2f}'} | {target} | {met} | "
                     f"{'—' if rss is None else f'{rss:.0f}'} |")
    stream = {r["mode"]: r for r in records if r.get("stage") == "stream"
              and r.get("value") is not None}
    if stream:
        lines += ["", _stream_line(stream)]
    if startup:
        lines += ["", "Start-up, a fresh process (seconds, the fastest of "
                      f"{startup[0].get('rounds', '?')}): " + "; ".join(
                          f"`{r['mode']}` {r['seconds']:.2f} s (target < {r['target']:g} s: "
                          f"{'met' if r['meets_target'] else '**not met**'})" for r in startup)
                  + "."]
    return "\n".join(lines)


def _stream_line(by_mode: dict[str, dict]) -> str:
    """The README's line for the stream section's records (keyed by mode)."""
    def met(r: dict) -> str:
        return "met" if r.get("meets_target") else "**not met**"

    parts = []
    plain = by_mode.get("plain-pull")
    if plain:
        parts.append(f"a plain pull client {plain['value']:,.0f} messages/s")
    r = by_mode.get("lander")
    if r:
        parts.append(f"the lander {r['messages_per_second']:,.0f} messages/s, "
                     f"{r['value']:.2f} of it (goal ≥ {r['target']:g}: {met(r)})")
    r = by_mode.get("lander-batched")
    if r:
        parts.append(f"batched ({r['reports_per_message']} reports a message) "
                     f"{r['value']:,.0f} reports/s (goal ≥ {r['target']:,.0f}: {met(r)})")
    r = by_mode.get("end-to-end")
    if r:
        parts.append(f"end to end, landed and estimated (`stream --subscription --once`, "
                     f"Beam's start-up included) {r['value']:,.0f} reports/s")
    r = by_mode.get("beam-pubsub")
    if r:
        parts.append(f"Beam's `ReadFromPubSub` on the DirectRunner {r['value']:,.0f} "
                     f"messages/s" + (f" ({r['ratio_to_plain_pull']:.2f} of the plain client)"
                                      if r.get("ratio_to_plain_pull") else ""))
    r = by_mode.get("soak")
    if r:
        parts.append(f"a {r['seconds'] / 60:.0f}-minute soak at {r['rate']:g} reports/s: "
                     f"collector RSS {r['first_mb']:.0f} → {r['last_mb']:.0f} MiB (max "
                     f"{r['max_mb']:.0f}), {r['slope_mb_per_10min']:+.1f} MB per 10 min "
                     f"({'flat' if r['flat'] else '**growing**'} within the samples' noise)")
    return ("Live stream through Google's Pub/Sub emulator (`--only stream`, one run): "
            + "; ".join(parts) + ".")


def _rows(n: int) -> str:
    exp = len(str(n)) - 1
    lead = n / 10 ** exp
    return f"10^{exp}" if lead == 1 else f"{lead:g}x10^{exp}"


def write_readme(path: str, records: list[dict], total_seconds: float | None = None) -> None:
    """Rewrite only the text between the bench markers of the README at ``path``."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no {README_START} ... {README_END} block")
    block = readme_table(records, total_seconds)
    text = text[:start + len(README_START)] + "\n" + block + "\n" + text[end:]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
