"""Which reports can leak through their floating-point representation (docs/floating_point.md).

Mironov's attack needs an output whose set of reachable doubles depends on the input. Central
releases are integers plus exact integer noise (tests/core/test_noise.py); categorical LDP reports are
codes. Among the continuous LDP mechanisms, RVNS draws its reports from two input-independent
sets of doubles (only the choice between them depends on the input), while the additive and
piecewise baselines compute the report from the input and say so in their guarantee."""
from __future__ import annotations

import numpy as np
import pytest

from ldp_beam.mechanisms.rvns import RVNS
from ldp_beam.privacy import FLOAT_OUTPUT_NOTE
from ldp_beam.registry import build_mechanism
from ldp_beam_test_helpers import SAMPLE_PARAMS


def test_rvns_reports_come_from_input_independent_doubles():
    m = RVNS(lower=0.0, upper=10.0, d=1.0, k=3, delta=2.0)
    u = np.random.default_rng(0).random((20_000, m.draws))
    base = {j: 0.0 + u[:, 1 + j] * (10.0 - 0.0 - 1.0) for j in range(3)}
    for x in (0.0, 0.3, 5.0, 9.99, 10.0):
        rep = m.randomize({"value": np.full(u.shape[0], x)}, u)
        for j in range(3):
            y = rep[f"y{j + 1}"]
            # bit for bit one of the two candidates that do not involve x
            assert np.all((y == base[j]) | (y == base[j] + 1.0))


@pytest.mark.parametrize("name", ["laplace-dp", "generalized-gaussian", "square-wave", "pm"])
def test_float_output_baselines_carry_the_caveat(name):
    m = build_mechanism(name, **SAMPLE_PARAMS[name])
    assert FLOAT_OUTPUT_NOTE in m.guarantee.notes


@pytest.mark.parametrize("name", ["laplace-histogram", "dphr", "ahp"])
def test_central_histograms_publish_integers_plus_integer_noise(name):
    """The published bucket values are exact integers (LPA) or group sums of integers plus an
    integer, divided by the group size: no floating-point noise anywhere."""
    m = build_mechanism(name, **SAMPLE_PARAMS[name])
    counts = np.random.default_rng(1).integers(0, 30, m.n_buckets)
    rel = m.release_counts(counts, np.random.default_rng(2))
    groups = rel["groups"].value if "groups" in rel.statistics else np.arange(counts.size)
    size = np.bincount(groups)[groups]
    scaled = rel["histogram"].value * size
    np.testing.assert_allclose(scaled, np.rint(scaled), atol=1e-9)
