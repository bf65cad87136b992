"""``ldp-beam estimate``: reconstruct statistics from a reports table (server side).

The mechanism is read from the reports' Arrow schema metadata (written by ``collect``); naming one
with ``--mechanism`` is needed only for tables without it (CSV), and must agree with it when both
exist. Malformed reports go to ``OUTPUT.deadletter.jsonl``. With ``by``, one estimate per value of
a passthrough column (each is post-processing of the same LDP reports: no extra privacy cost).
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Iterable, Mapping

import apache_beam as beam
import pyarrow.parquet as pq

from ldp_beam.core import Mechanism
from ldp_beam.estimators import estimator_for
from ldp_beam.registry import get_registry
from ldp_beam.transforms import (EstimatorCombineFn, ReadTable, SplitByKey, ValidateReports,
                                 WriteJsonLines, mechanism_metadata)
from ldp_beam.transforms.combine import EstimateFailure
from ldp_beam.transforms.io import match_files, table_format

from .common import counters, count_rows_to, read_count, reconcile, run_pipeline, write_json


def mechanism_from_reports(input: str, name: str | None = None,
                           params: Mapping[str, Any] | None = None) -> Mechanism:
    reg = get_registry()
    files = match_files(input)
    meta = None
    if table_format(files[0]) == "parquet":
        meta = mechanism_metadata(pq.read_schema(files[0]))
    if name is None:
        if meta is None:
            raise ValueError(f"{files[0]} carries no mechanism metadata: pass --mechanism and its "
                             "parameters (-p NAME=VALUE)")
        merged = dict(meta["params"])
        merged.update(params or {})
        return reg.build(meta["mechanism"], merged)
    mech = reg.build(name, dict(params or {}))
    if meta is not None:
        if meta["mechanism"] != name:
            raise ValueError(f"reports were made by {meta['mechanism']!r}, not {name!r}")
        recorded = reg.build(meta["mechanism"], dict(meta["params"]))
        if recorded.params() != mech.params():
            diff = {k: (recorded.params()[k], v) for k, v in mech.params().items()
                    if recorded.params().get(k) != v}
            raise ValueError(f"parameters differ from those the reports were made with "
                             f"(recorded, given): {diff}")
    return mech


def _keyed_json(kv: Any) -> dict:
    key, est = kv
    return {"key": key, **_result(est)}


def _result(est: Any) -> dict:
    if isinstance(est, EstimateFailure):
        return {"error": est.reason, "n_reports": est.n_reports}
    return est.to_dict()


def run_estimate(input: str, output: str, mechanism: Mechanism | None = None,
                 by: str | None = None, options: Mapping[str, Any] | None = None,
                 beam_args: Iterable[str] = (), columns: Mapping[str, str] | None = None
                 ) -> dict:
    mech = mechanism or mechanism_from_reports(input)
    if getattr(mech, "central", False):
        return run_release(input, output, mech, columns or {}, by, options, beam_args)
    if columns:
        raise ValueError(f"{mech.name} estimates from reports; --column maps raw columns only "
                         "for central-DP releases")
    est = estimator_for(mech, **dict(options or {}))
    dead_letter = output + ".deadletter.jsonl"
    tmpdir = tempfile.mkdtemp(prefix="ldp-beam-estimate-")
    parts = os.path.join(tmpdir, "estimates.jsonl")
    read = ReadTable(input)
    count_path = os.path.join(tmpdir, "accepted.jsonl")

    def build(p):
        rd = p | "ReadReports" >> read
        valid = rd.batches | "Validate" >> ValidateReports(est)
        combine_fn = EstimatorCombineFn(est, on_empty="report")
        if by:
            results = (valid.reports | "SplitByKey" >> beam.ParDo(SplitByKey(by))
                       | "EstimatePerKey" >> beam.CombinePerKey(combine_fn)
                       | "ToJson" >> beam.Map(_keyed_json))
        else:
            results = (valid.reports | "Estimate" >> beam.CombineGlobally(combine_fn)
                       | "ToJson" >> beam.Map(_result))
        return [results | "WriteEstimates" >> WriteJsonLines(parts),
                count_rows_to(valid.reports, count_path),
                (rd.dead_letter, valid.dead_letter) | "AllDeadLetters" >> beam.Flatten()
                | "WriteDeadLetters" >> WriteJsonLines(dead_letter)]

    result = run_pipeline(build, beam_args)
    with open(parts) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    c = counters(result)
    c = {"records_in": c.get("reports_in"), "records_invalid": c.get("reports_invalid"),
         "files_unreadable": c.get("files_unreadable", 0)} if "reports_in" in c else {}
    rec = reconcile(c, read.files, dead_letter, read_count(count_path))
    out: dict[str, Any] = {
        "input": input, "mechanism": mech.name, "params": mech.params(),
        "estimator_options": dict(options or {}),
        "guarantee": mech.guarantee.to_dict(),
        "reports": {"read": rec["input"], "valid": rec["accepted"],
                    "invalid": rec["dead_lettered"], "unreadable_files": rec["unreadable_files"],
                    "reconciles": rec["reconciles"], "counted_from": rec["counted_from"],
                    "dead_letter": os.path.abspath(dead_letter)},
    }
    if by:
        out["by"] = by
        out["estimates"] = {str(r.pop("key")): r for r in sorted(rows, key=lambda r: str(r["key"]))}
    else:
        out["estimate"] = rows[0] if rows else {"error": "no reports", "n_reports": 0}
    write_json(output, out)
    return out


def run_release(input: str, output: str, mech: Mechanism, columns: Mapping[str, str],
                by: str | None = None, options: Mapping[str, Any] | None = None,
                beam_args: Iterable[str] = ()) -> dict:
    """A central-DP release on the trusted curator: raw records are validated and bucketed (bad
    ones dead-lettered with the reason), accumulated, and released once with noise.

    ``OUTPUT`` is the release (what may be published): the statistics and the guarantee, no exact
    counts. ``OUTPUT.curator.json`` holds the curator's bookkeeping (records read, accepted and
    dead-lettered, which reconcile); like the dead-letter file it is not to be published.
    """
    from ldp_beam.transforms import Perturb

    from .collect import resolve_columns

    if by:
        raise ValueError(f"{mech.name} is a central-DP release: per-key releases (--by) would "
                         "disclose which keys occur and how many there are; release one "
                         "histogram per declared key with separate runs instead")
    read = ReadTable(input)
    cols = resolve_columns(mech, read.schema, columns or {r.name: r.name for r in mech.roles
                                                          if r.required}, ())
    est = estimator_for(mech, **dict(options or {}))
    dead_letter = output + ".deadletter.jsonl"
    tmpdir = tempfile.mkdtemp(prefix="ldp-beam-release-")
    parts = os.path.join(tmpdir, "release.jsonl")
    count_path = os.path.join(tmpdir, "accepted.jsonl")

    def build(p):
        rd = p | "ReadTable" >> read
        rec = rd.batches | "Validate" >> Perturb(mech, columns=cols)
        return [rec.reports
                | "Release" >> beam.CombineGlobally(EstimatorCombineFn(est, on_empty="report"))
                | "ToJson" >> beam.Map(_result) | "WriteRelease" >> WriteJsonLines(parts),
                count_rows_to(rec.reports, count_path),
                (rd.dead_letter, rec.dead_letter) | "AllDeadLetters" >> beam.Flatten()
                | "WriteDeadLetters" >> WriteJsonLines(dead_letter)]

    result = run_pipeline(build, beam_args)
    with open(parts) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    release = rows[0] if rows else {"error": "no records"}
    if "error" in release:
        release.pop("n_reports", None)  # the exact count stays with the curator
    opts = {k: v for k, v in dict(options or {}).items() if k != "seed"}
    out: dict[str, Any] = {"mechanism": mech.name, "params": mech.params(),
                           "estimator_options": opts, "guarantee": mech.guarantee.to_dict(),
                           "seeded": "seed" in dict(options or {}), "estimate": release}
    write_json(output, out)
    rec = reconcile(counters(result), read.files, dead_letter, read_count(count_path))
    curator = {"input": input, "release": os.path.abspath(output), "columns": cols,
               "records": {"input": rec["input"], "released_from": rec["accepted"],
                           "dead_lettered": rec["dead_lettered"],
                           "unreadable_files": rec["unreadable_files"],
                           "dead_letter": os.path.abspath(dead_letter),
                           "reconciles": rec["reconciles"],
                           "counted_from": rec["counted_from"]}}
    write_json(output + ".curator.json", curator)
    out["curator"] = curator
    return out
