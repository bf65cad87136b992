"""The bundled sample table used by ``ldp-beam demo`` (pipelines/data/survey_sample.parquet).

A synthetic survey of 50,000 people: ``user_id``, ``region`` (4 regions), ``age`` (years,
18-95; about 5% null as if the question were skipped, plus a handful of impossible entries such
as 150 or -2 that a real export would contain), ``privacy_preference`` (each person's eps_u,
Gaussian(5, 1.5) as in the BiSample paper, redrawn below 0.1), ``income`` (whole thousands),
and two categorical answers that depend on age and on each other: ``employment`` (employed,
self-employed, unemployed, retired) and ``health`` (excellent, good, fair, poor), each with a few
unusable entries (null, or a label outside the questionnaire's), and ``income_sensitivity``, how
sensitive each person considers their income (0: not at all, else in (0, 1]; high earners more
often and more strongly). The file is generated once and
shipped; it was made with ``python -m ldp_beam.pipelines.sample_data --out PATH --seed 20261121``.
"""
from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REGIONS = ("north", "south", "east", "west")
EMPLOYMENT = ("employed", "self-employed", "unemployed", "retired")
HEALTH = ("excellent", "good", "fair", "poor")
# P(employment | age < 65), P(employment | age >= 65) and P(health | employment)
_EMP = np.array([[0.70, 0.15, 0.12, 0.03], [0.10, 0.08, 0.02, 0.80]])
_HEALTH = np.array([[0.30, 0.45, 0.18, 0.07], [0.28, 0.45, 0.20, 0.07],
                    [0.12, 0.38, 0.32, 0.18], [0.10, 0.35, 0.35, 0.20]])


def _draw(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One categorical draw per row of ``probs`` (rows sum to one)."""
    u = rng.random(probs.shape[0])
    return np.minimum((u[:, None] >= np.cumsum(probs, axis=1)).sum(axis=1), probs.shape[1] - 1)


def make_survey(n: int, rng: np.random.Generator) -> pa.Table:
    region = rng.integers(0, len(REGIONS), n)
    centre = np.array([38.0, 45.0, 41.0, 52.0])[region]
    age = np.clip(np.round(rng.gamma(9.0, centre / 9.0)), 18, 95)
    skipped = rng.random(n) < 0.05
    age = np.where(skipped, np.nan, age)
    bad = rng.choice(n, size=6, replace=False)
    age[bad] = [150, -2, 240, 130, -7, 999]
    pref = rng.normal(5.0, 1.5, n)
    while (low := pref < 0.1).any():
        pref[low] = rng.normal(5.0, 1.5, int(low.sum()))
    income = np.round(rng.lognormal(3.6, 0.6, n))
    # drawn after the columns above, so those stay as they were before these were added
    age_true = np.clip(np.round(rng.gamma(9.0, centre / 9.0)), 18, 95)
    emp = _draw(rng, _EMP[(age_true >= 65).astype(int)])
    health = _draw(rng, _HEALTH[emp])
    employment = np.array(EMPLOYMENT, dtype=object)[emp]
    health_l = np.array(HEALTH, dtype=object)[health]
    odd = rng.choice(n, size=5, replace=False)
    employment[odd[:2]] = [None, "student"]
    health_l[odd[2:]] = [None, "n/a", "very good"]
    # drawn after every column above: P(sensitive) and the level grow with income
    p_sens = np.clip(0.15 + 0.6 * income / 150.0, 0.0, 0.9)
    sensitive = rng.random(n) < p_sens
    level = np.where(sensitive, np.clip(rng.beta(2.0, 2.0, n) + income / 500.0, 0.001, 1.0), 0.0)
    return pa.table({
        "user_id": pa.array(np.arange(1, n + 1, dtype=np.int32)),
        "region": pa.array([REGIONS[i] for i in region]).dictionary_encode(),
        "age": pa.array(age, mask=np.isnan(age)),
        "privacy_preference": pa.array(np.round(pref, 2).astype(np.float32)),
        "income": pa.array(income.astype(np.int32)),
        "employment": pa.array(employment, type=pa.string()),
        "health": pa.array(health_l, type=pa.string()),
        "income_sensitivity": pa.array(np.round(level, 3).astype(np.float32)),
    })


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--seed", type=int, required=True, help="the dataset's seed (not a noise seed)")
    a = ap.parse_args(argv)
    pq.write_table(make_survey(a.rows, np.random.default_rng(a.seed)), a.out, compression="zstd")


if __name__ == "__main__":
    main()
