"""A run's counts, taken from the data itself inside the pipeline (:class:`Tally`), and the
rows read so far for a progress bar (:class:`CountLive`).

Counts come from the elements, not from Beam's metrics: Beam commits each bundle's outputs
once, so the counts are the same on every runner and under retries, where attempted metrics
would count a retried bundle twice. The launcher reads the one line :class:`Tally` writes and
reconciles it (:func:`ldp_beam.pipelines.common.reconcile`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import apache_beam as beam

from ldp_beam.jsonio import json_line

from .batches import num_rows
from .io import UNREADABLE as UNREADABLE_PREFIX  # the reason of a reader's unreadable part
from .write import fs_open


def _reader_part(d: dict) -> dict:
    """A reader's dead letter as tally fields: an unreadable part stands for ``rows`` input rows
    (None: unknown), anything else (a malformed row) for one row, or ``rows`` if it says."""
    rows = d.get("rows", 1 if d.get("record") is not None else None)
    if str(d.get("reason", "")).startswith(UNREADABLE_PREFIX):
        return {"unreadable_parts": 1, "unreadable_rows": rows or 0,
                "unreadable_unknown": int(rows is None), "dead_letter_lines": 1}
    return {"malformed": 1 if rows is None else rows, "dead_letter_lines": 1}


def _sum_counts(items: Iterable[dict]) -> dict:
    out: dict[str, int] = {}
    for d in items:
        for k, v in d.items():
            out[k] = out.get(k, 0) + int(v)
    return out


def _count_read(batch: Any) -> dict:
    return {"read": num_rows(batch)}


def _count_accepted(batch: Any) -> dict:
    return {"accepted": num_rows(batch)}


def _count_invalid(_dead_letter: Any) -> dict:
    return {"invalid": 1, "dead_letter_lines": 1}


class _CountFn(beam.CombineFn):
    """One branch of a :class:`Tally`: ``count(element)`` ({name: n}) summed over the branch's
    elements where they are produced, into one small dict."""

    def __init__(self, count: Callable[[Any], dict]) -> None:
        self.count = count

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, acc: dict, element: Any) -> dict:
        for k, v in self.count(element).items():
            acc[k] = acc.get(k, 0) + int(v)
        return acc

    def merge_accumulators(self, accs: Iterable[dict]) -> dict:
        return _sum_counts(accs)

    def extract_output(self, acc: dict) -> dict:
        return acc


class WriteOneLine:
    """``beam.Map(WriteOneLine(path))`` on a PCollection of exactly one element (the output of a
    ``CombineGlobally`` with its default: one per run) writes the JSON-lines file ``path`` holding
    that one line, through Beam's FileSystems where the element is, and passes ``path`` on: the
    bytes :class:`~ldp_beam.transforms.WriteJsonLines` writes for one element, in one step
    instead of its eleven (part files, ``ToList``, join; measured: each Beam step costs the
    command line's start-up ~10 ms to build, check and translate). A re-executed step rewrites
    the same line; a lost one leaves no file, which the launcher refuses (:func:`read_tally`)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, obj: Any) -> str:
        with fs_open(self.path, "w") as fh:
            fh.write(json_line(obj).encode("utf-8") + b"\n")
        return self.path


class Tally(beam.PTransform):
    """Counts of a run taken from the data itself, the same on every runner and under retries
    (Beam commits each bundle's outputs once; attempted metrics would count a retried bundle
    twice): ``read`` rows arrived in batches, ``malformed`` and ``unreadable_*`` rows were
    dead-lettered by the reader, ``accepted`` rows passed validation and ``invalid`` ones were
    dead-lettered by it. Written as one JSON line to ``path``; see :func:`reconcile`."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def expand(self, parts):
        batches, reader_dead, accepted, invalid, *bounded = parts
        counts = [(batches, _count_read), (reader_dead, _reader_part),
                  (accepted, _count_accepted), (invalid, _count_invalid)]
        if bounded:  # rows a privacy unit's contribution bound left out: {"bounded_out": n}
            counts.append((bounded[0], dict))
        # each branch is summed where it is produced, and only the sums are flattened: Beam's
        # DirectRunner materializes a multi-input Flatten in memory (it never fuses one), so
        # flattening per-record counts would hold one dict per dead letter. A branch without
        # elements gives no sum (without_defaults: 4 Beam steps instead of 8; an empty dict
        # would add nothing); the last sum keeps its default, so the run always writes one
        # line ({} for an empty input).
        sums = [pc | f"TallySum{i}" >> beam.CombineGlobally(_CountFn(fn)).without_defaults()
                for i, (pc, fn) in enumerate(counts)]
        return (tuple(sums)
                | "TallyAll" >> beam.Flatten()
                | "TallySum" >> beam.CombineGlobally(_sum_counts)
                | "TallyWrite" >> beam.Map(WriteOneLine(self.path)))


#: rows counted so far by the live counting branch of the runs in this process, by run
LIVE: dict[str, int] = {}


class CountLive(beam.DoFn):
    """Adds the rows of each batch the reader emits to ``LIVE[run_id]`` (this process only: a
    run on workers elsewhere leaves it at 0 and the bar falls back to the runner's metrics)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def process(self, element: Any):
        if not isinstance(element, dict):  # the reader's dead letters are dicts
            LIVE[self.run_id] = LIVE.get(self.run_id, 0) + num_rows(element)
        return ()

__all__ = ["Tally", "WriteOneLine", "CountLive", "LIVE", "UNREADABLE_PREFIX"]
