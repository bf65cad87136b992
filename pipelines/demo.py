"""``ldp-beam demo``: the main job, end to end on the bundled sample table, through Beam.

Sections (``--section NAME``; all by default): ``bisample``, ``rvns``, ``uldp``, ``dphr`` and
``ospdprr``.

1. collect: each of 50,000 synthetic survey records is perturbed with BiSample-MD (the client
   step; people whose privacy preference is below epsilon, or who skipped the question, send a
   report of the null value), bad rows are dead-lettered with their reason;
2. estimate: the collector reconstructs the missing rate, the mean age of the answering people
   and the sum, with 95% confidence intervals, overall and per region;
3. for contrast, the same data collected with Harmony, a mechanism that forces an answer (people
   who would not answer send a random value), shows the bias BiSample-MD avoids;
4. rvns: each income is reported negatively with RVNS (a value where it is not) and the collector
   reconstructs the income density and its six indicators;
5. uldp: each (employment, health) pair is perturbed with CPRR, under utility-optimized LDP
   (unemployment and fair/poor health are the sensitive answers), and the collector estimates the
   joint table, beside the truth and beside JD-GRR (plain LDP on the same pairs);
6. dphr: a trusted curator publishes the income histogram once under central DP with DPHR
   (sound variant), beside the true histogram and the identity-Laplace baseline;
7. ospdprr: the curator answers "mean income" once with OSPDPRR, where each person's own
   sensitivity level drives how likely they are to be used, beside the truth and beside the
   one-sided OsdpRR baseline.

True values are printed beside the estimates only because the demo data is synthetic.

``ldp-beam demo --stream`` is the live counterpart (:mod:`.demo_stream`): simulated devices
publish to Google's Pub/Sub emulator and the collector estimates each window as it closes.
"""
from __future__ import annotations

import os
import sys
import tempfile
from importlib import resources
from importlib.util import find_spec
from typing import Any, Iterable, TextIO

import numpy as np
import pyarrow.parquet as pq

from ldp_beam.estimators.density import DensityGrid, indicators, wasserstein_grid
from ldp_beam.privacy import compose
from ldp_beam.registry import build_mechanism
from ldp_beam.reproduce.metrics import range_query_mse
from ldp_beam.reproduce.recipe import pyplot

from .collect import run_collect
from .common import format_table, records_line, say, scratch_ledger
from .estimate import run_estimate
from .sample_data import EMPLOYMENT, HEALTH

LOWER, UPPER = 0.0, 100.0


def sample_path() -> str:
    return str(resources.files("ldp_beam.pipelines") / "data" / "survey_sample.parquet")


def _truth(path: str, epsilon: float) -> dict[str, Any]:
    df = pq.read_table(path).to_pandas()
    age, pref = df["age"].to_numpy(float), df["privacy_preference"].to_numpy(float)
    valid = np.isnan(age) | ((age >= LOWER) & (age <= UPPER))
    ans = valid & ~np.isnan(age) & (pref >= epsilon)
    out = {"n_valid": int(valid.sum()), "missing_rate": 1 - ans.sum() / valid.sum(),
           "mean": float(age[ans].mean()), "sum": float(age[ans].sum()),
           "answering": int(ans.sum()), "by_region": {}}
    for reg in sorted(df["region"].astype(str).unique()):
        m = ans & (df["region"].astype(str).to_numpy() == reg)
        out["by_region"][reg] = float(age[m].mean())
    return out


def _row(label: str, truth: float, stat: dict, digits: int = 3) -> str:
    val, ci = stat.get("value"), stat.get("ci95")
    v = "undefined" if val is None else f"{val:.{digits}f}"
    ci_text = "" if ci is None else f"[{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    return f"  {label:<28}{truth:>12.{digits}f}{v:>12}   {ci_text}"


def _pyplot():
    """matplotlib's pyplot (Agg), or None without matplotlib (the ``reproduce`` extra; run_demo
    says so once): a figure is a convenience, never a reason to fail the job."""
    try:
        return pyplot()
    except Exception:
        return None


def _finish_plot(plt, fig, ax, path: str, xlabel: str, ylabel: str, title: str) -> str:
    """The end of the demo's one-panel figures: axis labels, the title, the legend, then laid
    out, saved as ``path``, closed. Returns ``path``."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _plot(path: str, truth: dict, by_region: dict, epsilon: float) -> str | None:
    plt = _pyplot()
    if plt is None:
        return None
    regions = sorted(by_region)
    est = [by_region[r]["statistics"]["mean"]["value"] for r in regions]
    lo = [by_region[r]["statistics"]["mean"]["ci95"][0] for r in regions]
    hi = [by_region[r]["statistics"]["mean"]["ci95"][1] for r in regions]
    tru = [truth["by_region"][r] for r in regions]
    x = np.arange(len(regions))
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.errorbar(x, est, yerr=[np.subtract(est, lo), np.subtract(hi, est)], fmt="o", capsize=4,
                label="BiSample-MD estimate (95% CI)")
    ax.scatter(x, tru, marker="x", color="black", zorder=3, label="true mean (answering people)")
    ax.set_xticks(x, regions)
    return _finish_plot(plt, fig, ax, path, "region", "mean age (years)",
                        "Mean age per region from BiSample-MD reports (LDP, epsilon = "
                        f"{epsilon:g})")


def bisample_section(data: str, out_dir: str, epsilon: float, seed: Any,
                     beam_args: Iterable[str], w) -> dict:
    """BiSample-MD on age: missing rate, answering mean and sum, per region; Harmony contrast."""
    cols = {"value": "age", "preference": "privacy_preference"}
    md = build_mechanism("bisample-md", epsilon=epsilon, lower=LOWER, upper=UPPER)
    say(f"[demo] bisample 1/4 collect: BiSample-MD (epsilon={epsilon}) over {data}")
    reports = os.path.join(out_dir, "reports_bisample_md.parquet")
    man = run_collect(data, reports, md, cols, keep=("region",), public=("region",),
                      seed=seed, beam_args=beam_args, force=True)
    say("[demo] bisample 2/4 estimate: overall")
    est = run_estimate(reports, os.path.join(out_dir, "estimate.json"), beam_args=beam_args, force=True)
    say("[demo] bisample 3/4 estimate: per region")
    per = run_estimate(reports, os.path.join(out_dir, "estimate_by_region.json"), by="region",
                       beam_args=beam_args, force=True)
    say("[demo] bisample 4/4 contrast: Harmony with random fake answers")
    hm = build_mechanism("harmony", epsilon=epsilon, lower=LOWER, upper=UPPER, fake="rnd",
                         allow_missing=True)
    h_reports = os.path.join(out_dir, "reports_harmony.parquet")
    run_collect(data, h_reports, hm, cols, seed=seed, beam_args=beam_args, force=True)
    h_est = run_estimate(h_reports, os.path.join(out_dir, "estimate_harmony.json"),
                         beam_args=beam_args, force=True)
    truth = _truth(data, epsilon)
    figure = _plot(os.path.join(out_dir, "mean_age_by_region.png"), truth, per["estimates"],
                   epsilon)

    s = est["estimate"]["statistics"]
    w("\n== BiSample-MD: mean age with missing answers (LDP) ==\n")
    w("  records: " + records_line(man, f"reasons in {os.path.basename(man['dead_letter'])}")
      + "\n")
    w(f"  privacy: each person sent one report: {md.guarantee.describe()} "
      f"(every number below is post-processing of those reports)\n\n")
    w(f"  {'statistic':<28}{'true':>12}{'estimate':>12}   95% CI\n")
    w(_row("missing rate", truth["missing_rate"], s["missing_rate"]) + "\n")
    w(_row("mean age (answering)", truth["mean"], s["mean"], 2) + "\n")
    w(_row("sum of ages (answering)", truth["sum"], s["sum"], 0) + "\n")
    w("\n  mean age per region (answering people):\n")
    for reg, e in per["estimates"].items():
        w(_row(f"  {reg}", truth["by_region"][reg], e["statistics"]["mean"], 2) + "\n")
    hs = h_est["estimate"]["statistics"]["mean"]
    w("\n  contrast: Harmony forces an answer, so non-answering people send random fakes:\n")
    w(_row("mean age (Harmony, RND)", truth["mean"], hs, 2) + "\n")
    both = compose([md.guarantee, hm.guarantee])
    w(f"  (a separate collection: running both on the same people would cost "
      f"{both.describe()} by sequential composition)\n")
    if figure:
        w(f"  figure: {figure}\n")
    return {"manifest": man, "estimate": est, "by_region": per, "harmony": h_est,
            "truth": truth, "figure": figure}


def _plot_density(path: str, values: np.ndarray, est: dict, lo: float, hi: float,
                  title: str) -> str | None:
    plt = _pyplot()
    if plt is None:
        return None
    st = est["statistics"]
    z, v = np.asarray(st["grid"]["value"]), np.asarray(st["density"]["value"])
    fig, ax = plt.subplots(figsize=(6.5, 3.5), dpi=100)
    ax.hist(values, bins=len(z) // 2, range=(lo, hi), density=True, color="0.8",
            label="true values (histogram)")
    ax.plot(z, v, lw=2, label="reconstructed from RVNS reports")
    return _finish_plot(plt, fig, ax, path, "income (thousands)", "density", title)


INCOME = (0.0, 250.0)


def rvns_section(data: str, out_dir: str, epsilon: float, seed: Any,
                 beam_args: Iterable[str], w) -> dict:
    """RVNS on income: a density reconstructed from negative reports, six indicators beside the
    truth. d = 25, delta = 50 on [0, 250]: the exact neighbourhood-LDP epsilon is ln 2."""
    lo, hi = INCOME
    mech = build_mechanism("rvns", lower=lo, upper=hi, d=25.0, k=1, delta=50.0)
    say("[demo] rvns 1/2 collect: RVNS (d=25, k=1) over income")
    reports = os.path.join(out_dir, "reports_rvns.parquet")
    man = run_collect(data, reports, mech, {"value": "income"}, seed=seed, beam_args=beam_args,
                      force=True)
    say("[demo] rvns 2/2 estimate: density on 100 cells")
    est = run_estimate(reports, os.path.join(out_dir, "estimate_rvns.json"),
                       options={"m": 100}, beam_args=beam_args, force=True)["estimate"]
    income = pq.read_table(data, columns=["income"])["income"].to_numpy().astype(float)
    x = income[(income >= lo) & (income <= hi)]
    # lazy: scipy.stats costs 0.8 s at import (measured, after this module's imports); only
    # this section needs it, and `demo --section` can leave it out
    from scipy import stats as sps

    grid = DensityGrid(lo, hi, 100)
    hist = np.histogram(x, bins=grid.edges)[0].astype(float)
    true_ind = {"mean": float(x.mean()), "std": float(x.std()),
                "mode": indicators(grid, hist / (hist.sum() * grid.width))["mode"],
                "median": float(np.median(x)), "skewness": float(sps.skew(x)),
                "kurtosis": float(sps.kurtosis(x))}
    st = est["statistics"]
    figure = _plot_density(os.path.join(out_dir, "income_density_rvns.png"), x, est, lo, hi,
                           f"Income density from {est['n_reports']:,} RVNS reports (each says "
                           f"where the value is NOT; neighbourhood-LDP, epsilon = "
                           f"{mech.guarantee.epsilon:.3g})")
    g = mech.guarantee
    w("\n== RVNS: the income distribution from negative reports ==\n")
    w("  records: " + records_line(man, f"income outside [{lo:g}, {hi:g}]") + "\n")
    w(f"  privacy: {g.describe()} with neighbourhood delta = {g.params['neighbourhood_delta']:g} "
      f"(outputs closer than that count as one); the paper's formula gives "
      f"{g.params.get('paper_epsilon', float('nan')):.3g} here\n\n")
    w(f"  {'indicator':<28}{'true':>12}{'estimate':>12}\n")
    for k in ("mean", "std", "mode", "median", "skewness", "kurtosis"):
        w(f"  {k:<28}{true_ind[k]:>12.2f}{st[k]['value']:>12.2f}\n")
    wd = wasserstein_grid(hist, np.asarray(st["density"]["value"]))
    w(f"  Wasserstein distance to the true histogram (Eq. 19, 100 cells): {wd:.3f} "
      f"(= {wd * grid.width:.2f} thousand in income units)\n")
    w("  (true indicators from the raw values; the mode from the densest of the 100 cells)\n")
    if figure:
        w(f"  figure: {figure}\n")
    return {"manifest": man, "estimate": est, "truth": true_ind, "figure": figure,
            "wasserstein": wd}


def _plot_joint(path: str, tables: dict[str, np.ndarray], rows, cols,
                title: str) -> str | None:
    plt = _pyplot()
    if plt is None:
        return None
    vmax = max(float(t.max()) for t in tables.values())
    fig, axes = plt.subplots(1, len(tables), figsize=(3.6 * len(tables), 3.4), dpi=100)
    for k, (ax, (name, t)) in enumerate(zip(axes, tables.items())):
        im = ax.imshow(t, vmin=0, vmax=vmax, cmap="viridis")
        for i in range(t.shape[0]):
            for j in range(t.shape[1]):
                ax.text(j, i, f"{t[i, j]:.3f}", ha="center", va="center", fontsize=7,
                        color="white" if t[i, j] < vmax / 2 else "black")
        ax.set_xticks(range(len(cols)), cols, rotation=30, fontsize=7)
        ax.set_yticks(range(len(rows)), rows if k == 0 else [""] * len(rows), fontsize=7)
        ax.set_xlabel("health", fontsize=8)
        if k == 0:
            ax.set_ylabel("employment", fontsize=8)
        ax.set_title(name, fontsize=9)
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="share of people")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def uldp_section(data: str, out_dir: str, epsilon: float, seed: Any,
                 beam_args: Iterable[str], w) -> dict:
    """CPRR on (employment, health): the joint table under utility-optimized LDP, beside the
    truth and beside JD-GRR (eps-LDP on the product domain) on the same pairs."""
    cols = {"x": "employment", "y": "health"}
    params = dict(epsilon=epsilon, x_domain=EMPLOYMENT, y_domain=HEALTH)
    cprr = build_mechanism("cprr", **params, x_sensitive=("unemployed",),
                           y_sensitive=("fair", "poor"))
    jd = build_mechanism("jd-grr", **params)
    results = {}
    for step, mech in enumerate((cprr, jd), 1):
        say(f"[demo] uldp {step}/2 collect and estimate: {mech.name} (epsilon={epsilon}) over "
            "(employment, health)")
        reports = os.path.join(out_dir, f"reports_{mech.name}.parquet")
        man = run_collect(data, reports, mech, cols, seed=seed, beam_args=beam_args, force=True)
        est = run_estimate(reports, os.path.join(out_dir, f"estimate_{mech.name}.json"),
                           beam_args=beam_args, force=True)["estimate"]
        results[mech.name] = {"manifest": man, "estimate": est}
    df = pq.read_table(data, columns=["employment", "health"]).to_pandas()
    ok = df["employment"].isin(EMPLOYMENT) & df["health"].isin(HEALTH)
    truth = (df[ok].groupby(["employment", "health"]).size().unstack(fill_value=0)
             .reindex(index=list(EMPLOYMENT), columns=list(HEALTH), fill_value=0)
             .to_numpy(float, copy=True))
    truth /= truth.sum()
    st = results["cprr"]["estimate"]["statistics"]
    joint = np.asarray(st["joint"]["clipped"])
    raw, se = np.asarray(st["joint"]["value"]), np.asarray(st["joint"]["stderr"])
    ed = {name: float(np.sqrt(np.mean((np.asarray(r["estimate"]["statistics"]["joint"]["value"])
                                       - truth) ** 2))) for name, r in results.items()}
    inside = float(np.mean(np.abs(raw - truth) <= 1.96 * se))
    figure = _plot_joint(os.path.join(out_dir, "joint_employment_health.png"),
                         {"true joint": truth, f"CPRR (eps={epsilon:g}, consistent)": joint,
                          "JD-GRR (consistent)": np.asarray(
                              results["jd-grr"]["estimate"]["statistics"]["joint"]["clipped"])},
                         EMPLOYMENT, HEALTH,
                         f"Joint table of employment and health (utility-optimized LDP, "
                         f"epsilon = {epsilon:g})")
    man = results["cprr"]["manifest"]
    w("\n== CPRR: the joint table of two categorical answers (utility-optimized LDP) ==\n")
    w("  records: " + records_line(man, "null or unknown labels") + "\n")
    w(f"  privacy: {cprr.guarantee.describe()}; sensitive answers: unemployed, fair, poor. A "
      "pair is released as itself only when both answers are non-sensitive.\n\n")
    w("  joint frequency, CPRR consistent estimate (true value in parentheses):\n")
    table = format_table(joint, EMPLOYMENT, HEALTH, extra=truth)
    w("".join("    " + line + "\n" for line in table.split("\n")))
    w(f"\n  {100 * inside:.0f}% of the {raw.size} true cells lie inside the raw estimate's "
      "95% CI (about 95% expected)\n")
    w("\n  share in fair or poor health, by employment (from the consistent joint):\n")
    cond = np.asarray(st["y_given_x"]["value"])
    for i, lab in enumerate(EMPLOYMENT):
        w(f"    {lab:<16}{cond[i, 2:].sum():>8.3f}   "
          f"(true {truth[i, 2:].sum() / truth[i].sum():.3f})\n")
    w(f"\n  error (ED, Eq. 59 of the JuRR/CPRR paper): CPRR {ed['cprr']:.4f} vs JD-GRR "
      f"{ed['jd-grr']:.4f} ({jd.guarantee.describe()} on the same pairs, a separate "
      "collection)\n")
    if figure:
        w(f"  figure: {figure}\n")
    return {"results": results, "truth": truth, "ed": ed, "coverage": inside, "figure": figure}


HIST_EPSILON = 0.1  # small enough that grouping visibly beats per-bucket noise
HIST_BINS = 250


def _plot_hist(path: str, edges: np.ndarray, series: dict[str, np.ndarray]) -> str | None:
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    mid = (edges[:-1] + edges[1:]) / 2
    styles = {"true counts": dict(color="black", lw=1.6),
              "identity Laplace": dict(color="0.65", lw=0.8),
              "DPHR (sound)": dict(color="tab:red", lw=1.4)}
    for name, y in series.items():
        ax.step(mid, y, where="mid", label=name, **styles.get(name, {}))
    return _finish_plot(plt, fig, ax, path, "income (thousands)", "records per bucket",
                        "Income histogram published under central DP (epsilon = "
                        f"{HIST_EPSILON:g})")


def dphr_section(data: str, out_dir: str, epsilon: float, seed: Any,
                 beam_args: Iterable[str], w) -> dict:
    """DPHR on the curator: the income histogram released once, beside the truth and LPA."""
    lo, hi = INCOME
    params = dict(epsilon=HIST_EPSILON, bins=HIST_BINS, lower=lo, upper=hi)
    options = {} if seed is None else {"seed": seed}
    out = {}
    for step, name in enumerate(("dphr", "laplace-histogram"), 1):
        say(f"[demo] dphr {step}/2 release: {name} (epsilon={HIST_EPSILON}) of the income "
            "histogram, on the curator")
        mech = build_mechanism(name, **params)
        out[name] = run_estimate(data, os.path.join(out_dir, f"release_{name}.json"), mech,
                                 options=options, beam_args=beam_args, force=True,
                                 columns={"value": "income"})
    income = pq.read_table(data, columns=["income"])["income"].to_numpy().astype(float)
    ok = income[(income >= lo) & (income <= hi)]
    edges = np.linspace(lo, hi, HIST_BINS + 1)
    true = np.histogram(ok, bins=edges)[0].astype(float)
    rel = {k: np.asarray(v["estimate"]["statistics"]["histogram"]["value"])
           for k, v in out.items()}
    lengths = (1, 10, 50)
    mse = {k: range_query_mse(true, h, lengths) for k, h in rel.items()}
    groups = len(set(out["dphr"]["estimate"]["statistics"]["groups"]["value"]))
    figure = _plot_hist(os.path.join(out_dir, "income_histogram_dphr.png"), edges,
                        {"true counts": true, "identity Laplace": rel["laplace-histogram"],
                         "DPHR (sound)": rel["dphr"]})
    cur = out["dphr"]["curator"]["records"]
    g = out["dphr"]["guarantee"]
    w("\n== DPHR: a histogram published once by a trusted curator (central DP) ==\n")
    w(f"  records: {cur['input']:,} read = {cur['released_from']:,} in the histogram + "
      f"{cur['dead_lettered']:,} dead-lettered (income outside [{lo:g}, {hi:g}]; curator-only "
      "bookkeeping, not part of the release)\n")
    # the summary states the unit; the notes' first part is the budget split (their unit
    # sentences repeat the summary's)
    w(f"  privacy: {g['summary']}; {g['notes'].split(' Unit: ')[0]}\n")
    w(f"  {HIST_BINS} buckets in {groups} groups; mean squared error of range-count queries:\n")
    w(f"    {'range length':<16}" + "".join(f"{L:>14}" for L in lengths) + "\n")
    for k in ("dphr", "laplace-histogram"):
        w(f"    {k:<16}" + "".join(f"{v:>14.1f}" for v in mse[k]) + "\n")
    if mse["dphr"][-1] > mse["laplace-histogram"][-1]:
        w("  here per-bucket Laplace noise is more accurate: grouping a noisy view of this smooth "
          "histogram puts buckets of different counts together, and their shared means err in "
          "the same direction over whole ranges (docs/results_dphr.md measures where grouping "
          "pays)\n")
    if figure:
        w(f"  figure: {figure}\n")
    return {"releases": out, "true": true, "mse": mse, "groups": groups, "figure": figure}


OSP_T = 0.8


def ospdprr_section(data: str, out_dir: str, epsilon: float, seed: Any,
                    beam_args: Iterable[str], w) -> dict:
    """OSPDPRR (sound-self, t = 0.8) and OsdpRR (eps = t) on mean income, on the curator."""
    lo, hi = INCOME
    roles = {"value1": "income", "level1": "income_sensitivity"}
    common = dict(query="mean", k=1, lower=lo, upper=hi)
    options = {} if seed is None else {"seed": seed}
    mechs = {"ospdprr": build_mechanism("ospdprr", t=OSP_T, **common),
             "osdp-rr": build_mechanism("osdp-rr", epsilon=OSP_T, **common)}
    out = {}
    for step, (name, mech) in enumerate(mechs.items(), 1):
        say(f"[demo] ospdprr {step}/2 release: {name} mean income, on the curator")
        out[name] = run_estimate(data, os.path.join(out_dir, f"release_{name}.json"), mech,
                                 options=options, beam_args=beam_args, force=True, columns=roles)
    t = pq.read_table(data, columns=["income", "income_sensitivity"])
    income = t["income"].to_numpy().astype(float)
    level = t["income_sensitivity"].to_numpy().astype(float)
    ok = (income >= lo) & (income <= hi)
    true = float(income[ok].mean())
    cur = out["ospdprr"]["curator"]["records"]
    w("\n== OSPDPRR: one query, personalized by each person's own sensitivity (central DP) ==\n")
    w(f"  records: {cur['input']:,} read = {cur['released_from']:,} used + "
      f"{cur['dead_lettered']:,} dead-lettered (income outside [{lo:g}, {hi:g}]; curator-only "
      "bookkeeping)\n")
    w(f"  {100 * (level[ok] > 0).mean():.0f}% of people call their income sensitive; they are "
      "sampled less often, and the answer gets Laplace noise with budget t\n\n")
    w(f"  {'mean income (thousands)':<34}{'value':>10}\n")
    w(f"  {'true (all valid records)':<34}{true:>10.2f}\n")
    for name in mechs:
        st = out[name]["estimate"]["statistics"]["mean"]["value"]
        w(f"  {name:<34}{st:>10.2f}   {out[name]['guarantee']['summary']}\n")
    w("  ospdprr: every person gets t-DP at user level, and a person u pays only min(M_u, t), "
      "less the more sensitive they are; because sensitive people are sampled less and earn "
      "more here, its mean is biased down too, by less\n")
    w("  osdp-rr releases a truthful sample of the non-sensitive records only, so it never sees "
      "the (richer) people who call their income sensitive: its mean is biased down, and its "
      "one-sided guarantee protects nobody who is not sensitive\n")
    return {"releases": out, "true_mean": true}


SECTIONS = {"bisample": bisample_section, "rvns": rvns_section, "uldp": uldp_section,
            "dphr": dphr_section, "ospdprr": ospdprr_section}


def run_demo(out_dir: str | None = None, epsilon: float = 3.0, seed: Any = None,
             beam_args: Iterable[str] = (), stream: TextIO | None = None,
             sections: Iterable[str] | None = None) -> dict:
    """Run every demo section (or those named) on the bundled sample through Beam."""
    out_dir = out_dir or tempfile.mkdtemp(prefix="ldp-beam-demo-")
    os.makedirs(out_dir, exist_ok=True)
    data = sample_path()
    names = list(sections) if sections else list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown demo section(s) {unknown}; available: {list(SECTIONS)}")
    w = (stream or sys.stdout).write  # resolved per call: a default bound at import would outlive a redirect
    w(f"\nldp-beam demo on the bundled survey sample ({data}; Apache Beam, DirectRunner)\n")
    if find_spec("matplotlib") is None:
        w("  figures: skipped, they need matplotlib (pip install 'ldp-beam[reproduce]')\n")
    results = {"out_dir": out_dir}
    with scratch_ledger():  # the demo's runs are recorded in a ledger of their own
        for name in names:
            results[name] = SECTIONS[name](data, out_dir, epsilon, seed, beam_args, w)
    w(f"\n  all outputs in {out_dir}\n")
    return results
