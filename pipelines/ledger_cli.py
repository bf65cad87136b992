"""``ldp-beam ledger``: what each dataset has spent, and the ledger options of every run.

``ldp-beam ledger [--ledger URL] [--dataset D] [--status S] [--json]`` lists every collection and
release recorded in the ledger (time, run id, command, status, the dataset's name with a short
fingerprint of the data the run read, privacy unit, mechanism, epsilon, delta), then the totals
per dataset name (with its budget, what remains and its budget history), per privacy unit and per
day (UTC). ``--dataset`` selects a dataset by its name, a path or URI it was read from, or (a
prefix of) a data fingerprint. Reading never creates a ledger: a ``--ledger`` where there is none
is an error. ``--resolve RUN_ID --as committed|aborted`` settles a run left pending by a process
that died: ``committed`` if it may have published (it stays spent), ``aborted`` if it certainly
did not (its reservation is given back). ``--set-budget EPS [--budget-delta D] --dataset NAME
--why TEXT`` sets, raises or lowers a dataset's budget: the recorded act (who, when, why), the
only way to raise one.

:func:`add_ledger_options` adds ``--ledger``, ``--budget``, ``--budget-delta`` and ``--dataset``
to a command that collects or releases (:func:`ledger_args` passes them on);
:func:`ledger_outputs` lists a run's staged outputs (path, bytes, SHA-256) for
:meth:`ldp_beam.ledger.Reservation.prepare`; :func:`ledger_line` is the line every command prints
about the ledger it wrote to and what the dataset has left. See :mod:`ldp_beam.ledger` for what is
recorded and how spending is composed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from typing import Any, Mapping

from ldp_beam.errors import ParameterError
from ldp_beam.ledger import Ledger, canonical_location, default_url

LEDGER_HELP = ("the budget ledger: a file path or sqlite://PATH (sqlite://team.db relative, "
               "sqlite:///srv/team.db absolute; default: $LDP_BEAM_LEDGER, else "
               "~/.local/share/ldp-beam/ledger.db) or postgresql://USER@HOST:PORT/DATABASE")


def add_ledger_options(sp: argparse.ArgumentParser) -> None:
    """``--ledger``, ``--budget``, ``--budget-delta``: for every command that collects or
    releases."""
    sp.add_argument("--ledger", metavar="URL", help=LEDGER_HELP)
    sp.add_argument("--budget", type=float, metavar="EPS",
                    help="the input dataset's total epsilon: a run that would exceed it is "
                         "refused before any noise is drawn (recorded in the ledger, so later "
                         "runs without --budget are held to it). A run may set a budget where "
                         "none is recorded, confirm it or lower it, never raise it (`ldp-beam "
                         "ledger --set-budget` does, recorded with why)")
    sp.add_argument("--budget-delta", type=float, metavar="DELTA",
                    help="the delta at which the total --budget holds (needed once any run on "
                         "the dataset has delta > 0; composed with dp_accounting)")
    sp.add_argument("--dataset", metavar="NAME",
                    help="the dataset's name in the ledger: its budget follows the people in it "
                         "however its content changes (default: the input's canonical "
                         "location)")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The ``ledger`` subcommand."""
    lp = subparsers.add_parser("ledger", help="what each dataset has spent (the budget ledger); "
                               "--resolve a run left pending; --set-budget of a dataset")
    lp.add_argument("--ledger", metavar="URL", help=LEDGER_HELP)
    lp.add_argument("--dataset", metavar="D",
                    help="only this dataset: its name, a path/URI it was read from or (a prefix "
                         "of) a data fingerprint; with --set-budget, the dataset's name (or its "
                         "input's path)")
    lp.add_argument("--status", choices=("pending", "committed", "aborted"),
                    help="only entries with this status")
    lp.add_argument("--json", action="store_true", help="machine-readable output")
    lp.add_argument("--resolve", metavar="RUN_ID",
                    help="settle a pending run whose process is gone (with --as)")
    lp.add_argument("--as", dest="resolve_as", choices=("committed", "aborted"),
                    help="committed: it may have published, it stays spent; aborted: it "
                         "certainly published nothing, its reservation is given back")
    lp.add_argument("--note", default="", help="why (recorded with --resolve)")
    lp.add_argument("--set-budget", type=float, metavar="EPS",
                    help="set, raise or lower the budget of --dataset NAME (with --why; "
                         "recorded with who and when: the only way to raise a budget)")
    lp.add_argument("--budget-delta", type=float, metavar="DELTA",
                    help="with --set-budget: the delta at which the budget holds")
    lp.add_argument("--why", metavar="TEXT",
                    help="with --set-budget: why the budget changes (who agreed, a ticket), "
                         "recorded")
    return lp


def cmd_ledger(a: argparse.Namespace) -> int:
    set_budget, why = getattr(a, "set_budget", None), getattr(a, "why", None)
    budget_delta = getattr(a, "budget_delta", None)
    if a.resolve_as and not a.resolve:
        raise ParameterError("--as", a.resolve_as, "given with --resolve RUN_ID")
    if a.resolve and not a.resolve_as:
        raise ParameterError("--as", None, "committed or aborted, to --resolve "
                             f"{a.resolve}")
    if set_budget is None:
        if budget_delta is not None:
            raise ParameterError("--budget-delta", budget_delta, "given with --set-budget EPS")
        if why is not None:
            raise ParameterError("--why", why, "given with --set-budget EPS (--resolve takes "
                                 "--note)")
    else:
        if a.resolve:
            raise ParameterError("--set-budget", set_budget, "given without --resolve (one "
                                 "act at a time)")
        if not a.dataset:
            raise ParameterError("--dataset", a.dataset, "the name of the dataset whose budget "
                                 "--set-budget sets")
        if not why or not why.strip():
            raise ParameterError("--why", why, "a non-empty reason, recorded with the new "
                                 "budget (who agreed, a ticket)")
        with Ledger.open(a.ledger) as led:  # a budget may be set before the first run
            name = _dataset_name(led, a.dataset)
            new = name not in led.datasets()
            change = led.set_budget(name, set_budget, budget_delta, why=why)
            print(render_change(led.url, change))
            if new:
                print(f"note: no run has used the dataset name {name!r} yet in this ledger; runs "
                      f"hold to this budget with --dataset {shlex.quote(name)} (or, for a path, "
                      "by reading it there)")
            print(ledger_line(led.url, led.dataset_status(name), _default_used(a.ledger)))
        return 0
    with Ledger.open(a.ledger, create=False) as led:  # reading never creates a ledger
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


def _default_used(url: str | None) -> bool:
    """True when a command used the default ledger: no ``--ledger``, no ``$LDP_BEAM_LEDGER``."""
    return not url and not os.environ.get("LDP_BEAM_LEDGER", "").strip()


def _dataset_name(led: Ledger, text: str) -> str:
    """The dataset ``--set-budget`` changes: ``text`` when the ledger knows that name; else the
    canonical location of ``text`` when it is a path or URL the ledger knows a dataset by (the
    default name of a run on it); else ``text`` itself, a new name."""
    known = set(led.datasets())
    if text in known:
        return text
    try:
        loc = canonical_location(text)
    except ParameterError:
        return text
    if loc in known or ("://" not in text and os.path.exists(text)):
        return loc
    return text


def render_change(url: str, change: Mapping[str, Any]) -> str:
    """What ``--set-budget`` changed, in one line (and a warning when the dataset has already
    spent more than its new budget)."""
    before = _budget_text(change["previous_epsilon"], change["previous_delta"])
    after = _budget_text(change["epsilon"], change["delta"])
    verb = "unchanged at" if before == after else f"{before} ->"
    line = (f"ledger {url}: dataset {change['dataset']}: budget {verb} {after}, recorded by "
            f"{change['os_user']}@{change['host']} at {change['changed'][:19].replace('T', ' ')} "
            f"UTC: {change['why']}")
    spent = change.get("spent") or {}
    eps = spent.get("epsilon")
    if spent and (eps is None or eps > change["epsilon"]):
        line += (f"\nwarning: it has already spent epsilon={_num(eps)}, more than its new "
                 "budget: no further run on it fits")
    return line


def _budget_text(eps: Any, delta: Any) -> str:
    if eps is None:
        return "none"
    return f"epsilon={_num(eps)}" + (f" delta={delta:g}" if delta is not None else "")


def ledger_line(url: str, status: Mapping[str, Any], default_used: bool) -> str:
    """The line a command prints after a run: which ledger it wrote to and what the dataset has
    left (``status``: :meth:`ldp_beam.ledger.Ledger.dataset_status`); ``default_used``: the
    ledger was the default one (no ``--ledger``, no ``$LDP_BEAM_LEDGER``), which the line then
    says."""
    spent = status.get("spent") or {}
    at = f" at delta={spent['delta']:g}" if spent.get("delta") else ""
    line = (f"ledger {url}: dataset {status['dataset']} has spent "
            f"epsilon={_num(spent.get('epsilon'))}{at}")
    b = status.get("budget")
    if b is None:
        line += " (no budget)"
    else:
        line += (f" of budget {_num(b['epsilon'])}"
                 + (f" (delta={b['delta']:g})" if b.get("delta") is not None else "")
                 + f" ({_num(status.get('remaining'))} left)")
    if status.get("pending"):
        line += f"; {status['pending']} pending run(s) count until resolved"
    if default_used:
        line += " (the default ledger; pass --ledger or set LDP_BEAM_LEDGER)"
    return line


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _num(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isinf(x)):
        return "inf"
    return f"{x:.6g}"


def _short(fp: str) -> str:
    return fp.split(":", 1)[-1][:12]


def _dataset(name: str, fp: str) -> str:
    return f"{name} [{_short(fp)}]"


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
                         _dataset(e["dataset"], e["fingerprint"]), e["unit"], e["mechanism"],
                         _num(e["epsilon"]), _num(e["delta"])))
        widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if totals:
        lines.append("")
        lines.append("totals per dataset (pending runs count as spent until resolved):")
    for t in totals:
        s = t["spent"]
        at = f" at delta={s['delta']:g}" if s["delta"] else ""
        budget = ("no budget" if t["budget"] is None else
                  f"budget epsilon={_num(t['budget']['epsilon'])}"
                  + (f" delta={t['budget']['delta']:g}" if t["budget"]["delta"] else "")
                  + f", remaining {_num(t['remaining'])}")
        lines.append(f"  {t['dataset']}: spent epsilon="
                     f"{_num(s['epsilon'])}{at} ({s['method']}); {budget}; {s['runs']} run(s), "
                     f"{s['pending']} pending, {t['aborted']} aborted")
        others = [u for u in t["uris"] if u != t["dataset"]]
        if others:
            lines.append(f"    read from: {', '.join(others)}")
        if len(t["fingerprints"]) > 1:
            lines.append(f"    {len(t['fingerprints'])} versions of its data: "
                         f"{', '.join(_short(f) for f in t['fingerprints'])} (its budget "
                         "counts them all)")
        for u, us in t["units"].items():
            lines.append(f"    unit {u}: epsilon={_num(us['epsilon'])} ({us['runs']} run(s))")
        for d, ds in t["days"].items():
            lines.append(f"    day {d}: epsilon={_num(ds['epsilon'])} ({ds['runs']} run(s))")
        for c in t.get("budget_changes") or ():
            was = _budget_text(c["previous_epsilon"], c["previous_delta"])
            now = _budget_text(c["epsilon"], c["delta"])  # epsilon: never null
            lines.append(f"    budget {c['changed'][:19].replace('T', ' ')}: {was} -> {now} by "
                         f"{c['os_user']}@{c['host']}"
                         + (f" (run {c['run_id']})" if c.get("run_id") else "")
                         + f": {c['why']}")
    if not entries:
        lines.append("nothing recorded" + ("" if url else f" (default ledger {default_url()})"))
    return "\n".join(lines)


def ledger_outputs(outs: Any) -> dict:
    """A run's outputs as the ledger records them: role -> final path, bytes and SHA-256 of the
    staged file (identical once committed). ``outs`` is a :class:`.outputs.RunOutputs` whose
    outputs are all staged."""
    return {role: {"path": outs.location(role), **outs.digest(role)} for role in outs.outputs}


def ledger_args(a: argparse.Namespace) -> Mapping[str, Any]:
    """The keyword arguments the run functions take from ``add_ledger_options``' options:
    ``ledger``, ``budget``, ``budget_delta`` and ``dataset`` (the ``--dataset`` name, None for
    the input's canonical location)."""
    return {k: getattr(a, k, None) for k in ("ledger", "budget", "budget_delta", "dataset")}
