"""The three core contracts (Mechanism, Estimator/Estimate, PrivacyGuarantee), parameter
validation, the plugin registry and the import boundaries of the core package."""
from __future__ import annotations

import ast
import dataclasses
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

import ldp_beam
from ldp_beam import (Estimate, Estimator, Mechanism, ParameterError, PrivacyGuarantee, Statistic,
                      UnknownPluginError, build_mechanism, compose, estimator_for, get_registry)
from ldp_beam.mechanisms import BiSample, BiSampleMD, Harmony, PiecewiseMechanism, PrivKVM
from ldp_beam.privacy import CENTRAL, LDP, NONE, ULDP
from ldp_beam.registry import Registry, convert

SEED = 7
BOUNDS = dict(lower=-1.0, upper=1.0)  # the papers' normalized domain (lower/upper are required)
PKG = Path(ldp_beam.__file__).resolve().parent

ALL = [
    ("bisample", BiSample),
    ("bisample-md", BiSampleMD),
    ("harmony", Harmony),
    ("pm", PiecewiseMechanism),
    ("privkvm", PrivKVM),
]


# --------------------------------------------------------------------------- Mechanism
@pytest.mark.parametrize("name,cls", ALL, ids=[a[0] for a in ALL])
def test_mechanism_is_a_frozen_validated_dataclass(name, cls):
    mech = cls(epsilon=0.7, lower=-3.0, upper=5.0)
    assert isinstance(mech, Mechanism) and dataclasses.is_dataclass(mech)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mech.epsilon = 2.0  # type: ignore[misc]
    assert mech.name == name
    assert mech.params()["epsilon"] == 0.7 and mech.params()["lower"] == -3.0
    assert mech.describe().startswith(f"{name}(") and "epsilon=0.7" in mech.describe()
    g = mech.guarantee
    assert isinstance(g, PrivacyGuarantee)
    assert g.kind == LDP and g.epsilon == 0.7 and g.delta == 0.0
    assert isinstance(mech.draws, int) and mech.draws >= 1
    # picklable (it travels to Beam workers)
    assert pickle.loads(pickle.dumps(mech)) == mech


@pytest.mark.parametrize("name,cls", ALL, ids=[a[0] for a in ALL])
def test_perturb_returns_documented_wire_columns(name, cls):
    mech = cls(epsilon=1.0, lower=0.0, upper=10.0)
    x = np.random.default_rng(SEED).uniform(0, 10, 257)
    reports = mech.perturb(x, rng=SEED)
    assert list(reports) == [f for f, _ in mech.report_fields]
    for f, dt in mech.report_fields:
        assert reports[f].dtype == np.dtype(dt) and reports[f].shape == (257,)
    # a mapping of role -> column is the same input
    again = mech.perturb({"value": x}, rng=SEED)
    for f, _ in mech.report_fields:
        np.testing.assert_array_equal(reports[f], again[f])
    # an empty batch gives empty reports of the right dtypes
    empty = mech.perturb(np.empty(0), rng=SEED)
    for f, dt in mech.report_fields:
        assert empty[f].dtype == np.dtype(dt) and empty[f].shape == (0,)
    for f, dt in mech.report_fields:
        assert mech.empty_reports()[f].dtype == np.dtype(dt)


def test_perturb_rejects_unknown_or_missing_columns():
    mech = BiSample(epsilon=1.0, **BOUNDS)
    with pytest.raises(ParameterError, match="columns"):
        mech.perturb({"value": [0.1], "colour": [1]})
    with pytest.raises(ParameterError, match="role 'value'"):
        mech.perturb({"preference": [1.0]})
    with pytest.raises(ParameterError, match="equal lengths"):
        mech.perturb({"value": [0.1, 0.2], "preference": [1.0]})


# --------------------------------------------------------------------------- Estimator, Estimate
@pytest.mark.parametrize("name,cls", ALL, ids=[a[0] for a in ALL])
def test_estimator_contract(name, cls):
    mech = cls(epsilon=1.0, lower=0.0, upper=10.0)
    est = estimator_for(mech)
    assert isinstance(est, Estimator) and est.mechanism is mech
    x = np.random.default_rng(SEED).uniform(0, 10, 5000)
    reports = mech.perturb(x, rng=SEED)
    acc = est.add(est.create(), reports)
    # the accumulator is small: its size does not depend on the number of reports
    assert acc.shape == est.create().shape and acc.size <= 16
    acc_big = est.add(est.create(), mech.perturb(np.repeat(x, 4), rng=SEED + 1))
    assert acc_big.shape == acc.shape
    assert est.n_reports(acc) == 5000
    assert np.array_equal(pickle.loads(pickle.dumps(acc)), acc)
    e = est.finalize(acc)
    assert isinstance(e, Estimate)
    assert e.mechanism == name and e.n_reports == 5000
    assert e.guarantee == mech.guarantee
    assert e.params == mech.params()
    assert "mean" in e.statistics and all(isinstance(s, Statistic) for s in e.statistics.values())
    # to_dict is JSON-serializable and carries what was released and what it cost
    d = json.loads(json.dumps(e.to_dict()))
    assert d["n_reports"] == 5000 and d["guarantee"]["epsilon"] == 1.0
    assert d["guarantee"]["kind"] == LDP and set(d["statistics"]) == set(e.statistics)
    # estimate() is create + add + finalize
    assert est.estimate(reports).to_dict() == e.to_dict()
    with pytest.raises(KeyError, match="available"):
        e["no such statistic"]


def test_statistic_ci_and_to_dict():
    s = Statistic(2.0, 0.5, 2.0)
    lo, hi = s.ci(0.95)
    z = norm.ppf(0.975)
    assert lo == pytest.approx(2.0 - z * 0.5, rel=1e-12) and hi == pytest.approx(2.0 + z * 0.5)
    lo90, hi90 = s.ci(0.90)
    assert lo < lo90 < hi90 < hi
    assert Statistic(1.0).ci() is None and Statistic(None, 1.0).ci() is None
    d = Statistic(np.float64(1.5), np.float64(0.1), note="n").to_dict()
    assert d["value"] == 1.5 and d["note"] == "n" and len(d["ci95"]) == 2
    json.dumps(d)
    assert "ci95" not in Statistic(np.arange(3.0), np.ones(3)).to_dict()


# --------------------------------------------------------------------------- PrivacyGuarantee
def test_privacy_guarantee_validation_and_describe():
    d = PrivacyGuarantee(LDP, 1.5).describe()
    assert "LDP" in d and "1.5" in d
    d = PrivacyGuarantee(CENTRAL, 1.0, delta=1e-6).describe()
    assert CENTRAL in d and "1e-06" in d
    assert "no privacy guarantee" in PrivacyGuarantee(NONE, math.inf).describe()
    assert PrivacyGuarantee(NONE, math.inf).to_dict()["epsilon"] is None
    with pytest.raises(ValueError, match="kind"):
        PrivacyGuarantee("strong", 1.0)
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="epsilon"):
            PrivacyGuarantee(LDP, bad)
    for bad in (-1e-9, 1.5, math.nan):
        with pytest.raises(ValueError, match="delta"):
            PrivacyGuarantee(CENTRAL, 1.0, delta=bad)


def test_compose_adds_budgets():
    c = compose([PrivacyGuarantee(LDP, 0.5), PrivacyGuarantee(LDP, 1.0), PrivacyGuarantee(LDP, 2)])
    assert c.kind == LDP and c.epsilon == pytest.approx(3.5) and c.delta == 0
    c = compose([PrivacyGuarantee(CENTRAL, 1.0, 0.7), PrivacyGuarantee(CENTRAL, 1.0, 0.6)])
    assert c.epsilon == 2.0 and c.delta == 1.0  # delta capped at 1
    assert compose([PrivacyGuarantee(LDP, 1.0)]).epsilon == 1.0
    c = compose([PrivacyGuarantee(LDP, 1.0), PrivacyGuarantee(NONE, math.inf)])
    assert c.kind == NONE and math.isinf(c.epsilon)
    # an eps-LDP release is also eps-central-DP: LDP with central composes to central
    c = compose([PrivacyGuarantee(LDP, 1.0), PrivacyGuarantee(CENTRAL, 0.5, 1e-6)])
    assert c.kind == CENTRAL and c.epsilon == 1.5 and c.delta == 1e-6
    with pytest.raises(ValueError):
        compose([])
    # the composed budget of a pipeline releasing several estimates
    mech = BiSampleMD(epsilon=0.8, **BOUNDS)
    assert compose([mech.guarantee] * 3).epsilon == pytest.approx(2.4)


def test_compose_does_not_upgrade_uldp_to_central_dp():
    """Mixed kinds compose to the weakest: ULDP protects only sensitive values."""
    c = compose([PrivacyGuarantee(LDP, 1.0), PrivacyGuarantee(ULDP, 1.0)])
    assert c.kind == ULDP and c.epsilon == 2.0 and "weakest" in c.notes
    c = compose([PrivacyGuarantee(CENTRAL, 1.0), PrivacyGuarantee(ULDP, 0.5)])
    assert c.kind == ULDP
    c = compose([PrivacyGuarantee(LDP, 1.0), PrivacyGuarantee(CENTRAL, 0.5, delta=1e-6)])
    assert c.kind == CENTRAL and c.delta == 1e-6


# --------------------------------------------------------------------------- parameter validation
def _assert_param_error(exc_info, name, value, valid_fragment):
    err = exc_info.value
    assert err.name == name
    msg = str(err)
    assert repr(name) in msg, msg
    assert repr(value) in msg if not (isinstance(value, float) and math.isnan(value)) \
        else "nan" in msg, msg
    assert valid_fragment in msg, msg


@pytest.mark.parametrize("cls", [c for _, c in ALL], ids=[a[0] for a in ALL])
@pytest.mark.parametrize("eps", [0, 0.0, -1.0, math.nan, math.inf, -math.inf, "1", True, None])
def test_bad_epsilon(cls, eps):
    with pytest.raises(ParameterError) as ei:
        cls(epsilon=eps, **BOUNDS)
    _assert_param_error(ei, "epsilon", eps, "a finite number > 0")


@pytest.mark.parametrize("cls", [c for _, c in ALL], ids=[a[0] for a in ALL])
@pytest.mark.parametrize("lower,upper,bad_name,bad_value,valid", [
    (1.0, 1.0, "lower", 1.0, "a number < upper = 1.0"),
    (2.0, 1.0, "lower", 2.0, "a number < upper = 1.0"),
    (math.nan, 1.0, "lower", math.nan, "a finite number"),
    (-math.inf, 1.0, "lower", -math.inf, "a finite number"),
    (0.0, math.inf, "upper", math.inf, "a finite number"),
    (0.0, math.nan, "upper", math.nan, "a finite number"),
    (0.0, "10", "upper", "10", "a finite number"),
])
def test_bad_interval(cls, lower, upper, bad_name, bad_value, valid):
    with pytest.raises(ParameterError) as ei:
        cls(epsilon=1.0, lower=lower, upper=upper)
    _assert_param_error(ei, bad_name, bad_value, valid)


@pytest.mark.parametrize("cls", [BiSample, Harmony, PiecewiseMechanism])
@pytest.mark.parametrize("fake", ["TOP", "random", "", None, 1])
def test_bad_fake(cls, fake):
    with pytest.raises(ParameterError) as ei:
        cls(epsilon=1.0, fake=fake, **BOUNDS)
    _assert_param_error(ei, "fake", fake, "one of ('top', 'rnd')")


@pytest.mark.parametrize("cls", [c for _, c in ALL], ids=[a[0] for a in ALL])
@pytest.mark.parametrize("pref", [-1.0, -1e-300, -math.inf, math.nan, True, "5"])
def test_bad_preference(cls, pref):
    with pytest.raises(ParameterError) as ei:
        cls(epsilon=1.0, preference=pref, **BOUNDS)
    _assert_param_error(ei, "preference", pref, "an epsilon in [0, inf]")


@pytest.mark.parametrize("cls", [c for _, c in ALL], ids=[a[0] for a in ALL])
@pytest.mark.parametrize("pref", [0, 0.0, 2.5, math.inf, None])
def test_good_preference(cls, pref):
    assert cls(epsilon=1.0, preference=pref, **BOUNDS).preference == pref


@pytest.mark.parametrize("cls", [c for _, c in ALL], ids=[a[0] for a in ALL])
def test_bad_allow_missing(cls):
    with pytest.raises(ParameterError) as ei:
        cls(epsilon=1.0, allow_missing="yes", **BOUNDS)
    _assert_param_error(ei, "allow_missing", "yes", "True or False")


@pytest.mark.parametrize("kf", [0, 0.0, 1, 1.0, -0.5, 1.5, math.nan, True])
def test_bad_privkvm_key_fraction(kf):
    with pytest.raises(ParameterError) as ei:
        PrivKVM(epsilon=1.0, key_fraction=kf, **BOUNDS)
    _assert_param_error(ei, "key_fraction", kf, "a number in (0, 1)")


@pytest.mark.parametrize("vi", [-1, 1001, 2.0, True, "5", None])
def test_bad_privkvm_virtual_iterations(vi):
    with pytest.raises(ParameterError) as ei:
        PrivKVM(epsilon=1.0, virtual_iterations=vi, **BOUNDS)
    _assert_param_error(ei, "virtual_iterations", vi, "an integer in [0, 1000]")


def test_good_parameters_are_accepted():
    PrivKVM(epsilon=1.0, key_fraction=0.3, virtual_iterations=0, **BOUNDS)
    PrivKVM(epsilon=1.0, virtual_iterations=1000, **BOUNDS)
    Harmony(epsilon=np.float64(0.5), lower=np.int64(0), upper=np.float32(2.5), fake="top")
    BiSampleMD(epsilon=1, preference=0.5, allow_missing=False, **BOUNDS)


# --------------------------------------------------------------------------- registry
def test_registry_lists_the_bisample_family():
    names = get_registry().names()
    for name, _ in ALL:
        assert name in names


def test_registry_builds_from_command_line_strings():
    m = build_mechanism("bisample-md", epsilon="0.5", lower="0", upper="100",
                        allow_missing="false", preference="none")
    assert isinstance(m, BiSampleMD)
    assert m.epsilon == 0.5 and isinstance(m.epsilon, float)
    assert m.lower == 0.0 and isinstance(m.lower, float) and m.upper == 100.0
    assert m.allow_missing is False and m.preference is None
    m = build_mechanism("harmony", epsilon="2", fake="top", preference="3.5", lower="-1",
                        upper="1")
    assert m.fake == "top" and m.preference == 3.5
    m = build_mechanism("privkvm", epsilon="1", key_fraction="0.25", virtual_iterations="7",
                        allow_missing="yes", lower="-1", upper="1")
    assert m.key_fraction == 0.25 and m.virtual_iterations == 7 and m.allow_missing is True
    # non-string values pass through unchanged
    assert build_mechanism("pm", epsilon=1.25, **BOUNDS).epsilon == 1.25
    # the CLI form and the Python form build equal mechanisms
    assert build_mechanism("bisample", epsilon="1", lower="-2", upper="2") == \
        BiSample(epsilon=1.0, lower=-2.0, upper=2.0)


@pytest.mark.parametrize("params,name,valid", [
    ({"epsilon": "abc"}, "epsilon", "a value of type float"),
    ({"epsilon": "nan"}, "epsilon", "a value of type float"),
    ({"epsilon": "inf", "lower": "-1", "upper": "1"}, "epsilon",
     "a finite number > 0"),  # parses, then fails validation
    ({"epsilon": "-1", "lower": "-1", "upper": "1"}, "epsilon", "a finite number > 0"),
    ({"epsilon": "1", "allow_missing": "maybe"}, "allow_missing", "a value of type bool"),
    ({"epsilon": "1", "virtual_iterations": "2.5"}, "virtual_iterations", "a value of type int"),
    ({"epsilon": "1", "colour": "red"}, "colour", "a parameter of privkvm"),
    ({}, "epsilon", "a value: privkvm requires epsilon, lower, upper (no default)"),
    ({"epsilon": "1"}, "lower", "a value: privkvm requires lower, upper (no default)"),
])
def test_registry_build_errors_name_the_parameter(params, name, valid):
    with pytest.raises(ParameterError) as ei:
        build_mechanism("privkvm", **params)
    assert ei.value.name == name
    assert valid in str(ei.value)


def test_convert_types():
    assert convert("1,2, 3", tuple[int, ...], "grid") == (1, 2, 3)
    assert convert("null", float | None, "x") is None
    assert convert("On", bool, "x") is True
    with pytest.raises(ParameterError):
        convert("x", float | None, "x")


def test_unknown_mechanism_name():
    with pytest.raises(UnknownPluginError) as ei:
        build_mechanism("bisampel", epsilon=1.0)
    msg = str(ei.value)
    assert "'bisampel'" in msg and "bisample-md" in msg  # names what is registered
    assert isinstance(ei.value, KeyError)
    with pytest.raises(UnknownPluginError):
        get_registry().get("nope")


def test_registry_describe():
    desc = {d["name"]: d for d in get_registry().describe()}
    json.dumps(list(desc.values()), default=str)
    for name, cls in ALL:
        d = desc[name]
        assert d["family"] == "bisample" and d["summary"]
        params = {p["name"]: p for p in d["parameters"]}
        assert params["epsilon"]["required"] is True
        # no default domain fits arbitrary data: the bounds are required
        assert params["lower"]["required"] is True and params["lower"]["default"] is None
        assert params["upper"]["required"] is True and params["upper"]["default"] is None
        assert params["epsilon"]["type"] == "float"
        assert [r["name"] for r in d["roles"]] == ["value", "preference"]
        assert d["report_fields"] == [list(f) for f in cls.report_fields]
    assert {p["name"] for p in desc["privkvm"]["parameters"]} >= {"key_fraction",
                                                                   "virtual_iterations"}
    assert "fake" in {p["name"] for p in desc["harmony"]["parameters"]}


def test_registry_estimator_for_and_plugins():
    for name, cls in ALL:
        mech = build_mechanism(name, epsilon=1.0, **BOUNDS)
        assert type(mech) is cls
        est = estimator_for(mech)
        assert est is not estimator_for(mech)  # a new estimator each time
        assert type(est) is get_registry().get(name).estimator
    reg = Registry()

    @dataclasses.dataclass(frozen=True)
    class Unregistered(BiSample):
        NAME = "unregistered"

    with pytest.raises(UnknownPluginError, match="not registered"):
        get_registry().plugin_of(Unregistered(epsilon=1.0, **BOUNDS))
    from ldp_beam.estimators.bisample import BiSampleEstimator

    reg.register("my-bisample", Unregistered, BiSampleEstimator, source="a-plugin")
    assert reg.names() == ["my-bisample"]
    m = reg.build("my-bisample", {"epsilon": "2", "lower": "-1", "upper": "1"})
    assert isinstance(reg.estimator_for(m), BiSampleEstimator)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("my-bisample", Unregistered, BiSampleEstimator)
    with pytest.raises(TypeError,
                       match="mechanism must be a Mechanism or CentralRelease subclass"):
        reg.register("other", dict, BiSampleEstimator)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- import boundaries
def test_core_never_imports_apache_beam():
    code = ("import ldp_beam, ldp_beam.mechanisms, ldp_beam.estimators, sys; "
            "from ldp_beam.registry import Registry, _register_builtins; "
            "_register_builtins(Registry()); "  # every built-in mechanism and estimator module
            "bad = sorted(m for m in sys.modules if m.startswith('apache_beam')); "
            "assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def _imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of every module imported by a source file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from .. import estimators`
    return out


def test_mechanisms_never_import_estimators():
    files = sorted((PKG / "mechanisms").glob("*.py"))
    assert files
    for f in files:
        mods = _imported_modules(f, "ldp_beam.mechanisms")
        bad = sorted(m for m in mods if m == "ldp_beam.estimators"
                     or m.startswith("ldp_beam.estimators."))
        assert not bad, f"{f.name} imports server code: {bad}"


def test_import_checker_resolves_relative_imports(tmp_path):
    """The checker above must see `from ..estimators import x` and `from .. import estimators`."""
    src = tmp_path / "m.py"
    src.write_text("from ..estimators.bisample import X\nfrom .. import estimators\n")
    mods = _imported_modules(src, "ldp_beam.mechanisms")
    assert "ldp_beam.estimators.bisample" in mods and "ldp_beam.estimators" in mods


def test_client_modules_load_no_estimator_module():
    """A device importing the randomizers loads no estimator module and nothing from Beam.

    (``ldp_beam/__init__`` imports the ``ldp_beam.estimators`` package for ``estimator_for``, whose
    registry lookup is lazy; the estimator modules themselves must not be loaded.)
    """
    code = ("import sys, ldp_beam.mechanisms.bisample, ldp_beam.mechanisms.mean_baselines; "
            "bad = sorted(m for m in sys.modules if m.startswith('ldp_beam.estimators.') "
            "or m.startswith('apache_beam')); assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_confidence_intervals_use_scipys_normal_quantile():
    """The default level's quantile is a literal (no scipy import when writing an estimate):
    it must be scipy's value exactly, and other levels must match scipy too."""
    from scipy.stats import norm

    from ldp_beam.core import _Z, Statistic

    assert _Z[0.95] == float(norm.ppf(0.975))
    s = Statistic(value=3.0, stderr=0.7)
    for level in (0.5, 0.8, 0.9, 0.95, 0.99):
        z = float(norm.ppf(0.5 + level / 2))
        assert s.ci(level) == (3.0 - z * 0.7, 3.0 + z * 0.7)
