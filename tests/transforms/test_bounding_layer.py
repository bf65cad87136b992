"""The contribution bounding's layers (issue 25): the algorithm is ldp_beam.bounding, pure (no
Beam), and transforms/units.py is its Beam shell, which keeps exactly the rows the pure functions
select (the keyed unit hashes, the AES row and partition priorities, reduce_candidates)."""
from __future__ import annotations

import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

from ldp_beam.bounding import (aes_prf, hash_units, reduce_candidates, row_priorities,
                               unit_column)
from ldp_beam.rng import RunKey
from ldp_beam.transforms import KeyedBatch
from ldp_beam.transforms.units import BoundContributions

U64 = np.uint64


def test_the_bounding_core_imports_no_beam():
    code = ("import sys, ldp_beam.bounding\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam'\n"
            "             or m.startswith(('ldp_beam.transforms', 'ldp_beam.pipelines'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def _batches(seed: int) -> list[KeyedBatch]:
    """Three batches of two streams (one near 2^64): 60 units with 1-6 rows each, integer and
    text units mixed, a few rows without a unit, partition codes in -1..4 (-1: rejected)."""
    rng = np.random.default_rng(seed)
    out = []
    for stream, offset, n in ((7, 0, 90), (7, 90, 70), (2**64 - 3, 1000, 80)):
        uid = [None if r < 0.05 else (int(v) if v % 2 else f"u{v}")
               for r, v in zip(rng.random(n), rng.integers(0, 60, n))]
        table = pa.table({"uid": pa.array([None if v is None else str(v) for v in uid]),
                          "k": rng.integers(-1, 5, n)})
        out.append(KeyedBatch(stream, offset, table, source=f"s{stream}"))
    return out


def _part(table) -> np.ndarray:
    return np.asarray(table.column("k").to_numpy(), np.int64)


def _pure_selection(batches, key: RunKey, l0: int, linf: int, partitioned: bool) -> list:
    """The rows kept, by the pure functions alone, with the keys the module docstring names."""
    text_key = tuple(int.from_bytes(key.derive("bounding/units")[i:i + 8], "little")
                     for i in (0, 8))
    int_key = key.derive("bounding/units/int")[:16]
    row_key = int.from_bytes(key.derive("bounding/rows")[:16], "big")
    part_key = key.derive("bounding/partitions")[:16]
    cols, through = {f: [] for f in ("u", "rh", "s", "rid", "p")}, []
    for b in batches:
        col, missing = unit_column(b.table.column("uid"), "uid")
        ids = b.record_ids()
        cand = ~missing
        if partitioned:
            p = _part(b.table)
            through += [(b.stream, int(i)) for i in ids[cand & (p < 0)]]  # the mechanism's
            cand &= p >= 0
            cols["p"].append(p[cand].view(U64))
        idx = np.flatnonzero(cand)
        cols["u"].append(hash_units(text_key, int_key, col.take(pa.array(idx))))
        cols["rh"].append(row_priorities(row_key, b.stream, ids[idx]))
        cols["s"].append(np.full(idx.size, b.stream, U64))
        cols["rid"].append(ids[idx])
    c = {f: np.concatenate(v) for f, v in cols.items() if v}
    if partitioned:
        c["pp"] = aes_prf(part_key, c["u"], c["p"])
    kept, _ = reduce_candidates(c, l0, linf, partitioned)
    return sorted(through + list(zip(kept["s"].tolist(), kept["rid"].tolist())))


@pytest.mark.parametrize("l0, linf, partitioned", [(1, 1, False), (1, 2, False), (2, 1, True)])
def test_the_beam_shell_keeps_the_rows_the_pure_functions_select(l0, linf, partitioned):
    """One row per unit (the hash-table sketch), two (the sorting sketch) and two partitions per
    unit: the same (stream, record) pairs, and every other row with a unit is counted out."""
    batches, key = _batches(3), RunKey.new(11)
    want = _pure_selection(batches, key, l0, linf, partitioned)
    with_unit = sum(int((~unit_column(b.table.column("uid"), "uid")[1]).sum()) for b in batches)
    assert 0 < len(want) < with_unit  # the bound bites

    with beam.Pipeline() as p:
        b = (p | beam.Create(batches)
             | BoundContributions("uid", key, l0, linf, _part if partitioned else None))
        pairs = b.batches | beam.FlatMap(lambda x: [(x.stream, int(i)) for i in x.record_ids()])
        assert_that(pairs, equal_to(want), label="kept")
        out = b.dropped | "Out" >> beam.Map(lambda d: d["bounded_out"]) \
            | "Sum" >> beam.CombineGlobally(sum)
        assert_that(out, equal_to([with_unit - len(want)]), label="bounded_out")
