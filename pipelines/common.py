"""Shared plumbing for the runnable pipelines: Beam options, metrics, JSON output."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import uuid
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.direct_runner import SwitchingDirectRunner

from ldp_beam.errors import LdpBeamError
# write_json: the name stream.py and pubsub_stream.py import from here
from ldp_beam.jsonio import write_json_atomic as write_json  # noqa: F401
from ldp_beam.progress import pipeline_progress

import ldp_beam.transforms  # noqa: F401  (its fixes to Beam's S3 FileSystem, on Dask workers too)
from ldp_beam.transforms.io import count_rows, table_format
from ldp_beam.transforms.read import read_steps
from ldp_beam.transforms.runners import DEFAULT_DASK_WORKERS
from ldp_beam.transforms.tally import LIVE as _LIVE, UNREADABLE_PREFIX, CountLive

from .lifecycle import in_chain
from .files import RunFailed

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
RUNNER_ALIASES = {"dask": DASK_RUNNER, "daskrunner": DASK_RUNNER, "direct": "DirectRunner",
                  "directrunner": "DirectRunner"}


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def beam_option_names() -> set[str]:
    """Every ``--option`` a registered PipelineOptions subclass declares (Beam's own, the Dask
    runner's when it is installed, and ours)."""
    try:
        # lazy: optional dependency (the [dask] extra); importing it registers DaskOptions
        import apache_beam.runners.dask.dask_runner  # noqa: F401
    except ImportError:
        pass
    names: set[str] = set()
    for cls in set(_subclasses(PipelineOptions)):
        parser = argparse.ArgumentParser(add_help=False)
        try:
            cls._add_argparse_args(parser)
        except Exception:  # a third-party options class that cannot register here: skip it
            continue
        for action in parser._actions:
            names.update(o for o in action.option_strings if o.startswith("--"))
    return names


def runner_args(beam_args: Iterable[str] = ()) -> list[str]:
    """The command line's leftover arguments for Beam: ``--runner`` defaults to DirectRunner and
    accepts the short names ``direct`` and ``dask``; ``--runner VALUE`` becomes
    ``--runner=VALUE``."""
    args, out = list(beam_args), []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--runner" and i + 1 < len(args):
            a, i = f"--runner={args[i + 1]}", i + 1
        if a.startswith("--runner="):
            name = a.split("=", 1)[1]
            a = f"--runner={RUNNER_ALIASES.get(name.lower(), name)}"
        out.append(a)
        i += 1
    if not any(a.startswith("--runner=") for a in out):
        out.append("--runner=DirectRunner")
    return out


def runner_name(args: Sequence[str]) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith("--runner="))


@contextlib.contextmanager
def runner_context(beam_args: Iterable[str] = ()) -> Iterator[list[str]]:
    """Beam arguments ready to run. For the Dask runner without ``--dask_client_address`` (or
    ``--dask_scheduler_file``), a local ``distributed`` cluster of ``--dask_workers=N`` (default
    2) single-threaded worker processes is started for the run and closed after it."""
    args = runner_args(beam_args)
    counts = [int(a.split("=", 1)[1]) for a in args if a.startswith("--dask_workers=")]
    workers = counts[-1] if counts else DEFAULT_DASK_WORKERS
    args = [a for a in args if not a.startswith("--dask_workers=")]
    if runner_name(args) != DASK_RUNNER or any(
            a.startswith(("--dask_client_address", "--dask_scheduler_file")) for a in args):
        yield args
        return
    try:
        from distributed import LocalCluster  # lazy: optional dependency (the [dask] extra)
    except ImportError as exc:
        raise RuntimeError("the Dask runner needs dask and distributed: "
                           "pip install 'ldp-beam[dask]'") from exc
    # its status page on a free loopback port: the default, 8787, is taken by any other cluster
    # (a second run, the user's own), which Dask only warns about
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address="127.0.0.1:0")
    try:
        yield args + [f"--dask_client_address={cluster.scheduler_address}"]
    finally:
        cluster.close()


def worker_pool_env(folder: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment (``base``, default ``os.environ``) to start Beam's external worker pool
    with (``python -m apache_beam.runners.worker.worker_pool_main``) so its workers run on this
    interpreter: ``folder`` (created if needed) first on ``PATH``, holding ``python``, a script
    that runs ``sys.executable``.

    The pool starts every SDK worker as the ``python`` on its ``PATH`` (Beam 2.77), not as the
    interpreter that started it: from a virtual environment not on ``PATH`` the workers died
    with ``No module named 'apache_beam'`` and the job failed after 300 s (DEADLINE_EXCEEDED).
    A script, not a link: Python finds its venv by the ``pyvenv.cfg`` beside the path it was
    started by, so a link elsewhere starts the base interpreter outside the venv."""
    os.makedirs(folder, exist_ok=True)
    script = os.path.join(folder, "python")
    tmp = f"{script}.{os.getpid()}.tmp"  # written whole, then renamed over any older one
    with open(tmp, "w") as fh:
        fh.write(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    os.chmod(tmp, 0o755)
    os.replace(tmp, script)
    env = dict(os.environ if base is None else base)
    env["PATH"] = folder + os.pathsep + env.get("PATH", "")
    return env


def _dask_client_kwargs(args: Sequence[str]) -> dict:
    address = [a.split("=", 1)[1] for a in args if a.startswith("--dask_client_address=")]
    if address:
        return {"address": address[-1]}
    sched = [a.split("=", 1)[1] for a in args if a.startswith("--dask_scheduler_file=")]
    return {"scheduler_file": sched[-1]} if sched else {}


def _set_filesystem_options(args: list) -> None:
    """On a Dask worker: Beam's FileSystems get the run's options (endpoint, region, keys)."""
    FileSystems.set_options(PipelineOptions(args))


def share_filesystem_options(args: Sequence[str]) -> None:
    """Give every worker of the Dask cluster, now and later (a dask ``WorkerPlugin``), the
    run's Beam options for Beam's FileSystems: Beam's Dask runner never calls
    ``FileSystems.set_options`` there, so ``s3://`` writes had no ``--s3_...`` endpoint, region
    or credentials and failed ("Must provide one of client or options")."""
    kwargs = _dask_client_kwargs(args)
    if not kwargs:
        return
    # lazy: optional dependency (the [dask] extra)
    from distributed import Client
    from distributed.diagnostics.plugin import WorkerPlugin

    class FileSystemOptions(WorkerPlugin):
        name = "ldp-beam-filesystem-options"

        def __init__(self, run_args: list) -> None:
            self.args = list(run_args)

        def setup(self, worker) -> None:
            _set_filesystem_options(self.args)

    with Client(timeout=60, **kwargs) as client:
        client.register_plugin(FileSystemOptions(list(args)), name=FileSystemOptions.name)


def run_pipeline(build: Callable[[beam.Pipeline], Sequence[Any]],
                 beam_args: Iterable[str] = (),
                 wait: Callable[[Any], Any] | None = None) -> Any:
    """Build a pipeline with ``build(p)`` (returning every terminal PCollection, e.g. its
    writes' outputs), run it to completion and return the result. ``wait(result)``: how to wait
    (default ``result.wait_until_finish()``; an unbounded pipeline passes its own stop, see
    :func:`ldp_beam.pipelines.stream.until_stopped`).

    All terminals are joined by one final step, so runners that compute only the graph's last
    node (Beam's Dask runner) still run every branch. A failed run raises the runner's error
    (an ldp-beam error it wraps is raised as itself).

    Progress (:mod:`ldp_beam.progress`; on for the command line, off for the Python API): on a
    terminal a bar of the rows read (an ETA when the row count is known from metadata), then a
    line with the rows read and rows/s (the reader's ``input_rows_read`` counter). The bar
    follows a counting branch on the reader's output when the run is in this process, else the
    running job's metrics (portable runners), else the count so far and the elapsed time."""
    with runner_context(beam_args) as args:
        if runner_name(args) == DASK_RUNNER:
            share_filesystem_options(args)
        p = beam.Pipeline(runner=local_runner(args), options=PipelineOptions(args))
        terminals = [t for t in build(p) if t is not None]
        reads = read_steps(p)
        prog = pipeline_progress(total=lambda: _total_rows(reads))
        run_id = None
        if prog is not None and prog.show_bar and _in_process(args):
            run_id = _attach_live_count(reads)
            if run_id is not None:
                prog.set_live(lambda: _LIVE.get(run_id, 0))
        if len(terminals) > 1:  # one last step (a Map: one Beam step, not Count's eight)
            _ = (tuple(terminals) | "AllOutputs" >> beam.Flatten()
                 | "OutputsDone" >> beam.Map(_done))
        if prog is not None:
            prog.start()
        ok = False
        result = None
        try:
            result = p.run()
            if prog is not None and prog.show_bar and prog._live is None:
                prog.set_live(lambda: _running_rows(result), interval=1.0)
            try:
                (wait or _finish)(result)
            finally:
                client = getattr(result, "client", None)  # the Dask runner's own client
                if client is not None:
                    client.close()
            ok = True
        except Exception as exc:  # a runner wraps our own errors: raise them as they are
            ours = _our_error(exc)
            if ours is None:
                raise
            raise ours from exc
        finally:
            if prog is not None:
                rows = counters(result).get("input_rows_read") if ok else None
                prog.finish(rows, ok, passes=_passes(reads))
                _LIVE.pop(run_id, None)
    return result


def _finish(result: Any) -> Any:
    return result.wait_until_finish()


def _done(_: Any) -> None:
    return None


def _our_error(exc: BaseException) -> BaseException | None:
    """The ldp-beam error (a size cap's LimitError, a ParameterError) a runner's RuntimeError
    wraps, if any: the command line then reports it as a configuration error (exit 2) rather
    than a failed run with the runner's traceback."""
    ours = in_chain(exc, LdpBeamError)
    return None if ours is exc else ours


def _passes(reads: list) -> int:
    """How many times the run reads one input: the number of ReadTables when they all read the
    same source (the per-unit bound's two passes), else 1 (different inputs are all input)."""
    if len(reads) < 2:
        return 1
    ids = {(rt.url, tuple(getattr(rt, "files", None) or ())) for rt, _ in reads}
    return len(reads) if len(ids) == 1 else 1


def _total_rows(reads: list) -> int | None:
    """Rows the run will read, from the files' metadata (Parquet footers; CSV records counted
    only up to 64 MiB of CSV in all); None when unknown (a database source, large CSV)."""
    if not reads:
        return None
    total = 0
    csv_bytes = 0
    for rt, _ in reads:
        if getattr(rt, "kind", None) != "files" or not rt.files:
            return None
        for f in rt.files:
            if table_format(f) != "parquet":
                try:
                    csv_bytes += os.path.getsize(f)
                except OSError:
                    return None
                if csv_bytes > 64 << 20:
                    return None
            total += count_rows(f, rt.csv_options, rt.flags)
    return total


def local_runner(args: Sequence[str]) -> Any:
    """The runner object for ``beam.Pipeline(runner=...)``: for the DirectRunner, Beam's
    switching DirectRunner without its PrismRunner attempt; ``None`` (``--runner``'s) otherwise.

    Beam 2.77's DirectRunner first tries the PrismRunner, which downloads a Go binary at run
    time: offline that fails and falls back (~0.09 s a process, plus a second graph
    translation); online the run would go to a runner the tests never exercise.
    ``is_interactive()`` is the runner's one switch that turns off only the Prism attempt, so the
    run takes the FnApiRunner (or the bundle-based runner for streaming) as the fallback did."""
    if runner_name(args) not in ("DirectRunner", "direct"):
        return None
    runner = SwitchingDirectRunner()
    if hasattr(runner, "is_interactive"):
        runner.is_interactive()
    return runner


def _in_process(args: Sequence[str]) -> bool:
    """Does the run execute in this process (the DirectRunner in memory or in threads)?"""
    if runner_name(args) not in ("DirectRunner", "direct"):
        return False
    mode = PipelineOptions(list(args)).get_all_options().get("direct_running_mode")
    return mode in (None, "in_memory", "multi_threading")


def _attach_live_count(reads: list) -> str | None:
    run_id = uuid.uuid4().hex
    attached = False
    for i, (_, out) in enumerate(reads):
        if out is not None:
            _ = out | f"ProgressCount{i}" >> beam.ParDo(CountLive(run_id))
            attached = True
    if not attached:
        return None
    _LIVE[run_id] = 0
    return run_id


def _running_rows(result: Any) -> int | None:
    """Rows read so far by a running job, from its metrics (attempted values)."""
    if result is None:
        return None
    try:
        res = result.metrics().query(
            MetricsFilter().with_namespace("ldp_beam").with_name("input_rows_read"))
    finally:
        if hasattr(result, "_metrics"):  # the PortableRunner keeps its first answer for good:
            result._metrics = None       # forget it, or the final counters would stay empty
    vals = [c.attempted if c.attempted is not None else c.committed for c in res["counters"]]
    vals = [int(v) for v in vals if v is not None]
    return sum(vals) if vals else None


def counters(result: Any, namespace: str = "ldp_beam") -> dict[str, int]:
    """Committed (else attempted) counter values of a finished pipeline, summed over steps."""
    out: dict[str, int] = {}
    try:
        res = result.metrics().query(MetricsFilter().with_namespace(namespace))
    except Exception:  # a runner without metrics support
        return out
    for c in res["counters"]:
        val = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(val or 0)
    return out


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def reconcile(t: dict, dead_letter_lines: int, accepted: int | None = None) -> dict:
    """Do the counts add up? input = read + malformed + unreadable; read = accepted + invalid
    (+ rows left out by a privacy unit's contribution bound);
    the dead-letter file holds one line per invalid or malformed record and per unreadable
    part; ``accepted`` (counted from the written output, when given) equals the tally's."""
    g = {k: int(t.get(k, 0)) for k in ("read", "malformed", "unreadable_rows",
                                        "unreadable_parts", "unreadable_unknown", "accepted",
                                        "invalid", "dead_letter_lines", "bounded_out")}
    unknown = g["unreadable_unknown"] > 0
    ok = (g["read"] == g["accepted"] + g["invalid"] + g["bounded_out"]
          and dead_letter_lines == g["dead_letter_lines"]
          and (accepted is None or accepted == g["accepted"]))
    return {"input": None if unknown else g["read"] + g["malformed"] + g["unreadable_rows"],
            "read": g["read"], "accepted": g["accepted"],
            "dead_lettered": g["invalid"] + g["malformed"], "invalid": g["invalid"],
            "malformed": g["malformed"], "unreadable_rows": g["unreadable_rows"],
            "unreadable_parts": g["unreadable_parts"], "unreadable_rows_unknown": unknown,
            "bounded_out": g["bounded_out"], "reconciles": bool(ok), "counted_from": "data"}


def check_readable(rec: dict, dead_letter_path: str, allow_unreadable: bool,
                   opener: Callable[[str], Any] = open) -> None:
    """Refuse to commit a run that could not read part of its input, unless allowed
    (``opener``: how to open the dead letters as text, e.g. through Beam's FileSystems)."""
    if not rec["unreadable_parts"] or allow_unreadable:
        return
    reasons = []
    with opener(dead_letter_path) as fh:
        for line in fh:
            d = json.loads(line)
            if str(d.get("reason", "")).startswith(UNREADABLE_PREFIX):
                where = d.get("source", "")
                reasons.append(f"{where}: {d['reason']}"
                               + (f" ({d['rows']:,} rows)" if d.get("rows") else ""))
            if len(reasons) == 3:
                break
    rows = ("an unknown number of" if rec["unreadable_rows_unknown"]
            else f"{rec['unreadable_rows']:,}")
    raise RunFailed(f"{rows} input rows in {rec['unreadable_parts']} part(s) could not be read "
                    f"(first: {'; '.join(reasons)}); nothing was committed. Pass "
                    "--allow-unreadable (allow_unreadable=True) to commit the rest, with the "
                    "unreadable parts counted in the manifest")


def check_reconciles(rec: dict) -> None:
    if not rec["reconciles"]:
        raise RunFailed(f"the run's counts do not reconcile ({rec}); nothing was committed")


def count_text(n: int | None) -> str:
    """A record count for people: thousands separators, or why there is none."""
    return "unknown (the runner reports no metrics)" if n is None else f"{n:,}"


def records_line(manifest: dict, dead_letter_hint: str) -> str:
    """The one-line reconciliation of a collect run: input = reported + dead-lettered
    (+ unreadable rows, when the run was allowed to commit without them)."""
    r = manifest["records"]
    unread = ""
    if r.get("unreadable_parts"):
        n = "?" if r.get("unreadable_rows_unknown") else f"{r['unreadable_rows']:,}"
        unread = f" + {n} unreadable ({r['unreadable_parts']} part(s))"
    bounded = (f" + {r['bounded_out']:,} left out by the per-unit bound"
               if r.get("bounded_out") else "")
    return (f"{count_text(r['input'])} input rows = {count_text(r['reported'])} reported + "
            f"{count_text(r['dead_lettered'])} dead-lettered{bounded}{unread} ({dead_letter_hint})"
            + ("" if r["reconciles"] else "  ** DOES NOT RECONCILE **"))


def format_table(values, rows, cols, fmt: str = "{:.4f}", extra=None) -> str:
    """A labelled text table of a 2-D array; ``extra`` is an optional second array shown in
    parentheses after each value (e.g. the truth beside an estimate)."""
    rows, cols = [str(r) for r in rows], [str(c) for c in cols]
    cells = [[fmt.format(v) + ("" if extra is None else f" ({fmt.format(extra[i][j])})")
              for j, v in enumerate(row)] for i, row in enumerate(values)]
    w0 = max(len(r) for r in rows)
    w = max([len(c) for c in cols] + [len(x) for row in cells for x in row])
    lines = [" " * w0 + "  " + "  ".join(c.rjust(w) for c in cols)]
    lines += [r.ljust(w0) + "  " + "  ".join(x.rjust(w) for x in row)
              for r, row in zip(rows, cells)]
    return "\n".join(lines)


@contextlib.contextmanager
def scratch_ledger() -> Iterator[str]:
    """``$LDP_BEAM_LEDGER`` pointed, for the block, at a fresh ledger, removed afterwards (the
    demos': synthetic data has no budget to track, and a second demo must draw its releases
    afresh, not re-publish the first one's). Yields its path."""
    folder = tempfile.mkdtemp(prefix="ldp-beam-demo-ledger-")
    previous = os.environ.get("LDP_BEAM_LEDGER")
    os.environ["LDP_BEAM_LEDGER"] = path = os.path.join(folder, "ledger.db")
    try:
        yield path
    finally:
        os.environ.pop("LDP_BEAM_LEDGER", None)
        if previous is not None:
            os.environ["LDP_BEAM_LEDGER"] = previous
        shutil.rmtree(folder, ignore_errors=True)
