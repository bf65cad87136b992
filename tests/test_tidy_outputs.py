"""Estimates and releases as tidy tables (issue 15): `-o X.parquet` / `X.csv` write one row per
statistic and cell with value, SE, CI, n and the guarantee; `-o X.json` keeps the nested form; the
same numbers either way."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ldp_beam_test_helpers import run_cli


def _reports(tmp_path):
    rng = np.random.default_rng(3)
    pq.write_table(pa.table({"v": rng.choice(list("abc"), 3000), "g": rng.choice(["n", "s"], 3000)}),
                   tmp_path / "t.parquet")
    assert run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", "-m", "grr",
                   "--epsilon", "2", "-p", "domain=a,b,c", "--keep", "g", "--public", "g",
                   "-o", str(tmp_path / "r.parquet"))[0] == 0
    return str(tmp_path / "r.parquet")


def test_tidy_parquet_and_csv_hold_the_nested_numbers(tmp_path):
    rep = _reports(tmp_path)
    assert run_cli("estimate", "-i", rep, "-o", str(tmp_path / "e.json"))[0] == 0
    assert run_cli("estimate", "-i", rep, "-o", str(tmp_path / "e.parquet"))[0] == 0
    assert run_cli("estimate", "-i", rep, "-o", str(tmp_path / "e.csv"))[0] == 0
    nested = json.loads((tmp_path / "e.json").read_text())["estimate"]
    tidy = pq.read_table(tmp_path / "e.parquet").to_pylist()
    for col in ("statistic", "value", "stderr", "ci_low", "ci_high", "n_reports", "guarantee"):
        assert col in tidy[0]
    for name, stat in nested["statistics"].items():
        rows = [r for r in tidy if r["statistic"] == name]
        vals = stat["value"] if isinstance(stat["value"], list) else [stat["value"]]
        if not vals or not all(isinstance(v, (int, float)) for v in vals):
            continue
        got = [r["value"] for r in rows]
        assert np.allclose(got, vals), name
        assert all(r["n_reports"] == nested["n_reports"] for r in rows)
    csv = pacsv.read_csv(tmp_path / "e.csv").to_pylist()
    assert len(csv) == len(tidy)


def test_tidy_by_group_and_a_release(tmp_path):
    rep = _reports(tmp_path)
    assert run_cli("estimate", "-i", rep, "--by", "g", "-o", str(tmp_path / "g.parquet"))[0] == 0
    rows = pq.read_table(tmp_path / "g.parquet").to_pylist()
    assert {r["group"] for r in rows} == {"n", "s"}
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v",
                          "-m", "laplace-histogram", "--epsilon", "1", "-p", "categories=a,b,c",
                          "-o", str(tmp_path / "h.csv"))
    assert code == 0, se
    rel = pacsv.read_csv(tmp_path / "h.csv").to_pylist()
    assert rel and all("central-DP" in r["guarantee"] for r in rel)
    assert {r["label"] for r in rel if r["label"]} >= {"a", "b", "c"}
