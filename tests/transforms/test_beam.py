"""The generic Beam layer: Perturb (batch and element paths, dead letters, counters, seeds) and
the estimator CombineFn (global, per key, per window), on the DirectRunner."""
import math
import uuid

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from ldp_beam import build_mechanism, estimator_for
from ldp_beam.transforms import (Accumulate, EstimateGlobally, EstimatePerKey,
                                 Perturb, ReadTable, SplitByKey, ValidateReports)
from ldp_beam.transforms.combine import EstimateFailure, EstimatorCombineFn
from ldp_beam_test_helpers import Sink, core_reports


def _md():
    return build_mechanism("bisample-md", epsilon=1.0, lower=0, upper=100)


def _collect(path, mech, seed, batch_rows, keep=("uid",)):
    """Run ReadTable | Perturb and return (reports sorted by uid, dead letters, counters)."""
    base = path.parent / f"sink-{uuid.uuid4().hex}"
    got_sink, dead_sink = Sink(base / "r"), Sink(base / "d")
    p = TestPipeline()
    rd = p | ReadTable(str(path), batch_rows=batch_rows)
    out = rd.batches | Perturb(mech, columns={"value": "age", "preference": "pref"}, keep=keep,
                               seed=seed)
    out.reports | beam.Map(lambda b: got_sink(b.to_pydict()))
    out.dead_letter | beam.Map(dead_sink)
    res = p.run()
    res.wait_until_finish()
    got, dead = got_sink.items(), dead_sink.items()
    cols = {}
    for d in got:
        for k, v in d.items():
            cols.setdefault(k, []).extend(v)
    order = np.argsort(cols["uid"])
    cols = {k: np.asarray(v)[order] for k, v in cols.items()}
    counters = {c.key.metric.name: c.committed for c in
                res.metrics().query(MetricsFilter().with_namespace("ldp_beam"))["counters"]}
    return cols, dead, counters


def test_batch_path_dead_letters_and_reconciles(survey_table):
    path, t = survey_table
    cols, dead, c = _collect(path, _md(), seed=1, batch_rows=512)
    reasons = sorted(d["reason"] for d in dead)
    assert len(dead) == 3  # NaN is a *missing* value for BiSample-MD, not a bad record
    assert any("150.0 outside [0, 100]" in r for r in reasons)
    assert any("-1.0 outside" in r for r in reasons)
    assert any(r.startswith("preference: -2.0 is not an epsilon") for r in reasons)
    assert {d["row"] for d in dead} == {1, 2, 3}
    assert all(d["source"].endswith("survey.parquet") for d in dead)
    assert c["records_in"] == t.num_rows == c["records_valid"] + c["records_invalid"]
    assert c["records_invalid"] == 3 and len(cols["uid"]) == t.num_rows - 3


def test_seeded_reports_do_not_depend_on_batching(survey_table):
    path, _ = survey_table
    a, _, _ = _collect(path, _md(), seed="s1", batch_rows=97)
    b, _, _ = _collect(path, _md(), seed="s1", batch_rows=1000)
    c, _, _ = _collect(path, _md(), seed="s2", batch_rows=97)
    for k in ("uid", "s", "b"):
        np.testing.assert_array_equal(a[k], b[k])
    assert (a["s"] != c["s"]).any()


def test_unseeded_runs_differ(survey_table):
    path, _ = survey_table
    a, _, _ = _collect(path, _md(), seed=None, batch_rows=1000)
    b, _, _ = _collect(path, _md(), seed=None, batch_rows=1000)
    assert (a["s"] != b["s"]).any() or (a["b"] != b["b"]).any()


def test_seeded_matches_core_perturbation(survey_table):
    """The Beam path gives exactly the reports the core computes for the same (stream, offset)."""
    from ldp_beam.rng import stream_id

    path, t = survey_table
    mech = _md()
    beam_cols, _, _ = _collect(path, mech, seed=9, batch_rows=700)
    core = core_reports(mech, {"value": t["age"].to_numpy(), "preference": t["pref"].to_numpy()},
                        9, stream_id("survey.parquet"))
    np.testing.assert_array_equal(core["s"], beam_cols["s"])
    np.testing.assert_array_equal(core["b"], beam_cols["b"])


def test_element_path_and_bad_records():
    mech = build_mechanism("bisample", epsilon=1.0, lower=0, upper=10)
    records = [{"id": 1, "x": 3.0}, {"id": 2, "x": "abc"}, {"id": 3, "x": None},
               {"id": 4, "x": 11}, {"id": 5}, {"id": 6, "x": True}, {"id": 7, "x": "7.5"}]
    with TestPipeline() as p:
        out = (p | beam.Create(records)
               | Perturb(mech, columns={"value": "x"}, keep=("id",), seed=3, key_column="id"))
        assert_that(out.reports | beam.Map(lambda r: r["id"]), equal_to([1, 7]), label="ok")
        assert_that(out.dead_letter | beam.Map(lambda d: (d["record"]["id"], d["reason"])),
                    equal_to([(2, "value: non-numeric value 'abc'"),
                              (3, "value: missing (null/NaN) and allow_missing=False"),
                              (4, "value: 11.0 outside [0, 10]"),
                              (5, "record has no field 'x'"),
                              (6, "value: non-numeric value True")]), label="dead")


def test_seeded_bare_batches_are_refused():
    mech = _md()
    with pytest.raises(Exception, match="keyed batches"):
        with TestPipeline() as p:
            _ = (p | beam.Create([{"value": np.array([1.0, 2.0])}]) | Perturb(mech, seed=1))


def test_estimate_globally_equals_core_estimator():
    mech = build_mechanism("bisample", epsilon=2.0, lower=-1, upper=1)
    est = estimator_for(mech)
    rng = np.random.default_rng(5)
    batches = [mech.perturb(rng.uniform(-1, 1, n), rng=rng) for n in (10, 500, 1, 2000)]
    expected = est.create()
    for b in batches:
        est.add(expected, b)
    with TestPipeline() as p:
        acc = p | beam.Create(batches) | beam.CombineGlobally(Accumulate(est))
        assert_that(acc | beam.Map(lambda a: a.tolist()), equal_to([expected.tolist()]))
        means = p | "c2" >> beam.Create(batches) | EstimateGlobally(est)
        want = est.finalize(expected)["mean"].value
        assert_that(means | beam.Map(lambda e: e["mean"].value), equal_to([want]), label="est")


def test_per_key_estimates(survey_table):
    path, t = survey_table
    mech = _md()
    est = estimator_for(mech)
    with TestPipeline() as p:
        rd = p | ReadTable(str(path))
        out = rd.batches | Perturb(mech, columns={"value": "age", "preference": "pref"},
                                   keep=("g",))
        per = out.reports | beam.ParDo(SplitByKey("g")) | EstimatePerKey(est)
        assert_that(per | beam.Map(lambda kv: (kv[0], kv[1].n_reports > 800)),
                    equal_to([("0", True), ("1", True), ("2", True)]))
        total = per | beam.Map(lambda kv: kv[1].n_reports) | beam.CombineGlobally(sum)
        assert_that(total, equal_to([t.num_rows - 3]), label="sum")


def test_windowed_estimates():
    """One estimate per fixed window, with per-window report counts."""
    mech = build_mechanism("harmony", epsilon=1.0, lower=-1.0, upper=1.0)
    est = estimator_for(mech)
    reports = [({"y": 1 if i % 3 else -1}, float(i)) for i in range(90)]
    with TestPipeline() as p:
        out = (p | beam.Create(reports)
               | beam.Map(lambda rt: window.TimestampedValue(rt[0], rt[1]))
               | beam.WindowInto(window.FixedWindows(30))
               | EstimateGlobally(est, windowed=True)
               | beam.Map(lambda e: e.n_reports))
        assert_that(out, equal_to([30, 30, 30]))


def test_empty_input_raises_or_reports():
    est = estimator_for(_md())
    with pytest.raises(Exception, match="no reports were accumulated"):
        with TestPipeline() as p:
            _ = p | beam.Create([]) | EstimateGlobally(est)
    with TestPipeline() as p:
        out = (p | beam.Create([]) | beam.CombineGlobally(EstimatorCombineFn(est, "report")))
        assert_that(out | beam.Map(lambda f: (type(f) is EstimateFailure, f.n_reports)),
                    equal_to([(True, 0)]))


def test_validate_reports_dead_letters_malformed_telemetry():
    est = estimator_for(_md())
    good = [{"s": 1, "b": 0}, {"s": 0, "b": 1}]
    bad = [{"s": 2, "b": 0}, {"s": 1}, {"s": "x", "b": 1}, "garbage"]
    with TestPipeline() as p:
        v = p | beam.Create(good + bad) | ValidateReports(est)
        assert_that(v.reports, equal_to(good), label="good")
        assert_that(v.dead_letter | beam.Map(lambda d: d["reason"].split(":")[0]),
                    equal_to(["report field 's'", "report field 'b' is missing",
                              "report field 's'", "unsupported report type str"]), label="bad")
        n = v.reports | beam.CombineGlobally(EstimatorCombineFn(est, "report"))
        assert_that(n | beam.Map(lambda e: e.n_reports), equal_to([2]), label="n")


def test_bisample_pipeline_estimate_is_unbiased_within_its_stderr(tmp_path):
    """End to end through Beam: the estimate lies within 4 reported standard errors of truth."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(21)
    v = rng.beta(2, 5, 20000) * 100
    pq.write_table(pa.table({"age": v}), tmp_path / "t.parquet")
    mech = build_mechanism("bisample", epsilon=1.0, lower=0, upper=100)
    sink = Sink(tmp_path / "sink")
    with TestPipeline() as p:
        rd = p | ReadTable(str(tmp_path / "t.parquet"), batch_rows=3000)
        out = rd.batches | Perturb(mech, columns={"value": "age"}, seed=77)
        out.reports | EstimateGlobally(estimator_for(mech)) | beam.Map(sink)
    m = sink.items()[0]["mean"]
    assert abs(m.value - v.mean()) < 4 * m.stderr
    # Eq. 14: worst-case sd per user ((e^eps+1)/(e^eps-1)) in the normalized scale
    assert m.stderr <= 50 * (math.e + 1) / (math.e - 1) / math.sqrt(20000) * 1.01


def test_buffered_records_keep_their_windows():
    """Single records are perturbed together per bundle but keep their own timestamp/window."""
    mech = build_mechanism("bisample-md", epsilon=1.0, lower=0, upper=10)
    est = estimator_for(mech)
    recs = [({"x": float(i % 10), "id": i}, float(i)) for i in range(100)]
    recs.append(({"x": 99.0, "id": 100}, 5.0))  # a bad record in the first window
    with TestPipeline() as p:
        timed = (p | beam.Create(recs)
                 | beam.Map(lambda rt: window.TimestampedValue(rt[0], rt[1]))
                 | beam.WindowInto(window.FixedWindows(25)))
        out = timed | Perturb(mech, columns={"value": "x"}, keep=("id",), key_column="id")
        counts = out.reports | EstimateGlobally(est, windowed=True) | beam.Map(
            lambda e: e.n_reports)
        assert_that(counts, equal_to([25, 25, 25, 25]))
        dead = (out.dead_letter | "Global" >> beam.WindowInto(window.GlobalWindows())
                | beam.Map(lambda d: d["record"]["id"]))
        assert_that(dead, equal_to([100]), label="dead")
        ids = (out.reports | beam.Map(lambda r, ts=beam.DoFn.TimestampParam:
                                      (r["id"], float(ts))))
        assert_that(ids, equal_to([(i, float(i)) for i in range(100)]), label="ts")


def test_read_from_parquet_batched_feeds_the_batch_path(tmp_path):
    """Beam's own ReadFromParquetBatched (pyarrow tables per row group) goes straight into
    Perturb's vectorized batch path for unseeded runs; the estimate is within its standard error
    of the truth. (ReadTable is used when a seed is asked for: it keys every row by file and row
    number, which ReadFromParquetBatched does not expose.)"""
    from apache_beam.io.parquetio import ReadFromParquetBatched

    rng = np.random.default_rng(3)
    ages = rng.uniform(0, 100, 40_000)
    path = tmp_path / "t.parquet"
    pa_table = pa.table({"age": ages})
    import pyarrow.parquet as pq

    pq.write_table(pa_table, path, row_group_size=5000)
    mech = _md()
    sink = Sink(tmp_path / "s")
    p = TestPipeline()
    out = (p | ReadFromParquetBatched(str(path), columns=["age"])
           | Perturb(mech, columns={"value": "age"}))
    out.reports | EstimateGlobally(estimator_for(mech)) | beam.Map(sink)
    p.run().wait_until_finish()
    (est,) = sink.items()
    assert est.n_reports == 40_000
    assert abs(est["mean"].value - ages.mean()) <= 4 * est["mean"].stderr


def test_a_key_is_its_text_whatever_the_column_type_of_its_batch():
    """SplitByKey's keys (and the per-key bounding's partitions, which use the same text): 1,
    1.0 and "1" are one key, with or without a null in the batch; a null or NaN is ""."""
    from ldp_beam.transforms.batches import key_text

    assert key_text(pa.table({"k": pa.array([1, None, 3])}), "k").to_pylist() == ["1", "", "3"]
    assert key_text(pa.table({"k": [1.0, 1e10, -0.0, 2.5, float("nan")]}), "k").to_pylist() \
        == ["1", "10000000000", "0", "2.5", ""]
    assert key_text({"k": np.array([1.0, np.nan])}, "k").to_pylist() == ["1", ""]
    split = SplitByKey("k").process
    for table in (pa.table({"k": pa.array([1, 2, 1], pa.int64())}),
                  pa.table({"k": pa.array([1, None, 1], pa.int64())})):
        keys = [k for k, _ in split(table)]
        assert "1" in keys and all(isinstance(k, str) for k in keys)
