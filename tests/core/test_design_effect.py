"""Standard errors with up to k reports per privacy unit (issue 14): ``with_design_effect(k)``
widens them by sqrt(k), which must cover the variance (over the draw of the units) when a unit's k
reports come from rows with the same value (the worst case for positive correlation), where the
naive standard error does not.
"""
from __future__ import annotations

import numpy as np
from scipy.stats import chi2

from ldp_beam import build_mechanism, estimator_for


def test_design_effect_covers_correlated_reports_and_naive_does_not():
    mech = build_mechanism("grr", epsilon=3.0, domain=["a", "b", "c"])
    est = estimator_for(mech)
    g = np.random.default_rng(2024)
    units, k, reps = 400, 4, 400
    values, naive, wide = [], [], []
    for _ in range(reps):
        # units drawn from the population; each reports its one value k times, fresh noise each
        # time: a unit's reports share its value, so they are positively correlated
        unit_value = g.choice(["a", "b", "c"], units, p=[0.6, 0.3, 0.1])
        rows = np.repeat(unit_value, k)
        e = est.estimate(mech.perturb(rows, rng=g))
        name = next(n for n, s in e.statistics.items() if s.stderr is not None)
        stat = e[name]
        values.append(np.asarray(stat.value, dtype=float)[0])
        naive.append(np.asarray(stat.stderr, dtype=float)[0])
        wide.append(np.asarray(e.with_design_effect(k, "test")[name].stderr, dtype=float)[0])
    emp_var = np.var(values, ddof=1)
    # the empirical variance over `reps` replications is within its chi-square interval
    lo = emp_var * (reps - 1) / chi2.ppf(0.999, reps - 1)
    hi = emp_var * (reps - 1) / chi2.ppf(0.001, reps - 1)
    assert np.mean(np.square(wide)) >= lo  # the widened SE covers the true variance
    assert np.mean(np.square(naive)) < lo  # the naive one understates it here
    assert np.allclose(np.asarray(wide) / np.asarray(naive), np.sqrt(k))


def test_design_effect_of_one_changes_nothing():
    mech = build_mechanism("grr", epsilon=1.0, domain=["a", "b"])
    e = estimator_for(mech).estimate(mech.perturb(np.array(["a", "b"] * 50)))
    assert e.with_design_effect(1, "x") is e
