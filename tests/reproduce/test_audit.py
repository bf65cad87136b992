"""Privacy audits (``ldp-beam audit``; ldp_beam.audit and ldp_beam.reproduce.audit_recipe).

Statistical tolerances: every empirical bound is a one-sided Clopper-Pearson bound at confidence
1 - 0.05/38 per audit (Bonferroni over the 38 audits of a run), so for a mechanism whose claim is
correct the chance that *some* bound of a run exceeds its claim is <= 5%; the runs here use a
fixed seed, so the tests are deterministic (the seed was not chosen by looking at the bounds).
Exact worst cases are compared with the claims within 1e-9 (floating point only).
"""
import json
import math

import numpy as np
import pytest
from scipy import stats

from ldp_beam import audit as A
from ldp_beam.reproduce import audit_recipe as R
from ldp_beam.registry import build_mechanism
from ldp_beam_test_helpers import run_cli

SEED = 20240808
LDP_NAMES = set(R.DISCRETE) | set(R.CONTINUOUS) | {"rvns"}
NOT_TIGHT = {"privkvm": "eps1 + eps2 by composition; the exact worst case is smaller"}


@pytest.fixture(scope="module")
def records():
    return R.run(quick=True, seed=SEED)


def test_every_builtin_is_audited(records):
    from ldp_beam.registry import _register_builtins, Registry

    reg = Registry()
    _register_builtins(reg)
    audited = {r["method"] for r in records if r["verdict"] != "not audited"}
    assert set(reg.names()) <= audited
    for r in records:
        for key in ("claimed_epsilon", "exact_epsilon", "empirical_epsilon_lower", "confidence"):
            assert key in r
        assert r["seed"] == SEED


def test_exact_epsilon_equals_the_claim_for_every_ldp_mechanism(records):
    for r in records:
        if r["method"] not in LDP_NAMES:
            continue
        if r["exact_infinite"]:  # only where the guarantee itself says no finite epsilon exists
            assert r["method"] == "rvns" and r["claimed_epsilon"] is None, r
            assert build_mechanism("rvns", lower=0.0, upper=1.0, d=0.2, delta=0.1,
                                   allow_no_guarantee=True).guarantee.epsilon == math.inf
            continue
        assert r["exact_epsilon"] is not None, r
        if r["method"] in NOT_TIGHT:
            assert r["exact_epsilon"] < r["claimed_epsilon"], r
        else:
            assert r["exact_epsilon"] == pytest.approx(r["claimed_epsilon"], abs=1e-9), r


def test_rvns_both_regimes_audited(records):
    rv = {r["dataset"]: r for r in records if r["method"] == "rvns"}
    assert rv["delta=0.1<=d=0.2"]["exact_infinite"]
    finite = rv["delta=0.3>d=0.2"]
    assert finite["exact_epsilon"] == pytest.approx(math.log(0.3 / 0.1), abs=1e-9)
    # delta <= d: the paper's k ln(4d/delta) = ln 8 is exceeded by the empirical bound (a finding)
    assert rv["delta=0.1<=d=0.2"]["empirical_epsilon_lower"] > math.log(8)


def test_empirical_bounds_never_exceed_sound_claims(records):
    for r in records:
        if r["verdict"] in ("no claim", "not audited"):
            continue
        assert r["verdict"] == "consistent", r
        claim = math.inf if r["claimed_epsilon"] is None else r["claimed_epsilon"]
        assert r["empirical_epsilon_lower"] <= claim, r
        assert 0.99 < r["confidence"] < 1


def test_central_sound_algorithms_stay_below_their_claims(records):
    central = [r for r in records if r["dataset"].startswith("central")]
    assert {r["method"] for r in central} >= {"laplace-histogram", "dphr", "ahp",
                                               "structure-first", "ospdprr", "osdp-rr"}
    for name in ("laplace-histogram", "dphr", "ahp", "structure-first"):  # two neighbour pairs
        sound = {r["dataset"] for r in central if r["method"] == name and r["kind"] != "none"}
        assert any("bucket 0" in d for d in sound) and any("bucket 2" in d for d in sound)
    lpa = [r for r in central if r["method"] == "laplace-histogram"]
    for r in lpa:  # exact: 1/t with t rounded up to a denominator 2^20, so the realized
        eps = r["claimed_epsilon"]  # epsilon loses at most a relative eps / 2^20
        assert eps * (1 - eps * 2 ** -20) <= r["exact_epsilon"] <= eps
    assert all(r["exact_epsilon"] is None for r in central if r["method"] != "laplace-histogram")
    for r in central:
        if r["kind"] == "none":
            assert r["verdict"] == "no claim" and r["empirical_epsilon_lower"] is not None
        else:
            assert r["empirical_epsilon_lower"] <= r["claimed_epsilon"], r


def test_a_wrong_claim_is_caught():
    """GRR at eps = 2 (two labels: p = e^2/(e^2+1) = 0.881, q = 0.119) audited against a claimed
    eps = 1. With 10^4 evaluation samples per input and alpha = 0.05/24, the Clopper-Pearson
    bounds are within ~0.012 of p and q (3.2 standard errors), giving ln(0.869/0.131) ~ 1.89;
    falling below 1 would need q's upper bound to exceed p_lower/e ~ 0.32, i.e. a deviation of
    over 60 standard errors: the test cannot flake."""
    m = build_mechanism("grr", epsilon=2.0, domain=("a", "b"))
    gen = np.random.default_rng(SEED)
    n = 20_000
    s1 = m.perturb({"value": np.array(["a"] * n, dtype=object)}, rng=gen)["v"]
    s2 = m.perturb({"value": np.array(["b"] * n, dtype=object)}, rng=gen)["v"]
    res = A.audit_samples(s1, s2, A.singleton_events(np.arange(2)), alpha=0.05 / 24)
    assert res["epsilon_lower"] > 1.0
    assert R._verdict("LDP", 1.0, A.ldp_epsilon(m.transition_matrix()), res["epsilon_lower"]) \
        == "violates claim"
    assert R._verdict("LDP", 1.0, 2.0, 0.5) == "violates claim"  # exact above the claim too
    assert R._verdict("none", 1.0, None, 5.0) == "no claim"


@pytest.mark.parametrize("n", [1, 5, 12])
@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_clopper_pearson_coverage_is_exact(n, alpha):
    """P(lower(K) > p) <= alpha and P(upper(K) < p) <= alpha for K ~ Bin(n, p), computed exactly
    over every k, at many p (including the endpoints of every interval)."""
    bounds = [A.clopper_pearson(k, n, alpha) for k in range(n + 1)]
    ps = set(np.linspace(0.0, 1.0, 101))
    for lo, hi in bounds:
        ps |= {lo, hi, min(1.0, lo + 1e-12), max(0.0, hi - 1e-12)}
    for p in ps:
        pmf = stats.binom.pmf(np.arange(n + 1), n, p)
        miss_lo = sum(pmf[k] for k, (lo, _) in enumerate(bounds) if lo > p)
        miss_hi = sum(pmf[k] for k, (_, hi) in enumerate(bounds) if hi < p)
        assert miss_lo <= alpha + 1e-9 and miss_hi <= alpha + 1e-9, (p, miss_lo, miss_hi)


def test_epsilon_lower_bound_basics():
    assert A.epsilon_lower_bound(0, 100, 50, 100) == 0.0
    b = A.epsilon_lower_bound(900, 1000, 100, 1000, alpha=0.05)
    assert 0 < b < math.log(9)
    assert A.epsilon_lower_bound(900, 1000, 100, 1000, 0.05, delta=0.5) < b


def test_cli_audit_writes_records_and_exits_zero(tmp_path):
    """The whole quick run is the ``records`` fixture; the command line is checked on a subset."""
    out = tmp_path / "audit.json"
    code, so, se = run_cli("audit", "--quick", "--json", str(out), "--seed", "5",
                           "--only", "grr", "--only", "laplace-histogram")
    assert code == 0, se
    recs = json.loads(out.read_text())
    assert {r["method"] for r in recs} == {"grr", "laplace-histogram"}
    # grr's transition matrix; LPA on two neighbouring pairs and at person level (bounded,
    # unbounded baseline, per key)
    assert len(recs) == 6
    assert sum(r["dataset"].startswith("person") for r in recs) == 3
    assert recs[0]["family_confidence"] == pytest.approx(0.95)
    for r in recs:
        for key in ("claimed_epsilon", "exact_epsilon", "empirical_epsilon_lower", "confidence",
                    "experiment", "method", "epsilon", "metric", "value"):
            assert key in r
    # the table, not JSON, on stdout (the records went to the file)
    assert so.startswith("privacy audit: 6 audits, seed 5") and "[" not in so, so
    grr = next(s for s in so.splitlines() if s.strip().startswith("grr"))
    assert grr.split()[-1] == "consistent" and R.EXPLANATION in so
    # --json alone: the records on stdout for a script, the table on stderr (none with -q)
    code, so, se = run_cli("audit", "--quick", "--json", "--seed", "5", "--only", "grr")
    assert code == 0, se
    assert [r["method"] for r in json.loads(so)] == ["grr"] and "privacy audit: 1 audit" in se
    code, so, se = run_cli("audit", "--quick", "-q", "--only", "grr", "--json", "-")
    assert code == 0 and se == "" and json.loads(so)[0]["method"] == "grr", se
    code, _, se = run_cli("audit", "--quick", "--only", "no-such-mechanism")
    assert code != 0 and "only" in se and "no-such-mechanism" in se


def test_person_level_audits(records):
    """Issue 14: a person with 50 rows. Bounded releases meet their per-unit claim (exactly for
    LPA, from the discrete Laplace pmf: ||shift||_1 / t); the unbounded baselines carry no
    per-unit guarantee and show it: LPA's exact loss is 50 times the per-record epsilon, and the
    empirical lower bounds are far above it (capped only by the number of releases)."""
    person = {(r["method"], r["dataset"]): r for r in records if r["dataset"].startswith("person")}
    assert {m for m, _ in person} >= {"laplace-histogram", "dphr", "ahp", "structure-first",
                                      "ospdprr", "osdp-rr", "partition-selection"}
    for (m, d), r in person.items():
        if "unbounded" in d:
            assert r["kind"] == "none" and r["verdict"] == "no claim", r
            assert r["claimed_epsilon"] == R.EPS  # the per-record epsilon it would be taken for
            assert r["empirical_epsilon_lower"] > 4 * R.EPS, r  # far above the per-record eps
        else:
            assert r["kind"] != "none" and r["verdict"] == "consistent", r
            assert r["unit"] == "person" or m == "partition-selection"
            assert r["empirical_epsilon_lower"] <= r["claimed_epsilon"], r
    eps = R.EPS
    lpa = person[("laplace-histogram", "person L0=Linf=1")]
    assert eps * (1 - eps * 2 ** -20) <= lpa["exact_epsilon"] <= eps + 1e-12
    per_key = person[("laplace-histogram", "person per key L0=2 Linf=3")]
    assert eps * (1 - eps * 2 ** -20) <= per_key["exact_epsilon"] <= eps + 1e-12
    unb = person[("laplace-histogram", "person unbounded")]
    assert unb["exact_epsilon"] == pytest.approx(50 * lpa["exact_epsilon"], rel=1e-12)
    sel = person[("partition-selection", "person L0=2 delta=1e-5")]
    assert sel["exact_epsilon"] <= eps + 1e-12 and sel["exact_delta"] <= sel["claimed_delta"]


# --------------------------------------------------------------------------- the console table
def _rec(method, setting, claimed, lower, conf, exact, verdict, **kw):
    return {"method": method, "dataset": setting, "claimed_epsilon": claimed,
            "empirical_epsilon_lower": lower, "confidence": conf, "exact_epsilon": exact,
            "verdict": verdict, "seed": 7, "family_confidence": 0.95, **kw}


def test_summary_is_a_table_for_a_reader_not_json():
    recs = [_rec("grr", "transition-matrix", 1.0, 0.000012345, 1 - 0.05 / 38, 1.0, "consistent"),
            _rec("leaky", "density", 1.0, 1.43216, 1 - 0.05 / 38, None, "violates claim"),
            _rec("rvns", "delta=0.1<=d=0.2", None, 7.3, 1 - 0.05 / 38, None, "no claim",
                 exact_infinite=True),
            _rec("coinflip", "not audited", None, None, None, None, "not audited",
                 note="coinflip (plugin from x) cannot be audited: no audit_profile()")]
    text = R.summary(recs)
    lines = text.splitlines()
    assert lines[0].startswith("privacy audit: 3 audits, seed 7") and "95%" in lines[0]
    header = lines[1].split()
    assert header[:2] == ["mechanism", "setting"] and "verdict" in header
    grr = next(s for s in lines if s.strip().startswith("grr"))
    assert grr.split() == ["grr", "transition-matrix", "1.000", "0.000", "(99.87%)", "1.000",
                           "consistent"]
    leaky = next(s for s in lines if s.strip().startswith("leaky"))
    assert leaky.split()[-1] == "VIOLATION" and "1.432 (99.87%)" in leaky
    rvns = next(s for s in lines if s.strip().startswith("rvns"))
    assert rvns.split()[2] == "inf" and rvns.split()[-3:] == ["inf", "no", "claim"]
    assert R.EXPLANATION in lines and "lower bound" in R.EXPLANATION
    assert "1 consistent, 1 VIOLATION, 1 no claim" in text
    assert lines[-1] == "not audited: coinflip: coinflip (plugin from x) cannot be audited: " \
                        "no audit_profile()"
    assert "e-0" not in text and "e+0" not in text and "{" not in text  # no JSON, no 1.2e-05
    assert R._confidence(0.95) == "95%" and R._eps(1234.5) == "1234.500"


# --------------------------------------------------------------------------- plugins
@pytest.fixture
def plugins(monkeypatch):
    """The test plugin package's coin flip (no audit profile), registered into a fresh registry
    as a plugin is, with variants that define ``audit_profile()``: a correct one, a leaky one
    (it randomizes at epsilon + 0.5 and claims epsilon) and one with a malformed matrix."""
    import math as m

    from ldp_beam_test_helpers import load_test_plugin

    mod, fresh = load_test_plugin(monkeypatch, "audit_test_coinflip")

    class Audited(mod.CoinFlip):
        NAME = "coinflip-audited"

        def audit_profile(self):
            p = m.exp(self.epsilon) / (1 + m.exp(self.epsilon))
            return A.AuditProfile(matrix=[[p, 1 - p], [1 - p, p]],
                                  inputs=[{"value": 0.0}, {"value": 1.0}],
                                  output_code=lambda reports: reports["r"])

    class Leaky(Audited):
        NAME = "coinflip-leaky"

        def randomize(self, cols, u):
            keep = u[:, 0] < m.exp(self.epsilon + 0.5) / (1 + m.exp(self.epsilon + 0.5))
            v = cols["value"].astype(bool)
            return {"r": np.where(keep, v, ~v).astype(np.uint8)}

    class Malformed(Audited):
        NAME = "coinflip-malformed"

        def audit_profile(self):
            return A.AuditProfile([[0.9, 0.5], [0.3, 0.5]], [{"value": 0.0}, {"value": 1.0}],
                                  lambda reports: reports["r"])

    for cls in (Audited, Leaky, Malformed):  # beside "coinflip", as the plugin registers it
        fresh.register(cls.NAME, cls, mod.CoinFlipEstimator, source="audit-tests")
    monkeypatch.setattr(R, "get_registry", lambda: fresh)
    return fresh


def test_a_plugin_with_an_audit_profile_is_audited(plugins):
    (r,) = R.run(quick=True, seed=SEED, only=["coinflip-audited"])
    assert r["method"] == "coinflip-audited" and r["dataset"] == "plugin audit_profile"
    assert r["verdict"] == "consistent" and r["claimed_epsilon"] == 1.0
    assert r["exact_epsilon"] == pytest.approx(1.0, abs=1e-9)
    assert 0.8 < r["empirical_epsilon_lower"] <= 1.0  # 10^5 samples a side: close to the claim
    assert r["confidence"] == pytest.approx(0.95) and r["samples"] == 200_000


def test_a_leaky_plugin_is_caught_by_sampling_not_by_its_own_matrix(plugins):
    """Its profile states the claimed probabilities (exact = 1); perturb draws at eps 1.5: the
    empirical bound (about 1.47 with 5*10^4 evaluation samples a side) exceeds the claim."""
    (r,) = R.run(quick=True, seed=SEED, only=["coinflip-leaky"])
    assert r["exact_epsilon"] == pytest.approx(1.0, abs=1e-9)
    assert r["empirical_epsilon_lower"] > 1.2 and r["verdict"] == "violates claim"


def test_a_plugin_without_an_audit_profile_is_refused_by_name(plugins):
    """`audit --only coinflip` divided by zero (no audit in the plan); now it is refused before
    anything is sampled, naming the reason and what would make the plugin auditable."""
    for only in (["coinflip"], ["grr", "coinflip"]):
        with pytest.raises(R.NotAuditable) as e:
            R.run(quick=True, seed=SEED, only=only)
        msg = str(e.value)
        assert msg.startswith("coinflip (plugin from ldp-beam-coinflip) cannot be audited: "
                              "CoinFlip has no audit_profile()"), msg
        assert "AuditProfile(matrix, inputs, output_code)" in msg and "docs/plugins.md" in msg
    with pytest.raises(R.NotAuditable, match=r"coinflip-malformed .*audit_profile\(\)\.matrix"):
        R.run(quick=True, seed=SEED, only=["coinflip-malformed"])
    code, so, se = run_cli("audit", "--quick", "-q", "--only", "coinflip")
    assert code == 2 and so == "" and len(se.strip().splitlines()) == 1, se
    assert se.startswith("ldp-beam audit: error: coinflip (plugin from ldp-beam-coinflip) "
                         "cannot be audited"), se
    assert "ZeroDivisionError" not in se


def test_a_full_run_lists_a_plugin_without_a_profile_as_not_audited(plugins, monkeypatch):
    """Without --only every family is audited or listed with its reason (the built-ins' plan
    cut to GRR here, for time)."""
    plan = R._plan
    monkeypatch.setattr(R, "_plan", lambda quick: [p for p in plan(quick) if p[0] == "grr"])
    recs = {r["method"]: r for r in R.run(quick=True, seed=SEED)}
    assert recs["grr"]["verdict"] == "consistent"
    assert recs["coinflip-audited"]["verdict"] == "consistent"
    assert recs["coinflip"]["verdict"] == "not audited"
    assert "no audit_profile()" in recs["coinflip"]["note"]
    assert "central release" in recs["laplace-histogram"]["note"]  # (cut from the plan here)
    assert "not audited: coinflip: coinflip (plugin from" in R.summary(list(recs.values()))
