"""A tidy table holds only the columns its family uses (issue 26): the core columns, the group
columns of a grouped output, the window columns of a stream pane, and the cell columns its family
declares (``tidy_cells``, next to the family). The schema follows from the family and the
output's shape, never from the data; a row that fills an undeclared column is refused, never
dropped; a plugin that declares nothing gets every column; the documented table of
docs/guides/outputs.md is the declarations; appends to database tables go by column name (a
table written with the old full schema takes the new rows) or are refused in one line."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ldp_beam import build_mechanism
from ldp_beam.estimators import estimator_for
from ldp_beam.mechanisms.categorical import GRR
from ldp_beam.registry import BUILTINS
from ldp_beam.transforms import SourceError, tidy_output, tidy_rows, write_tidy
from ldp_beam.transforms import sinks
from ldp_beam.transforms.sinks import (CELL_COLUMNS, CORE_COLUMNS, GROUP_COLUMNS, TIDY_COLUMNS,
                                       TIDY_SCHEMA, WINDOW_COLUMNS, TidySchemaError,
                                       family_cells, tidy_output_table, tidy_schema, tidy_table)
from ldp_beam_test_helpers import SAMPLE_OPTIONS, SAMPLE_PARAMS, emit, run_cli, valid_columns

DOC = Path(__file__).resolve().parents[2] / "docs" / "guides" / "outputs.md"
NAMES = [name for name, *_ in BUILTINS]

#: configurations besides SAMPLE_PARAMS that fill the rest of a family's declaration (a
#: histogram of categories fills label, one of bins the edges; osdp-rr's mean is clipped)
MORE = {name: [dict(epsilon=1.0, categories="a,b,c")]
        for name in ("dphr", "laplace-histogram", "ahp")}
MORE["structure-first"] = [dict(epsilon=1.0, categories="a,b,c", k=2, F=1000)]
MORE["osdp-rr"] = [dict(epsilon=1.0, k=1, lower=0.0, upper=10.0, query="mean")]


def release(name: str, params: dict, n: int = 3000, seed: int = 3) -> dict:
    mech = build_mechanism(name, **params)
    g = np.random.default_rng(seed)
    est = estimator_for(mech, **SAMPLE_OPTIONS.get(name, {}))
    data = (g.choice(np.array(mech.categories, dtype=object), n)
            if getattr(mech, "categories", ()) else valid_columns(mech, n, g))
    return est.finalize(est.add(est.create(), emit(mech, data, g))).to_dict()


@pytest.fixture(scope="module")
def estimates() -> dict[str, list[dict]]:
    return {name: [release(name, p) for p in [SAMPLE_PARAMS[name]] + MORE.get(name, [])]
            for name in NAMES}


def _cells(table: pa.Table) -> list[str]:
    return [c for c in table.schema.names if c in CELL_COLUMNS]


@pytest.mark.parametrize("name", NAMES)
def test_every_family_declares_exactly_the_cells_it_fills(estimates, name):
    """The table of every built-in family has the core columns and its declared cell columns,
    in TIDY_SCHEMA's order, and each declared cell column is filled by some configuration of
    the family (a declaration is not wider than the family's statistics), none undeclared."""
    declared = family_cells(name)
    filled = set()
    for est in estimates[name]:
        t = tidy_table(tidy_rows(est))
        assert t.schema == tidy_schema(name)
        assert t.schema.names == [c for c in TIDY_COLUMNS
                                  if c in CORE_COLUMNS or c in declared]
        filled |= {c for c in _cells(t) if t.column(c).null_count < t.num_rows}
    assert sorted(filled, key=CELL_COLUMNS.index) == list(declared)


def test_the_schema_follows_the_family_and_the_output_not_the_data(estimates):
    """Two runs of one family on different data, and a grouped output whose every group failed
    or was suppressed, have the same columns: what a daily appended table needs."""
    one = release("dphr", SAMPLE_PARAMS["dphr"], n=50, seed=1)
    other = release("dphr", dict(epsilon=1.0, categories="a,b,c"), n=9000, seed=2)
    assert tidy_table(tidy_rows(one)).schema == tidy_table(tidy_rows(other)).schema
    g = estimates["grr"][0]
    ok = {"mechanism": "grr", "by": "region", "guarantee": g["guarantee"],
          "estimates": {"north": g, "south": g}}
    bad = {"mechanism": "grr", "by": "region", "guarantee": g["guarantee"],
           "estimates": {"north": {"error": "no reports", "n_reports": 0},
                         "south": {"suppressed": "too few", "n_reports": 3}}}
    want = tidy_schema("grr", grouped=True)
    assert tidy_output_table(ok).schema == tidy_output_table(bad).schema == want
    assert tidy_table(tidy_output(bad)).schema == want  # the rows name their family too
    assert [r["mechanism"] for r in tidy_output(bad)] == ["grr", "grr"]
    assert tidy_output_table({**bad, "estimates": {}}).schema == want  # no rows at all


def test_group_and_window_columns_only_when_the_output_has_them(estimates):
    e = estimates["bisample"][0]
    pane = {"window_start": "2026-01-01T00:00:00Z", "window_end": "2026-01-01T00:01:00Z"}
    shapes = {
        (): {"estimate": e},
        GROUP_COLUMNS: {"by": "g", "estimates": {"a": e}},
        WINDOW_COLUMNS: {**pane, "estimate": e},
        GROUP_COLUMNS + WINDOW_COLUMNS: {**pane, "by": "g", "estimates": {"a": e}},
    }
    for extra, out in shapes.items():
        t = tidy_output_table(out, run_id="R")
        assert t.schema.names == [c for c in TIDY_COLUMNS if c in CORE_COLUMNS + extra
                                  or c == "clipped"], extra
        assert tidy_table(tidy_output(out)).schema == t.schema  # inferred alike from the rows
    assert tidy_schema("bisample").names == [c for c in TIDY_COLUMNS
                                              if c in CORE_COLUMNS + ("clipped",)]


def test_a_row_that_fills_an_undeclared_column_is_refused(estimates, tmp_path, monkeypatch):
    rows = tidy_rows(estimates["grr"][0])
    bad = [dict(rows[0], grid_x=0.5)] + rows[1:]
    with pytest.raises(TidySchemaError, match=r"of grr \(statistic 'frequency'\) fills cell "
                                              r"column\(s\) \['grid_x'\], which grr does not "
                                              r"declare"):
        tidy_table(bad)
    # a family whose declaration misses a column its statistics fill: refused, nothing written
    monkeypatch.setattr(GRR, "tidy_cells", ("i", "label"))
    with pytest.raises(TidySchemaError, match=r"\['clipped'\], which grr does not declare"):
        write_tidy(rows, str(tmp_path / "e.parquet"))
    assert not (tmp_path / "e.parquet").exists()
    monkeypatch.undo()
    assert tidy_table(rows).num_rows == 3
    # a column the given schema does not have
    grouped = tidy_rows(estimates["grr"][0], group_key="north", by="region")
    with pytest.raises(TidySchemaError, match=r"fills column\(s\) \['group_by', 'group'\], "
                                              "which the table's schema does not have"):
        tidy_table(grouped, tidy_schema("grr"))
    with pytest.raises(TidySchemaError, match="not columns of TIDY_SCHEMA"):
        tidy_table(rows, pa.schema([("value", pa.string())]))
    with pytest.raises(TidySchemaError, match="unknown column"):
        tidy_table([{"statistic": "x", "surprise": 1}])


def test_a_plugin_family_that_declares_nothing_gets_every_column(monkeypatch):
    """The test plugin's coin flip declares no tidy cells: every cell column; a variant that
    declares one gets it; one that names a column the tidy table lacks is refused."""
    from ldp_beam_test_helpers import load_test_plugin

    mod, reg = load_test_plugin(monkeypatch, "tidy_test_coinflip")

    @dataclass(frozen=True)
    class NarrowCoin(mod.CoinFlip):
        NAME: ClassVar[str] = "narrow-coin-tidy"
        tidy_cells: ClassVar[tuple[str, ...]] = ("i",)

    @dataclass(frozen=True)
    class WrongCoin(mod.CoinFlip):
        NAME: ClassVar[str] = "wrong-coin-tidy"
        tidy_cells: ClassVar[tuple[str, ...]] = ("i", "bucket")

    for cls in (NarrowCoin, WrongCoin):
        reg.register(cls.NAME, cls, mod.CoinFlipEstimator, source="a-plugin")
    monkeypatch.setattr(sinks, "get_registry", lambda: reg)
    est = {"mechanism": "coinflip", "n_reports": 10, "params": {},
           "statistics": {"share": {"value": 0.4, "stderr": 0.1}}}
    t = tidy_table(tidy_rows(est))
    assert t.schema == tidy_schema("coinflip") == tidy_schema("no-such-family") == \
        pa.schema([f for f in TIDY_SCHEMA if f.name not in GROUP_COLUMNS + WINDOW_COLUMNS])
    assert _cells(t) == list(CELL_COLUMNS) and t.column("value").to_pylist() == [0.4]
    assert tidy_table(tidy_rows(dict(est, mechanism="narrow-coin-tidy"))).schema == \
        pa.schema([f for f in TIDY_SCHEMA if f.name in CORE_COLUMNS + ("i",)])
    with pytest.raises(TidySchemaError, match=r"WrongCoin.tidy_cells names \['bucket'\]"):
        tidy_schema("wrong-coin-tidy")


def _doc_table() -> dict[str, tuple[str, ...]]:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("Which cell columns each family fills")
    lines = text[start:].split("\n")
    head = next(k for k, line in enumerate(lines) if line.startswith("| registry names"))
    assert [c.strip() for c in lines[head].strip("|").split("|")][:2] == \
        ["registry names", "cell columns"]
    out: dict[str, tuple[str, ...]] = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        names, cells = line.strip("|").split("|")[:2]
        for name in re.findall(r"`([^`]+)`", names):
            assert name not in out, f"{name} is listed twice"
            out[name] = tuple(re.findall(r"`([^`]+)`", cells))
    return out


def test_the_documented_schema_per_family_is_the_declarations():
    doc = _doc_table()
    assert sorted(doc) == sorted(NAMES)
    for name in NAMES:
        assert doc[name] == family_cells(name), name


def test_rows_take_a_releases_own_bucket_edges():
    """bin_low/bin_high come from the edges the release carries (here uneven ones, which the
    parameters bins/lower/upper alone could not give)."""
    est = {"mechanism": "dphr", "n_reports": None,
           "params": {"bins": 3, "lower": 0.0, "upper": 10.0,
                      "bucket_edges": [0.0, 1.0, 5.0, 10.0]},
           "statistics": {"histogram": {"value": [3.0, 4.0, 5.0], "stderr": [1.0] * 3}}}
    rows = tidy_rows(est)
    assert [(r["bin_low"], r["bin_high"]) for r in rows] == [(0.0, 1.0), (1.0, 5.0), (5.0, 10.0)]
    del est["params"]["bucket_edges"]  # an output written before releases carried them
    assert [(r["bin_low"], r["bin_high"]) for r in tidy_rows(est)] == \
        [(0.0, 10 / 3), (10 / 3, 20 / 3), (20 / 3, 10.0)]


def test_files_have_the_familys_columns(estimates, tmp_path):
    rows = tidy_rows(estimates["central-quantiles"][0], run_id="R")
    write_tidy(rows, str(tmp_path / "q.parquet"))
    write_tidy(rows, str(tmp_path / "q.csv"))
    want = [c for c in TIDY_COLUMNS if c in CORE_COLUMNS or c == "i"]
    assert pq.read_table(tmp_path / "q.parquet").schema.names == want
    assert pacsv.read_csv(tmp_path / "q.csv").schema.names == want
    assert pq.read_table(tmp_path / "q.parquet").column("i").to_pylist() == [0, 1, 2]


def _old_full_table(rows: list[dict]) -> pa.Table:
    """Rows as every table was written before issue 26: all columns of TIDY_SCHEMA."""
    return pa.Table.from_pylist([{c: r.get(c) for c in TIDY_COLUMNS} for r in rows],
                                schema=TIDY_SCHEMA)


def _check_appended(got: list[dict], rows: list[dict]) -> None:
    assert len(got) == len(rows)
    for g, r in zip(got, rows):
        for c in TIDY_COLUMNS:
            want = r.get(c)
            if isinstance(want, float) and math.isnan(want):
                assert isinstance(g[c], float) and math.isnan(g[c]), c
            else:
                assert g[c] == want, (c, g[c], want)


def test_duckdb_appends_by_name_or_refuses_in_one_line(estimates, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    db = tmp_path / "w.duckdb"
    day1 = tidy_rows(estimates["grr"][0], run_id="day1")
    day2 = tidy_rows(estimates["grr"][0], run_id="day2")
    old = f"duckdb://{db}?table=daily_old"
    write_tidy(_old_full_table(day1), old)
    assert write_tidy(day2, old, mode="append") == 3  # narrower rows into the full table

    def read(table: str) -> list[dict]:
        con = duckdb.connect(str(db), read_only=True)
        try:
            cur = con.execute(f"SELECT * FROM {table} ORDER BY run_id, i")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]
        finally:
            con.close()

    got = read("daily_old")
    assert list(got[0]) == list(TIDY_COLUMNS)  # the table keeps its columns
    _check_appended(got, day1 + day2)
    new = f"duckdb://{db}?table=daily"
    write_tidy(day1, new)
    write_tidy(day2, new, mode="append")
    assert list(read("daily")[0]) == tidy_schema("grr").names and len(read("daily")) == 6
    grouped = tidy_rows(estimates["grr"][0], group_key="north", by="region")
    for wider, cols in ((grouped, "['group_by', 'group']"),
                        (tidy_rows(estimates["cprr"][0]), "['j', 'x_label', 'y_label']")):
        with pytest.raises(SourceError) as ei:
            write_tidy(wider, new, mode="append")
        msg = str(ei.value)
        assert "\n" not in msg and f"cannot append to table daily: it has no column(s) {cols}" \
            in msg, msg
        assert len(read("daily")) == 6  # untouched


def test_postgres_appends_by_name_or_refuses_in_one_line(estimates, pg_url):
    import adbc_driver_postgresql.dbapi as pg

    day1 = tidy_rows(estimates["dphr"][0], run_id="day1")
    day2 = tidy_rows(estimates["dphr"][0], run_id="day2")
    old = f"{pg_url}?table=daily_old"
    write_tidy(_old_full_table(day1), old)
    assert write_tidy(day2, old, mode="append") == len(day2)

    def read(table: str) -> list[dict]:
        with pg.connect(pg_url) as con, con.cursor() as cur:
            cur.execute(f'SELECT * FROM {table} ORDER BY run_id, statistic, "i"')
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]

    got = read("daily_old")
    assert list(got[0]) == list(TIDY_COLUMNS)
    key = lambda r: (r["run_id"], r["statistic"], r["i"])  # noqa: E731
    _check_appended(got, sorted(day1 + day2, key=key))
    new = f"{pg_url}?table=daily"
    write_tidy(day1, new)
    write_tidy(day2, new, mode="append")
    assert list(read("daily")[0]) == tidy_schema("dphr").names
    assert len(read("daily")) == 2 * len(day1)
    with pytest.raises(SourceError) as ei:
        write_tidy(tidy_rows(estimates["dphr"][0], window=("a", "b")), new, mode="append")
    msg = str(ei.value)
    assert "\n" not in msg and "cannot append to table daily: it has no column(s) " \
        "['window_start', 'window_end']" in msg, msg
    assert len(read("daily")) == 2 * len(day1)


def test_the_cli_writes_the_familys_columns(tmp_path):
    rng = np.random.default_rng(3)
    pq.write_table(pa.table({"v": rng.choice(list("abc"), 2000),
                             "g": rng.choice(["n", "s"], 2000)}), tmp_path / "t.parquet")
    assert run_cli("collect", "-i", str(tmp_path / "t.parquet"), "-c", "v", "-m", "grr",
                   "--epsilon", "2", "-p", "domain=a,b,c", "--keep", "g", "--public", "g",
                   "-o", str(tmp_path / "r.parquet"))[0] == 0
    rep = str(tmp_path / "r.parquet")
    assert run_cli("estimate", "-i", rep, "-o", str(tmp_path / "e.parquet"))[0] == 0
    assert pq.read_table(tmp_path / "e.parquet").schema == tidy_schema("grr")
    assert run_cli("estimate", "-i", rep, "--by", "g", "-o", str(tmp_path / "g.csv"))[0] == 0
    assert pacsv.read_csv(tmp_path / "g.csv").schema.names == \
        tidy_schema("grr", grouped=True).names


def test_a_beam_step_writes_the_schema_it_is_given(estimates, tmp_path):
    """WriteTidy(schema=...) pins a table's columns, e.g. those of a daily grouped table, for
    rows that would not have them all (here ungrouped ones: group columns null)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from ldp_beam.transforms import WriteTidy

    rows = tidy_rows(estimates["grr"][0])
    want = tidy_schema("grr", grouped=True)
    with beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"])) as p:
        _ = p | beam.Create(rows) | WriteTidy(str(tmp_path / "g.parquet"), schema=want)
    t = pq.read_table(tmp_path / "g.parquet")
    assert t.schema == want and t.column("group").null_count == 3
    assert sorted(t.column("label").to_pylist()) == ["a", "b", "c"]
