"""OSPDPRR's and OsdpRR's row accumulators (issue 16): rows appended with amortized growth (never a
copy of every row per batch), merged with one copy, forks of one accumulator independent, and
the rows held capped by LDP_BEAM_MAX_USER_CELLS with a clear LimitError."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ldp_beam.central.ospdprr import OSPDPRR, OSPDPRREstimator, OsdpRR, OsdpRREstimator
from ldp_beam.errors import LimitError

U = {"lower": 0.0, "upper": 100.0}


def _reports(mech, n, seed):
    g = np.random.default_rng(seed)
    rep = {f"value{i}": g.uniform(0, 100, n) for i in mech.target}
    rep.update({f"weight{i}": g.uniform(0, 1, n) for i in range(1, mech.k + 1)})
    return rep


def _rows(rep, est):
    return np.column_stack([rep[name] for name, _ in est.fields])


def test_batches_are_appended_with_amortized_growth():
    """2,000 batches of 3 rows: the rows are right, and the accumulator moved to a new buffer
    only O(log n) times (growth by 1.5: at most log_1.5(6000) + 1 = 23 buffers), where the old
    code allocated (and copied every row into) a new array for each of the 2,000 batches."""
    mech = OSPDPRR(t=0.5, k=2, **U)
    est = OSPDPRREstimator(mech, seed=3)
    rep = _reports(mech, 6000, 1)
    acc = est.create()
    buffers = set()
    for s in range(0, 6000, 3):
        acc = est.add(acc, {k: v[s:s + 3] for k, v in rep.items()})
        buffers.add(id(acc.base))
    np.testing.assert_array_equal(acc, _rows(rep, est))
    assert len(buffers) <= math.floor(math.log(6000, 1.5)) + 1
    one = est.add(est.create(), rep)
    assert est.finalize(acc).to_dict() == est.finalize(one).to_dict()


def test_forks_of_one_accumulator_do_not_share_appended_rows():
    """Beam may add to an accumulator and keep the old one: appending into spare capacity is
    only allowed to the newest view, so every accumulator keeps exactly its own rows."""
    mech = OsdpRR(epsilon=0.5, k=1, **U)
    est = OsdpRREstimator(mech)
    a, b, c = ({"value1": np.full(n, v), "sensitive1": np.zeros(n)} for n, v in
               ((4, 1.0), (3, 2.0), (5, 3.0)))
    base = est.add(est.create(), a)
    left = est.add(base, b)       # appended into base's spare room
    right = est.add(base, c)      # base is no longer the newest view: a new buffer
    again = est.add(left, c)
    assert base.shape[0] == 4 and np.all(base[:, 0] == 1.0)
    assert left[:, 0].tolist() == [1.0] * 4 + [2.0] * 3
    assert right[:, 0].tolist() == [1.0] * 4 + [3.0] * 5
    assert again[:, 0].tolist() == [1.0] * 4 + [2.0] * 3 + [3.0] * 5
    merged = est.merge([left, right, est.create(), base])
    assert merged[:, 0].tolist() == ([1.0] * 4 + [2.0] * 3) + ([1.0] * 4 + [3.0] * 5) + [1.0] * 4
    assert left[:, 0].tolist() == [1.0] * 4 + [2.0] * 3  # merge left its inputs as they were
    assert est.add(left, {"value1": np.zeros(0), "sensitive1": np.zeros(0)}) is left


def test_merge_copies_each_row_once_into_one_buffer():
    mech = OSPDPRR(t=0.5, k=1, **U)
    est = OSPDPRREstimator(mech)
    parts = [est.add(est.create(), _reports(mech, n, n)) for n in (300, 7, 50, 1)]
    merged = est.merge(parts)  # 58 rows fit in the room after the first one's 300 (of 450)
    np.testing.assert_array_equal(merged, np.concatenate(parts))
    assert merged.base is parts[0].base
    small_first = est.merge([parts[3], parts[0], parts[1]])  # no room: one new buffer
    np.testing.assert_array_equal(small_first, np.concatenate([parts[3], parts[0], parts[1]]))
    assert all(small_first.base is not p.base for p in parts)
    np.testing.assert_array_equal(parts[0], np.concatenate(parts)[:300])  # inputs unchanged
    assert est.merge([parts[2]]) is parts[2]  # one accumulator: nothing to copy


@pytest.mark.parametrize("kind", ["ospdprr", "osdp"])
def test_rows_held_are_capped_with_a_clear_error(monkeypatch, kind):
    """users x row width <= LDP_BEAM_MAX_USER_CELLS, checked before the rows are stored."""
    if kind == "ospdprr":
        mech = OSPDPRR(t=0.5, k=3, target=(1,), **U)
        est = OSPDPRREstimator(mech)
    else:
        mech = OsdpRR(epsilon=0.5, k=2, **U)
        est = OsdpRREstimator(mech)
    width = est.width  # 1 + 3 cells, or 2 x 2
    assert width == 4
    monkeypatch.setenv("LDP_BEAM_MAX_USER_CELLS", str(10 * width))
    rep = {name: np.zeros(6) for name, _ in est.fields}
    acc = est.add(est.create(), rep)  # 6 users: within the cap of 10
    with pytest.raises(LimitError, match="LDP_BEAM_MAX_USER_CELLS") as info:
        est.add(acc, rep)  # 12 users
    assert "12 rows" in str(info.value)
    with pytest.raises(LimitError, match="user_cells|LDP_BEAM_MAX_USER_CELLS"):
        est.merge([acc, acc])
    monkeypatch.setenv("LDP_BEAM_MAX_USER_CELLS", str(12 * width))  # exactly at the cap: fine
    assert est.n_reports(est.merge([acc, acc])) == 12
