"""The DPHR recipe (``ldp-beam reproduce dphr``): one quick run on the synthetic stand-ins with a
fixed seed, checked for its record schema, its figures and claims, and against exact theory.

Tolerances come from sampling distributions, not from the seed: LPA's range-query MSE has the
exact expectation 2L/eps^2 and an exact variance (overlapping windows of iid Laplace noise), and
the mean over the releases is compared with a moment-matched scaled chi-square, Bonferroni-
corrected over every LPA cell. No timing is asserted.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import os
import re

import numpy as np
import pytest
from ldp_beam_test_helpers import check_claims, check_records, recipe_outputs, run_quick_recipe
from scipy.stats import chi2

from ldp_beam.pipelines.records import select
from ldp_beam.reproduce import dphr_recipe as recipe
from ldp_beam.reproduce.metrics import range_query_mse
from ldp_beam.privacy import CENTRAL, NONE

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data")
if not os.path.isdir(SHARED_DATA):
    SHARED_DATA = "/work/shared/data"
HAVE_DPBENCH = all(os.path.isfile(recipe.dpbench_path(SHARED_DATA, n)) for n in recipe.DATASETS)

SEED = 20240917
EXPERIMENTS = {"datasets", "methods", "fig3", "runtime", "scaling", "soundness", "vs_LPA"}
FIGURES = {f"fig3_{d}.png" for d in recipe.DATASETS} | {"soundness.png"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return run_quick_recipe(recipe, tmp_path_factory, "dphr", SEED)


def _methods():
    return [m.name for m in recipe.methods(recipe.QUICK)]


# ----------------------------------------------------------------------------- schema
def test_record_schema(quick_run):
    records, out, _ = quick_run
    check_records(records, out, "dphr", SEED)
    for r in records:
        assert r["epsilon"] is None or isinstance(r["epsilon"], float)
        if "source" in r:
            assert r["source"].startswith("synthetic"), r
    assert {r["experiment"] for r in records} == EXPERIMENTS


def test_every_cell_is_measured(quick_run):
    records, _, _ = quick_run
    cfg = recipe.QUICK
    assert recipe.LENGTHS == tuple(range(50, 501, 50))
    assert sorted(recipe.EPS_GRID) == pytest.approx([0.01, 0.1, math.log(2), 1.0])
    fig3 = select(records, experiment="fig3", metric="MSE")
    assert len(fig3) == (len(recipe.DATASETS) * len(cfg.eps_grid) * len(cfg.lengths)
                         * len(_methods()))
    for ds in recipe.DATASETS:
        for eps in cfg.eps_grid:
            for L in cfg.lengths:
                rs = select(fig3, dataset=ds, epsilon=eps, length=L)
                assert sorted(r["method"] for r in rs) == sorted(_methods())
    for r in fig3:
        assert r["n"] == recipe.N_BUCKETS and r["reps"] == cfg.reps
        assert r["value"] > 0 and r["se"] is not None and r["se"] >= 0
        assert r["bias_MSE"] >= 0 and r["noise_MSE"] >= 0
        assert r["min"] <= r["value"] <= r["max"]
        assert set(r["guarantee"]) == {"kind", "epsilon"}
    rt = select(records, experiment="runtime", metric="seconds")
    assert len(rt) == len(recipe.DATASETS) * len(cfg.eps_grid) * len(_methods())
    assert all(r["value"] > 0 for r in rt)


def test_guarantees_as_run(quick_run):
    """The published DPHR and StructureFirst with F = max count carry no established guarantee;
    the sound DPHR, LPA and AHP are eps-DP (central) for the eps of the record."""
    records, _, _ = quick_run
    for r in select(records, experiment="fig3", length=50):
        g = r["guarantee"]
        if r["method"] == "DPHR-paper" or r["method"].startswith("StructureFirst (k=") and \
                "F=N" not in r["method"]:
            assert g == {"kind": NONE, "epsilon": None}, r
        else:
            assert g["kind"] == CENTRAL and g["epsilon"] == pytest.approx(r["epsilon"]), r
        assert r["in_paper"] == (r["method"] in ("DPHR-paper", "AHP")
                                 or r["method"].startswith("StructureFirst (k=")
                                 and "F=N" not in r["method"])
    ihp = select(records, experiment="methods", method="IHP")
    assert len(ihp) == 1 and ihp[0]["value"] is None and "not run" in ihp[0]["description"]


# ----------------------------------------------------------------------------- theory
def test_iid_range_mse_variance_is_exact():
    """Against exhaustive enumeration with Rademacher errors (variance 1, fourth cumulant -2):
    the formula uses only the variance and the fourth cumulant, so it must match exactly."""
    n = 10
    signs = np.array(list(itertools.product((-1.0, 1.0), repeat=n)))
    for L in (1, 3, 7, 10):
        mses = np.array([range_query_mse(np.zeros(n), s, [L])[0] for s in signs])
        assert mses.mean() == pytest.approx(float(L))
        assert recipe.iid_range_mse_variance(n, L, 1.0, -2.0) == pytest.approx(mses.var(),
                                                                               rel=1e-12)


def _lpa_interval(r, alpha):
    """Acceptance interval of the mean LPA MSE of record r: mu chi2(nu)/nu quantiles."""
    mu = r["theory_MSE"]
    nu = 2.0 * mu * mu * r["reps"] / r["theory_var"]
    return mu * chi2.ppf(alpha / 2, nu) / nu, mu * chi2.ppf(1 - alpha / 2, nu) / nu


def test_lpa_matches_its_exact_expectation(quick_run):
    """LPA's MSE for length L has expectation 2L/eps^2 (every range sums L iid Lap(1/eps)). The
    mean over T releases, with the exact per-release variance v, is compared with
    mu chi2(nu)/nu, nu = 2 mu^2 T / v, at Bonferroni level 1e-3 over all LPA cells."""
    records, _, _ = quick_run
    rs = select(records, experiment="fig3", method="LPA", metric="MSE")
    assert len(rs) == len(recipe.DATASETS) * len(recipe.EPS_GRID) * len(recipe.LENGTHS)
    for r in rs:
        assert r["theory_MSE"] == pytest.approx(2.0 * r["length"] / r["epsilon"] ** 2,
                                                rel=1e-12)
        assert r["bias_MSE"] == 0.0 and r["noise_MSE"] == pytest.approx(r["value"])
        lo, hi = _lpa_interval(r, 1e-3 / len(rs))
        assert lo <= r["value"] <= hi, (r, lo, hi)


def test_lpa_mse_grows_with_length(quick_run):
    """Theory: E[MSE] = 2L/eps^2 grows with L, and the acceptance intervals of the previous test
    at L = 50 and L = 500 are disjoint (the ratio of the bounds depends only on n, L and T), so
    the measured MSE(500) > MSE(50) in every cell."""
    records, _, _ = quick_run
    rs_all = select(records, experiment="fig3", method="LPA", metric="MSE")
    alpha = 1e-3 / len(rs_all)
    for ds in recipe.DATASETS:
        for eps in recipe.EPS_GRID:
            rs = sorted(select(rs_all, dataset=ds, epsilon=eps), key=lambda r: r["length"])
            th = [r["theory_MSE"] for r in rs]
            assert all(a < b for a, b in zip(th, th[1:]))
            a, b = rs[0], rs[-1]
            assert _lpa_interval(a, alpha)[1] < _lpa_interval(b, alpha)[0]
            assert a["value"] < b["value"]


def test_releases_follow_the_documented_streams():
    """One cell recomputed by hand: release r of a method draws from release_rng(seed, dataset,
    method, eps, r); the record splits MSE into reconstruction and noise parts."""
    gen = np.random.default_rng(5)
    data = recipe.Dataset("MEDCOST", recipe.synthetic_medcost(gen), "synthetic test")
    cfg = dataclasses.replace(recipe.QUICK, sf_k=(4,))
    lengths = (50, 500)
    for m in recipe.methods(cfg):
        res, mech = recipe.simulate(m, 0.5, data, lengths, 2, 123)
        for r in range(2):
            rel = mech.release_counts(data.counts,
                                      recipe.release_rng(123, "MEDCOST", m.name, 0.5, r))
            hist = rel["histogram"].value
            assert res.mse[r] == pytest.approx(range_query_mse(data.counts, hist, lengths))
            if "groups" in rel.statistics:
                gm = recipe._group_means(data.counts, rel["groups"].value)
                assert res.bias[r] == pytest.approx(range_query_mse(data.counts, gm, lengths))
                assert res.noise[r] == pytest.approx(range_query_mse(gm, hist, lengths))


def test_derived_ratios(quick_run):
    records, _, _ = quick_run
    mse = {(r["dataset"], r["method"], r["epsilon"], r["length"]): r
           for r in select(records, experiment="fig3", metric="MSE")}
    sd = select(records, experiment="soundness")
    vs = select(records, experiment="vs_LPA")
    n_cells = len(recipe.DATASETS) * len(recipe.EPS_GRID) * len(recipe.LENGTHS)
    assert len(sd) == 2 * n_cells and len(vs) == 3 * n_cells
    for rs, base in ((sd, "DPHR-paper"), (vs, "LPA")):
        for r in rs:
            a = mse[(r["dataset"], r["method"], r["epsilon"], r["length"])]
            b = mse[(r["dataset"], base, r["epsilon"], r["length"])]
            assert r["value"] == pytest.approx(a["value"] / b["value"])
            assert r["metric"] == f"MSE / MSE({base})" and r["se"] >= 0


def test_significance_rules():
    """2 combined standard errors; or complete separation of independent releases when its
    exact rank-test p-value 1/C(Ta + Tb, Ta) is <= 0.025 (C >= 40: T >= 4 each)."""
    a = {"value": 10.0, "se": 1.0, "min": 8.0, "max": 12.0, "reps": 10}
    b = {"value": 13.0, "se": 1.0, "min": 11.0, "max": 15.0, "reps": 10}
    assert recipe.significantly_less(a, b)  # 10 + 2 * sqrt(2) < 13
    heavy = {"value": 1e6, "se": 9e5, "min": 20.0, "max": 9e6, "reps": 10}
    assert recipe.significantly_less(a, heavy)  # separated: p = 1/C(20, 10)
    assert not recipe.significantly_less(a, heavy, independent=False)  # same releases: se only
    assert not recipe.significantly_less({**a, "reps": 3}, {**heavy, "reps": 3})  # p = 1/20
    assert recipe.significantly_less({**a, "reps": 4}, {**heavy, "reps": 4})  # p = 1/70
    assert not recipe.significantly_less(heavy, a) and not recipe.significantly_less(b, a)


# ----------------------------------------------------------------------------- outputs
def test_figures_and_files_written(quick_run):
    _, out, _ = quick_run
    cl, table = recipe_outputs(out, "dphr", FIGURES)
    assert len(cl) == len(recipe.claims([])) + len(recipe.DATASETS) * len(recipe.EPS_GRID)
    assert "fig3 HEPTH eps=1 " in table and "fig3 MEDCOST eps=ln2 " in table
    assert "soundness" in table and "scaling" in table


def test_claims_verdicts(quick_run):
    records, _, _ = quick_run
    cs = check_claims(recipe, records, recipe.VERDICTS, "not testable")
    assert len(cs) == len(recipe.claims([])) + len(recipe.DATASETS) * len(recipe.EPS_GRID)
    heads = [c for c in cs if c["claim"].startswith("DPHR has the lowest MSE")]
    assert len(heads) == len(recipe.DATASETS) * len(recipe.EPS_GRID) + 1
    assert heads[-1]["claim"].endswith("overall")
    assert all(c["verdict"] != "not testable" for c in heads)
    cost = next(c for c in cs if c["claim"].startswith("(ours) What soundness costs"))
    assert cost["verdict"] == "measured" and "eps=0.01" in cost["evidence"]


def test_progress_lines(quick_run):
    _, _, lines = quick_run
    steps = [ln for ln in lines if re.fullmatch(r"\[dphr\] \S+ .* \(\d+/\d+\)", ln)]
    assert len(steps) == len(recipe.DATASETS) * len(recipe.EPS_GRID) + 1
    assert steps[-1].endswith(f"({len(steps)}/{len(steps)})")
    assert any(re.fullmatch(r"\[dphr\] fig3 INCOME eps=ln2 \(\d+/\d+\)", ln) for ln in steps)


def test_seed_is_drawn_recorded_and_repeatable():
    cfg = dataclasses.replace(recipe.QUICK, reps=2, eps_grid=(1.0,), lengths=(50, 100),
                              datasets=("MEDCOST",), sf_k=(4,), scaling_n=())
    first = recipe.run(quick=True, config=cfg, progress=False)
    seeds = {r["seed"] for r in first}
    assert len(seeds) == 1 and isinstance(next(iter(seeds)), int)
    again = recipe.run(quick=True, config=cfg, progress=False, seed=seeds.pop())

    def untimed(rs):
        return [r for r in rs if r["experiment"] not in ("runtime", "scaling")]
    assert untimed(again) == untimed(first)


# ----------------------------------------------------------------------------- datasets
def test_synthetic_histograms_have_the_documented_shapes():
    gen = np.random.default_rng(17)
    for name, fn in recipe.SYNTHETIC.items():
        h = fn(gen)
        assert h.shape == (recipe.N_BUCKETS,) and h.dtype == np.int64 and (h >= 0).all()
        assert int(h.sum()) == recipe.DPBENCH_FACTS[name][0]
    inc = recipe.synthetic_income(gen)
    assert inc[0] == 2_587_110 and inc[-1] == 19_067
    med = recipe.synthetic_medcost(gen)
    assert med[0] == 2_782 and int((med > 0).sum()) == 1_032
    hep = recipe.synthetic_hepth(gen)
    assert (hep[3700:] == 0).all()


def test_loaders_return_none_without_files(tmp_path):
    assert recipe.load_dpbench("HEPTH", None) is None
    assert recipe.load_dpbench("HEPTH", tmp_path) is None
    d = recipe.load_dataset("MEDCOST", tmp_path, seed=3)
    assert d.source.startswith("synthetic") and d.n == recipe.N_BUCKETS
    assert np.array_equal(d.counts, recipe.load_dataset("MEDCOST", tmp_path, seed=3).counts)


def test_loader_rejects_a_malformed_file(tmp_path):
    os.makedirs(tmp_path / recipe.DPBENCH_DIR)
    np.save(recipe.dpbench_path(tmp_path, "HEPTH"), np.arange(10))
    with pytest.raises(ValueError, match="4096 non-negative integer counts"):
        recipe.load_dpbench("HEPTH", tmp_path)


@pytest.mark.skipif(not HAVE_DPBENCH, reason="shared/data/dpbench_1d is not available")
def test_dpbench_files_load_as_documented():
    for name in recipe.DATASETS:
        d = recipe.load_dpbench(name, SHARED_DATA)
        assert d is not None and d.source.startswith("file")
        h = d.counts
        assert h.shape == (4096,) and h.dtype == np.int64 and (h >= 0).all()
        total, top, nonzero = recipe.DPBENCH_FACTS[name]
        assert (int(h.sum()), int(h.max()), int((h > 0).sum())) == (total, top, nonzero)
