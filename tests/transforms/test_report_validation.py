"""Report tables are validated before any cast (issue 13): text from CSV or JSON is parsed against
each report field's declared dtype, never coerced ("x", "1.5" and "65536" for a uint16 field were
cast to 0, 1 and 0 and counted); bad reports are dead-lettered with their text and the rest are
estimated, through the Python API, the transforms and ``ldp-beam estimate``."""
from __future__ import annotations

import csv
import json
import uuid

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import given, settings
from hypothesis import strategies as st

from ldp_beam import build_mechanism, estimator_for
from ldp_beam.errors import InvalidRecordsError
from ldp_beam.transforms import EstimateGlobally, ReadTable, ValidateReports
from ldp_beam.transforms.batches import check_report_field, report_columns, report_value
from ldp_beam.transforms.combine import ValidateReportsFn
from ldp_beam_test_helpers import Sink, read_jsonl, run_cli

DTYPES = ["uint8", "int8", "uint16", "int32", "int64", "uint64", "float64", "float32"]


# --------------------------------------------------------------------------- the reference
@pytest.mark.parametrize("text, dtype, expected", [
    ("x", "uint16", "'x' is not an integer"),
    ("1.5", "uint16", "'1.5' is not an integer"),
    ("65536", "uint16", "'65536' is out of range for uint16 [0, 65535]"),
    ("-1", "uint16", "'-1' is out of range for uint16 [0, 65535]"),
    ("-129", "int8", "'-129' is out of range for int8 [-128, 127]"),
    ("inf", "uint8", "'inf' is not an integer"),
    ("NaN", "int32", "'NaN' is not an integer"),
    ("", "uint8", "missing value"),
    (None, "uint8", "missing value"),
    (True, "uint8", "True is a boolean, not an integer"),
    ("0x10", "uint8", "'0x10' is not an integer"),
    ("18446744073709551616", "uint64", "'18446744073709551616' is out of range for uint64 "
                                       "[0, 18446744073709551615]"),
    ("abc", "float64", "'abc' is not a number"),
    ("inf", "float64", "'inf' is not a finite number"),
    ("-Infinity", "float64", "'-Infinity' is not a finite number"),
    ("1e400", "float64", "'1e400' is out of range for float64"),
    ("1e39", "float32", "'1e39' is out of range for float32"),
    (1.5, "uint8", "1.5 is not an integer"),
    (256, "uint8", "256 is out of range for uint8 [0, 255]"),
    (float("inf"), "float64", "inf is not a finite number"),
    ([1], "float64", "[1] (list) is not a number"),
])
def test_invalid_report_values_and_why(text, dtype, expected):
    value, why = report_value(text, np.dtype(dtype))
    assert value is None and why.startswith(expected)


@pytest.mark.parametrize("text, dtype, expected", [
    ("3", "uint16", 3), ("3.0", "uint16", 3), ("1e3", "uint16", 1000), (" 7 ", "uint8", 7),
    ("+5", "int8", 5), ("-128", "int8", -128), ("65535", "uint16", 65535),
    ("18446744073709551615", "uint64", 2**64 - 1), ("-0", "uint8", 0),
    ("0.1", "float64", 0.1), (".5", "float64", 0.5), ("-2e-3", "float64", -0.002),
    (np.int64(4), "uint8", 4), (2.0, "uint8", 2),
])
def test_valid_report_values_keep_their_value(text, dtype, expected):
    value, why = report_value(text, np.dtype(dtype))
    assert why is None and value == expected


# --------------------------------------------------------------------------- every path agrees
NUMBERISH = st.one_of(
    st.integers(-(2**65), 2**65).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "x", "1.5", "3.0", "1e3", "+1", "-0", "0x10", "1_0", " 2 ", "nan",
                     "NaN", "inf", "-inf", "Infinity", "1e400", "1.", ".5", "007", "65536", "-1",
                     "255", "256", "127", "-128", "١", "1e-400", "2e2", "9" * 25]),
    st.text(alphabet="0123456789+-.eE x", max_size=8),
)


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=60, deadline=None, derandomize=True)
@given(texts=st.lists(NUMBERISH, max_size=12), valid_only=st.booleans())
def test_vectorized_paths_agree_with_the_reference(dtype, texts, valid_only):
    """Arrow text (with its pyarrow fast path for well-formed columns), numpy text and Python
    objects give exactly what report_value gives value by value."""
    dt = np.dtype(dtype)
    ref = [report_value(t, dt) for t in texts]
    if valid_only:  # so that the fast path (every value well formed) is exercised too
        texts = [t for t, (_, why) in zip(texts, ref) if why is None]
        ref = [r for r in ref if r[1] is None]
    for raw in (pa.array(texts, type=pa.string()), np.array(texts, dtype=object),
                np.array(texts, dtype=str) if texts else np.array([], dtype=str)):
        chk = check_report_field(raw, "f", dt)
        assert chk.values.dtype == dt
        assert chk.bad.tolist() == [why is not None for _, why in ref]
        for i, (val, why) in enumerate(ref):
            if why is None:
                assert chk.values[i] == val, (raw, i)
            else:
                assert chk.reasons[i] == f"report field 'f': {why}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_numeric_columns_are_checked_without_a_lossy_cast(dtype):
    dt = np.dtype(dtype)
    floats = np.array([0.0, 1.0, 1.5, np.nan, np.inf, 255.0, 256.0, -1.0, -128.0, 2.0**63,
                       2.0**64, 3.4e38, 1e300])
    ints = np.array([0, 1, 127, 128, 255, 256, 65535, 65536, -1, -129, 2**62], dtype=np.int64)
    big = np.array([2**64 - 1, 2**63], dtype=np.uint64)
    with np.errstate(over="ignore"):
        small = (ints.astype(np.int8), floats.astype(np.float32))  # wrapped on purpose
    for arr in (floats, ints, big, *small):
        ref = [report_value(None if isinstance(v, float) and np.isnan(v) else v, dt)
               for v in arr.tolist()]
        for raw in (arr, pa.array(arr)):
            chk = check_report_field(raw, "f", dt)
            assert chk.bad.tolist() == [why is not None for _, why in ref], (arr.dtype, raw)
            good = [(i, val) for i, (val, why) in enumerate(ref) if why is None]
            assert all(chk.values[i] == val for i, val in good)
    nullable = pa.array([1, None, 300], type=pa.int64())
    chk = check_report_field(nullable, "f", dt)
    assert chk.bad[1] and chk.reasons[1] == "report field 'f': missing value"


def test_report_columns_refuses_to_cast_what_it_would_change():
    fields = (("v", "uint16"),)
    good = pa.record_batch({"v": pa.array(["0", "2", "1.0"])})
    cols = report_columns(good, fields)
    assert cols["v"].dtype == np.uint16 and cols["v"].tolist() == [0, 2, 1]
    bad = pa.record_batch({"v": pa.array(["0", "x", "1.5", "65536"])})
    with pytest.raises(InvalidRecordsError, match="3 of 4 records are invalid: row 1: report "
                       "field 'v': 'x' is not an integer; row 2: .*'1.5' is not an integer; "
                       "row 3: .*'65536' is out of range for uint16"):
        report_columns(bad, fields)


# --------------------------------------------------------------------------- the Beam layer
BAD = {"x": "report field 'v': 'x' is not an integer",
       "1.5": "report field 'v': '1.5' is not an integer",
       "65536": "report field 'v': '65536' is out of range for uint16 [0, 65535]",
       "-1": "report field 'v': '-1' is out of range for uint16 [0, 65535]",
       "": "report field 'v': missing value",
       "3": "report field 'v': 3 is not a code in [0, 3)"}  # the estimator's check, after typing
ODD_BUT_VALID = ["2.0", " 1 ", "+0"]


@pytest.fixture
def csv_reports(tmp_path):
    """A CSV reports table of GRR over three labels: genuine reports, odd-but-valid texts and
    one bad text of each kind."""
    mech = build_mechanism("grr", epsilon=1.0, domain="a,b,c")
    rng = np.random.default_rng(8)
    genuine = mech.perturb(rng.choice(["a", "b", "c"], 500, p=[0.6, 0.3, 0.1]), rng=9)["v"]
    texts = [str(v) for v in genuine.tolist()]
    rows = texts[:200] + list(BAD) + texts[200:] + ODD_BUT_VALID
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["v", "g"])
        w.writerows([t, f"k{i % 2}"] for i, t in enumerate(rows))
    valid = np.concatenate([genuine, np.array([2, 1, 0], dtype=np.uint16)])
    return mech, path, valid


def _expected_reason(text, got):
    return got == BAD[text]


def test_validate_reports_dead_letters_bad_text_and_estimates_the_rest(csv_reports):
    mech, path, valid = csv_reports
    est = estimator_for(mech)
    base = f"/tmp/ldp-reports-{uuid.uuid4().hex}"
    est_sink, dead_sink, rows_sink = Sink(base + "/e"), Sink(base + "/d"), Sink(base + "/n")
    p = beam.Pipeline(options=PipelineOptions(["--runner=DirectRunner"]))
    rd = p | ReadTable(str(path), batch_rows=128)
    checked = rd.batches | ValidateReports(est)
    checked.reports | beam.Map(lambda b: (b.num_rows, str(b.schema.field("v").type))) \
        | beam.Map(rows_sink)
    checked.reports | EstimateGlobally(est) | beam.Map(lambda e: e.to_dict()) | beam.Map(est_sink)
    checked.dead_letter | beam.Map(dead_sink)
    p.run().wait_until_finish()
    dead = dead_sink.items()
    assert sorted(d["record"]["v"] or "" for d in dead) == sorted(BAD)
    for d in dead:
        text = d["record"]["v"] or ""
        assert _expected_reason(text, d["reason"]), d
        assert d["source"] == str(path) and d["row"] == 200 + list(BAD).index(text)
    sizes = rows_sink.items()
    assert {t for _, t in sizes} == {"uint16"}  # typed before it reaches the estimator
    assert sum(n for n, _ in sizes) == valid.size
    (got,) = est_sink.items()
    assert got == est.estimate({"v": valid}).to_dict()


def test_single_reports_are_validated_and_typed():
    mech = build_mechanism("grr", epsilon=1.0, domain="a,b,c")
    fn = ValidateReportsFn(estimator_for(mech))
    out = list(fn.process({"v": "2", "device": "d1"}))
    assert out == [{"v": 2, "device": "d1"}] and isinstance(out[0]["v"], int)
    (d,) = list(fn.process({"v": "65536", "device": "d2"}))
    assert d["reason"] == BAD["65536"] and d["record"] == {"v": "65536", "device": "d2"}
    (d,) = list(fn.process({"v": 1.5}))
    assert d["reason"] == "report field 'v': 1.5 is not an integer"
    (d,) = list(fn.process({"v": [1, 2], "device": "d3"}))  # one record, a list where a code is
    assert d["reason"] == "report field 'v': [1, 2] (list) is not an integer"


def test_a_long_text_in_a_bad_report_is_cut_and_the_reason_says_so():
    mech = build_mechanism("grr", epsilon=1.0, domain="a,b,c")
    fn = ValidateReportsFn(estimator_for(mech))
    (d,) = list(fn.process(pa.record_batch({"v": pa.array(["y" * 10_000])})))
    assert len(d["record"]["v"]) == 2000
    assert d["reason"].endswith("(field 'v' shows the first 2,000 of 10,000 characters)")
    assert "'yyyy" in d["reason"] and len(d["reason"]) < 300


# --------------------------------------------------------------------------- end to end
def _check_run(out, dead_path, est, valid):
    dead = read_jsonl(dead_path)
    assert sorted(d["record"]["v"] or "" for d in dead) == sorted(BAD)
    assert all(_expected_reason(d["record"]["v"] or "", d["reason"]) for d in dead)
    expected = json.loads(json.dumps(est.estimate({"v": valid}).to_dict()))
    # the statistics are post-processing of the valid reports: exactly the Python API's (the
    # guarantee is the run's, which the pipeline words for the run)
    assert out["estimate"]["n_reports"] == expected["n_reports"] == valid.size
    assert out["estimate"]["statistics"] == expected["statistics"]
    rep = out["reports"]
    assert rep["valid"] == valid.size and rep["invalid"] == len(BAD)
    assert rep["read"] == valid.size + len(BAD) and rep["reconciles"]


def test_ldp_beam_estimate_on_csv_reports(csv_reports, tmp_path):
    mech, path, valid = csv_reports
    out_path = tmp_path / "e.json"
    # CSV reports have no collect manifest: estimated only when told to (issue 23)
    code, so, se = run_cli("estimate", "-i", str(path), "-o", str(out_path), "-m", "grr",
                           "--epsilon", "1", "-p", "domain=a,b,c", "--unverified")
    assert code == 0, se
    _check_run(json.loads(out_path.read_text()), str(out_path) + ".deadletter.jsonl",
               estimator_for(mech), valid)


def test_run_estimate_python_api_on_csv_reports(csv_reports, tmp_path):
    from ldp_beam.pipelines.estimate import run_estimate

    mech, path, valid = csv_reports
    out_path = tmp_path / "e.json"
    out = run_estimate(str(path), str(out_path), mech, unverified=True)  # CSV: no manifest
    _check_run(out, str(out_path) + ".deadletter.jsonl", estimator_for(mech), valid)


def test_parquet_reports_of_the_wrong_width_are_checked_too(tmp_path):
    """A reports table written by another tool with int64/float64 columns: values that would
    wrap or truncate in the uint16 cast are dead-lettered, the rest estimated."""
    mech = build_mechanism("grr", epsilon=1.0, domain="a,b,c")
    est = estimator_for(mech)
    fn = ValidateReportsFn(est)
    table = pa.record_batch({"v": pa.array([0.0, 1.0, 65536.0 + 1, 2.5, float("nan"), 2.0])})
    out = list(fn.process(table))
    dead = [o for o in out if isinstance(o, dict)]
    (kept,) = [o for o in out if not isinstance(o, dict)]
    assert kept.column("v").to_pylist() == [0, 1, 2] and kept.schema.field("v").type == pa.uint16()
    assert [d["reason"] for d in dead] == [
        "report field 'v': 65537.0 is out of range for uint16 [0, 65535]",
        "report field 'v': 2.5 is not an integer", "report field 'v': missing value"]
    pq.write_table(pa.table({"v": pa.array([0, 1, 70000, -2, 2], type=pa.int64())}),
                   tmp_path / "r.parquet")
    with pytest.raises(InvalidRecordsError, match="out of range for uint16"):
        report_columns(pq.read_table(tmp_path / "r.parquet"), mech.report_fields)
