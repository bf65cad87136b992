"""The one-row bounding sketch's packed references, its encoding and the AES row priorities
(ldp_beam/minsketch.py: _MinSketch, _MinTable; ldp_beam/prf.py: row_priorities;
transforms/units.py: the coder)."""
import pickle

import numpy as np
import pytest

from ldp_beam.rng import RunKey
from ldp_beam import bounding, minsketch
from ldp_beam.bounding import KeptRows, reduce_candidates
from ldp_beam.minsketch import _MinSketch
from ldp_beam.prf import _row_priorities_ctr, row_priorities
from ldp_beam.transforms.units import _ArraysCoder

U64 = np.uint64


def _c_module():
    try:
        from ldp_beam import _minsketch
    except ImportError:
        return None
    return _minsketch


@pytest.fixture(autouse=True, params=["c", "numpy"])
def insert(request, monkeypatch):
    """Every test runs with the C insert loop (ldp_beam/_minsketch.c) and with the numpy
    rounds it replaces: the two must keep the same rows."""
    if request.param == "numpy":
        monkeypatch.setattr(minsketch, "_NATIVE", None)
    else:
        mod = _c_module()
        if mod is None:
            _no_c_module()
        monkeypatch.setattr(minsketch, "_NATIVE", mod)
    return request.param


def _no_c_module():
    import shutil
    import sysconfig

    if shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc") is None:
        pytest.skip("ldp_beam._minsketch is not built: no C compiler here (the numpy path runs)")
    pytest.fail("a C compiler is here but ldp_beam._minsketch is not built: reinstall the "
                "package (pip install -e .)")


def _oracle(u, prio, s, rid):
    """One row per unit by sorting (the general path): (units, [(unit, stream, record)])."""
    c, n = reduce_candidates({"u": u, "rh": prio, "s": s, "rid": rid}, 1, 1, False)
    return n, sorted(zip(c["u"].tolist(), c["s"].tolist(), c["rid"].tolist()))


def _got(sketch):
    k = sketch.kept()
    return sketch.units, sorted(zip(k["u"].tolist(), k["s"].tolist(), k["rid"].tolist()))


def _rows(rng, n, units, streams, rid_lo=0, ties=True):
    u = rng.integers(1, 2**63, units, dtype=U64)[rng.integers(0, units, n)] | U64(1)
    prio = (rng.integers(0, 4, n) if ties else rng.integers(0, 2**63, n)).astype(U64)
    s = np.asarray(streams, U64)[rng.integers(0, len(streams), n)]
    rid = rid_lo + rng.permutation(n).astype(np.int64)
    return u, prio, s, rid


def test_row_priorities_are_the_counter_generator_blocks():
    key = int.from_bytes(RunKey.new(7).derive("bounding/rows")[:16], "big")
    rng = np.random.default_rng(1)
    for stream in (0, 5, 2**64 - 1, 0x1234567890ABCDEF):
        dense = np.arange(1000, 3000, dtype=np.int64)
        sparse = np.unique(rng.integers(0, 2**62, 300))
        edge = np.array([0, 1, 2**48 - 1, 2**48, 2**63 - 1], np.int64)
        for ids in (dense, sparse, edge):
            assert np.array_equal(row_priorities(key, stream, ids),
                                  _row_priorities_ctr(key, stream, ids))


@pytest.mark.parametrize("case", ["huge_record", "negative_record", "many_streams"])
def test_references_that_do_not_pack_turn_the_sketch_wide_with_the_same_rows(case, monkeypatch):
    rng = np.random.default_rng(3)
    u, prio, s, rid = _rows(rng, 30_000, 4000, [11, 2**64 - 2, 7])
    late = slice(20_000, None)  # rows arriving after the sketch has packed references
    if case == "huge_record":
        rid[late] += 2**48
    elif case == "negative_record":
        rid[late] = -2 - rid[late]
    else:
        monkeypatch.setattr(minsketch, "_MAX_STREAMS", 3)
        s[late] = rng.integers(100, 110, 10_000).astype(U64)
    want = _oracle(u, prio, s, rid)
    sketch = _MinSketch()
    for a in range(0, 30_000, 2500):
        sketch.add(u[a:a + 2500], prio[a:a + 2500], s[a:a + 2500], rid[a:a + 2500])
        assert sketch.wide == (a >= 20_000)
    assert _got(sketch) == want
    again = pickle.loads(pickle.dumps(sketch))
    assert again.wide and _got(again) == want
    kept = sketch.kept_rows()  # wide: built from the decoded rows
    assert kept.rows == len(want[1]) and kept.units == want[0]


def test_packed_sketch_keeps_the_same_rows_as_the_sorting_sketch_across_streams():
    rng = np.random.default_rng(4)
    u, prio, s, rid = _rows(rng, 50_000, 6000, [3, 2**63 + 5, 0], rid_lo=2**48 - 60_000)
    sketch = _MinSketch()
    for a in range(0, 50_000, 7000):
        sketch.add(u[a:a + 7000], prio[a:a + 7000], s[a:a + 7000], rid[a:a + 7000])
    assert not sketch.wide and _got(sketch) == _oracle(u, prio, s, rid)


def test_one_stream_for_all_rows_is_the_same_as_a_column_of_it():
    rng = np.random.default_rng(5)
    u, prio, _, rid = _rows(rng, 20_000, 3000, [9])
    a, b = _MinSketch(), _MinSketch()
    for i in range(0, 20_000, 3000):
        a.add(u[i:i + 3000], prio[i:i + 3000], np.full(1, 9, U64), rid[i:i + 3000])
        b.add(u[i:i + 3000], prio[i:i + 3000], np.full(min(3000, 20_000 - i), 9, U64),
              rid[i:i + 3000])
    assert _got(a) == _got(b) == _oracle(u, prio, np.full(20_000, 9, U64), rid)


def _keyed_rows(rng, key, n, pool, stream, lo):
    rid = lo + np.arange(n, dtype=np.int64)
    prio = row_priorities(key, stream, rid)
    return pool[rng.integers(0, pool.size, n)], prio, np.full(n, stream, U64), rid


def test_coder_round_trip_drops_priorities_only_when_the_key_can_recompute_them():
    key = int.from_bytes(RunKey.new(8).derive("bounding/rows")[:16], "big")
    aes = key.to_bytes(16, "little")
    rng = np.random.default_rng(6)
    pool = rng.integers(1, 2**63, 2000, dtype=U64) | U64(1)  # the later rows' units are held
    first = [_keyed_rows(rng, key, 9000, pool, st, lo) for st, lo in ((5, 0), (2**64 - 3, 70))]
    later = _keyed_rows(rng, key, 9000, pool, 5, 9000)
    everything = [np.concatenate(x) for x in zip(*first, later)]
    want = _oracle(*everything)
    coder = _ArraysCoder()

    keyed = _MinSketch(aes)
    for rows in first:
        keyed.add(*rows)
    plain = _MinSketch()
    for rows in first:
        plain.add(*rows)
    enc_keyed, enc_plain = coder.encode(keyed), coder.encode(plain)
    assert len(enc_keyed) < len(enc_plain)  # no priorities
    back = coder.decode(enc_keyed)
    assert back.frozen[1] is None and back.key is None
    assert _got(back) == _got(keyed)  # the kept rows need no priorities
    with pytest.raises(RuntimeError, match="row key"):
        back.add(*later)
    back.key = aes  # as the combine gives it back
    back.add(*later)
    assert _got(back) == want
    again = coder.decode(enc_plain)  # priorities kept: takes rows without the key
    again.add(*later)
    assert _got(again) == want
    # merging decoded sketches: priorities recomputed for both
    x, y = coder.decode(enc_keyed), coder.decode(coder.encode(_sketch_of(aes, [later])))
    x.key = y.key = aes
    x.merge(y)
    assert _got(x) == want


def _sketch_of(aes, batches):
    sk = _MinSketch(aes)
    for rows in batches:
        sk.add(*rows)
    return sk


def test_kept_rows_of_a_frozen_sketch_match_the_generic_build():
    rng = np.random.default_rng(7)
    u, prio, s, rid = _rows(rng, 40_000, 5000, [1, 2**64 - 9, 40], ties=False)
    sketch = _MinSketch()
    sketch.add(u, prio, s, rid)
    generic = KeptRows.of(sketch.kept(), sketch.units, False)
    fast = pickle.loads(pickle.dumps(sketch)).kept_rows()
    assert (fast.units, fast.rows) == (generic.units, generic.rows)
    assert set(fast.streams) == set(generic.streams)
    for name in generic.streams:
        r, uu, p = generic.stream(name)
        fr, fu, fp = fast.stream(name)
        assert np.array_equal(fr, r) and np.array_equal(fu, uu) and p is None and fp is None
        ids = np.arange(int(r.min()), int(r.max()) + 1, dtype=np.int64)
        h1, e1 = fast.lookup(name, ids)
        h2, e2 = generic.lookup(name, ids)
        assert np.array_equal(h1, h2) and np.array_equal(e1[0], e2[0])


def test_kept_rows_round_trip_through_their_compact_encoding():
    rng = np.random.default_rng(8)
    near = np.unique(rng.integers(0, 10**6, 5000))  # gaps < 2^16
    mid = np.unique(rng.integers(0, 2**40, 300))  # gaps < 2^32 mostly, some not
    far = np.array([-5, 3, 2**62], np.int64)  # gaps beyond 2^32: kept as they are
    streams = {s: (r.astype(np.int64), rng.integers(1, 2**63, r.size, dtype=U64),
                   None if s != 3 else rng.integers(0, 9, r.size, dtype=U64))
               for s, r in ((1, near), (2, mid), (3, far), (4, np.array([7], np.int64)),
                            (5, np.arange(-70_000, 3_000_000, 3, dtype=np.int64)))}
    kept = KeptRows(streams, 123, sum(v[0].size for v in streams.values()))
    enc = pickle.dumps(kept)
    back = pickle.loads(enc)
    assert (back.units, back.rows) == (123, kept.rows)
    for name, (r, u, p) in streams.items():
        br, bu, bp = back.stream(name)
        assert br.dtype == np.int64 and np.array_equal(br, r)
        assert np.array_equal(bu, bounding.unit_fingerprint(u))
        assert (bp is None) == (p is None) and (p is None or np.array_equal(bp, p))
    # the near stream's record numbers as 2-byte gaps and 4-byte fingerprints: ~6 bytes a row
    big = streams[5][0].size
    assert len(enc) < 6.2 * (near.size + big) + 24 * (mid.size + far.size + 1) + 4096
    # any range of a stream decodes on its own, across the marks
    ids = back.streams[5][0]
    for lo, hi in ((-70_000, -69_999), (-1, 5), (1020 * 3 - 70_000, 1030 * 3 - 70_000),
                   (2_999_990, 4_000_000), (5_000_000, 6_000_000), (-10**9, -10**8)):
        a, vals = ids.span(lo, hi)
        full = streams[5][0]
        want = full[(full >= lo) & (full <= hi)]
        assert np.array_equal(vals, want)
        assert a == int(np.searchsorted(full, lo))


def test_freezing_hands_the_freed_heap_back_once(monkeypatch):
    calls = []
    monkeypatch.setattr(minsketch, "_LIBC", lambda pad: calls.append(pad))
    rng = np.random.default_rng(9)
    u, prio, s, rid = _rows(rng, 5000, 800, [2], ties=False)
    sketch = _MinSketch()
    sketch.add(u, prio, s, rid)
    want = _got(sketch)
    sketch.freeze()
    sketch.freeze()  # already frozen: nothing to free
    assert calls == [0] and sketch.tables == [None] * len(sketch.tables)
    assert _got(sketch) == want


def test_many_small_batches_with_ties_keep_the_sorting_oracles_rows():
    """Tables that grow many times, rows of one unit spread over batches, priorities in 0..3
    (ties broken by (stream, record)): the per-unit minimum, as the sort finds it."""
    rng = np.random.default_rng(10)
    u, prio, s, rid = _rows(rng, 200_000, 30_000, [4, 2**64 - 2, 12])
    sketch = _MinSketch()
    for a in range(0, u.size, 1500):
        sketch.add(u[a:a + 1500], prio[a:a + 1500], s[a:a + 1500], rid[a:a + 1500])
    assert _got(sketch) == _oracle(u, prio, s, rid)


def test_a_sketch_pickled_right_after_a_batch_holds_that_batch():
    rng = np.random.default_rng(11)
    u, prio, s, rid = _rows(rng, 60_000, 9000, [2, 3], ties=False)
    sketch = _MinSketch()
    sketch.add(u[:30_000], prio[:30_000], s[:30_000], rid[:30_000])
    sketch.add(u[30_000:], prio[30_000:], s[30_000:], rid[30_000:])  # may still be going in
    back = pickle.loads(pickle.dumps(sketch))
    assert _got(back) == _oracle(u, prio, s, rid)


def test_the_c_insert_reports_a_bad_row_at_the_next_step(insert):
    if insert != "c":
        pytest.skip("the numpy rounds never see a zero hash either (hashes have their low bit "
                    "set); the C loop checks it")
    sketch = _MinSketch()
    u = np.array([3, 0, 5], U64)
    sketch.add(u, np.arange(3, dtype=U64), np.full(1, 1, U64), np.arange(3, dtype=np.int64))
    with pytest.raises(ValueError, match="unit hash of 0"):
        sketch.units


def test_the_c_module_refuses_tables_it_cannot_use():
    mod = _c_module()
    if mod is None:
        _no_c_module()
    kp, ref = np.zeros((100, 2), U64), np.zeros(100, U64)
    rows = (np.array([3], U64), np.array([1], U64), np.array([0], U64), None)
    names = np.array([1], U64)
    with pytest.raises(ValueError, match="size 200"):
        mod.insert([(kp, ref, None, 200)], names, *rows)
    with pytest.raises(ValueError, match="power of two"):
        mod.insert([(kp, ref, None, 90)] * 3, names, *rows)
    with pytest.raises(ValueError, match="expected 100"):
        mod.insert([(kp, np.zeros(99, U64), None, 90)], names, *rows)
    with pytest.raises(TypeError, match="64-bit"):
        mod.insert([(kp, np.zeros(100, np.uint32), None, 90)], names, *rows)
    with pytest.raises(ValueError, match="stream index"):
        mod.insert([(kp, ref, None, 90)], names, rows[0], rows[1], np.array([1 << 48], U64),
                   None)
    assert not kp.any()  # refused rows leave the table as it was
    assert mod.insert([(kp, ref, None, 90)], names, *rows) == [1]


def _c_or_skip():
    mod = _c_module()
    if mod is None:
        _no_c_module()
    return mod


def test_the_c_rehash_puts_every_unit_where_probing_finds_it():
    """A table grown by the C rehash holds the same entries, each where the insert's probing
    looks for it (re-inserting the units claims none), and refuses a source holding a unit
    twice or a destination too small."""
    mod = _c_or_skip()
    rng = np.random.default_rng(12)
    u = np.unique(rng.integers(1, 2**63, 3000, dtype=U64) | U64(1))
    t = minsketch._MinTable(size=4096)
    t.kp[:], t.ref[:] = 0, 0  # as the C mode allocates it
    names = np.array([9], U64)
    prio, ref = rng.integers(0, 2**63, u.size, dtype=U64), np.arange(u.size, dtype=U64)
    assert mod.insert([(t.kp, t.ref, None, t.size)], names, u, prio, ref, None) == [u.size]
    before = sorted(zip(*(x.tolist() for x in t.entries()[:3])))
    kp2, ref2 = np.zeros((6001, 2), U64), np.zeros(6001, U64)
    assert mod.rehash(t.kp, t.ref, None, (kp2, ref2, None, 6000)) == u.size
    occ = np.flatnonzero(kp2[:, 0])
    assert sorted(zip(kp2[occ, 0].tolist(), kp2[occ, 1].tolist(), ref2[occ].tolist())) == before
    assert mod.insert([(kp2, ref2, None, 6000)], names, u, prio + U64(1), ref, None) == [0]
    assert sorted(zip(kp2[occ, 0].tolist(), kp2[occ, 1].tolist(), ref2[occ].tolist())) == before
    dup = t.kp.copy()
    dup[np.flatnonzero(dup[:, 0] == 0)[0], 0] = u[0]
    with pytest.raises(ValueError, match="twice"):
        mod.rehash(dup, t.ref, None, (np.zeros((6001, 2), U64), ref2.copy(), None, 6000))
    with pytest.raises(RuntimeError, match="full"):
        mod.rehash(t.kp, t.ref, None, (np.zeros((100, 2), U64), np.zeros(100, U64), None, 90))
    with pytest.raises(ValueError, match="both"):
        mod.rehash(t.kp, t.ref, None, (kp2, ref2, np.zeros(6001, U64), 6000))


@pytest.mark.parametrize("case", ["empty", "one", "equal", "extremes", "wide", "narrow"])
def test_the_c_radix_sort_is_numpys_sort(case):
    mod = _c_or_skip()
    rng = np.random.default_rng(13)
    a = {"empty": np.empty(0, U64), "one": np.array([7], U64),
         "equal": np.full(5000, 2**40 + 3, U64),
         "extremes": np.array([2**64 - 1, 0, 1, 2**63, 2**64 - 1, 2**11, 2**11 - 1], U64),
         "wide": rng.integers(0, 2**64 - 1, 100_000, dtype=U64, endpoint=True),
         "narrow": rng.integers(0, 2**20, 100_000, dtype=U64) << U64(30)}[case]
    b = a.copy()
    mod.sort(b)
    assert np.array_equal(b, np.sort(a))
    with pytest.raises(TypeError, match="64-bit"):
        mod.sort(np.zeros(4, np.uint32))


def test_queued_inserts_hold_every_batch_and_raise_an_error_after_the_queue(insert):
    """The C inserts run behind each other in the background (up to ``_QUEUE`` batches): a
    batch that fails there is raised by the next step that reads the tables, after the batches
    queued behind it went in; the rows are the sorting oracle's."""
    if insert != "c":
        pytest.skip("the numpy rounds insert in the caller's thread")
    rng = np.random.default_rng(14)
    u, prio, s, rid = _rows(rng, 40_000, 5000, [3], ties=False)
    sketch = _MinSketch()
    bad = np.array([3, 0, 5], U64)
    sketch.add(bad, np.arange(3, dtype=U64), np.full(1, 1, U64), np.arange(3, dtype=np.int64))
    added = 0
    with pytest.raises(ValueError, match="unit hash of 0"):
        for a in range(0, u.size, 4000):
            sketch.add(u[a:a + 4000], prio[a:a + 4000], s[a:a + 4000], rid[a:a + 4000])
            added += 1
        sketch.units
    assert added <= minsketch._QUEUE  # raised once the queue came round to it
    assert not sketch.inflight  # and the queue was drained before it was raised
    good = _MinSketch()
    for a in range(0, u.size, 4000):
        good.add(u[a:a + 4000], prio[a:a + 4000], s[a:a + 4000], rid[a:a + 4000])
    assert len(good.inflight) <= minsketch._QUEUE
    assert _got(good) == _oracle(u, prio, s, rid)
