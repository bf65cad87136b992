"""``ldp-beam plan`` (issue 26): the command prints the plan of a release from a size, a table it
counts (rows, or distinct privacy units; groups of a column) or group sizes, with the ledger's
budget for the dataset, read only: no ledger is created, no entry is recorded, no noise drawn.
Run in-process through the CLI when ``plan`` is registered there, else through the module's own
``main`` (the same parser and command)."""
from __future__ import annotations

import io
import json
import sqlite3
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import run_cli

GRR = ("-m", "grr", "--epsilon", "1", "-p", "domain=a,b,c")


def _registered() -> bool:
    from ldp_beam.pipelines.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0]
    return "plan" in sub.choices


def plan_cli(*args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``ldp-beam plan ARGS``."""
    if _registered():
        return run_cli("plan", *args)
    from ldp_beam.pipelines.plan import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    g = np.random.default_rng(5)
    n = 6000
    uid = g.integers(0, 2500, n)
    region = np.array(["north", "south", "east", "isle"], dtype=object)[
        np.minimum(g.geometric(0.5, n) - 1, 3)]
    t = pa.table({"uid": uid, "region": region, "answer": g.choice(list("abc"), n),
                  "secret": g.normal(0, 1, n)})
    pq.write_table(t, d / "t.parquet")
    pacsv.write_csv(t, d / "t.csv")
    df = t.to_pandas()
    return d, {"rows": n, "units": df.uid.nunique(),
               "unit_groups": df.groupby("region").uid.nunique().to_dict()}


def _entries(db) -> int:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT COUNT(*) FROM ldp_beam_entries").fetchone()[0]


def test_plan_from_a_size_prints_the_table_rule_and_smallest_group(tmp_path):
    led = tmp_path / "none.db"
    code, out, err = plan_cli(*GRR, "--rows", "5000", "--ledger", f"sqlite:///{led}",
                              "--dataset", "survey")
    assert code == 0, err
    assert "plan: grr(epsilon=1.0" in out and "n = 5,000 rows" in out
    assert "frequency" in out and "[0, 1] declared" in out
    assert "rule: useful: the 95% CI half-width is at most half the width" in out
    assert "smallest group with a useful answer: about" in out
    assert "value: uniform over its 3 declared labels" in out
    assert "dataset survey has spent nothing" in out and "epsilon=1" in out
    assert "(--seed repeats this plan exactly); nothing was spent" in out
    assert not led.exists()  # reading never creates a ledger


def test_plan_json_is_strict_and_matches_the_python_api():
    from ldp_beam.plan import plan
    from ldp_beam.registry import build_mechanism

    code, out, err = plan_cli(*GRR, "--units", "2000", "--json", "--by", "50,500", "--seed",
                              "7")
    assert code == 0, err
    d = json.loads(out)
    api = plan(build_mechanism("grr", epsilon=1.0, domain="a,b,c"), 2000,
               groups=[50, 500], seed=7).to_dict()
    assert d["statistics"] == api["statistics"]
    assert d["smallest_useful_group"] == api["smallest_useful_group"]
    assert d["counted"] == {"n": 2000, "what": "privacy units"}
    assert [g["n"] for g in d["groups"]["shown"]] == [50, 500]
    assert d["budget"]["release_epsilon"] == 1.0


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_plan_counts_units_and_groups_of_an_input(table, fmt):
    d, want = table
    code, out, err = plan_cli(*GRR, "--input", str(d / f"t.{fmt}"), "--privacy-unit", "uid",
                              "--by", "region", "--json")
    assert code == 0, err
    p = json.loads(out)
    assert p["n"] == want["units"] and p["counted"]["rows"] == want["rows"]
    assert p["counted"]["groups"] == dict(sorted(want["unit_groups"].items(),
                                                 key=lambda kv: (-kv[1], kv[0])))
    shown = {g["key"]: g["n"] for g in p["groups"]["shown"]}
    assert shown == want["unit_groups"]
    assert p["groups"]["summary"]["by"] == "region"
    code, out, _ = plan_cli(*GRR, "--input", str(d / f"t.{fmt}"))
    assert code == 0 and f"n = {want['rows']:,} rows (of" not in out
    assert f"n = {want['rows']:,} rows in" in out


def test_plan_reads_the_budget_and_records_nothing(table, tmp_path):
    d, _ = table
    url = f"sqlite:///{tmp_path / 'l.db'}"
    code, _, err = run_cli("ledger", "--ledger", url, "--set-budget", "1.5", "--dataset",
                           "survey", "--why", "plan test")
    assert code == 0, err
    before = _entries(tmp_path / "l.db")
    code, out, err = plan_cli(*GRR, "--input", str(d / "t.parquet"), "--ledger", url,
                              "--dataset", "survey")
    assert code == 0, err
    assert "dataset survey has spent epsilon=0 of budget 1.5 (1.5 left)" in out
    assert "this release would spend epsilon=1: it fits (0.5 would be left)" in out
    code, out, err = plan_cli("-m", "grr", "--epsilon", "2", "-p", "domain=a,b,c", "--rows",
                              "100", "--ledger", url, "--dataset", "survey", "--json")
    assert code == 0, err
    b = json.loads(out)["budget"]
    assert b["fits"] is False and "exceeds what is left by 0.5" in b["line"]
    assert b["status"]["remaining"] == 1.5
    assert _entries(tmp_path / "l.db") == before  # read only


def test_plan_options_assume_target_level_and_estimator_options():
    code, out, err = plan_cli("-m", "pm", "--epsilon", "1", "-p", "lower=0", "-p", "upper=10",
                              "--rows", "3000", "--assume", "mean=2,sd=1", "--target",
                              "mean=0.5", "--level", "0.9", "--json")
    assert code == 0, err
    p = json.loads(out)
    assert p["level"] == 0.9 and "mean 2" in p["assumption"][0]["describe"]
    assert p["statistics"]["mean"]["range"] == "target +-0.5"
    assert p["statistics"]["mean"]["half_width"] == pytest.approx(
        1.6448536269514722 * p["statistics"]["mean"]["stderr"])
    code, out, err = plan_cli("-m", "rvns", "-p", "lower=0", "-p", "upper=10", "-p", "d=2",
                              "-p", "k=2", "--rows", "2000", "--replicates", "6", "--option",
                              "m=50", "--json")
    assert code == 0, err
    p = json.loads(out)
    assert len(p["statistics"]["density"]["stderr_cells"]) == 50  # the estimator's option
    assert p["simulation"]["replicates"] == 6


@pytest.mark.parametrize("args,message", [
    (("--rows", "10", "--by", "x,y"), "--by 'x,y': expected group sizes"),
    (("--rows", "10", "--privacy-unit", "uid"), "--privacy-unit: needs --input"),
    (("--rows", "0"), "--rows 0: an integer >= 1"),
    (("--rows", "10", "--assume", "z=0.5"), "--assume: parameter 'assume'"),
    (("--rows", "10", "--target", "wide"), "--target 'wide'"),
    (("--rows", "10", "--level", "2"), "--level 2.0"),
    (("--rows", "10", "--replicates", "1"), "--replicates 1"),
    (("--rows", "10", "-p", "nope=1"), "--mechanism/--param"),
    (("--input", "/no/such/file.parquet"), "--input '/no/such/file.parquet': no such file"),
])
def test_bad_options_exit_2_with_one_line_naming_the_option(args, message):
    code, out, err = plan_cli(*GRR, *args)
    assert code == 2, (out, err)
    assert err.startswith("ldp-beam plan: error: ") and message in err, err
    assert err.count("\n") == 1 and out == ""


def test_unknown_column_of_an_input(table):
    d, _ = table
    code, _, err = plan_cli(*GRR, "--input", str(d / "t.parquet"), "--privacy-unit", "who")
    assert code == 2 and "--privacy-unit 'who': the input has no such column" in err
    code, _, err = plan_cli(*GRR, "--input", str(d / "t.parquet"), "--by", "where")
    assert code == 2 and "--by 'where': not a column of --input, nor group sizes" in err
