"""`ldp-beam bench` writes JSON records with the documented fields (no timing assertions:
speed targets are measured by the benchmark itself, never by unit tests)."""
import json
import math

import pytest
from ldp_beam_test_helpers import run_cli

from ldp_beam.pipelines import bench_core as bench
from ldp_beam.pipelines import bench as pipeline_bench


def test_bench_core_records_have_the_documented_fields(monkeypatch):
    monkeypatch.setattr(bench, "PROFILES", {k: v for k, v in bench.PROFILES.items()
                                            if k in ("bisample-md", "pm")})
    recs = bench.run(quick=True, progress=bench.Progress("bench", enabled=False))
    stages = {r["stage"] for r in recs}
    assert stages == {"reference", "perturb", "accumulate", "estimate", "noise"}
    for r in recs:
        for key in ("experiment", "dataset", "method", "epsilon", "metric", "value", "stage",
                    "rows", "seconds", "rows_per_second"):
            assert key in r, (key, r)
        assert r["seconds"] > 0 and r["rows"] > 0
    perturb = [r for r in recs if r["metric"] == "perturbed rows/s"]
    assert {r["method"] for r in perturb} == {"bisample-md", "pm"}
    assert all(r["fraction_of_uniform_rate"] > 0 for r in perturb)


def test_bench_cli_writes_json(tmp_path):
    out = tmp_path / "b.json"
    code, _, err = run_cli("bench", "--quick", "--only", "harmony", "--no-pipeline",
                           "--json", str(out))
    assert code == 0, err
    recs = json.loads(out.read_text())
    assert {r["method"] for r in recs if r["stage"] != "reference"} == {"harmony"}


def test_pipeline_bench_records_are_ratios_to_the_reference():
    """One mechanism (grr) on every path, tiny inputs: each record names its path and carries
    the reference's seconds, the ratio to it, the issue's target and whether it is met."""
    recs = pipeline_bench.run(only=["grr"], sizes=(5_000,), element_records=4_000)
    assert {(r["path"], r["mode"]) for r in recs} == {
        ("api", "batched"), ("element", "element"), ("cli", "collect+estimate"),
        ("api", "readme"), ("api", "readme+speedups")}  # the README's pipeline by hand
    for r in recs:
        assert r["method"] == "grr" and r["stage"] == "pipeline"
        assert r["seconds"] > 0 and r["reference_seconds"] > 0 and r["peak_rss_mb"] > 0
        assert math.isclose(r["ratio_to_reference"], r["reference_seconds"] / r["seconds"])
        assert math.isclose(r["rows_per_second"], r["rows"] / r["seconds"])
        assert r["target_of"] == "ratio_to_reference"
        if r["path"] == "cli":  # the CLI's target is stated at 10^7 rows (start-up counted)
            assert r["target"] is None and r["meets_target"] is None
            assert math.isclose(r["seconds"], r["collect_seconds"] + r["estimate_seconds"])
            assert r["peak_rss_mb"] == max(r["collect_peak_rss_mb"], r["estimate_peak_rss_mb"])
        else:
            assert r["target"] == pipeline_bench.TARGETS[r["path"]]
            assert r["meets_target"] == (r["ratio_to_reference"] >= r["target"])
    assert next(r for r in recs if r["path"] == "element")["rows"] == 4_000
    # the api and cli runs read the same file: one reference measurement serves both
    assert len({r["reference_seconds"] for r in recs
                if r["path"] != "element" and not r.get("by_hand")}) == 1


def test_a_central_release_is_measured_without_and_with_the_speedups_opt_in():
    """The CLI's release from raw rows, tiny input: one record as shipped and one with
    LDP_BEAM_SPEEDUPS=1, against the same reference (no timing asserted)."""
    recs = pipeline_bench.run(only=["cli", "dphr"], sizes=(5_000,))
    assert {(r["path"], r["mode"], r["speedups"]) for r in recs} == {
        ("cli", "release", False), ("cli", "release+speedups", True)}
    assert len({r["reference_seconds"] for r in recs}) == 1
    for r in recs:
        assert r["method"] == "dphr" and r["command"] == "release" and r["seconds"] > 0
        assert ("LDP_BEAM_SPEEDUPS=1" in r["note"]) is r["speedups"]


def test_only_selects_sections_and_mechanisms():
    assert pipeline_bench._selection(None)[0] == set(pipeline_bench.SECTIONS)
    assert pipeline_bench._selection(["bounding"]) == ({"bounding"}, None)
    assert pipeline_bench._selection(["grr", "api"]) == ({"api"}, {"grr"})
    assert pipeline_bench._selection(["cprr"]) == ({"api", "cli", "element"}, {"cprr"})
    assert pipeline_bench._selection(["harmony"]) == (set(), None)  # a core-only mechanism


def _record(path, method, rows, secs, ref, target, **extra):
    return {"experiment": "bench", "dataset": "synthetic", "method": method, "epsilon": 1.0,
            "metric": "pipeline rows/s", "value": rows / secs, "stage": "pipeline", "path": path,
            "rows": rows, "seconds": secs, "rows_per_second": rows / secs, "mode": "batched",
            "ratio_to_reference": ref / secs, "reference_seconds": ref, "target": target,
            "target_of": "ratio_to_reference",
            "meets_target": None if target is None else ref / secs >= target,
            "peak_rss_mb": 250.0, "runner": "DirectRunner", "machine": "2 cores, test",
            "date": "2026-01-01 00:00 UTC", **extra}


def test_readme_table_is_rewritten_between_the_markers_only(tmp_path):
    recs = [_record("api", "grr", 1_000_000, 0.5, 0.4, 0.85),
            _record("cli", "dphr", 10_000_000, 4.0, 1.0, 0.5, mode="release"),
            {**_record("cli", "grr", 10_000_000, 2.0, 1.0, 0.15, mode="collect"),
             "stage": "memory", "command": "collect", "rss_growth": 0.3, "target_of":
             "rss_growth", "meets_target": False}]
    readme = tmp_path / "README.md"
    readme.write_text("# T\n\nbefore\n<!-- bench:start -->\nold table\n<!-- bench:end -->\n"
                      "after\n")
    records = tmp_path / "b.json"
    records.write_text(json.dumps(recs + [{"experiment": "bench", "dataset": "synthetic",
                                           "method": "grr", "epsilon": 1.0, "metric": "x",
                                           "value": 1.0, "stage": "perturb", "bench_seconds":
                                           600.0}]))
    code, _, err = run_cli("bench", "--from-json", str(records), "--readme", str(readme))
    assert code == 0, err
    text = readme.read_text()
    assert text.startswith("# T\n\nbefore\n<!-- bench:start -->\n")
    assert text.endswith("<!-- bench:end -->\nafter\n") and "old table" not in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(recs)  # a header, then one row per pipeline record
    assert "| api | grr | batched | 10^6 | 2.00M | 0.80 | ≥ 0.85 | **no** | 250 |" in rows
    assert "| cli | dphr | release | 10^7 | 2.50M | 0.25 | ≥ 0.5 | **no** | 250 |" in rows
    assert any("RSS growth +30%" in r and "rss growth ≤ 0.15" in r for r in rows)
    assert "2 cores, test" in text and "10.0 min" in text
    readme.write_text("no markers\n")
    with pytest.raises(ValueError, match="bench:start"):
        pipeline_bench.write_readme(str(readme), recs)


def test_generated_table_names_the_page_it_is_regenerated_into(tmp_path, monkeypatch):
    """The table lives in docs/guides/performance.md (the README was shortened): its first line
    names `--readme docs/guides/performance.md`, from the project root, however the page was
    named on the command line; it said `--readme README.md` whatever the page."""
    proj = tmp_path / "proj"
    (proj / "docs" / "guides").mkdir(parents=True)
    (proj / "mkdocs.yml").write_text("site_name: x\n")
    page = proj / "docs" / "guides" / "performance.md"
    page.write_text("# Performance\n\n<!-- bench:start -->\nold\n<!-- bench:end -->\n")
    recs = tmp_path / "b.json"
    recs.write_text(json.dumps([_record("api", "grr", 1_000_000, 0.5, 0.4, 0.85)]))
    monkeypatch.chdir(proj / "docs")
    code, _, err = run_cli("bench", "--from-json", str(recs), "--readme", "guides/performance.md")
    assert code == 0, err
    block = page.read_text().split("<!-- bench:start -->\n")[1]
    assert block.startswith("Generated by `ldp-beam bench --readme docs/guides/performance.md` "
                            "on 2 cores, test"), block[:200]
    assert "README" not in block
    assert pipeline_bench.readme_table(json.loads(recs.read_text())).startswith(
        "Generated by `ldp-beam bench --readme FILE` on ")  # no page given: not guessed


def test_bounding_bench_records_the_cost_and_memory_per_unit(tmp_path):
    """The bounding section: bounded against unbounded at each size, and at the largest size a
    run on ten times the rows of the smallest at the same units (memory per unit, not per
    row), each a ratio to the reference with its target."""
    recs = pipeline_bench._bounding((2_000, 20_000), str(tmp_path), None)
    modes = sorted((r["mode"], r["rows"]) for r in recs)
    assert modes == [("batched", 2_000), ("batched", 20_000), ("bounded", 2_000),
                     ("bounded", 20_000), ("bounded-fixed-units", 20_000)]
    by = {(r["mode"], r["rows"]): r for r in recs}
    for n in (2_000, 20_000):
        b, u = by[("bounded", n)], by[("batched", n)]
        assert math.isclose(b["ratio_to_unbounded"], b["seconds"] / u["seconds"])
        assert b["meets_target"] == (b["ratio_to_unbounded"] <= 2.0) and b["units"] == n // 10
    fixed, small = by[("bounded-fixed-units", 20_000)], by[("bounded", 2_000)]
    assert fixed["units"] == small["units"] == 200
    assert math.isclose(fixed["rss_growth"], fixed["peak_rss_mb"] / small["peak_rss_mb"] - 1)
    assert fixed["target_of"] == "rss_growth"
    assert fixed["meets_target"] == (fixed["rss_growth"] <= 0.15)
    assert math.isclose(by[("bounded", 20_000)]["rss_growth_vs_smallest"],
                        by[("bounded", 20_000)]["peak_rss_mb"] / small["peak_rss_mb"] - 1)
    table = pipeline_bench.readme_table(recs)
    assert "200 units of 100 rows (RSS" in table and "rss growth ≤ 0.15" in table


def test_startup_records_time_fresh_processes_against_the_absolute_targets(tmp_path):
    """``import ldp_beam`` and ``ldp-beam --help`` run as fresh processes (they must succeed:
    the help command is the installed entry point), recorded as start-up seconds against
    issue 16's targets, not as pipeline records, and listed under the performance table."""
    cmds = pipeline_bench._startup_commands()
    assert cmds["import ldp_beam"][-1] == "import ldp_beam"
    assert cmds["ldp-beam --help"][-1] == "--help"
    b = pipeline_bench._Bench(str(tmp_path), None, rounds=1)
    recs = pipeline_bench._startup(b, 2)
    assert [r["mode"] for r in recs] == ["import ldp_beam", "ldp-beam --help"]
    for r in recs:
        assert r["stage"] == "startup" and r["path"] == "cli" and r["rounds"] == 2
        assert r["seconds"] > 0 and r["target_of"] == "seconds"
        assert r["target"] == pipeline_bench.STARTUP_TARGETS[r["mode"]]
        assert r["meets_target"] == (r["seconds"] < r["target"])
        assert "ratio_to_reference" not in r  # not a pipeline record
    table = pipeline_bench.readme_table([_record("api", "grr", 10**6, 0.5, 0.4, 0.85)] + recs)
    assert sum(line.startswith("| ") for line in table.splitlines()) == 2  # header + api
    line = table.splitlines()[-1]
    assert line.startswith("Start-up, a fresh process") and "`import ldp_beam`" in line
    assert "`ldp-beam --help`" in line and "target < 0.6 s" in line


def test_measured_children_run_from_a_bytecode_cache_in_the_runs_directory(tmp_path,
                                                                           monkeypatch):
    """A shell's PYTHONDONTWRITEBYTECODE would make every measured process recompile ldp-beam
    (an installed package runs compiled): the children get a cache of their own instead."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = pipeline_bench._child_env(str(tmp_path))
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache")
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "import ldp_beam.errors"], env=env, check=True)
    cached = [p.name for p in (tmp_path / "pycache").rglob("*.pyc")]
    assert any(name.startswith("errors.") for name in cached)
