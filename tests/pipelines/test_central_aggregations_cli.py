"""The central-DP aggregations through `ldp-beam estimate` on the DirectRunner: per key with
contribution bounding and partition selection or public keys, and globally; what is published,
what stays with the curator, the dead letters, and seeded reproducibility."""
from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam_test_helpers import run_cli

REGIONS = ("north", "south", "east")
BAD = [150.0, -5.0, None, float("inf")]  # one-row units: always kept by the bounding


def _rows(path):
    """1500 users with 4 rows each over three regions, values uniform on [0, 100]; a key held
    by one person only ("solo"); four one-row users with values outside the domain or none."""
    rng = np.random.default_rng(5)
    users = np.repeat(np.arange(1500), 4)
    region = rng.choice(np.array(REGIONS, dtype=object), users.size)
    values = list(rng.uniform(0.0, 100.0, users.size))
    users = [f"u{u}" for u in users] + ["solo-person"] * 3 + [f"bad{i}" for i in range(4)]
    region = list(region) + ["solo"] * 3 + ["north"] * 4
    values += [50.0] * 3 + BAD
    pq.write_table(pa.table({"user": users, "region": region,
                             "value": pa.array(values, pa.float64())}), path)
    return path


@pytest.fixture
def rows(tmp_path):
    return str(_rows(tmp_path / "rows.parquet"))


def _dead(path):
    with open(path + ".deadletter.jsonl") as fh:
        return [json.loads(line) for line in fh]


def test_per_key_mean_with_partition_selection(rows, tmp_path):
    out = str(tmp_path / "mean.json")
    code, _, se = run_cli("estimate", "-i", rows, "-o", out, "-m", "central-mean", "-c", "value",
                          "--by", "region", "--privacy-unit", "user", "-p", "epsilon=1",
                          "-p", "lower=0", "-p", "upper=100", "-p", "max_partitions_per_unit=2",
                          "-p", "max_rows_per_partition=3", "--partition-selection", "1,1e-6")
    assert code == 0, se
    text = open(out).read()
    pub = json.loads(text)
    assert sorted(pub["estimates"]) == sorted(REGIONS)  # "solo": one person, not released
    g = pub["guarantee"]
    assert g["epsilon"] == 2.0 and g["delta"] == 1e-6 and "per privacy unit 'user'" in g["summary"]
    assert "epsilon/2" in g["notes"] and "never clipped" in g["notes"]
    assert g["params"]["contribution_bounds"] == {"max_partitions_per_unit": 2,
                                                  "max_rows_per_partition": 3}
    cur = json.loads(open(out + ".curator.json").read())
    assert cur["records"]["reconciles"]
    for key, est in pub["estimates"].items():
        assert "n_reports" not in est and "curator" not in est
        mean = est["statistics"]["mean"]
        exact = cur["releases"][key]
        assert 0 <= mean["clipped"] <= 100
        assert abs(mean["value"] - exact["mean"]) < 6 * mean["stderr"], (key, mean, exact)
        # the exact numbers are the curator's only
        assert repr(exact["mean"]) not in text and repr(exact["normalized_sum"]) not in text
    dead = _dead(out)
    assert len(dead) == 4 and cur["records"]["dead_lettered"] == 4
    reasons = sorted(d["reason"] for d in dead)
    assert sum("outside the declared domain [lower, upper] = [0, 100]" in r and
               "not clipped" in r for r in reasons) == 3
    assert sum(r.startswith("value: missing value") for r in reasons) == 1


def test_global_privacy_id_count_and_sum(rows, tmp_path):
    out = str(tmp_path / "pid.json")
    code, so, se = run_cli("estimate", "-i", rows, "-o", out, "-m", "privacy-id-count",
                           "-c", "value", "--privacy-unit", "user", "-p", "epsilon=1")
    assert code == 0, se
    est = json.loads(open(out).read())["estimate"]
    st = est["statistics"]["privacy_id_count"]
    assert abs(st["value"] - 1505) < 6 * st["stderr"]  # the distinct units (bad rows counted)
    assert "n_reports" not in est or est["n_reports"] is None
    cur = json.loads(open(out + ".curator.json").read())
    assert cur["release"]["privacy_id_count"] == 1505 and cur["records"]["dead_lettered"] == 0
    # a sum per unit: each unit keeps at most Linf = 2 rows
    out = str(tmp_path / "sum.json")
    code, so, se = run_cli("estimate", "-i", rows, "-o", out, "-m", "central-sum", "-c", "value",
                           "--privacy-unit", "user", "-p", "epsilon=1", "-p", "lower=0",
                           "-p", "upper=100", "-p", "max_rows_per_partition=2")
    assert code == 0, se
    pub = json.loads(open(out).read())
    st = pub["estimate"]["statistics"]["sum"]
    exact = json.loads(open(out + ".curator.json").read())["release"]
    assert exact["rows"] == 1500 * 2 + 2  # 2 rows a user (solo-person's too); bad rows out
    assert abs(st["value"] - exact["sum"]) < 6 * st["stderr"]
    assert st["stderr"] == pytest.approx(math.sqrt(2) * 2 * 100 / 1.0, rel=1e-3)
    assert pub["guarantee"]["params"]["grid"]["sum"]["grid"] == 2.0 ** (7 - 40)
    assert len(_dead(out)) == 4


def test_public_keys_seeded_reproducible_and_absent_keys(rows, tmp_path):
    def run(name, *params, tag):
        out = str(tmp_path / f"{name}-{tag}.json")
        code, _, se = run_cli("estimate", "-i", rows, "-o", out, "-m", name, "-c", "value",
                              "--by", "region", "--privacy-unit", "user", "--keys",
                              "north,south,west", "--seed", "123", "-p", "epsilon=1", *params)
        assert code == 0, se
        return json.loads(open(out).read())

    q = ("-p", "lower=0", "-p", "upper=100", "-p", "quantiles=0.25,0.5,0.75",
         "-p", "branching=4", "-p", "height=4", "-p", "max_rows_per_partition=2")
    a, b = run("central-quantiles", *q, tag="a"), run("central-quantiles", *q, tag="b")
    assert a["estimates"] == b["estimates"]  # the same seed: the same release (retry-proof)
    assert sorted(a["estimates"]) == ["north", "south", "west"]  # west: absent, released empty
    qs = {k: v["statistics"]["quantiles"]["value"] for k, v in a["estimates"].items()}
    for key in ("north", "south"):
        assert np.allclose(qs[key], [25, 50, 75], atol=5), qs
        assert qs[key] == sorted(qs[key])
    assert qs["north"] != qs["south"]
    g = a["guarantee"]  # seeded: not private, and says what it would be unseeded
    assert g["epsilon"] is None and g["unseeded"]["epsilon"] == 1.0 and g["unseeded"]["delta"] == 0
    v = run("central-variance", "-p", "lower=0", "-p", "upper=100", tag="v")
    for key in ("north", "south"):
        var = v["estimates"][key]["statistics"]["variance"]
        assert abs(var["value"] - 100 ** 2 / 12) < 6 * var["stderr"] + 60  # + sampling spread
        assert 0 <= var["clipped"] <= 50 ** 2
    # west is absent: its noisy empty release has intervals wider than the declared domain, so
    # it is published as suppressed (issue 26), named with its reason, not as numbers
    assert list(v["suppressed"]) == ["west"] and "declared domain" in v["suppressed"]["west"]
    assert v["estimates"]["west"] == {"suppressed": v["suppressed"]["west"]}


def test_parameter_errors_exit_2(rows, tmp_path):
    code, _, se = run_cli("estimate", "-i", rows, "-o", str(tmp_path / "x.json"),
                          "-m", "privacy-id-count", "-c", "value", "--privacy-unit", "user",
                          "-p", "epsilon=1", "-p", "max_rows_per_partition=3")
    assert code == 2 and "max_rows_per_partition" in se
    code, _, se = run_cli("estimate", "-i", rows, "-o", str(tmp_path / "y.json"),
                          "-m", "central-mean", "-c", "value", "-p", "epsilon=1")
    assert code == 2 and "lower" in se
