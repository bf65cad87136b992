"""`ldp-beam bench --only sources` (ldp_beam.pipelines.bench_sources): the same rows read from
Parquet, DuckDB and a PostgreSQL server the benchmark starts itself, and the Parquet pipeline on
the PortableRunner. The records' fields and row counts are checked, never their timings (speed is
measured by the benchmark itself)."""
from __future__ import annotations

import json

import pytest

from ldp_beam.pipelines import bench_sources

@pytest.mark.slow  # four child pipelines, a PostgreSQL server and a job service: ~30 s
def test_sources_bench_records_and_rows(tmp_path):
    n = 20_000
    recs = bench_sources.run((n,), str(tmp_path))
    json.dumps(recs, allow_nan=False)
    direct = [r for r in recs if r["runner"] == "DirectRunner"]
    assert [r["source"] for r in direct] == ["parquet", "duckdb", "postgresql"]
    pg_reason = bench_sources.postgres_unavailable()
    for r in direct:
        for key in ("experiment", "dataset", "method", "epsilon", "metric", "value", "stage",
                    "runner", "rows", "seconds", "rows_per_second", "peak_rss_mb", "mode",
                    "path", "note", "source", "repeats"):
            assert key in r, (key, r)
        assert r["stage"] == "sources" and r["path"] == "api" and r["rows"] == n
        if r["source"] == "postgresql" and pg_reason:
            assert r["skipped"] == pg_reason and r["seconds"] is None
            continue
        assert "skipped" not in r
        # the same rows in each source: every one perturbed and estimated, none dead-lettered
        assert r["reports"] == n and r["dead_letters"] == 0
        assert r["seconds"] > 0 and len(r["all_seconds"]) == r["repeats"] == 1
        # CPU accounting: the pipeline process; for PostgreSQL also the server's processes
        assert r["cpu_seconds"] > 0 and r["cores"] >= 1
        server = r.get("server_cpu_seconds") or 0.0
        assert ("server_cpu_seconds" in r) == (r["source"] == "postgresql")
        assert server >= 0
        assert r["wall_floor_seconds"] == pytest.approx((r["cpu_seconds"] + server) / r["cores"])
        if r["source"] != "parquet":
            assert r["ratio_to_parquet"] == pytest.approx(r["seconds"] / direct[0]["seconds"])
            assert r["target"] == 1.5 and r["meets_target"] == (r["ratio_to_parquet"] <= 1.5)
    (portable,) = [r for r in recs if r["runner"].startswith("PortableRunner")]
    assert portable["source"] == "parquet" and portable["rows"] == n
    assert portable["reports"] == n and portable["dead_letters"] == 0
    (ref,) = portable["direct_seconds"]  # the DirectRunner run paired with it
    assert portable["ratio_to_direct"] == pytest.approx(portable["seconds"] / ref)
    assert "target" not in portable  # the overhead is measured, not held to a target


@pytest.mark.skipif(bench_sources.postgres_unavailable() is not None,
                    reason=str(bench_sources.postgres_unavailable()))
def test_the_benchmarks_own_postgres_server_loads_reads_and_cleans_up():
    """Not slow: the server the benchmark starts (no tests/ helper), its bulk load and its
    removal."""
    import os

    from ldp_beam.transforms import ReadTable

    table = bench_sources._table(5000)
    with bench_sources._PostgresServer.running() as server:
        folder = server.folder
        url = server.load(table, "t5000")
        rt = ReadTable(url)
        assert rt.source.rows == 5000 and rt.schema.names == ["x"]
        rt.source.close()
        assert os.path.isdir(folder)
    assert not os.path.exists(folder)
