"""Baselines of central-DP histogram publishing (spec: shared/specs/dphr.md, "Baselines").

* :class:`StructureFirst` — Xu, Zhang, Xiao, Yang, Yu, Winslett, "Differentially private
  histogram publication", VLDB Journal 22(6), 2013 (ICDE 2012 version: "NoiseFirst" and
  "StructureFirst"). A v-optimal k-group structure over contiguous buckets of the original order,
  its k - 1 boundaries chosen with the exponential mechanism, Laplace noise on the group sums.
* :class:`AHP` — Zhang, Chen, Xu, Meng, Xie, "Towards Accurate Histogram Publication under
  Differential Privacy", SDM 2014. Laplace-noised counts, thresholding of small noisy counts,
  sorting, greedy clustering of the sorted view, group means of the true counts plus Laplace.

All Laplace noise here is the exact discrete Laplace on integer counts and group sums
(:mod:`ldp_beam.noise`, docs/floating_point.md).

IHP (Li, Cui, Meng, Ma, "IHP: improving the utility in differential private histogram
publication", Distributed and Parallel Databases 37, 2019) is not implemented: only its abstract
("Iterative Histogram Partition": an exponential-mechanism partitioning with a budget split
between the grouping and the noise phases, chosen from a theoretical analysis) could be found,
which does not pin the algorithm down.

Every algorithm here is a frozen :class:`~.histogram.HistogramRelease` (``release_counts(counts,
rng)`` makes one release, ``guarantee`` says what it costs), calibrated to m = L0 * Linf rows per
privacy unit as :mod:`.histogram` describes: StructureFirst's boundary score sensitivity is
m (2F + 1) and its group sums get discrete Laplace noise of sensitivity m; AHP's view and group
sums get noise of sensitivity m, and its threshold and clustering error use the per-record
budgets eps1/m and eps2/m (they read only the view: post-processing). m = 1 is the per-record
release, bit for bit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np

from ..errors import ParameterError
from ..limits import check_cap, product
from ..privacy import CENTRAL, NONE, PrivacyGuarantee
from ..rng import RngLike
from .histogram import (HistogramRelease, TwoPartBudget, _groups_from_starts, _prefix_sums,
                        as_generator, check_counts, group_means_with_noise, laplace_counts)

#: Entries of one block of the (prefix position x bucket) cost matrix of the v-optimal programme.
_BLOCK_ENTRIES = 1 << 22


# --------------------------------------------------------------------------- shared pieces
def exponential_mechanism_probabilities(scores: np.ndarray, epsilon: float,
                                        sensitivity: float) -> np.ndarray:
    """McSherry-Talwar: P(r) proportional to exp(epsilon * score(r) / (2 * sensitivity))."""
    s = np.asarray(scores, dtype=float)
    w = np.exp(epsilon * (s - s.max()) / (2.0 * sensitivity))
    return w / w.sum()


def exponential_mechanism(scores: np.ndarray, epsilon: float, sensitivity: float,
                          gen: np.random.Generator) -> int:
    """One epsilon-DP choice among ``len(scores)`` candidates (score sensitivity
    ``sensitivity``), by inverting the CDF with one uniform draw. Returns the index."""
    cdf = np.cumsum(exponential_mechanism_probabilities(scores, epsilon, sensitivity))
    u = gen.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), cdf.size - 1))


def _sse(s1: np.ndarray, s2: np.ndarray, lo: Any, hi: Any) -> Any:
    """SSE of the buckets lo..hi-1 (prefix positions lo < hi; vectorized, broadcasting)."""
    size = hi - lo
    tot = s1[hi] - s1[lo]
    return np.maximum((s2[hi] - s2[lo]) - tot * tot / size, 0.0)


def _first_true(pred: Callable[[int, int], np.ndarray], start: int, stop: int,
                window: int = 64) -> int:
    """The first index t in [start, stop) with pred(lo, hi)[t - lo] true (pred evaluates a
    window lo..hi-1 at once); ``stop`` when there is none. Windows grow geometrically, so a
    search that ends after m indices costs O(m) vector work."""
    lo = start
    while lo < stop:
        hi = min(stop, lo + window)
        hit = np.flatnonzero(pred(lo, hi))
        if hit.size:
            return lo + int(hit[0])
        lo, window = hi, window * 4
    return stop


def _check_int(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ParameterError(name, value, f"an integer >= {low}")
    return int(value)


# --------------------------------------------------------------------------- StructureFirst
def check_v_optimal_size(k: int, n: int) -> None:
    """StructureFirst's v-optimal table (k rows for k - 1 boundaries, n + 1 columns) within the
    cells cap, before it is allocated."""
    check_cap("cells", product(k, n + 1), f"k x bins (StructureFirst's v-optimal table, "
              f"k = {k:,} groups x {n + 1:,})")


def v_optimal_table(values: np.ndarray, max_groups: int) -> np.ndarray:
    """The v-optimal dynamic programme over contiguous groups of ``values`` (in the given order):
    ``T[j, i]`` = the least total SSE of the first ``i`` values cut into exactly ``j`` non-empty
    contiguous groups (``inf`` where i < j; row 0 is T[0, 0] = 0, else inf), j = 0..max_groups.

    T[j, i] = min_{j-1 <= l < i} T[j-1, l] + SSE(l..i-1), with prefix sums for each SSE. The
    cost matrix SSE(l, i) is built once per block of i and reused by every layer j, so the work
    is O(max_groups * n^2) additions in numpy and O(n^2) SSE evaluations."""
    v = np.asarray(values, dtype=float)
    n = v.size
    s1, s2 = _prefix_sums(v)
    T = np.full((max_groups + 1, n + 1), np.inf)
    T[0, 0] = 0.0
    block = max(1, _BLOCK_ENTRIES // (n + 1))
    for i0 in range(1, n + 1, block):
        i1 = min(n + 1, i0 + block)
        ii = np.arange(i0, i1)
        ll = np.arange(i1)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            cost = _sse(s1, s2, ll, ii[None, :])
        cost[ll >= ii[None, :]] = np.inf  # group l..i-1 must be non-empty
        buf = np.empty_like(cost)
        for j in range(1, min(max_groups, i1 - 1) + 1):
            lo = j - 1  # T[j-1, l] is inf for l < j - 1: skip those rows
            np.add(cost[lo:], T[j - 1, lo:i1, None], out=buf[lo:])
            T[j, i0:i1] = buf[lo:].min(axis=0)
    return T


@dataclass(frozen=True)
class StructureFirst(TwoPartBudget, HistogramRelease):
    """StructureFirst (Xu et al., VLDB J 2013, Algorithm "StructureFirst" with the mean as the
    group representative).

    1. On the counts (clipped to ``F`` when ``F`` is given), build the v-optimal table
       T[j, i] (least SSE of the first i buckets in j contiguous groups, original bucket order).
    2. Choose the k - 1 boundaries from right to left: with q_k = n, for j = k-1, ..., 1 pick
       q_j in [j, q_{j+1} - 1] (the first j groups cover buckets 1..q_j) with the exponential
       mechanism, score -(T[j, q] + SSE(q+1..q_{j+1})), per-choice budget eps1/(k-1) and score
       sensitivity 2F + 1 (one record moves one clipped count in [0, F] by 1, which moves any
       SSE, and so any minimum of sums of SSEs, by at most 2F + 1).
    3. Publish every bucket as its group's (sum + Lap(1/eps2)) / |G| (sensitivity 1 for the
       disjoint group sums).

    Per privacy unit (bounds L0, Linf; m = L0 * Linf): a unit's m rows move the clipped counts by
    at most m in L1, so any SSE score by at most m (2F + 1) (chaining one-row changes), and the
    group sums by m in L1: score sensitivity m (2F + 1) and group-sum noise m/eps2.

    ``k`` (the number of groups) is required: the paper leaves it to the user. When the
    structure is forced (k = 1, or k = n at publish time) no choice is made and the whole budget
    goes to step 3, as in the authors' code.

    ``F`` is a public upper bound on any count. With ``F`` given the guarantee is
    (eps1 + eps2)-DP unconditionally: the structure step reads min(count, F). With ``F = None``
    the maximum count of the data is used, as the paper's experiments did; the score's
    sensitivity is then itself data-dependent, so the release carries no established guarantee
    (kind ``none``, the paper's claim beside it) — for replication only.

    Budget split: eps1 = eps2 = epsilon / 2 by default. The authors' code chooses eps1 by
    numerically minimizing an error bound of theirs (``DP::getOptEps1``) whose expression we
    could not verify against the paper (for large F it drives eps1 to its smallest grid value);
    an even split is the neutral choice. Pass ``epsilon1``/``epsilon2`` to choose another.
    """

    NAME: ClassVar[str] = "structure-first"
    BUCKET_CAP: ClassVar[str] = "grouping_buckets"  # the v-optimal programme is O(k n^2)

    k: int | None = None
    epsilon1: float | None = None
    epsilon2: float | None = None
    F: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k is None:
            raise ParameterError("k", None, "an integer >= 1 (the number of groups; "
                                 "StructureFirst needs it)")
        _check_int(self.k, "k", 1)
        if 1 < self.k < self.n_buckets:  # the v-optimal table: k x (buckets + 1) cells (k = 1
            check_v_optimal_size(int(self.k), self.n_buckets)  # or k = n: no choice, no table)
        self.budget  # validates the split
        if self.F is not None and (isinstance(self.F, bool)
                                   or not isinstance(self.F, (int, float, np.integer,
                                                              np.floating))
                                   or not math.isfinite(self.F) or self.F <= 0):
            raise ParameterError("F", self.F, "None or a finite public bound > 0 on any count")

    def no_guarantee_reason(self) -> tuple[tuple[str, ...], str]:
        """Why this configuration has no guarantee (for the registry's opt-in check)."""
        return (("F",), "F=None takes the boundary score's sensitivity from the data's maximum "
                "count, which is not public; give a public bound F > 0 on any count for an "
                "(eps1 + eps2)-DP release")

    @property
    def guarantee(self) -> PrivacyGuarantee:
        e1, e2 = self.budget
        m = self.unit_sensitivity
        params = {"epsilon1": e1, "epsilon2": e2, "k": self.k, "F": self.F}
        if self.F is None:
            return self.unit_guarantee(
                NONE, float("inf"), claim=f"(eps1 + eps2) = {self.epsilon:g}-DP (Xu et al. 2013)",
                notes="F (the SSE score's sensitivity is 2F + 1) was taken from the data's "
                      "maximum count, which is not public: the exponential-mechanism choices "
                      "of the boundaries are not differentially private as run. Pass a public "
                      "bound F (e.g. the number of records, if that is public) for an "
                      "(eps1 + eps2)-DP release. Replication only.",
                params=params)
        if m == 1:
            sens = f"score sensitivity 2F + 1 = {2 * self.F + 1:g}"
            sums, who = "Laplace(1/eps2) group sums (disjoint groups, sensitivity 1)", \
                "add/remove-one-record neighbours"
        else:
            sens = (f"score sensitivity (L0 x Linf)(2F + 1) = {m} x {2 * self.F + 1:g} = "
                    f"{m * (2 * self.F + 1):g}")
            sums = (f"Laplace({m}/eps2) group sums (disjoint groups, L1 sensitivity L0 x Linf = "
                    f"{m})")
            who = "neighbours differ by all rows of one unit"
        return self.unit_guarantee(
            CENTRAL, self.epsilon,
            notes=f"eps1 = {e1:g} on k - 1 = {self.k - 1} exponential-mechanism boundary choices "
                  f"(eps1 / (k - 1) each, {sens} on counts "
                  f"clipped to F for the structure) + eps2 = {e2:g} on {sums}; "
                  "sequential composition; all of "
                  "epsilon goes to the group sums when the structure is forced (k = 1 or k = n); "
                  f"{who}. The group sums' noise is the exact discrete "
                  "Laplace; the boundary choices are a floating-point exponential mechanism "
                  "(scores and the inverse-CDF draw in double precision): its output is an index, "
                  "not a noisy value, and its residual deviation from the exact mechanism is "
                  "discussed, not bounded by this epsilon, in docs/floating_point.md",
            params=params)

    def _publish(self, counts: Any, rng: RngLike = None) -> dict[str, Any]:
        h = check_counts(counts, cap=self.BUCKET_CAP)
        n = h.size
        k = int(self.k)
        if k > n:
            raise ParameterError("k", k, f"an integer in [1, n] = [1, {n}] (the number of "
                                 "buckets)")
        if 1 < k < n:
            check_v_optimal_size(k, n)
        gen = as_generator(rng)
        e1, e2 = self.budget
        m = self.unit_sensitivity
        F = float(h.max()) if self.F is None else float(self.F)
        if k == 1 or k == n:  # forced structure: nothing to choose
            starts = np.arange(k, dtype=np.int64) if k == n else np.zeros(1, dtype=np.int64)
            e1, e2 = 0.0, self.epsilon
        else:
            starts = self._choose_starts(np.minimum(h, F).astype(float), k, e1, F, gen, m)
        groups = _groups_from_starts(starts, n)
        hist, var = group_means_with_noise(h, groups, e2, gen, m)
        return {"histogram": hist, "groups": groups, "noise_var": var, "starts": starts,
                "epsilon_spent": (e1, e2)}

    @staticmethod
    def _choose_starts(values: np.ndarray, k: int, e1: float, F: float,
                       gen: np.random.Generator, unit_rows: int = 1) -> np.ndarray:
        """Step 2: the k - 1 boundaries, right to left, by the exponential mechanism (score
        sensitivity ``unit_rows`` (2F + 1): one row moves a score by at most 2F + 1). Returns
        the 0-based first bucket of every group."""
        n = values.size
        T = v_optimal_table(values, k - 1)
        s1, s2 = _prefix_sums(values)
        eps_choice = e1 / (k - 1)
        sensitivity = (2.0 * F + 1.0) * unit_rows
        bounds = np.empty(k + 1, dtype=np.int64)  # bounds[j] = q_j (buckets in the first j)
        bounds[0], bounds[k] = 0, n
        for j in range(k - 1, 0, -1):
            right = int(bounds[j + 1])
            q = np.arange(j, right)
            err = T[j, q] + _sse(s1, s2, q, right)
            bounds[j] = q[exponential_mechanism(-err, eps_choice, sensitivity, gen)]
        return bounds[:-1]


# --------------------------------------------------------------------------- AHP
def ahp_threshold(view: np.ndarray, eta: float, eps1: float) -> np.ndarray:
    """AHP's thresholding: noisy counts <= eta * ln(n) / eps1 become 0 (n buckets)."""
    cutoff = eta * math.log(view.size) / eps1 if view.size > 1 else 0.0
    return np.where(view <= cutoff, 0.0, view)


def ahp_err_star(x: np.ndarray, eps2: float) -> np.ndarray:
    """err*(j) of AHP's greedy clustering, for every position j of the sorted view ``x``: the
    least estimated error of x_j when it opens a new cluster j..l,
    min_l (x_j - mean(x_j..x_l))^2 + 2 / ((l - j + 1)^2 eps2^2), scanning l = j, j+1, ... and
    stopping (the paper's early termination) at the first l whose increase of the first term is
    at least the largest decrease the second term could still make,
    2 / ((l - j)^2 eps2^2) - 2 / ((n - j)^2 eps2^2) (n - j: the longest cluster from j)."""
    x = np.asarray(x, dtype=float)
    n = x.size
    s1, _ = _prefix_sums(x)
    c = 2.0 / (eps2 * eps2)
    out = np.empty(n)
    lens = np.arange(1, n + 1, dtype=float)
    for j in range(n):
        floor = c / float(n - j) ** 2

        def terms(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
            ln = lens[lo - j:hi - j]
            mean = (s1[lo + 1:hi + 1] - s1[j]) / ln
            return (x[j] - mean) ** 2, c / (ln * ln)

        def stops(lo: int, hi: int) -> np.ndarray:  # stop *before* l, for l in lo..hi-1
            e1, e2 = terms(lo - 1, hi)
            return np.diff(e1) >= e2[:-1] - floor

        end = _first_true(stops, j + 1, n)  # clusters j..l for l < end are scanned
        e1, e2 = terms(j, end)
        out[j] = float((e1 + e2).min())
    return out


def ahp_greedy_cluster(x: np.ndarray, eps2: float) -> np.ndarray:
    """AHP's greedy clustering of the sorted view ``x``: scan j = 1..n-1 with a current cluster
    i..j-1; close it before j (j opens a new cluster) when
    err(i..j) >= err(i..j-1) + err*(j), where err(G) = SSE(G) + 2 / (|G| eps2^2) (the
    approximation error plus the Laplace error of the group mean). Returns the group id of every
    position (contiguous, 0..m-1). One vectorized search per cluster."""
    x = np.asarray(x, dtype=float)
    n = x.size
    s1, s2 = _prefix_sums(x)
    c = 2.0 / (eps2 * eps2)
    star = ahp_err_star(x, eps2)
    starts = [0]
    i = 0
    while True:
        def closes(lo: int, hi: int, i: int = i) -> np.ndarray:
            j = np.arange(lo, hi)
            now = _sse(s1, s2, i, j + 1) + c / (j + 1 - i)
            last = _sse(s1, s2, i, j) + c / (j - i)
            return now >= last + star[lo:hi]

        j = _first_true(closes, i + 1, n)
        if j >= n:
            break
        starts.append(j)
        i = j
    return _groups_from_starts(np.asarray(starts), n)


@dataclass(frozen=True)
class AHP(TwoPartBudget, HistogramRelease):
    """AHP (Zhang et al., SDM 2014).

    1. view = counts + Lap(1/eps1) per bucket;
    2. thresholding: view entries <= eta * ln(n) / eps1 become 0 (:func:`ahp_threshold`);
    3. sort the thresholded view (ascending, stable: ties keep bucket order);
    4. greedy clustering of the sorted view (:func:`ahp_greedy_cluster`, with eps2 in the
       Laplace-error term);
    5. publish each bucket as its group's mean of the *true* counts + Lap(1/(eps2 |G|)).

    Steps 2-4 read only the view, so the grouping is post-processing of an eps1-DP release; the
    group means then cost eps2 (disjoint groups, sensitivity 1/|G|): (eps1 + eps2)-DP.

    Parameters where the paper is not explicit follow DPBench's transcription of the authors'
    implementation (Hay et al. 2016, ``dpcomp_core/algorithm/AHP.py``): the threshold
    eta * ln(n) / eps1 and the defaults eps1 = 0.85 epsilon, eta = 0.35 (the authors' setting
    for epsilon = 0.1; their code used (0.5, 0.4) at epsilon = 1 and (0.65, 0.9) at
    epsilon = 0.01 — pass ``epsilon1``/``eta`` to reproduce those). The early termination of
    err* uses the longest possible cluster n - j (DPBench has n - j + 1, an off-by-one).
    """

    NAME: ClassVar[str] = "ahp"
    BUCKET_CAP: ClassVar[str] = "grouping_buckets"  # err* scans up to O(n^2) cluster ends
    DEFAULT_FRACTION: ClassVar[float] = 0.85

    epsilon1: float | None = None
    epsilon2: float | None = None
    eta: float = 0.35

    def __post_init__(self) -> None:
        super().__post_init__()
        self.budget  # validates the split
        if isinstance(self.eta, bool) or not isinstance(self.eta, (int, float, np.integer,
                                                                   np.floating)) \
                or not math.isfinite(self.eta) or self.eta < 0:
            raise ParameterError("eta", self.eta, "a finite number >= 0 (threshold factor)")

    @property
    def guarantee(self) -> PrivacyGuarantee:
        e1, e2 = self.budget
        m = self.unit_sensitivity
        view = "Laplace(1/eps1)" if m == 1 else f"Laplace({m}/eps1)"
        who = ("add/remove-one-record neighbours" if m == 1 else
               f"neighbours differ by all rows of one unit (L1 change <= L0 x Linf = {m}: noise "
               f"of sensitivity {m} on the view and on the group sums)")
        return self.unit_guarantee(
            CENTRAL, self.epsilon,
            notes=f"eps1 = {e1:g} on a {view} view of the counts (thresholding, "
                  f"sorting and greedy clustering are its post-processing) + eps2 = {e2:g} on "
                  "the group means of the true counts (disjoint groups, sensitivity 1/|G|); "
                  f"{who}; all noise is exact discrete Laplace on "
                  "integer counts and group sums (docs/floating_point.md)",
            params={"epsilon1": e1, "epsilon2": e2, "eta": self.eta})

    def _publish(self, counts: Any, rng: RngLike = None) -> dict[str, Any]:
        h = check_counts(counts, cap=self.BUCKET_CAP)
        gen = as_generator(rng)
        e1, e2 = self.budget
        m = self.unit_sensitivity
        view = laplace_counts(h, e1, gen, m).astype(float)
        groups = self.group_view(view)
        hist, var = group_means_with_noise(h, groups, e2, gen, m)
        return {"histogram": hist, "groups": groups, "noise_var": var, "view": view}

    def group_view(self, view: np.ndarray) -> np.ndarray:
        """Steps 2-4: the grouping (group id per bucket, original order) from the noisy view
        alone (the threshold and the error terms use eps1/m and eps2/m, m = L0 * Linf)."""
        e1, e2 = self.budget
        m = self.unit_sensitivity
        thr = ahp_threshold(np.asarray(view, dtype=float), self.eta, e1 / m)
        order = np.argsort(thr, kind="stable")
        groups = np.empty(thr.size, dtype=np.int64)
        groups[order] = ahp_greedy_cluster(thr[order], e2 / m)
        return groups
