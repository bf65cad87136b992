"""The central releases' fast paths (issue 16, CLI releases) equal their general paths bit for bit.

* ``HistogramRelease.check`` buckets a batch whose values are all inside [lower, upper] in
  slices, without the general path's masks: compared with the general path itself (the same
  rows with one outside value appended, which sends the batch down the general path).
* ``OSPDPRR.validate`` gives w = level without building the weight matrix when no importance
  column is mapped and the sensitivity function is one of the library's two: compared with a
  copy of the same function under another name (which takes the general path).
* ``OSPDPRR.prepare`` (sound-self, one item) computes pi on 1-D arrays, M as ``1 - w`` for
  weights in [0, 1]: compared with ``OSPDPRR.sampling`` on the (n, 1) matrix.
* ``OSPDPRREstimator.add`` (sound-self) sums the lattice units column by column in slices:
  compared with :func:`statistic_units` on the kept rows, summed.

Edge cases: nulls (NaN), values and levels out of range, -0.0, subnormal levels (whose square
underflows), ties on the lattice (rounded half to even), empty batches, batches that span
several slices.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from ldp_beam import build_mechanism, estimator_for
from ldp_beam.central.histogram import HistogramRelease
from ldp_beam.central.ospdprr import (OSPDPRR, OSPDPRREstimator, _self_sampling_one_item,
                                      comprehensive_weight, importance_times_level, level_only,
                                      sampling_probabilities, statistic_units)

SEEDS = (0, 1, 2)


def _bits(a: np.ndarray) -> bytes:
    a = np.ascontiguousarray(a)
    return a.dtype.str.encode() + repr(a.shape).encode() + a.tobytes()


def _same(a: np.ndarray, b: np.ndarray) -> None:
    assert _bits(np.asarray(a)) == _bits(np.asarray(b))


# --------------------------------------------------------------------------- DPHR check
def _values(n: int, lower: float, upper: float, seed: int) -> np.ndarray:
    """Values inside [lower, upper]: uniform, both ends, bucket edges, -0.0 next to a zero
    bound, and values one ulp inside the ends."""
    rng = np.random.default_rng(seed)
    v = rng.uniform(lower, upper, n)
    edges = np.linspace(lower, upper, 9)
    special = np.concatenate([edges, [lower, upper, np.nextafter(upper, lower),
                                      np.nextafter(lower, upper)]])
    if lower == 0.0:
        special = np.concatenate([special, [-0.0]])
    m = min(n, special.size)
    v[:m] = special[:m]
    return rng.permutation(v)


@pytest.mark.parametrize("mech_name,params", [
    ("dphr", {"epsilon": 1.0, "bins": 256, "lower": 0.0, "upper": 100.0}),
    ("dphr", {"epsilon": 1.0, "bins": 7, "lower": -3.5, "upper": 11.25}),
    ("dphr", {"epsilon": 1.0, "bins": 1, "lower": 0, "upper": 1}),  # integer bounds
    ("laplace-histogram", {"epsilon": 1.0, "bins": 100, "lower": -1.0, "upper": 1.0}),
])
@pytest.mark.parametrize("n", [0, 1, 100, 40_000])  # 40,000: three slices of 16,384
def test_histogram_check_fast_path_equals_general(mech_name, params, n):
    mech = build_mechanism(mech_name, **params)
    assert isinstance(mech, HistogramRelease)
    for seed in SEEDS:
        v = _values(n, float(params["lower"]), float(params["upper"]), seed)[:n]
        fast, reasons = mech.check({"value": v})
        assert not reasons.bad.any() and reasons.as_dict() == {}
        # the general path: the same rows plus one value outside, which is dead-lettered
        general, greasons = mech.check({"value": np.append(v, params["upper"] + 1.0)})
        _same(fast["value"], general["value"][:n])
        assert general["value"][n] == -1 and list(greasons.as_dict()) == [n]
        assert fast["value"].dtype == np.int64
        if n:
            assert fast["value"].min() >= 0 and fast["value"].max() <= params["bins"] - 1


def test_histogram_check_bad_rows_still_flagged():
    """Nulls, out-of-range and non-numeric values leave the fast path: the same reasons as
    before, in the same order, and code -1."""
    mech = build_mechanism("dphr", epsilon=1.0, bins=10, lower=0.0, upper=10.0)
    raw = np.array([1.5, None, "x", 11.0, -0.5, 10.0, np.nan, True, ""], dtype=object)
    cols, reasons = mech.check({"value": raw})
    assert cols["value"].tolist() == [1, -1, -1, -1, -1, 9, -1, -1, -1]
    msgs = reasons.as_dict()
    assert set(msgs) == {1, 2, 3, 4, 6, 7, 8}
    assert "non-numeric" in msgs[2] and "non-numeric" in msgs[7]
    assert "missing" in msgs[1] and "missing" in msgs[6] and "missing" in msgs[8]
    assert "outside" in msgs[3] and "outside" in msgs[4]


def test_histogram_check_non_plain_bounds_take_general_path():
    """Bounds that are not plain Python numbers (here numpy float32) are bucketed by the
    general path, whose arithmetic they might change."""
    mech = build_mechanism("dphr", epsilon=1.0, bins=4, lower=np.float32(0.0),
                           upper=np.float32(1.0))
    assert mech._bucket_codes(np.array([0.5])) is None
    cols, reasons = mech.check({"value": np.array([0.0, 0.3, 1.0])})
    assert cols["value"].tolist() == [0, 1, 3] and not reasons.bad.any()


# --------------------------------------------------------------------------- OSPDPRR validate
def product_copy(importance, level):
    """importance_times_level under another name: the general path."""
    return importance_times_level(importance, level)


def level_copy(importance, level):
    return level_only(importance, level)


def _rows(n: int, k: int, seed: int, bad: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    cols = {"value1": rng.uniform(0.0, 100.0, n)}
    for i in range(1, k + 1):
        lv = np.where(rng.random(n) < 0.4, 0.0, rng.uniform(0.0, 1.0, n))
        special = np.array([0.0, -0.0, 1.0, 5e-324, 1e-160, 1e-300, 0.5, np.nextafter(1.0, 0)])
        m = min(n, special.size)
        lv[:m] = special[:m]
        cols[f"level{i}"] = rng.permutation(lv)
    if bad and n:
        idx = rng.choice(n, size=min(n, 12), replace=False)
        cols["value1"][idx[:3]] = [np.nan, -1.0, 100.5][: len(idx[:3])]
        for j, b in enumerate(idx[3:]):
            cols[f"level{1 + j % k}"][b] = [np.nan, -0.1, 1.5, np.inf, -np.inf][j % 5]
    return cols


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("n", [0, 1, 50, 3000])
@pytest.mark.parametrize("fast,general", [("product", product_copy), ("level", level_copy)])
@pytest.mark.parametrize("clip", [False, True])
def test_ospdprr_validate_fast_path_equals_general(k, n, fast, general, clip):
    base = {"t": 0.8, "query": "sum", "k": k, "target": (1,), "lower": 0.0, "upper": 100.0,
            "clip": clip}
    m_fast = OSPDPRR(sensitivity=fast, **base)
    m_gen = OSPDPRR(sensitivity=general, **base)
    for seed in SEEDS:
        for bad in (False, True):
            raw = _rows(n, k, seed, bad)
            c1, r1 = m_fast.check({k2: v.copy() for k2, v in raw.items()})
            c2, r2 = m_gen.check({k2: v.copy() for k2, v in raw.items()})
            assert sorted(c1) == sorted(c2)
            for name in c1:
                _same(c1[name], c2[name])
            _same(r1.bad, r2.bad)
            assert r1.as_dict() == r2.as_dict()
            if bad and n >= 12 and not clip:
                assert r1.bad.sum() == 12  # the fast path flags every bad row too


def test_ospdprr_validate_with_importance_takes_general_path():
    """A mapped importance column changes w: the general path runs (and flags bad ones)."""
    m = OSPDPRR(t=0.8, k=2, target=(1,), lower=0.0, upper=1.0)
    cols, reasons = m.check({"value1": np.array([0.5, 0.5, 0.5]),
                             "level1": np.array([0.5, 0.5, 0.5]),
                             "level2": np.array([1.0, 1.0, 1.0]),
                             "importance1": np.array([0.5, 1.0, 0.0])})
    assert cols["weight1"].tolist() == [0.25, 0.5, 0.0]
    assert list(reasons.as_dict()) == [2] and "importance" in reasons.as_dict()[2]


# --------------------------------------------------------------------------- OSPDPRR prepare
def _weights(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = np.where(rng.random(n) < 0.5, 0.0, rng.uniform(0.0, 1.0, n))
    special = np.array([0.0, -0.0, 1.0, 5e-324, 1e-160, 1e-154, 1e-300, 0.2, 0.5,
                        np.nextafter(0.2, 1.0), np.nextafter(0.2, 0.0), np.nan, np.inf, -1.0,
                        2.0])
    m = min(n, special.size)
    w[:m] = special[:m]
    return w


@pytest.mark.parametrize("t", [0.8, 0.1, 1.0, 0.5])
@pytest.mark.parametrize("n", [1, 15, 20_000])
def test_ospdprr_one_item_sampling_equals_general(t, n):
    m = OSPDPRR(t=t, k=1, target=(1,), lower=0.0, upper=100.0)
    rng = np.random.default_rng(n)
    for seed in SEEDS:
        w = _weights(n, seed)
        with np.errstate(invalid="ignore"):
            _, _, pi = m.sampling(w[:, None])
            u = rng.random((n, 1))
            u[: min(n, 3), 0] = [0.0, np.nextafter(1.0, 0.0), 0.5][: min(n, 3)]
            rep = m.prepare({"value1": np.full(n, 1.0), "weight1": w}, u)
            pi_ref = sampling_probabilities(comprehensive_weight(w[:, None], "fixed", None), t)
        _same(pi, pi_ref)
        _same(rep["sampled"], (u[:, 0] < pi).astype(np.uint8))
        _same(rep["value1"], np.full(n, 1.0))


@pytest.mark.parametrize("t", [0.8, 0.1, 1.0, 0.5, 1 / 3])
def test_ospdprr_one_item_sampling_valid_weights_equal_general(t):
    """Weights in [0, 1] (every valid row's) take M = 1 - w: equal to the general TOPSIS
    closeness bit for bit on random weights, every power of two down to the smallest subnormal
    (where w^2 underflows), the ties around 2^-54, and the 2,000 doubles on each side of
    1 - t (where pi switches to 1)."""
    m = OSPDPRR(t=t, k=1, target=(1,), lower=0.0, upper=1.0)
    rng = np.random.default_rng(7)
    powers = np.ldexp(1.0, -np.arange(0, 1075))
    tie = 2.0 ** -54
    ties = np.array([tie, 2 * tie, np.nextafter(tie, 1), np.nextafter(tie, 0)])
    near = (1.0 - t) + np.arange(-2000, 2001) * 2.0 ** -53
    near = near[(near >= 0) & (near <= 1)]
    for w in (rng.random(200_000), powers, 1.0 - powers, ties, near,
              np.array([0.0, -0.0, 1.0, 0.5, np.nextafter(0.5, 0), np.nextafter(0.5, 1)])):
        fast = _self_sampling_one_item(w, t)
        _same(fast, sampling_probabilities(comprehensive_weight(w[:, None], "fixed", None), t))
        u = rng.random((w.size, 1))
        _same(m.prepare({"value1": np.zeros(w.size), "weight1": w}, u)["sampled"],
              (u[:, 0] < m.sampling(w[:, None])[2]).astype(np.uint8))


def test_ospdprr_prepare_empty_and_bad_uniforms():
    m = OSPDPRR(t=0.8, k=1, target=(1,), lower=0.0, upper=1.0)
    rep = m.prepare({"value1": np.zeros(0), "weight1": np.zeros(0)}, np.zeros((0, 1)))
    assert rep["sampled"].shape == (0,) and rep["sampled"].dtype == np.uint8
    with pytest.raises(ValueError, match="one uniform"):
        m.prepare({"value1": np.zeros(3), "weight1": np.zeros(3)}, np.zeros(3))


# --------------------------------------------------------------------------- OSPDPRR add
def _general_add(est: OSPDPRREstimator, acc: np.ndarray, reports: dict) -> np.ndarray:
    """The general path of ``add``: statistic_units on the kept rows, summed."""
    m = est.mechanism
    keep = np.asarray(reports["sampled"]).reshape(-1) != 0
    vals = np.column_stack([np.asarray(reports[f"value{i}"], dtype=np.float64).reshape(-1)[keep]
                            for i in m.target])
    out = np.empty(4, dtype=np.int64)
    out[0] = int(acc[0]) + keep.size
    out[1:] = np.asarray(acc[1:], dtype=np.int64) + statistic_units(vals, est.lattice).sum(axis=0)
    return out


def _reports(n: int, target: tuple, lower: float, upper: float, seed: int, keep: str) -> dict:
    rng = np.random.default_rng(seed)
    rep = {}
    grid = max(abs(lower), abs(upper)) / (1 << 20)
    for i in target:
        v = rng.uniform(lower, upper, n)
        ties = (np.arange(min(n, 8)) + 0.5) * grid  # exactly half-way between lattice points
        v[: ties.size] = np.clip(ties, lower, upper)
        if n > 10:
            v[8:11] = [lower, upper, -0.0 if lower <= 0 else lower]
        rep[f"value{i}"] = v
    if keep == "all":
        rep["sampled"] = np.ones(n, dtype=np.uint8)
    elif keep == "none":
        rep["sampled"] = np.zeros(n, dtype=np.uint8)
    else:
        rep["sampled"] = (rng.random(n) < 0.7).astype(np.uint8)
    return rep


@pytest.mark.parametrize("query", ["count", "sum", "mean", "variance", "cv"])
@pytest.mark.parametrize("target,k", [((1,), 1), ((1, 2), 2)])
@pytest.mark.parametrize("bounds", [(0.0, 100.0), (-7.5, 3.0), (1.0, 2.0)])
def test_ospdprr_add_equals_general(query, target, k, bounds):
    lower, upper = bounds
    floor = {"mean_floor": 0.5} if query == "cv" and lower <= 0 else {}
    m = OSPDPRR(t=0.8, query=query, k=k, target=target, lower=lower, upper=upper, **floor)
    est = estimator_for(m, seed=1)
    assert isinstance(est, OSPDPRREstimator) and est.one_pass
    for n in (0, 1, 11, 40_000):  # 40,000 rows: three slices of 16,384
        for keep in ("all", "none", "some"):
            for seed in SEEDS:
                rep = _reports(n, target, lower, upper, seed, keep)
                acc = np.array([5, 3, -7, 11], dtype=np.int64)
                fast = est.add(acc.copy(), rep)
                if n == 0:
                    _same(fast, acc)
                    continue
                _same(fast, _general_add(est, acc, rep))


def test_ospdprr_add_split_and_nan_rows():
    """Any split gives the same accumulator; a NaN in a row left out of the sample is never
    converted (no warning), one in a sampled row gives the general path's integer."""
    m = OSPDPRR(t=0.8, query="variance", k=1, target=(1,), lower=0.0, upper=10.0)
    est = estimator_for(m, seed=1)
    rep = _reports(50_000, (1,), 0.0, 10.0, 3, "some")
    whole = est.add(est.create(), rep)
    acc = est.create()
    for lo in range(0, 50_000, 7_777):
        acc = est.add(acc, {k: v[lo:lo + 7_777] for k, v in rep.items()})
    _same(acc, whole)
    rep["sampled"][:2] = [0, 1]
    rep["value1"][0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(est.add(est.create(), rep), _general_add(est, est.create(), rep))
    rep["value1"][1] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same(est.add(est.create(), rep), _general_add(est, est.create(), rep))


def test_ospdprr_add_mismatched_lengths_still_rejected():
    m = OSPDPRR(t=0.8, query="sum", k=2, target=(1, 2), lower=0.0, upper=1.0)
    est = estimator_for(m, seed=1)
    with pytest.raises(ValueError):
        est.add(est.create(), {"value1": np.zeros(3), "value2": np.zeros(2),
                               "sampled": np.ones(3, dtype=np.uint8)})
