"""The measurements behind docs/rvns_reconstruction.md (not part of the library, not a test).

    python docs/rvns_compare.py [--study fit-rules|main|em-options|paper-options|n-rule|timing|all]
                                [--reps R] [--json FILE]

Data as in the paper's Section V: chi-squared(df) values kept in [0, 10]. We *redraw* until
exactly n values fall in [0, 10] (a chi-squared truncated to [0, 10]), so every dataset has
exactly n users. The metric is the paper's Eq. 19, the sum over the m grid points of |CDF
difference| between the true histogram of the data on the grid and the estimate (multiply by the
cell width for the W1 distance in data units). Each number is a mean over ``reps`` repetitions
(fresh data and fresh reports each time; seeds fixed).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time

import numpy as np

from ldp_beam.estimators.density import wasserstein_grid
from ldp_beam.reproduce.datasets import chi2_truncated
from ldp_beam.estimators.rvns import RVNSEstimator
from ldp_beam.mechanisms.rvns import RVNS

A, B = 0.0, 10.0




def compare_methods(variants: dict[str, dict], dfs=(2, 3, 5, 8, 10), ds=(0.5, 1.0, 2.0, 4.0),
                    ks=(1, 3), n: int = 50_000, m: int = 100, reps: int = 11, seed: int = 2024,
                    progress: bool = True) -> list[dict]:
    """Eq. 19 Wasserstein distance of each reconstruction variant (name -> RVNSEstimator
    options; an option value may be a callable f(n, d, k) -> value) on every (df, d, k).
    Returns one record per (variant, df, d, k): mean and sd over reps, mean seconds."""
    rows: dict[tuple, list] = {}
    for df, rep in itertools.product(dfs, range(reps)):
        rng = np.random.default_rng([seed, int(df * 10), rep])
        x = chi2_truncated(df, n, rng)
        truth = np.histogram(x, bins=np.linspace(A, B, m + 1))[0].astype(float)
        for d, k in itertools.product(ds, ks):
            mech = RVNS(lower=A, upper=B, d=d, k=k)
            acc = None
            for name, opts in variants.items():
                opts = {o: (v(n, d, k) if callable(v) else v) for o, v in opts.items()}
                est = _estimator(mech, m, opts)
                if acc is None:
                    acc = est.add(est.create(), mech.perturb(x, rng=np.random.default_rng(
                        [seed, int(df * 10), rep, int(d * 100), k])))
                rec = est.reconstruct(acc)
                w = wasserstein_grid(truth, rec.density)
                rows.setdefault((name, df, d, k), []).append(
                    (w, rec.seconds, rec.iterations, rec.converged))
        if progress:
            print(f"  df={df} rep={rep} done", file=sys.stderr, flush=True)
    out = []
    for (name, df, d, k), vals in rows.items():
        arr = np.array([v[0] for v in vals])
        out.append({"experiment": "rvns-reconstruction", "dataset": f"chi2({df:g})",
                    "method": name, "metric": "wasserstein_eq19", "value": float(arr.mean()),
                    "sd": float(arr.std(ddof=1)) if arr.size > 1 else None, "df": df, "d": d,
                    "k": k, "n": n, "m": m, "reps": len(vals), "values": arr.tolist(),
                    "seconds": float(np.mean([v[1] for v in vals])),
                    "iterations": float(np.mean([v[2] for v in vals])),
                    "converged": float(np.mean([v[3] for v in vals]))})
    return out


def table(records: list[dict], cols: list[str], dfs, ds, ks) -> str:
    """Markdown: one row per (d, k), one column per (variant, df) ... per variant block."""
    by = {(r["method"], r["df"], r["d"], r["k"]): r for r in records}
    lines = []
    head = "| d | k | " + " | ".join(f"df={df:g}" for df in dfs) + " | mean |"
    for name in cols:
        lines.append(f"\n**{name}**\n")
        lines.append(head)
        lines.append("|" + "---|" * (len(dfs) + 3))
        for d, k in itertools.product(ds, ks):
            vals = [by[(name, df, d, k)]["value"] for df in dfs if (name, df, d, k) in by]
            if not vals:
                continue
            lines.append(f"| {d:g} | {k} | " + " | ".join(f"{v:.2f}" for v in vals)
                         + f" | {np.mean(vals):.2f} |")
    return "\n".join(lines)


def side_by_side(records: list[dict], names: list[str], dfs, ds, ks) -> str:
    """Markdown: rows (df, d, k) or (d, k) averaged over df; one column per variant."""
    by = {(r["method"], r["df"], r["d"], r["k"]): r for r in records}
    lines = ["| d | k | " + " | ".join(names) + " | best |", "|" + "---|" * (len(names) + 3)]
    for d, k in itertools.product(ds, ks):
        means = []
        for name in names:
            vals = [by[(name, df, d, k)]["value"] for df in dfs if (name, df, d, k) in by]
            means.append(np.mean(vals) if vals else np.nan)
        if np.all(np.isnan(means)):
            continue
        best = names[int(np.nanargmin(means))]
        lines.append(f"| {d:g} | {k} | " + " | ".join(f"{v:.2f}" for v in means)
                     + f" | {best} |")
    return "\n".join(lines)


class PointTransitionEstimator(RVNSEstimator):
    """EM with the rectangle rule in x (x at the cell midpoint), as the paper's P does, instead
    of averaging over the cell; still exact over each report bin."""

    def em_matrix(self) -> np.ndarray:
        key = ("A-point", self.report_bins)
        if key not in self._cache:
            from ldp_beam.estimators.rvns import transition_matrix

            mech = self.mechanism
            _, edges = self._report_grouping()
            self._cache[key] = transition_matrix(edges, self.grid.edges, mech.lower, mech.upper,
                                                 mech.d, quad=1)
        return self._cache[key]


class DensityTransitionEstimator(RVNSEstimator):
    """EM with the paper's rectangle rule in both x and y: Pr(bin r | cell i) ~ p(z_i, c_r) dy,
    columns renormalized to sum 1."""

    def em_matrix(self) -> np.ndarray:
        key = ("A-dens", self.report_bins)
        if key not in self._cache:
            from ldp_beam.mechanisms.rvns import rvns_density

            mech = self.mechanism
            _, edges = self._report_grouping()
            c = (edges[1:] + edges[:-1]) / 2
            T = rvns_density(self.grid.points[None, :], c[:, None], mech.lower, mech.upper,
                             mech.d) * np.diff(edges)[:, None]
            self._cache[key] = T / T.sum(axis=0, keepdims=True)
        return self._cache[key]


def _estimator(mech, m, opts):
    opts = dict(opts)
    kind = opts.pop("_transition", None)
    cls = {None: RVNSEstimator, "point": PointTransitionEstimator,
           "density": DensityTransitionEstimator}[kind]
    return cls(mech, m=m, **opts)


def _em_rule(f):
    return lambda n, d, k: f * 0.65 * (B - A) * (d / ((B - A) * n * k)) ** 0.4


def _paper_rule(f):
    return lambda n, d, k: f * 0.01 * (d / ((B - A) * n * k)) ** 0.6


def paired(records: list[dict], a: str, b: str, dfs, ds, ks) -> str:
    """Markdown: mean paired difference b - a (same data, same reports) over df and reps, with
    its standard error."""
    by = {(r["method"], r["df"], r["d"], r["k"]): r for r in records}
    lines = [f"| d | k | {b} - {a} | standard error | verdict |", "|---|---|---|---|---|"]
    for d, k in itertools.product(ds, ks):
        diffs = np.concatenate([np.subtract(by[(b, df, d, k)]["values"],
                                            by[(a, df, d, k)]["values"])
                                for df in dfs if (a, df, d, k) in by])
        if diffs.size == 0:
            continue
        mean, se = diffs.mean(), diffs.std(ddof=1) / math.sqrt(diffs.size)
        verdict = "tie (|diff| < 2 se)" if abs(mean) < 2 * se else (f"{a} better" if mean > 0
                                                                  else f"{b} better")
        lines.append(f"| {d:g} | {k} | {mean:+.3f} | {se:.3f} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--study", default="main",
                    help="fit-rules, main, em-options, paper-options, n-rule, timing or all")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    dfs, ds, ks = (2, 3, 5, 8, 10), (0.5, 1.0, 2.0, 4.0), (1, 3)
    records: list[dict] = []
    studies = ["fit-rules", "main", "em-options", "paper-options", "n-rule", "timing"] \
        if args.study == "all" else [args.study]
    for study in studies:
        t0 = time.perf_counter()
        recs: list[dict] = []
        if study == "main":
            names = {"em": {}, "paper": {"method": "paper"}}
            recs = compare_methods(names, dfs, ds, ks, reps=args.reps or 11)
            print("\n## main: EM default vs paper default (Eq. 19, mean over df)\n")
            print(side_by_side(recs, list(names), dfs, ds, ks))
            print("\nPaired difference (same data and reports; over df and reps):\n")
            print(paired(recs, "em", "paper", dfs, ds, ks))
            print(table(recs, list(names), dfs, ds, ks))
        elif study == "em-options":
            names = {"em (default)": {}, "plain EM (no smoothing)": {"smoothing": 0.0}}
            for f in (0.25, 0.5, 2.0, 4.0):
                names[f"smoothing x{f:g}"] = {"smoothing": _em_rule(f)}
            names["EMS [1,2,1]/4 (sd 0.71 cell)"] = {"smoothing": 0.0707}
            names["report bins = m"] = {"report_bins": 100}
            names["report bins = 4096 (all)"] = {"report_bins": 4096}
            names["x at cell midpoint"] = {"_transition": "point"}
            names["p(z_i, y_r) dy (paper's rule)"] = {"_transition": "density"}
            recs = compare_methods(names, dfs, ds, ks, reps=args.reps or 5)
            print("\n## em-options (mean over df)\n")
            print(side_by_side(recs, list(names), dfs, ds, ks))
        elif study == "paper-options":
            w = (B - A) / 100
            names = {"paper (default)": {"method": "paper"}}
            for h, bd in itertools.product((0.5 * w, w, 2 * w, "silverman"), ("reflect", "none")):
                if h == 0.5 * w and bd == "reflect":
                    continue
                key = f"h={'silverman' if h == 'silverman' else f'{h / w:g}w'} {bd}"
                hh = (lambda n, d, k: 1.06 * (B - A) / 12 ** 0.5 * (n * k) ** -0.2) \
                    if h == "silverman" else h
                names[key] = {"method": "paper", "bandwidth": hh, "boundary": bd}
            names["reg_smooth=0"] = {"method": "paper", "reg_smooth": 0.0}
            for f in (0.1, 0.3, 3.0, 10.0):
                names[f"reg_smooth x{f:g}"] = {"method": "paper", "reg_smooth": _paper_rule(f)}
            for l2 in (1e-4, 1e-3, 1e-2):
                names[f"L1+L2 only (l1=1, l2={l2:g})"] = {
                    "method": "paper", "reg_smooth": 0.0, "reg_l1": 1.0, "reg_l2": l2}
            recs = compare_methods(names, dfs, ds, (1,), reps=args.reps or 3)
            print("\n## paper-options (k=1, mean over df)\n")
            print(side_by_side(recs, list(names), dfs, ds, (1,)))
        elif study == "n-rule":
            for n in (2_000, 10_000, 50_000, 200_000, 1_000_000):
                names = {"em": {}, "paper": {"method": "paper"},
                         "em smoothing x0.5": {"smoothing": _em_rule(0.5)},
                         "em smoothing x2": {"smoothing": _em_rule(2.0)}}
                r = compare_methods(names, (2, 5, 10), ds, ks, n=n,
                                    reps=args.reps or (5 if n < 500_000 else 2))
                recs += r
                print(f"\n## n-rule: n = {n} (df 2, 5, 10)\n")
                print(side_by_side(r, list(names), (2, 5, 10), ds, ks))
        elif study == "timing":
            recs = timing()
        elif study == "fit-rules":
            recs = fit_rules(args.reps)
        else:
            ap.error(f"unknown study {study!r}")
        for r in recs:
            r["study"] = study
        records += recs
        print(f"\n({study}: {time.perf_counter() - t0:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh, indent=1)
    return 0


def fit_rules(reps: int | None = None) -> list[dict]:
    """The least-squares fits behind the default rules: for each (n, d, k), Eq. 19 (mean over
    df in {2, 5, 10} and reps; seeds differ from the tables') on a grid of weights, the optimum
    by a parabola in log(weight) through the best three, then
    log(optimum) = c0 + c1 log(d / (b - a)) + c2 log(n k). Prints the fit and how far the chosen
    rules are from the per-configuration best (mean and worst ratio)."""
    span = B - A
    setups = {
        "em": ("smoothing", (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.6, 0.8),
               lambda c, n, d, k: c * span * (n * k) ** -0.4,
               (2_000, 10_000, 50_000, 200_000, 1_000_000), {},
               lambda n, d, k: 0.65 * span * (d / (span * n * k)) ** 0.4),
        "paper": ("reg_smooth", (1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4),
                  lambda c, n, d, k: c, (10_000, 50_000, 200_000), {"method": "paper"},
                  lambda n, d, k: 0.01 * (d / (span * n * k)) ** 0.6),
    }
    out = []
    for method, (opt, grid, value, ns, extra, rule) in setups.items():
        rows, X, Y, ratios = {}, [], [], []
        for n in ns:
            names = {f"{c:g}": {**extra, opt: (lambda n_, d, k, c=c: value(c, n_, d, k))}
                     for c in grid}
            names["rule"] = {**extra}
            r = compare_methods(names, (2, 5, 10), (0.5, 1.0, 2.0, 4.0), (1, 3), n=n,
                                reps=reps or (4 if n <= 50_000 else 2 if n < 10 ** 6 else 1),
                                seed=7, progress=False)
            out += [dict(x, study="fit-rules", fitted=method) for x in r]
            for x in r:
                rows.setdefault((n, x["d"], x["k"], x["method"]), []).append(x["value"])
        for n, d, k in itertools.product(ns, (0.5, 1.0, 2.0, 4.0), (1, 3)):
            W = np.array([np.mean(rows[(n, d, k, f"{c:g}")]) for c in grid])
            lw = np.log([value(c, n, d, k) for c in grid])
            j = int(np.clip(np.argmin(W), 1, len(grid) - 2))
            a2, a1, _ = np.polyfit(lw[j - 1:j + 2], W[j - 1:j + 2], 2)
            best = -a1 / (2 * a2) if a2 > 0 else lw[j]
            X.append([1.0, math.log(d / span), math.log(n * k)])
            Y.append(float(np.clip(best, lw[0], lw[-1])))
            ratios.append(np.mean(rows[(n, d, k, "rule")]) / W.min())
        coef, *_ = np.linalg.lstsq(np.array(X), np.array(Y), rcond=None)
        print(f"\n## fit-rules: {method} {opt}: log(optimum) = {coef[0]:.2f} "
              f"{coef[1]:+.2f} log(d/(b-a)) {coef[2]:+.2f} log(n k); the default rule is "
              f"{np.mean(ratios):.3f}x the per-configuration best on average, "
              f"{np.max(ratios):.3f}x at worst")
    return out


def timing(n: int = 50_000, repeats: int = 5) -> list[dict]:
    """Seconds per finalize (median of ``repeats``; the first call, which also builds the
    transition matrix, separately), chi-squared(3) data, k = 1."""
    rng = np.random.default_rng(99)
    x = chi2_truncated(3, n, rng)
    out = []
    print("\n## timing (seconds per finalize; n = 50,000, chi2(3), k = 1)\n")
    print("| method | m | d | first call | median of later calls | iterations | converged |"
          " Eq. 19 (x 100/m) |")
    print("|---|---|---|---|---|---|---|---|")
    for method, m, d in itertools.product(("em", "paper"), (100, 1000), (0.5, 2.0)):
        mech = RVNS(lower=A, upper=B, d=d, k=1)
        est = RVNSEstimator(mech, m=m, method=method)
        acc = est.add(est.create(), mech.perturb(x, rng=rng))
        truth = np.histogram(x, bins=np.linspace(A, B, m + 1))[0]
        t = time.perf_counter()
        e = est.finalize(acc)
        first = time.perf_counter() - t
        times = []
        for _ in range(repeats if (method, m) != ("paper", 1000) else 0):
            t = time.perf_counter()
            est.finalize(acc)
            times.append(time.perf_counter() - t)
        w = wasserstein_grid(truth, e["density"].value) * 100 / m
        med = float(np.median(times)) if times else float("nan")
        it, conv = e["iterations"].value, e["converged"].value
        print(f"| {method} | {m} | {d:g} | {first:.3f} | {med:.3f} | {it} | {conv} | {w:.2f} |",
              flush=True)
        out.append({"experiment": "rvns-timing", "dataset": "chi2(3)", "method": method,
                    "metric": "seconds_per_finalize", "value": med, "first_call": first,
                    "m": m, "d": d, "k": 1, "n": n, "iterations": it, "converged": conv,
                    "wasserstein_eq19_x100_over_m": w})
    return out


if __name__ == "__main__":
    raise SystemExit(main())
