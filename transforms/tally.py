"""A run's counts, taken from the data itself inside the pipeline (:class:`Tally`), and the
rows read so far for a progress bar (:class:`CountLive`).

Counts come from the elements and the dead-letter part files of committed bundles, not from
Beam's metrics: Beam commits each bundle's outputs once, so the counts are the same on every
runner and under retries, where attempted metrics would count a retried bundle twice. The
launcher reads the one line :class:`Tally` writes and reconciles it
(:func:`ldp_beam.pipelines.common.reconcile`).
"""
from __future__ import annotations

import json
from typing import Any, Iterable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from ldp_beam.jsonio import json_line

from .batches import num_rows
from .io import UNREADABLE as UNREADABLE_PREFIX  # the reason of a reader's unreadable part
from .write import WritePartFn, fs_open, join_text_parts


def _reader_part(d: dict) -> dict:
    """A reader's dead letter as tally fields: an unreadable part stands for ``rows`` input rows
    (None: unknown), anything else (a malformed row) for one row, or ``rows`` if it says."""
    rows = d.get("rows", 1 if d.get("record") is not None else None)
    if str(d.get("reason", "")).startswith(UNREADABLE_PREFIX):
        return {"unreadable_parts": 1, "unreadable_rows": rows or 0,
                "unreadable_unknown": int(rows is None), "dead_letter_lines": 1}
    return {"malformed": 1 if rows is None else rows, "dead_letter_lines": 1}


#: the tally's field carrying the dead-letter part files to join (never written in the tally)
PARTS = "dead_letter_parts"


def _sum_counts(items: Iterable[dict]) -> dict:
    """Counts added up; the lists of part names (:data:`PARTS`) joined."""
    out: dict[str, Any] = {}
    for d in items:
        for k, v in d.items():
            out[k] = out.get(k, []) + v if k == PARTS else out.get(k, 0) + int(v)
    return out


def _nothing(_: Any) -> dict:
    return {}


def _count_read(batch: Any) -> dict:
    return {"read": num_rows(batch)}


def _count_accepted(batch: Any) -> dict:
    return {"accepted": num_rows(batch)}


class WriteOneLine:
    """``beam.Map(WriteOneLine(path))`` on a PCollection of exactly one element (e.g. a
    ``CombineGlobally``'s output) writes it as the one line of the JSON-lines file ``path``
    (Beam's FileSystems, where the element is) and passes ``path`` on: what
    :class:`~ldp_beam.transforms.WriteJsonLines` writes for one element, in one step instead of
    eleven (each costs the command line's start-up ~10 ms). A re-executed step rewrites the
    same line; a lost one leaves no file, which the launcher refuses (:func:`read_tally`)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, obj: Any) -> str:
        with fs_open(self.path, "w") as fh:
            fh.write(json_line(obj).encode("utf-8") + b"\n")
        return self.path


class _DeadLetterPartFn(WritePartFn):
    """The dead letters of a bundle written as JSON lines into a part file of their own; the
    part goes on to the tally as ``{PARTS: [[branch, name]]}`` (``branch``: ``"reader"`` or
    ``"invalid"``), which counts its lines and joins the parts."""

    def __init__(self, path: str, branch: str) -> None:
        super().__init__(path, line=json_line)
        self.branch = branch

    def process(self, element: Any):
        for name in super().process(element):
            yield {PARTS: [[self.branch, name]]}


def _count_part(branch: str, name: str) -> dict:
    """The tally fields of one dead-letter part file: each line of a validation part is one
    invalid row; a reader's line is read back for what it stands for (:func:`_reader_part`)."""
    with fs_open(name) as fh:
        if branch == "reader":
            return _sum_counts(_reader_part(json.loads(line)) for line in fh if line.strip())
        n = sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 22), b""))
    return {"invalid": n, "dead_letter_lines": n}


class _Finish(WriteOneLine):
    """The tally's last step: the dead letters counted from their committed parts and the counts
    written as the tally's one line, then the parts joined into ``dead_letter``. In that order,
    so a retried step is exact: parts are removed only once the join is complete, after the
    tally was written; a retry that finds them gone (and the joined file there) has nothing
    left to do, one that finds them all counts them again."""

    def __init__(self, path: str, dead_letter: str) -> None:
        super().__init__(path)
        self.dead_letter = dead_letter

    def __call__(self, obj: Any) -> str:
        parts = dict((name, branch) for branch, name in obj.get(PARTS, []))
        if all(FileSystems.exists(name) for name in parts):
            counts = [{k: v for k, v in obj.items() if k != PARTS}]
            counts += [_count_part(branch, name) for name, branch in sorted(parts.items())]
            super().__call__(_sum_counts(counts))
        join_text_parts(list(parts), self.dead_letter)  # a part missing and no file: it raises
        return self.path


class Tally(beam.PTransform):
    """A run's counts from the data itself (see the module docstring), applied to ``(written,
    batches, reader_dead, accepted, invalid[, bounded])``: ``read`` rows arrived in batches,
    ``malformed`` and ``unreadable_*`` rows were dead-lettered by the reader, ``accepted`` rows
    passed validation and ``invalid`` ones were dead-lettered by it. Written as one JSON line to
    ``path``; see :func:`reconcile`. ``written`` is the main output's write (one element, once
    it is complete): the final combine reads it, so the tally is the pipeline's last step, and
    its element stands in for the combine's default (an empty input gives ``{}``).

    The reader's and validation's dead letters are written as one JSON-lines file at
    ``dead_letter`` (created even when empty), as :class:`~ldp_beam.transforms.WriteJsonLines`
    would, but with their part names gathered by the tally's own combine (one shuffle less per
    run), and counted from the parts of committed bundles in the last step."""

    def __init__(self, path: str, dead_letter: str) -> None:
        super().__init__()
        self.path, self.dead_letter = path, dead_letter

    def expand(self, parts):
        written, batches, reader_dead, accepted, invalid, *bounded = parts
        # Only small dicts are flattened: Beam's DirectRunner materializes a multi-input
        # Flatten in memory. A batch branch gives one count per batch (~24 bytes held each:
        # 5x10^4 batches peaked 2.4 MB higher, measured); a dead-letter branch gives only the
        # names of its bundles' part files, whose lines the last step counts (a combine per
        # branch cost 10 Beam steps, ~0.1 s of start-up). The write's one {} lets one
        # CombineGlobally without a default add everything after the main output is complete
        # (a default, DoOnce + InjectDefault, cost ~35 ms more). Nothing is emitted from
        # finish_bundle: Beam's Dask runner drops what a DoFn emits there.
        sums = [written | "TallyAfterOutput" >> beam.Map(_nothing),
                batches | "TallyRead" >> beam.Map(_count_read),
                accepted | "TallyAccepted" >> beam.Map(_count_accepted)]
        sums += [pc | f"WriteDeadLetters{i}" >> beam.ParDo(_DeadLetterPartFn(self.dead_letter, b))
                 for i, (pc, b) in enumerate(((reader_dead, "reader"), (invalid, "invalid")))]
        if bounded:  # rows a privacy unit's contribution bound left out: {"bounded_out": n}
            sums.append(bounded[0])  # per batch
        return (tuple(sums)
                | "TallyAll" >> beam.Flatten()
                | "TallySum" >> beam.CombineGlobally(_sum_counts).without_defaults()
                | "TallyWrite" >> beam.Map(_Finish(self.path, self.dead_letter)))


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

__all__ = ["Tally", "WriteOneLine", "CountLive", "LIVE", "UNREADABLE_PREFIX", "PARTS"]
