"""``ldp-beam estimate``: reconstruct statistics from a reports table (server side).

The mechanism is read from the reports' Arrow schema metadata (written by ``collect``); naming one
with ``--mechanism`` is needed only for tables without it (CSV), and must agree with it when both
exist. Malformed reports go to ``OUTPUT.deadletter.jsonl``. With ``by``, one estimate per value of
a passthrough column (each is post-processing of the same LDP reports: no extra privacy cost).
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ldp_beam.core import CentralRelease, Mechanism
from ldp_beam.estimators import estimator_for
from ldp_beam.ledger import release_request
from ldp_beam.limits import check_groups
from ldp_beam.prf import keyed_digest
from ldp_beam.privacy import ContributionBounds, run_guarantee
from ldp_beam.registry import get_registry
from ldp_beam.rng import RunKey
from ldp_beam.transforms import (EstimatorCombineFn, Perturb, ReadTable, SplitByKey,
                                 ValidateReports, WriteJsonLines)
from ldp_beam.transforms.batches import key_text
from ldp_beam.transforms.combine import (NOT_IN_KEYS, EstimateFailure, PerKeyCombineFn,
                                        ReleaseKeys, per_key_part)
from ldp_beam.transforms.io import open_input, table_format
from ldp_beam.transforms.sinks import tidy_bytes, tidy_format, tidy_output_table
from ldp_beam.transforms.sources import parse_settings
from ldp_beam.transforms.tally import WriteOneLine

from .outputs import RunOutputs, location
from .run import Run, take_seed
from .provenance import agreed_metadata, mark_unverified, verify_reports


def reports_metadata(input: str, beam_args: Iterable[str] = ()) -> dict | None:
    """The mechanism metadata ``collect`` wrote into a reports table's Parquet schema (local or
    any Beam FileSystems URL), or None (CSV, a database table: no such metadata). Every file's
    metadata is read, not the first one's only: files stating different mechanisms, parameters,
    privacy units or seededness are refused
    (:class:`~.provenance.MixedReportsError`, naming two of them and what differs)."""
    read = ReadTable(input, options=list(beam_args))
    if read.kind != "files" or not read.files:
        return None
    return agreed_metadata(read.files, read.flags, input)


def mechanism_from_reports(input: str, name: str | None = None,
                           params: Mapping[str, Any] | None = None,
                           allow_no_guarantee: bool = False,
                           beam_args: Iterable[str] = ()) -> Mechanism:
    """The mechanism that made the reports in ``input`` (from the metadata of all of its files,
    which must agree), or the one named (which must agree with it). Reports collected under a
    configuration without a finite guarantee need no second opt-in (the estimate restates their
    guarantee); a mechanism named or parameters given here need ``allow_no_guarantee``."""
    reg = get_registry()
    meta = reports_metadata(input, beam_args)
    if name is None:
        if meta is None:
            raise ValueError(f"{input} carries no mechanism metadata: pass --mechanism and its "
                             "parameters (-p NAME=VALUE)")
        merged = dict(meta["params"])
        merged.update(params or {})
        return reg.build(meta["mechanism"], merged,
                         allow_no_guarantee=allow_no_guarantee or not params)
    mech = reg.build(name, dict(params or {}), allow_no_guarantee=allow_no_guarantee)
    check_recorded(mech, meta)
    return mech


def check_recorded(mech: Mechanism, meta: Mapping[str, Any] | None) -> None:
    """A mechanism given for reports agrees with the one their metadata records (if any)."""
    if meta is None or not meta.get("mechanism"):
        return
    reg = get_registry()
    if meta["mechanism"] != mech.name:
        raise ValueError(f"reports were made by {meta['mechanism']!r}, not {mech.name!r}")
    recorded = reg.build(meta["mechanism"], dict(meta.get("params") or {}),
                         allow_no_guarantee=True)
    if recorded.params() != mech.params():
        diff = {k: (recorded.params().get(k), v) for k, v in mech.params().items()
                if recorded.params().get(k) != v}
        raise ValueError(f"parameters differ from those the reports were made with "
                         f"(recorded, given): {diff}")


class GroupRule:
    """Which groups of a ``--by`` estimate are published: ``min_group_size`` None (the
    default) suppresses a group whose estimate is uninformative (a statistic's CI is wider than
    its declared domain: :meth:`~ldp_beam.core.Estimate.uninformative`, i.e. the group is
    smaller than the size at which this mechanism's variance gives a CI within the domain); an
    integer N suppresses groups of fewer than N reports (0: none is suppressed). A suppressed
    group is published as ``{"suppressed": reason, "n_reports": n}`` (the report count of LDP
    reports is public; a central release's exact count is not, so only the default rule, on
    the released statistics, applies there). Both rules read only released values:
    post-processing, no privacy cost."""

    def __init__(self, min_group_size: int | None = None) -> None:
        if min_group_size is not None and (isinstance(min_group_size, bool) or
                                           not isinstance(min_group_size, int) or
                                           min_group_size < 0):
            raise ValueError(f"--min-group-size {min_group_size!r}: an integer >= 0 (0: "
                             "publish every group)")
        self.min_group_size = min_group_size

    def __call__(self, key: Any, est: Any) -> dict:
        n = est.n_reports
        small = self.min_group_size is not None and n is not None and n < self.min_group_size
        why = None
        if small:
            why = f"{n} reports, fewer than --min-group-size {self.min_group_size}"
        elif self.min_group_size is None and not isinstance(est, EstimateFailure):
            why = est.uninformative()
        if why is not None:
            return {"key": key, "suppressed": why, "n_reports": n}
        return {"key": key, **_result(est)}


def _result(est: Any) -> dict:
    if isinstance(est, EstimateFailure):
        return {"error": est.reason, "n_reports": est.n_reports}
    # exact curator-only counts (e.g. values clipped) under "curator": a release moves them
    # into its curator file before anything is written or published
    return est.to_dict(curator=True)


def group_outcomes(estimates: Mapping[str, Mapping[str, Any]]) -> dict:
    """The groups that were not published as numbers, by outcome: ``suppressed`` (too small to
    say anything; reason) and ``failed`` (no estimate possible; error)."""
    return {"suppressed": {k: e["suppressed"] for k, e in estimates.items() if "suppressed" in e},
            "failed": {k: e["error"] for k, e in estimates.items() if "error" in e}}


class _WriteResult:
    """The one estimate of a global combine -> (widened,) as JSON, the one line of ``path``
    (:class:`~ldp_beam.transforms.tally.WriteOneLine`: one Beam step, not thirteen)."""

    def __init__(self, path: str, widen: Any = None) -> None:
        self.write, self.widen = WriteOneLine(path), widen

    def __call__(self, est: Any) -> str:
        return self.write(_result(est if self.widen is None else self.widen(est)))


def distinct_keys(files: list[str], column: str, flags: Iterable[str] = ()) -> int:
    """Distinct values of one column over the input files (read alone, column-wise)."""
    seen = None
    for f in files:
        try:
            with open_input(f, tuple(flags)) as fh:
                if table_format(f) == "parquet":
                    col = pq.read_table(fh, columns=[column]).column(0)
                else:
                    col = pacsv.read_csv(fh, convert_options=pacsv.ConvertOptions(
                        include_columns=[column], column_types={column: "string"})).column(0)
        except Exception:  # an unreadable file or no such column: the pipeline reports it
            continue
        u = pc.unique(col.cast("string"))
        seen = u if seen is None else pc.unique(pa.concat_arrays([seen, u]))
    return 0 if seen is None else len(seen)


def run_estimate(input: str, output: str, mechanism: Mechanism | None = None,
                 by: str | None = None, options: Mapping[str, Any] | None = None,
                 beam_args: Iterable[str] = (), columns: Mapping[str, str] | None = None, *,
                 seed: Any = None, force: bool = False, allow_unreadable: bool = False,
                 null_values: Iterable[str] | None = None, run_key: RunKey | None = None,
                 ledger: str | None = None, budget: float | None = None,
                 budget_delta: float | None = None, unit: str | None = None,
                 keys: Iterable[str] | None = None,
                 selection: tuple[float, float] | None = None,
                 side_outputs: str | None = None, unverified: bool = False,
                 dataset: str | None = None, min_group_size: int | None = None) -> dict:
    """Estimate from a reports table (LDP) or release from raw rows (central DP, see
    :func:`run_release`). Writes ``OUTPUT`` (the estimate: a ``.json``, ``.parquet`` or ``.csv``
    file, local or any Beam FileSystems URL, or a ``duckdb://``/``postgresql://`` table),
    ``PREFIX.deadletter.jsonl`` and, last, ``PREFIX.manifest.json``, committed together or not at
    all (``PREFIX``: ``side_outputs``, by default the output itself, see :func:`side_prefix`);
    returns the estimate.

    LDP reports are verified first (:func:`~.provenance.verify_reports`, issue 23): each file
    tied to the ``collect`` manifest that committed it, unedited, not duplicated, all of one
    configuration (whose mechanism, parameters and seededness are used). Reports without such
    provenance (CSV, a database table, hand-written files, a deleted manifest) are refused
    unless ``unverified``, and every output then says so (the guarantee's summary starts with
    "UNVERIFIED reports"); mixed configurations are refused either way. The outputs name the
    ``runs`` used and the ``verification``.

    ``min_group_size``: which ``by`` groups are published (:class:`GroupRule`); the output
    names the ``suppressed`` and ``failed`` groups with their reasons."""
    options = dict(options or {})
    if isinstance(mechanism, CentralRelease):
        return run_release(input, output, mechanism, columns or {}, by, options, beam_args,
                           seed=seed, force=force, allow_unreadable=allow_unreadable,
                           null_values=null_values, run_key=run_key, ledger=ledger,
                           budget=budget, budget_delta=budget_delta, unit=unit, keys=keys,
                           selection=selection, side_outputs=side_outputs, dataset=dataset,
                           min_group_size=min_group_size)
    run = Run("estimate", input, seed=seed, run_key=run_key, beam_args=beam_args,
              null_values=null_values, ledger=ledger, dataset=dataset, force=force,
              allow_unreadable=allow_unreadable)
    read = run.read
    if by and by not in read.schema.names:  # before the pipeline, not a Beam traceback in it
        raise ValueError(f"--by {by}: the input has no column {by!r}; columns: "
                         f"{', '.join(read.schema.names)}")
    # the reports' provenance (issue 23), before anything runs: the files read are exactly the
    # files verified; mixed configurations are refused even when unverified
    prov = verify_reports(input, beam_args, unverified=unverified, read=read)
    meta = None if prov.mechanism is None else {"mechanism": prov.mechanism,
                                                "params": prov.params}
    if mechanism is None:
        if meta is None:
            raise ValueError(f"{input} carries no mechanism metadata: pass --mechanism and its "
                             "parameters (-p NAME=VALUE)")
        mech = get_registry().build(prov.mechanism, dict(prov.params or {}),
                                    allow_no_guarantee=True)
    else:
        mech = mechanism
        check_recorded(mech, meta)
    if columns:
        raise ValueError(f"{mech.name} estimates from reports; --column maps raw columns only "
                         "for central-DP releases")
    est = estimator_for(mech, **options)
    fmt = tidy_format(output)
    side = side_prefix(output, side_outputs)
    # seeded when any verified file is seeded (None: no file states it, e.g. CSV reports)
    seeded_reports = prov.seeded
    unit_meta = prov.privacy_unit or {}
    unit_col, k = unit_meta.get("column"), int(unit_meta.get("max_reports_per_unit", 1))
    if by:  # one accumulator per key: check their number before any is built
        check_groups(distinct_keys(read.files, by, read.flags), est.create().size, "--by")
    rule = GroupRule(min_group_size)

    # post-processing of LDP reports: recorded (epsilon 0) against the reports' dataset
    with run.spend({"estimate": output, "dead_letter": side + ".deadletter.jsonl"},
                   side + ".manifest.json", mech, unit=unit, seeded=bool(seeded_reports),
                   note="post-processing of LDP reports"):
        parts = run.results

        def build(p):
            rd = p | "ReadReports" >> read
            valid = rd.batches | "Validate" >> ValidateReports(est)
            combine_fn = EstimatorCombineFn(est, on_empty="report")
            widen = DesignEffect(k, f"up to {k} reports per privacy unit {unit_col!r}, which "
                                    "may be correlated")
            if by:
                written = (valid.reports | "SplitByKey" >> beam.ParDo(SplitByKey(by))
                           | "EstimatePerKey" >> beam.CombinePerKey(combine_fn)
                           | "PerUnitSE" >> beam.MapTuple(lambda key, e: (key, widen(e)))
                           | "ToJson" >> beam.MapTuple(rule)
                           | "WriteEstimates" >> WriteJsonLines(parts))
            else:  # one estimate (the combine's default when there is no report)
                written = (valid.reports | "Estimate" >> beam.CombineGlobally(combine_fn)
                           | "WriteEstimates" >> beam.Map(_WriteResult(parts, widen)))
            return run.bookkeeping(written, rd, valid.reports, valid.dead_letter, None)

        rows, rec = run.execute(build)
        guarantee = mark_unverified(run_guarantee(mech.guarantee, seeded=bool(seeded_reports),
                                                  unit=unit_col, bounds=k if unit_col else None),
                                    prov)
        out: dict[str, Any] = {
            "input": read.source_name, "mechanism": mech.name, "params": mech.params(),
            "estimator_options": options, "guarantee": guarantee,
            "seeded": seeded_reports,
            "runs": prov.run_ids, "verification": prov.verification(),
            "estimand": (f"per privacy unit {unit_col!r}: each unit's reports come from at most "
                         f"{k} of its rows, chosen uniformly (k = 1: every unit counts once, "
                         "whatever its number of rows)" if unit_col else
                         "per record: every row is a report; a person with several rows counts "
                         "once per row"),
            "reports": {"read": rec["read"], "valid": rec["accepted"],
                        "invalid": rec["dead_lettered"],
                        "unreadable_rows": rec["unreadable_rows"],
                        "unreadable_parts": rec["unreadable_parts"],
                        "reconciles": rec["reconciles"], "counted_from": rec["counted_from"],
                        "dead_letter": run.outs.location("dead_letter")},
        }
        if by:
            out["by"] = by
            out["estimates"] = {str(r.pop("key")): _mark(r, guarantee)
                                for r in sorted(rows, key=lambda r: str(r["key"]))}
            out.update(group_outcomes(out["estimates"]))
        else:
            out["estimate"] = _mark(rows[0], guarantee) if rows else \
                {"error": "no reports", "n_reports": 0}
        write_estimate(out, run.staged("estimate"), fmt, run.run_id, run.outs)
        run.commit({"command": "estimate", "input": read.source_name, "mechanism": mech.name,
                    "seeded": seeded_reports, "guarantee": guarantee,
                    "reports": out["reports"], "runs": prov.run_ids,
                    "verification": prov.to_dict()})
        out["ledger_state"] = run.ledger_state()
    return out


class DesignEffect:
    """Widen an estimate's standard errors for up to ``k`` reports per privacy unit (see
    :meth:`ldp_beam.core.Estimate.with_design_effect`); failures pass through."""

    def __init__(self, k: int, why: str) -> None:
        self.k, self.why = k, why

    def __call__(self, est: Any) -> Any:
        return est if isinstance(est, EstimateFailure) else est.with_design_effect(self.k, self.why)


def write_estimate(out: dict, path: str, fmt: str, run_id: str, outs: RunOutputs) -> None:
    """Stage the estimate as asked at ``path`` (in ``outs``' staging folder): the nested JSON
    (``.json``) or the tidy table (``.parquet``, ``.csv``: one row per statistic, cell and group,
    with value, SE, CI, n and the guarantee; a ``duckdb://``/``postgresql://`` table is staged
    as Parquet and written to the database when the run commits)."""
    if fmt == "json":
        outs.write_json(path, out)
    elif fmt in ("parquet", "csv", "duckdb", "postgresql"):  # a table is staged as Parquet
        outs.write(path, tidy_bytes(tidy_output_table(out, run_id=run_id),
                                    "csv" if fmt == "csv" else "parquet"))
    else:
        raise ValueError(f"estimate outputs go to .json, .parquet or .csv files or duckdb:// / "
                         f"postgresql:// tables (not {fmt})")


def side_prefix(output: str, side_outputs: str | None = None) -> str:
    """Where a run's manifest, dead letters and curator file go (``PREFIX.manifest.json``, ...):
    ``side_outputs`` when given (a local path or URL), else the output itself for a file; beside
    the database file for a DuckDB table (``FILE.TABLE``); for a PostgreSQL table, which has no
    folder, ``DATABASE.TABLE`` in the current folder."""
    if side_outputs:
        if tidy_format(side_outputs + ".json") != "json" or "?" in side_outputs:
            raise ValueError(f"--side-outputs {side_outputs}: a path or URL prefix for the "
                             "manifest and dead-letter files")
        return side_outputs
    fmt = tidy_format(output)
    if fmt not in ("duckdb", "postgresql"):
        return output
    base, settings, _ = parse_settings(output)
    table = settings.get("table") or "table"
    if fmt == "duckdb":
        return base.split("://", 1)[1] + "." + table
    db = urlsplit(base).path.strip("/") or "postgres"
    return os.path.abspath(f"{db}.{table}")


def _mark(est: dict, guarantee: dict) -> dict:
    """Every estimate carries its run's guarantee (a seeded one says it is not private)."""
    if "guarantee" in est:
        est["guarantee"] = guarantee
    return est


def run_release(input: str, output: str, mech: CentralRelease, columns: Mapping[str, str],
                by: str | None = None, options: Mapping[str, Any] | None = None,
                beam_args: Iterable[str] = (), *, seed: Any = None, force: bool = False,
                allow_unreadable: bool = False, null_values: Iterable[str] | None = None,
                run_key: RunKey | None = None, ledger: str | None = None,
                budget: float | None = None, budget_delta: float | None = None,
                unit: str | None = None, keys: Iterable[str] | None = None,
                selection: tuple[float, float] | None = None,
                side_outputs: str | None = None, dataset: str | None = None,
                min_group_size: int | None = None) -> dict:
    """A central-DP release on the trusted curator: raw records are validated and encoded (bad
    ones dead-lettered with the reason), accumulated, and released once with noise; with ``by``,
    one release per value of that column (:func:`release_by`).

    The noise is a function of the run's secret key and the accumulator: a runner that
    re-executes the release step (Dask does) publishes the same numbers, never a second draw.
    A re-run of the identical request on the same data publishes the recorded release again
    (epsilon 0 in the ledger), globally and per key. ``seed`` (or an estimator option ``seed``)
    makes it reproducible and not private.

    ``OUTPUT`` is the release (what may be published): the statistics and the guarantee, no exact
    counts. ``PREFIX.curator.json`` holds the curator's bookkeeping (records read, accepted and
    dead-lettered, which reconcile); like the dead-letter file it is not to be published. The
    manifest ``PREFIX.manifest.json`` is written last and names the three (``PREFIX``: see
    :func:`side_prefix`).
    """
    if by and unit is None:
        raise ValueError(f"--by {by}: a per-key central release needs --privacy-unit (each "
                         "person's keys and rows are bounded, and keys are selected privately or "
                         "given with --keys), else the set of keys and their sizes would be "
                         "disclosed")
    if by and (keys is None) == (selection is None):
        raise ValueError(f"--by {by}: give the public keys (--keys A,B,...) or a partition "
                         "selection budget (--partition-selection EPSILON,DELTA), one of them")
    if min_group_size not in (None, 0) and by:
        raise ValueError(f"--min-group-size {min_group_size}: a central release does not "
                         "publish its groups' exact sizes (they are private); small keys are "
                         "left out by partition selection, and a key whose released interval is "
                         "wider than its domain is suppressed by default (--min-group-size 0: "
                         "publish every selected key)")
    options = dict(options or {})
    run = Run("release", input, seed=take_seed(seed, options), run_key=run_key,
              beam_args=beam_args, null_values=null_values, ledger=ledger, budget=budget,
              budget_delta=budget_delta, dataset=dataset, force=force,
              allow_unreadable=allow_unreadable)
    fmt = tidy_format(output)
    cols = run.columns(mech, columns, unit=unit)
    plan = (_PerKey(mech, by, unit, keys, selection, run, cols, GroupRule(min_group_size))
            if by else
            _Global(mech, unit))
    est = estimator_for(mech, seed=run.release_seed, **options)
    guarantee = run_guarantee(plan.guarantee, seeded=run.seeded, unit=unit, bounds=plan.bounds)
    # what changes the data read or what is published is part of the request (given only
    # when set, so a default run matches the releases recorded before they were)
    settings = {k: v for k, v in (("null_values", None if null_values is None
                                   else list(null_values)),
                                  ("min_group_size", min_group_size)) if v is not None}
    request = release_request(mech.name, mech.params(), cols, options, unit=unit or "record",
                              seed=run.key.seed, **plan.request, **settings)
    side = side_prefix(output, side_outputs)
    dead_letter, curator_path = side + ".deadletter.jsonl", side + ".curator.json"
    roles = {"release": output, "curator": curator_path, "dead_letter": dead_letter}
    curator: dict[str, Any] = {"input": run.read.source_name, "release": location(output),
                               "columns": cols, **plan.request, "run_id": run.run_id}
    manifest = {"command": "release", **plan.request, "mechanism": mech.name,
                "seeded": run.seeded}
    prior = run.prior_release(request)
    if prior:  # an identical release is recorded: publish it again, draw no new noise
        with run.spend(roles, side + ".manifest.json", mech, guarantee=guarantee, unit=unit,
                       request=request, republished_from=prior["run_id"]):
            out = dict(prior["release"])
            curator["republished_from"] = prior["run_id"]
            write_estimate(out, run.staged("release"), fmt, run.run_id, run.outs)
            run.outs.write_json(run.staged("curator"), curator)
            run.outs.write(run.staged("dead_letter"), b"")
            run.commit({**manifest, "guarantee": out["guarantee"],
                        "republished_from": prior["run_id"]}, out)
            out["ledger_state"] = run.ledger_state()
        return {**out, "curator": curator, "republished_from": prior["run_id"],
                "curator_file": location(curator_path)}
    with run.spend(roles, side + ".manifest.json", mech, guarantee=guarantee, unit=unit,
                   request=request):
        def build(p):
            rd, rows, unit_dead, dropped = run.read_rows(p, unit, *plan.read_bounds)
            rec = rows | "Validate" >> Perturb(mech, columns=cols, run_key=run.key,
                                               keep=plan.keep)
            return run.bookkeeping(plan.release(rec.reports, est, run.results), rd, rec.reports,
                                   rec.dead_letter, dropped, unit_dead)

        rows_out, tally = run.execute(build)
        out: dict[str, Any] = {"mechanism": mech.name, "params": mech.params(),
                               "estimator_options": options, "guarantee": guarantee,
                               "seeded": run.seeded, **plan.describe()}
        exact = plan.collect(rows_out, out, guarantee)
        write_estimate(out, run.staged("release"), fmt, run.run_id, run.outs)
        curator["records"] = run.records(tally)
        skipped = plan.not_in_keys
        if skipped:  # rows of keys not listed: read and accepted, never released
            curator["records"]["released_from"] -= skipped["rows"]
            curator["records"]["not_in_keys"] = skipped["rows"]
        if exact:
            curator["releases" if by else "release"] = exact
        run.outs.write_json(run.staged("curator"), curator)
        run.commit({**manifest, "guarantee": guarantee}, out)
        out["ledger_state"] = run.ledger_state()
    out["curator"] = curator
    out["curator_file"] = location(curator_path)
    return out


class _Global:
    """A release's configuration: one release of all records (a privacy unit keeps at most
    Linf rows: one histogram is one partition)."""

    keep: tuple = ()
    request: dict = {}
    not_in_keys: dict | None = None  # a global release lists no keys

    def __init__(self, mech: CentralRelease, unit: str | None) -> None:
        self.guarantee = mech.guarantee
        self.bounds = None
        if unit is not None:
            cb = getattr(mech, "contribution_bounds", None)
            if cb is None:
                raise ValueError(f"--privacy-unit: {mech.name} states no contribution bounds, "
                                 "so its release cannot be calibrated per unit")
            self.bounds = ContributionBounds(1, cb.max_rows_per_partition)
        self.read_bounds = (1, self.bounds.max_rows_per_partition if self.bounds else 1)

    def release(self, records: Any, est: Any, results: str) -> Any:
        return (records
                | "Release" >> beam.CombineGlobally(EstimatorCombineFn(est, on_empty="report"))
                | "WriteRelease" >> beam.Map(_WriteResult(results)))

    def describe(self) -> dict:
        return {}

    def collect(self, rows: list, out: dict, guarantee: dict) -> dict:
        release = rows[0] if rows else {"error": "no records"}
        exact = release.pop("curator", None)  # never published
        if "error" in release:
            release.pop("n_reports", None)  # the exact count stays with the curator
        out["estimate"] = _mark(release, guarantee)
        return exact or {}


# --------------------------------------------------------------------------- per-key releases
class _KeyCodes:
    """A picklable partition function: one int64 code (>= 0) per row from the key's text
    (:func:`~ldp_beam.transforms.batches.key_text`, the text :class:`SplitByKey` groups by; a
    null key is the key ``""``, bounded like any other), by a hash keyed with the run's secret
    (63 bits): two keys with one code would be one partition of the bound, and a unit could
    then reach more than L0 released keys, beyond what the partition selection is calibrated
    to; unkeyed, whoever chooses key texts could search for such a pair (56 bits: ~2^28
    tries).

    ``public``: the listed keys (``--keys``); a row of another key gets -1, which bounding
    neither bounds nor counts against a unit's L0 keys (it is never released: see
    :class:`ReleaseKeys`, which counts such rows), so a unit's L0 slots go to listed keys."""

    def __init__(self, column: str, key: bytes, public: Iterable[str] | None = None) -> None:
        self.column, self.key = column, key
        self.public = None if public is None else frozenset(public)

    def __call__(self, table: Any) -> np.ndarray:
        enc = key_text(table, self.column).dictionary_encode()
        lut = np.array([-1 if self.public is not None and u not in self.public else
                        int.from_bytes(keyed_digest(self.key, u.encode(), 8), "big") >> 1
                        for u in enc.dictionary.to_pylist()], dtype=np.int64)
        return lut[enc.indices.to_numpy(zero_copy_only=False)]


class _PerKey:
    """A release's configuration: one release per value of ``by`` (issue 14). Each privacy unit
    keeps at most L0 keys and Linf rows per key (the release's ``max_partitions_per_unit`` and
    ``max_rows_per_partition``), chosen uniformly; every key's release has noise calibrated to
    the unit's total contribution over all keys (so all keys together cost epsilon once) and
    addressed by the key. Which keys appear is either public (``keys``: every listed key is
    released, an absent one as a noisy empty release; other keys are not released) or chosen by
    private partition selection (``selection`` = (epsilon, delta): thresholded noisy
    distinct-unit counts), whose cost composes with the releases."""

    def __init__(self, mech: CentralRelease, by: str, unit: str, keys: Iterable[str] | None,
                 selection: tuple[float, float] | None, run: Run,
                 cols: Mapping[str, str], rule: "GroupRule") -> None:
        # lazy: ldp_beam.central.partition costs 13 ms at import (measured), only per-key
        # central releases need it (not `estimate` of LDP reports)
        from ldp_beam.central.partition import (PartitionSelection, PublicPartitions,
                                                per_key_guarantee)

        if by not in run.schema.names or by in cols.values() or by == unit:
            raise ValueError(f"--by {by}: a column of the input other than the mechanism's "
                             f"inputs and the privacy unit; columns: "
                             f"{', '.join(run.schema.names)}")
        self.by, self.unit = by, unit
        cb = getattr(mech, "contribution_bounds", None)
        if cb is None:  # a plugin's release may declare none: its noise has no per-unit scale
            raise ValueError(f"--by {by}: {mech.name} declares no contribution_bounds (at most "
                             "L0 keys and Linf rows per key of a privacy unit), which a per-key "
                             "release calibrates its noise to; see docs/plugins.md")
        self.public = None if keys is None else tuple(str(k) for k in keys)
        if self.public is not None:
            check_groups(len(self.public), int(getattr(mech, "n_buckets", 1) or 1), "--keys")
            self.selector, sel_g = None, PublicPartitions(self.public).guarantee
            self.request = {"by": by, "keys": list(self.public)}
        else:
            self.selector = PartitionSelection(float(selection[0]), float(selection[1]), cb.l0)
            sel_g = self.selector.guarantee
            self.request = {"by": by, "selection": [float(selection[0]), float(selection[1])]}
        self.selection = selection
        self.guarantee = per_key_guarantee(mech.guarantee, sel_g)
        self.bounds = cb
        self.read_bounds = (cb.l0, cb.linf,
                            _KeyCodes(by, run.key.derive("key-codes"), self.public))
        self.keep = (by, unit)
        self.seed = run.release_seed
        self.rule = rule
        self.not_in_keys: dict | None = None  # rows of unlisted keys, set by collect()

    def release(self, records: Any, est: Any, results: str) -> Any:
        by, unit = self.by, self.unit
        return (records | "SplitKeys" >> beam.ParDo(SplitByKey(by))
                | "KeyParts" >> beam.Map(per_key_part(unit, by))
                | "PerKey" >> beam.CombinePerKey(PerKeyCombineFn(est))
                | "AllKeys" >> beam.combiners.ToList()
                | "Release" >> beam.ParDo(ReleaseKeys(est, self.public, self.selector,
                                                      self.seed, self.rule))
                | "WriteRelease" >> WriteJsonLines(results))

    def describe(self) -> dict:
        return {"by": self.by,
                "keys": "public" if self.public is not None else
                {"selection": {"epsilon": self.selection[0], "delta": self.selection[1]}}}

    def collect(self, rows: list, out: dict, guarantee: dict) -> dict:
        releases, exact = {}, {}
        self.not_in_keys = next((r[NOT_IN_KEYS] for r in rows if NOT_IN_KEYS in r), None)
        for r in sorted((r for r in rows if NOT_IN_KEYS not in r), key=lambda r: r["key"]):
            key = r.pop("key")
            r.pop("n_reports", None)  # exact counts stay with the curator
            cur = r.pop("curator", None)
            if cur:
                exact[key] = cur
            releases[key] = _mark(r, guarantee)
        out["estimates"] = releases
        out.update(group_outcomes(releases))
        return exact
