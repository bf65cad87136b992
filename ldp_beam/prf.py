"""Every keyed hash in ldp-beam, in one module, by how long its output must stay the same.

**A run's** (keyed by its :class:`~ldp_beam.rng.RunKey`, recomputed by a retry, never stored):
SipHash-2-4 of many messages at once (:func:`siphash_words`; the Arrow text adapter,
``siphash_text``, sits with its one caller in :mod:`ldp_beam.bounding`), the first 64 bits of
an AES-128 block (:func:`aes_prf`) and a record's priority as the block at its counter of the
addressable AES-CTR stream that draws the noise (:func:`row_priorities`). They hash millions of
rows a second, vectorized in numpy or in OpenSSL's AES; why each is uniform and retry-proof is
in :mod:`ldp_beam.bounding`.

**Durable** (their outputs are stored or sent, so the bytes can never change):
:func:`keyed_digest`, BLAKE2b under a secret key, for what outlives a run: the streaming
collector's unit hashes and record and memo slots in ``units.sqlite``, memoized reports' ids
and a device's report ids under its ``id_key``. Changing it would orphan every unit's
recorded spend, so it is not replaced by the faster per-run hashes.

**Sub-keys** for both: :func:`derive_key` (SHA-256 of a label path and the secret), the one way
a run key, a state file's secret or a device secret is split into independent keys per use.

Pure: numpy, randomgen and ``cryptography``'s AES (loaded by :func:`aes_prf` when first
called: a device imports this module for its memoization and report ids, and loads neither
pyarrow nor cryptography)."""
from __future__ import annotations

import hashlib
import sys
import threading

import numpy as np
from randomgen import AESCounter

U64 = np.uint64
_MASK64 = (1 << 64) - 1
_AES_GAP = 1 << 13  # records: drawing a gap this long costs about what a new AES generator does


def _key_words(key: bytes) -> tuple[int, int]:
    return int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")


def _rotl(x: np.ndarray, b: int, tmp: np.ndarray) -> None:
    np.right_shift(x, U64(64 - b), out=tmp)
    np.left_shift(x, U64(b), out=x)
    np.bitwise_or(x, tmp, out=x)


def _sip_rounds(v0, v1, v2, v3, tmp, rounds: int) -> None:
    for _ in range(rounds):
        v0 += v1
        _rotl(v1, 13, tmp)
        v1 ^= v0
        _rotl(v0, 32, tmp)
        v2 += v3
        _rotl(v3, 16, tmp)
        v3 ^= v2
        v0 += v3
        _rotl(v3, 21, tmp)
        v3 ^= v0
        v2 += v1
        _rotl(v1, 17, tmp)
        v1 ^= v2
        _rotl(v2, 32, tmp)


def siphash_words(key: tuple[int, int], words: list[np.ndarray]) -> np.ndarray:
    """SipHash-2-4 (the reference PRF, as CPython and pandas use it) of ``n`` messages at once,
    given as their 64-bit little-endian words (``words[j][i]``: word ``j`` of message ``i``),
    the last word carrying the message length in its top byte, as the algorithm pads it."""
    k0, k1 = key
    n = len(words[0])
    v0 = np.full(n, U64(k0 ^ 0x736F6D6570736575))
    v1 = np.full(n, U64(k1 ^ 0x646F72616E646F6D))
    v2 = np.full(n, U64(k0 ^ 0x6C7967656E657261))
    v3 = np.full(n, U64(k1 ^ 0x7465646279746573))
    tmp = np.empty(n, U64)
    with np.errstate(over="ignore"):
        for m in words:
            v3 ^= m
            _sip_rounds(v0, v1, v2, v3, tmp, 2)
            v0 ^= m
        v2 ^= U64(0xFF)
        _sip_rounds(v0, v1, v2, v3, tmp, 4)
    v0 ^= v1
    v0 ^= v2
    v0 ^= v3
    return v0


def derive_key(secret: bytes, *labels: str) -> bytes:
    """A 32-byte sub-key of ``secret`` for one use: SHA-256 of ``ldp-beam/<label>/.../<secret>``
    (the labels joined by ``/``, the secret last). Every key ldp-beam splits off a run key, a
    state file's secret or a device secret comes from here, with fixed labels per use; the
    bytes are those stored state was keyed with, so they never change."""
    return hashlib.sha256(b"/".join([b"ldp-beam", *(lab.encode() for lab in labels),
                                     bytes(secret)])).digest()


def keyed_digest(key: bytes, data: bytes, size: int = 16) -> bytes:
    """BLAKE2b of ``data`` keyed by ``key`` (at most 64 bytes: a :func:`derive_key` output),
    ``size`` bytes: the durable keyed hash (see the module's text)."""
    return hashlib.blake2b(data, key=key, digest_size=size).digest()


_SCRATCH = threading.local()


def _scratch(rows: int) -> np.ndarray:
    """A ``(rows, 2)`` uint64 work buffer of this thread, reused across calls: a fresh 1 MB
    temporary per batch cost more in page faults than the AES it holds (callers copy out what
    they keep before the next call)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.shape[0] < rows:
        buf = _SCRATCH.buf = np.empty((max(rows, 1 << 16), 2), U64)
    return buf[:rows]


def aes_prf(key: bytes, lo: np.ndarray, hi: np.ndarray | int) -> np.ndarray:
    """The first 64 bits of ``AES-128_key(lo[i] || hi[i])`` (two little-endian 64-bit words:
    one block) for every ``i``, read as a little-endian integer. AES is a pseudorandom
    permutation, hence a pseudorandom function of the block (the switching distance,
    ``q^2 / 2^129`` for ``q`` blocks, is negligible); OpenSSL's AES-NI code (through
    ``cryptography``, which Beam depends on) takes ~5 ns a block, ~30x less than SipHash in
    numpy. The blocks are encrypted in place (one buffer)."""
    # lazy: cryptography, 32 ms at import (measured on the device client), which the device
    # side of this module (keyed_digest, derive_key) never needs
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    n = int(np.size(lo))
    if n == 0:
        return np.empty(0, U64)
    blk = _scratch(n + 1)  # update_into asks for one spare block
    blk[:n, 0] = lo
    blk[:n, 1] = hi
    if sys.byteorder != "little":
        blk = blk.byteswap()
    buf = memoryview(blk).cast("B")
    enc = Cipher(algorithms.AES(key[:16]), modes.ECB()).encryptor()
    enc.update_into(buf[:16 * n], buf)
    enc.finalize()
    first = blk[:n, 0]
    return first.byteswap() if sys.byteorder != "little" else first.copy()


def row_priorities(key: int, stream: int, ids: np.ndarray) -> np.ndarray:
    """The first 64 bits of the AES-128 block ``AES_key(stream * 2**64 + id)`` for each record
    number in ``ids`` (increasing): one block per record, so a record's priority does not
    depend on the batch or subset it arrives in. ``key`` is the integer randomgen's
    ``AESCounter`` takes (its bytes are the key little-endian first), and the block of counter
    ``stream * 2**64 + id`` (``0 <= id < 2**64``) is ``id || stream`` in little-endian words:
    the same blocks, encrypted by :func:`aes_prf` (no generator to build, any gaps)."""
    if ids.size == 0:
        return np.empty(0, U64)
    if int(ids.min()) >= 0:  # no borrow into the stream word: one block a record, as the counter
        return aes_prf(int(key).to_bytes(16, "little"), ids.astype(np.int64, copy=False)
                       .view(U64), U64(int(stream) & _MASK64))
    return _row_priorities_ctr(key, stream, ids)


def _row_priorities_ctr(key: int, stream: int, ids: np.ndarray) -> np.ndarray:
    """:func:`row_priorities` by randomgen's AES counter generator (any record numbers)."""
    base = (int(stream) & _MASK64) << 64
    # A new generator costs about as much as drawing ~8,000 blocks: the span is drawn whole,
    # except across gaps longer than that (so a sparse subset costs at most ~2x its best plan).
    cuts = np.flatnonzero(np.diff(ids) > _AES_GAP) + 1
    out = []
    for r in np.split(ids, cuts):
        lo = int(r[0])
        raw = AESCounter(key=key, counter=base + lo).random_raw(2 * (int(r[-1]) - lo + 1))
        out.append(raw[0::2][r - lo])
    return out[0] if len(out) == 1 else np.concatenate(out)


__all__ = ["U64", "aes_prf", "derive_key", "keyed_digest", "row_priorities", "siphash_words"]
