"""The batch path's fast paths (issue 16) give exactly what their definitions give.

* keyed draws by AES-ECB over the counter blocks (:meth:`RandomSource.uniforms`) against
  randomgen's ``AESCounter`` drawn the documented way (record-major, column-contiguous), across
  chunk boundaries, odd draw counts and the carry of the counter's low word;
"""
from __future__ import annotations

import numpy as np
import pytest
from randomgen import AESCounter

import ldp_beam.rng as rng_module
from ldp_beam.rng import RandomSource, RunKey, stream_id


def _aes_counter_definition(src: RandomSource, n: int, draws: int, stream: int,
                            offset: int) -> np.ndarray:
    """The seeded contract in rng.py's words: counter block ``stream * 2**64 + offset *
    blocks``, numpy's ``Generator.random`` over AESCounter, record i's uniforms contiguous."""
    blocks = (draws + 1) // 2
    counter = ((stream % 2**64) * 2**64 + offset * blocks) % 2**128
    gen = np.random.Generator(AESCounter(key=src._key, counter=counter))
    return gen.random((n, 2 * blocks))[:, :draws]


SOURCES = [RandomSource(3), RandomSource("text seed"), RandomSource(key=RunKey.new().key),
           RunKey.new("s").source()]


@pytest.mark.parametrize("draws", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [1, 5, 8191, 8192, 8193, 20_000])
def test_keyed_batch_draws_equal_aes_counter(draws, n):
    for src in SOURCES:
        for stream, offset in ((0, 0), (stream_id("survey.parquet"), 123_457),
                               (2**64 - 1, 2**40 + 3)):
            got = src.uniforms(n, draws, stream=stream, offset=offset)
            assert got.shape == (n, draws) and got.dtype == np.float64
            assert got.flags.f_contiguous
            np.testing.assert_array_equal(
                got, _aes_counter_definition(src, n, draws, stream, offset))


def test_keyed_draws_across_the_low_word_carry():
    """Blocks whose counter's low word wraps (offset near 2^64 / blocks) carry into the stream
    word exactly as AESCounter's 128-bit counter does (those calls take AESCounter itself)."""
    src = RandomSource(11)
    for draws in (1, 2, 4):
        blocks = (draws + 1) // 2
        offset = (2**64 - 3) // blocks
        got = src.uniforms(10, draws, stream=5, offset=offset)
        np.testing.assert_array_equal(got, _aes_counter_definition(src, 10, draws, 5, offset))


def test_sequential_seeded_draws_continue_the_counter():
    """Without an offset, a seeded source's calls continue where the last one stopped."""
    a, b = RandomSource(7), RandomSource(7)
    parts = np.vstack([a.uniforms(k, 3) for k in (1, 9000, 17)])
    np.testing.assert_array_equal(parts, _aes_counter_definition(b, 9018, 3, 0, 0))


def test_small_chunks_give_the_same_draws(monkeypatch):
    """The chunking of the encryption does not show in the draws (keyed batches and keyed
    single records alike)."""
    src = RandomSource(5)
    streams = np.array([stream_id(i) for i in range(300)], dtype=np.uint64)
    want = src.uniforms(1000, 3, stream=9, offset=77)
    want_keyed = src.keyed_uniforms(streams, np.arange(300) * 3, 3)
    monkeypatch.setattr(rng_module, "_CHUNK_BLOCKS", 7)
    np.testing.assert_array_equal(src.uniforms(1000, 3, stream=9, offset=77), want)
    np.testing.assert_array_equal(src.keyed_uniforms(streams, np.arange(300) * 3, 3),
                                  want_keyed)
    np.testing.assert_array_equal(want, _aes_counter_definition(src, 1000, 3, 9, 77))
