"""Warehouse sources on real engines: DuckDB files, a PostgreSQL server started from the machine's
packages (tests/postgres_server.py) and Iceberg tables in a pyiceberg SQL catalog; plus directory
inputs with pyarrow.dataset semantics (hive partitions, skipped files, .csv.gz with options).

Each read is checked row for row against the source, with the record identity the module
documents; seeded ReadTable | Perturb over a database gives identical reports on the DirectRunner
and the multi-process DirectRunner; bad inputs fail before the pipeline with the source named."""
from __future__ import annotations

import gzip
import importlib.util
import os
import time
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from ldp_beam import build_mechanism
from ldp_beam.rng import RunKey, stream_id
from ldp_beam.transforms import Perturb, ReadTable, WriteJsonLines, WriteParquetFile, report_schema
from ldp_beam.transforms.io import EmptySourceError, SourceError, reader_tally
from ldp_beam.transforms.batches import KeyedBatch

duckdb = pytest.importorskip("duckdb")

_spec = importlib.util.spec_from_file_location(
    "ldp_beam_postgres_server_sources",
    Path(__file__).resolve().parents[1] / "postgres_server.py")  # tests/postgres_server.py
pgs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pgs)

MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]
SINGLE = ["--runner=DirectRunner"]
N = 5000


def sample_table(n: int = N, seed: int = 3) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(n, dtype=np.int64),
                     "x": rng.random(n),
                     "c": pa.array(np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, n)]),
                     "note": pa.array([None if i % 17 == 0 else f"r{i}" for i in range(n)])})


def read_direct(rt: ReadTable) -> tuple[list[KeyedBatch], list[dict]]:
    """Every unit through the reader's DoFn (no pipeline): batches and reader dead letters."""
    batches, dead = [], []
    for u in rt.units:
        for e in rt.fn.process(u):
            (batches if isinstance(e, KeyedBatch) else dead).append(e)
    return batches, [dict(d) for d in dead]


def rows_with_ids(batches: list[KeyedBatch]) -> dict[tuple[int, int], dict]:
    out = {}
    for b in batches:
        for rid, row in zip(b.record_ids().tolist(), b.table.to_pylist()):
            key = (b.stream, rid)
            assert key not in out, f"record {key} read twice"
            out[key] = row
    return out


def clean_rows(rt: ReadTable) -> dict[tuple[int, int], dict]:
    """Every unit through the reader's DoFn, with no dead letter: the rows by identity."""
    batches, dead = read_direct(rt)
    assert dead == []
    return rows_with_ids(batches)


def assert_refused(*cases: tuple[type, str, str]) -> None:
    """Each (exception, pattern, url): ``ReadTable(url)`` raises it, matching the pattern, before
    any pipeline."""
    for exc, pattern, url in cases:
        with pytest.raises(exc, match=pattern):
            ReadTable(url)


def perturb_run(url: str, args: list[str], out: Path, **read_kw) -> tuple[pa.Table, list]:
    """Seeded ReadTable | Perturb(grr on c) with id kept: (reports, dead letters)."""
    mech = build_mechanism("grr", epsilon=1.0, domain=["a", "b", "c"])
    rt = ReadTable(url, batch_rows=700, **read_kw)
    keep = pa.schema([rt.schema.field("id")])
    run = RunKey.new(seed=1234)
    schema = report_schema(mech, keep, seeded=True)
    path, dead_path = str(out / "reports.parquet"), str(out / "dead.jsonl")
    with beam.Pipeline(options=PipelineOptions(args)) as p:
        rd = p | "Read" >> rt
        res = rd.batches | Perturb(mech, columns={"value": "c"}, keep=("id",), run_key=run,
                                   passthrough_schema=keep)
        res.reports | WriteParquetFile(path, schema)
        (rd.dead_letter, res.dead_letter) | beam.Flatten() | WriteJsonLines(dead_path)
    reports = pq.read_table(path).sort_by("id") if os.path.exists(path) else None
    with open(dead_path) as fh:
        import json

        dead = [json.loads(line) for line in fh if line.strip()]
    return reports, dead


# ------------------------------------------------------------------------------ DuckDB
@pytest.fixture
def duck(tmp_path):
    path = tmp_path / "w.duckdb"
    t = sample_table()
    con = duckdb.connect(str(path))
    con.register("src", t)
    con.execute("CREATE TABLE t AS SELECT * FROM src")
    con.execute("DELETE FROM t WHERE id % 997 = 5")  # gaps in rowid: identities stay the rowids
    con.execute("CREATE TABLE empty AS SELECT * FROM src LIMIT 0")
    con.execute("CREATE VIEW v AS SELECT id, c FROM t WHERE x < 0.5")
    con.close()
    return path, t


def test_duckdb_table_rows_match_and_keep_their_rowids(duck):
    path, t = duck
    rt = ReadTable(f"duckdb://{path}?table=t", batch_rows=333, split_rows=1200)
    assert rt.kind == "duckdb" and len(rt.units) == 5  # rowid ranges spread across workers
    assert rt.schema.names == ["id", "x", "c", "note"]
    batches, dead = read_direct(rt)
    assert dead == []
    got = rows_with_ids(batches)
    kept = [r for r in t.to_pylist() if r["id"] % 997 != 5]
    assert len(got) == len(kept) == N - 6
    stream = stream_id(f"duckdb:{path.name}:t")
    # the record number is the rowid (the row's insertion position), gaps included
    assert got == {(stream, r["id"]): r for r in kept}
    assert any(b.rows is not None for b in batches)  # a batch across a deleted row


def test_duckdb_query_rows_in_a_deterministic_order(duck):
    path, t = duck
    q = "SELECT id, x, c FROM t WHERE c <> 'a'"
    got = clean_rows(ReadTable(f"duckdb://{path}?query={q}", split_rows=1000))
    want = sorted(({"id": r["id"], "x": r["x"], "c": r["c"]} for r in t.to_pylist()
                   if r["c"] != "a" and r["id"] % 997 != 5), key=lambda r: (r["id"], r["x"]))
    stream = stream_id(f"duckdb:{path.name}:query:{q}")
    # no order_by: ordered by every column (id first); record number = position
    assert got == {(stream, i): r for i, r in enumerate(want)}
    # with order_by the position follows it; a '+' in the query stays a plus
    rt2 = ReadTable(f"duckdb://{path}?query=SELECT id, x + 0 AS x FROM t&order_by=x")
    got2 = rows_with_ids(read_direct(rt2)[0])
    xs = [r["x"] for _, r in sorted(got2.items())]
    assert xs == sorted(xs) and len(xs) == N - 6


def test_duckdb_view_and_order_by_keyword(duck):
    path, t = duck
    rt = ReadTable(f"duckdb://{path}?table=v", order_by=["id"])
    got = rows_with_ids(read_direct(rt)[0])
    ids = [r["id"] for _, r in sorted(got.items())]
    assert ids == [r["id"] for r in t.to_pylist() if r["x"] < 0.5 and r["id"] % 997 != 5]
    rt = ReadTable(f"duckdb://{path}?table=v")  # a view has no rowid: read as a query
    assert sum(b.num_rows for b in read_direct(rt)[0]) == len(ids)


def test_duckdb_bad_inputs_fail_before_the_pipeline_naming_the_source(duck, tmp_path):
    path, _ = duck
    assert_refused(
        (SourceError, r"nope\.duckdb.*does not exist", f"duckdb://{tmp_path}/nope.duckdb?table=t"),
        (SourceError, r"duckdb://.*table=missing.*missing", f"duckdb://{path}?table=missing"),
        (EmptySourceError, r"table empty returns no rows", f"duckdb://{path}?table=empty"),
        (EmptySourceError, r"query returns no rows",
         f"duckdb://{path}?query=SELECT * FROM t WHERE x > 2"))
    assert ReadTable(f"duckdb://{path}?table=empty", allow_empty=True).units == []
    assert_refused(
        (SourceError, "exactly one of table", f"duckdb://{path}?table=t&query=SELECT 1"),
        (SourceError, "order_by column 'nope'", f"duckdb://{path}?table=t&order_by=nope"),
        (SourceError, "Parser Error|syntax", f"duckdb://{path}?query=SELEC 1"),
        (SourceError, "unknown setting", f"duckdb://{path}?table=t&tabel=x"),
        (Exception, "split_rows", f"duckdb://{path}?table=t&split_rows=0"))


def test_a_unit_that_fails_mid_run_is_a_counted_dead_letter(duck):
    path, _ = duck
    rt = ReadTable(f"duckdb://{path}?table=t", split_rows=2000)
    planned = sum(u.rows for u in rt.units)
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE t")  # gone between planning and reading
    con.close()
    batches, dead = read_direct(rt)
    assert batches == [] and len(dead) == len(rt.units)
    tally = reader_tally(dead)
    assert tally["unreadable_rows"] == planned == N - 6 and tally["complete"]
    assert all(d["source"].startswith(f"duckdb://{path}?table=t (rowid [") for d in dead)
    assert all("unreadable input: rowid [" in d["reason"] for d in dead)
    assert sorted(d["row"] for d in dead) == [0, 2000, 4000]


def test_duckdb_seeded_reports_are_runner_independent(duck, tmp_path):
    path, _ = duck
    url = f"duckdb://{path}?table=t&split_rows=1500"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, dead_a = perturb_run(url, SINGLE, tmp_path / "a")
    b, dead_b = perturb_run(url, MULTI, tmp_path / "b")
    assert a.num_rows == N - 6 and dead_a == dead_b == []
    assert a.equals(b)


# ------------------------------------------------------------------------------ PostgreSQL
@pytest.fixture(scope="module")
def pg(pg_server):  # pg_server: the session's real server (tests/conftest.py)
    import psycopg

    pytest.importorskip("adbc_driver_postgresql")

    url = pg_server.create_database("sources")
    t = sample_table()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, x double precision, c text, "
                     "note text)")
        with conn.cursor().copy("COPY t (id, x, c, note) FROM STDIN") as cp:
            for r in t.to_pylist():
                cp.write_row((r["id"], r["x"], r["c"], r["note"]))
        conn.execute("CREATE TABLE empty (id bigint)")
        conn.execute("CREATE TABLE typed (id bigint, c text, doc json)")
        conn.execute("INSERT INTO typed VALUES (1, 'a', '{}'), (2, 'zzz', '[1]'), "
                     "(3, NULL, 'null'), (4, 'b', '2')")
        conn.execute("CREATE VIEW v AS SELECT id, c FROM t")
    return url, t


def test_postgres_table_rows_match_in_physical_order(pg):
    url, t = pg
    rt = ReadTable(f"{url}?table=t", batch_rows=400, split_rows=1000)
    assert rt.kind == "postgresql" and len(rt.units) >= 4  # page ranges for parallel reads
    assert rt.schema.names == ["id", "x", "c", "note"]
    got = clean_rows(rt)
    stream = stream_id("postgresql:sources:t")
    # a table loaded in id order: physical (ctid) order is id order, record number = position
    assert got == {(stream, r["id"]): r for r in t.to_pylist()}
    assert sum(u.rows for u in rt.units) == N


def test_postgres_units_count_and_read_their_own_pages_only(pg):
    """A table with no statistics yet (never analyzed): its units are sized from a sample of
    pages, each counted and read by a TID range scan of its own pages, never by a sequential
    scan of the whole table (the server's own scan statistics say so); the last unit runs to
    the end of the table."""
    import psycopg

    url, _ = pg
    n = 20_000
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS nostats")
        conn.execute("CREATE TABLE nostats (id bigint, x double precision) "
                     "WITH (autovacuum_enabled = off)")
        conn.execute(f"INSERT INTO nostats SELECT i, i * 0.5 FROM generate_series(0, {n - 1}) i")
        assert conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'nostats'"
                            ).fetchone()[0] < 0  # no statistics: the sample sizes the units

    def seq_scans() -> int:
        """The table's sequential scans so far, once every other session has ended (a session
        hands its statistics to the server as it exits)."""
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 10
            while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                               "current_database() AND pid <> pg_backend_pid()").fetchone()[0]:
                assert time.monotonic() < deadline, "other sessions did not end"
                time.sleep(0.05)
            conn.execute("SELECT pg_stat_clear_snapshot()")
            return conn.execute("SELECT seq_scan FROM pg_stat_user_tables "
                                "WHERE relname = 'nostats'").fetchone()[0]

    before = seq_scans()
    rt = ReadTable(f"{url}?table=nostats", split_rows=3000)
    assert 6 <= len(rt.units) <= 8 and sum(u.rows for u in rt.units) == n
    assert rt.units[-1].label.endswith(", end)") and "ctid <" not in rt.units[-1].sql
    batches, dead = read_direct(rt)
    rt.source.close()
    assert dead == []
    got = rows_with_ids(batches)
    stream = stream_id("postgresql:sources:nostats")
    assert got == {(stream, i): {"id": i, "x": i * 0.5} for i in range(n)}
    assert seq_scans() == before  # no sequential scan, when planned nor when read
    with psycopg.connect(url, autocommit=True) as conn:  # (one would be counted)
        conn.execute("SELECT count(*) FROM nostats").fetchone()
    assert seq_scans() == before + 1


def test_postgres_query_and_order_by(pg):
    url, t = pg
    q = "SELECT id, x * 2 AS y FROM t WHERE c = 'b'"
    got = clean_rows(ReadTable(f"{url}?query={q}&order_by=y", split_rows=700))
    want = sorted(({"id": r["id"], "y": r["x"] * 2} for r in t.to_pylist() if r["c"] == "b"),
                  key=lambda r: (r["y"], r["id"]))
    stream = stream_id(f"postgresql:sources:query:{q}")
    assert got == {(stream, i): r for i, r in enumerate(want)}
    # a view (no pages) with an order, and a json column left out of the tie-breakers
    rt = ReadTable(f"{url}?table=v&order_by=id")
    assert sum(b.num_rows for b in read_direct(rt)[0]) == N
    rows = rows_with_ids(read_direct(ReadTable(f"{url}?table=typed&order_by=id"))[0])
    assert [r["c"] for _, r in sorted(rows.items())] == ["a", "zzz", None, "b"]


def test_postgres_bad_inputs_fail_before_the_pipeline(pg, pg_server):
    url, _ = pg
    assert_refused(
        (SourceError, r"table=nope.*does not exist", f"{url}?table=nope"),
        (EmptySourceError, r"sources\?table=empty: table empty returns no", f"{url}?table=empty"),
        (EmptySourceError, "query returns no rows", f"{url}?query=SELECT * FROM t WHERE id < 0"),
        (SourceError, "not a plain table", f"{url}?table=v"),
        (SourceError, 'database "nodb" does not exist', url.rsplit("/", 1)[0] + "/nodb?table=t"))
    port = pgs.free_port()
    started = time.monotonic()
    with pytest.raises(SourceError, match=rf"postgresql://ldpbeam@127.0.0.1:{port}/x\?table=t: "
                       "the PostgreSQL server cannot be reached"):
        ReadTable(f"postgresql://ldpbeam@127.0.0.1:{port}/x?table=t")
    assert time.monotonic() - started < 15


def test_postgres_missing_credentials_are_named_and_passwords_never_shown(pg, pg_server):
    """A role that must give a password (scram over TCP) and gives none, or a wrong one."""
    import psycopg

    url, _ = pg
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS pwuser")
        conn.execute("CREATE ROLE pwuser LOGIN PASSWORD 'right-pw'")
        conn.execute("GRANT SELECT ON t TO pwuser")
    hba = os.path.join(pg_server.data, "pg_hba.conf")
    with open(hba) as fh:
        old = fh.read()
    try:
        with open(hba, "w") as fh:
            fh.write("host all pwuser 127.0.0.1/32 scram-sha-256\n" + old)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(0.5)
        host = f"127.0.0.1:{pg_server.port}"
        env = os.environ.pop("PGPASSWORD", None)
        try:
            with pytest.raises(SourceError, match=rf"postgresql://pwuser@{host}/sources\?table=t: "
                               "credentials missing or refused"):
                ReadTable(f"postgresql://pwuser@{host}/sources?table=t")
            with pytest.raises(SourceError, match="credentials missing or refused") as info:
                ReadTable(f"postgresql://pwuser:wrong-pw@{host}/sources?table=t")
            assert "wrong-pw" not in str(info.value) and "pwuser:***@" in str(info.value)
            rt = ReadTable(f"postgresql://pwuser:right-pw@{host}/sources?table=t")
            assert rt.source_name == f"postgresql://pwuser:***@{host}/sources?table=t"
            assert sum(b.num_rows for b in read_direct(rt)[0]) == N
        finally:
            if env is not None:
                os.environ["PGPASSWORD"] = env
    finally:
        with open(hba, "w") as fh:
            fh.write(old)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")


def test_postgres_seeded_reports_are_runner_independent(pg, tmp_path):
    url, t = pg
    for sub in ("a", "b", "c"):
        (tmp_path / sub).mkdir()
    a, dead_a = perturb_run(f"{url}?table=t&split_rows=1200", SINGLE, tmp_path / "a")
    b, dead_b = perturb_run(f"{url}?table=t&split_rows=1200", MULTI, tmp_path / "b")
    assert a.num_rows == N and dead_a == dead_b == []
    assert a.equals(b)
    # the split size changes the units, not the records' identities or their noise
    c, _ = perturb_run(f"{url}?table=t&split_rows=700", SINGLE, tmp_path / "c")
    assert a.equals(c)


def test_values_that_do_not_fit_the_mechanism_are_dead_letters_with_source_and_row(pg, tmp_path):
    url, _ = pg
    mech = build_mechanism("grr", epsilon=1.0, domain=["a", "b"])
    rt = ReadTable(f"{url}?table=typed&order_by=id")
    dead_path = str(tmp_path / "dead.jsonl")
    with beam.Pipeline(options=PipelineOptions(SINGLE)) as p:
        rd = p | rt
        res = rd.batches | Perturb(mech, columns={"value": "c"}, run_key=RunKey.new(seed=5))
        (rd.dead_letter, res.dead_letter) | beam.Flatten() | WriteJsonLines(dead_path)
    import json

    with open(dead_path) as fh:
        dead = sorted((json.loads(line) for line in fh), key=lambda d: d["row"])
    assert [d["row"] for d in dead] == [1, 2]  # 'zzz' (not in the domain) and NULL; ids 2, 3
    assert all(d["source"] == f"{url}?table=typed&order_by=id" for d in dead)


# ------------------------------------------------------------------------------ Iceberg
@pytest.fixture
def iceberg(tmp_path):
    pytest.importorskip("pyiceberg")
    from pyiceberg.catalog.sql import SqlCatalog

    cat_path = tmp_path / "catalog.db"
    cat = SqlCatalog("test", uri=f"sqlite:///{cat_path}", warehouse=f"file://{tmp_path}/wh")
    cat.create_namespace("ns")
    t = sample_table()
    first, second = t.slice(0, 3000), t.slice(3000)
    tbl = cat.create_table("ns.t", schema=t.schema)
    tbl.append(first)
    tbl.append(second)  # two data files
    cat.create_table("ns.empty", schema=t.schema)
    return cat_path, t, tbl


def test_iceberg_rows_match_by_data_file(iceberg):
    cat_path, t, tbl = iceberg
    rt = ReadTable(f"iceberg://{cat_path}?table=ns.t", batch_rows=512)
    assert rt.kind == "iceberg" and len(rt.units) == 2
    assert rt.schema.names == t.schema.names
    got = clean_rows(rt)
    assert sorted(r["id"] for r in got.values()) == list(range(N))
    by_stream: dict[int, list] = {}
    for (s, rid), r in sorted(got.items()):
        by_stream.setdefault(s, []).append((rid, r))
    # each data file is a stream; record number = the row's position in the file
    assert sorted(len(v) for v in by_stream.values()) == [2000, 3000]
    for rows in by_stream.values():
        assert [rid for rid, _ in rows] == list(range(len(rows)))
        assert all(r == t.slice(rows[0][1]["id"] + rid, 1).to_pylist()[0] for rid, r in rows)
    # a pinned snapshot: the first append only
    first = tbl.history()[0].snapshot_id
    rt1 = ReadTable(f"iceberg://{cat_path}?table=ns.t&snapshot={first}")
    assert sum(b.num_rows for b in read_direct(rt1)[0]) == 3000


def test_iceberg_seeded_reports_are_runner_independent(iceberg, tmp_path):
    cat_path, t, _ = iceberg
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _ = perturb_run(f"iceberg://{cat_path}?table=ns.t", SINGLE, tmp_path / "a")
    b, _ = perturb_run(f"iceberg://{cat_path}?table=ns.t", MULTI, tmp_path / "b")
    assert a.num_rows == N and a.equals(b)


def test_iceberg_bad_inputs(iceberg, tmp_path):
    cat_path, _, _ = iceberg
    assert_refused(
        (SourceError, "catalog file .* does not exist", f"iceberg://{tmp_path}/nope.db?table=ns.t"),
        (SourceError, r"table=ns.missing.*(NoSuchTable|does not exist)",
         f"iceberg://{cat_path}?table=ns.missing"),
        (EmptySourceError, "table ns.empty returns no rows",
         f"iceberg://{cat_path}?table=ns.empty"),
        (SourceError, "not a query", f"iceberg://{cat_path}?query=SELECT 1"),
        (SourceError, "no snapshot 12345", f"iceberg://{cat_path}?table=ns.t&snapshot=12345"))


# ------------------------------------------------------------------------------ directories
def test_directory_with_hive_partitions_and_files_to_skip(tmp_path):
    root = tmp_path / "in"
    t = sample_table(600)
    for year, part in ((2023, t.slice(0, 250)), (2024, t.slice(250))):
        d = root / f"year={year}" / "region=north south"
        d.mkdir(parents=True)
        pq.write_table(part.slice(0, 100), d / "part-0.parquet", row_group_size=40)
        pq.write_table(part.slice(100), d / "part-1.parquet")
    (root / "README.md").write_text("not a table")
    (root / "year=2023" / "_SUCCESS").write_text("")
    (root / ".hidden").mkdir()
    pq.write_table(t, root / ".hidden" / "x.parquet")
    rt = ReadTable(str(root))
    assert rt.schema.names == ["id", "x", "c", "note", "year", "region"]
    assert rt.schema.field("year").type == pa.int32()
    assert sorted(os.path.relpath(s["path"], root) for s in rt.skipped) == \
        [".hidden", "README.md", os.path.join("year=2023", "_SUCCESS")]
    got = clean_rows(rt)
    assert len(got) == 600
    assert sorted((r["id"], r["year"], r["region"]) for r in got.values()) == \
        [(i, 2023 if i < 250 else 2024, "north south") for i in range(600)]
    # files of one name in two partitions are two streams, named by their path below the root
    name = os.path.join("year=2024", "region=north south", "part-0.parquet")
    assert (stream_id(name), 0) in got and got[(stream_id(name), 0)]["id"] == 250


def test_hive_partition_with_a_null_value_is_an_error_naming_the_file(tmp_path):
    d = tmp_path / "in" / "year=__HIVE_DEFAULT_PARTITION__"
    d.mkdir(parents=True)
    pq.write_table(sample_table(10), d / "p.parquet")
    with pytest.raises(ValueError, match=r"p\.parquet.*partition column 'year' is null"):
        ReadTable(str(tmp_path / "in"))


def test_directory_of_compressed_csv_with_dialect_options(tmp_path):
    root = tmp_path / "csv"
    root.mkdir()
    text = "id;name\n1;\"Zoë; the first\"\n2;Jürgen\n"
    with gzip.open(root / "a.csv.gz", "wb") as fh:
        fh.write(text.encode("latin-1"))
    (root / "b.csv").write_bytes("id;name\n3;Åsa\n".encode("latin-1"))
    (root / "notes.json").write_text("{}")
    rt = ReadTable(str(root), csv_options={"delimiter": ";", "encoding": "latin-1"})
    assert [os.path.basename(s["path"]) for s in rt.skipped] == ["notes.json"]
    batches, dead = read_direct(rt)
    assert dead == []
    rows = sorted((r for b in batches for r in b.table.to_pylist()), key=lambda r: r["id"])
    assert rows == sorted([{"id": "1", "name": "Zoë; the first"}, {"id": "2", "name": "Jürgen"},
                           {"id": "3", "name": "Åsa"}], key=lambda r: r["id"])


def test_a_directory_with_no_table_file_is_an_error(tmp_path):
    (tmp_path / "only.md").write_text("x")
    with pytest.raises(FileNotFoundError, match="no input table file.*only.md"):
        ReadTable(str(tmp_path))
    with pytest.raises(Exception, match="table"):
        ReadTable(str(tmp_path / "data.parquet"), table="t")
