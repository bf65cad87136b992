"""RandomSource: secure unseeded draws, and seeded draws addressed per (stream, record).

The seeded contract (ldp_beam/rng.py): row ``i`` of ``uniforms(n, d, stream=s, offset=o)`` is the
noise of record ``o + i`` of stream ``s`` and depends on nothing else, so any batching of the same
records gives the same noise. Mechanisms consume a fixed number of uniforms per record, so their
reports inherit that property.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from ldp_beam import RandomSource, build_mechanism
from ldp_beam.rng import as_source, draw_uniforms, stream_id

SEED = 20240611
P_MIN = 1e-4  # significance level of the distributional checks (false alarm 1 in 10^4)

# Irregular chunk sizes (primes and 1s) that sum to 1000: every batch boundary is "odd".
CHUNKS = [7, 13, 1, 1, 29, 97, 3, 250, 101, 11, 487]
assert sum(CHUNKS) == 1000


def _chunked(draw, chunks):
    """Concatenate draw(size, offset) over consecutive chunks."""
    out, off = [], 0
    for c in chunks:
        out.append(draw(c, off))
        off += c
    return out


# --------------------------------------------------------------------------- unseeded
def test_unseeded_sources_differ_between_instances():
    a, b = RandomSource(), RandomSource()
    assert not a.seeded and not b.seeded
    ua, ub = a.uniforms(1000, 2), b.uniforms(1000, 2)
    # Two independent OS-entropy streams agree on a double with probability ~2^-53 per draw.
    assert not np.any(ua == ub)
    # and one source does not repeat itself
    assert not np.array_equal(ua, a.uniforms(1000, 2))


def test_unseeded_draws_shape_and_range():
    # (no distribution test here: unseeded draws are not reproducible, so a statistical check
    # would be a flaky test; the seeded tests below check uniformity with the same generator)
    u = RandomSource().uniforms(20000, 2)
    assert u.shape == (20000, 2) and u.dtype == np.float64
    assert u.min() >= 0 and u.max() < 1


def test_no_rng_argument_means_fresh_entropy():
    mech = build_mechanism("harmony", epsilon=1.0, lower=-1.0, upper=1.0)
    x = np.zeros(2000)
    # With eps=1 each report is +-1 with prob 1/2 at x=0: two unseeded runs agree on all 2000
    # reports with probability 2^-2000.
    assert not np.array_equal(mech.perturb(x)["y"], mech.perturb(x)["y"])


# --------------------------------------------------------------------------- seeded
@pytest.mark.parametrize("draws", [1, 2, 3, 4, 5])
def test_seeded_sources_are_identical(draws):
    a = RandomSource(SEED).uniforms(500, draws, stream=3, offset=11)
    b = RandomSource(SEED).uniforms(500, draws, stream=3, offset=11)
    assert a.shape == (500, draws)
    np.testing.assert_array_equal(a, b)
    assert RandomSource(SEED).seeded


def test_different_seeds_differ():
    a = RandomSource(SEED).uniforms(1000, 2, stream=0, offset=0)
    b = RandomSource(SEED + 1).uniforms(1000, 2, stream=0, offset=0)
    assert not np.any(a == b)
    c = RandomSource("a string seed").uniforms(10, 2, stream=0, offset=0)
    np.testing.assert_array_equal(c, RandomSource("a string seed").uniforms(10, 2, stream=0,
                                                                            offset=0))


@pytest.mark.parametrize("draws", [1, 2, 3, 4, 5])
def test_seeded_record_noise_does_not_depend_on_batch_split(draws):
    src = RandomSource(SEED)
    full = src.uniforms(1000, draws, stream=5, offset=0)
    parts = _chunked(lambda c, off: src.uniforms(c, draws, stream=5, offset=off), CHUNKS)
    np.testing.assert_array_equal(np.concatenate(parts), full)
    # a fresh source addressed at an arbitrary record gives that record's noise
    np.testing.assert_array_equal(
        RandomSource(SEED).uniforms(100, draws, stream=5, offset=617), full[617:717])
    # batches in reverse order, each from its own source (as on different workers)
    rev = {}
    off = 0
    for c in CHUNKS:
        rev[off] = (c, off)
        off += c
    for off, (c, _) in sorted(rev.items(), reverse=True):
        np.testing.assert_array_equal(
            RandomSource(SEED).uniforms(c, draws, stream=5, offset=off), full[off:off + c])


@pytest.mark.parametrize("draws", [1, 2, 3, 5])
def test_records_do_not_share_noise(draws):
    """Each record gets fresh counter blocks: no uniform repeats across the 1000 x draws values
    (overlapping counter ranges between records would repeat values exactly)."""
    u = RandomSource(SEED).uniforms(1000, draws, stream=0, offset=0)
    assert np.unique(u).size == u.size


@pytest.mark.parametrize("draws", [1, 3])
def test_seeded_draws_are_uniform_and_columns_independent(draws):
    u = RandomSource(SEED).uniforms(20000, draws, stream=9, offset=123)
    assert u.min() >= 0 and u.max() < 1
    for j in range(draws):
        assert stats.kstest(u[:, j], "uniform").pvalue > P_MIN
    if draws > 1:
        # correlation of two independent uniforms: sd 1/sqrt(n); 4 sd ~ p 6e-5
        r = np.corrcoef(u[:, 0], u[:, 1])[0, 1]
        assert abs(r) < 4 / np.sqrt(u.shape[0])


def test_different_streams_differ():
    src = RandomSource(SEED)
    a = src.uniforms(1000, 3, stream=1, offset=0)
    b = src.uniforms(1000, 3, stream=2, offset=0)
    assert not np.any(a == b)
    # a stream is not a shifted copy of another: stream 1 is not stream 0 at any small offset
    c = src.uniforms(5000, 3, stream=0, offset=0)
    assert not np.isin(a[:, 0], c).any()


def test_sequential_unkeyed_calls_continue_one_stream():
    """With a seed and no keys, calls on one source continue stream 0 (running offset)."""
    src = RandomSource(SEED)
    parts = [src.uniforms(c, 3) for c in CHUNKS]
    full = RandomSource(SEED).uniforms(1000, 3, stream=0, offset=0)
    np.testing.assert_array_equal(np.concatenate(parts), full)


def test_stream_id_is_stable_and_distinguishes_names():
    assert stream_id("part-0001.parquet") == stream_id("part-0001.parquet")
    assert stream_id("part-0001.parquet") != stream_id("part-0002.parquet")
    assert stream_id(7) == 7
    assert 0 <= stream_id("x") < 2**64


def test_as_source_and_bad_rng():
    assert isinstance(as_source(None), RandomSource) and not as_source(None).seeded
    assert as_source(5).seeded
    src = RandomSource(1)
    assert as_source(src) is src
    g = np.random.default_rng(SEED)
    assert as_source(g) is g
    assert draw_uniforms(np.random.default_rng(1), 4, 3).shape == (4, 3)
    with pytest.raises(TypeError, match="rng must be"):
        as_source(1.5)
    with pytest.raises(TypeError):
        RandomSource(True)
    with pytest.raises(ValueError, match="draws"):
        RandomSource(1).uniforms(3, -1)
    # zero draws per record (central-DP inputs are only validated): an (n, 0) array
    assert RandomSource(1).uniforms(3, 0).shape == (3, 0)
    assert RandomSource().uniforms(3, 0).shape == (3, 0)


# --------------------------------------------------------------------------- mechanisms
MECHS = [
    ("bisample", dict(epsilon=1.0, lower=0, upper=10)),
    ("bisample-md", dict(epsilon=1.0, lower=0, upper=10)),
    ("harmony", dict(epsilon=1.0, lower=0, upper=10, fake="rnd")),
    ("pm", dict(epsilon=1.0, lower=0, upper=10, fake="rnd")),
    ("privkvm", dict(epsilon=1.0, lower=0, upper=10)),
]


def _inputs():
    g = np.random.default_rng(SEED)
    value = g.uniform(0, 10, 1000)
    pref = g.uniform(0.5, 1.5, 1000)  # about half the users do not answer (eps_u < eps = 1)
    return {"value": value, "preference": pref}


@pytest.mark.parametrize("name,params", MECHS, ids=[m[0] for m in MECHS])
def test_perturb_with_seed_and_keys_is_split_invariant(name, params):
    mech = build_mechanism(name, **params)
    data = _inputs()
    full = mech.perturb(data, rng=SEED, stream=42, offset=0)
    assert set(full) == {f for f, _ in mech.report_fields}

    def part(c, off):
        return mech.perturb({k: v[off:off + c] for k, v in data.items()},
                            rng=SEED, stream=42, offset=off)

    parts = _chunked(part, CHUNKS)
    for f, dt in mech.report_fields:
        joined = np.concatenate([p[f] for p in parts])
        assert joined.dtype == np.dtype(dt)
        np.testing.assert_array_equal(joined, full[f])
    # the same with one RandomSource object shared by all batches (as one worker would)
    src = RandomSource(SEED)
    parts = _chunked(lambda c, off: mech.perturb({k: v[off:off + c] for k, v in data.items()},
                                                 rng=src, stream=42, offset=off), CHUNKS)
    for f, _ in mech.report_fields:
        np.testing.assert_array_equal(np.concatenate([p[f] for p in parts]), full[f])
    # another stream gives other noise (the reports are not a function of the data alone)
    other = mech.perturb(data, rng=SEED, stream=43, offset=0)
    assert any(not np.array_equal(other[f], full[f]) for f, _ in mech.report_fields)
    # another seed too
    other = mech.perturb(data, rng=SEED + 1, stream=42, offset=0)
    assert any(not np.array_equal(other[f], full[f]) for f, _ in mech.report_fields)


@pytest.mark.parametrize("name,params", MECHS, ids=[m[0] for m in MECHS])
def test_perturb_accepts_a_numpy_generator(name, params):
    mech = build_mechanism(name, **params)
    data = _inputs()
    a = mech.perturb(data, rng=np.random.default_rng(SEED))
    b = mech.perturb(data, rng=np.random.default_rng(SEED))
    for f, _ in mech.report_fields:
        np.testing.assert_array_equal(a[f], b[f])
