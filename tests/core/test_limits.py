"""Size caps (issue 13): every size parameter is checked against a named cap before anything of
that size is allocated, the error names the parameter, the value, the cap and the environment
variable that raises it, the variable does raise it, and values at a cap still construct."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam import build_mechanism, estimator_for
from ldp_beam import limits
from ldp_beam.central.dphr import DPHR
from ldp_beam.central.histogram import IdentityLaplace
from ldp_beam.central.histogram_baselines import AHP, StructureFirst
from ldp_beam.errors import LdpBeamError, LimitError, ParameterError
from ldp_beam.estimators.density import BinnedDensity, DensityGrid, sample_density
from ldp_beam.limits import check_cap, check_groups
from ldp_beam.mechanisms.rvns import rvns_worst_case
from ldp_beam_test_helpers import run_cli

CELLS = 1 << 24  # the documented defaults
DEFAULTS = {"cells": CELLS, "grouping_buckets": 1 << 16, "groups": 100_000, "items": 256,
            "reports_per_user": 1000, "user_cells": 1 << 27}


@pytest.fixture(autouse=True)
def default_caps(monkeypatch):
    """Every test starts from the default caps, whatever the environment says."""
    for name in limits.CAPS:
        monkeypatch.delenv(limits.env_var(name), raising=False)


def labels(n: int) -> tuple[str, ...]:
    return tuple(str(i) for i in range(n))


def assert_limit(exc_info, param: str, cap: str, value: int | None = None) -> None:
    err = exc_info.value
    msg = str(err)
    assert isinstance(err, LimitError) and isinstance(err, ParameterError)
    assert param in err.name and repr(err.name) in msg, msg
    assert err.cap == cap and f"{cap!r}" in msg, msg
    assert limits.env_var(cap) in msg and err.env_var == limits.env_var(cap), msg
    assert f"{limits.cap(cap):,}" in msg, msg  # the cap in force
    if value is not None:
        assert err.value == value and f"{value:,}" in msg, msg


# --------------------------------------------------------------------------- the table
def test_the_caps_and_their_documented_environment_variables():
    assert {n: c.default for n, c in limits.CAPS.items()} == DEFAULTS
    assert limits.caps() == DEFAULTS
    for name in limits.CAPS:
        var = f"LDP_BEAM_MAX_{name.upper()}"
        assert limits.env_var(name) == var and var in limits.__doc__
        assert f"{DEFAULTS[name]:,}" in limits.__doc__


def test_check_cap_at_and_above_the_cap():
    assert check_cap("cells", CELLS, "bins") == CELLS  # at the cap: allowed
    assert check_cap("cells", np.int64(7), "bins") == 7 and isinstance(
        check_cap("cells", np.int64(7), "bins"), int)
    with pytest.raises(LimitError) as ei:
        check_cap("cells", CELLS + 1, "bins")
    assert_limit(ei, "bins", "cells", CELLS + 1)
    assert isinstance(ei.value, LdpBeamError) and isinstance(ei.value, ValueError)
    assert "LDP_BEAM_MAX_CELLS=16777217" in str(ei.value)  # how to raise it, to this value
    again = pickle.loads(pickle.dumps(ei.value))  # errors travel between Beam processes
    assert type(again) is LimitError and str(again) == str(ei.value)
    with pytest.raises(KeyError, match="no cap named 'bytes'"):
        check_cap("bytes", 1, "x")


@pytest.mark.parametrize("raw,value", [("20", 20), ("1_000_000", 1_000_000), ("1e6", 1_000_000),
                                       (" 5 ", 5)])
def test_the_environment_variable_sets_the_cap(monkeypatch, raw, value):
    monkeypatch.setenv("LDP_BEAM_MAX_GROUPS", raw)
    assert limits.cap("groups") == value
    check_cap("groups", value, "--by")
    with pytest.raises(LimitError) as ei:
        check_cap("groups", value + 1, "--by")
    assert_limit(ei, "--by", "groups", value + 1)


@pytest.mark.parametrize("raw", ["0", "-3", "lots", "1.5", "nan", "inf"])
def test_a_bad_environment_variable_is_a_clear_error(monkeypatch, raw):
    monkeypatch.setenv("LDP_BEAM_MAX_CELLS", raw)
    with pytest.raises(ParameterError) as ei:
        check_cap("cells", 1, "bins")
    assert ei.value.name == "LDP_BEAM_MAX_CELLS" and "a positive integer" in str(ei.value)


def test_check_groups_bounds_groups_and_their_accumulators():
    assert check_groups(100_000) == 100_000
    with pytest.raises(LimitError) as ei:
        check_groups(10 ** 6, 1, "--by")  # the 10^6-key column
    assert_limit(ei, "--by", "groups", 10 ** 6)
    # 5,000 groups of an RVNS accumulator (4,101 cells) hold 20.5M cells together
    with pytest.raises(LimitError) as ei:
        check_groups(5000, 4101, "--by")
    assert_limit(ei, "--by", "cells", 5000 * 4101)
    assert "5,000 groups x 4,101 accumulator cells" in str(ei.value)
    assert check_groups(4000, 4101) == 4000


# --------------------------------------------------------------------------- every cap fires
JOINT = ("cprr", "jd-grr", "jurr", "tdrr")


def _joint(name: str, x, y):
    kw = dict(epsilon=6.0, x_domain=x, y_domain=y)
    if name != "jd-grr":
        kw.update(x_sensitive=("0",), y_sensitive=("0",))
    return build_mechanism(name, **kw)


@pytest.mark.parametrize("name", JOINT)
@pytest.mark.parametrize("as_text", [False, True], ids=["tuple", "comma-text"])
def test_joint_product_domain_is_capped_before_labels_are_read(name, as_text):
    """The issue's CPRR with 15,000 labels per attribute (5.8 GB and 21 s to perturb 2 rows)."""
    x = labels(15_000)
    dom = ",".join(x) if as_text else x
    with pytest.raises(LimitError) as ei:
        _joint(name, dom, dom)
    assert_limit(ei, "x_domain x y_domain", "cells", 15_000 ** 2)
    assert "15,000 x 15,000 labels" in str(ei.value)


def test_values_at_the_cells_cap_construct_and_one_more_fails(monkeypatch):
    monkeypatch.setenv("LDP_BEAM_MAX_CELLS", "10000")
    m = _joint("cprr", labels(100), labels(100))  # 100 x 100 = the cap
    assert m.nx * m.ny == 10_000
    with pytest.raises(LimitError) as ei:
        _joint("cprr", labels(100), labels(101))
    assert_limit(ei, "x_domain x y_domain", "cells", 10_100)
    IdentityLaplace(1.0, bins=10_000, lower=0.0, upper=1.0)
    with pytest.raises(LimitError) as ei:
        IdentityLaplace(1.0, bins=10_001, lower=0.0, upper=1.0)
    assert_limit(ei, "bins", "cells", 10_001)
    with pytest.raises(LimitError):
        IdentityLaplace(1.0, categories=labels(10_001))
    rv = build_mechanism("rvns", lower=0.0, upper=1.0)
    est = estimator_for(rv, m=50, bins=200)  # EM: m x report_bins = 50 x 200 = the cap
    assert est.grid.m * est.report_bins == 10_000
    with pytest.raises(LimitError) as ei:
        estimator_for(rv, m=51, bins=200)
    assert_limit(ei, "m x report_bins", "cells", 51 * 200)


def test_the_environment_variable_raises_a_cap(monkeypatch):
    with pytest.raises(LimitError):
        IdentityLaplace(1.0, bins=10 ** 8, lower=0.0, upper=1.0)
    monkeypatch.setenv("LDP_BEAM_MAX_CELLS", str(10 ** 9))
    assert IdentityLaplace(1.0, bins=10 ** 8, lower=0.0, upper=1.0).n_buckets == 10 ** 8
    with pytest.raises(LimitError):
        DPHR(1.0, bins=100_000, lower=0.0, upper=1.0)
    monkeypatch.setenv("LDP_BEAM_MAX_GROUPING_BUCKETS", "100000")
    assert DPHR(1.0, bins=100_000, lower=0.0, upper=1.0).n_buckets == 100_000
    rv = build_mechanism("rvns", lower=25.0, upper=70.0)
    assert estimator_for(rv, m=100_000).grid.m == 100_000  # not built until a release


def test_histogram_buckets(monkeypatch):
    """`-p bins=100000000` (8 GB, then MemoryError) fails at once; the grouping releases, whose
    work is quadratic in the buckets, have a smaller cap; at the caps they construct."""
    for cls in (IdentityLaplace, DPHR, AHP):
        with pytest.raises(LimitError) as ei:
            cls(1.0, bins=10 ** 8, lower=0.0, upper=1.0)
        assert_limit(ei, "bins", cls.BUCKET_CAP, 10 ** 8)
    assert IdentityLaplace.BUCKET_CAP == "cells"
    assert DPHR.BUCKET_CAP == AHP.BUCKET_CAP == StructureFirst.BUCKET_CAP == "grouping_buckets"
    IdentityLaplace(1.0, bins=CELLS, lower=0.0, upper=1.0)
    DPHR(1.0, bins=1 << 16, lower=0.0, upper=1.0)
    AHP(1.0, bins=1 << 16, lower=0.0, upper=1.0)
    with pytest.raises(LimitError) as ei:
        DPHR(1.0, bins=(1 << 16) + 1, lower=0.0, upper=1.0)
    assert_limit(ei, "bins", "grouping_buckets", (1 << 16) + 1)
    # counts given straight to release_counts are checked too, before the O(n^2) grouping starts
    with pytest.raises(LimitError) as ei:
        DPHR(1.0).release_counts(np.zeros((1 << 16) + 1, dtype=np.int64), 1)
    assert_limit(ei, "counts", "grouping_buckets", (1 << 16) + 1)
    monkeypatch.setenv("LDP_BEAM_MAX_CELLS", "100")
    with pytest.raises(LimitError) as ei:
        IdentityLaplace(1.0).release_counts(np.zeros(101, dtype=np.int64), 1)
    assert_limit(ei, "counts", "cells", 101)
    assert IdentityLaplace(1.0).release_counts(np.zeros(100, dtype=np.int64), 1)["histogram"] \
        .value.size == 100


def test_structure_first_v_optimal_table(monkeypatch):
    # k x (bins + 1) cells: 4,096 groups over 65,536 buckets would be 268M cells
    with pytest.raises(LimitError) as ei:
        StructureFirst(1.0, bins=1 << 16, lower=0.0, upper=1.0, k=4096, F=10.0)
    assert_limit(ei, "k x bins", "cells", 4096 * ((1 << 16) + 1))
    StructureFirst(1.0, bins=1 << 16, lower=0.0, upper=1.0, k=255, F=10.0)  # 255 x 65,537
    monkeypatch.setenv("LDP_BEAM_MAX_CELLS", "100")
    with pytest.raises(LimitError):  # on counts given to release_counts
        StructureFirst(1.0, k=10, F=10.0).release_counts(np.ones(20, dtype=np.int64), 1)
    est = StructureFirst(1.0, k=5, F=10.0).release_counts(np.ones(19, dtype=np.int64), 1)  # 5 x 20
    assert est["histogram"].value.size == 19


def test_rvns_estimator_grid_and_matrices():
    """The issue's `--option m=100000` (EM: a 4,096 x 100,000 matrix, 3.3 GB)."""
    rv = build_mechanism("rvns", lower=0.0, upper=10.0)
    with pytest.raises(LimitError) as ei:
        estimator_for(rv, m=100_000)
    assert_limit(ei, "m x report_bins", "cells", 100_000 * 4096)
    with pytest.raises(LimitError) as ei:
        estimator_for(rv, m="100000")  # the command line's form
    assert_limit(ei, "m x report_bins", "cells")
    with pytest.raises(LimitError) as ei:
        estimator_for(rv, m=5000, method="paper")  # m x m
    assert_limit(ei, "m", "cells", 5000 * 5000)
    with pytest.raises(LimitError) as ei:
        estimator_for(rv, m=4096, method="paper", bins=8192)  # the KDE's kernel matrix
    assert_limit(ei, "m x bins", "cells", 4096 * 8192)
    with pytest.raises(LimitError) as ei:
        estimator_for(rv, bins=CELLS + 1)
    assert_limit(ei, "bins", "cells", CELLS + 1)
    est = estimator_for(rv, m=4096)  # at the cap: 4,096 x 4,096
    assert est.grid.m * est.report_bins == CELLS
    assert estimator_for(rv, m=4096, method="paper").grid.m == 4096


def test_density_grids_and_bins():
    with pytest.raises(LimitError) as ei:
        DensityGrid(0.0, 1.0, CELLS + 1)
    assert_limit(ei, "m", "cells", CELLS + 1)
    with pytest.raises(LimitError) as ei:
        BinnedDensity(0.0, 1.0, CELLS + 1)
    assert_limit(ei, "bins", "cells", CELLS + 1)
    assert BinnedDensity(0.0, 1.0, CELLS).bins == CELLS  # nothing allocated until create()
    grid = DensityGrid(0.0, 1.0, 4)
    with pytest.raises(LimitError) as ei:
        sample_density(grid, np.ones(4), CELLS + 1, np.random.default_rng(1))
    assert_limit(ei, "n (synthetic sample size)", "cells", CELLS + 1)
    assert sample_density(grid, np.ones(4), 10, np.random.default_rng(1)).size == 10


def test_continuous_baseline_estimators():
    lap = build_mechanism("laplace-dp", epsilon=1.0, lower=0.0, upper=1.0)
    with pytest.raises(LimitError) as ei:
        estimator_for(lap, bins=CELLS + 1)
    assert_limit(ei, "bins", "cells", CELLS + 1)
    with pytest.raises(LimitError) as ei:
        estimator_for(lap, m=10_000)  # 10,000 points x 4,096 bins of kernel
    assert_limit(ei, "m x bins", "cells", 10_000 * 4096)
    assert estimator_for(lap, m=4096).grid.m == 4096
    sw = build_mechanism("square-wave", epsilon=1.0, lower=0.0, upper=1.0)
    with pytest.raises(LimitError) as ei:
        estimator_for(sw, d=5000)  # output_bins defaults to d: a 5,000 x 5,000 EMS matrix
    assert_limit(ei, "d x output_bins", "cells", 25_000_000)
    assert estimator_for(sw, d=4096).output_bins == 4096


def test_items_and_reports_per_user():
    for name, kw in (("ospdprr", dict(t=0.5)), ("osdp-rr", dict(epsilon=0.5))):
        with pytest.raises(LimitError) as ei:
            build_mechanism(name, k=10 ** 6, lower=0.0, upper=1.0, **kw)
        assert_limit(ei, "k", "items", 10 ** 6)
        assert len(build_mechanism(name, k=256, lower=0.0, upper=1.0, **kw).roles) >= 512
    with pytest.raises(LimitError) as ei:
        build_mechanism("rvns", lower=0.0, upper=1.0, k=10 ** 6)
    assert_limit(ei, "k", "reports_per_user", 10 ** 6)
    assert build_mechanism("rvns", lower=0.0, upper=1.0, k=1000).k == 1000


def test_dense_transition_matrices_are_checked_when_built():
    m = build_mechanism("grr", epsilon=1.0, domain=labels(5000))
    with pytest.raises(LimitError) as ei:
        m.transition_matrix()  # 5,000^2 = 25M cells
    assert_limit(ei, "transition matrix of domain", "cells", 25_000_000)
    assert build_mechanism("grr", epsilon=1.0, domain=labels(64)).transition_matrix().shape \
        == (64, 64)
    for name in JOINT:
        j = _joint(name, labels(100), labels(50))  # 5,000 cells: a 25M-cell matrix
        with pytest.raises(LimitError) as ei:
            j.transition_matrix()
        assert_limit(ei, "transition matrix of x_domain x y_domain", "cells", 25_000_000)


def test_rvns_worst_case_boxes():
    with pytest.raises(LimitError) as ei:
        rvns_worst_case(0.0, 10.0, 2.0, 3.0, k=4, nx=5, ny=200)
    assert_limit(ei, "boxes of rvns_worst_case", "cells")


# --------------------------------------------------------------------------- large, allowed
@pytest.mark.parametrize("name", ["cprr", "jd-grr"])
def test_a_product_domain_beyond_65536_cells_reports_the_right_cells(name):
    """Cell codes pass 65,535 on 300 x 300 labels; the reported (x, y) must still be the cells
    the mechanism chose (they were once decoded through uint16 codes, which wrap)."""
    m = _joint(name, labels(300), labels(300))
    x = np.array([299, 299, 150, 0, 218], dtype=np.int64)
    y = np.array([299, 17, 150, 0, 299], dtype=np.int64)
    n = 2000
    rep = m.perturb_valid({"x": np.repeat(x, n), "y": np.repeat(y, n)}, rng=3)
    kept = (rep["x"] == np.repeat(x, n)) & (rep["y"] == np.repeat(y, n))
    # at epsilon = 6 a sensitive cell is kept w.p. e^6 / (e^6 + |S| - 1) >= 0.55, a
    # non-sensitive one w.p. (e^6 - 1)/(e^6 + |S| - 1) (|S| = 599 or 90,000 for JD-GRR);
    # wrongly decoded cells would almost never equal the input
    a = m.probabilities()["a"]
    assert kept.reshape(len(x), n).mean(axis=1).min() > a - 5 * np.sqrt(a * (1 - a) / n) - 0.05


# --------------------------------------------------------------------------- the command line
def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_BEAM_MAX_")}
    return subprocess.run([sys.executable, "-m", "ldp_beam.pipelines.cli", *args],
                          capture_output=True, text=True, timeout=60, env=env)  # a hang guard


def test_cli_size_caps_exit_2_without_a_traceback(tmp_path):
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"v": np.random.default_rng(2).uniform(0, 1, 200)}), table)
    listed = _cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    with_bins = [m["name"] for m in json.loads(listed.stdout)["mechanisms"]
                 if any(p["name"] == "bins" for p in m["parameters"])]
    assert "laplace-histogram" in with_bins and "dphr" in with_bins
    for name in with_bins:
        r = _cli("collect", "-i", str(table), "-c", "v", "-m", name, "--epsilon", "1",
                 "-p", "bins=100000000", "-p", "lower=0", "-p", "upper=1",
                 "-o", str(tmp_path / f"{name}.parquet"))
        assert r.returncode == 2, (name, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        cap = "cells" if name == "laplace-histogram" else "grouping_buckets"
        assert "parameter 'bins' = 100,000,000 exceeds the size cap" in r.stderr, r.stderr
        assert f"LDP_BEAM_MAX_{cap.upper()}=100000000" in r.stderr, r.stderr
    # rvns reports, then `estimate --option m=100000`
    reports = tmp_path / "r.parquet"
    code, _, se = run_cli("collect", "-i", str(table), "-c", "v", "-m", "rvns", "-p", "lower=0",
                          "-p", "upper=1", "-o", str(reports))
    assert code == 0, se
    r = _cli("estimate", "-i", str(reports), "-o", str(tmp_path / "e.json"),
             "--option", "m=100000")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert "m x report_bins" in r.stderr and "size cap 'cells'" in r.stderr, r.stderr
    assert "LDP_BEAM_MAX_CELLS=" in r.stderr, r.stderr
    assert not (tmp_path / "e.json").exists()
