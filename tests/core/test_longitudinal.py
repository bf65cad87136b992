"""Longitudinal telemetry (ldp_beam.longitudinal): memoized randomization, L-GRR, and the
collector's per-unit accounting. Statistical checks use chi-square tests at level ALPHA (a
correct implementation fails one with probability ALPHA; inputs are seeded, so a run is
deterministic) or z-scores against the theoretical standard error."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from ldp_beam.bounding import bound_candidates, fold_candidates
from ldp_beam.errors import InvalidRecordsError, ParameterError
from ldp_beam.longitudinal import (Memoized, TwoLayerGRR, UnitState, UnitStateError, priority,
                                   unit_hash, unit_loss, unit_text)
from ldp_beam.registry import build_mechanism

ALPHA = 1e-4
DOMAIN = ("a", "b", "c", "d")
SECRET = bytes(range(32))


@pytest.fixture(scope="module")
def grr():
    return build_mechanism("grr", epsilon=1.0, domain=list(DOMAIN))


def chi2_p(observed, expected):
    observed, expected = np.asarray(observed, float), np.asarray(expected, float)
    keep = expected > 0
    assert observed[~keep].sum() == 0
    return stats.chisquare(observed[keep], expected[keep]).pvalue


# --------------------------------------------------------------------------- memoization
def test_same_unit_and_value_always_send_the_same_report(grr):
    m = Memoized(grr, SECRET)
    units = [f"dev{i}" for i in range(300)]
    values = [DOMAIN[i % 4] for i in range(300)]
    first = m.perturb(values, units)["v"]
    # again, in another order and batch split, and from another instance with the same secret
    order = np.random.default_rng(0).permutation(300)
    again = Memoized(grr, SECRET).perturb([values[i] for i in order], [units[i] for i in order])
    assert np.array_equal(again["v"], first[order])
    halves = np.concatenate([m.perturb(values[:100], units[:100])["v"],
                             m.perturb(values[100:], units[100:])["v"]])
    assert np.array_equal(halves, first)
    # repeats within one call share one report
    rep = m.perturb(["b"] * 50, ["dev7"] * 50)["v"]
    assert len(set(rep.tolist())) == 1
    # integer ids and their decimal text are the same unit
    assert m.perturb(["c"], [17])["v"][0] == m.perturb(["c"], ["17"])["v"][0]


def test_other_secrets_and_other_mechanisms_draw_independently(grr):
    units = [f"dev{i}" for i in range(2000)]
    values = ["a"] * 2000
    a = Memoized(grr, SECRET).perturb(values, units)["v"]
    b = Memoized(grr, b"another secret of 32 bytes......").perturb(values, units)["v"]
    other = build_mechanism("grr", epsilon=1.0000001, domain=list(DOMAIN))
    c = Memoized(other, SECRET).perturb(values, units)["v"]
    p_keep = math.e / (math.e + 3)
    same = p_keep ** 2 + 3 * ((1 - p_keep) / 3) ** 2  # P(two independent reports agree)
    for x in (b, c):
        agree = int((a == x).sum())
        z = (agree - 2000 * same) / math.sqrt(2000 * same * (1 - same))
        assert abs(z) < 4.5, z


def test_memoized_reports_follow_the_mechanism_and_units_are_independent(grr):
    """Over many units, the report of each true value is distributed as the GRR column, and the
    reports of two units with the same value are independent (their joint table is the product
    of the marginals)."""
    m = Memoized(grr, SECRET)
    q = grr.transition_matrix()  # Q[output, input]
    n = 4000
    p_values = []
    for j, v in enumerate(DOMAIN):
        rep = m.perturb([v] * n, [f"u{j}-{i}" for i in range(n)])["v"]
        p_values.append(chi2_p(np.bincount(rep, minlength=4), n * q[:, j]))
        pairs = rep[0::2] * 4 + rep[1::2]
        p_values.append(chi2_p(np.bincount(pairs, minlength=16),
                               (n // 2) * np.outer(q[:, j], q[:, j]).ravel()))
    assert min(p_values) > ALPHA / len(p_values), p_values  # Bonferroni over the tests


def test_memoization_keeps_any_mechanisms_distribution():
    """A two-field mechanism (BiSample-MD): memoized reports of one value over many units against
    fresh reports of the same value (two-sample chi-square)."""
    mech = build_mechanism("bisample-md", epsilon=2.0, lower=0, upper=100)
    n = 4000
    memo = Memoized(mech, SECRET).perturb(np.full(n, 30.0), [f"u{i}" for i in range(n)])
    fresh = mech.perturb(np.full(n, 30.0), rng=5)
    table = np.array([np.bincount(r["s"].astype(int) * 2 + r["b"], minlength=4)
                      for r in (memo, fresh)])
    table = table[:, table.sum(axis=0) > 0]
    assert stats.chi2_contingency(table)[1] > ALPHA


def test_memo_ids_name_the_slot_and_hide_the_value(grr):
    m = Memoized(grr, SECRET)
    ids = m.memo_ids(["a", "a", "b", "a"], ["u1", "u1", "u1", "u2"])
    assert ids[0] == ids[1] and len({ids[0], ids[2], ids[3]}) == 3
    assert all(i.startswith("m") and len(i) == 33 for i in ids)  # "m" + 16 bytes of digest
    assert not any(v in i for i in ids for v in ("u1", "u2"))
    assert Memoized(grr, b"x" * 32).memo_ids(["a"], ["u1"])[0] != ids[0]  # keyed
    assert "secret" not in repr(m) and SECRET.hex() not in repr(m)


def test_loss_is_epsilon_times_distinct_values(grr):
    m = Memoized(grr, SECRET)
    loss = m.loss(["a", "a", "b", "a", "c", "d", "d"], ["u1", "u1", "u1", "u1", "u2", 3, "3"])
    assert loss == {"u1": 2.0, "u2": 1.0, "3": 1.0}
    assert unit_loss(["x"] * 10, ["v"] * 10, 0.5) == {"x": 0.5}
    assert unit_loss([], [], 1.0) == {}
    assert "distinct values" in m.guarantee.notes and "change of report reveals" in \
        m.guarantee.notes and m.guarantee.params["memoized"] is True


def test_memoized_refuses_what_it_cannot_memoize(grr):
    with pytest.raises(ParameterError, match="device_secret"):
        Memoized(grr, b"short")
    with pytest.raises(ParameterError, match="LDP mechanism"):
        Memoized(build_mechanism("laplace-histogram", epsilon=1.0, bins=4, lower=0, upper=1),
                 SECRET)
    with pytest.raises(InvalidRecordsError):
        Memoized(grr, SECRET).perturb(["zz"], ["u"])
    with pytest.raises(ParameterError, match="one privacy-unit id per value"):
        Memoized(grr, SECRET).perturb(["a", "b"], ["u"])
    for bad in (None, True, 1.5, [1], ""):
        with pytest.raises(ValueError):
            unit_text(bad)
    assert unit_text(7.0) == unit_text(7) == "7"


# --------------------------------------------------------------------------- L-GRR
def test_two_layer_grr_composes_to_grr_with_eps_1():
    for eps_perm, eps_1, k in ((4.0, 1.0, 4), (2.0, 0.5, 10), (1.0, 0.999, 2)):
        s = TwoLayerGRR(eps_perm, eps_1, tuple(f"x{i}" for i in range(k)))
        assert 1 / k < s.irr_keep < 1
        assert np.allclose(s.composed_matrix(), s.channel.transition_matrix(), atol=1e-12)
        q = s.composed_matrix()
        ratio = q.max(axis=1) / q.min(axis=1)
        assert np.allclose(ratio, math.exp(eps_1))  # one report: eps_1-LDP, tight
        assert s.guarantee.epsilon == eps_1 and s.guarantee.params["eps_perm"] == eps_perm
    with pytest.raises(ParameterError, match="eps_1"):
        TwoLayerGRR(1.0, 1.0, DOMAIN)
    with pytest.raises(ParameterError, match="eps_1"):
        TwoLayerGRR(1.0, 0.0, DOMAIN)


def test_two_layer_reports_estimate_the_frequencies():
    s = TwoLayerGRR(3.0, 1.0, DOMAIN)
    client = s.client(SECRET)
    n = 20000
    rng = np.random.default_rng(3)
    truth = np.array([0.4, 0.3, 0.2, 0.1])
    values = [DOMAIN[i] for i in rng.choice(4, n, p=truth)]
    units = [f"u{i}" for i in range(n)]
    rep = client.perturb(values, units, rng=11)
    # the permanent layer is memoized: the same (unit, value) keeps its permanent report
    perm = client.permanent.perturb(values[:50], units[:50])["v"]
    assert np.array_equal(perm, client.permanent.perturb(values[:50], units[:50])["v"])
    # each report is one draw of GRR(eps_1): the estimator of that channel is unbiased
    est = s.estimator().estimate(rep)
    f = est.statistics["frequency"]
    emp = np.bincount([DOMAIN.index(v) for v in values], minlength=4) / n
    z = (np.asarray(f.value) - emp) / np.asarray(f.stderr)
    assert np.all(np.abs(z) < 4), z
    # the loss: eps_perm per distinct value, whatever the number of reports
    assert s.loss(["a", "a", "b"], ["u", "u", "u"]) == {"u": 6.0}


# --------------------------------------------------------------------------- the collector
def cands(names, memo=None, digest=None):
    """Candidates as the stream makes them: a keyed priority and slot id from each record's
    identity (here a name), its memo slot and report digest, and its row."""
    return [(*priority(b"k" * 32, s), memo, digest, (s,)) for s in names]


def _smallest(cands, k):
    """The rule, written out: one candidate per slot, the k of smallest (priority, slot)."""
    return sorted({c[1]: c for c in cands}.values(), key=lambda c: (c[0], c[1]))[:k]


@pytest.mark.parametrize("k", [1, 3])
def test_the_streams_per_unit_choice_is_the_k_smallest_whatever_the_split(k):
    """The stream folds a window's candidates batch by batch and merges accumulators in any
    order (Beam's CombineFn); with the batch's algorithm underneath, every split keeps the k
    of smallest (priority, slot) of each unit, a record read twice counting once."""
    rng = np.random.default_rng(7)
    names = [f"u{i}" for i in range(40)] + [unit_hash(b"k" * 32, i) for i in range(40)]
    rows = [(u, c) for u in names for c in cands([f"{u}/{j}" for j in range(rng.integers(1, 9))])]
    rows += [rows[i] for i in rng.integers(0, len(rows), 60)]  # duplicates of some records
    expect = {u: _smallest([c for v, c in rows if v == u], k) for u in names}
    counts = {u: sum(v == u for v, _ in rows) for u in names}
    for _ in range(5):
        rng.shuffle(rows)
        cuts = np.sort(rng.integers(0, len(rows), 6))
        parts = []
        for chunk in np.split(np.arange(len(rows)), cuts):
            per: dict = {}
            for i in chunk.tolist():
                u, c = rows[i]
                e = per.setdefault(u, [0, []])
                e[0] += 1
                e[1].append(c)
            bound_candidates(per, per, k)
            parts.append(per)
        out: dict = {}
        for per in parts[::-1]:
            fold_candidates(out, {u: tuple(e) for u, e in per.items()}, k)
        assert {u: e[1] for u, e in out.items()} == expect
        assert {u: e[0] for u, e in out.items()} == counts


def test_equal_priorities_are_ordered_by_slot():
    low, high = "0" * 16 + "0" * 15 + "1", "0" * 16 + "f" * 16
    per = {"u": [3, [(5, high, None, None, ("b",)), (5, low, None, None, ("a",)),
                     (9, "0" * 32, None, None, ("c",))]]}
    bound_candidates(per, ["u"], 1)
    assert per["u"][1] == [(5, low, None, None, ("a",))]


@pytest.fixture
def state(tmp_path):
    return UnitState(str(tmp_path / "units.sqlite"), "device")


def test_k_reports_per_unit_per_window_and_the_rest_bounded_out(state):
    c = {"u1": (50, cands([f"r{i}" for i in range(50)])), "u2": (2, cands(["x", "y"]))}
    a = state.admit(0, "run", c, k=1, epsilon=1.0)
    assert (a.reports, a.estimated, a.bounded_out, a.over_budget) == (52, 2, 50, 0)
    assert len(a.selected["u1"]) == 1 and a.selected["u1"][0] == min(c["u1"][1])
    b = state.admit(10, "run", c, k=3, epsilon=1.0)
    assert (b.estimated, b.bounded_out) == (5, 47)
    assert sorted(b.selected["u1"]) == sorted(c["u1"][1])[:3]
    assert state.spent() == {"u1": 4.0, "u2": 3.0}


def test_selection_is_uniform_among_a_units_reports():
    """The keyed priorities make the selected report uniform among a unit's reports."""
    key = os.urandom(32)
    counts = np.zeros(5)
    for u in range(5000):
        prio = [priority(key, f"f.jsonl\n{u}\n{j}")[0] for j in range(5)]
        counts[int(np.argmin(prio))] += 1
    assert chi2_p(counts, np.full(5, 1000.0)) > ALPHA


def test_a_unit_past_its_cap_is_dropped_and_counted(state):
    out = []
    for w in range(4):
        out.append(state.admit(w, "run", {"u": (1, cands([f"w{w}"]))}, k=1, epsilon=1.0,
                               cap=2.5))
    assert [a.estimated for a in out] == [1, 1, 0, 0]
    assert [a.over_budget for a in out] == [0, 0, 1, 1] and out[3].units_over_budget == 1
    assert state.spent() == {"u": 2.0}
    # k x eps summed in floating point still fits a cap of exactly that
    s = [state.admit(100 + w, "run", {"v": (1, cands([f"v{w}"]))}, k=1, epsilon=0.1, cap=0.3)
         for w in range(4)]
    assert [a.estimated for a in s] == [1, 1, 1, 0]


def test_memoized_repeats_cost_nothing_and_a_changed_report_is_charged(state):
    eps = 1.0
    for w in range(5):  # the same memo slot and the same report every window
        a = state.admit(w, "run", {"u": (1, cands([f"w{w}"], memo="m1", digest="d1"))}, k=1,
                        epsilon=eps, cap=1.5)
        assert a.estimated == 1 and a.over_budget == 0
    assert state.spent() == {"u": eps} and a.memo_repeats == 1
    # the same memo id with another report cannot be a copy: charged (here: past the cap)
    a = state.admit(9, "run", {"u": (1, cands(["w9"], memo="m1", digest="other"))}, k=1,
                    epsilon=eps, cap=1.5)
    assert a.memo_mismatch == 1 and a.over_budget == 1 and a.estimated == 0
    # a new value (another memo slot) costs epsilon; reports without a memo always do
    a = state.admit(10, "run", {"v": (2, cands(["a"], memo="m2", digest="d") + cands(["b"]))},
                    k=2, epsilon=eps)
    assert a.charged == 2 * eps and a.memo_repeats == 0


def test_admission_is_idempotent_and_a_window_keeps_its_k(state):
    c = {"u": (3, cands(["a", "b", "c"]))}
    first = state.admit(5, "run1", c, k=1, epsilon=1.0)
    again = state.admit(5, "run1", c, k=1, epsilon=1.0)  # a re-executed pane
    assert first.selected == again.selected and again.charged == 0 and state.spent()["u"] == 1
    # another run reads other reports of the unit for the same window: its slot is used
    chosen = first.selected["u"][0][4][0]
    others = {"u": (2, cands([s for s in ("a", "b", "c") if s != chosen]))}
    later = state.admit(5, "run2", others, k=1, epsilon=1.0)
    assert later.estimated == 0 and later.bounded_out == 2 and state.spent()["u"] == 1
    # duplicates of one record (same slot) are one candidate
    dup = state.admit(6, "run", {"w": (3, cands(["z", "z", "z"]))}, k=3, epsilon=1.0)
    assert dup.estimated == 1 and dup.bounded_out == 2


def test_group_charging_for_a_release_calibrated_to_several_rows(state):
    a = state.admit(0, "run", {"u": (3, cands(["a", "b", "c"]))}, k=3, epsilon=1.0, group=2)
    assert a.estimated == 3 and a.charged == 2.0  # ceil(3 / 2) x epsilon


def test_state_survives_a_restart_and_holds_no_raw_ids(tmp_path):
    path = str(tmp_path / "units.sqlite")
    s = UnitState(path, "device")
    key = s.key("unit")
    raw = ["alice@example.org", "device-0042"]
    hashed = {unit_hash(key, r): (1, cands([r + "-slot"])) for r in raw}
    s.admit(0, "run", hashed, k=1, epsilon=0.5)
    s.close()
    again = UnitState(path, "device")
    assert again.key("unit") == key and again.spent() == {h: 0.5 for h in hashed}
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    blob = b"".join(open(f, "rb").read() for f in tmp_path.iterdir())
    assert not any(r.encode() in blob for r in raw)
    with pytest.raises(UnitStateError, match="tracks privacy unit 'device'"):
        UnitState(path, "user")
    with pytest.raises(UnitStateError, match="another key"):
        UnitState(path, "device", seed_secret=b"s" * 32)


def test_the_core_does_not_import_beam():
    code = "import sys, ldp_beam.longitudinal; print('apache_beam' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
