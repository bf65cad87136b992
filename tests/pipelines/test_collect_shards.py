"""Memory flat in collect (issue 16): reports and dead letters are written as runner-chosen part
files (no GroupByKey ever carries a report or a dead letter, which is what made the DirectRunner
hold every report in memory), then joined into the one committed file by a last pipeline step:
renamed when there is one part, streamed a row group at a time when there are several. The
committed layout does not change: one ``REPORTS`` Parquet file, its dead letters and manifest."""
from __future__ import annotations

import glob
import json
import os
import re

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.pipeline import PipelineVisitor

from ldp_beam import build_mechanism
from ldp_beam.pipelines.collect import run_collect
from ldp_beam.pipelines.outputs import STAGING_PREFIX, verify
from ldp_beam.transforms import WriteJsonLines, WriteParquetFile
from ldp_beam.transforms.write import PARTS_SUFFIX, join_parquet_parts, join_text_parts

MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]
SCHEMA = pa.schema([("i", pa.int64()), ("s", pa.string())], metadata={b"k": b"v"})


def _batch(j: int, n: int = 100) -> pa.Table:
    return pa.table({"i": np.arange(j * n, (j + 1) * n), "s": [f"r{j}"] * n}, schema=SCHEMA)


def _data_groupings(write, inputs: int = 1) -> list[str]:
    """Labels of the GroupByKey and multi-input Flatten steps (the DirectRunner materializes
    both in memory) that receive the written elements themselves (or anything computed from
    them before a write step turned them into file names)."""
    p = beam.Pipeline()
    srcs = [p | f"Seeds{i}" >> beam.Create(range(3)) | f"Make{i}" >> beam.Map(_batch)
            for i in range(inputs)]
    _ = (srcs[0] if inputs == 1 else tuple(srcs)) | "W" >> write
    nodes = []

    class Visit(PipelineVisitor):
        def visit_transform(self, node):
            nodes.append(node)

    p.visit(Visit())
    data = set(srcs)
    changed = True
    while changed:
        changed = False
        for node in nodes:
            if re.search(r"/(WriteParts\d*|WriteBundles)$", node.full_label):
                continue  # its outputs are file results, not data
            if any(i in data for i in node.inputs):
                for o in node.outputs.values():
                    if o not in data:
                        data.add(o)
                        changed = True
    return [n.full_label for n in nodes
            if (isinstance(n.transform, beam.GroupByKey)
                or isinstance(n.transform, beam.Flatten) and len(n.inputs) > 1)
            and any(i in data for i in n.inputs)]


@pytest.mark.parametrize("write", [lambda: WriteParquetFile("/tmp/unused.parquet", SCHEMA),
                                   lambda: WriteJsonLines("/tmp/unused.jsonl")],
                         ids=["parquet", "jsonl"])
def test_no_groupbykey_carries_the_written_data(write):
    # the old num_shards=1 write grouped every element under one key: W/Write/WriteImpl/GroupByKey
    assert _data_groupings(write()) == []


def test_dead_letters_of_several_sources_are_written_without_a_flatten():
    # collect used to Flatten the reader's and validation's dead letters before writing them
    assert _data_groupings(WriteJsonLines("/tmp/unused.jsonl"), inputs=2) == []
    assert _data_groupings(_FlattenThenWrite(), inputs=2) == ["W/Flatten"]


class _FlattenThenWrite(beam.PTransform):
    def expand(self, pcolls):
        return pcolls | beam.Flatten() | WriteJsonLines("/tmp/unused.jsonl")


def test_join_parquet_parts_streams_row_groups_in_part_order_and_removes_the_parts(tmp_path):
    folder = tmp_path / ("out.parquet" + PARTS_SUFFIX)
    folder.mkdir()
    parts = []
    for j in (2, 0, 1):  # the join orders parts by name, not by the order it is given them
        f = folder / f"part-{j:05d}-of-00003.parquet"
        pq.write_table(pa.concat_tables([_batch(j * 2), _batch(j * 2 + 1)]), f,
                       row_group_size=100)
        parts.append(str(f))
    dest = str(tmp_path / "out.parquet")
    assert join_parquet_parts(parts, dest, SCHEMA) == dest
    pf = pq.ParquetFile(dest)
    assert pf.num_row_groups == 6 and pf.schema_arrow.metadata == {b"k": b"v"}
    assert pf.read().column("i").to_pylist() == list(range(600))
    assert not folder.exists()
    # a retried join (the parts already removed, the file complete) is a no-op, not an error
    assert join_parquet_parts(parts, dest, SCHEMA) == dest and pq.read_table(dest).num_rows == 600


def test_join_of_no_part_is_an_empty_readable_file_and_leftover_parts_are_removed(tmp_path):
    folder = tmp_path / ("out.parquet" + PARTS_SUFFIX)
    folder.mkdir()
    (folder / "part-orphan.parquet").write_bytes(b"a failed bundle attempt's part")
    dest = str(tmp_path / "out.parquet")
    join_parquet_parts([], dest, SCHEMA)
    assert pq.read_table(dest).num_rows == 0 and pq.read_schema(dest).names == ["i", "s"]
    assert not folder.exists()


def test_join_with_one_part_renames_it(tmp_path):
    folder = tmp_path / ("d.jsonl" + PARTS_SUFFIX)
    folder.mkdir()
    (folder / "part-00000-of-00001.jsonl").write_text('{"a": 1}\n')
    dest = tmp_path / "d.jsonl"
    join_text_parts([str(folder / "part-00000-of-00001.jsonl")], str(dest))
    assert dest.read_text() == '{"a": 1}\n' and not folder.exists()


def test_join_text_parts_concatenates_and_a_missing_part_without_output_fails(tmp_path):
    folder = tmp_path / ("d.jsonl" + PARTS_SUFFIX)
    folder.mkdir()
    parts = []
    for j in range(3):
        f = folder / f"part-{j:05d}-of-00003.jsonl"
        f.write_text("".join(json.dumps({"j": j, "k": k}) + "\n" for k in range(2)))
        parts.append(str(f))
    os.remove(parts[1])
    with pytest.raises(OSError, match="missing"):
        join_text_parts(parts, str(tmp_path / "d.jsonl"))
    assert not (tmp_path / "d.jsonl").exists()


@pytest.mark.parametrize("args", [[], MULTI], ids=["direct", "multiprocess"])
def test_writes_make_one_file_with_every_row_and_leave_no_parts(tmp_path, args):
    pq_path, js_path = str(tmp_path / "r.parquet"), str(tmp_path / "d.jsonl")
    with beam.Pipeline(argv=args) as p:
        tables = p | beam.Create(range(8)) | "Make" >> beam.Map(_batch)
        _ = tables | WriteParquetFile(pq_path, SCHEMA)
        _ = (tables | beam.FlatMap(lambda t: [{"i": i} for i in t.column("i").to_pylist()])
             | WriteJsonLines(js_path))
    assert sorted(os.listdir(tmp_path)) == ["d.jsonl", "r.parquet"]
    t = pq.read_table(pq_path)
    assert t.schema.metadata == {b"k": b"v"}
    assert sorted(t.column("i").to_pylist()) == list(range(800))
    with open(js_path) as fh:
        assert sorted(json.loads(line)["i"] for line in fh) == list(range(800))


def test_empty_writes_still_make_a_readable_file(tmp_path):
    pq_path, js_path = str(tmp_path / "r.parquet"), str(tmp_path / "d.jsonl")
    with beam.Pipeline() as p:
        empty = p | beam.Create([]).with_output_types(pa.Table)
        _ = empty | WriteParquetFile(pq_path, SCHEMA)
        _ = empty | "NoDicts" >> beam.Map(dict) | WriteJsonLines(js_path)
    assert pq.read_table(pq_path).num_rows == 0 and pq.read_schema(pq_path).names == ["i", "s"]
    assert open(js_path).read() == ""


@pytest.mark.parametrize("args", [[], MULTI], ids=["direct", "multiprocess"])
def test_collect_commits_one_reports_file_with_reconciling_counts(tmp_path, args):
    rng = np.random.default_rng(3)
    n = 6000
    x = rng.uniform(0, 100, n)
    x[::50] = 1000.0  # out of range: dead letters, 120 of them
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": x, "region": rng.choice(["n", "s"], n)}), src,
                   row_group_size=500)
    out = tmp_path / "out"
    rep = str(out / "reports.parquet")
    mech = build_mechanism("bisample-md", epsilon=1.0, lower=0.0, upper=100.0)
    man = run_collect(str(src), rep, mech, {"value": "x"}, keep=("region",),
                      public=("region",), seed=4, batch_rows=400, beam_args=args,
                      dead_letter_columns="all")
    assert sorted(os.listdir(out)) == ["reports.parquet", "reports.parquet.deadletter.jsonl",
                                       "reports.parquet.manifest.json"]
    assert not glob.glob(str(out / "**" / ("*" + PARTS_SUFFIX)), recursive=True)
    assert not glob.glob(str(out / (STAGING_PREFIX + "*")))
    r = man["records"]
    assert (r["input"], r["reported"], r["dead_lettered"], r["reconciles"]) == \
        (n, n - 120, 120, True)
    meta = pq.ParquetFile(rep).metadata
    assert meta.num_rows == n - 120
    # encoded as before (Beam's sink): dictionary pages, so a report code takes a few bits
    assert "RLE_DICTIONARY" in meta.row_group(0).column(0).encodings
    with open(rep + ".deadletter.jsonl") as fh:
        assert sum(1 for _ in fh) == 120
    assert verify(rep + ".manifest.json") == []


def test_a_run_whose_tally_line_is_lost_fails_rather_than_reconciling_as_zeros(tmp_path):
    # before this, a runner that dropped the tally's one line (Beam's Dask runner drops what a
    # bundle emits when it finishes) made every count 0, and 0 = 0 + 0 "reconciled"
    from ldp_beam.pipelines.run import read_tally  # the lifecycle of every run (issue 25)
    from ldp_beam.pipelines.outputs import RunFailed, RunOutputs

    with RunOutputs({"reports": str(tmp_path / "r.parquet")}, str(tmp_path / "r.manifest.json"),
                    "run1") as outs:
        path = outs.scratch("tally.jsonl")
        outs.write(path, b"")
        with pytest.raises(RunFailed, match="0 tally lines"):
            read_tally(outs, path)
        outs.write(path, b'{"read": 3, "accepted": 3}\n')
        assert read_tally(outs, path) == {"read": 3, "accepted": 3}
