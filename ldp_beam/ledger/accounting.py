"""Composition: what a dataset has spent, from its ledger entries (see "Composition" in
:mod:`ldp_beam.ledger`), and the checks of the epsilons, deltas and budgets a run gives. Pure:
no database, no I/O."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import LdpBeamError, ParameterError
from .base import _dumps, _loads


# ------------------------------------------------------------------------------ composition
@dataclass(frozen=True)
class Spent:
    """What a dataset (or one unit, one day) has spent.

    ``epsilon`` holds at ``delta``: the exact sum when every entry is pure, else the
    ``dp_accounting`` PLD composition at the target delta (``method`` says which).
    ``epsilon_sum``/``delta_sum`` are basic composition, for reference. ``entries`` are the runs
    counted (dicts with run_id, command, mechanism, epsilon, delta, status, started)."""

    epsilon: float
    delta: float
    epsilon_sum: float
    delta_sum: float
    runs: int
    pending: int
    method: str
    entries: tuple = field(default=(), repr=False)

    def to_dict(self) -> dict:
        return {"epsilon": _finite(self.epsilon), "delta": self.delta,
                "epsilon_sum": _finite(self.epsilon_sum), "delta_sum": self.delta_sum,
                "runs": self.runs, "pending": self.pending, "method": self.method}


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x


_NOISES = {"gaussian": ("sigma",), "laplace": ("scale",), "eps-delta": ("epsilon", "delta")}


def check_accounting(accounting: Any) -> list[dict] | None:
    """Validate a run's noise description (a list of components; see :func:`compose`)."""
    if accounting is None:
        return None
    comps = [accounting] if isinstance(accounting, Mapping) else list(accounting)
    out = []
    for i, c in enumerate(comps):
        where = f"accounting[{i}]"
        if not isinstance(c, Mapping) or c.get("noise") not in _NOISES:
            raise ParameterError(where, c, "a dict with noise one of " + ", ".join(_NOISES))
        c = dict(c)
        for k in _NOISES[c["noise"]] + ("sensitivity",):
            v = c.get(k, 1.0 if k == "sensitivity" else None)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            lo_ok = ok and (v >= 0 if k in ("epsilon", "delta") else v > 0)
            if not lo_ok or (k == "delta" and v >= 1):
                raise ParameterError(f"{where}.{k}", v, "a finite number > 0" if k not in (
                    "epsilon", "delta") else "a number in [0, 1)" if k == "delta"
                                     else "a finite number >= 0")
            c[k] = float(v)
        count = c.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ParameterError(f"{where}.count", count, "an integer >= 1")
        c["count"] = count
        out.append(c)
    return out


def compose(entries: Sequence[Mapping[str, Any]], delta: float | None = None) -> Spent:
    """Compose ledger entries (each with ``epsilon``, ``delta`` and optionally ``accounting``).

    Pure epsilon (every delta 0): the exact sum. Otherwise ``dp_accounting``'s PLD composition at
    ``delta`` (default: the sum of the entries' deltas), capped by basic composition where that
    holds at ``delta``. An entry's ``accounting`` (a list of ``{"noise": "gaussian", "sigma",
    "sensitivity", "count"}``, ``{"noise": "laplace", "scale", "sensitivity", "count"}`` or
    ``{"noise": "eps-delta", "epsilon", "delta", "count"}``) describes its noise exactly; without
    one, the entry is a generic (epsilon, delta)-DP mechanism."""
    entries = list(entries)
    eps_sum = math.fsum(float(e["epsilon"]) for e in entries)
    delta_sum = min(1.0, math.fsum(float(e["delta"]) for e in entries))
    pending = sum(1 for e in entries if e.get("status") == "pending")
    shown = tuple({k: e.get(k) for k in ("run_id", "command", "mechanism", "epsilon", "delta",
                                         "status", "started", "unit", "seeded")}
                  for e in entries)
    if delta_sum == 0.0:
        return Spent(eps_sum, 0.0, eps_sum, 0.0, len(entries), pending,
                     "exact sum (pure epsilon)", shown)
    target = delta_sum if delta is None else float(delta)
    if math.isinf(eps_sum):
        return Spent(math.inf, target, eps_sum, delta_sum, len(entries), pending,
                     "no finite guarantee", shown)
    pld_eps = _pld_epsilon(entries, target, eps_sum)
    basic = eps_sum if delta_sum <= target else math.inf
    return Spent(min(pld_eps, basic), target, eps_sum, delta_sum, len(entries), pending,
                 f"dp_accounting PLD composition at delta={target:g}"
                 + (" (basic composition is tighter here)" if basic < pld_eps else ""), shown)


def _pld_epsilon(entries: Sequence[Mapping[str, Any]], target: float, eps_sum: float) -> float:
    # lazy: dp_accounting costs 1.1 s at import (measured); only entries with a delta compose
    # through it, and the CLI imports the ledger for every command
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    # One discretisation for every PLD (compose needs it); coarser for large totals so the
    # composed distribution stays small. Pessimistic discretisation: an upper bound whatever it is.
    interval = max(1e-4, eps_sum / 20000.0)
    groups: dict[str, int] = {}
    for e in entries:
        comps = check_accounting(_loads(e["accounting"]) if isinstance(e.get("accounting"), str)
                                 else e.get("accounting"))
        if comps is None:
            comps = [{"noise": "eps-delta", "epsilon": float(e["epsilon"]),
                      "delta": float(e["delta"]), "count": 1}]
        for c in comps:
            if c["noise"] == "eps-delta" and c["epsilon"] == 0 and c["delta"] == 0:
                continue  # a re-publication, a post-processing: no privacy loss
            key = _dumps({k: v for k, v in c.items() if k != "count"})
            groups[key] = groups.get(key, 0) + c["count"]
    if not groups:
        return 0.0
    total = None
    for key, count in sorted(groups.items()):
        c = json.loads(key)
        if c["noise"] == "gaussian":
            one = pld.from_gaussian_mechanism(c["sigma"], sensitivity=c["sensitivity"],
                                              value_discretization_interval=interval)
        elif c["noise"] == "laplace":
            one = pld.from_laplace_mechanism(c["scale"], sensitivity=c["sensitivity"],
                                             value_discretization_interval=interval)
        else:
            one = pld.from_privacy_parameters(
                common.DifferentialPrivacyParameters(c["epsilon"], c["delta"]),
                value_discretization_interval=interval)
        part = one.self_compose(count) if count > 1 else one
        total = part if total is None else total.compose(part)
    return float(total.get_epsilon_for_delta(target))


# ------------------------------------------------------------------------------------ error
class BudgetExceeded(ParameterError):
    """A run would exceed a dataset's budget (or a budget without delta cannot hold a run with
    delta). Raised before any noise is drawn. ``name`` is the parameter to change (``--budget`` or
    ``--budget-delta``), ``value`` its value; ``spent`` the :class:`Spent` so far, ``asked`` the
    run's (epsilon, delta)."""

    def __init__(self, name: str, value: object, message: str, spent: "Spent | None" = None,
                 asked: tuple[float, float] | None = None) -> None:
        self.name, self.value, self.valid = name, value, message
        self.spent, self.asked, self.message = spent, asked, message
        LdpBeamError.__init__(self, message)

    def __reduce__(self):
        return (type(self), (self.name, self.value, self.message, self.spent, self.asked))


# ---------------------------------------------------------------------------- budgets
def _budget_text(eps: float | None, delta: float | None) -> str:
    if eps is None:
        return "none"
    return f"epsilon={eps:g}" + (f" delta={delta:g}" if delta is not None else "")


def _remaining(b_eps: float | None, total: Spent) -> float | None:
    if b_eps is None:
        return None
    return 0.0 if math.isinf(total.epsilon) else max(0.0, b_eps - total.epsilon)


def _check_budget_args(budget: Any, budget_delta: Any, what: str
                       ) -> tuple[float | None, float | None]:
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) \
                or not math.isfinite(budget) or budget < 0:
            raise ParameterError(what, budget, "a finite epsilon >= 0")
        budget = float(budget)
    if budget_delta is not None:
        if isinstance(budget_delta, bool) or not isinstance(budget_delta, (int, float)) \
                or not 0 <= budget_delta < 1:
            raise ParameterError("--budget-delta", budget_delta, "a number in [0, 1)")
        budget_delta = float(budget_delta)
    return budget, budget_delta


def _check_eps_delta(epsilon: Any, delta: Any) -> tuple[float, float]:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
        raise ParameterError("epsilon", epsilon, "a number >= 0 (math.inf for a run without a "
                             "finite guarantee)")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta <= 1:
        raise ParameterError("delta", delta, "a number in [0, 1]")
    return float(epsilon), float(delta)
