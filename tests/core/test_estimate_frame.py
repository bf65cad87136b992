"""Estimate.to_frame(): a pandas DataFrame, one row per statistic and cell (issue 26)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from ldp_beam import build_mechanism, estimator_for
from ldp_beam.core import Estimate, Statistic
from ldp_beam.privacy import PrivacyGuarantee

COLUMNS = ["statistic", "cell", "value", "stderr", "ci_low", "ci_high", "clipped"]


def _estimate(name, data, **params):
    mech = build_mechanism(name, **params)
    rng = np.random.default_rng(26)
    return estimator_for(mech).estimate(mech.perturb(data, rng))


def test_scalars_one_row_each_with_their_interval():
    rng = np.random.default_rng(1)
    est = _estimate("bisample-md", {"value": rng.uniform(0, 100, 4000)}, epsilon=2.0, lower=0,
                    upper=100)
    f = est.to_frame()
    assert isinstance(f, pd.DataFrame) and list(f.columns) == COLUMNS
    assert list(f["statistic"]) == list(est.statistics)
    assert f["cell"].isna().all()
    mean = f.set_index("statistic").loc["mean"]
    st = est["mean"]
    assert mean["value"] == pytest.approx(st.value) and mean["stderr"] == pytest.approx(st.stderr)
    assert (mean["ci_low"], mean["ci_high"]) == pytest.approx(st.ci())
    assert f.attrs["mechanism"] == "bisample-md" and f.attrs["n_reports"] == 4000
    assert f.attrs["guarantee"] == est.guarantee.describe()


def test_a_vector_by_label_and_a_matrix_by_label_pairs():
    rng = np.random.default_rng(2)
    est = _estimate("grr", rng.choice(["a", "b", "c"], 3000), epsilon=2.0, domain=("a", "b", "c"))
    f = est.to_frame()
    assert list(f["cell"]) == ["a", "b", "c"] and (f["statistic"] == "frequency").all()
    freq = est["frequency"]
    assert np.allclose(f["value"], freq.value) and np.allclose(f["stderr"], freq.stderr)
    assert np.allclose(f["ci_low"], np.asarray(freq.value) - 1.959963984540054 * f["stderr"])
    assert np.allclose(f["clipped"], freq.clipped)
    assert f["value"].dtype == float

    x, y = rng.choice(["a", "b"], 3000), rng.choice(["u", "v", "w"], 3000)
    joint = _estimate("jd-grr", {"x": x, "y": y}, epsilon=3.0, x_domain=("a", "b"),
                      y_domain=("u", "v", "w")).to_frame()
    cells = joint[joint["statistic"] == "joint"]["cell"].tolist()
    assert cells == [(a, b) for a in "ab" for b in "uvw"]
    assert joint[joint["statistic"] == "marginal_y"]["cell"].tolist() == ["u", "v", "w"]


def test_unlabelled_cells_text_values_and_missing_errors():
    g = PrivacyGuarantee("LDP", 1.0)
    est = Estimate("x", 10, {"hist": Statistic(np.array([0.1, 0.9]), np.array([0.01, 0.02])),
                             "grid": Statistic(np.array([[1.0, 2.0], [3.0, 4.0]])),
                             "method": Statistic("em"), "converged": Statistic(True)}, g)
    f = est.to_frame()
    assert f["cell"].tolist() == [0, 1, (0, 0), (0, 1), (1, 0), (1, 1), None, None]
    assert f["value"].tolist()[:6] == [0.1, 0.9, 1.0, 2.0, 3.0, 4.0]
    assert f["value"].tolist()[6:] == ["em", 1.0]  # text kept as text, a boolean as 1.0
    grid = f[f["statistic"] == "grid"]
    assert grid[["stderr", "ci_low", "ci_high", "clipped"]].isna().all().all()
    assert f.loc[1, "ci_high"] == pytest.approx(0.9 + 1.959963984540054 * 0.02)
    assert math.isnan(f.loc[6, "stderr"])


def test_an_estimate_without_statistics_is_an_empty_frame():
    f = Estimate("x", 0, {}, PrivacyGuarantee("LDP", 1.0)).to_frame()
    assert f.empty and list(f.columns) == COLUMNS
