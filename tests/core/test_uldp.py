"""The categorical / joint-distribution family: uRR, GRR, JuRR, CPRR, JD-GRR, TDRR.

Tolerances come from sampling theory: chi-square quantiles for sampled output frequencies,
normal quantiles (Bonferroni over cells) for unbiasedness, and the sampling distribution of a
standard deviation for the variance formulas.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chi2, norm

from ldp_beam.audit import ldp_epsilon, uldp2d_epsilon, uldp_epsilon
from ldp_beam.core import encode_categories
from ldp_beam.errors import InvalidRecordsError, ParameterError
from ldp_beam.estimators import estimator_for
from ldp_beam.estimators.consistency import project_simplex
from ldp_beam.mechanisms.categorical import GRR, URR
from ldp_beam.mechanisms.joint import CPRR, JDGRR, TDRR, JuRR, jurr_min_epsilon
from ldp_beam.privacy import LDP, ULDP
from ldp_beam.registry import build_mechanism

X = ("a", "b", "c", "d")
Y = ("u", "v", "w")


def joint_mechanisms(eps: float = 2.0, xs=("a", "b"), ys=("u",)):
    return [JuRR(eps, X, Y, xs, ys), CPRR(eps, X, Y, xs, ys), JDGRR(eps, X, Y),
            TDRR(eps, X, Y, xs, ys)]


def all_mechanisms():
    return joint_mechanisms() + [URR(1.0, X, ("a", "b")), GRR(1.0, X)]


def ids(ms):
    return [m.name for m in ms]


def true_joint() -> np.ndarray:
    """A dependent joint distribution over X x Y (every cell positive)."""
    f = np.array([[0.20, 0.05, 0.02],
                  [0.04, 0.15, 0.03],
                  [0.03, 0.06, 0.12],
                  [0.10, 0.02, 0.18]])
    return f / f.sum()


def sample_cells(f: np.ndarray, n: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    cells = rng.choice(f.size, size=n, p=f.ravel())
    return np.divmod(cells, f.shape[1])


# --------------------------------------------------------------------------- categories
def test_encode_categories_text_and_integers():
    codes, missing, unknown = encode_categories(np.array(["b", None, "zz", "a"], dtype=object),
                                                ("a", "b"))
    assert codes.tolist() == [1, -1, -1, 0]
    assert missing.tolist() == [False, True, False, False]
    assert unknown.tolist() == [False, False, True, False]
    codes, _, unknown = encode_categories(np.array([3, 1, 7]), ("1", "3"))
    assert codes.tolist() == [1, 0, -1] and unknown.tolist() == [False, False, True]
    codes, missing, _ = encode_categories(np.array([1.0, np.nan, 3.0]), ("1", "3"))
    assert codes.tolist() == [0, -1, 1] and missing.tolist() == [False, True, False]


def test_labels_are_canonical_text():
    m = URR(1.0, (1, 2, 3), (1,))
    assert m.domain == ("1", "2", "3") and m.sensitive == ("1",)
    assert m.perturb(np.array([1, 2, 3]), rng=1)["v"].dtype == np.uint16


# --------------------------------------------------------------------------- transition matrices
@pytest.mark.parametrize("mech", all_mechanisms(), ids=ids(all_mechanisms()))
def test_transition_matrix_is_stochastic(mech):
    q = mech.transition_matrix()
    assert q.shape[0] == q.shape[1]
    assert q.min() >= 0
    np.testing.assert_allclose(q.sum(axis=0), 1.0, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(nx=st.integers(1, 5), ny=st.integers(1, 5), eps=st.floats(0.1, 6.0),
       data=st.data())
def test_stochastic_for_any_sensitive_sets(nx, ny, eps, data):
    if nx * ny < 2:
        return
    xd, yd = tuple(f"x{i}" for i in range(nx)), tuple(f"y{j}" for j in range(ny))
    sx = data.draw(st.integers(1, nx))
    sy = data.draw(st.integers(1, ny))
    xs, ys = xd[:sx], yd[:sy]
    mechs = [CPRR(eps, xd, yd, xs, ys), JDGRR(eps, xd, yd), TDRR(eps, xd, yd, xs, ys)]
    if sx == nx or sy == ny or eps > jurr_min_epsilon(sx, sy):
        mechs.append(JuRR(eps, xd, yd, xs, ys))
    for m in mechs:
        q = m.transition_matrix()
        assert q.min() >= -1e-15, m
        np.testing.assert_allclose(q.sum(axis=0), 1.0, atol=1e-12)


@pytest.mark.parametrize("mech", all_mechanisms(), ids=ids(all_mechanisms()))
def test_sampled_outputs_match_the_matrix(mech):
    """For every input cell, the output counts of 20,000 perturbations pass a chi-square
    goodness-of-fit test against the matrix column (level 1e-4 per cell, seeded)."""
    q = mech.transition_matrix()
    k = q.shape[1]
    n = 20_000
    rng = np.random.default_rng(11)
    joint = mech.name not in ("urr", "grr")
    for cell in range(k):
        if joint:
            i, j = divmod(cell, len(Y))
            data = {"x": np.full(n, X[i], dtype=object), "y": np.full(n, Y[j], dtype=object)}
        else:
            data = np.full(n, X[cell], dtype=object)
        rep = mech.perturb(data, rng=rng)
        out = rep["x"].astype(np.int64) * len(Y) + rep["y"] if joint else rep["v"]
        counts = np.bincount(out, minlength=k)
        expected = q[:, cell] * n
        zero = expected == 0
        assert counts[zero].sum() == 0, (mech.name, cell)
        stat = ((counts[~zero] - expected[~zero]) ** 2 / expected[~zero]).sum()
        dof = int((~zero).sum()) - 1
        if dof > 0:
            assert stat < chi2.ppf(1 - 1e-4, dof), (mech.name, cell, stat)


# --------------------------------------------------------------------------- privacy
@pytest.mark.parametrize("eps", [1.2, 2.0, 4.0])
def test_privacy_definitions_hold_exactly(eps):
    xs_, ys_ = ("a", "b"), ("u",)
    for m in joint_mechanisms(eps, xs_, ys_):
        q = m.transition_matrix()
        xs, ys = m.sensitive_masks() if not isinstance(m, JDGRR) else \
            (np.isin(X, xs_), np.isin(Y, ys_))
        product_s = (xs[:, None] | ys[None, :]).ravel()
        g = m.guarantee
        assert g.epsilon == eps
        # the paper's 2-D ULDP holds with exactly eps for every mechanism
        assert uldp2d_epsilon(q, xs, ys) == pytest.approx(eps, abs=1e-9), m.name
        if isinstance(m, JDGRR):
            assert g.kind == LDP and ldp_epsilon(q) == pytest.approx(eps)
        elif isinstance(m, CPRR):
            assert g.kind == ULDP and uldp_epsilon(q, product_s) == pytest.approx(eps)
            assert ldp_epsilon(q) == math.inf
        else:  # JuRR, TDRR: not ULDP on the product domain, and the guarantee says so
            assert g.kind == ULDP and "NOT (S, eps)-ULDP" in g.notes
            assert uldp_epsilon(q, product_s) == math.inf


def test_urr_and_grr_guarantees():
    u = URR(1.5, X, ("a",))
    sens = np.isin(X, ("a",))
    assert uldp_epsilon(u.transition_matrix(), sens) == pytest.approx(1.5)
    assert ldp_epsilon(u.transition_matrix()) == math.inf
    assert u.guarantee.kind == ULDP
    g = GRR(1.5, X)
    assert ldp_epsilon(g.transition_matrix()) == pytest.approx(1.5) and g.guarantee.kind == LDP


def test_jurr_reveals_a_nonsensitive_y_of_a_sensitive_x():
    """The weaker definition is real: an (a, v) user (a sensitive, v not) reports y = v exactly
    with probability p + (sx - 1) q, and never reports any other non-sensitive y."""
    m = JuRR(2.0, X, Y, ("a", "b"), ("u",))
    q = m.transition_matrix().reshape(4, 3, 4, 3)[:, :, 0, 1]  # input (a, v)
    pr = m.probabilities()
    assert q[:, 1].sum() == pytest.approx(pr["p"] + pr["q"])
    assert q[:, 2].sum() == 0.0


def test_jurr_rejects_the_invalid_region_naming_the_bound():
    with pytest.raises(ParameterError, match=r"sx \* sy < \(e\^epsilon - 1\)\^2") as ei:
        JuRR(0.5, X, Y, ("a", "b"), ("u", "v"))
    assert "1.0986" in str(ei.value) and "t = -0.07" in str(ei.value)
    assert jurr_min_epsilon(2, 2) == pytest.approx(math.log(3))
    JuRR(1.1, X, Y, ("a", "b"), ("u", "v"))  # just above ln 3
    # without a fully non-sensitive block t never enters: valid at any eps
    m = JuRR(0.5, X, Y, X, ("u",))
    np.testing.assert_allclose(m.transition_matrix().sum(axis=0), 1.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0.0), "epsilon"),
    (dict(epsilon=-1.0), "epsilon"),
    (dict(x_domain=()), "x_domain"),
    (dict(x_domain=("a", "a", "b")), "distinct"),
    (dict(x_sensitive=("a", "zz")), r"subset of x_domain"),
    (dict(y_sensitive=()), "y_sensitive"),
    (dict(x_domain=("a",), y_domain=("u",), x_sensitive=("a",), y_sensitive=("u",)),
     "at least 2 cells"),
])
def test_bad_parameters(kwargs, match):
    base = dict(epsilon=2.0, x_domain=X, y_domain=Y, x_sensitive=("a",), y_sensitive=("u",))
    base.update(kwargs)
    with pytest.raises(ParameterError, match=match):
        CPRR(**base)


def test_bad_records_are_named():
    m = CPRR(1.0, X, Y, ("a",), ("u",))
    with pytest.raises(InvalidRecordsError) as ei:
        m.perturb({"x": np.array(["a", "zz", None, "b"], dtype=object),
                   "y": np.array(["u", "u", "v", "nope"], dtype=object)})
    r = ei.value.reasons
    assert set(r) == {1, 2, 3}
    assert "x: 'zz' is not in the declared domain" in r[1]
    assert "x: missing value" in r[2]
    assert "y: 'nope' is not in the declared domain" in r[3]


def test_cli_strings_build_mechanisms():
    m = build_mechanism("jurr", epsilon="2", x_domain="a,b,c,d", y_domain="u,v,w",
                        x_sensitive="a,b", y_sensitive="u")
    assert m.x_domain == X and m.x_sensitive == ("a", "b")


# --------------------------------------------------------------------------- estimators
@pytest.mark.parametrize("mech", all_mechanisms(), ids=ids(all_mechanisms()))
def test_closed_form_equals_solving_with_the_matrix(mech):
    est = estimator_for(mech)
    q = mech.transition_matrix()
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(q.shape[0]))
    closed = est.unbias(p.reshape(est.shape)).ravel()
    np.testing.assert_allclose(closed, np.linalg.solve(q, p), atol=1e-10)
    # A (built from the closed form) is Q^-1, power=2 is A*A, adjoint is A^T
    k = q.shape[0]
    a = np.stack([est.unbias(np.eye(k)[c].reshape(est.shape)).ravel() for c in range(k)], axis=1)
    np.testing.assert_allclose(a @ q, np.eye(k), atol=1e-10)
    a2 = np.stack([est.unbias(np.eye(k)[c].reshape(est.shape), 2).ravel() for c in range(k)],
                  axis=1)
    np.testing.assert_allclose(a2, a * a, atol=1e-9)
    w = rng.normal(size=(3,) + est.shape)
    np.testing.assert_allclose(est.adjoint(w).reshape(3, k), w.reshape(3, k) @ a, atol=1e-9)


def test_jurr_closed_form_without_nonsensitive_x():
    m = JuRR(1.0, X, Y, X, ("u",))
    est = estimator_for(m)
    p = np.random.default_rng(4).dirichlet(np.ones(12))
    np.testing.assert_allclose(est.unbias(p.reshape(4, 3)).ravel(),
                               np.linalg.solve(m.transition_matrix(), p), atol=1e-10)


def _simulate(mech, f, n, reps, seed):
    """reps independent collections of n users: raw joint estimates, SEs and marginal SEs."""
    rng = np.random.default_rng(seed)
    est = estimator_for(mech)
    fs, ses, mses = [], [], []
    for _ in range(reps):
        i, j = sample_cells(f, n, rng)
        rep = mech.perturb_valid({"x": i, "y": j}, rng)
        e = est.finalize(est.add(est.create(), rep))
        fs.append(e["joint"].value)
        ses.append(e["joint"].stderr)
        mses.append(e["marginal_x"].stderr)
    return np.array(fs), np.array(ses), np.array(mses), est


@pytest.mark.parametrize("mech", joint_mechanisms(), ids=ids(joint_mechanisms()))
def test_unbiased_and_standard_errors_match_simulation(mech):
    """400 collections of 2,000 users. (1) The mean estimate is within z * SE/sqrt(R) of the
    truth for every cell (z = Bonferroni 0.001 over the cells). (2) The reported per-cell SE
    (mean over runs) matches the empirical SD over runs within 5 SEs of a sample SD,
    SD/sqrt(2(R-1)); the same for the x marginal."""
    f = true_joint()
    reps, n = 400, 2000
    fs, ses, mses, _ = _simulate(mech, f, n, reps, seed=hash(mech.name) % 1000)
    sd = fs.std(axis=0, ddof=1)
    z = norm.ppf(1 - 0.001 / (2 * f.size))
    assert np.all(np.abs(fs.mean(axis=0) - f) <= z * sd / math.sqrt(reps)), mech.name
    rel = 5 / math.sqrt(2 * (reps - 1))
    np.testing.assert_allclose(ses.mean(axis=0), sd, rtol=rel)
    msd = fs.sum(axis=2).std(axis=0, ddof=1)
    np.testing.assert_allclose(mses.mean(axis=0), msd, rtol=rel)


def test_tdrr_product_of_marginals_is_biased_on_dependent_data():
    """The paper's TDRR estimate assumes independence: on a dependent joint its mean misses the
    truth by far more than its sampling error, while the Kronecker estimate does not."""
    f = true_joint()
    mech = TDRR(4.0, X, Y, ("a", "b"), ("u",))
    rng = np.random.default_rng(8)
    est = estimator_for(mech)
    i, j = sample_cells(f, 400_000, rng)
    e = est.finalize(est.add(est.create(), mech.perturb_valid({"x": i, "y": j}, rng)))
    indep = np.outer(f.sum(axis=1), f.sum(axis=0))
    kron, prod = e["joint"], e["joint_independent"]
    z = norm.ppf(1 - 0.001 / (2 * f.size))
    assert np.all(np.abs(kron.value - f) <= z * kron.stderr)
    assert np.all(np.abs(prod.value - indep) <= z * prod.stderr)
    biggest = np.argmax(np.abs(indep - f))
    assert abs(prod.value.flat[biggest] - f.flat[biggest]) > 10 * prod.stderr.flat[biggest]
    # the Kronecker joint's margins are the 1-D uRR estimates, so the paper's estimate is their
    # outer product
    np.testing.assert_allclose(prod.value, np.outer(e["marginal_x"].value,
                                                    e["marginal_y"].value), atol=1e-12)


def test_marginals_conditionals_and_consistency():
    f = true_joint()
    mech = CPRR(3.0, X, Y, ("a", "b"), ("u",))
    rng = np.random.default_rng(9)
    i, j = sample_cells(f, 100_000, rng)
    est = estimator_for(mech)
    e = est.finalize(est.add(est.create(), mech.perturb_valid({"x": i, "y": j}, rng)))
    joint = e["joint"]
    np.testing.assert_allclose(e["marginal_x"].value, joint.value.sum(axis=1))
    np.testing.assert_allclose(e["marginal_y"].value, joint.value.sum(axis=0))
    c = joint.clipped
    assert c.min() >= 0 and c.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(e["y_given_x"].value.sum(axis=1), 1.0)
    np.testing.assert_allclose(e["x_given_y"].value.sum(axis=0), 1.0)
    np.testing.assert_allclose(e["y_given_x"].value * c.sum(axis=1)[:, None], c)
    assert e.n_reports == 100_000
    d = e.to_dict()
    assert len(d["statistics"]["joint"]["value"]) == 4 and d["guarantee"]["kind"] == ULDP


def test_frequency_estimator_unbiased():
    f = np.array([0.4, 0.3, 0.2, 0.1])
    mech = URR(1.0, X, ("a", "b"))
    rng = np.random.default_rng(5)
    x = rng.choice(4, size=200_000, p=f)
    est = estimator_for(mech)
    e = est.finalize(est.add(est.create(), mech.perturb_valid({"value": x}, rng)))
    s = e["frequency"]
    z = norm.ppf(1 - 0.001 / 8)
    assert np.all(np.abs(s.value - f) <= z * s.stderr)
    assert s.clipped.sum() == pytest.approx(1.0)


# --------------------------------------------------------------------------- accumulator
@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(0, 500), max_size=5), seed=st.integers(0, 2**32 - 1))
def test_split_merge_invariance(cuts, seed):
    mech = JuRR(2.0, X, Y, ("a", "b"), ("u",))
    est = estimator_for(mech)
    rng = np.random.default_rng(seed)
    i, j = sample_cells(true_joint(), 500, rng)
    rep = mech.perturb_valid({"x": i, "y": j}, rng)
    whole = est.add(est.create(), rep)
    bounds = [0] + sorted(cuts) + [500]
    parts = [est.add(est.create(), {k: v[a:b] for k, v in rep.items()})
             for a, b in zip(bounds[:-1], bounds[1:])]
    rng.shuffle(parts)
    merged = est.merge([est.merge(parts[: len(parts) // 2]), est.merge(parts[len(parts) // 2:])])
    np.testing.assert_array_equal(merged, whole)
    assert merged.dtype == np.int64 and merged.shape == (12,)


def test_malformed_reports_are_flagged():
    est = estimator_for(CPRR(1.0, X, Y, ("a",), ("u",)))
    r = est.check_reports({"x": np.array([0, 4, 1, -1]), "y": np.array([0, 0, 2.5, 1])})
    msgs = r.as_dict()
    assert set(msgs) == {1, 2, 3}
    assert "not a code in [0, 4)" in msgs[1] and "[0, 3)" in msgs[2]
    r = est.check_reports({"x": np.array([0])})
    assert "report field 'y' is missing" in r.as_dict()[0]


# --------------------------------------------------------------------------- consistency
@settings(max_examples=60, deadline=None)
@given(v=st.lists(st.floats(-3, 3), min_size=1, max_size=30))
def test_project_simplex_is_the_euclidean_projection(v):
    v = np.array(v)
    p = project_simplex(v)
    assert p.min() >= 0 and p.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(project_simplex(p), p, atol=1e-12)  # idempotent
    # KKT: p = max(v - theta, 0) with one theta, and the positive cells all share it
    pos = p > 0
    theta = (v[pos] - p[pos])
    np.testing.assert_allclose(theta, theta[0], atol=1e-9)
    assert np.all(v[~pos] <= theta[0] + 1e-9)


@settings(max_examples=40, deadline=None)
@given(nx=st.integers(1, 6), ny=st.integers(2, 6), eps=st.floats(2.5, 6.0), data=st.data())
def test_fast_marginal_stderr_equals_the_generic_adjoint_route(nx, ny, eps, data):
    """The O(|X||Y|) class-based marginal variances equal one adjoint per marginal."""
    xd, yd = tuple(f"x{i}" for i in range(nx)), tuple(f"y{j}" for j in range(ny))
    sx, sy = data.draw(st.integers(1, nx)), data.draw(st.integers(1, ny))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    xs = tuple(rng.choice(xd, sx, replace=False))
    ys = tuple(rng.choice(yd, sy, replace=False))
    mechs = [CPRR(eps, xd, yd, xs, ys), JDGRR(eps, xd, yd), TDRR(eps, xd, yd, xs, ys)]
    if sx == nx or sy == ny or eps > jurr_min_epsilon(sx, sy):
        mechs.append(JuRR(eps, xd, yd, xs, ys))
    for m in mechs:
        est = estimator_for(m)
        acc = rng.integers(0, 50, nx * ny).astype(np.int64) + 1
        f, _, _ = est.estimate_table(acc)
        for axis in (0, 1):
            fast = est.marginal_stderr(acc, f, axis)
            assert est._plans[axis] is not None, (m.name, axis)
            k = est.shape[axis]
            w = np.zeros((k,) + est.shape)
            for i in range(k):
                if axis == 0:
                    w[i, i, :] = 1
                else:
                    w[i, :, i] = 1
            # compare variances: a true zero (a single line holds everything) comes out as the
            # square root of rounding noise, ~1e-9, on both routes
            np.testing.assert_allclose(fast ** 2, est.functional_stderr(w, acc, f) ** 2,
                                       rtol=1e-9, atol=1e-14)
