"""Contribution bounding per privacy unit, the algorithm: at most so many rows of each person
reach a mechanism. Pure (numpy and pyarrow, no Beam): the keyed unit hashes, the row and
partition priorities (from the keyed pseudorandom functions of :mod:`ldp_beam.prf`), the
sketch that keeps each unit's rows of smallest priority, and the kept rows the
second pass looks up. Its Beam shell is :class:`~ldp_beam.transforms.units.BoundContributions`
(transforms/units.py: pass 1 ``CandidatesFn``, the sketch ``BoundingCombineFn``, pass 2
``FilterFn``), which takes batches of rows with their identities and keeps, for every privacy
unit (a distinct value of the unit column):

* **LDP collection** (no partitions): one partition, so at most ``Linf`` (the collection's
  ``max_reports_per_unit``) of the unit's rows, chosen uniformly at random among them (all of
  them when it has fewer);
* **central release** (a partition code per row, e.g. its histogram bucket or a (key, bucket)
  code): at most ``L0`` of the unit's partitions, chosen uniformly among its partitions, and at
  most ``Linf`` rows in each, chosen uniformly among its rows there (contribution bounding as in
  PipelineDP). Rows with a negative partition are rows the mechanism will reject: they never
  count against a bound.

Uniform and retry-proof
-----------------------
Every choice is a fixed function of the run's secret key (:class:`~ldp_beam.rng.RunKey`) and the
rows' identities, never of bundle order, batch sizes or workers, so a runner that re-executes a
step keeps the same rows, and every runner keeps the same rows:

* a row's priority is the first 64 bits of ``AES_k(stream * 2**64 + record)`` (the AES-128
  block at the record's counter, keyed by ``run_key.derive("bounding/rows")``: the addressable
  AES-CTR stream that draws the noise, under a key of its own);
* a unit is represented by its keyed hash (64 bits, lowest bit set): an integer unit (see
  below) by the first 64 bits of ``AES_k(v || 0)`` under ``run_key.derive("bounding/units/int")``,
  a text unit by SipHash-2-4 of its UTF-8 bytes under ``run_key.derive("bounding/units")``;
  computed where the batch is read, only this keyed hash travels through the sketch and the
  side input, never the unit's value;
* a partition's priority for a unit is the first 64 bits of ``AES_k'(unit hash || partition)``
  (``k'`` from ``run_key.derive("bounding/partitions")``).

AES (a pseudorandom permutation, hence a pseudorandom function up to a switching distance of
``q^2 / 2^129`` for ``q`` blocks) and SipHash are pseudorandom functions: on distinct inputs (a
unit's distinct rows, its distinct partitions) their outputs are indistinguishable from
independent uniform 64-bit values to anyone without the key. For i.i.d. continuous priorities
every ordering of a unit's ``n`` rows is equally likely, so the ``k`` rows of smallest priority
are a uniformly random ``k``-subset of them. Equal 64-bit priorities (about ``n^2 / 2^65`` per
unit) are broken by the record identity ``(stream, record)``, which is unique, so the order is
total: the choice is deterministic and each bound holds exactly. The same holds for partitions
(ties broken by the partition code). The choice for a unit depends only on its own rows and the
key, so each unit contributes at most ``L0 x Linf`` rows whatever the other units do. A
different run key gives an independent choice; a seeded run key (``RunKey.new(seed)``) gives a
reproducible one, like its noise, and is as little private. The unit hash only groups rows (its
keying keeps unit values out of the sketch); the uniformity rests on the row priorities.

Units are compared as text, numbers by their decimal form: ``42`` in a Parquet integer column,
``42.0`` in a float column and ``"42"`` in a CSV file are one unit (a person split across files
of different types is still one unit; so are ``1e10`` in a float column and ``10000000000``,
and ``-0.0`` and ``0``), while ``"042"`` and ``"+42"`` are other texts. A value
whose text is an int64 in Python's form is hashed as that integer (no text is built for integer
columns), any other as its UTF-8 bytes, under two keys. A unit that is null, NaN or the empty
text is no unit: its rows are dead-lettered. Two different units whose keyed hashes collide
(probability about ``units^2 / 2^65``, 3e-8 for 10^6 units) are bounded together: a stricter
bound, never a looser one.

Plan and memory
---------------
Two passes over the rows, vectorized per batch (no per-row Python except dead letters):

1. every batch -> its *candidates* ``(unit hash, row priority, stream, record)`` (plus
   ``(partition, partition priority)`` with ``partition_fn``) for the rows with a unit and a
   partition >= 0; a ``CombineGlobally`` merges them into the *sketch*: per unit, its ``L0``
   partitions of smallest priority and, in each, its ``Linf`` rows of smallest priority (what
   is not among the smallest in a part of the data cannot be among the smallest in all of it,
   so parts merge in any order). With ``source=`` and no ``partition_fn`` this read decodes only
   the unit column (``ReadTable.with_columns``).

   * One row per unit (``Linf = 1``, no ``partition_fn``: an LDP collection's default) uses
     the hash tables of :mod:`ldp_beam.minsketch` (its classes give the details): 16 shards by
     unit hash of open-addressing tables holding, per unit, its best priority so far and that
     row's reference: no sort, O(1) per row. The C loop (``ldp_beam/_minsketch.c``, an
     optional extension: each row's slot prefetched 16 rows ahead, ~20-40 ns a row) runs on a
     background thread behind at most 3 earlier batches, overlapping the reading and hashing
     of the next ones; without it, vectorized numpy rounds (~80 ns a row;
     ``LDP_BEAM_NO_NATIVE=1`` forces them) build the same tables. 24 bytes a slot, 1.67-2.5
     slots a unit: 40-60 MB per million units (~400-600 MB at the 10^7 cap). Before Beam
     encodes it (the combine's ``compact``) the sketch becomes its held entries sorted by
     reference, the references held as their gaps (:class:`_Ids`): ~10 bytes a unit.
   * Otherwise each batch's candidates are first reduced within the batch and the sketch is
     split in 64 shards by unit hash, each reduced (sorted) on its own when its unreduced
     entries outgrow twice its reduced ones (amortized O(n log n)); it holds O(units x L0 +
     unit-partitions x Linf) entries of 32 bytes (48 with partitions), at most ~3x the reduced
     sketch, e.g. ~100 MB for 10^6 units at one row each.

   Neither holds rows: memory grows with the units, not the rows.
2. the kept rows' record numbers per stream (sorted, as gaps: :class:`_Ids`, 2 bytes a row
   when kept rows are < 65,536 records apart) with a 32-bit fingerprint of their unit hash
   (:func:`unit_fingerprint`) and their partition, to check, are a side input (~6 bytes a kept
   row in memory and encoded, one encode); each batch keeps its rows found there (the range of
   its record numbers decoded on its own; consecutive record numbers: by subtraction, else
   ``searchsorted``).

   Measured (DirectRunner, one process, peak RSS
   from the process's own high-water mark, two full benches of 2026-11-26): 10^6 rows of 10^5
   units 274-276 MB; 10^7 rows of the same 10^5 units (100 rows a unit) 267-268 MB (-2% to
   -3%); 10^7 rows of 10^6 units 331 MB (+20-21%; the unbounded pipeline: 258 MB). Stage by
   stage at 10^6 units: the first pass peaks ~300 MB with the tables, ~260 MB once frozen (the
   heap and Arrow's pool handed back, ``minsketch._trim_heap``); then Beam's copies of the encoded
   sketch (~31 MB for its 9 MB) and of the side input (~17 MB for its 5 MB) raise the second
   pass to ~320 MB before it reads.
   ``ldp-beam bench --only bounding`` records both growths (the fixed-units one with the +15%
   target) and the time against the unbounded pipeline.

The streaming run bounds each unit's reports of a window with the same rule and the same
function (:func:`reduce_candidates`, through :func:`bound_candidates`):
there a row's priority is a keyed BLAKE2b digest of its durable identity (file, line, event
time, content), as the stream's per-unit record outlives a run.

Limits: at most ``max_units`` distinct units (default: the ``units`` cap,
``LDP_BEAM_MAX_UNITS``, 10,000,000): a run with more fails with a
:class:`~ldp_beam.errors.LimitError` naming the column, what was seen, the cap and how to raise
it, as soon as a shard's reduction has counted more (the one-row sketch counts when a batch is
queued, the units of the batches inserted so far: late by at most 4 batches of rows, exact when
the sketch is extracted).
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import LdpBeamError, LimitError
from .limits import env_cap
from .prf import (_MASK64, U64, _key_words, aes_prf, row_priorities,  # noqa: F401 (exported)
                  siphash_words)
from .privacy import check_contribution_bound
from .rng import RunKey

UNITS_CAP = "units"
UNITS_ENV = "LDP_BEAM_MAX_UNITS"
DEFAULT_MAX_UNITS = 10_000_000
UNITS_WHAT = ("distinct privacy units of a bounded collection or release: the bounding holds up "
              "to max_partitions_per_unit x max_rows_per_partition entries of 32-48 bytes per "
              "unit while it runs (one row per unit: a hash table of 40-60 bytes a unit, about "
              "50 MB per million units; otherwise about 100 MB per million units)")


# --------------------------------------------------------------------------- parameters
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


def check_bound(name: str, value: Any) -> int:
    """A contribution bound: an integer >= 1 (the shared check of ldp_beam.privacy)."""
    return check_contribution_bound(value, name)


def units_cap() -> int:
    """The ``units`` cap in force: ``LDP_BEAM_MAX_UNITS`` if set (``1_000_000`` and ``1e6``
    accepted, as for the caps of :mod:`ldp_beam.limits`), else 10,000,000."""
    return env_cap(UNITS_ENV, DEFAULT_MAX_UNITS)


class UnitLimitError(LimitError):
    """More distinct privacy units than ``max_units`` (or the ``units`` cap): the message names
    the column, how many were seen, the cap and how to raise it."""

    def __init__(self, column: str, seen: int, limit: int, explicit: bool) -> None:
        self.column, self.explicit = column, explicit
        self.name = f"distinct values of privacy-unit column {column!r}"
        self.value, self.cap, self.limit, self.env_var, self.what = \
            seen, UNITS_CAP, limit, UNITS_ENV, UNITS_WHAT
        self.valid = f"at most {limit:,} (the {UNITS_CAP!r} cap)"
        how = (f"raise max_units (set to {limit:,} here)" if explicit else
               f"raise the cap with the environment variable {UNITS_ENV}={seen} if the machine "
               "can afford it")
        LdpBeamError.__init__(
            self, f"parameter {self.name!r} = {seen:,} (at least; counting stopped there) "
            f"exceeds the size cap {UNITS_CAP!r} = {limit:,} ({UNITS_WHAT}); the bounding "
            f"stopped before holding more. Check that {column!r} identifies people, or {how}")

    def __reduce__(self):  # picklable (Beam ships errors between processes)
        return (type(self), (self.column, self.value, self.limit, self.explicit))


# --------------------------------------------------------------------------- per-batch columns
_TEXT_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
               pa.types.is_large_binary)


#: the reason a row without a unit is dead-lettered (``{col!r}``: the column)
MISSING_UNIT_REASON = "missing privacy unit: column {col!r} is null, empty or only whitespace"


def _blank_text(col: pa.Array) -> pa.Array:
    """Whether each text of ``col`` (string or binary) is empty or only whitespace (null where
    ``col`` is null), vectorized: Unicode whitespace (``utf8_is_space``) for UTF-8 text; bytes that
    are not UTF-8 count ASCII whitespace only."""
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        try:
            col = pc.cast(col, pa.large_string() if pa.types.is_large_binary(col.type)
                          else pa.string())
        except pa.ArrowInvalid:  # not UTF-8: ASCII whitespace
            return pc.match_substring_regex(col, r"^[\t\n\x0b\f\r ]*$")
    return pc.or_(pc.equal(pc.binary_length(col), 0), pc.utf8_is_space(col))


def unit_column(col: Any, column: str) -> tuple[pa.Array, np.ndarray]:
    """The privacy-unit column (dictionaries decoded) and its rows without a unit: null, NaN,
    the empty text or a text of only whitespace (Unicode: spaces, tabs, no-break spaces...; ten
    rows of ``"   "`` are ten rows without a unit, not one unit). Raises TypeError for a type that
    cannot identify a unit (one with no text form: lists, structs, ...)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    text = any(f(t) for f in _TEXT_TYPES)
    if not text:
        try:
            pc.cast(col.slice(0, 0), pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise TypeError(f"privacy-unit column {column!r} has type {t}, which cannot "
                            "identify a unit (use text or integers)") from None
    if text:
        missing = pc.fill_null(_blank_text(col), True)
    elif pa.types.is_floating(t):
        missing = pc.fill_null(pc.is_nan(col), True)
    else:
        missing = col.is_null()
    return col, np.asarray(missing.to_numpy(zero_copy_only=False), dtype=bool)


_CANONICAL_INT = r"^(0|-?[1-9][0-9]{0,18})$"  # an integer as Python and Arrow print it


def whole_numbers(v: np.ndarray) -> np.ndarray:
    """Which floats are whole numbers of the int64 range (NaN and infinities are not): the
    values a unit id or a grouping key takes as that integer, whatever Arrow writes for them
    (``1e+10``, ``-0``)."""
    return np.isfinite(v) & (np.floor(v) == v) & (np.abs(v) < 2.0 ** 63)


def _int_units(key: bytes, v: np.ndarray) -> np.ndarray:
    """The keyed hash of integer units: ``AES_key(v || 0)`` (64 bits; see :func:`aes_prf`)."""
    return aes_prf(key, np.ascontiguousarray(v, dtype=np.int64).view(U64), 0)


def hash_units(text_key: tuple[int, int], int_key: bytes, col: pa.Array) -> np.ndarray:
    """The keyed hash of each unit (nulls hash to anything: callers mask them). A unit is its
    text, numbers by their decimal form, so ``42``, ``42.0`` and ``"42"`` are one unit: a value
    whose text is an integer of the int64 range as Python prints it (``"42"``, ``"-7"``; not
    ``"042"`` or ``"+42"``, which are other texts) is hashed as that integer (AES of its 8
    bytes and 8 zero bytes, under ``int_key``), any other text as its UTF-8 bytes (SipHash-2-4
    under ``text_key``). Integer columns skip the text altogether. The lowest bit of every hash
    is set (63 keyed bits): 0 marks an empty slot of the bounding's table."""
    return _hash_units(text_key, int_key, col) | U64(1)


def _hash_units(text_key: tuple[int, int], int_key: bytes, col: pa.Array) -> np.ndarray:
    n = len(col)
    t = col.type
    if pa.types.is_integer(t):
        if pa.types.is_uint64(t):
            v = col.fill_null(0).to_numpy(zero_copy_only=False)
            big = v > U64(2 ** 63 - 1)
            if big.any():  # beyond int64: their text, as a text column holding them would
                out = np.empty(n, U64)
                out[~big] = _int_units(int_key, v[~big].astype(np.int64))
                out[big] = _hash_units(text_key, int_key,
                                       pc.cast(col.filter(pa.array(big)), pa.string()))
                return out
            return _int_units(int_key, v.astype(np.int64))
        return _int_units(int_key, pc.cast(col, pa.int64()).fill_null(0).to_numpy(
            zero_copy_only=False))
    if pa.types.is_floating(t):  # a whole number is that integer (Arrow writes 1e10 as
        # "1e+10" and -0.0 as "-0", so its text alone would split a person across file types)
        v = col.to_numpy(zero_copy_only=False)
        whole = whole_numbers(v)
        if whole.any():
            out = np.empty(n, U64)
            out[whole] = _int_units(int_key, v[whole].astype(np.int64))
            rest = np.flatnonzero(~whole)
            if rest.size:
                out[rest] = _hash_units(text_key, int_key,
                                        pc.cast(col.take(pa.array(rest)), pa.string()))
            return out
    if not any(f(t) for f in _TEXT_TYPES):
        col = pc.cast(col, pa.string())
    is_int = pc.match_substring_regex(col, _CANONICAL_INT).fill_null(False).to_numpy(
        zero_copy_only=False)
    if not is_int.any():
        return siphash_text(text_key, col)
    idx = np.flatnonzero(is_int)
    sub = col if idx.size == n else col.take(pa.array(idx))
    lens = pc.binary_length(sub).to_numpy(zero_copy_only=False)
    for j in np.flatnonzero(lens >= 19).tolist():  # 19 digits may be beyond int64 (rare)
        x = sub[j].as_py()
        if not -2 ** 63 <= int(x) <= 2 ** 63 - 1:
            is_int[idx[j]] = False
    if not is_int.all():
        idx = np.flatnonzero(is_int)
        sub = col.take(pa.array(idx))
    out = np.empty(n, U64)
    ints = pc.cast(pc.cast(sub, pa.string()) if not pa.types.is_string(sub.type) else sub,
                   pa.int64())
    out[idx] = _int_units(int_key, ints.to_numpy(zero_copy_only=False))
    rest = np.flatnonzero(~is_int)
    if rest.size:
        out[rest] = siphash_text(text_key, col.take(pa.array(rest)))
    return out


class _Rows:
    """What both passes compute for a batch: the rows without a unit (``missing``), the rows
    the bounding applies to (``cand``: a unit and a partition >= 0), their partition codes, and
    the unit column (turned into text and hashed only where needed). ``batch``: a
    :class:`~ldp_beam.transforms.KeyedBatch` (anything with ``.table`` and ``.record_ids()``)."""

    __slots__ = ("n", "col", "missing", "parts", "cand", "ids", "absent", "bad_type")

    def __init__(self, spec: "_Spec", batch: Any) -> None:
        table = batch.table
        self.n = n = table.num_rows
        self.ids = batch.record_ids()
        self.absent = spec.unit_column not in table.schema.names
        self.bad_type = self.col = self.parts = None
        self.missing, self.cand = np.ones(n, bool), np.zeros(n, bool)  # no unit: no row
        if self.absent:
            return
        try:
            self.col, self.missing = unit_column(table.column(spec.unit_column),
                                                 spec.unit_column)
        except TypeError as e:
            self.bad_type = str(e)
            return
        self.cand = ~self.missing
        if spec.partition_fn is not None:
            codes, reject = spec.partition_codes(table, n)
            self.parts = codes
            self.cand &= ~reject

    def units(self, spec: "_Spec", idx: np.ndarray) -> np.ndarray:
        """The keyed unit hashes of rows ``idx``."""
        return spec.units(self.col if idx.size == self.n else self.col.take(pa.array(idx)))


class _Spec:
    """The bounding's settings and keys, shipped to both passes."""

    def __init__(self, unit_column: str, run_key: RunKey, l0: int, linf: int,
                 partition_fn: Callable | None, max_units: int, explicit_cap: bool) -> None:
        self.unit_column = unit_column
        self.l0, self.linf = l0, linf
        self.partition_fn = partition_fn
        self.max_units, self.explicit_cap = max_units, explicit_cap
        self.unit_key = _key_words(run_key.derive("bounding/units"))
        self.int_key = run_key.derive("bounding/units/int")[:16]
        self.part_key = run_key.derive("bounding/partitions")[:16]
        self.row_key = int.from_bytes(run_key.derive("bounding/rows")[:16], "big")
        self.row_aes_key = self.row_key.to_bytes(16, "little")  # see row_priorities

    @property
    def partitioned(self) -> bool:
        return self.partition_fn is not None

    @property
    def one_row(self) -> bool:
        """One row per unit and one partition: the sketch is a ``minsketch._MinSketch``."""
        return self.partition_fn is None and self.linf == 1

    def partition_codes(self, table: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        codes = np.asarray(self.partition_fn(table))
        if codes.shape != (n,) or codes.dtype.kind not in "iu":
            raise TypeError(f"partition_fn must return one integer partition code per row "
                            f"(int64 or uint64, shape ({n},)); it returned {codes.dtype} of "
                            f"shape {codes.shape}")
        if codes.dtype.kind == "i":
            codes = codes.astype(np.int64, copy=False)
            return codes.view(U64), codes < 0
        return codes.astype(U64, copy=False), np.zeros(n, bool)

    def units(self, col: pa.Array) -> np.ndarray:
        return hash_units(self.unit_key, self.int_key, col)

    def part_priorities(self, u: np.ndarray, p: np.ndarray) -> np.ndarray:
        return aes_prf(self.part_key, u, p)

    def too_many(self, seen: int) -> None:
        if seen > self.max_units:
            raise UnitLimitError(self.unit_column, seen, self.max_units, self.explicit_cap)


# --------------------------------------------------------------------------- the sketch
FIELDS = ("u", "rh", "s", "rid")  # + "p", "pp" when partitioned
_HI32 = U64(0xFFFFFFFF00000000)
# an accumulator is split in 64 shards by unit hash (its top 6 bits), so each reduction is
# small (in cache)
_SHARD_SHIFT = U64(58)
_SHARD_MIN = 4096  # pending entries of a shard before it is first reduced


def _group_order(g: np.ndarray, ident: list[np.ndarray], hi: np.ndarray,
                 ties: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Rows ordered by group, then by ``hi`` and ``ties`` within each group: ``(order, new)``
    where ``new[j]`` says sorted row ``j`` starts a group. A group is an identity (the arrays
    ``ident``: the unit hash, or unit hash and partition) and ``g`` a 64-bit hash of it;
    ``ties`` order rows of equal ``hi`` (the record identity, unique).

    One quicksort of a 64-bit key (the top halves of ``g`` and ``hi``) instead of a lexsort,
    ~10x faster; the few runs it cannot order on its own (two identities sharing the top half
    of ``g``, or equal top halves of ``hi`` in a group) are found and re-sorted exactly."""
    def starts_group(order: np.ndarray) -> np.ndarray:
        differ = np.zeros(n - 1, bool)
        for a in ident:
            s_ = a[order]
            differ |= s_[1:] != s_[:-1]
        return differ

    comp = (g & _HI32) | (hi >> U64(32))
    order = np.argsort(comp)
    n = order.size
    cs = comp[order]
    same_run = (cs[1:] & _HI32) == (cs[:-1] & _HI32)
    differ = starts_group(order)
    bad = same_run & (differ | (cs[1:] == cs[:-1]))
    if bad.any():
        run = np.zeros(n, np.int64)
        np.cumsum(~same_run, out=run[1:])
        bad_run = np.zeros(int(run[-1]) + 1, bool)
        bad_run[run[1:][bad]] = True
        pos = np.flatnonzero(bad_run[run])
        rows = order[pos]
        keys = tuple(t[rows] for t in reversed(ties)) + (hi[rows],) \
            + tuple(a[rows] for a in reversed(ident)) + (g[rows],)
        order[pos] = rows[np.lexsort(keys)]
        differ = starts_group(order)
    new = np.empty(n, bool)
    new[0] = True
    new[1:] = differ
    return order, new


def _first_k(order: np.ndarray, new: np.ndarray, k: int) -> np.ndarray:
    """The rows among the first ``k`` of their group (``order``/``new`` from _group_order)."""
    starts = np.flatnonzero(new)
    rank = np.arange(order.size) - np.repeat(starts, np.diff(np.append(starts, order.size)))
    return order[rank < k]


def reduce_candidates(c: dict, l0: int, linf: int, partitioned: bool) -> tuple[dict, int]:
    """Keep, per unit ``u``, its ``l0`` partitions of smallest priority ``pp`` (ties: smaller
    partition code) and, in each ``(u, p)``, its ``linf`` rows of smallest priority ``rh``
    (ties: smaller record identity ``(s, rid)``). Returns the kept candidates and the number
    of distinct units."""
    u = c["u"]
    n = u.size
    if n == 0:
        return c, 0
    ties = [c["s"], c["rid"]]
    if partitioned:
        order, new = _group_order(c["pp"], [u, c["p"]], c["rh"], ties)
    else:
        order, new = _group_order(u, [u], c["rh"], ties)
    keep = _first_k(order, new, linf)
    if partitioned:
        firsts = order[new]  # one row per (unit, partition)
        uf = u[firsts]
        o2, new2 = _group_order(uf, [uf], c["pp"][firsts], [c["p"][firsts]])
        units = int(new2.sum())
        pairs = _first_k(o2, new2, l0)
        if pairs.size < firsts.size:  # some unit has more than l0 partitions
            ok = np.zeros(n, bool)
            ok[firsts[pairs]] = True
            # a row is kept when the first row of its (unit, partition) is
            pair_of = np.empty(n, np.int64)
            pair_of[order] = order[np.flatnonzero(new)[np.cumsum(new) - 1]]
            keep = keep[ok[pair_of[keep]]]
    else:
        units = int(new.sum())
    if keep.size == n:
        return c, units
    keep.sort()
    return {k: v[keep] for k, v in c.items()}, units


def shard_of(u: np.ndarray) -> np.ndarray:
    """The shard of each unit hash (its top 6 bits): a unit never spans two shards."""
    return (u >> _SHARD_SHIFT).astype(np.uint8)


def _concat(parts: list[dict], partitioned: bool) -> dict:
    names = FIELDS + (("p", "pp") if partitioned else ())
    if not parts:
        return {k: np.empty(0, np.int64 if k == "rid" else U64) for k in names}
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([q[k] for q in parts]) for k in names}


class _Acc:
    """A bounding sketch: per shard of units, its candidates (a list of parts: the first
    ``reduced`` entries already reduced, ``pending`` more not yet) and its units when last
    reduced."""

    __slots__ = ("shards",)

    def __init__(self) -> None:
        self.shards: dict[int, list] = {}  # shard -> [parts, pending, reduced, units]

    def __getstate__(self):
        return self.shards

    def __setstate__(self, state):
        self.shards = state

    def add(self, shard: int, part: dict, reduced: bool = False, units: int = 0) -> list:
        sh = self.shards.setdefault(shard, [[], 0, 0, 0])
        size = int(part["u"].size)
        if reduced and size > sh[2]:  # the largest reduced part leads; the rest is pending
            sh[0].insert(0, part)
            sh[1] += sh[2]
            sh[2], sh[3] = size, units
        else:
            sh[0].append(part)
            sh[1] += size
        return sh


# --------------------------------------------------------------------------- stream candidates
def _unit_code(unit: str) -> int:
    """A stream unit hash's 64-bit code for the grouping: its first 64 bits (a keyed
    :func:`ldp_beam.longitudinal.unit_hash` is ``"u"`` + 32 hex digits), lowest bit set as the
    batch's unit codes; any other text (a test's name) by an unkeyed BLAKE2b of it. Two units
    whose codes collide (about ``units^2 / 2^65`` per window) share one bound: stricter, never
    looser."""
    if len(unit) == 33 and unit[0] == "u":
        try:
            return int.from_bytes(bytes.fromhex(unit[1:17]), "big") | 1
        except ValueError:
            pass
    return int.from_bytes(hashlib.blake2b(unit.encode("utf-8"), digest_size=8).digest(),
                          "big") | 1


def bound_candidates(per: dict, units: Iterable[str], k: int) -> None:
    """Keep, of each of ``units``' candidates in ``per`` (unit hash -> ``[n, candidates]``,
    in place), one per slot (a record read twice is one record) and, of those, the ``k`` of
    smallest ``(priority, slot)``, in that order: the batch's bounding algorithm
    (:func:`reduce_candidates`, one partition, ``Linf = k``) with a candidate's priority as the
    row priority and the slot's last 64 bits (its first 64 are the priority) as the record
    identity that breaks ties. So the stream's per-unit choice and the
    batch's are one function, and the choice does not depend on the split or order of the rows:
    the ``k`` smallest of the union are the ``k`` smallest of the parts' ``k`` smallest."""
    owners, sizes, codes, flat = [], [], [], []
    for u in units:
        cands = per[u][1]
        if len(cands) < 2:
            continue
        owners.append(u)
        sizes.append(len(cands))
        codes.append(_unit_code(u))
        flat.extend(cands)
        cands.clear()
    if not flat:
        return
    n = len(flat)
    owner = np.repeat(np.arange(len(owners)), sizes)
    slots = "".join([c[1] for c in flat])
    if len(slots) != 32 * n:
        raise ValueError("a candidate's slot is not 32 hex digits (longitudinal.priority)")
    c = {"u": np.repeat(np.array(codes, np.uint64), sizes),
         "rh": np.fromiter((c[0] for c in flat), np.uint64, n),
         "s": np.frombuffer(bytes.fromhex(slots), ">u8")[1::2].astype(np.uint64),
         "rid": np.arange(n, dtype=np.int64)}
    if k > 1:  # one candidate per slot of a unit (a record read twice is one record)
        o = np.lexsort((c["s"], c["rh"], owner))
        again = ((owner[o][1:] == owner[o][:-1]) & (c["rh"][o][1:] == c["rh"][o][:-1])
                 & (c["s"][o][1:] == c["s"][o][:-1]))
        if again.any():
            first = np.sort(np.concatenate((o[:1], o[1:][~again])))
            c = {name: col[first] for name, col in c.items()}
    kept, _ = reduce_candidates(c, 1, k, False)
    rid = kept["rid"][np.lexsort((kept["s"], kept["rh"], owner[kept["rid"]]))]
    for i in rid.tolist():
        per[owners[owner[i]]][1].append(flat[i])


def fold_candidates(into: dict, units: Mapping[str, tuple], k: int) -> None:
    """Fold per-unit candidates ``units`` (unit hash -> ``(n, candidates)``) into ``into``
    (unit hash -> ``[n, candidates]``), in place: counts add up, at most ``k`` candidates of
    smallest priority stay, one per slot (:func:`bound_candidates`)."""
    touched = []
    for u, (n, cands) in units.items():
        entry = into.get(u)
        if entry is None:
            into[u] = entry = [n, list(cands)]
        else:
            entry[0] += n
            entry[1].extend(cands)
        if len(entry[1]) > 1:
            touched.append(u)
    bound_candidates(into, touched, k)


def _order_of(rid: np.ndarray) -> np.ndarray:
    """``np.argsort(rid)`` for distinct record numbers >= 0, by sorting ``rid`` and position
    packed in one 64-bit word when they fit (a vectorized sort of plain integers, several times
    faster than an argsort)."""
    n = rid.size
    bits = max(n - 1, 1).bit_length()
    if n == 0 or int(rid.min()) < 0 or int(rid.max()) >= 1 << (63 - bits):
        return np.argsort(rid, kind="stable")
    packed = np.sort((rid.astype(np.int64) << bits) | np.arange(n, dtype=np.int64))
    return packed & ((1 << bits) - 1)


_MARK = 1024  # kept record numbers per absolute mark in _Ids


class _Ids:
    """A sorted run of distinct record numbers (int64), held as the gaps between them in the
    narrowest unsigned integers that hold them (2 bytes each when kept rows are < 65,536
    records apart) plus every 1,024th number whole, so a range is decoded on its own
    (:meth:`span`, :meth:`chunks`) and the whole run never needs to be: ~2 bytes a kept row in
    memory and encoded, not 8. Gaps of 2^32 or more keep the numbers whole."""

    __slots__ = ("n", "marks", "gaps", "ids")
    STEP = 1 << 16  # numbers decoded or encoded at a time: no whole-run temporary

    def __init__(self, rid: np.ndarray | None = None) -> None:
        rid = np.empty(0, np.int64) if rid is None else np.asarray(rid, np.int64)
        n, step = int(rid.size), self.STEP
        top = max((int(np.diff(rid[a:a + step + 1]).max()) for a in range(0, n - 1, step)),
                  default=0)
        if top >= 1 << 32:
            self.n, self.marks, self.gaps, self.ids = n, None, None, rid
            return
        self._fill((rid[a:a + step] for a in range(0, n, step)), n,
                   np.uint16 if top < 1 << 16 else np.uint32)

    @classmethod
    def of_chunks(cls, chunks, n: int, dtype: Any) -> "_Ids":
        """From the run's numbers in increasing chunks (``n`` in all), gaps of ``dtype``."""
        out = cls.__new__(cls)
        out._fill(chunks, n, dtype)
        return out

    def _fill(self, chunks, n: int, dtype: Any) -> None:
        gaps = np.empty(n, dtype)
        marks = np.empty(-(-n // _MARK), np.int64)
        at, prev = 0, None
        for c in chunks:
            k = int(c.size)
            if k == 0:
                continue
            gaps[at] = 0 if prev is None else int(c[0]) - prev
            gaps[at + 1:at + k] = np.diff(c)
            first = -(-at // _MARK)  # the marks in [at, at + k)
            marks[first:-(-(at + k) // _MARK)] = c[first * _MARK - at::_MARK]
            at, prev = at + k, int(c[-1])
        if at != n:
            raise ValueError(f"_Ids: {at} numbers, {n} announced")
        self.n, self.marks, self.gaps, self.ids = n, marks, gaps, None

    def __getstate__(self):
        return self.n, self.marks, self.gaps, self.ids

    def __setstate__(self, state):
        self.n, self.marks, self.gaps, self.ids = state

    @property
    def nbytes(self) -> int:
        return sum(int(x.nbytes) for x in (self.marks, self.gaps, self.ids) if x is not None)

    def span(self, lo: int, hi: int) -> tuple[int, np.ndarray]:
        """The numbers in ``[lo, hi]``: (index of the first, the numbers)."""
        if self.ids is not None:
            a = int(np.searchsorted(self.ids, lo, side="left"))
            b = int(np.searchsorted(self.ids, hi, side="right"))
            return a, self.ids[a:b]
        if self.n == 0:
            return 0, np.empty(0, np.int64)
        i = max(int(np.searchsorted(self.marks, lo, side="right")) - 1, 0)
        j = int(np.searchsorted(self.marks, hi, side="right"))
        a0, b0 = i * _MARK, min(j * _MARK, self.n)
        if b0 <= a0:  # the range ends before the first number
            return 0, np.empty(0, np.int64)
        vals = self._decode(a0, b0)
        a = int(np.searchsorted(vals, lo, side="left"))
        b = int(np.searchsorted(vals, hi, side="right"))
        return a0 + a, vals[a:b]

    def chunks(self, a: int, b: int):
        """The numbers at positions ``[a, b)``, decoded a slice at a time."""
        for x in range(a, b, self.STEP):
            y = min(b, x + self.STEP)
            if self.ids is not None:
                yield self.ids[x:y]
                continue
            start = x - x % _MARK
            yield self._decode(start, y)[x - start:]

    def position(self, v: int) -> int:
        """How many numbers are below ``v``."""
        if self.ids is not None:
            return int(np.searchsorted(self.ids, v, side="left"))
        i = int(np.searchsorted(self.marks, v, side="right")) - 1
        if i < 0:
            return 0
        a0 = i * _MARK
        return a0 + int(np.searchsorted(self._decode(a0, min(a0 + _MARK, self.n)), v,
                                        side="left"))

    def _decode(self, a: int, b: int) -> np.ndarray:
        """The numbers at positions ``[a, b)``, ``a`` a multiple of 1,024 (a mark): the mark,
        then the running sum of the gaps after it."""
        g = self.gaps[a:b].astype(np.int64)
        g[0] = self.marks[a // _MARK]
        return np.cumsum(g, out=g)

    def decode(self) -> np.ndarray:
        """All the numbers (int64)."""
        if self.ids is not None:
            return self.ids
        parts = list(self.chunks(0, self.n))
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else \
            np.empty(0, np.int64)


def unit_fingerprint(u: np.ndarray) -> np.ndarray:
    """The top 32 bits of keyed unit hashes: what :class:`KeptRows` keeps to check that a kept
    row still belongs to its unit in the second read (a row whose unit changed between the
    reads goes unnoticed with probability 2^-32)."""
    return (np.asarray(u, U64) >> U64(32)).astype(np.uint32)


class KeptRows:
    """The first pass's result: per stream, the kept record numbers (sorted, as :class:`_Ids`:
    ~2 bytes a row) with their units' fingerprints (:func:`unit_fingerprint`, 4 bytes) and
    partitions (None for one partition), and how many units and rows it holds. Built from
    ``{stream: (record numbers int64 sorted, unit hashes, partitions or None)}``."""

    def __init__(self, streams: dict | None = None, units: int = 0, rows: int = 0) -> None:
        self.streams = {name: (rid if isinstance(rid, _Ids) else _Ids(rid),
                               unit_fingerprint(u), p)
                        for name, (rid, u, p) in (streams or {}).items()}
        self.units, self.rows = units, rows

    # Encoded (a side input) as it is held: the gaps, the fingerprints, the partitions.
    def __getstate__(self):
        return self.streams, self.units, self.rows

    def __setstate__(self, state):
        self.streams, self.units, self.rows = state

    @property
    def nbytes(self) -> int:
        return sum(ids.nbytes + int(fp.nbytes) + (0 if p is None else int(p.nbytes))
                   for ids, fp, p in self.streams.values())

    def stream(self, name: int) -> tuple[np.ndarray, np.ndarray, Any]:
        """One stream's kept rows decoded: (record numbers, unit fingerprints, partitions)."""
        ids, fp, p = self.streams[name]
        return ids.decode(), fp, p

    @classmethod
    def of(cls, c: dict, units: int, partitioned: bool) -> "KeptRows":
        s = c["s"]
        names = np.unique(s)
        if names.size <= 16:  # few streams (files): a pass each
            groups = [np.flatnonzero(s == x) for x in names] if names.size > 1 else \
                [np.arange(s.size)]
        else:
            order = np.argsort(s, kind="stable")
            groups = np.split(order, np.flatnonzero(np.diff(s[order])) + 1)
        streams = {}
        for idx in (groups if s.size else []):
            idx = idx[_order_of(c["rid"][idx])]
            streams[int(s[idx[0]])] = (c["rid"][idx], c["u"][idx],
                                       c["p"][idx] if partitioned else None)
        return cls(streams, units, int(s.size))

    def lookup(self, stream: int, ids: np.ndarray) -> tuple[np.ndarray, Any]:
        """For rows with record numbers ``ids`` (increasing) of ``stream``: which are kept,
        and the kept entries ``(unit fingerprints, partitions)`` of those rows, in the same
        order."""
        hit = np.zeros(ids.size, bool)
        entry = self.streams.get(int(stream) & _MASK64)
        if entry is None or ids.size == 0:
            return hit, None
        seq, u, p = entry
        lo, rid = seq.span(int(ids[0]), int(ids[-1]))
        u = u[lo:lo + rid.size]
        p = p[lo:lo + rid.size] if p is not None else None
        if rid.size == 0:
            return hit, None
        if ids[-1] - ids[0] + 1 == ids.size:  # consecutive records: positions by subtraction
            pos = rid - ids[0]
            found = np.ones(rid.size, bool)
        else:
            pos = np.minimum(np.searchsorted(ids, rid), ids.size - 1)
            found = ids[pos] == rid
        hit[pos[found]] = True
        return hit, (u[found], None if p is None else p[found])

    def __repr__(self) -> str:
        return f"KeptRows({self.rows:,} rows of {self.units:,} units, " \
               f"{len(self.streams)} streams)"


__all__ = ["DEFAULT_MAX_UNITS", "KeptRows", "MISSING_UNIT_REASON", "UNITS_CAP", "UNITS_ENV",
           "UnitLimitError", "aes_prf", "bound_candidates", "check_bound", "fold_candidates",
           "hash_units", "reduce_candidates", "whole_numbers",
           "row_priorities", "shard_of", "siphash_text", "siphash_words", "unit_column",
           "unit_fingerprint", "units_cap"]
