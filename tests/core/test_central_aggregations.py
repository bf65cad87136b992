"""The central-DP aggregations (central-count, privacy-id-count, central-sum, central-mean,
central-variance, central-quantiles), without Beam: validation and dead-lettering, the exact grid
sums, accuracy against the stated standard errors, retry reproducibility, per-unit sensitivity
after bounding, and a Monte Carlo privacy audit on neighbouring datasets (with a negative control
that shows the audit can see a violation)."""
from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from ldp_beam import audit as A
from ldp_beam.central.aggregation import (GRID_BITS, Lattice, budget_part, get_wide,
                                          normalize_wide, wide_add)
from ldp_beam.central.partition import bound_contributions
from ldp_beam.core import CentralRelease, Estimate
from ldp_beam.errors import ParameterError
from ldp_beam.privacy import per_unit
from ldp_beam.registry import BUILTINS, build_mechanism, get_registry

NAMES = ("central-count", "privacy-id-count", "central-sum", "central-mean",
         "central-variance", "central-quantiles")
VALUED = {"lower": 0.0, "upper": 100.0}
#: the excess kurtosis of the (discrete) Laplace: the sample variance of R draws has relative
#: standard deviation sqrt((2 + 3) / R), not the normal's sqrt(2 / R)
LAPLACE_EXCESS_KURTOSIS = 3.0


def build(name: str, **kw):
    params = {"epsilon": 1.0, **kw}
    if name not in ("central-count", "privacy-id-count"):
        params = {**VALUED, **params}
    return build_mechanism(name, **params)


def accumulate(mech, values, est=None):
    """(estimator, accumulator) of the valid rows of ``values`` (the Beam path's steps)."""
    est = est or mech.estimator()
    cols, reasons = mech.check(np.asarray(values, dtype=object)
                               if not isinstance(values, np.ndarray) else values)
    ok = ~reasons.bad
    reports = mech.prepare({k: v[ok] for k, v in cols.items()}, np.empty((int(ok.sum()), 0)))
    return est, est.add(est.create(), reports)


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(20261127).beta(2.0, 5.0, 3000) * 100.0


# ------------------------------------------------------------------------ registry, parameters
def test_registered_as_deferred_builtins():
    table = {n for n, _, _ in BUILTINS}
    assert set(NAMES) <= table
    reg = get_registry()
    for name in NAMES:
        mech = build(name)
        assert isinstance(mech, CentralRelease) and mech.name == name and mech.draws == 0
        assert reg.plugin_of(mech).name == name
        g = mech.guarantee
        assert g.kind == "central-DP" and g.epsilon == 1.0 and g.delta == 0.0
        assert g.params["unit"] == "record" and g.params["unit_sensitivity"] == 1
        assert g.params["realized_epsilon"] <= 1.0
        assert "budget" in g.params and "sensitivity" in g.params


def test_budget_splits_and_sensitivities_are_stated():
    m = build("central-mean", max_partitions_per_unit=2, max_rows_per_partition=3)
    g = m.guarantee
    assert g.params["budget"] == {"count": 0.5, "normalized_sum": 0.5}
    assert g.params["sensitivity"] == {"count": 6, "normalized_sum": 6 * 50.0}
    assert "epsilon/2" in g.notes and "mid = (lower + upper)/2 = 50" in g.notes
    assert "never clipped" in g.notes and "PipelineDP clamps" in g.notes
    assert "per privacy unit (at most 2 partitions x 3 rows each)" in g.notes
    v = build("central-variance", max_rows_per_partition=2)
    assert v.guarantee.params["budget"] == pytest.approx(
        {"count": 1 / 3, "normalized_sum": 1 / 3, "normalized_sum_of_squares": 1 / 3})
    assert v.guarantee.params["sensitivity"]["normalized_sum_of_squares"] == 2 * 50.0 ** 2 / 2
    s = build("central-sum", lower=-300.0, upper=100.0, max_partitions_per_unit=4)
    assert s.guarantee.params["sensitivity"] == {"sum": 4 * 300.0}  # no midpoint shift
    q = build("central-quantiles", height=5, branching=4)
    assert q.guarantee.params["budget"] == pytest.approx({"per_level": 0.2, "levels": 5})
    assert build("privacy-id-count", max_partitions_per_unit=7).guarantee.params[
        "sensitivity"] == {"privacy_id_count": 7}
    assert build("central-count", max_partitions_per_unit=7, max_rows_per_partition=2
                 ).guarantee.params["sensitivity"] == {"count": 14}


def test_parameters_are_validated():
    with pytest.raises(ParameterError, match="max_rows_per_partition"):
        build("privacy-id-count", max_rows_per_partition=2)
    with pytest.raises(ParameterError, match="lower"):
        build_mechanism("central-mean", epsilon=1.0, lower=5.0, upper=5.0)
    with pytest.raises(ParameterError, match="lower"):
        build_mechanism("central-sum", epsilon=1.0, upper=1.0)  # no default domain
    with pytest.raises(ParameterError, match="quantiles"):
        build("central-quantiles", quantiles=(0.5, 1.5))
    with pytest.raises(ParameterError, match="max_partitions_per_unit"):
        build("central-count", max_partitions_per_unit=0)
    with pytest.raises(ParameterError, match="epsilon"):
        build("central-sum", epsilon=1e-3, max_partitions_per_unit=10**6,
              max_rows_per_partition=10**6)  # the noise scale would leave the sampler's range
    # command-line strings convert through the field types
    q = get_registry().build("central-quantiles", {"epsilon": "1", "lower": "0", "upper": "10",
                                                   "quantiles": "0.1,0.9"})
    assert q.quantiles == (0.1, 0.9)


def test_budget_parts_never_sum_above_epsilon():
    for eps in (1.0, 0.1, 0.7, 3.3, 1e-3, 2.0 / 3.0):
        for parts in (2, 3, 4, 7):
            p = budget_part(eps, parts)
            assert Fraction(p) * parts <= Fraction(eps) and p > eps / parts * (1 - 1e-15)


# ------------------------------------------------------------------------ rows and dead letters
def test_out_of_domain_values_are_dead_lettered_with_reasons_never_clipped():
    raw = np.array([12.5, "40", "abc", None, np.nan, 150.0, -1.0, np.inf, True, 100.0],
                   dtype=object)
    for name in ("central-sum", "central-mean", "central-variance", "central-quantiles"):
        mech = build(name)
        cols, reasons = mech.check(raw)
        why = reasons.as_dict()
        assert sorted(why) == [2, 3, 4, 5, 6, 7, 8], (name, why)
        for i, text in why.items():
            assert text.startswith("value: ") and "[0, 100]" in text, text
        assert "non-numeric" in why[2] and "missing" in why[3] and "missing" in why[4]
        for i in (5, 6, 7):
            assert "outside" in why[i] and "not clipped" in why[i]
        assert cols["value"][1] == 40.0 and cols["value"][9] == 100.0
    # a count reads its column only to count the rows: nothing is dead-lettered
    for name in ("central-count", "privacy-id-count"):
        _, reasons = build(name).check(raw)
        assert not reasons.bad.any()


def test_prepare_encodes_true_values_without_noise(data):
    mech = build("central-sum")
    lat = mech.lattice
    rep = mech.prepare({"value": data}, np.empty((data.size, 0)))
    assert rep["units"].dtype == np.int64
    assert np.abs(rep["units"] * lat.grid - data).max() <= lat.grid / 2
    assert np.array_equal(rep["units"], mech.prepare({"value": data}, None)["units"])
    q = build("central-quantiles", branching=4, height=3)
    leaf = q.prepare({"value": np.array([0.0, 1.5625, 99.99, 100.0])}, None)["leaf"]
    assert leaf.tolist() == [0, 1, 63, 63]  # upper itself is in the last leaf


# ------------------------------------------------------------------------ the exact grid
def test_lattice_is_a_power_of_two_below_the_bound():
    for bound in (50.0, 0.3, 1e6, 123.456, 2.0 ** -30):
        lat = Lattice.of(bound, 1, 1.0, "test")
        mant, _ = math.frexp(lat.grid)
        assert mant == 0.5  # a power of two: t / g is exact
        assert lat.bits == GRID_BITS and 2 ** (GRID_BITS - 1) <= lat.units <= 2 ** GRID_BITS
        x = np.random.default_rng(1).uniform(-bound, bound, 1000)
        u = lat.encode(x)
        assert np.abs(u).max() <= lat.units and np.abs(u * lat.grid - x).max() <= lat.grid / 2
    # a large m / epsilon gives fewer grid bits, keeping the noise scale in the sampler's range
    lat = Lattice.of(1.0, 10**9, 0.5, "test")
    assert lat.bits < GRID_BITS and float(lat.scale) < 2.0 ** 56


def test_wide_sums_are_exact_and_merge_to_the_same_bytes():
    rng = np.random.default_rng(3)
    n = (1 << 20) * 2 + 12345  # beyond one chunk
    units = rng.integers(-(2 ** 40), 2 ** 40, n)
    units[:1000] = 2 ** 40  # extremes
    acc = np.zeros(3, dtype=np.int64)
    wide_add(acc, 1, units)
    assert get_wide(acc, 1) == sum(int(c.sum()) for c in np.array_split(units, 64))
    assert 0 <= acc[1] < 2 ** 32
    parts = [np.zeros(3, dtype=np.int64) for _ in range(3)]
    for p, chunk in zip(parts, np.array_split(units, 3)):
        wide_add(p, 1, chunk)
    merged = normalize_wide(np.sum(np.stack(parts), axis=0), (1,))
    assert merged[1:].tobytes() == acc[1:].tobytes()


def test_merge_is_exact_for_every_release(data):
    for name in NAMES:
        mech = build(name, **({"branching": 4, "height": 3} if name == "central-quantiles"
                              else {}))
        est, whole = accumulate(mech, data)
        parts = [accumulate(mech, chunk, est)[1] for chunk in np.array_split(data, 5)]
        merged = est.merge(parts[::-1])
        assert merged.tobytes() == whole.tobytes(), name
        assert est.n_reports(merged) == data.size


# ------------------------------------------------------------------------ accuracy
def _repeated(mech, acc, stat, reps):
    est_cls = type(mech.estimator())
    vals, ses = [], []
    for seed in range(reps):
        e = est_cls(mech, seed=seed).finalize(acc)
        vals.append(np.asarray(e[stat].value, dtype=float))
        ses.append(np.asarray(e[stat].stderr, dtype=float))
    return np.array(vals), np.array(ses)


ACCURACY = [
    ("central-count", "count", lambda x: x.size, {}),
    ("central-count", "count", lambda x: x.size,
     {"max_partitions_per_unit": 3, "max_rows_per_partition": 4}),
    ("privacy-id-count", "privacy_id_count", lambda x: x.size, {"max_partitions_per_unit": 5}),
    ("central-sum", "sum", lambda x: x.sum(), {}),
    ("central-sum", "sum", lambda x: x.sum(), {"lower": -50.0, "max_rows_per_partition": 5}),
    ("central-mean", "mean", lambda x: x.mean(), {}),
    ("central-mean", "mean", lambda x: x.mean(),
     {"max_partitions_per_unit": 4, "max_rows_per_partition": 5}),
    ("central-variance", "variance", lambda x: x.var(), {}),
    ("central-variance", "variance", lambda x: x.var(), {"max_rows_per_partition": 5}),
    ("central-variance", "mean", lambda x: x.mean(), {}),
]


@pytest.mark.parametrize("name,stat,truth,kw", ACCURACY,
                         ids=[f"{a[0]}-{a[1]}-{i}" for i, a in enumerate(ACCURACY)])
def test_repeated_releases_match_the_stated_standard_error(data, name, stat, truth, kw):
    """400 seeded releases of the same accumulator: the mean error is within 4 SE / sqrt(R) of
    0 and the empirical SD matches the stated SE (the sample variance's 4-sigma band for
    Laplace-tailed errors: relative SD sqrt((2 + kurtosis) / R))."""
    reps = 400
    mech = build(name, **kw)
    _, acc = accumulate(mech, data)
    vals, ses = _repeated(mech, acc, stat, reps)
    se = ses.mean()
    err = vals - truth(data)
    assert abs(err.mean()) < 4 * se / math.sqrt(reps), (err.mean(), se)
    ratio = err.var(ddof=1) / se ** 2
    band = 4 * math.sqrt((2 + LAPLACE_EXCESS_KURTOSIS) / reps)
    assert 1 - band < ratio < 1 + band, (ratio, band)


def test_quantiles_accuracy_against_the_approximate_standard_error(data):
    """Quantiles from a 4^5-leaf tree: the mean error within 4 SE / sqrt(R) plus one leaf width
    (the interpolation bias the SE leaves out), the SD within the (approximate, conservative)
    SE's range."""
    reps = 150
    qs = (0.25, 0.5, 0.75)
    mech = build("central-quantiles", quantiles=qs, branching=4, height=5)
    _, acc = accumulate(mech, data)
    vals, ses = _repeated(mech, acc, "quantiles", reps)
    err = vals - np.quantile(data, qs)
    se = ses.mean(axis=0)
    assert np.all(np.abs(err.mean(axis=0)) < 4 * se / math.sqrt(reps) + mech.leaf_width), \
        (err.mean(axis=0), se)
    ratio = err.std(axis=0, ddof=1) / se
    assert np.all((ratio > 0.4) & (ratio < 1.3)), ratio
    assert np.all(np.diff(vals, axis=1) >= 0)  # monotone in q (one tree per release)
    assert np.all((vals >= 0) & (vals <= 100))


def test_default_quantile_tree_and_clipped_post_processing(data):
    mech = build("central-quantiles", quantiles=(0.5,))
    assert mech.leaves == 16 ** 4 and mech.n_buckets == 16 ** 4
    _, acc = accumulate(mech, data)
    e = type(mech.estimator())(mech, seed=5).finalize(acc)
    st = e["quantiles"]
    assert abs(st.value[0] - np.median(data)) < 6 * st.stderr[0] + mech.leaf_width
    # mean and variance: raw value, and post-processed into their ranges in `clipped`
    for name, stat, lo, hi in (("central-mean", "mean", 0.0, 100.0),
                               ("central-variance", "variance", 0.0, 50.0 ** 2)):
        m = build(name, epsilon=0.05)
        est, acc = accumulate(m, np.array([0.0, 0.0, 100.0]))  # few rows: noise dominates
        outside = 0
        for seed in range(60):
            s = type(est)(m, seed=seed).finalize(acc)[stat]
            assert lo <= s.clipped <= hi
            assert s.clipped == min(max(s.value, lo), hi)
            outside += not lo <= s.value <= hi
        assert outside > 0  # the raw value does leave the range: clipped is not a no-op


# ------------------------------------------------------------------------ empty, keys, retries
@pytest.mark.parametrize("name", NAMES)
def test_empty_and_absent_keys(name):
    mech = build(name, **({"branching": 4, "height": 3} if name == "central-quantiles" else {}))
    est = type(mech.estimator())(mech, seed=11)
    empty = est.finalize(est.create())  # no rows: noise alone, never a fixed error
    assert isinstance(empty, Estimate) and empty.n_reports is None and empty.statistics
    e = est.finalize_key(None, "absent")  # a public key without rows: a noisy empty release
    assert isinstance(e, Estimate) and e.n_reports is None and e.statistics
    again = type(mech.estimator())(mech, seed=11).finalize_key(None, "absent")
    assert json.dumps(e.to_dict()) == json.dumps(again.to_dict())


@pytest.mark.parametrize("name", NAMES)
def test_retries_reproduce_and_keys_never_share_noise(data, name):
    # a small budget: wide noise, so that two independent draws are almost never equal
    mech = build(name, epsilon=1e-3,
                 **({"branching": 4, "height": 3} if name == "central-quantiles" else {}))
    est, acc = accumulate(mech, data)
    cls = type(est)
    # the same seed and accumulator (however it was bundled and merged) -> the same release
    merged = est.merge([accumulate(mech, c, est)[1] for c in np.array_split(data, 4)])
    first = cls(mech, seed=42).finalize_key(acc, "a").to_dict(curator=True)
    retry = cls(mech, seed=42).finalize_key(merged, "a").to_dict(curator=True)
    assert first == retry
    # different keys (equal accumulators), or no key: different noise
    outs = [json.dumps(cls(mech, seed=42).finalize_key(acc, k).to_dict()["statistics"])
            for k in ("a", "b", "c", "d", "e", "f")]
    outs.append(json.dumps(cls(mech, seed=42).finalize(acc).to_dict()["statistics"]))
    assert len(set(outs)) == len(outs)
    # without a seed: OS entropy, a fresh draw every time
    unseeded = {json.dumps(est.finalize(acc).to_dict()["statistics"]) for _ in range(4)}
    assert len(unseeded) > 1


@pytest.mark.parametrize("name", NAMES)
def test_the_exact_numbers_stay_with_the_curator(data, name):
    mech = build(name, **({"branching": 4, "height": 3} if name == "central-quantiles" else {}))
    est, acc = accumulate(mech, data)
    e = est.finalize(acc)
    assert e.n_reports is None
    published = e.to_dict()
    assert "curator" not in published and published["n_reports"] is None
    curator = e.to_dict(curator=True)["curator"]
    assert data.size in curator.values()  # the exact count is the curator's
    if name in ("central-mean", "central-variance"):
        assert repr(curator["mean"]) not in json.dumps(published)


# ------------------------------------------------------------------------ per-unit sensitivity
def _person_data(rng):
    """100 single-row units over keys a, b, c, and a person (unit -1) with 50 rows: 20 in a
    (value 100), 20 in b (value 0), 10 in c (value 100)."""
    keys = np.concatenate([rng.choice(np.array(["a", "b", "c"]), 100),
                           np.repeat(np.array(["a", "b", "c"]), [20, 20, 10])])
    vals = np.concatenate([rng.uniform(0, 100, 100), np.repeat([100.0, 0.0, 100.0], [20, 20, 10])])
    units = np.concatenate([np.arange(100), np.full(50, -1)])
    return keys, vals, units


def _parts(mech, acc):
    """The released integer parts of an accumulator and the L1 sensitivity each is noised for."""
    name = mech.name
    if name in ("central-count", "privacy-id-count"):
        return [(np.array([acc[0]]), mech.sensitivity)]
    if name == "central-sum":
        return [(np.array([acc[0]]), None), (np.array([get_wide(acc, 1)], dtype=object),
                                              mech.lattice.sensitivity)]
    if name == "central-mean":
        return [(np.array([acc[0]]), mech.unit_sensitivity),
                (np.array([get_wide(acc, 1)], dtype=object), mech.sum_lattice.sensitivity)]
    if name == "central-variance":
        return [(np.array([acc[0]]), mech.unit_sensitivity),
                (np.array([get_wide(acc, 1)], dtype=object), mech.sum_lattice.sensitivity),
                (np.array([get_wide(acc, 3)], dtype=object), mech.square_lattice.sensitivity)]
    b = mech.branching
    return [(acc.reshape(b ** lv, -1).sum(axis=1), mech.unit_sensitivity)
            for lv in range(1, mech.height + 1)]


@pytest.mark.parametrize("name", NAMES)
def test_a_heavy_unit_moves_all_keys_by_at_most_the_sensitivity_after_bounding(name):
    rng = np.random.default_rng(8)
    linf = 1 if name == "privacy-id-count" else 3
    kw = {"max_partitions_per_unit": 2, "max_rows_per_partition": linf}
    if name == "central-quantiles":
        kw.update(branching=4, height=3)
    mech = build(name, **kw)
    keys, vals, units = _person_data(rng)

    def per_key(mask):
        out = {}
        for k in ("a", "b", "c"):
            rows = mask & (keys == k)
            out[k] = accumulate(mech, vals[rows])[1] if rows.any() else mech.estimator().create()
        return out

    without = per_key(units != -1)
    change_bounded = change_unbounded = None
    for trial in range(20):  # the bounding's random choices: each must stay within
        keep = bound_contributions(units, keys, 2, linf, rng)
        assert keep[units != -1].all() and keep[units == -1].sum() == 2 * linf
        with_p = per_key(keep)
        for i, (_, sens) in enumerate(_parts(mech, without["a"])):
            if sens is None:
                continue
            moved = sum(int(np.abs(_parts(mech, with_p[k])[i][0] - _parts(mech, without[k])[i][0]
                                   ).sum()) for k in with_p)
            assert moved <= sens, (name, i, moved, sens)
            if i == len(_parts(mech, without["a"])) - 1:
                change_bounded = max(change_bounded or 0, moved)
    # unbounded, the same person moves the last part beyond it: the bound is what protects
    all_rows = per_key(np.ones(units.size, dtype=bool))
    parts = _parts(mech, without["a"])
    i, sens = len(parts) - 1, parts[-1][1]
    change_unbounded = sum(int(np.abs(_parts(mech, all_rows[k])[i][0]
                                      - _parts(mech, without[k])[i][0]).sum()) for k in all_rows)
    assert change_unbounded > sens >= change_bounded


# ------------------------------------------------------------------------ privacy audit
AUDIT_REPS = 2000


def _audit(mech, stat, reps, bounded: bool, seed: int, index=None):
    """Monte Carlo audit of neighbouring datasets: 40 single-row units, with and without a person
    with 50 rows at the domain's upper bound (bounded to the release's contribution bounds, or
    not); releases from the release's own code path; threshold events on the statistic."""
    gen = np.random.default_rng(seed)
    base = np.linspace(10.0, 90.0, 40)
    person = np.full(50, 100.0)
    units = np.concatenate([np.arange(40), np.full(50, -1)])
    vals = np.concatenate([base, person])
    b = mech.contribution_bounds
    est = mech.estimator()
    acc_without = accumulate(mech, base, est)[1]

    def release(acc):
        v = mech.release_from(acc, gen)[0][stat].value
        return float(v if index is None else v[index])

    accs: dict[bytes, np.ndarray] = {}  # the accumulator of each distinct set of kept rows
    # the bounding's random choices (250 draws, used in turn: bounding costs ~1 ms a call)
    keeps = [bound_contributions(units, None, b.l0, b.linf, gen) if bounded else
             np.ones(units.size, dtype=bool) for _ in range(250)]
    s1 = []
    for i in range(reps):
        kept = np.sort(vals[keeps[i % len(keeps)]])
        acc = accs.get(kept.tobytes())
        if acc is None:
            acc = accs[kept.tobytes()] = accumulate(mech, kept, est)[1]
        s1.append(release(acc))
    s2 = [release(acc_without) for _ in range(reps)]
    s1, s2 = np.array(s1), np.array(s2)
    h = reps // 2
    events = A.threshold_events(np.concatenate([s1[:h], s2[:h]]))
    return A.audit_samples(s1, s2, events, alpha=0.05)


AUDITED = [
    ("central-count", "count", None, {"max_rows_per_partition": 3}),
    ("privacy-id-count", "privacy_id_count", None, {}),
    ("central-sum", "sum", None, {"max_rows_per_partition": 3}),
    ("central-mean", "mean", None, {"max_rows_per_partition": 3}),
    ("central-variance", "variance", None, {"max_rows_per_partition": 2}),
    ("central-quantiles", "quantiles", 0, {"max_rows_per_partition": 2, "branching": 2,
                                           "height": 3, "quantiles": (0.9,)}),
]


@pytest.mark.parametrize("name,stat,index,kw", AUDITED, ids=[a[0] for a in AUDITED])
def test_privacy_audit_lower_bound_is_within_the_claim(name, stat, index, kw):
    mech = build(name, **kw)
    claim = per_unit(mech.guarantee, "person", mech.contribution_bounds).epsilon
    res = _audit(mech, stat, AUDIT_REPS, bounded=True, seed=NAMES.index(name), index=index)
    assert res["epsilon_lower"] <= claim, res
    if name in ("central-count", "privacy-id-count"):  # the exact loss: ||shift||_1 / t
        shift = mech.contribution_bounds.l1 if name == "central-count" else 1
        assert A.discrete_laplace_shift_epsilon([shift], mech.scale) <= claim + 1e-9


@pytest.mark.parametrize("name,stat", [("central-count", "count"), ("central-mean", "mean")])
def test_privacy_audit_sees_a_violation_without_bounding(name, stat):
    """The negative control: the same release with the person's 50 rows NOT bounded (calibrated
    to 3 rows): the audit's lower bound exceeds the per-unit claim, so the audit can fail."""
    mech = build(name, max_rows_per_partition=3)
    claim = per_unit(mech.guarantee, "person", mech.contribution_bounds).epsilon
    res = _audit(mech, stat, AUDIT_REPS, bounded=False, seed=7)
    assert res["epsilon_lower"] > claim, res
