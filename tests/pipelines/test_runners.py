"""The same pipelines on the DirectRunner, the multi-process DirectRunner and a local Dask cluster
(two worker processes): with a seed, reports, estimates and central releases are bit-identical
for every family, and the record counts reconcile (from metrics, or from the outputs on Dask,
which has none)."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam import build_mechanism
from ldp_beam.pipelines.collect import run_collect
from ldp_beam.pipelines.estimate import run_estimate

distributed = pytest.importorskip("distributed")

MULTI = ["--runner=DirectRunner", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing"]


@pytest.fixture(scope="module")
def dask_args():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address="127.0.0.1:0")
    try:
        yield ["--runner=dask", f"--dask_client_address={cluster.scheduler_address}"]
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    """Two Parquet files of several row groups with numeric, categorical and level columns, and
    a few bad rows."""
    d = tmp_path_factory.mktemp("runners")
    rng = np.random.default_rng(5)
    for part, n in (("a", 5000), ("b", 3000)):
        x = rng.gamma(3.0, 10.0, n)
        x[:2] = [np.nan, 500.0]
        emp = rng.choice(["employed", "retired", "unemployed"], n)
        health = rng.choice(["good", "fair", "poor"], n)
        health[2] = "unknown"
        level = np.where(rng.random(n) < 0.6, 0.0, rng.uniform(0.05, 1.0, n))
        pq.write_table(pa.table({"uid": np.arange(n) + (0 if part == "a" else 10**6), "x": x,
                                 "emp": emp, "health": health, "level": level}),
                       d / f"{part}.parquet", row_group_size=1200)
    return d


FAMILIES = {
    "bisample-md": (dict(epsilon=1.0, lower=0.0, upper=100.0), {"value": "x"}),
    "rvns": (dict(lower=0.0, upper=100.0, d=10.0, k=2, delta=20.0), {"value": "x"}),
    "cprr": (dict(epsilon=2.0, x_domain=("employed", "retired", "unemployed"),
                  y_domain=("good", "fair", "poor"), x_sensitive=("unemployed",),
                  y_sensitive=("poor",)), {"x": "emp", "y": "health"}),
}
CENTRAL = {
    "dphr": (dict(epsilon=1.0, bins=20, lower=0.0, upper=100.0), {"value": "x"}),
    "ospdprr": (dict(t=0.8, query="sum", k=1, lower=0.0, upper=100.0),
                {"value1": "x", "level1": "level"}),
}


def _collect_and_estimate(name, table_dir, out, args):
    params, cols = FAMILIES[name]
    mech = build_mechanism(name, **params)
    rep = str(out / "r.parquet")
    # uid is kept only to align the runners' reports row by row (declared public for the test)
    man = run_collect(str(table_dir), rep, mech, cols, keep=("uid",), public=("uid",), seed=11,
                      batch_rows=700, beam_args=args)
    est = run_estimate(rep, str(out / "e.json"), beam_args=args)
    return pq.read_table(rep).sort_by("uid"), man, est


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_ldp_families_are_runner_independent(name, table_dir, tmp_path, dask_args):
    results = {}
    for label, args in (("direct", []), ("multi", MULTI), ("dask", dask_args)):
        out = tmp_path / label
        out.mkdir()
        results[label] = _collect_and_estimate(name, table_dir, out, args)
    ref_reports, ref_man, ref_est = results["direct"]
    assert ref_man["records"]["reconciles"] and ref_man["records"]["counted_from"] == "data"
    for label in ("multi", "dask"):
        reports, man, est = results[label]
        assert reports.equals(ref_reports), label
        assert man["records"]["reconciles"], (label, man["records"])
        assert man["records"] == ref_man["records"], label  # every count, on every runner
        assert est["estimate"] == ref_est["estimate"], label
        assert {k: v for k, v in est["reports"].items() if k != "dead_letter"} == \
            {k: v for k, v in ref_est["reports"].items() if k != "dead_letter"}, label


@pytest.mark.parametrize("name", sorted(CENTRAL))
def test_central_releases_are_runner_independent(name, table_dir, tmp_path, dask_args):
    params, cols = CENTRAL[name]
    mech = build_mechanism(name, **params)
    outs = {}
    for label, args in (("direct", []), ("multi", MULTI), ("dask", dask_args)):
        path = tmp_path / f"{label}.json"
        # a ledger per runner: one ledger would re-publish the first runner's recorded release
        outs[label] = run_estimate(str(table_dir), str(path), mech, options={"seed": 3},
                                   beam_args=args, columns=cols,
                                   ledger=str(tmp_path / f"{label}.db"))
        assert "republished_from" not in outs[label]
        assert outs[label]["curator"]["records"]["reconciles"], (label, outs[label]["curator"])
        released = json.loads(path.read_text())
        assert released["estimate"]["n_reports"] is None
    for label in ("multi", "dask"):
        assert outs[label]["estimate"] == outs["direct"]["estimate"], label
        rec = {k: v for k, v in outs[label]["curator"]["records"].items() if k != "dead_letter"}
        ref = {k: v for k, v in outs["direct"]["curator"]["records"].items() if k != "dead_letter"}
        assert rec == ref, label


def test_dask_worker_failure_fails_the_pipeline(tmp_path, dask_args):
    """A crash inside a worker surfaces as a failed run with the error, not as partial output
    presented as complete."""
    import apache_beam as beam

    from ldp_beam.pipelines.common import run_pipeline

    def boom(x):
        if x == 3:
            raise RuntimeError("worker exploded on record 3")
        return x

    def build(p):
        return [p | beam.Create(list(range(8))) | beam.Map(boom)
                | beam.io.WriteToText(str(tmp_path / "out"))]

    with pytest.raises(Exception, match="worker exploded on record 3"):
        run_pipeline(build, dask_args)


def test_command_line_direct_runs_never_try_prism(monkeypatch, tmp_path):
    """Beam 2.77's DirectRunner tries the PrismRunner first, which downloads a binary at run time
    (and would run our pipelines on a runner no test exercises where a network is present). The
    command line's DirectRunner skips that attempt and still runs the pipeline to its answer."""
    import apache_beam as beam
    from apache_beam.runners.portability import prism_runner

    from ldp_beam.pipelines.common import local_runner, run_pipeline

    tried = []

    def refuse(self, *a, **k):
        tried.append(1)
        raise RuntimeError("the PrismRunner was tried")

    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", refuse)

    def build(p, name):
        out = str(tmp_path / name)
        return [p | beam.Create([1, 2, 3]) | beam.CombineGlobally(sum)
                | beam.Map(lambda s: open(out, "w").write(str(s)))]

    run_pipeline(lambda p: build(p, "ours"), ["--runner", "direct"])
    assert tried == [] and (tmp_path / "ours").read_text() == "6"
    assert local_runner(["--runner=DirectRunner"]) is not None
    assert local_runner(["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"]) is None
    # the check is live: Beam's own DirectRunner does try Prism on this pipeline (then falls back)
    with beam.Pipeline(runner="DirectRunner") as p:
        build(p, "beams")
    assert tried == [1] and (tmp_path / "beams").read_text() == "6"
