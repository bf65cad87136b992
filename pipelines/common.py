"""Shared plumbing for the runnable pipelines: Beam options, metrics, JSON output."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable

import contextlib
from typing import Callable, Iterator, Sequence

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
RUNNER_ALIASES = {"dask": DASK_RUNNER, "daskrunner": DASK_RUNNER, "direct": "DirectRunner",
                  "directrunner": "DirectRunner"}
DEFAULT_DASK_WORKERS = 2


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


def pipeline_options(beam_args: Iterable[str] = ()) -> PipelineOptions:
    """Beam options from the command line's leftover arguments; DirectRunner unless told."""
    return PipelineOptions(runner_args(beam_args))


@contextlib.contextmanager
def runner_context(beam_args: Iterable[str] = ()) -> Iterator[list[str]]:
    """Beam arguments ready to run. For the Dask runner without ``--dask_client_address`` (or
    ``--dask_scheduler_file``), a local ``distributed`` cluster of ``--dask_workers=N`` (default
    2) single-threaded worker processes is started for the run and closed after it."""
    args = runner_args(beam_args)
    workers = DEFAULT_DASK_WORKERS
    kept = []
    for a in args:
        if a.startswith("--dask_workers="):
            workers = int(a.split("=", 1)[1])
        else:
            kept.append(a)
    args = kept
    if runner_name(args) != DASK_RUNNER or any(
            a.startswith(("--dask_client_address", "--dask_scheduler_file")) for a in args):
        yield args
        return
    try:
        from distributed import LocalCluster
    except ImportError as exc:
        raise RuntimeError("the Dask runner needs dask and distributed: "
                           "pip install 'ldp-beam[dask]'") from exc
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    try:
        yield args + [f"--dask_client_address={cluster.scheduler_address}"]
    finally:
        cluster.close()


def run_pipeline(build: Callable[[beam.Pipeline], Sequence[Any]],
                 beam_args: Iterable[str] = ()) -> Any:
    """Build a pipeline with ``build(p)`` (which returns every terminal PCollection, e.g. the
    outputs of its writes), run it to completion and return the result.

    All terminals are joined by one final step, so runners that compute only the graph's last
    node (Beam's Dask runner does) still run every branch: no output is silently skipped. A
    failed run raises with the runner's error (a crashed Dask worker included)."""
    with runner_context(beam_args) as args:
        p = beam.Pipeline(options=PipelineOptions(args))
        terminals = [t for t in build(p) if t is not None]
        if len(terminals) > 1:
            _ = (tuple(terminals) | "AllOutputs" >> beam.Flatten()
                 | "OutputsDone" >> beam.combiners.Count.Globally())
        result = p.run()
        try:
            result.wait_until_finish()
        finally:
            client = getattr(result, "client", None)  # the Dask runner's own client
            if client is not None:
                client.close()
    return result


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


def write_json(path: str, obj: Any) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2, default=_default, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)


def _default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, tuple):
        return list(x)
    return str(x)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _rows(element: Any) -> int:
    from ldp_beam.transforms.batches import num_rows

    return num_rows(element)


def count_rows_to(pcoll: Any, path: str) -> Any:
    """Write the number of records in a PCollection of batches/records to ``path`` (one JSON
    line): a count taken from the data itself, for runners without metrics."""
    from ldp_beam.transforms import WriteJsonLines

    return (pcoll | "CountRows" >> beam.Map(_rows)
            | "SumRows" >> beam.CombineGlobally(sum)
            | "WriteCount" >> WriteJsonLines(path))


def read_count(path: str) -> int | None:
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        vals = [json.loads(line) for line in fh if line.strip()]
    return int(vals[0]) if vals else None


def reconcile(c: dict, files: Sequence[str], dead_letter: str, accepted: int | None,
              accepted_counter: str = "records_valid") -> dict:
    """Do the counts add up? Every input record is accepted (reported / used) or dead-lettered,
    and the dead-letter file holds exactly those records plus one line per unreadable file.

    From Beam's counters when the runner has metrics; otherwise (the Dask runner) from the
    outputs themselves: the input files' row counts (Parquet metadata, CSV records) against the
    accepted count and the dead-letter file."""
    lines = 0
    unreadable: set[str] = set()
    if os.path.exists(dead_letter):
        with open(dead_letter) as fh:
            for line in fh:
                if not line.strip():
                    continue
                lines += 1
                d = json.loads(line)
                if d.get("record") is None and str(d.get("reason", "")).startswith(
                        "unreadable input"):
                    unreadable.add(d.get("source"))
    bad_records = lines - len(unreadable)
    rin, bad = c.get("records_in"), c.get("records_invalid")
    if rin is not None and bad is not None:
        acc = accepted if accepted is not None else c.get(accepted_counter)
        n_unreadable = c.get("files_unreadable", 0)
        ok = acc is not None and rin == acc + bad and lines == bad + n_unreadable
        source = "metrics"
    else:
        from ldp_beam.transforms.io import count_rows

        rin = sum(count_rows(f) for f in files if f not in unreadable)
        bad, n_unreadable = bad_records, len(unreadable)
        acc = accepted
        ok = acc is not None and rin == acc + bad
        source = "outputs"
    return {"input": rin, "accepted": acc, "dead_lettered": bad,
            "unreadable_files": n_unreadable, "reconciles": bool(ok), "counted_from": source}


def count_text(n: int | None) -> str:
    """A record count for people: thousands separators, or why there is none."""
    return "unknown (the runner reports no metrics)" if n is None else f"{n:,}"


def records_line(manifest: dict, dead_letter_hint: str) -> str:
    """The one-line reconciliation of a collect run: read = reported + dead-lettered."""
    r = manifest["records"]
    files = f" + {r['unreadable_files']} unreadable file(s)" if r.get("unreadable_files") else ""
    return (f"{count_text(r['input'])} read = {count_text(r['reported'])} reported + "
            f"{count_text(r['dead_lettered'])} dead-lettered{files} ({dead_letter_hint})"
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
