"""Fuzzing of the public entry points that take user data or parameters (issue 8, Reliability).

For every registered built-in mechanism:

1. ``Registry.build`` with random parameter values (Python objects and their command-line string
   form) either builds or raises a documented error (a subclass of ``LdpBeamError``).
2. ``check`` on random columns never raises for bad *values*; the rows it accepts perturb (a
   central release: prepare), with reports of the declared dtypes and lengths; ``perturb``
   (``records``) raises ``InvalidRecordsError`` iff ``check`` flagged a row.
3. Estimates from the reports of valid random input are finite (value and stderr) except the
   documented undefined cases; ``EmptyAccumulatorError`` is the only error allowed.
4. ``check_reports`` on garbage telemetry never raises; the rows it accepts can be accumulated.
5. Central histogram ``release_counts`` on random counts: ``ParameterError`` or a finite
   histogram.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ldp_beam.core import CentralRelease, coerce_numeric
from ldp_beam.errors import (EmptyAccumulatorError, InvalidRecordsError, LdpBeamError,
                             ParameterError)
from ldp_beam.registry import get_registry
from ldp_beam.rng import as_source, draw_uniforms
from ldp_beam_test_helpers import SAMPLE_PARAMS, emit, valid_columns

REG = get_registry()
BUILTINS = [d["name"] for d in REG.describe() if d["source"] == "ldp-beam"]
DESCRIBE = {d["name"]: d for d in REG.describe()}

CENTRAL = [n for n in BUILTINS if issubclass(REG.get(n).mechanism, CentralRelease)]
HISTOGRAMS = [n for n in CENTRAL if hasattr(REG.get(n).mechanism, "bins")]

FUZZ = settings(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

_MECHS: dict = {}


def mech_of(name):
    if name not in _MECHS:
        _MECHS[name] = REG.build(name, SAMPLE_PARAMS[name])
    return _MECHS[name]


def test_every_builtin_has_sample_params():
    assert sorted(SAMPLE_PARAMS) == sorted(BUILTINS)


# --------------------------------------------------------------------------- strategies
NUMBERS = st.one_of(
    st.sampled_from([0, 0.0, -0.0, 1, -1, 2, 0.5, -0.5, 1e-300, -1e-300, 1e300, -1e300,
                     float("nan"), float("inf"), float("-inf"), 2**63, -(2**63), 10**30]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
TEXT = st.one_of(
    st.sampled_from(["", " ", ",", ",,", "a", "a,b", "a,a", "a,b,c", "u,v", "1,2,3", "nan",
                     "inf", "-inf", "1e999", "None", "null", "true", "false", "0", "-1", "0.5",
                     "sum", "mean", "rnd", "sound", "exact", "paper", "product", "vector",
                     "\x00", "é,ü", "1,,2", " a , b "]),
    st.text(max_size=12),
    st.lists(st.sampled_from(["a", "b", "c", "u", "v", "1", "", " "]), max_size=4)
    .map(",".join),
)
VALUES = st.one_of(
    NUMBERS, TEXT, st.none(), st.booleans(),
    st.lists(st.one_of(st.sampled_from(["a", "b", "c", 1, 2.5, None, True]), st.text(max_size=3)),
             max_size=4).map(tuple),
    st.sampled_from([[], {}, object(), b"ab", np.float64(1.5), np.int64(3), np.nan,
                     complex(1, 1)]),
)


@st.composite
def param_dicts(draw, name):
    """Start from the sample parameters and overwrite a random subset with random values (or drop
    them, or add an unknown one); optionally send every value as its command-line string."""
    params = dict(SAMPLE_PARAMS[name])
    names = [p["name"] for p in DESCRIBE[name]["parameters"]]
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    for p in chosen:
        if draw(st.integers(0, 9)) == 0:
            params.pop(p, None)
        else:
            params[p] = draw(VALUES)
    if draw(st.integers(0, 19)) == 0:
        params["no_such_parameter"] = draw(VALUES)
    if draw(st.booleans()):  # the CLI's form: every value a string
        params = {k: (v if isinstance(v, str) else
                      ",".join(map(str, v)) if isinstance(v, tuple) else str(v))
                  for k, v in params.items()}
    return params


# --------------------------------------------------------------------------- 1. parameters
@pytest.mark.parametrize("name", BUILTINS)
@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_build_with_random_parameters_raises_only_documented_errors(name, data):
    params = data.draw(param_dicts(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            mech = REG.build(name, params)
        except LdpBeamError:
            return
        except Exception as exc:  # noqa: BLE001 - the point of the test
            pytest.fail(f"build({name!r}, {params!r}) raised {type(exc).__name__}: {exc}")
    mech.describe()  # a built mechanism describes itself and states its guarantee
    mech.guarantee


@pytest.mark.parametrize("name", BUILTINS)
def test_unknown_parameter_and_missing_required_are_parameter_errors(name):
    with pytest.raises(ParameterError, match="no_such_parameter"):
        REG.build(name, {**SAMPLE_PARAMS[name], "no_such_parameter": "1"})
    required = [p["name"] for p in DESCRIBE[name]["parameters"] if p["required"]]
    for p in required:
        params = {k: v for k, v in SAMPLE_PARAMS[name].items() if k != p}
        with pytest.raises(ParameterError, match=p):
            REG.build(name, params)


# --------------------------------------------------------------------------- 2. data
ELEMENTS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, 5.0, 10.0, -1.0, 11.0, 1e308, -1e308, 0.5, 0.3, 1e-320]),
    st.integers(-(2**40), 2**40), st.sampled_from(["a", "b", "c", "u", "v", "1", "3.0", ""]),
    st.text(max_size=4), st.none(), st.booleans(),
)


@st.composite
def columns(draw, n):
    kind = draw(st.sampled_from(["float", "int", "str", "object", "bool", "valid"]))
    if kind == "float":
        return np.array(draw(st.lists(st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from([0.0, 0.5, 1.0, 5.0, 10.0, -1.0, 1e308])), min_size=n, max_size=n)),
            dtype=np.float64)
    if kind == "int":
        return np.array(draw(st.lists(st.integers(-(2**62), 2**62) | st.integers(-2, 12),
                                      min_size=n, max_size=n)), dtype=np.int64)
    if kind == "str":
        return np.array(draw(st.lists(st.sampled_from(["a", "b", "c", "u", "v", "1", "2.5", "x",
                                                        "nan", ""]) | st.text(max_size=3),
                                      min_size=n, max_size=n)), dtype=str)
    if kind == "bool":
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    if kind == "valid":
        return None  # filled with valid values by the caller
    arr = np.empty(n, dtype=object)
    arr[:] = draw(st.lists(ELEMENTS, min_size=n, max_size=n))
    return arr


def assert_reports(mech, reports, n):
    fields = dict(mech.report_fields)
    assert set(reports) == set(fields)
    for k, dt in fields.items():
        assert reports[k].dtype == np.dtype(dt), (k, reports[k].dtype, dt)
        assert reports[k].shape == (n,)


@pytest.mark.parametrize("name", BUILTINS)
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_check_never_raises_for_bad_values_and_accepted_rows_perturb(name, data):
    mech = mech_of(name)
    n = data.draw(st.integers(0, 12))
    g = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    cols = valid_columns(mech, n, g)
    for r in mech.roles:
        if not r.required and data.draw(st.booleans()):
            del cols[r.name]
            continue
        col = data.draw(columns(n))
        if col is not None:
            cols[r.name] = col
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            coerced, reasons = mech.check(cols)
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"check raised {type(exc).__name__}: {exc} on {cols!r}")
        assert reasons.n == n and reasons.bad.shape == (n,)
        assert set(reasons.as_dict()) == set(np.flatnonzero(reasons.bad).tolist())
        good = ~reasons.bad
        valid = {k: v[good] for k, v in coerced.items()}
        if isinstance(mech, CentralRelease):
            reports = mech.prepare(valid, draw_uniforms(as_source(1), int(good.sum()),
                                                        mech.draws))
        else:
            reports = mech.perturb_valid(valid, rng=1)
        assert_reports(mech, reports, int(good.sum()))
        if reasons.bad.any():
            with pytest.raises(InvalidRecordsError) as info:
                emit(mech, cols, rng=1)
            assert set(info.value.reasons) == set(np.flatnonzero(reasons.bad).tolist())
        else:
            assert_reports(mech, emit(mech, cols, rng=1), n)


@pytest.mark.parametrize("name", BUILTINS)
def test_bad_columns_are_parameter_errors(name):
    mech = mech_of(name)
    g = np.random.default_rng(0)
    cols = valid_columns(mech, 5, g)
    with pytest.raises(ParameterError):
        mech.check({**cols, "no_such_role": np.zeros(5)})
    first = mech.roles[0].name
    if len(cols) > 1:
        with pytest.raises(ParameterError):
            mech.check({**cols, first: cols[first][:3]})
    with pytest.raises(ParameterError):
        mech.check({k: v for k, v in cols.items() if k != first})


# --------------------------------------------------------------------------- 3. estimation
def estimator_of(name):
    return REG.estimator_for(mech_of(name))


def _finite_or_documented(name, stat_name, stat, what):
    x = getattr(stat, what)
    if x is None:
        return
    arr = np.asarray(x)
    if isinstance(x, str):  # a label (e.g. the reconstruction method), not a number
        assert what == "value" and x, f"{name}.{stat_name}: empty label"
        return
    if arr.dtype == object or arr.dtype.kind not in "iufb":
        pytest.fail(f"{name}.{stat_name}.{what} is not numeric: {x!r}")
    if np.isfinite(arr).all():
        return
    # documented: the joint family's conditionals are NaN where the conditioning marginal is 0
    if (what == "value" and stat_name.endswith(("y_given_x", "x_given_y"))
            and "NaN where the conditioning label has estimated frequency 0" in stat.note):
        assert not np.isinf(arr).any()
        return
    pytest.fail(f"{name}: statistic {stat_name!r}.{what} is not finite: {x!r} "
                f"(note: {stat.note!r})")


@pytest.mark.parametrize("name", BUILTINS)
@settings(FUZZ, max_examples=6)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1),
       skew=st.sampled_from(["random", "constant", "edges"]))
def test_estimates_from_valid_input_are_finite(name, n, seed, skew):
    mech, est = mech_of(name), estimator_of(name)
    g = np.random.default_rng(seed)
    cols = valid_columns(mech, n, g)
    if skew != "random":  # degenerate but valid input: one value, or only the domain's ends
        for r in mech.roles:
            c = cols[r.name]
            if r.kind == "category":
                labels = np.array(mech.labels(r.name), dtype=object)
                cols[r.name] = np.full(n, labels[0], dtype=object) if skew == "constant" \
                    else g.choice(labels[[0, -1]], n)
            elif r.name.startswith(("value",)) and hasattr(mech, "lower"):
                cols[r.name] = np.full(n, mech.lower) if skew == "constant" \
                    else g.choice([mech.lower, mech.upper], n)
            else:
                cols[r.name] = np.full(n, c[0]) if skew == "constant" else c
    reports = emit(mech, cols, rng=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            estimate = est.finalize(est.add(est.create(), reports))
        except EmptyAccumulatorError:
            return
    assert estimate.statistics
    for sname, stat in estimate.statistics.items():
        _finite_or_documented(name, sname, stat, "value")
        _finite_or_documented(name, sname, stat, "stderr")
        if stat.value is None:
            assert stat.note, f"{name}.{sname}: undefined value without a note"
    estimate.to_dict()  # serialisable


# --------------------------------------------------------------------------- 4. telemetry
@st.composite
def garbage_reports(draw, mech, n):
    out = {}
    for field, dt in mech.report_fields:
        if draw(st.integers(0, 9)) == 0:
            continue  # a missing field
        kind = draw(st.sampled_from(["valid", "float", "int", "object", "str"]))
        if kind == "valid":
            continue  # filled by the caller from genuine reports
        if kind == "float":
            vals = draw(st.lists(st.floats(allow_nan=True, allow_infinity=True)
                                 | st.sampled_from([0.0, 1.0, 2.0, -1.0, 0.5, 65535.0]),
                                 min_size=n, max_size=n))
            out[field] = np.array(vals, dtype=np.float64)
        elif kind == "int":
            vals = draw(st.lists(st.integers(-(2**62), 2**62) | st.integers(-2, 4),
                                 min_size=n, max_size=n))
            out[field] = np.array(vals, dtype=np.int64)
        elif kind == "str":
            out[field] = np.array(draw(st.lists(st.text(max_size=3) | st.sampled_from(["0", "1"]),
                                                min_size=n, max_size=n)), dtype=str)
        else:
            arr = np.empty(n, dtype=object)
            arr[:] = draw(st.lists(ELEMENTS, min_size=n, max_size=n))
            out[field] = arr
    return out


@pytest.mark.parametrize("name", BUILTINS)
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_check_reports_on_garbage_never_raises_and_accepted_rows_accumulate(name, data):
    mech, est = mech_of(name), estimator_of(name)
    n = data.draw(st.integers(0, 10))
    seed = data.draw(st.integers(0, 2**32 - 1))
    genuine = emit(mech, valid_columns(mech, n, np.random.default_rng(seed)), rng=seed)
    garbage = data.draw(garbage_reports(mech, n))
    reports = {k: garbage.get(k, v) for k, v in genuine.items()
               if k in garbage or data.draw(st.integers(0, 9)) > 0}
    if data.draw(st.integers(0, 9)) == 0:
        reports["extra_field"] = np.arange(n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            reasons = est.check_reports(reports, n)
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"check_reports raised {type(exc).__name__}: {exc} on {reports!r}")
        assert reasons.n == n
        good = ~reasons.bad
        if good.any():
            fields = dict(mech.report_fields)
            assert set(fields) <= set(reports)
            # the ingestion edge casts accepted telemetry to the declared wire dtypes
            clean = {k: coerce_numeric(np.asarray(reports[k])[good])[0].astype(fields[k])
                     for k in fields}
            acc = est.add(est.create(), clean)
            assert est.n_reports(acc) == int(good.sum())


# --------------------------------------------------------------------------- 5. release_counts
COUNTS = st.one_of(
    st.lists(st.integers(0, 10**6), min_size=1, max_size=30).map(np.array),
    st.lists(st.integers(-(2**62), 2**62), max_size=30).map(lambda x: np.array(x, np.int64)),
    st.lists(st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 1.0, 2.0]),
             max_size=30).map(lambda x: np.array(x, np.float64)),
    st.lists(st.sampled_from([0, 1, 2, 10**15, 2**62]), min_size=1, max_size=30)
    .map(lambda x: np.array(x, np.int64)),
    st.sampled_from([np.array([]), np.zeros(0, np.int64), np.zeros((2, 3), np.int64),
                     np.array([True, False]), np.array(["1", "2"]), np.array([1, None], object),
                     np.array(5), np.zeros(1, np.int64), np.zeros(40, np.int64)]),
)


@pytest.mark.parametrize("name", HISTOGRAMS)
@settings(FUZZ, max_examples=30)
@given(counts=COUNTS, epsilon=st.sampled_from([1e-3, 0.1, 1.0, 10.0, 1e3]))
def test_release_counts_random_counts(name, counts, epsilon):
    params = {**SAMPLE_PARAMS[name], "epsilon": epsilon}
    mech = REG.build(name, params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            est = mech.release_counts(counts, rng=3)
        except ParameterError:
            return
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"{name}.release_counts({counts!r}) raised {type(exc).__name__}: {exc}")
    h = np.asarray(est["histogram"].value)
    assert h.shape == (np.asarray(counts).size,)
    assert np.isfinite(h).all(), f"{name}.release_counts({counts!r}) -> {h!r}"


@pytest.mark.parametrize("name", ["laplace-dp", "generalized-gaussian"])
def test_implausibly_far_noise_reports_are_dead_lettered(name):
    """A report far beyond any honest noise (|y| ~ 1e308: its square overflows the moment sums)
    is flagged by check_reports instead of breaking the bandwidth at finalize; the rest
    estimate normally."""
    est = estimator_of(name)
    reports = {"y": np.array([1e308, 1.0, 2.0, -1e200])}
    bad = est.check_reports(reports).bad
    assert bad.tolist() == [True, False, False, True]
    e = est.estimate({"y": reports["y"][~bad]})
    assert all(s.value is None or np.all(np.isfinite(np.asarray(s.value, dtype=float)))
               for k, s in e.statistics.items() if not isinstance(s.value, str))


@pytest.mark.parametrize("name", BUILTINS)
def test_label_parameters_accept_numpy_arrays(name):
    """Tuple-typed parameters (domains, categories, sensitive subsets) accept a numpy array."""
    tuples = {p["name"] for p in DESCRIBE[name]["parameters"] if p["type"] == "tuple"}
    params = {k: (np.array([x.strip() for x in v.split(",")]) if k in tuples
                  and isinstance(v, str) else v) for k, v in SAMPLE_PARAMS[name].items()}
    if name in HISTOGRAMS:
        params = {k: v for k, v in params.items() if k not in ("bins", "k")}
        params.update({"k": 2} if "k" in SAMPLE_PARAMS[name] else {})
        params["categories"] = np.array(["a", "b", "c"])
    mech = REG.build(name, params)
    for k in tuples & set(params):
        assert isinstance(getattr(mech, k), tuple), (k, getattr(mech, k))
