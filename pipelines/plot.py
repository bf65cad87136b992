"""``estimate --plot FILE.png``: a picture of an estimate or release with its 95% intervals.

Drawn from the tidy rows of the output (:func:`ldp_beam.transforms.sinks.tidy_output`), so
every family is drawn the same way and nothing is drawn that is not in the output:

* groups (``--by``): the main statistic of every group with its interval, one point per group
  (a vector statistic: one line per group); suppressed and failed groups are named under the
  axis, never drawn as numbers;
* one estimate: a scalar as a point with its interval; a vector (frequencies, a histogram, a
  density) as bars or a line over its labels, bucket edges or grid, with intervals where a
  standard error exists; a matrix (a joint table) as a labelled heatmap;
* ``truth`` (the demo's): the true values beside the estimate, as black crosses.

The title names the mechanism, the statistic and the guarantee's kind and epsilon (a seeded
run says it is not private); the axes say what they show. matplotlib is the ``reproduce``
extra: without it :func:`plot_estimate` raises :class:`PlotError` naming the extra.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ldp_beam.reproduce.recipe import pyplot
from ldp_beam.transforms.sinks import tidy_output

#: the statistic drawn, first found: what each family estimates
MAIN = ("mean", "frequency", "histogram", "joint", "density", "sum", "count", "quantiles",
        "variance", "missing_rate")


class PlotError(ValueError):
    """Why a figure cannot be drawn (one line)."""


def _pyplot() -> Any:
    try:
        return pyplot()
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'ldp-beam[reproduce]'") from None


def main_statistic(rows: list[dict]) -> str:
    names = [r["statistic"] for r in rows if r["statistic"] and r["value"] is not None]
    if not names:
        raise PlotError("the output has no numeric statistic to draw")
    return next((name for name in MAIN if name in names), names[0])


def _title(rows: list[dict], stat: str) -> str:
    r = next(r for r in rows if r["statistic"] == stat)
    if r["seeded"]:
        privacy = "seeded: NOT private"
    elif r["epsilon"] is not None:
        privacy = f"{r['guarantee_kind']}, epsilon = {r['epsilon']:g}"
        if r["delta"]:
            privacy += f", delta = {r['delta']:g}"
    else:
        privacy = str(r["guarantee_kind"])
    return f"{r['mechanism']}: {stat} ({privacy}; bars: 95% CI)"


def _cell_label(r: dict) -> str:
    if r["label"] is not None:
        return r["label"]
    if r["bin_low"] is not None:
        return f"{r['bin_low']:g}"
    if r["grid_x"] is not None:
        return f"{r['grid_x']:g}"
    if r["probability"] is not None:
        return f"q{r['probability']:g}"
    return str(r["i"])


def _yerr(sub: list[dict]) -> Any:
    if all(r["ci_low"] is None for r in sub):
        return None
    v = np.array([r["value"] for r in sub], dtype=float)
    lo = np.array([r["value"] if r["ci_low"] is None else r["ci_low"] for r in sub], dtype=float)
    hi = np.array([r["value"] if r["ci_high"] is None else r["ci_high"] for r in sub],
                  dtype=float)
    return [v - lo, hi - v]


def plot_estimate(out: Mapping[str, Any], path: str,
                  truth: Mapping[str, Any] | None = None) -> dict:
    """Draw ``out`` (the dict ``ldp-beam estimate`` writes as JSON) into ``path`` (PNG, SVG or
    PDF by its extension); ``truth``: group -> true value (grouped) or the true vector/value.
    Returns what was drawn: ``{"path", "statistic", "title", "xlabel", "ylabel"}``."""
    rows = tidy_output(out)
    stat = main_statistic(rows)
    sel = [r for r in rows if r["statistic"] == stat and r["value"] is not None]
    plt = _pyplot()
    grouped = "estimates" in out
    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=100)
    try:
        if grouped:
            _draw_groups(ax, rows, sel, stat, out.get("by") or "group", truth)
        elif sel[0]["j"] is not None:
            _draw_matrix(fig, ax, sel, stat)
        elif sel[0]["i"] is not None:
            _draw_vector(ax, sel, stat, truth)
        else:
            r = sel[0]
            ax.errorbar([0], [r["value"]], yerr=_yerr(sel), fmt="o", capsize=6,
                        label="estimate (95% CI)")
            if truth is not None:
                ax.scatter([0], [float(truth)], marker="x", color="black", zorder=3,
                           label="truth")
            ax.set_xticks([0], [stat])
            ax.set_xlabel("statistic")
            ax.set_ylabel(stat)
            ax.legend(fontsize=8)
        ax.set_title(_title(rows, stat), fontsize=9)
        fig.tight_layout()
        fig.savefig(path)
        return {"path": path, "statistic": stat, "title": ax.get_title(),
                "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel()}
    finally:
        plt.close(fig)


def _draw_groups(ax: Any, rows: list[dict], sel: list[dict], stat: str, by: str,
                 truth: Mapping[str, Any] | None) -> None:
    groups = sorted({r["group"] for r in rows if r["group"] is not None})
    drawn = [g for g in groups if any(r["group"] == g for r in sel)]
    missing = {r["group"]: r["error"] for r in rows if r["error"] and r["group"] is not None}
    x = {g: k for k, g in enumerate(groups)}
    if sel and sel[0]["i"] is None:  # a scalar per group
        sub = [next(r for r in sel if r["group"] == g) for g in drawn]
        ax.errorbar([x[g] for g in drawn], [r["value"] for r in sub], yerr=_yerr(sub),
                    fmt="o", capsize=4, label="estimate (95% CI)")
        if truth is not None:
            known = [g for g in groups if g in truth]
            ax.scatter([x[g] for g in known], [truth[g] for g in known], marker="x",
                       color="black", zorder=3, label="truth")
    else:  # a vector per group: one line each
        for g in drawn:
            sub = sorted((r for r in sel if r["group"] == g), key=lambda r: r["i"])
            ax.errorbar([r["i"] for r in sub], [r["value"] for r in sub], yerr=_yerr(sub),
                        capsize=2, label=str(g))
        ax.set_xlabel("cell")
    ax.set_ylabel(stat)
    names = [g if g not in missing else
             f"{g}\n({'suppressed' if missing[g].startswith('suppressed') else 'failed'})"
             for g in groups]
    if sel and sel[0]["i"] is None:
        ax.set_xticks(range(len(groups)), names, fontsize=8)
        ax.set_xlabel(by)
    ax.legend(fontsize=8)


def _draw_vector(ax: Any, sel: list[dict], stat: str, truth: Any) -> None:
    sub = sorted(sel, key=lambda r: r["i"])
    xs = np.arange(len(sub))
    vals = [r["value"] for r in sub]
    if sub[0]["grid_x"] is not None:  # a density on a grid: a line
        gx = [r["grid_x"] for r in sub]
        ax.plot(gx, vals, lw=1.6, label="estimate")
        ax.set_xlabel("value")
    else:
        ax.bar(xs, vals, yerr=_yerr(sub), capsize=2, color="tab:blue", alpha=0.8,
               label="estimate (95% CI)")
        step = max(1, len(sub) // 20)
        ax.set_xticks(xs[::step], [_cell_label(r) for r in sub][::step], rotation=30,
                      fontsize=7)
        ax.set_xlabel("bucket (lower edge)" if sub[0]["bin_low"] is not None else "category")
    if truth is not None:
        ax.scatter(xs if sub[0]["grid_x"] is None else [r["grid_x"] for r in sub],
                   np.asarray(truth, dtype=float), marker="x", color="black", zorder=3,
                   label="truth")
    ax.set_ylabel(stat)
    ax.legend(fontsize=8)


def _draw_matrix(fig: Any, ax: Any, sel: list[dict], stat: str) -> None:
    ni = max(r["i"] for r in sel) + 1
    nj = max(r["j"] for r in sel) + 1
    t = np.full((ni, nj), np.nan)
    xl, yl = [""] * ni, [""] * nj
    for r in sel:
        t[r["i"], r["j"]] = r["value"]
        xl[r["i"]], yl[r["j"]] = r["x_label"] or str(r["i"]), r["y_label"] or str(r["j"])
    im = ax.imshow(t, cmap="viridis")
    ax.set_yticks(range(ni), xl, fontsize=7)
    ax.set_xticks(range(nj), yl, rotation=30, fontsize=7)
    ax.set_ylabel("x")
    ax.set_xlabel("y")
    fig.colorbar(im, ax=ax, label=stat)
