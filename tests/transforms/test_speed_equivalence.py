"""The element path's and the accumulators' speed-ups give exactly what the plain versions give.

* single records buffered as field values (not as records, see ``perturb._RecordBuffer``):
  every report and dead letter, and every output's timestamp, window and pane, equal to those of
  the records perturbed one at a time (a buffer of one), whatever the buffer size, the runs of
  timestamps and windows, missing fields and Mapping records that are not dicts;
* ``FoldingCombineFn`` keeping pending reports as field values: the accumulator of adding each
  report alone, for one- and two-field reports, and the same failure for a report without a
  field;
* the sums of squares of ``BinnedDensity`` and ``MomentEstimator`` (numpy's pairwise sum, no
  BLAS call) within the float rounding bound of the exact sum.
"""
from __future__ import annotations

import collections
import math
from fractions import Fraction

import numpy as np
import pytest
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from ldp_beam import build_mechanism, estimator_for


def _outputs(mech, items, buffer_size, monkeypatch, **kw):
    """``items``: (record, windowed value) pairs -> [(value, timestamp, windows, pane)]."""
    from ldp_beam.transforms import perturb
    from ldp_beam.transforms.perturb import PerturbFn

    monkeypatch.setattr(perturb, "ELEMENT_BUFFER", buffer_size)
    fn = PerturbFn(mech, seed=5, **kw)
    fn.setup()
    fn.start_bundle()
    outs = [o for r, w in items for o in fn.process(r, w)]
    outs += list(fn.finish_bundle() or [])
    return [(dict(o.value), o.timestamp, o.windows, o.pane_info) for o in outs]


def _by_record(outs, key):
    """Outputs keyed by record id (reports by their kept id, dead letters by their shown id)."""
    got = {}
    for value, ts, windows, pane in outs:
        rid = value["record"][key] if "reason" in value else value[key]
        got[("dead" if "reason" in value else "report", rid)] = (value, ts, windows, pane)
    return got


def _items(n=400, seed=3):
    rng = np.random.default_rng(seed)
    late = PaneInfo(False, False, PaneInfoTiming.LATE, 1, 1)
    items = []
    for i in range(n):
        rec = {"rid": i, "x": str(int(rng.integers(0, 7))), "region": f"r{i % 3}"}
        if i % 37 == 5:
            del rec["x"]  # no input field
        if i % 41 == 7:
            rec = collections.defaultdict(lambda: "0", {k: v for k, v in rec.items()
                                                        if k != "x"})  # makes up nothing
        if i % 43 == 11:
            rec = collections.OrderedDict(rec)  # a Mapping that is a dict subclass
        # runs of windowed values: the same objects, equal new ones, and changes
        block = (i // 25) % 4
        ts = Timestamp(micros=1000 * (i // 50))
        windows = (GlobalWindow(),) if block < 2 else (IntervalWindow(0, 100 + block),)
        pane = late if block == 3 else PaneInfo(True, True, PaneInfoTiming.ON_TIME, 0, 0)
        items.append((rec, WindowedValue(None, ts, windows, pane)))
    return items


@pytest.mark.parametrize("dead_columns", ["mapped", "all"])
def test_buffered_records_equal_records_one_at_a_time(monkeypatch, dead_columns):
    mech = build_mechanism("grr", epsilon=1.0, domain=[str(i) for i in range(6)])
    items = _items()
    kw = dict(columns={"value": "x"}, key_column="rid", keep=("rid", "region"),
              dead_letter_columns=dead_columns)
    alone = _by_record(_outputs(mech, items, 1, monkeypatch, **kw), "rid")
    assert any(k[0] == "dead" for k in alone) and any(k[0] == "report" for k in alone)
    for size in (2, 7, 64, 4096):
        got = _outputs(mech, items, size, monkeypatch, **kw)
        assert _by_record(got, "rid") == alone
        assert len(got) == len(items)
    # each report's id follows from its record: its windowed value is its record's
    for (kind, rid), (_, ts, windows, pane) in alone.items():
        _, w = items[rid]
        assert (ts, windows, pane) == (w.timestamp, w.windows, w.pane_info)
        if kind == "dead" and dead_columns == "mapped":
            rec = alone[(kind, rid)][0]["record"]
            assert rec == {k: items[rid][0][k] for k in ("rid", "x") if k in items[rid][0]}


def test_buffered_records_multi_role_mechanism(monkeypatch):
    mech = build_mechanism("cprr", epsilon=2.0, x_domain=list("abc"), y_domain=list("xyz"),
                           x_sensitive=["a"], y_sensitive=["x"])
    rng = np.random.default_rng(8)
    w = WindowedValue(None, 0, (GlobalWindow(),))
    items = [({"id": f"k{i}", "p": "abcd"[int(rng.integers(0, 4))],
               "q": "xyz"[int(rng.integers(0, 3))]}, w) for i in range(300)]
    kw = dict(columns={"x": "p", "y": "q"}, key_column="id", keep=("id",))
    alone = _by_record(_outputs(mech, items, 1, monkeypatch, **kw), "id")
    assert any(k[0] == "dead" for k in alone)  # "d" is not in x_domain
    for size in (3, 128):
        assert _by_record(_outputs(mech, items, size, monkeypatch, **kw), "id") == alone


@pytest.mark.parametrize("name,params", [
    ("grr", {"epsilon": 1.0, "domain": [str(i) for i in range(6)]}),
    ("cprr", {"epsilon": 2.0, "x_domain": list("abc"), "y_domain": list("xyz"),
              "x_sensitive": ["a"], "y_sensitive": ["x"]}),
])
def test_folding_equals_adding_each_report(name, params):
    from ldp_beam.transforms import combine
    from ldp_beam.transforms.combine import EstimatorCombineFn, FoldingCombineFn

    mech = build_mechanism(name, **params)
    est = estimator_for(mech)
    rng = np.random.default_rng(1)
    n = 2 * combine.FOLD_RECORDS + 17
    reports = mech.perturb({r.name: rng.choice(list(mech.labels(r.name)), n)
                            for r in mech.roles if r.kind == "category"}, rng=4)
    singles = [{k: int(v[i]) for k, v in reports.items()} | {"kept": i} for i in range(n)]
    one = EstimatorCombineFn(est)
    want = one.create_accumulator()
    for r in singles:
        want = one.add_input(want, r)
    fold = FoldingCombineFn(est)
    accs = []
    for chunk in (singles[:3], singles[3:1500], singles[1500:]):
        a = fold.create_accumulator()
        for r in chunk:
            a = fold.add_input(a, r)
        accs.append(fold.compact(a) if len(accs) == 1 else a)
    import pickle

    merged = fold.merge_accumulators([pickle.loads(pickle.dumps(a)) for a in accs])
    np.testing.assert_array_equal(merged.acc, want)
    assert fold.extract_output(merged).to_dict() == one.extract_output(want).to_dict()
    # a report batch between single reports: added in order, the same counts
    a = fold.create_accumulator()
    a = fold.add_input(a, singles[0])
    a = fold.add_input(a, {k: v[1:] for k, v in reports.items()})
    fold._fold(a)
    np.testing.assert_array_equal(a.acc, want)


def test_folding_a_report_without_a_field_fails_as_alone():
    from ldp_beam.transforms.combine import EstimatorCombineFn, FoldingCombineFn

    mech = build_mechanism("cprr", epsilon=2.0, x_domain=list("abc"), y_domain=list("xyz"),
                           x_sensitive=["a"], y_sensitive=["x"])
    est = estimator_for(mech)
    one = EstimatorCombineFn(est)
    with pytest.raises(Exception) as alone:
        one.add_input(one.create_accumulator(), {"x": 1})
    fold = FoldingCombineFn(est)
    a = fold.create_accumulator()
    a = fold.add_input(a, {"x": 0, "y": 2})
    with pytest.raises(type(alone.value)):
        a = fold.add_input(a, {"x": 1})
        fold.extract_output(a)


def test_sums_of_squares_within_rounding_of_the_exact_sum():
    from ldp_beam.core import MomentEstimator
    from ldp_beam.estimators.density import BinnedDensity

    rng = np.random.default_rng(6)
    for n in (1, 7, 65_536, 100_003):
        y = rng.uniform(-50.0, 150.0, n)
        exact = float(sum(Fraction(v) ** 2 for v in y.tolist()))
        bound = n * 2.0 ** -52 * float(np.sum(y * y)) + 1e-300
        b = BinnedDensity(0.0, 100.0, 64)
        acc = b.add(b.create(), y)
        assert abs(acc[-1] - exact) <= bound
        assert acc[-3] == n and acc[-2] == pytest.approx(float(np.sum(y)), rel=1e-12)

        class Mean(MomentEstimator):
            def statistics(self, acc):  # pragma: no cover - not used
                return {}

        m = Mean(build_mechanism("grr", epsilon=1.0, domain=["a", "b"]))
        acc = m.add(m.create(), {"y": y})
        assert acc[0] == n and abs(acc[2] - exact) <= bound
        assert math.isfinite(acc[1])
