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
  reference reads the row groups with pyarrow: :data:`ROW_GROUP_REFERENCE`); the privacy-unit
  bounding runs (``--only bounding``) keep their ``ratio_to_unbounded``. And the README's
  Python example built by hand in a fresh process (``mode="readme"`` and
  ``"readme+speedups"``, :func:`_api_readme`; ``--only api-readme`` runs only this part);
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
``ratio_to_reference`` here too), ``startup`` (``import ldp_beam`` and ``ldp-beam --help`` in
a fresh process, absolute seconds against issue 16's < 0.3 s and < 0.6 s; ``stage="startup"``,
not pipeline records), ``central`` (:mod:`.bench_central`), ``stream`` (live telemetry through
Google's Pub/Sub emulator, ``stage="stream"``: :func:`.bench_stream.stream_bench`; skipped, not
failed, where Java or the emulator is missing) and, only when named or with ``--soak SECONDS``,
``stream-soak`` (:func:`.bench_stream.stream_soak`). A failing section is reported and fails
the run at the end; the other sections' records are still written.
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ldp_beam.pipelines.bench_sources import run as sources
from ldp_beam.pipelines.records import make_record

from .bench_stream import SOAK_SECONDS, _stream_line, stream_bench, stream_soak
from .records import PEAK_RSS_SOURCE, SectionFailed, command_paths

_CHILD = r'''
import json, sys, time

LABELS = tuple(str(i) for i in range(20))


def main():
    import apache_beam as beam
    from ldp_beam.pipelines.common import run_pipeline

    cfg = json.loads(sys.argv[1])
    mode = cfg["mode"]
    if cfg.get("by_hand"):  # the README's way: beam.Pipeline(runner=...) in a `with` block
        return by_hand(cfg)
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


def by_hand(cfg):
    """The pipeline a user writes from the README's Python example, built by hand (no ldp-beam
    helper: ``with beam.Pipeline(runner="DirectRunner") as p:``), on the reference's file:
    ``ReadTable(path).batches | Perturb``, its reports ``| EstimateGlobally | beam.Map(print)``
    and its dead letters ``| beam.Map(print)`` (the README reads files with ReadTable); or the
    reference (``mode="reference"``) built the same way. ``speedups``: the Python API's opt-in,
    ``beam_speed.install()``, called first (timed with the rest; on a Beam it refuses, the run
    says so: ``installed`` false)."""
    import apache_beam as beam

    mech, ours = None, cfg["mode"] != "reference"
    if ours:
        from ldp_beam import build_mechanism, estimator_for
        from ldp_beam.transforms import EstimateGlobally, Perturb, ReadTable

        mech = build_mechanism(cfg["mechanism"], **cfg["params"])
    if cfg.get("speedups"):
        from ldp_beam.transforms import beam_speed
    t, cpu = time.perf_counter(), time.process_time()
    installed = bool(cfg.get("speedups")) and beam_speed.install()
    with beam.Pipeline(runner="DirectRunner") as p:
        if ours:
            out = (p | ReadTable(cfg["path"])).batches | Perturb(mech, columns=cfg["columns"])
            (out.reports
             | EstimateGlobally(estimator_for(mech))
             | beam.Map(lambda e: print("beam:", e.n_reports, file=sys.stderr)))
            out.dead_letter | beam.Map(print)
        else:
            reference(p, cfg)
    secs, cpu = time.perf_counter() - t, time.process_time() - cpu
    print(json.dumps({"seconds": secs, "cpu_seconds": cpu, "peak_rss_mb": peak_rss_mb(),
                      "installed": installed}))


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


''' + PEAK_RSS_SOURCE + r'''

if __name__ == "__main__":
    main()
'''

# `ldp-beam ARGS` in this process (what the console script runs), then this process's own peak
# RSS (VmHWM) written to the file named by LDP_BEAM_BENCH_RSS, whatever the exit.
_CLI = r'''
import os, sys
''' + PEAK_RSS_SOURCE + r'''

if __name__ == "__main__":
    sys.argv = ["ldp-beam"] + sys.argv[1:]
    try:
        from ldp_beam.pipelines.cli import entry

        code = entry()
    finally:
        with open(os.environ["LDP_BEAM_BENCH_RSS"], "w") as fh:
            fh.write(repr(peak_rss_mb()))
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
    regions = np.array(_REGIONS, dtype=object)
    return {"x": rng.uniform(0.0, 100.0, n), "region": regions[rng.integers(0, len(regions), n)]}


def _pairs(n: int, rng: Any) -> dict:
    """Two string label columns (20 labels each, skewed)."""
    labels = np.array(_LABELS, dtype=object)
    return {c: labels[np.minimum(rng.geometric(0.15, n) - 1, 19)] for c in ("x", "y")}


def _item_levels(n: int, rng: Any) -> dict:
    return {"x": rng.uniform(0.0, 100.0, n),
            "level": np.where(rng.random(n) < 0.6, 0.0, rng.uniform(0.01, 1.0, n))}


def _numeric_units(per: int):
    """Values with a privacy unit of ``per`` rows each (units in random order). 100 rows a unit
    at 10^7 rows give as many units as 10 a unit at 10^6 (memory at a fixed number of units,
    ten times the rows)."""
    def gen(n: int, rng: Any) -> dict:
        return {"x": rng.uniform(0.0, 100.0, n),
                "uid": rng.permutation(np.arange(n) // per + rng.integers(0, 2**40))}
    return gen


#: input files: name -> (generator, the column the reference codes)
FILES = {"numeric": (_numeric, "x"), "labels": (_pairs, "x"), "levels": (_item_levels, "x"),
         "units": (_numeric_units(10), "x"), "units100": (_numeric_units(100), "x")}

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
SECTIONS = ("api", "cli", "element", "runners", "bounding", "sources", "startup", "stream",
            "central")
#: a part of a section that ``--only`` may also name alone: ``api-readme`` is the README-style
#: pipeline of ``api`` (:func:`_api_readme`) without the rest of that section
SUBSECTIONS = ("api-readme",)
#: the README-style pipeline's mechanisms: the README's own example and the reference's work
README_CASES = ("bisample-md", "grr")
README_ROUNDS = 3  # fresh-process timings of each README-style configuration (--quick: 1)
#: sections run only when named (``--only``) or asked for (``--soak``)
OPT_IN_SECTIONS = ("stream-soak",)
#: issue 16's start-up targets, absolute seconds for a fresh process (fastest of the rounds)
STARTUP_TARGETS = {"import ldp_beam": 0.3, "ldp-beam --help": 0.6}
STARTUP_ROUNDS = 5
QUICK_CLI = ("grr", "bisample-md", "dphr")  # --quick: fewer CLI runs


def _write(path: str, gen, n: int) -> None:
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
    # lazy: apache_beam costs 1.9 s at import (measured); every `ldp-beam bench` imports this
    # module (`--no-pipeline` included), and only the records of a pipeline section need it
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
        self.note = progress.note if progress is not None else (lambda text: None)
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

    def file(self, name: str, n: int) -> str:
        if (name, n) not in self.files:
            path = os.path.join(self.tmp, f"{name}-{n}.parquet")
            self.note(f"writing {name} input ({n:,} rows)")
            _write(path, FILES[name][0], n)
            self.files[(name, n)] = path
        return self.files[(name, n)]

    def child(self, cfg: dict) -> dict:
        """One pipeline in a fresh process: what it reports (seconds, peak_rss_mb, ...)."""
        r = subprocess.run([sys.executable, self.script, json.dumps(cfg)], capture_output=True,
                           text=True, timeout=3600, env=self.env)
        if r.returncode != 0:
            raise RuntimeError(f"benchmark pipeline failed ({cfg['mode']}): {r.stderr[-2000:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    def best(self, cfgs: list[dict], rounds: int | None = None) -> list[tuple[float, float]]:
        """Each configuration measured ``rounds`` times (default: the bench's rounds), interleaved
        so drift hits all alike; the fastest kept."""
        if rounds is None:
            rounds = self.rounds
        best: list[tuple[float, float] | None] = [None] * len(cfgs)
        for _ in range(rounds):
            for i, cfg in enumerate(cfgs):
                out = self.child(cfg)
                if best[i] is None or out["seconds"] < best[i][0]:
                    best[i] = (out["seconds"], out["peak_rss_mb"])
        return best  # type: ignore[return-value]

    def runs(self, cfgs: list[dict], rounds: int) -> list[list[dict]]:
        """Every configuration measured ``rounds`` times, each in a fresh process, interleaved
        (every other round in reverse order, so neither end of the list is always first or
        last): per configuration, what each round's process reported."""
        out: list[list[dict]] = [[] for _ in cfgs]
        for k in range(rounds):
            order = range(len(cfgs)) if k % 2 == 0 else reversed(range(len(cfgs)))
            for i in order:
                out[i].append(self.child(cfgs[i]))
        return out

    def reference(self, file: str, n: int) -> float:
        key = ("file", file, n, "DirectRunner")
        if key not in self.refs:
            self.note(f"reference: plain Beam GRR on {file} ({n:,} rows, DirectRunner)")
            self.refs[key] = self.best([self.ref_cfg(file, n)])[0][0]
        return self.refs[key]

    def ref_cfg(self, file: str, n: int, runner: str = "DirectRunner") -> dict:
        return {"mode": "reference", "path": self.file(file, n), "ref_column": FILES[file][1],
                "ref_epsilon": REF_EPSILON, "rows": n, "beam_args": RUNNERS[runner],
                "ref_read": "row_groups" if runner in ROW_GROUP_REFERENCE else "beam"}

    def cli(self, args: list[str], ledger: str | None = None,
            speedups: bool = False) -> tuple[float, float]:
        """``ldp-beam ARGS`` as a subprocess: (wall seconds with start-up, its peak RSS).
        ``ledger``: a ledger file of its own (a repeated central release would otherwise be
        re-published from the run's ledger, not computed). ``speedups``: with the Beam speedups
        opt-in (``LDP_BEAM_SPEEDUPS=1``; off otherwise, whatever the shell says)."""
        rss_file = os.path.join(self.tmp, "cli-rss.txt")
        env = dict(self.env, LDP_BEAM_BENCH_RSS=rss_file,
                   LDP_BEAM_SPEEDUPS="1" if speedups else "0")
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
        return make_record("bench", "synthetic", method, epsilon, f"pipeline rows/s ({mode})",
                           n / secs, stage=stage, path=path, runner=runner, rows=n, seconds=secs,
                           rows_per_second=n / secs, peak_rss_mb=rss, mode=mode,
                           reference_seconds=ref, ratio_to_reference=ratio,
                           target=target, target_of="ratio_to_reference",
                           meets_target=None if target is None else bool(ratio >= target),
                           note=note + "; ratio_to_reference = reference seconds / seconds "
                                       "(> 1: faster than the reference)",
                           **extra, **self.stamp)


def _selection(only: list[str] | None) -> tuple[set[str], set[str] | None]:
    """``--only`` names -> (sections to run, mechanisms to keep or None for all). Section names
    (api, cli, element, runners, bounding, sources, startup) pick sections; mechanism names pick
    mechanisms within api, cli and element; neither kind given: all of that kind."""
    if not only:
        return set(SECTIONS), None
    names = set(only)
    mechs = names & (set(CASES) | set(RELEASES))
    sections = names & (set(SECTIONS) | set(OPT_IN_SECTIONS) | set(SUBSECTIONS))
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
    sizes = sizes if sizes is not None else (1_000_000,) if quick else (1_000_000, 10_000_000)
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
            except SectionFailed as exc:  # its records so far are kept
                out.extend(exc.records)
                failed.append(f"{name}: {exc}")
                b.note(f"section {name} FAILED: {str(exc)[-300:]}")
            except Exception as exc:  # noqa: BLE001 - re-raised below as BenchFailed
                failed.append(f"{name}: {type(exc).__name__}: {str(exc)[-1500:]}")
                b.note(f"section {name} FAILED: {type(exc).__name__}: {str(exc)[-300:]}")

        if "api" in sections:
            section("api", lambda: _api(b, sizes, mechs))
        if "api" in sections or "api-readme" in sections:
            section("api", lambda: _api_readme(b, sizes, mechs, 1 if quick else README_ROUNDS))
        if "element" in sections and (mechs is None or ELEMENT_MECHANISM in mechs):
            section("element", lambda: _element(b, element_records))
        if "cli" in sections:
            cli_mechs = mechs if mechs is not None else (set(QUICK_CLI) if quick else None)
            section("cli", lambda: _cli(b, sizes, cli_mechs, big))
        if "runners" in sections and not quick:
            section("runners", lambda: _runners(b, sizes[0], mechs))
        if "bounding" in sections:
            section("bounding", lambda: _bounding(sizes, tmp, progress, bench=b))
        if "startup" in sections and mechs is None:
            section("startup", lambda: _startup(b, 1 if quick else STARTUP_ROUNDS))
        if "sources" in sections:
            section("sources", lambda: _with_reference(
                b, sources(sizes, tmp, progress, repeats=1 if quick else None), tmp))
        if "stream" in sections and mechs is None:
            section("stream", lambda: stream_bench(tmp, progress, quick=quick, stamp=b.stamp,
                                                   env=b.env))
        if "central" in sections and mechs is None:
            def central_records():
                # lazy: the section imports PipelineDP (the comparison), only when it runs
                from ldp_beam.pipelines.bench_central import central_section

                return central_section(100_000 if quick else sizes[0], tmp=tmp,
                                       progress=progress, stamp=b.stamp,
                                       repeats=1 if quick else 2)["records"]
            section("central", central_records)
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
            refs[n] = b.best([cfg])[0][0]
        secs = r.get("seconds")
        r["reference_seconds"] = refs.get(n)
        r["ratio_to_reference"] = refs[n] / secs if secs and n in refs else None
        r.setdefault("path", "api")
        r.setdefault("target_of", "ratio_to_parquet" if "ratio_to_parquet" in r else None)
        r.update(b.stamp)
    return recs


def _api_cfg(b: _Bench, name: str, n: int, runner: str) -> dict:
    params, cols, file, _ = CASES[name]
    return {"mechanism": name, "params": params, "columns": cols, "rows": n,
            "path": b.file(file, n), "mode": "api", "beam_args": RUNNERS[runner]}


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
        res = b.best(cfgs)
        for f, (secs, _) in zip(files, res):
            b.refs[("file", f, n, "DirectRunner")] = secs
        for m, (secs, rss) in zip(names, res[len(files):]):
            ref = b.refs[("file", CASES[m][2], n, "DirectRunner")]
            out.append(b.record("api", "pipeline", m, CASES[m][0].get("epsilon"), "batched", n,
                                secs, rss, ref, "DirectRunner", TARGETS["api"],
                                "ReadTable | Perturb | EstimateGlobally on the reference's file, "
                                "Beam's start-up included"))
    return out


def _api_readme(b: _Bench, sizes, mechs, rounds: int = README_ROUNDS) -> list[dict]:
    """The pipeline a user writes from the README's Python example (``ReadTable(path).batches |
    Perturb``, ``reports | EstimateGlobally | beam.Map(print)``, ``dead_letter |
    beam.Map(print)``, built by hand in a ``with beam.Pipeline(runner="DirectRunner")`` block in
    a fresh process: no ldp-beam helper, no command line) against the plain-Beam reference built
    the same way on the same file, without and with the Beam speedups opt-in
    (``beam_speed.install()`` first in the process), at each size.

    Every configuration runs ``rounds`` times in fresh processes, interleaved (each pipeline next
    to its reference); each time is the median of its rounds. ``ratio_to_reference`` compares
    like with like: reference and pipeline both without the opt-in (``mode="readme"``, the
    default a user gets), or both with it (``mode="readme+speedups"``: the patches speed up
    Beam's own fixed cost in the reference too); the latter's ``ratio_to_unpatched_reference``
    is against the reference as Beam ships. Beside them, for a loaded machine: the median of
    the rounds' own ratios (``paired_ratio``: each pipeline and its reference ran back to back)
    and the same ratio of CPU seconds (``cpu_ratio_to_reference``: the process's CPU time over
    the same span, which other processes' load disturbs less than wall time).
    """
    names = [m for m in README_CASES if mechs is None or m in mechs]
    out: list[dict] = []
    if not names:
        return out
    for n in sizes:
        files = sorted({CASES[m][2] for m in names})
        cfgs, keys = [], []
        for speed in (False, True):
            for f in files:
                cfgs.append(dict(b.ref_cfg(f, n), by_hand=True, speedups=speed))
                keys.append(("reference", f, speed))
                for m in names:
                    if CASES[m][2] == f:
                        cfgs.append(dict(_api_cfg(b, m, n, "DirectRunner"), mode="readme",
                                         by_hand=True, speedups=speed))
                        keys.append(("readme", m, speed))
        b.note(f"api: the README's pipeline by hand ({', '.join(names)}) and the reference by "
               f"hand, without and with the beam speedups ({n:,} rows, {rounds} rounds)")
        runs = dict(zip(keys, b.runs(cfgs, rounds)))

        def med(key, field="seconds"):
            return statistics.median([r[field] for r in runs[key]])

        for speed in (False, True):
            for m in names:
                mine, theirs = ("readme", m, speed), ("reference", CASES[m][2], speed)
                secs, ref = med(mine), med(theirs)
                paired = [t["seconds"] / o["seconds"] for o, t in zip(runs[mine], runs[theirs])]
                rec = b.record(
                    "api", "pipeline", m, CASES[m][0].get("epsilon"),
                    "readme+speedups" if speed else "readme", n, secs,
                    max(r["peak_rss_mb"] for r in runs[mine]), ref, "DirectRunner",
                    TARGETS["api"],
                    "the README's pipeline built by hand in a fresh process (with "
                    "beam.Pipeline(runner='DirectRunner'): ReadTable | Perturb, reports | "
                    "EstimateGlobally | Map, dead letters | Map) against the reference built "
                    "the same way on the same file, "
                    + ("both after beam_speed.install() (the opt-in)" if speed else
                       "neither with the beam speedups (the default)")
                    + f"; seconds: the median of {rounds} fresh-process runs each, Beam's "
                      "start-up included, imports excluded",
                    by_hand=True, speedups=speed, reference_speedups=speed, rounds=rounds,
                    statistic="median", seconds_runs=[r["seconds"] for r in runs[mine]],
                    reference_seconds_runs=[r["seconds"] for r in runs[theirs]],
                    paired_ratio=statistics.median(paired), cpu_seconds=med(mine, "cpu_seconds"),
                    reference_cpu_seconds=med(theirs, "cpu_seconds"),
                    cpu_ratio_to_reference=med(theirs, "cpu_seconds") / med(mine, "cpu_seconds"))
                if speed:  # False where this Beam is not one beam_speed verified
                    rec["speedups_installed"] = all(r["installed"]
                                                    for r in runs[mine] + runs[theirs])
                    plain = med(("reference", CASES[m][2], False))
                    rec["unpatched_reference_seconds"] = plain
                    rec["ratio_to_unpatched_reference"] = plain / secs
                out.append(rec)
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
                                            _api_cfg(b, m, n, runner)],
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
    return [make_record("bench", "none", "-", None, "start-up seconds", secs, stage="startup",
                        path="cli", mode=name, seconds=secs, target=STARTUP_TARGETS[name],
                        target_of="seconds", meets_target=bool(secs < STARTUP_TARGETS[name]),
                        rounds=rounds, note=f"a fresh process, the fastest of {rounds}: "
                        f"{' '.join(os.path.basename(c) for c in cmds[name][:2])}"
                        f"{' ...' if len(cmds[name]) > 2 else ''}", **b.stamp)
            for name, secs in best.items()]


def _element(b: _Bench, n: int) -> list[dict]:
    """Single records generated inside the pipeline (no beam.Create of the data), perturbed with
    a record id as key and estimated, against plain Beam doing per-record numpy RR."""
    params, cols, _, _ = CASES[ELEMENT_MECHANISM]
    ref_cfg = {"mode": "reference-element", "rows": n, "ref_epsilon": REF_EPSILON,
               "beam_args": RUNNERS["DirectRunner"]}
    cfg = {"mechanism": ELEMENT_MECHANISM, "params": params, "columns": cols, "rows": n,
           "path": None, "mode": "element", "beam_args": RUNNERS["DirectRunner"]}
    b.note(f"element: plain Beam per-record reference and {ELEMENT_MECHANISM} ({n:,} records)")
    (ref, _), (secs, rss) = b.best([ref_cfg, cfg], rounds=1)  # seconds-long runs
    return [b.record("element", "pipeline", ELEMENT_MECHANISM, params["epsilon"], "element", n,
                     secs, rss, ref, "DirectRunner", TARGETS["element"],
                     "records generated in the pipeline | Perturb(key_column=rid) | "
                     "EstimateGlobally, against plain Beam doing per-record numpy RR and a count "
                     "CombineFn on the same records", reference="plain Beam per-record RR")]


def _pargs(params: dict) -> list[str]:
    """Mechanism parameters as ``--epsilon`` and ``-p NAME=VALUE`` (tuples comma-separated)."""
    return [a for k, v in params.items() for a in
            (["--epsilon", str(v)] if k == "epsilon" else
             ["-p", f"{k}={','.join(v) if isinstance(v, tuple) else v}"])]


def _roles(params_cols: dict) -> list[str]:
    return [a for role, col in params_cols.items() for a in ("--role", f"{role}={col}")]


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
                    _remove_outputs(reports, est)
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
            _remove_outputs(reports, est)
        for m in central:
            params, cols, file = RELEASES[m]
            src = b.file(file, n)
            ref = b.reference(file, n)
            rel = os.path.join(b.tmp, f"{m}-{n}.release.json")
            b.note(f"cli: ldp-beam estimate -m {m}, a central release from raw rows ({n:,} rows), "
                   "without and with the Beam speedups opt-in")
            runs: dict[bool, list] = {False: [], True: []}
            for k in range(b.rounds):  # interleaved, so drift hits both alike
                for speed in (False, True):
                    runs[speed].append(b.cli(
                        ["estimate", "-i", src, "-m", m, *_pargs(params), *_roles(cols),
                         "-o", rel], os.path.join(b.tmp, f"ledger-{m}-{n}-{k}-{speed}.db"),
                        speedups=speed))
                    _remove_outputs(rel)
            for speed in (False, True):
                secs, r_rss = min(x[0] for x in runs[speed]), max(x[1] for x in runs[speed])
                if not speed:
                    rss.setdefault(("release", m), {})[n] = r_rss
                    seconds[("release", m, n)] = secs
                out.append(b.record(
                    "cli", "pipeline", m, params.get("epsilon"),
                    "release+speedups" if speed else "release", n, secs, r_rss, ref,
                    "DirectRunner", target,
                    "`ldp-beam estimate -m RELEASE` from raw rows as a subprocess, start-up "
                    "counted" + ("; with LDP_BEAM_SPEEDUPS=1 (the opt-in)" if speed else "")
                    + ("" if target else "; the issue's target is at 10^7 rows"),
                    command="release", speedups=speed))
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
        out.append(make_record(
            "bench", "synthetic", m, None, f"peak RSS growth ({command})", growth, stage="memory",
            path="cli", command=command, mode=command, runner="DirectRunner", rows=largest,
            seconds=secs, rows_per_second=largest / secs, peak_rss_mb=by_n[largest],
            peak_rss_mb_by_rows={str(k): v for k, v in sorted(by_n.items())},
            rss_growth=growth, reference_seconds=ref, ratio_to_reference=ref / secs,
            target=TARGETS["memory"], target_of="rss_growth",
            meets_target=bool(growth <= TARGETS["memory"]),
            note=f"`ldp-beam {command}` peak RSS at {largest:,} rows / at {sizes[0]:,} - 1 (the "
                 "process's own VmHWM); ratio_to_reference: this command alone at the largest "
                 "size (reference seconds / seconds)", **b.stamp))
    return out


def _remove_outputs(*paths: str) -> None:
    """Runs' outputs and their side files (manifest, dead letters, curator notes)."""
    for path in paths:
        folder, base = os.path.split(path)
        stem = base.rsplit(".", 1)[0]
        for f in os.listdir(folder):
            if f.startswith(base) or f.startswith(stem + "."):
                full = os.path.join(folder, f)
                if os.path.isfile(full):
                    os.remove(full)


BOUNDING_ROUNDS = 3  # rounds of the bounded/unbounded comparison at every size (full bench)


def _bounding(sizes, tmp: str, progress=None, bench: _Bench | None = None) -> list[dict]:
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
        b.note(f"pipeline bisample with and without a privacy unit ({n:,} rows)")
        # a ratio of two pipelines: each the fastest of 3 interleaved fresh-process rounds at
        # every size (one round at 10^7 moved it between 1.82x and 2.14x in two quiet runs)
        (ref, _), *runs = b.best(cfgs, rounds=1 if b.rounds == 1 else BOUNDING_ROUNDS)
        refs[n], unbounded = ref, runs[0][0]
        for mode, (secs, rss) in zip(("batched", "bounded"), runs):
            rec = b.record("api", "bounding", "bisample", params["epsilon"], mode, n, secs,
                           rss, ref, "DirectRunner", None,
                           "ReadTable [| BoundContributions(uid, 1 report per unit)] | "
                           "Perturb | EstimateGlobally, start-up included",
                           dataset_note="synthetic, 10 rows per unit")
            if mode == "bounded":
                rec.update(ratio_to_unbounded=secs / unbounded, target=2.0,
                           target_of="ratio_to_unbounded",
                           meets_target=bool(secs / unbounded <= 2.0), units=n // 10)
                peak[n] = rss
                if n != sizes[0]:  # ten times the units: the sketch grows with them
                    rec["rss_growth_vs_smallest"] = rss / peak[sizes[0]] - 1.0
            out.append(rec)
    big = max(sizes)
    if big > sizes[0]:
        # the rows x10 at the units of the smallest run: memory follows units, not rows
        b.note(f"pipeline bisample with a privacy unit, 100 rows a unit ({big:,} rows)")
        (secs, rss), = b.best([cfg(b.file("units100", big), big, "bounded")])
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


# -- the performance table (docs/guides/performance.md), generated from the records ----------

README_START, README_END = "<!-- bench:start -->", "<!-- bench:end -->"


def readme_table(records: list[dict], total_seconds: float | None = None,
                 page: str | None = None) -> str:
    """The performance block (between the markers of ``page``: docs/guides/performance.md) from
    pipeline records; its first line names the command that regenerates it."""
    recs = [r for r in records if "ratio_to_reference" in r and "path" in r
            and r.get("seconds")]  # a skipped source has no time
    startup = [r for r in records if r.get("stage") == "startup"]
    if not recs:
        raise ValueError("no pipeline records (with path and ratio_to_reference) to tabulate")
    stamp = recs[0]
    target = "FILE" if page is None else command_paths(page, page)[0]
    lines = [f"Generated by `ldp-beam bench --readme {target}` on {stamp.get('machine', '?')}, "
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


def _rows(n: int) -> str:
    exp = len(str(n)) - 1
    lead = n / 10 ** exp
    return f"10^{exp}" if lead == 1 else f"{lead:g}x10^{exp}"


def write_readme(path: str, records: list[dict], total_seconds: float | None = None) -> None:
    """Rewrite only the text between the bench markers of the Markdown page at ``path``
    (docs/guides/performance.md)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"{path} has no {README_START} ... {README_END} block")
    block = readme_table(records, total_seconds, page=path)
    text = text[:start + len(README_START)] + "\n" + block + "\n" + text[end:]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
