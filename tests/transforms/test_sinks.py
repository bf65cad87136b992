"""Estimates as tidy tables: flattening (scalars, labelled vectors, bucket edges, density grids,
quantile probabilities, joint tables, groups, windows, errors) and round trips through every
writer (Parquet, CSV, DuckDB, and a real PostgreSQL server), also from a Beam step."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from ldp_beam import build_mechanism
from ldp_beam.estimators import estimator_for
from ldp_beam.privacy import run_guarantee
from ldp_beam.transforms import (TIDY_SCHEMA, SourceError, WriteTidy, tidy_output, tidy_rows,
                                 tidy_schema, tidy_table, write_tidy)
from ldp_beam.transforms.sinks import previous_table
from ldp_beam_test_helpers import emit

_spec = importlib.util.spec_from_file_location(
    "ldp_beam_postgres_server_sinks",
    Path(__file__).resolve().parents[1] / "postgres_server.py")  # tests/postgres_server.py
pgs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pgs)


def estimate(name: str, values, **params) -> dict:
    mech = build_mechanism(name, **params)
    rng = np.random.default_rng(7)
    est = estimator_for(mech)
    return est.finalize(est.add(est.create(), emit(mech, values, rng))).to_dict()


@pytest.fixture(scope="module")
def estimates():
    rng = np.random.default_rng(1)
    cats = np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, 4000)]
    num = rng.random(4000)
    return {
        "grr": estimate("grr", cats, epsilon=1.0, domain=["a", "b", "c"]),
        "bisample": estimate("bisample", num, epsilon=1.0, lower=0, upper=1),
        "cprr": estimate("cprr", {"x": cats, "y": cats}, epsilon=1.0, x_domain=["a", "b", "c"],
                         y_domain=["a", "b", "c"], x_sensitive=["a"], y_sensitive=["a"]),
        "square-wave": estimate("square-wave", num, epsilon=1.0, lower=0, upper=1),
        "laplace-histogram": estimate("laplace-histogram", num, epsilon=1.0, bins=4, lower=0,
                                      upper=2),
    }


def test_scalars_keep_value_stderr_interval_and_guarantee(estimates):
    e = estimates["bisample"]
    rows = {r["statistic"]: r for r in tidy_rows(e, run_id="R1")}
    assert set(rows) == {"mean", "sum"}
    m = rows["mean"]
    s = e["statistics"]["mean"]
    assert (m["value"], m["stderr"]) == (s["value"], s["stderr"])
    assert [m["ci_low"], m["ci_high"]] == s["ci95"]
    assert m["n_reports"] == 4000 and m["i"] is None and m["run_id"] == "R1"
    assert (m["guarantee"], m["guarantee_kind"], m["epsilon"], m["seeded"]) == \
        ("LDP with epsilon=1", "LDP", 1.0, None)


def test_vectors_carry_their_labels_and_intervals(estimates):
    e = estimates["grr"]
    rows = tidy_rows(e)
    f = e["statistics"]["frequency"]
    assert [(r["statistic"], r["i"], r["label"]) for r in rows] == \
        [("frequency", i, lab) for i, lab in enumerate("abc")]
    for i, r in enumerate(rows):
        assert (r["value"], r["stderr"], r["clipped"]) == \
            (f["value"][i], f["stderr"][i], f["clipped"][i])
        assert math.isclose(r["ci_low"], f["value"][i] - 1.959963984540054 * f["stderr"][i])


def test_histogram_rows_have_bucket_edges(estimates):
    rows = tidy_rows(estimates["laplace-histogram"])
    assert [(r["bin_low"], r["bin_high"]) for r in rows] == \
        [(0.0, 0.5), (0.5, 1.0), (1.0, 1.5), (1.5, 2.0)]
    assert all(r["n_reports"] is None and r["guarantee_kind"] == "central-DP" for r in rows)


def test_joint_tables_have_x_and_y_labels(estimates):
    e = estimates["cprr"]
    rows = [r for r in tidy_rows(e) if r["statistic"] == "joint"]
    assert len(rows) == 9
    j = e["statistics"]["joint"]
    for r in rows:
        assert (r["x_label"], r["y_label"]) == ("abc"[r["i"]], "abc"[r["j"]])
        assert r["value"] == j["value"][r["i"]][r["j"]]
        assert r["stderr"] == j["stderr"][r["i"]][r["j"]]
    mx = [r for r in tidy_rows(e) if r["statistic"] == "marginal_x"]
    assert [r["label"] for r in mx] == ["a", "b", "c"]


def test_densities_grids_quantiles_and_text(estimates):
    e = estimates["square-wave"]
    rows = tidy_rows(e)
    grid = e["statistics"]["grid"]["value"]
    dens = [r for r in rows if r["statistic"] == "density"]
    assert [r["grid_x"] for r in dens] == grid
    assert [r["value"] for r in dens] == e["statistics"]["density"]["value"]
    q = [r for r in rows if r["statistic"] == "quantiles"]
    assert [r["probability"] for r in q][:3] == [0.01, 0.05, 0.1]
    n_cells = sum(len(s["value"]) if isinstance(s["value"], list) else 1
                  for s in e["statistics"].values())
    assert len(rows) == n_cells  # nothing dropped


def test_groups_windows_errors_and_seeded_runs(estimates):
    g = run_guarantee(build_mechanism("grr", epsilon=1.0, domain=["a", "b", "c"]).guarantee,
                      seeded=True)
    est = dict(estimates["grr"], guarantee=g)
    out = {"by": "region", "guarantee": g, "seeded": True,
           "estimates": {"north": est, "south": {"error": "no reports", "n_reports": 0}}}
    rows = tidy_output(out, run_id="R")
    assert [(r["group_by"], r["group"]) for r in rows] == [("region", "north")] * 3 + \
        [("region", "south")]
    err = rows[-1]
    assert err["statistic"] is None and err["error"] == "no reports" and err["n_reports"] == 0
    assert all(r["seeded"] is True and r["guarantee_kind"] == "none (seeded: not private)"
               and r["epsilon"] is None and r["delta"] is None for r in rows)
    assert "not private" in rows[0]["guarantee"]
    pane = {"window_start": "2026-01-01T00:00:00Z", "window_end": "2026-01-01T00:01:00Z",
            "estimate": estimates["grr"]}
    assert {(r["window_start"], r["window_end"]) for r in tidy_output(pane)} == \
        {("2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z")}
    with pytest.raises(ValueError, match="unknown column"):
        tidy_table([{"statistic": "x", "surprise": 1}])


def _all_rows(estimates) -> list[dict]:
    rows = []
    for name, e in estimates.items():
        rows += tidy_rows(e, group_key=name, by="family", run_id="run-1")
    return rows


def _same(a: pa.Table, rows: list[dict]) -> None:
    want = tidy_table(rows)
    assert a.num_rows == want.num_rows
    assert a.schema.names == want.schema.names  # the rows' families' columns, no more
    for c in want.schema.names:
        got, exp = a.column(c).to_pylist(), want.column(c).to_pylist()
        for x, y in zip(got, exp):
            if isinstance(y, float) and math.isnan(y):
                assert isinstance(x, float) and math.isnan(x), c
            else:
                assert x == y, (c, x, y)


def test_parquet_and_csv_round_trip_every_value(estimates, tmp_path):
    rows = _all_rows(estimates)
    assert write_tidy(rows, str(tmp_path / "e.parquet")) == len(rows)
    t = pq.read_table(tmp_path / "e.parquet")
    assert t.schema == tidy_schema(list(estimates), grouped=True)  # no window columns
    assert set(TIDY_SCHEMA.names) - set(t.schema.names) == \
        {"window_start", "window_end", "value_text"}
    _same(t, rows)
    write_tidy(rows, str(tmp_path / "e.csv"))
    c = pacsv.read_csv(tmp_path / "e.csv", convert_options=pacsv.ConvertOptions(
        column_types=TIDY_SCHEMA, strings_can_be_null=True, quoted_strings_can_be_null=False))
    _same(c, rows)  # doubles are written with their shortest round-trip text


def test_tidy_bytes_are_the_files_write_tidy_writes(estimates, tmp_path):
    import io

    from ldp_beam.transforms.sinks import tidy_bytes

    rows = _all_rows(estimates)
    _same(pq.read_table(io.BytesIO(tidy_bytes(rows, "parquet"))), rows)
    write_tidy(rows, str(tmp_path / "e.csv"))
    assert tidy_bytes(rows, "csv") == (tmp_path / "e.csv").read_bytes()
    with pytest.raises(Exception, match="fmt"):
        tidy_bytes(rows, "json")


def test_table_exists_for_duckdb(estimates, tmp_path):
    pytest.importorskip("duckdb")
    from ldp_beam.transforms.sinks import tidy_table_exists

    url = f"duckdb://{tmp_path}/t.duckdb?table=estimates"
    assert tidy_table_exists(url) is False  # no database file yet: no table, none created
    assert not (tmp_path / "t.duckdb").exists()
    write_tidy(_all_rows(estimates)[:2], url)
    assert tidy_table_exists(url) is True
    assert tidy_table_exists(f"duckdb://{tmp_path}/t.duckdb?table=other") is False
    assert tidy_table_exists(f"duckdb://{tmp_path}/t.duckdb?table=main.estimates") is True
    (tmp_path / "junk.duckdb").write_bytes(b"not a database at all" * 100)
    with pytest.raises(SourceError, match="junk.duckdb"):
        tidy_table_exists(f"duckdb://{tmp_path}/junk.duckdb?table=t")


def test_duckdb_round_trip_replace_and_append(estimates, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    rows = _all_rows(estimates)
    url = f"duckdb://{tmp_path}/out.duckdb?table=estimates"
    write_tidy(rows, url)
    write_tidy(rows, url)  # replace: still one copy
    con = duckdb.connect(str(tmp_path / "out.duckdb"), read_only=True)
    t = con.sql("SELECT * FROM estimates").to_arrow_table() \
        if hasattr(type(con.sql("SELECT 1")), "to_arrow_table") else con.sql(
            "SELECT * FROM estimates").arrow()
    con.close()
    _same(t, rows)
    write_tidy(rows[:5], url, mode="append")
    con = duckdb.connect(str(tmp_path / "out.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM estimates").fetchall()[0][0] == len(rows) + 5
    con.close()
    with pytest.raises(Exception, match="mode"):
        write_tidy(rows, url, mode="upsert")
    with pytest.raises(Exception, match="table=NAME"):
        write_tidy(rows, f"duckdb://{tmp_path}/out.duckdb")


def test_write_tidy_from_a_beam_step(estimates, tmp_path):
    rows = _all_rows(estimates)
    path = str(tmp_path / "beam.parquet")
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        _ = p | beam.Create(rows) | WriteTidy(path)
    t = pq.read_table(path)
    key = ["group", "statistic", "i", "j"]
    _same(t.sort_by([(k, "ascending") for k in key]),
          tidy_table(rows).sort_by([(k, "ascending") for k in key]).to_pylist())


def test_postgres_round_trip_in_one_transaction(estimates, pg_url):
    import psycopg

    rows = _all_rows(estimates)
    write_tidy(rows, f"{pg_url}?table=estimates")
    write_tidy(rows, f"{pg_url}?table=estimates")  # replaced, not doubled
    import adbc_driver_postgresql.dbapi as pg

    with pg.connect(pg_url) as con, con.cursor() as cur:
        cur.execute("SELECT * FROM estimates")
        t = cur.fetch_arrow_table()
    t = pa.Table.from_arrays(list(t.columns), schema=pa.schema(
        [pa.field(f.name, f.type) for f in t.schema]))
    _same(t, rows)
    write_tidy(rows[:3], f"{pg_url}?table=estimates", mode="append")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM estimates").fetchone()[0] == len(rows) + 3
    # a failed write leaves the table as it was
    bad = tidy_table(rows[:2]).set_column(0, "run_id", pa.array(["x\x00y", "z"]))
    with pytest.raises(SourceError, match=r"table=estimates: writing table estimates failed"):
        write_tidy(bad, f"{pg_url}?table=estimates")
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM estimates").fetchone()[0] == len(rows) + 3
    port = pgs.free_port()
    with pytest.raises(SourceError, match="cannot be reached"):
        write_tidy(rows, f"postgresql://ldpbeam@127.0.0.1:{port}/x?table=t")
    from ldp_beam.transforms.sinks import tidy_table_exists

    assert tidy_table_exists(f"{pg_url}?table=estimates") is True
    assert tidy_table_exists(f"{pg_url}?table=public.estimates") is True
    assert tidy_table_exists(f"{pg_url}?table=nothing_here") is False
    with pytest.raises(SourceError, match="cannot be reached"):
        tidy_table_exists(f"postgresql://ldpbeam@127.0.0.1:{port}/x?table=t")


# --------------------------------------------------------------------------- kept tables
_kept_names = iter(range(10 ** 6))


class _Db:
    """A DuckDB file or the module's PostgreSQL database, with a schema ``kept`` besides the
    default one, read and changed with plain SQL (not through the code under test)."""

    def __init__(self, kind: str, base: str, path: str | None = None) -> None:
        self.kind, self.base, self.path = kind, base, path
        self.default = "main" if kind == "duckdb" else "public"  # the schema of a bare name
        self.sql("CREATE SCHEMA IF NOT EXISTS kept")

    def url(self, table: str) -> str:
        return f"{self.base}?table={table}"

    def sql(self, query: str, params=()) -> list[tuple]:
        if self.kind == "duckdb":
            import duckdb

            con = duckdb.connect(self.path)
            try:
                cur = con.execute(query, list(params))
                return cur.fetchall() if cur.description else []
            finally:
                con.close()
        import psycopg

        with psycopg.connect(self.base) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def snapshot(self, table: str) -> tuple[list, list]:
        """``(columns with their types, in order; the rows, NaN as text, in a stable order)``."""
        from ldp_beam.transforms.sources import quote_ident

        parts = table.split(".")
        schema = parts[0] if len(parts) == 2 else self.default
        mark = "?" if self.kind == "duckdb" else "%s"
        cols = self.sql("SELECT column_name, data_type FROM information_schema.columns WHERE "
                        f"table_schema = {mark} AND table_name = {mark} "
                        "ORDER BY ordinal_position", (schema, parts[-1]))
        rows = [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r)
                for r in self.sql(f"SELECT * FROM {quote_ident(table)}")]
        return cols, sorted(rows, key=repr)

    def exists(self, table: str) -> bool:
        """Whether ``table`` (``T``: in the default schema only; or ``S.T``) exists."""
        schema, _, name = table.rpartition(".")
        return bool(self.sql("SELECT 1 FROM information_schema.tables WHERE table_schema = "
                             + ("?" if self.kind == "duckdb" else "%s") + " AND table_name = "
                             + ("?" if self.kind == "duckdb" else "%s"),
                             (schema or self.default, name)))


@pytest.fixture(params=["duckdb", "postgresql"])
def db(request, tmp_path):
    if request.param == "duckdb":
        pytest.importorskip("duckdb")
        return _Db("duckdb", f"duckdb://{tmp_path}/out.duckdb", str(tmp_path / "out.duckdb"))
    pytest.importorskip("psycopg")
    return _Db("postgresql", request.getfixturevalue("pg_url"))


def _names(kind: str) -> tuple[str, str]:
    """A new table name (``plain``, ``kept.`` + name, or a 63-byte one) and its bare name."""
    n = next(_kept_names)
    bare = f"t{n}_" + "x" * (63 - len(f"t{n}_")) if kind == "long" else f"estimates_{n}"
    assert kind != "long" or len(bare.encode()) == 63
    return ("kept." + bare if kind == "schema" else bare), bare


def _old_and_new(estimates) -> tuple[list[dict], list[dict]]:
    """Rows of two tables that differ in rows, columns and column types."""
    old = _all_rows(estimates)
    new = tidy_rows(estimates["grr"], run_id="run-2")
    assert set(tidy_table(old).schema.names) != set(tidy_table(new).schema.names)
    return old, new


def _kept(estimates, db, kind):
    """(old rows, new rows, the table's name, its URL, its schema prefix, the kept name)."""
    old, new = _old_and_new(estimates)
    table, bare = _names(kind)
    url = db.url(table)
    return old, new, table, url, table[:-len(bare)], previous_table(url)


@pytest.mark.parametrize("kind", ["plain", "schema", "long"])
def test_keep_then_restore_gives_back_the_old_table(estimates, db, kind):
    from ldp_beam.transforms.sinks import restore_tidy

    old, new, table, url, schema, keep = _kept(estimates, db, kind)
    assert write_tidy(old, url) == len(old)
    before = db.snapshot(table)
    assert len(before[1]) == len(old) and [c for c, _ in before[0]] == \
        tidy_table(old).schema.names
    assert write_tidy(new, url, keep=keep) == len(new)
    now = db.snapshot(table)
    assert len(now[1]) == len(new) and [c for c, _ in now[0]] == tidy_table(new).schema.names
    assert db.snapshot(schema + keep) == before  # kept in the table's own schema
    if schema:
        assert not db.exists(f"{db.default}.{keep}")  # not in the default schema
    restore_tidy(url, keep)
    assert db.snapshot(table) == before  # the same rows, columns and column types
    assert not db.exists(schema + keep)
    restore_tidy(url, keep)  # again: the table is dropped and nothing is renamed back
    assert not db.exists(table) and not db.exists(schema + keep)


@pytest.mark.parametrize("kind", ["plain", "schema"])
def test_keep_without_a_previous_table_then_restore_leaves_none(estimates, db, kind):
    from ldp_beam.transforms.sinks import restore_tidy

    _, new, table, url, schema, keep = _kept(estimates, db, kind)
    assert not db.exists(table)
    write_tidy(new, url, keep=keep)
    assert db.exists(table) and not db.exists(schema + keep)  # nothing renamed
    assert len(db.snapshot(table)[1]) == len(new)
    restore_tidy(url, keep)
    assert not db.exists(table) and not db.exists(schema + keep)


@pytest.mark.parametrize("kind", ["plain", "schema"])
def test_keep_then_drop_leaves_only_the_new_table(estimates, db, kind):
    from ldp_beam.transforms.sinks import drop_tidy

    old, new, table, url, schema, keep = _kept(estimates, db, kind)
    write_tidy(old, url)
    write_tidy(new, url, keep=keep)
    after = db.snapshot(table)
    assert db.exists(schema + keep)
    drop_tidy(url, keep)
    assert not db.exists(schema + keep) and db.snapshot(table) == after
    assert len(after[1]) == len(new) and [c for c, _ in after[0]] == tidy_table(new).schema.names
    drop_tidy(url, keep)  # no kept table: nothing to do
    assert db.snapshot(table) == after


@pytest.mark.parametrize("kind", ["plain", "schema"])
def test_a_stale_kept_table_is_replaced(estimates, db, kind):
    from ldp_beam.transforms.sinks import restore_tidy
    from ldp_beam.transforms.sources import quote_ident

    old, new = _old_and_new(estimates)
    table, bare = _names(kind)
    url, schema = db.url(table), table[:-len(bare)]
    keep = previous_table(url)
    stale = quote_ident(schema + keep)
    db.sql(f"CREATE TABLE {stale} AS SELECT 1 AS junk")
    write_tidy(new, url, keep=keep)  # no table to keep: the stale one is dropped all the same
    assert not db.exists(schema + keep)
    db.sql(f"CREATE TABLE {stale} AS SELECT 1 AS junk")
    write_tidy(old, url)
    before = db.snapshot(table)
    write_tidy(new, url, keep=keep)
    assert db.snapshot(schema + keep) == before  # the stale table's junk is gone
    restore_tidy(url, keep)
    assert db.snapshot(table) == before


def test_a_failed_write_keeps_the_table_and_the_stale_kept_one(estimates, pg_url):
    db = _Db("postgresql", pg_url)
    old, _ = _old_and_new(estimates)
    table, _ = _names("schema")
    url = db.url(table)
    keep = previous_table(url)
    write_tidy(old, url)
    before = db.snapshot(table)
    db.sql(f'CREATE TABLE kept."{keep}" AS SELECT 1 AS junk')
    bad = tidy_table(old[:2]).set_column(0, "run_id", pa.array(["x\x00y", "z"]))
    with pytest.raises(SourceError, match=f"table={table}: writing table {table} failed"):
        write_tidy(bad, url, keep=keep)
    assert db.snapshot(table) == before  # one transaction: nothing dropped or renamed
    assert db.snapshot("kept." + keep) == ([("junk", "integer")], [(1,)])


def test_keep_is_refused_where_it_cannot_work(estimates, db):
    from ldp_beam.errors import ParameterError
    from ldp_beam.transforms.sinks import drop_tidy, restore_tidy

    old, new = _old_and_new(estimates)
    table, bare = _names("schema")
    url = db.url(table)
    write_tidy(old, url)
    before = db.snapshot(table)
    with pytest.raises(ParameterError, match="'keep'.*append"):
        write_tidy(new, url, mode="append", keep="k")
    with pytest.raises(ParameterError, match="'keep'"):
        write_tidy(new, url, keep=bare)  # its own name: the new table would be dropped
    with pytest.raises(ParameterError, match="'keep'"):
        write_tidy(new, url, keep="kept.other")  # the schema is the table's
    with pytest.raises(ParameterError, match="'keep'"):
        write_tidy(new, url, keep="")
    with pytest.raises(ParameterError, match="'keep'"):
        restore_tidy(url, bare)
    with pytest.raises(ParameterError, match="'name'"):
        drop_tidy(url, bare)
    if db.kind == "duckdb":  # DuckDB names ignore case
        with pytest.raises(ParameterError, match="'keep'"):
            write_tidy(new, url, keep=bare.upper())
    else:  # PostgreSQL cuts names to 63 bytes
        with pytest.raises(ParameterError, match="'keep'"):
            write_tidy(new, db.url("a" * 63), keep="a" * 64)
    assert db.snapshot(table) == before  # nothing was written
    assert not db.exists("kept.k") and not db.exists("kept.other")


def test_keep_is_refused_for_files(estimates, tmp_path):
    from ldp_beam.errors import ParameterError
    path = tmp_path / "e.parquet"
    with pytest.raises(ParameterError, match="'keep'"):
        write_tidy(_all_rows(estimates), str(path), keep="previous")
    assert not path.exists()
    with pytest.raises(ParameterError, match="output"):
        previous_table(str(path))


def test_previous_table_names():
    assert previous_table("duckdb:///x.duckdb?table=estimates") == \
        "estimates__ldp_beam_previous"
    assert previous_table("postgresql://u@h:5432/d?table=s.estimates") == \
        "estimates__ldp_beam_previous"  # the bare name: kept in the table's schema
    fits = "e" * (63 - len("__ldp_beam_previous"))
    assert previous_table(f"duckdb:///x.duckdb?table={fits}") == fits + "__ldp_beam_previous"
    long_a, long_b = "a" * 62 + "b", "a" * 62 + "c"
    pa_, pb = (previous_table(f"postgresql://u@h:5432/d?table=s.{n}") for n in (long_a, long_b))
    assert len(pa_.encode()) == len(pb.encode()) == 63
    assert pa_ != pb and pa_.startswith("a" * 30) and pa_.endswith("__ldp_beam_previous")
    assert pa_ == previous_table(f"duckdb:///y.duckdb?table={long_a}")  # deterministic
    wide = "é" * 40  # 80 bytes: cut between characters, never inside one
    pw = previous_table(f"postgresql://u@h:5432/d?table={wide}")
    assert len(pw.encode()) <= 63 and pw.startswith("é" * 17) and \
        pw.endswith("__ldp_beam_previous")


def test_restore_and_drop_errors_name_the_output(tmp_path):
    from ldp_beam.transforms.sinks import drop_tidy, restore_tidy

    url = f"duckdb://{tmp_path}/none.duckdb?table=t"
    restore_tidy(url, "k")  # no database: nothing to restore, and no file made
    drop_tidy(url, "k")
    assert not (tmp_path / "none.duckdb").exists()
    (tmp_path / "junk.duckdb").write_bytes(b"not a database at all" * 100)
    with pytest.raises(SourceError, match="junk.duckdb"):
        restore_tidy(f"duckdb://{tmp_path}/junk.duckdb?table=t", "k")
    port = pgs.free_port()
    with pytest.raises(SourceError, match=r"\?table=t: .*cannot be reached"):
        restore_tidy(f"postgresql://ldpbeam@127.0.0.1:{port}/x?table=t", "k")
    with pytest.raises(SourceError, match="cannot be reached"):
        drop_tidy(f"postgresql://ldpbeam@127.0.0.1:{port}/x?table=t", "k")


def test_a_duckdb_table_with_an_index_is_kept_and_restored(tmp_path):
    """DuckDB refuses to rename a table with an index: the previous table is kept as a copy,
    and the replacement (which drops the index, as without keep) and its undo both work."""
    duckdb = pytest.importorskip("duckdb")
    from ldp_beam.transforms.sinks import drop_tidy, restore_tidy

    url = f"duckdb://{tmp_path}/i.duckdb?table=est"
    write_tidy([{"statistic": "mean", "value": 0.25}], url)
    con = duckdb.connect(f"{tmp_path}/i.duckdb")
    con.execute("CREATE INDEX by_value ON est(value)")
    con.close()
    keep = previous_table(url)
    write_tidy([{"statistic": "mean", "value": 0.75}], url, keep=keep)
    restore_tidy(url, keep)
    write_tidy([{"statistic": "mean", "value": 0.5}], url, keep=keep)
    drop_tidy(url, keep)
    con = duckdb.connect(f"{tmp_path}/i.duckdb", read_only=True)
    try:
        assert con.execute("SELECT value FROM est").fetchall() == [(0.5,)]
        assert con.execute("SELECT count(*) FROM information_schema.tables").fetchone() == (1,)
    finally:
        con.close()
