"""``ldp-beam plan``: the errors a release will have, and the budget left, before spending any.

``ldp-beam plan -m MECHANISM -p NAME=VALUE ... (--rows N | --units N | --input TABLE
[--privacy-unit COLUMN]) [--by SIZES|COLUMN]`` prints, for every statistic the mechanism
releases, its standard error and CI half-width at that size, the rule by which an answer is
useful and the smallest group that gets one, the assumed data distribution the numbers rest on,
and what the dataset has left in the budget ledger (``--ledger URL``, ``--dataset NAME``; read
only: a plan never creates a ledger nor records anything). See :mod:`ldp_beam.plan` for how the
errors are computed (synthetic records through the family's own estimator; no formula per
family) and docs/plan.md for a guide.

Nothing private is read: with ``--input`` only the number of rows (Parquet: from the footers),
or the distinct values of the ``--privacy-unit`` column, and with ``--by COLUMN`` the size of
each group; no value of any other column, no noise drawn on the data, no ledger entry.

Exit codes: 0 the plan was printed; 2 bad options (one line naming the option). Imports neither
Apache Beam nor, before the command runs, numpy or pyarrow (the CLI builds its parser from this
module for every command).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from ldp_beam.errors import LdpBeamError
from ldp_beam.ledger import Ledger, LedgerError, LedgerNotFound, canonical_location, \
    default_url, redact

from .cli import UsageError, _params
from .ledger_cli import _default_used, ledger_line


class PlanUsageError(ValueError):
    """A bad option, in one line naming the option."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plan`` subcommand to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "plan", help="before spending: the standard error and CI of every statistic a "
        "release will have, the smallest useful group, and the budget left (reads no "
        "private value, spends nothing)")
    p.add_argument("--mechanism", "-m", required=True,
                   help="a registered mechanism name (see `ldp-beam list`)")
    p.add_argument("--param", "-p", action="append", metavar="NAME=VALUE",
                   help="a mechanism parameter, repeatable (e.g. -p lower=0 -p upper=100)")
    p.add_argument("--epsilon", type=float, help="shorthand for -p epsilon=VALUE")
    p.add_argument("--allow-no-guarantee", action="store_true",
                   help="plan a configuration with no finite privacy guarantee")
    p.add_argument("--option", action="append", metavar="NAME=VALUE",
                   help="an estimator option, repeatable (as `estimate --option`)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--rows", type=int, metavar="N", help="the number of rows (records)")
    size.add_argument("--units", type=int, metavar="N",
                      help="the number of privacy units (people); one report each")
    size.add_argument("--input", "-i", metavar="TABLE",
                      help="a Parquet or CSV file, folder or glob to count: its rows, or the "
                           "distinct values of --privacy-unit (no other column is read)")
    p.add_argument("--privacy-unit", metavar="COLUMN",
                   help="with --input: count the distinct values of this column (the units "
                        "kept), not the rows")
    p.add_argument("--by", metavar="SIZES|COLUMN",
                   help="a per-key release: the group sizes (comma-separated integers, or "
                        "KEY=SIZE pairs), or a column of --input whose groups are counted")
    p.add_argument("--assume", action="append", metavar="[ROLE:]SPEC",
                   help="the synthetic data the errors are computed on (default: uniform over "
                        "each declared domain): label frequencies a=0.5,b=0.2 for a category, "
                        "mean=M[,sd=S], constant=V or uniform for a number; ROLE: for a role "
                        "other than the first (repeatable)")
    p.add_argument("--target", action="append", metavar="[STATISTIC=]HALF_WIDTH",
                   help="useful means a CI half-width at most this (default rule: at most "
                        "half the statistic's range); a bare number applies to the statistics "
                        "with a declared, probability or data-unit range (repeatable)")
    p.add_argument("--level", type=float, default=0.95,
                   help="the confidence level of the intervals (default 0.95)")
    p.add_argument("--replicates", type=int, default=None, metavar="R",
                   help="simulated releases for statistics whose estimator gives no stderr "
                        "(default 50)")
    p.add_argument("--seed", type=int, default=None,
                   help="the simulation's seed (synthetic data only; default: drawn afresh "
                        "and printed, so a plan can be repeated)")
    p.add_argument("--ledger", metavar="URL",
                   help="the budget ledger to read (default: $LDP_BEAM_LEDGER, else the "
                        "user's default ledger); read only, never created")
    p.add_argument("--dataset", metavar="NAME",
                   help="the dataset's name in the ledger (default: the --input's canonical "
                        "location)")
    p.add_argument("--json", action="store_true", help="the plan as JSON on stdout")
    return p


# --------------------------------------------------------------------------- options
def _kv(items: list[str] | None, opt: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise PlanUsageError(f"{opt} {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _groups(a: argparse.Namespace, counted: dict | None) -> tuple[Any, str | None]:
    """(group sizes for plan(), the grouping column's name or None)."""
    if not a.by:
        return None, None
    text = a.by.strip()
    if counted is not None and "groups" in counted:
        return counted["groups"], a.by
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise PlanUsageError(f"--by {a.by!r}: group sizes or a column of --input")
    keyed = all("=" in x for x in items)
    sizes: Any = {} if keyed else []
    for x in items:
        key, val = x.rsplit("=", 1) if keyed else (None, x)
        try:
            v = int(val.replace("_", ""))
        except ValueError:
            if a.input:
                raise PlanUsageError(f"--by {a.by!r}: not a column of --input, nor group "
                                     "sizes") from None
            raise PlanUsageError(f"--by {a.by!r}: expected group sizes (integers, or "
                                 "KEY=SIZE pairs), or a column name with --input") from None
        if v < 0:
            raise PlanUsageError(f"--by {a.by!r}: group sizes must be >= 0")
        if keyed:
            sizes[key.strip()] = v
        else:
            sizes.append(v)
    return sizes, None


def _assume(items: list[str] | None, mech: Any) -> Any:
    if not items:
        return None
    roles = {r.name for r in mech.roles}
    out: dict[str, str] = {}
    first = next((r.name for r in mech.roles if r.required), None)
    for item in items:
        role, spec = first, item
        if ":" in item:
            head, rest = item.split(":", 1)
            if head.strip() in roles:
                role, spec = head.strip(), rest
        if role in out:
            raise PlanUsageError(f"--assume {item!r}: role {role!r} is assumed twice")
        out[role] = spec
    return out


def _target(items: list[str] | None) -> Any:
    if not items:
        return None
    bare: float | None = None
    named: dict[str, float] = {}
    for item in items:
        name, val = item.rsplit("=", 1) if "=" in item else (None, item)
        try:
            v = float(val)
        except ValueError:
            raise PlanUsageError(f"--target {item!r}: expected a half-width or "
                                 "STATISTIC=HALF_WIDTH") from None
        if not (v > 0 and math.isfinite(v)):
            raise PlanUsageError(f"--target {item!r}: a half-width > 0")
        if name is None:
            bare = v
        else:
            named[name.strip()] = v
    if named and bare is not None:
        raise PlanUsageError("--target: give either one half-width or STATISTIC=HALF_WIDTH "
                             "pairs, not both")
    return named or bare


# --------------------------------------------------------------------------- the ledger
def budget_state(ledger: str | None, dataset: str | None, input_path: str | None,
                 guarantee: dict) -> dict:
    """What the ledger holds for the dataset, read only (never creates a ledger), with the
    line the command prints: ``{"ledger", "dataset", "status", "release_epsilon", "fits",
    "line"}``."""
    eps = guarantee.get("epsilon")
    delta = guarantee.get("delta") or 0.0
    out: dict[str, Any] = {"ledger": redact(ledger or default_url()), "dataset": None,
                           "status": None, "release_epsilon": eps, "release_delta": delta,
                           "fits": None}
    name = dataset
    if name is None and input_path:
        try:
            name = canonical_location(input_path)
        except LdpBeamError:
            name = None
    spend = ("no finite epsilon" if eps is None else
             f"epsilon={eps:g}" + (f", delta={delta:g}" if delta else ""))
    if name is None:
        out["line"] = (f"budget: not shown (name the dataset with --dataset NAME, or give "
                       f"--input); this release would spend {spend}")
        return out
    out["dataset"] = name
    try:
        with Ledger.open(ledger, create=False) as led:
            status = led.dataset_status(name)
            url = led.url
    except LedgerNotFound:
        out["line"] = (f"ledger {out['ledger']}: none there yet, so dataset {name} has spent "
                       f"nothing; this release would spend {spend}")
        return out
    except (LedgerError, LdpBeamError, ValueError) as exc:
        out["line"] = f"ledger {out['ledger']}: not read ({exc}); this release would spend {spend}"
        return out
    out["status"] = status
    out["ledger"] = url
    line = ledger_line(url, status, _default_used(ledger))
    remaining = status.get("remaining")
    if eps is None:
        out["fits"] = False
        line += f"; this release has no finite epsilon ({guarantee.get('summary', '')})"
    elif remaining is None:
        line += f"; this release would spend {spend}"
    else:
        fits = eps <= remaining + 1e-12
        out["fits"] = fits
        line += (f"; this release would spend {spend}: "
                 + (f"it fits ({remaining - eps:.6g} would be left)" if fits else
                    f"it exceeds what is left by {eps - remaining:.6g} (the run would be "
                    "refused before any noise is drawn)"))
        if delta or (status.get("spent") or {}).get("delta"):
            line += " (epsilon alone: the ledger composes delta when the run reserves)"
    out["line"] = line
    return out


# --------------------------------------------------------------------------- the command
def cmd_plan(a: argparse.Namespace) -> int:
    """Run ``ldp-beam plan``; returns the exit code. Raises ``ValueError`` (one line naming the
    option) for bad options, which the command line prints as ``ldp-beam plan: error: ...``
    with exit code 2."""
    # lazy: ldp_beam.plan costs 53 ms at import, the registry it loads included (measured, after
    # numpy and ldp_beam.core); the CLI imports this module to build its parser, --help included
    from ldp_beam import plan as P
    from ldp_beam.registry import get_registry

    if a.privacy_unit and not a.input:
        raise PlanUsageError("--privacy-unit: needs --input (give --units N for a unit count)")
    if not 0 < a.level < 1:
        raise PlanUsageError(f"--level {a.level}: a confidence level in (0, 1)")
    try:
        params = _params(a)  # -p and --epsilon parsed as every command does
    except UsageError as exc:
        raise PlanUsageError(str(exc)) from None
    try:
        mech = get_registry().build(a.mechanism, params,
                                    allow_no_guarantee=a.allow_no_guarantee)
    except (LdpBeamError, ValueError, KeyError) as exc:
        raise PlanUsageError(f"--mechanism/--param: {exc}") from None
    n: int | None
    if a.input:
        by_col = a.by.strip() if a.by and _is_column(a.input, a.by.strip()) else None
        counted = P.count_input(a.input, unit=a.privacy_unit, by=by_col)
        n = counted["n"]
        if n < 1:
            raise PlanUsageError(f"--input {a.input!r}: no rows"
                                 + (f" with a {a.privacy_unit!r}" if a.privacy_unit else ""))
    else:
        n = a.rows if a.rows is not None else a.units
        if n is None or n < 1:
            raise PlanUsageError(f"--{'rows' if a.rows is not None else 'units'} {n}: an "
                                 "integer >= 1")
        counted = {"n": n, "what": "rows" if a.rows is not None else "privacy units"}
    groups, by_name = _groups(a, counted)
    kwargs: dict[str, Any] = {"groups": groups, "assume": _assume(a.assume, mech),
                              "level": a.level, "options": _kv(a.option, "--option"),
                              "target": _target(a.target), "seed": a.seed, "by": by_name}
    if a.replicates is not None:
        if a.replicates < 2:
            raise PlanUsageError(f"--replicates {a.replicates}: an integer >= 2")
        kwargs["replicates"] = a.replicates
    try:
        result = P.plan(mech, n, **kwargs)
    except P.PlanError:
        raise
    except LdpBeamError as exc:
        opt = {"assume": "--assume", "target": "--target", "groups": "--by",
               "level": "--level"}.get(getattr(exc, "name", ""), "--option")
        raise PlanUsageError(f"{opt}: {exc}") from None
    result = result.with_counted(counted)
    result = result.with_budget(budget_state(a.ledger, a.dataset, a.input, result.guarantee))
    if a.json:
        json.dump(result.to_dict(), sys.stdout, indent=1, allow_nan=False, default=str)
        sys.stdout.write("\n")
    else:
        print(result.summary())
    return 0


def _is_column(path: str, name: str) -> bool:
    """Whether ``name`` is a column of the table at ``path`` (reads the schema only)."""
    from ldp_beam import plan as P  # lazy: 53 ms at import (measured; see cmd_plan)

    try:
        return name in P.input_columns(path)
    except (LdpBeamError, ValueError, OSError):
        return False


def main(argv: list[str] | None = None) -> int:
    """``plan`` on its own (what ``ldp-beam plan`` does once wired into the CLI)."""
    ap = argparse.ArgumentParser(prog="ldp-beam")
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    a = ap.parse_args(["plan", *(sys.argv[1:] if argv is None else argv)])
    try:
        return cmd_plan(a)
    except (LdpBeamError, ValueError, FileNotFoundError) as exc:
        print(f"ldp-beam plan: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
