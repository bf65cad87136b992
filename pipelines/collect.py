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

import pyarrow as pa
import pyarrow.parquet as pq

from ldp_beam.core import CentralRelease, Mechanism
from ldp_beam.registry import get_registry
from ldp_beam.privacy import check_contribution_bound, run_guarantee
from ldp_beam.rng import RunKey
from ldp_beam.transforms import Perturb, ReadTable, WriteParquetFile, report_schema

from .outputs import OutputError, check_output_format, is_table_url, location
from .run import Run, read_options


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
    if isinstance(mechanism, CentralRelease):
        raise ValueError(f"{mechanism.name} is a central-DP release: there is no client-side "
                         "report to collect; run `ldp-beam estimate -i TABLE -c COLUMN -m "
                         f"{mechanism.name} ...` on the trusted curator, which adds the noise once")
    undeclared = [c for c in keep if c not in public]
    if undeclared:
        raise ValueError(f"--keep {undeclared[0]}: kept columns are copied into the reports "
                         "unprotected; declare the column public with --public "
                         f"{undeclared[0]} if it is neither about a person nor an identifier "
                         "(a grouping key such as a region or a release date)")
    run = Run("collect", input, seed=seed, run_key=run_key, beam_args=beam_args,
              read=ReadTable(input, batch_rows=batch_rows, options=list(beam_args),
                             **read_options(null_values)), ledger=ledger, budget=budget, budget_delta=budget_delta,
              dataset=dataset, force=force, allow_unreadable=allow_unreadable)
    in_schema = run.schema
    cols = run.columns(mechanism, columns, keep, unit)
    if unit is not None:
        check_contribution_bound(max_reports_per_unit, "max_reports_per_unit")
    for c in keep:
        if c in cols.values():
            role = next(r for r, col in cols.items() if col == c)
            raise ValueError(f"--keep {c}: {c!r} is the input of {mechanism.name}'s role "
                             f"{role!r}; it can never be copied into the reports")
    passthrough = pa.schema([  # dictionary columns are written as their values
        pa.field(f.name, f.type.value_type) if pa.types.is_dictionary(f.type) else f
        for f in map(in_schema.field, keep)]) if keep else None
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
    guarantee = run_guarantee(mechanism.guarantee, seeded=run.seeded, public=keep, unit=unit,
                              bounds=max_reports_per_unit if unit else None)
    with run.spend({"reports": output, "dead_letter": dead_letter}, output + ".manifest.json",
                   mechanism, guarantee=guarantee, unit=unit):
        staged = run.staged("reports")

        def build(p):
            rd, rows, unit_dead, dropped = run.read_rows(p, unit, 1, max_reports_per_unit)
            out = rows | "Perturb" >> Perturb(
                mechanism, columns=cols, keep=keep, run_key=run.key,
                passthrough_schema=passthrough, dead_letter_columns=dead_letter_columns)
            return run.bookkeeping(out.reports | "WriteReports" >> WriteParquetFile(staged, schema),
                                   rd, out.reports, out.dead_letter, dropped, unit_dead)

        def reported() -> int:
            if not run.outs.exists(staged):  # no valid record at all: a readable, empty table
                buf = io.BytesIO()
                pq.write_table(schema.empty_table(), buf)
                run.outs.write(staged, buf.getvalue())
            with run.outs.open(staged) as fh:
                return pq.ParquetFile(fh).metadata.num_rows

        _, rec = run.execute(build, reported)
        manifest = {
            "command": "collect",
            "input": os.path.abspath(input) if os.path.exists(input) else run.read.source_name,
            "skipped_inputs": run.read.skipped,
            "output": location(output),
            "dead_letter": location(dead_letter),
            "mechanism": mechanism.name, "params": mechanism.params(),
            "columns": cols, "keep": list(keep), "public_columns": list(keep),
            "seeded": run.seeded, "guarantee": guarantee,
            "privacy_unit": None if unit is None else {
                "column": unit, "max_reports_per_unit": max_reports_per_unit,
                "estimand": "per unit: each unit's reports come from at most "
                            f"{max_reports_per_unit} of its rows, chosen uniformly"},
            "records": {"input": rec["input"], "reported": rec["accepted"],
                        "dead_lettered": rec["dead_lettered"],
                        "unreadable_rows": rec["unreadable_rows"],
                        "unreadable_parts": rec["unreadable_parts"],
                        "unreadable_rows_unknown": rec["unreadable_rows_unknown"],
                        **({"bounded_out": rec["bounded_out"]} if unit else {}),
                        "reconciles": rec["reconciles"], "counted_from": rec["counted_from"]},
        }
        written = run.commit(manifest)  # the ledger settled as what truly happened
        written["ledger_state"] = run.ledger_state()
        return written


def build(name: str, params: Mapping[str, Any], allow_no_guarantee: bool = False) -> Mechanism:
    return get_registry().build(name, dict(params), allow_no_guarantee=allow_no_guarantee)
