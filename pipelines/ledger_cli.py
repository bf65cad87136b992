"""``ldp-beam ledger``: what each dataset has spent, and the ledger options of every run.

``ldp-beam ledger [--ledger URL] [--dataset D] [--status S] [--json]`` lists every collection and
release recorded in the ledger (time, run id, command, status, dataset URI with a short
fingerprint, privacy unit, mechanism, epsilon, delta), then the totals per dataset (with its budget
and what remains), per privacy unit and per day (UTC). ``--resolve RUN_ID --as committed|aborted``
settles a run left pending by a process that died: ``committed`` if it may have published (it
stays spent), ``aborted`` if it certainly did not (its reservation is given back).

:func:`add_ledger_options` adds ``--ledger``, ``--budget`` and ``--budget-delta`` to a command that
collects or releases; :func:`ledger_outputs` lists a run's staged outputs (path, bytes, SHA-256)
for :meth:`ldp_beam.ledger.Ledger.commit`. See :mod:`ldp_beam.ledger` for what is recorded and
how spending is composed.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Mapping

from ldp_beam.errors import ParameterError
from ldp_beam.ledger import Ledger, default_url

LEDGER_HELP = ("the budget ledger: sqlite:///FILE (default: $LDP_BEAM_LEDGER, else "
               "~/.local/share/ldp-beam/ledger.db) or postgresql://USER@HOST:PORT/DATABASE")


def add_ledger_options(sp: argparse.ArgumentParser) -> None:
    """``--ledger``, ``--budget``, ``--budget-delta``: for every command that collects or
    releases."""
    sp.add_argument("--ledger", metavar="URL", help=LEDGER_HELP)
    sp.add_argument("--budget", type=float, metavar="EPS",
                    help="the input dataset's total epsilon: a run that would exceed it is "
                         "refused before any noise is drawn (recorded in the ledger, so later "
                         "runs without --budget are held to it)")
    sp.add_argument("--budget-delta", type=float, metavar="DELTA",
                    help="the delta at which the total --budget holds (needed once any run on "
                         "the dataset has delta > 0; composed with dp_accounting)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The ``ledger`` subcommand."""
    lp = subparsers.add_parser("ledger", help="what each dataset has spent (the budget ledger); "
                               "--resolve a run left pending")
    lp.add_argument("--ledger", metavar="URL", help=LEDGER_HELP)
    lp.add_argument("--dataset", metavar="D",
                    help="only this dataset: its path/URI or (a prefix of) its fingerprint")
    lp.add_argument("--status", choices=("pending", "committed", "aborted"),
                    help="only entries with this status")
    lp.add_argument("--json", action="store_true", help="machine-readable output")
    lp.add_argument("--resolve", metavar="RUN_ID",
                    help="settle a pending run whose process is gone (with --as)")
    lp.add_argument("--as", dest="resolve_as", choices=("committed", "aborted"),
                    help="committed: it may have published, it stays spent; aborted: it "
                         "certainly published nothing, its reservation is given back")
    lp.add_argument("--note", default="", help="why (recorded with --resolve)")
    return lp


def cmd_ledger(a: argparse.Namespace) -> int:
    if a.resolve_as and not a.resolve:
        raise ParameterError("--as", a.resolve_as, "given with --resolve RUN_ID")
    if a.resolve and not a.resolve_as:
        raise ParameterError("--as", None, "committed or aborted, to --resolve "
                             f"{a.resolve}")
    with Ledger.open(a.ledger) as led:
        if a.resolve:
            led.resolve(a.resolve, a.resolve_as, a.note)
            print(f"run {a.resolve} resolved as {a.resolve_as} in {led.url}")
            return 0
        entries = led.entries(a.dataset, a.status)
        totals = led.summary(a.dataset)
        if a.json:  # strict JSON: an infinite epsilon (no finite guarantee) is null
            json.dump(_finite({"ledger": led.url, "entries": entries, "totals": totals}),
                      sys.stdout, indent=1, default=str, allow_nan=False)
            sys.stdout.write("\n")
            return 0
        print(render(led.url, entries, totals))
    return 0


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _num(x: Any) -> str:
    if x is None:
        return "inf"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.6g}"


def _dataset(uri: str, fp: str) -> str:
    return f"{uri} [{fp.split(':', 1)[-1][:12]}]"


def render(url: str, entries: list[dict], totals: list[dict]) -> str:
    """The text listing: one line per entry, then totals per dataset, unit and day."""
    lines = [f"ledger {url}: {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"]
    if entries:
        head = ("time (UTC)", "run id", "command", "status", "dataset", "unit", "mechanism",
                "epsilon", "delta")
        rows = []
        for e in entries:
            status = e["status"] + (" (re-published)" if e.get("republished_from") else "") \
                + (" (seeded: not private)" if e.get("seeded") else "")
            rows.append((e["started"][:19].replace("T", " "), e["run_id"], e["command"], status,
                         _dataset(e["uri"], e["fingerprint"]), e["unit"], e["mechanism"],
                         _num(e["epsilon"]), _num(e["delta"])))
        widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if totals:
        lines.append("")
        lines.append("totals (pending runs count as spent until resolved):")
    for t in totals:
        s = t["spent"]
        at = f" at delta={s['delta']:g}" if s["delta"] else ""
        budget = ("no budget" if t["budget"] is None else
                  f"budget epsilon={_num(t['budget']['epsilon'])}"
                  + (f" delta={t['budget']['delta']:g}" if t["budget"]["delta"] else "")
                  + f", remaining {_num(t['remaining'])}")
        lines.append(f"  {_dataset(t['uri'], t['fingerprint'])}: spent epsilon="
                     f"{_num(s['epsilon'])}{at} ({s['method']}); {budget}; {s['runs']} run(s), "
                     f"{s['pending']} pending, {t['aborted']} aborted")
        if len(t["uris"]) > 1:
            lines.append(f"    also read as: {', '.join(u for u in t['uris'] if u != t['uri'])}")
        for u, us in t["units"].items():
            lines.append(f"    unit {u}: epsilon={_num(us['epsilon'])} ({us['runs']} run(s))")
        for d, ds in t["days"].items():
            lines.append(f"    day {d}: epsilon={_num(ds['epsilon'])} ({ds['runs']} run(s))")
    if not entries:
        lines.append("nothing recorded" + ("" if url else f" (default ledger {default_url()})"))
    return "\n".join(lines)


def ledger_outputs(outs: Any) -> dict:
    """A run's outputs as the ledger records them: role -> final path, bytes and SHA-256 of the
    staged file (identical once committed). ``outs`` is a :class:`.outputs.RunOutputs` whose
    outputs are all staged."""
    return {role: {"path": outs.location(role), **outs.digest(role)} for role in outs.outputs}


def ledger_args(a: argparse.Namespace) -> Mapping[str, Any]:
    """The keyword arguments the run functions take from ``add_ledger_options``' options."""
    return {"ledger": getattr(a, "ledger", None), "budget": getattr(a, "budget", None),
            "budget_delta": getattr(a, "budget_delta", None)}
