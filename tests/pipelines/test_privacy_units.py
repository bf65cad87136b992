"""Privacy per person through the commands (issue 14): --privacy-unit bounds each unit's
reports (LDP) or rows (central) before anything is released, the guarantee says per what unit it
holds, the estimand is per unit with standard errors that account for k reports, and counts
reconcile with the rows the bound left out."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.stats import norm

from ldp_beam_test_helpers import read_jsonl, run_cli

GRR = ("-m", "grr", "--epsilon", "2", "-p", "domain=a,b")


def _people(path, heavy=300, light=1500, rows_heavy=50, seed=0):
    """Heavy users (50 rows each, value a) and light users (1 row, value b): per record, a is
    the majority; per person, b is."""
    uid = np.concatenate([np.repeat(np.arange(heavy), rows_heavy),
                          np.arange(heavy, heavy + light)])
    v = np.array(["a"] * (heavy * rows_heavy) + ["b"] * light)
    order = np.random.default_rng(seed).permutation(uid.size)
    pq.write_table(pa.table({"uid": uid[order].astype(str), "v": v[order]}), path)
    return heavy, light, rows_heavy


def test_one_report_per_person_and_the_per_unit_estimand(tmp_path):
    heavy, light, rows = _people(tmp_path / "t.parquet")
    code, so, se = run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR,
                           "--privacy-unit", "uid", "-o", str(tmp_path / "r.parquet"))
    assert code == 0, se
    assert "per privacy unit 'uid'" in so and "left out by the per-unit bound" in so
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    rec = man["records"]
    assert rec["reported"] == heavy + light  # a person with 50 rows sends one report
    assert rec["bounded_out"] == heavy * (rows - 1) and rec["reconciles"]
    assert man["guarantee"]["epsilon"] == 2.0 and man["privacy_unit"]["column"] == "uid"
    assert "uid" not in pq.read_schema(tmp_path / "r.parquet").names
    assert run_cli("estimate", "-i", str(tmp_path / "r.parquet"), "-o",
                   str(tmp_path / "e.json"))[0] == 0
    est = json.loads((tmp_path / "e.json").read_text())
    assert est["estimand"].startswith("per privacy unit 'uid'")
    freq = est["estimate"]["statistics"]["frequency"]
    z = norm.ppf(1 - 1e-4)
    share_a = heavy / (heavy + light)  # per person
    assert abs(freq["value"][0] - share_a) <= z * freq["stderr"][0]


def test_without_a_unit_the_guarantee_is_per_record(tmp_path):
    heavy, light, rows = _people(tmp_path / "t.parquet")
    code, so, _ = run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR,
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 0 and "per record" in so
    assert run_cli("estimate", "-i", str(tmp_path / "r.parquet"), "-o",
                   str(tmp_path / "e.json"))[0] == 0
    est = json.loads((tmp_path / "e.json").read_text())
    assert est["estimand"].startswith("per record")
    freq = est["estimate"]["statistics"]["frequency"]
    share_a = heavy * rows / (heavy * rows + light)  # per record
    assert abs(freq["value"][0] - share_a) <= norm.ppf(1 - 1e-4) * freq["stderr"][0]


def test_k_reports_per_unit_cost_k_epsilon_and_widen_the_errors(tmp_path):
    _people(tmp_path / "t.parquet", heavy=100, light=100, rows_heavy=10)
    code, so, _ = run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR,
                          "--privacy-unit", "uid", "--max-reports-per-unit", "3",
                          "-o", str(tmp_path / "r.parquet"))
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    assert code == 0 and man["guarantee"]["epsilon"] == 6.0
    assert man["records"]["reported"] == 100 * 3 + 100
    assert run_cli("estimate", "-i", str(tmp_path / "r.parquet"), "-o",
                   str(tmp_path / "e.json"))[0] == 0
    freq = json.loads((tmp_path / "e.json").read_text())["estimate"]["statistics"]["frequency"]
    assert "sqrt(3)" in freq["note"]


def test_bad_privacy_unit_input(tmp_path):
    pq.write_table(pa.table({"uid": ["u1", None, "", "u2"], "v": ["a", "b", "a", "b"]}),
                   tmp_path / "t.parquet")
    args = ("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", *GRR)
    code, _, se = run_cli(*args, "--privacy-unit", "nope", "-o", str(tmp_path / "x.parquet"))
    assert code == 2 and "--privacy-unit nope" in se
    code, _, se = run_cli(*args, "--privacy-unit", "uid", "--keep", "uid", "--public", "uid",
                          "-o", str(tmp_path / "x.parquet"))
    assert code == 2 and "privacy unit" in se
    code, _, se = run_cli(*args, "--privacy-unit", "uid", "--max-reports-per-unit", "0",
                          "-o", str(tmp_path / "x.parquet"))
    assert code == 2 and "max_reports_per_unit" in se
    code, _, se = run_cli(*args, "--privacy-unit", "uid", "-o", str(tmp_path / "r.parquet"))
    assert code == 0, se
    dead = read_jsonl(tmp_path / "r.parquet.deadletter.jsonl")
    assert len(dead) == 2 and all("uid" in d["reason"] for d in dead)  # null and empty unit
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    assert man["records"]["reported"] == 2 and man["records"]["dead_lettered"] == 2


def test_a_central_release_bounds_rows_per_unit(tmp_path):
    heavy, light, rows = _people(tmp_path / "t.parquet")
    code, so, se = run_cli("estimate", "-i", str(tmp_path / "t.parquet"), "-c", "v",
                           "-m", "laplace-histogram", "--epsilon", "1", "-p", "categories=a,b",
                           "-p", "max_rows_per_partition=2", "--privacy-unit", "uid",
                           "-o", str(tmp_path / "h.json"))
    assert code == 0, se
    assert "per privacy unit 'uid' (at most 1 partition(s) x 2 row(s) each)" in so
    cur = json.loads((tmp_path / "h.json.curator.json").read_text())["records"]
    assert cur["released_from"] == heavy * 2 + light and cur["reconciles"]
    assert cur["bounded_out"] == heavy * (rows - 2)
    rel = json.loads((tmp_path / "h.json").read_text())
    hist = rel["estimate"]["statistics"]["histogram"]["value"]
    # discrete Laplace of scale ~2/eps around the bounded counts (600, 1500): 8 SDs is far
    assert abs(hist[0] - heavy * 2) < 8 * 2 * np.sqrt(2) and abs(hist[1] - light) < 8 * 2 * 1.5
