"""Issue 23's hardening, one regression test per finding (an operator's report):

1. a ``query=`` source runs exactly one read-only SELECT (DuckDB: its own parser, and a
   connection that reaches nothing outside the database file; PostgreSQL: one statement, run in
   read-only transactions) -- the reported attack writes nothing and is refused;
2. a CSV record is capped before it is buffered: a file with one huge line is read in bounded
   memory (the child's peak RSS is measured) and the refusal names the file, the row and the cap;
3. a value quoted in a dead letter's reason is capped like the record's own fields: a 20 MB cell
   makes a dead letter of a few KB;
4. bounds whose width (or a mechanism's scaled computation) overflows are refused by every
   numeric family, while a wide normal range is still accepted;
5. ospdprr / osdp-rr with ``clip=True`` count the clipped values exactly, for the curator only
   (``Estimate.curator["values_clipped"]``, never in ``to_dict()``), and the release says so.
"""
from __future__ import annotations

import csv
import inspect
import io
import json
import random
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from ldp_beam import build_mechanism, estimator_for
from ldp_beam.core import QUOTED_VALUE_CHARS, REASON_CHARS, quote_value
from ldp_beam.errors import InvalidRecordsError, ParameterError
from ldp_beam.transforms import Perturb, ReadTable, WriteJsonLines
from ldp_beam.transforms.batches import KeyedBatch
from ldp_beam.transforms.io import (MAX_CSV_RECORD_BYTES, UNREADABLE, CsvOptions, SourceError,
                                    _count_records, csv_header, tolerant_count)
from ldp_beam_test_helpers import (SAMPLE_OPTIONS, SAMPLE_PARAMS, emit, emitted_rows,
                                   valid_columns)

ATTACK = ("SELECT x FROM t ) AS a; COPY (SELECT 1) TO '{path}'; "
          "SELECT * FROM (SELECT 1")


def _read(rt: ReadTable) -> tuple[int, list[dict]]:
    """Rows read and the reader's dead letters, every unit through the reader's DoFn."""
    rows, dead = 0, []
    for u in rt.units:
        for e in rt.fn.process(u):
            if isinstance(e, KeyedBatch):
                rows += e.table.num_rows
            else:
                dead.append(dict(e))
    if rt.source is not None:
        rt.source.close()
    return rows, dead


# --------------------------------------------------------------------------- 1. query= sources
@pytest.fixture()
def duck(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "db.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT range::DOUBLE AS x, range % 3 AS g FROM range(100)")
    con.close()
    (tmp_path / "outside.csv").write_text("secret\n42\n")
    return path


def test_duckdb_query_attack_is_refused_and_writes_nothing(duck, tmp_path):
    target = tmp_path / "pwned"
    with pytest.raises(SourceError, match=r"query= must be exactly one read-only SELECT"):
        ReadTable(f"duckdb://{duck}?query=" + ATTACK.format(path=target))
    assert not target.exists()
    # the same statements as a keyword, and other ways out: each refused, naming what was found
    with pytest.raises(SourceError, match=r"query=.*found a COPY statement"):
        ReadTable(f"duckdb://{duck}", query=f"COPY (SELECT 1) TO '{target}'")
    with pytest.raises(SourceError, match=r"query=.*found 2 statements \(SELECT, SELECT\)"):
        ReadTable(f"duckdb://{duck}", query="SELECT 1; SELECT 2")
    with pytest.raises(SourceError, match=r"query=.*found a ATTACH statement"):
        ReadTable(f"duckdb://{duck}", query=f"ATTACH '{tmp_path / 'other.duckdb'}'")
    assert not target.exists() and not (tmp_path / "other.duckdb").exists()
    # a SELECT cannot reach a file outside the database: external access is disabled
    with pytest.raises(SourceError, match="disabled by configuration"):
        ReadTable(f"duckdb://{duck}", query=f"SELECT * FROM read_csv('{tmp_path / 'outside.csv'}')")


def test_duckdb_connection_is_read_only_without_external_access(duck):
    rt = ReadTable(f"duckdb://{duck}?table=t")
    con = rt.source._connect()
    try:
        got = con.execute("SELECT current_setting('enable_external_access')").fetchone()[0]
        assert got is False or str(got).lower() == "false"
        with pytest.raises(Exception, match="locked|Cannot change"):
            con.execute("SET enable_external_access = true")
        with pytest.raises(Exception, match="read-only|read only"):
            con.execute("CREATE TABLE w (x INT)")
    finally:
        rt.source.close()
    assert _read(rt) == (100, [])  # and the database file itself is read


# queries both engines must run, with the rows each returns of t's 100 (each engine's test
# adds one of its own)
LEGITIMATE = [
    ("SELECT x FROM t WHERE x >= 10", 90),
    ("SELECT x FROM t WHERE x IN (SELECT x FROM t WHERE g = 1)", 33),
    ("WITH a AS (SELECT x, g FROM t WHERE g <> 0) SELECT x FROM a;", 66),
]


def _reads_every_row(url, query, n):
    """``query`` on ``url`` is planned at ``n`` rows, all read, with no dead letter."""
    rt = ReadTable(url, query=query, split_rows=40)
    assert rt.source.rows == n
    assert _read(rt) == (n, [])


@pytest.mark.parametrize("query,n", LEGITIMATE + [
    ("SELECT x FROM t WHERE x < 5 -- a trailing comment", 5),
])
def test_duckdb_legitimate_queries_still_work(duck, query, n):
    _reads_every_row(f"duckdb://{duck}", query, n)


@pytest.fixture(scope="module")
def pg(pg_url):
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS t")
        conn.execute("CREATE TABLE t AS SELECT i::float8 AS x, i % 3 AS g "
                     "FROM generate_series(0, 99) i")
        conn.execute("DROP TABLE IF EXISTS w")
        conn.execute("CREATE TABLE w (x int)")
        conn.execute("CREATE OR REPLACE FUNCTION evil() RETURNS int LANGUAGE plpgsql AS "
                     "$$ BEGIN INSERT INTO w VALUES (7); RETURN 1; END $$")
    return pg_url


def _written(url) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM w").fetchone()[0]


def test_postgres_query_attack_is_refused_and_writes_nothing(pg):
    before = _written(pg)
    attack = "SELECT x FROM t ) AS a; INSERT INTO w VALUES (1); SELECT * FROM (SELECT 1"
    with pytest.raises(SourceError, match=r"query= must be exactly one read-only SELECT.*"
                                          r"found 3 statements \(SELECT, INSERT, SELECT\)"):
        ReadTable(f"{pg}?query={attack}")
    with pytest.raises(SourceError, match=r"query=.*starts with 'INSERT'"):
        ReadTable(pg, query="INSERT INTO w VALUES (1) RETURNING x")
    # a ';' inside a literal, a quoted identifier or a dollar quote is not a second statement:
    # those reach the server (which refuses the write: every transaction is read-only)
    with pytest.raises(SourceError, match="read-only transaction"):
        ReadTable(pg, query="SELECT x, evil() AS e, ';' AS s, $$;$$ AS d FROM t")
    assert _written(pg) == before


def test_postgres_set_config_cannot_turn_read_only_off_for_later_units(pg):
    """A query's set_config() turns the session default off on the pooled connection that ran
    it; the next unit's statement on that connection starts read-only all the same."""
    before = _written(pg)
    q = ("SELECT x, set_config('default_transaction_read_only', 'off', false) AS s, "
         "CASE WHEN current_setting('transaction_read_only') = 'off' THEN evil() END AS e "
         "FROM t")
    rt = ReadTable(pg, query=q, split_rows=30)
    assert len(rt.units) == 4
    assert _read(rt) == (100, [])
    assert _written(pg) == before


@pytest.mark.parametrize("query,n", LEGITIMATE + [
    ("SELECT x, ';' AS semi FROM t WHERE x < 5 -- a trailing comment", 5),
])
def test_postgres_legitimate_queries_still_work(pg, query, n):
    _reads_every_row(pg, query, n)


# --------------------------------------------------------------------------- 2. long CSV records
# the child reads with _read itself (its source, after the imports it needs)
_CHILD = textwrap.dedent("""
    import json, resource, sys
    from ldp_beam.transforms import ReadTable
    from ldp_beam.transforms.batches import KeyedBatch
""") + inspect.getsource(_read) + textwrap.dedent("""
    rows, dead = _read(ReadTable(sys.argv[1]))
    # the peak RSS of this process's own memory: Linux's ru_maxrss of an exec'd child also
    # counts the parent's peak at the fork (a long pytest session passes 1 GB by itself)
    try:
        with open("/proc/self/status") as fh:
            peak = next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM:"))
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rows": rows, "dead": dead, "maxrss_kib": peak}))
""")


def test_a_huge_csv_line_is_refused_in_bounded_memory(tmp_path):
    """One 300 MiB line (streamed to disk): the reader reads the rows before it, refuses it with
    a dead letter naming the cap, the file and the row, counts the rows it stands for, and its
    process never holds the line (peak RSS of the child process, under 1 GB; the former reader
    held it several times over, issue 23). By hand, a 1 GiB line: 0.75 GB, 10.6 s."""
    path = tmp_path / "huge.csv"
    chunk = b"7" * (1 << 20)
    with open(path, "wb") as fh:
        fh.write(b"value\n1\n2\n")
        for _ in range(300):
            fh.write(chunk)
        fh.write(b"\n3\n")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rows"] == 2
    (d,) = got["dead"]
    assert d["reason"].startswith(UNREADABLE + f"a record longer than max_record_bytes = "
                                  f"{MAX_CSV_RECORD_BYTES:,} bytes in {path}, at or after "
                                  "data row 2")
    assert d["source"] == str(path) and d["row"] == 2 and d["rows"] == 2
    assert got["maxrss_kib"] < 1024 * 1024, got["maxrss_kib"]


def test_a_huge_header_is_refused_naming_the_file_and_the_cap(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("a" * 5000 + "\n1\n")
    opts = CsvOptions(block_size=1024, max_record_bytes=2048)
    with pytest.raises(ValueError, match=r"h\.csv: line 1 \(the header\) is a record longer than "
                                         r"max_record_bytes = 2,048"):
        csv_header(str(path), opts)


def test_the_streaming_count_follows_the_csv_module():
    """The bounded-memory count (:func:`_count_records`) gives csv.reader's record count on
    random texts of delimiters, quotes, escapes and line ends, whatever the chunk size."""
    rng = random.Random(23)
    dialects = [CsvOptions(), CsvOptions(escape_char="\\"),
                CsvOptions(delimiter=";", quote_char="'", escape_char="\\", double_quote=False),
                CsvOptions(delimiter="\t", quote_char=False),
                CsvOptions(quote_char=False, escape_char="\\"), CsvOptions(double_quote=False)]
    for _ in range(4000):
        opts = rng.choice(dialects)
        alpha = [opts.delimiter, "\r", "\n", "a", " ", "\0"] + \
            [c for c in (opts.quote_char, opts.escape_char) if c]
        text = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 40)))
        want = sum(1 for _ in csv.reader(io.StringIO(text, newline=""), **opts.python_dialect()))
        for chunk in (1, 3, 1 << 20):
            assert _count_records(io.StringIO(text, newline=""), opts, chunk) == want, \
                (text, opts, chunk)


def test_a_long_line_is_counted_exactly(tmp_path):
    """Lines over the csv module's share (COUNT_LINE_CHARS) are counted by the stream: quoted
    newlines inside a 3 Mi-character field still do not end the record."""
    path = tmp_path / "q.csv"
    field = ("x" * 1000 + "\n") * 3000
    path.write_text('v,w\n1,2\n"' + field + '",3\n4,5\n')
    assert tolerant_count(str(path)) == 3


# --------------------------------------------------------------------------- 3. dead-letter reasons
def test_a_huge_cell_makes_a_small_dead_letter(tmp_path):
    """A 20 MB non-numeric cell: its dead letter's line is under 64 KB (the reason quotes the
    first QUOTED_VALUE_CHARS characters and says how long the value was; the record's field is
    cut to 2,000 characters as before)."""
    path = tmp_path / "cell.csv"
    big = "z" * 20_000_000
    path.write_text(f"v\n1\n{big}\n2\n")
    out = tmp_path / "dead.jsonl"
    mech = build_mechanism("bisample", epsilon=1.0, lower=0, upper=10)
    p = TestPipeline()
    rd = p | ReadTable(str(path))
    res = rd.batches | Perturb(mech, columns={"value": "v"}, seed=1)
    (res.dead_letter,) | WriteJsonLines(str(out))
    p.run().wait_until_finish()
    lines = out.read_text().splitlines()
    assert len(lines) == 1
    assert len(lines[0].encode()) < 64 * 1024
    d = json.loads(lines[0])
    assert d["reason"].startswith("value: non-numeric value 'zzz")
    assert "... (20,000,000 characters)" in d["reason"]
    assert d["row"] == 1


def test_reasons_quote_values_within_the_cap():
    big = "q" * 5_000_000
    grr = build_mechanism("grr", epsilon=1.0, domain="a,b")
    _, reasons = grr.check(np.array(["a", big], dtype=object))
    r = reasons.as_dict()[1]
    assert len(r) < QUOTED_VALUE_CHARS + 200 and "(5,000,000 characters)" in r
    with pytest.raises(InvalidRecordsError) as exc:
        grr.perturb(np.array([big], dtype=object), 1)
    assert len(str(exc.value)) < QUOTED_VALUE_CHARS + 300
    assert quote_value("short") == "'short'" and quote_value(b"x" * 3000).endswith("(3,000 bytes)")
    # a reason built elsewhere (a plugin's message) is cut too
    from ldp_beam.core import Reasons
    rs = Reasons(1)
    rs.flag(np.array([True]), lambda i: "w" * 100_000)
    assert len(rs.as_dict()[0]) < REASON_CHARS + 100


# --------------------------------------------------------------------------- 4. bounds
NUMERIC = [n for n, p in SAMPLE_PARAMS.items() if "lower" in p]


def test_every_numeric_family_is_covered():
    assert set(NUMERIC) >= {"bisample", "bisample-md", "harmony", "pm", "privkvm", "laplace-dp",
                            "generalized-gaussian", "square-wave", "rvns", "dphr",
                            "laplace-histogram", "ahp", "structure-first", "ospdprr",
                            "osdp-rr"}


@pytest.mark.parametrize("name", NUMERIC)
def test_bounds_whose_width_overflows_are_refused(name):
    with pytest.raises(ParameterError, match=r"'lower, upper'.*upper - lower finite \(at most "
                                             r"~1\.8e308"):
        build_mechanism(name, **dict(SAMPLE_PARAMS[name], lower=-1e308, upper=1e308))


@pytest.mark.parametrize("name", NUMERIC)
def test_a_wide_normal_range_is_still_accepted_and_estimates_are_finite(name):
    params = dict(SAMPLE_PARAMS[name], lower=-1e6, upper=1e6)
    if name == "rvns":
        params["d"] = 2e5
    mech = build_mechanism(name, **params)
    g = np.random.default_rng(2)
    reports = emit(mech, valid_columns(mech, 3000, g), 5)
    for v in reports.values():
        assert np.isfinite(np.asarray(v, dtype=float)).all()
    est = estimator_for(mech, **SAMPLE_OPTIONS.get(name, {}))
    e = est.finalize(est.add(est.create(), reports))
    for st in e.statistics.values():
        v = np.asarray(st.value)
        if st.value is not None and v.dtype.kind in "iuf":
            assert np.isfinite(v.astype(float)).all(), (name, st)


@pytest.mark.parametrize("name,params", [
    # estimates reach coth(eps/2) half-widths beyond the bounds: inf at eps = 0.05
    ("bisample", dict(epsilon=0.05, lower=-1e307, upper=1e307)),
    ("pm", dict(epsilon=0.05, lower=-1e307, upper=1e307)),
    # the scaled values 2v overflow
    ("harmony", dict(epsilon=1.0, lower=0.0, upper=1.5e308)),
    # the noise (36.7 scales for Laplace) overflows
    ("laplace-dp", dict(epsilon=1.0, lower=-1e307, upper=1e307)),
    # the density estimate's kurtosis takes x^5
    ("square-wave", dict(epsilon=1.0, lower=-1e62, upper=1e62)),
    ("rvns", dict(lower=-1e62, upper=1e62)),
    # sums of squares of up to 2^63 values
    ("osdp-rr", dict(epsilon=1.0, lower=1.0, upper=1e150)),
    ("ospdprr", dict(t=0.7, query="variance", lower=1.0, upper=1e150)),
    # the sum of values, and OSPDPRR's noise variance
    ("osdp-rr", dict(epsilon=1.0, query="mean", lower=0.0, upper=1e296)),
    ("ospdprr", dict(t=0.7, lower=1.0, upper=1e200)),
])
def test_bounds_whose_scaled_computations_overflow_are_refused(name, params):
    with pytest.raises(ParameterError, match=r"'lower, upper'"):
        build_mechanism(name, **params)


def test_gaussian_calibration_on_too_wide_bounds_fails_at_once():
    t0 = time.monotonic()
    with pytest.raises(ParameterError, match=r"'lower, upper'"):
        build_mechanism("generalized-gaussian", epsilon=0.05, lower=-1e307, upper=1e307)
    assert time.monotonic() - t0 < 10  # the calibration used to loop forever here


# --------------------------------------------------------------------------- 5. clipped counts
def _clip_data(mech, n=1000, outside=80, seed=4):
    g = np.random.default_rng(seed)
    v = g.uniform(0, 10, n)
    idx = g.choice(n, outside, replace=False)
    v[idx[: outside // 2]] = -3.0
    v[idx[outside // 2:]] = 25.0
    data = {f"value{i}": v.copy() for i in mech.target}
    for r in mech.roles:
        if r.name.startswith("level"):
            data[r.name] = np.where(g.random(n) < 0.3, 0.4, 0.0)
    return data


@pytest.mark.parametrize("name,params", [
    ("ospdprr", dict(t=0.7)),
    ("ospdprr", dict(t=0.7, mode="sound-public")),
    ("ospdprr", dict(t=0.7, query="mean")),
    ("osdp-rr", dict(epsilon=1.0)),
])
def test_clipped_values_are_counted_for_the_curator_only(name, params):
    mech = build_mechanism(name, **params, lower=0.0, upper=10.0, clip=True)
    data = _clip_data(mech)
    est = estimator_for(mech, seed=3)
    parts = []
    for lo in range(0, 1000, 300):  # batches accumulated apart, then merged
        rep = emitted_rows(mech, {k: v[lo:lo + 300] for k, v in data.items()}, 9, stream=1,
                           offset=lo)
        assert not est.check_reports(rep).bad.any()
        parts.append(est.add(est.create(), rep))
    e = est.finalize(est.merge(parts[::-1]))
    assert e.curator == {"values_clipped": 80}
    # never published: not in to_dict(); only on request, for the pipeline's curator file
    assert "curator" not in e.to_dict() and "values_clipped" not in json.dumps(e.to_dict())
    assert e.to_dict(curator=True)["curator"] == {"values_clipped": 80}
    note = e[mech.query].note
    assert "values outside [0, 10] were clipped" in note
    assert "their exact number is in the curator file, not published" in note


def test_clipped_values_count_every_target_item_and_only_with_clip():
    mech = build_mechanism("ospdprr", t=0.7, k=2, target=(1, 2), lower=0.0, upper=10.0,
                           clip=True)
    est = estimator_for(mech, seed=1)
    e = est.finalize(est.add(est.create(), mech.records(_clip_data(mech), 2)))
    assert e.curator == {"values_clipped": 160}
    plain = build_mechanism("ospdprr", t=0.7, lower=0.0, upper=10.0)
    assert "clipped" not in dict(plain.report_fields)
    data = {"value1": np.linspace(0, 10, 50), "level1": np.zeros(50)}
    est = estimator_for(plain, seed=1)
    e = est.finalize(est.add(est.create(), plain.records(data, 2)))
    assert e.curator == {} and "clipped" not in e["sum"].note


def test_a_forged_clipped_field_is_a_malformed_report():
    mech = build_mechanism("osdp-rr", epsilon=1.0, lower=0.0, upper=10.0, clip=True)
    est = estimator_for(mech)
    rep = {"value1": np.array([1.0, 2.0]), "released1": np.array([1, 0], dtype=np.uint8),
           "clipped": np.array([0, 7], dtype=np.uint32)}
    r = est.check_reports(rep).as_dict()
    assert list(r) == [1] and "'clipped'" in r[1] and "[0, 1]" in r[1]


def test_a_clipping_release_puts_the_exact_count_in_the_curator_file_only(tmp_path):
    """End to end: `estimate -m osdp-rr -p clip=true` on 1,000 values of which 80 lie outside
    [0, 10]: the curator file says 80, the published release and its manifest never hold it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ldp_beam_test_helpers import run_cli

    g = np.random.default_rng(4)
    v = g.uniform(0, 10, 1000)
    idx = g.choice(1000, 80, replace=False)
    v[idx[:40]], v[idx[40:]] = -3.0, 25.0
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": v, "lv": np.where(g.random(1000) < 0.3, 0.4, 0.0)}), src)
    out = tmp_path / "r.json"
    code, _, se = run_cli("estimate", "-i", str(src), "-m", "osdp-rr", "-p", "epsilon=1",
                          "-p", "k=1", "-p", "lower=0", "-p", "upper=10", "-p", "clip=true",
                          "--role", "value1=x", "--role", "level1=lv", "-o", str(out),
                          "--quiet", "--ledger", f"sqlite:///{tmp_path / 'l.db'}")
    assert code == 0, se
    curator = json.loads((tmp_path / "r.json.curator.json").read_text())
    assert curator["release"] == {"values_clipped": 80}
    for published in (out, tmp_path / "r.json.manifest.json"):
        assert "values_clipped" not in published.read_text()  # the manifest names the file
    assert "were clipped" in out.read_text()
