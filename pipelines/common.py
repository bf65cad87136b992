"""Shared plumbing for the runnable pipelines: Beam options, metrics, JSON output."""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable

from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions


def pipeline_options(beam_args: Iterable[str] = ()) -> PipelineOptions:
    """Beam options from the command line's leftover arguments; DirectRunner unless told."""
    args = list(beam_args)
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args.append("--runner=DirectRunner")
    return PipelineOptions(args)


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


def count_lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
