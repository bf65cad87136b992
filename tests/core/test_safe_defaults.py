"""Safe defaults (issue 13): no default may fail to serve the user's domain silently. Domain bounds
are required; RVNS's d and delta are relative to the declared domain and promise a finite epsilon
by default; a configuration with no finite guarantee is built from the registry only with an
explicit opt-in, and then says "no finite guarantee" in every output."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from ldp_beam import build_mechanism, estimator_for, get_registry
from ldp_beam.central.dphr import DPHR
from ldp_beam.central.histogram_baselines import StructureFirst
from ldp_beam.central.ospdprr import OSPDPRR
from ldp_beam.core import CountEstimator, Mechanism, Reasons
from ldp_beam.errors import ParameterError
from ldp_beam.mechanisms.rvns import RVNS, rvns_neighbourhood_epsilon
from ldp_beam.privacy import LDP, NONE, PrivacyGuarantee
from ldp_beam.registry import Registry, has_finite_guarantee

REG = get_registry()
BUILTINS = [d["name"] for d in REG.describe() if d["source"] == "ldp-beam"]
DESCRIBE = {d["name"]: d for d in REG.describe()}
#: mechanisms whose values must lie in a declared [lower, upper]
BOUNDED = {
    "bisample": dict(epsilon=1.0), "bisample-md": dict(epsilon=1.0), "harmony": dict(epsilon=1.0),
    "pm": dict(epsilon=1.0), "privkvm": dict(epsilon=1.0), "laplace-dp": dict(epsilon=1.0),
    "generalized-gaussian": dict(epsilon=1.0), "square-wave": dict(epsilon=1.0),
    "rvns": dict(), "ospdprr": dict(t=0.5), "osdp-rr": dict(epsilon=0.5),
    "central-sum": dict(epsilon=1.0), "central-mean": dict(epsilon=1.0),
    "central-variance": dict(epsilon=1.0), "central-quantiles": dict(epsilon=1.0),
}
HISTOGRAMS = {"laplace-histogram": {}, "dphr": {}, "ahp": {}, "structure-first": {"k": 2, "F": 9}}


# --------------------------------------------------------------------------- bounds
def test_every_builtin_with_a_domain_is_covered():
    with_bounds = {n for n, d in DESCRIBE.items() if d["source"] == "ldp-beam"
                   and {"lower", "upper"} <= {p["name"] for p in d["parameters"]}}
    assert with_bounds == set(BOUNDED) | set(HISTOGRAMS)


@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_bounds_are_required(name):
    """bisample-md without lower/upper used [-1, 1] and dead-lettered 92% of a table, exit 0."""
    params = {p["name"]: p for p in DESCRIBE[name]["parameters"]}
    assert params["lower"]["required"] and params["upper"]["required"]
    assert params["lower"]["default"] is None and params["upper"]["default"] is None
    for missing in (("lower", "upper"), ("lower",), ("upper",)):
        given = {k: v for k, v in dict(lower=25.0, upper=70.0).items() if k not in missing}
        with pytest.raises(ParameterError) as ei:
            build_mechanism(name, **BOUNDED[name], **given)
        msg = str(ei.value)
        assert ei.value.name == missing[0] and repr(missing[0]) in msg, msg
        assert f"requires {', '.join(missing)} (no default)" in msg, msg
        assert "no default domain fits arbitrary data" in msg, msg
    m = build_mechanism(name, **BOUNDED[name], lower=25.0, upper=70.0)
    assert (m.lower, m.upper) == (25.0, 70.0)
    # in Python, the dataclass names both missing arguments
    with pytest.raises(TypeError, match="'lower' and 'upper'"):
        REG.get(name).mechanism(**BOUNDED[name])


@pytest.mark.parametrize("name", sorted(HISTOGRAMS))
def test_histogram_bins_need_bounds_but_categories_and_counts_do_not(name):
    cls = REG.get(name).mechanism
    extra = HISTOGRAMS[name]
    for given, missing in (({}, "lower"), ({"lower": 0.0}, "upper"), ({"upper": 9.0}, "lower")):
        with pytest.raises(ParameterError) as ei:
            build_mechanism(name, epsilon=1.0, bins=10, **given, **extra)
        assert ei.value.name == missing and "numeric bins need the domain [lower, upper]" in \
            str(ei.value)
    m = build_mechanism(name, epsilon=1.0, bins=10, lower=0.0, upper=9.0, **extra)
    assert m.bucket_edges()[[0, -1]].tolist() == [0.0, 9.0]
    m = build_mechanism(name, epsilon=1.0, categories="a,b,c", **extra)
    assert m.n_buckets == 3 and m.lower is None
    assert cls(epsilon=1.0, **extra).release_counts(np.array([3, 0, 5, 1]), 2)["histogram"] \
        .value.size == 4
    desc = {p["name"]: p for p in DESCRIBE[name]["parameters"]}
    assert desc["lower"]["default"] is None and desc["lower"]["default_note"] == \
        "required with bins"


def test_the_bisample_md_table_of_the_issue_is_not_dead_lettered_by_a_default():
    """Ages in [18, 90]: with the declared domain nothing is dead-lettered and the mean is
    estimated in the data's units."""
    ages = np.random.default_rng(4).uniform(18, 90, 20_000)
    m = build_mechanism("bisample-md", epsilon=2.0, lower=18, upper=90)
    cols, reasons = m.check(ages)
    assert not reasons.bad.any()
    est = estimator_for(m).estimate(m.perturb_valid(cols, rng=4))
    mean = est["mean"]
    assert abs(mean.value - ages.mean()) < 5 * mean.stderr  # a z-test on the stated stderr


# --------------------------------------------------------------------------- RVNS d and delta
def test_rvns_defaults_are_relative_to_the_domain():
    """The default d was an absolute 0.2: 0.4% of [25, 70] (a wrong density, exit 0)."""
    m = build_mechanism("rvns", lower=25, upper=70)
    assert m.d == pytest.approx(0.2 * 45) and m.delta == pytest.approx(2 * m.d)
    assert m.params()["d"] == m.d and m.params()["delta"] == m.delta  # recorded as used
    for lo, hi in ((0.0, 1.0), (-5.0, 5.0), (1e3, 1e6)):
        r = RVNS(lower=lo, upper=hi)
        assert r.d == pytest.approx(0.2 * (hi - lo)) and r.delta == pytest.approx(0.4 * (hi - lo))
    # given d, delta follows it (capped at the width); given delta, d keeps its default
    assert RVNS(lower=0, upper=10, d=2.0).delta == 4.0
    assert RVNS(lower=0, upper=10, d=7.0).delta == 10.0
    assert RVNS(lower=0, upper=10, delta=3.0).d == 2.0
    desc = {p["name"]: p for p in DESCRIBE["rvns"]["parameters"]}
    assert desc["d"]["default_note"] == "0.2 (upper - lower)"
    assert desc["delta"]["default_note"].startswith("2 d")


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("d_frac", [None, 0.05, 0.2, 1 / 3, 0.5, 0.9])
def test_rvns_default_delta_gives_a_finite_epsilon(k, d_frac):
    lo, hi = 25.0, 70.0
    kw = {} if d_frac is None else {"d": d_frac * (hi - lo)}
    m = build_mechanism("rvns", lower=lo, upper=hi, k=k, **kw)
    g = m.guarantee
    assert math.isfinite(g.epsilon) and g.kind != NONE
    assert g.epsilon == pytest.approx(rvns_neighbourhood_epsilon(lo, hi, m.d, m.delta, k))
    if m.d <= (hi - lo) / 3:  # delta = 2 d: k ln 2
        assert g.epsilon == pytest.approx(k * math.log(2))
    assert "no finite guarantee" not in g.describe()


def test_rvns_with_default_d_is_the_same_mechanism_on_every_domain():
    """With d relative to the width, RVNS on [25, 70] is the affine image of RVNS on [0, 1] (the
    spec's measured configuration, d = 0.2 of the width): same uniforms, reports 25 + 45 y, and
    the reconstructed density is the image of the unit one. With the old absolute d = 0.2 the
    two would be different mechanisms (a window of 0.4% of [25, 70])."""
    g = np.random.default_rng(5)
    unit = g.beta(2.0, 5.0, 20_000)
    lo, hi = 25.0, 70.0
    big = lo + (hi - lo) * unit
    m1 = build_mechanism("rvns", lower=0.0, upper=1.0)
    m45 = build_mechanism("rvns", lower=lo, upper=hi)
    r1 = m1.perturb(unit, rng=9)["y1"]
    r45 = m45.perturb(big, rng=9)["y1"]
    np.testing.assert_allclose(r45, lo + (hi - lo) * r1, rtol=1e-12, atol=1e-9)
    assert m45.guarantee.epsilon == m1.guarantee.epsilon == pytest.approx(math.log(2))
    e1 = estimator_for(m1, m=100).estimate({"y1": r1})
    e45 = estimator_for(m45, m=100).estimate({"y1": r45})
    # binning the affine image can move a report across a fine-bin edge by rounding only
    np.testing.assert_allclose(e45["density"].value * (hi - lo), e1["density"].value,
                               rtol=0, atol=0.05)
    assert e45["mean"].value == pytest.approx(lo + (hi - lo) * e1["mean"].value, abs=0.01)


# --------------------------------------------------------------------------- the opt-in
NO_GUARANTEE = [
    ("rvns", dict(lower=0.0, upper=1.0, d=0.2, delta=0.01), "delta", "d = 0.2"),
    ("rvns", dict(lower=0.0, upper=10.0, d=2.0, delta=2.0), "delta", "delta > d"),
    ("dphr", dict(epsilon=1.0, variant="paper"), "variant", "variant='sound'"),
    ("structure-first", dict(epsilon=1.0, k=3), "F", "public bound F"),
    ("ospdprr", dict(t=0.5, lower=0.0, upper=1.0, mode="paper"), "mode", "mode='sound-self'"),
]


@pytest.mark.parametrize("name,params,param,hint", NO_GUARANTEE,
                         ids=[f"{n}-{p}" for n, _, p, _ in NO_GUARANTEE])
def test_no_finite_guarantee_needs_the_opt_in(name, params, param, hint):
    with pytest.raises(ParameterError) as ei:
        build_mechanism(name, **params)
    msg = str(ei.value)
    assert ei.value.name == param and f"parameter {param!r}" in msg, msg
    assert "a configuration with a finite privacy guarantee" in msg and hint in msg, msg
    assert "allow_no_guarantee=True" in msg and "--allow-no-guarantee" in msg, msg
    # the command line's string form is refused the same way
    with pytest.raises(ParameterError):
        REG.build(name, {k: str(v) for k, v in params.items()})
    m = build_mechanism(name, allow_no_guarantee=True, **params)
    g = m.guarantee
    assert not has_finite_guarantee(m) and (g.kind == NONE or math.isinf(g.epsilon))
    assert g.describe().startswith("no finite guarantee")
    assert g.to_dict()["summary"].startswith("no finite guarantee") and \
        g.to_dict()["epsilon"] is None


def test_every_output_of_an_opted_in_run_says_so():
    m = build_mechanism("rvns", lower=0.0, upper=1.0, d=0.2, delta=0.01, allow_no_guarantee=True)
    est = estimator_for(m, m=20).estimate(m.perturb(np.linspace(0, 1, 500), rng=1))
    out = est.to_dict()["guarantee"]
    assert out["summary"] == "no finite guarantee: no finite epsilon (neighbourhood-LDP; see " \
                             "the notes)"
    rel = build_mechanism("dphr", epsilon=1.0, variant="paper", bins=4, lower=0.0, upper=1.0,
                          allow_no_guarantee=True)
    e = estimator_for(rel, seed=3).finalize(np.array([5, 0, 2, 9]))
    assert e.to_dict()["guarantee"]["summary"] == \
        "no finite guarantee: no privacy guarantee (replication only)"


def test_finite_configurations_need_no_opt_in_and_the_flag_is_checked():
    assert build_mechanism("dphr", epsilon=1.0).guarantee.epsilon == 1.0
    assert build_mechanism("structure-first", epsilon=1.0, k=3, F=40.0).guarantee.epsilon == 1.0
    assert math.isfinite(build_mechanism("rvns", lower=0.0, upper=1.0, delta=0.5).guarantee.epsilon)
    with pytest.raises(ParameterError) as ei:
        build_mechanism("dphr", epsilon=1.0, allow_no_guarantee="yes")
    assert ei.value.name == "allow_no_guarantee"


def test_recipes_construct_the_published_variants_directly():
    """The evaluation recipes reproduce papers' variants by constructing them, not through the
    registry: that path is not gated (and says what it is)."""
    assert DPHR(1.0, variant="paper").guarantee.kind == NONE
    assert StructureFirst(1.0, k=3).guarantee.kind == NONE
    assert OSPDPRR(t=0.5, lower=0.0, upper=1.0, mode="paper").guarantee.kind == NONE
    assert math.isinf(RVNS(lower=0.0, upper=10.0, d=2.0, delta=0.1).guarantee.epsilon)


def test_a_plugin_without_a_reason_is_refused_by_name():
    @dataclasses.dataclass(frozen=True)
    class Nothing(Mechanism):
        NAME = "nothing"
        roles = ()
        report_fields = (("v", "uint8"),)
        epsilon: float = 1.0

        @property
        def draws(self) -> int:
            return 1

        @property
        def guarantee(self) -> PrivacyGuarantee:
            return PrivacyGuarantee(NONE, math.inf, notes="It promises nothing. At all.")

        def validate(self, cols, reasons: Reasons) -> None:
            pass

        def randomize(self, cols, u):
            return {"v": np.zeros(len(u), dtype=np.uint8)}

    class NothingEstimator(CountEstimator):
        n_cells = 1

        def cells(self, reports):
            return np.asarray(reports["v"], dtype=np.int64)

        def statistics(self, acc):
            return {}

    reg = Registry()
    reg.register("nothing", Nothing, NothingEstimator, source="a-plugin")
    with pytest.raises(ParameterError) as ei:
        reg.build("nothing", {})
    assert ei.value.name == "allow_no_guarantee" and "It promises nothing" in str(ei.value)
    assert reg.build("nothing", {}, allow_no_guarantee=True).guarantee.kind == NONE
    assert PrivacyGuarantee(LDP, 1.0).describe() == "LDP with epsilon=1"


def test_example_parameters_build_every_builtin_with_bounds():
    """What `ldp-beam list` can build to show each guarantee: bounds 0..1, 1.0 elsewhere."""
    for name in set(BOUNDED):
        ex = REG.example_params(name)
        assert ex["lower"] == 0.0 and ex["upper"] == 1.0
        g = REG.build(name, ex).guarantee
        assert has_finite_guarantee(REG.build(name, ex)) and g.describe()
    assert REG.example_params("grr") == {"epsilon": 1.0, "domain": 1.0}
