"""The query machinery shared by the per-user central releases of one-sided privacy: OSPDPRR
(:mod:`ldp_beam.central.ospdprr`) and its baseline OsdpRR (:mod:`ldp_beam.central.osdprr`) are
both built on it, and neither imports from the other.

It holds the queries (count, sum, mean, variance, cv) and their answers from the count, sum and
sum of squares (:func:`query_answer`), the lattice those statistics are summed on
(:func:`statistic_lattice`), the parameter checks (query, items, interval, magnitudes and the
contribution bounds), clipping and its curator-only count (report field :data:`CLIPPED`), the
release as an :class:`~ldp_beam.core.Estimate`, and the base of an estimator that releases once
(the contribution bounds are every central release's :class:`~ldp_beam.privacy.UnitBounded`). Spec: ``shared/specs/ospdprr.md``.
"""
from __future__ import annotations

import math
import sys
from dataclasses import replace
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from ..core import Estimate, Reasons, Statistic, check_choice, check_interval, coerce_numeric
from ..errors import ParameterError
from ..limits import check_cap
from ..noise import discrete_laplace_scale, discrete_laplace_variance
from ..privacy import check_contribution_bound

QUERIES = ("count", "sum", "mean", "variance", "cv")
#: the noisy statistics each query is built from; the budget is split equally among them (§6)
QUERY_STATISTICS = {"count": ("N",), "sum": ("S",), "mean": ("N", "S"),
                    "variance": ("N", "S", "Q"), "cv": ("N", "S", "Q")}
STATISTIC_NAMES = {"N": "sample_count", "S": "sample_sum", "Q": "sample_sumsq"}
RATIO_QUERIES = ("count", "sum")


#: real-valued statistics are summed exactly as integers on a grid of 2^-LATTICE_BITS of their
#: per-value bound, so their sensitivity in grid units is an exact integer (ldp_beam.noise)
LATTICE_BITS = 20


def statistic_lattice(query: str, k_target: int, lower: float, upper: float,
                      unit_rows: int = 1) -> dict[str, tuple[float, int]]:
    """(grid, sensitivity in grid units) of each noisy statistic of ``query``: N counts items
    (grid 1, sensitivity k_T); S and Q sum values and squares in units of Bmax / 2^20 and
    Bmax^2 / 2^20 (sensitivity k_T 2^20: rounding is monotone, so a value bounded by Bmax has at
    most 2^20 units). The grids are powers of two times the bound, so no rounding hides in them.
    ``unit_rows`` = m multiplies every sensitivity (an integer: a unit of at most m rows)."""
    check_choice(query, "query", QUERIES)
    bmax = max(abs(float(lower)), abs(float(upper)))
    unit = 1 << LATTICE_BITS
    m = int(unit_rows)
    lattice = {"N": (1.0, m * int(k_target)), "S": (bmax / unit, m * int(k_target) * unit),
               "Q": (bmax * bmax / unit, m * int(k_target) * unit)}
    return {s: lattice[s] for s in QUERY_STATISTICS[query]}


def query_answer(query: str, n: Any, s: Any, q: Any, lower: float, upper: float,
                 mean_floor: float | None = None) -> tuple[Any, Any]:
    """The query from (noisy) count, sum and sum of squares; post-processing only (spec §6).
    Returns ``(value, clipped)``: the plain formula and its post-processed form inside the valid
    range. mean: S/max(N, 1), clipped to [lower, upper]; variance: Q/max(N, 1) - mean^2 with the
    clipped mean, clipped to [0, (upper - lower)^2 / 4]; cv: sqrt(clipped variance) / max(clipped
    mean, mean_floor) (value and clipped agree). Vectorized over arrays."""
    check_choice(query, "query", QUERIES)
    if query == "count":
        n = np.asarray(n, dtype=np.float64)
        return n, np.maximum(n, 0.0)
    if query == "sum":
        s = np.asarray(s, dtype=np.float64)
        lo = 0.0 if lower >= 0 else -np.inf
        hi = 0.0 if upper <= 0 else np.inf
        return s, np.clip(s, lo, hi)
    nn = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    mean = np.asarray(s, dtype=np.float64) / nn
    mean_c = np.clip(mean, lower, upper)
    if query == "mean":
        return mean, mean_c
    var = np.asarray(q, dtype=np.float64) / nn - mean_c * mean_c
    var_c = np.clip(var, 0.0, (upper - lower) ** 2 / 4.0)
    if query == "variance":
        return var, var_c
    floor = lower if mean_floor is None else mean_floor
    if not floor > 0:
        raise ParameterError("mean_floor", mean_floor, "a number > 0 for the cv (the mean must "
                             "be bounded away from 0)")
    cv = np.sqrt(var_c) / np.maximum(mean_c, floor)
    return cv, cv


# --------------------------------------------------------------------------- validation helpers
def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float, np.integer, np.floating)) \
        and math.isfinite(v)


def _check_t(t: Any) -> float:
    if not _is_number(t) or not 0 < t <= 1:
        raise ParameterError("t", t, "a number in (0, 1] (the sampling threshold and, in the "
                             "sound modes, the noise budget)")
    return float(t)


def _check_items(k: Any, target: Any) -> tuple[int, tuple[int, ...]]:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ParameterError("k", k, "an integer >= 1 (items per user)")
    k = check_cap("items", k, "k")
    if isinstance(target, (int, np.integer)) and not isinstance(target, bool):
        target = (target,)
    try:
        items = tuple(target)
    except TypeError:
        raise ParameterError("target", target, f"item numbers in 1..{k}") from None
    if not items:
        return k, tuple(range(1, k + 1))
    bad = [i for i in items if isinstance(i, bool) or not isinstance(i, (int, np.integer))
           or not 1 <= i <= k]
    if bad:
        raise ParameterError("target", target, f"distinct item numbers in 1..{k} (k = {k})")
    if len(set(items)) != len(items):
        raise ParameterError("target", target, "distinct item numbers")
    return k, tuple(sorted(int(i) for i in items))


def _check_common(self: Any) -> None:
    """Shared checks of OSPDPRR and OsdpRR: query, items, interval, clip, mean floor."""
    check_choice(self.query, "query", QUERIES)
    k, target = _check_items(self.k, self.target)
    object.__setattr__(self, "k", k)
    object.__setattr__(self, "target", target)
    check_interval(self.lower, self.upper)
    _check_magnitudes(self)
    if not isinstance(self.clip, (bool, np.bool_)):
        raise ParameterError("clip", self.clip, "True or False")
    if self.mean_floor is not None:
        if self.query != "cv":
            raise ParameterError("mean_floor", self.mean_floor,
                                 "None unless query='cv' (it bounds the cv's denominator)")
        if not _is_number(self.mean_floor) or self.mean_floor <= 0:
            raise ParameterError("mean_floor", self.mean_floor, "a number > 0")
    elif self.query == "cv" and self.lower <= 0:
        raise ParameterError(
            "lower", self.lower, "a number > 0 for query='cv'",
            "with lower <= 0 the mean of the data can be 0 and the coefficient of variation is "
            "unbounded; declare a public lower bound on the mean with mean_floor > 0, or use "
            "values bounded away from 0")


#: the largest number of values a release sums (the int64 counts' limit): a sum of values
#: bounded by Bmax = max(|lower|, |upper|) is at most MAX_TERMS Bmax, of squares MAX_TERMS Bmax^2
MAX_TERMS = float(1 << 63)
#: the smallest grid a sum may have: its square (in the noise variance) is still a normal float
MIN_GRID = 2.0 ** -511


def _check_magnitudes(self: Any) -> None:
    """The bounds' scaled computations must neither overflow (an inf release or a failure
    mid-run) nor underflow. Overflow: the sums of up to 2^63 values (S: Bmax each) and of their
    squares (Q: Bmax^2, for the queries that use Q and OsdpRR's sum, whose stderr does);
    OSPDPRR's noise variance is checked with the noise (:func:`_check_bounds`). Underflow: each
    sum's grid Bmax^power / 2^20 (:func:`statistic_lattice`; OsdpRR's sums live on the same
    scale) must be at least :data:`MIN_GRID` = 2^-511, so that it and its square (in the noise
    variance) are normal floats, else the release would publish 0 sums, a negative variance or a
    0 standard error: max(|lower|, |upper|) >= 2^-491 (about 1.6e-148) for the sum, 2^-245.5
    (about 1.2e-74) for the squares."""
    bmax = max(abs(float(self.lower)), abs(float(self.upper)))
    uses = self.sums_used
    unit = 1 << LATTICE_BITS
    for stat, power in (("S", 1), ("Q", 2)):
        if stat not in uses:
            continue
        what = "values" if power == 1 else "squared values"
        grid = bmax / unit if power == 1 else bmax * bmax / unit  # as statistic_lattice
        if not grid >= MIN_GRID:
            floor = 2.0 ** ((LATTICE_BITS - 511) / power)
            raise ParameterError(
                "lower, upper", (self.lower, self.upper),
                f"bounds with max(|lower|, |upper|) at least 2^{(LATTICE_BITS - 511) / power:g}"
                f" (about {floor:.3g}) for query={self.query!r}: the grid of its sum of {what}, "
                f"max(|lower|, |upper|)^{power} / 2^{LATTICE_BITS}, must be at least 2^-511 "
                "(its square, in the noise variance, must not underflow to 0)",
                "rescale the values (e.g. to other units) so the bounds are larger")
        limit = (sys.float_info.max / MAX_TERMS) ** (1.0 / power)
        if not bmax <= limit:
            raise ParameterError(
                "lower, upper", (self.lower, self.upper),
                f"bounds with max(|lower|, |upper|) at most {limit:.3g} for query="
                f"{self.query!r} (its sum of up to 2^63 {what} must stay finite; and lower and "
                "upper finite with upper - lower finite)", "narrow the bounds")


def _check_bounds(self: Any, share: float | None = None) -> None:
    """The contribution bounds (integers in [1, 10^6]); with ``share`` (the budget of one noisy
    statistic) also that the noise they need stays within the exact sampler's range."""
    for name in ("max_partitions_per_unit", "max_rows_per_partition"):
        object.__setattr__(self, name, check_contribution_bound(getattr(self, name), name))
    if share is None:
        return
    m = self.max_partitions_per_unit * self.max_rows_per_partition
    for stat, (grid, sens) in statistic_lattice(self.query, len(self.target), self.lower,
                                                self.upper, m).items():
        try:
            scale = discrete_laplace_scale(sens, share)
        except ParameterError:
            raise ParameterError(
                "max_rows_per_partition", self.max_rows_per_partition,
                f"bounds whose product L0 x Linf = {m} keeps the noise scale (L0 x Linf x "
                f"{sens // m} lattice units / {share:g}) below 2^56 units",
                "smaller contribution bounds, or a larger t") from None
        # the released noise's variance in data units (its stderr) must be finite
        with np.errstate(over="ignore"):
            var = grid * grid * float(discrete_laplace_variance(scale))
        if not math.isfinite(var):
            raise ParameterError(
                "lower, upper", (self.lower, self.upper),
                f"bounds whose noise for {STATISTIC_NAMES[stat]} (scale {float(scale):.4g} "
                f"units of {grid:.4g}) has a finite variance: a smaller max(|lower|, |upper|)",
                "narrow the bounds, or raise t")


#: the report field (``clip=True`` only) holding how many of the row's target values were
#: clipped into [lower, upper]; the estimators sum it into the curator-only count
#: ``Estimate.curator["values_clipped"]``
CLIPPED = "clipped"
CLIPPED_DTYPE = "uint32"
#: what a release with ``clip=True`` says about clipping (the exact count is not published)
CLIP_NOTE = ("values outside [{lo:g}, {hi:g}] were clipped to it (clip=True); their exact "
             "number is in the curator file, not published")


def _clip_note(self: Any) -> str:
    return "; " + CLIP_NOTE.format(lo=self.lower, hi=self.upper) if self.clip else ""


def _flag_values(self: Any, cols: dict, reasons: Reasons) -> None:
    """Missing target values are invalid; values outside [lower, upper] are clipped when
    ``clip`` was asked for and invalid otherwise. With ``clip``, ``cols["clipped"]`` counts
    each row's clipped target values (the report field :data:`CLIPPED`)."""
    clipped = np.zeros(reasons.n, dtype=CLIPPED_DTYPE) if self.clip else None
    for i in self.target:
        name = f"value{i}"
        v = cols[name]
        reasons.flag(np.isnan(v), f"{name}: missing value (a number is required)")
        with np.errstate(invalid="ignore"):
            out = (v < self.lower) | (v > self.upper)
        if self.clip:
            cols[name] = np.clip(v, self.lower, self.upper)
            clipped += out
        else:
            reasons.flag(out, lambda r, v=v, nm=name: (
                f"{nm}: {float(v[r])!r} is outside the declared interval [{self.lower!r}, "
                f"{self.upper!r}] (not clipped; set clip=True to clip)"))
    if clipped is not None:
        cols[CLIPPED] = clipped


def _clipped_column(self: Any, cols: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """The rows' clipped-value counts (as :func:`_flag_values` left them; zeros for columns
    built without :meth:`check`)."""
    c = cols.get(CLIPPED)
    return np.zeros(n, dtype=CLIPPED_DTYPE) if c is None else np.asarray(c, dtype=CLIPPED_DTYPE)


def _clipped_sum(mech: Any, reports: Mapping[str, Any]) -> int:
    """The clipped values of a batch of reports (their :data:`CLIPPED` field summed)."""
    if CLIPPED not in reports:
        raise ParameterError("reports", sorted(reports), f"{mech.name} reports with clip=True: "
                             f"the field {CLIPPED!r} (the row's clipped values, made by "
                             f"{type(mech).__name__}.perturb/randomize)")
    return int(np.asarray(reports[CLIPPED]).astype(np.int64).sum())


def _check_clipped(mech: Any, reports: Mapping[str, Any], reasons: Reasons) -> None:
    """Report field :data:`CLIPPED`: a whole number in [0, k_T]."""
    v, _ = coerce_numeric(reports[CLIPPED])
    kt = mech.k_target
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(v) | (v < 0) | (v > kt) | (v != np.floor(v))
    reasons.flag(bad, lambda r, v=v: f"report field {CLIPPED!r}: {float(v[r])!r} is not a "
                 f"whole number in [0, {kt}]")


def _flag_levels(self: Any, cols: dict, reasons: Reasons, items: Iterable[int]) -> None:
    for i in items:
        name = f"level{i}"
        v = cols[name]
        reasons.flag(np.isnan(v), f"{name}: missing sensitivity level (a number in [0, 1] is "
                     "required)")
        with np.errstate(invalid="ignore"):
            out = (v < 0) | (v > 1)
        reasons.flag(out, lambda r, v=v, nm=name: f"{nm}: sensitivity level {float(v[r])!r} is "
                     "outside [0, 1]")


class _UserQuery:
    """The derived parameters OSPDPRR and OsdpRR share."""

    @property
    def k_target(self) -> int:
        return len(self.target)

    @property
    def resolved_mean_floor(self) -> float | None:
        if self.query != "cv":
            return None
        return float(self.lower if self.mean_floor is None else self.mean_floor)


class _ByItem:
    """A class attribute computed from an instance's ``k``/``target`` (its roles or report
    fields); on the class itself it shows a template (for ``ldp-beam list``)."""

    def __init__(self, build: Callable[[Any], tuple], template: tuple) -> None:
        self.build, self.template = build, template

    def __get__(self, obj: Any, owner: type) -> tuple:
        return self.template if obj is None else self.build(obj)


# --------------------------------------------------------------------------- releases
def _estimate(mech: Any, statistics: dict[str, Statistic], curator: dict[str, Any]) -> Estimate:
    """One OSPDPRR or OsdpRR release as the library's :class:`~ldp_beam.core.Estimate` (the paper
    API's ``release``/``release_sums`` and, through them, the estimators' ``finalize``): the
    mechanism's name, guarantee and params; ``n_reports=None`` (a central release does not
    publish its number of users); ``statistics``, what may be published; ``curator``, what must
    not be (the sample, the sampling probabilities, the scores, the noise: for tests and
    diagnostics only, left out of ``to_dict()`` -- publishing any of it voids the guarantee)."""
    return Estimate(mech.name, None, statistics, mech.guarantee, mech.params(), curator)


def _curated(rel: Estimate, clipped: Any) -> Estimate:
    """``rel`` keeping, for the curator only, the number of values clipped (``clipped``; None
    without clipping). Its ``n_reports`` stays None: the exact number of users is itself
    sensitive and is not released, nor is the number of clipped values (``Estimate.curator``
    keeps only that count: a release's own curator bookkeeping is for tests and diagnostics)."""
    return replace(rel, curator={} if clipped is None else {"values_clipped": int(clipped)})


def _report_values(est: Any, reports: Mapping[str, Any], reasons: Reasons):
    """``(name, values)`` for each report field of estimator ``est`` present in ``reports``, as
    numbers (a non-numeric entry is NaN, for the caller to flag); the clipped-count field is
    checked here (:func:`_check_clipped`), not yielded."""
    for name, _ in est.fields:
        if name not in reports:
            continue
        if name == CLIPPED:
            _check_clipped(est.mechanism, reports, reasons)
            continue
        yield name, coerce_numeric(reports[name])[0]


class _ReleasedOnce:
    """The per-user central estimators: one release, by ``finalize``, from any accumulator, the
    empty one included (no per-statistic estimates). An empty input is released as noise
    alone: refusing it would publish a fixed error where one person's row gives a noisy
    answer, which no epsilon bounds."""

    def statistics(self, acc: np.ndarray) -> dict[str, Statistic]:
        raise NotImplementedError("a central release is made by finalize(), once")


__all__ = ["QUERIES", "QUERY_STATISTICS", "STATISTIC_NAMES", "RATIO_QUERIES", "LATTICE_BITS",
           "MAX_TERMS", "MIN_GRID", "CLIPPED", "CLIPPED_DTYPE", "CLIP_NOTE", "statistic_lattice",
           "query_answer"]
