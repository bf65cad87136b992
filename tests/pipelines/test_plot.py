"""`estimate --plot` (issue 26): every kind of output is drawn with its intervals, labelled axes
and the guarantee's epsilon in the title; suppressed groups are named, never drawn as numbers."""
from __future__ import annotations

import numpy as np
import pytest

from ldp_beam.core import Estimate, Statistic
from ldp_beam.privacy import PrivacyGuarantee
from ldp_beam.registry import get_registry

pytest.importorskip("matplotlib")
from ldp_beam.pipelines.plot import PlotError, plot_estimate  # noqa: E402

G = PrivacyGuarantee("LDP", 1.5)


def _out(est: Estimate) -> dict:
    d = est.to_dict()
    return {"estimate": d, "guarantee": d["guarantee"], "seeded": False}


def _png(path) -> bytes:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    return data


def test_a_frequency_vector_is_drawn_with_labels_and_epsilon(tmp_path):
    m = get_registry().build("grr", {"epsilon": 1.5, "domain": "a,b,c"})
    est = get_registry().estimator_for(m).estimate(
        m.perturb(np.array(list("aabbbc") * 500, dtype=object), rng=np.random.default_rng(1)))
    got = plot_estimate(_out(est), str(tmp_path / "f.png"), truth=[2 / 6, 3 / 6, 1 / 6])
    _png(tmp_path / "f.png")
    assert got["statistic"] == "frequency"
    assert "epsilon = 1.5" in got["title"] and "95% CI" in got["title"]
    assert got["xlabel"] == "category" and got["ylabel"] == "frequency"


def test_groups_are_points_with_intervals_and_suppressed_groups_are_named(tmp_path):
    def est(v, se):
        return Estimate("bisample", 1000, {"mean": Statistic(v, se, domain=(0, 200))}, G,
                        {"lower": 0, "upper": 200}).to_dict()
    out = {"by": "region", "guarantee": G.to_dict(), "seeded": False,
           "estimates": {"north": est(40.0, 2.0), "south": est(45.0, 3.0),
                         "tiny": {"suppressed": "mean: too few reports", "n_reports": 5}}}
    got = plot_estimate(out, str(tmp_path / "g.png"), truth={"north": 41, "south": 44})
    _png(tmp_path / "g.png")
    assert got["xlabel"] == "region" and got["ylabel"] == "mean"


def test_a_seeded_run_says_so_and_a_text_only_output_is_refused(tmp_path):
    d = Estimate("m", 10, {"mean": Statistic(1.0, 0.1)}, G).to_dict()
    got = plot_estimate({"estimate": d, "guarantee": d["guarantee"], "seeded": True},
                        str(tmp_path / "s.png"))
    assert "NOT private" in got["title"]
    d = Estimate("m", 10, {"method": Statistic("em")}, G).to_dict()
    with pytest.raises(PlotError, match="no numeric statistic"):
        plot_estimate({"estimate": d}, str(tmp_path / "t.png"))
