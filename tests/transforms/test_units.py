"""BoundContributions (issue 14): each privacy unit keeps at most L0 partitions x Linf rows,
chosen uniformly by keyed priorities; the same rows on every runner and retry for one run key,
other rows for another; rows without a unit dead-lettered; every dropped row counted."""
from __future__ import annotations

import pickle

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy.stats import chi2

from ldp_beam.errors import ParameterError

from ldp_beam.pipelines.common import run_pipeline
from ldp_beam.rng import RunKey
from ldp_beam.transforms import ReadTable
from ldp_beam.transforms.units import BoundContributions
from ldp_beam_test_helpers import bounded_run

MULTI = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def _units_table(path, units=4000, rows=5, seed=0):
    uid = np.repeat(np.arange(units), rows)
    order = np.random.default_rng(seed).permutation(uid.size)
    pq.write_table(pa.table({"uid": uid[order], "x": np.arange(uid.size)}), path)
    return uid[order]


def test_each_unit_keeps_one_row_chosen_uniformly(tmp_path):
    uid = _units_table(tmp_path / "t.parquet")
    pairs, dead, dropped = bounded_run(tmp_path / "t.parquet", RunKey.new(), tmp_path)
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

    pairs, _, dropped = bounded_run(tmp_path / "t.parquet", RunKey.new(), tmp_path, l0=2,
                                    linf=3, partition_fn=partition_fn)
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
    a = bounded_run(tmp_path / "t.parquet", key, tmp_path / "a")[0]
    b = bounded_run(tmp_path / "t.parquet", key, tmp_path / "b", args=MULTI)[0]
    c = bounded_run(tmp_path / "t.parquet", key, tmp_path / "c", batch_rows=333)[0]
    d = bounded_run(tmp_path / "t.parquet", RunKey.new(), tmp_path / "d")[0]
    assert a == b == c
    assert len(set(a) & set(d)) < 0.4 * len(a)  # another run key: another uniform choice


def test_rows_without_a_unit_are_dead_lettered_and_counted(tmp_path):
    pq.write_table(pa.table({"uid": ["u1", None, "", "u1", "u2"], "x": [1, 2, 3, 4, 5]}),
                   tmp_path / "t.parquet")
    pairs, dead, dropped = bounded_run(tmp_path / "t.parquet", RunKey.new(), tmp_path)
    assert len(pairs) == 2 and len(dead) == 2 and dropped == 1
    assert all("uid" in d["reason"] for d in dead)


def _oracle(u, prio, s, rid):
    """One row per unit by sorting (the general path's reduce_candidates): (unit, stream, rid)."""
    from ldp_beam.bounding import reduce_candidates

    c, units = reduce_candidates({"u": u, "rh": prio, "s": s, "rid": rid}, 1, 1, False)
    return units, sorted(zip(c["u"].tolist(), c["s"].tolist(), c["rid"].tolist()))


def test_one_row_table_matches_the_sorting_sketch_in_any_batches_with_ties(monkeypatch):
    """The hash-table sketch (Linf = 1) keeps exactly the rows the sorting sketch keeps, whatever
    the batches and merges, including rows of one unit with equal priorities (drawn from 4
    values here, so most units have ties) and the largest priority (the empty-slot value)."""
    from ldp_beam import minsketch
    from ldp_beam.minsketch import _MinSketch

    rng = np.random.default_rng(5)
    n = 60_000
    u = rng.integers(1, 2**63, 9000, dtype=np.uint64)[rng.integers(0, 9000, n)] | np.uint64(1)
    u[:5000] = (np.arange(5000, dtype=np.uint64) << np.uint64(40)) | np.uint64(1)  # top bits
    prio = rng.integers(0, 4, n).astype(np.uint64)
    prio[rng.random(n) < 0.01] = np.uint64(2**64 - 1)
    s = rng.integers(0, 3, n).astype(np.uint64)
    rid = rng.permutation(n).astype(np.int64)
    want = _oracle(u, prio, s, rid)
    for trial in range(4):
        if trial == 3:  # small queues: rows reach the tables in many small inserts
            monkeypatch.setattr(minsketch, "_FLUSH", 64)
        cuts = np.sort(rng.integers(0, n, 12 + 40 * trial))
        parts = [_MinSketch(), _MinSketch()]
        for j, (a, b) in enumerate(zip(np.r_[0, cuts], np.r_[cuts, n])):
            parts[j % 2].add(u[a:b], prio[a:b], s[a:b], rid[a:b])
        sketch = pickle.loads(pickle.dumps(parts[0]))
        sketch.merge(parts[1])
        k = sketch.kept()
        got = sorted(zip(k["u"].tolist(), k["s"].tolist(), k["rid"].tolist()))
        assert (sketch.units, got) == want


def test_too_many_units_fail_naming_the_column(tmp_path):
    from ldp_beam.bounding import UnitLimitError

    _units_table(tmp_path / "t.parquet", units=300, rows=2)
    def build(p):
        b = p | BoundContributions("uid", RunKey.new(), max_units=100,
                                   source=ReadTable(str(tmp_path / "t.parquet")))
        return [b.batches | beam.Map(lambda x: None)]

    with pytest.raises(Exception) as e:
        run_pipeline(build, [])
    err = e.value
    while not isinstance(err, UnitLimitError) and (err.__cause__ or err.__context__):
        err = err.__cause__ or err.__context__
    text = str(err)
    assert "'uid'" in text and "300" in text and "100" in text, text[:500]


def test_integer_units_are_one_unit_whatever_their_type():
    from ldp_beam.bounding import hash_units

    ik, tk = b"i" * 16, (1, 2)
    h = [hash_units(tk, ik, a)[0] for a in (pa.array([42]), pa.array(["42"]), pa.array([42.0]),
                                           pa.array([42], pa.uint64()))]
    assert len(set(h)) == 1 and h[0] & np.uint64(1)
    others = hash_units(tk, ik, pa.array(["042", "+42", "43", "x"]))
    assert len(set(others.tolist()) | {int(h[0])}) == 5
    assert hash_units(tk, b"j" * 16, pa.array([42]))[0] != h[0]  # keyed
    # whole floats Arrow writes in exponent form ("1e+10") or signed ("-0") are their integer
    # too: a person whose ids are float in one file and integer in another is one unit
    big = [10_000_000_007, 10 ** 15, 0, -(10 ** 12)]
    as_int = hash_units(tk, ik, pa.array(big, pa.int64()))
    assert (hash_units(tk, ik, pa.array([float(x) for x in big[:2]] + [-0.0, -1e12]))
            == as_int).all()
    assert (hash_units(tk, ik, pa.array([str(x) for x in big])) == as_int).all()
    # a float that is not whole stays its text, as in a CSV file
    assert hash_units(tk, ik, pa.array([1.5]))[0] == hash_units(tk, ik, pa.array(["1.5"]))[0]


def test_read_table_projection_keeps_rows_and_identities(tmp_path):
    pq.write_table(pa.table({"uid": np.arange(1000) % 7, "x": np.arange(1000.0)}),
                   tmp_path / "t.parquet", row_group_size=300)
    whole = ReadTable(str(tmp_path / "t.parquet"), batch_rows=128)
    proj = whole.with_columns(["uid", "nope"])
    assert whole.fn.columns is None and proj.fn.columns == ("uid", "nope")
    a = sorted((b.offset, b.table.column("uid").to_pylist(), b.table.schema.names)
               for b in _batches_of(whole))
    b = sorted((b.offset, b.table.column("uid").to_pylist(), b.table.schema.names)
               for b in _batches_of(proj))
    assert [x[:2] for x in a] == [x[:2] for x in b] and sum(len(x[1]) for x in b) == 1000
    assert {tuple(x[2]) for x in a} == {("uid", "x")} and {tuple(x[2]) for x in b} == {("uid",)}
    with pytest.raises(ParameterError, match="columns"):
        ReadTable(str(tmp_path / "t.parquet"), columns="uid")


def _batches_of(read):
    out = []
    for unit in read.units:
        out += [x for x in read.fn.process(unit) if hasattr(x, "offset")]
    return out
