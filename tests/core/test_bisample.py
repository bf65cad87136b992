"""BiSample, BiSample-MD and the paper's baselines (Harmony, PM, PrivKVM).

Every tolerance here comes from theory:

* distributional checks are chi-square goodness-of-fit tests at significance ``P_MIN``;
* simulation checks compare the mean of ``R`` estimates with the truth within 4 theoretical
  standard errors ``sd / sqrt(R)``, where ``sd`` is the exact (delta-method) standard deviation of
  one estimate on the fixed dataset, computed from the mechanism's published transition
  probabilities; the paper's Eq. 14 is checked to be the same variance;
* variance checks compare ``(R - 1) s^2 / sigma^2`` with the ``P_MIN`` quantiles of chi2(R - 1).

Why the reported standard errors are (slightly) conservative: every estimator reports the plug-in
variance of an i.i.d. sample from the *mixture* of the users' output distributions. On a fixed
dataset the users' reports are independent but not identically distributed, and the variance of a
(linearized) estimator is the mean of the per-user variances, which is smaller by the spread of the
per-user means. We compute both exactly, so the test of the reported errors is two-sided:
``s^2 / mean(se^2)`` must lie within ``rho * [chi2 band]`` with ``rho = exact / plug-in <= 1``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from ldp_beam import EmptyAccumulatorError, InvalidRecordsError, estimator_for
from ldp_beam.mechanisms import BiSample, BiSampleMD, Harmony, PiecewiseMechanism, PrivKVM

SEED = 1234
P_MIN = 1e-4  # significance level of every statistical check
R = 1000  # repetitions in the simulation checks (variance band about +-17%)
N = 2000  # users per repetition
N_MD = 5000  # users per repetition for BiSample-MD: its ratio estimator's O(1/n) bias must stay
#              well under the standard error of the mean of R estimates (checked in the test)
L, U = 20.0, 80.0  # a domain with L != 0 and L != -U, so that sign slips in [L, U] show up
HALF, MID = (U - L) / 2, (U + L) / 2
EPS = 1.0
UNIT = dict(lower=-1.0, upper=1.0)  # the paper's normalized domain (the bounds are required)

CHI_LO = stats.chi2.ppf(P_MIN / 2, R - 1) / (R - 1)
CHI_HI = stats.chi2.ppf(1 - P_MIN / 2, R - 1) / (R - 1)
Z95 = stats.norm.ppf(0.975)
COVERAGE_MIN = 0.95 - 4 * math.sqrt(0.95 * 0.05 / R)


def k_of(eps: float) -> float:
    """2p - 1 = (e^eps - 1)/(e^eps + 1)."""
    return (math.exp(eps) - 1) / (math.exp(eps) + 1)


def to_values(x: np.ndarray) -> np.ndarray:
    """Normalized x in [-1, 1] (NaN stays NaN) -> values in [L, U]."""
    return MID + HALF * x


# --------------------------------------------------------------------------- theory helpers
def linear_variances(P: np.ndarray, psi: np.ndarray) -> tuple[float, float]:
    """Variance of an estimator T ~ T0 + (1/n) sum_i psi(report_i), for n users whose report
    codes have distributions P (n x K): (exact on this fixed dataset, plug-in / i.i.d. mixture)."""
    n = P.shape[0]
    m1, m2 = P @ psi, P @ (psi * psi)
    exact = float((m2 - m1**2).sum()) / n**2
    pi = P.mean(axis=0)
    plugin = float(pi @ (psi * psi) - (pi @ psi) ** 2) / n
    return exact, plugin


def bisample_influence(P: np.ndarray):
    """f_POS, f_NEG (Eqs. 9-10) at the expected report frequencies and their influence vectors
    over the report codes 2s + b."""
    pi = P.mean(axis=0)
    p_neg, p_pos = pi[0] + pi[1], pi[2] + pi[3]
    f_pos, f_neg = pi[3] / p_pos, pi[1] / p_neg
    psi_pos = (np.array([0, 0, 0, 1.0]) - f_pos * np.array([0, 0, 1, 1.0])) / p_pos
    psi_neg = (np.array([0, 1, 0, 0.0]) - f_neg * np.array([1, 1, 0, 0.0])) / p_neg
    return f_pos, f_neg, psi_pos, psi_neg


def exact_cov(P: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    n = P.shape[0]
    return float(((P @ (a * b)) - (P @ a) * (P @ b)).sum()) / n**2


def pm_moments(t: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """E[y | t] and E[y^2 | t] of PM, integrated exactly from the paper's piecewise density."""
    e = math.exp(eps / 2)
    C = (e + 1) / (e - 1)
    hi, lo = e / (e + 1) / (C - 1), 1 / (e + 1) / (C + 1)
    t = np.asarray(t, float)
    l = (C + 1) / 2 * t - (C - 1) / 2
    r = l + C - 1

    def integral(a, b, k):  # int_a^b y^k dy
        return (b ** (k + 1) - a ** (k + 1)) / (k + 1)

    m = [lo * (integral(-C, l, k) + integral(r, C, k)) + hi * integral(l, r, k) for k in (1, 2)]
    return m[0], m[1]


def pm_var(t: np.ndarray, eps: float) -> np.ndarray:
    m1, m2 = pm_moments(t, eps)
    return m2 - m1**2


def pm_bin_probabilities(edges: np.ndarray, t: float, eps: float) -> np.ndarray:
    """P[y in bin | t] for PM from the paper's definition (not from ``density``)."""
    e = math.exp(eps / 2)
    C = (e + 1) / (e - 1)
    l = (C + 1) / 2 * t - (C - 1) / 2
    r = l + C - 1
    a, b = edges[:-1], edges[1:]
    inside = np.clip(np.minimum(b, r) - np.maximum(a, l), 0, None)
    width = np.clip(np.minimum(b, C) - np.maximum(a, -C), 0, None)
    return e / (e + 1) * inside / (C - 1) + 1 / (e + 1) * (width - inside) / (C + 1)


def simulate(mech, data: dict, reps: int, seed: int):
    """Perturb ``reps`` independent copies of the dataset in one vectorized call, then estimate
    each copy separately. Returns the list of Estimates."""
    n = len(data["value"])
    tiled = {k: np.tile(v, reps) for k, v in data.items()}
    reports = mech.perturb(tiled, rng=seed)
    est = estimator_for(mech)
    return [est.estimate({f: v[i * n:(i + 1) * n] for f, v in reports.items()})
            for i in range(reps)]


def check_simulation(estimates, name, truth, exact_var, plugin_var, bias=0.0):
    """Unbiasedness, variance calibration (against theory and the reported errors), coverage."""
    vals = np.array([e[name].value for e in estimates], float)
    ses = np.array([e[name].stderr for e in estimates], float)
    se_r = math.sqrt(exact_var / len(vals))
    assert abs(bias) <= 0.5 * se_r, f"{name}: n too small, O(1/n) bias {bias} vs {se_r}"
    err = vals.mean() - truth
    assert abs(err) <= 4 * se_r + abs(bias), \
        f"{name}: mean of {len(vals)} estimates {vals.mean()!r} vs truth {truth!r} " \
        f"({err / se_r:+.2f} theoretical standard errors)"
    s2 = vals.var(ddof=1)
    ratio = s2 / exact_var
    assert CHI_LO <= ratio <= CHI_HI, \
        f"{name}: empirical/theoretical variance {ratio:.3f} outside [{CHI_LO:.3f}, {CHI_HI:.3f}]"
    rho = exact_var / plugin_var
    assert rho <= 1 + 1e-9
    rep = s2 / np.mean(ses**2)
    assert rho * CHI_LO <= rep <= rho * CHI_HI, \
        f"{name}: empirical/reported variance {rep:.3f} outside rho*[{CHI_LO:.3f}, " \
        f"{CHI_HI:.3f}] with rho = {rho:.3f}"
    cover = np.mean(np.abs(vals - truth) <= Z95 * ses)
    assert cover >= COVERAGE_MIN, f"{name}: 95% CI coverage {cover:.3f} < {COVERAGE_MIN:.3f}"


def dataset(n: int, seed: int, missing: float = 0.0, nan_share: float = 0.0):
    """Normalized values with spread (so that exact and plug-in variances differ), values in
    [L, U], and a preference column: a ``missing`` share of users has eps_u < EPS, and a further
    ``nan_share`` has a null value."""
    g = np.random.default_rng(seed)
    x = np.clip(g.normal(0.3, 0.45, n), -1, 1)
    x[:5] = [-1, 1, -1, 1, 0]  # the domain's ends are valid values
    u = g.random(n)
    no_answer = u < missing
    null = (u >= missing) & (u < missing + nan_share)
    pref = np.where(no_answer, g.uniform(0.05, EPS * 0.99, n), g.uniform(EPS, 10, n))
    value = to_values(np.where(null, np.nan, x))
    miss = no_answer | null
    return {"value": value, "preference": pref}, np.where(miss, np.nan, x)


# --------------------------------------------------------------------------- mechanisms
def count_mechs(eps=EPS):
    return {
        "bisample": BiSample(epsilon=eps, lower=L, upper=U),
        "bisample-md": BiSampleMD(epsilon=eps, lower=L, upper=U),
        "harmony": Harmony(epsilon=eps, lower=L, upper=U),
        "privkvm": PrivKVM(epsilon=eps, lower=L, upper=U),
    }


SUPPORTS_MISSING = {"bisample-md", "privkvm"}  # a missing value has its own report distribution
GRID = np.linspace(-1, 1, 4001)


def audit_grid(name):
    return np.append(GRID, np.nan) if name in SUPPORTS_MISSING else GRID


@pytest.mark.parametrize("eps", [0.05, 0.5, 1.0, 2.5, 6.0])
@pytest.mark.parametrize("name", ["bisample", "bisample-md", "harmony", "privkvm"])
def test_transition_probabilities_sum_to_one(name, eps):
    mech = count_mechs(eps)[name]
    P = mech.output_probabilities(audit_grid(name))
    assert P.shape[0] == audit_grid(name).size
    assert np.all(P >= 0) and np.all(P <= 1)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-14)


def _codes(mech, reports):
    return np.asarray(estimator_for(mech).cells(reports), np.int64)


def _gof(groups):
    """Combined chi-square goodness of fit over independent groups of (observed, expected)."""
    stat, df = 0.0, 0
    for obs, exp in groups:
        assert obs.sum() == pytest.approx(exp.sum(), rel=1e-9)
        keep = exp > 0
        assert np.all(obs[~keep] == 0), "a report the theory gives probability 0"
        stat += float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
        df += int(keep.sum()) - 1
    return stats.chi2.sf(stat, df), stat, df


X_POINTS = np.array([-1.0, -0.6, 0.0, 0.25, 0.9, 1.0])
M_PER_POINT = 20000


@pytest.mark.parametrize("eps", [0.5, 2.0])
@pytest.mark.parametrize("name", ["bisample", "bisample-md", "harmony", "privkvm"])
def test_empirical_outputs_match_transition_probabilities(name, eps):
    """Reports from ``perturb`` (coded by the estimator's cells) follow output_probabilities,
    including the missing value where the mechanism encodes it."""
    mech = count_mechs(eps)[name]
    xs = list(X_POINTS) + ([np.nan] if name in SUPPORTS_MISSING else [])
    value = np.repeat(to_values(np.array(xs)), M_PER_POINT)
    reports = mech.perturb(value, rng=SEED)
    codes = _codes(mech, reports).reshape(len(xs), M_PER_POINT)
    P = mech.output_probabilities(np.array(xs))
    K = P.shape[1]
    groups = [(np.bincount(codes[i], minlength=K), M_PER_POINT * P[i]) for i in range(len(xs))]
    pval, stat, df = _gof(groups)
    assert pval > P_MIN, f"chi2 = {stat:.1f} on {df} df, p = {pval:.2e}"


@pytest.mark.parametrize("name", ["bisample", "bisample-md", "harmony", "privkvm"])
def test_gof_detects_a_wrong_distribution(name):
    """Power check of the test above: reports for x = 0.25 are rejected against x = 0."""
    mech = count_mechs(1.0)[name]
    reports = mech.perturb(np.full(M_PER_POINT, to_values(0.25)), rng=SEED)
    obs = np.bincount(_codes(mech, reports), minlength=mech.output_probabilities(0.0).shape[1])
    pval, _, _ = _gof([(obs, M_PER_POINT * mech.output_probabilities(0.0)[0])])
    assert pval < P_MIN


@pytest.mark.parametrize("fake", ["top", "rnd"])
@pytest.mark.parametrize("name", ["bisample", "harmony"])
def test_forced_answer_fakes_follow_their_distribution(name, fake):
    """A user with eps_u < eps fakes: TOP sends the upper bound (x = 1); RND a uniform x, whose
    output distribution is P(x = 0) because the transition probabilities are linear in x."""
    mech = type(count_mechs()[name])(epsilon=EPS, lower=L, upper=U, fake=fake)
    n = 4 * M_PER_POINT
    g = np.random.default_rng(SEED)
    data = {"value": g.uniform(L, U, n), "preference": np.full(n, EPS / 2)}
    codes = _codes(mech, mech.perturb(data, rng=SEED))
    P = mech.output_probabilities(1.0 if fake == "top" else 0.0)[0]
    pval, stat, df = _gof([(np.bincount(codes, minlength=P.size), n * P)])
    assert pval > P_MIN, f"chi2 = {stat:.1f} on {df} df, p = {pval:.2e}"


@pytest.mark.parametrize("eps", [0.5, 2.0])
@pytest.mark.parametrize("fake", ["top", "rnd"])
def test_pm_outputs_match_the_piecewise_density(eps, fake):
    mech = PiecewiseMechanism(epsilon=eps, lower=L, upper=U, fake=fake)
    C = mech.C
    edges = np.linspace(-C, C, 41)
    ts = np.array([-1.0, -0.3, 0.0, 0.8, 1.0])
    value = np.repeat(to_values(ts), M_PER_POINT)
    y = mech.perturb(value, rng=SEED)["y"].reshape(ts.size, M_PER_POINT)
    assert np.all(np.abs(y) <= C)
    groups = [(np.histogram(y[i], edges)[0], M_PER_POINT * pm_bin_probabilities(edges, t, eps))
              for i, t in enumerate(ts)]
    # users who fake (eps_u < eps): TOP is t = 1; RND mixes t uniformly over [-1, 1]
    n = 4 * M_PER_POINT
    data = {"value": np.full(n, MID), "preference": np.full(n, eps / 2)}
    y_fake = mech.perturb(data, rng=SEED + 1)["y"]
    if fake == "top":
        p_fake = pm_bin_probabilities(edges, 1.0, eps)
    else:  # the bin probabilities are piecewise linear in t: a fine trapezoid is exact to 1e-9
        tt = np.linspace(-1, 1, 20001)
        pb = np.array([pm_bin_probabilities(edges, t, eps) for t in tt])
        p_fake = integrate.trapezoid(pb, tt, axis=0) / 2
    groups.append((np.histogram(y_fake, edges)[0], n * p_fake))
    pval, stat, df = _gof(groups)
    assert pval > P_MIN, f"chi2 = {stat:.1f} on {df} df, p = {pval:.2e}"


def test_pm_density_is_the_papers():
    for eps in (0.3, 1.0, 4.0):
        mech = PiecewiseMechanism(epsilon=eps, **UNIT)
        C = mech.C
        edges = np.linspace(-C, C, 2001)
        mids = (edges[:-1] + edges[1:]) / 2
        for t in (-1.0, -0.2, 0.5, 1.0):
            # average density over each bin from the paper's definition vs ``density`` at the
            # bin centre: equal except in the (at most two) bins holding a jump l(t) or r(t)
            pb = pm_bin_probabilities(edges, t, eps) / np.diff(edges)
            off = ~np.isclose(pb, mech.density(mids, t), rtol=1e-9, atol=0)
            l = (C + 1) / 2 * t - (C - 1) / 2
            jumps = np.searchsorted(edges, [l, l + C - 1]) - 1
            assert set(np.flatnonzero(off)) <= set(jumps.tolist())
            assert np.all(mech.density(np.array([-C - 1e-9, C + 1e-9]), t) == 0)
        # E[y | t] = t and Var[y | t] is Wang et al.'s closed form
        e = math.exp(eps / 2)
        ts = np.linspace(-1, 1, 11)
        m1, _ = pm_moments(ts, eps)
        np.testing.assert_allclose(m1, ts, atol=1e-12)
        np.testing.assert_allclose(pm_var(ts, eps),
                                   ts**2 / (e - 1) + (e + 3) / (3 * (e - 1) ** 2), rtol=1e-10)


# --------------------------------------------------------------------------- privacy audits
def worst_ratio(P: np.ndarray) -> float:
    """max over outputs of max_x P[o | x] / min_x P[o | x]."""
    return float(np.max(P.max(axis=0) / P.min(axis=0)))


@pytest.mark.parametrize("eps", [0.05, 0.5, 1.0, 2.5, 6.0])
@pytest.mark.parametrize("name", ["bisample", "bisample-md", "harmony"])
def test_privacy_audit_tight(name, eps):
    mech = count_mechs(eps)[name]
    g = mech.guarantee
    assert g.kind == "LDP" and g.epsilon == eps
    ratio = worst_ratio(mech.output_probabilities(audit_grid(name)))
    bound = math.exp(g.epsilon)
    assert ratio <= bound * (1 + 1e-12), f"ratio {ratio!r} > e^eps = {bound!r}"
    assert ratio >= bound * (1 - 1e-12), f"ratio {ratio!r} < e^eps = {bound!r}: not tight"


@pytest.mark.parametrize("key_fraction", [0.1, 0.5, 0.8])
@pytest.mark.parametrize("eps", [0.05, 0.5, 1.0, 2.5, 6.0])
def test_privacy_audit_privkvm(eps, key_fraction):
    mech = PrivKVM(epsilon=eps, key_fraction=key_fraction, **UNIT)
    ratio = worst_ratio(mech.output_probabilities(audit_grid("privkvm")))
    bound = math.exp(mech.guarantee.epsilon)
    # the exact worst case: key output e^eps1; value output e^eps2 between present values and
    # 2 e^eps1 p2 between x = +1 and a missing user's uniform fake
    e1, e2 = math.exp(mech.eps1), math.exp(mech.eps2)
    exact = max(e1, e2, 2 * e1 * e2 / (e2 + 1))
    assert ratio <= bound * (1 + 1e-12), f"ratio {ratio!r} > e^eps = {bound!r}"
    assert ratio == pytest.approx(exact, rel=1e-12), \
        f"worst-case ratio {ratio!r} = e^{math.log(ratio):.6f}; analytic {exact!r}"
    assert ratio < bound, f"exact worst case e^{math.log(ratio):.6f} < e^{eps}"


@pytest.mark.parametrize("eps", [0.05, 0.5, 1.0, 2.5, 6.0])
def test_privacy_audit_pm(eps):
    mech = PiecewiseMechanism(epsilon=eps, **UNIT)
    C = mech.C
    y = np.linspace(-C, C, 1201)
    t = np.linspace(-1, 1, 801)
    D = mech.density(y[:, None], t[None, :])  # y x t
    assert np.all(D > 0)
    ratio = float(np.max(D.max(axis=1) / D.min(axis=1)))
    bound = math.exp(mech.guarantee.epsilon)
    assert ratio <= bound * (1 + 1e-12), f"ratio {ratio!r} > e^eps = {bound!r}"
    assert ratio >= bound * (1 - 1e-12), f"ratio {ratio!r} < e^eps: not tight"


def test_audit_catches_a_leaky_mechanism():
    """Power check: a BiSample whose Bernoulli uses the wrong p (eps + 0.1) fails the audit."""
    leaky = BiSample(epsilon=1.1, **UNIT)
    P = leaky.output_probabilities(GRID)
    assert worst_ratio(P) > math.exp(1.0) * (1 + 1e-12)


# --------------------------------------------------------------------------- unbiasedness etc.
@pytest.fixture(scope="module")
def plain_data():
    data, x = dataset(N, SEED)
    return data, x


def test_bisample_mean(plain_data):
    data, x = plain_data
    mech = BiSample(epsilon=EPS, lower=L, upper=U)
    P = mech.output_probabilities(x)
    f_pos, f_neg, psi_pos, psi_neg = bisample_influence(P)
    exact, plugin = linear_variances(P, HALF / k_of(EPS) * (psi_pos - psi_neg))
    # Eq. 14 is the plug-in (i.i.d.) variance: (((e^eps+1)/(e^eps-1))^2 - m^2)/n, normalized
    m = x.mean()
    assert plugin == pytest.approx(HALF**2 * (1 / k_of(EPS) ** 2 - m**2) / N, rel=1e-10)
    # the exact variance on this dataset: (1/k^2 - mean x^2)/n
    assert exact == pytest.approx(HALF**2 * (1 / k_of(EPS) ** 2 - np.mean(x**2)) / N, rel=1e-10)
    ests = simulate(mech, data, R, SEED)
    check_simulation(ests, "mean", data["value"].mean(), exact, plugin)
    check_simulation(ests, "sum", data["value"].sum(), N**2 * exact, N**2 * plugin)


def test_harmony_mean(plain_data):
    data, x = plain_data
    mech = Harmony(epsilon=EPS, lower=L, upper=U)
    P = mech.output_probabilities(x)
    exact, plugin = linear_variances(P, HALF / k_of(EPS) * np.array([-1.0, 1.0]))
    assert plugin == pytest.approx(HALF**2 * (1 / k_of(EPS) ** 2 - x.mean() ** 2) / N, rel=1e-10)
    ests = simulate(mech, data, R, SEED + 1)
    check_simulation(ests, "mean", data["value"].mean(), exact, plugin)


def test_pm_mean(plain_data):
    data, x = plain_data
    mech = PiecewiseMechanism(epsilon=EPS, lower=L, upper=U)
    v = pm_var(x, EPS)
    exact = HALF**2 * v.sum() / N**2
    plugin = HALF**2 * (v.mean() + x.var()) / N
    ests = simulate(mech, data, R, SEED + 2)
    check_simulation(ests, "mean", data["value"].mean(), exact, plugin)


@pytest.fixture(scope="module")
def md_data():
    return dataset(N_MD, SEED + 10, missing=0.25, nan_share=0.05)


def test_bisample_md_missing_rate_sum_and_mean(md_data):
    data, x = md_data
    mech = BiSampleMD(epsilon=EPS, lower=L, upper=U)
    miss = np.isnan(x)
    assert 0.25 < miss.mean() < 0.35
    P = mech.output_probabilities(x)
    f_pos, f_neg, psi_pos, psi_neg = bisample_influence(P)
    k, p = k_of(EPS), mech.p
    ests = simulate(mech, data, R, SEED + 3)
    # Eq. 18: missing rate
    check_simulation(ests, "missing_rate", miss.mean(),
                     *linear_variances(P, -(psi_pos + psi_neg) / k))
    check_simulation(ests, "answering_count", float((~miss).sum()),
                     *[N_MD**2 * v for v in linear_variances(P, -(psi_pos + psi_neg) / k)])
    # the sum of the answering users' values in [L, U]:
    # (U-L)/2 s* + (U+L)/2 n (1 - f*) = n/k [U f_POS + L f_NEG + (U+L)(p-1)]
    check_simulation(ests, "sum", float(np.nansum(data["value"][~miss])),
                     *linear_variances(P, N_MD / k * (U * psi_pos + L * psi_neg)))
    # Eq. 20: the answering users' mean, a ratio estimator (O(1/n) bias, second order below)
    D, Nm = f_pos + f_neg + 2 * p - 2, f_pos - f_neg
    gp, gn = (D - Nm) / D**2, (-D - Nm) / D**2
    gpp, gnn, gpn = -2 * (D - Nm) / D**3, 2 * (D + Nm) / D**3, 2 * Nm / D**3
    Cpp, Cnn, Cpn = (exact_cov(P, psi_pos, psi_pos), exact_cov(P, psi_neg, psi_neg),
                     exact_cov(P, psi_pos, psi_neg))
    bias = HALF * 0.5 * (gpp * Cpp + 2 * gpn * Cpn + gnn * Cnn)
    check_simulation(ests, "mean", float(np.mean(data["value"][~miss])),
                     *linear_variances(P, HALF * (gp * psi_pos + gn * psi_neg)), bias=bias)


def test_bisample_md_missing_values_are_nan_or_preference():
    """A null value and eps_u < eps are the same missing report; the fixed ``preference``
    parameter makes every user missing (eps > preference) or none (eps <= preference)."""
    n = 40000
    mech = BiSampleMD(epsilon=EPS, lower=L, upper=U)
    nan_reports = mech.perturb(np.full(n, np.nan), rng=SEED)
    pref_reports = mech.perturb({"value": np.full(n, U), "preference": np.full(n, 0.5)},
                                rng=SEED)
    for f in ("s", "b"):  # same noise, same missing encoding -> identical reports
        np.testing.assert_array_equal(nan_reports[f], pref_reports[f])
    fixed = BiSampleMD(epsilon=EPS, lower=L, upper=U, preference=0.5)
    np.testing.assert_array_equal(fixed.perturb(np.full(n, U), rng=SEED)["b"], nan_reports["b"])
    answering = BiSampleMD(epsilon=EPS, lower=L, upper=U, preference=EPS)  # eps_u = eps answers
    e = estimator_for(answering).estimate(answering.perturb(np.full(n, U), rng=SEED))
    # all answer with x = 1: missing rate 0 within 4 exact standard errors
    P = answering.output_probabilities(np.ones(n))
    _, _, pp, pn = bisample_influence(P)
    exact, _ = linear_variances(P, -(pp + pn) / k_of(EPS))
    assert abs(e["missing_rate"].value) <= 4 * math.sqrt(exact)


def test_bisample_md_mean_undefined_when_nobody_answers():
    mech = BiSampleMD(epsilon=EPS, **UNIT)
    est = estimator_for(mech)
    acc = np.array([50, 0, 50, 0], dtype=np.int64)  # every b = 0: f_POS = f_NEG = 0
    e = est.finalize(acc)
    assert e["mean"].value is None and "undefined" in e["mean"].note
    k = k_of(EPS)
    assert e["missing_rate"].value == pytest.approx(1 / k)  # raw: outside [0, 1], unbiased form
    assert e["missing_rate"].clipped == 1.0


def test_privkvm_missing_rate(md_data):
    data, x = md_data
    mech = PrivKVM(epsilon=EPS, lower=L, upper=U)
    miss = np.isnan(x)
    P = mech.output_probabilities(x)
    psi = np.array([0.0, -1.0, -1.0]) / (2 * mech.p1 - 1)
    ests = simulate(mech, data, R, SEED + 4)
    check_simulation(ests, "missing_rate", miss.mean(), *linear_variances(P, psi))


def privkvm_limit_mean(mech, pi: np.ndarray) -> float:
    """The fixed point of the virtual iterations, S / (N - n_fake), as a function of the report
    frequencies pi = (<0>, <1,-1>, <1,+1>), normalized scale, no clipping."""
    p1, p2 = mech.p1, mech.p2
    S = (pi[2] - pi[1]) / (2 * p2 - 1)
    fk = (pi[1] + pi[2] + p1 - 1) / (2 * p1 - 1)
    return S / (pi[1] + pi[2] - (1 - fk) * (1 - p1))


def test_privkvm_mean_converges_to_the_ratio_estimator(md_data):
    """Many virtual iterations reach S / (N - n_fake), a consistent estimator of the answering
    users' mean; checked within 4 delta-method standard errors on one large sample."""
    data, x = md_data
    miss = np.isnan(x)
    reps = 100
    mech = PrivKVM(epsilon=2.0, lower=L, upper=U, virtual_iterations=1000)
    tiled = {k: np.tile(v, reps) for k, v in data.items()}
    est = estimator_for(mech)
    acc = est.add(est.create(), mech.perturb(tiled, rng=SEED + 5))
    e = est.finalize(acc)
    n = acc.sum()
    # the iteration's fixed point, from the accumulator
    assert e["mean"].value == pytest.approx(MID + HALF * privkvm_limit_mean(mech, acc / n),
                                            rel=1e-9)
    # at the expected frequencies the fixed point is the answering users' mean exactly
    P = mech.output_probabilities(np.tile(x, reps))
    pi = mech.output_probabilities(x).mean(axis=0)
    assert privkvm_limit_mean(mech, pi) == pytest.approx(np.mean(x[~miss]), rel=1e-10)
    # delta method: gradient of the (smooth, rational) fixed point by central differences
    h = 1e-6
    grad = np.array([(privkvm_limit_mean(mech, pi + h * d) - privkvm_limit_mean(mech, pi - h * d))
                     / (2 * h) for d in np.eye(3)])
    exact, _ = linear_variances(P, HALF * grad)
    truth = float(np.mean(data["value"][~miss]))
    assert abs(e["mean"].value - truth) <= 4 * math.sqrt(exact), \
        f"{e['mean'].value} vs {truth} (sd {math.sqrt(exact):.4f})"
    # with no virtual round the fakes' zero values pull the mean towards the midpoint
    e0 = estimator_for(PrivKVM(epsilon=2.0, lower=L, upper=U, virtual_iterations=0)).finalize(acc)
    assert abs(e0["mean"].value - MID) < abs(e["mean"].value - MID)


# --------------------------------------------------------------------------- TOP / RND
@pytest.mark.parametrize("fake", ["top", "rnd"])
@pytest.mark.parametrize("cls", [Harmony, BiSample, PiecewiseMechanism])
def test_fake_answers_when_nobody_answers(cls, fake):
    """All users have eps_u < eps: TOP estimates the upper bound, RND the midpoint."""
    n = 100000
    mech = cls(epsilon=EPS, lower=L, upper=U, fake=fake)
    g = np.random.default_rng(SEED)
    data = {"value": g.uniform(L, U, n), "preference": g.uniform(0.01, EPS * 0.99, n)}
    e = estimator_for(mech).estimate(mech.perturb(data, rng=SEED))
    xf = 1.0 if fake == "top" else 0.0  # per-user output distribution: x = 1, or the RND mixture
    target = U if fake == "top" else MID
    if cls is PiecewiseMechanism:
        var = HALF**2 * (pm_var(1.0, EPS) if fake == "top"
                         else np.mean(pm_var(np.linspace(-1, 1, 20001), EPS)) + 1 / 3) / n
    else:
        P = mech.output_probabilities(np.full(n, xf))
        if cls is Harmony:
            psi = HALF / k_of(EPS) * np.array([-1.0, 1.0])
        else:
            _, _, pp, pn = bisample_influence(P)
            psi = HALF / k_of(EPS) * (pp - pn)
        var, _ = linear_variances(P, psi)
    assert abs(e["mean"].value - target) <= 4 * math.sqrt(var), \
        f"{fake}: {e['mean'].value} vs {target} (sd {math.sqrt(var):.4f})"
    # the true answers would give the data mean; the fake is far from it in TOP mode
    if fake == "top":
        assert abs(e["mean"].value - data["value"].mean()) > 10 * math.sqrt(var)
    # the fixed preference parameter has the same effect
    fixed = cls(epsilon=EPS, lower=L, upper=U, fake=fake, preference=EPS / 2)
    e2 = estimator_for(fixed).estimate(fixed.perturb(data["value"], rng=SEED + 1))
    assert abs(e2["mean"].value - target) <= 4 * math.sqrt(var)


# --------------------------------------------------------------------------- bad input
ALL_MECHS = {
    "bisample": lambda **kw: BiSample(epsilon=EPS, lower=L, upper=U, **kw),
    "bisample-md": lambda **kw: BiSampleMD(epsilon=EPS, lower=L, upper=U, **kw),
    "harmony": lambda **kw: Harmony(epsilon=EPS, lower=L, upper=U, **kw),
    "pm": lambda **kw: PiecewiseMechanism(epsilon=EPS, lower=L, upper=U, **kw),
    "privkvm": lambda **kw: PrivKVM(epsilon=EPS, lower=L, upper=U, **kw),
}


def _expect_invalid(mech, data, bad_rows, fragment):
    with pytest.raises(InvalidRecordsError) as ei:
        mech.perturb(data, rng=SEED)
    assert sorted(ei.value.reasons) == sorted(bad_rows), ei.value.reasons
    for i in bad_rows:
        assert fragment in ei.value.reasons[i], ei.value.reasons[i]
    assert f"{len(bad_rows)} of " in str(ei.value) and f"row {bad_rows[0]}" in str(ei.value)
    _, reasons = mech.check(data)
    assert np.flatnonzero(reasons.bad).tolist() == sorted(bad_rows)
    arr = reasons.array()
    assert all(arr[i] is None for i in range(len(arr)) if i not in bad_rows)
    assert all(fragment in arr[i] for i in bad_rows)


@pytest.mark.parametrize("name", list(ALL_MECHS))
def test_values_outside_the_domain(name):
    mech = ALL_MECHS[name]()
    v = np.array([L, U, L - 1e-9, 50.0, U + 1, np.inf, -np.inf, MID])
    _expect_invalid(mech, v, [2, 4, 5, 6], "outside")
    with pytest.raises(InvalidRecordsError) as ei:
        mech.perturb(v, rng=SEED)
    assert "81.0" in ei.value.reasons[4] and "inf" in ei.value.reasons[5]


@pytest.mark.parametrize("name", list(ALL_MECHS))
def test_nan_without_allow_missing(name):
    mech = ALL_MECHS[name](allow_missing=False)
    v = np.array([30.0, np.nan, 40.0, np.nan])
    _expect_invalid(mech, v, [1, 3], "allow_missing=False")
    obj = np.array([30.0, None, 40.0], dtype=object)  # a null in an object column
    _expect_invalid(mech, obj, [1], "allow_missing=False")


@pytest.mark.parametrize("name", ["bisample-md", "privkvm"])
def test_nan_with_allow_missing_is_a_missing_report(name):
    mech = ALL_MECHS[name]()
    assert mech.allow_missing
    r = mech.perturb(np.array([30.0, np.nan, None], dtype=object), rng=SEED)
    assert all(len(v) == 3 for v in r.values())


@pytest.mark.parametrize("name", list(ALL_MECHS))
def test_non_numeric_and_boolean_values(name):
    mech = ALL_MECHS[name]()
    v = np.array([30.0, "abc", "45.5", True, np.False_, "", 50], dtype=object)
    with pytest.raises(InvalidRecordsError) as ei:
        mech.perturb(v, rng=SEED)
    reasons = ei.value.reasons
    # "45.5" parses; booleans are not numbers; "" is a missing value (an empty CSV cell), so it
    # is invalid only where missing values are not allowed
    assert sorted(reasons) == [1, 3, 4] + ([] if mech.allow_missing else [5])
    assert "non-numeric" in reasons[1] and "'abc'" in reasons[1]
    assert "non-numeric" in reasons[3] and "True" in reasons[3]
    if not mech.allow_missing:
        assert "missing" in reasons[5] and "allow_missing=False" in reasons[5]
    # an all-boolean column is rejected too
    _expect_invalid(mech, np.array([True, False]), [0, 1], "non-numeric")
    # the valid rows alone perturb fine
    assert len(mech.perturb(np.array([30.0, "45.5", 50], dtype=object), rng=SEED)
               [mech.report_fields[0][0]]) == 3


@pytest.mark.parametrize("name", list(ALL_MECHS))
def test_bad_preference_column(name):
    """Preferences are epsilons in [0, inf]: negative, NaN and non-numeric ones are bad records."""
    mech = ALL_MECHS[name]()
    data = {"value": np.full(8, MID),
            "preference": np.array([1.0, 0.0, -2.0, np.nan, np.inf, 0.5, "x", -np.inf],
                                   dtype=object)}
    with pytest.raises(InvalidRecordsError) as ei:
        mech.perturb(data, rng=SEED)
    reasons = ei.value.reasons
    assert sorted(reasons) == [2, 3, 6, 7]
    for i in (2, 3, 7):
        assert "preference" in reasons[i] and "[0, inf]" in reasons[i]
    assert "-2.0" in reasons[2] and "nan" in reasons[3]
    assert "non-numeric" in reasons[6] and "'x'" in reasons[6]
    _, r = mech.check({"value": np.full(3, MID), "preference": np.array([-1e-300, 0.0, 3.0])})
    assert np.flatnonzero(r.bad).tolist() == [0]


@pytest.mark.parametrize("name", ["bisample-md", "privkvm"])
def test_preference_zero_never_answers_inf_always(name):
    """eps_u = 0 never answers and eps_u = inf always does: exactly as a null value and as the
    true value (same seed, same noise)."""
    mech = ALL_MECHS[name]()
    n = 500
    v = np.random.default_rng(SEED).uniform(L, U, n)
    zero = mech.perturb({"value": v, "preference": np.zeros(n)}, rng=SEED)
    null = mech.perturb(np.full(n, np.nan), rng=SEED)
    inf = mech.perturb({"value": v, "preference": np.full(n, np.inf)}, rng=SEED)
    plain = mech.perturb(v, rng=SEED)
    for f, _ in mech.report_fields:
        np.testing.assert_array_equal(zero[f], null[f])
        np.testing.assert_array_equal(inf[f], plain[f])


# --------------------------------------------------------------------------- malformed reports
def _bad_rows(est, reports, n=None):
    reasons = est.check_reports(reports, n)
    return np.flatnonzero(reasons.bad).tolist(), reasons.as_dict()


def test_check_reports_bisample():
    for mech in (BiSample(epsilon=EPS, **UNIT), BiSampleMD(epsilon=EPS, **UNIT)):
        est = estimator_for(mech)
        rep = {"s": np.array([0, 1, 2, 1, 0, 1]), "b": np.array([1, 0, 1, -1, 0, 1])}
        rows, reasons = _bad_rows(est, rep)
        assert rows == [2, 3]
        assert "'s'" in reasons[2] and "2" in reasons[2]
        assert "'b'" in reasons[3] and "-1" in reasons[3]
        rows, reasons = _bad_rows(est, {"s": np.array([0, 1])})
        assert rows == [0, 1] and "'b' is missing" in reasons[0]
        rows, reasons = _bad_rows(est, {}, n=3)
        assert rows == [0, 1, 2]
        rows, _ = _bad_rows(est, {"s": np.array(["1", "x", None], dtype=object),
                                  "b": np.array([0.0, 1.0, 0.5])})
        assert rows == [1, 2]
        # well-formed wire reports pass
        good = mech.perturb(np.linspace(-1, 1, 50), rng=SEED)
        assert _bad_rows(est, good)[0] == []
        # adding malformed codes without checking is refused, not miscounted
        with pytest.raises(ValueError, match="check_reports"):
            est.add(est.create(), {"s": np.array([2]), "b": np.array([1])})


def test_check_reports_harmony_pm_privkvm():
    est = estimator_for(Harmony(epsilon=EPS, **UNIT))
    rows, _ = _bad_rows(est, {"y": np.array([1, -1, 0, 2, 1])})
    assert rows == [2, 3]
    pm = PiecewiseMechanism(epsilon=EPS, **UNIT)
    est = estimator_for(pm)
    C = pm.C
    rows, reasons = _bad_rows(est, {"y": np.array([0.0, C, -C, C * (1 + 1e-9), -C - 1, np.nan,
                                                   np.inf])})
    assert rows == [3, 4, 5, 6] and "'y'" in reasons[3]
    rows, reasons = _bad_rows(est, {"z": np.array([0.0])})
    assert rows == [0] and "'y' is missing" in reasons[0]
    est = estimator_for(PrivKVM(epsilon=EPS, **UNIT))
    rows, _ = _bad_rows(est, {"k": np.array([0, 1, 1, 2, 1]), "v": np.array([0, 1, -1, 1, 3])})
    assert rows == [3, 4]


def test_check_reports_privkvm_inconsistent_key_value():
    """The wire form says v is +-1 when k = 1 and 0 when k = 0; anything else is malformed (a
    report <1, 0> would otherwise be counted as <1, -1>)."""
    est = estimator_for(PrivKVM(epsilon=EPS, **UNIT))
    rows, reasons = _bad_rows(est, {"k": np.array([1, 0, 1, 0]), "v": np.array([0, 1, 1, 0])})
    assert rows == [0, 1], reasons


@pytest.mark.parametrize("name", list(ALL_MECHS))
def test_finalize_empty_accumulator(name):
    est = estimator_for(ALL_MECHS[name]())
    with pytest.raises(EmptyAccumulatorError, match="no reports"):
        est.finalize(est.create())
    with pytest.raises(EmptyAccumulatorError):
        est.finalize(est.merge([]))
    with pytest.raises(EmptyAccumulatorError):
        est.estimate(ALL_MECHS[name]().empty_reports())


@pytest.mark.parametrize("mech", [BiSample(epsilon=EPS, **UNIT), BiSampleMD(epsilon=EPS, **UNIT)])
def test_bisample_needs_both_directions(mech):
    est = estimator_for(mech)
    for s in (0, 1):
        rep = {"s": np.full(100, s, np.uint8), "b": np.tile(np.array([0, 1], np.uint8), 50)}
        with pytest.raises(EmptyAccumulatorError, match="both sampling directions"):
            est.estimate(rep)


def test_privkvm_all_keys_zero():
    """No key-1 report: the missing rate is still estimable, the mean is released as undefined."""
    mech = PrivKVM(epsilon=EPS, **UNIT)
    e = estimator_for(mech).estimate({"k": np.zeros(10, np.uint8), "v": np.zeros(10, np.int8)})
    f1 = 1 / 12  # Agresti-Coull share of key-1 reports: (0 + 1)/(10 + 2)
    assert e["missing_rate"].value == pytest.approx(1 - (mech.p1 - 1) / (2 * mech.p1 - 1))
    assert e["missing_rate"].stderr == pytest.approx(math.sqrt(f1 * (1 - f1) / 10)
                                                     / (2 * mech.p1 - 1))
    assert e["mean"].value is None and "key 1" in e["mean"].note
