"""Reproduction of the BiSample paper's experiments (Sun et al., Section 5) as a recipe.

``run(quick, data_dir, out_dir, seed)`` returns a list of JSON records (see
:mod:`ldp_beam.pipelines.records`) and, with ``out_dir``, writes one PNG per figure panel plus
``bisample.json`` (the records) and ``bisample_claims.json`` (:func:`claims`). Experiments:

* ``datasets``: the mean of every dataset beside Table 2.
* ``fig4``: mean estimation vs epsilon on EXP, GAUSS, UNIFORM and ADULT, with privacy preferences
  eps_u ~ N(5, 1.5^2): a user answers iff eps_u >= eps (Definition 2, Alg. 3). BiSample-MD and
  PrivKVM send the missing value; BiSample, Harmony and PM force an answer, faked in TOP mode
  (the upper bound, 1) or RND mode (uniform). Truth: the mean of the answering users' values and
  the share of non-answering users. ``answer_rate`` records are Fig. 3(b).
* ``fig5``: a missing rate set directly (users drawn uniformly at random, exact count), eps in
  {0.1, 1}, EXP and GAUSS, BiSample-MD vs PrivKVM: mean and missing-rate errors.
* ``fig6``: varying n at eps = 0.1 on EXP with a missing rate of 0.3, all methods. The paper
  states neither the dataset nor the missing rate of Fig. 6; EXP and 0.3 are our choices.
* ``variance``: no missing data; the empirical Var(m) (Eq. 21) of BiSample, Harmony and PM beside
  Eq. 14's worst case ((e^eps + 1)/(e^eps - 1))^2 / n and the exact variances.

Metrics (Eq. 21, :mod:`ldp_beam.reproduce.metrics`), all on the [-1, 1] scale:
``AE(m)``/``Var(m)`` of the raw estimator (Eq. 11 for forced answers, Eq. 20 for BiSample-MD);
repetitions where Eq. 20 is undefined (estimated answering share <= 0) are left out and counted in
``undefined``. ``AE(m,clip)``/``Var(m,clip)`` use the post-processed estimate clipped to [-1, 1]
(the domain midpoint 0 where undefined), which is privacy-free and what a user of the library
would publish. ``AE(mr)``/``Var(mr)`` for the methods that estimate a missing rate. Each AE record
carries ``se``, the standard error of the AE over the repetitions.

Randomness: one recipe ``seed`` (:func:`.recipe.start_recipe`: from OS entropy when not given,
in every record); every (experiment, dataset, method, epsilon) cell gets its own PCG64 stream
(:func:`.recipe.cell_rng`), so a cell does not depend on the grid.

Sizes: full = the paper's (n = 10^5, T = 100); ``quick`` = n = 10^4, T = 10 and reduced grids.
Run it as ``python -m ldp_beam.reproduce.bisample_recipe [--quick] [--data-dir D] [--out DIR]``.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import EmptyAccumulatorError
from ..estimators import estimator_for
from ..pipelines.records import make_record, select
from ..registry import build_mechanism
from . import datasets as ds
from .metrics import (absolute_error, bisample_variance, chi2_interval,
                      harmony_worst_case_variance, pm_variance, squared_error)
from .recipe import (below_by_se, cell_rng as _rng, claim_list, curve, finish_recipe, mean_se,
                     paper_run, pyplot, recipe_main, save_figure, start_recipe)

FAMILY = "bisample"

#: display name -> (registry name, mechanism parameters)
METHODS: dict[str, tuple[str, dict]] = {
    "BiSample-MD": ("bisample-md", {}),
    "BiSample-TOP": ("bisample", {"fake": "top"}),
    "BiSample-RND": ("bisample", {"fake": "rnd"}),
    "Harmony-TOP": ("harmony", {"fake": "top"}),
    "Harmony-RND": ("harmony", {"fake": "rnd"}),
    "PM-TOP": ("pm", {"fake": "top"}),
    "PM-RND": ("pm", {"fake": "rnd"}),
    "PrivKVM": ("privkvm", {}),
}
MR_METHODS = ("BiSample-MD", "PrivKVM")  # the methods that estimate a missing rate
FORCED_BASELINES = ("Harmony-TOP", "Harmony-RND", "PM-TOP", "PM-RND")
VARIANCE_METHODS: dict[str, tuple[str, dict]] = {
    "BiSample": ("bisample", {}),
    "Harmony": ("harmony", {}),
    "PM": ("pm", {}),
}
DATASETS = ("EXP", "GAUSS", "UNIFORM", "ADULT")
PREF_FLOOR = 0.0  # a drawn eps_u < 0 (prob. 4e-4) becomes 0, "never answers"; same decisions


@dataclass(frozen=True)
class Config:
    n: int
    reps: int
    eps_grid: tuple[float, ...]
    fig5_eps: tuple[float, ...] = (0.1, 1.0)
    fig5_datasets: tuple[str, ...] = ("EXP", "GAUSS")
    mr_grid: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    fig6_eps: float = 0.1
    fig6_missing_rate: float = 0.3
    fig6_dataset: str = "EXP"
    n_grid: tuple[int, ...] = (1_000, 3_000, 10_000, 30_000, 100_000, 300_000, 1_000_000)
    pref_mu: float = 5.0
    pref_sigma: float = 1.5
    experiments: tuple[str, ...] = ("fig4", "fig5", "fig6", "variance")


FULL = Config(n=100_000, reps=100,
              eps_grid=(0.1, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0))
QUICK = Config(n=10_000, reps=10, eps_grid=(0.1, 1.0, 2.0, 4.0, 6.0, 8.0),
               mr_grid=(0.1, 0.3, 0.5, 0.7, 0.9), n_grid=(1_000, 10_000, 100_000))


# --------------------------------------------------------------------------- one cell
@dataclass
class CellResult:
    mean_raw: np.ndarray
    mean_clip: np.ndarray
    mr: np.ndarray | None


def simulate(method: str, epsilon: float, values: np.ndarray, prefs: np.ndarray | None,
             reps: int, rng: np.random.Generator,
             methods: Mapping[str, tuple[str, dict]] = METHODS) -> CellResult:
    """T repetitions of one mechanism on one population: perturb everyone (one vectorized call
    per repetition), accumulate, estimate. ``prefs``: eps_u per user (None: everyone answers).
    Estimates are on the [-1, 1] scale."""
    reg_name, params = methods[method]
    mech = build_mechanism(reg_name, epsilon=float(epsilon), lower=-1.0, upper=1.0, **params)
    est = estimator_for(mech)
    cols = {"value": values} if prefs is None else {"value": values, "preference": prefs}
    checked, reasons = mech.check(cols)  # validate once; repetitions reuse the coerced columns
    if reasons.bad.any():
        raise ValueError(f"{method}: invalid simulated input: {list(reasons.as_dict().items())[:3]}")
    raw = np.full(reps, np.nan)
    clip = np.zeros(reps)
    mr = np.full(reps, np.nan) if method in MR_METHODS else None
    for t in range(reps):
        reports = mech.perturb_valid(checked, rng)
        acc = est.add(est.create(), reports)
        try:
            stats = est.statistics(acc)
        except EmptyAccumulatorError:
            continue  # no usable report: raw stays NaN (undefined), clipped stays at 0
        m = stats["mean"]
        if m.value is not None:
            raw[t] = m.value
            clip[t] = m.clipped
        if mr is not None:
            mr[t] = stats["missing_rate"].value
    return CellResult(raw, clip, mr)


def _cell_records(experiment: str, dataset: str, method: str, epsilon: float, res: CellResult,
                  true_mean: float, true_mr: float, **params: Any) -> list[dict]:
    """AE/Var records (Eq. 21) of one cell."""
    out = []
    T = res.mean_raw.size
    undefined = int(np.isnan(res.mean_raw).sum())

    def ae_se(truth: float, est: np.ndarray) -> float:
        e = np.abs(est - truth)
        return mean_se(e[~np.isnan(e)])

    common = dict(true_mean=true_mean, true_mr=true_mr, reps=T, **params)
    series = []  # (what is estimated, its truth, the estimates, whether NaN ones are left out)
    if not math.isnan(true_mean):
        series += [("m", true_mean, res.mean_raw, True),
                   ("m,clip", true_mean, res.mean_clip, False)]
    if res.mr is not None:
        series.append(("mr", true_mr, res.mr, True))
    for what, truth, est, ignore_nan in series:
        extra = {"undefined": undefined} if what == "m" else {}
        out += [make_record(experiment, dataset, method, epsilon, f"AE({what})",
                            absolute_error(truth, est, ignore_nan=ignore_nan),
                            se=ae_se(truth, est), **extra, **common),
                make_record(experiment, dataset, method, epsilon, f"Var({what})",
                            squared_error(truth, est, ignore_nan=ignore_nan), **extra, **common)]
    return out


# --------------------------------------------------------------------------- experiments
def _data(cfg: Config, seed: int, name: str, data_dir: str | None, n: int | None = None
          ) -> ds.Dataset:
    n = cfg.n if n is None else n
    return ds.dataset(name, n, _rng(seed, "data", name, n), data_dir)


def _prefs(cfg: Config, seed: int, name: str, n: int) -> np.ndarray:
    raw = ds.preferences(n, _rng(seed, "prefs", name, n), cfg.pref_mu, cfg.pref_sigma)
    return np.maximum(raw, PREF_FLOOR)


def _missing(d: ds.Dataset, rate: float, epsilon: float, rng: np.random.Generator
             ) -> tuple[np.ndarray, float, float]:
    """Exactly round(rate n) users of ``d``, drawn by ``rng``, refuse at ``epsilon``: (the
    preference column that makes them refuse, the other users' mean, the true missing rate)."""
    missing = np.zeros(d.n, dtype=bool)
    missing[rng.choice(d.n, int(round(rate * d.n)), replace=False)] = True
    return (np.where(missing, epsilon / 2.0, epsilon * 2.0), float(d.values[~missing].mean()),
            int(missing.sum()) / d.n)


def _datasets_experiment(cfg, seed, data_dir, common) -> list[dict]:
    return [make_record("datasets", name, "truth", None, "mean", d.mean,
                        paper_value=ds.PAPER_TABLE2[name][1], n=d.n,
                        paper_n=ds.PAPER_TABLE2[name][0], source=d.source, **common)
            for name in DATASETS for d in [_data(cfg, seed, name, data_dir)]]


def _fig4(cfg, seed, data_dir, common, prog) -> list[dict]:
    out = []
    for name in DATASETS:
        d = _data(cfg, seed, name, data_dir)
        prefs = _prefs(cfg, seed, name, d.n)
        for eps in cfg.eps_grid:
            answering = prefs >= eps
            true_mr = float(1.0 - answering.mean())
            true_mean = float(d.values[answering].mean()) if answering.any() else float("nan")
            out.append(make_record("fig4", name, "preferences", eps, "answer_rate",
                                   1.0 - true_mr, n=d.n, **common))
            prog.step(f"fig4 {name} eps={eps:g}")
            for method in METHODS:
                res = simulate(method, eps, d.values, prefs, cfg.reps,
                               _rng(seed, "fig4", name, method, eps))
                out += _cell_records("fig4", name, method, eps, res, true_mean, true_mr,
                                     n=d.n, source=d.source, **common)
    return out


def _fig5(cfg, seed, data_dir, common, prog) -> list[dict]:
    out = []
    for name in cfg.fig5_datasets:
        d = _data(cfg, seed, name, data_dir)
        for eps in cfg.fig5_eps:
            for rate in cfg.mr_grid:
                prog.step(f"fig5 {name} eps={eps:g} mr={rate:g}")
                prefs, true_mean, true_mr = _missing(d, rate, eps,
                                                     _rng(seed, "fig5-missing", name, rate))
                for method in MR_METHODS:
                    res = simulate(method, eps, d.values, prefs, cfg.reps,
                                   _rng(seed, "fig5", name, method, eps, rate))
                    out += _cell_records("fig5", name, method, eps, res, true_mean, true_mr,
                                         n=d.n, missing_rate=rate, **common)
    return out


def _fig6(cfg, seed, data_dir, common, prog) -> list[dict]:
    out = []
    eps, rate, name = cfg.fig6_eps, cfg.fig6_missing_rate, cfg.fig6_dataset
    for n in cfg.n_grid:
        d = _data(cfg, seed, name, data_dir, n=n)
        prefs, true_mean, true_mr = _missing(d, rate, eps, _rng(seed, "fig6-missing", name, n))
        prog.step(f"fig6 {name} n={d.n}")
        for method in METHODS:
            res = simulate(method, eps, d.values, prefs, cfg.reps,
                           _rng(seed, "fig6", name, method, n))
            out += _cell_records("fig6", name, method, eps, res, true_mean, true_mr,
                                 n=d.n, missing_rate=rate, **common)
    return out


def _variance(cfg, seed, data_dir, common, prog) -> list[dict]:
    out = []
    for name in DATASETS:
        d = _data(cfg, seed, name, data_dir)
        truth = d.mean
        for eps in cfg.eps_grid:
            prog.step(f"variance {name} eps={eps:g}")
            worst = harmony_worst_case_variance(eps, d.n)
            eq14 = (((math.exp(eps) + 1) / math.expm1(eps)) ** 2 - truth ** 2) / d.n
            exact = {"BiSample": bisample_variance(eps, d.values),
                     "Harmony": bisample_variance(eps, d.values),
                     "PM": pm_variance(eps, d.values)}
            for method in VARIANCE_METHODS:
                res = simulate(method, eps, d.values, None, cfg.reps,
                               _rng(seed, "variance", name, method, eps),
                               methods=VARIANCE_METHODS)
                out.append(make_record(
                    "variance", name, method, eps, "Var(m)",
                    squared_error(truth, res.mean_raw), reps=cfg.reps, n=d.n,
                    theory_exact=exact[method], theory_eq14=eq14, theory_worst_case=worst,
                    true_mean=truth, **common))
                out.append(make_record(
                    "variance", name, method, eps, "AE(m)", absolute_error(truth, res.mean_raw),
                    reps=cfg.reps, n=d.n, true_mean=truth, **common))
    return out


def _total_steps(cfg: Config) -> int:
    steps = {"fig4": len(DATASETS) * len(cfg.eps_grid), "fig6": len(cfg.n_grid),
             "fig5": len(cfg.fig5_datasets) * len(cfg.fig5_eps) * len(cfg.mr_grid),
             "variance": len(DATASETS) * len(cfg.eps_grid)}
    return sum(steps.get(e, 0) for e in set(cfg.experiments))


@paper_run("Section 5")
def run(quick: bool = False, data_dir: str | None = None, out_dir: str | None = None,
        seed: int | None = None, progress: Any = None, *, config: Config | None = None
        ) -> list[dict]:
    cfg = config if config is not None else (QUICK if quick else FULL)
    seed, prog, common, t0 = start_recipe(FAMILY, quick, seed, progress, _total_steps(cfg),
                                          f"n={cfg.n}, T={cfg.reps}", data_dir)
    records = _datasets_experiment(cfg, seed, data_dir, common)
    runners = {"fig4": _fig4, "fig5": _fig5, "fig6": _fig6, "variance": _variance}
    for exp_name in cfg.experiments:
        records += runners[exp_name](cfg, seed, data_dir, common, prog)
    prog.note(f"experiments done in {time.perf_counter() - t0:.1f}s")
    return finish_recipe(FAMILY, records, out_dir, prog, claims, figures, summary)


# --------------------------------------------------------------------------- figures
_STYLE = {
    "BiSample-MD": dict(color="C3", marker="o", lw=2.0),
    "BiSample-TOP": dict(color="C0", marker="^", ls="--"),
    "BiSample-RND": dict(color="C0", marker="v", ls=":"),
    "Harmony-TOP": dict(color="C1", marker="^", ls="--"),
    "Harmony-RND": dict(color="C1", marker="v", ls=":"),
    "PM-TOP": dict(color="C2", marker="^", ls="--"),
    "PM-RND": dict(color="C2", marker="v", ls=":"),
    "PrivKVM": dict(color="C4", marker="s"),
    "BiSample": dict(color="C3", marker="o"),
    "Harmony": dict(color="C1", marker="^", ls="--"),
    "PM": dict(color="C2", marker="s"),
}


def figures(records: Sequence[Mapping], out_dir: str, dpi: int = 90) -> list[str]:
    """One PNG per panel of Figs. 4-6 plus the variance figure. Returns the paths written."""
    plt = pyplot()
    paths = []
    def tag(rs):
        rs = [r for r in rs if r.get("reps") is not None]
        return f"n={rs[0].get('n')}, T={rs[0]['reps']}, seed={rs[0].get('seed')}" if rs else ""

    for name in DATASETS:  # Fig. 4: one panel per dataset
        rs = select(records, experiment="fig4", dataset=name)
        if not rs:
            continue
        fig, ax = plt.subplots(figsize=(5.2, 3.8))
        for method in METHODS:
            xs, ys, _ = curve(rs, "epsilon", method=method, metric="AE(m)")
            ax.plot(xs, ys, label=f"{method}-m", ms=4, **_STYLE[method])
        for method in MR_METHODS:
            xs, ys, _ = curve(rs, "epsilon", method=method, metric="AE(mr)")
            ax.plot(xs, ys, label=f"{method}-mr", ms=3, alpha=0.6, color=_STYLE[method]["color"],
                    ls="-.", marker="x")
        ax.set(yscale="log", xlabel="epsilon", ylabel="average absolute error",
               title=f"Fig. 4 {name} ({tag(rs)})")
        ax.title.set_fontsize(8)
        ax.legend(fontsize=6, ncol=2)
        paths.append(save_figure(fig, os.path.join(out_dir, f"fig4_{name}.png"), dpi=dpi))
    for name in sorted({r["dataset"] for r in select(records, experiment="fig5")}):  # Fig. 5
        for eps in sorted({r["epsilon"] for r in select(records, experiment="fig5",
                                                          dataset=name)}):
            rs = select(records, experiment="fig5", dataset=name, epsilon=eps)
            fig, ax = plt.subplots(figsize=(4.6, 3.4))
            for method in MR_METHODS:
                for metric, ls in (("AE(m)", "-"), ("AE(mr)", "--")):
                    xs, ys, _ = curve(rs, "missing_rate", method=method, metric=metric)
                    st = {**_STYLE[method], "ls": ls}
                    ax.plot(xs, ys, label=f"{method}-{metric[3:-1]}", ms=4, **st)
            ax.set(yscale="log", xlabel="missing rate", ylabel="average absolute error",
                   title=f"Fig. 5 {name} eps={eps:g} ({tag(rs)})")
            ax.title.set_fontsize(8)
            ax.legend(fontsize=7)
            paths.append(save_figure(fig, os.path.join(out_dir, f"fig5_{name}_eps{eps:g}.png"),
                                     dpi=dpi))
    rs6 = select(records, experiment="fig6")
    if rs6:  # Fig. 6 (a) mean, (b) missing rate
        for panel, metric, methods in (("a", "AE(m)", list(METHODS)), ("b", "AE(mr)", MR_METHODS)):
            fig, ax = plt.subplots(figsize=(4.6, 3.4))
            for method in methods:
                xs, ys, _ = curve(rs6, "n", method=method, metric=metric)
                ax.plot(xs, ys, label=method, ms=4, **_STYLE[method])
            r0 = rs6[0]
            ax.set(xscale="log", yscale="log", xlabel="n (users)",
                   ylabel=f"average absolute error {metric}",
                   title=f"Fig. 6({panel}) {r0['dataset']} eps={r0['epsilon']:g} "
                         f"mr={r0.get('missing_rate')} T={r0.get('reps')}")
            ax.title.set_fontsize(8)
            ax.legend(fontsize=6, ncol=2)
            paths.append(save_figure(fig, os.path.join(out_dir, f"fig6{panel}.png"), dpi=dpi))
    rv = select(records, experiment="variance", metric="Var(m)")
    if rv:  # variance vs Eq. 14
        names = [n for n in DATASETS if select(rv, dataset=n)]
        fig, axes = plt.subplots(1, len(names), figsize=(3.4 * len(names), 3.2), squeeze=False)
        for ax, name in zip(axes[0], names):
            rs = select(rv, dataset=name)
            for method in VARIANCE_METHODS:
                xs, ys, _ = curve(rs, "epsilon", method=method)
                ax.plot(xs, ys, label=f"{method} (empirical)", ms=4, ls="none",
                        marker=_STYLE[method]["marker"], color=_STYLE[method]["color"])
            b = sorted(select(rs, method="BiSample"), key=lambda r: r["epsilon"])
            p = sorted(select(rs, method="PM"), key=lambda r: r["epsilon"])
            ax.plot([r["epsilon"] for r in b], [r["theory_worst_case"] for r in b], "k-",
                    lw=1, label="Eq. 14 worst case")
            ax.plot([r["epsilon"] for r in b], [r["theory_exact"] for r in b], "C3:",
                    lw=1, label="BiSample/Harmony exact")
            ax.plot([r["epsilon"] for r in p], [r["theory_exact"] for r in p], "C2:",
                    lw=1, label="PM exact")
            ax.set(yscale="log", xlabel="epsilon", title=f"{name} (n={b[0]['n']}, "
                   f"T={b[0]['reps']})")
            ax.title.set_fontsize(8)
        axes[0][0].set_ylabel("Var(m), Eq. 21")
        axes[0][0].legend(fontsize=6)
        paths.append(save_figure(fig, os.path.join(out_dir, "variance.png"), dpi=dpi))
    return paths


# --------------------------------------------------------------------------- claims
MISSING_THRESHOLD = 0.05  # "with missing data": cells whose true missing rate is at least 5%


def _index(records, experiment, metric):
    """{(dataset, epsilon, x) -> {method: record}} for one experiment/metric."""
    idx: dict = {}
    for r in select(records, experiment=experiment, metric=metric):
        key = (r["dataset"], r["epsilon"], r.get("missing_rate"), r.get("n"))
        idx.setdefault(key, {})[r["method"]] = r
    return idx


def _compare(idx, method, others, keep=lambda key, r: True):
    wins = losses = sig_losses = sig_wins = 0
    worst = None
    for key, by in sorted(idx.items(), key=lambda kv: str(kv[0])):
        if method not in by or by[method]["value"] is None:
            continue
        for other in others:
            if other not in by or by[other]["value"] is None or not keep(key, by[method]):
                continue
            a, b = by[method], by[other]
            wins += a["value"] < b["value"]
            losses += not a["value"] < b["value"]
            sig_wins += below_by_se(a, b)
            if below_by_se(b, a):
                sig_losses += 1
                ratio = a["value"] / b["value"]
                if worst is None or ratio > worst[0]:
                    worst = (ratio, key, other)
    return wins, losses, sig_wins, sig_losses, worst


def _fmt_key(key):
    ds_, eps, mr, n = key
    return " ".join([ds_, f"eps={eps:g}"] + ([] if mr is None else [f"mr={mr:g}"])
                    + ([] if n is None else [f"n={n}"]))


def claims(records: Sequence[Mapping]) -> list[dict]:
    """Judge the paper's headline claims from the records. Each result:
    ``{"claim", "verdict": "reproduced" | "differs" | "not reproducible", "evidence"}``.

    The rules are fixed in advance: differences count only beyond 2 standard errors of the AE
    (``se``); "with missing data" means a true missing rate of at least 5%.
    """
    out, add = claim_list()

    # 1. BiSample's variance matches Harmony's worst case (Eq. 14).
    claim = ("BiSample's variance matches Harmony's: worst case ((e^eps+1)/(e^eps-1))^2/n "
             "(Eq. 14)")
    rv = select(records, experiment="variance", metric="Var(m)")
    if not select(rv, method="BiSample") or not select(rv, method="Harmony"):
        add(claim, "not reproducible", "no variance experiment in the records")
    else:
        # lazy: scipy.stats costs 0.76 s at import (measured, after this module's imports); only
        # this claim on the variance experiment needs it: runs of the other experiments
        # (Config.experiments) and importing the recipe never do
        from scipy.stats import f as fdist

        cells = sorted({(r["dataset"], r["epsilon"]) for r in select(rv, method="BiSample")})
        alpha = 0.01 / max(len(cells), 1)  # Bonferroni over the cells
        above_worst, off_harmony, off_exact, ratios, worst_ratio = [], [], [], [], []
        for dname, eps in cells:
            b = select(rv, method="BiSample", dataset=dname, epsilon=eps)[0]
            h = select(rv, method="Harmony", dataset=dname, epsilon=eps)
            T = b["reps"]
            lo, hi = chi2_interval(b["theory_worst_case"], T, alpha)
            if b["value"] > hi:
                above_worst.append(f"{dname} eps={eps:g}")
            lo, hi = chi2_interval(b["theory_exact"], T, alpha)
            if not lo <= b["value"] <= hi:
                off_exact.append(f"{dname} eps={eps:g}")
            worst_ratio.append(b["value"] / b["theory_worst_case"])
            if h:
                ratio = b["value"] / h[0]["value"]
                ratios.append(ratio)
                if not fdist.ppf(alpha / 2, T, T) <= ratio <= fdist.ppf(1 - alpha / 2, T, T):
                    off_harmony.append(f"{dname} eps={eps:g} (ratio {ratio:.2f})")
        ok = not above_worst and not off_harmony and not off_exact
        add(claim, "reproduced" if ok else "differs",
            f"{len(cells)} (dataset, eps) cells, T={T}: empirical Var(BiSample)/Eq.14 worst case "
            f"in [{min(worst_ratio):.2f}, {max(worst_ratio):.2f}]; Var(BiSample)/Var(Harmony) in "
            f"[{min(ratios):.2f}, {max(ratios):.2f}]; above the worst case (chi-square, "
            f"Bonferroni 1%): {above_worst or 'none'}; outside the exact variance "
            f"(1/(2p-1)^2 - mean v^2)/n: {off_exact or 'none'}; BiSample vs Harmony outside "
            f"F({T},{T}) bounds: {off_harmony or 'none'}. Note Eq. 14 writes m^2 where the exact "
            f"variance has mean(v^2) >= m^2, so Eq. 14 is an upper bound, exact only for constant "
            f"data.")

    # 2. With missing data BiSample-MD beats Harmony/PM in TOP and RND modes.
    claim = ("With missing data, BiSample-MD has lower mean error than Harmony and PM in TOP "
             "and RND modes (except RND on UNIFORM, a coincidence)")
    idx = _index(records, "fig4", "AE(m)")
    if not idx:
        add(claim, "not reproducible", "no fig4 records")
    else:
        miss = lambda key, r: r.get("true_mr", 0) >= MISSING_THRESHOLD
        low = lambda key, r: r.get("true_mr", 0) < MISSING_THRESHOLD
        w, l, sw, sl, worst = _compare(
            {k: v for k, v in idx.items() if k[0] != "UNIFORM"}, "BiSample-MD",
            FORCED_BASELINES, miss)
        uni = {k: v for k, v in idx.items() if k[0] == "UNIFORM"}
        wu, lu, swu, slu, worstu = _compare(uni, "BiSample-MD", ("Harmony-TOP", "PM-TOP"), miss)
        wr, lr, _, slr, _ = _compare(uni, "BiSample-MD", ("Harmony-RND", "PM-RND"), miss)
        wl, ll, _, sll, _ = _compare(idx, "BiSample-MD", FORCED_BASELINES, low)
        total_w, total_l, total_sl = w + wu, l + lu, sl + slu
        ok = total_sl == 0 and total_w >= 0.8 * (total_w + total_l)
        worst_txt = "".join(f" worst significant loss: {_fmt_key(wst[1])} vs {wst[2]} "
                            f"(AE ratio {wst[0]:.2f});" for wst in (worst, worstu) if wst)
        add(claim, "reproduced" if ok else "differs",
            f"fig4 cells with true missing rate >= {MISSING_THRESHOLD:.0%} (excluding UNIFORM/RND):"
            f" BiSample-MD lower AE(m) in {total_w} of {total_w + total_l} comparisons, "
            f"significantly (2 se) lower in {sw + swu}, significantly higher in {total_sl};"
            f"{worst_txt} UNIFORM/RND (the noted coincidence): lower in {wr} of {wr + lr}, "
            f"significantly higher in {slr}. Cells with < {MISSING_THRESHOLD:.0%} missing "
            f"(small eps, nearly everyone answers, so faking hardly matters): lower in {wl} of "
            f"{wl + ll}, significantly higher in {sll} (BiSample-MD's ratio estimator, Eq. 20, "
            f"pays for estimating the answering share).")

    # 3. BiSample-MD beats PrivKVM on the mean and 4. on the missing rate.
    for metric, what in (("AE(m)", "mean"), ("AE(mr)", "missing rate")):
        claim = f"BiSample-MD estimates the {what} more accurately than PrivKVM"
        parts, W, L, SL, SW = [], 0, 0, 0, 0
        for exp_name in ("fig4", "fig5", "fig6"):
            idx = _index(records, exp_name, metric)
            if not idx:
                continue
            w, l, sw, sl, worst = _compare(idx, "BiSample-MD", ("PrivKVM",))
            W, L, SW, SL = W + w, L + l, SW + sw, SL + sl
            txt = f"{exp_name}: lower in {w} of {w + l} (significantly {sw}, significantly " \
                  f"higher {sl})"
            if worst:
                txt += f", worst: {_fmt_key(worst[1])} (AE ratio {worst[0]:.2f})"
            parts.append(txt)
        if W + L == 0:
            add(claim, "not reproducible", "no BiSample-MD/PrivKVM records")
        else:
            ok = SL == 0 and W >= 0.8 * (W + L)
            add(claim, "reproduced" if ok else "differs",
                f"{metric}: " + "; ".join(parts) + ". PrivKVM as implemented: key with eps/2, "
                "value with eps/2, 5 virtual iterations.")

    # 5. Error grows again at large eps because users stop answering.
    claim = ("Mean error grows again at large eps because users stop answering "
             "(BiSample-MD, preferences N(5, 1.5))")
    idx = _index(records, "fig4", "AE(m)")
    rows, grows = [], []
    for name in DATASETS:
        rs = sorted([by["BiSample-MD"] for k, by in idx.items()
                     if k[0] == name and "BiSample-MD" in by], key=lambda r: r["epsilon"])
        if len(rs) < 3:
            continue
        best, last = min(rs, key=lambda r: r["value"]), rs[-1]
        grows.append(best is not last and below_by_se(best, last))
        rows.append(f"{name}: min AE {best['value']:.4g} at eps={best['epsilon']:g} "
                    f"(answer rate {1 - best['true_mr']:.3f}), AE {last['value']:.4g} at "
                    f"eps={last['epsilon']:g} (answer rate {1 - last['true_mr']:.3f})")
    if not grows:
        add(claim, "not reproducible", "no fig4 curve for BiSample-MD")
    else:
        add(claim, "reproduced" if all(grows) else "differs", "; ".join(rows))

    # 6. Missing-rate estimation is more accurate than mean estimation.
    claim = "Missing-rate estimation is more accurate than mean estimation (Fig. 5)"
    idx_m, idx_r = _index(records, "fig5", "AE(m)"), _index(records, "fig5", "AE(mr)")
    if not idx_m:
        add(claim, "not reproducible", "no fig5 records")
    else:
        parts, allw, allt, allsl = [], 0, 0, 0
        for method in MR_METHODS:
            w = t = sl = 0
            fails = []
            for key, by in idx_r.items():
                if method not in by or method not in idx_m.get(key, {}):
                    continue
                rm, rr = idx_m[key][method], by[method]
                if rm["value"] is None or rr["value"] is None:
                    continue
                t += 1
                if rr["value"] < rm["value"]:
                    w += 1
                else:
                    fails.append(_fmt_key(key))
                sl += below_by_se(rm, rr)
            parts.append(f"{method}: AE(mr) < AE(m) in {w} of {t} cells"
                         + (f" (not in: {', '.join(fails[:6])}{' ...' if len(fails) > 6 else ''})"
                            if fails else ""))
            allw, allt, allsl = allw + w, allt + t, allsl + sl
        ok = allsl == 0 and allw >= 0.8 * allt
        add(claim, "reproduced" if ok else "differs",
            "; ".join(parts) + f"; AE(m) significantly below AE(mr) in {allsl} cells. (Both "
            "errors are on their own scales: the mean on [-1, 1], the rate on [0, 1], as in the "
            "paper.)")
    return out


# --------------------------------------------------------------------------- text summary
def summary(records: Sequence[Mapping], eps_shown: Iterable[float] = (0.1, 1.0, 4.0, 8.0)
            ) -> str:
    """A plain-text table: dataset means beside Table 2, AE(m)/AE(mr) per method at a few eps,
    the variance comparison, and the claim verdicts."""
    lines = []
    dm = select(records, experiment="datasets")
    if dm:
        lines += ["dataset   n        mean      paper (Table 2)  source"] + [
            f"{r['dataset']:<9} {r['n']:<8} {r['value']:+.4f}   {r['paper_value']:+.3f}           "
            f"{r.get('source', '')}" for r in dm]
    eps_shown = [e for e in eps_shown if select(records, experiment="fig4", epsilon=e)]
    for name in DATASETS:
        rs = select(records, experiment="fig4", dataset=name)
        if not rs:
            continue
        lines.append(f"\nfig4 {name}: AE(m) [AE(mr)] at eps = "
                     + ", ".join(f"{e:g}" for e in eps_shown))
        for method in METHODS:
            cells = []
            for e in eps_shown:
                m, r = (next((x["value"] for x in select(rs, method=method, epsilon=e,
                                                         metric=k)), None)
                        for k in ("AE(m)", "AE(mr)"))
                c = ("-" if m is None else f"{m:.4f}") + ("" if r is None else f" [{r:.4f}]")
                cells.append(f"{c:<18}")
            lines.append(f"  {method:<13}" + " ".join(cells))
    rv = select(records, experiment="variance", metric="Var(m)")
    if rv:
        lines.append("\nvariance (no missing data): Var(m) x n, empirical / Eq. 14 worst case")
        for name in DATASETS:
            for e in eps_shown:
                rs = select(rv, dataset=name, epsilon=e)
                if not rs:
                    continue
                n = rs[0]["n"]
                cells = " ".join(f"{r['method']}={r['value'] * n:.3f}" for r in rs)
                lines.append(f"  {name:<8} eps={e:<4g} {cells}  worst={rs[0]['theory_worst_case'] * n:.3f}")
    lines += [""] + [f"[{c['verdict']}] {c['claim']}" for c in claims(records)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return recipe_main(run, "python -m ldp_beam.reproduce.bisample_recipe",
                       __doc__.split("\n")[0], 'n=10^4, T=10, reduced grids',
                       'folder holding uci_adult/adult.data', argv)


if __name__ == "__main__":
    raise SystemExit(main())
