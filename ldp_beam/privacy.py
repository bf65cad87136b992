"""What a release costs: privacy guarantees and their composition.

Every mechanism and every estimate carries a :class:`PrivacyGuarantee`. The guarantee is the one
we can defend, which is not always the one a paper claims: where they differ, ``claim`` keeps the
paper's statement and ``notes`` says why we do not repeat it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from .errors import ParameterError

#: The kinds of guarantee ldp-beam reports.
LDP = "LDP"  # local DP: every pair of inputs, every output
ULDP = "ULDP"  # utility-optimized LDP (sensitive inputs protected, non-sensitive ones may leak)
CENTRAL = "central-DP"  # the curator sees true values, the release is DP
NEIGHBOURHOOD_LDP = "neighbourhood-LDP"  # LDP only for inputs within a declared distance
PERSONALIZED = "personalized-DP"
NONE = "none"  # replication of a paper's rule that carries no defensible guarantee
KINDS = (LDP, ULDP, CENTRAL, NEIGHBOURHOOD_LDP, PERSONALIZED, NONE)


@dataclass(frozen=True)
class PrivacyGuarantee:
    """A privacy promise: ``kind`` with ``epsilon`` (and ``delta`` where the kind needs one).

    ``epsilon`` is ``math.inf`` for kind ``none``. ``claim`` is what the source paper states when it
    differs from what we report; ``notes`` explains the difference or any condition of the promise.
    """

    kind: str
    epsilon: float
    delta: float = 0.0
    notes: str = ""
    claim: str = ""
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"guarantee kind {self.kind!r} is not one of {KINDS}")
        if not (self.epsilon >= 0):
            raise ValueError(f"guarantee epsilon {self.epsilon!r} must be >= 0")
        if not (0.0 <= self.delta <= 1.0):
            raise ValueError(f"guarantee delta {self.delta!r} must be in [0, 1]")

    def describe(self) -> str:
        if self.kind == NONE:
            return "no finite guarantee: no privacy guarantee (replication only)"
        if math.isinf(self.epsilon):
            return f"no finite guarantee: no finite epsilon ({self.kind}; see the notes)"
        if self.delta:
            return f"{self.kind} with epsilon={self.epsilon:g}, delta={self.delta:g}"
        return f"{self.kind} with epsilon={self.epsilon:g}"

    def to_dict(self) -> dict:
        eps = None if math.isinf(self.epsilon) else self.epsilon
        return {"kind": self.kind, "epsilon": eps, "delta": self.delta, "notes": self.notes,
                "claim": self.claim, "params": dict(self.params), "summary": self.describe()}


#: Appended to the notes of LDP mechanisms whose report is a double computed from the input (PM,
#: Square Wave, Laplace-DP, the generalized Gaussian): see docs/floating_point.md.
FLOAT_OUTPUT_NOTE = (
    " Floating-point caveat: the report is a double computed from the input, so which doubles "
    "can occur depends on the input; the epsilon stated is that of the real-number mechanism and "
    "does not cover attacks on the report's low-order bits (Mironov 2012). A baseline for "
    "accuracy comparisons; see docs/floating_point.md.")

#: From strongest to weakest: a composition of mixed kinds promises only the weakest one. An LDP
#: release is also neighbourhood-LDP and central DP for the same epsilon; ULDP protects only
#: sensitive values, so it is the weakest of the DP kinds here.
STRENGTH = (LDP, NEIGHBOURHOOD_LDP, CENTRAL, PERSONALIZED, ULDP)


def compose(guarantees: Iterable[PrivacyGuarantee]) -> PrivacyGuarantee:
    """Sequential composition of releases about the same people: epsilons and deltas add up.

    Releases of different kinds compose to the weakest kind among them (see ``STRENGTH``); a
    release with no guarantee makes the whole composition carry none.
    """
    gs = list(guarantees)
    if not gs:
        raise ValueError("compose() needs at least one guarantee")
    kinds = {g.kind for g in gs}
    if NONE in kinds:
        return PrivacyGuarantee(NONE, math.inf, notes="a component carries no guarantee")
    kind = max(kinds, key=STRENGTH.index)
    notes = f"sequential composition of {len(gs)} releases"
    if len(kinds) > 1:
        notes += f" of kinds {', '.join(sorted(kinds))}; stated as the weakest, {kind}"
    return PrivacyGuarantee(kind, sum(g.epsilon for g in gs),
                            min(1.0, sum(g.delta for g in gs)), notes=notes)


#: What every output of a seeded run says (reports' metadata, the CLI's privacy line, estimates).
SEEDED_TEXT = ("seeded run: reproducible, not private - whoever knows or guesses the seed can "
               "recompute the noise and remove it (a small integer seed is found by trying "
               "candidates against the reports in well under a second)")


#: The ``kind`` of a seeded run's guarantee: it promises nothing, in every field a program reads.
SEEDED_KIND = "none (seeded: not private)"


def run_guarantee(g: PrivacyGuarantee, *, seeded: bool = False, public: Iterable[str] = (),
                  unit: str | None = None, bounds: Any = None) -> dict:
    """A guarantee as a run states it (``to_dict`` plus what the run changed about it).

    Per what unit it holds (:func:`per_unit`): without a privacy unit the summary ends "per
    record" and says that a person with several records spends it several times; with one it
    names the unit and the bound on its contribution, and epsilon is the unit's (k reports: k
    times epsilon). Public columns copied beside the reports are named (they are not protected).

    ``private`` is True for an unseeded run. A seeded run promises nothing, and says so in every
    machine-readable field: ``kind`` is :data:`SEEDED_KIND`, ``epsilon`` and ``delta`` are None,
    ``private`` is False, ``seeded`` is True and the summary says "seeded" and "not private".
    What the same configuration would guarantee unseeded is kept under ``unseeded`` (``kind``,
    ``epsilon``, ``delta``) and ``unseeded_summary``; :func:`ledger_cost` is what a budget
    ledger records for either.
    """
    g = per_unit(g, unit, bounds)
    d = g.to_dict()
    d["seeded"] = bool(seeded)
    d["unit"] = g.params.get("unit", "record")
    if unit is None:
        d["summary"] += (" per record (no privacy unit declared: a person with several records "
                         "spends it once per record)")
    elif _is_central(g):
        b = ContributionBounds.of(bounds)
        d["summary"] += (f" per privacy unit {unit!r} (at most {b.l0} partition(s) x {b.linf} "
                         "row(s) each)")
    else:
        k = bounds if isinstance(bounds, int) else ContributionBounds.of(bounds).l1
        per = g.params.get("per_record_epsilon")
        d["summary"] += (f" per privacy unit {unit!r} (at most {k} report(s) each"
                         + (f", epsilon={per:g} per report)" if per is not None else ")"))
    public = list(public)
    if public:
        d["public_columns"] = public
        d["summary"] += (f"; the reports also carry the column(s) {', '.join(public)} unprotected "
                         "(declared public)")
    d["private"] = not seeded
    if seeded:
        d["unseeded"] = {"kind": d["kind"], "epsilon": d["epsilon"], "delta": d["delta"]}
        d["unseeded_summary"] = d["summary"]
        d["summary"] = f"{SEEDED_TEXT}; unseeded it would be: {d['summary']}"
        d["kind"], d["epsilon"], d["delta"] = SEEDED_KIND, None, None
    return d


def is_seeded_guarantee(guarantee: Any) -> bool:
    """Whether a run guarantee (a :func:`run_guarantee` dict) is that of a seeded run: ``seeded``
    true, ``private`` false or the seeded kind."""
    if not isinstance(guarantee, dict):
        return False
    return (bool(guarantee.get("seeded")) or guarantee.get("private") is False
            or guarantee.get("kind") == SEEDED_KIND)


def ledger_cost(guarantee: dict) -> tuple[float, float, str]:
    """``(epsilon, delta, kind)`` a budget ledger records for a run with the :func:`run_guarantee`
    ``guarantee``.

    A seeded run is not private, but its reports still came from the data, so it counts against
    the budget conservatively: the epsilon and delta the configuration would guarantee unseeded
    (``guarantee["unseeded"]``), with the kind as stated (:data:`SEEDED_KIND`). An epsilon of
    None (no finite guarantee, seeded or not) is ``math.inf``: such a run never fits a budget."""
    # a seeded guarantee without "unseeded" (not built by run_guarantee) has a null epsilon,
    # recorded as infinite: never less than what the run would have cost
    g = guarantee.get("unseeded") if isinstance(guarantee.get("unseeded"), dict) else guarantee
    eps, delta = g.get("epsilon"), g.get("delta")
    epsilon = math.inf if eps is None else float(eps)
    return epsilon, 0.0 if delta is None else float(delta), str(guarantee.get("kind"))


# =============================================================================== privacy units
# Issue 14: a guarantee says per what unit it holds. A *privacy unit* is a person (a user id, a
# device, a household): neighbouring datasets differ by ALL rows of one unit. Central releases are
# calibrated to contribution bounds that the pipeline enforces *before* the release sees the
# records (as in PipelineDP): each unit keeps at most ``max_partitions_per_unit`` partitions (keys
# of a per-key release; 1 for a single release) and at most ``max_rows_per_partition`` rows in
# each. LDP reports compose over the reports one unit sends. docs/person_level.md has the argument
# per family.

#: the largest contribution bound accepted (each of the two): beyond it the noise of a release
#: (at least 10^6 / epsilon per count) drowns any statistic, and the lattice sensitivities of the
#: exact sampler (ldp_beam.noise) would leave its integer range
MAX_CONTRIBUTION_BOUND = 1_000_000

#: what a guarantee says when no privacy unit is declared
PER_RECORD_TEXT = ("per record only: a person with several records spends it several times "
                   "(r records: up to r times epsilon)")


def check_contribution_bound(value: object, name: str) -> int:
    """A contribution bound: an integer in [1, MAX_CONTRIBUTION_BOUND] (``ParameterError`` naming
    ``name`` otherwise; booleans and floats are refused, even 2.0)."""
    # lazy: numpy costs 90 ms at import (measured); the rest of this module needs none of it
    # (``from ldp_beam import PrivacyGuarantee, compose`` loads no numpy)
    import numpy as np

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or not 1 <= value <= MAX_CONTRIBUTION_BOUND:
        raise ParameterError(name, value, f"an integer in [1, {MAX_CONTRIBUTION_BOUND:,}] (a "
                             "contribution bound per privacy unit)")
    return int(value)


@dataclass(frozen=True)
class ContributionBounds:
    """How much one privacy unit may contribute to a central release, enforced before it.

    ``max_partitions_per_unit`` (L0): the partitions (keys of a per-key release) a unit may touch;
    ``max_rows_per_partition`` (Linf): the rows a unit may keep in each partition. After bounding,
    removing a unit changes the bucket counts of all partitions together by at most
    ``l1 = L0 * Linf`` in L1 norm and any one count by at most ``Linf``. (1, 1) is one row per
    unit: the per-record behaviour of a release calibrated to one record."""

    max_partitions_per_unit: int = 1
    max_rows_per_partition: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_partitions_per_unit", check_contribution_bound(
            self.max_partitions_per_unit, "max_partitions_per_unit"))
        object.__setattr__(self, "max_rows_per_partition", check_contribution_bound(
            self.max_rows_per_partition, "max_rows_per_partition"))

    @property
    def l0(self) -> int:
        return self.max_partitions_per_unit

    @property
    def linf(self) -> int:
        return self.max_rows_per_partition

    @property
    def l1(self) -> int:
        """Rows of one unit over all partitions after bounding: the L1 sensitivity of counts."""
        return self.max_partitions_per_unit * self.max_rows_per_partition

    def to_dict(self) -> dict:
        return {"max_partitions_per_unit": self.max_partitions_per_unit,
                "max_rows_per_partition": self.max_rows_per_partition}

    def describe(self) -> str:
        return (f"at most {self.l0} partition{'s' if self.l0 != 1 else ''} x {self.linf} "
                f"row{'s' if self.linf != 1 else ''} each")

    @classmethod
    def of(cls, bounds: "ContributionBounds | dict | tuple | None") -> "ContributionBounds":
        """Bounds from a ContributionBounds, a dict of the two parameters, a (L0, Linf) pair or
        None ((1, 1))."""
        if bounds is None:
            return cls()
        if isinstance(bounds, cls):
            return bounds
        if isinstance(bounds, dict):
            return cls(**bounds)
        return cls(*bounds)


class UnitBounded:
    """A central release calibrated to contribution bounds per privacy unit: a mixin for a
    dataclass with the fields ``max_partitions_per_unit`` (L0) and ``max_rows_per_partition``
    (Linf), which the pipeline enforces before the release sees a row."""

    @property
    def contribution_bounds(self) -> ContributionBounds:
        """The bounds the release is calibrated to (the pipeline must enforce them)."""
        return ContributionBounds(self.max_partitions_per_unit, self.max_rows_per_partition)

    @property
    def unit_sensitivity(self) -> int:
        """m = L0 x Linf: the rows one unit keeps over all partitions after bounding, the L1
        change of the counts when all of them are removed; 1 for one row per unit (the
        per-record release)."""
        return self.max_partitions_per_unit * self.max_rows_per_partition


def central_unit_params(bounds: ContributionBounds, unit_epsilon: float | None = None) -> dict:
    """The params entries every central release's guarantee carries: the contribution bounds it
    is calibrated to (``contribution_bounds``, ``unit_sensitivity`` = L0 * Linf), the unit it is
    stated for (``"record"`` when the bounds are (1, 1), else ``"privacy unit"``; named by
    :func:`per_unit`) and, where it differs from ``epsilon``, the epsilon per unit."""
    out = {"contribution_bounds": bounds.to_dict(), "unit_sensitivity": bounds.l1,
           "unit": "record" if bounds.l1 == 1 else "privacy unit"}
    if unit_epsilon is not None:
        out["unit_epsilon"] = unit_epsilon
    return out


def central_unit_text(bounds: ContributionBounds) -> str:
    """The sentence a central guarantee's notes carry about its unit."""
    if bounds.l1 == 1:
        return (f" Unit: {PER_RECORD_TEXT}; per privacy unit when the pipeline keeps one row per "
                "unit (max_partitions_per_unit = max_rows_per_partition = 1; ldp_beam.privacy."
                "per_unit).")
    return (f" Unit: per privacy unit ({bounds.describe()}): the noise is calibrated to the L1 "
            f"change {bounds.l1} = L0 x Linf of removing all of one unit's rows, which the "
            "pipeline must enforce before the release (else it is per record only: a unit "
            "with r rows would spend r / (L0 Linf) times epsilon).")


def _is_central(g: PrivacyGuarantee) -> bool:
    return "contribution_bounds" in g.params


def per_unit(g: PrivacyGuarantee, unit: str | None,
             bounds: "ContributionBounds | int | dict | tuple | None" = None) -> PrivacyGuarantee:
    """The guarantee ``g`` of a release (central) or of one report (LDP), stated per ``unit``.

    * ``unit=None``: no privacy unit is declared; the guarantee is per record (per report), and
      says so: a person with several records spends it several times.
    * central releases (``g.params`` has ``contribution_bounds``): ``bounds`` are the
      :class:`ContributionBounds` the pipeline enforced before the release; their L0 x Linf must
      not exceed the ``unit_sensitivity`` the release was calibrated to (``ParameterError``
      otherwise). Epsilon and delta are those of the release (``params["unit_epsilon"]`` where a
      family states a different per-unit epsilon, e.g. OsdpRR with several target items).
    * LDP (any other guarantee): ``bounds`` is the number k of reports one unit may send (an
      int, or ContributionBounds whose L0 x Linf is k). Pure epsilon: exactly k * epsilon; with
      delta > 0 the k-fold composition from ``dp_accounting`` (privacy loss distributions) at
      delta' = k * delta, capped by basic composition (k eps, k delta).

    Returns a new guarantee with ``params["unit"]`` (the unit's name or ``"record"``), the
    bounds, ``per_record_epsilon`` and a sentence in ``notes``.
    """
    params = dict(g.params)
    params["per_record_epsilon"] = None if math.isinf(g.epsilon) else g.epsilon
    if unit is None:
        params["unit"] = "record"
        return PrivacyGuarantee(g.kind, g.epsilon, g.delta, notes=g.notes + f" Per record: "
                                f"{PER_RECORD_TEXT}.", claim=g.claim, params=params)
    if not isinstance(unit, str) or not unit:
        raise ParameterError("unit", unit, "the privacy unit's name (a non-empty string) or None")
    if _is_central(g):
        if bounds is None:
            raise ParameterError("bounds", None, "the ContributionBounds the pipeline enforced "
                                 "before the release (a per-unit statement needs them)")
        if isinstance(bounds, int) and not isinstance(bounds, bool):
            raise ParameterError("bounds", bounds, "ContributionBounds(max_partitions_per_unit, "
                                 "max_rows_per_partition) for a central release")
        b = ContributionBounds.of(bounds)
        calibrated = dict(g.params["contribution_bounds"])
        m = g.params.get("unit_sensitivity")  # the L1 the release's noise covers (None: any)
        if m is not None and b.l1 > m:
            raise ParameterError(
                "bounds", b.to_dict(), f"at most L0 x Linf = {m} rows per unit (the release is "
                f"calibrated to {calibrated}); build the release with these bounds so that its "
                "noise covers them")
        l0 = g.params.get("partitions_per_unit")  # a partition selection's L0 (None: any)
        if l0 is not None and b.l0 > l0:
            raise ParameterError(
                "bounds", b.to_dict(), f"at most {l0} partition(s) per unit (the partition "
                "selection is calibrated to it)")
        eps = float(g.params.get("unit_epsilon", g.epsilon))
        params.update(unit=unit, contribution_bounds=b.to_dict(), calibrated_bounds=calibrated)
        return PrivacyGuarantee(
            g.kind, eps, g.delta, claim=g.claim, params=params,
            notes=g.notes + f" Per privacy unit {unit!r} ({b.describe()}, enforced before the "
                            f"release; all rows of one unit differ between neighbours).")
    if bounds is None:
        raise ParameterError("bounds", None, "the number of reports one unit may send (an "
                             "integer >= 1) for a per-unit statement of an LDP guarantee")
    if isinstance(bounds, (ContributionBounds, dict, tuple)):
        k = ContributionBounds.of(bounds).l1
    else:
        k = check_contribution_bound(bounds, "reports_per_unit")
    params.update(unit=unit, reports_per_unit=k)
    if g.kind == NONE or math.isinf(g.epsilon):
        return PrivacyGuarantee(g.kind, g.epsilon, g.delta, claim=g.claim, params=params,
                                notes=g.notes + f" Per privacy unit {unit!r}: no finite "
                                                f"guarantee ({k} report(s) per unit).")
    if g.delta == 0.0:
        eps, delta, how = k * g.epsilon, 0.0, "exact sum (pure epsilon)"
    else:
        delta = min(1.0, k * g.delta)
        eps, how = compose_epsilon_delta([(g.epsilon, g.delta)] * k, delta)
    params["accounting"] = how
    return PrivacyGuarantee(
        g.kind, eps, delta, claim=g.claim, params=params,
        notes=g.notes + f" Per privacy unit {unit!r}: at most {k} report(s) per unit, composed "
                        f"({how}).")


def compose_epsilon_delta(parts: "Iterable[tuple[float, float]]", delta: float
                          ) -> tuple[float, str]:
    """The epsilon at ``delta`` of the sequential composition of (epsilon_i, delta_i)-DP
    mechanisms, and how it was computed: the exact sum when every delta_i is 0; otherwise
    Google's ``dp_accounting`` privacy loss distributions (each part as the worst case of an
    (epsilon_i, delta_i)-DP mechanism, ``from_privacy_parameters``, pessimistic discretization),
    capped by basic composition (sum of epsilons) when ``delta`` >= the sum of the deltas. An
    upper bound either way."""
    parts = [(float(e), float(d)) for e, d in parts]
    eps_sum = math.fsum(e for e, _ in parts)
    delta_sum = math.fsum(d for _, d in parts)
    if delta_sum == 0.0:
        return eps_sum, "exact sum (pure epsilon)"
    if math.isinf(eps_sum):
        return math.inf, "no finite epsilon"
    # lazy: dp_accounting costs 1.3 s at import (measured); only parts with a delta need it
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    # the ledger's discretization (ldp_beam.ledger): exact for epsilons on the 1e-4 grid, an
    # upper bound (pessimistic rounding) otherwise; coarser for large totals
    interval = max(1e-4, eps_sum / 20000.0)
    total = None
    for e, d in parts:
        if e == 0.0 and d == 0.0:
            continue
        one = pld.from_privacy_parameters(common.DifferentialPrivacyParameters(e, d),
                                          value_discretization_interval=interval)
        total = one if total is None else total.compose(one)
    accounted = float(total.get_epsilon_for_delta(delta))
    how = f"dp_accounting PLD composition at delta={delta:g}"
    if delta_sum <= delta * (1 + 1e-12) and eps_sum < accounted:
        return eps_sum, how + " (capped by basic composition)"
    return accounted, how


def compose_dp(guarantees: Iterable[PrivacyGuarantee], delta: float | None = None
               ) -> PrivacyGuarantee:
    """Sequential composition of releases about the same units: :func:`compose` when every part
    is pure (epsilons add exactly); with any delta > 0 the epsilon at ``delta`` (default: the sum
    of the deltas) from ``dp_accounting`` (:func:`compose_epsilon_delta`)."""
    gs = list(guarantees)
    base = compose(gs)
    if base.kind == NONE or base.delta == 0.0:
        return base
    target = base.delta if delta is None else float(delta)
    eps, how = compose_epsilon_delta([(g.epsilon, g.delta) for g in gs], target)
    return PrivacyGuarantee(base.kind, eps, target, notes=base.notes + f"; {how}",
                            params={"accounting": how})
