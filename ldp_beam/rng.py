"""Randomness policy.

* **Secure by default.** Every generator is numpy's ``Generator`` over randomgen's
  ``AESCounter`` (AES-128 in counter mode, a CSPRNG). PCG64 is as fast here but predictable from
  its output; a collector who sees many reports of a PCG64-driven mechanism could in principle
  recover the stream and strip the noise. AESCounter costs nothing measurable over PCG64 on this
  machine (both ~50-400M uniforms/s depending on batch size) and is kept by numpy's random-module
  author, so we take it rather than write our own.
* **No fixed default seed.** ``RandomSource()`` keys AES from operating-system entropy.
* **Retry-proof by default in pipelines.** ``RandomSource(key=RunKey.new().key)`` keys AES from a
  per-run secret (32 bytes of OS entropy drawn once on the trusted side, never written to any
  output). Its draws are addressed like a seeded source's, by (stream, offset), so a re-executed
  bundle, stage or release reproduces its noise exactly: a runner's retry or speculative copy of
  a step sends the same reports, and a person's budget is not spent twice. Unlike a seed, the key
  is unguessable, so the run stays private. See :class:`RunKey`.
* **Deterministic per record on request.** ``RandomSource(seed)`` derives the AES key from the seed
  (SHA-256), and the uniforms of record ``offset`` in stream ``stream`` come from counter block
  ``stream * 2**64 + offset * blocks_per_record``. A record's noise therefore depends only on the
  seed and its stable key (stream, offset), never on how records were split into batches or which
  worker saw them. Every mechanism uses a fixed number of uniforms per record (``draws``).
* **Computed with OpenSSL where it can.** Those addressed draws are AESCounter's by definition;
  they are computed as AES-128-ECB of the counter blocks (the ``cryptography`` package, a
  dependency of apache-beam; AESCounter itself without it, or where a batch's counters carry
  into the stream word), bit for bit the same and ~3x faster (tests/test_batch_fast_paths.py).
"""
from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Union

import numpy as np
from randomgen import AESCounter

from .prf import _MASK64, derive_key

_STREAM_SHIFT = 64


def _key_from_seed(seed: int | str | bytes, purpose: str = "aes-key") -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer, str, bytes)):
        raise TypeError(f"seed must be an int, str or bytes, not {type(seed).__name__}")
    raw = seed if isinstance(seed, bytes) else str(int(seed) if isinstance(seed, np.integer)
                                                    else seed).encode()
    return int.from_bytes(derive_key(raw, purpose)[:16], "big")


def stream_id(name: object) -> int:
    """A stable 64-bit stream number for a file name, a partition key or a user id."""
    if isinstance(name, (int, np.integer)) and not isinstance(name, bool):
        return int(name) & _MASK64
    return int.from_bytes(hashlib.blake2b(str(name).encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class RunKey:
    """A run's identity and its secret noise key.

    ``run_id`` names the run in manifests, ledgers and logs. ``key`` (32 bytes) addresses every
    random draw of the run: fresh OS entropy unless the run is ``seeded``, in which case the key
    is derived from the seed and the run is reproducible but **not private** (whoever knows or
    guesses the seed can recompute and remove the noise). The key never appears in ``repr`` and
    is never written to an output; it travels only inside the pipeline's own (trusted) steps.
    """

    run_id: str
    key: bytes = field(repr=False)
    seed: str | None = None

    @classmethod
    def new(cls, seed: int | str | bytes | None = None) -> "RunKey":
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        run_id = f"{stamp}-{secrets.token_hex(4)}"
        if seed is None:
            return cls(run_id, os.urandom(32))
        _key_from_seed(seed)  # type check
        text = seed.hex() if isinstance(seed, bytes) else str(
            int(seed) if isinstance(seed, np.integer) else seed)
        return cls(run_id, derive_key(text.encode(), "run-key"), text)

    @property
    def seeded(self) -> bool:
        return self.seed is not None

    def source(self) -> "RandomSource":
        """The run's draws: keyed by the secret key, or by the seed exactly as
        ``RandomSource(seed)`` (so a seeded pipeline matches the core API record for record)."""
        return RandomSource(key=self.key) if self.seed is None else RandomSource(self.seed)

    def derive(self, purpose: str) -> bytes:
        """A sub-key for one use of the run (e.g. ``"release"``), independent of the others."""
        return derive_key(self.key, "derive", purpose)


class RandomSource:
    """Uniform draws for mechanisms: OS-entropy by default, per-record deterministic with a seed
    or a run key (see :class:`RunKey`).

    ``uniforms(n, draws, stream=s, offset=o)`` returns an ``(n, draws)`` float64 array in [0, 1)
    whose row ``i`` is the noise of record ``o + i`` of stream ``s``. Without a seed, ``stream``
    and ``offset`` are ignored and the draws come from one OS-seeded AES stream. With a seed and no
    offset, draws continue after the last block used (deterministic for sequential calls).
    """

    def __init__(self, seed: int | str | bytes | None = None, *, key: bytes | None = None
                 ) -> None:
        if seed is not None and key is not None:
            raise ValueError("RandomSource: give a seed or a key, not both")
        if key is not None and (not isinstance(key, bytes) or len(key) < 16):
            raise ValueError("RandomSource: key must be at least 16 bytes (RunKey.new().key)")
        self.seed = seed
        self._run_key = key
        if seed is None and key is None:
            self._key = None
            self._gen = np.random.Generator(AESCounter())  # OS entropy
        else:
            self._key = _key_from_seed(seed) if key is None else _key_from_seed(key, "run-key")
            self._gen = None
        self._next_block = 0
        self._next_generator = 0

    @property
    def seeded(self) -> bool:
        """Drawn from a caller's seed: reproducible and therefore not private."""
        return self.seed is not None

    def uniforms(self, n: int, draws: int, *, stream: int | None = None,
                 offset: int | None = None) -> np.ndarray:
        if n < 0 or draws < 0:
            raise ValueError(f"uniforms(n={n}, draws={draws}): need n >= 0 and draws >= 0")
        if draws == 0:  # a mechanism that needs no noise per record (central-DP inputs)
            return np.empty((n, 0), order="F")
        if self._key is None:
            return np.asfortranarray(self._gen.random((n, draws)))
        stream = 0 if stream is None else stream
        blocks = (draws + 1) // 2  # one AES block = two 64-bit outputs = two doubles
        if offset is None:  # sequential use: continue after the last block this source used
            start = self._next_block
            self._next_block += n * blocks
        else:
            start = offset * blocks
        counter = (((stream & _MASK64) << _STREAM_SHIFT) + start) % (1 << 128)
        if n and (counter & _MASK64) + n * blocks <= _MASK64 + 1:  # no carry into the stream word
            ecb = _aes_ecb(self._key)  # ~10 us: one per call, never shared between threads
            if ecb is not None:
                return _counter_uniforms(ecb, counter, n, draws)
        return self._generator_uniforms(counter, n, draws)

    def _generator_uniforms(self, counter: int, n: int, draws: int) -> np.ndarray:
        """The definition of the keyed draws: randomgen's AESCounter from 128-bit ``counter``,
        ``(n, 2 * blocks)`` doubles record-major (record i's uniforms contiguous in the counter
        stream), the first ``draws`` of each record, column-contiguous (mechanisms read whole
        columns, ~3x faster than strided views)."""
        blocks = (draws + 1) // 2
        gen = np.random.Generator(AESCounter(key=self._key, counter=counter))
        return np.asfortranarray(gen.random((n, 2 * blocks))[:, :draws])

    def keyed_uniforms(self, streams: np.ndarray, offsets: np.ndarray | int,
                       draws: int) -> np.ndarray:
        """Row ``i`` = ``uniforms(1, draws, stream=streams[i], offset=offsets[i])[0]`` for many
        records at once (single records keyed by their own ids): bit for bit the same draws,
        computed with one AES-ECB call over the records' counter blocks instead of one
        generator per record (~35 us each). ``(n, draws)``, column-contiguous."""
        streams = np.asarray(streams, dtype=np.uint64).reshape(-1)
        n = streams.shape[0]
        offs = np.broadcast_to(np.asarray(offsets, dtype=np.int64), (n,))
        if draws == 0:
            return np.empty((n, 0), order="F")
        if self._key is None:
            return self.uniforms(n, draws)
        if n and offs.min() < 0:
            raise ValueError("keyed_uniforms: offsets must be >= 0")
        blocks = (draws + 1) // 2
        ecb = _aes_ecb(self._key)
        if ecb is None or (n and int(offs.max()) >= ((1 << 64) - blocks) // blocks):
            if n == 0:
                return np.empty((0, draws), order="F")
            return np.asfortranarray(np.vstack([
                self.uniforms(1, draws, stream=int(st), offset=int(o))
                for st, o in zip(streams.tolist(), offs.tolist())]))
        ctr = np.empty((n, blocks, 2), dtype="<u8")  # one AES block: (low, high) 64-bit words
        ctr[:, :, 0] = (offs.astype(np.uint64) * np.uint64(blocks))[:, None] + \
            np.arange(blocks, dtype=np.uint64)[None, :]  # no carry: offset bound above
        ctr[:, :, 1] = streams[:, None]
        flat = ctr.reshape(n * blocks, 2)
        step = max(1, _CHUNK_BLOCKS // blocks)
        chunk = np.empty((min(n, step) * blocks, 2), dtype="<u8")
        return _encrypted_uniforms(ecb, n, draws, step, chunk, lambda r0, m: np.copyto(
            chunk[:m], flat[r0 * blocks:r0 * blocks + m]))

    def generator(self) -> np.random.Generator:
        """A numpy Generator for non-mechanism uses (simulation data, bootstrap)."""
        if self._key is None:
            return self._gen
        # A key of its own (never the mechanisms' key), one 2^64-block stream per call.
        key = _key_from_seed(self.seed if self._run_key is None else self._run_key, "generator")
        g = np.random.Generator(AESCounter(key=key, counter=self._next_generator << 64))
        self._next_generator += 1
        return g


def _aes_ecb(key: int):
    """An AES-128-ECB encryptor for ``key`` (as randomgen's AESCounter keys it: the integer's
    16 little-endian bytes), or None without the ``cryptography`` package (a dependency of
    apache-beam; the core falls back to one AESCounter per record)."""
    try:
        # lazy: cryptography costs 0.014 s (21 modules) at import (measured); `ldp-beam --help`
        # and the device client load this module, and only seeded or keyed draws need AES-ECB
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    except ImportError:  # pragma: no cover - installed with apache-beam
        return None
    return Cipher(algorithms.AES(key.to_bytes(16, "little")), modes.ECB()).encryptor()


_CHUNK_BLOCKS = 1 << 13  # counter blocks encrypted at a time (128 KiB: the scratch stays in cache)
_TWO_TO_MINUS_53 = 1.0 / 9007199254740992.0


def _counter_uniforms(ecb, counter: int, n: int, draws: int) -> np.ndarray:
    """What :meth:`RandomSource._generator_uniforms` returns (bit for bit: AESCounter's block i
    is AES_k(counter + i), the 128-bit counter little-endian), computed with OpenSSL's AES-ECB
    over the counter blocks: pipelined AES-NI, ~10 GB/s here against randomgen's ~3 GB/s, and
    the draws were the batch path's largest cost. The caller checks that ``counter``'s low word
    does not wrap within the ``n * blocks`` blocks."""
    blocks = (draws + 1) // 2
    step = max(1, _CHUNK_BLOCKS // blocks)  # records per chunk
    ctr = np.empty((min(n, step) * blocks, 2), dtype="<u8")
    ctr[:, 1] = counter >> 64
    low, base = counter & _MASK64, np.arange(ctr.shape[0], dtype=np.uint64)
    return _encrypted_uniforms(ecb, n, draws, step, ctr, lambda r0, m: np.add(
        base[:m], np.uint64(low + r0 * blocks), out=ctr[:m, 0]))


def _encrypted_uniforms(ecb, n: int, draws: int, step: int, ctr: np.ndarray, fill) -> np.ndarray:
    """The ``(n, draws)`` column-contiguous doubles numpy's ``Generator.random`` makes of the
    encryptions of records' counter blocks: ``(x >> 11) * 2**-53`` per 64-bit word, record
    ``i`` owning ``blocks = (draws + 1) // 2`` consecutive blocks. Done ``step`` records at a
    time: ``fill(r0, m)`` writes the first ``m`` rows of ``ctr`` (little-endian uint64: low,
    high word) with the blocks of records ``r0 ..``; they are encrypted into one small buffer,
    reused (fresh megabyte temporaries cost more in page faults here than the AES itself;
    ``update`` would also return a new bytes object)."""
    blocks = (draws + 1) // 2
    u = np.empty((n, draws), order="F")
    out = np.empty(2 * ctr.shape[0] + 2, dtype="<u8")  # update_into wants one block more
    out8 = out.view(np.uint8)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        m = (r1 - r0) * blocks
        fill(r0, m)
        ecb.update_into(ctr[:m].reshape(-1).view(np.uint8), out8[:16 * m + 16])
        words = out[:2 * m].reshape(r1 - r0, 2 * blocks)
        np.right_shift(words, np.uint64(11), out=words)
        words = words.view(np.int64)  # < 2^53 now: the same values, a faster conversion
        for d in range(draws):  # exact: x >> 11 < 2^53 is a double, and 2^-53 scales exactly
            np.multiply(words[:, d], _TWO_TO_MINUS_53, out=u[r0:r1, d], casting="unsafe")
    return u


RngLike = Union[None, int, str, RandomSource, np.random.Generator]


def as_source(rng: RngLike) -> RandomSource | np.random.Generator:
    """Normalize the ``rng`` argument of the core API.

    ``None`` -> a fresh OS-entropy source; an int/str -> a seeded source; a RandomSource or a numpy
    Generator is used as is (a Generator supplies ``random((n, draws))`` directly).
    """
    if rng is None or isinstance(rng, (int, np.integer, str, bytes)) \
            and not isinstance(rng, (bool, np.bool_)):
        return RandomSource(rng)
    if isinstance(rng, (RandomSource, np.random.Generator)):
        return rng
    raise TypeError(f"rng must be None, a seed, a RandomSource or a numpy Generator, "
                    f"not {type(rng).__name__}")


def draw_uniforms(rng: RandomSource | np.random.Generator, n: int, draws: int, *,
                  stream: int | None = None, offset: int | None = None) -> np.ndarray:
    if isinstance(rng, np.random.Generator):
        return np.asfortranarray(rng.random((n, draws)))
    return rng.uniforms(n, draws, stream=stream, offset=offset)
