"""OSPDPRR's row accumulators (the data-reference modes; issue 16): rows appended with amortized
growth (never a copy of every row per batch), merged with one copy, forks of one accumulator
independent, and the rows held capped by LDP_BEAM_MAX_USER_CELLS with a clear LimitError."""
from __future__ import annotations

import math

import numpy as np
import pytest

from ldp_beam.central.ospdprr import OSPDPRR, OSPDPRREstimator
from ldp_beam import progress
from ldp_beam.errors import LimitError

U = {"lower": 0.0, "upper": 100.0}
PUBLIC = {"mode": "sound-public"}  # a data-reference mode: the estimator holds one row per user


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
    mech = OSPDPRR(t=0.5, k=2, **PUBLIC, **U)
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
    mech = OSPDPRR(t=0.5, k=1, **PUBLIC, **U)
    est = OSPDPRREstimator(mech)
    a, b, c = ({"value1": np.full(n, v), "weight1": np.zeros(n)} for n, v in
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
    assert est.add(left, {"value1": np.zeros(0), "weight1": np.zeros(0)}) is left


def test_merge_copies_each_row_once_into_one_buffer():
    mech = OSPDPRR(t=0.5, k=1, **PUBLIC, **U)
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


@pytest.mark.parametrize("mode", ["sound-public", "paper"])
def test_rows_held_are_capped_with_a_clear_error(monkeypatch, mode):
    """users x row width <= LDP_BEAM_MAX_USER_CELLS, checked before the rows are stored (the
    data-reference modes; OsdpRR and sound-self hold no rows: tests/core/test_osdprr_onepass.py,
    tests/core/test_ospdprr_onepass.py)."""
    if mode == "sound-public":
        mech = OSPDPRR(t=0.5, k=3, target=(1,), mode=mode, **U)
    else:
        mech = OSPDPRR(t=0.5, k=2, mode=mode, **U)
    est = OSPDPRREstimator(mech)
    width = est.width  # 1 + 3 cells, or 2 + 2
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


def _lexsorted(acc):
    """The reference: every column's lexicographic order (the former implementation)."""
    return np.ascontiguousarray(acc[np.lexsort(acc.T[::-1])])


def test_canonical_order_is_the_lexicographic_order_of_the_rows():
    g = np.random.default_rng(11)
    est = OSPDPRREstimator(OSPDPRR(t=0.5, k=3, **PUBLIC, **U))
    for trial in range(60):
        n, w = int(g.integers(0, 300)), int(g.integers(1, 5))
        if trial % 3 == 0:  # continuous: no ties
            acc = g.uniform(0, 1, (n, w))
        elif trial % 3 == 1:  # few values: long runs of ties in every column
            acc = g.integers(0, 3, (n, w)).astype(float)
        else:
            acc = np.where(g.random((n, w)) < 0.5, g.integers(0, 2, (n, w)).astype(float),
                           g.uniform(0, 1, (n, w)))
        got = est.canonical(acc)
        np.testing.assert_array_equal(got, _lexsorted(acc))
        assert got.tobytes() == est.canonical(acc[g.permutation(n)]).tobytes()


def test_negative_zero_does_not_make_the_release_depend_on_row_order():
    """-0.0 equals 0.0, so a sort may put either first; the canonical rows write it as 0.0, and
    a seeded release is the same for any order of the rows."""
    mech = OSPDPRR(t=0.5, k=1, lower=-1.0, upper=1.0, query="sum", **PUBLIC)
    est = OSPDPRREstimator(mech, seed=9)
    rows = np.array([[0.0, 0.5], [-0.0, 0.5], [0.25, 0.5], [-0.0, 0.5]])
    canon = est.canonical(rows)
    assert not np.signbit(canon).any()
    first = est.finalize(rows).to_dict()
    for order in ([1, 0, 2, 3], [3, 2, 1, 0], [0, 3, 1, 2]):
        assert est.canonical(rows[order]).tobytes() == canon.tobytes()
        assert est.finalize(rows[order]).to_dict() == first


def test_the_cap_inside_a_release_is_a_configuration_error(tmp_path, monkeypatch, capsys):
    """Hit while the pipeline runs, the cap's LimitError reaches the command line as itself:
    exit status 2 and its message naming the variable (not a runner traceback)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ldp_beam.pipelines.cli import main

    path = str(tmp_path / "users.parquet")
    g = np.random.default_rng(5)
    pq.write_table(pa.table({"income": g.uniform(0, 250, 500), "lv": g.uniform(0, 1, 500)}),
                   path)
    monkeypatch.setenv("LDP_BEAM_MAX_USER_CELLS", "600")  # 300 users of 2 cells

    def release(mode, out):
        before = progress.configure()
        try:
            return main(["estimate", "-i", path, "-m", "ospdprr", "-p", "t=0.8", "-p", "k=1",
                         "-p", f"mode={mode}", "-p", "lower=0", "-p", "upper=250",
                         "--role", "value1=income", "--role", "level1=lv", "-o", out,
                         "--quiet", "--ledger", str(tmp_path / "ledger")])
        finally:
            progress.restore(before)  # --quiet set it for the rest of this process

    code = release("sound-public", str(tmp_path / "r.json"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "ldp-beam estimate: error:" in err and "LDP_BEAM_MAX_USER_CELLS" in err, err
    assert not (tmp_path / "r.json").exists()
    # sound-self holds no rows (one pass, four integers): the same 500 users under the same cap
    assert release("sound-self", str(tmp_path / "s.json")) == 0, capsys.readouterr().err
    assert (tmp_path / "s.json").exists()


def _release_config():
    for mode, norm, paper_m in (("sound-self", None, None), ("sound-public", "vector", None),
                                ("sound-public", "minmax", None), ("paper", "vector", "raw"),
                                ("paper", "minmax", "rescaled")):
        for query in ("count", "sum", "mean", "variance", "cv"):
            for k, target in ((1, ()), (3, (2,)), (5, (1, 4, 5))):
                yield dict(mode=mode, norm=norm, paper_m=paper_m, query=query, k=k,
                           target=target)


def test_lean_release_is_the_release_bit_for_bit(monkeypatch):
    """finalize's release in chunks of users (diagnostics=False) gives the same statistics as
    the release on arrays of every user: every mode, norm, query; chunks of 7 rows, so that
    the references, A/B, the uniforms and the sums all cross chunk boundaries; empty, one user,
    nobody sampled, equal scores (A = B)."""
    from ldp_beam.rng import RandomSource

    monkeypatch.setattr(OSPDPRR, "CHUNK_ROWS", 7)
    g = np.random.default_rng(21)
    for c, cfg in enumerate(_release_config()):
        mech = OSPDPRR(t=0.7, lower=1.0, upper=100.0, **cfg)
        for n in (0, 1, 5, 60):
            vals = g.uniform(1, 100, (n, mech.k_target))
            w = g.uniform(0, 1, (n, mech.k))
            if c % 4 == 1:
                w[:] = 0.3  # every score equal: A = B
            elif c % 4 == 2:
                w = (g.random((n, mech.k)) < 0.2) * 1.0  # whole levels, many ties
            elif c % 4 == 3 and n:
                w[:, 0] = 0.0
            full = mech.release(vals, w, RandomSource(f"eq/{c}/{n}"), allow_empty=True)
            lean = mech.release(vals, w, RandomSource(f"eq/{c}/{n}"), allow_empty=True,
                                diagnostics=False)
            assert lean.statistics == full.statistics, (cfg, n)
            assert lean.curator.get("m") == full.curator.get("m")


def test_finalize_uses_the_lean_release_with_the_same_result():
    mech = OSPDPRR(t=0.6, k=2, mode="sound-public", query="sum", **U)
    est = OSPDPRREstimator(mech, seed=4)
    assert est._lean == {"diagnostics": False}
    acc = est.add(est.create(), _reports(mech, 3000, 8))
    from ldp_beam.central.histogram import release_source

    rows = est.canonical(acc)
    ref = mech.release(rows[:, :2], rows[:, 2:], release_source(4, rows), allow_empty=True)
    assert est.finalize(acc).statistics == ref.statistics
