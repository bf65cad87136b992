"""The reproduction report: one markdown file over every family's recipe outputs.

``ldp-beam reproduce all --out DIR`` runs each family's recipe into ``DIR/FAMILY/`` (records,
claims with verdicts, summary, PNG figures) and then :func:`write_report` writes
``DIR/report.md``: a verdict count per family, then each family's claims (claim, verdict,
evidence) and its figures, so every number stands beside the paper's claim it tests.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from typing import Mapping, Sequence

TITLES = {
    "bisample": "BiSample / BiSample-MD (LDP means with missing values)",
    "rvns": "RVNS (real-valued negative survey)",
    "uldp": "JuRR / CPRR (joint distributions under utility-optimized LDP)",
    "dphr": "DPHR (differentially private histogram publishing)",
    "ospdprr": "OSPDPRR (one-sided personalized DP queries)",
}
EVIDENCE_CHARS = 400


def _cell(text: object) -> str:
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= EVIDENCE_CHARS else s[:EVIDENCE_CHARS - 1] + "…"


def family_claims(folder: str, family: str) -> list[dict]:
    path = os.path.join(folder, f"{family}_claims.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write_report(out_dir: str, families: Sequence[str], run_info: Mapping[str, object]
                 ) -> str:
    """Write ``out_dir/report.md`` from the recipe outputs in ``out_dir/FAMILY/``; returns the
    path. ``run_info`` (quick or full, seeds, data directory) is printed at the top."""
    lines = ["# ldp-beam: reproducing the papers", ""]
    lines += [f"- {k}: {v}" for k, v in run_info.items()]
    lines += ["", "Verdicts are decided by each recipe from its own records, with tolerances "
              "from standard errors (see each family's docs/results_*.md for the method). "
              "Full evidence: `FAMILY/FAMILY_claims.json`; all numbers: `FAMILY/FAMILY.json`.",
              "", "| family | claims | verdicts |", "|---|---|---|"]
    per_family = {}
    for fam in families:
        claims = family_claims(os.path.join(out_dir, fam), fam)
        per_family[fam] = claims
        counts = Counter(c.get("verdict", "?") for c in claims)
        summary = ", ".join(f"{v}: {n}" for v, n in sorted(counts.items())) or "no claims written"
        lines.append(f"| [{fam}](#{fam}) | {len(claims)} | {summary} |")
    for fam in families:
        lines += ["", f'<a id="{fam}"></a>', f"## {TITLES.get(fam, fam)}", ""]
        claims = per_family[fam]
        if claims:
            lines += ["| claim | verdict | evidence |", "|---|---|---|"]
            lines += [f"| {_cell(c.get('claim', ''))} | **{_cell(c.get('verdict', ''))}** | "
                      f"{_cell(c.get('evidence', ''))} |" for c in claims]
        else:
            lines.append("(the recipe wrote no claims)")
        folder = os.path.join(out_dir, fam)
        figures = sorted(f for f in os.listdir(folder) if f.endswith(".png")) \
            if os.path.isdir(folder) else []
        if figures:
            lines.append("")
            lines += [f"![{fam}: {f[:-4]}]({fam}/{f})" for f in figures]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path
