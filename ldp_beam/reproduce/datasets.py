"""Datasets of the BiSample paper's experiments (Section 5, Table 2), all on the scale [-1, 1].

Every generator takes a numpy ``Generator``; there is no default seed here (a recipe draws one
and records it). How each dataset is put on [-1, 1], and why (the paper only says "regularize"):

* **GAUSS**: N(0.5, 0.1^2) values used as they are, clipped to [-1, 1] (the clip changes nothing
  in practice: 1 is five standard deviations away). Mean 0.500 +- 0.0003 for n = 10^5; Table 2
  says 0.499. A min-max rescaling would give a mean near 0, so the paper cannot have used one.
* **EXP**: Exp(scale 0.1) values min-max rescaled *by the sample* to [-1, 1],
  ``2 (v - min) / (max - min) - 1``. The sample maximum of 10^5 draws is about
  0.1 (ln 10^5 + 0.577) = 1.21, so the mean is about 2 * 0.1 / 1.21 - 1 = -0.835; over 2,000
  simulated samples the median was -0.8314 (95% range -0.866 .. -0.803), matching Table 2's
  -0.831. Clipping to [0, 1] and mapping 2v - 1 instead would give -0.800, outside that range.
* **UNIFORM**: U(-1, 1). Mean 0 +- 0.0018; Table 2 says -0.001.
* **ADULT**: column ``age`` of UCI Adult (``uci_adult/adult.data``, 32,561 rows) mapped by its
  min and max (17 .. 90): ``2 (age - 17) / 73 - 1``. Mean -0.40872; Table 2 says -0.409.
  When the file is absent, :func:`synthetic_age` stands in (same size, range and moments).
* **Preferences** eps_u ~ N(5, 1.5^2) (Section 5.2).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .recipe import data_file

#: Table 2 of the paper: dataset -> (number of instances, mean value).
PAPER_TABLE2: dict[str, tuple[int, float]] = {
    "EXP": (100_000, -0.831),
    "GAUSS": (100_000, 0.499),
    "UNIFORM": (100_000, -0.001),
    "ADULT": (32_561, -0.409),
}

ADULT_FILE = os.path.join("uci_adult", "adult.data")
ADULT_ROWS = 32_561
AGE_MIN, AGE_MAX = 17.0, 90.0
# Moments of the real Adult ages (shared/data/README.md): mean 38.5816, std 13.6404.
AGE_MEAN, AGE_STD = 38.5816, 13.6404


@dataclass(frozen=True)
class Dataset:
    """Values on [-1, 1] and where they came from (``source`` says whether it is the real file)."""

    name: str
    values: np.ndarray
    source: str

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    @property
    def mean(self) -> float:
        return float(self.values.mean())


def _check_n(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n = {n!r} is invalid: expected an integer >= 2")
    return int(n)


def minmax_to_unit(v: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Map ``v`` linearly onto [-1, 1] by ``lo``/``hi`` (default: the sample min/max)."""
    v = np.asarray(v, dtype=np.float64)
    lo = float(v.min()) if lo is None else float(lo)
    hi = float(v.max()) if hi is None else float(hi)
    if not hi > lo:
        raise ValueError(f"cannot rescale: max {hi!r} <= min {lo!r}")
    return np.clip(2.0 * (v - lo) / (hi - lo) - 1.0, -1.0, 1.0)


def gauss(n: int, rng: np.random.Generator, mu: float = 0.5, sigma: float = 0.1) -> np.ndarray:
    """GAUSS: N(mu, sigma^2) used as is, clipped to [-1, 1]."""
    return np.clip(rng.normal(mu, sigma, _check_n(n)), -1.0, 1.0)


def exp(n: int, rng: np.random.Generator, scale: float = 0.1) -> np.ndarray:
    """EXP: Exp(scale) min-max rescaled by the sample to [-1, 1] (mean about -0.83 for 10^5)."""
    return minmax_to_unit(rng.exponential(scale, _check_n(n)))


def uniform(n: int, rng: np.random.Generator) -> np.ndarray:
    """UNIFORM: U(-1, 1)."""
    return rng.uniform(-1.0, 1.0, _check_n(n))


def synthetic_age(n: int, rng: np.random.Generator) -> np.ndarray:
    """Integer ages in [17, 90] shaped like Adult's: 17 + Gamma with Adult's mean and std,
    rounded and capped at 90 (raw ages, not rescaled)."""
    n = _check_n(n)
    excess_mean, var = AGE_MEAN - AGE_MIN, AGE_STD ** 2
    shape, scale = excess_mean ** 2 / var, var / excess_mean
    return np.minimum(np.rint(AGE_MIN + rng.gamma(shape, scale, n)), AGE_MAX)


def load_adult_age(data_dir: str | os.PathLike | None) -> np.ndarray | None:
    """The raw ``age`` column of ``<data_dir>/uci_adult/adult.data``, or None if the file is absent.

    Parsing is vectorized (numpy reads the first comma-separated field of every line).
    """
    path = data_file(data_dir, ADULT_FILE)
    if path is None:
        return None
    ages = np.loadtxt(path, delimiter=",", usecols=0, dtype=np.float64, ndmin=1,
                      comments=None)
    if ages.size == 0 or np.isnan(ages).any():
        raise ValueError(f"{path}: could not read an 'age' column of numbers")
    return ages


def adult(data_dir: str | os.PathLike | None, rng: np.random.Generator) -> Dataset:
    """ADULT ages mapped by 17..90 to [-1, 1]; a synthetic stand-in when the file is absent."""
    ages = load_adult_age(data_dir)
    if ages is None:
        return Dataset("ADULT", minmax_to_unit(synthetic_age(ADULT_ROWS, rng), AGE_MIN, AGE_MAX),
                       "synthetic (uci_adult/adult.data not found)")
    return Dataset("ADULT", minmax_to_unit(ages, AGE_MIN, AGE_MAX),
                   f"file {os.path.join(os.fspath(data_dir), ADULT_FILE)}")


SYNTHETIC = {"EXP": exp, "GAUSS": gauss, "UNIFORM": uniform}


def dataset(name: str, n: int, rng: np.random.Generator,
            data_dir: str | os.PathLike | None = None) -> Dataset:
    """One of EXP, GAUSS, UNIFORM (``n`` users) or ADULT (its own size, ``n`` ignored)."""
    key = name.upper()
    if key == "ADULT":
        return adult(data_dir, rng)
    if key not in SYNTHETIC:
        raise ValueError(f"dataset = {name!r} is invalid: expected one of "
                         f"{sorted([*SYNTHETIC, 'ADULT'])}")
    return Dataset(key, SYNTHETIC[key](n, rng), "synthetic")


def preferences(n: int, rng: np.random.Generator, mu: float = 5.0,
                sigma: float = 1.5) -> np.ndarray:
    """Privacy preferences eps_u ~ N(mu, sigma^2) (Section 5.2), raw (may be <= 0, rarely)."""
    return rng.normal(mu, sigma, _check_n(n))


def answer_rate(prefs: np.ndarray, epsilon: float) -> float:
    """Share of users who give their real value at budget ``epsilon`` (eps_u >= eps, Alg. 3)."""
    return float(np.mean(np.asarray(prefs) >= epsilon))


def chi2_truncated(df: float, n: int, rng: np.random.Generator, upper: float = 10.0
                   ) -> np.ndarray:
    """n draws of chi-squared(df) conditioned on <= upper (the RVNS paper's synthetic data):
    values above are redrawn, never clipped."""
    parts, have = [], 0
    while have < n:
        x = rng.chisquare(df, 2 * (n - have) + 100)
        x = x[x <= upper]
        parts.append(x)
        have += x.size
    return np.concatenate(parts)[:n]
