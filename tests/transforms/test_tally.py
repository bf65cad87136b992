"""The run's tally and its dead letters (transforms/tally.py): batches counted where they are
produced, the dead letters counted and joined from their committed part files, everything added
by one combine. The counts and lines must be exact (they reconcile the run) on every runner: one
process, several, and Dask (whose runner drops what a DoFn emits from finish_bundle, so no count
may travel that way), and under a retried last step."""
from __future__ import annotations

import json

import apache_beam as beam
import distributed
import pyarrow as pa
import pytest

from ldp_beam.pipelines.common import DASK_RUNNER
from ldp_beam.transforms.tally import PARTS, Tally, _Finish, _sum_counts
from ldp_beam.transforms.write import PARTS_SUFFIX

MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]


def _run(tmp_path, batches, reader_dead, invalid, bounded=None, args=(), written=True):
    tally, dl = tmp_path / "tally.jsonl", tmp_path / "dead.jsonl"
    with beam.Pipeline(argv=list(args) or ["--runner=DirectRunner"]) as p:
        def create(label, items):
            return p | label >> beam.Create(items, reshuffle=False)
        b = create("Batches", batches)
        parts = (create("Written", ["output"] if written else []), b,
                 create("ReaderDead", reader_dead), b | beam.Map(lambda t: t),
                 create("Invalid", invalid))
        if bounded is not None:
            parts += (create("Bounded", bounded),)
        _ = parts | Tally(str(tally), dead_letter=str(dl))
    if not written:
        return tally.exists(), None
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


def test_an_empty_run_without_its_main_output_writes_no_tally(tmp_path):
    # the main output's element stands in for the combine's default: without it, an empty run
    # writes no line and the launcher refuses the run (read_tally)
    assert _run(tmp_path, [], [], [], written=False) == (False, None)


def test_sums_add_counts_and_join_part_names():
    assert _sum_counts([{"read": 2, PARTS: ["a"]}, {"read": 3}, {PARTS: ["b"], "invalid": 1}]) \
        == {"read": 5, PARTS: ["a", "b"], "invalid": 1}


def _parts(tmp_path, lines_by_branch):
    """Dead-letter part files as the tally's writer leaves them: {PARTS: [[branch, name]]}."""
    folder = tmp_path / ("dead.jsonl" + PARTS_SUFFIX)
    folder.mkdir()
    parts = []
    for i, (branch, lines) in enumerate(lines_by_branch):
        f = folder / f"part-{i}.jsonl"
        f.write_text("".join(json.dumps(x) + "\n" for x in lines))
        parts.append([branch, str(f)])
    return parts


def test_the_last_step_counts_committed_parts_and_a_retry_after_the_join_changes_nothing(tmp_path):
    tally, dl = tmp_path / "tally.jsonl", tmp_path / "dead.jsonl"
    reader = [{"reason": "malformed row", "record": {"x": "a"}},
              {"reason": "unreadable input: truncated file", "rows": 4}]
    invalid = [{"reason": "value out of range", "row": i} for i in range(3)]
    parts = _parts(tmp_path, [("reader", reader), ("invalid", invalid[:2]),
                                  ("invalid", invalid[2:])])
    finish = _Finish(str(tally), str(dl))
    obj = {"read": 7, "accepted": 4, PARTS: parts}
    assert finish(obj) == str(tally)
    expected = {"read": 7, "accepted": 4, "malformed": 1, "unreadable_parts": 1,
                "unreadable_rows": 4, "unreadable_unknown": 0, "invalid": 3,
                "dead_letter_lines": 5}
    assert json.loads(tally.read_text()) == expected
    joined = dl.read_text()
    assert len(joined.splitlines()) == 5
    assert not (tmp_path / ("dead.jsonl" + PARTS_SUFFIX)).exists()
    # the step retried once the parts were joined and removed: nothing counted or written again
    before = tally.stat().st_mtime_ns
    assert finish(obj) == str(tally)
    assert tally.stat().st_mtime_ns == before and dl.read_text() == joined


def test_a_part_missing_before_any_join_fails_the_step(tmp_path):
    tally, dl = tmp_path / "tally.jsonl", tmp_path / "dead.jsonl"
    parts = _parts(tmp_path, [("invalid", [{"reason": "r"}])])
    parts.append(["invalid", str(tmp_path / ("dead.jsonl" + PARTS_SUFFIX) / "part-lost.jsonl")])
    with pytest.raises(OSError, match="part-lost.jsonl"):
        _Finish(str(tally), str(dl))({PARTS: parts})
    assert not tally.exists() and not dl.exists()
