"""Per-key central releases (issue 14): contribution bounding, private partition selection, public
keys, and what the whole per-key release costs.

A per-key release (``--by KEY``) publishes one central release (a histogram, an OSPDPRR answer)
per partition key. Two things must be private besides the releases themselves:

* **which keys occur.** Either the keys are a *public list* (:class:`PublicPartitions`: no cost;
  rows of unlisted keys are dropped before bounding, listed keys absent from the data are released
  as noisy empty releases, so nothing reveals whether a key occurs), or they are chosen by *private
  partition selection* (:class:`PartitionSelection`: thresholded noisy counts of distinct units,
  (epsilon, delta)-DP);
* **how much one unit contributes.** Each privacy unit is bounded first
  (:func:`bound_contributions`, the reference of what the Beam layer does): at most
  ``max_partitions_per_unit`` = L0 keys, at most ``max_rows_per_partition`` = Linf rows in each.
  The per-key releases are calibrated to the unit's total L1 over all keys, m = L0 * Linf (the
  releases' own ``max_partitions_per_unit`` / ``max_rows_per_partition``), so all per-key releases
  *together* cost their epsilon once per unit (docs/person_level.md).

Private partition selection (Laplace thresholding, as Google's differential-privacy library and
PipelineDP's ``LaplacePartitionSelection``; Wilson et al., PoPETs 2020; Desfontaines et al.,
PoPETs 2022), with the *discrete* Laplace so that the noise is exact (:mod:`ldp_beam.noise`):
keep key k iff c_k + Z_k >= T, with c_k the number of distinct units with a (kept) row in k
(after bounding: each unit counts in <= L0 keys) and Z_k discrete Laplace of scale
t = :func:`~ldp_beam.noise.discrete_laplace_scale` (L0, epsilon) >= L0 / epsilon, independent
per key. Keys a unit shares with others move by at most L0 in L1 (epsilon-DP, realized L0 / t <=
epsilon); each of the <= L0 keys only it has is kept with probability p1 = q^(T-1) / (1 + q),
q = e^(-1/t). Requiring p1 <= delta_p = 1 - (1 - delta)^(1/L0) (Google's per-partition delta)
gives (epsilon, delta)-DP per unit with the smallest such threshold

    T = 1 + ceil( t (ln(1/delta_p) - ln(1 + q)) )        (at least 1),

checked in log space with a relative margin of 1e-9 and moved by one where rounding requires.
The derivation, and the tests that check p1 and 1 - (1 - p1)^L0 against delta exactly:
docs/person_level.md ("Per-key releases").

Composition: the releases of the selected keys are epsilon_h-DP per unit for *any* selected set,
so selection then releases is (epsilon_s + epsilon_h, delta_s)-DP per unit (adaptive sequential
composition). :func:`per_key_guarantee` states it: the exact sum when every part is pure (public
keys: delta = 0), else the epsilon at delta_s from Google's ``dp_accounting``
(:func:`ldp_beam.privacy.compose_dp`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from fractions import Fraction
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..core import CentralRelease, Estimate, check_epsilon
from ..errors import ParameterError
from ..limits import check_cap
from ..noise import discrete_laplace, discrete_laplace_scale, realized_epsilon
from ..privacy import CENTRAL, NONE, PrivacyGuarantee, check_contribution_bound, compose_dp
from ..rng import RandomSource, RngLike
from .histogram import as_generator, key_address

#: relative margin on the per-partition delta when the threshold is chosen (floating point)
_THRESHOLD_MARGIN = 1e-9


# =============================================================================== bounding
def _rank_in_runs(keys_sorted: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... within each run of equal values of a sorted array."""
    n = keys_sorted.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    idx = np.arange(n)
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(keys_sorted[1:], keys_sorted[:-1], out=new[1:])
    start = np.maximum.accumulate(np.where(new, idx, 0))
    return idx - start


def _codes(values: Any, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ParameterError(name, f"array of shape {arr.shape}", "a 1-D array (one per row)")
    try:
        return np.unique(arr, return_inverse=True)[1].astype(np.int64).ravel()
    except TypeError:  # mixed types that do not sort: code them by their text
        return np.unique(np.array([key_address(v) for v in arr], dtype=object),
                         return_inverse=True)[1].astype(np.int64).ravel()


def bound_contributions(units: Any, partitions: Any = None, max_partitions_per_unit: int = 1,
                        max_rows_per_partition: int = 1, rng: RngLike = None,
                        keys: Sequence | None = None) -> np.ndarray:
    """Which rows to keep so that every privacy unit contributes at most
    ``max_partitions_per_unit`` (L0) partitions and at most ``max_rows_per_partition`` (Linf) rows
    in each: a boolean mask over the rows (the reference of the Beam layer's bounding, as
    PipelineDP bounds contributions).

    ``units``: the privacy unit of every row; ``partitions``: its partition key (None: one
    partition, as for a single release); ``keys``: a public list of partitions -- rows of other
    partitions are dropped *before* bounding, so that they do not use up a unit's L0. A unit's L0
    partitions are a uniformly random subset of its partitions, and its Linf rows in each a
    uniformly random subset of its rows there (random priorities from ``rng``: OS entropy by
    default). Vectorized: two sorts."""
    l0 = check_contribution_bound(max_partitions_per_unit, "max_partitions_per_unit")
    linf = check_contribution_bound(max_rows_per_partition, "max_rows_per_partition")
    u = _codes(units, "units")
    n = u.size
    if partitions is None:
        if keys is not None:
            raise ParameterError("keys", keys, "None without partitions (a single release)")
        p = np.zeros(n, dtype=np.int64)
        eligible = np.ones(n, dtype=bool)
    else:
        parr = np.asarray(partitions)
        if parr.shape != (n,):
            raise ParameterError("partitions", f"array of shape {parr.shape}",
                                 f"one partition key per row (shape ({n},))")
        p = _codes(parr, "partitions")
        eligible = np.ones(n, dtype=bool) if keys is None else PublicPartitions(keys).mask(parr)
    gen = as_generator(rng)
    keep = np.zeros(n, dtype=bool)
    rows = np.flatnonzero(eligible)
    if rows.size == 0:
        return keep
    uu, pp = u[rows], p[rows]
    pairs, pair_of_row = np.unique(np.stack([uu, pp], axis=1), axis=0, return_inverse=True)
    pair_of_row = pair_of_row.ravel()
    # L0: a random priority per (unit, partition) pair; keep the L0 smallest within each unit
    order = np.lexsort((gen.random(len(pairs)), pairs[:, 0]))
    keep_pair = np.empty(len(pairs), dtype=bool)
    keep_pair[order] = _rank_in_runs(pairs[order, 0]) < l0
    # Linf: a random priority per row; keep the Linf smallest within each pair
    order = np.lexsort((gen.random(rows.size), pair_of_row))
    keep_row = np.empty(rows.size, dtype=bool)
    keep_row[order] = _rank_in_runs(pair_of_row[order]) < linf
    keep[rows] = keep_row & keep_pair[pair_of_row]
    return keep


def distinct_unit_counts(units: Any, partitions: Any) -> tuple[np.ndarray, np.ndarray]:
    """(keys, counts): every partition key occurring in the rows and the number of distinct units
    with a row in it (the statistic private partition selection thresholds; computed after
    bounding, so each unit counts in at most L0 keys)."""
    parr = np.asarray(partitions)
    u = _codes(units, "units")
    if parr.shape != u.shape:
        raise ParameterError("partitions", f"array of shape {parr.shape}",
                             f"one partition key per row (shape {u.shape})")
    keys, p = np.unique(parr, return_inverse=True)
    pairs = np.unique(np.stack([u, p.ravel().astype(np.int64)], axis=1), axis=0)
    return keys, np.bincount(pairs[:, 1], minlength=keys.size).astype(np.int64)


# =============================================================================== selection
def selection_source(seed: Any, key: Any) -> RandomSource | None:
    """The noise source of one key's selection draw: OS entropy without a seed; with one (the
    run's release seed), addressed by the key, so a re-executed step draws the same noise."""
    if seed is None:
        return None
    return RandomSource(f"{seed}/partition-selection/{key_address(key)}")


def _check_delta(delta: Any) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating, np.integer)) \
            or not (math.isfinite(delta) and 0 < delta < 1):
        raise ParameterError("delta", delta, "a number in (0, 1) (the probability that a key "
                             "of a single unit is released; typically below 1 / number of units)")
    return float(delta)


def discrete_laplace_tail(k: Any, scale: Fraction | float) -> np.ndarray:
    """P(Z >= k) for Z discrete Laplace of ``scale`` t (q = e^(-1/t)): q^k / (1 + q) for k >= 0,
    1 - q^(1-k) / (1 + q) for k <= 0. Vectorized over integer k."""
    t = float(scale)
    q = math.exp(-1.0 / t)
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(over="ignore"):
        upper = np.exp(-np.maximum(k, 0.0) / t) / (1.0 + q)
        lower = 1.0 - np.exp(-np.maximum(1.0 - k, 0.0) / t) / (1.0 + q)
    return np.where(k >= 0, upper, lower)


@dataclass(frozen=True)
class PartitionSelection:
    """Private partition selection by discrete-Laplace thresholding (module docstring):
    keep a key iff (distinct units in it) + Z >= ``threshold``, Z discrete Laplace of scale
    ``scale`` >= L0 / epsilon. (epsilon, delta)-DP per privacy unit when each unit counts in at
    most ``max_partitions_per_unit`` = L0 keys.

    ``epsilon`` > 0, ``delta`` in (0, 1), ``max_partitions_per_unit`` an integer in [1, 10^6].
    """

    epsilon: float
    delta: float
    max_partitions_per_unit: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        object.__setattr__(self, "delta", _check_delta(self.delta))
        object.__setattr__(self, "max_partitions_per_unit", check_contribution_bound(
            self.max_partitions_per_unit, "max_partitions_per_unit"))
        self.threshold  # validates that a threshold exists (the scale is in range)

    # -- the calibration (computed once per instance)
    @cached_property
    def scale(self) -> Fraction:
        """t: the smallest rational >= L0 / epsilon the exact sampler uses."""
        return discrete_laplace_scale(self.max_partitions_per_unit, self.epsilon)

    @property
    def realized_epsilon(self) -> float:
        """L0 / t <= epsilon: the exact privacy loss on the keys present in both datasets."""
        return realized_epsilon(self.max_partitions_per_unit, self.scale)

    @property
    def partition_delta(self) -> float:
        """delta_p = 1 - (1 - delta)^(1/L0): the most a key with one unit may be released with."""
        return -math.expm1(math.log1p(-self.delta) / self.max_partitions_per_unit)

    @cached_property
    def threshold(self) -> int:
        """T: the smallest integer >= 1 with P(1 + Z >= T) = q^(T-1)/(1+q) <= delta_p."""
        t = float(self.scale)
        q = math.exp(-1.0 / t)
        log_target = math.log(self.partition_delta) + math.log1p(-_THRESHOLD_MARGIN)

        def log_p1(T: int) -> float:
            return -(T - 1) / t - math.log1p(q)
        T = 1 + max(0, math.ceil(t * (-log_target - math.log1p(q))))
        while log_p1(T) > log_target:
            T += 1
        while T > 1 and log_p1(T - 1) <= log_target:
            T -= 1
        return int(T)

    def keep_probability(self, count: Any) -> np.ndarray | float:
        """P(count + Z >= T): the probability that a key with ``count`` distinct units is kept
        (exact closed form, vectorized)."""
        p = discrete_laplace_tail(self.threshold - np.asarray(count, dtype=np.float64),
                                  self.scale)
        return float(p) if np.ndim(p) == 0 else p

    def drop_probability(self, count: Any) -> np.ndarray | float:
        """P(count + Z < T) = P(Z >= count - T + 1) (the noise is symmetric): 1 - keep, computed
        without cancellation where the key is almost surely kept."""
        p = discrete_laplace_tail(np.asarray(count, dtype=np.float64) - self.threshold + 1,
                                  self.scale)
        return float(p) if np.ndim(p) == 0 else p

    @property
    def single_unit_probability(self) -> float:
        """p1 = P(1 + Z >= T) = q^(T-1)/(1+q): a key of one unit is released (<= delta_p)."""
        return float(self.keep_probability(1))

    @property
    def realized_delta(self) -> float:
        """1 - (1 - p1)^L0: the probability that some key only one unit has is released (<=
        delta)."""
        return -math.expm1(self.max_partitions_per_unit * math.log1p(-self.single_unit_probability))

    # -- the selection
    def select(self, counts: Any, rng: RngLike = None) -> np.ndarray:
        """Which keys to keep, given their distinct-unit ``counts`` (non-negative integers,
        counted after bounding each unit to L0 keys): a boolean mask. One exact discrete Laplace
        draw per key from ``rng`` (OS entropy by default; per key and retry-proof with
        :func:`selection_source`)."""
        c = np.asarray(counts)
        if c.ndim != 1 or c.dtype.kind not in "iu" or (c.size and c.min() < 0):
            raise ParameterError("counts", f"array of shape {c.shape}, dtype {c.dtype}",
                                 "a 1-D array of non-negative integer counts of distinct units")
        if c.size == 0:
            return np.zeros(0, dtype=bool)
        z = discrete_laplace(as_generator(rng), self.scale, c.shape)
        return c.astype(np.int64) + z >= self.threshold

    def keep(self, count: int, rng: RngLike = None) -> bool:
        """The decision for one key (``rng``: e.g. ``selection_source(seed, key)``)."""
        return bool(self.select(np.array([int(count)], dtype=np.int64), rng)[0])

    @property
    def guarantee(self) -> PrivacyGuarantee:
        L0, T = self.max_partitions_per_unit, self.threshold
        return PrivacyGuarantee(
            CENTRAL, self.epsilon, self.delta,
            notes=f"private partition selection: a key is kept iff its number of distinct units "
                  f"+ discrete Laplace noise of scale t = {float(self.scale):.6g} (>= L0/eps = "
                  f"{L0}/{self.epsilon:g}) is >= T = {T}; eps on the keys present with and "
                  f"without the unit (L1 change <= L0 = {L0}), delta = 1 - (1 - p1)^L0 for the "
                  f"keys only the unit has (p1 = q^(T-1)/(1+q) = {self.single_unit_probability:.3g}"
                  f" per key). Per privacy unit when each unit counts in at most {L0} key(s) "
                  "(bounded before the selection).",
            params={"threshold": T, "scale": str(self.scale), "partitions_per_unit": L0,
                    "contribution_bounds": {"max_partitions_per_unit": L0,
                                            "max_rows_per_partition": None},
                    "unit_sensitivity": None, "unit": "privacy unit",
                    "partition_delta": self.partition_delta,
                    "single_unit_probability": self.single_unit_probability,
                    "realized_delta": self.realized_delta,
                    "realized_epsilon": self.realized_epsilon})


@dataclass(frozen=True)
class PublicPartitions:
    """A public list of partition keys: no selection cost. Rows of keys not in the list are
    dropped (before bounding: :func:`bound_contributions` with ``keys``); every listed key is
    released, from an empty accumulator when it has no rows, so whether a key occurs is never
    disclosed. The list must not be derived from the protected data."""

    keys: tuple = field(default=())

    def __post_init__(self) -> None:
        try:
            keys = tuple(self.keys)
        except TypeError:
            raise ParameterError("keys", self.keys, "a sequence of public partition keys") \
                from None
        if not keys:
            raise ParameterError("keys", keys, "a non-empty sequence of public partition keys")
        check_cap("groups", len(keys), "keys (public partitions)")
        try:
            distinct = len(set(keys))
        except TypeError:
            raise ParameterError("keys", self.keys, "hashable keys") from None
        if distinct != len(keys):
            raise ParameterError("keys", self.keys, "distinct keys")
        object.__setattr__(self, "keys", keys)

    def select(self, data_keys: Iterable = ()) -> tuple:
        """The keys to release: all the public ones, whatever ``data_keys`` holds."""
        return self.keys

    def absent(self, data_keys: Iterable) -> tuple:
        """Public keys without rows (released from an empty accumulator)."""
        have = set(data_keys)
        return tuple(k for k in self.keys if k not in have)

    def mask(self, partitions: Any) -> np.ndarray:
        """Rows whose key is in the list (the others are dropped before bounding)."""
        s = set(self.keys)
        return np.fromiter((p in s for p in np.asarray(partitions, dtype=object)), dtype=bool,
                           count=len(partitions))

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(CENTRAL, 0.0, notes=f"a public list of {len(self.keys)} keys: no "
                                "selection cost (the list must not depend on the data); listed "
                                "keys without rows are released from empty accumulators",
                                params={"public_keys": len(self.keys)})


# =============================================================================== composition
def per_key_guarantee(release: PrivacyGuarantee, selection: PrivacyGuarantee | None = None
                      ) -> PrivacyGuarantee:
    """What a per-key release costs per privacy unit: the per-key releases (``release``: the
    guarantee of one of them, calibrated to the unit's total L1 over all keys, so all of them
    together cost it once) after the key selection (``selection``: a
    :class:`PartitionSelection`'s or :class:`PublicPartitions`' guarantee; None = public keys).

    Sequential composition: pure parts add exactly; with delta > 0 (private selection) the
    epsilon at the selection's delta comes from ``dp_accounting`` (:func:`compose_dp`). The result
    keeps the release's params (contribution bounds, unit) and names both parts."""
    if "contribution_bounds" not in release.params:
        raise ParameterError("release", release.kind, "the guarantee of a central release "
                             "calibrated to contribution bounds")
    sel = selection if selection is not None else PrivacyGuarantee(
        CENTRAL, 0.0, notes="public keys: no selection cost")
    # the releases' epsilon per unit (OsdpRR states it apart from its per-record epsilon)
    rel = PrivacyGuarantee(release.kind, float(release.params.get("unit_epsilon",
                                                                  release.epsilon)),
                           release.delta)
    parts = [g for g in (sel, rel) if not (g.epsilon == 0.0 and g.delta == 0.0)]
    total = compose_dp(parts)
    if total.kind == NONE:
        return PrivacyGuarantee(NONE, math.inf, claim=release.claim,
                                notes="per-key release of a configuration without guarantee: "
                                      + release.notes, params=dict(release.params))
    how = total.params.get("accounting", "exact sum (pure epsilon)")
    L0 = sel.params.get("partitions_per_unit")
    release_l0 = release.params["contribution_bounds"].get("max_partitions_per_unit")
    if L0 is not None and release_l0 is not None and release_l0 > L0:
        raise ParameterError("max_partitions_per_unit", release_l0,
                             f"at most {L0}: the partition selection is calibrated to {L0} "
                             "key(s) per unit")
    sel_text = ("public keys (no cost)" if sel.delta == 0.0 and sel.epsilon == 0.0 else
                f"private partition selection ({sel.epsilon:g}, {sel.delta:g})")
    params = {**release.params, "per_key": True, "selection": dict(sel.params),
              "selection_epsilon": sel.epsilon, "selection_delta": sel.delta,
              "release_epsilon": rel.epsilon, "accounting": how}
    params.pop("unit_epsilon", None)  # the composed epsilon is per unit already
    if L0 is not None:
        params["partitions_per_unit"] = L0
    return PrivacyGuarantee(
        total.kind, total.epsilon, total.delta, claim=release.claim, params=params,
        notes=f"per-key release: {sel_text}, then every selected key released with "
              f"epsilon = {rel.epsilon:g} calibrated to the unit's total contribution over "
              f"all keys (so all keys together cost it once per unit); composed: "
              f"({total.epsilon:.6g}, {total.delta:g}) by {how}. Per key: " + release.notes)


@dataclass(frozen=True)
class PerKeyRelease:
    """The outcome of :func:`release_per_key`: one estimate per released key, and the guarantee
    of the whole (selection and releases together)."""

    estimates: dict
    guarantee: PrivacyGuarantee
    selected: tuple


def release_per_key(estimator: Any, accumulators: Mapping[Any, Any],
                    selection: PartitionSelection | PublicPartitions,
                    unit_counts: Mapping[Any, int] | None = None) -> PerKeyRelease:
    """Select keys and release each (the per-key release on the curator, in memory; the Beam
    layer does the same per key): ``accumulators`` maps each key with rows to its estimator
    accumulator (built from rows bounded to the release's contribution bounds); ``unit_counts``
    the distinct units per key (required by :class:`PartitionSelection`). With
    :class:`PublicPartitions`, every listed key is released (absent ones from an empty
    accumulator) and unlisted keys are ignored. Noise: the estimator's ``seed`` addresses each
    key's selection and release draws (OS entropy without one)."""
    mech = estimator.mechanism
    if not isinstance(mech, CentralRelease) or not hasattr(estimator, "finalize_key"):
        raise ParameterError("estimator", type(estimator).__name__,
                             "the estimator of a central release (with finalize_key)")
    seed = getattr(estimator, "seed", None)
    if isinstance(selection, PublicPartitions):
        keys = selection.select(accumulators)
    elif isinstance(selection, PartitionSelection):
        if selection.max_partitions_per_unit < mech.max_partitions_per_unit:
            raise ParameterError("max_partitions_per_unit", mech.max_partitions_per_unit,
                                 f"at most the selection's {selection.max_partitions_per_unit}")
        if unit_counts is None or set(unit_counts) != set(accumulators):
            raise ParameterError("unit_counts", None if unit_counts is None else
                                 f"{len(unit_counts)} keys", "the distinct units of every key "
                                 "with rows (private partition selection thresholds them)")
        check_cap("groups", len(accumulators), "keys (partitions)")
        keys = tuple(k for k in accumulators
                     if selection.keep(int(unit_counts[k]), selection_source(seed, k)))
    else:
        raise ParameterError("selection", type(selection).__name__,
                             "PartitionSelection(epsilon, delta, L0) or PublicPartitions(keys)")
    estimates: dict[Any, Estimate] = {k: estimator.finalize_key(accumulators.get(k), k)
                                      for k in keys}
    return PerKeyRelease(estimates, per_key_guarantee(mech.guarantee, selection.guarantee),
                         tuple(keys))


__all__ = ["bound_contributions", "distinct_unit_counts", "PartitionSelection",
           "PublicPartitions", "per_key_guarantee", "release_per_key", "PerKeyRelease",
           "selection_source", "discrete_laplace_tail"]
