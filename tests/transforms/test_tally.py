"""The run's tally and its dead letters (transforms/tally.py): counted where the elements are
produced, added by one combine, the dead letters joined from their part files. The counts and
lines must be exact (they reconcile the run) on every runner: one process, several, and Dask
(whose runner drops what a DoFn emits from finish_bundle, so no count may travel that way)."""
from __future__ import annotations

import json

import apache_beam as beam
import distributed
import pyarrow as pa
import pytest

from ldp_beam.pipelines.common import DASK_RUNNER
from ldp_beam.transforms.tally import PARTS, Tally, _sum_counts
from ldp_beam.transforms.write import PARTS_SUFFIX

MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]


def _run(tmp_path, batches, reader_dead, invalid, bounded=None, args=()):
    tally, dl = tmp_path / "tally.jsonl", tmp_path / "dead.jsonl"
    with beam.Pipeline(argv=list(args) or ["--runner=DirectRunner"]) as p:
        def create(label, items):
            return p | label >> beam.Create(items, reshuffle=False)
        b = create("Batches", batches)
        parts = (b, create("ReaderDead", reader_dead), b | beam.Map(lambda t: t),
                 create("Invalid", invalid))
        if bounded is not None:
            parts += (create("Bounded", bounded),)
        _ = parts | Tally(str(tally), dead_letter=str(dl))
    lines = tally.read_text().splitlines()
    assert len(lines) == 1
    dead = [json.loads(x) for x in dl.read_text().splitlines()]
    return json.loads(lines[0]), dead


@pytest.fixture(scope="module")
def dask_args():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address="127.0.0.1:0")
    try:
        yield [f"--runner={DASK_RUNNER}", f"--dask_client_address={cluster.scheduler_address}"]
    finally:
        cluster.close()


@pytest.mark.parametrize("runner", ["one-process", "two-processes", "dask"])
def test_counts_and_dead_letters_are_exact(tmp_path, runner, request):
    args = (request.getfixturevalue("dask_args") if runner == "dask"
            else {"one-process": (), "two-processes": MULTI}[runner])
    batches = [pa.table({"x": list(range(n))}) for n in (3, 5, 7, 11, 13)]
    reader_dead = [{"reason": "malformed row", "record": {"x": "a"}},
                   {"reason": "unreadable input: truncated file", "rows": 4},
                   {"reason": "unreadable input: no footer"}]
    invalid = [{"reason": "value out of range", "row": i} for i in range(9)]
    counts, dead = _run(tmp_path, batches, reader_dead, invalid,
                        bounded=[{"bounded_out": 2}, {"bounded_out": 5}], args=args)
    assert counts == {"read": 39, "accepted": 39, "malformed": 1, "unreadable_parts": 2,
                      "unreadable_rows": 4, "unreadable_unknown": 1, "invalid": 9,
                      "dead_letter_lines": 12, "bounded_out": 7}
    assert sorted(map(json.dumps, dead)) == sorted(map(json.dumps, reader_dead + invalid))
    assert not (tmp_path / ("dead.jsonl" + PARTS_SUFFIX)).exists()  # parts joined, then removed


def test_an_empty_run_writes_one_empty_line_and_an_empty_dead_letter_file(tmp_path):
    counts, dead = _run(tmp_path, [], [], [])
    assert counts == {} and dead == []


def test_sums_add_counts_and_join_part_names():
    assert _sum_counts([{"read": 2, PARTS: ["a"]}, {"read": 3}, {PARTS: ["b"], "invalid": 1}]) \
        == {"read": 5, PARTS: ["a", "b"], "invalid": 1}
