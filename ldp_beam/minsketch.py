"""The one-row bounding sketch: per privacy unit, the row of smallest ``(priority, stream,
record)``, for the default of an LDP collection (``Linf = 1``, no partitions), where
:mod:`ldp_beam.bounding`'s sorted reduction would sort every row. Open-addressing hash tables
(:class:`_MinTable`) in shards by unit hash (:class:`_MinSketch`), filled by the C loop of
``ldp_beam/_minsketch.c`` on a background thread where it was compiled and by vectorized numpy
rounds otherwise (``LDP_BEAM_NO_NATIVE=1`` forces them): the same tables either way. The plan,
the memory it takes and why the kept rows are uniform are in :mod:`ldp_beam.bounding`, whose
rule this keeps exactly (tested against :func:`~ldp_beam.bounding.reduce_candidates`). Pure:
numpy, pyarrow and the optional extension, no Beam.
"""
from __future__ import annotations

import ctypes
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from .bounding import _MASK64, U64, KeptRows, _Ids
from .prf import aes_prf

try:  # the insert loop in C (ldp_beam/_minsketch.c: an optional extension; numpy otherwise)
    from ldp_beam import _minsketch as _NATIVE
except ImportError:  # not compiled (no compiler where the package was built)
    _NATIVE = None
if os.environ.get("LDP_BEAM_NO_NATIVE"):  # the numpy rounds, for comparison (bench, tests)
    _NATIVE = None


_EMPTY = U64(_MASK64)  # a slot's row reference while it holds no row (and its priority)
_REF_BITS = 48  # a packed row reference: stream index << 48 | record number
_REF_MASK = U64((1 << _REF_BITS) - 1)
_MAX_STREAMS = (1 << (64 - _REF_BITS)) - 1  # indices 0..65534: a packed reference is never _EMPTY
_TABLE_MIN = 4096  # slots of a new table
_TABLE_LOAD = 0.6  # most units per slot after an insert: probing stays short (3.6 probes a miss)
_TABLE_FULL = 0.9  # most units per slot while a chunk goes in (each row could be a new unit)
_TABLE_GROW = 1.5  # a full table grows by half: it holds 2/5 to 3/5 of its slots
_TABLE_PAD = 64  # slots past the last home slot, so a sorted rebuild needs no wrap-around
_QUEUE = 4  # C inserts a sketch may have queued or running (62,500-row batches: ~6 MB of rows)
_WINDOW = 32  # slots a probing round reads per row once few rows are left
_SLOT = np.dtype((np.void, 16))  # a slot's unit hash and priority as one item: one gather


def _home(u: np.ndarray, size: int) -> np.ndarray:
    """The home slot of each unit hash in a table of ``size`` slots: bits 1-32 of the hash
    (above its fixed lowest bit; the top bits choose the shard of a _MinSketch) scaled to
    ``size`` by a multiply and shift, so any size works and the slot grows with the hash."""
    return ((((u >> U64(1)) & U64(0xFFFFFFFF)) * U64(size)) >> U64(32)).astype(np.int64)


_POOL: Any = None  # (process id, executor)


def _background() -> Any:
    """The one thread that runs the C inserts of every sketch in this process (each sketch
    waits for its own insert before the next, so one thread is enough). A forked worker
    process gets its own (the parent's thread does not exist there)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="ldp-beam-bounding"))
    return _POOL[1]


def _native_insert(tables: list, names: np.ndarray | None, u: np.ndarray, prio: np.ndarray,
                   ref: np.ndarray, s: np.ndarray | None) -> list[int]:
    """Rows into ``tables`` (a power of two of :class:`_MinTable`, row ``i`` into the one the
    top bits of ``u[i]`` name) by the C loop; the units each table claimed."""
    c = np.ascontiguousarray
    return _NATIVE.insert([(t.kp, t.ref, t.s, t.size) for t in tables], names, c(u, U64),
                          c(prio, U64), c(ref, U64), None if s is None else c(s, U64))


class _MinTable:
    """The bounding sketch for one row per unit and one partition (``Linf = 1``, no
    ``partition_fn``, the LDP default): per unit, the row of smallest ``(priority, stream,
    record)``. An open-addressing hash table (linear probing, at most 3/5 full between inserts)
    indexed by the keyed unit hash, whose slots hold the unit hash (0: empty; hashes have their
    low bit set) and the smallest priority seen, side by side (one 16-byte gather reads both),
    and that row's reference: 24 bytes a slot (32 in wide mode, see :class:`_MinSketch`),
    40-60 bytes a unit, never the rows. A batch of candidates is inserted with vectorized
    probing; only the rows at or below their unit's current priority (about ``H_n / n`` of a
    unit's ``n`` rows) go on to ``np.minimum.at``: no sort, O(1) per row. Two rows of a unit
    with the same 64-bit priority (about ``rows^2 / 2^65`` per unit) are told apart by
    ``(stream, record)`` in a per-slot loop, so the result is the exact minimum whatever the
    order the rows arrive in: merging tables, or inserting rows in any batches, gives the same
    table.

    A table grows by half when full, rebuilt by placing its units in the order of their home
    slots (then each one's slot is a running maximum: no probing, no wrap-around). Frozen
    (:meth:`freeze`), it keeps only its held entries and rebuilds itself when a row comes."""

    __slots__ = ("size", "kp", "slots", "keys", "prio", "ref", "s", "units", "frozen",
                 "streams", "names")

    def __init__(self, streams: list | None = None, wide: bool = False,
                 size: int = _TABLE_MIN) -> None:
        self.streams = streams if streams is not None else []  # packed stream index -> stream
        self.names = None  # self.streams as an array, for the C insert's ties
        self.units = 0
        self.frozen = None
        self._alloc(size, size + _TABLE_PAD, wide)

    def _alloc(self, size: int, alloc: int, wide: bool) -> None:
        """Empty slots: unit hash 0. The numpy rounds also read an empty slot's priority and
        reference (both ``_EMPTY``); the C loop never does, so there the table is zeroed memory
        the kernel hands over untouched (``calloc``: no pass filling it)."""
        if _NATIVE is not None:
            kp, ref = np.zeros((alloc, 2), U64), np.zeros(alloc, U64)
        else:
            kp = np.empty((alloc, 2), U64)
            kp[:, 0] = 0
            kp[:, 1] = _EMPTY
            ref = np.full(alloc, _EMPTY, U64)
        self.size, self.kp = size, kp
        self.slots = kp.view(_SLOT).reshape(alloc)
        self.keys, self.prio = kp[:, 0], kp[:, 1]
        self.ref = ref
        self.s = np.zeros(alloc, U64) if wide else None

    def _drop(self) -> None:
        self.kp = self.slots = self.keys = self.prio = self.ref = self.s = None

    @property
    def wide(self) -> bool:
        return (self.frozen[3] if self.frozen is not None else self.s) is not None

    # Pickled as its held entries only (24 bytes a unit, not a slot); unpickled, it stays so
    # until a row is added (extracting the kept rows needs no table).
    def __getstate__(self):
        return self.entries() + (self.units,)

    def __setstate__(self, state):
        self._drop()
        self.streams, self.names = [], None
        self.frozen, self.units = tuple(state[:4]), state[4]

    def entries(self) -> tuple:
        """The held units: (unit hashes, priorities, references, streams or None)."""
        if self.frozen is not None:
            return self.frozen
        occ = np.flatnonzero(self.keys)
        return (self.keys[occ], self.prio[occ], self.ref[occ],
                None if self.s is None else self.s[occ])

    def freeze(self) -> None:
        """Keep the held entries only (the table's slots are freed)."""
        if self.frozen is None:
            self.frozen = self.entries()
            self._drop()

    def _thaw(self) -> None:
        if self.frozen is not None:
            held, self.frozen = self.frozen, None
            self._place(held, max(_TABLE_MIN, int(held[0].size / _TABLE_LOAD) + 1))

    def _place(self, held: tuple, size: int) -> None:
        """A table of ``size`` slots holding ``held`` (distinct units): units in the order of
        their home slots, each at the first slot past the previous one's and not before its
        home (a running maximum), which is where linear probing would put them."""
        u, p, ref, s = held
        if _NATIVE is not None:  # distinct units into an empty table: probing claims, in C
            self._alloc(size, size + _TABLE_PAD, s is not None)
            self.units = _native_insert([self], self._names(), u, p, ref, s)[0]
            return
        h = _home(u, size)
        order = np.argsort(h, kind="stable")  # nearly sorted when rebuilt from a table: runs
        h = h[order]
        ar = np.arange(h.size, dtype=np.int64)
        pos = ar + np.maximum.accumulate(h - ar) if h.size else h
        self._alloc(size, max(size, int(pos[-1]) + 1 if h.size else 0) + _TABLE_PAD,
                    s is not None)
        self.keys[pos], self.prio[pos], self.ref[pos] = u[order], p[order], ref[order]
        if s is not None:
            self.s[pos] = s[order]
        self.units = int(h.size)

    def widen(self) -> None:
        """Packed references -> (stream, record) in two columns (see :class:`_MinSketch`)."""
        if self.wide:
            return
        names = np.array(self.streams + [0], U64)
        if self.frozen is not None:
            u, p, ref, _ = self.frozen
            self.frozen = (u, p, ref & _REF_MASK, names[(ref >> U64(_REF_BITS)).astype(np.int64)])
            return
        self.s = np.zeros(self.ref.size, U64)
        occ = np.flatnonzero(self.keys)
        r = self.ref[occ]
        self.s[occ] = names[(r >> U64(_REF_BITS)).astype(np.int64)]
        self.ref[occ] = r & _REF_MASK

    def add(self, u: np.ndarray, prio: np.ndarray, ref: np.ndarray,
            s: np.ndarray | None = None) -> None:
        """Insert candidate rows: unit hashes, priorities, references (and streams in wide
        mode). Rows go in by chunks that cannot fill the table past 9/10 even if each is a new
        unit (most are not: a unit's later rows find it held), and the table grows by half (or
        more) when an insert has left it more than 3/5 full, or before a chunk when its room is
        below 1/16 of it: so it is 2/5 to 3/5 full between inserts and chunks stay large (at
        3/4, probing a table as it fills measured ~30% slower)."""
        self._thaw()
        i, n = 0, int(u.size)
        while i < n:
            room = int(_TABLE_FULL * self.size) - self.units
            if room < min(n - i, max(self.size // 16, 256)):
                self._grow(n - i)
                continue
            j = min(n, i + room)
            self._add(u[i:j], prio[i:j], ref[i:j], None if s is None else s[i:j])
            i = j
            if self.units > _TABLE_LOAD * self.size:
                self._grow(n - i)

    def _grow(self, rows: int) -> None:
        need = self.units + min(rows, max(self.size // 16, 256))
        size = max(int(self.size * _TABLE_GROW), int(need / _TABLE_LOAD) + 1)
        if _NATIVE is not None and self.frozen is None:  # slot to slot in C, no entries
            old = (self.kp, self.ref, self.s)
            self._alloc(size, size + _TABLE_PAD, self.s is not None)
            self.units = _NATIVE.rehash(*old, (self.kp, self.ref, self.s, self.size))
            return
        self._place(self.entries(), size)

    def _slots(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slot of each unit hash and the priority it holds, claiming empty slots for new
        units (vectorized linear probing: each round resolves the rows whose slot holds their
        unit or was empty; rows racing for one empty slot: the unit written last holds it, the
        others probe on)."""
        keys, alloc = self.keys, self.keys.size
        pos = _home(u, self.size)
        g = self.slots[pos].view(U64)  # the home slots' (unit, priority) pairs
        k, cur = g[0::2], g[1::2]
        slot = pos
        idx = np.flatnonzero(k != u)
        if idx.size == 0:
            return slot, cur
        u, pos = u[idx], pos[idx] - 1  # the others probe on from their home slot
        while True:  # the others: the next slot a round, then a window once few rows are left
            w = 1 if idx.size > 1024 else _WINDOW
            if w == 1:
                pos += 1
                pos[pos == alloc] = 0
                q, win = pos, keys[pos]
                eq = win == u
                stop = eq | (win == 0)  # its unit, or an empty slot: the unit is not held
                found, at, first_eq = stop, pos, eq
                nxt = pos
            else:
                q = pos[:, None] + np.arange(1, w + 1, dtype=np.int64)
                q[q >= alloc] -= alloc
                win = keys[q]
                eq = win == u[:, None]
                stop = eq | (win == 0)
                j = stop.argmax(axis=1)
                r = np.arange(idx.size)
                found, at, first_eq = stop[r, j], q[r, j], eq[r, j]
                nxt = pos + w
            new = np.flatnonzero(found & ~first_eq)
            if new.size:  # claim the empty slots; of units racing for one, the last written wins
                fp, fu = at[new], u[new]
                keys[fp] = fu
                lost = new[keys[fp] != fu]
                if lost.size:
                    found = found.copy()
                    found[lost] = False
                    nxt = nxt.copy()
                    nxt[lost] = at[lost]  # probe on past the slot another unit took
            done = np.flatnonzero(found)
            ph = at[done]
            slot[idx[done]] = ph
            cur[idx[done]] = self.prio[ph]
            if done.size == idx.size:
                return slot, cur
            rest = np.flatnonzero(~found)
            idx, u, pos = idx[rest], u[rest], nxt[rest]
            pos[pos >= alloc] -= alloc

    def _names(self) -> np.ndarray | None:
        """The streams by packed index, as an array (for the C insert's ties; None when
        wide)."""
        if self.s is not None:
            return None
        if self.names is None or self.names.size != len(self.streams):
            self.names = np.array(self.streams, U64)
        return self.names

    def _add(self, u: np.ndarray, prio: np.ndarray, ref: np.ndarray,
             s: np.ndarray | None) -> None:
        if _NATIVE is not None:  # the same table, one C loop (ldp_beam/_minsketch.c)
            self.units += _native_insert([self], self._names(), u, prio, ref, s)[0]
            return
        slot, cur = self._slots(u)
        c = np.flatnonzero(prio <= cur)  # the others cannot be their unit's minimum
        if c.size == 0:
            return
        sc, pc_ = slot[c], prio[c]
        np.minimum.at(self.prio, sc, pc_)
        w = np.flatnonzero(pc_ == self.prio[sc])  # rows at their unit's minimum
        win, ws = c[w], sc[w]
        held = self.ref[ws] != _EMPTY
        tie_held = held & (prio[win] == cur[win])  # equal to the row the slot held already
        # two new rows at one slot's minimum: one of them loses a scatter of row numbers
        mark = np.empty(self.ref.size, np.int32)  # only the slots written are read back
        nums = np.arange(ws.size, dtype=np.int32)
        mark[ws] = nums
        tie_batch = ws[mark[ws] != nums]
        if tie_held.any() or tie_batch.size:
            contested = np.unique(np.concatenate([ws[tie_held], tie_batch]))
            self._settle(contested, set(ws[tie_held].tolist()), win, ws, ref, s)
            keep = ~np.isin(ws, contested)
            win, ws, held = win[keep], ws[keep], held[keep]
        self.units += int(win.size - np.count_nonzero(held))
        self.ref[ws] = ref[win]
        if s is not None:
            self.s[ws] = s[win]

    def _ident(self, ref: int, s: int | None) -> tuple[int, int]:
        """A row's identity ``(stream, record)`` from its reference."""
        if s is not None:
            return s, ref - (1 << 64) if ref >= 1 << 63 else ref  # the record number, signed
        return int(self.streams[ref >> _REF_BITS]), ref & ((1 << _REF_BITS) - 1)

    def _settle(self, contested: np.ndarray, held_ties: set, win: np.ndarray, ws: np.ndarray,
                ref: np.ndarray, s: np.ndarray | None) -> None:
        """Slots where several rows share the smallest priority: the smallest ``(stream,
        record)`` among them takes the slot (with the row it held, when that one ties too:
        ``held_ties``)."""
        for slot in contested.tolist():
            rows = [(int(ref[j]), None if s is None else int(s[j]))
                    for j in win[ws == slot].tolist()]
            fresh = int(self.ref[slot]) == _MASK64
            if slot in held_ties:
                rows.append((int(self.ref[slot]), None if s is None else int(self.s[slot])))
            r, st = min(rows, key=lambda x: self._ident(*x))
            self.ref[slot] = U64(r)
            if st is not None:
                self.s[slot] = U64(st)
            self.units += int(fresh)


_FLUSH = 1 << 15  # pending rows of a shard before they go into its table


def _trim_heap() -> None:
    """Hand the freed heap back to the operating system (glibc's ``malloc_trim``), where there
    is one: the tables' slots are freed shard by shard, and glibc keeps arrays of a few MB in
    its heap once it has raised its mmap threshold, so the next stage (the filter, its reads)
    would otherwise run on top of the first pass's peak."""
    global _LIBC
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC(0)
    pa.default_memory_pool().release_unused()  # Arrow's own pool (the first read's buffers)


_LIBC: Any = None
_MIN_SHARD_BITS = 4  # 16 shards: the top 4 bits of the unit hash


def _by_shard(u: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Rows ordered by the shard of their unit hash, and where each shard's rows end."""
    shard = (u >> U64(64 - _MIN_SHARD_BITS)).astype(np.uint8)
    order = np.argsort(shard, kind="stable")  # a radix sort for 8-bit keys
    return order, np.cumsum(np.bincount(shard, minlength=1 << _MIN_SHARD_BITS)).tolist()


class _MinSketch:
    """:class:`_MinTable` split in 16 shards by the top 4 bits of the unit hash. Rows wait in
    their shard's queue (at most 32,768, 24 bytes each: at most 12 MB in all) and go into the
    shard's table together: each table is 1/16 of the sketch (~3 MB for a million units), so its
    probing and updates mostly hit the processor's cache, a table that grows copies 1/16 of the
    sketch, and each insert is large enough to amortize its Python steps. Same result as one
    table: a unit lives in one shard.

    A row is referenced by one 64-bit word, its stream's index in :attr:`streams` (the sketch's
    own numbering, in order of arrival) above its record number (48 bits). A record number
    outside ``[0, 2^48)`` or more than 65,535 streams turn the sketch *wide* for good: streams
    and record numbers in two columns (32 bytes a slot). The choice of rows does not depend on
    the mode: ties are broken on the decoded ``(stream, record)``.

    :meth:`freeze` (the combine's ``compact``, before Beam encodes the sketch) replaces the
    tables by their held entries sorted by reference (by stream, then record number: the order
    :class:`KeptRows` wants), table by table so the slots are freed as the entries are
    gathered. Encoded, a frozen sketch is its unit hashes (8 bytes a unit) and the gaps between
    its sorted references (2 bytes a unit when kept rows are < 65,536 records apart, else 4 or
    8); the priorities are left out when the sketch knows the row key (:attr:`key`, set by the
    combine, never encoded), which recomputes them (one AES block a unit) only if rows are added
    or sketches merged after decoding. A frozen sketch thaws back into tables when rows come."""

    __slots__ = ("tables", "pending", "queued", "streams", "index", "wide", "frozen", "key",
                 "inflight")

    def __init__(self, key: bytes | None = None) -> None:
        self.tables: list = [None] * (1 << _MIN_SHARD_BITS)
        self.pending: list = [[] for _ in range(1 << _MIN_SHARD_BITS)]
        self.queued = [0] * (1 << _MIN_SHARD_BITS)
        self.streams: list[int] = []  # stream index -> stream
        self.index: dict[int, int] = {}  # stream -> stream index
        self.wide = False
        self.frozen = None  # (u, priorities or None, references, streams or None, units)
        self.key = key  # the row key's AES key (see row_priorities), or None
        self.inflight: deque = deque()  # C inserts queued or running in the background

    def __getstate__(self):
        self.freeze()
        u, p, ref, s, units = self.frozen
        if not self.wide:  # sorted references, as their gaps (an _Ids below 2^63)
            if not isinstance(ref, _Ids):  # references past 2^63 (over 32,767 streams)
                gaps = np.diff(ref, prepend=U64(0))
                top = int(gaps.max()) if gaps.size else 0
                ref = gaps.astype(np.uint16 if top < 1 << 16 else np.uint32 if top < 1 << 32
                                  else U64)
            if self.key is not None:
                p = None  # recomputed from the key if ever needed
        return self.streams, self.wide, units, u, p, ref, s

    def __setstate__(self, state):
        self.__init__()
        self.streams, self.wide, units, u, p, ref, s = state
        if not self.wide and not isinstance(ref, _Ids):
            ref = np.cumsum(ref, dtype=U64)
        self.frozen = (u, p, ref, s, units)
        self.index = {x: i for i, x in enumerate(self.streams)}

    def _settle(self, keep: int = 0) -> None:
        """Wait for the C inserts queued in the background until at most ``keep`` are left
        (the first error is raised here, after the queue is drained): every method that reads
        or changes the tables calls this first with ``keep=0``."""
        error = None
        while len(self.inflight) > keep:
            try:
                self.inflight.popleft().result()
            except BaseException as exc:  # noqa: BLE001 - raised below, once all have run
                if error is None:
                    error = exc
                keep = 0  # a failed insert: the rest of the queue is waited for too
        if error is not None:
            raise error

    @property
    def units(self) -> int:
        self._settle()
        if self.frozen is not None:
            return self.frozen[4]
        return sum(t.units for t in self.tables if t is not None)

    def _stream_index(self, stream: int) -> int | None:
        i = self.index.get(stream)
        if i is None:
            if len(self.streams) >= _MAX_STREAMS:
                return None
            i = self.index[stream] = len(self.streams)
            self.streams.append(stream)
        return i

    def _refs(self, s: np.ndarray, rid: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Row references (and streams, in wide mode) of rows of streams ``s`` (one per row, or
        one for all) and record numbers ``rid``; turns the sketch wide when they do not pack."""
        s = np.asarray(s, U64).reshape(-1)
        rid = np.asarray(rid, np.int64)
        n = rid.size
        if not self.wide and n:
            if s.size == 1 or not (s != s[0]).any():
                code = self._stream_index(int(s[0]))
                codes = None if code is None else U64(code)
            else:
                names, inv = np.unique(s, return_inverse=True)
                idx = [self._stream_index(int(x)) for x in names.tolist()]
                codes = None if None in idx else np.array(idx, U64)[inv.reshape(-1)]
            if codes is not None and int(rid.min()) >= 0 and int(rid.max()) <= int(_REF_MASK):
                if s.size == 1 and codes == 0:
                    return rid.view(U64), None
                return rid.view(U64) | (codes << U64(_REF_BITS)), None
            self._widen()
        if not self.wide:
            return rid.view(U64), None
        return rid.view(U64), (np.full(n, s[0], U64) if s.size == 1 and n != 1 else s)

    def _widen(self) -> None:
        self._thaw()
        self.flush()
        for t in self.tables:
            if t is not None:
                t.widen()
        self.wide = True

    def add(self, u: np.ndarray, prio: np.ndarray, s: np.ndarray, rid: np.ndarray
            ) -> int | None:
        """Queue candidate rows (``s``: each row's stream, or one stream for all). Returns the
        units to check against the cap when tables took rows (else None): with the C insert,
        the units the tables held when this batch was queued (see :meth:`_add_native`)."""
        if self.frozen is not None:
            self._thaw()
        ref, sw = self._refs(s, rid)
        if _NATIVE is not None:
            return self._add_native(u, prio, ref, sw)
        order, ends = _by_shard(u)
        cols = (u[order], prio[order], ref[order]) + (() if sw is None else (sw[order],))
        grew, a = False, 0
        for k, b in enumerate(ends):
            if b > a:
                self.pending[k].append(tuple(c[a:b] for c in cols))
                self.queued[k] += b - a
                if self.queued[k] >= _FLUSH:
                    self._flush(k)
                    grew = True
            a = b
        return self.units if grew else None

    def _add_native(self, u: np.ndarray, prio: np.ndarray, ref: np.ndarray,
                    sw: np.ndarray | None) -> int:
        """:meth:`add` by one C call for all the shards: no queues by shard, no sort by shard
        (the C loop prefetches each row's slot a few rows ahead, which hides the misses the
        shard queues were there to avoid). Each table first grows, if need be, to take all its
        rows as new units below 9/10 full, and after the insert when it is more than 3/5 full
        (as :meth:`_MinTable.add`).

        The batch is queued for the one background thread (the C loop releases the GIL) behind
        at most ``_QUEUE - 1`` earlier ones, so the reading and hashing of the next batches
        overlap the inserts (with a single batch in flight, measured at 10^7 rows, the reading
        thread waited 0.15-0.17 s for them and the inserting thread idled as long). The growing
        and inserting both run there, in the order the batches came; every other method waits
        for the whole queue first (:meth:`_settle`). The result is the per-unit minimum, which
        does not depend on the order anyway. Returns the units the tables held when the batch
        was queued: the cap is checked against it late by at most ``_QUEUE`` batches (a few
        hundred thousand units at most), and exactly by every caller that settles
        (``extract_output``, merges)."""
        self._settle(keep=_QUEUE - 1)
        tables = self.tables  # its items are set by the background thread only
        before = sum(t.units for t in tables if t is not None)

        def insert() -> None:
            nt = 1 << _MIN_SHARD_BITS
            counts = np.bincount((u >> U64(64 - _MIN_SHARD_BITS)).astype(np.intp),
                                 minlength=nt).tolist()
            for k in range(nt):
                t = tables[k]
                if t is None:
                    t = tables[k] = _MinTable(self.streams, sw is not None)
                t._thaw()
                while t.units + counts[k] > _TABLE_FULL * t.size:
                    t._grow(counts[k])
            # the streams array (ties) as of now: every stream of this batch is registered
            got = _native_insert(tables, tables[0]._names(), u, prio, ref, sw)
            for t, g in zip(tables, got):
                t.units += g
                if t.units > _TABLE_LOAD * t.size:
                    t._grow(0)

        self.inflight.append(_background().submit(insert))
        return before

    def _flush(self, k: int) -> None:
        parts = self.pending[k]
        if not parts:
            return
        cols = parts[0] if len(parts) == 1 else \
            tuple(np.concatenate([p[j] for p in parts]) for j in range(len(parts[0])))
        self.pending[k], self.queued[k] = [], 0
        if self.tables[k] is None:
            self.tables[k] = _MinTable(self.streams, self.wide)
        self.tables[k].add(*cols)

    def flush(self) -> None:
        self._settle()
        for k in range(len(self.tables)):
            self._flush(k)

    def freeze(self) -> None:
        """Flush the queues and replace the tables by their held entries, sorted by reference
        in the narrow mode (see the class)."""
        self.flush()
        if self.frozen is not None:
            return
        n = self.units
        keep_p = self.key is None or self.wide
        u, ref = np.empty(n, U64), np.empty(n, U64)
        p = np.empty(n, U64) if keep_p else None
        s = np.empty(n, U64) if self.wide else None
        at = 0
        for k, t in enumerate(self.tables):
            if t is None:
                continue
            e = t.entries()
            m = e[0].size
            u[at: at + m], ref[at: at + m] = e[0], e[2]
            if p is not None:
                p[at: at + m] = e[1]
            if s is not None:
                s[at: at + m] = e[3]
            at += m
            self.tables[k] = e = t = None  # the table's slots go now
        if not self.wide and n:
            bits = max(n - 1, 1).bit_length()
            if int(ref.max()) < 1 << (63 - bits):  # reference and position in one word
                packed = np.left_shift(ref.view(np.int64), bits)
                packed |= np.arange(n, dtype=np.int64)
                if _NATIVE is not None:  # radix, ~4x numpy's sort at 10^6 (_minsketch.c)
                    _NATIVE.sort(packed.view(U64))  # non-negative: the same order as int64
                else:
                    packed.sort()
                order = packed & ((1 << bits) - 1)
                np.right_shift(packed, bits, out=packed)
                ref = packed.view(U64)
            else:
                order = np.argsort(ref, kind="stable")
                ref = ref[order]
            u = u[order]
            if p is not None:
                p = p[order]
            if int(ref[-1]) < 1 << 63:  # as gaps (~2 bytes a unit, not 8): see _Ids
                ref = _Ids(ref.view(np.int64))
        self.frozen = (u, p, ref, s, n)
        _trim_heap()

    def _thaw(self) -> None:
        """A frozen sketch back into tables (priorities recomputed from the key if left out)."""
        self._settle()
        if self.frozen is None:
            return
        u, p, _, s, _ = self.frozen
        ref = self._frozen_ref()
        if p is None:
            if self.key is None:
                raise RuntimeError("a decoded bounding sketch without priorities needs its row "
                                   "key to take more rows")
            p = np.empty(u.size, U64)
            cuts = np.searchsorted(ref, np.arange(len(self.streams) + 1, dtype=U64)
                                   << U64(_REF_BITS)).tolist() + [u.size]
            for i, name in enumerate(self.streams):
                lo, hi = cuts[i], cuts[i + 1]
                if hi > lo:
                    p[lo:hi] = aes_prf(self.key, ref[lo:hi] & _REF_MASK, U64(name))
        self.frozen = None
        order, ends = _by_shard(u)
        a = 0
        for k, b in enumerate(ends):
            if b > a:
                part = order[a:b]
                t = self.tables[k] = _MinTable(self.streams, self.wide)
                t.freeze()
                t.frozen = (u[part], p[part], ref[part], None if s is None else s[part])
                t.units = b - a
            a = b

    def _decoded(self, t: _MinTable | None = None) -> tuple:
        """A table's entries (the frozen sketch's when ``t`` is None) as (unit hashes,
        priorities, streams, record numbers)."""
        u, p, ref, s = t.entries() if t is not None else \
            self.frozen[:2] + (self._frozen_ref(),) + self.frozen[3:4]
        if s is not None:
            return u, p, s, ref.view(np.int64)
        names = np.array(self.streams + [0], U64)
        return u, p, names[(ref >> U64(_REF_BITS)).astype(np.int64)], \
            (ref & _REF_MASK).view(np.int64)

    def _frozen_ref(self) -> np.ndarray:
        """The frozen sketch's sorted references as one array (decoded from gaps if held so)."""
        ref = self.frozen[2]
        return ref.decode().view(U64) if isinstance(ref, _Ids) else ref

    def merge(self, other: "_MinSketch") -> None:
        other._thaw()
        other.flush()
        for t in other.tables:
            if t is not None:
                self.add(*other._decoded(t))
        self.flush()

    def kept(self) -> dict:
        """The kept rows: {"u": unit hashes, "s": streams, "rid": record numbers}."""
        self.flush()
        parts = [self._decoded()] if self.frozen is not None else \
            [self._decoded(t) for t in self.tables if t is not None]
        if not parts:
            return {"u": np.empty(0, U64), "s": np.empty(0, U64), "rid": np.empty(0, np.int64)}
        return {f: np.concatenate([p[j] for p in parts]) for j, f in ((0, "u"), (2, "s"),
                                                                      (3, "rid"))}

    def kept_rows(self) -> "KeptRows":
        """The kept rows as :class:`KeptRows`, sharing the frozen sketch's arrays: its
        references sort by stream index, then record number, so each stream's record numbers
        are a slice of them (the first stream's as they are, the others' less their index)."""
        self.freeze()
        if self.wide:
            return KeptRows.of(self.kept(), self.units, False)
        u, _, ref, _, units = self.frozen
        if isinstance(ref, _Ids):  # each stream's record numbers: a range of the gaps
            n = ref.n
            cuts = [ref.position(i << _REF_BITS) for i in range(len(self.streams))] + [n]
            streams = {}
            for i, name in enumerate(self.streams):
                lo, hi = cuts[i], cuts[i + 1]
                if hi > lo:
                    off = i << _REF_BITS
                    ids = ref if (lo, hi, off) == (0, n, 0) else \
                        _Ids(ref.ids[lo:hi] - off) if ref.ids is not None else \
                        _Ids.of_chunks((c - off for c in ref.chunks(lo, hi)), hi - lo,
                                       ref.gaps.dtype)
                    streams[name] = (ids, u[lo:hi], None)
            return KeptRows(streams, units, n)
        cuts = np.searchsorted(ref, np.arange(len(self.streams) + 1, dtype=U64)
                               << U64(_REF_BITS)).tolist() + [ref.size]
        streams = {}
        for i, name in enumerate(self.streams):
            lo, hi = cuts[i], cuts[i + 1]
            if hi > lo:
                seg = ref[lo:hi] if i == 0 else ref[lo:hi] - U64(i << _REF_BITS)
                streams[name] = (seg.view(np.int64), u[lo:hi], None)
        return KeptRows(streams, units, int(ref.size))
