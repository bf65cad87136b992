"""``ldp-beam collect``: perturb a column of a Parquet/CSV table into a reports table.

Runs on the trusted side (the ingestion edge): the input holds true values, the output holds only
reports. Writes ``OUTPUT`` (Parquet; the mechanism and its parameters in the Arrow schema
metadata), ``OUTPUT.deadletter.jsonl`` (records that could not be perturbed, with the reason, the
file and the row; they hold the input columns' raw values and must stay on the trusted side) and,
last, ``OUTPUT.manifest.json`` (the run id, the files it covers, counts that reconcile: input =
reported + dead-lettered [+ unreadable]; the guarantee each report carries). All three are
committed together or not at all (:mod:`.outputs`).
"""
from __future__ import annotations

import io
import os
from typing import Any, Iterable, Mapping

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

from ldp_beam.core import Mechanism
from ldp_beam.ledger import Ledger
from ldp_beam.registry import get_registry
from ldp_beam.privacy import check_contribution_bound, ledger_cost, run_guarantee
from ldp_beam.rng import RunKey
from ldp_beam.transforms import (Perturb, ReadTable, WriteJsonLines, WriteParquetFile,
                                 report_schema)
from ldp_beam.transforms.units import BoundContributions

from .datasets import dataset_identity
from .common import Tally, check_readable, check_reconciles, reconcile, run_pipeline
from .lifecycle import ledger_state, publish
from .outputs import (OutputError, RunFailed, RunOutputs, check_output_format, is_table_url,
                      location)


def resolve_columns(mech: Mechanism, schema: pa.Schema, columns: Mapping[str, str],
                    keep: Iterable[str]) -> dict[str, str]:
    """Check the role -> column mapping against the input schema; error with what exists."""
    cols = dict(columns)
    roles = {r.name: r for r in mech.roles}
    for role in cols:
        if role not in roles:
            raise ValueError(f"{mech.name} has no input role {role!r}; roles: {sorted(roles)}")
    for r in mech.roles:
        if r.required and r.name not in cols:
            raise ValueError(f"{mech.name} needs a column for role {r.name!r} "
                             f"(use --column for 'value' or --role {r.name}=COLUMN)")
    for c in list(cols.values()) + list(keep):
        if c not in schema.names:
            raise ValueError(f"input has no column {c!r}; columns: {', '.join(schema.names)}")
    return cols


def run_collect(input: str, output: str, mechanism: Mechanism, columns: Mapping[str, str],
                keep: Iterable[str] = (), seed: Any = None, dead_letter: str | None = None,
                batch_rows: int = 1 << 16, beam_args: Iterable[str] = (), *,
                public: Iterable[str] = (), force: bool = False, allow_unreadable: bool = False,
                null_values: Iterable[str] | None = None, dead_letter_columns: str = "mapped",
                run_key: RunKey | None = None, ledger: str | None = None,
                budget: float | None = None, budget_delta: float | None = None,
                unit: str | None = None, max_reports_per_unit: int = 1,
                dataset: str | None = None) -> dict:
    """Perturb ``input`` into ``output``; returns the committed manifest.

    ``keep`` columns are copied into the reports unprotected, so each must also be declared in
    ``public`` (and none may be an input of the mechanism). The run commits all of its outputs
    (reports, dead letters, then the manifest) or none: see :mod:`.outputs`. It fails with
    :class:`RunFailed`, committing nothing, when part of the input cannot be read (unless
    ``allow_unreadable``) or its counts do not add up.

    ``dataset``: the input's name in the budget ledger (default: its canonical location), so its
    budget follows its people however its content changes. The manifest's ``ledger`` says which
    ledger the run was recorded in and what the dataset has left.
    """
    keep = tuple(keep)
    public = tuple(public)
    if getattr(mechanism, "central", False):
        raise ValueError(f"{mechanism.name} is a central-DP release: there is no client-side "
                         "report to collect; run `ldp-beam estimate -i TABLE -c COLUMN -m "
                         f"{mechanism.name} ...` on the trusted curator, which adds the noise once")
    undeclared = [c for c in keep if c not in public]
    if undeclared:
        raise ValueError(f"--keep {undeclared[0]}: kept columns are copied into the reports "
                         "unprotected; declare the column public with --public "
                         f"{undeclared[0]} if it is neither about a person nor an identifier "
                         "(a grouping key such as a region or a release date)")
    run = run_key or RunKey.new(seed)
    read = ReadTable(input, batch_rows=batch_rows, options=list(beam_args),
                     **_read_options(null_values))
    in_schema = read.schema
    cols = resolve_columns(mechanism, in_schema, columns, keep)
    if unit is not None:
        check_unit_column(unit, in_schema, cols, keep)
        check_contribution_bound(max_reports_per_unit, "max_reports_per_unit")
    for c in keep:
        if c in cols.values():
            role = next(r for r, col in cols.items() if col == c)
            raise ValueError(f"--keep {c}: {c!r} is the input of {mechanism.name}'s role "
                             f"{role!r}; it can never be copied into the reports")
    passthrough = pa.schema([in_schema.field(c) for c in keep]) if keep else None
    if passthrough is not None:  # dictionary columns are written as their values
        passthrough = pa.schema([pa.field(f.name, f.type.value_type)
                                 if pa.types.is_dictionary(f.type) else f for f in passthrough])
    schema = report_schema(mechanism, passthrough, seeded=run.seeded,
                           privacy_unit=None if unit is None else
                           {"column": unit, "max_reports_per_unit": max_reports_per_unit},
                           run_id=run.run_id)
    if is_table_url(output):
        raise OutputError(f"--output {location(output)}: collect writes a reports Parquet file "
                          "(a local path or a URL such as s3://bucket/prefix/reports.parquet)")
    check_output_format("--output", output, (".parquet", ".pq"))
    dead_letter = dead_letter or output + ".deadletter.jsonl"
    check_output_format("--dead-letter", dead_letter, (".jsonl",))
    outs = RunOutputs({"reports": output, "dead_letter": dead_letter},
                      output + ".manifest.json", run.run_id, inputs=[input], force=force,
                      options=beam_args)
    # the ledger: reachable, and the budget holds, before any noise is drawn
    guarantee = run_guarantee(mechanism.guarantee, seeded=run.seeded, public=keep, unit=unit,
                              bounds=max_reports_per_unit if unit else None)
    ds = dataset_identity(input, beam_args, name=dataset)
    epsilon, delta, kind = ledger_cost(guarantee)
    with outs, Ledger.open(ledger) as led, led.reserve(
            run.run_id, ds, command="collect", mechanism=mechanism.name,
            params=mechanism.params(), epsilon=epsilon, delta=delta, kind=kind, unit=unit,
            budget=budget, budget_delta=budget_delta, seeded=run.seeded) as entry:
        staged, staged_dead = outs.staged("reports"), outs.staged("dead_letter")
        tally_path = outs.scratch("tally.jsonl")

        def build(p):
            rd, rows, unit_dead, dropped = read_bounded(p, read, unit, run, 1,
                                                         max_reports_per_unit)
            out = rows | "Perturb" >> Perturb(
                mechanism, columns=cols, keep=keep, run_key=run, passthrough_schema=passthrough,
                dead_letter_columns=dead_letter_columns)
            invalid = invalid_rows(out.dead_letter, unit_dead)
            return [out.reports | "WriteReports" >> WriteParquetFile(staged, schema),
                    (rd.dead_letter, invalid)
                    | "WriteDeadLetters" >> WriteJsonLines(staged_dead),
                    tally_inputs(rd, out.reports, invalid, dropped)
                    | "Tally" >> Tally(tally_path)]

        run_pipeline(build, beam_args)
        if not outs.exists(staged):  # no valid record at all: still a readable, empty table
            outs.write(staged, parquet_bytes(schema.empty_table()))
        with outs.open(staged) as fh:
            reported = pq.ParquetFile(fh).metadata.num_rows
        rec = reconcile(read_tally(outs, tally_path), outs.count_lines(staged_dead), reported)
        check_reconciles(rec)
        check_readable(rec, staged_dead, allow_unreadable, opener=outs.open_text)
        manifest = {
            "command": "collect",
            "input": os.path.abspath(input) if os.path.exists(input) else read.source_name,
            "skipped_inputs": read.skipped,
            "output": location(output),
            "dead_letter": location(dead_letter),
            "mechanism": mechanism.name, "params": mechanism.params(),
            "columns": cols, "keep": list(keep), "public_columns": list(keep),
            "seeded": run.seeded, "guarantee": guarantee,
            "privacy_unit": None if unit is None else {
                "column": unit, "max_reports_per_unit": max_reports_per_unit,
                "estimand": "per unit: each unit's reports come from at most "
                            f"{max_reports_per_unit} of its rows, chosen uniformly"},
            "records": {"input": rec["input"], "reported": reported,
                        "dead_lettered": rec["dead_lettered"],
                        "unreadable_rows": rec["unreadable_rows"],
                        "unreadable_parts": rec["unreadable_parts"],
                        "unreadable_rows_unknown": rec["unreadable_rows_unknown"],
                        **({"bounded_out": rec["bounded_out"]} if unit else {}),
                        "reconciles": rec["reconciles"], "counted_from": rec["counted_from"]},
        }
        manifest["dataset"] = ds["dataset"]
        manifest["ledger"] = led.url
        written = publish(entry, outs, manifest)  # the ledger settled as what truly happened
        written["ledger_state"] = ledger_state(led, ds["dataset"], ledger)
        return written


def read_tally(outs: RunOutputs, path: str) -> dict:
    """The run's tally (one JSON line the pipeline wrote into the staging folder), read back
    through the staging folder's file system. The pipeline always writes that line (``{}`` for
    an empty input), so a run without it fails: its counts would otherwise read as all zeros
    and "reconcile"."""
    vals = outs.read_json_lines(path) if outs.exists(path) else []
    if len(vals) != 1:
        raise RunFailed(f"the run wrote {len(vals)} tally lines instead of one (the runner lost "
                        "or repeated part of the pipeline's output); its counts cannot be "
                        "checked and nothing was committed")
    return vals[0]


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def check_unit_column(unit: str, schema: pa.Schema, cols: Mapping[str, str],
                      keep: Iterable[str]) -> None:
    """The privacy-unit column exists, is not an input of the mechanism and is never kept."""
    if unit not in schema.names:
        raise ValueError(f"--privacy-unit {unit}: the input has no column {unit!r}; columns: "
                         f"{', '.join(schema.names)}")
    if unit in cols.values():
        raise ValueError(f"--privacy-unit {unit}: the column is an input of the mechanism; the "
                         "privacy unit names a person, it is never perturbed or reported")
    if unit in keep:
        raise ValueError(f"--keep {unit}: the privacy unit identifies a person and can never be "
                         "copied into the reports")


def read_bounded(p: Any, read: Any, unit: str | None, run: RunKey, l0: int, linf: int,
                 partition_fn: Any = None) -> tuple[Any, Any, Any, Any]:
    """Read the input; with a privacy unit, keep at most ``l0`` partitions x ``linf`` rows per
    unit (the input is read twice, so memory stays flat). Returns (reader outputs, rows to use,
    dead letters of rows without a unit, {"bounded_out": n} counts); the last two are None
    without a privacy unit (see :func:`invalid_rows`)."""
    if unit is None:
        rd = p | "ReadTable" >> read
        return rd, rd.batches, None, None
    b = p | "BoundPerUnit" >> BoundContributions(unit, run, l0, linf, partition_fn, source=read)
    return b.read, b.batches, b.dead_letter, b.dropped


def invalid_rows(dead_letter: Any, unit_dead: Any) -> Any:
    """The rows validation dead-lettered, with those that had no privacy unit (if any).

    Without a unit nothing is flattened in: Beam's DirectRunner materializes every multi-input
    Flatten in memory (it never fuses one), so flattening the dead letters with an empty
    PCollection held every one of them (10^6 input rows, half invalid: ~700 MB, not ~280)."""
    if unit_dead is None:
        return dead_letter
    return (dead_letter, unit_dead) | "InvalidRows" >> beam.Flatten()


def tally_inputs(rd: Any, accepted: Any, invalid: Any, dropped: Any) -> tuple:
    """What :class:`~.common.Tally` counts: the reader's batches and dead letters, the accepted
    rows, the invalid ones and, with a privacy unit, the rows its bound left out."""
    parts = (rd.batches, rd.dead_letter, accepted, invalid)
    return parts if dropped is None else parts + (dropped,)


def _read_options(null_values: Iterable[str] | None) -> dict:
    """ReadTable keyword arguments for options the user set (``None``: the reader's default)."""
    return {} if null_values is None else {"null_values": tuple(null_values)}


def build(name: str, params: Mapping[str, Any], allow_no_guarantee: bool = False) -> Mechanism:
    return get_registry().build(name, dict(params), allow_no_guarantee=allow_no_guarantee)
