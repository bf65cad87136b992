"""The bundled sample table used by ``ldp-beam demo`` (pipelines/data/survey_sample.parquet).

A synthetic survey of 50,000 people: ``user_id``, ``region`` (4 regions), ``age`` (years,
18-95; about 5% null as if the question were skipped, plus a handful of impossible entries such
as 150 or -2 that a real export would contain), ``privacy_preference`` (each person's eps_u,
Gaussian(5, 1.5) as in the BiSample paper, redrawn below 0.1) and ``income`` (whole thousands; not used
yet). The file is generated once and shipped; regenerate with
``python -m ldp_beam.pipelines.sample_data --out PATH --seed SEED``.
"""
from __future__ import annotations

import argparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REGIONS = ("north", "south", "east", "west")


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
    return pa.table({
        "user_id": pa.array(np.arange(1, n + 1, dtype=np.int32)),
        "region": pa.array([REGIONS[i] for i in region]).dictionary_encode(),
        "age": pa.array(age, mask=np.isnan(age)),
        "privacy_preference": pa.array(np.round(pref, 2).astype(np.float32)),
        "income": pa.array(income.astype(np.int32)),
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
