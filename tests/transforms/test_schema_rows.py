"""Schema'd PCollections through Perturb (beam.Row, NamedTuple rows, pandas frames), reports as
schema'd beam.Row (output="rows") and estimates as schema'd rows (EstimatesAsRows)."""
from typing import NamedTuple, Optional

import apache_beam as beam
import numpy as np
import pandas as pd
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.typehints.schemas import named_fields_from_element_type

from ldp_beam import build_mechanism, estimator_for
from ldp_beam.transforms import Perturb
from ldp_beam.transforms.combine import EstimateFailure
from ldp_beam.transforms.rows import EstimatesAsRows, estimate_rows

AGES = [10.0, 150.0, 55.0, -1.0, 99.0, 0.0, 42.0]  # 150 and -1 outside [0, 100]
BAD = {1, 3}


def _mech():
    return build_mechanism("bisample", epsilon=1.0, lower=0, upper=100)


class Person(NamedTuple):
    id: int
    age: float
    region: str


beam.coders.registry.register_coder(Person, beam.coders.RowCoder)


def _counters(res):
    return {c.key.metric.name: c.committed for c in
            res.metrics().query(MetricsFilter().with_namespace("ldp_beam"))["counters"]}


def _check_counts(n_valid, n_dead):
    def check(got):
        assert len(got) == n_valid, got
    def check_dead(got):
        assert len(got) == n_dead, got
        for d in got:
            assert "unsupported element type" not in d["reason"]
            assert "outside [0, 100]" in d["reason"], d
            assert d["record"]["id"] in BAD  # the record id travels with the dead letter
    return check, check_dead


def _n_reports(element):
    return element.num_rows if hasattr(element, "num_rows") else 1


def _run_records(make, out_type=None, **kw):
    p = TestPipeline()
    pcoll = p | beam.Create([make(i, a) for i, a in enumerate(AGES)])
    if out_type is not None:  # through a schema'd step: Beam decodes its own row type
        pcoll = pcoll | beam.Map(lambda r: r).with_output_types(out_type)
    out = pcoll | Perturb(_mech(), columns={"value": "age"}, key_column="id", **kw)
    check, check_dead = _check_counts(len(AGES) - len(BAD), len(BAD))
    assert_that(out.reports | beam.FlatMap(lambda e: [1] * _n_reports(e)), check,
                label="reports")
    assert_that(out.dead_letter, check_dead, label="dead")
    res = p.run()
    res.wait_until_finish()
    c = _counters(res)
    assert c["records_in"] == len(AGES) == c["records_valid"] + c["records_invalid"]
    assert c["records_invalid"] == len(BAD)
    return out


def test_beam_rows_perturbed_and_dead_lettered():
    _run_records(lambda i, a: beam.Row(id=i, age=a, region="north"))


def test_beam_rows_through_a_schemad_step():
    from apache_beam.typehints.row_type import RowTypeConstraint
    t = RowTypeConstraint.from_fields([("id", int), ("age", float), ("region", str)])
    _run_records(lambda i, a: beam.Row(id=i, age=a, region="north"), out_type=t)


def test_namedtuple_rows_perturbed_and_dead_lettered():
    _run_records(lambda i, a: Person(i, a, "south"))
    _run_records(lambda i, a: Person(i, a, "south"), out_type=Person)


def test_schema_rows_need_a_key_column_for_noise():
    p = TestPipeline()
    _ = (p | beam.Create([beam.Row(id=1, age=3.0)])
         | Perturb(_mech(), columns={"value": "age"}))
    with pytest.raises(Exception, match="key_column"):
        p.run().wait_until_finish()


def test_row_noise_is_the_dict_noise():
    """A beam.Row record is the same record as its dict: same id, same draws, same report."""
    p = TestPipeline()
    branches = []
    for tag, make in (("dict", lambda i, x: {"id": i, "age": x}),
                      ("row", lambda i, x: beam.Row(id=i, age=x))):
        out = (p | f"Create{tag}" >> beam.Create([make(i, a) for i, a in enumerate(AGES)])
               | f"Perturb{tag}" >> Perturb(_mech(), columns={"value": "age"}, key_column="id",
                                            keep=("id",), seed=7))
        branches.append(out.reports | f"Tag{tag}" >> beam.Map(
            lambda r, t=tag: (t, (r["id"], int(r["s"]), int(r["b"])))))

    def check(got):
        by = {"dict": sorted(v for t, v in got if t == "dict"),
              "row": sorted(v for t, v in got if t == "row")}
        assert len(by["dict"]) == len(AGES) - len(BAD)
        assert by["dict"] == by["row"]

    assert_that(branches | beam.Flatten(), check)
    p.run().wait_until_finish()


def test_pandas_dataframe_is_a_bare_batch():
    df = pd.DataFrame({"age": AGES, "region": ["x"] * len(AGES)}, index=range(100, 107))
    p = TestPipeline()
    out = p | beam.Create([df]) | Perturb(_mech(), columns={"value": "age"}, keep=("region",))

    def check(batches):
        assert sum(b.num_rows for b in batches) == len(AGES) - len(BAD)
        for b in batches:
            assert b.schema.names == ["s", "b", "region"]
            assert set(b.column("region").to_pylist()) == {"x"}

    def check_dead(dead):
        assert sorted(d["row"] for d in dead) == sorted(BAD)  # positions, not the index
        assert all("unsupported element type" not in d["reason"] for d in dead)

    assert_that(out.reports, check, label="reports")
    assert_that(out.dead_letter, check_dead, label="dead")
    p.run().wait_until_finish()


def test_pandas_dataframe_refused_when_seeded():
    p = TestPipeline()
    _ = (p | beam.Create([pd.DataFrame({"age": [1.0]})])
         | Perturb(_mech(), columns={"value": "age"}, seed=1))
    with pytest.raises(Exception, match="keyed batches"):
        p.run().wait_until_finish()


@pytest.mark.parametrize("source", ["rows", "namedtuple", "dicts", "frame"])
def test_output_rows_are_schemad(source):
    import pyarrow as pa
    mech = _mech()
    p = TestPipeline()
    kw = {}
    if source == "rows":
        pcoll = p | beam.Create([beam.Row(id=i, age=a, region="n") for i, a in enumerate(AGES)])
        kw = {"key_column": "id"}
    elif source == "namedtuple":
        pcoll = p | beam.Create([Person(i, a, "n") for i, a in enumerate(AGES)]) \
            .with_output_types(Person)
        kw = {"key_column": "id"}
    elif source == "dicts":
        pcoll = p | beam.Create([{"id": i, "age": a, "region": "n"} for i, a in enumerate(AGES)])
        kw = {"key_column": "id", "passthrough_schema": pa.schema([("region", pa.string())])}
    else:
        pcoll = p | beam.Create([pd.DataFrame({"age": AGES, "region": ["n"] * len(AGES)})])
        kw = {"passthrough_schema": pa.schema([("region", pa.string())])}
    out = pcoll | Perturb(mech, columns={"value": "age"}, keep=("region",), output="rows", **kw)
    fields = dict(named_fields_from_element_type(out.reports.element_type))
    assert list(fields) == ["s", "b", "region"]
    assert fields["s"] == fields["b"] == np.int64
    assert fields["region"] in (str, Optional[str])

    def check(rows):
        assert len(rows) == len(AGES) - len(BAD)
        for r in rows:
            assert isinstance(r, beam.Row) or hasattr(r, "_fields")
            assert r.region == "n"
            assert isinstance(r.s, int) and isinstance(r.b, int)

    assert_that(out.reports, check, label="rows")
    assert_that(out.dead_letter | beam.Map(lambda d: 1), equal_to([1] * len(BAD)),
                label="dead")
    # downstream schema'd steps see the schema
    sel = out.reports | beam.Select("s", "region")
    assert [n for n, _ in named_fields_from_element_type(sel.element_type)] == ["s", "region"]
    p.run().wait_until_finish()


def test_output_rows_needs_kept_types():
    p = TestPipeline()
    with pytest.raises(ValueError, match="passthrough_schema"):
        _ = (p | beam.Create([{"id": 1, "age": 3.0, "region": "n"}])
             | Perturb(_mech(), columns={"value": "age"}, key_column="id", keep=("region",),
                       output="rows"))
    with pytest.raises(ValueError, match="output="):
        Perturb(_mech(), columns={"value": "age"}, output="tables")


def _estimates():
    rng = np.random.default_rng(3)
    m = _mech()
    e = estimator_for(m)
    cols, _ = m.check({"value": rng.uniform(0, 100, 400)})
    scalar = e.finalize(e.add(e.create(), m.randomize(cols, rng.uniform(size=(400, m.draws)))))
    g = build_mechanism("grr", epsilon=2.0, domain=("a", "b", "c"))
    eg = estimator_for(g)
    cols, _ = g.check({"value": np.array(["a", "b"] * 100, dtype=object)})
    vector = eg.finalize(eg.add(eg.create(), g.randomize(cols, rng.uniform(size=(200, g.draws)))))
    return scalar, vector


def test_estimates_as_rows():
    scalar, vector = _estimates()
    failure = EstimateFailure("bisample", 0, "no reports")
    p = TestPipeline()
    rows = (p | beam.Create([scalar, ("k1", vector), ("k2", failure)], reshuffle=False)
            | EstimatesAsRows())
    fields = [n for n, _ in named_fields_from_element_type(rows.element_type)]
    assert {"statistic", "value", "stderr", "n_reports", "guarantee", "index"} <= set(fields)

    expected = []
    for name, st in scalar.statistics.items():
        expected.append((None, name, None, float(st.value), float(st.stderr),
                         scalar.n_reports))
    f = vector["frequency"]
    for i, (v, se) in enumerate(zip(f.value, f.stderr)):
        expected.append(("k1", "frequency", i, float(v), float(se), vector.n_reports))
    expected.append(("k2", None, None, None, None, 0))

    def check(got):
        assert len(got) == len(expected)
        flat = sorted(((r.key, r.statistic, r.index, r.value, r.stderr, r.n_reports)
                       for r in got), key=repr)
        for a, b in zip(flat, sorted(expected, key=repr)):
            assert a[:3] == b[:3] and a[5] == b[5]
            for x, y in zip(a[3:5], b[3:5]):
                assert (x is None and y is None) or x == pytest.approx(y, rel=1e-12)
        assert all(r.guarantee == scalar.guarantee.describe() for r in got if r.key is None)
        assert [r.error for r in got if r.key == "k2"] == ["no reports"]

    assert_that(rows, check)
    p.run().wait_until_finish()
    # the same rows without a pipeline
    assert len(estimate_rows(scalar)) == len(scalar.statistics)


def test_row_reports_flow_into_the_estimate():
    """Reports emitted as beam.Row (output="rows") are estimated like report batches."""
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from ldp_beam import build_mechanism, estimator_for
    from ldp_beam.transforms import EstimateGlobally, Perturb

    mech = build_mechanism("grr", epsilon=1.0, domain=["a", "b", "c"])
    records = [beam.Row(id=i, value=["a", "b", "c"][i % 3]) for i in range(300)]
    with TestPipeline() as p:
        out = p | beam.Create(records) | Perturb(mech, key_column="id", output="rows")
        n = out.reports | EstimateGlobally(estimator_for(mech)) | beam.Map(lambda e: e.n_reports)
        assert_that(n, equal_to([300]))
