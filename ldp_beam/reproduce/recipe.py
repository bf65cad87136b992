"""What every family's recipe shares: its start (seed, progress), its end (records, claims,
summary and figures written to ``out_dir``), its figures (matplotlib, imported only when one is
drawn) and its command line (``python -m ldp_beam.reproduce.X_recipe``). The records themselves
are :mod:`ldp_beam.pipelines.records`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import time
import zlib
from typing import Any, Callable, Mapping

import numpy as np

from ..pipelines.records import Progress, as_progress, select, write_records


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend, imported here, when a figure is
    drawn: nothing else in ldp-beam imports matplotlib, which only the ``reproduce`` extra
    installs (an ``ImportError`` saying so without it)."""
    try:
        # lazy: optional dependency (the [reproduce] extra); matplotlib.pyplot also costs 0.39 s
        # at import (measured): only a figure needs it
        import matplotlib
    except ImportError as exc:
        raise ImportError("figures need matplotlib: pip install 'ldp-beam[reproduce]'") from exc

    matplotlib.use("Agg")
    # lazy: optional dependency (the [reproduce] extra), after the backend is chosen
    import matplotlib.pyplot as plt

    return plt


def curve(records: Any, x_key: str, **match: Any) -> tuple[list, list, list]:
    """(x, value, se) of the records matching ``match`` whose value is positive (a log axis shows
    them), sorted by ``x_key``; a missing ``se`` is 0."""
    rs = sorted(select(records, **match), key=lambda r: r[x_key])
    rs = [r for r in rs if r["value"] is not None and r["value"] > 0]
    return [r[x_key] for r in rs], [r["value"] for r in rs], [r.get("se") or 0.0 for r in rs]


def save_figure(fig: Any, path: str | os.PathLike, *, dpi: int = 90) -> str:
    """Save a matplotlib figure as PNG (Agg), create parent folders, close it. Returns the path."""
    plt = pyplot()
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", bbox_inches="tight")
    plt.close(fig)
    return path


def recipe_main(run: Callable[..., list], prog: str, description: str, quick_help: str,
                data_help: str, argv: list[str] | None = None) -> int:
    """The command line every recipe module shares (``python -m ldp_beam.reproduce.X_recipe``):
    ``--quick``, ``--data-dir``, ``--out``, ``--seed``, ``--json``."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--data-dir", default=None, help=data_help)
    ap.add_argument("--out", default=None, help="folder for PNG figures and JSON records")
    ap.add_argument("--seed", type=int, default=None, help="default: drawn from OS entropy")
    ap.add_argument("--json", default=None, help="also write the records to this file")
    args = ap.parse_args(argv)
    recs = run(args.quick, args.data_dir, args.out, args.seed)  # the table goes to stderr
    if args.json:
        write_records(recs, args.json)
    else:
        print(json.dumps(recs, indent=1, allow_nan=False))
    return 0


def start_recipe(family: str, quick: bool, seed: int | None, progress: Any, total: int,
                 settings: str, data_dir: Any, more: str = "") -> tuple[int, Progress, dict, float]:
    """What every recipe's ``run`` does first: draw the seed from OS entropy unless one is given
    (it goes into every record so a run can be repeated), set up progress for ``total`` steps,
    start the clock and note the run's first line, ``"quick run: SETTINGS, seed=S,
    data_dir=D"`` (``"full run: ..."``; ``more`` is added at its end). Returns ``(seed, progress,
    fields every record carries, the clock's start)``."""
    seed = int(secrets.randbits(63) if seed is None else seed)
    prog = as_progress(progress, family)
    prog.total = total
    t0 = time.perf_counter()
    prog.note(f"{'quick' if quick else 'full'} run: {settings}, seed={seed}, data_dir={data_dir}"
              + more)
    return seed, prog, {"seed": seed, "quick": bool(quick)}, t0


#: The docstring of every paper recipe's ``run`` (:func:`paper_run`), for the paper's section.
PAPER_RUN_DOC = """Run the paper's {} experiments; return the records (and write figures/JSON to
    ``out_dir`` when given). ``seed=None`` draws one from OS entropy; it is in every record.
    ``progress``: None (lines on stderr), False (silent), or a callable taking each line.
    ``config`` overrides the quick/full sizes (for tests and ad-hoc runs)."""


def paper_run(section: str) -> Callable[[Callable], Callable]:
    """Decorator of a recipe's ``run``: the docstring the paper recipes share
    (:data:`PAPER_RUN_DOC`), naming the paper's ``section``."""
    def document(run: Callable) -> Callable:
        run.__doc__ = PAPER_RUN_DOC.format(section)
        return run
    return document


def cell_rng(seed: int, *label: Any) -> np.random.Generator:
    """A PCG64 stream keyed by the recipe seed and a cell label (stable across grids and runs).
    The recipes simulate many users, so they use the fast PCG64 instead of the library's AES-CTR
    default."""
    key = tuple(zlib.crc32(str(x).encode()) for x in label)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def mean_se(x: Any) -> Any:
    """The standard error of the mean over axis 0 (repetitions): a float for 1-D input, an
    array per column otherwise; NaN below two repetitions."""
    x = np.asarray(x, dtype=float)
    if x.shape[0] < 2:
        return np.full(x.shape[1:], np.nan) if x.ndim > 1 else float("nan")
    se = x.std(axis=0, ddof=1) / math.sqrt(x.shape[0])
    return float(se) if x.ndim == 1 else se


def below_by_se(a: Mapping, b: Mapping, z: float = 2.0) -> bool:
    """Record a's ``value`` is below b's by more than z combined standard errors (``se``)."""
    se = math.hypot(a.get("se") or 0.0, b.get("se") or 0.0)
    return a["value"] + z * se < b["value"]


def claim_list() -> tuple[list[dict], Callable[[str, str, str], None]]:
    """A recipe's judged claims and the function adding one: ``add(claim, verdict, evidence)``
    appends ``{"claim", "verdict", "evidence"}``."""
    out: list[dict] = []
    return out, lambda claim, verdict, evidence: out.append(
        {"claim": claim, "verdict": verdict, "evidence": evidence})


def data_file(data_dir: str | os.PathLike | None, name: str) -> str | None:
    """The path of the file ``name`` (relative) under ``data_dir``, or None when no folder is
    given or the file is not there: a recipe then skips the dataset or stands in for it."""
    if data_dir is None:
        return None
    path = os.path.join(os.fspath(data_dir), name)
    return path if os.path.isfile(path) else None


def finish_recipe(family: str, records: list, out_dir: str | None, prog: Progress,
                  claims: Callable[[list], list], figures: Callable[[list, str], list],
                  summary: Callable[[list], str]) -> list:
    """The end of every recipe: print the summary table and, with ``out_dir``, write
    ``FAMILY.json`` (the records), ``FAMILY_claims.json`` (one verdict record per claim),
    ``FAMILY_summary.txt`` and the figures there. Returns ``records``."""
    table = summary(records)
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        write_records(records, os.path.join(out_dir, f"{family}.json"))
        write_records([{**c, "experiment": "claims", "dataset": "-", "method": "-",
                        "epsilon": None, "metric": "verdict", "value": c["verdict"]}
                       for c in claims(records)], os.path.join(out_dir, f"{family}_claims.json"))
        paths = figures(records, out_dir)
        with open(os.path.join(out_dir, f"{family}_summary.txt"), "w", encoding="utf-8") as fh:
            fh.write(table + "\n")
        prog.note(f"wrote {len(paths)} figures, {family}.json, {family}_claims.json and "
                  f"{family}_summary.txt to {out_dir}")
    prog.block(table)
    prog.close()
    return records
