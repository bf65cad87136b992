"""Accumulators: any split of the reports into batches, added in any order and merged in any
order or grouping, gives the same accumulator (exactly for count accumulators; within the float
rounding bound ``n * 2**-52 * sum|y|`` for moment accumulators), for every registered estimator."""
from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ldp_beam import EmptyAccumulatorError, build_mechanism, estimator_for, get_registry
from ldp_beam.core import CentralRelease
from ldp_beam_test_helpers import SAMPLE_OPTIONS, SAMPLE_PARAMS, emit, valid_columns

SEED = 99
N_REPORTS = 300
EPS_F = 2.0**-52

_CACHE: dict[str, tuple] = {}


def setup_for(name: str):
    """(mechanism, estimator, reports) for a registered name; plugins get generic numeric input
    where they take it, and are skipped with a reason otherwise."""
    if name in _CACHE:
        return _CACHE[name]
    params = SAMPLE_PARAMS.get(name, {"epsilon": 1.0})
    try:
        mech = build_mechanism(name, **params)
    except Exception as exc:  # a plugin with other required parameters
        pytest.skip(f"no sample parameters for plugin {name!r} ({exc}); add to SAMPLE_PARAMS")
    data = valid_columns(mech, N_REPORTS, np.random.default_rng(SEED))
    try:
        reports = emit(mech, data, rng=SEED)
    except Exception as exc:
        pytest.skip(f"no sample input for plugin {name!r} ({exc}); add one to this file")
    est = estimator_for(mech, **SAMPLE_OPTIONS.get(name, {}))
    _CACHE[name] = (mech, est, reports)
    return _CACHE[name]


NAMES = get_registry().names()


def subset(reports, rows):
    return {k: v[rows] for k, v in reports.items()}


def assert_same_acc(est, acc, ref, reports):
    if hasattr(est, "canonical"):  # row accumulators: the same rows, in any order, exactly
        np.testing.assert_array_equal(est.canonical(acc), est.canonical(ref))
        return
    assert acc.shape == ref.shape and acc.dtype == ref.dtype
    if ref.dtype.kind in "iu":  # count accumulators: exact
        np.testing.assert_array_equal(acc, ref)
        return
    if hasattr(est, "binned"):
        # BinnedDensity layout [counts..., below, above, n, sum, sumsq]: the counts are exact
        # integers in float64; the last two are float sums, bounded as below
        np.testing.assert_array_equal(acc[:-2], ref[:-2])
        y = np.concatenate([np.asarray(v, np.float64).ravel() for v in reports.values()])
        n = y.size
        assert abs(acc[-2] - ref[-2]) <= 2 * n * EPS_F * np.abs(y).sum()
        assert abs(acc[-1] - ref[-1]) <= 2 * n * EPS_F * (y * y).sum()
        return
    # moment accumulator [n, sum y, sum y^2]: each float sum of n terms in any order is within
    # n * 2^-52 * sum|term| of any other (a factor 2 for the two summations compared)
    y = np.asarray(reports[est.value_field], np.float64)
    n = y.size
    assert acc[0] == ref[0] == n
    assert abs(acc[1] - ref[1]) <= 2 * n * EPS_F * np.abs(y).sum()
    assert abs(acc[2] - ref[2]) <= 2 * n * EPS_F * (y * y).sum()


@st.composite
def plans(draw):
    """A random plan: row order, batch boundaries, which accumulator takes each batch, and the
    merge tree."""
    perm_seed = draw(st.integers(0, 2**32 - 1))
    cuts = sorted(draw(st.lists(st.integers(0, N_REPORTS), max_size=12)))
    # the assignment of batches to accumulators and the merge tree come from a seeded Random
    # (st.randoms() makes hypothesis's minimal example too large for its health check)
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    return perm_seed, cuts, rnd


def run_plan(est, reports, plan):
    perm_seed, cuts, rnd = plan
    rows = np.random.default_rng(perm_seed).permutation(N_REPORTS)
    batches = np.split(rows, cuts)  # empty batches included (an empty bundle is legal)
    rnd.shuffle(batches)
    n_accs = rnd.randint(1, len(batches))
    accs = [est.create() for _ in range(n_accs)]
    for b in batches:
        i = rnd.randrange(n_accs)
        accs[i] = est.add(accs[i], subset(reports, b))
    if rnd.random() < 0.5:
        accs.append(est.create())  # merging an empty accumulator changes nothing
    # merge in a random tree: repeatedly merge a random group, put the result back anywhere
    while len(accs) > 1:
        rnd.shuffle(accs)
        size = rnd.randint(1, len(accs))
        merged = est.merge(accs[:size])
        accs = accs[size:]
        accs.insert(rnd.randint(0, len(accs)), merged)
    return accs[0]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=50, deadline=None, derandomize=True)
@given(plan=plans())
def test_any_split_order_and_merge_tree_gives_the_same_accumulator(name, plan):
    mech, est, reports = setup_for(name)
    ref = est.add(est.create(), reports)
    acc = run_plan(est, reports, plan)
    assert_same_acc(est, acc, ref, reports)
    if ref.dtype.kind in "iu" or hasattr(est, "canonical"):  # the same release, bit for bit
        try:
            expected = est.finalize(ref).to_dict()
        except EmptyAccumulatorError:
            return
        assert est.finalize(acc).to_dict() == expected


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=50, deadline=None, derandomize=True)
@given(a=plans(), b=plans())
def test_merge_is_commutative_and_associative(name, a, b):
    mech, est, reports = setup_for(name)
    x, y = run_plan(est, reports, a), run_plan(est, reports, b)
    z = est.add(est.create(), subset(reports, np.arange(0, N_REPORTS, 3)))
    full = {k: np.concatenate([v, v, reports[k][::3]]) for k, v in reports.items()}
    assert_same_acc(est, est.merge([x, y, z]), est.merge([z, y, x]), full)
    assert_same_acc(est, est.merge([est.merge([x, y]), z]), est.merge([x, est.merge([y, z])]),
                    full)


@pytest.mark.parametrize("name", NAMES)
def test_empty_accumulator(name):
    mech, est, reports = setup_for(name)
    a, b = est.create(), est.create()
    assert a is not b
    np.testing.assert_array_equal(a, b)
    assert est.n_reports(a) == 0
    # create() returns a fresh accumulator each time: adding to one leaves the next untouched
    est.add(a, reports)
    np.testing.assert_array_equal(est.create(), b)
    assert est.n_reports(est.create()) == 0
    # merge([]) is the empty accumulator; the empty accumulator is merge's identity
    np.testing.assert_array_equal(est.merge([]), est.create())
    ref = est.add(est.create(), reports)
    assert_same_acc(est, est.merge([est.create(), ref.copy(), est.create()]), ref, reports)
    assert_same_acc(est, est.merge([ref.copy()]), ref, reports)
    # adding no reports changes nothing
    assert_same_acc(est, est.add(ref.copy(), mech.empty_reports()), ref, reports)
    if isinstance(mech, CentralRelease):
        # released as noise alone: a fixed error for no rows, where one person's row gives a
        # noisy answer, would be a difference no epsilon bounds
        e = est.finalize(est.merge([]))
        assert e.n_reports is None and e.statistics and e.guarantee == mech.guarantee
    else:
        with pytest.raises(EmptyAccumulatorError, match="no reports"):
            est.finalize(est.merge([]))
    # small and picklable, whatever the number of reports (binned densities: a few thousand
    # bins; counts need at most 1 MiB) -- except OSPDPRR's, which must hold one row per user
    # (its TOPSIS normalization and sampling thresholds need every user; documented there)
    if not getattr(est, "accumulates_rows", False):
        assert ref.shape == est.create().shape and ref.nbytes <= 1 << 20
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(ref)), ref)


def _one(reports, i):
    return {k: v[i:i + 1] for k, v in reports.items()}


@pytest.mark.parametrize("name", NAMES)
def test_single_report(name):
    """One report: an estimate with n_reports = 1, or EmptyAccumulatorError saying why."""
    mech, est, reports = setup_for(name)
    for i in range(20):
        acc = est.add(est.create(), _one(reports, i))
        assert est.n_reports(acc) == 1
        try:
            e = est.finalize(acc)
        except EmptyAccumulatorError as exc:
            assert mech.name in str(exc) and len(str(exc)) > 30
            continue
        # central-DP releases do not disclose the exact record count (n_reports is None)
        assert e.n_reports == (None if isinstance(mech, CentralRelease) else 1) and e.statistics


def test_single_report_per_estimator():
    """Which estimators can answer from one report, and the messages of those that cannot."""
    def single(name, **fields):
        mech, est, _ = setup_for(name)
        return est.estimate({k: np.array([v], dtype=dt)
                             for (k, dt), v in zip(mech.report_fields, fields.values())})

    for name in ("bisample", "bisample-md"):
        with pytest.raises(EmptyAccumulatorError, match="both sampling directions"):
            single(name, s=1, b=1)
    e = single("harmony", y=1)
    assert e.n_reports == 1 and np.isfinite(e["mean"].value)
    assert e["mean"].stderr > 0  # Agresti-Coull: one report never gives a zero-width interval
    e = single("pm", y=0.5)
    assert e.n_reports == 1 and e["mean"].stderr is None  # no variance from one report
    assert e["mean"].ci() is None
    e = single("privkvm", k=1, v=-1)
    assert e.n_reports == 1 and np.isfinite(e["missing_rate"].value)
    e = single("privkvm", k=0, v=0)  # the missing rate exists; the mean does not
    assert np.isfinite(e["missing_rate"].value)
    assert e["mean"].value is None and "no report carries key 1" in e["mean"].note
    # two reports, one per direction, are enough for BiSample
    mech, est, _ = setup_for("bisample")
    e = est.estimate({"s": np.array([0, 1], np.uint8), "b": np.array([0, 1], np.uint8)})
    assert e.n_reports == 2 and np.isfinite(e["mean"].value)
