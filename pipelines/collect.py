"""``ldp-beam collect``: perturb a column of a Parquet/CSV table into a reports table.

Runs on the trusted side (the ingestion edge): the input holds true values, the output holds only
reports. Writes ``OUTPUT`` (Parquet; the mechanism and its parameters in the Arrow schema
metadata), ``OUTPUT.deadletter.jsonl`` (records that could not be perturbed, with the reason; they
hold raw values and must stay on the trusted side) and ``OUTPUT.manifest.json`` (counts that
reconcile: input = reported + dead-lettered; the guarantee each report carries).
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

from ldp_beam.core import Mechanism
from ldp_beam.registry import get_registry
from ldp_beam.transforms import (Perturb, ReadTable, WriteJsonLines, WriteParquetFile,
                                 report_schema)

from .common import counters, reconcile, run_pipeline, write_json


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
                batch_rows: int = 1 << 16, beam_args: Iterable[str] = ()) -> dict:
    keep = tuple(keep)
    if getattr(mechanism, "central", False):
        raise ValueError(f"{mechanism.name} is a central-DP release: there is no client-side "
                         "report to collect; run `ldp-beam estimate -i TABLE -c COLUMN -m "
                         f"{mechanism.name} ...` on the trusted curator, which adds the noise once")
    read = ReadTable(input, batch_rows=batch_rows)
    in_schema = read.schema
    cols = resolve_columns(mechanism, in_schema, columns, keep)
    passthrough = pa.schema([in_schema.field(c) for c in keep]) if keep else None
    if passthrough is not None:  # dictionary columns are written as their values
        passthrough = pa.schema([pa.field(f.name, f.type.value_type)
                                 if pa.types.is_dictionary(f.type) else f for f in passthrough])
    schema = report_schema(mechanism, passthrough)
    dead_letter = dead_letter or output + ".deadletter.jsonl"
    os.makedirs(os.path.dirname(os.path.abspath(output)) or ".", exist_ok=True)
    for path in (output, dead_letter):
        if os.path.exists(path):
            os.remove(path)
    def build(p):
        rd = p | "ReadTable" >> read
        out = rd.batches | "Perturb" >> Perturb(mechanism, columns=cols, keep=keep, seed=seed,
                                                passthrough_schema=passthrough)
        return [out.reports | "WriteReports" >> WriteParquetFile(output, schema),
                (rd.dead_letter, out.dead_letter) | "AllDeadLetters" >> beam.Flatten()
                | "WriteDeadLetters" >> WriteJsonLines(dead_letter)]

    result = run_pipeline(build, beam_args)
    if not os.path.exists(output):  # no valid record at all: still leave a readable, empty table
        pq.write_table(schema.empty_table(), output)
    reported = pq.ParquetFile(output).metadata.num_rows
    rec = reconcile(counters(result), read.files, dead_letter, reported)
    manifest = {
        "input": os.path.abspath(input) if os.path.exists(input) else input,
        "output": os.path.abspath(output),
        "dead_letter": os.path.abspath(dead_letter),
        "mechanism": mechanism.name, "params": mechanism.params(),
        "columns": cols, "keep": list(keep), "seeded": seed is not None,
        "guarantee": mechanism.guarantee.to_dict(),
        "records": {"input": rec["input"], "reported": reported,
                    "dead_lettered": rec["dead_lettered"],
                    "unreadable_files": rec["unreadable_files"],
                    "reconciles": rec["reconciles"], "counted_from": rec["counted_from"]},
    }
    write_json(output + ".manifest.json", manifest)
    return manifest


def build(name: str, params: Mapping[str, Any]) -> Mechanism:
    return get_registry().build(name, dict(params))
