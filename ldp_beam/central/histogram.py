"""Central-DP histogram publishing: the shared pieces (spec: shared/specs/dphr.md).

The curator sees true values. A *histogram release* is a :class:`HistogramRelease` subclass: a
frozen dataclass of validated parameters (the budget and the bucket domain) that

* maps raw records to bucket codes (``check``/``randomize``: validation and encoding only, no
  noise — ``draws == 0``; invalid records are dead-lettered by the Beam layer), and
* publishes a noisy histogram from true bucket counts, once: ``release_counts(counts, rng)``
  (an :class:`~ldp_beam.core.Estimate`).

:class:`HistogramReleaseEstimator` is the server side: its accumulator is the vector of bucket
counts (int64; mergeable by summation, so any Beam runner can build it), and ``finalize`` makes
the one release. Neighbouring datasets differ by adding or removing one record, which changes one
bucket count by 1 -- or, with contribution bounds (issue 14), by all rows of one *privacy unit*.

Contribution bounds (``max_partitions_per_unit`` = L0, ``max_rows_per_partition`` = Linf; both 1
by default, the per-record release): the pipeline keeps, for every unit, at most L0 partitions
and at most Linf rows in each before the release sees the records, so removing a unit changes all
partitions' counts together by at most m = L0 * Linf in L1. Every release here is calibrated to
m: its noise is the exact discrete Laplace of integer sensitivity m added to an integer (a bucket
count or a group sum; :func:`laplace_counts`, :func:`ldp_beam.noise.discrete_laplace_scale`, so
the realized epsilon m / t is at most the claim), never a floating-point Laplace variate, whose
low-order bits can reveal the input (docs/floating_point.md); every exponential-mechanism score
sensitivity is multiplied by m, and data-independent utility parameters that used a budget
(grouping errors, thresholds) use the per-record budget epsilon / m. Equivalently: the algorithm
at epsilon / m per record plus group privacy over the unit's m rows; per-key releases compose to
epsilon over all keys (docs/person_level.md).

The bucket domain is either numeric (``bins`` equal-width buckets on ``[lower, upper]``; the last
bucket includes ``upper``) or categorical (``categories``). Counts that are already aggregated
(e.g. the DPBench histograms) go straight to ``release_counts``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from fractions import Fraction
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from ..core import (CentralRelease, CountEstimator, Estimate, Reasons, Reports, Role, Statistic,
                    check_epsilon, check_interval, check_labels, coerce_numeric,
                    encode_categories)
from ..errors import ParameterError
from ..limits import check_cap
from ..mechanisms.categorical import count_labels
from ..noise import (discrete_laplace_scale, discrete_laplace_variance, lattice_laplace,
                     realized_epsilon)
from ..privacy import (CENTRAL, PrivacyGuarantee, UnitBounded, central_unit_params,
                       central_unit_text, check_contribution_bound)
from ..rng import RandomSource, RngLike
from .unit_release import _ReleasedOnce

BUCKET = (("bucket", "int32"),)


def as_generator(rng: RngLike) -> np.random.Generator:
    """A numpy Generator for curator-side noise: OS-entropy AES by default, seeded on request."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, RandomSource):
        return rng.generator()
    return RandomSource(rng).generator()


def check_counts(counts: Any, name: str = "counts", cap: str = "cells") -> np.ndarray:
    """Validate a histogram of counts: a non-empty 1-D array of non-negative integers, with at
    most the ``cap`` size cap of buckets (checked before the counts are converted)."""
    arr = np.asarray(counts)
    if arr.ndim != 1 or arr.size == 0:
        raise ParameterError(name, f"array of shape {arr.shape}", "a non-empty 1-D array of counts")
    check_cap(cap, arr.size, f"{name} (buckets)")
    if arr.dtype.kind not in "iuf" or arr.dtype.kind == "b":
        raise ParameterError(name, f"dtype {arr.dtype}", "numeric counts")
    vals = arr.astype(np.float64)
    bad = ~np.isfinite(vals) | (vals < 0) | (vals != np.floor(vals))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ParameterError(name, f"{arr[i]!r} at bucket {i} ({int(bad.sum())} such)",
                             "non-negative integer counts")
    return vals.astype(np.int64)


def _below(epsilon: float, part: float, rest: float) -> float:
    """``rest``, stepped down an ulp at a time until part + rest <= epsilon in exact arithmetic
    (a rounded difference or product can land above it)."""
    while Fraction(float(part)) + Fraction(float(rest)) > Fraction(float(epsilon)):
        rest = math.nextafter(rest, 0.0)
    return rest


def split_budget(epsilon: float, epsilon1: float | None, epsilon2: float | None,
                 default_fraction: float = 0.5) -> tuple[float, float]:
    """(eps1, eps2), both > 0, with eps1 + eps2 <= epsilon in exact arithmetic (sequential
    composition never spends more than epsilon) and equal to it up to rounding. Either part may
    be given (the other is the rest, rounded down), or both (then they must sum to epsilon up
    to rounding and never above it, exactly: e.g. 0.1 + 0.2 is above 0.3 as doubles; give one
    part and the rest is computed), or neither (``default_fraction`` of epsilon, then the
    rest)."""
    check_epsilon(epsilon)
    if epsilon1 is None and epsilon2 is None:
        first = epsilon * default_fraction
        return first, _below(epsilon, first, epsilon * (1 - default_fraction))
    if epsilon1 is not None and epsilon2 is not None:
        check_epsilon(epsilon1, "epsilon1")
        check_epsilon(epsilon2, "epsilon2")
        total = Fraction(float(epsilon1)) + Fraction(float(epsilon2))
        whole = Fraction(float(epsilon))
        if not (total <= whole and math.isclose(
                epsilon1 + epsilon2, epsilon, rel_tol=1e-12, abs_tol=1e-15)):
            raise ParameterError("epsilon1", epsilon1,
                                 f"epsilon1 + epsilon2 = epsilon = {epsilon!r}, up to rounding "
                                 f"and never above it in exact arithmetic (got {epsilon1!r} + "
                                 f"{epsilon2!r} = {float(total)!r}"
                                 + (", above epsilon)" if total > whole else ")"),
                                 "give only epsilon1 (or epsilon2): the other part is then "
                                 "epsilon minus it, rounded down")
        return float(epsilon1), float(epsilon2)
    part, name = (epsilon1, "epsilon1") if epsilon1 is not None else (epsilon2, "epsilon2")
    check_epsilon(part, name)
    if not part < epsilon:
        raise ParameterError(name, part, f"a part of epsilon = {epsilon!r}: in (0, {epsilon!r})")
    part = float(part)
    rest = _below(epsilon, part, epsilon - part)
    if not rest > 0:
        raise ParameterError(name, part, f"a part of epsilon = {epsilon!r} that leaves a rest "
                             "> 0: in (0, epsilon)")
    return (part, rest) if name == "epsilon1" else (rest, part)


class TwoPartBudget:
    """For releases that spend epsilon in two parts (a structure or view, then the counts):
    ``epsilon1``/``epsilon2`` fields (either, both or neither given) and the resolved
    ``budget``; ``DEFAULT_FRACTION`` of epsilon goes to the first part by default."""

    DEFAULT_FRACTION: ClassVar[float] = 0.5

    @property
    def budget(self) -> tuple[float, float]:
        return split_budget(self.epsilon, self.epsilon1, self.epsilon2,  # type: ignore[attr-defined]
                            self.DEFAULT_FRACTION)


@dataclass(frozen=True)
class HistogramRelease(UnitBounded, CentralRelease):
    """Base of the central histogram algorithms: the budget and the bucket domain."""

    family: ClassVar[str] = "dphr"
    roles: ClassVar[tuple[Role, ...]] = (
        Role("value", help="a number in [lower, upper] (numeric bins) or a label of categories"),)
    report_fields: ClassVar[tuple] = BUCKET
    #: histogram and groups: one row per bucket, with its edges (numeric bins, from the
    #: release's ``bucket_edges``) or its label (categories)
    tidy_cells: ClassVar[tuple[str, ...]] = ("i", "label", "bin_low", "bin_high")

    #: the size cap on the number of buckets (:mod:`ldp_beam.limits`): ``cells`` for releases
    #: linear in the buckets, ``grouping_buckets`` for those whose grouping is quadratic
    BUCKET_CAP: ClassVar[str] = "cells"
    #: shown by ``ldp-beam list``
    DEFAULT_NOTES: ClassVar[dict[str, str]] = {"lower": "required with bins",
                                               "upper": "required with bins"}

    epsilon: float
    bins: int = 0
    lower: float | None = None
    upper: float | None = None
    categories: tuple[str, ...] = ()
    #: contribution bounds per privacy unit (issue 14), enforced by the pipeline before the
    #: release: L0 partitions x Linf rows each; the noise is calibrated to L0 * Linf
    max_partitions_per_unit: int = 1
    max_rows_per_partition: int = 1

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        for name in ("max_partitions_per_unit", "max_rows_per_partition"):
            object.__setattr__(self, name, check_contribution_bound(getattr(self, name), name))
        if isinstance(self.categories, np.ndarray):  # an array of labels: `if array:` is ambiguous
            object.__setattr__(self, "categories", tuple(self.categories.ravel().tolist()))
        if self.categories:
            n = count_labels(self.categories)
            if n is not None:  # before the labels are read
                self.check_buckets(n, "categories")
            object.__setattr__(self, "categories", check_labels(self.categories, "categories"))
            self.check_buckets(len(self.categories), "categories")
            if self.bins:
                raise ParameterError("bins", self.bins,
                                     "0 when categories are given (one domain, not both)")
        elif self.bins:
            if isinstance(self.bins, bool) or not isinstance(self.bins, (int, np.integer)) \
                    or self.bins < 1:
                raise ParameterError("bins", self.bins, "an integer >= 1")
            self.check_buckets(int(self.bins), "bins")
            missing = [n for n in ("lower", "upper") if getattr(self, n) is None]
            if missing:
                raise ParameterError(
                    missing[0], None, f"a finite number: numeric bins need the domain [lower, "
                    f"upper] (missing: {', '.join(missing)})",
                    "no default domain fits arbitrary data: values outside it are dead-lettered")
            check_interval(self.lower, self.upper)

    @classmethod
    def check_buckets(cls, n: int, param: str) -> None:
        """Check a number of buckets (declared, or of counts given to ``release_counts``) against the
        release's size cap, before anything of that size is built."""
        check_cap(cls.BUCKET_CAP, n, param)

    # -- the privacy unit (contribution_bounds, unit_sensitivity: UnitBounded)
    def unit_guarantee(self, kind: str, epsilon: float, notes: str, params: dict | None = None,
                       claim: str = "") -> PrivacyGuarantee:
        """A guarantee of this release with the unit it holds for (params and a sentence)."""
        b = self.contribution_bounds
        return PrivacyGuarantee(kind, epsilon, notes=notes + central_unit_text(b), claim=claim,
                                params={**(params or {}), **central_unit_params(b)})

    # -- the domain
    @property
    def n_buckets(self) -> int:
        """Buckets of the declared domain (0: only ``release_counts`` on given counts is possible)."""
        return len(self.categories) if self.categories else int(self.bins)

    def bucket_edges(self) -> np.ndarray | None:
        return np.linspace(self.lower, self.upper, self.bins + 1) if self.bins else None

    def labels(self, role: str) -> tuple[str, ...]:
        return self.categories

    def check(self, data: Any) -> tuple[dict[str, np.ndarray], Reasons]:
        if not self.n_buckets:
            raise ParameterError("bins", 0, "a declared domain (bins >= 1 with lower/upper, or "
                                 "categories) to bucket raw records")
        cols = self.columns(data)
        raw = cols["value"]
        reasons = Reasons(len(raw))
        if self.categories:
            codes, missing, unknown = encode_categories(raw, self.categories)
            reasons.flag(missing, "value: missing value (a category is required)")
            reasons.flag(unknown, lambda i: f"value: {raw[i]!r} is not in the declared categories")
            return {"value": codes}, reasons
        vals, nonnum = coerce_numeric(raw)
        with np.errstate(invalid="ignore"):
            inside = (vals >= self.lower) & (vals <= self.upper)  # False for NaN
        if inside.all():  # nothing to flag (then no entry is non-numeric or missing either)
            codes = self._bucket_codes(vals)
            if codes is not None:
                return {"value": codes}, reasons
        reasons.flag(nonnum, lambda i: f"value: non-numeric value {raw[i]!r}")
        reasons.flag(np.isnan(vals), "value: missing value (a number is required)")
        outside = (vals < self.lower) | (vals > self.upper)
        reasons.flag(outside, lambda i: f"value: {float(vals[i]):g} is outside the declared "
                     f"domain [{self.lower:g}, {self.upper:g}] (not clipped)")
        with np.errstate(invalid="ignore"):
            pos = (vals - self.lower) / (self.upper - self.lower) * self.bins
        codes = np.where(reasons.bad, -1, np.minimum(np.floor(np.nan_to_num(pos)),
                                                     self.bins - 1)).astype(np.int64)
        return {"value": codes}, reasons

    #: values bucketed at a time by :meth:`_bucket_codes`: temporaries of 128 KiB (a whole
    #: 65,536-row batch's 512 KiB ones are mapped and faulted in afresh on every call, which
    #: made bucketing it four times slower than bucketing its slices)
    CODE_ROWS: ClassVar[int] = 1 << 14

    def _bucket_codes(self, vals: np.ndarray) -> np.ndarray | None:
        """The bucket of every value, all of them in [lower, upper] (None when the bounds are
        not plain Python numbers: the caller takes the general path). The general path's
        ``minimum(floor(pos), bins - 1)`` as int64, bit for bit: pos = (v - lower) / (upper -
        lower) * bins, the same float64 operations in the same order, is in [0, bins] here,
        where truncation (the cast) is the floor."""
        if not all(isinstance(b, (int, float)) and not isinstance(b, bool)
                   for b in (self.lower, self.upper)):
            return None
        n, step = vals.shape[0], self.CODE_ROWS
        lower, span, bins = self.lower, self.upper - self.lower, self.bins
        codes = np.empty(n, dtype=np.int64)
        for lo in range(0, n, step):
            pos = vals[lo:lo + step] - lower
            pos /= span
            pos *= bins
            codes[lo:lo + step] = pos
        np.minimum(codes, bins - 1, out=codes)
        return codes

    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        pass  # check() above does it all

    def prepare(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        return {"bucket": np.asarray(cols["value"], dtype=np.int32)}

    # -- the release
    def release_counts(self, counts: Any, rng: RngLike = None) -> Estimate:
        """One release from true bucket counts (the curator's), as an :class:`Estimate`:
        ``histogram`` (one value per bucket in bucket order; stderr: the noise alone, where
        known) and whatever else the algorithm publishes with it (``groups``, ``view``,
        ``order``, ``starts``, ``planned_error``: all functions of the noisy outputs, so
        publishable). ``rng``: None (OS entropy), a seed (testing only: not private), a
        :class:`~ldp_beam.rng.RandomSource` or a numpy Generator. The exact counts are not in
        it (``n_reports`` is None)."""
        rel = self._publish(counts, rng)
        var = self._noise_variance(rel)
        stats = {"histogram": Statistic(
            np.asarray(rel["histogram"]), None if var is None else np.sqrt(var),
            note="the published counts in bucket order; stderr: the noise alone (grouping "
                 "methods add a reconstruction bias it does not include)")}
        for name, value in rel.items():
            if name not in ("histogram", "noise_var"):
                stats[name] = Statistic(np.asarray(value) if not np.isscalar(value) else value,
                                        note=_RELEASE_NOTES.get(name, "part of the release"))
        return Estimate(self.name, None, stats, self.guarantee,
                        self.release_params(len(stats["histogram"].value)))

    def release_params(self, n: int) -> dict:
        """The parameters a release of ``n`` buckets carries (:attr:`Estimate.params`): the
        release's own (:meth:`params`) and, for numeric bins, ``bucket_edges``: the ``bins + 1``
        edges of the buckets in bucket order (bucket ``i`` is ``[edges[i], edges[i + 1])``, the
        last one includes ``upper``), as :meth:`bucket_edges` gives them.

        The edges are public parameters fixed before any data is seen, not an estimate (and
        ``bins + 1`` of them), so they sit with the other cell labels (``categories``,
        ``domain``) that the JSON, :meth:`Estimate.to_frame`, the tidy table
        (``bin_low``/``bin_high``) and the console read. ``bucket_edges`` is not a parameter of
        the release (leave it out to rebuild the release from an estimate's parameters). Counts
        given to :meth:`release_counts` that do not match the declared ``bins`` carry no edges
        (they are not the declared buckets)."""
        params = self.params()
        edges = self.bucket_edges()
        if edges is not None and len(edges) == n + 1:
            params["bucket_edges"] = tuple(float(e) for e in edges)
        return params

    # -- what subclasses provide
    def _publish(self, counts: Any, rng: RngLike = None) -> dict[str, Any]:
        """The algorithm: one release from true bucket counts, as arrays. Returns at least
        ``histogram`` (float64, one value per bucket, in the original bucket order) and may add
        ``noise_var`` (per-bucket noise variance), ``groups`` and other published outputs."""
        raise NotImplementedError

    def _noise_variance(self, release: Mapping[str, Any]) -> np.ndarray | None:
        """Per-bucket variance of the *noise* in a release (not the grouping bias), if known."""
        var = release.get("noise_var")
        return None if var is None else np.asarray(var)


#: what the extra outputs of a histogram release are (Statistic notes)
_RELEASE_NOTES = {
    "epsilon_spent": "the budget parts (eps1, eps2) the release spent",
    "groups": "group id of every bucket (part of the release)",
    "order": "the bucket order the grouping used (from the noisy view)",
    "view": "the noisy view of the counts the grouping was chosen on (epsilon1)",
    "starts": "first bucket of every group",
    "planned_error": "the grouping's planned error (a function of the noisy view)",
}


def laplace_counts(counts: np.ndarray, epsilon: float, gen: np.random.Generator,
                   sensitivity: int = 1) -> np.ndarray:
    """``counts`` (integers of L1 ``sensitivity``: 1 per record, m = L0 * Linf per bounded unit)
    plus exact discrete Laplace noise of scale sensitivity/epsilon (rounded up to a rational;
    :mod:`ldp_beam.noise`): an integer, exactly epsilon-DP view."""
    return lattice_laplace(counts, sensitivity, epsilon, gen)[0]


def count_noise_variance(epsilon: float, sensitivity: int = 1) -> float:
    """The variance of :func:`laplace_counts`' noise: 2q/(1 - q)^2, q = exp(-1/t),
    t ~ sensitivity/eps."""
    return discrete_laplace_variance(discrete_laplace_scale(sensitivity, epsilon))


@dataclass(frozen=True)
class IdentityLaplace(HistogramRelease):
    """LPA / identity: Laplace noise of scale 1/eps on every bucket (Dwork et al. 2006), as the
    exact discrete Laplace on the integer counts (see :mod:`ldp_beam.noise`); eps-DP, unbiased."""

    NAME: ClassVar[str] = "laplace-histogram"

    @property
    def guarantee(self) -> PrivacyGuarantee:
        m = self.unit_sensitivity
        what = ("L1 sensitivity 1 (add/remove a record)" if m == 1 else
                f"L1 sensitivity L0 x Linf = {m} (add/remove all bounded rows of one unit)")
        return self.unit_guarantee(
            CENTRAL, self.epsilon, notes="discrete Laplace mechanism on the integer counts, "
                                         f"sampled exactly (no floating-point noise), {what}")

    @property
    def scale(self):
        """The rational scale t >= m / epsilon of the discrete Laplace noise (m = L0 * Linf)."""
        return discrete_laplace_scale(self.unit_sensitivity, self.epsilon)

    @property
    def realized_epsilon(self) -> float:
        """The exact worst-case privacy loss of the release as sampled, per unit: m/t for the
        rational scale t >= m/epsilon the exact sampler uses (m = L0 * Linf, 1 per record; at most
        epsilon, within 2^-20 of it)."""
        return realized_epsilon(self.unit_sensitivity, self.scale)

    def _publish(self, counts: Any, rng: RngLike = None) -> dict[str, Any]:
        h = check_counts(counts, cap=self.BUCKET_CAP)
        return {"histogram": laplace_counts(h, self.epsilon, as_generator(rng),
                                            self.unit_sensitivity).astype(float),
                "noise_var": np.full(h.size, count_noise_variance(self.epsilon,
                                                                  self.unit_sensitivity))}


def group_means_with_noise(counts: np.ndarray, groups: np.ndarray, epsilon: float,
                           gen: np.random.Generator, sensitivity: int = 1
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Publish every bucket as its group's mean of the *true* counts plus noise of scale
    1/(epsilon |G|) shared by the group (DPHR Algorithm 1 line 8), as (group sum + Z) / |G| with
    Z exactly discrete Laplace of scale 1/epsilon on the integer group sum. Groups are disjoint,
    so one record moves one group sum by 1: epsilon-DP for a grouping fixed independently of the
    counts. With ``sensitivity`` m (a bounded unit's m = L0 * Linf rows move the group sums by at
    most m in L1 together) the scale is m/epsilon. Returns (histogram, per-bucket noise
    variance)."""
    k = int(groups.max()) + 1
    size = np.bincount(groups, minlength=k).astype(float)
    sums = np.zeros(k, dtype=np.int64)
    np.add.at(sums, groups, np.asarray(counts, dtype=np.int64))
    noisy = laplace_counts(sums, epsilon, gen, sensitivity) / size
    return noisy[groups], (count_noise_variance(epsilon, sensitivity) / size ** 2)[groups]


def _prefix_sums(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(values, dtype=float)
    return (np.concatenate([[0.0], np.cumsum(v)]),
            np.concatenate([[0.0], np.cumsum(v * v)]))


def _groups_from_starts(starts: np.ndarray, n: int) -> np.ndarray:
    """Group id of every position for contiguous groups beginning at ``starts`` (starts[0] = 0)."""
    gid = np.zeros(n, dtype=np.int64)
    gid[np.asarray(starts[1:], dtype=np.int64)] = 1
    return np.cumsum(gid)


#: "no key": a release that is not one of several per-key releases
UNKEYED: Any = object()


def release_source(seed: Any, acc: np.ndarray, key: Any = UNKEYED) -> RandomSource | None:
    """The noise source of one central release: OS entropy without a seed; with a seed, a
    deterministic function of the seed *and the accumulator*, so the same counts give the same
    release (reproducible tests) while releases of different counts (per-key, per-window) never
    share noise. A seeded release is for testing only: whoever knows the seed can remove the
    noise.

    ``key``: the partition key of a per-key release, part of the address. Per-key releases must
    pass it: two keys with equal counts would otherwise get *equal* noise, and whether two
    published histograms are equal would reveal whether their counts are (a neighbour that
    changes one of them changes that with probability near 1: no DP)."""
    if seed is None:
        return None
    digest = hashlib.sha256(np.ascontiguousarray(acc).tobytes()).hexdigest()
    where = "" if key is UNKEYED else f"key/{key_address(key)}/"
    return RandomSource(f"{seed}/release/{where}{acc.dtype}/{acc.shape}/{digest}")


def key_address(key: Any) -> str:
    """A stable text for a partition key (its type and value), for addressing its noise."""
    if isinstance(key, bytes):
        return "bytes:" + key.hex()
    if isinstance(key, (np.integer, np.floating, np.str_)):
        key = key.item()
    return f"{type(key).__name__}:{key!r}"


class HistogramReleaseEstimator(_ReleasedOnce, CountEstimator):
    """Accumulates bucket counts of raw records; ``finalize`` publishes once with the
    release's algorithm. Each call of ``finalize`` is one release (one use of the budget on those
    records); releases on disjoint records (per key, per window) compose in parallel. ``seed``
    makes the release's noise reproducible (default: OS entropy; see :func:`release_source`)."""

    def __init__(self, mechanism: HistogramRelease, seed: int | None = None) -> None:
        super().__init__(mechanism)
        if not mechanism.n_buckets:
            raise ParameterError("bins", 0, "a declared domain (bins or categories) to accumulate "
                                 "raw records; use release_counts(counts) for ready-made counts")
        self.n_cells = mechanism.n_buckets
        self.seed = seed

    def cells(self, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.asarray(reports["bucket"], dtype=np.int64)

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        if "bucket" in reports:
            raw = reports["bucket"]
            vals, _ = coerce_numeric(raw)
            ok = (vals >= 0) & (vals < self.n_cells) & (np.floor(vals) == vals)
            reasons.flag(~ok, lambda i: f"report field 'bucket': {raw[i]!r} is not a bucket in "
                         f"[0, {self.n_cells})")
        return reasons

    def finalize(self, acc: np.ndarray) -> Estimate:
        """The one release, from any accumulator, the empty one included (a noisy empty
        histogram; see :class:`~ldp_beam.central.unit_release._ReleasedOnce`)."""
        return self._release(acc, release_source(self.seed, acc))

    def finalize_key(self, acc: np.ndarray | None, key: Any) -> Estimate:
        """The release of one partition ``key`` of a per-key release (issue 14): the key is
        part of the noise's address (:func:`release_source`), and an empty or missing
        accumulator (a public key absent from the data) is released as a noisy empty histogram,
        so that whether a public key occurs is not disclosed. The caller selects the keys
        (:mod:`ldp_beam.central.partition`) and bounds each unit's contribution first."""
        acc = self.create() if acc is None else np.asarray(acc, dtype=np.int64)
        return self._release(acc, release_source(self.seed, acc, key))

    def _release(self, acc: np.ndarray, source: Any) -> Estimate:
        est = self.mechanism.release_counts(acc, source)
        # what the pipelines publish per release: the histogram and its groups (the other
        # outputs are the algorithm's diagnostics, kept for the paper reproductions)
        return dataclasses.replace(est, statistics={k: v for k, v in est.statistics.items()
                                                    if k in ("histogram", "groups")})
