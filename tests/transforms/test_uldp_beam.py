"""The joint family through the Beam layer and the CLI: two-column tables, dead letters for
categories outside the declared domains, seeded determinism, telemetry records, estimates."""
from __future__ import annotations

import json
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from scipy.stats import norm

from ldp_beam import build_mechanism, estimator_for
from ldp_beam.rng import stream_id
from ldp_beam.transforms import EstimateGlobally, Perturb, ReadTable
from ldp_beam_test_helpers import Sink, core_reports, read_jsonl, run_cli

XD = ("usual", "pretentious", "great_pret")
YD = ("not_recom", "recommend", "very_recom", "priority", "spec_prior")
PARAMS = ["-p", "x_domain=" + ",".join(XD), "-p", "y_domain=" + ",".join(YD),
          "-p", "x_sensitive=usual,pretentious", "-p", "y_sensitive=not_recom,recommend"]
TRUE = np.array([[0.10, 0.02, 0.03, 0.12, 0.06],
                 [0.05, 0.01, 0.04, 0.10, 0.09],
                 [0.03, 0.01, 0.02, 0.08, 0.24]])
TRUE = TRUE / TRUE.sum()


@pytest.fixture
def joint_table(tmp_path):
    """20,000 rows drawn from TRUE, plus three bad rows (unknown x, unknown y, missing y)."""
    rng = np.random.default_rng(21)
    n = 20_000
    cells = rng.choice(TRUE.size, size=n, p=TRUE.ravel())
    x = np.array(XD, dtype=object)[cells // 5]
    y = np.array(YD, dtype=object)[cells % 5]
    x[:3] = ["nobody", "usual", "usual"]
    y[:3] = ["priority", "great", None]
    t = pa.table({"uid": np.arange(n), "parents": x, "cls": y})
    path = tmp_path / "nursery.parquet"
    pq.write_table(t, path, row_group_size=5000)
    return path, t


def test_cli_collect_and_estimate_two_columns(joint_table, tmp_path):
    path, t = joint_table
    rep = tmp_path / "r.parquet"
    code, so, se = run_cli("collect", "-i", str(path), "-c", "parents", "-c", "cls",
                           "-m", "cprr", "--epsilon", "3", *PARAMS, "-o", str(rep))
    assert code == 0, se
    man = json.load(open(str(rep) + ".manifest.json"))
    assert man["records"] == {"input": 20_000, "reported": 19_997, "dead_lettered": 3,
                              "unreadable_rows": 0, "unreadable_parts": 0,
                              "unreadable_rows_unknown": False, "reconciles": True,
                              "counted_from": "data"}
    assert man["columns"] == {"x": "parents", "y": "cls"}
    dead = read_jsonl(str(rep) + ".deadletter.jsonl")
    reasons = sorted(d["reason"] for d in dead)
    assert any("x: 'nobody' is not in the declared domain" in r for r in reasons)
    assert any("y: 'great' is not in the declared domain" in r for r in reasons)
    assert any("y: missing value" in r for r in reasons)
    assert pq.read_schema(rep).field("x").type == pa.uint16()

    out = tmp_path / "e.json"
    code, so, se = run_cli("estimate", "-i", str(rep), "-o", str(out))
    assert code == 0, se
    assert "joint (consistent estimate; rows x, columns y)" in so and "great_pret" in so
    est = json.load(open(out))["estimate"]
    assert est["n_reports"] == 19_997 and est["guarantee"]["kind"] == "ULDP"
    joint = est["statistics"]["joint"]
    f, s = np.array(joint["value"]), np.array(joint["stderr"])
    z = norm.ppf(1 - 0.001 / (2 * f.size))
    # the 19,997 valid rows are a sample of TRUE: sampling error adds to the estimator's
    emp = np.zeros(TRUE.size)
    ok = ~np.isin(np.arange(20_000), [0, 1, 2])
    np.add.at(emp, np.array([XD.index(a) * 5 + YD.index(b) for a, b in
                             zip(t["parents"].to_pylist()[3:], t["cls"].to_pylist()[3:])]), 1)
    emp = (emp / ok.sum()).reshape(TRUE.shape)
    assert np.all(np.abs(f - emp) <= z * s)


def test_cli_column_count_is_checked(joint_table, tmp_path):
    path, _ = joint_table
    code, _, se = run_cli("collect", "-i", str(path), "-c", "parents", "-c", "cls", "-c", "uid",
                          "-m", "cprr", "--epsilon", "3", *PARAMS, "-o", str(tmp_path / "r"))
    assert code == 2 and "--column given 3 times but cprr has 2 required role(s)" in se
    code, _, se = run_cli("collect", "-i", str(path), "-c", "parents", "-m", "cprr",
                          "--epsilon", "3", *PARAMS, "-o", str(tmp_path / "r"))
    assert code == 2 and "needs a column for role 'y'" in se


def test_cli_rejects_jurr_in_its_invalid_region(joint_table, tmp_path):
    path, _ = joint_table
    code, _, se = run_cli("collect", "-i", str(path), "-c", "parents", "-c", "cls", "-m", "jurr",
                          "--epsilon", "0.5", *PARAMS, "-o", str(tmp_path / "r"))
    assert code == 2 and "sx * sy < (e^epsilon - 1)^2" in se


def test_cli_rejects_sensitive_labels_outside_the_domain(joint_table, tmp_path):
    path, _ = joint_table
    bad = PARAMS[:-1] + ["y_sensitive=not_recom,awful"]
    code, _, se = run_cli("collect", "-i", str(path), "-c", "parents", "-c", "cls", "-m", "cprr",
                          "--epsilon", "1", *bad, "-o", str(tmp_path / "r"))
    assert code == 2 and "'y_sensitive'" in se and "awful" in se


@pytest.mark.parametrize("name", ["jurr", "tdrr", "jd-grr"])
def test_seeded_beam_reports_equal_the_core(joint_table, tmp_path, name):
    path, t = joint_table
    kw = dict(epsilon=2.0, x_domain=XD, y_domain=YD)
    if name != "jd-grr":
        kw.update(x_sensitive=XD[:2], y_sensitive=YD[:2])
    mech = build_mechanism(name, **kw)
    sink = Sink(tmp_path / "s")
    p = TestPipeline()
    rd = p | ReadTable(str(path), batch_rows=3000)
    out = rd.batches | Perturb(mech, columns={"x": "parents", "y": "cls"}, keep=("uid",), seed=5)
    out.reports | beam.Map(lambda b: sink(b.to_pydict()))
    p.run().wait_until_finish()
    cols: dict = {}
    for d in sink.items():
        for k, v in d.items():
            cols.setdefault(k, []).extend(v)
    order = np.argsort(cols["uid"])
    cols = {k: np.asarray(v)[order] for k, v in cols.items()}
    core = core_reports(mech, {"x": t["parents"].to_numpy(zero_copy_only=False),
                               "y": t["cls"].to_numpy(zero_copy_only=False)},
                        5, stream_id("nursery.parquet"))
    np.testing.assert_array_equal(core["x"], cols["x"])
    np.testing.assert_array_equal(core["y"], cols["y"])


def test_telemetry_records_element_path(tmp_path):
    """Single dict records (telemetry) with labels, a bad one dead-lettered, estimated globally."""
    mech = build_mechanism("cprr", epsilon=4.0, x_domain=XD, y_domain=YD,
                           x_sensitive=XD[:1], y_sensitive=YD[:1])
    rng = np.random.default_rng(2)
    cells = rng.choice(TRUE.size, size=3000, p=TRUE.ravel())
    records = [{"x": XD[c // 5], "y": YD[c % 5], "rid": i} for i, c in enumerate(cells)]
    records.append({"x": "usual", "y": 7, "rid": -1})
    est_sink, dead_sink = Sink(tmp_path / "e"), Sink(tmp_path / "d")
    p = TestPipeline()
    out = p | beam.Create(records) | Perturb(mech, key_column="rid")  # a record id keys the noise
    out.reports | EstimateGlobally(estimator_for(mech)) | beam.Map(est_sink)
    out.dead_letter | beam.Map(dead_sink)
    p.run().wait_until_finish()
    (est,) = est_sink.items()
    (dead,) = dead_sink.items()
    assert "y: 7 is not in the declared domain" in dead["reason"]
    assert est.n_reports == 3000
    f, s = est["joint"].value, est["joint"].stderr
    emp = np.bincount(cells, minlength=TRUE.size).reshape(TRUE.shape) / 3000
    assert np.all(np.abs(f - emp) <= norm.ppf(1 - 0.001 / 30) * s)
    assert math.isclose(est["joint"].clipped.sum(), 1.0)
