"""OSPDPRR: one-sided personalized DP queries driven by user sensitivity weights. Its
baseline OsdpRR (OSDP randomized response, ``osdp-rr``) is in :mod:`ldp_beam.central.osdprr`. The
query machinery both share (queries, checks, clipping) is in :mod:`ldp_beam.central.unit_release`.

Paper: Liu, Wang, Dong, Wang, JEIT 47(8):2768-2779, 2025 (``shared/papers/
ospdprr_one_sided_personalized_dp.txt``: abstract and the Algorithm 1 box only). Spec:
``shared/specs/ospdprr.md``, which reconstructs every stage; its source tags are repeated here:
[P] paper, [OSDP] Kotsogiannis et al. 2020, [PDP] Jorgensen et al. 2015 (``Sample``),
[TOPSIS] Hwang & Yoon, [I] our interpretation.

The curator sees every user's ``k`` items. A user's row holds the values of the *target* items
``T`` (the query's input) and, for every item, a sensitivity level and an importance. Three
stages, all in :meth:`OSPDPRR.release` on arrays of every user (the estimator's finalize in the
data-reference modes; in sound-self, stage 2's draw is made per row by :meth:`OSPDPRR.prepare`
and stage 3 by :meth:`OSPDPRR.release_sums`, see below):

1. **Sensitivity weights and the comprehensive weight** (spec §2). A pluggable *sensitivity
   specification function* ``S(importance, level) -> weight`` (default: importance relative to the
   user's most important item, times the level; §2.1), then TOPSIS (:func:`comprehensive_weight`):
   normalization (``vector`` or ``minmax``), ideal points (``data``: the column min/max, or
   ``fixed``: the 0/1 profiles), distances, ``M_u = W- / (W+ + W-)`` in [0, 1] (1 = least
   sensitive).
2. **Personalized sampling** (§3): Jorgensen's ``Sample`` on the personal budgets ``eps_u``
   (``M'_u = (M_u - B)/(A - B)`` with A/B over all users, or ``M_u`` itself in ``sound-self``):
   ``pi_u = (e^eps_u - 1)/(e^t - 1)`` if ``eps_u < t`` else 1 (:func:`sampling_probabilities`).
3. **One Laplace release** (§4, §6): the query on the sample plus ``Lap(Delta / eps)``; ``eps = t``
   in the sound modes, ``e^m`` (``m`` the smallest score among sampled users) in ``paper`` mode.
   The statistics are summed exactly on an integer lattice (:func:`statistic_lattice`) and the
   noise is the exact discrete Laplace (:mod:`ldp_beam.noise`, docs/floating_point.md), not
   floating-point Laplace draws.

Modes (spec §4.4) and what we claim (§5; docs/ospdprr_privacy.md):

* ``sound-self`` (default): fixed references on the raw weights, ``eps_u = M_u`` depends only on
  user u's own items, noise budget t. t-DP at user level (add/remove a user with all her items);
  per user ``ln(1 + pi_u (e^t - 1)) = min(M_u, t)``; (P, 2t)-OSDP for every policy P. It is the
  default because it needs no assumption about the weights.
* ``sound-public``: the paper's data references, normalization and A/B, noise budget t. The same
  statements *only if the whole weight matrix is public metadata* not derived from protected
  values; otherwise no guarantee. Allows the ratio estimator (``n / sum pi`` is then public).
* ``paper``: the literal rule ``eps = e^m``. No privacy claim (replication only): the noise scale
  depends on the sample, and the output density ratio of neighbouring datasets is unbounded.

Queries (§6), user-level add/remove L1 sensitivities with ``Bmax = max(|lower|, |upper|)`` and
``k_T = |T|``: count N (``k_T``), sum S (``k_T Bmax``), sum of squares Q (``k_T Bmax^2``);
``count`` = N, ``sum`` = S, ``mean`` = S/N (N and S at eps/2 each), ``variance`` = Q/N - mean^2
and ``cv`` = sqrt(variance)/mean (N, S, Q at eps/3 each). Estimators: ``raw`` (the query on the
sample, what the paper appears to do; biased for count/sum by ``sum pi / n``) and ``ratio``
(count/sum times ``n / sum pi``; only where ``pi`` is public, i.e. ``sound-public``, or in the
claim-free ``paper`` mode). Bounds whose sums would overflow are refused when the mechanism is
built: besides a finite ``upper - lower``, ``Bmax`` at most about 1.95e289 for the queries that
sum values and 4.4e144 for those that sum squares (the sums of up to 2^63 values must stay
finite), and OSPDPRR's noise variance finite.

**Clipping (``clip=True``).** Values outside [lower, upper] are clipped into it where the row is
checked, and each report carries the row's number of clipped target values (report field
``clipped``); the estimators sum it exactly (one more integer in the one-pass accumulators, one
more column in the rows) and put it in ``Estimate.curator["values_clipped"]``, never in the
release: the number is a statistic of the private data. The released query's note says that
values outside [lower, upper] were clipped and that their exact number is in the curator file,
not published.

**sound-self: one pass, memory that does not grow with users (issue 16).** M_u is a function
of user u's own row, so so is pi_u, and the row's sampling Bernoulli(pi_u) is drawn where the
row is read: the mechanism draws one uniform per row (``draws = 1``), and :meth:`OSPDPRR.prepare`
reports the row's target values and ``sampled = u < pi_u`` (not its weights). In a pipeline,
``Perturb`` addresses that uniform exactly as ``collect`` addresses LDP noise: by the run's
secret key (:class:`~ldp_beam.rng.RunKey`, fresh OS entropy; never a fixed default seed) and
the row's identity (its input stream and record offset, from ``ReadTable``'s ``KeyedBatch``),
so the sample is secret, a runner's retry reproduces it, and a seeded run (reproducible, and
saying it is not private) samples the same rows whatever the runner or batch size. The
estimator's accumulator is four int64 numbers ``[users, N, S, Q]`` (a fifth, the clipped values,
with ``clip=True``): the users seen (curator bookkeeping, never released) and the sample's
statistics summed exactly on the integer lattice (:func:`statistic_lattice`), so ``add`` and
``merge`` are integer additions (exact in any split and merge order; at most (2^63 - 1) / (k_T
2^20) users, checked), and ``finalize`` draws the one discrete Laplace noise
(:meth:`OSPDPRR.release_sums`). The release's distribution is that of :meth:`OSPDPRR.release`
(the same pi_u, the same noise, budget and statistics), which takes numpy arrays of every user
(the paper reproduction's path) and is O(users) in process.

Measured (``ldp-beam bench --only cli --only ospdprr``: ``ldp-beam estimate -m ospdprr`` from
raw rows, t = 0.8, sum, k = 1, DirectRunner, one process, peak RSS = the process's VmHWM, on the
shared 2-core machine): 299 MB / 4.9 s at 10^6 rows and 312 MB / 6.1 s at 10^7 (growth +4%,
load 2.3; a row accumulator took 375 MB and 1340 MB). What remains of the memory is Beam's and
the batches in flight, not users.

**sound-public, paper: O(users), bounded and never copied quadratically.** Only these modes
hold rows, every user's target values and k weights: the normalization, the ideal points and
A/B of stages 1-2 need all users, and the sample is drawn at release time. ``add`` and
``merge`` append rows into the spare capacity of the accumulator's buffer (grown by half when
full): O(n) copying for n rows. The rows held are capped by ``LDP_BEAM_MAX_USER_CELLS``
(:mod:`ldp_beam.limits`, ``user_cells``: users x row width, 1 GiB of rows by default), checked
before rows are stored (a :class:`~ldp_beam.errors.LimitError` names the variable).
``finalize`` sorts the rows into a canonical order first (the release does not depend on how
the rows were split or merged) and releases a chunk of users at a time
(:meth:`OSPDPRR._sample_in_chunks`). One row must be one user in every mode: the pipeline groups
a user's items into one row before estimating (the user-level sensitivities assume it).

*The plan for the data-reference modes (not implemented).* A bounded sample (a reservoir or
bottom-k) would change the release (every user is Poisson-sampled with her own pi_u, so the
sample's size is random and unbounded), and none is needed: the release uses only the sampled
users' N, S, Q, their sum of pi (the ratio estimator) and, in paper mode, their smallest score.
An exact plan in memory that does not grow with users reads the input three times, each pass
with the previous one's few numbers as a side input: (1) the weight columns' sums of squares,
minima and maxima (O(k) numbers: the ``ref="data"`` normalization, then the ideal points, the
normalized minima and maxima); (2) each user's M_u, combining A = max M, B = min M; (3) the
sound-self pass with pi_u from M'_u = (M_u - B)/(A - B), also summing pi and, in paper mode,
keeping the smallest sampled score. Until then the cap above bounds the memory.

**Privacy unit (issue 14; docs/person_level.md).** ``max_partitions_per_unit`` (L0) and
``max_rows_per_partition`` (Linf), both 1 by default (one row per user, as above), are the
contribution bounds the pipeline enforces before the release: a unit keeps at most L0 partitions
(keys of a per-key release) and at most Linf rows (users' rows, each with its k items) in each, so
at most m = L0 * Linf rows in all. OSPDPRR then multiplies every sensitivity by m (a unit's rows
move N, S and Q by at most m times one row's amount: noise m Delta / (t/j)); the release is t-DP
per unit, and a unit whose rows r are sampled with probabilities pi_r spends
sum_r ln(1 + pi_r (e^(t/m) - 1)) <= t (:func:`unit_personal_epsilon`; amplification by sampling
row by row). The simplest deployment keeps one row per unit (L0 = Linf = 1): the
per-user statements above then hold per unit.

**Budget.** Each ``finalize`` is one release. Releases on disjoint users (per key, where the key
partitions users; per window, where a user reports in one window only) compose in parallel, each
at its own budget; every further release that involves the same user (a trigger firing twice, a
user present in several keys or windows) adds its budget for her (sequential composition).
"""
from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping, Union

import numpy as np

from ..core import (CentralRelease, Estimate, Estimator, Reasons, Reports, Role, Statistic,
                    check_choice)
from ..errors import EmptyAccumulatorError, ParameterError
from ..limits import cap, check_cap
from ..noise import discrete_laplace_variance, lattice_laplace, to_units
from ..privacy import (CENTRAL, NONE, PrivacyGuarantee, UnitBounded, central_unit_params,
                       central_unit_text)
from ..rng import RngLike
from .histogram import UNKEYED, as_generator, release_source
# the query machinery OSPDPRR shares with OsdpRR (its public names importable from here too)
from .unit_release import (CLIPPED, CLIPPED_DTYPE, LATTICE_BITS, QUERIES, QUERY_STATISTICS,
                           RATIO_QUERIES, STATISTIC_NAMES, query_answer, statistic_lattice, _ByItem,
                           _check_bounds, _check_common, _check_t, _clip_note, _clipped_column,
                           _clipped_sum, _curated, _estimate, _flag_levels, _flag_values,
                           _ReleasedOnce, _report_values, _UserQuery)

MODES = ("paper", "sound-public", "sound-self")
NORMS = ("vector", "minmax")
REFS = ("data", "fixed")


# --------------------------------------------------------------------------- stage 1
def importance_times_level(importance: np.ndarray, level: np.ndarray) -> np.ndarray:
    """The default sensitivity specification function (spec §2.1 [I]): ``w = r * l`` where
    ``r = importance / max_j importance_j`` is the item's importance relative to the user's most
    important item (so that item has r = 1) and ``l`` the item's sensitivity level (0 = not
    sensitive). Arrays of shape (n, k); importances in (0, 1], levels in [0, 1]."""
    imp = np.asarray(importance, dtype=np.float64)
    lvl = np.asarray(level, dtype=np.float64)
    return imp / imp.max(axis=1, keepdims=True) * lvl


def level_only(importance: np.ndarray, level: np.ndarray) -> np.ndarray:
    """A sensitivity specification function that ignores importance: ``w = l``."""
    return np.array(level, dtype=np.float64)


#: named sensitivity specification functions (for the command line); a callable also works
SENSITIVITY_FUNCTIONS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "product": importance_times_level, "level": level_only}
#: the sensitivity functions that give w = level when every importance is 1 (no importance
#: column mapped): :meth:`OSPDPRR.validate` skips building the weight matrix for them
_PLAIN_WEIGHTS = (importance_times_level, level_only)


def normalize_weights(weights: np.ndarray, norm: str = "vector") -> np.ndarray:
    """The 'standard normalization' of the weight matrix (spec §2.2 [TOPSIS]/[I]), column by
    column: ``vector``: w / sqrt(sum_u w^2) (a column of zeros stays 0); ``minmax``:
    (w - min)/(max - min) (a constant column becomes 0)."""
    w = np.asarray(weights, dtype=np.float64)
    return _normalizer(w, norm)(w)


def _normalizer(w: np.ndarray, norm: str) -> Callable[[np.ndarray], np.ndarray]:
    """:func:`normalize_weights` with the column statistics of the float64 matrix ``w``, as a
    function of rows of ``w`` (the release's chunks)."""
    if norm == "vector":
        norms = np.sqrt(np.einsum("ij,ij->j", w, w))
        return lambda x: np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    if norm == "minmax":
        lo, hi = w.min(axis=0), w.max(axis=0)
        span = hi - lo
        return lambda x: np.divide(x - lo, span, out=np.zeros_like(x), where=span > 0)
    raise ParameterError("norm", norm, f"one of {NORMS}")


def comprehensive_weight(weights: np.ndarray, ref: str = "data", norm: str | None = "vector"
                         ) -> np.ndarray:
    """TOPSIS closeness of each user (spec §2.2-2.4): ``M_u = W-_u / (W+_u + W-_u)`` in [0, 1],
    where ``W+`` / ``W-`` are the Euclidean distances to the least / most sensitive profile
    (0.5 where both are 0). ``M = 1``: the least sensitive user; ``M = 0``: the most sensitive.

    ``ref="data"`` (the paper's): normalize the columns (``norm``), then ``w+ = column min`` and
    ``w- = column max`` of the normalized matrix -- every user's M depends on every other user.
    ``ref="fixed"``: the raw weights against ``w+ = (0..0)`` and ``w- = (1..1)`` with no
    normalization (``norm`` must be None): M_u depends on user u's weights only.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 2:
        raise ParameterError("weights", f"array of shape {w.shape}", "an (n users, k items) array")
    if ref == "data":
        wb = normalize_weights(w, "vector" if norm is None else norm)
        return _closeness(wb, wb.min(axis=0), wb.max(axis=0))
    if ref != "fixed":
        raise ParameterError("ref", ref, f"one of {REFS}")
    if norm is not None:
        raise ParameterError("norm", norm, "None with ref='fixed' (the fixed 0/1 references "
                             "apply to the raw weights; spec §2.3)")
    return _closeness(w, np.zeros(w.shape[1]), np.ones(w.shape[1]))


def _closeness(wb: np.ndarray, best: np.ndarray, worst: np.ndarray) -> np.ndarray:
    """``W- / (W+ + W-)`` of each row of ``wb`` (0.5 where both distances are 0)."""
    d_plus = np.sqrt(np.square(wb - best).sum(axis=1))
    d_minus = np.sqrt(np.square(wb - worst).sum(axis=1))
    den = d_plus + d_minus
    return np.divide(d_minus, den, out=np.full(wb.shape[0], 0.5), where=den > 0)


def _self_sampling_one_item(w: np.ndarray, t: float) -> np.ndarray:
    """sound-self with one item (k = 1): ``sampling_probabilities(comprehensive_weight(w[:, None],
    "fixed", None), t)`` on the 1-D weights, bit for bit, without the (n, 1) matrices and their
    row sums. The budget is M itself (sound-self: no rescale).

    For weights in [0, 1] (every valid row's), M is exactly ``1 - w`` as rounded: with the fixed
    references 0 and 1, W+ = sqrt(fl(w^2)) = w and W- = sqrt(fl(fl(w - 1)^2)) = fl(1 - w)
    (sqrt(fl(x^2)) = |x| in binary floating point without underflow; a w so small that w^2
    underflows has fl(1 - w) = 1 and W+ < 2^-53), and W+ + W- rounds to exactly 1: for w >= 1/2,
    w - 1 is exact (Sterbenz) and the sum is 1; below, fl(1 - w) is within 2^-54 of 1 - w, so
    the exact sum is within 2^-54 of 1 and rounds to 1 (a tie at 1 - 2^-54 goes to the even 1).
    So M = fl(1 - w) / 1, and M >= 0 makes the clamp at 0 the identity. Any other weight (NaN,
    outside [0, 1]) takes the general formula's operations."""
    if w.size and w.min() >= 0.0 and w.max() <= 1.0:  # False with a NaN
        m = 1.0 - w
        return np.where(m >= t, 1.0, np.expm1(m) / math.expm1(t))
    return sampling_probabilities(_closeness(w[:, None], np.zeros(1), np.ones(1)), t)


# --------------------------------------------------------------------------- stage 2
def personal_budgets(scores: np.ndarray, rescale: bool) -> np.ndarray:
    """The personal budgets ``eps_u`` of the sampling step (spec §3 [I]): with ``rescale`` (the
    paper's steps 6-7) ``M'_u = (M_u - B)/(A - B)`` with ``A = max M``, ``B = min M`` (all 1 if
    A = B); without, ``M_u`` itself (sound-self)."""
    m = np.asarray(scores, dtype=np.float64)
    if not rescale or m.size == 0:
        return m.copy()
    a, b = m.max(), m.min()
    if a == b:
        return np.ones_like(m)
    return (m - b) / (a - b)


def sampling_probabilities(budgets: np.ndarray, t: float) -> np.ndarray:
    """Jorgensen et al.'s ``Sample`` [PDP]: ``pi_u = (e^eps_u - 1)/(e^t - 1)`` if ``eps_u < t``,
    else 1. A user with budget 0 is never sampled."""
    eps = np.asarray(budgets, dtype=np.float64)
    return np.where(eps >= t, 1.0, np.expm1(np.maximum(eps, 0.0)) / math.expm1(t))


def personal_epsilon(pi: np.ndarray, t: float, unit_rows: int = 1) -> np.ndarray:
    """The privacy loss of a user sampled with probability ``pi`` before a t-DP release
    (amplification by sampling): ``ln(1 + pi (e^t - 1))``, which equals ``min(eps_u, t)`` for
    ``pi`` from :func:`sampling_probabilities`.

    ``unit_rows`` = m = L0 * Linf when the release is calibrated to units of at most m rows: one
    row then moves the release's distribution by at most e^(t/m) and costs
    ``ln(1 + pi (e^(t/m) - 1))``; a unit spends the sum over its rows
    (:func:`unit_personal_epsilon`)."""
    return np.log1p(np.asarray(pi, dtype=np.float64) * math.expm1(t / unit_rows))


def unit_personal_epsilon(pi_rows: np.ndarray, t: float, unit_rows: int) -> float:
    """The privacy loss of one unit whose rows (at most ``unit_rows`` = m of them) are sampled
    independently with probabilities ``pi_rows`` before a release calibrated to m rows at budget
    t: sum_r ln(1 + pi_r (e^(t/m) - 1)) <= t. (Removing the unit: the output law is a mixture over
    the subset T of its rows that is sampled, each component within e^(t |T|/m) of the law
    without the unit; the mixture's ratio is at most E[e^(t |T|/m)] = prod_r (1 + pi_r
    (e^(t/m) - 1)), and its inverse at most the same.)"""
    pi = np.asarray(pi_rows, dtype=np.float64).ravel()
    if pi.size > unit_rows:
        raise ParameterError("pi_rows", f"{pi.size} rows", f"at most unit_rows = {unit_rows} rows "
                             "(the bound the release is calibrated to)")
    return float(personal_epsilon(pi, t, unit_rows).sum())


# --------------------------------------------------------------------------- stage 3
def sensitivities(query: str, k_target: int, lower: float, upper: float,
                  unit_rows: int = 1) -> dict[str, float]:
    """User-level add/remove L1 sensitivity of each noisy statistic of ``query`` (spec §6):
    N: k_T, S: k_T Bmax, Q: k_T Bmax^2 with Bmax = max(|lower|, |upper|); times ``unit_rows``
    (m = L0 * Linf) for a privacy unit of at most m rows."""
    check_choice(query, "query", QUERIES)
    bmax = max(abs(lower), abs(upper))
    delta = {"N": float(k_target), "S": k_target * bmax, "Q": k_target * bmax * bmax}
    return {s: unit_rows * delta[s] for s in QUERY_STATISTICS[query]}


def noise_scales(query: str, k_target: int, lower: float, upper: float,
                 epsilon: float | np.ndarray, unit_rows: int = 1) -> dict[str, Any]:
    """Laplace scale of each noisy statistic: ``Delta_j / (epsilon / j)`` when ``query`` uses j
    statistics (the budget is split equally; sequential composition). ``epsilon`` may be an array
    (one per repetition, for the paper's data-dependent e^m). ``unit_rows``: see
    :func:`sensitivities`."""
    delta = sensitivities(query, k_target, lower, upper, unit_rows)
    share = np.asarray(epsilon, dtype=np.float64) / len(delta)
    return {s: d / share for s, d in delta.items()}


def statistic_units(values: np.ndarray, lattice: Mapping[str, tuple[float, int]]) -> np.ndarray:
    """Per user (row of ``values``, shape (n, k_T)), her contribution to N, S and Q in lattice
    units: an (n, 3) int64 table whose column sums are the exact integer statistics (columns a
    query does not use are 0)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:  # one target item
        v = v[:, None]
    out = np.zeros((v.shape[0], 3), dtype=np.int64)
    if "N" in lattice:
        out[:, 0] = v.shape[1]
    if "S" in lattice:
        out[:, 1] = to_units(v, lattice["S"][0]).sum(axis=1)
    if "Q" in lattice:
        out[:, 2] = to_units(v * v, lattice["Q"][0]).sum(axis=1)
    return out


def noisy_statistics(sums: np.ndarray, query: str, k_target: int, lower: float, upper: float,
                     epsilon: float | np.ndarray, gen: np.random.Generator, unit_rows: int = 1
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stage 3's noise: each statistic of ``query`` (``sums[..., j]`` in lattice units, j = 0, 1,
    2 for N, S, Q; any leading shape, e.g. one row per repetition) plus exact discrete Laplace
    noise at ``epsilon / j`` (the budget split equally; ``epsilon`` a number or an array matching
    the leading shape), calibrated to units of at most ``unit_rows`` rows. Returns ({statistic:
    noisy value in data units}, {statistic: noise variance in data units^2})."""
    lattice = statistic_lattice(query, k_target, lower, upper, unit_rows)
    share = np.asarray(epsilon, dtype=np.float64) / len(lattice)
    sums = np.asarray(sums, dtype=np.int64)
    noisy, variance = {}, {}
    for s, (grid, sens) in lattice.items():
        units, scale = lattice_laplace(sums[..., "NSQ".index(s)], sens, share, gen)
        noisy[s] = grid * units.astype(np.float64)
        variance[s] = grid * grid * discrete_laplace_variance(scale)
    return noisy, variance


def exact_answer(query: str, values: np.ndarray) -> float:
    """The query on exact data (the truth of an experiment): population variance, cv = sd/mean."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if query == "count":
        return float(v.size)
    if query == "sum":
        return float(v.sum())
    mean = float(v.mean())
    if query == "mean":
        return mean
    var = float(np.mean((v - mean) ** 2))
    return var if query == "variance" else math.sqrt(var) / mean


# --------------------------------------------------------------------------- OSPDPRR
def _ospdprr_roles(m: "OSPDPRR") -> tuple[Role, ...]:
    return (tuple(Role(f"value{i}", help=f"item {i}: a number in [lower, upper]")
                  for i in m.target)
            + tuple(Role(f"level{i}", help=f"item {i}: sensitivity level in [0, 1] (0: not "
                         "sensitive)") for i in range(1, m.k + 1))
            + tuple(Role(f"importance{i}", required=False,
                         help=f"item {i}: importance in (0, 1] (default 1)")
                    for i in range(1, m.k + 1)))


def _ospdprr_fields(m: "OSPDPRR") -> tuple[tuple[str, str], ...]:
    values = tuple((f"value{i}", "float64") for i in m.target)
    clip = ((CLIPPED, CLIPPED_DTYPE),) if m.clip else ()
    if m.one_pass:  # sound-self: the row's sampling decision, drawn where the row is read
        return values + (("sampled", "uint8"),) + clip
    return values + tuple((f"weight{i}", "float64") for i in range(1, m.k + 1)) + clip


@dataclass(frozen=True)
class OSPDPRR(_UserQuery, UnitBounded, CentralRelease):
    """OSPDPRR: one-sided personalized DP query on users' k items (central, one release).

    TOPSIS sensitivity scores, personalized sampling with threshold t, one Laplace release.

    Parameters: ``t`` in (0, 1]; ``query`` (count, sum, mean, variance, cv) on the target items
    ``target`` (item numbers in 1..k, default all); values in ``[lower, upper]`` (required, no
    default: the noise is calibrated to them; outside: invalid, or clipped with ``clip=True``);
    ``mode`` (``sound-self`` default, ``sound-public``, ``paper``);
    ``norm`` (``vector``/``minmax`` for the data-reference modes; None = vector; sound-self uses
    no normalization); ``estimator`` (``raw``/``ratio``; None = ratio where allowed in
    sound-public, else raw); ``sensitivity``: the sensitivity specification function, a name of
    :data:`SENSITIVITY_FUNCTIONS` or a callable ``(importance, level) -> weights`` on (n, k)
    arrays (a module-level function, so that Beam can pickle it); ``paper_m`` (paper mode: ``m``
    over the ``raw`` scores M, default, or the ``rescaled`` M'); ``mean_floor`` (cv only: a public
    lower bound > 0 on the mean; default ``lower``, which must then be > 0).

    Curator side: ``check`` validates the rows and computes the item weights; invalid rows are
    dead-lettered. In sound-self, ``randomize`` also draws each row's sampling (``draws == 1``:
    ``sampled = u < pi_u``) and :class:`OSPDPRREstimator` sums the sample in one pass; in the
    other modes ``randomize`` passes the weights on (``draws == 0``) and the estimator keeps the
    rows. Either way the one release is made in ``finalize``.
    """

    NAME: ClassVar[str] = "ospdprr"
    tidy_cells: ClassVar[tuple[str, ...]] = ("clipped",)  # scalars; the query clipped too
    family: ClassVar[str] = "ospdprr"
    #: how this family's epsilon is set (it has no epsilon parameter): said by the command line
    #: with a parameter error and where the epsilon is checked
    EPSILON_FROM: ClassVar[str] = (
        "ospdprr takes no epsilon: -p t= (in (0, 1]) is its budget, the sampling threshold and "
        "the noise's epsilon: t-DP per user in mode sound-self (the default) and sound-public "
        "(under its public-weights assumption); mode=paper has no finite guarantee")
    roles = _ByItem(_ospdprr_roles, (
        Role("value<i>", help="one per target item i: a number in [lower, upper]"),
        Role("level<i>", help="one per item i = 1..k: sensitivity level in [0, 1]"),
        Role("importance<i>", required=False, help="one per item i = 1..k: importance in (0, 1]")))
    report_fields = _ByItem(_ospdprr_fields, (
        ("value<i>", "float64"), ("sampled", "uint8 (sound-self)"),
        ("weight<i>", "float64 (sound-public, paper)"),
        (CLIPPED, f"{CLIPPED_DTYPE} (clip=True: the row's clipped values)")))

    t: float
    query: str = "sum"
    k: int = 1
    target: tuple[int, ...] = ()
    lower: float = field(kw_only=True)  # required: values outside are invalid (or clipped) and
    upper: float = field(kw_only=True)  # the sensitivities (noise scales) are calibrated to them
    clip: bool = False
    mode: str = "sound-self"
    norm: Union[str, None] = None
    estimator: Union[str, None] = None
    sensitivity: Union[str, Callable[..., Any]] = "product"
    paper_m: Union[str, None] = None
    mean_floor: Union[float, None] = None
    #: contribution bounds per privacy unit (issue 14): at most L0 partitions x Linf rows each,
    #: enforced by the pipeline; every sensitivity is multiplied by L0 * Linf
    max_partitions_per_unit: int = 1
    max_rows_per_partition: int = 1

    def __post_init__(self) -> None:
        _check_t(self.t)
        _check_common(self)
        _check_bounds(self, self.t / len(QUERY_STATISTICS[self.query]))
        check_choice(self.mode, "mode", MODES)
        if self.mode == "sound-self":
            if self.norm not in (None, "none"):
                raise ParameterError(
                    "norm", self.norm, "None with mode='sound-self'",
                    "sound-self scores the raw weights against the fixed references 0 and 1; a "
                    "normalization across users would make each user's budget depend on the "
                    "others (spec §2.3, §5)")
            object.__setattr__(self, "norm", None)
        else:
            norm = "vector" if self.norm is None else self.norm
            check_choice(norm, "norm", NORMS)
            object.__setattr__(self, "norm", norm)
        ratio_ok = self.query in RATIO_QUERIES and self.mode in ("sound-public", "paper")
        est = self.estimator
        if est is None:
            est = "ratio" if ratio_ok and self.mode == "sound-public" else "raw"
        check_choice(est, "estimator", ("raw", "ratio"))
        if est == "ratio" and not ratio_ok:
            why = ("count and sum only (mean, variance and cv are ratios already)"
                   if self.query not in RATIO_QUERIES else
                   "mode 'sound-public' or 'paper': the factor n / sum(pi) is public only when "
                   "the weights are (in sound-self, n and the pi are private)")
            raise ParameterError("estimator", self.estimator, "'raw'", f"ratio needs {why}")
        object.__setattr__(self, "estimator", est)
        if isinstance(self.sensitivity, str):
            check_choice(self.sensitivity, "sensitivity", tuple(SENSITIVITY_FUNCTIONS))
        elif not callable(self.sensitivity):
            raise ParameterError("sensitivity", self.sensitivity,
                                 f"one of {tuple(SENSITIVITY_FUNCTIONS)} or a callable "
                                 "(importance, level) -> weights")
        if self.mode == "paper":
            pm = "raw" if self.paper_m is None else self.paper_m
            check_choice(pm, "paper_m", ("raw", "rescaled"))
            object.__setattr__(self, "paper_m", pm)
        elif self.paper_m is not None:
            raise ParameterError("paper_m", self.paper_m, "None unless mode='paper'")

    # -- derived parameters
    @property
    def ref(self) -> str:
        """TOPSIS references: ``fixed`` (sound-self) or ``data`` (paper, sound-public)."""
        return "fixed" if self.mode == "sound-self" else "data"

    @property
    def sensitivity_function(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        s = self.sensitivity
        return SENSITIVITY_FUNCTIONS[s] if isinstance(s, str) else s

    def params(self) -> dict:
        p = super().params()
        if callable(f := p["sensitivity"]):
            p["sensitivity"] = f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', f)}"
        return p

    @property
    def one_pass(self) -> bool:
        """sound-self: each row's sampling is drawn where it is read and the estimator keeps
        only the sample's lattice sums; the data-reference modes keep the rows (module
        docstring)."""
        return self.mode == "sound-self"

    @property
    def sums_used(self) -> set[str]:
        """The sums its query's statistics need (:data:`QUERY_STATISTICS`), whose magnitude
        the bounds must keep finite (:func:`_check_magnitudes`)."""
        return set(QUERY_STATISTICS[self.query])

    @property
    def draws(self) -> int:
        # sound-self: the uniform of the row's Bernoulli(pi_u) sampling; the other modes sample
        # at release time (pi_u needs every user) and draw nothing per row
        return 1 if self.one_pass else 0

    # -- the guarantee (spec §5)
    def no_guarantee_reason(self) -> tuple[tuple[str, ...], str]:
        """Why this configuration has no guarantee (for the registry's opt-in check)."""
        return (("mode",), "mode='paper' is the literal rule eps = e^m, which carries no privacy "
                "claim (replication only); mode='sound-self' (the default) is t-DP")

    @property
    def guarantee(self) -> PrivacyGuarantee:
        t = float(self.t)
        m = self.unit_sensitivity
        bounds = self.contribution_bounds
        split = len(QUERY_STATISTICS[self.query])
        comp = (f" The query uses {split} noisy statistics at t/{split} each (sequential "
                "composition: t in total)." if split > 1 else "")
        release = (" Each finalize is one release: releases on disjoint users (per key or per "
                   "window) compose in parallel; further releases that involve the same user add "
                   "up.")
        claim = ("the paper (Algorithm 1, step 8): noise Lap(Delta f / eps) with eps = e^m, m the "
                 "smallest comprehensive weight among the sampled users; claimed to satisfy "
                 "one-sided personalized DP with sensitivity shielding")
        if self.mode == "paper":
            return PrivacyGuarantee(
                NONE, math.inf, claim=claim,
                params={**central_unit_params(bounds), "mode": "paper", "t": t},
                notes="Replication only, no privacy claim (spec §4.2, docs/ospdprr_privacy.md): "
                      "the noise budget e^m depends on which users were sampled and on their "
                      "weights, so the output distribution with a user contains a Laplace "
                      "component strictly wider than any without her, and the density ratio of "
                      "neighbouring datasets grows without bound in the tails. e^m lies in "
                      "[1, e], above every t, and the normalization, the ideals and A/B couple "
                      "all users." + central_unit_text(bounds))
        personal = ("min(M_u, t) = ln(1 + pi_u (e^t - 1)) for user u, M_u her comprehensive "
                    "weight against the fixed references" if self.mode == "sound-self" else
                    "min(M'_u, t) = ln(1 + pi_u (e^t - 1)) for user u, M'_u her rescaled "
                    "comprehensive weight")
        params = {**central_unit_params(bounds, unit_epsilon=t),
                  "mode": self.mode, "t": t, "unit": "user (add/remove one user with all her "
                  "items)", "personal_epsilon": personal, "osdp_epsilon": 2 * t,
                  "replacement_epsilon": 2 * t}
        if m == 1:
            core = (f"t-DP at user level (t = {t:g}; add/remove one user with all her items): "
                    f"Laplace noise calibrated to Delta/t on any sample is t-DP and the "
                    f"personalized sampling only amplifies (Jorgensen et al.'s Sample). Per user: "
                    f"{personal} (amplification by sampling, Li-Qardaji-Su). Replacing a user's "
                    f"items costs at most 2t = {2 * t:g}, so the release is (P, {2 * t:g})-one-"
                    f"sided DP for every policy P (the paper's sensitivity shielding, with "
                    f"parameter 2t); non-sensitive users are protected too.")
        else:
            params["unit"] = (f"privacy unit ({bounds.describe()}; a row is one user's k items)")
            params["personal_epsilon"] = ("sum over the unit's rows r of ln(1 + pi_r (e^(t/m) - "
                                          f"1)) <= t, m = {m}")
            core = (f"t-DP per privacy unit (t = {t:g}; all rows of one unit, at most L0 x Linf "
                    f"= {m} rows, each one user's items): every sensitivity is multiplied by "
                    f"{m}, so Laplace noise calibrated to {m} Delta/t on any sample is t-DP per "
                    f"unit, and the sampling, row by row, only amplifies. Per unit: the sum over "
                    f"its rows r of ln(1 + pi_r (e^(t/{m}) - 1)) (each row's pi_r as below: "
                    f"{personal}). Replacing a unit's rows costs at most 2t = {2 * t:g}: "
                    f"(P, {2 * t:g})-one-sided DP per unit for every policy P.")
        core += central_unit_text(bounds)
        if self.mode == "sound-self":
            params["assumption"] = "none"
            return PrivacyGuarantee(
                CENTRAL, t, claim=claim, params=params,
                notes=core + " M_u depends only on user u's own items, so the per-user bound is "
                      "a budget that is a function of the user's own record (per-record DP "
                      "sense)." + comp + release)
        params["assumption"] = "the weight matrix is public"
        return PrivacyGuarantee(
            CENTRAL, t, claim=claim, params=params,
            notes="CONDITIONAL on the public-weights assumption: the whole weight matrix "
                  "(every user's importance and level, hence the normalization, the ideal "
                  "points, A, B, every pi_u, n and sum pi) is public metadata fixed in advance "
                  "and not derived from protected values; the protected data are the item "
                  "values. Under it: " + core + " The ratio factor n / sum(pi) is then public "
                  "post-processing. Without the assumption there is NO guarantee: one user's "
                  "weights move the column norms, the ideals, A and B, hence every other user's "
                  "sampling probability; use mode='sound-self'." + comp + release)

    # -- validation and encoding (curator side: no noise here)
    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        n = reasons.n
        _flag_values(self, cols, reasons)
        items = range(1, self.k + 1)
        _flag_levels(self, cols, reasons, items)
        if any(self.sensitivity_function is f for f in _PLAIN_WEIGHTS) and \
                not any(f"importance{i}" in cols for i in items):
            # no importance column and w = importance / max importance * level or w = level:
            # every importance is 1, so w is the level itself (1.0 / 1.0 * l == l exactly), and
            # 0 on an invalid row (where the general path zeroes the level). Those w are always
            # in [0, 1] (a valid row's level is), so no row fails the weight check below: the
            # same weights and reasons as the general path, without its (n, k) temporaries.
            bad = reasons.bad
            any_bad = bool(bad.any())
            for i in items:
                lv = cols[f"level{i}"]
                cols[f"weight{i}"] = np.where(bad, 0.0, lv) if any_bad else \
                    np.array(lv, dtype=np.float64)
            return
        imp = np.ones((n, self.k))
        for j, i in enumerate(items):
            name = f"importance{i}"
            if name not in cols:
                continue
            v = cols[name]
            reasons.flag(np.isnan(v), f"{name}: missing importance (a number in (0, 1] is "
                         "required when the column is mapped)")
            with np.errstate(invalid="ignore"):
                out = (v <= 0) | (v > 1)
            reasons.flag(out, lambda r, v=v, nm=name:
                         f"{nm}: importance {float(v[r])!r} is outside (0, 1]")
            imp[:, j] = np.where(np.isnan(v), 1.0, v)
        lvl = np.column_stack([np.nan_to_num(cols[f"level{i}"]) for i in items]) if n else \
            np.zeros((0, self.k))
        bad = reasons.bad
        imp = np.where(bad[:, None] | (imp <= 0) | (imp > 1), 1.0, imp)
        lvl = np.where(bad[:, None] | (lvl < 0) | (lvl > 1), 0.0, lvl)
        w = self.weights(imp, lvl)
        with np.errstate(invalid="ignore"):
            wbad = ~np.isfinite(w) | (w < 0) | (w > 1)
        rows = wbad.any(axis=1)
        reasons.flag(rows, lambda r: (
            f"sensitivity function {self.params()['sensitivity']!r} gave weights "
            f"{w[r].tolist()!r}: every weight must be in [0, 1]"))
        for j, i in enumerate(items):
            cols[f"weight{i}"] = np.where(rows, 0.0, w[:, j])

    def weights(self, importance: np.ndarray, level: np.ndarray) -> np.ndarray:
        """Stage 1 (§2.1): the (n, k) weight matrix from importances and levels."""
        imp = np.asarray(importance, dtype=np.float64)
        lvl = np.asarray(level, dtype=np.float64)
        if imp.shape[0] == 0:
            return np.zeros(lvl.shape)
        w = np.asarray(self.sensitivity_function(imp, lvl), dtype=np.float64)
        if w.shape != lvl.shape:
            raise ParameterError("sensitivity", self.params()["sensitivity"],
                                 f"a function returning one weight per item: shape "
                                 f"{lvl.shape}, not {w.shape}")
        return w

    def prepare(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        """The report of each valid row: its target values and, in the data-reference modes,
        its weights (sampled at release time); in sound-self (:attr:`one_pass`) its sampling
        decision ``sampled = u < pi_u`` instead of the weights, ``u`` the row's one uniform
        (per record, from the run's secret key and the row's identity in a pipeline) -- the
        same Bernoulli(pi_u) as :meth:`release` draws, and never published."""
        out = {f"value{i}": np.asarray(cols[f"value{i}"], dtype=np.float64) for i in self.target}
        n = out[f"value{self.target[0]}"].shape[0]
        if not self.one_pass:
            out.update({f"weight{i}": np.asarray(cols[f"weight{i}"], dtype=np.float64)
                        for i in range(1, self.k + 1)})
            if self.clip:
                out[CLIPPED] = _clipped_column(self, cols, n)
            return out
        u = np.asarray(u)
        if u.ndim != 2 or u.shape[0] != n or u.shape[1] < 1:
            raise ValueError(f"{self.name} (mode sound-self) samples each row with one uniform: "
                             f"prepare needs an ({n}, 1) array of uniforms, not shape {u.shape}")
        if self.k == 1 and n:  # the common case: no (n, 1) matrix, the same arithmetic
            pi = _self_sampling_one_item(np.asarray(cols["weight1"], dtype=np.float64), self.t)
        else:
            w = np.column_stack([np.asarray(cols[f"weight{i}"], dtype=np.float64)
                                 for i in range(1, self.k + 1)]) if n else np.zeros((0, self.k))
            _, _, pi = self.sampling(w)
        out["sampled"] = (u[:, 0] < pi).astype(np.uint8)
        if self.clip:
            out[CLIPPED] = _clipped_column(self, cols, n)
        return out

    # -- stages 1-3 and the one release
    def scores(self, weights: np.ndarray) -> np.ndarray:
        """Stage 1 (§2.2-2.4): the comprehensive weight M_u of every user."""
        return comprehensive_weight(weights, self.ref, self.norm)

    def sampling(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stages 1-2: (M, personal budgets eps_u, sampling probabilities pi)."""
        m = self.scores(weights)
        eps = personal_budgets(m, rescale=self.mode != "sound-self")
        return m, eps, sampling_probabilities(eps, self.t)

    def noise_scales(self, epsilon: float | None = None) -> dict[str, float]:
        """Laplace scale of each noisy statistic at budget ``epsilon`` (default t), calibrated to
        units of at most L0 * Linf rows."""
        sc = noise_scales(self.query, self.k_target, self.lower, self.upper,
                          self.t if epsilon is None else epsilon, self.unit_sensitivity)
        return {s: float(v) for s, v in sc.items()}

    def release(self, values: np.ndarray, weights: np.ndarray, rng: RngLike = None, *,
                allow_empty: bool = False, diagnostics: bool = True) -> Estimate:
        """Stages 1-3 on all users' rows: ``values`` (n, k_T) target values in [lower, upper],
        ``weights`` (n, k) in [0, 1]. One sample, one Laplace draw per noisy statistic. The
        release's :class:`~ldp_beam.core.Estimate` (``n_reports=None``); its ``curator`` holds
        the sample, scores, budgets, pi, noise (never published).

        ``allow_empty``: release from no rows at all (a public key absent from the data, in a
        per-key release): the statistics are the noise alone, and the ratio factor is 1.
        ``diagnostics=False``: the same release (bit for bit, the same draws) computed a chunk
        of users at a time, without the per-user arrays of ``curator`` (scores, budgets, pi,
        sample); what the estimator's finalize uses."""
        vals = np.asarray(values, dtype=np.float64).reshape(-1, self.k_target)
        w = np.asarray(weights, dtype=np.float64).reshape(-1, self.k)
        n = vals.shape[0]
        if (n == 0 and not allow_empty) or w.shape[0] != n:
            raise EmptyAccumulatorError(f"{self.name}: no reports (users) to release from")
        gen = as_generator(rng)
        um = self.unit_sensitivity
        lattice = statistic_lattice(self.query, self.k_target, self.lower, self.upper, um)
        if not diagnostics:
            sums, low, pi_sum = self._sample_in_chunks(vals, w, gen, lattice)
            curator: dict[str, Any] = {}
        else:
            m, eps_u, pi = self.sampling(w) if n else (np.zeros(0), np.zeros(0), np.zeros(0))
            keep = gen.random(n) < pi
            sv = vals[keep]
            exact = {"N": float(self.k_target * keep.sum()), "S": float(sv.sum()),
                     "Q": float(np.square(sv).sum())}
            curator = {"scores": m, "budgets": eps_u, "pi": pi, "sample": keep, "exact": exact}
            if self.mode == "paper":
                score = m if self.paper_m == "raw" else eps_u
                # empty sample: over all users (no users: m = 0)
                low = score[keep].min() if keep.any() else (score.min() if n else 0.0)
            sums = statistic_units(sv, lattice).sum(axis=0)
            pi_sum = float(pi.sum())
        if self.mode == "paper":  # step 8: eps = e^m, m the smallest score among sampled users
            epsilon = math.exp(float(low))
            curator["m"] = float(low)
        else:
            epsilon = float(self.t)
        return self._noisy_release(n, sums, epsilon, pi_sum, gen, lattice, curator)

    def release_sums(self, n: int, sums: np.ndarray, rng: RngLike = None, *,
                     allow_empty: bool = False) -> Estimate:
        """Stage 3 of the one-pass release (sound-self, :attr:`one_pass`): the noise and the
        published statistics from the sample's lattice sums ``sums`` (N, S, Q in the units of
        :func:`statistic_lattice`, as :func:`statistic_units` sums them) over ``n`` users,
        each sampled with her own pi_u where her row was read (:meth:`randomize`). The same
        noise, budget and statistics as :meth:`release` on those users with that sample."""
        if not self.one_pass:
            raise ParameterError("mode", self.mode, "'sound-self' for a release from sums (in "
                                 "the other modes pi_u depends on every user: use release())")
        if n == 0 and not allow_empty:
            raise EmptyAccumulatorError(f"{self.name}: no reports (users) to release from")
        lattice = statistic_lattice(self.query, self.k_target, self.lower, self.upper,
                                    self.unit_sensitivity)
        return self._noisy_release(n, np.asarray(sums, dtype=np.int64), float(self.t),
                                   math.nan, as_generator(rng), lattice, {})

    #: rows per chunk of the release's lean path (:meth:`_sample_in_chunks`)
    CHUNK_ROWS: ClassVar[int] = 1 << 16

    def _sample_in_chunks(self, vals: np.ndarray, w: np.ndarray, gen: np.random.Generator,
                          lattice: Mapping[str, tuple[float, int]]
                          ) -> tuple[np.ndarray, float, float]:
        """Stages 1-2 and the sample's lattice sums, CHUNK_ROWS users at a time: the same
        numbers as :meth:`sampling` on all users (every step is per user, or an exact
        reduction -- column norms, minima and maxima -- taken over all users first), the same
        uniforms (drawn in order from ``gen``, which yields one stream however it is split),
        without arrays of one value per user. Returns (sums of N, S, Q in lattice units, the
        paper mode's smallest sampled score, sum of pi over all users: summed over one array of
        every pi, as ``pi.sum()``, in the modes with a ratio estimator)."""
        n, step = vals.shape[0], self.CHUNK_ROWS
        k = w.shape[1]
        if self.ref == "data" and n:
            scale = _normalizer(w, self.norm)
            best, worst = np.full(k, np.inf), np.full(k, -np.inf)
            for i in range(0, n, step):
                wb = scale(np.asarray(w[i:i + step], dtype=np.float64))
                best, worst = np.minimum(best, wb.min(axis=0)), np.maximum(worst, wb.max(axis=0))
        else:
            def scale(x: np.ndarray) -> np.ndarray:
                return x
            best, worst = np.zeros(k), np.ones(k)

        def scores(i: int) -> np.ndarray:
            return _closeness(scale(np.asarray(w[i:i + step], dtype=np.float64)), best, worst)

        rescale = self.mode != "sound-self"
        if rescale and n:
            a, b = -np.inf, np.inf
            for i in range(0, n, step):
                m = scores(i)
                a, b = max(a, float(m.max())), min(b, float(m.min()))
        ratio = self.query in RATIO_QUERIES and self.mode in ("sound-public", "paper")
        pi_all = np.empty(n) if ratio else None
        sums = np.zeros(3, dtype=np.int64)
        low, low_all = math.inf, math.inf
        for i in range(0, n, step):
            m = scores(i)
            if not rescale:
                eps_u = m
            elif a == b:
                eps_u = np.ones_like(m)
            else:
                eps_u = (m - b) / (a - b)
            pi = sampling_probabilities(eps_u, self.t)
            keep = gen.random(m.shape[0]) < pi
            if pi_all is not None:
                pi_all[i:i + step] = pi
            sums += statistic_units(vals[i:i + step][keep], lattice).sum(axis=0)
            if self.mode == "paper":
                score = m if self.paper_m == "raw" else eps_u
                low_all = min(low_all, float(score.min()))
                if keep.any():
                    low = min(low, float(score[keep].min()))
        if low == math.inf:  # nobody sampled: over all users (no users: m = 0)
            low = low_all if n else 0.0
        return sums, low, (float(pi_all.sum()) if pi_all is not None else math.nan)

    def _noisy_release(self, n: int, sums: np.ndarray, epsilon: float, pi_sum: float,
                       gen: np.random.Generator, lattice: Mapping[str, tuple[float, int]],
                       curator: dict[str, Any]) -> Estimate:
        """Stage 3 from the sample's lattice sums: the noise and the published statistics
        (``curator``: the stages' bookkeeping so far, completed here with the noise's)."""
        scales = self.noise_scales(epsilon)
        um = self.unit_sensitivity
        noisy_arr, variance = noisy_statistics(sums, self.query, self.k_target, self.lower,
                                               self.upper, epsilon, gen, um)
        noisy = {s: float(v) for s, v in noisy_arr.items()}
        sds = {s: math.sqrt(float(v)) for s, v in variance.items()}
        curator.update(epsilon=epsilon, scales=scales, noisy=noisy, noise_sd=sds,
                        lattice=lattice, units=sums)
        stats: dict[str, Statistic] = {}
        public = self.mode != "paper"  # the noise scale itself is data-dependent in paper mode
        for s, v in noisy.items():
            stats[STATISTIC_NAMES[s]] = Statistic(
                v, sds[s] if public else None,
                note=f"{s} of the sample's target values (summed exactly on a grid of "
                     f"{lattice[s][0]:g}) + discrete Laplace noise of scale Delta_{s} / eps_{s}; "
                     "the noisy statistic every other number here is computed from (stderr: "
                     "the noise alone)")
        value, clipped = query_answer(self.query, noisy.get("N"), noisy.get("S"), noisy.get("Q"),
                                      self.lower, self.upper, self.resolved_mean_floor)
        raw = Statistic(float(value), self._stderr(sds, 1.0, public), float(clipped),
                        note=self._note("raw"))
        stats[self.query] = raw
        if self.query in RATIO_QUERIES and self.mode in ("sound-public", "paper"):
            factor = float(n / pi_sum) if n else 1.0
            ratio = Statistic(float(value) * factor, self._stderr(sds, factor, public),
                              float(clipped) * factor, note=self._note("ratio"))
            stats[f"{self.query}_raw"] = raw
            stats[f"{self.query}_ratio"] = ratio
            stats[self.query] = ratio if self.estimator == "ratio" else raw
            stats["ratio_factor"] = Statistic(
                factor, note="n / sum(pi): public under the sound-public assumption"
                if self.mode == "sound-public" else "n / sum(pi) (paper mode: data-dependent)")
            curator["ratio_factor"] = factor
        if self.mode == "paper":
            stats["paper_epsilon"] = Statistic(
                epsilon, note="the paper's data-dependent budget e^m (replication only: it "
                              "reveals the smallest sampled score)")
        return _estimate(self, stats, curator)

    def _stderr(self, sds: Mapping[str, float], factor: float, public: bool) -> float | None:
        if not public or self.query not in RATIO_QUERIES:
            return None
        return factor * sds["N" if self.query == "count" else "S"]

    def _note(self, estimator: str) -> str:
        what = {"count": "the number of target values", "sum": "the sum of the target values",
                "mean": "the mean", "variance": "the population variance",
                "cv": "the coefficient of variation sqrt(variance)/mean"}[self.query]
        base = f"{what} of the sampled users, from the noisy statistics"
        if estimator == "ratio":
            base = (f"{what} of all users: the raw answer times n / sum(pi) (approximately "
                    "unbiased when values do not depend on sensitivity)")
        elif self.query in RATIO_QUERIES:
            base += "; an estimate of the full-data total only up to the factor sum(pi) / n"
        if self.query in RATIO_QUERIES and self.mode != "paper":
            base += "; stderr: the Laplace noise alone (the sampling error is not included)"
        if self.mode == "paper":
            base += "; paper mode: replication only, no privacy claim"
        return base + _clip_note(self)


class _UserRowsEstimator(_ReleasedOnce, Estimator):
    """The row accumulator of OSPDPRR's data-reference modes: one float64 row per user (the
    report fields in order), appended with amortized growth (:func:`_grow`) and capped by
    ``user_cells``; ``finalize`` sorts the rows and makes the mechanism's one release."""

    #: the accumulator holds one row per user (O(users)); compare accumulators with canonical()
    accumulates_rows: ClassVar[bool] = True

    def __init__(self, mechanism: Any, seed: int | None = None) -> None:
        super().__init__(mechanism)
        self.seed = seed
        self.fields = mechanism.report_fields
        self.width = len(self.fields)
        # OSPDPRR's release without its per-user diagnostic arrays (the same statistics, with
        # memory of a chunk of users rather than several arrays of one value per user)
        lean = (isinstance(mechanism, OSPDPRR) and type(mechanism).sampling is OSPDPRR.sampling
                and type(mechanism).scores is OSPDPRR.scores)  # not if a subclass changes them
        self._lean = {"diagnostics": False} if lean else {}

    def create(self) -> np.ndarray:
        return np.empty((0, self.width), dtype=np.float64)

    def add(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        """``acc`` with the reports' rows appended (:func:`_grow`: O(n) copies for n rows)."""
        cols = [np.asarray(reports[name], dtype=np.float64).reshape(-1) for name, _ in self.fields]
        m = cols[0].size
        if not m:
            return acc
        out, dest = _grow(acc, m, self._check_rows)
        for j, c in enumerate(cols):
            dest[:, j] = c
        return out

    def merge(self, accs: Iterable[np.ndarray]) -> np.ndarray:
        """The rows of every accumulator, appended once (:func:`_grow`)."""
        accs = [a for a in accs if a.shape[0]]
        if not accs:
            return self.create()
        if len(accs) == 1:
            return accs[0]  # rows are never written in place: sharing them is safe
        out, dest = _grow(accs[0], sum(a.shape[0] for a in accs[1:]), self._check_rows)
        np.concatenate(accs[1:], out=dest)
        return out

    def _check_rows(self, rows: int) -> None:
        """The ``user_cells`` cap (:mod:`ldp_beam.limits`): rows x row width held at once."""
        if rows * self.width > cap("user_cells"):  # the message only when it is needed
            check_cap("user_cells", rows * self.width,
                      f"{self.mechanism.name} users held by the curator ({rows:,} rows x "
                      f"{self.width} cells each)")

    def n_reports(self, acc: np.ndarray) -> int:
        return int(acc.shape[0])

    def canonical(self, acc: np.ndarray) -> np.ndarray:
        """See :meth:`OSPDPRREstimator.canonical`."""
        return _canonical(acc)

    def finalize(self, acc: np.ndarray) -> Estimate:
        """The one release, from no rows too (noise alone; see :class:`_ReleasedOnce`)."""
        return self._release(acc, UNKEYED)

    def finalize_key(self, acc: np.ndarray | None, key: Any) -> Estimate:
        """The release of one partition ``key`` of a per-key release (issue 14): the key is part
        of the noise's address (:func:`~.histogram.release_source`: equal rows under two keys
        must not get equal noise), and an empty or missing accumulator (a public key absent from
        the data) is released from no rows (noise alone), so that whether a public key occurs
        is not disclosed. The caller selects the keys (:mod:`ldp_beam.central.partition`) and
        bounds each unit's contribution first."""
        return self._release(self.create() if acc is None else
                             np.asarray(acc, self.create().dtype), key)

    def _release(self, acc: np.ndarray, key: Any) -> Estimate:
        acc = _canonical(acc)
        m = self.mechanism
        kt, k = m.k_target, m.k
        # the noise is addressed by the rows without the clipped counts (the same address,
        # hence the same seeded release, as without them)
        rel = m.release(acc[:, :kt], acc[:, kt:kt + k],
                        release_source(self.seed, np.ascontiguousarray(acc[:, :kt + k]), key),
                        allow_empty=True, **self._lean)
        return _curated(rel, acc[:, kt + k:].sum() if m.clip else None)


class OSPDPRREstimator(_UserRowsEstimator):
    """The one release of OSPDPRR (its accumulators: see the module docstring).

    **sound-self (one pass, bounded).** Each report carries its row's sampling decision
    (:meth:`OSPDPRR.prepare`); the accumulator is the int64 sums ``[users, N, S, Q]`` (+ the
    values clipped with ``clip=True``, curator only: ``Estimate.curator["values_clipped"]``),
    the same bit for bit in any split and merge order; ``finalize`` is
    :meth:`OSPDPRR.release_sums`.

    **sound-public, paper (O(users)).** The accumulator is a float64 array of shape (users,
    k_T + k), the target values and item weights (+ a last column, the row's clipped values,
    with ``clip=True``), capped by ``LDP_BEAM_MAX_USER_CELLS``; ``finalize`` sorts the rows
    first, so the release is the same whatever the split or merge order.

    ``seed`` makes the release's noise reproducible (a function of the seed and the
    accumulator; for tests only: whoever knows the seed can remove the noise); default: OS
    entropy. Each ``finalize`` is one release (see the module docstring for per-key /
    per-window budgets)."""

    def __init__(self, mechanism: Any, seed: int | None = None) -> None:
        super().__init__(mechanism, seed)
        self.one_pass = mechanism.one_pass
        self.accumulates_rows = not self.one_pass
        self.clip = bool(mechanism.clip)
        self._size = 5 if self.clip else 4
        if self.one_pass:
            self.lattice = statistic_lattice(mechanism.query, mechanism.k_target,
                                             mechanism.lower, mechanism.upper,
                                             mechanism.unit_sensitivity)
            # |S| and Q of one row are at most k_T 2^LATTICE_BITS units: int64 sums are exact
            # for up to this many users (about 8.8e12 / k_T)
            self.max_users = ((1 << 63) - 1) // (mechanism.k_target << LATTICE_BITS)

    # -- the one-pass (sound-self) accumulator: [users, N, S, Q] (+ [clipped]), int64
    def create(self) -> np.ndarray:
        if not self.one_pass:
            return super().create()
        return np.zeros(self._size, dtype=np.int64)

    def add(self, acc: np.ndarray, reports: Mapping[str, np.ndarray]) -> np.ndarray:
        """sound-self: ``acc`` plus the users of ``reports`` and the lattice sums of the
        sampled ones (a new array); else the rows appended (:class:`_UserRowsEstimator`)."""
        if not self.one_pass:
            return super().add(acc, reports)
        m = self.mechanism
        if "sampled" not in reports:
            raise ParameterError("reports", sorted(reports), "sound-self reports: value<i> and "
                                 "the row's sampling decision 'sampled' (made by "
                                 "OSPDPRR.perturb/randomize), not the weights")
        keep = np.asarray(reports["sampled"]).reshape(-1) != 0
        n = keep.size
        if not n:
            return acc
        cols = [np.asarray(reports[f"value{i}"], dtype=np.float64).reshape(-1) for i in m.target]
        clipped = _clipped_sum(m, reports) if self.clip else 0
        out = np.empty(self._size, dtype=np.int64)
        out[0] = self._users(int(acc[0]) + n)
        if all(c.shape[0] == n for c in cols):
            # the sums column by column: the same integers as statistic_units' (n, 3) table
            # summed (int64 addition is exact and order-free), without building it
            units = self._sample_units(cols, keep)
        else:
            vals = np.column_stack(cols if keep.all() else [c[keep] for c in cols])
            units = statistic_units(vals, self.lattice).sum(axis=0)
        out[1:4] = np.asarray(acc[1:4], dtype=np.int64) + units
        if self.clip:
            out[4] = int(acc[4]) + clipped
        return out

    #: rows converted to lattice units at a time in :meth:`add`: slices of 128 KiB per float64
    #: temporary (a 512 KiB one is mapped and faulted in afresh on every call here, which made
    #: the conversion of a 65,536-row batch three times slower than that of its four slices)
    ADD_ROWS: ClassVar[int] = 1 << 14

    def _sample_units(self, cols: list[np.ndarray], keep: np.ndarray) -> np.ndarray:
        """[N, S, Q] of the kept rows in lattice units: ``statistic_units(values[keep],
        lattice).sum(axis=0)`` for the target columns ``cols`` (int64; 0 where the query does
        not use a statistic). A row left out counts as the value 0.0, which is 0 units (0 in S
        and Q): the same integers, summed exactly (int64 addition is order-free), and only kept
        rows' values are converted, as in the general path."""
        lat = self.lattice
        n = keep.size
        kept = int(np.count_nonzero(keep))
        sums = np.zeros(3, dtype=np.int64)
        if "N" in lat:
            sums[0] = kept * len(cols)
        if not kept:
            return sums
        step = self.ADD_ROWS
        for c in cols:
            for lo in range(0, n, step):
                x = c[lo:lo + step]
                if kept < n:
                    x = np.where(keep[lo:lo + step], x, 0.0)
                if "S" in lat:
                    sums[1] += to_units(x, lat["S"][0]).sum()
                if "Q" in lat:
                    sums[2] += to_units(x * x, lat["Q"][0]).sum()
        return sums

    def merge(self, accs: Iterable[np.ndarray]) -> np.ndarray:
        if not self.one_pass:
            return super().merge(accs)
        accs = [np.asarray(a, dtype=np.int64) for a in accs]
        if not accs:
            return self.create()
        self._users(sum(int(a[0]) for a in accs))
        return np.sum(accs, axis=0, dtype=np.int64)

    def _users(self, users: int) -> int:
        if users > self.max_users:
            raise ParameterError("users", users, f"at most {self.max_users:,} users in one "
                                 "release (the int64 lattice sums must stay exact)")
        return users

    def n_reports(self, acc: np.ndarray) -> int:
        return int(acc[0]) if self.one_pass else super().n_reports(acc)

    def canonical(self, acc: np.ndarray) -> np.ndarray:
        """The accumulator in the form ``finalize`` releases from, equal for any split of the
        reports into batches and any merge order: the sums themselves (sound-self), the rows
        in lexicographic order (the other modes)."""
        if self.one_pass:
            return np.array(acc, dtype=np.int64)
        return super().canonical(acc)

    def _release(self, acc: np.ndarray, key: Any) -> Estimate:
        if not self.one_pass:
            return super()._release(acc, key)
        acc = np.asarray(acc, dtype=np.int64)
        rel = self.mechanism.release_sums(int(acc[0]), acc[1:4],
                                          release_source(self.seed, acc[:4], key),
                                          allow_empty=True)
        return _curated(rel, acc[4] if self.clip else None)

    def check_reports(self, reports: Mapping[str, Any], n: int | None = None) -> Reasons:
        reasons = super().check_reports(reports, n)
        m = self.mechanism
        for name, v in _report_values(self, reports, reasons):
            if name == "sampled":
                reasons.flag(~np.isin(v, (0.0, 1.0)), lambda r, v=v: f"report field "
                             f"'sampled': {float(v[r])!r} is not 0 or 1")
                continue
            lo, hi = (m.lower, m.upper) if name.startswith("value") else (0.0, 1.0)
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(v) | (v < lo) | (v > hi)
            reasons.flag(bad, lambda r, v=v, nm=name, lo=lo, hi=hi:
                         f"report field {nm!r}: {float(v[r])!r} is not in [{lo!r}, {hi!r}]")
        return reasons


#: the rows in use of every accumulator buffer with spare capacity, by id(buffer): only the
#: accumulator that ends there (the newest view) may append into the space after it
_BUFFER_ROWS: dict[int, int] = {}
_BUFFER_LOCK = threading.Lock()
_GROWTH = 1.5


def _grow(acc: np.ndarray, m: int, check: Callable[[int], None]) -> tuple[np.ndarray, np.ndarray]:
    """``(out, dest)``: ``out`` holds ``acc``'s rows then ``m`` rows to be written into ``dest``
    (its last m rows, a view). When ``acc`` is the newest view of a buffer with room for m more
    rows, the rows go into that room (no copy of ``acc``: its own rows are never written, so
    ``acc`` and any older view stay as they were); else a buffer 1.5 times the new size is
    allocated and ``acc`` copied once. Growth by a factor makes the copies O(rows) in all."""
    n = acc.shape[0]
    check(n + m)
    buf = acc.base
    with _BUFFER_LOCK:
        if (isinstance(buf, np.ndarray) and _BUFFER_ROWS.get(id(buf)) == n
                and buf.ndim == 2 and buf.shape[0] >= n + m and buf.shape[1] == acc.shape[1]
                and buf.dtype == acc.dtype and acc.ctypes.data == buf.ctypes.data
                and acc.strides == buf.strides):
            _BUFFER_ROWS[id(buf)] = n + m
            return buf[:n + m], buf[n:n + m]
    room = max(n + m, int(_GROWTH * (n + m)))
    buf = np.empty((room, acc.shape[1]), dtype=np.float64)
    buf[:n] = acc
    with _BUFFER_LOCK:
        _BUFFER_ROWS[id(buf)] = n + m
    weakref.finalize(buf, _forget_buffer, id(buf))
    return buf[:n + m], buf[n:n + m]


def _forget_buffer(key: int) -> None:
    with _BUFFER_LOCK:
        _BUFFER_ROWS.pop(key, None)


def _canonical(acc: np.ndarray) -> np.ndarray:
    """The rows in lexicographic order (a release independent of split and merge order), with
    -0.0 written as 0.0 (equal values, so that equal rows are equal bit for bit and their order
    cannot depend on the input's).

    Sorted by the first column (an unstable sort: O(n log n) on one key), then only the runs of
    equal first values are ordered by the other columns: the same rows as a lexicographic sort of
    every column (the order of rows that are equal does not show), 2-3 times faster on continuous
    values (4.2 s -> 1.8 s for 3 x 10^6 rows of two columns, measured on a loaded machine)."""
    if acc.shape[0] < 2:
        return np.ascontiguousarray(acc) + 0.0
    out = acc[np.argsort(acc[:, 0])]
    out += 0.0  # -0.0 -> 0.0, in place (a fresh array)
    if out.shape[1] > 1:
        first = out[:, 0]
        eq = first[1:] == first[:-1]
        tied = np.zeros(out.shape[0], dtype=bool)
        tied[1:] = eq
        tied[:-1] |= eq
        idx = np.flatnonzero(tied)
        if idx.size:
            sub = out[idx]
            run = np.cumsum(np.concatenate(([True], sub[1:, 0] != sub[:-1, 0])))
            keys = tuple(sub[:, j] for j in range(sub.shape[1] - 1, 0, -1)) + (run,)
            out[idx] = sub[np.lexsort(keys)]
    return out


__all__ = ["OSPDPRR", "OSPDPRREstimator", "SENSITIVITY_FUNCTIONS", "importance_times_level",
           "level_only", "normalize_weights", "comprehensive_weight", "personal_budgets",
           "sampling_probabilities", "personal_epsilon", "sensitivities", "noise_scales",
           "query_answer", "exact_answer"]
