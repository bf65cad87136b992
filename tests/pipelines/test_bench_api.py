"""The bench's README-style API section (issue 25): the pipeline a user writes from the README,
built by hand in fresh processes, against the plain-Beam reference built the same way, with and
without the Beam speedups opt-in. Run at a tiny size: the records and their ratios exist; no
timing is asserted (speed is measured by `ldp-beam bench` only)."""
from __future__ import annotations

import os
import re

import apache_beam as beam
import pytest

from ldp_beam.pipelines import bench
from ldp_beam.transforms import beam_speed

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


@pytest.fixture(scope="module")
def records():
    return bench.run(quick=True, only=["api-readme", "grr"], sizes=(2_000,))


def test_section_yields_both_ratios(records):
    recs = [r for r in records if r.get("by_hand")]
    assert {r["mode"] for r in recs} == {"readme", "readme+speedups"}
    assert len(recs) == 2 and {r["method"] for r in recs} == {"grr"}
    for r in recs:
        assert r["path"] == "api" and r["rows"] == 2_000 and r["runner"] == "DirectRunner"
        assert r["ratio_to_reference"] == pytest.approx(r["reference_seconds"] / r["seconds"])
        assert r["ratio_to_reference"] > 0 and r["target"] == bench.TARGETS["api"]
        assert r["meets_target"] == (r["ratio_to_reference"] >= r["target"])
        assert r["statistic"] == "median" and r["rounds"] == 1
        assert len(r["seconds_runs"]) == len(r["reference_seconds_runs"]) == 1
        assert r["speedups"] is r["reference_speedups"] is (r["mode"] == "readme+speedups")
        assert r["paired_ratio"] == pytest.approx(
            r["reference_seconds_runs"][0] / r["seconds_runs"][0])
        assert r["cpu_ratio_to_reference"] == pytest.approx(
            r["reference_cpu_seconds"] / r["cpu_seconds"]) and r["cpu_seconds"] > 0
    plain = next(r for r in recs if not r["speedups"])
    fast = next(r for r in recs if r["speedups"])
    assert "ratio_to_unpatched_reference" not in plain
    assert fast["speedups_installed"] is beam.__version__.startswith(beam_speed.VERIFIED_BEAM)
    assert fast["unpatched_reference_seconds"] == plain["reference_seconds"]
    assert fast["ratio_to_unpatched_reference"] == pytest.approx(
        plain["reference_seconds"] / fast["seconds"])
    # only that part of the api section ran
    assert all(r.get("by_hand") for r in records if r.get("path") == "api")


def test_the_readme_table_lists_them(records):
    table = bench.readme_table(records)
    assert "| api | grr | readme | " in table and "| api | grr | readme+speedups | " in table


def test_child_builds_the_readme_pipeline():
    """The by-hand pipeline is the README's: the same calls, in the same kind of `with` block."""
    with open(README, encoding="utf-8") as fh:
        readme = fh.read()
    for call in ('with beam.Pipeline(runner="DirectRunner") as p:',
                 "| EstimateGlobally(estimator_for(mech))", "out.dead_letter | beam.Map(print)",
                 "Perturb(mech, columns=", "ReadTable"):
        assert call in readme, call
        assert call in bench._CHILD, call
    assert re.search(r"def by_hand\(cfg\):.*beam_speed\.install\(\)", bench._CHILD, re.S)


def test_selection(monkeypatch):
    """``api`` runs the README part too; ``api-readme`` runs only it; mechanisms filter it."""
    calls = []
    monkeypatch.setattr(bench, "_warm_bytecode", lambda env: None)
    monkeypatch.setattr(bench, "_api", lambda b, sizes, mechs: calls.append(("api", mechs)) or [])
    monkeypatch.setattr(bench, "_api_readme", lambda b, sizes, mechs, rounds:
                        calls.append(("readme", mechs, rounds)) or [])
    bench.run(only=["api"], sizes=(10,))
    assert calls == [("api", None), ("readme", None, bench.README_ROUNDS)]
    calls.clear()
    bench.run(only=["api-readme", "bisample-md"], sizes=(10,), quick=True)
    assert calls == [("readme", {"bisample-md"}, 1)]


def test_no_readme_case_no_runs():
    """A mechanism filter without a README case times nothing."""
    class NoChild(bench._Bench):
        def __init__(self):
            pass

        def child(self, cfg):
            raise AssertionError("nothing should run")

    assert bench._api_readme(NoChild(), (10,), {"cprr"}) == []

