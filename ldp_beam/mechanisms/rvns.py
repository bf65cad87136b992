"""RVNS: the real-valued negative survey (spec: shared/specs/rvns.md; paper:
shared/papers/rvns_real_value_negative_survey.txt).

A user with value x in [lower, upper] = [a, b] picks one window W of width d that contains x and
reports k values drawn uniformly from [a, b] outside W ("what my value is not"). Algorithm 1 as
printed has typos; this is the restatement of the spec, which reproduces Eqs. (2)-(4):

1. the offset d1 of x from the window's left end is uniform on [lo, hi] =
   [max(0, x + d - b), min(d, x - a)], so W = [x - d1, x - d1 + d] lies inside [a, b];
2. k values y_j ~ U([a, b] minus W), independently, all with the same window.

Report (wire form): ``y1`` ... ``yk`` (float64, in [a, b]).
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from ..core import Mechanism, Reports, Role, check_choice, check_interval
from ..errors import ParameterError
from ..limits import check_cap
from ..privacy import NEIGHBOURHOOD_LDP, PrivacyGuarantee
from .continuous_baselines import DENSITY_MOMENT_POWER, DENSITY_MOMENTS, _BoundedValue


def rvns_density(x: np.ndarray, y: np.ndarray, a: float, b: float, d: float) -> np.ndarray:
    """Transition density p(x, y) of one report (Eqs. 2-4 in one formula, any d < b - a).

    y falls inside the window iff d1 is in [x - y, x - y + d], so
    p(x, y) = (1 - |[lo, hi] and [x - y, x - y + d]| / (hi - lo)) / (b - a - d), with the
    degenerate hi == lo (x at a boundary) giving an indicator. Broadcasts over x and y.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    lo = np.maximum(0.0, x + d - b)
    hi = np.minimum(d, x - a)
    s, e = x - y, x - y + d
    overlap = np.clip(np.minimum(hi, e) - np.maximum(lo, s), 0.0, None)
    width = hi - lo
    with np.errstate(divide="ignore", invalid="ignore"):
        inside = np.where(width > 0, overlap / np.where(width > 0, width, 1.0),
                          ((lo >= s) & (lo <= e)).astype(float))
    dens = (1.0 - inside) / (b - a - d)
    return np.where((y >= a) & (y <= b), dens, 0.0)


@dataclass(frozen=True)
class RVNS(Mechanism):
    """Real-valued negative survey: k reports of where the value is *not*.

    ``lower`` and ``upper`` (the domain [a, b]) are required: no default domain fits arbitrary
    data. ``d`` is the window width, by default ``D_FRACTION`` = 0.2 of the domain's width (the
    spec's measured configuration, d = 2 on [0, 10]): an absolute default would be a different
    mechanism on every domain (0.2 is 0.4% of [25, 70]). ``delta`` is the neighbourhood size of
    the relaxed guarantee (outputs closer than delta count as the same output); it changes
    nothing in the perturbation, only what the guarantee states. A finite epsilon exists only
    for delta > d, so it defaults to ``DELTA_FACTOR`` = 2 times d (capped at b - a), where the
    guarantee is k ln 2 for d <= (b - a)/3: a default that promises something. Both defaults are
    resolved when the mechanism is built, so ``params()`` and the reports' metadata record the
    values in use. An explicit delta <= d has no finite epsilon; the registry builds it only with
    ``allow_no_guarantee=True``.
    """

    NAME: ClassVar[str] = "rvns"
    family: ClassVar[str] = "rvns"
    #: density, cdf and grid by grid point, quantiles by probability, scalars, and the
    #: reconstruction ``method`` as text
    tidy_cells: ClassVar[tuple[str, ...]] = ("i", "grid_x", "probability", "value_text")
    roles: ClassVar[tuple[Role, ...]] = (Role("value", help="the number, in [lower, upper]"),)
    D_FRACTION: ClassVar[float] = 0.2
    DELTA_FACTOR: ClassVar[float] = 2.0
    #: how the None defaults are resolved (shown by ``ldp-beam list``)
    DEFAULT_NOTES: ClassVar[dict[str, str]] = {
        "d": "0.2 (upper - lower)", "delta": "2 d, at most upper - lower (finite epsilon)"}
    #: how this family's epsilon is set (it has no epsilon parameter): said by the command line
    #: with a parameter error and where the epsilon is checked
    EPSILON_FROM: ClassVar[str] = (
        "rvns takes no epsilon: its epsilon follows from -p d= (window width), -p delta= "
        "(neighbourhood size) and -p k= (reports per user) as k ln(min(delta, upper - lower - d) "
        "/ (delta - d)), finite only for delta > d; the defaults d = 0.2 (upper - lower), "
        "delta = 2 d give k ln 2")

    lower: float
    upper: float
    d: float | None = None
    k: int = 1
    delta: float | None = None

    def __post_init__(self) -> None:
        check_interval(self.lower, self.upper)
        check_interval(self.lower, self.upper, power=DENSITY_MOMENT_POWER,
                       computes=DENSITY_MOMENTS)
        span = self.upper - self.lower
        if self.d is None:
            object.__setattr__(self, "d", self.D_FRACTION * span)
        if isinstance(self.d, bool) or not isinstance(self.d, (int, float, np.integer,
                                                               np.floating)) \
                or not 0 < self.d < span:
            raise ParameterError("d", self.d, f"a window width in (0, upper - lower = {span:g}) "
                                 f"(default: {self.D_FRACTION:g} (upper - lower))")
        if isinstance(self.k, bool) or not isinstance(self.k, (int, np.integer)) or self.k < 1:
            raise ParameterError("k", self.k, "an integer >= 1 (reports per user)")
        check_cap("reports_per_user", self.k, "k")
        if self.delta is None:
            object.__setattr__(self, "delta", min(self.DELTA_FACTOR * self.d, span))
        if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float, np.integer,
                                                                       np.floating)) \
                or not 0 < self.delta <= span:
            raise ParameterError("delta", self.delta,
                                 f"a neighbourhood size in (0, upper - lower = {span:g}] "
                                 f"(default: {self.DELTA_FACTOR:g} d; finite epsilon only for "
                                 "delta > d)")

    @property
    def neighbourhood(self) -> float:
        """delta (resolved when built: by default 2 d)."""
        return float(self.delta)

    def no_guarantee_reason(self) -> tuple[tuple[str, ...], str]:
        """Why this configuration has no finite epsilon (for the registry's opt-in check)."""
        return (("delta", "d"), f"delta = {self.delta:g} <= d = {self.d:g}: RVNS has a finite "
                "epsilon only for delta > d (the default delta is 2 d)")

    @property
    def report_fields(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        """y1 .. yk: float64 in [lower, upper]"""
        return tuple((f"y{j + 1}", "float64") for j in range(self.k))

    @property
    def draws(self) -> int:
        return 1 + self.k  # window offset, then one uniform per report

    @property
    def guarantee(self) -> PrivacyGuarantee:
        """Neighbourhood-LDP as we can defend it (see docs/rvns_privacy.md).

        ``epsilon`` is the exact worst case of the delta-neighbourhood privacy loss over all inputs
        in [lower, upper], all outputs and all k reports (box neighbourhoods, one shared window):
        ``math.inf`` when delta <= d, else k ln(min(delta, b - a - d) / (delta - d)). ``claim`` is
        the paper's k ln(4d/delta). The neighbourhood size is ``params["neighbourhood_delta"]``
        (the guarantee's own ``delta`` field is the (epsilon, delta)-DP failure probability, 0
        here).
        """
        return _rvns_guarantee(float(self.lower), float(self.upper), float(self.d),
                               int(self.k), float(self.neighbourhood))

    validate = _BoundedValue.validate  # missing or outside [lower, upper]: dead-lettered

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        a, b, d = self.lower, self.upper, self.d
        x = cols["value"]
        # left = x - (lo + u0 (hi - lo)) with lo = max(0, x + d - b), hi = min(d, x - a): the
        # same operations in place (products and sums commute exactly in IEEE arithmetic)
        lo = np.add(x, d)
        lo -= b
        np.maximum(0.0, lo, out=lo)
        left = np.subtract(x, a)
        np.minimum(d, left, out=left)
        left -= lo
        left *= u[:, 0]
        left += lo
        np.subtract(x, left, out=left)  # window [left, left + d] inside [a, b]
        del lo
        out = {}
        span = b - a - d
        for j in range(self.k):
            y = np.multiply(u[:, 1 + j], span)
            y += a
            z = y + d
            np.copyto(z, y, where=y < left)
            out[f"y{j + 1}"] = z
        return out

    def density(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """p(x, y) of one report; see :func:`rvns_density`."""
        return rvns_density(x, y, self.lower, self.upper, self.d)


# =============================================================================== privacy analysis
# Section IV-A of the paper, redone. docs/rvns_privacy.md has the derivations (the box
# probability as an exact Gauss-Legendre integral over the window's position, C = b - a - d, the
# neighbourhood convention of the paper's Eq. 13: 0/0 is no loss, p/0 an infinite one) and the
# tables.

_CENTERS = ("domain", "interior")


def _uncovered(left: np.ndarray, w0: np.ndarray, w1: np.ndarray, d: float) -> np.ndarray:
    """|W| - |W ∩ [left, left + d]| for W = [w0, w1]: exactly 0 when the window covers W."""
    return (w1 - w0) - np.clip(np.minimum(w1, left + d) - np.maximum(w0, left), 0.0, None)


def rvns_box_probability(x, lows, highs, a: float, b: float, d: float) -> np.ndarray:
    """P(y_j in [lows_j, highs_j] for every j | x) for k reports that share one window. Exact.

    ``x`` has shape S; ``lows``/``highs`` have shape T + (k,) and are clipped to [a, b]; S and T
    broadcast, and the result has their broadcast shape. With k = 1 this is the integral of
    :func:`rvns_density` over [lows, highs].
    """
    x = np.asarray(x, dtype=float)[..., None]
    w0 = np.clip(np.asarray(lows, dtype=float), a, b)
    w1 = np.maximum(np.clip(np.asarray(highs, dtype=float), a, b), w0)
    u0, u1 = np.maximum(x - d, a), np.minimum(x, b - d)
    w0, w1, u0, u1 = np.broadcast_arrays(w0, w1, u0, u1)
    k = w0.shape[-1]
    u0, u1 = u0[..., :1], u1[..., :1]
    kinks = np.concatenate([u0, u1] + [np.clip(v, u0, u1) for v in (w0 - d, w1 - d, w0, w1)], -1)
    kinks.sort(axis=-1)
    t, wt = np.polynomial.legendre.leggauss(k // 2 + 1)
    lo, half = kinks[..., :-1, None], np.diff(kinks, axis=-1)[..., None] / 2
    nodes = lo + half * (1.0 + t)  # (..., pieces, nodes)
    g = _uncovered(nodes[..., None], w0[..., None, None, :], w1[..., None, None, :], d)
    area = (half[..., 0] * (g.prod(axis=-1) * wt).sum(axis=-1)).sum(axis=-1)
    width = (u1 - u0)[..., 0]
    at_u0 = _uncovered(u0, w0, w1, d).prod(axis=-1)  # degenerate window (x = a or x = b)
    pos = width > 0
    mean = np.where(pos, area / np.where(pos, width, 1.0), at_u0)
    return mean / (b - a - d) ** k


def rvns_interval_probability(x, low, high, a: float, b: float, d: float) -> np.ndarray:
    """P(report in [low, high] | x) = the integral of p(x, .) over [low, high] (one report, exact).

    Broadcasts over ``x``, ``low`` and ``high``."""
    return rvns_box_probability(x, np.asarray(low, dtype=float)[..., None],
                                np.asarray(high, dtype=float)[..., None], a, b, d)


def rvns_joint_density(x, ys, a: float, b: float, d: float) -> np.ndarray:
    """Joint density p(x, y_1..y_k) of one user's k reports (one shared window).

    p = P_L(the window [L, L + d] misses every y_j) / C^k: the window must contain x, lie in
    [a, b] and sit between the nearest reports around x, so with g_l the largest report <= x and
    g_r the smallest report >= x, p = |[max(u0, g_l), min(u1, g_r - d)]| / (u1 - u0) / C^k.
    It is NOT the product of the marginals (the reports are dependent through the window).
    ``x`` has shape S, ``ys`` shape T + (k,); S and T broadcast.
    """
    x = np.asarray(x, dtype=float)
    ys = np.asarray(ys, dtype=float)
    xe = x[..., None]
    k = ys.shape[-1]
    u0, u1 = np.maximum(x - d, a), np.minimum(x, b - d)
    g_l = np.max(np.where(ys <= xe, ys, -np.inf), axis=-1)
    g_r = np.min(np.where(ys >= xe, ys, np.inf), axis=-1)
    free = np.clip(np.minimum(u1, g_r - d) - np.maximum(u0, g_l), 0.0, None)
    width = u1 - u0
    pos = width > 0
    point = np.all((ys < u0[..., None]) | (ys > u0[..., None] + d), axis=-1)
    frac = np.where(pos, free / np.where(pos, width, 1.0), point.astype(float))
    inside = np.all((ys >= a) & (ys <= b), axis=-1)
    return np.where(inside, frac, 0.0) / (b - a - d) ** k


def rvns_paper_epsilon(d: float, delta: float, k: int = 1) -> float:
    """The paper's Theorem 1: k ln(4d/delta) (not a valid bound in general; see the docs)."""
    return k * math.log(4 * d / delta)


def _check_analysis(a: float, b: float, d: float, delta: float, k: int, centers: str) -> None:
    check_interval(a, b, "a", "b")
    if not 0 < d < b - a:
        raise ParameterError("d", d, f"a window width in (0, b - a = {b - a:g})")
    if isinstance(delta, bool) or not 0 < delta <= b - a:
        raise ParameterError("delta", delta, f"a neighbourhood size in (0, b - a = {b - a:g}]")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ParameterError("k", k, "an integer >= 1")
    check_choice(centers, "centers", _CENTERS)


def rvns_neighbourhood_epsilon(a: float, b: float, d: float, delta: float, k: int = 1, *,
                               centers: str = "domain") -> float:
    """Exact worst-case delta-neighbourhood privacy loss of RVNS over all inputs in [a, b].

    With L the shortest neighbourhood (L = delta for ``centers="domain"``, the paper's convention;
    L = 2 delta for ``centers="interior"``, neighbourhoods [y - delta, y + delta] inside [a, b]),
    capped at b - a:

    * L <= d: ``math.inf`` (x = a never reports in [a, a + d] and that interval holds a whole
      neighbourhood, which every input far from a reaches with positive probability);
    * L > d: k ln(min(L, b - a - d) / (L - d)).

    Proof (docs/rvns_privacy.md): P_x(box) is an average over window positions of
    prod_j (|W_j| - |W_j ∩ window|); each factor lies between |W_j| - d (window inside W_j) and
    |W_j| - max(0, d - gap_j) (window as far from W_j as [a, b] allows), so the ratio of any two
    inputs is at most prod_j of those ratios, which is largest for the shortest neighbourhood at a
    boundary; x = a and x = b have deterministic windows and attain it. The shared window
    therefore costs nothing over k independent reports in the worst case: epsilon_k = k epsilon_1.
    """
    _check_analysis(a, b, d, delta, k, centers)
    span = b - a
    short = min(delta if centers == "domain" else 2 * delta, span)
    if short <= d:
        return math.inf
    return k * math.log(min(short, span - d) / (short - d))


class WorstCase(NamedTuple):
    """A numerical worst case: ``epsilon`` = ln(P_x1(box) / P_x2(box)) for the box of half-width
    delta around the centres ``y`` (one per report); ``math.inf`` when P_x2(box) = 0 < P_x1(box)."""

    epsilon: float
    x1: float
    x2: float
    y: tuple[float, ...]


def _centre_range(a: float, b: float, delta: float, centers: str) -> tuple[float, float]:
    if centers == "domain":
        return a, b
    if 2 * delta >= b - a:
        return (a + b) / 2, (a + b) / 2
    return a + delta, b - delta


def rvns_worst_case(a: float, b: float, d: float, delta: float, k: int = 1, *,
                    inputs: tuple[float, float] | None = None, centers: str = "domain",
                    nx: int | None = None, ny: int | None = None) -> WorstCase:
    """Numerical worst case of the delta-neighbourhood privacy loss (exact probabilities on grids).

    For every box of centres on the y grid, the exact box probabilities
    (:func:`rvns_box_probability`) are computed for every input on the x grid, and the largest
    max_x / min_x ratio is returned with where it occurs. The x grid (``nx`` uniform points over
    ``inputs``, default [a, b]) always contains the kinks a, b, a + d, b - d that fall in it
    (x = a and x = b are the degenerate inputs with a fixed window). For k = 1 the y grid (``ny``
    uniform centres) also contains every x-grid point and the points x ± delta, x ± d ± delta,
    where a neighbourhood's end meets a kink of p(x, .); for k >= 2 it is uniform (``ny`` points
    per report; boxes are symmetric, so only sorted centre tuples are evaluated).

    This is a lower bound on the supremum that is exact whenever the supremum is attained on
    the grids; for the full input domain it reproduces :func:`rvns_neighbourhood_epsilon` (the
    tests check it). ``inputs`` restricts the inputs compared (e.g. (a + d, b - d)). The cost
    grows like C(ny + k - 1, k) boxes times nx inputs: meant for k <= 3 (k = 2 takes ~0.2 s).
    """
    _check_analysis(a, b, d, delta, k, centers)
    xl, xh = (a, b) if inputs is None else (float(inputs[0]), float(inputs[1]))
    if not a <= xl <= xh <= b:
        raise ParameterError("inputs", inputs, f"an interval inside [a, b] = [{a:g}, {b:g}]")
    nx = nx or (201 if k == 1 else 81)
    ny = ny or {1: 401, 2: 41, 3: 17}.get(k, 9)
    xs = np.unique(np.concatenate([np.linspace(xl, xh, nx),
                                   [v for v in (a, b, a + d, b - d) if xl <= v <= xh]]))
    c0, c1 = _centre_range(a, b, delta, centers)
    ys = np.linspace(c0, c1, ny)
    if k == 1:
        offs = np.array([0.0, delta, -delta, d + delta, d - delta, -d + delta, -d - delta])
        ys = np.concatenate([ys, (xs[:, None] + offs).ravel()])
    ys = np.unique(np.clip(ys, c0, c1))
    check_cap("cells", math.comb(ys.size + k - 1, k) * k,
              f"boxes of rvns_worst_case (C(ny + k - 1, k) x k for {ys.size} centres, k = {k})")
    combos = np.array(list(itertools.combinations_with_replacement(range(ys.size), k)))
    best = WorstCase(0.0, float(xs[0]), float(xs[0]), (float(ys[0]),) * k)
    best_ratio = 1.0
    per_box = xs.size * (1 + 4 * k) * (k // 2 + 1) * k
    step = max(1, 2_000_000 // per_box)
    for s in range(0, len(combos), step):
        cy = ys[combos[s:s + step]]  # (boxes, k)
        p = rvns_box_probability(xs[:, None], cy - delta, cy + delta, a, b, d)  # (x, boxes)
        hi_i, lo_i = p.argmax(axis=0), p.argmin(axis=0)
        cols = np.arange(cy.shape[0])
        mx, mn = p[hi_i, cols], p[lo_i, cols]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(mx <= 0, 1.0, np.where(mn <= 0, np.inf, mx / mn))
        j = int(np.argmax(ratio))
        if ratio[j] > best_ratio:
            best_ratio = float(ratio[j])
            best = WorstCase(math.log(best_ratio), float(xs[hi_i[j]]), float(xs[lo_i[j]]),
                             tuple(float(v) for v in cy[j]))
    return best


@functools.lru_cache(maxsize=512)
def _worst_case_cached(a: float, b: float, d: float, delta: float, k: int,
                       inputs: tuple[float, float] | None, centers: str) -> WorstCase:
    return rvns_worst_case(a, b, d, delta, k, inputs=inputs, centers=centers)


def _verdict(exact: float, claim: float) -> str:
    if math.isinf(exact):
        return "is violated (the true worst case is infinite)"
    if math.isclose(exact, claim, rel_tol=1e-9, abs_tol=1e-12):
        return "is exact here (tight)"
    if exact > claim:
        return f"is violated (true {exact:.4g} > claimed {claim:.4g})"
    return "holds here as an upper bound, but is not tight"


@functools.lru_cache(maxsize=512)
def _guarantee_terms(a: float, b: float, d: float, k: int, delta: float) -> tuple:
    exact = rvns_neighbourhood_epsilon(a, b, d, delta, k)
    numeric = _worst_case_cached(a, b, d, delta, 1, None, "domain").epsilon
    eps = max(exact, k * numeric)  # they agree (tests); never report less than either
    claim = rvns_paper_epsilon(d, delta, k)
    span = b - a
    if math.isinf(eps):
        notes = (f"No finite epsilon: with delta = {delta:g} <= d = {d:g}, the input x = lower "
                 f"never reports in [lower, lower + d] (x = upper never in [upper - d, upper]), "
                 f"so an output neighbourhood there has probability 0 for that input and positive "
                 f"probability for inputs far from it; inputs just inside the domain make the "
                 f"ratio unbounded too. A finite epsilon exists only when delta > d, and is then "
                 f"k ln(min(delta, b - a - d)/(delta - d)). The paper's k ln(4d/delta) = "
                 f"{claim:.4g} {_verdict(eps, claim)}.")
        if span > 2 * d:
            inner = _worst_case_cached(a, b, d, delta, 1, (a + d, b - d), "domain").epsilon
            notes += (f" What can be claimed: if every true value lies in [lower + d, upper - d] "
                      f"(declare the domain d wider than the data on each side), one report "
                      f"(k = 1) has worst case epsilon = {inner:.4g} over those inputs "
                      f"(ln(2d/delta) = {math.log(2 * d / delta):.4g} when b - a >= 3d + delta)")
            notes += ("; with k >= 2 the shared window makes even that infinite when "
                      "4 delta <= d (two reports within d on both sides of x rule x out)."
                      if k >= 2 else ".")
    else:
        notes = (f"Exact worst case over all inputs, outputs and all k = {k} report(s) "
                 f"(delta-boxes, one shared window): k ln(min(delta, b - a - d)/(delta - d)) = "
                 f"{eps:.4g} for delta = {delta:g} > d = {d:g}; checked numerically. The paper's "
                 f"k ln(4d/delta) = {claim:.4g} {_verdict(eps, claim)}.")
    # "neighbourhood_delta", never "delta": the guarantee's own delta is its (epsilon, delta)-DP
    # failure probability (0 here)
    params = {"neighbourhood_delta": delta, "neighbourhood": "each report within delta (box), "
              "clipped to [lower, upper]", "finite_if": "delta > d",
              "epsilon_per_report": None if math.isinf(eps) else eps / k,
              "paper_epsilon": claim}
    return eps, notes, claim, tuple(params.items())


def _rvns_guarantee(a: float, b: float, d: float, k: int, delta: float) -> PrivacyGuarantee:
    eps, notes, claim, params = _guarantee_terms(a, b, d, k, delta)
    return PrivacyGuarantee(NEIGHBOURHOOD_LDP, eps, notes=notes,
                            claim=f"k ln(4d/delta) = {claim:.4g}", params=dict(params))
