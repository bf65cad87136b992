"""Retry-proof noise: every draw is a function of the run's secret key and the record's identity,
so a runner that re-executes a bundle or a stage reproduces the reports exactly (issue 13)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from apache_beam.transforms.window import GlobalWindow

from ldp_beam.registry import build_mechanism
from ldp_beam.rng import RandomSource, RunKey
from ldp_beam.transforms.batches import KeyedBatch
from ldp_beam.transforms.perturb import DeadLetterRecord, PerturbFn


def _mech():
    return build_mechanism("grr", epsilon=1.0, domain=[str(i) for i in range(8)])


def _run(fn: PerturbFn, elements) -> tuple[np.ndarray, list[dict]]:
    """Drive the DoFn as a runner would (setup, bundles, process): reports in element order."""
    fn.setup()
    fn.start_bundle()
    reps, dead = [], []
    outs = [o for e in elements for o in fn.process(e, 0, GlobalWindow())]
    for out in outs + list(fn.finish_bundle() or []):
        out = getattr(out, "value", out)  # single records come back as WindowedValues
        (dead if isinstance(out, DeadLetterRecord) else reps).append(out)
    vals = [r.column(0).to_numpy() if isinstance(r, pa.RecordBatch) else
            np.array([r[next(iter(r))]])
            for r in reps]
    return (np.concatenate(vals) if vals else np.empty(0)), dead


def _table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"value": rng.integers(0, 8, n).astype(str), "region": ["x"] * n})


def test_unseeded_run_key_is_secret_and_fresh():
    a, b = RunKey.new(), RunKey.new()
    assert a.key != b.key and a.run_id != b.run_id and len(a.key) == 32
    assert not a.seeded and a.key.hex() not in repr(a)
    s = RunKey.new(42)
    assert s.seeded and s.key == RunKey.new(42).key  # a seed gives the same key: not private


def test_same_run_key_reproduces_reports_whatever_the_batching():
    """One run (one key): the records of a stream get the same reports however the runner splits
    them into bundles, and a re-executed bundle repeats them exactly."""
    t = _table(5000)
    fn = PerturbFn(_mech())
    whole, _ = _run(fn, [KeyedBatch(7, 0, t)])
    parts = [KeyedBatch(7, off, t.slice(off, 700)) for off in range(0, 5000, 700)]
    split, _ = _run(fn, parts)
    again, _ = _run(fn, parts[::-1])  # a retry, in another order
    np.testing.assert_array_equal(whole, split)
    np.testing.assert_array_equal(np.sort(whole), np.sort(again))
    other, _ = _run(PerturbFn(_mech()), [KeyedBatch(7, 0, t)])  # another run: fresh noise
    # GRR at eps=1 over 8 labels keeps the value w.p. e/(e+7) = 0.28: two independent runs agree
    # on about 0.28^2 + 0.72^2/7 = 0.15 of rows; the same run agrees on all of them.
    agree = float(np.mean(other == whole))
    assert agree < 0.5


def test_bare_batches_are_identified_by_their_content():
    """A batch without a stream (ReadFromParquetBatched, a user's own batches) is keyed by its
    content: re-executing the bundle repeats the reports; another batch gets other noise."""
    fn = PerturbFn(_mech())
    t = _table(4000, seed=1)
    first, _ = _run(fn, [t.to_batches()[0]])
    retry, _ = _run(fn, [pa.Table.from_batches(t.to_batches())])  # same rows, another container
    np.testing.assert_array_equal(first, retry)
    sliced = pa.concat_tables([_table(10, seed=9), t]).slice(10)  # an offset into a buffer
    again, _ = _run(fn, [sliced])
    np.testing.assert_array_equal(first, again)
    t2 = _table(4000, seed=2)
    other, _ = _run(fn, [t2])
    # identical inputs where t and t2 agree would give identical reports if the two batches
    # shared noise; independent noise makes them agree on only part of those rows
    same_in = t.column("value").to_numpy(zero_copy_only=False) == \
        t2.column("value").to_numpy(zero_copy_only=False)
    assert np.mean(first[same_in] == other[same_in]) < 0.6


def test_single_records_need_a_record_id_when_noise_is_drawn():
    fn = PerturbFn(_mech())
    with pytest.raises(ValueError, match="key_column"):
        _run(fn, [{"value": "3"}])
    keyed = PerturbFn(_mech(), key_column="id", keep=("id",))
    a, _ = _run(keyed, [{"value": "3", "id": "r1"}, {"value": "5", "id": "r2"}])
    b, _ = _run(keyed, [{"value": "5", "id": "r2"}, {"value": "3", "id": "r1"}])
    np.testing.assert_array_equal(a, b[::-1])


def test_records_of_a_noiseless_mechanism_need_no_id():
    """Central-DP inputs are only validated and bucketed by Perturb (no draw): no id needed."""
    mech = build_mechanism("laplace-histogram", epsilon=1.0, categories=["a", "b"])
    assert mech.draws == 0
    fn = PerturbFn(mech)
    reps, dead = _run(fn, [{"value": "a"}, {"value": "c"}])
    assert len(reps) == 1 and len(dead) == 1


def test_keep_refuses_the_mechanisms_input():
    with pytest.raises(ValueError, match="input of .*role 'value'"):
        PerturbFn(_mech(), columns={"value": "age"}, keep=("age",))


def test_dead_letters_hold_the_mapped_columns_unless_asked():
    t = pa.table({"value": ["3", "nine"], "user_id": ["u1", "u2"], "salary": [10, 20]})
    _, dead = _run(PerturbFn(_mech()), [KeyedBatch(1, 0, t, "f.parquet")])
    assert [d["record"] for d in dead] == [{"value": "nine"}]
    assert dead[0]["source"] == "f.parquet" and dead[0]["row"] == 1
    _, full = _run(PerturbFn(_mech(), dead_letter_columns="all"), [KeyedBatch(1, 0, t)])
    assert full[0]["record"] == {"value": "nine", "user_id": "u2", "salary": 20}


def test_seeded_reports_say_not_private():
    from ldp_beam.transforms.batches import mechanism_metadata

    fn = PerturbFn(_mech(), seed=5)
    reps, _ = _run(fn, [KeyedBatch(1, 0, _table(10))])
    meta = mechanism_metadata(fn.schema)
    assert meta["seeded"] is True
    assert "seeded" in meta["guarantee"]["summary"] and "not private" in meta["guarantee"]["summary"]
    unseeded = mechanism_metadata(PerturbFn(_mech()).schema)
    assert unseeded["seeded"] is False and "not private" not in unseeded["guarantee"]["summary"]


def test_seeded_run_key_matches_the_core_api():
    """A seeded pipeline gives the core API's reports for the same seed and record keys."""
    mech = _mech()
    t = _table(300)
    beam_side, _ = _run(PerturbFn(mech, seed=11), [KeyedBatch(3, 0, t)])
    cols, _ = mech.check({"value": t.column("value").to_numpy(zero_copy_only=False)})
    u = RandomSource(11).uniforms(300, mech.draws, stream=3, offset=0)
    np.testing.assert_array_equal(mech.randomize(cols, u)["v"], beam_side)


def test_a_subset_of_a_stream_keeps_each_records_noise():
    """After rows are dropped (e.g. bounding a person's contribution), every kept record gets the
    report it would have had in the full stream: identity travels with the row."""
    t = _table(3000, seed=4)
    fn = PerturbFn(_mech())
    full, _ = _run(fn, [KeyedBatch(5, 100, t)])
    full_batch = KeyedBatch(5, 100, t)
    for idx in (np.arange(0, 3000, 3), np.array([0, 1, 2, 2000, 2999]), np.arange(10, 20)):
        sub, _ = _run(fn, [full_batch.subset(idx)])
        np.testing.assert_array_equal(sub, full[idx])
        assert full_batch.subset(idx).record_ids().tolist() == (100 + idx).tolist()


def test_a_stream_records_identity_does_not_depend_on_its_bundle(tmp_path):
    """A stream record's priority and slot (what its unit is charged under) are the same
    whatever else its bundle holds: a float field's 1 is 1.0 whether or not another record of
    the bundle is a float (the column was int64 alone, float64 with 0.5: a restart that bundled
    anew gave the record another slot and charged its unit again)."""
    from apache_beam.transforms.window import IntervalWindow
    from apache_beam.utils.timestamp import Timestamp

    from ldp_beam import build_mechanism, estimator_for
    from ldp_beam.longitudinal import UnitState
    from ldp_beam.transforms.windowed import BatchPerWindowFn, PrivacyUnit

    mech = build_mechanism("pm", epsilon=1.0, lower=-1, upper=1)
    fn = BatchPerWindowFn(mech, estimator_for(mech),
                          unit=PrivacyUnit("device", UnitState(str(tmp_path / "u.db"), "device")))
    window = IntervalWindow(0, 10)

    def candidates(records):
        fn.start_bundle()
        out = [o for i, r in enumerate(records)
               for o in fn.process((r, "f.jsonl", i + 1), Timestamp(1), window)]
        return {u: c for o in out + list(fn.finish_bundle()) for u, (_, c) in
                o.value.units.items()}

    alone = candidates([{"y": 1, "device": "d1"}])
    mixed = candidates([{"y": 1, "device": "d1"}, {"y": 0.5, "device": "d2"}])
    (unit, cands), = alone.items()
    assert [c[:2] for c in mixed[unit]] == [c[:2] for c in cands]
    assert cands[0][4] == (1.0,)
