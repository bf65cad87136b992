"""The RVNS paper's Section V recipe: record schema, figures, methods, claim rules, and two
theory checks of the privacy metric (Eq. 16) whose tolerances come from sampling distributions.

The quick recipe runs once, into a temporary folder, with a data folder that does not exist (so
the real datasets fall back to their synthetic stand-ins) and a fixed seed.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from ldp_beam.pipelines.records import make_record, select
from ldp_beam.reproduce import rvns_recipe as recipe
from ldp_beam_test_helpers import check_records, run_quick_recipe

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
if not os.path.isdir(SHARED_DATA):
    SHARED_DATA = "/work/shared/data"

SEED = 20240521
DATASETS = {"chi2(2)", "chi2(5)", "AdultAge", "StudentsMath"}
FIGURES = {"rvns_fig2.png", "rvns_fig3.png", "rvns_fig4.png", "rvns_fig5.png"}
VERDICTS = {"reproduced", "differs", "not reproducible"}
Z = 5.0  # tolerance in standard errors (about 30 cells are checked)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return run_quick_recipe(recipe, tmp_path_factory, "rvns", SEED)


def test_record_schema(quick_run):
    records, out, lines = quick_run
    check_records(records, out, "rvns", SEED)
    for r in records:
        assert r["experiment"] == recipe.EXPERIMENT
        assert r["metric"] in recipe.METRICS, r
        assert r["method"] in recipe.METHODS, r
        for k in ("setting", "reps", "n", "m", "lower", "upper", "source", "se"):
            assert k in r, (k, r)
        assert r["value"] is not None and r["value"] >= 0, r
    assert any("[rvns]" in line for line in lines)
    # one record per (dataset, method, setting, metric)
    keys = [(r["dataset"], r["method"], r["setting"], r["metric"]) for r in records]
    assert len(keys) == len(set(keys))


def test_every_dataset_and_method(quick_run):
    records, _, _ = quick_run
    assert {r["dataset"] for r in records} == DATASETS
    for name in DATASETS:
        rs = select(records, dataset=name)
        assert rs[0]["source"].startswith("synthetic"), rs[0]["source"]
        assert {r["m"] for r in rs} == {100}  # quick: m = 100 everywhere
        methods = {r["method"] for r in rs}
        assert set(recipe.BASELINES) | {"RVNS-EM"} <= methods, (name, methods)
    assert {r["method"] for r in records} == set(recipe.METHODS)  # RVNS-paper on chi2(2)
    paper = select(records, method="RVNS-paper", metric="seconds")
    assert paper and all(r["value"] > 0 for r in paper)
    # the paper's reconstruction saw the same reports as EM: same privacy metric
    for r in select(records, method="RVNS-paper", metric="privacy"):
        em = select(records, dataset=r["dataset"], method="RVNS-EM", setting=r["setting"],
                    metric="privacy")[0]
        if r["reps"] == em["reps"]:
            assert r["value"] == em["value"]


def test_rvns_privacy_fields(quick_run):
    """RVNS records carry our epsilon (None: infinite, as delta = (b - a)/100 < d) and the
    paper's k ln(4d/delta); the wide neighbourhood has the closed form of docs/rvns_privacy.md."""
    records, _, _ = quick_run
    rs = select(records, method=["RVNS-EM", "RVNS-paper"])
    assert rs
    for r in rs:
        for k in ("k", "d", "neighbourhood_delta", "epsilon_honest", "epsilon_paper",
                  "neighbourhood_delta_wide", "epsilon_honest_wide", "epsilon_paper_wide"):
            assert k in r, (k, r)
        span = r["upper"] - r["lower"]
        delta = r["neighbourhood_delta"]
        assert delta == pytest.approx(span / 100)
        assert r["d"] > delta and r["epsilon_honest"] is None and r["epsilon"] is None
        assert r["epsilon_paper"] == pytest.approx(r["k"] * math.log(4 * r["d"] / delta))
        wide = r["neighbourhood_delta_wide"]
        assert wide == pytest.approx(min(2 * r["d"], span))
        assert r["epsilon_honest_wide"] == pytest.approx(
            r["k"] * math.log(min(wide, span - r["d"]) / (wide - r["d"])))
        assert r["epsilon_paper_wide"] == pytest.approx(r["k"] * math.log(4 * r["d"] / wide))
    for r in select(records, method=list(recipe.BASELINES)):
        assert isinstance(r["epsilon"], float) and r["setting"] == f"eps={r['epsilon']:g}"


def test_figures_and_claims_written(quick_run):
    records, out, _ = quick_run
    written = {p for p in os.listdir(out) if p.endswith(".png")}
    assert FIGURES <= written
    for name in FIGURES:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 400_000
    cl = json.load(open(out / "rvns_claims.json"))
    assert len(cl) == len(recipe.claims(records)) == 7
    for c in cl:
        assert c["verdict"] in VERDICTS and c["value"] == c["verdict"] and c["evidence"]
    privacy = [c for c in cl if c["variant"] == "privacy"][0]
    assert privacy["verdict"] == "differs"  # delta < d everywhere: no finite epsilon
    assert (out / "rvns_summary.txt").read_text().count("| RVNS-EM |") >= 4


def test_clipped_privacy_metric(quick_run):
    """Projecting a guess onto [a, b], where the true value lies, never moves it away from the
    truth, so the clipped Eq. 16 is at most the raw one; RVNS's guesses are already in [a, b]."""
    records, _, _ = quick_run
    for r in select(records, metric="privacy"):
        c = select(records, dataset=r["dataset"], method=r["method"], setting=r["setting"],
                   metric="privacy_clipped")[0]
        if r["method"] in recipe.RVNS_METHODS:
            assert c["value"] == r["value"]
        else:
            assert c["value"] <= r["value"] * (1 + 1e-12)
    # Laplace at eps = 1 on [0, 10]: most noisy values leave the domain, so clipping matters
    lap = select(records, dataset="chi2(2)", method="Laplace-DP", setting="eps=1")
    by = {r["metric"]: r["value"] for r in lap}
    assert by["privacy_clipped"] < 0.5 * by["privacy"]
    clipped = [c for c in recipe.claims(records) if "clipped" in c["variant"]]
    assert len(clipped) == 2 and all(c["verdict"] in VERDICTS for c in clipped)


def test_noise_privacy_metric_matches_theory(quick_run):
    """For noise-adding baselines Eq. 16 is sqrt(sum z_i^2) of the noise itself, so
    dis / sqrt(n) estimates the noise standard deviation. Tolerance: dis^2/n is a mean of n
    i.i.d. z^2 with Var(z^2) = K sd^4 (K = 5 Laplace, 2 Gaussian), so the relative sd of dis/sqrt(n)
    is about sqrt(K/n)/2, divided by sqrt(reps) for the average."""
    records, _, _ = quick_run
    checked = 0
    for method, K in (("Laplace-DP", 5.0), ("Gaussian-pDP", 2.0)):
        for r in select(records, method=method, metric="privacy"):
            rel_sd = 0.5 * math.sqrt(K / r["n"]) / math.sqrt(r["reps"])
            assert r["rmse"] / r["noise_sd"] == pytest.approx(1.0, abs=Z * rel_sd), r
            checked += 1
    assert checked >= 30


def test_square_wave_privacy_metric_matches_theory(quick_run):
    """EMS's privacy metric uses the square-wave report mapped back to data units, a + y (b - a).
    With t = y - v: E[t^2 | v] = p 2b^3/3 + q (((b + v)^3 - b^3) + ((1 + b - v)^3 - b^3))/3,
    and the fourth moment likewise, which bounds the sampling error of the mean over users."""
    records, _, _ = quick_run
    cfg = recipe.QUICK
    from ldp_beam.mechanisms.continuous_baselines import SquareWave

    checked = 0
    for name in DATASETS:
        data = recipe.rvns_dataset(name, cfg, recipe._rng(SEED, "data", name),
                                   "/no-such-data-dir")
        truth_mean = select(records, dataset=name, method="EMS", metric="AE(mean)")[0]
        assert truth_mean["true_value"] == pytest.approx(data.values.mean(), rel=1e-12)
        v = (data.values - data.lower) / (data.upper - data.lower)
        for r in select(records, dataset=name, method="EMS", metric="privacy"):
            mech = SquareWave(epsilon=r["epsilon"], lower=data.lower, upper=data.upper)
            b, p, q = mech.b, mech.p, mech.q

            def moment(j: int) -> np.ndarray:
                inside = p * 2 * b ** (j + 1) / (j + 1)
                outside = q * (((b + v) ** (j + 1) - b ** (j + 1))
                               + ((1 + b - v) ** (j + 1) - b ** (j + 1))) / (j + 1)
                return inside + outside

            e2, e4 = moment(2), moment(4)
            expected = math.sqrt(e2.mean()) * (data.upper - data.lower)
            rel_sd = 0.5 * math.sqrt(np.mean(e4 - e2 ** 2) / data.n) / e2.mean() \
                / math.sqrt(r["reps"])
            assert r["rmse"] / expected == pytest.approx(1.0, abs=Z * rel_sd + 1e-9), r
            checked += 1
    assert checked == len(DATASETS) * len(cfg.sw_eps)


# --------------------------------------------------------------------------- the claim rules
def _cell(dataset, method, setting, P, W, k=None, d=None, eps=None, ae=0.1):
    common = dict(setting=setting, reps=3, n=100, m=10, lower=0.0, upper=1.0, source="test",
                  se=0.0, k=k, d=d)
    out = [make_record(recipe.EXPERIMENT, dataset, method, eps, "privacy", P, **common),
           make_record(recipe.EXPERIMENT, dataset, method, eps, "wasserstein", W, **common)]
    out += [make_record(recipe.EXPERIMENT, dataset, method, eps, f"AE({i})", ae, **common)
            for i in recipe.INDICATORS]
    return out


def _toy(rvns_w: float) -> list[dict]:
    recs = []
    for j, eps in enumerate((1.0, 2.0, 4.0, 8.0)):
        P = 8.0 / eps  # privacy falls as eps grows; utility improves
        for b, scale in (("Laplace-DP", 1.0), ("Gaussian-pDP", 2.0), ("EMS", 0.5)):
            recs += _cell("toy", b, f"eps={eps:g}", P * (1 + 0.01 * j), scale / eps, eps=eps)
    recs += _cell("toy", "RVNS-EM", "k=1,d=0.5", 6.0, rvns_w, k=1, d=0.5, ae=0.01)
    recs += _cell("toy", "RVNS-EM", "k=1,d=0.2", 3.0, rvns_w, k=1, d=0.2, ae=0.01)
    return recs


def test_band_and_claim_rules():
    recs = _toy(0.05)
    lo, mid, hi = recipe.privacy_band(recs, "toy")
    # ranges: RVNS [3, 6], baselines about [1, 8]: common [3, 6], band [4.5, 6]
    assert (lo, hi) == (pytest.approx(3.0), pytest.approx(6.0)) and mid == pytest.approx(4.5)
    pts = recipe.band_points(recs, "toy")
    assert [round(P, 6) for P, _ in pts] == [6.0]
    good = recipe.claims(recs)
    assert good[0]["variant"] == "RVNS-EM" and good[0]["verdict"] == "reproduced"
    assert good[2]["variant"] == "RVNS-EM" and good[2]["verdict"] == "reproduced"
    assert good[1]["verdict"] == "not reproducible"  # no RVNS-paper cell at all
    # EMS at P = 6 is about 0.5 / 1.33 = 0.37: an RVNS distance of 1.0 loses the claim
    bad = recipe.claims(_toy(1.0))
    assert bad[0]["verdict"] == "differs"


def test_real_data_loaders():
    path = os.path.join(SHARED_DATA, recipe.STUDENTS_FILE)
    if not os.path.isfile(path):
        pytest.skip("shared data folder not present")
    math_scores = recipe.load_students_math(SHARED_DATA)
    assert math_scores.shape == (1000,)
    assert math_scores.mean() == pytest.approx(66.089, abs=5e-4)
    assert (math_scores.min(), math_scores.max()) == (0.0, 100.0)
    data = recipe.rvns_dataset("AdultAge", recipe.FULL, np.random.default_rng(0), SHARED_DATA)
    assert data.n == 32_561 and data.source.startswith("file")
    assert data.values.mean() == pytest.approx(38.5816, abs=5e-5)
