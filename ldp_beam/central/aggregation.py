"""Central-DP aggregations per key: what they share (PipelineDP's COUNT, PRIVACY_ID_COUNT, SUM,
MEAN, VARIANCE and PERCENTILE, as ldp-beam releases; docs/person_level.md compares them).

The six releases (modules :mod:`.count`, :mod:`.sum`, :mod:`.mean`, :mod:`.variance`,
:mod:`.quantiles`) are :class:`~ldp_beam.core.CentralRelease` subclasses run by the engine of the
histogram releases: the pipeline bounds every privacy unit to at most ``max_partitions_per_unit``
= L0 keys and ``max_rows_per_partition`` = Linf rows per key before the release sees the rows
(reference: :func:`ldp_beam.central.partition.bound_contributions`), selects the keys, and
releases every key once with noise addressed by the key
(:func:`~ldp_beam.central.histogram.release_source`). Each release is calibrated to m = L0 x Linf
rows per unit over all keys, so all keys together cost its epsilon once per unit.

**Values are never clipped**: one outside ``[lower, upper]``, non-numeric or missing is
dead-lettered with a reason naming the role and the domain (PipelineDP clamps without telling,
which silently biases a sum or a mean towards the bounds).

**Noise is exact**: every statistic is an integer before noise is added (counts; sums exact on a
fixed grid, :class:`Lattice`) and the noise is the discrete Laplace sampled with integer
arithmetic (:mod:`ldp_beam.noise`), never a floating-point Laplace variate, whose low-order bits
can reveal the input (Mironov 2012; docs/floating_point.md).

**The grid.** A bounded term t (|t| <= B, B public: max(|lower|, |upper|) for a sum, (upper -
lower)/2 for the midpoint-normalized sums of the mean and variance) is put on the grid
g = 2^(e - k), B < 2^e, k = :data:`GRID_BITS` = 40 (fewer only when m/epsilon would put the noise
scale beyond the exact sampler's integer range: k <= 52 + log2(epsilon / m)). t / g is exact in
floating point, so the only rounding is ``rint``, at most g/2 <= B 2^-40 per row; the sum of n
rows is exact in integers (two 32-bit limbs in the int64 accumulator), so the released sum's
rounding error is at most n g/2, deterministic and not in the stderr. The noise SD is at least
sqrt(2) m D g (D = B/g >= 2^(k-1)), so the rounding is below 1% of it for n up to
0.02 sqrt(2) D m rows (above 10^10 at k = 40; every release states its own threshold). For a
mean the rounding is at most g/2 whatever n.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Mapping

import numpy as np

from ..core import (Estimate, Estimator, Reasons, Statistic, check_epsilon, check_interval,
                    coerce_numeric, quote_value, value_at)
from ..errors import ParameterError
from ..noise import (discrete_laplace, discrete_laplace_scale, discrete_laplace_variance,
                     realized_epsilon, to_units)
from ..privacy import (CENTRAL, PrivacyGuarantee, UnitBounded, central_unit_params,
                       central_unit_text, check_contribution_bound)
from .histogram import as_generator, release_source
from .unit_release import _ReleasedOnce

#: bits of the grid below the term's bound B (g = 2^(e - GRID_BITS), B < 2^e)
GRID_BITS = 40
#: the noise scale in lattice units stays below 2^SCALE_BITS (the exact sampler takes < 2^56)
SCALE_BITS = 52
#: a budget so small that fewer grid bits would remain is refused
MIN_GRID_BITS = 8
#: the two limbs of a wide sum: value = hi * 2^32 + lo, 0 <= lo < 2^32
LIMB_BITS = 32
_LIMB_MASK = (1 << LIMB_BITS) - 1
#: rows summed at a time into a limb (each below 2^32: a chunk's sum stays below 2^52)
_CHUNK = 1 << 20

NEVER_CLIPPED = ("values outside [lower, upper], non-numeric or missing values are "
                 "dead-lettered with the reason, never clipped (PipelineDP clamps them into its "
                 "bounds without telling)")


# =============================================================================== the grid
@dataclass(frozen=True)
class Lattice:
    """How one bounded sum is released: its terms t (|t| <= ``bound``) on the grid ``grid``,
    at most ``units`` grid steps each; the L1 ``sensitivity`` in grid units of all of one unit's
    terms (m x units), the budget ``epsilon`` of this part and the exact discrete Laplace
    ``scale`` (>= sensitivity / epsilon)."""

    bound: float
    bits: int
    grid: float
    units: int
    sensitivity: int
    epsilon: float
    scale: Fraction

    @classmethod
    def of(cls, bound: float, m: int, epsilon: float, what: str) -> "Lattice":
        if not (math.isfinite(bound) and bound >= 2.0 ** -900):
            raise ParameterError("lower, upper", bound, f"bounds whose {what} bound is a "
                                 "normal float at least 2^-900 (its grid would underflow)")
        bits = min(GRID_BITS, math.floor(SCALE_BITS + math.log2(epsilon) - math.log2(m)))
        if bits < MIN_GRID_BITS:
            raise ParameterError(
                "epsilon", epsilon, f"at least m x 2^{MIN_GRID_BITS - SCALE_BITS} = "
                f"{m * 2.0 ** (MIN_GRID_BITS - SCALE_BITS):.3g} for the {what} (m = L0 x Linf = "
                f"{m}): a smaller budget makes a noise scale beyond the exact sampler's range")
        grid = math.ldexp(1.0, math.frexp(bound)[1] - bits)  # bound < 2^e, grid = 2^(e - k)
        units = int(to_units(bound, grid))
        sens = m * units
        return cls(float(bound), bits, grid, units, sens, float(epsilon),
                   discrete_laplace_scale(sens, epsilon))

    def encode(self, terms: np.ndarray) -> np.ndarray:
        """Terms (|t| <= bound) as int64 grid units. Rounding is monotone, so in-domain terms
        are within [-units, units]; the clip only guards the floating-point rounding of a term
        computed from a value (e.g. v - midpoint), never a value: values outside the domain
        were dead-lettered before."""
        u = to_units(terms, self.grid)
        np.clip(u, -self.units, self.units, out=u)
        return u

    @property
    def noise_variance_units(self) -> float:
        return float(discrete_laplace_variance(self.scale))

    @property
    def noise_sd(self) -> float:
        """The noise's standard deviation in data units."""
        return math.sqrt(self.noise_variance_units) * self.grid

    @property
    def negligible_rows(self) -> float:
        """Rows up to which the worst rounding, n g/2, is below 1% of the noise SD."""
        return 0.02 * math.sqrt(self.noise_variance_units)

    @property
    def realized_epsilon(self) -> float:
        return realized_epsilon(self.sensitivity, self.scale)

    def noisy(self, total: int, gen: np.random.Generator) -> int:
        """The exact integer ``total`` (grid units) plus one exact discrete Laplace draw."""
        return int(total) + int(discrete_laplace(gen, self.scale))

    def describe(self, name: str) -> str:
        return (f"{name} on the grid g = 2^{math.frexp(self.grid)[1] - 1} = {self.grid:.6g} "
                f"(|term| <= {self.bound:.6g} = {self.units} grid units; L1 sensitivity "
                f"{self.sensitivity} units; discrete Laplace of scale {float(self.scale):.6g} "
                f"units at epsilon {self.epsilon:.6g}; rounding <= g/2 per row, below 1% of the "
                f"noise SD for up to {self.negligible_rows:.3g} rows)")

    def params(self) -> dict:
        return {"grid": self.grid, "bound": self.bound, "units": self.units,
                "sensitivity_units": self.sensitivity, "epsilon": self.epsilon,
                "scale_units": str(self.scale)}


def wide_add(acc: np.ndarray, lo: int, units: np.ndarray) -> None:
    """Add int64 ``units`` exactly to the two-limb sum ``acc[lo], acc[lo + 1]`` (value =
    acc[lo + 1] * 2^32 + acc[lo]), leaving it normalized (0 <= acc[lo] < 2^32)."""
    u = np.asarray(units, dtype=np.int64)
    low = int(acc[lo])
    high = int(acc[lo + 1])
    for s in range(0, u.size, _CHUNK):
        c = u[s:s + _CHUNK]
        low += int(np.bitwise_and(c, _LIMB_MASK).sum())  # c mod 2^32, in [0, 2^32)
        high += int(np.right_shift(c, LIMB_BITS).sum())  # floor(c / 2^32)
    set_wide(acc, lo, high * (1 << LIMB_BITS) + low)


def set_wide(acc: np.ndarray, lo: int, value: int) -> None:
    """Store the integer ``value`` normalized in the limbs ``acc[lo], acc[lo + 1]``."""
    high, low = divmod(int(value), 1 << LIMB_BITS)
    if not -(1 << 63) <= high < (1 << 63):
        raise OverflowError("a sum beyond 2^95 grid units (more than 2^55 rows): not supported")
    acc[lo], acc[lo + 1] = low, high


def get_wide(acc: np.ndarray, lo: int) -> int:
    """The integer held in the limbs ``acc[lo], acc[lo + 1]``."""
    return int(acc[lo + 1]) * (1 << LIMB_BITS) + int(acc[lo])


def normalize_wide(acc: np.ndarray, limbs: tuple[int, ...]) -> np.ndarray:
    """Carry every limb pair (after a merge summed them) back into normal form."""
    for lo in limbs:
        set_wide(acc, lo, get_wide(acc, lo))
    return acc


# =============================================================================== releases
class Aggregation(UnitBounded):
    """What the six aggregations share (a mixin of frozen dataclasses that declare the fields
    ``epsilon``, ``max_partitions_per_unit``, ``max_rows_per_partition`` and, where values are
    involved, ``lower`` and ``upper``): the contribution bounds and the guarantee's unit, the
    value checks (dead-lettering, never clipping) and what the estimator needs (``ACC_SIZE``,
    ``LIMBS``, :meth:`fold`, :meth:`release_from`)."""

    family: ClassVar[str] = "aggregation"
    #: scalars (count, sum, mean, variance), each with its clipped value (quantiles: by ``i``)
    tidy_cells: ClassVar[tuple[str, ...]] = ("clipped",)
    #: whether the release reads values in [lower, upper] (else the column is only counted)
    NUMERIC: ClassVar[bool] = True
    #: the limb pairs of the accumulator (first limb's index), normalized after a merge
    LIMBS: ClassVar[tuple[int, ...]] = ()

    def _check_common(self, power: int = 1) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon))
        for name in ("max_partitions_per_unit", "max_rows_per_partition"):
            object.__setattr__(self, name, check_contribution_bound(getattr(self, name), name))
        if self.NUMERIC:
            check_interval(self.lower, self.upper, power=power,
                           computes="sums of squares" if power == 2 else "")
            object.__setattr__(self, "lower", float(self.lower))
            object.__setattr__(self, "upper", float(self.upper))

    # -- the privacy unit (contribution_bounds, unit_sensitivity: UnitBounded)
    def unit_guarantee(self, notes: str, params: dict | None = None,
                       realized: float | None = None) -> PrivacyGuarantee:
        b = self.contribution_bounds
        extra = dict(params or {})
        if realized is not None:
            extra["realized_epsilon"] = realized
        return PrivacyGuarantee(CENTRAL, self.epsilon, notes=notes + central_unit_text(b),
                                params={**extra, **central_unit_params(b)})

    @property
    def midpoint(self) -> float:
        return self.lower / 2 + self.upper / 2

    @property
    def half_width(self) -> float:
        return self.upper / 2 - self.lower / 2

    # -- the rows
    def check(self, data: Any) -> tuple[dict[str, np.ndarray], Reasons]:
        cols = self.columns(data)
        raw = cols["value"]
        n = len(raw)
        reasons = Reasons(n)
        if not self.NUMERIC:  # a count: every row counts, whatever the column holds
            return {"value": np.zeros(n, dtype=np.int8)}, reasons
        vals, nonnum = coerce_numeric(raw)
        lo, hi = self.lower, self.upper
        with np.errstate(invalid="ignore"):
            inside = (vals >= lo) & (vals <= hi)  # False for NaN
        if inside.all():
            return {"value": vals}, reasons
        domain = f"the declared domain [lower, upper] = [{lo:g}, {hi:g}]"
        reasons.flag(nonnum, lambda i: f"value: non-numeric value "
                     f"{quote_value(value_at(raw, i))} (a number in {domain} is required)")
        reasons.flag(np.isnan(vals), f"value: missing value (a number in {domain} is required)")
        reasons.flag(~inside, lambda i: f"value: {float(vals[i]):g} is outside {domain} "
                     "(dead-lettered, not clipped)")
        return {"value": vals}, reasons

    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        pass  # check() above does it all

    # -- what the estimator calls
    ACC_SIZE: ClassVar[int] = 1

    def fold(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        """Add a batch of prepared rows: the row count at ``acc[0]``, and each report field's
        exact integer sum into its two limbs at the matching ``LIMBS`` position (the sums'
        releases); a release with another accumulator overrides it."""
        cols = [np.asarray(reports[name], dtype=np.int64) for name, _ in self.report_fields]
        acc[0] += cols[0].size
        for col, at in zip(cols, self.LIMBS):
            wide_add(acc, at, col)
        return acc

    def report_bounds(self) -> dict[str, tuple[int, int]]:
        """The valid integer range of each prepared field ``check_reports`` enforces (a field
        not named here is only counted): the grid units of a bounded term, a tree leaf."""
        return {}

    def rows_in(self, acc: np.ndarray) -> int:
        """The exact number of rows in an accumulator (curator-only)."""
        return int(acc[0])

    def release_from(self, acc: np.ndarray, gen: np.random.Generator
                     ) -> tuple[dict[str, Statistic], dict]:
        """(published statistics, exact curator-only numbers) of one release."""
        raise NotImplementedError


def draw_noise(gen: np.random.Generator, scales: list) -> list[int]:
    """One exact discrete Laplace draw per scale (a release's parts), in one sampler call."""
    arr = np.empty(len(scales), dtype=object)
    arr[:] = list(scales)
    return [int(z) for z in discrete_laplace(gen, arr)]


def budget_part(epsilon: float, parts: int) -> float:
    """epsilon / parts as a double that is at most the exact quotient, so that the parts of a
    split never sum to more than epsilon (sequential composition, in exact arithmetic)."""
    part = epsilon / parts
    while Fraction(part) * parts > Fraction(epsilon):
        part = math.nextafter(part, 0.0)
    return part


def positive_denominator(n: int) -> int:
    """A noisy count as a denominator: at least 1 (post-processing, as PipelineDP does)."""
    return max(int(n), 1)


class AggregationEstimator(_ReleasedOnce, Estimator):
    """The estimator of an :class:`Aggregation`: an int64 accumulator (counts and exact two-limb
    grid sums; merge is a sum with the limbs carried), released once by ``finalize`` (or
    ``finalize_key`` per key, noise addressed by the key). ``seed`` makes the noise reproducible
    (testing only: not private; see :func:`~ldp_beam.central.histogram.release_source`)."""

    def __init__(self, mechanism: Any, seed: int | None = None) -> None:
        super().__init__(mechanism)
        self.seed = seed

    def create(self) -> np.ndarray:
        return np.zeros(self.mechanism.ACC_SIZE, dtype=np.int64)

    def add(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        return self.mechanism.fold(acc, reports)

    def merge(self, accs: Any) -> np.ndarray:
        accs = list(accs)
        if not accs:
            return self.create()
        acc = np.sum(np.stack([np.asarray(a, dtype=np.int64) for a in accs]), axis=0)
        return normalize_wide(acc, self.mechanism.LIMBS)

    def n_reports(self, acc: np.ndarray) -> int:
        return self.mechanism.rows_in(acc)

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        """Prepared rows read back (a reports table): each bounded field an integer in its
        range (:meth:`Aggregation.report_bounds`), else dead-lettered: a term beyond its bound
        would exceed the sensitivity the noise is calibrated to."""
        reasons = super().check_reports(reports, n)
        for name, (lo, hi) in self.mechanism.report_bounds().items():
            if name not in reports:
                continue
            raw = reports[name]
            vals, _ = coerce_numeric(raw)
            with np.errstate(invalid="ignore"):
                ok = (vals >= lo) & (vals <= hi) & (np.floor(vals) == vals)
            reasons.flag(~ok, lambda i, r=raw, f=name: f"report field {f!r}: {r[i]!r} is not an "
                         f"integer in [{lo}, {hi}]")
        return reasons

    def finalize(self, acc: np.ndarray) -> Estimate:
        """The one release, from any accumulator, the empty one included (noise alone; see
        :class:`~ldp_beam.central.unit_release._ReleasedOnce`)."""
        acc = np.asarray(acc, dtype=np.int64)
        return self._release(acc, release_source(self.seed, acc))

    def finalize_key(self, acc: np.ndarray | None, key: Any) -> Estimate:
        """The release of one partition ``key``: the key is part of the noise's address, and a
        missing accumulator (a public key absent from the data) is released as a noisy empty
        one, so whether a public key occurs is not disclosed."""
        acc = self.create() if acc is None else np.asarray(acc, dtype=np.int64)
        return self._release(acc, release_source(self.seed, acc, key))

    def _release(self, acc: np.ndarray, source: Any) -> Estimate:
        stats, exact = self.mechanism.release_from(acc, as_generator(source))
        # n_reports=None: the exact number of records is sensitive; it stays with the curator
        return Estimate(self.mechanism.name, None, stats, self.mechanism.guarantee,
                        self.mechanism.params(), curator=exact)


__all__ = ["Aggregation", "AggregationEstimator", "Lattice", "GRID_BITS", "NEVER_CLIPPED",
           "wide_add", "get_wide", "set_wide", "normalize_wide", "positive_denominator",
           "budget_part", "draw_noise"]
