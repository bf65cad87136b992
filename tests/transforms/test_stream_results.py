"""A stream's results sinks (issue 24): every published pane reaches a folder, a DuckDB table and
a PostgreSQL table once, idempotent by (window, pane); a restart re-sends what a crash may have
left undelivered and the sinks keep their first copy; a pane a killed run already published is
not published again."""
import json
import os

import duckdb
import numpy as np
import pytest

from ldp_beam_test_helpers import read_jsonl, write_file
from ldp_beam.errors import ParameterError
from ldp_beam.pipelines.stream import run_stream
from ldp_beam.transforms.windowed import PANE, StreamSink
from ldp_beam.registry import build_mechanism
from ldp_beam.transforms.stream_results import check_results, open_results

T0 = 1_700_000_000
EPS = 2.0


@pytest.fixture(scope="module")
def bisample():
    return build_mechanism("bisample-md", epsilon=EPS, lower=0, upper=100)


def reports(mech, n, seed):
    rep = mech.perturb({"value": np.random.default_rng(seed).uniform(18, 90, n)}, rng=seed)
    return [{"s": int(s), "b": int(b)} for s, b in zip(rep["s"], rep["b"])]


def _pg_rows(url: str, table: str) -> list[tuple]:
    from ldp_beam.transforms.sinks import _pg_connect

    con = _pg_connect(url)
    try:
        with con.cursor() as cur:
            cur.execute(f"SELECT window_start, pane, result FROM {table} ORDER BY 1, 2")
            return cur.fetchall()
    finally:
        con.close()


def test_every_pane_reaches_every_sink_once_and_a_rerun_adds_nothing(tmp_path, bisample,
                                                                    pg_url):
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    for w, n in ((0, 30), (10, 20), (20, 25)):
        write_file(spool, f"w{w}.jsonl", [{**r, "ts": T0 + w + 1} for r in
                                          reports(bisample, n, w)])
    folder = tmp_path / "panes"
    ddb = f"duckdb:///{tmp_path / 'results.db'}?table=stream_results"
    pg = f"{pg_url}{'&' if '?' in pg_url else '?'}table=stream_results"
    dests = [str(folder), ddb, pg]
    s = run_stream(str(out), bisample, spool=str(spool), window_seconds=10, once=True,
                   progress=False, results=dests)
    rows = read_jsonl(out / "estimates.jsonl")
    assert len(rows) == 3 and s["results"]["sinks"][0] == str(folder)
    by_name = {f"window={r['window_start']}.pane=0.json": r for r in rows}
    assert sorted(os.listdir(folder)) == sorted(by_name)
    for name, r in by_name.items():
        assert json.loads((folder / name).read_text()) == r
    con = duckdb.connect(str(tmp_path / "results.db"))
    got = con.execute("SELECT pane, result FROM stream_results ORDER BY window_start").fetchall()
    con.close()
    assert [json.loads(x[1]) for x in got] == sorted(rows, key=lambda r: r["window_start"])
    assert [json.loads(x[2]) for x in _pg_rows(pg_url, "stream_results")] == \
        sorted(rows, key=lambda r: r["window_start"])

    # a sink that lost a pane (a crash between the estimates file and the sink) gets it back at
    # the next start; the others keep their single copy
    (folder / sorted(by_name)[1]).unlink()
    con = duckdb.connect(str(tmp_path / "results.db"))
    con.execute("DELETE FROM stream_results WHERE pane = 0 AND window_start = "
                "(SELECT min(window_start) FROM stream_results)")
    con.close()
    run_stream(str(out), bisample, spool=str(spool), window_seconds=10, once=True,
               progress=False, results=dests)
    assert sorted(os.listdir(folder)) == sorted(by_name)
    con = duckdb.connect(str(tmp_path / "results.db"))
    assert con.execute("SELECT count(*) FROM stream_results").fetchone()[0] == 3
    con.close()
    assert len(_pg_rows(pg_url, "stream_results")) == 3
    assert len(read_jsonl(out / "estimates.jsonl")) == 3


def test_a_pane_already_published_is_not_published_again(tmp_path):
    """A re-fired pane of the same reports (a run killed after publishing, before settling) is
    kept once; a pane of more reports under a number already used gets the next number."""
    out = tmp_path / "out"
    start = T0 * 1_000_000

    def pane(index, n):
        row = {"window_start": "w", "window_start_epoch": T0, "window_end_epoch": T0 + 10,
               "pane": {"index": index, "timing": "on_time"}, "n_reports": n}
        return (0, (PANE, {"window_start_us": start, "window_end_us": start + 10_000_000,
                           "index": index, "timing": "on_time", "count": n, "row": row,
                           "refused": None}))

    sink = StreamSink(str(out), "r2", False, progress=False, results=[str(tmp_path / "f")],
                      published=[(start, 0, 40)])
    list(sink.process(pane(0, 40), settle=None) or ())
    assert not (out / "estimates.jsonl").exists()  # the same pane: not again
    list(sink.process(pane(0, 45), settle=None) or ())
    sink.teardown()
    (row,) = read_jsonl(out / "estimates.jsonl")
    assert row["pane"] == {"index": 1, "timing": "on_time", "index_in_run": 0}
    assert row["n_reports"] == 45
    ledger = read_jsonl(out / "curator" / "ledger.jsonl")
    assert [x.get("already_published", False) for x in ledger] == [True, False]
    assert os.listdir(tmp_path / "f") == [f"window=w.pane=1.json"]


@pytest.mark.parametrize("dest", ["out.parquet", "s3://b/x?table=t", "duckdb:///x.db"])
def test_results_destinations_are_checked(dest):
    with pytest.raises(ParameterError, match="--results"):
        check_results([dest], None)


def test_an_unreachable_results_table_is_an_error_naming_it(tmp_path):
    with pytest.raises(Exception, match=r"127\.0\.0\.1:1"):
        open_results([str(tmp_path / "ok"), "postgresql://127.0.0.1:1/x?table=t"], None)


def test_each_sink_says_whether_it_added_the_pane(tmp_path):
    row = {"window_start": "2023-11-14T22:13:20Z", "window_start_epoch": T0,
           "window_end_epoch": T0 + 10, "pane": {"index": 0, "timing": "on_time"}, "run": "r"}
    sinks = open_results([str(tmp_path / "f"), f"duckdb:///{tmp_path / 'r.db'}?table=t"], None)
    try:
        assert [s.write(row) for s in sinks] == [True, True]
        assert [s.write(row) for s in sinks] == [False, False]  # kept once, never overwritten
    finally:
        for s in sinks:
            s.close()
