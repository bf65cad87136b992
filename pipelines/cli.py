"""The ``ldp-beam`` command line: demo, list, collect, estimate, stream, reproduce, bench, audit.

Arguments this parser does not know (``--runner=...``, ``--direct_num_workers=2``, ...) are passed
on to Apache Beam's PipelineOptions. Exit codes: 0 success, 2 bad usage or configuration,
3 a command that is not available yet, 1 a failed run.

The imports inside functions are lazy on purpose: this module's imports load neither Beam nor
numpy, so that ``ldp-beam --help`` and the commands that need neither start fast; each names
what it would cost.
"""
from __future__ import annotations

import argparse
import difflib
import gc
import json
import logging
import math
import os
import re
import sys
import time
from collections import Counter
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from typing import Any

from ldp_beam import __version__, progress
from ldp_beam.errors import LdpBeamError

from .ledger_cli import add_ledger_options, add_parser as add_ledger_parser, cmd_ledger, \
    ledger_args, ledger_line
from .lifecycle import install_signal_handlers, interruption, quiet_beam_errors
from .files import RunFailed, open_read

FAMILIES = ("bisample", "rvns", "uldp", "dphr", "ospdprr")
PENDING: dict[str, str] = {}  # subcommand or family -> where it is tracked
#: the largest epsilon per release a command runs without --allow-weak-privacy
WEAK_EPSILON = 10.0


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line (``ldp-beam estimate: error: ...``, exit 2) instead
    of the usage block followed by the error; ``--help`` still shows the usage. Subcommands'
    parsers are of this class too (``add_subparsers`` makes them of the parent's class)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _kv(items: list[str] | None, what: str) -> dict[str, str]:
    """NAME=VALUE options; a NAME given twice with different values is refused, the same value
    twice is fine."""
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise UsageError(f"{what} {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        k, v = k.strip(), v.strip()
        if k in out and out[k] != v:
            raise UsageError(f"{what} {k}: given twice with different values ({what} {k}="
                             f"{out[k]} and {what} {k}={v}); give it once")
        out[k] = v
    return out


def _mechanism_args(sp: argparse.ArgumentParser, required: bool) -> None:
    sp.add_argument("--mechanism", "-m", required=required,
                    help="a registered mechanism name (see `ldp-beam list`)")
    sp.add_argument("--param", "-p", action="append", metavar="NAME=VALUE",
                    help="a mechanism parameter, repeatable (e.g. -p lower=0 -p upper=100)")
    sp.add_argument("--epsilon", type=float, help="shorthand for -p epsilon=VALUE")
    sp.add_argument("--allow-no-guarantee", action="store_true",
                    help="run a configuration with no finite privacy guarantee (e.g. a paper's "
                         "variant, for replication); every output then says so")
    _weak_privacy_arg(sp)


def _weak_privacy_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--allow-weak-privacy", action="store_true",
                    help=f"run with an epsilon above {WEAK_EPSILON:g} per release (given, or "
                         "what the parameters of a family such as rvns imply): practically no "
                         "protection; a warning is printed")


def _quiet_arg(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--quiet", "-q", action="store_true",
                    help="no progress bar nor rate line on stderr (only errors)")


def _run_args(sp: argparse.ArgumentParser) -> None:
    """Options of every batch run that commits outputs."""
    sp.add_argument("--force", action="store_true",
                    help="replace existing outputs (only once the new run has succeeded)")
    sp.add_argument("--allow-unreadable", action="store_true",
                    help="commit even if part of the input cannot be read (those rows are "
                         "counted as unreadable in the manifest); default: fail, commit nothing")
    sp.add_argument("--null-values", action="append", metavar="TEXT",
                    help="CSV input: a cell text that means a missing value, repeatable "
                         "(default: only the empty cell; \"NA\" stays text)")


def _params(a: argparse.Namespace) -> dict[str, Any]:
    """The mechanism parameters of ``-p NAME=VALUE`` and ``--epsilon``; epsilon given both ways
    with different values is refused."""
    params: dict[str, Any] = _kv(a.param, "--param")
    if a.epsilon is not None:
        given = params.get("epsilon")
        if given is not None and not _same_number(given, a.epsilon):
            raise UsageError(f"epsilon given twice with different values: --epsilon {a.epsilon:g} "
                             f"and -p epsilon={given}; give it once")
        params["epsilon"] = a.epsilon
    return params


def _same_number(text: str, value: float) -> bool:
    try:
        return float(text) == float(value)
    except ValueError:
        return False


# ------------------------------------------------------------------ options that do not surprise
def _weak_why() -> str:
    ratio = round(math.exp(WEAK_EPSILON), -3)
    return (f"at epsilon {WEAK_EPSILON:g} one report or answer can be e^{WEAK_EPSILON:g} ~ "
            f"{ratio:,.0f} times likelier under one value than under another: practically no "
            "protection")


def _epsilon_text(mech: Any) -> str:
    """``epsilon = 100``, or for a family whose epsilon follows from other parameters (a class
    attribute ``EPSILON_FROM``), the value with how it is set."""
    eps = mech.guarantee.epsilon
    how = getattr(type(mech), "EPSILON_FROM", None)
    if how and "epsilon" not in mech.params():
        return f"epsilon = {eps:.4g} ({how})"
    return f"epsilon = {eps:g}"


def weak_privacy(what: str, eps: float, a: argparse.Namespace, command: str,
                 chosen: bool = True) -> None:
    """An epsilon above :data:`WEAK_EPSILON` (per release): refused unless
    ``--allow-weak-privacy`` where it is chosen on this command line (``chosen``), else (and
    with the flag) one warning line on stderr. ``what``: the epsilon and where it comes from."""
    if not (math.isfinite(eps) and eps > WEAK_EPSILON):
        return
    allowed = bool(getattr(a, "allow_weak_privacy", False))
    if chosen and not allowed:
        raise UsageError(f"{what} is above {WEAK_EPSILON:g} (the range without "
                         f"--allow-weak-privacy is (0, {WEAK_EPSILON:g}]): {_weak_why()}; pass "
                         "--allow-weak-privacy to run it anyway")
    how = ("allowed by --allow-weak-privacy" if allowed else
           "the configuration the reports were collected with")
    print(f"ldp-beam {command}: warning: {what} is above {WEAK_EPSILON:g}: practically no "
          f"protection ({how})", file=sys.stderr)


def check_privacy_strength(mech: Any, a: argparse.Namespace, command: str,
                           chosen: bool = True) -> None:
    """:func:`weak_privacy` for a built mechanism: the epsilon of its guarantee (given with
    ``--epsilon``/``-p epsilon=``, or what the parameters imply, e.g. rvns's d, delta and k)."""
    eps = mech.guarantee.epsilon
    if eps is not None and math.isfinite(eps) and eps > WEAK_EPSILON:
        weak_privacy(_epsilon_text(mech), eps, a, command, chosen)


def _epsilon_from(a: argparse.Namespace, exc: BaseException) -> str:
    """For a parameter error of a family whose epsilon is derived (its mechanism class's
    ``EPSILON_FROM``): how epsilon is set for it, appended to the one-line error."""
    name, text = getattr(a, "mechanism", None), str(exc)
    if not name or "parameter '" not in text:
        return ""
    try:
        # lazy: ldp_beam.registry, 0.17 s (measured); only a failed command's message needs it
        from ldp_beam.registry import get_registry

        how = getattr(get_registry().get(name).mechanism, "EPSILON_FROM", None)
    except Exception:  # an unknown name: the error already says so
        return ""
    return f" ({how})" if how and how not in text else ""


def _nearest(name: str, ours: list[str], beam: set[str] | frozenset = frozenset()) -> str:
    """"; did you mean X?": the closest of this command's options and Beam's, else the nearest
    of this command's own options (there always is one)."""
    close = difflib.get_close_matches(name, sorted(set(ours) | set(beam)), n=1, cutoff=0.6)
    if not close:
        pool = [o for o in ours if o.startswith("--") == name.startswith("--")] or ours
        close = difflib.get_close_matches(name, pool, n=1, cutoff=0.0)
    return f"; did you mean {close[0]}?" if close else ""


def check_leftovers(rest: list[str], ours: list[str], command: str) -> None:
    """What the command's parser did not take: only Apache Beam's ``--options`` may pass. An
    unknown option is named (not the value after it) with the nearest valid one; raises
    ValueError in one line."""
    def is_option(x: str) -> bool:
        if not x.startswith("-") or x == "-":
            return False
        try:
            float(x)
            return False  # a negative number
        except ValueError:
            return True

    for x in rest:
        if is_option(x) and not x.startswith("--"):
            name = x.split("=", 1)[0]
            raise ValueError(f"unknown option {name}{_nearest(name, ours)} (not an option of "
                             f"ldp-beam {command})")
    longs = [x for x in rest if x.startswith("--")]
    if longs:
        # lazy: Beam (pipelines.common), 1.5 s (measured); only an option of Beam's needs it
        from .common import beam_option_names

        known = beam_option_names()
        for x in longs:
            name = x.split("=", 1)[0]
            if name not in known:
                raise ValueError(f"unknown option {name}{_nearest(name, ours, known)} (not an "
                                 f"option of ldp-beam {command} nor of Apache Beam's "
                                 "PipelineOptions)")
    for i, x in enumerate(rest):
        if not is_option(x):
            prev = rest[i - 1] if i else ""
            if prev.startswith("--") and "=" not in prev:
                raise ValueError(f"{prev} {x}: an option passed on to Apache Beam takes its "
                                 f"value with '=': {prev}={x}")
            raise ValueError(f"unexpected argument {x!r}: ldp-beam {command} takes options "
                             "only (--help lists them)")


def _quiet_logs(verbose: bool) -> None:
    """Configure logging before a command imports Beam or Dask: their INFO and WARNING lines
    (Beam's "apitools not found", logged on the root logger by every import of Beam's GCP
    modules; Dask's dozens of INFO lines per local cluster) appear only with ``--verbose``.
    ``distributed`` sets its loggers' levels when it is imported, in this process and in every
    worker process it starts, from its configuration: the environment sets that configuration
    for both (unless the user set it)."""
    logging.basicConfig(level=logging.INFO if verbose else logging.ERROR)
    if verbose:
        return
    logging.getLogger().setLevel(logging.ERROR)
    for name in ("apache_beam", "distributed", "dask"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__DISTRIBUTED", "error")
    os.environ.setdefault("DASK_DISTRIBUTED__LOGGING__ROOT", "error")
    quiet_beam_errors()  # a failure of ours is reported in one line, not Beam's traceback


def _estimate_options_apply(a: argparse.Namespace, central: bool) -> None:
    """Refuse an ``estimate`` option the path taken would ignore without a word."""
    if central:
        if a.unverified:
            raise UsageError("--unverified: applies to estimating LDP reports (their "
                             "provenance); a central-DP release reads raw rows")
        if not a.by:
            for opt, given in (("--keys", a.keys),
                               ("--partition-selection", a.partition_selection)):
                if given is not None:
                    raise UsageError(f"{opt}: chooses the keys of a per-key release and goes "
                                     "with --by COLUMN; without --by there is one release of "
                                     "all rows")
        return
    path = ("estimating LDP reports (no central-DP --mechanism given) draws no noise and spends "
            "nothing: it is post-processing of reports already collected")
    keys = ("--keys and --partition-selection choose the keys of a per-key central-DP release; "
            "LDP estimates --by COLUMN estimate every value of the kept column")
    budget = ("a budget is checked where epsilon is spent: at collect (collect --budget) or set "
              "with `ldp-beam ledger --set-budget`")
    for opt, given, why in (
            ("--seed", a.seed, "a seed applies to central-DP releases and to collect, which "
             "draw noise"),
            ("--keys", a.keys, keys), ("--partition-selection", a.partition_selection, keys),
            ("--privacy-unit", a.privacy_unit, "the reports' privacy unit is the one declared "
             "when they were collected (collect --privacy-unit), recorded in their metadata and "
             "applied here"),
            ("--budget", a.budget, budget), ("--budget-delta", a.budget_delta, budget)):
        if given is not None:
            raise UsageError(f"{opt}: does not apply here: {path}; {why}")


def _null_values_apply(a: argparse.Namespace) -> None:
    if a.null_values and a.input.lower().endswith((".parquet", ".pq")):
        raise UsageError(f"--null-values: applies to CSV input; {a.input} is Parquet, whose "
                         "missing values are nulls")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="ldp-beam", description="Privacy-preserving collection and "
                 "estimation on Apache Beam. Unknown --options go to Beam.")
    ap.add_argument("--verbose", "-v", action="store_true", help="show Beam's log")
    ap.add_argument("--beam-speedups", action="store_true",
                    help="opt in to three exact shortcuts patched into Beam's pipeline "
                         "construction (verified Beam versions only; off by default; also "
                         "LDP_BEAM_SPEEDUPS=1): ldp_beam/transforms/beam_speed.py")
    ap.add_argument("--version", action="version", version=f"ldp-beam {_version()}")
    sub = ap.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the main job on bundled sample data (DirectRunner)")
    d.add_argument("--out", help="directory for reports, estimates and the figure (default: temp)")
    d.add_argument("--epsilon", type=float, default=3.0)
    d.add_argument("--seed", help="make the noise reproducible (default: OS entropy)")
    d.add_argument("--section", action="append", help="run only this section (repeatable)")
    d.add_argument("--stream", action="store_true",
                   help="instead: live telemetry for ~30 s on Google's Pub/Sub emulator "
                        "(started here): simulated devices publish GRR reports, the collector "
                        "estimates each 5 s window, printed beside the truth")
    _weak_privacy_arg(d)

    ls = sub.add_parser("list", help="registered mechanisms with parameters and guarantees")
    ls.add_argument("--json", action="store_true")

    c = sub.add_parser("collect", help="perturb a table column into a reports table")
    c.add_argument("--input", "-i", required=True, help=INPUT_HELP)
    c.add_argument("--column", "-c", action="append",
                   help="input column for the mechanism's required roles, in order; repeat it "
                        "for several (e.g. -c parents -c class for a joint mechanism's x, y)")
    c.add_argument("--role", action="append", metavar="ROLE=COLUMN",
                   help="map another role to a column, e.g. --role preference=eps_u")
    c.add_argument("--keep", action="append", default=[],
                   help="copy this column to the reports unprotected (e.g. a grouping key); "
                        "it must be declared with --public, and can never be an input column")
    c.add_argument("--public", action="append", default=[], metavar="COLUMN",
                   help="declare a column public (not about a person, not an identifier), so "
                        "that --keep may copy it; listed in the manifest and the guarantee")
    c.add_argument("--output", "-o", required=True, help="reports Parquet file")
    c.add_argument("--dead-letter", help="default: OUTPUT.deadletter.jsonl")
    c.add_argument("--dead-letter-all-columns", action="store_true",
                   help="dead letters hold whole rows (default: only the mechanism's input "
                        "columns, with the file and row)")
    c.add_argument("--seed", help="reproducible noise from this seed: NOT PRIVATE (whoever "
                   "knows the seed removes the noise); default: a secret key of OS entropy")
    c.add_argument("--batch-rows", type=int, default=1 << 16)
    c.add_argument("--privacy-unit", metavar="COLUMN",
                   help="the column naming each row's person: at most --max-reports-per-unit "
                        "reports per unit, chosen uniformly among its rows; the guarantee holds "
                        "per unit (without it: per record only)")
    c.add_argument("--max-reports-per-unit", type=int, default=1, metavar="K",
                   help="with --privacy-unit: reports per unit (default 1); the guarantee is "
                        "K x epsilon per unit and standard errors are widened for K > 1")
    _quiet_arg(c)
    _mechanism_args(c, required=True)
    _run_args(c)
    add_ledger_options(c)

    e = sub.add_parser("estimate", help="estimate statistics from a reports table")
    e.add_argument("--input", "-i", required=True,
                   help=INPUT_HELP + " (for an LDP estimate: a reports table written by collect)")
    _quiet_arg(e)
    e.add_argument("--output", "-o", required=True,
                   help="the estimate: X.json (nested), X.parquet or X.csv (the tidy table), a "
                        "local path or a URL such as s3://bucket/prefix/est.parquet; or a "
                        "database table duckdb:///FILE.db?table=T or "
                        "postgresql://USER@HOST:PORT/DB?table=T (an existing one needs --force "
                        "and is replaced in one transaction when the run commits)")
    e.add_argument("--side-outputs", metavar="PREFIX",
                   help="where the manifest, dead letters and a release's curator file go: "
                        "PREFIX.manifest.json, PREFIX.deadletter.jsonl, PREFIX.curator.json "
                        "(default: OUTPUT; for a DuckDB table FILE.db.T beside the database; "
                        "for a PostgreSQL table ./DB.T in the current folder)")
    e.add_argument("--by", help="one estimate per value of this (kept) column")
    e.add_argument("--min-group-size", type=int, metavar="N",
                   help="with --by: publish only groups of at least N reports (default: a "
                        "group is suppressed, with its reason, when a statistic's 95%% CI is "
                        "wider than its declared domain; 0 publishes every group)")
    e.add_argument("--plot", metavar="FILE.png",
                   help="also draw the estimate with its 95%% intervals (needs matplotlib: "
                        "the reproduce extra)")
    e.add_argument("--column", "-c", action="append",
                   help="central-DP releases (dphr, ...): the raw input column(s), in the "
                        "order of the mechanism's roles")
    e.add_argument("--role", action="append", metavar="ROLE=COLUMN",
                   help="central-DP releases: map a role to a column (e.g. --role level1=lv)")
    e.add_argument("--option", action="append", metavar="NAME=VALUE",
                   help="an estimator option, repeatable (e.g. --option m=1000 --option "
                        "method=paper for RVNS)")
    e.add_argument("--seed", help="central releases: reproducible noise from this seed, NOT "
                   "PRIVATE (default: a secret key of OS entropy)")
    e.add_argument("--keys", help="central releases with --by: the public list of keys to "
                   "release (comma-separated); every listed key is released, one absent from "
                   "the data as a noisy empty histogram")
    e.add_argument("--partition-selection", metavar="EPSILON,DELTA",
                   help="central releases with --by: choose the keys privately (thresholded "
                        "noisy distinct-unit counts), at this extra cost")
    e.add_argument("--privacy-unit", metavar="COLUMN",
                   help="central releases: the column naming each row's person; each keeps at "
                        "most the mechanism's max_rows_per_partition rows (-p "
                        "max_rows_per_partition=K; default 1), chosen uniformly, and the noise "
                        "covers them all: the guarantee holds per unit (without it: per record)")
    e.add_argument("--unverified", action="store_true",
                   help="estimate reports whose provenance cannot be verified (CSV or database "
                        "reports, files without or differing from the collect manifest that "
                        "committed them, duplicated runs); every output then says UNVERIFIED. "
                        "Reports of different configurations are refused even so")
    _mechanism_args(e, required=False)
    _run_args(e)
    add_ledger_options(e)

    s = sub.add_parser("stream", help="windowed streaming estimation of telemetry (spool "
                       "directory or Pub/Sub)")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--spool", help="a directory of JSON-lines files, watched continuously "
                     "(producers rename complete files into it; read files move to .done/)")
    src.add_argument("--subscription", help="Pub/Sub projects/P/subscriptions/S (pip install "
                     "'ldp-beam[pubsub]'): each message is landed durably into a spool folder "
                     "(--landing-dir) and only then acked, deduplicated by its report id, then "
                     "streamed as a spool (exactly once in effect); each message holds one or "
                     "more JSON lines")
    s.add_argument("--landing-dir", metavar="DIR",
                   help="with --subscription: the spool folder messages are landed in "
                        "(default OUTPUT/spool)")
    s.add_argument("--report-id-attribute", default="report_id",
                   help="with --subscription: the message attribute holding a report's id "
                        "(default report_id; a batched message carries one per line)")
    s.add_argument("--timestamp-attribute", default="ts",
                   help="with --subscription: the message attribute holding the event time "
                        "(default ts)")
    s.add_argument("--results", action="append", default=[], metavar="DEST",
                   help="also deliver each published pane here, idempotent by (window, pane): "
                        "a folder (one JSON file per pane), duckdb:///FILE?table=T or "
                        "postgresql://...?table=T (one row per pane); repeatable")
    s.add_argument("--results-topic", metavar="TOPIC",
                   help="also publish each pane to this Pub/Sub topic (projects/P/topics/T), "
                        "with a release_id attribute \"<window_start>/<pane>\" to deduplicate by")
    s.add_argument("--beam-pubsub", action="store_true",
                   help="with --subscription: read through Beam's ReadFromPubSub instead of the "
                        "landing path (for Dataflow/Flink, where it is exactly-once; on the "
                        "DirectRunner it acks before processing: at most once)")
    s.add_argument("--output", "-o", required=True,
                   help="directory for estimates.jsonl (what may be published) and curator/ "
                        "(deadletter.jsonl, ledger.jsonl, summary.json: exact counts, never "
                        "published); appended to across runs")
    s.add_argument("--reports-schema", help="take the mechanism and its parameters from this "
                   "reports Parquet file's metadata (as written by collect)")
    s.add_argument("--column", "-c", action="append",
                   help="central-DP families: the raw record field(s) for the required roles, "
                        "in order")
    s.add_argument("--role", action="append", metavar="ROLE=FIELD",
                   help="central-DP families: map a role to a record field")
    s.add_argument("--option", action="append", metavar="NAME=VALUE",
                   help="an estimator option, repeatable")
    s.add_argument("--window", type=float, default=60.0,
                   help="fixed event-time window length in seconds (default 60)")
    s.add_argument("--allowed-lateness", type=float, default=0.0,
                   help="seconds after a window's end during which late records still count: "
                        "each fires a late pane (default 0: later records are dead-lettered)")
    s.add_argument("--early", type=float,
                   help="also fire speculative panes every this many seconds of processing "
                        "time before the window's end (a whole number of seconds >= 1)")
    s.add_argument("--privacy-unit", metavar="FIELD",
                   help="the record field naming each record's person or device: at most "
                        "--max-reports-per-unit of its reports are estimated per window and its "
                        "loss is tracked across windows and runs in OUTPUT/units.sqlite (ids kept "
                        "only as keyed hashes); without it the guarantee holds per record only")
    s.add_argument("--max-reports-per-unit", type=int, default=1, metavar="K",
                   help="with --privacy-unit: a unit's reports (raw records for central-DP) "
                        "estimated per window, chosen uniformly; the rest are counted as "
                        "bounded_out (default 1)")
    s.add_argument("--unit-budget", type=float, metavar="EPSILON",
                   help="with --privacy-unit: cap on each unit's cumulative epsilon across windows "
                        "and runs; a report past it is counted (over_budget) and dropped")
    s.add_argument("--memo-field", nargs="?", const="memo_id", metavar="FIELD",
                   help="with --privacy-unit (LDP): the report field naming a memoized report's "
                        "slot (memo_id when given bare); a repeat of its unit's slot with the same "
                        "report costs nothing, which is only as honest as the producers' memoization")
    s.add_argument("--start", help="central-DP families: the release range starts at the window "
                   "containing this time (epoch seconds or ISO 8601; default: the run's start, "
                   "or with --once the earliest record's window)")
    s.add_argument("--end", help="central-DP families: the release range ends with the last "
                   "window starting before this time (default: the run's stop, or with --once "
                   "the latest record's window)")
    s.add_argument("--releases-per-window", type=int,
                   help="central-DP families: the releases a window may make (needed with "
                        "--allowed-lateness or --early; the guarantee is their composition)")
    s.add_argument("--timestamp-field", default="ts",
                   help="record field with the event time: epoch seconds or ISO 8601 (default ts)")
    s.add_argument("--poll", type=float, default=1.0,
                   help="seconds between looks at the spool directory (default 1, at most 10)")
    s.add_argument("--watermark-lag", type=float, default=0.0,
                   help="seconds the spool's watermark trails the wall clock: how long a window "
                        "waits for stragglers before its on-time pane (default 0; with "
                        "--subscription give at least the subscription's ack deadline, so that "
                        "messages a crashed collector had pulled are still on time)")
    s.add_argument("--duration", type=float,
                   help="stop cleanly after this many seconds (default: run until Ctrl-C)")
    s.add_argument("--once", action="store_true",
                   help="read the files in the spool now, estimate, and stop (a bounded run)")
    s.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    _mechanism_args(s, required=False)
    add_ledger_options(s)  # a stream records what it spends, per deployment (stream_account)

    r = sub.add_parser("reproduce", help="a paper's experiments")
    r.add_argument("family", choices=FAMILIES + ("all", "report"),
                   help="one family, all of them, or `report`: no experiment, just rewrite "
                        "DIR/report.md from the outputs already in --out DIR")
    _quiet_arg(r)
    r.add_argument("--quick", action="store_true", help="reduced run, under a minute")
    r.add_argument("--data-dir", help="real datasets (synthetic fallback when a file is absent)")
    r.add_argument("--out", help="directory for PNG figures")
    r.add_argument("--json", help="write the records here (default: stdout)")
    r.add_argument("--seed", type=int, help="simulation seed (default: OS entropy, recorded)")
    r.add_argument("--readme", metavar="PAGE.md",
                   help="with all or report: also rewrite this Markdown page's generated "
                        "results block (between its results:begin/end markers; the project's "
                        "is docs/reproductions.md)")

    # lazy: import cycle (pipelines.emit imports UsageError, _kv and check_privacy_strength from
    # this module); emit also loads numpy and randomgen (0.19 s, measured), which `import
    # ldp_beam.pipelines.cli` does not
    from .emit import add_parser as add_emit_parser

    _weak_privacy_arg(add_emit_parser(sub))  # the device side: perturb values and publish
    # reports to Pub/Sub

    add_ledger_parser(sub)
    # lazy: import cycle (pipelines.plan imports UsageError and _params from this module)
    from .plan import add_parser as add_plan_parser

    add_plan_parser(sub)  # before spending: the errors a release will have, the budget left
    b = sub.add_parser("bench", help="performance benchmarks, as JSON records")
    b.add_argument("--quick", action="store_true", help="10^6 rows instead of 10^7; fewer repeats "
                   "(with the pipelines, the core micro bench always runs at 10^6 rows)")
    b.add_argument("--json", help="write the records here (default: stdout)")
    b.add_argument("--only", action="append",
                   help="benchmark only this mechanism or section (api, cli, element, runners, "
                        "bounding, sources, startup, stream, central (against PipelineDP); "
                        "stream-soak only when named; repeatable)")
    b.add_argument("--soak", type=float, metavar="SECONDS",
                   help="also run the stream soak for this long (a live `stream "
                        "--subscription` at a steady rate, its RSS sampled); alone with "
                        "--only stream-soak")
    b.add_argument("--no-pipeline", action="store_true", help="skip the Beam pipeline runs")
    b.add_argument("--big", action="store_true",
                   help="also `collect --keep` at 3x10^7 rows for the memory-growth records")
    b.add_argument("--readme", metavar="PAGE.md",
                   help="rewrite this Markdown page's performance table (between its "
                        "<!-- bench:start --> and <!-- bench:end --> markers) from the records "
                        "(the project's is docs/guides/performance.md)")
    b.add_argument("--from-json", metavar="F",
                   help="no benchmark: take the records from F (written by --json), e.g. to "
                        "regenerate the performance table with --readme")
    au = sub.add_parser("audit", help="privacy audits of every mechanism: exact worst case and an "
                        "empirical lower bound on epsilon beside each claim")
    _quiet_arg(au)
    au.add_argument("--quick", action="store_true", help="fewer samples, under a minute")
    au.add_argument("--json", nargs="?", const="-", metavar="F",
                    help="also write the records (JSON) to F; --json alone or --json - prints "
                         "them on stdout instead of the table (the table then goes to "
                         "stderr, or nowhere with --quiet)")
    au.add_argument("--seed", type=int, help="sampling seed (default: OS entropy, recorded)")
    au.add_argument("--only", action="append", metavar="NAME",
                    help="audit only this mechanism (repeatable; default: all)")
    for sp in sub.choices.values():  # --verbose after the command's name too (`estimate -v`)
        sp.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS,
                        help="show Beam's and Dask's logs (INFO and warnings)")
    return ap


def _version() -> str:
    try:
        return version("ldp-beam")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return __version__


def _not_yet(what: str) -> int:
    print(f"ldp-beam: '{what}' is not available yet (tracked in {PENDING[what]}); "
          "nothing was run.", file=sys.stderr)
    return 3


def cmd_list(a: argparse.Namespace) -> int:
    # lazy: ldp_beam.registry (numpy, randomgen), 0.17 s at import (measured)
    from ldp_beam.registry import get_registry

    reg = get_registry()
    rows = reg.describe()
    for row in rows:
        try:
            g = reg.build(row["name"], reg.example_params(row["name"]),
                          allow_no_guarantee=True).guarantee
            row["guarantee"] = f"{g.kind} with the epsilon given" + \
                (f"; {g.notes}" if g.notes else "")
        except Exception:
            row["guarantee"] = ""
    if a.json:
        print(json.dumps({"mechanisms": rows, "plugin_errors": reg.load_errors}, indent=2,
                         default=str))
        return 0
    for row in rows:
        print(f"{row['name']}  [{row['family']}; from {row['source']}]")
        print(f"    {row['summary']}")
        ps = ", ".join(p["name"] + ("" if p["required"] else f"={p['default']!r}")
                       for p in row["parameters"])
        print(f"    parameters: {ps}")
        print("    input roles: " + ", ".join(r["name"] + ("" if r["required"] else "?")
                                               for r in row["roles"]))
        rf = row["report_fields"]
        print("    reports: " + (rf if isinstance(rf, str) else
                                 ", ".join(f"{n}:{t}" for n, t in rf)))
        if row.get("guarantee"):
            print(f"    guarantee: {row['guarantee']}")
    for name, err in reg.load_errors.items():
        print(f"plugin {name!r} failed to load: {err}", file=sys.stderr)
    return 0


def role_columns(mech: Any, columns: list[str] | None, roles: list[str] | None
                 ) -> dict[str, str]:
    """Role -> input column from ``--column`` (the required roles, in order) and ``--role``."""
    out = _kv(roles, "--role")
    required = [r.name for r in mech.roles if r.required]
    for col in columns or []:  # `--column value=income`: a role mapping given to --column
        role, eq, named = col.partition("=")
        if eq and role.strip() in {r.name for r in mech.roles}:
            raise UsageError(f"--column {col}: --column takes a column name; to map role "
                             f"{role.strip()!r} to column {named.strip()!r} write --role {col} "
                             f"(or --column {named.strip()})")
    if len(columns or []) > len(required):
        raise UsageError(f"--column given {len(columns)} times but {mech.name} has "
                         f"{len(required)} required role(s) {required}; map optional roles "
                         "with --role ROLE=COLUMN")
    for role, col in zip(required, columns or []):
        if role in out and out[role] != col:
            raise UsageError(f"role {role!r} is mapped twice: --column {col} and --role "
                             f"{role}={out[role]}")
        out[role] = col
    return out


#: --input of collect and estimate (docs/guides/sources-sinks.md: the text after scheme:// is a
#: file's path, relative unless it starts with /)
INPUT_HELP = ("a Parquet or CSV file, glob or folder, local or a URL (s3://..., gs://...); or a "
              "database table: duckdb://FILE.db?table=T (FILE relative to the current folder; "
              "duckdb:///abs/FILE.db absolute; or ?query=SELECT ...), "
              "postgresql://USER@HOST:PORT/DB?table=T, iceberg://CATALOG?table=NS.T")

_CONSOLE = False  # set by entry(): this process is the command and ends with it


def _freeze_heap() -> None:
    """In the console script only (``entry``), hand every object alive now to the garbage
    collector's permanent generation (``gc.freeze``), which its collections never walk again.

    The imports (Beam, pandas, pyarrow, ...) leave ~155,000 objects that live as long as the
    process; every full collection during the run, and the one at interpreter exit, walked them
    all: measured at 10^7 rows, ~0.1 s of collections during a release and ~0.3 s at exit (a
    process that only imports Beam exits in 0.29 s, in 0.02 s after ``gc.freeze()``). Called
    once the command's modules are imported and again when it has finished. Collection itself
    is unchanged for everything created afterwards; frozen objects are never freed, which is
    what happens to them anyway in a process that ends. Not in-process callers of
    :func:`main` (tests, notebooks): their heap lives on."""
    if _CONSOLE:
        gc.freeze()


def cmd_collect(a: argparse.Namespace, beam_args: list[str]) -> int:
    # lazy: Beam (pipelines.collect), 1.6 s at import (measured)
    from .collect import build, run_collect

    _freeze_heap()

    if a.privacy_unit is None and a.max_reports_per_unit != 1:
        raise UsageError(f"--max-reports-per-unit {a.max_reports_per_unit}: applies with "
                         "--privacy-unit COLUMN (at most K reports per unit); without it every "
                         "row is reported")
    _null_values_apply(a)
    mech = build(a.mechanism, _params(a), a.allow_no_guarantee)
    check_privacy_strength(mech, a, "collect")
    columns = role_columns(mech, a.column, a.role)
    man = run_collect(a.input, a.output, mech, columns, keep=a.keep, seed=a.seed,
                      dead_letter=a.dead_letter, batch_rows=a.batch_rows, beam_args=beam_args,
                      public=a.public, force=a.force, allow_unreadable=a.allow_unreadable,
                      null_values=a.null_values,
                      dead_letter_columns="all" if a.dead_letter_all_columns else "mapped",
                      unit=a.privacy_unit, max_reports_per_unit=a.max_reports_per_unit,
                      **ledger_args(a))
    # lazy: Beam (pipelines.common), 1.5 s at import (measured); loaded by now (collect)
    from .common import records_line

    print(f"collected {man['records']['reported']:,} reports into {a.output} (run "
          f"{man['run_id']}): " + records_line(man, f"dead letters in {man['dead_letter']}"))
    print(f"privacy: {man['guarantee']['summary']}")
    if man["records"]["dead_lettered"]:
        print(dead_letter_reasons(man["dead_letter"], man["records"]["dead_lettered"],
                                  man["records"]["input"], beam_args))
    _say_ledger(man)
    return 0 if man["records"]["reconciles"] else 1


def _reason_kind(reason: str) -> str:
    """A dead letter's reason with the offending number left out (``value: 212.4 outside
    [0, 200]`` -> ``value: <number> outside [0, 200]``), so that reasons of one kind count
    together; numbers inside brackets or parentheses (a domain, a bound) and quoted labels (a
    category left out of a domain: the useful part) stay."""
    parts = _KEPT_PARTS.split(reason)
    return "".join(p if i % 2 else _NUMBER.sub("<number>", p) for i, p in enumerate(parts))


#: what a dead letter's reason keeps as written: a bracketed or parenthesized part, a quoted label
_KEPT_PARTS = re.compile(r"(\[[^\]]*\]|\([^)]*\)|'[^']*'|\"[^\"]*\")")
#: a number standing alone elsewhere in a reason (the offending value)
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])|"
                     r"(?<![\w.])[-+]?(?:inf|nan)(?!\w)")


def dead_letter_reasons(path: str, dead: int, total: int | None, flags=(), show: int = 3,
                        scan: int = 200_000) -> str:
    """What a collect run dead-lettered, by reason, for the console: the ``show`` commonest
    kinds of reason (see :func:`_reason_kind`) with their counts, over the first ``scan``
    lines of the dead-letter file (a summary; the file holds every row and its reason)."""
    share = f" ({dead / total:.1%} of {total:,} rows)" if total else ""
    kinds: Counter = Counter()
    read = 0
    try:
        with open_read(path, tuple(flags)) as fh:
            for line in fh:
                if read == scan:
                    break
                read += 1
                try:
                    kinds[_reason_kind(str(json.loads(line).get("reason", "")))] += 1
                except (ValueError, AttributeError):
                    kinds["(a dead letter that is not a JSON object)"] += 1
    except Exception as exc:  # noqa: BLE001 - a summary never fails a run that has committed
        return f"dead-lettered {dead:,} rows{share}; reasons in {path} (not summarized: {exc})"
    lines = [f"dead-lettered {dead:,} rows{share}, by reason"
             + (f" (among the first {read:,})" if read < dead else "") + ":"]
    width = len(f"{max(kinds.values(), default=0):,}")
    lines += [f"  {n:>{width},}  {kind}" for kind, n in kinds.most_common(show)]
    if len(kinds) > show:
        lines.append(f"  ... and {len(kinds) - show} more kind(s) of reason: see {path}")
    return "\n".join(lines)


def _say_ledger(out: dict) -> None:
    """Which ledger the run was recorded in and what its dataset has left (with the run's
    result lines on stdout)."""
    st = out.get("ledger_state")
    if st:
        print(ledger_line(st["url"], st, st["default"]))


def cmd_estimate(a: argparse.Namespace, beam_args: list[str]) -> int:
    # lazy: Beam (pipelines.estimate), 1.6 s at import (measured)
    from .estimate import mechanism_from_reports, run_estimate

    _freeze_heap()

    params = _params(a)
    mech = mechanism_from_reports(a.input, a.mechanism, params, a.allow_no_guarantee,
                                  beam_args) if (a.mechanism or params) else None
    columns = None
    # lazy: ldp_beam.core (numpy), loaded by now (the mechanism was built)
    from ldp_beam.core import CentralRelease

    if a.column or a.role:
        if mech is None or not isinstance(mech, CentralRelease):
            raise UsageError("--column/--role map raw columns for central-DP releases only (give "
                             "--mechanism); LDP estimates read the reports' own fields")
        columns = role_columns(mech, a.column, a.role)
    central = isinstance(mech, CentralRelease)
    _estimate_options_apply(a, central)
    _null_values_apply(a)
    selection = _selection(a.partition_selection)
    if mech is not None:
        check_privacy_strength(mech, a, "estimate")
    if selection is not None and a.by and central:  # the release costs both, per key
        total = mech.guarantee.epsilon + selection[0]
        weak_privacy(f"epsilon = {total:g} ({_epsilon_text(mech)} plus the partition "
                     f"selection's {selection[0]:g})", total, a, "estimate")
    out = run_estimate(a.input, a.output, mech, by=a.by, options=_kv(a.option, "--option"),
                       beam_args=beam_args, columns=columns, seed=a.seed, force=a.force,
                       allow_unreadable=a.allow_unreadable, null_values=a.null_values,
                       unit=a.privacy_unit, keys=_keys(a.keys), selection=selection,
                       side_outputs=a.side_outputs, unverified=a.unverified,
                       min_group_size=a.min_group_size, **ledger_args(a))
    # lazy: Beam (ldp_beam.transforms), 1.7 s at import (measured); loaded by now (estimate)
    from ldp_beam.transforms.sources import redact

    shown = redact(a.output)  # a database URL's password is never printed
    if mech is None:  # reports collected under a weak epsilon: said, not refused (no noise here)
        # lazy: ldp_beam.registry (numpy, randomgen), 0.17 s at import (measured); loaded by now
        from ldp_beam.registry import get_registry

        try:
            made = get_registry().build(out["mechanism"], dict(out["params"]),
                                        allow_no_guarantee=True)
        except Exception:  # only a warning: never fail a run that has committed
            made = None
        if made is not None:
            check_privacy_strength(made, a, "estimate", chosen=False)
    _say_ledger(out)
    if a.plot:
        _plot(out, a.plot)
    if a.by:
        print(groups_table(out))
        failed = _say_groups(out)
    if "curator" in out:
        return max(_print_release(out, shown), 1 if a.by and failed else 0)
    ests = [] if a.by else [out["estimate"]]
    errors = [e["error"] for e in ests if "error" in e]
    if a.by:
        print(f"{len(out['estimates'])} groups by {a.by!r} written to {shown}; "
              f"privacy: {out['guarantee']['summary']}")
        errors = list(out["failed"].values()) if failed else []
    elif not errors:
        parts = [_stat_text(k, st) for k, st in out["estimate"]["statistics"].items()]
        print(f"{out['estimate']['n_reports']:,} reports -> " + ", ".join(parts))
        table = joint_table_text(out["estimate"])
        if table:
            print(table)
        print(f"guarantee: {out['guarantee']['summary']}; written to {shown}")
    if out["reports"]["invalid"]:
        print(f"{out['reports']['invalid']:,} malformed reports dead-lettered to "
              f"{out['reports']['dead_letter']}")
    if not a.by:
        for err in errors:
            print(f"ldp-beam estimate: no estimate: {err}", file=sys.stderr)
    return 1 if errors else 0


def _plot(out: dict, path: str) -> None:
    # lazy: matplotlib (the reproduce extra) is imported only when a figure is asked for
    from .plot import PlotError, plot_estimate

    try:
        drawn = plot_estimate(out, path)
    except PlotError as exc:
        raise UsageError(f"--plot {path}: {exc}") from None
    print(f"figure: {drawn['path']} ({drawn['statistic']} with 95% intervals)")


def _say_groups(out: dict) -> bool:
    """Name every group not published as numbers on stderr; whether any failed."""
    for key, why in out.get("suppressed", {}).items():
        print(f"ldp-beam estimate: group {key!r} suppressed: {why}", file=sys.stderr)
    for key, why in out.get("failed", {}).items():
        print(f"ldp-beam estimate: group {key!r} failed: {why}", file=sys.stderr)
    n_sup, n_fail = len(out.get("suppressed", {})), len(out.get("failed", {}))
    if n_sup or n_fail:
        print(f"ldp-beam estimate: {len(out['estimates']) - n_sup - n_fail} group(s) published, "
              f"{n_sup} suppressed, {n_fail} failed", file=sys.stderr)
    return bool(n_fail)


def number_text(v: Any) -> str:
    """A number as a person reads it: counts with thousands separators, never in scientific
    notation below 10^15; other values to 4 significant digits."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if v != v:  # NaN
        return "nan"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def _interval(low: Any, high: Any) -> str:
    return f"[{number_text(low)}, {number_text(high)}]"


def groups_table(out: dict, limit: int = 30) -> str:
    """A short table of a --by output: per group its size and the main statistic with its 95%
    interval (the first scalar statistic: a mean, a count...; a vector's cells are in the
    output file), or why it is not published."""
    rows = []
    main = None
    for key, e in list(out["estimates"].items())[:limit]:
        n = e.get("n_reports")
        if "statistics" not in e:
            rows.append([str(key), "" if n is None else f"{n:,}",
                         "suppressed" if "suppressed" in e else "failed", ""])
            continue
        stats = e["statistics"]
        if main is None:
            main = next((k for k, st in stats.items() if isinstance(st.get("value"), (int, float))
                         and not isinstance(st.get("value"), bool)), next(iter(stats), None))
        st = stats.get(main, {})
        ci = st.get("ci95")
        rows.append([str(key), "" if n is None else f"{n:,}", number_text(st.get("value")),
                     "" if not ci else _interval(*ci)])
    more = len(out["estimates"]) - limit
    head = [out.get("by") or "group", "reports", main or "estimate", "95% CI"]
    return "\n".join(_aligned([head] + rows)) + (f"\n... and {more} more group(s) in the output"
                                                if more > 0 else "")


def _aligned(rows: list[list[str]]) -> list[str]:
    """Rows of cells as text lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if k == 0 else c.rjust(w)
                      for k, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


def _keys(text: str | None) -> list[str] | None:
    if text is None:
        return None
    keys = [k.strip() for k in text.split(",") if k.strip()]
    if not keys:
        raise UsageError("--keys: at least one key (comma-separated)")
    return keys


def _selection(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        eps, delta = (float(x) for x in text.split(","))
    except ValueError:
        raise UsageError(f"--partition-selection {text!r}: EPSILON,DELTA, e.g. 0.5,1e-6") from None
    return eps, delta


def _stat_text(name: str, stat: dict) -> str:
    val = stat.get("value")
    if val is None:
        return f"{name}=undefined"
    if isinstance(val, list):
        if val and isinstance(val[0], list):
            return f"{name}=[{len(val)}x{len(val[0])} table]"
        return f"{name}=[{len(val)} values]"
    if isinstance(val, (int, float)) and not isinstance(val, bool):
        ci = stat.get("ci95")
        return f"{name}={number_text(val)}" + (
            f" {_interval(*ci)}" if ci else "")
    return f"{name}={val}"


def _print_release(out: dict, path: str) -> int:
    """What a central release printed: the statistics released and the guarantee; the curator's
    record counts, marked as not for publication."""
    if out.get("republished_from"):
        print(f"re-published the recorded release of run {out['republished_from']} to {path} "
              f"(no new noise, nothing more spent; {out['guarantee']['summary']})")
        return 0
    if "estimates" in out:  # a per-key release
        rec = out["curator"]["records"]
        print(f"released {out['mechanism']} for {len(out['estimates'])} key(s) of "
              f"{out['by']!r} ({out['guarantee']['summary']}) to {path}")
        print(f"curator only (do not publish): {rec['input']:,} read = "
              f"{rec['released_from']:,} bucketed + {rec['dead_lettered']:,} dead-lettered + "
              f"{rec['bounded_out']:,} left out by the per-unit bound"
              + (f" + {rec['not_in_keys']:,} of keys not in --keys (never released)"
                 if rec.get("not_in_keys") else ""))
        _say_curator_dead_letters(rec)
        return 0 if rec.get("reconciles") else 1
    est, rec = out["estimate"], out["curator"]["records"]
    if "error" in est:
        print(f"ldp-beam estimate: no release: {est['error']}", file=sys.stderr)
        return 1
    stats = ", ".join(_stat_text(k, s) for k, s in est["statistics"].items())
    print(f"released {out['mechanism']}: {stats} ({out['guarantee']['summary']}) to {path}")
    table = bucket_table_text(est)
    if table:
        print(table)
    line = (f"{rec['input']:,} read = {rec['released_from']:,} in the release + "
            f"{rec['dead_lettered']:,} dead-lettered"
            + (f" + {rec['bounded_out']:,} left out by the per-unit bound"
               if rec.get("bounded_out") else "") if rec.get("input") is not None
            else "record counts unknown (part of the input could not be read)")
    print(f"curator only (do not publish): {line}; bookkeeping in "
          f"{out.get('curator_file', path + '.curator.json')}"
          + ("" if rec.get("reconciles") else "; DOES NOT RECONCILE"))
    _say_curator_dead_letters(rec)
    return 0 if rec.get("reconciles") else 1


def _say_curator_dead_letters(rec: dict) -> None:
    """A central release's dead letters by reason (curator-only, as the counts)."""
    if rec.get("dead_lettered") and rec.get("dead_letter"):
        print("curator only (do not publish): " + dead_letter_reasons(
            rec["dead_letter"], rec["dead_lettered"], rec.get("input")))


def bucket_table_text(estimate: dict, limit: int = 30) -> str:
    """A released histogram by bucket, as text ('' for an estimate without one): each bucket's
    edges (the release's ``bucket_edges``; ``[low, high)``, the last ``[low, high]``) or label
    (``categories``), its value and 95% interval; the first ``limit`` buckets, then how many
    more are in the output."""
    hist = estimate.get("statistics", {}).get("histogram")
    params = estimate.get("params", {})
    value = None if hist is None else hist.get("value")
    if not isinstance(value, list) or not value:
        return ""
    n = len(value)
    edges, cats = params.get("bucket_edges"), params.get("categories")
    if isinstance(edges, list) and len(edges) == n + 1:
        names = [f"[{edges[k]:.6g}, {edges[k + 1]:.6g}{']' if k == n - 1 else ')'}"
                 for k in range(n)]
        head = "bucket"
    elif isinstance(cats, list) and len(cats) == n:
        names, head = [str(c) for c in cats], "category"
    else:
        return ""
    se = hist.get("stderr") if isinstance(hist.get("stderr"), list) else None
    z = 1.959963984540054
    rows = [[head, "value", "95% CI (noise)"]]
    for k in range(min(n, limit)):
        v = value[k]
        ci = ("" if se is None or se[k] is None or not isinstance(v, (int, float))
              else _interval(v - z * se[k], v + z * se[k]))
        rows.append([names[k], number_text(v), ci])
    more = f"\n... and {n - limit} more bucket(s) in the output" if n > limit else ""
    return "histogram by bucket:\n" + "\n".join(_aligned(rows)) + more


def joint_table_text(estimate: dict) -> str:
    """The consistent joint table of a joint-family estimate, labelled, as text ('' otherwise)."""
    # lazy: Beam (pipelines.common), 1.5 s at import (measured)
    from .common import format_table

    joint = estimate.get("statistics", {}).get("joint")
    params = estimate.get("params", {})
    if not joint or "x_domain" not in params:
        return ""
    return "joint (consistent estimate; rows x, columns y):\n" + format_table(
        joint["clipped"], params["x_domain"], params["y_domain"])


def _emit_records(records: list[dict], path: str | None) -> None:
    text = json.dumps(records, indent=1, default=str)
    if path:
        with open(path, "w") as fh:
            fh.write(text + "\n")
        print(f"{len(records)} records written to {path}", file=sys.stderr)
    else:
        print(text)


def cmd_stream(a: argparse.Namespace, beam_args: list[str]) -> int:
    # lazy: ldp_beam.registry (numpy, randomgen), 0.17 s at import (measured)
    from ldp_beam.registry import get_registry

    # lazy: Beam (pipelines.estimate, pipelines.stream), 1.7 s at import (measured)
    from .estimate import mechanism_from_reports
    from .stream import run_stream

    _freeze_heap()
    params = _params(a)
    for opt, given in (("--report-id-attribute", a.report_id_attribute != "report_id"),
                       ("--timestamp-attribute", a.timestamp_attribute != "ts")):
        if given and not a.subscription:
            raise UsageError(f"{opt}: applies with --subscription (a Pub/Sub message's "
                             "attribute); a spool's records carry their event time in a field "
                             "(--timestamp-field)")
    if a.reports_schema:
        mech = mechanism_from_reports(a.reports_schema, a.mechanism, params,
                                      a.allow_no_guarantee)
    elif a.mechanism:
        mech = get_registry().build(a.mechanism, params, allow_no_guarantee=a.allow_no_guarantee)
    else:
        raise UsageError("name the mechanism: --mechanism NAME [-p NAME=VALUE ...], or "
                         "--reports-schema FILE")
    check_privacy_strength(mech, a, "stream", chosen=bool(params) or not a.reports_schema)
    columns = None
    # lazy: ldp_beam.core (numpy) is loaded by now (the mechanism was built)
    from ldp_beam.core import CentralRelease

    if a.column or a.role:
        if not isinstance(mech, CentralRelease):
            raise UsageError("--column/--role map raw record fields for central-DP releases "
                             f"only; {mech.name} reads its reports' own fields")
        columns = role_columns(mech, a.column, a.role)
    if a.subscription and not a.beam_pubsub:  # land (fsync, then ack), then stream the spool
        # lazy: Beam (pipelines.pubsub_stream), 1.8 s at import (measured); loaded by now
        from .pubsub_stream import run_pubsub_stream

        def run(output, mechanism, *, spool, subscription, **kw):
            return run_pubsub_stream(subscription, output, mechanism, spool_dir=a.landing_dir,
                                     lander_options={
                                         "report_id_attribute": a.report_id_attribute,
                                         "timestamp_attribute": a.timestamp_attribute,
                                         "timestamp_field": a.timestamp_field},
                                     **kw)
    elif a.landing_dir or a.beam_pubsub and not a.subscription:
        raise UsageError("--landing-dir and --beam-pubsub go with --subscription")
    else:
        run = run_stream
    summary = run(
        a.output, mech, spool=a.spool, subscription=a.subscription, window_seconds=a.window,
        allowed_lateness=a.allowed_lateness, early_seconds=a.early,
        releases_per_window=a.releases_per_window, columns=columns,
        options=_kv(a.option, "--option"), timestamp_field=a.timestamp_field,
        poll_seconds=a.poll, watermark_lag=a.watermark_lag, duration=a.duration, once=a.once,
        beam_args=beam_args, progress=not a.quiet, start=a.start, end=a.end,
        privacy_unit=a.privacy_unit, max_reports_per_unit=a.max_reports_per_unit,
        unit_budget=a.unit_budget, memoize=a.memo_field, results=a.results,
        results_topic=a.results_topic, ledger=a.ledger, budget=a.budget,
        budget_delta=a.budget_delta, dataset=a.dataset,
        **({"timestamp_attribute": a.timestamp_attribute,
            "report_id_attribute": a.report_id_attribute} if a.beam_pubsub else {}))
    print(f"{summary['windows']} window(s), {summary['panes']} pane(s) written to "
          f"{summary['outputs']['estimates']} ({summary['guarantee']['summary']})")
    st = summary.get("ledger")
    if st and "error" in st:
        print(st["error"])
    elif st:  # what this run recorded, and what the stream's dataset has left
        ran = st["run_epsilon"]
        print(("this run recorded nothing (it published and charged nothing); " if ran is None
               else f"this run recorded epsilon={ran:g} (what it added to the largest loss of "
               f"one {'record' if summary['guarantee']['unit'] == 'record' else 'unit'}); ")
              + ledger_line(st["url"], st, st["default"]))
    return 0 if summary["reconciles"] in (True, None) else 1


def cmd_bench(a: argparse.Namespace) -> int:
    """Core micro benchmarks, then the pipelines (each path as a ratio to the plain-Beam reference
    measured in the same run); the records as JSON, a summary on stderr, optionally the
    generated performance table of a page (--readme docs/guides/performance.md)."""
    # lazy: pipelines.bench (numpy, pyarrow, randomgen), 0.29 s at import (measured)
    from . import bench as pipeline_bench

    if a.from_json:
        with open(a.from_json) as fh:
            records = json.load(fh)
        total = next((r["bench_seconds"] for r in records if "bench_seconds" in r), None)
    else:
        # lazy: pipelines.bench_core (numpy, randomgen), 0.24 s at import (measured)
        from . import bench_core as bench
        from .records import Progress

        t0 = time.perf_counter()
        prog = Progress("bench")
        # with the pipelines, the core micro bench runs in its quick form (10^6 rows; its rates
        # are per core and per row) so that the whole bench fits in 15 minutes; alone
        # (--no-pipeline) it runs at 10^7 rows unless --quick
        records = bench.run(quick=a.quick or not a.no_pipeline, only=a.only, progress=prog)
        failed = None
        if not a.no_pipeline:
            try:
                records += pipeline_bench.run(quick=a.quick, progress=prog, only=a.only,
                                              big=a.big, soak=a.soak)
            except pipeline_bench.BenchFailed as exc:  # the other sections' records are kept
                records += exc.records
                failed = exc
        total = time.perf_counter() - t0
        for r in records:
            r["bench_seconds"] = total
            tgt = ""
            if r.get("target") is not None:
                tgt = f"  target {r['target']:.3g}: {'ok' if r['meets_target'] else 'MISSED'}"
            label = r.get("estimator") or r.get("mode") or ""
            if r.get("ratio_to_reference") is not None:
                label = f"{r.get('path', '')} {label} {r['rows']:,}"
                tgt = f"  x{r['ratio_to_reference']:.2f} of the reference{tgt}"
            value = "skipped" if r["value"] is None else f"{r['value']:.4g}"
            print(f"  {r['stage']:<10} {r['method']:<22} {label:<14} {r['metric']:<22} "
                  f"{value:>14}{tgt}", file=sys.stderr)
        print(f"bench: {total:.0f} s in all ({total / 60:.1f} min)", file=sys.stderr)
        _emit_records(records, a.json)
        if failed is not None:
            print(f"ldp-beam bench: {failed}", file=sys.stderr)
            return 1
    if a.readme:
        pipeline_bench.write_readme(a.readme, records, total)
        print(f"performance table rewritten in {a.readme}", file=sys.stderr)
    return 0


def cmd_audit(a: argparse.Namespace) -> int:
    """Exit 0 when every audited claim is consistent, 1 when one is violated."""
    # lazy: ldp_beam.reproduce.audit_recipe (numpy, randomgen, scipy), 0.5 s (measured)
    from ldp_beam.reproduce import audit_recipe

    # lazy: pipelines.records (numpy), 0.11 s at import (measured)
    from .records import Progress

    records = audit_recipe.run(quick=a.quick, progress=Progress("audit"), seed=a.seed,
                               only=a.only)
    # the table is the output for a reader; the records (JSON) only when asked for: in a file
    # (--json F), or on stdout (--json / --json -), the table then on stderr (unless --quiet)
    to_stdout = a.json == "-"
    if not (to_stdout and a.quiet):
        print(audit_recipe.summary(records), file=sys.stderr if to_stdout else sys.stdout)
    if a.json is not None:
        _emit_records(records, None if to_stdout else a.json)
    return 1 if any(r["verdict"] == "violates claim" for r in records) else 0


def _write_reproduction(out: str, families: list[str], readme: str | None) -> None:
    """Write ``out/report.md`` and, with ``readme``, that page's results block (e.g.
    docs/reproductions.md), both from the outputs in ``out/FAMILY/`` (each family's run, quick or
    full and its seed, from its records)."""
    # lazy: ldp_beam.reproduce.report (numpy), 0.13 s at import (measured)
    from ldp_beam.reproduce.report import results_section, update_readme, write_report

    path = write_report(out, families)
    print(f"ldp-beam reproduce: report written to {path}", file=sys.stderr)
    if readme:
        root = os.path.dirname(os.path.abspath(readme))
        link_base = os.path.relpath(os.path.abspath(out), root).replace(os.sep, "/")
        changed = update_readme(readme, results_section(out, families, link_base, root,
                                                        readme=readme))
        print(f"ldp-beam reproduce: results block in {readme} "
              f"{'rewritten' if changed else 'already up to date'}", file=sys.stderr)


def cmd_reproduce(a: argparse.Namespace) -> int:
    """One family's experiments; ``all`` runs every family into ``--out DIR/FAMILY/`` and writes
    ``DIR/report.md`` (every claim's verdict and evidence, and the figures); ``report`` only
    rewrites that report (and, with ``--readme PAGE``, that page's results block)."""
    families = list(FAMILIES) if a.family in ("all", "report") else [a.family]
    if a.readme:  # find a page without markers before, not after, the experiments
        # lazy: ldp_beam.reproduce.report (numpy), 0.13 s at import (measured)
        from ldp_beam.reproduce.report import readme_block

        readme_block(a.readme)
    if a.family == "report":
        _write_reproduction(a.out, families, a.readme)
        return 0
    if find_spec("matplotlib") is None:  # the experiments draw figures: stop before, not after
        raise UsageError("the reproductions need matplotlib, which the `reproduce` extra "
                         "installs: pip install 'ldp-beam[reproduce]'")
    records: list[dict] = []
    for fam in families:
        recipe = import_module(f"ldp_beam.reproduce.{fam}_recipe")
        out = os.path.join(a.out, fam) if a.out and a.family == "all" else a.out
        records += recipe.run(quick=a.quick, data_dir=a.data_dir, out_dir=out, seed=a.seed)
    if a.family == "all" and a.out:  # each family's run (quick/full, seed) read from its records
        _write_reproduction(a.out, families, a.readme)
    _emit_records(records, a.json)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one ``ldp-beam`` command (``argv``: its arguments; default ``sys.argv[1:]``) and
    return its exit status. The progress settings a command sets (``--quiet``, the label) are
    put back when it returns, so a caller running several commands in one process (a notebook,
    the tests) does not carry one command's ``--quiet`` into the next."""
    before = progress.configure()
    try:
        return _main(argv)
    finally:
        progress.restore(before)


def _main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    for i in range(len(argv) - 1):  # `--runner dask` as well as `--runner=dask`
        if argv[i] == "--runner":
            argv[i:i + 2] = [f"--runner={argv[i + 1]}", ""]
    a, rest = ap.parse_known_args([x for x in argv if x != ""])
    a.verbose = bool(getattr(a, "verbose", False))
    _quiet_logs(a.verbose)  # before anything imports Beam (the option check below does)
    sub = ap._subparsers._group_actions[0].choices[a.command]  # the command's own options
    ours = [o for act in sub._actions for o in act.option_strings]
    try:
        # only options Beam knows may pass through; a typo is an error naming the closest
        check_leftovers(rest, ours, a.command)
        if hasattr(a, "param") and hasattr(a, "epsilon") and hasattr(a, "mechanism"):
            _params(a)  # -p NAME=VALUE well formed, each name (and epsilon) given once
        if a.command == "demo":  # every section runs at this epsilon
            weak_privacy(f"epsilon = {a.epsilon:g}", a.epsilon, a, a.command)
        if a.command == "demo" and a.stream and (a.section or rest):
            raise UsageError(f"{'--section' if a.section else rest[0]}: applies to the batch "
                             "demo; --stream runs the live-telemetry demo on its own")
    except (UsageError, ValueError) as exc:
        print(f"ldp-beam {a.command}: error: {exc}", file=sys.stderr)
        return 2
    if a.command == "reproduce":
        if a.readme and (not a.out or a.family not in ("all", "report")):
            ap.error("--readme: needs --out DIR and the family `all` or `report`")
        if a.family == "report" and not a.out:
            ap.error("reproduce report: --out DIR is required (the folder with FAMILY/ outputs)")
    if a.command in ("collect", "estimate"):  # SIGINT/SIGTERM unwind: staging removed, the
        install_signal_handlers()  # ledger entry aborted, one line, 130/143
    if a.command in ("collect", "estimate", "reproduce", "audit"):  # progress bar / rate line
        progress.configure(enabled=True, quiet=a.quiet, label=a.command)
    if a.command in ("collect", "estimate"):
        # the ledger's fingerprint of a local input (every run records one), hashed while Beam
        # is imported
        # lazy: pipelines.datasets (numpy, pyarrow), 0.18 s at import (measured)
        from .datasets import prefetch_dataset_identity

        prefetch_dataset_identity(a.input)
    if a.command in ("demo", "collect", "estimate", "stream"):  # commands that build pipelines
        # patches of Beam's pipeline construction: only when asked for (--beam-speedups or
        # LDP_BEAM_SPEEDUPS=1), on a verified Beam only (ldp_beam/transforms/beam_speed.py)
        # lazy: Beam (ldp_beam.transforms), 1.7 s at import (measured)
        from ldp_beam.transforms import beam_speed

        try:
            asked = beam_speed.enabled(a.beam_speedups)
        except ValueError as exc:
            print(f"ldp-beam {a.command}: error: {exc}", file=sys.stderr)
            return 2
        if asked and not beam_speed.install():
            print(f"ldp-beam {a.command}: beam speedups {beam_speed.status()}; Beam runs as "
                  "shipped", file=sys.stderr)
    try:
        if a.command == "demo":
            # lazy: Beam (pipelines.demo), 1.7 s at import (measured)
            from .demo import run_demo

            _freeze_heap()
            if a.stream:
                # lazy: Beam (pipelines.demo_stream), 1.6 s at import (measured)
                from .demo_stream import run_demo_stream

                run_demo_stream(a.out, epsilon=a.epsilon, seed=a.seed)
                return 0
            run_demo(a.out, epsilon=a.epsilon, seed=a.seed, beam_args=rest, sections=a.section)
            return 0
        beam_commands = {"collect": cmd_collect, "estimate": cmd_estimate, "stream": cmd_stream}
        if a.command in beam_commands:  # the commands Beam arguments reach
            return beam_commands[a.command](a, rest)
        commands = {"list": cmd_list, "reproduce": cmd_reproduce, "ledger": cmd_ledger,
                    "bench": cmd_bench, "audit": cmd_audit}
        if a.command in commands:
            return commands[a.command](a)
        if a.command == "emit":
            # lazy: import cycle (pipelines.emit imports from this module; see build_parser)
            from .emit import cmd_emit

            return cmd_emit(a)
        if a.command == "plan":
            # lazy: import cycle (pipelines.plan imports from this module; see build_parser)
            from .plan import cmd_plan

            return cmd_plan(a)
        return _not_yet(a.command)
    except RunFailed as exc:
        print(f"ldp-beam {a.command}: run failed: {exc}", file=sys.stderr)
        return 1
    except (LdpBeamError, UsageError, ValueError, FileNotFoundError, KeyError) as exc:
        stop = interruption(exc)
        if stop is not None:
            return _interrupted(a.command, stop)
        print(f"ldp-beam {a.command}: error: {exc}{_epsilon_from(a, exc)}", file=sys.stderr)
        return 2
    except BaseException as exc:  # an interrupt, also when a runner wrapped it
        stop = interruption(exc)
        if stop is None:
            raise
        return _interrupted(a.command, stop)


def _interrupted(command: str, stop: Any) -> int:
    """Report an interrupt as the run was left: committed before stopping (a signal held by
    ``lifecycle.publish`` until the outputs and the ledger agreed), left pending by a failed
    publish, or stopped with nothing committed. The exit code is 128 + the signal (130, 143)
    in every case: the message, not the code, says whether the run committed."""
    run = f"run {stop.run_id}" if getattr(stop, "run_id", None) else "the run"
    entry = getattr(stop, "entry", None)
    if getattr(stop, "committed", False):
        manifest = getattr(stop, "manifest", None)
        where = f" (manifest {manifest})" if manifest else ""
        ledger = ("its ledger entry is committed" if entry == "committed" else
                  "its ledger entry stays pending and counts as spent (see the warning above)")
        said = (f"stopped after {run} committed: its outputs are in place{where} and {ledger}; "
                "do not re-run it")
    elif entry == "pending":
        said = (f"stopped while {run} was publishing: some outputs may be in place and no "
                "manifest vouches for them; its ledger entry stays pending and counts as spent "
                f"until resolved (`ldp-beam ledger --resolve "
                f"{getattr(stop, 'run_id', None) or 'RUN_ID'} --as committed|aborted`)")
    else:
        said = ("stopped; nothing was committed (the staging folder was removed and the run's "
                "ledger reservation given back)")
    print(f"ldp-beam {command}: {stop}: {said}", file=sys.stderr, flush=True)
    return stop.exit_code


def entry() -> int:
    """The console script: ``main`` with output piped to a reader that stops early (``| head``)
    ending quietly, as Unix tools do, instead of a BrokenPipeError traceback; the heap is
    frozen once the command's modules are imported and when it ends (:func:`_freeze_heap`)."""
    global _CONSOLE
    _CONSOLE = True
    # A console-script process is no IPython shell (a shell exists only once IPython is
    # imported), yet Beam asks whether it runs in one at the first transform it applies, by
    # importing IPython wherever it is installed (0.2-0.25 s, measured). Marking IPython as
    # absent in this process (the import system's own convention: a None entry in sys.modules)
    # answers that question without the import; nothing the commands use needs IPython.
    sys.modules.setdefault("IPython", None)  # type: ignore[arg-type]
    try:
        code = main()
        _freeze_heap()  # the exit's collection then skips what the run left alive
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout again at exit
        return 141  # 128 + SIGPIPE, as a shell reports it


if __name__ == "__main__":
    sys.exit(entry())
