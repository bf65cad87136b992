"""Histogram releases carry their bucket edges (issue 26): the released Estimate's ``params``
hold ``bucket_edges``, so the JSON (``to_dict``), ``to_frame`` (a bucket's cell is its interval)
and what ``ldp-beam estimate`` prints all show them, not only the tidy table."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam import build_mechanism, estimator_for
from ldp_beam.pipelines.cli import bucket_table_text
from ldp_beam_test_helpers import run_cli

RELEASES = {"dphr": {}, "laplace-histogram": {}, "ahp": {},
            "structure-first": {"k": 3, "F": 1000}}


def _release(name: str, **params):
    mech = build_mechanism(name, epsilon=1.0, **RELEASES[name], **params)
    g = np.random.default_rng(4)
    values = (g.choice(np.array(mech.categories, dtype=object), 2000) if mech.categories
              else g.uniform(mech.lower, mech.upper, 2000))
    est = estimator_for(mech, seed=9)
    return est.finalize(est.add(est.create(), mech.records(values)))


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_every_histogram_release_carries_its_edges_on_every_surface(name):
    est = _release(name, bins=12, lower=-3.0, upper=7.0)
    edges = tuple(np.linspace(-3.0, 7.0, 13).tolist())
    assert est.params["bucket_edges"] == edges
    assert edges[0] == -3.0 and edges[-1] == 7.0
    # the JSON
    d = json.loads(json.dumps(est.to_dict()))
    assert d["params"]["bucket_edges"] == list(edges)
    # the frame: every cell of histogram and groups is its bucket, [low, high), the last closed
    f = est.to_frame()
    for stat in ("histogram", "groups") if "groups" in est.statistics else ("histogram",):
        cells = f[f["statistic"] == stat]["cell"].tolist()
        assert all(isinstance(c, pd.Interval) for c in cells)
        assert [(c.left, c.right) for c in cells] == list(zip(edges[:-1], edges[1:]))
        assert [c.closed for c in cells] == ["left"] * 11 + ["both"]
    assert edges[11] not in f["cell"].iloc[10] and edges[11] in f["cell"].iloc[11]
    assert edges[12] in f["cell"].iloc[11]  # upper is in the last bucket
    # the console
    text = bucket_table_text(d)
    assert text.splitlines()[2].startswith("[-3, -2.16667)")
    assert text.splitlines()[-1].startswith("[6.16667, 7]")


def test_a_categorical_histogram_and_given_counts_carry_no_edges():
    cat = _release("dphr", categories="a,b,c")
    assert "bucket_edges" not in cat.params
    assert cat.to_frame().query("statistic == 'histogram'")["cell"].tolist() == ["a", "b", "c"]
    assert bucket_table_text(cat.to_dict()).splitlines()[2].startswith("a ")
    mech = build_mechanism("laplace-histogram", epsilon=1.0, bins=4, lower=0.0, upper=1.0)
    assert mech.release_counts([5, 6, 7, 8], rng=1).params["bucket_edges"] == \
        (0.0, 0.25, 0.5, 0.75, 1.0)
    # counts that are not the declared buckets: no edges of buckets they do not have
    assert "bucket_edges" not in mech.release_counts([5, 6, 7], rng=1).params
    bare = build_mechanism("laplace-histogram", epsilon=1.0)  # bins=0: counts only
    assert "bucket_edges" not in bare.release_counts([5, 6, 7], rng=1).params


def test_estimate_prints_the_buckets_with_their_edges(tmp_path):
    g = np.random.default_rng(5)
    pq.write_table(pa.table({"x": g.uniform(0, 2, 3000)}), tmp_path / "raw.parquet")
    code, out, err = run_cli("estimate", "-i", str(tmp_path / "raw.parquet"), "-c", "x",
                             "-m", "dphr", "--epsilon", "1", "-p", "bins=4", "-p", "lower=0",
                             "-p", "upper=2", "-o", str(tmp_path / "h.json"))
    assert code == 0, err
    lines = out.splitlines()
    k = lines.index("histogram by bucket:")
    assert [" ".join(ln.split()[:2]) for ln in lines[k + 2:k + 6]] == \
        ["[0, 0.5)", "[0.5, 1)", "[1, 1.5)", "[1.5, 2]"]
    saved = json.loads((tmp_path / "h.json").read_text())["estimate"]
    assert saved["params"]["bucket_edges"] == [0.0, 0.5, 1.0, 1.5, 2.0]
    values = saved["statistics"]["histogram"]["value"]
    from ldp_beam.pipelines.cli import number_text

    assert [ln.split()[2] for ln in lines[k + 2:k + 6]] == [number_text(v) for v in values]


def test_long_histograms_print_their_first_buckets_and_say_how_many_more():
    est = _release("laplace-histogram", bins=40, lower=0.0, upper=40.0).to_dict()
    lines = bucket_table_text(est, limit=5).splitlines()
    assert lines[-1] == "... and 35 more bucket(s) in the output"
    assert [ln.split(",")[0] for ln in lines[2:7]] == ["[0", "[1", "[2", "[3", "[4"]
