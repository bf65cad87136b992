"""Per-key central releases (issue 14): `estimate --by KEY` with a privacy unit, keys either
public (--keys) or chosen by private partition selection; each unit bounded to L0 keys."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ldp_beam_test_helpers import run_cli

HIST = ("-m", "laplace-histogram", "--epsilon", "1", "-p", "categories=a,b,c")


def _table(path):
    uid = np.repeat(np.arange(3000), 10)
    v = np.random.default_rng(1).choice(list("abc"), uid.size)
    region = np.where(uid < 2000, "north", "south").astype(object)
    region[uid == 2999] = "solo"  # a key held by one person only
    pq.write_table(pa.table({"uid": uid.astype(str), "v": v, "region": region}), path)


def test_private_partition_selection_hides_a_one_person_key(tmp_path):
    _table(tmp_path / "t.parquet")
    code, so, se = run_cli("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v", *HIST,
                           "--privacy-unit", "uid", "--by", "region",
                           "--partition-selection", "1,1e-6", "-o", str(tmp_path / "h.json"))
    assert code == 0, se
    out = json.loads((tmp_path / "h.json").read_text())
    # the one-person key is released with probability <= delta = 1e-6; the others (2000 and
    # 999 people, thresholds ~15) with probability 1 - O(e^-900)
    assert sorted(out["estimates"]) == ["north", "south"]
    g = out["guarantee"]
    assert g["epsilon"] == 2.0 and g["delta"] == 1e-6 and "per privacy unit 'uid'" in g["summary"]
    cur = json.loads((tmp_path / "h.json.curator.json").read_text())["records"]
    assert cur["released_from"] == 3000 and cur["bounded_out"] == 27000 and cur["reconciles"]
    hist = out["estimates"]["north"]["statistics"]["histogram"]["value"]
    assert abs(sum(hist) - 2000) < 40  # one row per person; noise of scale 1 per bucket


def test_public_keys_release_every_listed_key(tmp_path):
    _table(tmp_path / "t.parquet")
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v", *HIST,
                          "--privacy-unit", "uid", "--by", "region", "--keys", "north,east",
                          "-o", str(tmp_path / "h.json"))
    assert code == 0, se
    out = json.loads((tmp_path / "h.json").read_text())
    assert sorted(out["estimates"]) == ["east", "north"]  # east absent: a noisy empty histogram
    assert abs(sum(out["estimates"]["east"]["statistics"]["histogram"]["value"])) < 40
    assert out["guarantee"]["epsilon"] == 1.0 and out["guarantee"]["delta"] == 0.0


def test_per_key_release_needs_a_unit_and_one_way_to_choose_keys(tmp_path):
    _table(tmp_path / "t.parquet")
    base = ("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v", *HIST, "--by", "region",
            "-o", str(tmp_path / "h.json"))
    code, _, se = run_cli(*base, "--keys", "north")
    assert code == 2 and "--privacy-unit" in se
    code, _, se = run_cli(*base, "--privacy-unit", "uid")
    assert code == 2 and "--keys" in se and "--partition-selection" in se
    code, _, se = run_cli(*base, "--privacy-unit", "uid", "--partition-selection", "1")
    assert code == 2 and "EPSILON,DELTA" in se
    assert not (tmp_path / "h.json").exists()


def test_a_release_without_contribution_bounds_is_refused_per_key(tmp_path):
    """A plugin's central release need not declare contribution bounds; per key it must (the
    noise of every key is calibrated to a unit's L0 x Linf rows), so it is refused by name
    before anything runs instead of failing on a missing attribute."""
    from dataclasses import dataclass

    import pytest

    from ldp_beam.central.histogram import IdentityLaplace
    from ldp_beam.pipelines.estimate import run_release

    @dataclass(frozen=True)
    class Unbounded(IdentityLaplace):
        contribution_bounds = None

    _table(tmp_path / "t.parquet")
    mech = Unbounded(epsilon=1.0, categories=("a", "b", "c"))
    with pytest.raises(ValueError, match="declares no contribution_bounds"):
        run_release(str(tmp_path / "t.parquet"), str(tmp_path / "h.json"), mech, {"value": "v"},
                    by="region", unit="uid", keys=["north"],
                    ledger=f"sqlite://{tmp_path / 'l.db'}")
    assert not (tmp_path / "h.json").exists()


def test_rows_with_a_null_key_are_bounded_like_any_other_key(tmp_path):
    """A null key is the key "" for bounding as for the release: a unit keeps at most L0 = 1
    key and Linf = 1 row, its null-key rows included (they once bypassed the bound: a negative
    partition code, kept as if the mechanism would reject the row, which it does not)."""
    uid = np.repeat(np.arange(1000), 10).astype(str)
    region = np.tile(np.array(["north"] * 5 + [None] * 5, dtype=object), 1000)
    v = np.random.default_rng(2).choice(list("abc"), uid.size)
    pq.write_table(pa.table({"uid": uid, "v": v, "region": region}), tmp_path / "t.parquet")
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v", *HIST,
                          "--privacy-unit", "uid", "--by", "region",
                          "--partition-selection", "1,1e-6", "-o", str(tmp_path / "h.json"))
    assert code == 0, se
    cur = json.loads((tmp_path / "h.json.curator.json").read_text())["records"]
    assert cur["released_from"] == 1000 and cur["bounded_out"] == 9000 and cur["reconciles"]


def test_an_integer_key_is_one_key_in_batches_with_and_without_nulls(tmp_path):
    """An integer key column with a null in some row groups only: the key 1 is "1" in every
    batch (pandas would make it 1.0 where the batch holds a null, another group, and with
    public keys "1,2" its rows there were never released)."""
    n = 4000
    key = pa.array([None if i % 400 == 7 else 1 + i % 2 for i in range(n)], pa.int64())
    v = np.random.default_rng(3).choice(list("abc"), n)
    pq.write_table(pa.table({"uid": np.arange(n).astype(str), "v": v, "k": key}),
                   tmp_path / "t.parquet", row_group_size=800)  # nulls in some row groups
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v", *HIST,
                          "--privacy-unit", "uid", "--by", "k", "--keys", "1,2",
                          "-o", str(tmp_path / "h.json"))
    assert code == 0, se
    out = json.loads((tmp_path / "h.json").read_text())
    assert sorted(out["estimates"]) == ["1", "2"]
    ones = sum(1 for i in range(n) if i % 400 != 7 and i % 2 == 0)
    # one row per unit, all kept: 3 buckets of Laplace noise of scale 1 (sd sqrt(6) ~ 2.4 for
    # the total); 20 is over 8 standard deviations
    assert abs(sum(out["estimates"]["1"]["statistics"]["histogram"]["value"]) - ones) < 20


def test_rows_of_unlisted_keys_spend_no_key_slot_and_are_counted(tmp_path):
    """--keys north: a unit's rows in "south" are never released, so they must not take its
    one key slot (L0 = 1): every unit keeps a north row (about half did when south competed
    for the slot); the south rows are counted for the curator, not silently dropped."""
    uid = np.repeat(np.arange(1000), 10).astype(str)
    region = np.tile(np.array(["north"] * 5 + ["south"] * 5, dtype=object), 1000)
    v = np.random.default_rng(4).choice(list("abc"), uid.size)
    pq.write_table(pa.table({"uid": uid, "v": v, "region": region}), tmp_path / "t.parquet")
    code, so, se = run_cli("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v", *HIST,
                           "--privacy-unit", "uid", "--by", "region", "--keys", "north",
                           "-o", str(tmp_path / "h.json"))
    assert code == 0, se
    assert ("10,000 read = 1,000 bucketed + 0 dead-lettered + 4,000 left out by the per-unit "
            "bound + 5,000 of keys not in --keys") in so
    out = json.loads((tmp_path / "h.json").read_text())
    # 1000 rows, one per unit; Laplace noise of scale 1 on 3 buckets (sd ~2.4 for the total)
    assert abs(sum(out["estimates"]["north"]["statistics"]["histogram"]["value"]) - 1000) < 20
    cur = json.loads((tmp_path / "h.json.curator.json").read_text())["records"]
    assert cur["released_from"] == 1000 and cur["not_in_keys"] == 5000
    assert cur["bounded_out"] == 4000 and cur["input"] == 10000 and cur["reconciles"]


def test_key_codes_are_keyed_by_the_run():
    from ldp_beam.pipelines.estimate import _KeyCodes

    t = pa.table({"k": ["a", "b", None]})
    one, two = _KeyCodes("k", b"1" * 32)(t), _KeyCodes("k", b"2" * 32)(t)
    assert (one >= 0).all() and (two >= 0).all() and len(set(one) & set(two)) == 0
    assert _KeyCodes("k", b"1" * 32, public=["a"])(t).tolist()[1:] == [-1, -1]
