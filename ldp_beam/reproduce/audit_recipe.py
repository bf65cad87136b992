"""``ldp-beam audit``: privacy audits of every registered built-in mechanism.

For each LDP mechanism two numbers are set beside the claimed epsilon:

* ``exact_epsilon``: the worst-case probability ratio computed from the mechanism's own
  definition: exactly from its transition matrix (discrete outputs; numeric mechanisms over a
  grid of inputs that contains the extremes and the null value), or numerically from its density
  on fine grids of inputs and outputs (continuous outputs; RVNS with its declared delta-
  neighbourhoods). For (eps, delta) mechanisms it is the smallest epsilon whose exact delta is at
  most the claimed delta. ``None`` where no worst case is computed; ``math.inf`` (JSON null,
  ``exact_infinite: true``) where none is finite.
* ``empirical_epsilon_lower``: a statistical lower bound at confidence ``confidence`` from samples
  of the mechanism (through ``perturb``) on the worst-case input pair, with the event chosen on
  one half of the samples and evaluated on the other (:func:`ldp_beam.audit.audit_samples`).

Central algorithms get the Monte Carlo audit: repeated releases on neighbouring inputs (the sound
histogram releases on two pairs: one record added to a busy bucket and to an empty one; one user
added; one sensitive record replaced), threshold or singleton events on the released statistic.
LPA also gets an exact epsilon: its noise is the exact discrete Laplace, whose worst-case ratio
is 1/t for the rational scale t the sampler uses.

Person-level audits (issue 14; settings ``person ...``): neighbouring datasets differ by ALL rows
of one privacy unit, a person with 50 rows among single-row units. With contribution bounding
(:func:`ldp_beam.central.partition.bound_contributions`, the reference of the pipeline's bounding,
applied to every release's rows) the release's per-unit guarantee (``ldp_beam.privacy.per_unit``)
is the claim: LPA at L0 = Linf = 1 and per key at L0 = 2 x Linf = 3 (exact: ||shift||_1 / t from the
discrete Laplace pmf), DPHR (sound) at L0 = Linf = 1, AHP and StructureFirst at Linf = 3, OSPDPRR
and OsdpRR at Linf = 2, and private partition selection (exact epsilon from the keep
probabilities, exact delta = 1 - (1 - p1)^L0). Unbounded baselines (``person ... unbounded``: the
same 50 rows, bounding skipped) carry no per-unit guarantee (kind ``none``, verdict ``no claim``,
the per-record epsilon as ``claimed_epsilon``): their exact loss (LPA: 50 eps) and empirical lower
bound show what a per-record guarantee is worth per person.

Confidence: each audit's bound holds with probability >= 1 - 0.05/(number of audits), so all of
one run's bounds hold together with probability >= 0.95 (Bonferroni; ``family_confidence``).

Verdicts: ``consistent`` (empirical lower <= claim, and exact <= claim + 1e-9 where computed),
``violates claim``, or ``no claim`` (kind ``none``: replication-only variants; the paper's number
is reported as ``claimed_epsilon`` and a bound above it is a finding, not a failure).

Plugins (families without a built-in audit): an LDP mechanism whose class defines
``audit_profile()`` returning :class:`ldp_beam.audit.AuditProfile` is audited like the discrete
built-ins (setting ``plugin audit_profile``): built at epsilon = 1, exact epsilon from the
profile's matrix, empirical bound from ``perturb`` on its worst-case pair. Any other family is a
``not audited`` record whose note says why, and naming it with ``only`` raises
:class:`NotAuditable` (the CLI: one line, exit 2) before anything is sampled.

:func:`summary` renders the records as the console table of ``ldp-beam audit``.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import numpy as np
from scipy.optimize import brentq

from .. import audit as A
from ..central.partition import PartitionSelection, bound_contributions
from ..core import Mechanism
from ..errors import LdpBeamError, ParameterError
from ..mechanisms.continuous_baselines import gg_delta
from ..mechanisms.rvns import rvns_paper_epsilon, rvns_worst_case
from ..privacy import LDP, NONE, PrivacyGuarantee, per_unit
from ..registry import build_mechanism, get_registry
from ..pipelines.records import make_record

FAMILY_ALPHA = 0.05  # for the whole run: every audit gets FAMILY_ALPHA / (number of audits)
ALPHA = FAMILY_ALPHA  # per audit; set by run() (Bonferroni over the audits of one run)
EPS = 1.0


# --------------------------------------------------------------------------- helpers
def _verdict(kind: str, claim: float, exact: float | None, lower: float) -> str:
    if kind == "none":
        return "no claim"
    ok = lower <= claim + 1e-12 and (exact is None or exact <= claim + 1e-9)
    return "consistent" if ok else "violates claim"


def _record(name: str, setting: str, mech: Any, exact: float | None, res: dict, note: str,
            seed: int, claim: float | None = None, elapsed: float = 0.0,
            guarantee: Any = None, **extra: Any) -> dict:
    g = mech.guarantee if guarantee is None else guarantee
    claimed = g.epsilon if claim is None else claim
    lower = float(res["epsilon_lower"])
    rec = make_record(
        "audit", setting, name, claimed, "epsilon", lower,
        claimed_epsilon=claimed, exact_epsilon=exact, empirical_epsilon_lower=lower,
        confidence=res["confidence"], samples=res["samples"],
        verdict=_verdict(g.kind, claimed, exact, lower), kind=g.kind, delta=g.delta,
        exact_infinite=exact is not None and math.isinf(exact),
        family_confidence=1.0 - FAMILY_ALPHA,
        event_p=res.get("p"), event_q=res.get("q"), seed=seed, seconds=round(elapsed, 3),
        note=note, **extra)
    if extra.get("exact_delta") is not None and rec["verdict"] == "consistent" \
            and extra["exact_delta"] > g.delta:
        rec["verdict"] = "violates claim"
    return rec


def _density_epsilon(dens: Callable[[np.ndarray, np.ndarray], np.ndarray], xs: np.ndarray,
                     ys: np.ndarray) -> float:
    """max over y of ln(max_x p(y|x) / min_x p(y|x)) on the grids (inf if some p is 0 < max)."""
    p = dens(ys[None, :], xs[:, None])
    hi, lo = p.max(axis=0), p.min(axis=0)
    if np.any((hi > 0) & (lo <= 0)):
        return math.inf
    m = hi > 0
    return float(np.log(hi[m] / lo[m]).max())


# --------------------------------------------------------------------------- discrete LDP
def _discrete(mech: Any, q: np.ndarray, definition: str, data_of: Callable, code_of: Callable,
              n: int, gen: np.random.Generator, masks: tuple = ()) -> tuple:
    exact = (A.ldp_epsilon(q) if definition == "ldp" else
             A.uldp_epsilon(q, masks[0]) if definition == "uldp" else A.uldp2d_epsilon(q, *masks))
    allowed = A.allowed_inputs(q, definition, *(masks if definition == "uldp2d" else ()))
    i1, i2, _, outs = A.worst_pair(q, allowed)
    s1 = code_of(mech.perturb(data_of(i1, n), rng=gen))
    s2 = code_of(mech.perturb(data_of(i2, n), rng=gen))
    res = A.audit_samples(s1, s2, A.singleton_events(np.array(outs)), ALPHA)
    note = (f"{definition} on the transition matrix; sampled inputs {i1} vs {i2}, events: "
            f"single outputs the definition constrains for both")
    return exact, res, note


def _labels(domain):
    return lambda i, n: {"value": np.array([domain[i]] * n, dtype=object)}


def _cells(mech):
    def data(i, n):
        return {"x": np.array([mech.x_domain[i // mech.ny]] * n, dtype=object),
                "y": np.array([mech.y_domain[i % mech.ny]] * n, dtype=object)}
    return data


def _numeric(grid):
    return lambda i, n: {"value": np.full(n, grid[i])}


def _audit_discrete(name: str, n: int, gen) -> tuple:
    dom = ("a", "b", "c", "d", "e")
    xd, yd = ("a", "b", "c"), ("p", "q", "r")
    grid = np.linspace(-1.0, 1.0, 21)
    with_null = np.concatenate([grid, [np.nan]])
    if name == "grr":
        m = build_mechanism(name, epsilon=EPS, domain=dom)
        return m, _discrete(m, m.transition_matrix(), "ldp", _labels(dom), lambda r: r["v"], n,
                            gen)
    if name == "urr":
        m = build_mechanism(name, epsilon=EPS, domain=dom, sensitive=("a", "b"))
        mask = np.isin(np.array(dom), ["a", "b"])
        return m, _discrete(m, m.transition_matrix(), "uldp", _labels(dom), lambda r: r["v"], n,
                            gen, (mask,))
    code = (lambda m: (lambda r: r["x"].astype(np.int64) * m.ny + r["y"]))
    if name == "jd-grr":
        m = build_mechanism(name, epsilon=EPS, x_domain=xd, y_domain=yd)
        return m, _discrete(m, m.transition_matrix(), "ldp", _cells(m), code(m), n, gen)
    if name in ("cprr", "jurr", "tdrr"):
        eps = 1.5 if name == "jurr" else EPS  # JuRR needs eps > ln(1 + sqrt(sx sy)) = ln 2
        m = build_mechanism(name, epsilon=eps, x_domain=xd, y_domain=yd, x_sensitive=("a",),
                            y_sensitive=("p",))
        xs, ys = m.sensitive_masks()
        if name == "cprr":
            cells = np.zeros(m.nx * m.ny, dtype=bool)
            cells[m.sensitive_cells()] = True
            return m, _discrete(m, m.transition_matrix(), "uldp", _cells(m), code(m), n, gen,
                                (cells,))
        return m, _discrete(m, m.transition_matrix(), "uldp2d", _cells(m), code(m), n, gen,
                            (xs, ys))
    numeric = {  # name -> (inputs, the output code of a report)
        "bisample": (grid, lambda r: 2 * r["s"].astype(np.int64) + r["b"]),
        "harmony": (grid, lambda r: (r["y"] == 1).astype(np.int64)),
        "bisample-md": (with_null, lambda r: 2 * r["s"].astype(np.int64) + r["b"]),
        "privkvm": (with_null, lambda r: r["k"].astype(np.int64) * (1 + (r["v"] == 1)))}
    inputs, code_of = numeric[name]  # KeyError for any other name
    m = build_mechanism(name, epsilon=EPS, lower=-1.0, upper=1.0)
    return m, _discrete(m, m.output_probabilities(inputs).T, "ldp", _numeric(inputs), code_of, n,
                        gen)


# --------------------------------------------------------------------------- continuous LDP
def _sample_pair(m, x1: float, x2: float, n: int, gen, field: str = "y") -> tuple:
    s1 = m.perturb({"value": np.full(n, x1)}, rng=gen)[field]
    s2 = m.perturb({"value": np.full(n, x2)}, rng=gen)[field]
    return s1, s2


def _thresholds(s1, s2, delta: float = 0.0, directions=(0, 1)) -> dict:
    h1, h2 = len(s1) // 2, len(s2) // 2
    ev = A.threshold_events(np.concatenate([s1[:h1], s2[:h2]]))
    return A.audit_samples(s1, s2, ev, ALPHA, delta, directions)


def _audit_continuous(name: str, n: int, gen) -> tuple:
    if name == "pm":
        m = build_mechanism(name, epsilon=EPS, lower=-1.0, upper=1.0)
        C = m.C
        ys = np.unique(np.concatenate([np.linspace(-C, C, 4001), [-1.0, 1.0]]))
        exact = _density_epsilon(lambda y, t: m.density(y, t), np.linspace(-1, 1, 41), ys)
        res = _thresholds(*_sample_pair(m, 1.0, -1.0, n, gen))
        note = "density on a 41-input x 4001-output grid; sampled t = +1 vs -1, threshold events"
    elif name == "square-wave":
        m = build_mechanism(name, epsilon=EPS, lower=0.0, upper=1.0)
        b = m.b
        xs = np.linspace(0.0, 1.0, 41)
        ys = np.unique(np.concatenate([np.linspace(-b, 1 + b, 4001), xs - b, xs + b]))
        exact = _density_epsilon(m.density, xs, ys)
        res = _thresholds(*_sample_pair(m, 1.0, 0.0, n, gen))
        note = "density on a 41-input x 4000-output grid; sampled x = upper vs lower"
    elif name == "laplace-dp":
        m = build_mechanism(name, epsilon=EPS, lower=0.0, upper=1.0)
        ys = np.linspace(-30 * m.scale, 1 + 30 * m.scale, 6001)
        exact = _density_epsilon(m.density, np.linspace(0.0, 1.0, 41), ys)
        res = _thresholds(*_sample_pair(m, 1.0, 0.0, n, gen))
        note = "density ratio on a grid (30 scales of tail); sampled x = upper vs lower"
    elif name == "generalized-gaussian":
        m = build_mechanism(name, epsilon=EPS, lower=0.0, upper=1.0, delta=1e-5, p=2.0)
        dl = m.guarantee.delta

        def excess(e: float) -> float:
            return gg_delta(e, m.sensitivity, m.scale, float(m.p)) - dl
        exact = 0.0 if excess(0.0) <= 0 else float(brentq(excess, 0.0, 50.0, xtol=1e-12))
        res = _thresholds(*_sample_pair(m, 1.0, 0.0, n, gen), delta=dl)
        note = (f"(eps, delta = {dl:g}): exact = the smallest eps whose exact hockey-stick delta "
                f"is <= delta; empirical bound ln((P1 - delta)/P2); sampled x = upper vs lower")
    else:
        raise KeyError(name)
    return m, (exact, res, note)


def _audit_rvns(n: int, gen, delta: float) -> tuple:
    # delta <= d (no finite epsilon) is audited too: allowed explicitly
    m = build_mechanism("rvns", lower=0.0, upper=1.0, d=0.2, k=1, delta=delta,
                        allow_no_guarantee=True)
    a, b, d = m.lower, m.upper, m.d
    wc = rvns_worst_case(a, b, d, delta, 1)
    s1, s2 = _sample_pair(m, wc.x1, wc.x2, n, gen, field="y1")
    centres = np.linspace(a, b, 201)

    def events(y):
        y = np.asarray(y, float)[None, :]
        return (y >= centres[:, None] - delta) & (y <= centres[:, None] + delta)
    res = A.audit_samples(s1, s2, events, ALPHA)
    paper = rvns_paper_epsilon(d, delta, 1)
    note = (f"neighbourhood-LDP, delta = {delta:g}, d = {d:g}, k = 1: exact = numerical worst "
            f"case over delta-neighbourhoods (x = {wc.x1:g} vs {wc.x2:g}); events: the "
            f"neighbourhoods [c - delta, c + delta]. The paper's k ln(4d/delta) = {paper:.4g}: "
            f"the empirical lower bound is "
            f"{'ABOVE' if res['epsilon_lower'] > paper else 'not above'} it")
    return m, (wc.epsilon, res, note)


# --------------------------------------------------------------------------- central DP
_BASE = np.array([12, 3, 0, 7, 7, 1, 20, 4])  # the bucket counts of the histogram audits


def _central_hist(m: Any, reps: int, gen, bucket: int = 0) -> tuple:
    nb = _BASE.copy()
    nb[bucket] += 1
    s1 = np.array([m.release_counts(_BASE, gen)["histogram"].value[bucket] for _ in range(reps)])
    s2 = np.array([m.release_counts(nb, gen)["histogram"].value[bucket] for _ in range(reps)])
    res = _thresholds(s1, s2)
    note = (f"Monte Carlo: {reps} releases on counts {_BASE.tolist()} and with one record added "
            f"to bucket {bucket}; threshold events on that bucket's published value")
    exact = getattr(m, "realized_epsilon", None)  # releases whose worst case is known exactly
    if exact is not None:
        note += "; exact: the release's worst-case privacy loss as sampled (realized_epsilon)"
    return exact, res, note


def _central_ospdprr(m: Any, reps: int, gen) -> tuple:
    vals = np.array([[0.2], [0.9], [0.5]])
    w = np.array([[0.3], [0.8], [0.0]])
    v2, w2 = np.vstack([vals, [[1.0]]]), np.vstack([w, [[0.0]]])
    s1 = np.array([m.release(vals, w, gen).statistics["sum"].value for _ in range(reps)])
    s2 = np.array([m.release(v2, w2, gen).statistics["sum"].value for _ in range(reps)])
    res = _thresholds(s1, s2)
    note = (f"Monte Carlo: {reps} releases of the sum on 3 users and with one user added (value "
            "1, weight 0: sampled with probability 1); threshold events")
    return None, res, note


def _central_osdp(m: Any, reps: int, gen) -> tuple:
    vals = np.array([[0.2], [0.9], [0.5], [0.7]])
    sens = np.array([[1], [0], [0], [0]])
    sens2 = np.array([[0], [0], [0], [0]])
    s1 = np.array([m.release(vals, sens, gen).statistics["released_records"].value
                   for _ in range(reps)])
    s2 = np.array([m.release(vals, sens2, gen).statistics["released_records"].value
                   for _ in range(reps)])
    res = A.audit_samples(s1, s2, A.singleton_events(np.arange(5)), ALPHA, directions=(0,))
    note = (f"Monte Carlo: {reps} releases; user 1's record sensitive vs replaced by a "
            "non-sensitive one (the one-sided direction only); events: number of released records")
    return None, res, note


# --------------------------------------------------------------------------- person level
PERSON_ROWS = 50


class _Audited:
    """What a person-level audit is about: the mechanism (for its name and params) and the
    guarantee it is held to (per unit, or none for an unbounded baseline)."""

    def __init__(self, mech: Any, guarantee: Any) -> None:
        self.mech, self.guarantee = mech, guarantee
        self.epsilon = getattr(mech, "epsilon", getattr(mech, "t", None))


def _unit_claim(mech: Any, bounded: bool) -> Any:
    """The guarantee a person-level audit holds ``mech`` to: per unit when its rows are bounded;
    no finite per-unit guarantee (kind none, the per-record epsilon as the claim) when not."""
    if bounded:
        return per_unit(mech.guarantee, "person", mech.contribution_bounds)
    eps = mech.guarantee.epsilon
    return PrivacyGuarantee(NONE, math.inf, claim=f"{eps:g} per record",
                            notes="contribution bounding not applied: a person with r rows "
                                  "spends r x epsilon (no finite per-person guarantee)")


def _person_counts(gen, bounds: Any, bucket: int = 0) -> np.ndarray:
    """Bucket counts of the dataset with the person: single-row units in ``_BASE`` plus the
    person's PERSON_ROWS rows in ``bucket``, bounded to ``bounds`` (None: not bounded)."""
    buckets = np.concatenate([np.repeat(np.arange(_BASE.size), _BASE),
                              np.full(PERSON_ROWS, bucket)])
    units = np.concatenate([np.arange(_BASE.sum()), np.full(PERSON_ROWS, -1)])
    keep = np.ones(buckets.size, dtype=bool) if bounds is None else bound_contributions(
        units, None, bounds.l0, bounds.linf, gen)
    return np.bincount(buckets[keep], minlength=_BASE.size)


def _person_hist(m: Any, reps: int, gen, bounded: bool, bucket: int = 0) -> tuple:
    bounds = m.contribution_bounds if bounded else None
    s1 = np.array([m.release_counts(_person_counts(gen, bounds, bucket),
                                    gen)["histogram"].value[bucket]
                   for _ in range(reps)])
    s2 = np.array([m.release_counts(_BASE, gen)["histogram"].value[bucket] for _ in range(reps)])
    res = _thresholds(s1, s2)
    shift = _person_counts(gen, bounds, bucket) - _BASE
    exact = None
    if hasattr(m, "scale"):  # LPA: independent discrete Laplace on the counts
        exact = A.discrete_laplace_shift_epsilon(shift, m.scale)
    how = (f"bounded to L0 = {m.max_partitions_per_unit}, Linf = {m.max_rows_per_partition} "
           f"({int(shift.sum())} row(s) kept)" if bounded else "NOT bounded (all rows kept)")
    note = (f"Monte Carlo: {reps} releases on counts {_BASE.tolist()} of single-row units, with "
            f"and without one person's {PERSON_ROWS} rows in bucket {bucket}, {how}; threshold "
            "events on that bucket's published value")
    if exact is not None:
        note += "; exact: ||shift||_1 / t from the discrete Laplace pmf"
    return exact, res, note


def _person_per_key(m: Any, reps: int, gen) -> tuple:
    """LPA per key (public keys x, y, z; L0 = 2, Linf = 3): the person has 20, 20 and 10 rows in
    bucket 0 of the three keys; bounded to 2 keys x 3 rows. Statistic: bucket 0 summed over keys."""
    keys = ("x", "y", "z")
    person = {"x": 20, "y": 20, "z": 10}
    base = {k: np.roll(_BASE, i) for i, k in enumerate(keys)}
    rows_k = np.concatenate([np.repeat(np.arange(3), [b.sum() for b in base.values()]),
                             np.repeat(np.arange(3), [person[k] for k in keys])])
    rows_b = np.concatenate([np.repeat(np.arange(8), base[k]) for k in keys]
                            + [np.zeros(PERSON_ROWS, dtype=np.int64)])
    n_others = sum(int(b.sum()) for b in base.values())
    units = np.concatenate([np.arange(n_others), np.full(PERSON_ROWS, -1)])
    b = m.contribution_bounds

    def counts_with(g) -> list[np.ndarray]:
        keep = bound_contributions(units, rows_k, b.l0, b.linf, g)
        return [np.bincount(rows_b[keep & (rows_k == i)], minlength=8) for i in range(3)]

    def stat(counts: list[np.ndarray]) -> float:
        # LPA's noise is independent per bucket, so one publish of the three keys' counts side by
        # side has the law of the three per-key releases (and is 3x cheaper)
        return float(m.release_counts(np.concatenate(counts), gen)["histogram"].value[::8].sum())
    s1 = np.array([stat(counts_with(gen)) for _ in range(reps)])
    s2 = np.array([stat([base[k] for k in keys]) for _ in range(reps)])
    res = _thresholds(s1, s2)
    shift = np.concatenate(counts_with(gen)) - np.concatenate([base[k] for k in keys])
    exact = A.discrete_laplace_shift_epsilon(shift, m.scale)
    note = (f"Monte Carlo: {reps} per-key releases (public keys {list(keys)}, one LPA histogram "
            f"each) with and without a person with {PERSON_ROWS} rows over the 3 keys "
            f"({person}), bounded to L0 = {b.l0} keys x Linf = {b.linf} rows ({int(shift.sum())} "
            "kept); threshold events on bucket 0 summed over the keys; exact: ||shift||_1 / t over "
            "all keys from the discrete Laplace pmf")
    return exact, res, note


def _person_ospdprr(m: Any, reps: int, gen) -> tuple:
    vals = np.array([[0.2], [0.9], [0.5]])
    w = np.array([[0.3], [0.8], [0.0]])
    units = np.concatenate([np.arange(3), np.full(PERSON_ROWS, -1)])
    v_all = np.vstack([vals, np.ones((PERSON_ROWS, 1))])
    w_all = np.vstack([w, np.zeros((PERSON_ROWS, 1))])
    b = m.contribution_bounds

    def one(g) -> float:
        keep = bound_contributions(units, None, b.l0, b.linf, g)
        return m.release(v_all[keep], w_all[keep], gen).statistics["sum"].value
    s1 = np.array([one(gen) for _ in range(reps)])
    s2 = np.array([m.release(vals, w, gen).statistics["sum"].value for _ in range(reps)])
    res = _thresholds(s1, s2)
    note = (f"Monte Carlo: {reps} releases of the sum on 3 users, with and without a person with "
            f"{PERSON_ROWS} rows (value 1, weight 0: sampled with probability 1) bounded to Linf = "
            f"{b.linf} rows; threshold events")
    return None, res, note


def _person_osdp(m: Any, reps: int, gen) -> tuple:
    vals = np.concatenate([np.array([[0.2], [0.9], [0.5]]), np.full((PERSON_ROWS, 1), 0.7)])
    units = np.concatenate([np.arange(3), np.full(PERSON_ROWS, -1)])
    others = np.array([[0], [0], [0]])
    b = m.contribution_bounds

    def one(sensitive_person: int, g) -> int:
        keep = bound_contributions(units, None, b.l0, b.linf, g)
        sens = np.vstack([others, np.full((PERSON_ROWS, 1), sensitive_person)])
        return m.release(vals[keep], sens[keep], gen).statistics["released_records"].value
    s1 = np.array([one(1, gen) for _ in range(reps)])
    s2 = np.array([one(0, gen) for _ in range(reps)])
    res = A.audit_samples(s1, s2, A.singleton_events(np.arange(3 + b.l1 + 1)), ALPHA,
                          directions=(0,))
    note = (f"Monte Carlo: {reps} releases; a person's {PERSON_ROWS} records (bounded to Linf = "
            f"{b.linf}) sensitive vs replaced by non-sensitive ones (the one-sided direction); "
            "events: number of released records")
    return None, res, note


def _person_selection(sel: Any, reps: int, gen) -> tuple:
    """Partition selection: the person's L0 keys are present with and without her (counts T and
    T - 1, where a key's decision is most sensitive); exact epsilon from the keep probabilities
    summed over the L0 keys; exact delta for keys only she has."""
    T, L0 = sel.threshold, sel.max_partitions_per_unit
    cs = np.arange(1, 3 * T + 3)
    per_key = max(A.release_probability_epsilon(
        sel.keep_probability(c + 1), sel.keep_probability(c), sel.drop_probability(c + 1),
        sel.drop_probability(c)) for c in cs)
    exact = L0 * per_key
    s1 = np.array([int(sel.select(np.full(L0, T), gen).sum()) for _ in range(reps)])
    s2 = np.array([int(sel.select(np.full(L0, T - 1), gen).sum()) for _ in range(reps)])
    res = A.audit_samples(s1, s2, A.singleton_events(np.arange(L0 + 1)), ALPHA)
    note = (f"keys present with and without the person (counts {T} vs {T - 1} in each of her "
            f"L0 = {L0} keys; T = {T}): exact = L0 x max over counts c of the keep/drop log "
            f"ratio at c + 1 vs c (from the exact keep probabilities); Monte Carlo: {reps} "
            "selections, events: number of her keys kept. Keys only she has: exact delta = "
            f"1 - (1 - p1)^L0 with p1 = {sel.single_unit_probability:.3g}")
    return exact, res, note


def _person_aggregation(m: Any, stat: str, reps: int, gen) -> tuple:
    """The central aggregations (central-count ... central-quantiles): 40 single-row units with
    values across the domain, with and without a person with PERSON_ROWS rows at its upper bound
    (bounded to the release's contribution bounds: 250 bounding draws, used in turn); releases
    from the release's own accumulate-and-release code; threshold events on the statistic (a
    quantile release: its first quantile). Exact for the counts: ||shift||_1 / t."""
    b, est = m.contribution_bounds, m.estimator()
    lo, hi = (m.lower, m.upper) if hasattr(m, "lower") else (0.0, 1.0)
    base = np.linspace(lo, hi, 42)[1:-1]
    vals = np.concatenate([base, np.full(PERSON_ROWS, hi)])
    units = np.concatenate([np.arange(base.size), np.full(PERSON_ROWS, -1)])

    def acc_of(v):
        cols, _ = m.check(v)
        return est.add(est.create(), m.prepare(cols, np.empty((v.size, 0))))

    def release(acc) -> float:
        return float(np.ravel(m.release_from(acc, gen)[0][stat].value)[0])
    accs: dict = {}
    keeps = [bound_contributions(units, None, b.l0, b.linf, gen) for _ in range(250)]
    s1 = []
    for i in range(reps):
        kept = np.sort(vals[keeps[i % len(keeps)]])
        if kept.tobytes() not in accs:
            accs[kept.tobytes()] = acc_of(kept)
        s1.append(release(accs[kept.tobytes()]))
    without = acc_of(base)
    s2 = np.array([release(without) for _ in range(reps)])
    res = _thresholds(np.array(s1), s2)
    shift = int(keeps[0][units == -1].sum())
    exact = A.discrete_laplace_shift_epsilon([shift], m.scale) if hasattr(m, "sensitivity") \
        and stat in ("count", "privacy_id_count") else None
    note = (f"Monte Carlo: {reps} releases of {stat} on 40 single-row units with and without a "
            f"person's {PERSON_ROWS} rows at the upper bound, bounded to L0 = {b.l0}, Linf = "
            f"{b.linf} ({shift} kept); threshold events"
            + ("; exact: ||shift||_1 / t from the discrete Laplace pmf" if exact else ""))
    return exact, res, note


def _person_plan(reps: int) -> list[tuple[str, str, Callable]]:
    plan: list[tuple[str, str, Callable]] = []

    def person(name, setting, audit, bounded=True, **kw):
        def f(g):
            m = build_mechanism(name, **kw)
            return _Audited(m, _unit_claim(m, bounded)), audit(m, g)
        plan.append((name, setting, f))

    def hist(name, bounded, setting, **kw):
        person(name, setting, lambda m, g: _person_hist(m, reps, g, bounded), bounded,
               epsilon=EPS, **kw)
    hist("laplace-histogram", True, "person L0=Linf=1")
    hist("laplace-histogram", False, "person unbounded")
    hist("dphr", True, "person L0=Linf=1", variant="sound")
    hist("dphr", False, "person unbounded", variant="sound")
    hist("ahp", True, "person Linf=3", max_rows_per_partition=3)
    hist("structure-first", True, "person Linf=3 F=40", k=3, F=40.0,
         max_rows_per_partition=3)
    person("laplace-histogram", "person per key L0=2 Linf=3",
           lambda m, g: _person_per_key(m, reps, g), epsilon=EPS, max_partitions_per_unit=2,
           max_rows_per_partition=3)
    person("ospdprr", "person Linf=2", lambda m, g: _person_ospdprr(m, reps, g), t=EPS,
           query="sum", lower=0.0, upper=1.0, max_rows_per_partition=2)
    person("osdp-rr", "person Linf=2 one-sided", lambda m, g: _person_osdp(m, reps, g),
           epsilon=EPS, query="count", lower=0.0, upper=1.0, max_rows_per_partition=2)

    def select(g):
        sel = PartitionSelection(EPS, 1e-5, 2)
        return _Audited(sel, sel.guarantee), _person_selection(sel, reps, g)
    plan.append(("partition-selection", "person L0=2 delta=1e-5", select))

    def agg(name, stat, setting, **kw):
        person(name, setting, lambda m, g: _person_aggregation(m, stat, reps, g), epsilon=EPS,
               **kw)
    dom = {"lower": 0.0, "upper": 1.0}
    agg("central-count", "count", "person Linf=3", max_rows_per_partition=3)
    agg("privacy-id-count", "privacy_id_count", "person L0=Linf=1")
    agg("central-sum", "sum", "person Linf=3", max_rows_per_partition=3, **dom)
    agg("central-mean", "mean", "person Linf=3", max_rows_per_partition=3, **dom)
    agg("central-variance", "variance", "person Linf=2", max_rows_per_partition=2, **dom)
    agg("central-quantiles", "quantiles", "person Linf=2 q=0.9 tree 2^3",
        max_rows_per_partition=2, quantiles=(0.9,), branching=2, height=3, **dom)
    return plan


# --------------------------------------------------------------------------- the run
DISCRETE = ("grr", "urr", "cprr", "jd-grr", "jurr", "tdrr", "bisample", "bisample-md",
            "harmony", "privkvm")
CONTINUOUS = ("pm", "square-wave", "laplace-dp", "generalized-gaussian")


def _plan(quick: bool) -> list[tuple[str, str, Callable]]:
    n = 100_000 if quick else 1_000_000  # samples per input (LDP)
    reps = 5_000 if quick else 40_000  # releases per neighbouring input (central)
    plan: list[tuple[str, str, Callable]] = [
        *((name, "transition-matrix", lambda g, nm=name: _audit_discrete(nm, n, g))
          for name in DISCRETE),
        *((name, "density", lambda g, nm=name: _audit_continuous(nm, n, g))
          for name in CONTINUOUS),
        ("rvns", "delta=0.1<=d=0.2", lambda g: _audit_rvns(n, g, 0.1)),
        ("rvns", "delta=0.3>d=0.2", lambda g: _audit_rvns(n, g, 0.3))]

    def hist(name, bucket=0, **kw):
        def f(g):  # the published variants without a guarantee are audited too
            m = build_mechanism(name, epsilon=EPS, allow_no_guarantee=True, **kw)
            return m, _central_hist(m, reps, g, bucket)
        return f
    # two neighbouring pairs for the sound releases: a record added to a busy bucket (0) and to
    # the empty one (2), where grouping algorithms smear zeros together
    for b in (0, 2):
        plan += [("laplace-histogram", f"central +1 in bucket {b}", hist("laplace-histogram", b)),
                 ("dphr", f"central variant=sound +1 in bucket {b}",
                  hist("dphr", b, variant="sound")),
                 ("ahp", f"central +1 in bucket {b}", hist("ahp", b)),
                 ("structure-first", f"central F=40 +1 in bucket {b}",
                  hist("structure-first", b, k=3, F=40.0))]
    plan += [("dphr", "central variant=paper", hist("dphr", variant="paper")),
             ("structure-first", "central F=None", hist("structure-first", k=3))]

    def osp(g):
        m = build_mechanism("ospdprr", t=EPS, query="sum", lower=0.0, upper=1.0)
        return m, _central_ospdprr(m, reps, g)

    def osdp(g):
        m = build_mechanism("osdp-rr", epsilon=EPS, query="count", lower=0.0, upper=1.0)
        return m, _central_osdp(m, reps, g)
    return plan + [("ospdprr", "central mode=sound-self", osp),
                   ("osdp-rr", "central one-sided", osdp), *_person_plan(reps)]


def run(quick: bool = False, progress: Any = None, seed: int | None = None,
        only: list[str] | None = None) -> list[dict]:
    """Audit every registered built-in mechanism (or only the names in ``only``); one record per
    mechanism and setting. ``seed=None`` draws one from OS entropy; it is recorded in every
    record. The Bonferroni correction is over the audits actually run."""
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2 ** 63))
    global ALPHA
    plan = _plan(quick)
    builtin = {p[0] for p in plan}
    # families without a built-in audit (plugins): audited through their audit_profile(), or
    # listed as not audited with the reason (refused when asked for by name)
    others = [nm for nm in get_registry().names() if nm not in builtin]
    if only:
        known = set(get_registry().names()) | builtin
        unknown = sorted(set(only) - known)
        if unknown:
            raise ParameterError("only", unknown, f"registered mechanism names: {sorted(known)}")
        plan = [p for p in plan if p[0] in only]
        others = [nm for nm in others if nm in only]
    n = 100_000 if quick else 1_000_000
    not_auditable: dict[str, str] = {}
    for nm in others:
        try:
            plan.append((nm, "plugin audit_profile", _profile_audit(nm, n)))
        except NotAuditable as exc:
            not_auditable[nm] = str(exc)
    refused = [nm for nm in dict.fromkeys(only or ()) if nm in not_auditable]
    if refused:  # asked for by name: an error before any sampling, not a silent "not audited"
        raise NotAuditable("; ".join(not_auditable[nm] for nm in refused))
    if not plan:
        raise NotAuditable("nothing to audit")
    ALPHA = FAMILY_ALPHA / len(plan)  # a tight claim is "violated" by chance w.p. <= 5% per run
    children = np.random.SeedSequence(seed).spawn(len(plan))
    if progress is not None:
        progress.total = len(plan)  # a bar with an ETA on a terminal (issue 16)
    records: list[dict] = []
    audited = set()
    for (name, setting, fn), ss in zip(plan, children):
        if progress is not None:
            progress.step(f"{name} {setting}")
        t0 = time.perf_counter()
        mech, (exact, res, note) = fn(np.random.default_rng(ss))
        extra: dict = {}
        if isinstance(mech, _Audited):  # person level: held to its per-unit guarantee
            g = mech.guarantee
            extra = {"guarantee": g, "unit": g.params.get("unit", "person")}
            if g.delta:
                extra.update(exact_delta=float(mech.mech.realized_delta),
                             claimed_delta=g.delta)
            claim = mech.epsilon if g.kind == "none" else None
            mech = mech.mech
        else:
            claim = _paper_claim(mech)
        records.append(_record(name, setting, mech, exact, res, note, seed, claim=claim,
                               elapsed=time.perf_counter() - t0, **extra))
        audited.add(name)
    if progress is not None and hasattr(progress, "close"):
        progress.close()  # the bar ends before the caller prints the table
    for name in get_registry().names():
        if name not in audited and (not only or name in only):
            records.append(make_record(
                "audit", "not audited", name, None, "epsilon", None, claimed_epsilon=None,
                exact_epsilon=None, empirical_epsilon_lower=None, confidence=None, samples=0,
                verdict="not audited", seed=seed,
                note=not_auditable.get(name, "no audit profile for this mechanism")))
    return records


# --------------------------------------------------------------------------- the console table
VERDICT_SHOWN = {"consistent": "consistent", "violates claim": "VIOLATION",
                 "no claim": "no claim", "not audited": "not audited"}
EXPLANATION = ("empirical lower bound: sampling shows the true epsilon is at least this, at the "
               "stated confidence; above the claim is a VIOLATION, below it proves nothing")


def _eps(v: float | None, infinite: bool = False) -> str:
    """An epsilon for the table: fixed point, 3 decimals (never scientific notation)."""
    return "inf" if infinite else "-" if v is None else f"{v:.3f}"


def _confidence(c: float | None) -> str:
    """99.868... -> '99.87%', 0.95 -> '95%'."""
    return "" if c is None else f"{100 * c:.2f}".rstrip("0").rstrip(".") + "%"


def summary(records: list[dict]) -> str:
    """The run as a table for a reader (``ldp-beam audit``'s console output; the records
    themselves are the machine output): one line per audited mechanism and setting with the
    claimed epsilon, the empirical lower bound and its confidence, the exact worst case where
    one is computed and the verdict; then what an empirical lower bound means, the counts of
    verdicts, and the reasons of the families that were not audited."""
    audited = [r for r in records if r["verdict"] != "not audited"]
    skipped = [r for r in records if r["verdict"] == "not audited"]
    rows = [("mechanism", "setting", "claimed eps", "empirical lower eps (conf.)", "exact eps",
             "verdict")]
    for r in audited:
        low = f"{_eps(r['empirical_epsilon_lower'])} ({_confidence(r['confidence'])})"
        rows.append((r["method"], r["dataset"], _eps(r["claimed_epsilon"],
                                                     r["claimed_epsilon"] is None),
                     low, _eps(r["exact_epsilon"], bool(r.get("exact_infinite"))),
                     VERDICT_SHOWN.get(r["verdict"], r["verdict"])))
    w = [max(len(row[i]) for row in rows) for i in range(6)]
    lines = []
    if audited:
        seed = audited[0].get("seed")
        joint = audited[0].get("family_confidence")
        lines.append(f"privacy audit: {len(audited)} audit{'s' * (len(audited) != 1)}, seed "
                     f"{seed}; all bounds hold together with confidence "
                     f"{_confidence(joint)} (each at its own, shown)")
        for row in rows:
            lines.append(f"  {row[0]:<{w[0]}}  {row[1]:<{w[1]}}  {row[2]:>{w[2]}}  "
                         f"{row[3]:>{w[3]}}  {row[4]:>{w[4]}}  {row[5]}".rstrip())
        lines.append(EXPLANATION)
        counts = {v: sum(r["verdict"] == v for r in audited)
                  for v in ("consistent", "violates claim", "no claim")}
        lines.append(f"{counts['consistent']} consistent, {counts['violates claim']} VIOLATION"
                     + (f", {counts['no claim']} no claim (settings without a guarantee, shown "
                        "beside the epsilon they would be taken for)" if counts["no claim"]
                        else ""))
    for r in skipped:
        lines.append(f"not audited: {r['method']}: {r['note']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- plugins
#: what a plugin's mechanism must provide to be audited (the refusals end with it)
PROFILE_CONTRACT = (
    "to be auditable a plugin's LDP mechanism must build with epsilon=1 and its defaults and "
    "define audit_profile() returning ldp_beam.audit.AuditProfile(matrix, inputs, output_code): "
    "its exact transition matrix Q[output, input], one input record per column and the map "
    "from reports to output rows (docs/plugins.md, section 'Planning and auditing a plugin')")


class NotAuditable(LdpBeamError, ValueError):
    """A family ``ldp-beam audit`` cannot audit (the message says why and what would make it
    auditable); raised when it is asked for by name (``--only``)."""


def _profile_audit(name: str, n: int) -> Callable:
    """The audit of a family without a built-in one (a plugin's), from its mechanism's
    ``audit_profile()``: built at epsilon = EPS, the exact epsilon of the profile's matrix and an
    empirical lower bound from ``perturb`` on its worst-case pair of inputs (singleton events on
    the outputs). Raises :class:`NotAuditable` saying why when the family cannot be audited."""
    reg = get_registry()
    plugin = reg.get(name)
    who = f"{name} (" + (f"plugin from {plugin.source})" if plugin.source != "ldp-beam"
                         else "built-in)")
    cls = plugin.mechanism
    if not issubclass(cls, Mechanism):
        raise NotAuditable(f"{who} cannot be audited: it is a central release (no generic audit "
                           "of a plugin's central release: audit it in the plugin's own tests "
                           "with ldp_beam.audit.audit_samples on neighbouring datasets)")
    if not callable(getattr(cls, "audit_profile", None)):
        raise NotAuditable(f"{who} cannot be audited: {cls.__name__} has no audit_profile(); "
                           f"{PROFILE_CONTRACT}")
    try:
        mech = build_mechanism(name, epsilon=EPS)
    except Exception as exc:  # (a plugin's own errors too)
        raise NotAuditable(f"{who} cannot be audited: building it with epsilon={EPS:g} failed "
                           f"({exc}); {PROFILE_CONTRACT}") from None
    if mech.guarantee.kind != LDP:
        raise NotAuditable(f"{who} cannot be audited: its guarantee is {mech.guarantee.kind}, "
                           "and a plugin's audit_profile() audits epsilon-LDP claims only")
    try:
        profile = mech.audit_profile()
        if not isinstance(profile, A.AuditProfile):
            raise ValueError(f"audit_profile() returned {type(profile).__name__}, not an "
                             "ldp_beam.audit.AuditProfile")
        q = profile.check()
    except Exception as exc:
        raise NotAuditable(f"{who} cannot be audited: {exc}; {PROFILE_CONTRACT}") from None
    inputs = [dict(x) for x in profile.inputs]

    def data_of(i: int, k: int) -> dict:
        return {role: np.array([v] * k, dtype=object if isinstance(v, str) else None)
                for role, v in inputs[i].items()}

    def code_of(reports) -> np.ndarray:
        return np.asarray(profile.output_code(reports), dtype=np.int64)

    def audit(gen):
        exact, res, note = _discrete(mech, q, "ldp", data_of, code_of, n, gen)
        return mech, (exact, res, f"plugin's audit_profile(): {note}")
    return audit


def _paper_claim(mech: Any) -> float | None:
    """For kind ``none`` (replication-only variants) the paper's epsilon, else None (use the
    guarantee's)."""
    if mech.guarantee.kind != "none":
        return None
    return float(getattr(mech, "epsilon", getattr(mech, "t", math.inf)))
