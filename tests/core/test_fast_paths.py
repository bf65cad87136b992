"""The fast paths give exactly what the reference implementations give.

* :func:`ldp_beam.core.encode_categories` (integer lookup tables, integral floats, Arrow strings
  and dictionaries) against :func:`ldp_beam.core.encode_categories_reference`: the same codes,
  the same missing and unknown rows, on random columns with nulls, unknown labels, NaN, ints as
  floats, huge and negative values;
* the dead letters of :meth:`Mechanism.check` on Arrow text columns: the same reasons as on the
  same column read as Python objects.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ldp_beam import build_mechanism
from ldp_beam.core import encode_categories, encode_categories_reference

DOMAINS = [
    tuple(str(i) for i in range(20)),
    ("-3", "0", "7", "x", "2.5", "inf", "True"),
    ("1", "100000", "-7"),  # a wide integer span: the sorted search, not the table
    ("a", "b", "c"),  # no integer label at all
    (str(2**63 - 1), str(-2**63), "0", str(2**64)),  # int64's ends, one beyond it
]


def _same(values, labels, reference_values=None):
    got = encode_categories(values, labels)
    ref = encode_categories_reference(values if reference_values is None else reference_values,
                                      labels)
    for name, g, r in zip(("codes", "missing", "unknown"), got, ref):
        assert g.dtype == r.dtype, name
        np.testing.assert_array_equal(g, r, err_msg=name)
    return got


@pytest.mark.parametrize("labels", DOMAINS)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64", "uint32",
                                   "uint64"])
def test_integer_columns(labels, dtype):
    rng = np.random.default_rng(len(labels))
    info = np.iinfo(dtype)
    pool = [0, 1, 7, 20, 100000, -3, -7, info.min, info.max, 2**63 - 1, -2**63]
    pool = [v for v in pool if info.min <= v <= info.max]
    small = rng.integers(max(int(info.min), -30), min(int(info.max), 30), 500, endpoint=True)
    vals = np.concatenate([small.astype(dtype),
                           np.array(pool, dtype=dtype)[rng.integers(0, len(pool), 200)]])
    assert vals.dtype == np.dtype(dtype)
    _same(vals, labels)
    _same(vals[:0], labels)


@pytest.mark.parametrize("labels", DOMAINS)
def test_float_columns(labels):
    rng = np.random.default_rng(7)
    specials = np.array([np.nan, -0.0, 0.0, 2.5, np.inf, -np.inf, 1e300, 2.0**53, 2.0**53 + 2,
                         -2.0**63, 2.0**63, 2.0**64, 0.1, -3.0, 7.0, 100000.0, 1e-5])
    vals = np.concatenate([rng.integers(-25, 25, 400).astype(float), rng.choice(specials, 300),
                           rng.uniform(-5, 5, 50)])
    rng.shuffle(vals)
    _same(vals, labels)
    with np.errstate(over="ignore"):
        _same(vals.astype(np.float32), labels)
    _same(np.arange(-5.0, 25.0), labels)  # every value integral: one lookup


@pytest.mark.parametrize("labels", DOMAINS)
def test_arrow_text_and_dictionaries(labels):
    rng = np.random.default_rng(3)
    pool = list(labels) + [None, "", " 1", "1.0", "zz", "NaN", "-0", "True", "0"]
    texts = [pool[i] for i in rng.integers(0, len(pool), 800)]
    objects = np.array(texts, dtype=object)
    for t in (pa.string(), pa.large_string()):
        arr = pa.array(texts, type=t)
        _same(arr, labels, objects)
        _same(pa.chunked_array([arr[:300], arr[300:]]), labels, objects)
        _same(arr.dictionary_encode(), labels, objects)
        _same(pa.chunked_array([arr.dictionary_encode()]), labels, objects)
        _same(arr[:0], labels, objects[:0])


def test_arrow_numbers_and_other_types():
    labels = ("0", "1", "5", "True")
    ints = pa.array([0, 1, None, 5, 9, -1], type=pa.int32())
    _same(ints, labels, np.array([0, 1, np.nan, 5, 9, -1], dtype=float))
    _same(pa.array([0.0, 1.5, None, float("nan"), 5.0]), labels,
          np.array([0.0, 1.5, np.nan, np.nan, 5.0]))
    _same(pa.array([True, False, None]), labels, np.array([True, False, None], dtype=object))
    _same(pa.array([0, 5, None, 3]).dictionary_encode(), labels,
          np.array([0, 5, None, 3], dtype=object))


def test_objects_and_mixed_values_use_the_reference():
    labels = ("1", "2", "a")
    vals = np.array([1, 2.0, "a", None, float("nan"), "", True, np.int8(2), b"a", "b"],
                    dtype=object)
    _same(vals, labels)


@pytest.mark.parametrize("mech,params,cols", [
    ("grr", {"epsilon": 1.0, "domain": ["a", "b", "c"]}, ("value",)),
    ("cprr", {"epsilon": 2.0, "x_domain": ["a", "b", "c"], "y_domain": ["u", "v"],
              "x_sensitive": ["a"], "y_sensitive": ["u"]}, ("x", "y")),
])
def test_dead_letters_of_arrow_text_equal_those_of_objects(mech, params, cols):
    m = build_mechanism(mech, **params)
    rng = np.random.default_rng(5)
    pools = {c: list(m.labels(c)) + [None, "", "zz", "A"] for c in cols}
    data = {c: [pools[c][i] for i in rng.integers(0, len(pools[c]), 300)] for c in cols}
    fast_cols, fast = m.check({c: pa.array(v) for c, v in data.items()})
    slow_cols, slow = m.check({c: np.array(v, dtype=object) for c, v in data.items()})
    assert fast.as_dict() == slow.as_dict()
    assert fast.bad.any()
    for c in cols:
        np.testing.assert_array_equal(fast_cols[c], slow_cols[c])
    ok = ~fast.bad
    u = np.asfortranarray(np.random.default_rng(1).random((int(ok.sum()), m.draws)))
    a = m.randomize({c: v[ok] for c, v in fast_cols.items()}, u)
    b = m.randomize({c: v[ok] for c, v in slow_cols.items()}, u)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


# --------------------------------------------------------------------------- keyed draws
def test_keyed_uniforms_equal_one_generator_per_record():
    from ldp_beam.rng import RandomSource, RunKey, stream_id

    streams = np.array([stream_id(i) for i in range(40)] + [stream_id("r-7"), 0, 2**64 - 1],
                       dtype=np.uint64)
    offsets = np.arange(streams.size) * 5
    for src in (RandomSource(3), RandomSource(key=RunKey.new().key), RunKey.new("s").source()):
        for draws in (1, 2, 3, 4, 7):
            got = src.keyed_uniforms(streams, offsets, draws)
            want = np.vstack([src.uniforms(1, draws, stream=int(s), offset=int(o))
                              for s, o in zip(streams.tolist(), offsets.tolist())])
            np.testing.assert_array_equal(got, want)
            assert got.flags.f_contiguous
            np.testing.assert_array_equal(src.keyed_uniforms(streams, 0, draws)[3],
                                          src.uniforms(1, draws, stream=int(streams[3]),
                                                       offset=0)[0])
        assert src.keyed_uniforms(streams[:0], 0, 2).shape == (0, 2)


# --------------------------------------------------------------------------- element path
def _element_reports(records, buffer_size, monkeypatch, seed=9):
    from apache_beam.transforms.window import GlobalWindow

    from ldp_beam.transforms import perturb
    from ldp_beam.transforms.perturb import DeadLetterRecord, PerturbFn

    monkeypatch.setattr(perturb, "ELEMENT_BUFFER", buffer_size)
    m = build_mechanism("grr", epsilon=1.0, domain=[str(i) for i in range(6)])
    fn = PerturbFn(m, key_column="rid", keep=("rid",), seed=seed)
    fn.setup()
    fn.start_bundle()
    outs = [o for r in records for o in fn.process(r, 0, GlobalWindow())]
    outs += list(fn.finish_bundle() or [])
    reps, dead = {}, {}
    for o in outs:
        v = getattr(o, "value", o)
        if isinstance(v, DeadLetterRecord):
            dead[v["record"]["rid"]] = v["reason"]
        else:
            reps[v["rid"]] = v["v"]
    return reps, dead


def test_element_reports_do_not_depend_on_buffering(monkeypatch):
    rng = np.random.default_rng(2)
    records = [{"rid": f"r{i}", "value": int(v)} for i, v in enumerate(rng.integers(0, 7, 300))]
    records[5] = {"rid": "r5"}  # no value field
    records[9]["value"] = None
    # (the reasons' wording of a value may follow the buffer's column type, 6 or 6.0: the
    # reports and which records are dead letters may not)
    reps, dead = _element_reports(records, 4096, monkeypatch)
    for size in (1, 7, 64):
        r, d = _element_reports(records, size, monkeypatch)
        assert r == reps and set(d) == set(dead)
    assert set(dead) == {"r5", "r9"} | {r["rid"] for r in records if r.get("value") == 6}
    # the same record ids in another order: the same reports
    r, d = _element_reports(records[::-1], 50, monkeypatch)
    assert r == reps and set(d) == set(dead)


def test_folding_combine_fails_on_a_malformed_report_as_adding_it_alone():
    """(Folding equals adding each report: tests/transforms/test_speed_equivalence.py.)"""
    from ldp_beam import estimator_for
    from ldp_beam.transforms.combine import EstimatorCombineFn, FoldingCombineFn

    est = estimator_for(build_mechanism("grr", epsilon=1.0, domain=[str(i) for i in range(6)]))
    one, fold = EstimatorCombineFn(est), FoldingCombineFn(est)
    # a malformed report fails as it would alone
    bad = fold.create_accumulator()
    fold.add_input(bad, {"v": 70000})
    with pytest.raises(Exception) as got:
        fold.extract_output(bad)
    with pytest.raises(Exception) as want:
        one.add_input(one.create_accumulator(), {"v": 70000})
    assert type(got.value) is type(want.value) and str(got.value) == str(want.value)
