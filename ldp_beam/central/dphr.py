"""DPHR: differentially private histogram publishing by approximate sorting and optimal grouping
(paper: shared/papers/dphr_histogram_publishing.txt; spec: shared/specs/dphr.md).

Two variants:

* ``variant="paper"`` — Algorithms 1-3 as published: an approximate sort of the *true* counts by
  n - 1 exponential-mechanism picks (each with eps1), the Optimized_Cluster dynamic programme on
  the sorted *true* counts with Theorem 3's error, and Laplace(1/(eps2 |G|)) on each group mean.
  Its claim of (eps1 + eps2)-DP (Theorem 5) is **not established**: the n - 1 picks compose
  sequentially (the paper charges eps1 once), and the candidate threshold and the whole grouping
  are computed from exact counts and released without any budget. Its guarantee is reported as
  kind ``none``, with the claim beside it. For reproducing the paper's numbers only.
* ``variant="sound"`` (default) — spend eps1 on a private view of the counts (Laplace(1/eps1) per
  bucket, as exact discrete Laplace on the integer counts: :mod:`ldp_beam.noise`), sort the view and group it with the same dynamic programme (post-processing of the
  view), then publish group means of the *true* counts with Laplace(1/(eps2 |G|)). The grouping
  depends on the data only through the view, so the release is (eps1 + eps2)-DP. (Subtracting the
  view's noise, (|G| - 1) 2/eps1^2, from each group's SSE would be unbiased for a grouping chosen
  independently of the noise; the sort is not, adjacent sorted views are close by construction,
  and on the DPBench histograms the correction made groups larger and range queries worse, so
  the programme runs on the view as it is.)

What soundness costs: grouping a noisy view puts buckets of different true counts together, and
the group means then err in the same direction over whole regions (zeros in a sparse tail all get
a positive mean), so range-query errors grow with the square of the length. ``ldp-beam reproduce
dphr`` measures it against the published variant and the baselines.

Privacy unit (issue 14; m = L0 * Linf, as :mod:`.histogram` describes): the sound variant adds
discrete Laplace noise of sensitivity m to the view (scale m/eps1) and to the group sums (scale
m/eps2), and plans its grouping with the per-record budget eps2/m in Theorem 3's noise term (the
noise the group means actually get; post-processing of the view): (eps1 + eps2)-DP per unit. The
paper variant runs at eps1/m and eps2/m (no established guarantee either way).

The dynamic programme T(i) = min_j T(j) + err(j+1..i) over contiguous runs of the sorted order
uses prefix sums (each err is O(1)) and one vectorized row per i: O(n^2) time, O(n) memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..core import check_choice
from ..privacy import CENTRAL, NONE, PrivacyGuarantee
from ..rng import RngLike
from .histogram import (HistogramRelease, TwoPartBudget, _groups_from_starts, _prefix_sums,
                        as_generator, check_counts, group_means_with_noise, laplace_counts)


# --------------------------------------------------------------------------- grouping
def group_error_table(values: np.ndarray, eps2: float):
    """A function err(l, r) (vectorized over l, 0-based, inclusive) of Theorem 3:
    SSE(l..r) + 2 / (|G| eps2^2)."""
    s1, s2 = _prefix_sums(values)

    def err(l: np.ndarray, r: int) -> np.ndarray:
        size = (r + 1 - l).astype(float)
        tot = s1[r + 1] - s1[l]
        sse = (s2[r + 1] - s2[l]) - tot * tot / size
        return sse + 2.0 / (size * eps2 * eps2)
    return err


def optimal_grouping(values: np.ndarray, eps2: float) -> tuple[np.ndarray, float]:
    """Optimized_Cluster (Algorithm 3): the contiguous grouping of ``values`` (in the given order)
    minimizing the sum of Theorem 3's group errors, over any number of groups.

    Returns (group id per position, 0..k-1 in order; the minimal total error)."""
    v = np.asarray(values, dtype=float)
    n = v.size
    err = group_error_table(v, eps2)
    best = np.empty(n + 1)
    best[0] = 0.0
    arg = np.zeros(n + 1, dtype=np.int64)
    for i in range(1, n + 1):  # prefix v[0:i]; the last group is v[j:i]
        j = np.arange(i)
        cand = best[:i] + err(j, i - 1)
        k = int(np.argmin(cand))
        best[i], arg[i] = cand[k], k
    cuts = []
    i = n
    while i > 0:
        cuts.append(arg[i])
        i = arg[i]
    return _groups_from_starts(np.array(sorted(cuts), dtype=np.int64), n), float(best[n])


def brute_force_grouping(values: np.ndarray, eps2: float) -> tuple[np.ndarray, float]:
    """Every contiguous grouping (2^(n-1) of them): for testing the dynamic programme."""
    v = np.asarray(values, dtype=float)
    n = v.size
    err = group_error_table(v, eps2)
    best, best_cuts = np.inf, None
    for mask in range(1 << (n - 1)):
        starts = [0] + [i + 1 for i in range(n - 1) if mask >> i & 1]
        ends = starts[1:] + [n]
        tot = sum(float(err(np.array([a]), b - 1)[0]) for a, b in zip(starts, ends))
        if tot < best - 1e-12:
            best, best_cuts = tot, starts
    return _groups_from_starts(best_cuts, n), best


# --------------------------------------------------------------------------- the sort
def approximate_sort(counts: np.ndarray, eps_pick: float, gen: np.random.Generator
                     ) -> np.ndarray:
    """Approximate_Sort (Algorithm 2) as published: start from bucket 0; repeatedly take the
    remaining buckets within the discrete length delta of the base (Definition 6: the mean over
    all buckets of |B_v - B_base|; all remaining ones when none is within it), score
    u(j) = |B_j - B_base| + |j - base|, and pick one with the exponential mechanism favouring
    small u: P ∝ exp(-eps_pick u / 2) (sensitivity 1). Returns the order (bucket indices).

    Each pick reads the exact counts; see the module notes on what that costs in privacy."""
    b = np.asarray(counts, dtype=float)
    n = b.size
    remaining = np.ones(n, dtype=bool)
    order = np.empty(n, dtype=np.int64)
    base = 0
    order[0] = 0
    remaining[0] = False
    for step in range(1, n):
        dist = np.abs(b - b[base])
        delta = dist.mean()
        cand = remaining & (dist <= delta)
        if not cand.any():
            cand = remaining
        c = np.flatnonzero(cand)
        u = dist[c] + np.abs(c - base)
        # exponential mechanism by the Gumbel-max trick (one draw per candidate)
        score = -eps_pick * u / 2.0 + gen.gumbel(size=c.size)
        base = int(c[np.argmax(score)])
        order[step] = base
        remaining[base] = False
    return order


# --------------------------------------------------------------------------- the release
@dataclass(frozen=True)
class DPHR(TwoPartBudget, HistogramRelease):
    """DPHR (Algorithms 1-3), ``sound`` (default: (eps1 + eps2)-DP) or ``paper`` (as published;
    no established guarantee). Budget: epsilon = epsilon1 + epsilon2 (each epsilon/2 by
    default, as in the paper)."""

    NAME: ClassVar[str] = "dphr"
    BUCKET_CAP: ClassVar[str] = "grouping_buckets"  # the grouping (and the sort) are O(n^2)

    variant: str = "sound"
    epsilon1: float | None = None
    epsilon2: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.variant, "variant", ("sound", "paper"))
        self.budget  # validates the split

    def no_guarantee_reason(self) -> tuple[tuple[str, ...], str]:
        """Why this configuration has no guarantee (for the registry's opt-in check)."""
        return (("variant",), "variant='paper' is Algorithms 1-3 as published, whose (eps1 + "
                "eps2)-DP claim is not established (the sort and the grouping read the exact "
                "counts without budget); variant='sound' (the default) is DP")

    @property
    def guarantee(self) -> PrivacyGuarantee:
        e1, e2 = self.budget
        m = self.unit_sensitivity
        if self.variant == "paper":
            return self.unit_guarantee(
                NONE, float("inf"), claim=f"(eps1 + eps2) = {self.epsilon:g}-DP (Theorem 5)",
                notes="claimed by the paper, not established: the approximate sort makes n - 1 "
                      "exponential-mechanism picks on the same counts, each with eps1 (the paper "
                      "charges eps1 once); the candidate threshold and the Optimized_Cluster "
                      "grouping read the exact counts and the grouping is released without "
                      "budget. Replication only.",
                params={"epsilon1": e1, "epsilon2": e2, "variant": "paper"})
        who = ("add/remove-one-record neighbours" if m == 1 else
               f"neighbours differ by all rows of one unit (L1 change <= L0 x Linf = {m}: noise "
               f"of sensitivity {m} on the view and on the group sums)")
        return self.unit_guarantee(
            CENTRAL, self.epsilon,
            notes=f"eps1 = {e1:g} on a Laplace view of the counts (sort and grouping are its "
                  f"post-processing) + eps2 = {e2:g} on the group means of the true counts "
                  f"(disjoint groups, sensitivity 1/|G|); {who}; all "
                  "noise is exact discrete Laplace on integer counts and group sums "
                  "(docs/floating_point.md)",
            params={"epsilon1": e1, "epsilon2": e2, "variant": "sound"})

    def _publish(self, counts: Any, rng: RngLike = None) -> dict[str, Any]:
        h = check_counts(counts, cap=self.BUCKET_CAP)
        gen = as_generator(rng)
        e1, e2 = self.budget
        m = self.unit_sensitivity  # 1 per record; L0 * Linf per bounded unit
        if self.variant == "paper":
            order = approximate_sort(h, e1 / m, gen)
            sorted_groups, total = optimal_grouping(h[order].astype(float), e2 / m)
            view = None
        else:
            view = laplace_counts(h, e1, gen, m).astype(float)
            order = np.argsort(view, kind="stable")
            sorted_groups, total = optimal_grouping(view[order], e2 / m)
        groups = np.empty(h.size, dtype=np.int64)
        groups[order] = sorted_groups
        hist, var = group_means_with_noise(h, groups, e2, gen, m)
        out = {"histogram": hist, "groups": groups, "order": order, "noise_var": var,
               "planned_error": total}
        if view is not None:
            out["view"] = view
        return out
