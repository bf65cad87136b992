"""OsdpRR: OSDP randomized response (mechanism ``osdp-rr``), the baseline of OSPDPRR
(:mod:`ldp_beam.central.ospdprr`).

Kotsogiannis et al., ICDE 2020: one-sided DP at record level. Every target item of every user
is a record; a sensitive record (level > 0) is never released, a non-sensitive one is released
truthfully with probability ``1 - e^-epsilon`` (:func:`osdp_keep_probability`), and the query
is answered from the released records. Spec: ``shared/specs/ospdprr.md`` (source tags as in
:mod:`ldp_beam.central.ospdprr`: [OSDP] Kotsogiannis et al. 2020, [I] our interpretation);
guarantee: docs/ospdprr_privacy.md. The queries, their parameter checks, clipping, the
contribution bounds and the release as an :class:`~ldp_beam.core.Estimate` are shared with
OSPDPRR, imported from :mod:`ldp_beam.central.unit_release`.

**One pass, memory that does not grow with users (issue 16)**: the keep draws are made where
the row is read and :class:`OsdpRREstimator` keeps four exact integers (see :class:`OsdpRR`).

**Privacy unit (issue 14; docs/person_level.md).** With the contribution bounds
``max_partitions_per_unit`` (L0) and ``max_rows_per_partition`` (Linf) of OSPDPRR (at most
m = L0 * Linf rows per unit), OsdpRR keeps each non-sensitive record with probability
1 - e^(-eps/m), so a unit's at most m rows of k_T records each cost (P, k_T eps) together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Iterable, Mapping, Union

import numpy as np

from ..core import (CentralRelease, Estimate, Estimator, Reasons, Reports, Role, Statistic,
                    check_choice)
from ..errors import EmptyAccumulatorError, ParameterError
from ..privacy import (ULDP, PrivacyGuarantee, UnitBounded, central_unit_params,
                       central_unit_text)
from ..rng import RngLike
from .histogram import as_generator
from .unit_release import (CLIPPED, CLIPPED_DTYPE, RATIO_QUERIES, _ByItem, _check_bounds,
                           _check_common, _check_t, _clip_note, _clipped_column,
                           _clipped_sum, _curated, _estimate, _flag_levels, _flag_values,
                           _is_number, _ReleasedOnce, _report_values, _UserQuery, query_answer)


# --------------------------------------------------------------------------- the baseline
def osdp_keep_probability(epsilon: float) -> float:
    """OsdpRR [OSDP]: a non-sensitive record is released with probability ``1 - e^-eps``."""
    return -math.expm1(-epsilon)


def osdp_epsilon_for_threshold(t: float, matching: str = "epsilon") -> float:
    """Budget matching of spec §7.2 [I]: the OsdpRR epsilon for the OSPDPRR panel at threshold
    ``t``. ``"epsilon"`` (default): eps = t. ``"keep-probability"``: read t as the keep-probability
    cap, 1 - e^-eps = t, i.e. eps = -ln(1 - t) (undefined at t = 1). The two guarantees are not
    comparable either way: OSPDPRR's is user-level DP for everyone, OsdpRR's record-level
    one-sided DP that leaves non-sensitive records unprotected."""
    _check_t(t)
    check_choice(matching, "matching", ("epsilon", "keep-probability"))
    if matching == "epsilon":
        return float(t)
    if t >= 1:
        raise ParameterError("t", t, "a number in (0, 1) for matching='keep-probability'")
    return -math.log1p(-t)


# --------------------------------------------------------------------------- OsdpRR
#: exact sums of float64 values are kept as integers in units of 2^-EXACT_BITS, the smallest
#: subnormal: every finite float64 is an integer multiple of it, so the sum is exact
EXACT_BITS = 1074
_HALF_BITS = 26  # a 53-bit mantissa split in two halves, so bincount's float64 bins stay exact
_HALF_MASK = (1 << _HALF_BITS) - 1
_EXACT_CHUNK = 1 << 25  # at most 2^25 halves (< 2^27 each) per bin: sums < 2^52, exact


def exact_sum_units(values: np.ndarray) -> int:
    """The exact sum of finite float64 ``values`` as a Python int in units of 2^-1074
    (:data:`EXACT_BITS`): no rounding at all, so sums of parts added in any order and grouping
    are equal, bit for bit. :func:`from_exact_units` rounds the total once (correctly rounded,
    the same number as ``math.fsum``).

    Vectorized: each value is ``mant * 2^(e - 53)`` with a 53-bit integer ``mant``
    (``np.frexp``); the mantissas' two 26-bit halves are summed per exponent with ``bincount``
    (float64 bins, exact below 2^53: at most 2^25 values per call), and the few dozen nonzero
    bins are shifted into one Python int. The result has at most ~2,100 + log2(n) bits."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if not x.size:
        return 0
    if not np.isfinite(x).all():  # frexp of inf/NaN has no integer mantissa
        bad = x[~np.isfinite(x)][0]
        raise ParameterError("values", float(bad), "finite numbers (an exact sum)")
    frac, exp = np.frexp(x)
    mant = (frac * 9007199254740992.0).astype(np.int64)  # * 2^53: exact, |mant| < 2^53
    shift = exp.astype(np.int64) + (EXACT_BITS - 53)  # x = mant * 2^shift units of 2^-1074
    low = shift < 0  # subnormals: their mantissa's low -shift bits are 0, shifting is exact
    if low.any():
        mant = np.where(low, mant >> np.where(low, -shift, 0), mant)
        shift = np.where(low, 0, shift)
    hi = mant >> _HALF_BITS  # floor: mant = hi 2^26 + lo with 0 <= lo < 2^26 (also mant < 0)
    lo = mant & _HALF_MASK
    total = 0
    for s in range(0, x.size, _EXACT_CHUNK):
        at = shift[s:s + _EXACT_CHUNK]
        hs = np.bincount(at, weights=hi[s:s + _EXACT_CHUNK])
        ls = np.bincount(at, weights=lo[s:s + _EXACT_CHUNK])
        for b in np.flatnonzero((hs != 0) | (ls != 0)).tolist():
            total += ((int(hs[b]) << _HALF_BITS) + int(ls[b])) << b
    return total


def from_exact_units(units: int) -> float:
    """An exact sum of :func:`exact_sum_units` as the nearest float64 (Python's int division is
    correctly rounded)."""
    return int(units) / (1 << EXACT_BITS)


def _osdp_roles(m: "OsdpRR") -> tuple[Role, ...]:
    return (tuple(Role(f"value{i}", help=f"item {i}: a number in [lower, upper]")
                  for i in m.target)
            + tuple(Role(f"level{i}", help=f"item {i}: sensitivity level in [0, 1] (the record "
                         "is sensitive iff level > 0)") for i in m.target))


def _osdp_fields(m: "OsdpRR") -> tuple[tuple[str, str], ...]:
    # the record's value and whether it is in the released sample (non-sensitive and kept),
    # drawn where the row is read
    return (tuple((f"value{i}", "float64") for i in m.target)
            + tuple((f"released{i}", "uint8") for i in m.target)
            + (((CLIPPED, CLIPPED_DTYPE),) if m.clip else ()))


@dataclass(frozen=True)
class OsdpRR(_UserQuery, UnitBounded, CentralRelease):
    """OsdpRR: OSDP randomized response, record-level one-sided DP (the OSPDPRR baseline; see
    the module docstring).

    ``estimator``: ``raw`` (the query on the released records) or ``scaled`` (count and sum
    divided by the keep probability: an estimate of the *non-sensitive* total, biased by minus the
    sensitive mass); None = scaled for count/sum, raw otherwise. Other parameters as
    :class:`~ldp_beam.central.ospdprr.OSPDPRR`. For a panel at threshold t, :meth:`matched`
    builds it with the budget matching of spec §7.2.

    **One pass, memory that does not grow with users** (issue 16; docs/ospdprr_privacy.md):
    every record is kept or not by its own Bernoulli(q) draw (q public) and every answer is a
    function of the released records' count, sum and sum of squares. So the mechanism consumes
    one uniform per target item (``draws = k_T``, addressed in a pipeline by the run's secret key
    and the row's identity, like LDP noise; a seeded run says it is not private) and
    :meth:`randomize` reports each record's value and ``released<i> = (not sensitive) and
    u < q``. :class:`OsdpRREstimator` keeps four Python integers ``[users, records, S, Q]``: the
    users seen (never released), the released records, and the exact sums of their values and
    squares (float64 ``v * v``) in units of 2^-1074 (:func:`exact_sum_units`: any split and merge
    order gives the same integers), rounded once at release (correctly: the ``math.fsum`` of the
    released terms). The release draws nothing (post-processing of the per-record sample); same
    q, records and statistics as :meth:`release` (the in-memory path, which draws the (n, k_T)
    uniforms itself). Peak RSS of ``ldp-beam estimate -m osdp-rr``: about 300 MB at both 10^6 and
    10^7 rows (one row per user took 363 and 1355 MB; docs/guides/runners.md).
    """

    NAME: ClassVar[str] = "osdp-rr"
    tidy_cells: ClassVar[tuple[str, ...]] = ("clipped",)  # scalars; the query clipped too
    family: ClassVar[str] = "ospdprr"
    roles = _ByItem(_osdp_roles, (
        Role("value<i>", help="one per target item i: a number in [lower, upper]"),
        Role("level<i>", help="one per target item i: sensitivity level in [0, 1]")))
    report_fields = _ByItem(_osdp_fields, (
        ("value<i>", "float64"), ("released<i>", "uint8"),
        (CLIPPED, f"{CLIPPED_DTYPE} (clip=True: the row's clipped values)")))

    epsilon: float
    query: str = "sum"
    k: int = 1
    target: tuple[int, ...] = ()
    lower: float = field(kw_only=True)  # required: values outside are invalid (or clipped) and
    upper: float = field(kw_only=True)  # the sensitivities (noise scales) are calibrated to them
    clip: bool = False
    estimator: Union[str, None] = None
    mean_floor: Union[float, None] = None
    #: contribution bounds per privacy unit (issue 14): at most L0 partitions x Linf rows each,
    #: enforced by the pipeline; each record is kept with probability 1 - e^(-eps/(L0 Linf))
    max_partitions_per_unit: int = 1
    max_rows_per_partition: int = 1

    def __post_init__(self) -> None:
        if not _is_number(self.epsilon) or self.epsilon <= 0:
            raise ParameterError("epsilon", self.epsilon, "a finite number > 0")
        _check_common(self)
        _check_bounds(self)
        est = self.estimator
        if est is None:
            est = "scaled" if self.query in RATIO_QUERIES else "raw"
        check_choice(est, "estimator", ("raw", "scaled"))
        if est == "scaled" and self.query not in RATIO_QUERIES:
            raise ParameterError("estimator", self.estimator, "'raw'",
                                 "scaled applies to count and sum only")
        object.__setattr__(self, "estimator", est)

    @classmethod
    def matched(cls, t: float, matching: str = "epsilon", **params: Any) -> "OsdpRR":
        """The baseline for the OSPDPRR panel at threshold ``t`` (spec §7.2): epsilon = t
        (``matching="epsilon"``, default) or 1 - e^-epsilon = t (``"keep-probability"``)."""
        return cls(epsilon=osdp_epsilon_for_threshold(t, matching), **params)

    @property
    def record_epsilon(self) -> float:
        """The OSDP budget of one record (one target item of one row): epsilon / (L0 Linf)."""
        return float(self.epsilon) / self.unit_sensitivity

    @property
    def keep_probability(self) -> float:
        return osdp_keep_probability(self.record_epsilon)

    @property
    def draws(self) -> int:
        return self.k_target  # one keep draw per record (target item), where the row is read

    @property
    def exact_sums(self) -> tuple[bool, bool]:
        """Which exact sums the query's statistics need: (S, Q). The count needs neither; the
        mean S; the sum S and Q (its stderr); variance and cv both."""
        q = self.query
        return q != "count", q in ("sum", "variance", "cv")

    @property
    def sums_used(self) -> set[str]:
        """The sums the release computes (N always; S and Q as :attr:`exact_sums` says), whose
        magnitude the bounds must keep finite
        (:func:`~ldp_beam.central.unit_release._check_magnitudes`)."""
        need_s, need_q = self.exact_sums
        return {"N"} | ({"S"} if need_s else set()) | ({"Q"} if need_q else set())

    @property
    def guarantee(self) -> PrivacyGuarantee:
        eps = float(self.epsilon)
        m, kt = self.unit_sensitivity, self.k_target
        bounds = self.contribution_bounds
        if m == 1:
            unit = (f" Per row (one user's {kt} target items): (P, {kt * eps:g}) by group "
                    "privacy." if kt > 1 else "")
        else:
            unit = (f" Per privacy unit ({bounds.describe()}): each record is kept with "
                    f"probability 1 - e^(-eps/{m}), i.e. (P, eps/{m} = {eps / m:.4g}) per record, "
                    f"so a unit's at most {m} rows x {kt} target item(s) cost (P, {kt * eps:g}) "
                    "together (group privacy of OSDP: each replaced sensitive record multiplies "
                    f"the ratio by at most e^(eps/{m})).")
        return PrivacyGuarantee(
            ULDP, eps, params={**central_unit_params(bounds, unit_epsilon=kt * eps),
                               "unit": "record (one item of one user)",
                               "record_epsilon": self.record_epsilon,
                               "osdp_epsilon": eps, "policy": "sensitive iff level > 0",
                               "keep_probability": self.keep_probability},
            notes=f"(P, {eps:g})-one-sided DP at record level (Kotsogiannis et al., ICDE 2020), "
                  "policy P: a record is sensitive iff its level > 0. Sensitive records are "
                  "never released; a non-sensitive record is released truthfully with "
                  + (f"probability 1 - e^-eps = {self.keep_probability:.4g}" if m == 1 else
                     f"probability 1 - e^-(eps/m) = 1 - e^-(eps/{m}) = "
                     f"{self.keep_probability:.4g} (m = L0 x Linf = {m}: the record budget)")
                  + ". Replacing a sensitive "
                  "record by any record changes the probability of any output by at most "
                  "e^eps (the suppression probability e^-eps defeats exclusion attacks). NOT DP "
                  "for non-sensitive records: they are published as they are. Reported as kind "
                  "ULDP because, per record, this is exactly utility-optimized LDP on (value, "
                  "level) pairs: the one protected output (suppressed) has probability 1 or "
                  "e^-eps, and every released output reveals a non-sensitive record. Record "
                  "level, not user level: a user's target items are separate records (j "
                  "sensitive items of one user: j eps by group privacy). Not comparable with "
                  "OSPDPRR's user-level DP, which protects every user. Keep probability and "
                  "'never release a sensitive record' are the spec's reading of the OSDP paper "
                  "(open question Q7). The answers are post-processing of the released sample, "
                  "which is drawn record by record where the rows are read (from the run's "
                  "secret key): each run over the data is one release (a new sample); "
                  "finalizing the same reports again publishes the same sample." + unit
                  + central_unit_text(bounds))

    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        _flag_values(self, cols, reasons)
        _flag_levels(self, cols, reasons, self.target)
        for i in self.target:
            cols[f"sensitive{i}"] = (np.nan_to_num(cols[f"level{i}"]) > 0).astype(np.uint8)

    def prepare(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        """Each valid row's target values and, per record (target item i), whether it is in
        the released sample: ``released<i> = (not sensitive) and u[:, j] < q``, u the row's k_T
        uniforms (per record, from the run's secret key and the row's identity in a pipeline):
        the same Bernoulli(q) per record as :meth:`release` draws."""
        kt = self.k_target
        vals = {f"value{i}": np.asarray(cols[f"value{i}"], dtype=np.float64) for i in self.target}
        n = vals[f"value{self.target[0]}"].shape[0]
        u = np.asarray(u)
        if u.ndim != 2 or u.shape[0] != n or u.shape[1] < kt:
            raise ValueError(f"{self.name} keeps each record with one uniform: prepare needs "
                             f"an ({n}, {kt}) array of uniforms, not shape {u.shape}")
        q = self.keep_probability
        out = dict(vals)
        for j, i in enumerate(self.target):
            sens = np.asarray(cols[f"sensitive{i}"]).astype(bool)
            out[f"released{i}"] = (~sens & (u[:, j] < q)).astype(np.uint8)
        if self.clip:
            out[CLIPPED] = _clipped_column(self, cols, n)
        return out

    def record_sums(self, values: np.ndarray, released: np.ndarray) -> tuple[int, int, int]:
        """(released records, exact S, exact Q) of the records marked ``released``: ``values``
        and ``released`` (n, k_T) arrays; S and Q in units of 2^-1074 (:func:`exact_sum_units`;
        0 where the query does not use them). Additive over any split of the rows."""
        rel = np.asarray(released).astype(bool)
        count = int(np.count_nonzero(rel))
        need_s, need_q = self.exact_sums
        if not count or not (need_s or need_q):
            return count, 0, 0
        v = np.asarray(values, dtype=np.float64)[rel]
        return (count, exact_sum_units(v) if need_s else 0,
                exact_sum_units(np.square(v)) if need_q else 0)

    def release(self, values: np.ndarray, sensitive: np.ndarray, rng: RngLike = None, *,
                allow_empty: bool = False) -> Estimate:
        """Sample the non-sensitive records (each kept with probability 1 - e^-eps; e^-(eps/m)
        per unit of m = L0 Linf rows) and answer the query from them: the in-memory release
        (all rows at once; the paper reproduction's path). ``values`` and ``sensitive``: (n,
        k_T) arrays. ``allow_empty``: release from no rows (a public key absent from the data).
        The statistics are those of :meth:`release_sums` on the sample's exact sums, i.e. what
        the one-pass estimator publishes for the same sample; ``curator`` adds the sample
        (``kept``, never published)."""
        vals = np.asarray(values, dtype=np.float64).reshape(-1, self.k_target)
        sens = np.asarray(sensitive).reshape(-1, self.k_target).astype(bool)
        if vals.shape[0] == 0 and not allow_empty:
            raise EmptyAccumulatorError(f"{self.name}: no reports (users) to release from")
        gen = as_generator(rng)
        q = self.keep_probability
        kept = ~sens & (gen.random(vals.shape) < q)
        rel = self.release_sums(*self.record_sums(vals, kept))
        return replace(rel, curator={"kept": kept, **rel.curator})

    def release_sums(self, records: int, s_units: int = 0, q_units: int = 0) -> Estimate:
        """The published statistics from the released sample's exact sums: ``records`` released
        records, the exact sums of their values ``s_units`` and of their squares ``q_units``
        (units of 2^-1074, as :meth:`record_sums` / :func:`exact_sum_units` give them), each
        rounded once to the nearest float64. No randomness: the sample was drawn per record."""
        q = self.keep_probability
        n_rel = float(records)
        s, ss = from_exact_units(s_units), from_exact_units(q_units)
        stats: dict[str, Statistic] = {"released_records": Statistic(
            int(records), note="records in the released sample (part of the OSDP output)")}
        if self.query in RATIO_QUERIES:
            raw = n_rel if self.query == "count" else s
            var_sum = (n_rel if self.query == "count" else ss) * (1 - q)
            stats[f"{self.query}_raw"] = Statistic(
                raw, math.sqrt(var_sum), note="on the released records: its expectation is "
                "q times the non-sensitive total (stderr: the sampling error alone)"
                + _clip_note(self))
            stats[f"{self.query}_scaled"] = Statistic(
                raw / q, math.sqrt(var_sum) / q,
                note="released total / q: an unbiased estimate of the non-sensitive total only; "
                     "biased by minus the sensitive mass (stderr excludes that bias)"
                     + _clip_note(self))
            stats[self.query] = stats[f"{self.query}_{self.estimator}"]
        elif not records:
            stats[self.query] = Statistic(None, note="no record was released" + _clip_note(self))
        else:
            value, clipped = query_answer(self.query, n_rel, s, ss, self.lower, self.upper,
                                          self.resolved_mean_floor)
            stats[self.query] = Statistic(
                float(value), None, float(clipped),
                note="on the released non-sensitive records; unbiased for the full data only "
                     "when sensitivity is independent of value" + _clip_note(self))
        return _estimate(self, stats,
                         {"q": q, "exact": (int(records), int(s_units), int(q_units))})


class OsdpRREstimator(_ReleasedOnce, Estimator):
    """The one release of OsdpRR, in one pass (see :class:`OsdpRR`).

    Each report carries its records' values and whether each is in the released sample
    (:meth:`OsdpRR.prepare`, drawn where the row was read). The accumulator is a numpy object
    array of four Python integers ``[users, records, S, Q]``: the users seen (curator
    bookkeeping, never released), the released records, and the exact sums of their values and
    squares in units of 2^-1074 (Python integers: float64 sums need up to ~2,100 bits); with
    ``clip=True`` a fifth, the values clipped (curator only: ``Estimate.curator
    ["values_clipped"]``). ``add``
    and ``merge`` add integers (no rounding: any split and merge order gives the same four
    integers, bit for bit); ``finalize`` rounds the sums once and answers the query. Constant
    memory: four integers of at most ~2,100 + log2(records) bits, whatever the number of users.

    ``seed`` is accepted for the registry's uniform signature and not used: the release draws
    nothing (the sample's randomness is the run key's, in ``Perturb``), so finalizing one
    accumulator twice publishes the same sample twice (one release, not two)."""

    #: the accumulator is four integers, not one row per user
    accumulates_rows: ClassVar[bool] = False

    def __init__(self, mechanism: Any, seed: int | None = None) -> None:
        super().__init__(mechanism)
        self.seed = seed
        self.fields = mechanism.report_fields
        # clip=True: a fifth integer, the values clipped into [lower, upper] (curator only)
        self.clip = bool(getattr(mechanism, "clip", False))

    @staticmethod
    def _acc(users: int, records: int, s: int, q: int, *clipped: int) -> np.ndarray:
        out = np.empty(4 + len(clipped), dtype=object)
        out[:] = [int(users), int(records), int(s), int(q), *(int(c) for c in clipped)]
        return out

    def create(self) -> np.ndarray:
        return self._acc(0, 0, 0, 0, *((0,) if self.clip else ()))

    def add(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        """``acc`` plus the reports' users, released records and exact sums (a new array)."""
        m = self.mechanism
        missing = [f"released{i}" for i in m.target if f"released{i}" not in reports]
        if missing:
            raise ParameterError("reports", sorted(reports), "osdp-rr reports: value<i> and "
                                 "released<i>, the record's sampling decision (made by "
                                 "OsdpRR.perturb/randomize), not sensitivity flags")
        first = np.asarray(reports[f"released{m.target[0]}"]).reshape(-1)
        n = first.size
        if not n:
            return acc
        if m.k_target == 1:
            vals = np.asarray(reports[f"value{m.target[0]}"], dtype=np.float64).reshape(-1, 1)
            rel = first.reshape(-1, 1)
        else:
            vals = np.column_stack([np.asarray(reports[f"value{i}"], dtype=np.float64)
                                    .reshape(-1) for i in m.target])
            rel = np.column_stack([np.asarray(reports[f"released{i}"]).reshape(-1)
                                   for i in m.target])
        c, s, q = m.record_sums(vals, rel != 0)
        users, records, s0, q0 = (int(a) for a in acc[:4])
        clipped = (int(acc[4]) + _clipped_sum(m, reports),) if self.clip else ()
        return self._acc(users + n, records + c, s0 + s, q0 + q, *clipped)

    def merge(self, accs: Iterable[np.ndarray]) -> np.ndarray:
        out = [0] * (5 if self.clip else 4)
        for a in accs:
            for j in range(len(out)):
                out[j] += int(a[j])
        return self._acc(*out)

    def n_reports(self, acc: np.ndarray) -> int:
        return int(acc[0])

    def canonical(self, acc: np.ndarray) -> np.ndarray:
        """The accumulator as ``finalize`` releases from it (equal for any split and merge
        order: the sums are exact)."""
        return self._acc(*acc)

    def finalize(self, acc: np.ndarray) -> Estimate:
        """The one release, from no rows too (noise alone; see :class:`_ReleasedOnce`)."""
        return self._release(acc)

    def finalize_key(self, acc: np.ndarray | None, key: Any) -> Estimate:
        """The release of one partition ``key`` of a per-key release (issue 14): an empty or
        missing accumulator (a public key absent from the data) is released from no rows, so
        that whether a public key occurs is not disclosed. The records' draws are addressed by
        each row's identity, so equal rows under two keys get independent samples."""
        return self._release(self.create() if acc is None else acc)

    def _release(self, acc: np.ndarray) -> Estimate:
        _, records, s, q = acc[:4]
        rel = self.mechanism.release_sums(int(records), int(s), int(q))
        return _curated(rel, acc[4] if self.clip else None)

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        m = self.mechanism
        for name, v in _report_values(self, reports, reasons):
            if name.startswith("value"):
                with np.errstate(invalid="ignore"):
                    bad = ~np.isfinite(v) | (v < m.lower) | (v > m.upper)
                reasons.flag(bad, lambda r, v=v, nm=name: f"report field {nm!r}: "
                             f"{float(v[r])!r} is not in [{m.lower!r}, {m.upper!r}]")
            else:
                reasons.flag(~np.isin(v, (0.0, 1.0)), lambda r, v=v, nm=name:
                             f"report field {nm!r}: {float(v[r])!r} is not 0 or 1")
        return reasons


__all__ = ["OsdpRR", "OsdpRREstimator", "osdp_keep_probability", "osdp_epsilon_for_threshold",
           "exact_sum_units", "from_exact_units"]
