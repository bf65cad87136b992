"""Keyed pseudorandom functions over numpy arrays, the bounding's only randomness (pure: numpy,
pyarrow and ``cryptography``'s AES): SipHash-2-4 of text (:func:`siphash_text`,
:func:`siphash_words`), the first 64 bits of an AES-128 block (:func:`aes_prf`) and a record's
priority as the block at its counter of the addressable AES-CTR stream that draws the noise
(:func:`row_priorities`). Why each is uniform and retry-proof, and which key each use takes, is
in :mod:`ldp_beam.bounding`.

These are keyed by a run's key and live as long as the run. What must outlive a run, the
streaming collector's per-unit record (``units.sqlite``), is keyed by
:func:`ldp_beam.longitudinal.keyed_digest` (BLAKE2b, 128 bits, under the state file's own key),
which the device side shares and which therefore imports nothing heavy."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pyarrow as pa
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
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


def siphash_text(key: tuple[int, int], arr: pa.Array) -> np.ndarray:
    """SipHash-2-4 of every value of a string or binary Arrow array (its UTF-8 bytes; nulls hash
    as empty), vectorized: values are grouped by their number of 64-bit words and each group is
    gathered from the array's own buffers and hashed at once."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    out = np.empty(n, U64)
    if n == 0:
        return out
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64 if wide else np.int32)[
        arr.offset: arr.offset + n + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else \
        np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lens = np.diff(offsets)
    if arr.null_count:
        lens = np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, lens)
    nwords = lens // 8 + 1
    # 64-bit little-endian loads at any byte offset q: lanes[q % 8, q // 8] (the bytes copied
    # 8 times, each copy shifted by one byte, so every load is an aligned gather)
    m = data.size // 8 + 2
    pad = np.zeros(8 * m + 8, np.uint8)
    pad[:data.size] = data
    lanes = np.stack([pad[r: r + 8 * m].view("<u8") for r in range(8)]).astype(U64, copy=False)
    if nwords.min() == nwords.max():
        groups = [np.arange(n)]
    else:
        order = np.argsort(nwords, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(nwords[order])) + 1)
    for idx in groups:
        w = int(nwords[idx[0]])
        ln, st = lens[idx], starts[idx]
        words = [lanes[(st + 8 * j) % 8, (st + 8 * j) // 8] for j in range(w)]
        tail = (ln % 8).astype(U64) * U64(8)  # bits of the last, partial word
        with np.errstate(over="ignore"):
            mask = np.where(tail == 0, U64(0), (U64(1) << tail) - U64(1))
        words[-1] &= mask
        words[-1] |= (ln.astype(U64) & U64(0xFF)) << U64(56)  # the length byte ends it
        out[idx] = siphash_words(key, words)
    return out


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


__all__ = ["U64", "aes_prf", "row_priorities", "siphash_text", "siphash_words"]
