"""Estimates and releases as tidy tables (issue 15): `-o X.parquet` / `X.csv` write one row per
statistic and cell with value, SE, CI, n and the guarantee; `-o X.json` keeps the nested form; the
same numbers either way; `-o duckdb:///FILE?table=T` and `-o postgresql://...?table=T` write the
same rows into a database table when the run commits (a real PostgreSQL server, started here)."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

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


# --------------------------------------------------------------------------- database tables
HIST = ("-m", "laplace-histogram", "--epsilon", "1", "-p", "categories=a,b,c")


def _raw(tmp_path):
    """Raw rows for central releases: a value, a group and a person."""
    rng = np.random.default_rng(5)
    n = 2000
    pq.write_table(pa.table({"v": rng.choice(list("abc"), n), "g": rng.choice(["n", "s"], n),
                             "uid": rng.integers(0, 700, n)}), tmp_path / "raw.parquet")
    return str(tmp_path / "raw.parquet")


def _duck(path, sql):
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


TIDY_COLS = ("statistic", "value", "stderr", "ci_low", "ci_high", "n_reports", "group",
             "guarantee")


def test_estimates_and_releases_into_duckdb_tables(tmp_path):
    """`-o duckdb:///FILE?table=T`: the tidy rows in a table, written only when the run commits;
    an existing table needs --force and is then replaced whole; --by and central releases
    (per key too) alike; the manifest and dead letters beside the database file."""
    pytest.importorskip("duckdb")
    rep = _reports(tmp_path)
    db = tmp_path / "out.duckdb"
    url = f"duckdb://{db}?table=est"
    assert run_cli("estimate", "-i", rep, "-o", str(tmp_path / "e.json"))[0] == 0
    code, so, se = run_cli("estimate", "-i", rep, "-o", url)
    assert code == 0, se
    cols = [r[0] for r in _duck(db, "SELECT column_name FROM information_schema.columns "
                                    "WHERE table_name = 'est'")]
    assert set(TIDY_COLS) - {"group"} <= set(cols)
    assert "group" not in cols and "bin_low" not in cols  # ungrouped grr: its columns only
    rows = _duck(db, "SELECT label, value, n_reports, guarantee, run_id FROM est "
                     "WHERE statistic = 'frequency' ORDER BY i")
    assert [r[0] for r in rows] == ["a", "b", "c"] and {r[2] for r in rows} == {3000}
    assert all(r[3].startswith("LDP with epsilon=2") for r in rows)
    man = json.loads((tmp_path / "out.duckdb.est.manifest.json").read_text())
    assert man["files"]["estimate"] == {"table": url, "rows": 3}
    assert rows[0][4] == man["run_id"]
    assert (tmp_path / "out.duckdb.est.deadletter.jsonl").exists()
    # the table exists: refused without --force, untouched
    code, _, se = run_cli("estimate", "-i", rep, "--by", "g", "-o", url)
    assert code == 2 and "--force" in se and "est" in se
    assert _duck(db, "SELECT count(*) FROM est")[0][0] == 3
    code, _, se = run_cli("estimate", "-i", rep, "--by", "g", "-o", url, "--force")
    assert code == 0, se
    grouped = _duck(db, 'SELECT "group", group_by, count(*), min(n_reports) FROM est '
                        'GROUP BY ALL ORDER BY 1')
    assert [(g, by, k) for g, by, k, _ in grouped] == [("n", "g", 3), ("s", "g", 3)]
    assert sum(n for *_, n in grouped) == 3000
    # a central release, and one per key, into tables of the same file
    code, _, se = run_cli("estimate", "-i", _raw(tmp_path), "-c", "v", *HIST,
                          "-o", f"duckdb://{db}?table=rel")
    assert code == 0, se
    rel = _duck(db, "SELECT label, n_reports, guarantee_kind FROM rel ORDER BY i")
    assert [r[0] for r in rel] == ["a", "b", "c"] and {r[1] for r in rel} == {None}
    assert {r[2] for r in rel} == {"central-DP"}
    assert json.loads((tmp_path / "out.duckdb.rel.curator.json").read_text())[
        "records"]["input"] == 2000
    code, _, se = run_cli("estimate", "-i", str(tmp_path / "raw.parquet"), "-c", "v", *HIST,
                          "--privacy-unit", "uid", "--by", "g", "--keys", "n,s",
                          "-o", f"duckdb://{db}?table=rel_by")
    assert code == 0, se
    assert _duck(db, 'SELECT DISTINCT "group" FROM rel_by ORDER BY 1') == [("n",), ("s",)]


def test_a_failed_run_leaves_the_table_untouched(tmp_path):
    pytest.importorskip("duckdb")
    d = tmp_path / "in"
    d.mkdir()
    raw = _raw(tmp_path)
    (d / "a.parquet").write_bytes(open(raw, "rb").read())
    url = f"duckdb://{tmp_path / 'o.duckdb'}?table=rel"
    assert run_cli("estimate", "-i", str(d), "-c", "v", *HIST, "-o", url)[0] == 0
    before = _duck(tmp_path / "o.duckdb", "SELECT * FROM rel ORDER BY i")
    (d / "b.parquet").write_bytes(b"PAR1 not parquet")  # the re-run cannot read all its input
    code, _, se = run_cli("estimate", "-i", str(d), "-c", "v", *HIST, "-o", url, "--force")
    assert code == 1 and "nothing was committed" in se
    assert _duck(tmp_path / "o.duckdb", "SELECT * FROM rel ORDER BY i") == before
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".ldp-beam-staging-")]
    # the table an input names is never an output
    code, _, se = run_cli("estimate", "-i", url, "-c", "label", *HIST, "-o", url, "--force")
    assert code == 2 and "is an input table" in se


def test_estimates_and_per_key_releases_into_postgres(tmp_path, pg_url, monkeypatch):
    """`-o postgresql://USER@HOST:PORT/DB?table=T` from the CLI against a real server: the LDP
    estimate by group and a per-key central release; --force replaces the table in one
    transaction; side outputs default to ./DB.T (here under --side-outputs)."""
    import psycopg

    rep = _reports(tmp_path)
    monkeypatch.chdir(tmp_path)
    url = f"{pg_url}?table=estimates"
    code, so, se = run_cli("estimate", "-i", rep, "--by", "g", "-o", url)
    assert code == 0, se
    db = pg_url.rsplit("/", 1)[-1]  # side outputs are named DB.TABLE by default
    assert (tmp_path / f"{db}.estimates.manifest.json").exists()
    with psycopg.connect(pg_url) as conn:
        got = conn.execute('SELECT "group", statistic, label, value, stderr, ci_low, ci_high, '
                           "n_reports, guarantee FROM estimates ORDER BY 1, i").fetchall()
    assert [(g, lab) for g, _, lab, *_ in got] == [(g, c) for g in "ns" for c in "abc"]
    assert all(lo < v < hi for *_, v, se_, lo, hi, n, g in got)
    assert sum({g: n for g, *_, n, _ in got}.values()) == 3000
    code, _, se = run_cli("estimate", "-i", rep, "-o", url)
    assert code == 2 and "--force" in se
    code, _, se = run_cli("estimate", "-i", rep, "-o", url, "--force")
    assert code == 0, se
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT run_id) FROM estimates"
                            ).fetchone() == (3, 1)
    code, _, se = run_cli("estimate", "-i", _raw(tmp_path), "-c", "v", *HIST,
                          "--privacy-unit", "uid", "--by", "g", "--keys", "n,s",
                          "-o", f"{pg_url}?table=releases",
                          "--side-outputs", str(tmp_path / "side" / "rel"))
    assert code == 0, se
    assert json.loads((tmp_path / "side" / "rel.curator.json").read_text())["by"] == "g"
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute('SELECT "group", label, n_reports, guarantee_kind FROM releases '
                            'ORDER BY 1, i').fetchall()
    assert [(g, lab) for g, lab, *_ in rows] == [(g, c) for g in "ns" for c in "abc"]
    assert {(n, k) for *_, n, k in rows} == {(None, "central-DP")}
