"""DPHR and the central histogram base: the dynamic programme against brute force, the
approximate sort and its exponential mechanism, the two variants' guarantees (an exact audit of
the sound one, a counterexample for the published one), the release's noise, bad input, and the
Beam/CLI curator path."""
from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2, norm

from ldp_beam import estimator_for
from ldp_beam.central.dphr import (DPHR, approximate_sort, brute_force_grouping,
                                   optimal_grouping)
from ldp_beam.central.histogram import IdentityLaplace, group_means_with_noise, split_budget
from ldp_beam.errors import ParameterError
from ldp_beam.noise import discrete_laplace_pmf, discrete_laplace_scale
from ldp_beam.reproduce.metrics import range_query_mse, range_sums
from ldp_beam.privacy import CENTRAL, NONE
from ldp_beam_test_helpers import ScriptedNoise, read_jsonl, run_cli

EXAMPLE = np.array([2, 4, 2, 5, 8, 2, 3])  # Sections 4.2 and 5.2 of the paper


# --------------------------------------------------------------------------- the programme
@settings(max_examples=80, deadline=None)
@given(v=st.lists(st.integers(0, 30), min_size=1, max_size=9), eps=st.floats(0.05, 3.0))
def test_dynamic_programme_equals_brute_force(v, eps):
    v = np.array(v, dtype=float)
    g1, t1 = optimal_grouping(v, eps)
    g2, t2 = brute_force_grouping(v, eps)
    assert t1 == pytest.approx(t2, rel=1e-9, abs=1e-9)
    # the grouping found achieves the optimum it reports
    tot = sum(float(((v[g1 == k] - v[g1 == k].mean()) ** 2).sum())
              + 2 / (np.sum(g1 == k) * eps ** 2)
              for k in np.unique(g1))
    assert tot == pytest.approx(t1, rel=1e-9, abs=1e-9)
    assert np.all(np.diff(g1) >= 0) and g1[0] == 0 and np.all(np.diff(g1) <= 1)


def test_spec_worked_example_totals():
    """The paper's grouping {2,2,2}{3,4}{5,8} is not Theorem 3's optimum (spec)."""
    s = np.sort(EXAMPLE).astype(float)
    g, t = optimal_grouping(s, 1.0)
    assert g.tolist() == [0, 0, 0, 0, 1, 1, 2] and t == pytest.approx(4.75)
    g, t = optimal_grouping(s, 0.5)
    assert g.tolist() == [0, 0, 0, 0, 0, 1, 1] and t == pytest.approx(13.3)


def test_approximate_sort_low_noise_gives_the_papers_order():
    order = approximate_sort(EXAMPLE, 60.0, np.random.default_rng(1))
    assert order.tolist() == [0, 2, 5, 6, 1, 3, 4]  # {B1,B3,B6,B7,B2,B4,B5} = {2,2,2,3,4,5,8}
    assert sorted(order.tolist()) == list(range(7))


def test_exponential_mechanism_pick_frequencies():
    """First pick from bucket 0 of {2,4,2,5,8,2,3}: candidates B3, B6, B7 (within delta = 1.71)
    with u = 2, 5, 7 (|count diff| + |index diff|); P ∝ exp(-eps u / 2). Chi-square at 1e-4."""
    eps, runs = 0.8, 20_000
    gen = np.random.default_rng(17)
    picks = np.array([approximate_sort(EXAMPLE, eps, gen)[1] for _ in range(runs)])
    cand, u = np.array([2, 5, 6]), np.array([2.0, 5.0, 7.0])
    p = np.exp(-eps * u / 2)
    p /= p.sum()
    counts = np.array([(picks == c).sum() for c in cand])
    assert counts.sum() == runs
    stat = ((counts - runs * p) ** 2 / (runs * p)).sum()
    assert stat < chi2.ppf(1 - 1e-4, 2)


# --------------------------------------------------------------------------- guarantees
def test_variant_guarantees():
    paper = DPHR(1.0, variant="paper")
    g = paper.guarantee
    assert g.kind == NONE and math.isinf(g.epsilon) and "Theorem 5" in g.claim
    assert "not established" in g.notes
    sound = DPHR(1.0, epsilon1=0.3)
    assert sound.guarantee.kind == CENTRAL and sound.guarantee.epsilon == 1.0
    assert sound.budget == pytest.approx((0.3, 0.7))
    assert IdentityLaplace(0.5).guarantee.kind == CENTRAL


def _log_density_sound(h, view, hist, groups, e1, e2):
    """log P(view, published histogram | counts h) for the sound variant: the view is h plus
    discrete Laplace noise of scale t1 ~ 1/e1 per bucket, the grouping a function of the view,
    and each group's published value (sum_G(h) + Z) / |G| with Z discrete Laplace of scale
    t2 ~ 1/e2 (the scales as the library rounds them up)."""
    t1, t2 = discrete_laplace_scale(1, e1), discrete_laplace_scale(1, e2)
    lp = np.sum(np.log(discrete_laplace_pmf(view - h, t1)))
    for k in np.unique(groups):
        m = groups == k
        z = np.rint(hist[m][0] * m.sum() - h[m].sum())
        lp += np.log(discrete_laplace_pmf(z, t2))
    return lp


def test_sound_variant_exact_privacy_loss_is_bounded():
    """For neighbouring histograms (one bucket +-1) the exact privacy loss of the sound
    variant's output (view and release) never exceeds eps1 + eps2, over many sampled outputs."""
    rng = np.random.default_rng(23)
    e1, e2 = 0.4, 0.6
    mech = DPHR(1.0, epsilon1=e1, epsilon2=e2)
    worst = -np.inf
    for trial in range(300):
        h = rng.integers(0, 20, 8)
        h2 = h.copy()
        j = rng.integers(0, 8)
        h2[j] += 1 if (h[j] == 0 or rng.random() < 0.5) else -1
        est = mech.release_counts(h, rng)
        out = est["view"].value, est["histogram"].value, est["groups"].value
        loss = _log_density_sound(h, *out, e1, e2) - _log_density_sound(h2, *out, e1, e2)
        worst = max(worst, abs(loss))
    assert worst <= e1 + e2 + 1e-9
    assert worst > 0.5 * (e1 + e2)  # the bound is not vacuous: some outputs come close


def test_sound_grouping_depends_on_the_data_only_through_the_view(monkeypatch):
    rng = np.random.default_rng(4)
    view = np.rint(rng.normal(10, 6, 30)).astype(np.int64)
    mech = DPHR(0.5)
    groups = []
    for _ in range(5):
        h = rng.integers(0, 25, 30)  # five different histograms ...
        noise = ScriptedNoise(monkeypatch, [view - h])  # ... with the same private view
        est = mech.release_counts(h, np.random.default_rng(0))
        assert noise.calls[0] == (1, 0.25, 30)  # the view: sensitivity 1 at eps1
        np.testing.assert_allclose(est["view"].value, view)
        groups.append(est["groups"].value)
    for g in groups[1:]:
        np.testing.assert_array_equal(g, groups[0])


def test_paper_variant_grouping_reveals_one_record():
    """As published, the grouping is a deterministic function of the sort order and the *exact*
    counts. At the paper's own split (eps = 1: eps1 = eps2 = 0.5), run on its example H and on H
    with one more record in bucket 5 (8 -> 9): for orders both runs produce, the groupings
    differ, so that (order, grouping) output has positive probability under one histogram and
    probability 0 under the other: no finite epsilon."""
    h = EXAMPLE.copy()
    h2 = h.copy()
    h2[4] += 1
    mech = DPHR(1.0, variant="paper")
    rng = np.random.default_rng(12)

    def runs(hist):
        out = {}
        for _ in range(600):
            r = mech.release_counts(hist, rng)
            g = r["groups"].value
            part = frozenset(frozenset(np.flatnonzero(g == k).tolist()) for k in np.unique(g))
            out.setdefault(tuple(r["order"].value.tolist()), set()).add(part)
        return out

    a, b = runs(h), runs(h2)
    for parts in list(a.values()) + list(b.values()):
        assert len(parts) == 1  # given the order, the grouping is deterministic
    shared = set(a) & set(b)
    assert shared
    assert any(a[o] != b[o] for o in shared)


# --------------------------------------------------------------------------- the release
def test_group_noise_has_the_stated_variance():
    """(group sum + Z) / |G| with Z discrete Laplace of scale 1/eps: variance
    2q/(1-q)^2 / |G|^2, q = exp(-eps) (a little below the continuous 2/(eps |G|)^2)."""
    counts = np.arange(12)
    groups = np.repeat([0, 1, 2], [2, 4, 6])
    gen = np.random.default_rng(8)
    runs = 4000
    out = np.array([group_means_with_noise(counts, groups, 0.7, gen)[0] for _ in range(runs)])
    _, var = group_means_with_noise(counts, groups, 0.7, gen)
    q = math.exp(-1 / discrete_laplace_scale(1, 0.7))
    k2, k4 = 2 * q / (1 - q) ** 2, 2 * q * (1 + 4 * q + q * q) / (1 - q) ** 4
    for k, size in enumerate([2, 4, 6]):
        m = groups == k
        noise = out[:, m][:, 0] - counts[m].mean()
        assert np.all(out[:, m] == out[:, m][:, :1])  # one draw shared by the group
        np.testing.assert_allclose(noise * size, np.rint(noise * size), atol=1e-9)  # integers
        want = k2 / size ** 2
        assert var[m][0] == pytest.approx(want, rel=1e-12)
        # sample variance of R draws: relative SE sqrt((excess kurtosis k4/k2^2 + 2)/R)
        assert noise.var() == pytest.approx(want, rel=5 * math.sqrt((k4 / k2 ** 2 + 2) / runs))
        assert abs(noise.mean()) <= 5 * math.sqrt(want / runs)


def test_sound_release_total_is_unbiased():
    h = np.random.default_rng(2).poisson(30, 200)
    mech = DPHR(0.5)
    gen = np.random.default_rng(9)
    totals = np.array([mech.release_counts(h, gen)["histogram"].value.sum() for _ in range(300)])
    z = norm.ppf(1 - 1e-4)
    assert abs(totals.mean() - h.sum()) <= z * totals.std(ddof=1) / math.sqrt(totals.size)


def test_range_queries():
    h = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    assert range_sums(h, 3).tolist() == [8, 6, 10, 15, 16, 17]
    p = h + np.array([1, 0, 0, 0, 0, 0, 0, -1])
    brute = [np.mean([(p[i:i + L].sum() - h[i:i + L].sum()) ** 2 for i in range(8 - L + 1)])
             for L in (1, 3, 8)]
    np.testing.assert_allclose(range_query_mse(h, p, (1, 3, 8)), brute)
    with pytest.raises(ValueError, match="range length"):
        range_sums(h, 9)


def test_dp_scales_to_dpbench_sizes():
    """Not a timing test: the programme handles n = 4096 (bench measures the time)."""
    v = np.sort(np.random.default_rng(0).poisson(5, 4096)).astype(float)
    g, t = optimal_grouping(v, 0.5)
    assert g.size == 4096 and np.isfinite(t)


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("counts, match", [
    ([1, -2, 3], "non-negative integer"),
    ([1.5, 2], "non-negative integer"),
    ([], "non-empty"),
    ([[1, 2]], "1-D"),
    ([np.nan, 1], "non-negative integer"),
    (["a", "b"], "numeric"),
])
def test_bad_counts(counts, match):
    with pytest.raises(ParameterError, match=match):
        DPHR(1.0).release_counts(np.array(counts) if counts != [] else np.array([]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=1.0, epsilon1=0.4, epsilon2=0.4), "epsilon1 \\+ epsilon2 = epsilon"),
    (dict(epsilon=1.0, epsilon1=1.0), "in \\(0, 1.0\\)"),
    (dict(epsilon=1.0, epsilon2=-0.1), "epsilon2"),
    (dict(epsilon=1.0, variant="exact"), "variant"),
    (dict(epsilon=1.0, bins=-3), "bins"),
    (dict(epsilon=1.0, bins=4, lower=5.0, upper=5.0), "lower"),
    (dict(epsilon=1.0, bins=4, categories=("a", "b")), "bins"),
])
def test_bad_parameters(kwargs, match):
    with pytest.raises(ParameterError, match=match):
        DPHR(**kwargs)


def test_split_budget_defaults_and_parts():
    assert split_budget(1.0, None, None) == (0.5, 0.5)
    assert split_budget(1.0, None, 0.25) == (0.75, 0.25)


def test_raw_records_are_bucketed_or_dead_lettered():
    mech = DPHR(1.0, bins=4, lower=0.0, upper=8.0)
    cols, reasons = mech.check(np.array([0.0, 1.99, 2.0, 8.0, -0.1, np.nan, 9.0]))
    assert cols["value"][:4].tolist() == [0, 0, 1, 3]
    msgs = reasons.as_dict()
    assert set(msgs) == {4, 5, 6}
    assert "outside the declared domain [0, 8] (not clipped)" in msgs[4]
    assert "missing value" in msgs[5]
    cat = DPHR(1.0, categories=("x", "y"))
    cols, reasons = cat.check(np.array(["y", "z", None], dtype=object))
    assert cols["value"][0] == 1 and set(reasons.as_dict()) == {1, 2}


def test_estimator_releases_once_with_no_exact_count():
    mech = DPHR(1.0, bins=5, lower=0.0, upper=5.0)
    est = estimator_for(mech, seed=3)
    rep = mech.records(np.array([0.5, 1.5, 1.6, 4.9] * 50))
    acc = est.add(est.create(), rep)
    e = est.finalize(acc)
    assert e.n_reports is None and e.guarantee.kind == CENTRAL
    assert e["histogram"].value.shape == (5,) and e["groups"].value.shape == (5,)
    # seeded: the release is a function of (seed, counts) — reproducible, and different counts
    # never share noise
    np.testing.assert_array_equal(est.finalize(acc)["histogram"].value, e["histogram"].value)
    acc2 = acc.copy()
    acc2[0] += 1
    assert not np.allclose(est.finalize(acc2)["histogram"].value - e["histogram"].value,
                           np.eye(5)[0] / np.bincount(e["groups"].value)[e["groups"].value[0]])
    # no rows: a noisy empty histogram, never a fixed error (which would tell no rows from one)
    assert est.finalize(est.create())["histogram"].value.shape == e["histogram"].value.shape


# --------------------------------------------------------------------------- CLI / Beam
@pytest.fixture
def raw_table(tmp_path):
    rng = np.random.default_rng(31)
    v = rng.gamma(3.0, 10.0, 5000)
    v[:3] = [-5.0, np.nan, 1e6]
    path = tmp_path / "raw.parquet"
    pq.write_table(pa.table({"income": v}), path, row_group_size=2000)
    return path, v


def test_cli_release_from_raw_records(raw_table, tmp_path):
    path, v = raw_table
    out = tmp_path / "rel.json"
    code, so, se = run_cli("estimate", "-i", str(path), "-c", "income", "-m", "dphr",
                           "--epsilon", "1", "-p", "bins=40", "-p", "lower=0", "-p", "upper=200",
                           "-o", str(out))
    assert code == 0, se
    assert "released dphr: groups=[40 values], histogram=[40 values] (central-DP with " \
        "epsilon=1 per record (no privacy unit declared" in so
    rel = json.loads(out.read_text())
    assert rel["estimate"]["n_reports"] is None and "curator" not in rel
    assert "4,997" not in out.read_text()  # no exact count in what may be published
    cur = json.loads((tmp_path / "rel.json.curator.json").read_text())
    bad = 3 + int((v[3:] > 200).sum())
    assert cur["records"]["input"] == 5000 and cur["records"]["dead_lettered"] == bad
    assert cur["records"]["reconciles"] is True
    dead = read_jsonl(str(out) + ".deadletter.jsonl")
    assert len(dead) == bad and any(d["record"]["income"] is None for d in dead)  # NaN -> null
    hist = np.array(rel["estimate"]["statistics"]["histogram"]["value"])
    ok = v[3:][v[3:] <= 200]
    true = np.histogram(ok, bins=40, range=(0, 200))[0]
    # group means times group sizes keep the true total, so the published total differs from it
    # only by the k groups' Laplace(1/eps2) draws: variance 2 k / eps2^2 (eps2 = 0.5); z = 5
    k = len(set(rel["estimate"]["statistics"]["groups"]["value"]))
    assert abs(hist.sum() - true.sum()) <= 5 * math.sqrt(2 * k) / 0.5


def test_cli_refuses_collect_and_by_for_central(raw_table, tmp_path):
    path, _ = raw_table
    code, _, se = run_cli("collect", "-i", str(path), "-c", "income", "-m", "dphr",
                          "--epsilon", "1", "-p", "bins=4", "-p", "lower=0", "-p", "upper=200",
                          "-o", str(tmp_path / "r.parquet"))
    assert code == 2 and "central-DP release" in se
    code, _, se = run_cli("estimate", "-i", str(path), "-c", "income", "-m", "dphr", "--by", "x",
                          "--epsilon", "1", "-p", "bins=4", "-p", "lower=0", "-p", "upper=200",
                          "-o", str(tmp_path / "e.json"))
    # per-key central releases need a privacy unit (issue 14: bounded keys, public or
    # privately selected): without one the key set and sizes would be disclosed
    assert code == 2 and "--privacy-unit" in se and "disclosed" in se
