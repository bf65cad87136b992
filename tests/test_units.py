"""BoundContributions (issue 14): each privacy unit keeps at most L0 partitions x Linf rows,
chosen uniformly by keyed priorities; the same rows on every runner and retry for one run key,
other rows for another; rows without a unit dead-lettered; every dropped row counted."""
from __future__ import annotations

import json
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.stats import chi2

from ldp_beam.pipelines.common import run_pipeline
from ldp_beam.rng import RunKey
from ldp_beam.transforms import ReadTable
from ldp_beam.transforms.units import BoundContributions

MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def _kept(path, run_key, out_dir, l0=1, linf=1, partition_fn=None, args=(), batch_rows=5000):
    """Run the bounding; returns (kept record ids as (stream, id) pairs, dead letters, dropped)."""
    kept, dead, dropped = (os.path.join(out_dir, n) for n in ("kept", "dead", "dropped"))

    def ids(b):
        return json.dumps([[int(b.stream), int(i)] for i in b.record_ids()])

    def build(p):
        b = p | BoundContributions("uid", run_key, l0, linf, partition_fn,
                                   source=ReadTable(str(path), batch_rows=batch_rows))
        return [b.batches | "Ids" >> beam.Map(ids)
                | "WK" >> beam.io.WriteToText(kept, shard_name_template=""),
                b.dead_letter | "DJ" >> beam.Map(json.dumps, default=str)
                | "WD" >> beam.io.WriteToText(dead, shard_name_template=""),
                b.dropped | "Sum" >> beam.Map(lambda d: d["bounded_out"])
                | "Total" >> beam.CombineGlobally(sum)
                | "WB" >> beam.io.WriteToText(dropped, shard_name_template="")]

    run_pipeline(build, list(args))
    pairs = sorted(tuple(x) for line in open(kept) if line.strip() for x in json.loads(line))
    deads = [json.loads(line) for line in open(dead) if line.strip()]
    total = sum(int(line) for line in open(dropped) if line.strip())
    return pairs, deads, total


def _units_table(path, units=4000, rows=5, seed=0):
    uid = np.repeat(np.arange(units), rows)
    order = np.random.default_rng(seed).permutation(uid.size)
    pq.write_table(pa.table({"uid": uid[order], "x": np.arange(uid.size)}), path)
    return uid[order]


def test_each_unit_keeps_one_row_chosen_uniformly(tmp_path):
    uid = _units_table(tmp_path / "t.parquet")
    pairs, dead, dropped = _kept(tmp_path / "t.parquet", RunKey.new(), tmp_path)
    rows = np.array([i for _, i in pairs])
    assert len(rows) == 4000 and dropped == 16000 and not dead
    assert sorted(uid[rows].tolist()) == list(range(4000))  # exactly one row per unit
    # which of its 5 rows (in file order) each unit kept: uniform over 0..4
    rank = np.zeros(uid.size, dtype=int)
    seen: dict = {}
    for i, u in enumerate(uid.tolist()):
        rank[i] = seen.get(u, 0)
        seen[u] = rank[i] + 1
    counts = np.bincount(rank[rows], minlength=5)
    stat = ((counts - 800) ** 2 / 800).sum()
    assert stat < chi2.ppf(1 - 1e-4, 4), counts


def test_rows_per_partition_and_partitions_per_unit(tmp_path):
    n = 3000
    uid = np.repeat(np.arange(100), 30)
    part = np.tile(np.arange(6), 500)  # every unit has rows in all 6 partitions
    pq.write_table(pa.table({"uid": uid, "p": part}), tmp_path / "t.parquet")

    def partition_fn(table):
        return table.column("p").to_numpy().astype(np.int64)

    pairs, _, dropped = _kept(tmp_path / "t.parquet", RunKey.new(), tmp_path, l0=2, linf=3,
                              partition_fn=partition_fn)
    rows = np.array([i for _, i in pairs])
    assert len(rows) + dropped == n
    for u in range(100):
        mine = rows[uid[rows] == u]
        parts, per = np.unique(part[mine], return_counts=True)
        assert len(parts) == 2 and per.tolist() == [3, 3]


def test_same_key_same_rows_on_every_runner_and_batching(tmp_path):
    _units_table(tmp_path / "t.parquet", units=500)
    key = RunKey.new(7)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    (tmp_path / "d").mkdir()
    a = _kept(tmp_path / "t.parquet", key, tmp_path / "a")[0]
    b = _kept(tmp_path / "t.parquet", key, tmp_path / "b", args=MULTI)[0]
    c = _kept(tmp_path / "t.parquet", key, tmp_path / "c", batch_rows=333)[0]
    d = _kept(tmp_path / "t.parquet", RunKey.new(), tmp_path / "d")[0]
    assert a == b == c
    assert len(set(a) & set(d)) < 0.4 * len(a)  # another run key: another uniform choice


def test_rows_without_a_unit_are_dead_lettered_and_counted(tmp_path):
    pq.write_table(pa.table({"uid": ["u1", None, "", "u1", "u2"], "x": [1, 2, 3, 4, 5]}),
                   tmp_path / "t.parquet")
    pairs, dead, dropped = _kept(tmp_path / "t.parquet", RunKey.new(), tmp_path)
    assert len(pairs) == 2 and len(dead) == 2 and dropped == 1
    assert all("uid" in d["reason"] for d in dead)
