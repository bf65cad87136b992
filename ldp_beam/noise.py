"""Laplace noise that keeps its promise on a finite computer: the discrete Laplace mechanism on a
fixed lattice, sampled exactly with integer arithmetic (see docs/floating_point.md).

Why not ``numpy.random.Generator.laplace``: the textbook sampler ``x + b * log(U)`` (with a random
sign) runs in floating point, so the set of doubles it can output depends on ``x``. Mironov (2012,
"On significance of the least significant bits for differential privacy") showed that an observer
of one release can often tell which of two neighbouring inputs produced it from the low-order
bits alone, whatever epsilon; Jin et al. (2022) and Haney et al. (2022) extended the attack to
current libraries. Rounding the output afterwards does not repair a sampler whose probabilities
are themselves computed in floating point.

What we do instead, for every central release that adds Laplace noise:

* the statistic is put on an integer lattice first (counts are integers already; real-valued sums
  are summed exactly as integers in units of a public grid, :func:`to_units`), so its sensitivity
  in lattice units is an exact integer;
* the noise is discrete Laplace, P(Z = z) proportional to exp(-|z| / t), with a rational scale
  t = a / b rounded *up* from sensitivity / epsilon (:func:`discrete_laplace_scale`), so the realized
  epsilon = sensitivity / t is at most the one claimed;
* it is sampled by Canonne, Kamath and Steinke's algorithm (NeurIPS 2020, "The discrete Gaussian
  for differential privacy", Algorithms 1 and 2) using only uniform integers and integer
  comparisons: the output distribution is *exactly* the discrete Laplace, so the privacy proof of
  the Laplace mechanism on integers (ratio of neighbouring probabilities <= exp(Delta / t)) holds
  of the code as run, not only of the real-number idealisation.

Everything a release publishes is then ``grid * (integer + integer)``: post-processing of an exact
mechanism. The accuracy cost is negligible: Var = 2q / (1 - q)^2 with q = exp(-1/t) (at most the
continuous 2t^2), plus rounding to a grid of 2^-20 of the bound for real-valued sums.

Timing: the sampler is a rejection sampler, so its running time depends on the noise it draws
(not on the data). Releases here are batch jobs whose timing is not observable per draw.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from .errors import ParameterError

#: the scale t = a / b is rounded up to a denominator b of at most this (relative cost < 2^-20 / t)
MAX_DENOMINATOR = 1 << 20
#: numerators stay below this so that a * K and a * V fit in int64 for the loop counters K, V
#: below (a counter reaching 127 has probability below 1e-200; it is checked, never wrapped)
_NUMERATOR_LIMIT = 1 << 56
_COUNTER_LIMIT = 127
#: candidates proposed per pending draw and round when fewer than _SMALL draws are pending
#: (fewer rounds of small numpy calls; large batches are cheaper without)
OVERSAMPLE = 4
_SMALL = 8192


def discrete_laplace_scale(sensitivity: int | float, epsilon: float,
                           max_denominator: int = MAX_DENOMINATOR) -> Fraction:
    """The scale t = a/b (b <= ``max_denominator``) of discrete Laplace noise for an integer
    statistic of L1 ``sensitivity`` at budget ``epsilon``: the smallest such t >= sensitivity /
    epsilon, computed exactly (``epsilon`` is a binary float, hence an exact rational). The
    realized epsilon, sensitivity / t, is at most ``epsilon``."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating)) \
            or not (math.isfinite(epsilon) and epsilon > 0):
        raise ParameterError("epsilon", epsilon, "a finite number > 0")
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, (int, float, np.integer,
                                                                     np.floating)) \
            or not (math.isfinite(sensitivity) and sensitivity > 0
                    and float(sensitivity) == int(sensitivity)):
        raise ParameterError("sensitivity", sensitivity, "an integer >= 1 (lattice units)")
    exact = Fraction(int(sensitivity)) / Fraction(float(epsilon))
    b = int(max_denominator)
    while True:
        a = -(-exact.numerator * b // exact.denominator)  # ceil(exact * b)
        if a < _NUMERATOR_LIMIT or b == 1:
            break
        b //= 2
    if a >= _NUMERATOR_LIMIT:
        raise ParameterError("epsilon", epsilon,
                             f"at least {int(sensitivity)} / 2^56 (smaller budgets give a "
                             "noise scale beyond the exact sampler's integer range)")
    return Fraction(a, b)


def realized_epsilon(sensitivity: int, scale: Fraction) -> float:
    """The exact privacy loss bound of discrete Laplace noise of ``scale`` on a statistic of
    integer ``sensitivity``: sensitivity / scale (rounded up to the next double)."""
    value = Fraction(int(sensitivity)) / Fraction(scale)
    f = float(value)
    return f if Fraction(f) >= value else math.nextafter(f, math.inf)


def discrete_laplace_cumulants(scale: Any) -> tuple[Any, Any]:
    """(k2, k4), the second and fourth cumulants of discrete Laplace noise of ``scale`` (a
    number, Fraction or array): Z = G1 - G2 with G geometric of ratio q = exp(-1/t), so
    k2 = 2q/(1 - q)^2 and k4 = 2q(1 + 4q + q^2)/(1 - q)^4 (odd cumulants vanish). k2 is below
    the continuous Laplace's 2t^2; both tend to the continuous 2t^2 and 12t^4 as t grows."""
    t = np.asarray(scale, dtype=np.float64)
    one_minus_q = -np.expm1(-1.0 / t)  # accurate for large t
    q = 1.0 - one_minus_q
    k2 = 2.0 * q / one_minus_q ** 2
    k4 = 2.0 * q * (1.0 + 4.0 * q + q * q) / one_minus_q ** 4
    return (float(k2), float(k4)) if t.ndim == 0 else (k2, k4)


def discrete_laplace_variance(scale: Any) -> Any:
    """Var(Z) = 2q / (1 - q)^2 with q = exp(-1/t) (below 2t^2, the continuous variance)."""
    return discrete_laplace_cumulants(scale)[0]


def discrete_laplace_pmf(z: Any, scale: Fraction | float) -> np.ndarray:
    """P(Z = z) = (1 - q)/(1 + q) q^|z| (for tests and audits)."""
    t = float(scale)
    q = math.exp(-1.0 / t)
    return (1.0 - q) / (1.0 + q) * np.exp(-np.abs(np.asarray(z, dtype=np.float64)) / t)


def _bernoulli_exp(gen: np.random.Generator, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exactly Bernoulli(exp(-a/b)) for integers 0 <= a <= b, elementwise (CKS Algorithm 1):
    count K while Bernoulli(gamma / K) succeeds; K is odd with probability exp(-gamma)."""
    k = np.ones(a.shape, dtype=np.int64)
    active = np.flatnonzero(a > 0)
    while active.size:
        kk = k[active]
        if kk.max() >= _COUNTER_LIMIT:  # probability < 1 / 126!
            raise RuntimeError("discrete Laplace sampler: counter limit reached")
        hit = gen.integers(0, b[active] * kk) < a[active]  # Bernoulli(a / (b K)), exactly
        active = active[hit]
        k[active] += 1
    return (k & 1) == 1


def _scale_parts(scales: Any) -> tuple[np.ndarray, np.ndarray]:
    """Numerators and denominators (int64) of an array of rational scales."""
    flat = np.asarray(scales, dtype=object).ravel()
    uniq: dict[Fraction, int] = {}
    index = np.fromiter((uniq.setdefault(Fraction(x), len(uniq)) for x in flat),
                        dtype=np.int64, count=flat.size)
    num = np.array([f.numerator for f in uniq], dtype=np.int64)
    den = np.array([f.denominator for f in uniq], dtype=np.int64)
    if num.size and (num.min() <= 0 or num.max() >= _NUMERATOR_LIMIT):
        raise ParameterError("scale", scales, "rationals a/b with 0 < a < 2^56 "
                             "(use discrete_laplace_scale)")
    return num[index], den[index]


def _geometric_exp1(gen: np.random.Generator, m: int) -> np.ndarray:
    """m draws of V with P(V >= k) = exp(-k): the number of leading successes in a run of
    Bernoulli(exp(-1)) trials, drawn several trials at a time (more for small batches, where
    numpy's per-call cost dominates)."""
    v = np.zeros(m, dtype=np.int64)
    act = np.arange(m)
    while act.size:
        width = 2 if act.size >= _SMALL else 8
        if v[act].max() >= _COUNTER_LIMIT:  # probability < e^-126
            raise RuntimeError("discrete Laplace sampler: counter limit reached")
        one = np.ones(act.size * width, dtype=np.int64)
        hits = _bernoulli_exp(gen, one, one).reshape(act.size, width)
        run = np.where(hits.all(axis=1), width, np.argmin(hits, axis=1))
        v[act] += run
        act = act[run == width]  # every trial succeeded: the run goes on
    return v


def discrete_laplace(gen: np.random.Generator, scale: Fraction | Any, size: Any = None
                     ) -> np.ndarray:
    """Exact draws from the discrete Laplace distribution P(z) ∝ exp(-|z| / t), t = ``scale`` (a
    :class:`~fractions.Fraction` or an array of them, one per draw), by Canonne, Kamath and
    Steinke's Algorithm 2 with integer arithmetic only. Returns int64 of shape ``size`` (or of
    ``scale``'s shape).

    Vectorized: every round proposes ``OVERSAMPLE`` candidates per pending draw and keeps the
    first accepted one (the candidates are i.i.d., so the first accepted has the target law)."""
    if isinstance(scale, (Fraction, int)) or np.ndim(scale) == 0:
        f = Fraction(scale.item() if isinstance(scale, np.ndarray) else scale)
        shape = () if size is None else ((size,) if np.isscalar(size) else tuple(size))
        num, den = _scale_parts([f])
        n = int(np.prod(shape))
        num, den = np.full(n, num[0]), np.full(n, den[0])
    else:
        arr = np.asarray(scale, dtype=object)
        shape = arr.shape if size is None else ((size,) if np.isscalar(size) else tuple(size))
        num, den = _scale_parts(np.broadcast_to(arr, shape))
    out = np.empty(num.size, dtype=np.int64)
    todo = np.arange(num.size)
    while todo.size:
        r = 1 if todo.size >= _SMALL else OVERSAMPLE
        s, d = np.repeat(num[todo], r), np.repeat(den[todo], r)
        u = gen.integers(0, s)  # U uniform on {0, ..., s - 1}
        ok = _bernoulli_exp(gen, u, s)  # keep with probability exp(-U / s)
        v = np.zeros(s.size, dtype=np.int64)
        v[ok] = _geometric_exp1(gen, int(ok.sum()))
        y = (u + s * v) // d  # U + sV ~ Geometric(1 - exp(-1/s)); floor(./d): ratio exp(-d/s)
        neg = gen.integers(0, 2, s.size) == 1
        ok &= ~(neg & (y == 0))  # reject "-0" so that 0 is not counted twice
        ok2 = ok.reshape(-1, r)
        got = ok2.any(axis=1)
        first = np.argmax(ok2, axis=1) + np.arange(todo.size) * r
        pick = first[got]
        out[todo[got]] = np.where(neg[pick], -y[pick], y[pick])
        todo = todo[~got]
    return out.reshape(shape)


def to_units(values: Any, grid: float) -> np.ndarray:
    """Values as int64 multiples of ``grid`` (rounded to nearest): the fixed-point lattice on
    which sums are exact. Rounding is monotone, so |value| <= B gives |units| <= round(B / grid)."""
    v = np.asarray(values, dtype=np.float64)
    return np.rint(v / grid).astype(np.int64)


def lattice_laplace(units: Any, sensitivity: int, epsilon: float | Any,
                    gen: np.random.Generator) -> tuple[np.ndarray, Any]:
    """Release integer statistics ``units`` (any shape) of L1 ``sensitivity`` (lattice units) at
    budget ``epsilon`` (a number, or an array of them matching ``units``): units + Z, Z exactly
    discrete Laplace. Returns (noisy units as int64, the scale(s) used)."""
    u = np.asarray(units, dtype=np.int64)
    eps = np.asarray(epsilon, dtype=np.float64)
    if eps.ndim == 0:
        scale: Any = discrete_laplace_scale(sensitivity, float(eps))
    else:
        uniq, inverse = np.unique(np.broadcast_to(eps, u.shape), return_inverse=True)
        fracs = np.empty(uniq.size, dtype=object)
        fracs[:] = [discrete_laplace_scale(sensitivity, float(e)) for e in uniq]
        scale = fracs[inverse.reshape(u.shape)]
    return u + discrete_laplace(gen, scale, u.shape), scale
