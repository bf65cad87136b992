"""The RVNS paper's baselines (Section V-A1): noise addition and the square wave.

* :class:`LaplaceNoise` — "Laplace-DP" (ref. [35]): y = x + Laplace(scale (upper - lower)/eps),
  pure eps-LDP on [lower, upper].
* :class:`GeneralizedGaussianNoise` — "Gaussian-pDP" (ref. [36], F. Liu, "Generalized Gaussian
  mechanism for differential privacy", IEEE TKDE 31(4), 2019): y = x + Z with the generalized
  Gaussian density p / (2 sigma Gamma(1/p)) exp(-|z/sigma|^p), p >= 1 (p = 1 Laplace, p = 2 the
  Gaussian with standard deviation sigma / sqrt(2)). For p > 1 the log density ratio of two
  inputs is unbounded on an unbounded output, so there is no pure eps bound: the guarantee is
  (eps, delta)-LDP with delta computed exactly (see :func:`gg_delta`).
* :class:`SquareWave` — the square wave mechanism SW (ref. [22], Li, Wang, Lopuhaa-Zwakenberg,
  Skoric, Li, SIGMOD 2020), eps-LDP; its server side is the EMS reconstruction.

The Flipped Huber mechanism (ref. [37]) is not implemented: its noise density and the calibration
of its parameters to (eps, delta) could not be obtained from its published definition here (see
docs/rvns_baselines.md); we do not invent one.

Every mechanism reads one uniform per record and samples by inverse CDF. Reports (wire form):
``y`` (float64). Noise mechanisms report in the data's units (unbounded); SW reports on its
normalized scale [-b, 1 + b], where 0 stands for ``lower`` and 1 for ``upper``.

Floating point: like every textbook sampler, these draw from 53-bit uniforms, so the released
float is not exactly the ideal continuous distribution (Mironov, CCS 2012, showed that naive
floating-point Laplace noise can leak); the guarantees are those of the ideal mechanisms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..core import (Mechanism, Reasons, Reports, Role, check_choice, check_epsilon,
                    check_interval)
from ..errors import ParameterError
from ..privacy import FLOAT_OUTPUT_NOTE, LDP, PrivacyGuarantee


def _special():
    """scipy.special, imported on first use (most runs never need it)."""
    # lazy: scipy.special costs 0.16 s at import (measured, after this module's imports); only
    # generalized-gaussian noise and the noise KDE's outside-mass need it: laplace-dp and
    # square-wave (build, perturb, the EMS estimate) never do
    from scipy import special

    return special


def _stats():
    """scipy.stats, imported on first use (most runs never need it)."""
    # lazy: scipy.stats costs 0.78 s at import (measured, after this module's imports); only the
    # generalized-gaussian delta and the audits' densities need it: laplace-dp and square-wave
    # (build, perturb) never do
    from scipy import stats

    return stats


#: the density estimators' released indicators (up to the kurtosis) take raw moments of the
#: grid's cells, E[X^4] = (hi^5 - lo^5) / (5 (hi - lo)): the bounds' fifth power must be finite
#: (|lower|, |upper| at most about 2.6e61); RVNS checks the same
DENSITY_MOMENT_POWER = 5
DENSITY_MOMENTS = ("the density estimate's moments up to the kurtosis: x^5 on the grid of "
                   "[lower, upper]")
_HALF_ULP = 2.0 ** -53  # u moves by half its 2^-53 grid step, so 2u moves by 2^-53


# --------------------------------------------------------------------------- noise primitives
def _tails(u: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split uniforms u in [0, 1) into (sign, c, w) with c = P(|Z| <= |z|) and w = 1 - c, the
    two-sided tail probability of the symmetric inverse CDF. u is moved to the middle of its
    2^-53 cell, so w lies in (0, 1] (no infinite noise at u = 0) and the map is symmetric."""
    u = np.asarray(u, dtype=np.float64)
    low = u < 0.5
    sign = np.where(low, -1.0, 1.0)
    c = np.where(low, (1.0 - 2.0 * u) - _HALF_ULP, (2.0 * u - 1.0) + _HALF_ULP)
    w = np.where(low, 2.0 * u + _HALF_ULP, 2.0 * (1.0 - u) - _HALF_ULP)
    return sign, np.clip(c, 0.0, 1.0), np.clip(w, _HALF_ULP, 1.0)


def gg_noise_from_uniform(u: np.ndarray, sigma: float, p: float) -> np.ndarray:
    """Inverse CDF of the generalized Gaussian GG(0, sigma, p) at uniforms u (vectorized).

    |Z / sigma|^p is Gamma(1/p, 1)-distributed, so |z| = sigma * G^-1(c)^(1/p) with c =
    P(|Z| <= |z|) = |2u - 1|; the lower or upper regularized inverse is used, whichever keeps
    full relative precision (near the centre, in the tails)."""
    sign, c, w = _tails(u)
    if p == 1.0:
        t = np.where(c < 0.5, -np.log1p(-c), -np.log(w))
    elif p == 2.0:  # |Z/sigma| has CDF erf: the same inverse, faster
        t = np.where(c < 0.5, _special().erfinv(c), _special().erfcinv(w))
    else:
        a = 1.0 / p
        t = np.where(c < 0.5, _special().gammaincinv(a, c), _special().gammainccinv(a, w))
        t = t ** (1.0 / p)
    return sign * sigma * t


def max_noise(sigma: float, p: float) -> float:
    """The largest |noise| :func:`gg_noise_from_uniform` can return for GG(0, sigma, p): its
    value at the extreme uniform (u = 0, a two-sided tail of 2^-53); about 36.7 sigma for
    Laplace, 6.1 sigma for p = 2."""
    with np.errstate(over="ignore", invalid="ignore"):
        return float(abs(gg_noise_from_uniform(np.zeros(1), float(sigma), float(p))[0]))


def gg_sd(sigma: float, p: float) -> float:
    """Standard deviation of GG(0, sigma, p): sigma * sqrt(Gamma(3/p) / Gamma(1/p))."""
    return sigma * math.exp(0.5 * (math.lgamma(3.0 / p) - math.lgamma(1.0 / p)))


def _loss_root(eps: float, D: float, p: float) -> float:
    """t* with |t* - D|^p - |t*|^p = eps (noise in units of sigma, shift D = sensitivity/sigma):
    the privacy loss ln f(t)/f(t - D) exceeds eps exactly for t < t*. p > 1; -inf if t* is
    below -2^1000 (its tail mass underflows)."""
    def g(t: float) -> float:
        try:
            return abs(t - D) ** p - abs(t) ** p - eps
        except OverflowError:  # only far left of D/2, where g is astronomically positive
            return 1e300

    hi = D / 2.0  # g(D/2) = -eps < 0; g decreases
    k = 0
    lo = hi - 1.0
    while g(lo) <= 0:
        k += 1
        if k > 1000:
            return -math.inf
        lo = hi - 2.0 ** k
    # lazy: scipy.optimize costs 0.35 s at import (measured, after this module's imports); only
    # the generalized-gaussian delta needs it: laplace-dp and square-wave never do
    from scipy.optimize import brentq

    return brentq(g, lo, hi, xtol=1e-15 * max(1.0, abs(lo)), rtol=1e-15, maxiter=500)


def _loss_threshold(eps: float, sensitivity: float, sigma: float, p: float) -> float | None:
    """y* (data units) with loss(y) > eps iff y < y*, for noise centred at 0 against a shift of
    ``sensitivity``; None when the loss never exceeds eps (p = 1 and sensitivity/sigma <= eps)."""
    D = sensitivity / sigma
    if p == 1.0:
        if D <= eps:
            return None
        return sigma * (D - eps) / 2.0  # the loss D - 2t on [0, D], constant +-D outside
    return sigma * _loss_root(eps, D, p)


def gg_delta(epsilon: float, sensitivity: float, sigma: float, p: float) -> float:
    """The exact (eps, delta) of additive GG(0, sigma, p) noise for inputs ``sensitivity`` apart:
    delta = sup_S P(x + Z in S) - e^eps P(x' + Z in S) = F(y*) - e^eps F(y* - sensitivity), the
    hockey-stick divergence (the loss is monotone in y, so the worst S is a half-line). For p = 2
    this is the analytic Gaussian mechanism of Balle & Wang (ICML 2018), Theorem 8."""
    y = _loss_threshold(epsilon, sensitivity, sigma, p)
    if y is None or y == -math.inf:
        return 0.0
    l1 = float(_stats().gennorm.logcdf(y, p, scale=sigma))
    l2 = float(_stats().gennorm.logcdf(y - sensitivity, p, scale=sigma))
    return max(0.0, math.exp(l1) - math.exp(min(epsilon + l2, 700.0)))


def gg_pdp_delta(epsilon: float, sensitivity: float, sigma: float, p: float) -> float:
    """Probabilistic DP (Liu 2019, Definition of (eps, delta)-pDP): P(|privacy loss| > eps) for
    additive GG noise. By symmetry this is F(y*) + F(y* - sensitivity). pDP implies
    (eps, delta)-DP with the same delta; it is a stronger (larger-delta) requirement."""
    y = _loss_threshold(epsilon, sensitivity, sigma, p)
    if y is None or y == -math.inf:
        return 0.0
    return float(_stats().gennorm.cdf(y, p, scale=sigma)
                 + _stats().gennorm.cdf(y - sensitivity, p, scale=sigma))


def gaussian_analytic_delta(epsilon: float, sensitivity: float, sd: float) -> float:
    """Balle & Wang (2018), Theorem 8: delta of the Gaussian mechanism with standard deviation
    ``sd``: Phi(D/(2 sd) - eps sd/D) - e^eps Phi(-D/(2 sd) - eps sd/D)."""
    a, b = sensitivity / (2 * sd), epsilon * sd / sensitivity
    return float(_stats().norm.cdf(a - b) - math.exp(epsilon) * _stats().norm.cdf(-a - b))


def calibrate_gg_sigma(epsilon: float, delta: float, sensitivity: float, p: float,
                       method: str = "exact") -> float:
    """The GG scale sigma for a target (eps, delta).

    * ``exact``: the smallest sigma whose exact delta (:func:`gg_delta`) is <= delta (bisection;
      the returned sigma is on the safe side). For p = 1 and delta = 0: sigma = sensitivity/eps.
    * ``pdp``: the smallest sigma with P(|loss| > eps) <= delta (Liu's probabilistic DP).
    * ``classical``: p = 2 only, eps < 1: sd = sensitivity sqrt(2 ln(1.25/delta)) / eps (Dwork &
      Roth 2014, Theorem A.1), sigma = sqrt(2) sd.
    """
    if method == "classical":
        sd = sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
        return math.sqrt(2.0) * sd
    if delta == 0.0:  # only p = 1 reaches here (validated by the mechanism)
        return sensitivity / epsilon
    fn = gg_delta if method == "exact" else gg_pdp_delta

    def bad(s: float) -> bool:
        return fn(epsilon, sensitivity, s, p) > delta

    hi = sensitivity / epsilon
    if not math.isfinite(hi):
        raise ParameterError("lower, upper", sensitivity,
                             f"bounds whose width (upper - lower = {sensitivity:.4g}) divided "
                             f"by epsilon = {epsilon:g} is below the largest float64",
                             "narrow the bounds or raise epsilon")
    while bad(hi):
        hi *= 2.0
        if not math.isfinite(hi):  # a scale beyond any float: the bounds are too wide
            raise ParameterError("lower, upper", sensitivity,
                                 f"bounds whose width (upper - lower = {sensitivity:.4g}) needs "
                                 f"a noise scale below the largest float64 at epsilon = "
                                 f"{epsilon:g}, delta = {delta:g}",
                                 "narrow the bounds or raise epsilon/delta")
    lo = hi / 2.0
    while not bad(lo):
        hi, lo = lo, lo / 2.0
        if lo < 1e-300:
            return hi
    for _ in range(200):  # keep bad(lo), not bad(hi)
        mid = math.sqrt(lo * hi)
        if bad(mid):
            lo = mid
        else:
            hi = mid
        if hi / lo - 1.0 < 1e-12:
            break
    return hi


# --------------------------------------------------------------------------- the mechanisms
@dataclass(frozen=True)
class _BoundedValue(Mechanism):
    """A value in [lower, upper]; NaN or out-of-domain values are invalid (dead-lettered).

    ``lower`` and ``upper`` are required: they are the domain the noise is calibrated to (the
    sensitivity upper - lower) and no default domain fits arbitrary data."""

    epsilon: float
    lower: float
    upper: float

    family: ClassVar[str] = "rvns"
    roles: ClassVar[tuple[Role, ...]] = (Role("value", help="the number, in [lower, upper]"),)
    report_fields: ClassVar[tuple[tuple[str, str], ...]] = (("y", "float64"),)
    #: density, cdf and grid by grid point, quantiles by probability, scalars
    tidy_cells: ClassVar[tuple[str, ...]] = ("i", "grid_x", "probability")

    def __post_init__(self) -> None:
        check_epsilon(self.epsilon)
        check_interval(self.lower, self.upper)
        check_interval(self.lower, self.upper, power=DENSITY_MOMENT_POWER,
                       computes=DENSITY_MOMENTS)

    def _check_noise_reach(self) -> None:
        """The noisy reports (x + noise) and the estimator's grid (the KDE's default margin of
        8 noise standard deviations beyond the bounds) must stay finite: the largest noise a
        draw can give (:func:`max_noise`) is checked with the bounds."""
        width = float(self.upper) - float(self.lower)
        far = max(max_noise(self.scale, self._p), 8.0 * self.noise_sd)
        check_interval(self.lower, self.upper, reach=far / width,
                       computes=f"noisy reports x + z with |z| up to {far:.4g} (the largest "
                       f"noise a draw gives, or the estimator's margin of 8 noise standard "
                       f"deviations), noise scale {self.scale:.4g}")

    @property
    def sensitivity(self) -> float:
        """The largest distance between two inputs: upper - lower."""
        return float(self.upper - self.lower)

    @property
    def draws(self) -> int:
        return 1

    def validate(self, cols: dict[str, np.ndarray], reasons: Reasons) -> None:
        v = cols["value"]
        reasons.flag(np.isnan(v), "value: missing (null/NaN)")
        reasons.flag(~np.isnan(v) & ~((v >= self.lower) & (v <= self.upper)),
                     lambda i: f"value: {v[i].item()!r} outside [{self.lower:g}, {self.upper:g}]")

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        """x + GG(0, scale, p) noise (the square wave has its own)."""
        return {"y": cols["value"] + gg_noise_from_uniform(u[:, 0], self.scale, self._p)}


@dataclass(frozen=True)
class LaplaceNoise(_BoundedValue):
    """Laplace-DP: y = x + Laplace(0, scale), scale = (upper - lower)/epsilon; pure epsilon-LDP.

    Report: ``y`` (float64, data units, unbounded)."""

    NAME: ClassVar[str] = "laplace-dp"
    _p: ClassVar[float] = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_noise_reach()

    @property
    def scale(self) -> float:
        return self.sensitivity / self.epsilon

    @property
    def noise_sd(self) -> float:
        return math.sqrt(2.0) * self.scale

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            LDP, self.epsilon,
            notes="Laplace mechanism on the identity, sensitivity upper - lower: the output "
                  "density ratio of two inputs is at most exp(|x - x'|/scale) <= e^eps; tight "
                  "for x, x' at the ends of [lower, upper]." + FLOAT_OUTPUT_NOTE,
            params={"scale": self.scale})

    def density(self, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """p(y | x) (broadcasts)."""
        return _stats().laplace.pdf(np.asarray(y, float) - np.asarray(x, float), scale=self.scale)


@dataclass(frozen=True)
class GeneralizedGaussianNoise(_BoundedValue):
    """Gaussian-pDP / the generalized Gaussian mechanism: y = x + Z, Z ~ GG(0, sigma, p) with
    density p/(2 sigma Gamma(1/p)) exp(-|z/sigma|^p).

    Parameters: ``p`` >= 1 (2: Gaussian, 1: Laplace). Either give ``sigma`` (the GG scale; for
    p = 2 the standard deviation is sigma/sqrt(2)) or let it be calibrated from (``epsilon``,
    ``delta``) by ``calibration`` ('exact': smallest sigma whose exact delta is <= delta;
    'pdp': Liu's probabilistic DP, P(|loss| > eps) <= delta; 'classical': p = 2 and eps < 1 only,
    the Dwork-Roth bound). delta = 0 is possible only for p = 1 (sigma = (upper - lower)/eps).
    With ``sigma`` given, ``delta`` may be None (the guarantee then states the exact delta of
    that sigma) or a bound the given sigma must meet.

    Guarantee: (epsilon, delta)-LDP on [lower, upper]. Report: ``y`` (float64, data units).
    """

    NAME: ClassVar[str] = "generalized-gaussian"
    CALIBRATIONS: ClassVar[tuple[str, ...]] = ("exact", "pdp", "classical")

    p: float = 2.0
    delta: float | None = 1e-5
    sigma: float | None = None
    calibration: str = "exact"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.p, bool) or not isinstance(self.p, (int, float, np.floating)) \
                or not (1.0 <= self.p <= 100.0):
            raise ParameterError("p", self.p, "a number in [1, 100] (1: Laplace, 2: Gaussian)")
        check_choice(self.calibration, "calibration", self.CALIBRATIONS)
        if self.delta is not None:
            if isinstance(self.delta, bool) or not isinstance(self.delta, (int, float)) \
                    or not (0.0 <= self.delta < 1.0):
                raise ParameterError("delta", self.delta, "a number in [0, 1)")
            if self.delta == 0.0 and self.p != 1.0:
                raise ParameterError("delta", self.delta, "a number in (0, 1) when p > 1",
                                     "for p > 1 no pure epsilon bound exists on an unbounded "
                                     "output; use p = 1 for pure epsilon-LDP")
        if self.sigma is not None:
            if isinstance(self.sigma, bool) or not isinstance(self.sigma, (int, float)) \
                    or not (math.isfinite(self.sigma) and self.sigma > 0):
                raise ParameterError("sigma", self.sigma, "a finite number > 0 (or None)")
            scale = float(self.sigma)
            if self.delta is not None:
                need = gg_delta(self.epsilon, self.sensitivity, scale, float(self.p))
                if need > self.delta:
                    raise ParameterError(
                        "sigma", self.sigma, f"a scale whose exact delta at epsilon = "
                        f"{self.epsilon:g} is <= delta = {self.delta:g} (it is {need:.3g}); "
                        "raise sigma, or set delta=None to report the delta it gives")
        else:
            if self.delta is None:
                raise ParameterError("delta", None, "a number in [0, 1) when sigma is None",
                                     "give sigma, or (epsilon, delta) to calibrate it")
            if self.calibration == "classical":
                if self.p != 2.0:
                    raise ParameterError("calibration", "classical", "'exact' or 'pdp' when "
                                         f"p = {self.p!r} (the classical bound is for p = 2)")
                if not self.epsilon < 1.0:
                    raise ParameterError("epsilon", self.epsilon, "a number in (0, 1) for "
                                         "calibration='classical' (Dwork-Roth Theorem A.1)")
                if self.delta == 0.0:
                    raise ParameterError("delta", 0.0, "a number in (0, 1)")
            scale = calibrate_gg_sigma(self.epsilon, float(self.delta), self.sensitivity,
                                       float(self.p), self.calibration)
        object.__setattr__(self, "_scale", scale)
        self._check_noise_reach()

    @property
    def _p(self) -> float:
        return float(self.p)

    @property
    def scale(self) -> float:
        """The GG scale sigma in use (given or calibrated)."""
        return self._scale  # type: ignore[attr-defined]

    @property
    def noise_sd(self) -> float:
        return gg_sd(self.scale, float(self.p))

    @property
    def exact_delta(self) -> float:
        """The smallest delta for which the mechanism is (epsilon, delta)-LDP."""
        return gg_delta(self.epsilon, self.sensitivity, self.scale, float(self.p))

    @property
    def guarantee(self) -> PrivacyGuarantee:
        exact = self.exact_delta
        pdp = gg_pdp_delta(self.epsilon, self.sensitivity, self.scale, float(self.p))
        delta = exact if self.delta is None else float(self.delta)
        claim = ""
        if self.calibration == "pdp" and self.sigma is None:
            claim = (f"({self.epsilon:g}, {self.delta:g})-probabilistic DP (Liu 2019): "
                     "P(|privacy loss| > eps) <= delta")
        notes = ("additive GG(0, sigma, p) noise, sensitivity upper - lower; delta is the exact "
                 "hockey-stick divergence at the largest input distance (for log-concave noise "
                 "it grows with the distance)")
        if self.p == 1.0 and exact == 0.0:
            notes += "; p = 1 (Laplace) with sigma >= (upper - lower)/eps: pure epsilon-LDP"
        elif self.p > 1.0:
            notes += "; p > 1: no pure epsilon bound exists (unbounded log density ratio)"
        if self.p == 2.0:
            notes += "; for p = 2 this is the analytic Gaussian mechanism (Balle & Wang 2018)"
        notes += "." + FLOAT_OUTPUT_NOTE
        return PrivacyGuarantee(LDP, self.epsilon, min(delta, 1.0), notes=notes, claim=claim,
                                params={"sigma": self.scale, "p": float(self.p),
                                        "exact_delta": exact, "pdp_delta": pdp,
                                        "calibration": self.calibration if self.sigma is None
                                        else "sigma given"})

    def density(self, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """p(y | x) (broadcasts)."""
        return _stats().gennorm.pdf(np.asarray(y, float) - np.asarray(x, float), float(self.p),
                                 scale=self.scale)


def _sw_num_den(eps: float) -> tuple[float, float]:
    """eps e^eps - e^eps + 1 and e^eps - 1 - eps, by their series for small eps (both are
    O(eps^2) and cancel catastrophically in floating point)."""
    if eps < 0.1:
        num = sum(eps ** k * (k - 1) / math.factorial(k) for k in range(2, 24))
        den = sum(eps ** k / math.factorial(k) for k in range(2, 24))
        return num, den
    e = math.exp(eps)
    return eps * e - math.expm1(eps), math.expm1(eps) - eps


def square_wave_b(epsilon: float) -> float:
    """Half-width of the square wave (Li et al. 2020):
    b = (eps e^eps - e^eps + 1) / (2 e^eps (e^eps - 1 - eps)); b -> 1/2 as eps -> 0."""
    num, den = _sw_num_den(epsilon)
    return num / (2.0 * math.exp(epsilon) * den)


@dataclass(frozen=True)
class SquareWave(_BoundedValue):
    """The square wave mechanism SW (Li et al., SIGMOD 2020), epsilon-LDP.

    The value is normalized to v = (x - lower)/(upper - lower) in [0, 1]; the report is uniform on
    [v - b, v + b] with density p = e^eps/(2 b e^eps + 1) and uniform on the rest of [-b, 1 + b]
    with density q = 1/(2 b e^eps + 1). p/q = e^eps. One uniform per record (inverse CDF).

    Report: ``y`` (float64, normalized scale [-b, 1 + b]; 0 is ``lower``, 1 is ``upper``).
    """

    NAME: ClassVar[str] = "square-wave"
    #: Here the wave's half-width b is ~2e-13 of the domain; beyond it the EMS transition matrix
    #: loses float precision (checked: sane up to 35, garbage at 40).
    MAX_EPSILON: ClassVar[float] = 32.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.epsilon > self.MAX_EPSILON:
            raise ParameterError("epsilon", self.epsilon, f"a number in (0, {self.MAX_EPSILON:g}]",
                                 "beyond it the square wave is narrower than 2e-13 of the domain "
                                 "and EMS loses float precision")
        check_interval(self.lower, self.upper, reach=self.b,
                       computes=f"the report scale [-b, 1 + b], b = {self.b:.4g}, mapped to "
                       "data units: lower + y (upper - lower)")

    @property
    def b(self) -> float:
        return square_wave_b(self.epsilon)

    @property
    def p(self) -> float:
        e = math.exp(self.epsilon)
        return e / (2.0 * self.b * e + 1.0)

    @property
    def q(self) -> float:
        return 1.0 / (2.0 * self.b * math.exp(self.epsilon) + 1.0)

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            LDP, self.epsilon,
            notes="the output density is p or q = p e^-eps everywhere on [-b, 1 + b], for every "
                  "input: ratio <= e^eps, tight." + FLOAT_OUTPUT_NOTE, params={"b": self.b, "p": self.p, "q": self.q})

    def normalize(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, float) - self.lower) / (self.upper - self.lower)

    def randomize(self, cols: dict[str, np.ndarray], u: np.ndarray) -> Reports:
        v = np.clip(self.normalize(cols["value"]), 0.0, 1.0)
        b, p, q = self.b, self.p, self.q
        uu = u[:, 0]
        left = q * v  # mass of [-b, v - b)
        centre = left + 2.0 * b * p  # ... plus the mass of [v - b, v + b]
        y = np.where(uu < left, -b + uu / q,
                     np.where(uu < centre, v - b + (uu - left) / p, v + b + (uu - centre) / q))
        return {"y": np.clip(y, -b, 1.0 + b)}  # rounding only

    def density(self, y: np.ndarray, x: np.ndarray) -> np.ndarray:
        """p(y | x) for y on the normalized report scale and x in data units (broadcasts)."""
        y = np.asarray(y, float)
        v = self.normalize(x)
        inside = np.abs(y - v) <= self.b
        dens = np.where(inside, self.p, self.q)
        return np.where((y >= -self.b) & (y <= 1.0 + self.b), dens, 0.0)

    def cdf(self, y: np.ndarray, x: float) -> np.ndarray:
        """P(report <= y | x), y on the normalized scale (for goodness-of-fit tests)."""
        y = np.clip(np.asarray(y, float), -self.b, 1.0 + self.b)
        v = float(self.normalize(x))
        b, p, q = self.b, self.p, self.q
        inside = np.clip(y, v - b, v + b) - (v - b)
        return q * (y + b) + (p - q) * inside


__all__ = ["LaplaceNoise", "GeneralizedGaussianNoise", "SquareWave", "square_wave_b",
           "gg_noise_from_uniform", "max_noise", "gg_sd", "gg_delta", "gg_pdp_delta",
           "gaussian_analytic_delta", "calibrate_gg_sigma"]
