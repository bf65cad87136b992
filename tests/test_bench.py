"""`ldp-beam bench` writes JSON records with the documented fields (no timing assertions:
speed targets are measured by the benchmark itself, never by unit tests)."""
import json

from ldp_beam_test_helpers import run_cli

from ldp_beam.evaluation import bench


def test_bench_core_records_have_the_documented_fields(monkeypatch):
    monkeypatch.setattr(bench, "PROFILES", {k: v for k, v in bench.PROFILES.items()
                                            if k in ("bisample-md", "pm")})
    recs = bench.run(quick=True, progress=bench.Progress("bench", enabled=False))
    stages = {r["stage"] for r in recs}
    assert stages == {"reference", "perturb", "accumulate", "estimate", "noise"}
    for r in recs:
        for key in ("experiment", "dataset", "method", "epsilon", "metric", "value", "stage",
                    "rows", "seconds", "rows_per_second"):
            assert key in r, (key, r)
        assert r["seconds"] > 0 and r["rows"] > 0
    perturb = [r for r in recs if r["metric"] == "perturbed rows/s"]
    assert {r["method"] for r in perturb} == {"bisample-md", "pm"}
    assert all(r["fraction_of_uniform_rate"] > 0 for r in perturb)


def test_bench_cli_writes_json(tmp_path):
    out = tmp_path / "b.json"
    code, _, err = run_cli("bench", "--quick", "--only", "harmony", "--no-pipeline",
                           "--json", str(out))
    assert code == 0, err
    recs = json.loads(out.read_text())
    assert {r["method"] for r in recs if r["stage"] != "reference"} == {"harmony"}
