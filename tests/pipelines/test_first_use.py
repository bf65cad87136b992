"""A new user's first hour (issue 26: "every finding above is a test"): the findings that no
other test file covered, each reproduced with the command the user ran.

The others are covered where their code is tested: small groups suppressed and failed groups
named (tests/pipelines/test_group_rule.py), unknown options, parameters given twice, options
that would be ignored, weak epsilons, where a derived epsilon comes from, --by on a missing
column and Beam's and Dask's logs (tests/pipelines/test_cli_surprises.py), tables mapped by
role and ``on_invalid`` (tests/core/test_table_inputs.py), ``Estimate.to_frame``
(tests/core/test_estimate_frame.py), the demo's figures and privacy lines
(tests/pipelines/test_cli.py::test_demo_runs_and_reconciles)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
N = 2000


def _one_line(se: str) -> bool:
    return se.strip() != "" and "\n" not in se.strip() and "Traceback" not in se


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """2,000 rows: a department (hr in about 11% of rows), an income in [-20, 220] with 5
    missing (so some fall outside [0, 200]) and a group."""
    d = tmp_path_factory.mktemp("first_use")
    rng = np.random.default_rng(26)
    dept = rng.choice(["eng", "ops", "hr", "sales"], N, p=[0.4, 0.3, 0.11, 0.19])
    income = rng.uniform(-20, 220, N)
    income[:5] = np.nan
    pq.write_table(pa.table({"dept": dept, "income": income,
                             "g": rng.choice(["a", "b"], N)}), d / "hr.parquet")
    return d, dept, income


# ------------------------------------------------------- 3. dead letters summarized by reason
def test_collect_summarizes_its_dead_letters_by_reason(table, tmp_path):
    """Leaving one label out of the category list dead-lettered 11% of the rows with exit 0 and
    nothing said about why."""
    d, dept, _ = table
    code, so, se = run_cli("collect", "-i", str(d / "hr.parquet"), "-c", "dept", "-m", "grr",
                           "-p", "domain=eng,ops,sales", "--epsilon", "1", "-q",
                           "-o", str(tmp_path / "r.parquet"))
    assert code == 0, se  # what was asked was done; every row is accounted for
    hr = int((dept == "hr").sum())
    assert 150 < hr < 300  # the premise: about 11% of 2,000
    assert f"dead-lettered {hr:,} rows ({hr / N:.1%} of {N:,} rows), by reason:" in so, so
    assert re.search(rf"^ +{hr}  value: 'hr' is not in the declared domain "
                     r"\['eng', 'ops', 'sales'\]$", so, re.M), so


def test_numeric_reasons_count_together_and_central_releases_say_them_too(table, tmp_path):
    d, _, income = table
    outside = int(np.sum(~np.isnan(income) & ((income < 0) | (income > 200))))
    code, so, se = run_cli("collect", "-i", str(d / "hr.parquet"), "-c", "income", "-m",
                           "bisample", "-p", "lower=0", "-p", "upper=200", "--epsilon", "1",
                           "-q", "-o", str(tmp_path / "r.parquet"))
    assert code == 0, se
    assert re.search(rf"^ +{outside}  value: <number> outside \[0, 200\]$", so, re.M), so
    assert re.search(r"^ +5  value: missing", so, re.M), so
    # the bisample sum on the console: plain digits, never 1.08092e+06
    code, so, se = run_cli("estimate", "-i", str(tmp_path / "r.parquet"), "-q",
                           "-o", str(tmp_path / "e.json"))
    assert code == 0, se
    assert re.search(r"sum=\d{1,3}(,\d{3})+ \[-?\d{1,3}(,\d{3})+, \d{1,3}(,\d{3})+\]", so), so
    assert "e+" not in so
    code, so, se = run_cli("estimate", "-i", str(d / "hr.parquet"), "-c", "income", "-m",
                           "central-mean", "-p", "lower=0", "-p", "upper=200", "--epsilon", "1",
                           "-q", "-o", str(tmp_path / "m.json"))
    assert code == 0, se
    assert "curator only (do not publish): dead-lettered" in so
    assert re.search(rf"^ +{outside}  value: <number> is outside the declared domain", so,
                     re.M), so


def test_the_reason_summary_counts_kinds_and_says_what_it_left_out(tmp_path):
    from ldp_beam.pipelines.cli import _reason_kind, dead_letter_reasons

    assert _reason_kind("value: -13.3 outside [0, 200]") == "value: <number> outside [0, 200]"
    assert _reason_kind("value: 1e+300 outside [0, 2.5]") == "value: <number> outside [0, 2.5]"
    assert _reason_kind("value: 'x9' is not in ['a', 'b']") == "value: 'x9' is not in ['a', 'b']"
    path = tmp_path / "d.jsonl"
    reasons = ["value: 'hr' is not in the declared domain"] * 6 + [
        f"value: {v} outside [0, 1]" for v in (2, 3.5, -1)] + ["x: a", "y: b", "z: c"]
    path.write_text("".join(json.dumps({"reason": r}) + "\n" for r in reasons))
    text = dead_letter_reasons(str(path), len(reasons), 100)
    lines = text.splitlines()
    assert lines[0] == "dead-lettered 12 rows (12.0% of 100 rows), by reason:"
    assert lines[1:3] == ["  6  value: 'hr' is not in the declared domain",
                          "  3  value: <number> outside [0, 1]"]
    assert lines[-1] == f"  ... and 2 more kind(s) of reason: see {path}"
    text = dead_letter_reasons(str(path), len(reasons), 100, scan=4)
    assert "(among the first 4)" in text and "  4  value: 'hr'" in text


# ---------------------------------------------------------- 4. RVNS: one field named delta
def test_an_rvns_guarantee_has_one_delta_and_names_the_neighbourhood(table, tmp_path):
    """The estimate's guarantee had `delta` (0: the (epsilon, delta)-DP failure probability)
    and `params.delta` (the neighbourhood size) side by side."""
    d, _, _ = table
    code, _, se = run_cli("collect", "-i", str(d / "hr.parquet"), "-c", "income", "-m", "rvns",
                          "-p", "lower=-20", "-p", "upper=220", "-p", "delta=96", "-q",
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 0, se
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "r.parquet"), "-q",
                          "-o", str(tmp_path / "e.json"))
    assert code == 0, se
    out = json.loads((tmp_path / "e.json").read_text())

    def deltas(obj, where=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from ([f"{where}/{k}"] if k == "delta" else []) + list(
                    deltas(v, f"{where}/{k}"))

    for g in (out["guarantee"], out["estimate"]["guarantee"]):
        assert list(deltas(g)) == ["/delta"] and g["delta"] == 0
        assert g["params"]["neighbourhood_delta"] == 96.0
    assert out["params"]["delta"] == 96.0  # the mechanism's parameter, as `-p delta=` set it


# ------------------------------------------------------------- 8. one rule for every URL
@pytest.fixture
def warehouse(tmp_path, monkeypatch):
    """A DuckDB file in the current folder (a unique name: never one at the root)."""
    duckdb = pytest.importorskip("duckdb")
    monkeypatch.chdir(tmp_path)
    name = f"hr-{os.getpid()}-{tmp_path.name}.db"
    assert not os.path.exists("/" + name)
    rng = np.random.default_rng(8)
    con = duckdb.connect(name)
    con.register("src", pa.table({"dept": rng.choice(["eng", "ops"], 500)}))
    con.execute("CREATE TABLE t AS SELECT * FROM src")
    con.close()
    return tmp_path, name


def test_duckdb_and_sqlite_urls_name_files_by_one_rule(warehouse):
    """`duckdb:///hr.db` meant /hr.db while the ledger's `sqlite:///team.db` was relative."""
    from ldp_beam.ledger import sqlite_path
    from ldp_beam.transforms.sources import open_source

    folder, name = warehouse
    absolute = str(folder / name)
    for after in (name, absolute, "/" + absolute):  # relative; ///abs; ////abs
        src = open_source(f"duckdb://{after}?table=t")
        ledger = sqlite_path(f"sqlite://{after}")
        assert os.path.realpath(src.path) == os.path.realpath(ledger) == os.path.realpath(
            absolute), after
        assert os.path.isabs(ledger) == after.startswith("/")


def test_the_rule_on_the_command_line(warehouse, tmp_path):
    folder, name = warehouse
    grr = ("-c", "dept", "-m", "grr", "-p", "domain=eng,ops", "--epsilon", "1", "-q")
    code, so, se = run_cli("collect", "-i", f"duckdb://{name}?table=t", *grr,
                           "--ledger", "sqlite://team.db", "-o", "r.parquet")
    assert code == 0, se
    assert (folder / "team.db").is_file() and "ledger sqlite://team.db:" in so
    code, _, se = run_cli("estimate", "-i", "r.parquet", "-q", "--ledger", "sqlite://team.db",
                          "-o", "duckdb://out.db?table=e")
    assert code == 0 and (folder / "out.db").is_file(), se  # an output table: the same rule
    # the SQLAlchemy reading of three slashes, while ./team.db holds the spending: refused
    code, _, se = run_cli("collect", "-i", f"duckdb://{name}?table=t", *grr,
                          "--ledger", "sqlite:///team.db", "-o", "r2.parquet")
    assert code == 2 and _one_line(se), se
    assert "names /team.db (absolute)" in se and "write sqlite://team.db" in se
    assert not (folder / "r2.parquet").exists()
    # and a DuckDB input written that way says which URL names the file here
    code, _, se = run_cli("collect", "-i", f"duckdb:///{name}?table=t", *grr,
                          "--ledger", "sqlite://team.db", "-o", "r2.parquet")
    assert code == 2 and _one_line(se), se
    assert f"'/{name}' does not exist; '{name}' in the current folder is duckdb://{name}" in se


def test_a_new_ledger_is_never_created_at_the_filesystem_root(tmp_path, monkeypatch):
    """The SQLAlchemy habit ``sqlite:///team.db`` names /team.db by ldp-beam's rule; as root
    that used to create a ledger at the filesystem root (the finding for ``duckdb:///x.db``).
    A new ledger there is refused, saying what to write; nothing is created."""
    from ldp_beam.errors import ParameterError
    from ldp_beam.ledger import Ledger

    monkeypatch.chdir(tmp_path)
    name = f"ldp-beam-test-{os.getpid()}.db"
    with pytest.raises(ParameterError, match=f"write sqlite://{name}"):
        Ledger.open(f"sqlite:///{name}")
    assert not os.path.exists("/" + name)
    with Ledger.open(f"sqlite://{name}"):  # the relative form creates it here
        pass
    assert (tmp_path / name).is_file()


def test_one_function_reads_every_file_url_and_no_output_lands_at_the_root(tmp_path,
                                                                            monkeypatch):
    """The rule lives in ldp_beam.urls, used by the ledger, DuckDB inputs and outputs and
    Iceberg catalogs alike (percent-decoded, several leading slashes one); a DuckDB output new
    at the filesystem root (the finding: as root, -o duckdb:///x.db wrote /x.db) is refused as
    a new ledger there is, and nothing is written."""
    from ldp_beam.errors import ParameterError
    from ldp_beam.transforms import write_tidy
    from ldp_beam.urls import url_file

    assert url_file("duckdb://my%20hr.db?table=t") == "my hr.db"
    assert url_file("sqlite:////srv/team.db") == url_file("sqlite:///srv/team.db") == \
        "/srv/team.db"
    assert url_file("iceberg://cat.db?table=ns.t") == "cat.db"
    monkeypatch.chdir(tmp_path)
    name = f"ldp-beam-test-{os.getpid()}.db"
    rows = [{"mechanism": "grr", "statistic": "n", "value": 1.0}]
    with pytest.raises(ParameterError, match=f"write duckdb://{name}"):
        write_tidy(rows, f"duckdb:///{name}?table=t")
    assert not os.path.exists("/" + name)
    write_tidy(rows, f"duckdb://{name}?table=t")  # the relative form writes it here
    assert (tmp_path / name).is_file()


def test_database_inputs_are_in_the_help(capsys):
    from ldp_beam.pipelines.cli import main

    for command in ("collect", "estimate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        part = text[text.index("--input INPUT, -i INPUT"):]
        part = part[:part.index("--", len("--input INPUT, -i INPUT"))]
        assert "duckdb://FILE.db?table=T (FILE relative to the current folder; " \
               "duckdb:///abs/FILE.db absolute" in part, (command, part)
        assert "postgresql://" in part and "iceberg://" in part


# ------------------------------------------------------- 10. no Beam warning on the console
def test_collect_prints_no_beam_warning(table, tmp_path):
    """"WARNING:root:apitools not found, ..." is logged by Beam when its GCP modules are
    imported (`python -c "import ldp_beam.pipelines.run"` prints it: a library does not
    reconfigure its user's logging); the command line shows it with --verbose only."""
    d, _, _ = table
    r = subprocess.run([sys.executable, "-m", "ldp_beam.pipelines.cli", "collect", "-i",
                        str(d / "hr.parquet"), "-c", "dept", "-m", "grr", "-p",
                        "domain=eng,ops,sales,hr", "--epsilon", "1", "-q", "-o",
                        str(tmp_path / "r.parquet")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr  # -q: nothing at all on stderr


# ----------------------------------------------------------- 11. what the packages carry
def test_the_packages_carry_the_license_change_log_and_type_hints(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("ldp_beam-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "ldp_beam/py.typed" in names
        (lic,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert b"Apache License" in z.read(lic) and b"Version 2.0" in z.read(lic)
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert re.search(r"^License(-Expression)?: Apache-2\.0$", meta, re.M), meta[:600]
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                    "b.build_sdist(sys.argv[1])", str(tmp_path / "sdist")], cwd=REPO,
                   check=True, capture_output=True)
    (sdist,) = (tmp_path / "sdist").glob("ldp_beam-*.tar.gz")
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "ldp_beam/py.typed"} <= names
    assert (REPO / "CHANGELOG.md").read_text().startswith("# ")


# ---------------------------------------------- 12. --column ROLE=COLUMN says to use --role
def test_a_role_mapping_given_to_column_says_to_use_role(table, tmp_path):
    """`collect --column value=income` answered "input has no column 'value=income'"."""
    d, _, _ = table
    for args in (("collect", "-m", "bisample"), ("estimate", "-m", "central-mean")):
        out = tmp_path / ("r.parquet" if args[0] == "collect" else "m.json")
        code, _, se = run_cli(*args, "-i", str(d / "hr.parquet"), "--column", "value=income",
                              "-p", "lower=0", "-p", "upper=200", "--epsilon", "1", "-q",
                              "-o", str(out))
        assert code == 2 and _one_line(se), se
        assert "write --role value=income (or --column income)" in se
        assert "has no column 'value=income'" not in se and not out.exists()


# ------------------------------------------------------------------ 9. the Python API docs
def test_the_tour_shows_tables_per_key_and_per_person():
    """The docs had no example of a table input, ``on_invalid``, ``to_frame`` or an estimate
    per key or per person (the blocks run in tests/pipelines/test_docs.py)."""
    text = (REPO / "docs" / "getting-started.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    tour = next(b for b in blocks if 'on_invalid="return"' in b)
    for needed in ("pd.DataFrame(", ".to_frame()", "region == r", 'drop_duplicates("customer")',
                   'unit="customer"'):
        assert needed in tour, needed
