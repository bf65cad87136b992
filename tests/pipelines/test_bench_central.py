"""The bench's central section: ldp-beam's central aggregations against PipelineDP on the same
rows (small sizes here; the section's own numbers come from `ldp-beam bench`)."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from ldp_beam.pipelines import bench_central as B
from ldp_beam.pipelines.records import SectionFailed, check_records


def test_generated_rows_are_not_cut_by_the_bounding():
    d = B.make_rows(10_000, keys=6, l0=2, linf=3, seed=3)
    assert {len(v) for v in d.values()} == {10_000}
    users, keys = d["user"], d["key"]
    per_unit = {}
    for u, k in zip(users.tolist(), keys.tolist()):
        per_unit.setdefault(u, {}).setdefault(k, 0)
        per_unit[u][k] += 1
    full = [v for v in per_unit.values() if sum(v.values()) == 6]
    assert len(full) == len(per_unit) - 1 + (10_000 % 6 == 0)  # the last unit may be short
    assert all(len(v) == 2 and set(v.values()) == {3} for v in full)
    assert ((d["value"] >= 0) & (d["value"] <= 100)).all()
    t = B.truth(d, "privacy-id-count")
    assert sum(t.values()) == sum(len(v) for v in per_unit.values())


def test_without_pipeline_dp_the_section_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "pipeline_dp", None)  # `import pipeline_dp` fails
    assert B.pipeline_dp_version() is None
    with pytest.raises(SectionFailed, match="PipelineDP is not installed") as info:
        B.central_section(1000)
    assert info.value.records == []


def test_central_section_compares_time_and_accuracy(tmp_path):
    pytest.importorskip("pipeline_dp")
    out = B.central_section(3000, names=("central-mean",), keys=4, seed=11, tmp=str(tmp_path),
                            warmup=False)
    check_records(out["records"])  # JSON-ready bench records
    assert out["setup"]["partitions"] == "public" and out["setup"]["pipeline_dp_version"]
    c = out["comparison"]["central-mean"]
    for system in ("ldp-beam", "pipeline-dp"):
        assert c[system]["seconds"] > 0 and c[system]["keys_released"] == 4
        assert 0 <= c[system]["mean_abs_error"] < 5  # means in [0, 100] of ~750 rows a key
    assert c["ratio"] == pytest.approx(c["ldp-beam"]["seconds"] / c["pipeline-dp"]["seconds"])
    assert c["ldp-beam"]["mean_stated_stderr"] > 0
    methods = {r["method"] for r in out["records"]}
    assert methods == {"ldp-beam:central-mean", "pipeline-dp:central-mean", "central-mean"}
    assert np.isfinite([r["value"] for r in out["records"]]).all()
