"""The command line: collect/estimate over Parquet and CSV, errors, exit codes, the demo."""
import csv
import json
import math
import re
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import read_jsonl, run_cli

REPO = Path(__file__).resolve().parents[2]


def test_collect_estimate_parquet_roundtrip(survey_table, tmp_path):
    path, t = survey_table
    out = tmp_path / "r.parquet"
    code, so, se = run_cli("collect", "-i", str(path), "-c", "age", "--role", "preference=pref",
                           "-m", "bisample-md", "--epsilon", "2", "-p", "lower=0",
                           "-p", "upper=100", "--keep", "g", "--public", "g", "--seed", "4",
                           "-o", str(out))
    assert code == 0, se
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    rec = man["records"]
    assert rec == {"input": 3000, "reported": 2997, "dead_lettered": 3, "unreadable_rows": 0,
                   "unreadable_parts": 0, "unreadable_rows_unknown": False,
                   "reconciles": True, "counted_from": "data"}
    # seeded (--seed 4): not private in every field; what it would be unseeded is kept
    assert man["guarantee"]["kind"] == "none (seeded: not private)"
    assert man["guarantee"]["epsilon"] is None and man["guarantee"]["private"] is False
    assert man["guarantee"]["unseeded"] == {"kind": "LDP", "epsilon": 2.0, "delta": 0.0}
    schema = pq.read_schema(out)
    assert schema.names == ["s", "b", "g"]
    assert b"ldp_beam" in schema.metadata
    est_path = tmp_path / "e.json"
    code, so, se = run_cli("estimate", "-i", str(out), "-o", str(est_path))
    assert code == 0, se
    est = json.loads(est_path.read_text())
    stats = est["estimate"]["statistics"]
    assert est["estimate"]["n_reports"] == 2997
    age, pref = t["age"].to_numpy(), t["pref"].to_numpy()
    valid = np.isnan(age) | ((age >= 0) & (age <= 100))
    valid[3] = False
    ans = valid & ~np.isnan(age) & (pref >= 2)
    truth_miss = 1 - ans.sum() / valid.sum()
    assert abs(stats["missing_rate"]["value"] - truth_miss) < 4 * stats["missing_rate"]["stderr"]
    assert abs(stats["mean"]["value"] - age[ans].mean()) < 4 * stats["mean"]["stderr"]
    # per-key
    code, so, se = run_cli("estimate", "-i", str(out), "-o", str(tmp_path / "k.json"), "--by", "g")
    assert code == 0, se
    per = json.loads((tmp_path / "k.json").read_text())["estimates"]
    assert sorted(per) == ["0", "1", "2"]
    assert sum(v["n_reports"] for v in per.values()) == 2997


def test_collect_csv_with_bad_rows(tmp_path):
    p = tmp_path / "in.csv"
    rows = [["id", "x"]] + [[i, f"{(i * 7) % 10 / 10:.1f}"] for i in range(200)]
    rows += [[900, "abc"], [901, ""], [902, "5"], [903, "-0.5"]]
    with open(p, "w", newline="", encoding="utf-8-sig") as fh:  # with a BOM, like real exports
        csv.writer(fh).writerows(rows)
    out = tmp_path / "r.parquet"
    code, so, se = run_cli("collect", "-i", str(p), "-c", "x", "-m", "harmony", "--epsilon", "1",
                           "-p", "lower=0", "-p", "upper=1", "-o", str(out))
    assert code == 0, se
    dead = read_jsonl(tmp_path / "r.parquet.deadletter.jsonl")
    assert sorted(d["reason"] for d in dead) == sorted([
        "value: non-numeric value 'abc'", "value: missing (null/NaN) and allow_missing=False",
        "value: 5.0 outside [0, 1]", "value: -0.5 outside [0, 1]"])
    assert pq.ParquetFile(out).metadata.num_rows == 200


def test_estimate_from_csv_reports_needs_and_uses_the_mechanism(survey_table, tmp_path):
    path, _ = survey_table
    out = tmp_path / "r.parquet"
    assert run_cli("collect", "-i", str(path), "-c", "age", "-m", "bisample-md", "--epsilon", "1",
                   "-p", "lower=0", "-p", "upper=100", "--seed", "2", "-o", str(out))[0] == 0
    rep = pq.read_table(out).to_pandas()
    rep.loc[len(rep)] = [7, 0]  # one malformed report (s = 7)
    rep.to_csv(tmp_path / "r.csv", index=False)
    # CSV reports have no collect manifest: refused unless --unverified (issue 23)
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "r.csv"), "-o", str(tmp_path / "x.json"))
    assert code == 2 and "pass --unverified to estimate them anyway" in se
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "r.csv"), "-o", str(tmp_path / "x.json"),
                          "--unverified")
    assert code == 2 and "carries no mechanism metadata: pass --mechanism" in se
    code, so, se = run_cli("estimate", "-i", str(tmp_path / "r.csv"), "-o",
                           str(tmp_path / "c.json"), "-m", "bisample-md", "--epsilon", "1",
                           "-p", "lower=0", "-p", "upper=100", "--unverified")
    assert code == 0, se
    assert "1 malformed reports dead-lettered" in so
    code, _, _ = run_cli("estimate", "-i", str(out), "-o", str(tmp_path / "p.json"))
    from_csv = json.loads((tmp_path / "c.json").read_text())["estimate"]
    from_parquet = json.loads((tmp_path / "p.json").read_text())["estimate"]
    # the Parquet reports say they are seeded (not private); a CSV carries no such metadata
    assert "not private" in from_parquet.pop("guarantee")["summary"]
    assert "seeded" not in from_csv.pop("guarantee")["summary"]
    assert from_csv == from_parquet  # same reports, same counts, same estimate


def test_estimate_refuses_mismatched_mechanism(survey_table, tmp_path):
    path, _ = survey_table
    out = tmp_path / "r.parquet"
    assert run_cli("collect", "-i", str(path), "-c", "age", "-m", "bisample-md", "--epsilon", "1",
                   "-p", "lower=0", "-p", "upper=100", "-o", str(out))[0] == 0
    code, _, se = run_cli("estimate", "-i", str(out), "-o", str(tmp_path / "e.json"),
                          "-m", "harmony", "--epsilon", "1", "-p", "lower=0", "-p", "upper=100")
    assert code == 2 and "made by 'bisample-md', not 'harmony'" in se
    code, _, se = run_cli("estimate", "-i", str(out), "-o", str(tmp_path / "e.json"),
                          "-m", "bisample-md", "--epsilon", "3", "-p", "lower=0", "-p", "upper=100")
    assert code == 2 and "parameters differ" in se and "epsilon" in se


@pytest.mark.parametrize("args, message", [
    (["--epsilon", "0"], "parameter 'epsilon' = 0.0 is invalid: expected a finite number > 0"),
    (["--epsilon", "nan"], "parameter 'epsilon'"),
    (["--epsilon", "1", "-p", "lower=5", "-p", "upper=1"],
     "parameter 'lower' = 5.0 is invalid: expected a number < upper = 1.0"),
    (["--epsilon", "1", "-p", "lower=0", "-p", "lower=1"],
     "--param lower: given twice with different values"),
    (["--epsilon", "1", "-p", "fake=maybe"], "parameter 'fake' = 'maybe' is invalid"),
    (["--epsilon", "1", "-p", "lower=abc"], "parameter 'lower' = 'abc' is invalid"),
    (["--epsilon", "1", "-p", "colour=red"], "parameter 'colour'"),
    (["--epsilon", "1", "-p", "preference=-1"], "parameter 'preference' = -1.0 is invalid"),
])
def test_bad_parameters_exit_2_naming_the_parameter(survey_table, tmp_path, args, message):
    path, _ = survey_table
    given = {a.split("=")[0] for a in args if "=" in a}  # a parameter is given once
    base = [x for name, value in (("lower", "0"), ("upper", "100")) if name not in given
            for x in ("-p", f"{name}={value}")]
    code, _, se = run_cli("collect", "-i", str(path), "-c", "age", "-m", "bisample",
                          *base, *args, "-o", str(tmp_path / "r.parquet"))
    assert code == 2
    assert message in se


def test_usage_errors(survey_table, tmp_path):
    path, _ = survey_table
    code, _, se = run_cli("collect", "-i", str(path), "-c", "nope", "-m", "bisample",
                          "--epsilon", "1", "-p", "lower=0", "-p", "upper=100",
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 2 and "input has no column 'nope'; columns: uid, age, pref, g" in se
    code, _, se = run_cli("collect", "-i", str(tmp_path / "missing*.parquet"), "-c", "age",
                          "-m", "bisample", "--epsilon", "1", "-p", "lower=0", "-p", "upper=100",
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 2 and "no input" in se and "file matches" in se
    code, _, se = run_cli("collect", "-i", str(path), "-c", "age", "-m", "nosuch",
                          "--epsilon", "1", "-o", str(tmp_path / "r.parquet"))
    assert code == 2 and "unknown mechanism 'nosuch'" in se


def test_empty_reports_give_a_clear_error(tmp_path):
    import pyarrow as pa

    src = tmp_path / "all_bad.parquet"
    pq.write_table(pa.table({"x": [5.0, 7.0]}), src)
    out = tmp_path / "r.parquet"
    code, _, _ = run_cli("collect", "-i", str(src), "-c", "x", "-m", "bisample", "--epsilon", "1",
                         "-p", "lower=-1", "-p", "upper=1", "-o", str(out))  # every value outside
    assert code == 0 and pq.ParquetFile(out).metadata.num_rows == 0
    code, _, se = run_cli("estimate", "-i", str(out), "-o", str(tmp_path / "e.json"))
    assert code == 1 and "no reports were accumulated" in se


def test_audit_quick_runs_and_writes_records(tmp_path):
    # one mechanism through the command line: tests/reproduce/test_audit.py runs the whole quick audit once
    # (its module fixture) and checks every built-in is audited; running it all twice cost minutes
    out = tmp_path / "audit.json"
    code, so, se = run_cli("audit", "--quick", "--json", str(out), "--seed", "9",
                           "--only", "cprr")
    assert code == 0, se
    recs = json.loads(out.read_text())
    assert recs and {r["method"] for r in recs} == {"cprr"}
    assert all("empirical_epsilon_lower" in r for r in recs)
    # stdout is the table for a reader (issue 26: it was the raw JSON), not the records
    assert so.startswith("privacy audit: 1 audit, seed 9") and "{" not in so, so
    row = next(s for s in so.splitlines() if s.strip().startswith("cprr"))
    assert row.split()[:3] == ["cprr", "transition-matrix", "1.000"] and \
        row.split()[-1] == "consistent"


def test_list_shows_registry_with_parameters_and_guarantee():
    code, so, _ = run_cli("list", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(so)["mechanisms"]}
    assert {"bisample", "bisample-md", "harmony", "pm", "privkvm"} <= set(rows)
    assert [p["name"] for p in rows["bisample-md"]["parameters"]][:3] == ["epsilon", "lower",
                                                                           "upper"]
    assert rows["bisample-md"]["guarantee"].startswith("LDP")
    code, so, _ = run_cli("list")
    assert "bisample-md" in so and "parameters: epsilon, lower, upper, preference=None" in so


def test_no_function_binds_a_console_stream_at_import():
    """A default ``stream=sys.stdout`` is evaluated once, at import: whatever stdout was then
    (pytest's capture, a notebook's cell) keeps receiving the output after a later redirect.
    The demo did this and printed nothing into ``run_cli``'s capture once another test had
    imported it first (the clean-clone CI failure of session 11); streams resolve per call."""
    import importlib
    import inspect
    import io
    import pkgutil

    import ldp_beam
    import ldp_beam.pipelines
    import ldp_beam.transforms
    infos = [info for pkg in (ldp_beam, ldp_beam.pipelines, ldp_beam.transforms)
             for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    assert any(i.name == "ldp_beam.pipelines.demo" for i in infos)
    bound = []
    for info in infos:
        if ".reproduce" in info.name:
            continue
        mod = importlib.import_module(info.name)
        for name, fn in vars(mod).items():
            if not inspect.isfunction(fn) or fn.__module__ != mod.__name__:
                continue
            for p in inspect.signature(fn).parameters.values():
                if isinstance(p.default, io.IOBase) or p.default in (sys.stdout, sys.stderr,
                                                                     sys.__stdout__,
                                                                     sys.__stderr__):
                    bound.append(f"{mod.__name__}.{name}({p.name}=...)")
    assert not bound, bound


def test_the_demo_costs_the_cpu_time_the_readme_states(tmp_path):
    """The README's first command as it runs there, a fresh process (its imports and start-up
    included): its CPU time within a factor of 2 either way of what the README and the tour
    state (CPU time, so a busy machine does not move it the way it moves the wall clock)."""
    claims = {int(re.search(r"\((\d+) s of CPU", " ".join(f.read_text().split())).group(1))
              for f in (REPO / "README.md", REPO / "docs" / "getting-started.md")}
    assert len(claims) == 1, claims
    (claim,) = claims
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, "-m", "ldp_beam.pipelines.cli", "demo", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert r.returncode == 0, r.stderr[-2000:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert claim / 2 <= cpu <= claim * 2, (claim, cpu)


def test_demo_runs_and_reconciles(tmp_path, monkeypatch):
    plt = pytest.importorskip("matplotlib.pyplot")
    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    code, so, se = run_cli("demo", "--out", str(tmp_path), "--seed", "1")
    assert code == 0, se
    assert "50,000 input rows = 49,994 reported + 6 dead-lettered" in so
    assert "DOES NOT RECONCILE" not in so
    assert "LDP with epsilon=3" in so
    assert (tmp_path / "mean_age_by_region.png").stat().st_size > 1000
    est = json.loads((tmp_path / "estimate.json").read_text())["estimate"]["statistics"]
    assert all(math.isfinite(est[k]["value"]) for k in ("missing_rate", "mean", "sum"))
    # the RVNS section: a density from negative reports, its honest guarantee, reconciled counts
    assert "== RVNS" in so and "neighbourhood-LDP with epsilon=0.693147" in so
    assert "50,000 input rows = 49,974 reported + 26 dead-lettered" in so
    rv = json.loads((tmp_path / "estimate_rvns.json").read_text())["estimate"]
    dens = np.asarray(rv["statistics"]["density"]["value"])
    assert dens.size == 100 and (dens >= 0).all()
    assert abs(dens.sum() * 2.5 - 1) < 1e-9  # integrates to one on [0, 250]
    assert (tmp_path / "income_density_rvns.png").stat().st_size > 1000
    # the joint section: CPRR's table beside the truth, bad labels dead-lettered, a figure
    assert "== CPRR" in so and "50,000 input rows = 49,995 reported + 5 dead-lettered" in so
    joint = json.loads((tmp_path / "estimate_cprr.json").read_text())["estimate"]
    table = np.asarray(joint["statistics"]["joint"]["clipped"])
    assert table.shape == (4, 4) and abs(table.sum() - 1) < 1e-12
    assert joint["guarantee"]["kind"] == "none (seeded: not private)"  # the demo is seeded
    assert joint["guarantee"]["unseeded"]["kind"] == "ULDP"
    assert (tmp_path / "joint_employment_health.png").stat().st_size > 1000
    # the histogram section: one central-DP release, no exact count in what is published
    assert "== DPHR" in so and "central-DP with epsilon=0.1" in so
    rel = json.loads((tmp_path / "release_dphr.json").read_text())
    assert rel["estimate"]["n_reports"] is None and len(
        rel["estimate"]["statistics"]["histogram"]["value"]) == 250
    assert (tmp_path / "income_histogram_dphr.png").stat().st_size > 1000
    # the personalized query: one release each, with its guarantee
    assert "== OSPDPRR" in so and "central-DP with epsilon=0.8" in so
    rel = json.loads((tmp_path / "release_ospdprr.json").read_text())
    assert math.isfinite(rel["estimate"]["statistics"]["mean"]["value"])
    assert rel["estimate"]["n_reports"] is None
    # issue 26: three of the four figure titles omitted epsilon, the joint heatmaps had no axis
    # labels, and the DPHR privacy line read "Unit: per record only: ... Per record: per record
    # only: ..."
    assert len(figures) == 4
    for fig in figures:
        title = fig.get_suptitle() or fig.axes[0].get_title()
        assert re.search(r"epsilon = \d", title), title
        assert fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel(), title
        assert all(ax.get_xlabel() or ax.get_ylabel() for ax in fig.axes), title
    line = next(x for x in so.split("== DPHR")[1].splitlines() if x.startswith("  privacy: "))
    assert line.count("no privacy unit declared") == 1, line
    assert "Unit:" not in line and "Per record" not in line and "per record only" not in line


def test_rvns_collect_and_estimate_with_options(tmp_path):
    """RVNS through the CLI: k reports per user, estimator options, array statistics."""
    import pyarrow as pa

    rng = np.random.default_rng(8)
    x = np.append(rng.beta(2, 5, 4000) * 10, [11.0, np.nan])
    pq.write_table(pa.table({"x": x}), tmp_path / "t.parquet")
    out = tmp_path / "r.parquet"
    code, so, se = run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "x", "-m", "rvns",
                           "-p", "lower=0", "-p", "upper=10", "-p", "d=2", "-p", "k=3",
                           "-p", "delta=4", "--seed", "1", "-o", str(out))
    assert code == 0, se
    assert "neighbourhood-LDP with epsilon=2.07944" in so  # 3 ln 2 at delta = 2d
    assert pq.read_schema(out).names == ["y1", "y2", "y3"]
    code, so, se = run_cli("estimate", "-i", str(out), "-o", str(tmp_path / "e.json"),
                           "--option", "m=50", "--option", "method=em")
    assert code == 0, se
    assert "density=[50 values]" in so and "method=" in so
    est = json.loads((tmp_path / "e.json").read_text())
    assert est["estimate"]["n_reports"] == 4000  # users, not reports
    assert est["estimator_options"] == {"m": "50", "method": "em"}
    code, _, se = run_cli("estimate", "-i", str(out), "-o", str(tmp_path / "x.json"),
                          "--option", "method=magic")
    assert code == 2 and "parameter 'method' = 'magic' is invalid" in se


def test_corrupt_parquet_file_goes_to_the_dead_letter(tmp_path):
    """An unreadable input file is dead-lettered with its name and the reason; the readable
    files are still collected and the counts reconcile."""
    import pyarrow as pa

    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"x": np.linspace(0, 1, 100)}), d / "good.parquet")
    (d / "broken.parquet").write_bytes(b"PAR1 this is not a parquet file")
    out = tmp_path / "r.parquet"
    args = ("collect", "-i", str(d), "-c", "x", "-m", "harmony", "--epsilon", "1",
            "-p", "lower=0", "-p", "upper=1", "-o", str(out))
    code, so, se = run_cli(*args)
    # an unreadable input fails the run and commits nothing, unless allowed
    assert code == 1 and "could not be read" in se and "--allow-unreadable" in se
    assert "broken.parquet" in se and sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    code, so, se = run_cli(*args, "--allow-unreadable")
    assert code == 0, se
    dead = read_jsonl(tmp_path / "r.parquet.deadletter.jsonl")
    assert len(dead) == 1
    assert dead[0]["source"].endswith("broken.parquet")
    assert dead[0]["reason"].startswith("unreadable input:")
    man = json.loads((tmp_path / "r.parquet.manifest.json").read_text())
    # the broken file's footer is unreadable: how many rows it held cannot be known
    assert man["records"] == {"input": None, "reported": 100, "dead_lettered": 0,
                              "unreadable_rows": 0, "unreadable_parts": 1,
                              "unreadable_rows_unknown": True, "reconciles": True,
                              "counted_from": "data"}


def test_reproduce_all_writes_one_report(tmp_path, monkeypatch):
    """`reproduce all --out DIR --readme R` runs each family into DIR/FAMILY and writes
    DIR/report.md and R's results block (restricted here to one fast family)."""
    from ldp_beam.pipelines import cli

    from ldp_beam.reproduce.report import README_BEGIN_LINE, README_END

    monkeypatch.setattr(cli, "FAMILIES", ("uldp",))
    readme = tmp_path / "README.md"
    readme.write_text(f"{README_BEGIN_LINE}\n{README_END}\n")
    code, _, se = run_cli("reproduce", "all", "--quick", "--seed", "3", "--out", str(tmp_path),
                          "--data-dir", str(tmp_path / "none"), "--json",
                          str(tmp_path / "r.json"), "--readme", str(readme))
    assert code == 0, se
    assert "| uldp | quick run, seed 3, " in readme.read_text()
    report = (tmp_path / "report.md").read_text()
    assert "- uldp: quick run, seed 3, " in report
    assert "| [uldp](#uldp) | 11 |" in report
    assert "## JuRR / CPRR" in report and "| claim | verdict | evidence |" in report
    assert "](uldp/fig3_" in report
    assert (tmp_path / "uldp" / "uldp_claims.json").exists()


def test_reproduce_report_rewrites_report_and_readme(tmp_path):
    """`reproduce report --out DIR --readme README` runs no experiment: it rewrites DIR/report.md
    and the README's block from the outputs already in DIR/FAMILY/."""
    from ldp_beam.reproduce.report import README_BEGIN_LINE, README_END

    out = tmp_path / "figures"
    (out / "uldp").mkdir(parents=True)
    (out / "uldp" / "uldp_claims.json").write_text(json.dumps(
        [{"claim": "JuRR wins", "verdict": "differs", "evidence": "40 of 40"}]))
    (out / "uldp" / "uldp.json").write_text(json.dumps([{"seed": 9, "quick": True}]))
    (out / "uldp" / "fig3_nursery-parents.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{README_BEGIN_LINE}\nold\n{README_END}\n\n## after\n")
    code, so, se = run_cli("reproduce", "report", "--out", str(out), "--readme", str(readme))
    assert code == 0, se
    assert "report written to" in se and "rewritten" in se and so == ""
    report = (out / "report.md").read_text()
    assert "- uldp: quick run, seed 9, 1 records" in report and "- bisample: no records file" \
        in report
    text = readme.read_text()
    assert "old" not in text and text.endswith(f"{README_END}\n\n## after\n")
    assert "| JuRR wins | **differs** | 40 of 40 |" in text
    assert "](figures/uldp/fig3_nursery-parents.png)" in text
    assert "the claims file `figures/bisample/bisample_claims.json` is missing" in text
    code, _, se = run_cli("reproduce", "report", "--out", str(out), "--readme", str(readme))
    assert code == 0 and "already up to date" in se
    readme.write_text("# no markers\n")
    code, _, se = run_cli("reproduce", "report", "--out", str(out), "--readme", str(readme))
    assert code == 2 and "README.md: expected one line starting with '<!-- results:begin'" in se


@pytest.mark.parametrize("args", [("reproduce", "report", "--readme", "R.md"),
                                  ("reproduce", "all", "--quick", "--readme", "R.md"),
                                  ("reproduce", "uldp", "--out", "D", "--readme", "R.md"),
                                  ("reproduce", "report")])
def test_reproduce_readme_usage_errors(args, capsys):
    from ldp_beam.pipelines.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert ("--readme" in err) if "--readme" in args else ("--out DIR is required" in err)


def test_only_the_console_script_freezes_the_heap(monkeypatch):
    """The console script hands the imports' long-lived objects to the collector's permanent
    generation (0.3-0.4 s less per command at 10^7 rows); in-process callers of ``main`` keep
    an ordinary heap."""
    import gc

    from ldp_beam.pipelines import cli

    gc.unfreeze()
    before = gc.get_freeze_count()
    assert before == 0
    cli._freeze_heap()  # not the console script: nothing frozen
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(cli, "_CONSOLE", True)
    try:
        cli._freeze_heap()
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
