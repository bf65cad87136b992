"""Plan before spending (issue 26): the errors a release *will* have, before any data is touched.

:func:`plan` takes a mechanism (a built one, or a registry name and its parameters), the number
of rows or privacy units ``n`` and optionally the sizes of the groups of a per-key release, and
returns a :class:`Plan`: the standard error and CI half-width of every released statistic at
``n`` and in each group, the smallest group that gets a useful answer, and the assumptions the
numbers rest on. It reads no private value, draws no noise on private data and spends nothing:
the only inputs are sizes (:func:`count_input` counts them from a table, reading only the
privacy-unit and group columns) and the mechanism's parameters.

How (docs/plan.md gives the details, the rule and what the numbers mean): synthetic records of
an assumed distribution (:func:`parse_assumption`) are turned into the mechanism's rows and
folded by the family's own estimator (no formula per family: plugins included); ``n0 =
min(max(n, largest group), SIM_MAX)`` records (LDP: at least :data:`LDP_POOL`), and an
accumulator of m > n0 records is copies of the n0 one summed by ``merge`` (by doubling) plus a
prefix. The standard errors are ``finalize``'s (LDP: read on the pool and carried below it by
the power law the estimator shows from the pool to 4x the pool, read at m beyond it) or, for
statistics without one, the SD over ``replicates`` simulated releases (:class:`_Replicates`),
each with its relative precision (``StatPlan.precision``). An answer is useful when its CI
half-width is at most half the width of the range the statistic estimates in (the rule of
``estimate --by``, :meth:`ldp_beam.core.Estimate.uninformative`; a range inferred from the
statistic's kind where it declares none) or within an explicit ``target``; the smallest useful
group is searched by doubling, then bisection to 1%, re-running the estimator at each m. The
simulation's seed is drawn afresh unless given, and recorded in the plan so that it can be
repeated exactly.

Pure numpy (and pyarrow, lazily, for :func:`count_input`): no Beam, no ledger (the command adds
the ledger's state: ``Plan.with_budget``).
"""
from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
import secrets
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from . import registry
from .core import CentralRelease, Configured, Estimate, Estimator
from .errors import LdpBeamError, ParameterError

#: the largest simulation (records drawn, perturbed and folded at once): beyond it, copies
SIM_MAX = 10 ** 6
#: LDP: the estimator's standard errors are read on at least this many synthetic reports (a
#: plug-in variance from a handful of reports is itself noisy, even zero)
LDP_POOL = 100_000
DEFAULT_REPLICATES = 50
#: releases of at most this many synthetic reports are simulated for the replicate standard
#: errors (beyond: extrapolated)
REPLICATE_MAX = 200_000
#: the smallest useful group is searched up to this many rows
SEARCH_MAX = 10 ** 12
#: shown per group at most (more groups: the smallest and the largest, and counts)
SHOWN_GROUPS = 12

#: statistics that describe the estimation rather than the data (never planned)
DIAGNOSTICS = frozenset({
    "grid", "iterations", "converged", "objective", "bandwidth", "smoothing", "method",
    "log_likelihood", "reports_outside", "reports_beyond_grid", "kde_mass_outside", "groups",
    "order", "view", "starts", "planned_error", "epsilon_spent"})
#: statistic names whose range is [0, 1] when the estimator declares none
PROBABILITIES = frozenset({"frequency", "joint", "marginal_x", "marginal_y",
                           "joint_independent", "missing_rate", "cdf", "y_given_x",
                           "x_given_y"})
#: ... [lower, upper]
#: (not the mode: a flat distribution has none, its spread says nothing of a CI)
DATA_UNITS = frozenset({"mean", "median", "quantiles"})
#: ... [0, m] (m: the group's rows)
COUNTS = frozenset({"count", "privacy_id_count", "histogram", "answering_count",
                    "released_records"})
#: ... [m lower, m upper]
SUMS = frozenset({"sum", "sum_raw", "sum_scaled", "sample_sum"})

RULE = ("useful: the {pct} CI half-width is at most half the width of the range the statistic "
        "estimates in (its CI is narrower than that range), the rule `estimate --by` "
        "suppresses groups by")


class PlanError(LdpBeamError, ValueError):
    """A plan that cannot be made as asked (one line naming the option)."""


# --------------------------------------------------------------------------- assumptions
@dataclass(frozen=True)
class RoleAssumption:
    """How one input role's synthetic values are drawn."""

    role: str
    kind: str  # 'labels', 'uniform', 'beta', 'constant', 'discrete'
    labels: tuple[str, ...] = ()
    weights: tuple[float, ...] = ()  # of the labels, or of the values (discrete)
    values: tuple[float, ...] = ()
    lower: float = 0.0
    upper: float = 1.0
    a: float = 1.0
    b: float = 1.0
    value: float = 0.0
    source: str = ""  # where the range comes from

    def draw(self, n: int, g: np.random.Generator) -> np.ndarray:
        if self.kind == "labels":
            codes = g.choice(len(self.labels), size=n, p=np.asarray(self.weights))
            return np.asarray(self.labels, dtype=object)[codes]
        if self.kind == "constant":
            return np.full(n, self.value)
        if self.kind == "discrete":
            return np.asarray(self.values)[g.choice(len(self.values), size=n,
                                                     p=np.asarray(self.weights))]
        if self.kind == "beta":
            return self.lower + (self.upper - self.lower) * g.beta(self.a, self.b, n)
        x = g.uniform(self.lower, self.upper, n)
        return np.minimum(x, self.upper)

    def describe(self) -> str:
        if self.kind == "labels":
            k = len(self.labels)
            w = np.asarray(self.weights)
            if np.allclose(w, 1.0 / k):
                return f"{self.role}: uniform over its {k} declared labels"
            shown = ", ".join(f"{lab}={p:.3g}" for lab, p in zip(self.labels[:8], w[:8]))
            return f"{self.role}: labels with frequencies {shown}" + (" ..." if k > 8 else "")
        span = f"[{self.lower:g}, {self.upper:g}]{self.source}"
        if self.kind == "constant":
            return f"{self.role}: every value {self.value:g}"
        if self.kind == "discrete":
            return f"{self.role}: " + ", ".join(f"{v:g} with frequency {w:.3g}"
                                                  for v, w in zip(self.values, self.weights))
        if self.kind == "beta":
            mean = self.lower + (self.upper - self.lower) * self.a / (self.a + self.b)
            var = self.a * self.b / ((self.a + self.b) ** 2 * (self.a + self.b + 1))
            sd = (self.upper - self.lower) * math.sqrt(var)
            return (f"{self.role}: Beta({self.a:.3g}, {self.b:.3g}) on {span}: mean {mean:g}, "
                    f"sd {sd:.3g}")
        return f"{self.role}: uniform on {span}"

    def to_dict(self) -> dict:
        d = {"role": self.role, "kind": self.kind, "describe": self.describe()}
        if self.kind == "labels":
            d["frequencies"] = dict(zip(self.labels, self.weights))
        elif self.kind == "discrete":
            d["frequencies"] = {f"{v:g}": w for v, w in zip(self.values, self.weights)}
        else:
            d["range"] = [self.lower, self.upper]
        return d


_RANGE = re.compile(r"[\[(]\s*(lower|[-+0-9.eE]+)\s*,\s*(upper|[-+0-9.eE]+)\s*[\])]")


def _labels_of(mech: Configured, role: Any) -> tuple[str, ...]:
    try:
        return tuple(mech.labels(role.name) or ())
    except (NotImplementedError, TypeError, KeyError):
        return ()


def _numeric_range(mech: Configured, role: Any, first: bool) -> tuple[float, float, str]:
    """The range a numeric role's values are declared in: the ``[lower, upper]`` or ``[a, b]``
    its help names (a mechanism's roles say it), else the mechanism's bounds for its first
    role, else [0, 1] (said in the output)."""
    lo, hi = getattr(mech, "lower", None), getattr(mech, "upper", None)
    bounds = lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi) \
        and lo < hi
    m = _RANGE.search(role.help or "")
    if m:
        ends = [_end(tok, lo, hi, bounds) for tok in m.groups()]
        if None not in ends and ends[0] < ends[1]:
            return ends[0], ends[1], ""
    if bounds and first:
        return float(lo), float(hi), ""
    return 0.0, 1.0, " (no declared range; --assume to change it)"


def _end(tok: str, lo: Any, hi: Any, bounds: bool) -> float | None:
    if tok in ("lower", "upper"):
        return None if not bounds else float(lo if tok == "lower" else hi)
    try:
        return float(tok)
    except ValueError:
        return None


def parse_assumption(mech: Configured, assume: Any = None) -> tuple[RoleAssumption, ...]:
    """The synthetic distribution of every required role of ``mech``.

    ``assume``: None (uniform over each declared domain), one spec for the first required role,
    or a mapping role -> spec. A spec is text or a mapping:

    * category roles: label frequencies, ``"a=0.5,b=0.3"`` or ``{"a": 0.5, "b": 0.3}``
      (unlisted labels share the rest equally; weights summing to more than 1 are normalized
      when every label is listed);
    * numeric roles: ``"uniform"``; ``"mean=M"`` (a Beta on the role's range with that mean and
      the uniform's concentration, a + b = 2); ``"mean=M,sd=S"`` (the Beta with that mean and
      standard deviation); ``"constant=V"`` (every value V); value frequencies
      ``"0=0.7,1=0.3"`` (a discrete distribution, e.g. a 0/1 answer or sensitivity levels
      where 0 means not sensitive).

    Roles are drawn independently (joint mechanisms: x and y independent). Optional roles are
    left out (e.g. a preference: every user answers)."""
    required = [r for r in mech.roles if r.required]
    names = [r.name for r in required]
    if assume is None or (isinstance(assume, str) and not assume.strip()):
        per: dict[str, Any] = {}
    elif isinstance(assume, Mapping) and assume and all(k in names for k in assume):
        per = dict(assume)
    elif isinstance(assume, Mapping) and assume and any(k in {r.name for r in mech.roles}
                                                        for k in assume):
        bad = [k for k in assume if k not in names]
        raise ParameterError("assume", dict(assume), f"specs for the required roles {names} "
                             f"(not for {bad})")
    else:
        per = {names[0]: assume} if names else {}
    out = []
    for i, role in enumerate(required):
        spec = per.get(role.name)
        labels = _labels_of(mech, role)
        if labels:
            out.append(_label_assumption(role.name, labels, spec))
        else:
            lo, hi, src = _numeric_range(mech, role, i == 0)
            out.append(_numeric_assumption(role.name, lo, hi, src, spec))
    return tuple(out)


def _spec_items(spec: Any, name: str) -> dict[str, Any]:
    if isinstance(spec, Mapping):
        return dict(spec)
    if not isinstance(spec, str):
        raise ParameterError("assume", spec, f"text or a mapping for role {name!r}")
    items: dict[str, Any] = {}
    for part in filter(None, (x.strip() for x in spec.split(","))):
        k, eq, v = part.partition("=")
        items[k.strip()] = v.strip() if eq else None
    return items


def _uniform(spec: Any) -> bool:
    return spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "uniform"))


def _number(v: Any, what: str) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ParameterError("assume", v, f"a number for {what}") from None
    if not math.isfinite(x):
        raise ParameterError("assume", v, f"a finite number for {what}")
    return x


def _label_assumption(role: str, labels: tuple[str, ...], spec: Any) -> RoleAssumption:
    k = len(labels)
    if _uniform(spec):
        return RoleAssumption(role, "labels", labels, tuple([1.0 / k] * k))
    items = _spec_items(spec, role)
    given: dict[str, float] = {}
    for lab, w in items.items():
        lab = str(lab)
        if lab not in labels:
            raise ParameterError("assume", f"{role}:{lab}", f"a label of {role}'s declared "
                                 f"domain {list(labels[:12])}")
        x = _number(w, f"the frequency of {lab!r}")
        if x < 0:
            raise ParameterError("assume", f"{role}:{lab}={w}", "a frequency >= 0")
        given[lab] = x
    total = sum(given.values())
    rest = [lab for lab in labels if lab not in given]
    if rest:
        if total > 1 + 1e-9:
            raise ParameterError("assume", spec, f"frequencies summing to at most 1 when some "
                                 f"labels are not listed (they sum to {total:g})")
        share = max(1.0 - total, 0.0) / len(rest)
        w = [given.get(lab, share) for lab in labels]
    else:
        w = [given[lab] for lab in labels]
    s = sum(w)
    if s <= 0:
        raise ParameterError("assume", spec, "frequencies with a positive sum")
    return RoleAssumption(role, "labels", labels, tuple(x / s for x in w))


def _numeric_assumption(role: str, lo: float, hi: float, src: str, spec: Any
                        ) -> RoleAssumption:
    base = RoleAssumption(role, "uniform", lower=lo, upper=hi, source=src)
    if _uniform(spec):
        return base
    items = _spec_items(spec, role)
    keys = set(items)
    if keys == {"uniform"}:
        return base
    if keys == {"constant"}:
        v = _number(items["constant"], "constant")
        if not lo <= v <= hi:
            raise ParameterError("assume", spec, f"a value in {role}'s range [{lo:g}, {hi:g}]")
        return dataclasses.replace(base, kind="constant", value=v)
    if keys in ({"mean"}, {"mean", "sd"}):
        mean = _number(items["mean"], "mean")
        w = hi - lo
        m = (mean - lo) / w
        if not 0 < m < 1:
            raise ParameterError("assume", spec, f"a mean strictly inside {role}'s range "
                                 f"[{lo:g}, {hi:g}] (at a bound: constant=V)")
        if "sd" not in items:
            return dataclasses.replace(base, kind="beta", a=2 * m, b=2 * (1 - m))
        sd = _number(items["sd"], "sd") / w
        top = math.sqrt(m * (1 - m))
        if not 0 < sd < top:
            raise ParameterError("assume", spec, f"an sd in (0, {top * w:.4g}): the largest a "
                                 f"distribution on [{lo:g}, {hi:g}] with mean {mean:g} can have")
        c = m * (1 - m) / (sd * sd) - 1
        return dataclasses.replace(base, kind="beta", a=m * c, b=(1 - m) * c)
    numbers = {}
    for k, w in items.items():
        try:
            v = float(k)
        except (TypeError, ValueError):
            numbers = None
            break
        numbers[v] = _number(w, f"the frequency of {k}")
    if numbers:
        if any(w < 0 for w in numbers.values()) or sum(numbers.values()) <= 0:
            raise ParameterError("assume", spec, "frequencies >= 0 with a positive sum")
        if not src and any(not lo <= v <= hi for v in numbers):
            raise ParameterError("assume", spec, f"values in {role}'s range [{lo:g}, {hi:g}]")
        total = sum(numbers.values())
        return dataclasses.replace(base, kind="discrete", values=tuple(numbers),
                                   weights=tuple(w / total for w in numbers.values()))
    raise ParameterError("assume", spec, f"for the numeric role {role!r}: uniform, mean=M, "
                         "mean=M,sd=S, constant=V or value frequencies V=P,V=P")


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class StatPlan:
    """One statistic at one size: its standard error (the largest over its cells), the CI
    half-width, where they come from, the usefulness rule and the smallest useful size."""

    name: str
    cells: int
    stderr: float | None
    half_width: float | None
    source: str
    range_text: str | None = None
    limit: float | None = None  # the largest useful half-width at this size
    useful: bool | None = None
    min_useful: int | None = None
    min_note: str = ""
    stderr_cells: list | None = None
    #: the relative standard error of a simulated stderr, per cell (None: the estimator's own)
    precision: list | None = None

    def to_dict(self) -> dict:
        d = {"cells": self.cells, "stderr": _finite(self.stderr),
             "half_width": _finite(self.half_width), "source": self.source,
             "range": self.range_text, "useful_half_width": _finite(self.limit),
             "useful": self.useful, "smallest_useful_group": self.min_useful}
        if self.min_note:
            d["smallest_useful_note"] = self.min_note
        if self.stderr_cells is not None:
            d["stderr_cells"] = [_finite(x) for x in self.stderr_cells]
        if self.precision is not None:
            d["stderr_relative_precision"] = [_finite(x) for x in self.precision]
        return d


@dataclass(frozen=True)
class GroupPlan:
    key: str | None
    n: int
    statistics: dict[str, StatPlan]
    useful: bool | None

    def to_dict(self) -> dict:
        return {"key": self.key, "n": self.n, "useful": self.useful,
                "statistics": {k: {"stderr": _finite(s.stderr),
                                   "half_width": _finite(s.half_width), "useful": s.useful}
                               for k, s in self.statistics.items()}}


@dataclass(frozen=True)
class Plan:
    """What a release of ``mechanism`` on ``n`` rows (and per group) will look like."""

    mechanism: str
    describe: str
    params: dict
    guarantee: dict
    central: bool
    n: int
    level: float
    z: float
    assumptions: tuple[RoleAssumption, ...]
    statistics: dict[str, StatPlan]
    min_useful: int | None
    simulation: dict
    notes: tuple[str, ...] = ()
    groups: tuple[GroupPlan, ...] | None = None
    groups_summary: dict | None = None
    counted: dict | None = None  # what count_input read (the command's)
    budget: dict | None = None  # the ledger's state (the command's)

    def with_budget(self, budget: dict | None) -> "Plan":
        return dataclasses.replace(self, budget=budget)

    def with_counted(self, counted: dict | None) -> "Plan":
        return dataclasses.replace(self, counted=counted)

    def to_dict(self) -> dict:
        out = {"mechanism": self.mechanism, "params": _jsonable(self.params),
               "guarantee": self.guarantee, "release": "central" if self.central else "local",
               "n": self.n, "level": self.level, "z": self.z,
               "assumption": [a.to_dict() for a in self.assumptions],
               "rule": RULE.format(pct=f"{self.level:.0%}"),
               "statistics": {k: s.to_dict() for k, s in self.statistics.items()},
               "smallest_useful_group": self.min_useful,
               "simulation": self.simulation, "notes": list(self.notes)}
        if self.groups is not None:
            out["groups"] = {"summary": self.groups_summary,
                             "shown": [g.to_dict() for g in self.groups]}
        out.update((k, v) for k, v in (("counted", self.counted), ("budget", self.budget))
                   if v is not None)
        return out

    def summary(self) -> str:
        """A short text report: the table of statistics, the smallest useful group, the groups,
        the assumption and the budget."""
        pct = f"{self.level:.0%}"
        g = self.guarantee.get("summary", "")
        lines = [f"plan: {self.describe}",
                 f"  {'central release' if self.central else 'local (LDP) reports'}; {g}"]
        if self.counted:
            rows = self.counted.get("rows")
            lines.append(f"  n = {self.n:,} {self.counted.get('what', 'rows')}"
                         + (f" (of {rows:,} rows)" if rows is not None else "")
                         + (f" in {self.counted['input']}" if self.counted.get("input")
                            else ""))
        else:
            lines.append(f"  n = {self.n:,}")
        lines.append("  assumed data (synthetic; never yours): "
                     + "; ".join(a.describe() for a in self.assumptions))
        rows = [("statistic", "cells", "stderr", f"{pct} CI +-", "useful if +- <=", "range",
                 "smallest useful n")]
        for s in self.statistics.values():
            mark = "*" if s.precision is not None else ""
            rows.append((s.name, str(s.cells), _fmt(s.stderr) + mark, _fmt(s.half_width) + mark,
                         _fmt(s.limit) if s.limit is not None else "-",
                         s.range_text or "no rule",
                         ((s.min_note or "never") if s.min_useful is None else f"{s.min_useful:,}")
                         if s.range_text else "-"))
        lines.append("")
        lines += ["  " + line for line in _table(rows)]
        lines.append("")
        for src in sorted({s.source for s in self.statistics.values()}):
            names = [s.name for s in self.statistics.values() if s.source == src]
            lines.append(f"  stderr of {', '.join(names)}: {src}")
        lines.append("  cells > 1: the largest stderr over the cells"
                     + ("; * simulated: the release has no stderr for it"
                        if any(s.precision is not None for s in self.statistics.values())
                        else ""))
        lines.append("  rule: " + RULE.format(pct=pct)
                     + ("; target: at most the given half-width"
                        if any((s.range_text or "").startswith("target")
                               for s in self.statistics.values()) else ""))
        unit = "rows" if self.central else "reports"
        if self.min_useful is not None:
            one = unit[:-1] if self.min_useful == 1 else unit
            lines.append(f"smallest group with a useful answer: about {self.min_useful:,} "
                         f"{one} (where every statistic judged by the rule is useful)")
        elif any(s.range_text for s in self.statistics.values()):
            lines.append(f"smallest group with a useful answer: none up to {SEARCH_MAX:,} "
                         f"{unit}")
        else:
            lines.append("smallest group with a useful answer: no statistic of this release "
                         "has a stderr and a range to judge it by (give a target half-width)")
        if self.groups is not None:
            lines.append("")
            gs = self.groups_summary or {}
            head = f"groups{' (' + gs['by'] + ')' if gs.get('by') else ''}: {gs.get('count', 0):,}"
            if not any(s.range_text for s in self.statistics.values()):
                lines.append(head + " (none judged: no statistic with a stderr and a range)")
            else:
                lines.append(head + f", of which {gs.get('useful', 0):,} get a useful answer "
                             f"and {gs.get('not_useful', 0):,} do not"
                             + (f" (judged by size >= {self.min_useful:,})"
                                if gs.get("by_size") and self.min_useful is not None else ""))
            names = [k for k, s in self.statistics.items() if s.stderr is not None][:4]
            grows = [("group", "n", *[f"{k} +-" for k in names], "useful")]
            for gp in self.groups:
                grows.append((str(gp.key) if gp.key is not None else "-", f"{gp.n:,}",
                              *[_fmt(gp.statistics[k].half_width) if k in gp.statistics
                                else "-" for k in names],
                              {True: "yes", False: "no", None: "-"}[gp.useful]))
            lines += ["  " + line for line in _table(grows)]
            if gs.get("count", 0) > len(self.groups):
                lines.append(f"  ({len(self.groups)} of {gs['count']:,} groups shown: the "
                             "smallest and the largest)")
        for note in self.notes:
            lines.append("note: " + note)
        if self.budget is not None:
            lines.append(self.budget.get("line", ""))
        lines.append(f"simulation seed {self.simulation.get('seed')} (--seed repeats this plan "
                     "exactly); nothing was spent: no private value was read and no noise was "
                     "drawn on the data")
        return "\n".join(lines)


def _table(rows: list[tuple]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        cells = [c.ljust(w) if i == 0 or (i >= len(r) - 2 and j == 0) else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.4g}"


def _finite(x: Any) -> Any:
    if x is None:
        return None
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# --------------------------------------------------------------------------- the simulation
class Simulation:
    """Synthetic records of the assumed distribution, folded by the family's estimator: the
    accumulator at any size and its release (cached)."""

    def __init__(self, mech: Configured, est: Estimator, assumptions: tuple[RoleAssumption, ...],
                 pool: int, seed: int, make_estimator: Callable[[int | None], Estimator]
                 ) -> None:
        self.mech, self.est, self.assumptions, self.seed = mech, est, assumptions, seed
        self.make_estimator = make_estimator
        self.pool = max(int(pool), 1)
        self.reports = self.records(self.pool, np.random.default_rng([seed, 0]))
        self._acc_pool: np.ndarray | None = None
        self._cache: dict[int, Any] = {}

    def records(self, n: int, g: np.random.Generator) -> dict[str, np.ndarray]:
        """n synthetic records, checked and encoded as the mechanism's rows (reports)."""
        cols = {a.role: a.draw(n, g) for a in self.assumptions}
        checked, reasons = self.mech.check(cols)
        if reasons.bad.any():
            i = int(np.flatnonzero(reasons.bad)[0])
            raise ParameterError(
                "assume", "; ".join(a.describe() for a in self.assumptions),
                f"synthetic values {self.mech.name} accepts",
                f"e.g. {reasons.as_dict().get(i, '')}; give the assumption with values it "
                "accepts, e.g. value frequencies 0=0.5,1=0.5")
        u = np.asfortranarray(g.random((n, int(self.mech.draws))))
        return self.mech.rows(checked, u)

    def prefix(self, m: int) -> np.ndarray:
        rep = {k: v[:m] for k, v in self.reports.items()}
        return self.est.add(self.est.create(), rep)

    def acc(self, m: int) -> np.ndarray:
        """The accumulator of m records of the assumed distribution."""
        if m <= self.pool:
            return self.prefix(m)
        if self._acc_pool is None:
            self._acc_pool = self.prefix(self.pool)
        q, r = divmod(m, self.pool)
        total, power = None, self._acc_pool
        while q:
            if q & 1:
                total = power if total is None else self.est.merge([total, power])
            q >>= 1
            if q:
                power = self.est.merge([power, power])
        if r:
            total = self.est.merge([total, self.prefix(r)])
        return total

    def release(self, m: int) -> Estimate | None:
        """finalize at m records (None when the estimator cannot estimate from m)."""
        if m in self._cache:
            return self._cache[m]
        try:
            out = self.est.finalize(self.acc(m)) if m > 0 else None
        except (LdpBeamError, ValueError, ZeroDivisionError, FloatingPointError):
            out = None
        self._cache[m] = out
        return out


def _stderr_cells(st: Any) -> np.ndarray | None:
    if st is None or st.stderr is None or st.value is None:
        return None
    try:
        se = np.asarray(st.stderr, dtype=float)
    except (TypeError, ValueError):
        return None
    return se.reshape(-1) if se.size else None


def _numeric_value(st: Any) -> np.ndarray | None:
    if st is None or st.value is None:
        return None
    try:
        v = np.asarray(st.value)
    except (TypeError, ValueError):
        return None
    if v.dtype.kind not in "iuf" or v.size == 0:
        return None
    return v.astype(float).reshape(-1)


def _worst(se: np.ndarray | None) -> float | None:
    if se is None or se.size == 0 or np.isnan(se).all():
        return None
    return float(np.nanmax(se))


# --------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class _Range:
    """The range a statistic estimates in (its width may grow with the group's size m)."""

    text: str
    width: Callable[[int], float]
    absolute: bool = True  # a declared/probability/data range (a bare --target applies)


def _range_of(name: str, st: Any, mech: Configured) -> _Range | None:
    dom = getattr(st, "domain", None)
    if dom is not None:
        lo, hi = float(dom[0]), float(dom[1])
        return _Range(f"[{lo:g}, {hi:g}] declared", lambda m, w=hi - lo: w)
    lo, hi = getattr(mech, "lower", None), getattr(mech, "upper", None)
    bounds = isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi
    if name in PROBABILITIES:
        return _Range("[0, 1] (a probability)", lambda m: 1.0)
    if bounds and name in DATA_UNITS:
        return _Range(f"[{lo:g}, {hi:g}] (lower, upper)", lambda m, w=hi - lo: w)
    if bounds and name == "std":
        return _Range(f"[0, {(hi - lo) / 2:g}] (an sd)", lambda m, w=(hi - lo) / 2: w)
    if bounds and name == "variance":
        return _Range(f"[0, {(hi - lo) ** 2 / 4:g}] (a variance)",
                      lambda m, w=(hi - lo) ** 2 / 4: w)
    if name in COUNTS:
        return _Range("[0, n] (a count)", lambda m: float(m), absolute=False)
    if bounds and name in SUMS:
        return _Range(f"[{lo:g} n, {hi:g} n] (a sum)", lambda m, w=hi - lo: m * w,
                      absolute=False)
    return None


def _target_for(name: str, rng: _Range | None, target: Any) -> float | None:
    if target is None:
        return None
    if isinstance(target, Mapping):
        return None if name not in target else float(target[name])
    return float(target) if rng is None or rng.absolute else None


def _search_min(ok: Callable[[int], bool | None], start: int) -> tuple[int | None, str]:
    """The smallest m with ok(m) (assumed monotone), to within 1%: doubling or halving from
    ``start``, then bisection."""
    start = max(int(start), 1)
    if ok(start):
        hi = start
        lo = hi // 2
        while lo >= 1 and ok(lo):
            hi, lo = lo, lo // 2
        if lo < 1:
            return 1, ""
    else:
        lo = start
        hi = start * 2
        while hi <= SEARCH_MAX and not ok(hi):
            lo, hi = hi, hi * 2
        if hi > SEARCH_MAX:
            return None, f"none up to {SEARCH_MAX:.0e}"
    while hi - lo > max(1, hi // 100):
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi, ""


# --------------------------------------------------------------------------- plan()
def plan(mechanism: Any, n: int | None = None, *, groups: Any = None, assume: Any = None,
         level: float = 0.95, params: Mapping[str, Any] | None = None,
         options: Mapping[str, Any] | None = None, target: Any = None,
         replicates: int = DEFAULT_REPLICATES, seed: int | None = None,
         allow_no_guarantee: bool = False, by: str | None = None) -> Plan:
    """Plan a release: the standard error and CI half-width of each statistic ``mechanism``
    releases from ``n`` rows (or privacy units), per group of ``groups``, and the smallest
    useful group (module docstring: how). Touches no data, draws no noise on data, spends
    nothing.

    ``mechanism``: a built :class:`~ldp_beam.core.Mechanism` or
    :class:`~ldp_beam.core.CentralRelease`, or a registry name with ``params``.
    ``n``: rows or units (default: the sum of ``groups``). ``groups``: sizes of a per-key
    release, a sequence of integers or a mapping key -> size. ``assume``: the synthetic
    distribution (:func:`parse_assumption`). ``level``: of the confidence intervals.
    ``options``: estimator options. ``target``: an absolute CI half-width instead of the range
    rule, a number (for every statistic with a declared, probability or data-unit range) or a
    mapping statistic -> half-width. ``replicates``: simulated releases for the statistics whose
    estimator gives no standard error. ``seed``: of the simulation (synthetic data and the
    noise of central releases on it; never private data); None draws one from OS entropy,
    which the plan records (``Plan.simulation["seed"]``, printed) so that it can be repeated.
    ``by``: the grouping column's name, for the output."""
    reg = registry.get_registry()
    if isinstance(mechanism, str):
        mech = reg.build(mechanism, dict(params or {}), allow_no_guarantee=allow_no_guarantee)
    elif isinstance(mechanism, Configured):
        if params:
            raise ParameterError("params", params, "None with a built mechanism (its "
                                 "parameters are fixed)")
        mech = mechanism
    else:
        raise ParameterError("mechanism", mechanism, "a registry name or a built mechanism")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ParameterError("level", level, "a confidence level in (0, 1)")
    if isinstance(replicates, bool) or not isinstance(replicates, int) or replicates < 2:
        raise ParameterError("replicates", replicates, "an integer >= 2")
    keyed = _group_sizes(groups)
    if n is None:
        if not keyed:
            raise ParameterError("n", n, "the number of rows or privacy units (or groups)")
        n = sum(s for _, s in keyed)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ParameterError("n", n, "an integer >= 1 (rows or privacy units)")
    n = int(n)
    if target is not None:
        items = target.values() if isinstance(target, Mapping) else [target]
        for t in items:
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0 \
                    or not math.isfinite(t):
                raise ParameterError("target", target, "a CI half-width > 0 (or a mapping "
                                     "statistic -> half-width)")
    if seed is None:
        seed = secrets.randbits(63)
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ParameterError("seed", seed, "None or an integer >= 0")
    seed = int(seed)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    central = isinstance(mech, CentralRelease)
    opts = dict(options or {})

    def make_estimator(s: int | None) -> Estimator:
        if central and s is not None and "seed" not in opts:
            try:
                return reg.estimator_for(mech, **opts, seed=s)
            except (TypeError, ParameterError):
                pass  # a plugin's estimator without a seed option: OS-entropy noise
        return reg.estimator_for(mech, **opts)

    est = make_estimator(seed)
    assumptions = parse_assumption(mech, assume)
    biggest = max([n] + [s for _, s in keyed])
    pool = min(max(biggest, 1 if central else LDP_POOL), SIM_MAX)
    sim = Simulation(mech, est, assumptions, pool, seed, make_estimator)
    # the statistics released (LDP: as released from the pool, which any estimator can
    # estimate from; a central release at n itself)
    at = n if central else sim.pool
    base = sim.release(at)
    if base is None:
        raise PlanError(f"{mech.name}: the estimator cannot estimate from {at:,} synthetic "
                        "records of the assumed distribution")

    # which statistics, and where their standard errors come from
    direct: list[str] = []
    simulated: list[str] = []
    for name, st in base.statistics.items():
        if name in DIAGNOSTICS or _numeric_value(st) is None:
            continue
        (direct if _stderr_cells(st) is not None else simulated).append(name)
    rep = _Replicates(sim, simulated, replicates, central, seed, n) if simulated else None
    ranges = {name: _range_of(name, base.statistics[name], mech) for name in direct + simulated}

    # LDP: the estimator's stderr on the pool and the power law it follows from the pool to 4x
    # the pool (exact copies: the same proportions), carrying it to smaller sizes
    law: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if not central:
        big = sim.release(4 * sim.pool)
        ref = sim.release(sim.pool)
        for name in direct:
            se0 = _stderr_cells(ref.statistics.get(name)) if ref is not None else None
            se4 = _stderr_cells(big.statistics.get(name)) if big is not None else None
            if se0 is None or se4 is None or se0.size != se4.size:
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                alpha = np.log(se4 / se0) / math.log(4)
            law[name] = (se0, np.where(np.isfinite(alpha), alpha, -0.5))

    def se_cells(name: str, m: int) -> np.ndarray | None:
        if name in simulated:
            return rep.estimate(name, m)[0] if rep is not None else None
        if name in law and m < sim.pool:
            se0, alpha = law[name]
            return se0 * (m / sim.pool) ** alpha
        e = sim.release(m)
        return None if e is None or name not in e.statistics else \
            _stderr_cells(e.statistics[name])

    def direct_source(name: str) -> str:
        if name not in law:
            return "the estimator's own stderr at this size (finalize on synthetic records)"
        alpha = float(np.median(law[name][1]))
        return (f"the estimator's own stderr (finalize on {sim.pool:,} synthetic reports; "
                f"at n reports x (n / {sim.pool:,})^{alpha:.3g}, the power law the estimator "
                f"follows from {sim.pool:,} to {4 * sim.pool:,})")

    def limit(name: str, m: int) -> float | None:
        t = _target_for(name, ranges[name], target)
        if t is not None:
            return t
        r = ranges[name]
        # no stderr in the release: no CI is published to judge (only an explicit target)
        return None if r is None or name in simulated else r.width(m) / 2

    def stat_at(name: str, m: int, with_min: bool) -> StatPlan | None:
        se = se_cells(name, m)
        worst = _worst(se)
        if name in simulated and worst is None:
            return None
        hw = None if worst is None else z * worst
        lim = limit(name, m)
        useful = None if lim is None else (hw is not None and hw <= lim)
        r = ranges[name]
        t = _target_for(name, r, target)
        rtext = (f"target +-{t:g}" if t is not None else
                 (None if r is None or name in simulated else r.text))
        mn, note = None, ""
        if with_min and lim is not None:
            def ok(mm: int, name: str = name) -> bool:
                s = _worst(se_cells(name, mm))
                lm = limit(name, mm)
                return s is not None and lm is not None and z * s <= lm
            mn, note = _search_min(ok, m)
        src = direct_source(name) if name not in simulated else rep.source
        prec = None
        if name in simulated:
            rel = rep.estimate(name, m)[1]
            prec = None if rel is None else [float(x) for x in np.asarray(rel).reshape(-1)]
        return StatPlan(name, int(se.size) if se is not None else 0, worst, hw, src, rtext,
                        lim, useful, mn, note,
                        None if se is None or se.size == 1 else [float(x) for x in se], prec)

    stats = {name: sp for name in direct + simulated
             if (sp := stat_at(name, n, True)) is not None}
    mins = [s.min_useful for s in stats.values() if s.range_text]
    min_useful = None if not mins or any(x is None for x in mins) else max(mins)

    groups_out, summary = None, None
    if keyed:
        shown = _shown(keyed)
        gplans = []
        for key, size in shown:
            gstats = {name: sp for name in stats
                      if size > 0 and (sp := stat_at(name, size, False)) is not None}
            flags = [s.useful for s in gstats.values() if s.range_text]
            useful = (all(flags) if flags else None) if size > 0 else False
            gplans.append(GroupPlan(key, size, gstats, useful))
        by_size = len(shown) < len(keyed)
        ruled = any(s.range_text for s in stats.values())
        if not ruled:
            n_useful, n_not = 0, 0
        elif by_size:  # judged by size against the smallest useful group (monotone)
            n_useful = 0 if min_useful is None else sum(s >= min_useful for _, s in keyed)
            n_not = len(keyed) - n_useful
        else:
            n_useful = sum(1 for g in gplans if g.useful)
            n_not = sum(1 for g in gplans if g.useful is False)
        summary = {"count": len(keyed), "useful": int(n_useful), "not_useful": int(n_not),
                   "by_size": by_size, "smallest": min(s for _, s in keyed),
                   "largest": max(s for _, s in keyed), "by": by}
        groups_out = tuple(gplans)

    notes = [
        "the assumed distribution is synthetic: " + (
            "a central release's noise does not depend on it (grouping histograms' grouping "
            "does)" if central else
            "LDP errors depend on it weakly (frequencies: through the report frequencies); "
            "--assume to plan for another"),
        ("central standard errors are the noise's only (the rows are fixed)" if central else
         "LDP standard errors include the sampling of the people (the error against the "
         "population they are drawn from)")]
    if simulated and stats.keys() & set(simulated):
        notes.append(
            f"{', '.join(k for k in simulated if k in stats)}: no standard error in the release "
            "(no CI is published): their spread over simulated releases is shown for "
            "orientation and does not enter the smallest useful group unless a target is "
            "given (an estimator that shrinks, as EM and KDE do towards a flat density, can "
            "have a small spread with few reports without being accurate)")
    if central and getattr(mech, "contribution_bounds", None) is not None:
        notes.append("per privacy unit, the noise is calibrated to the mechanism's contribution "
                     f"bounds ({mech.contribution_bounds.describe()}); n counts the rows kept")
    simulation = {"n0": sim.pool, "seed": seed, "copies_beyond_n0": biggest > sim.pool,
                  "replicates": None if rep is None else rep.count,
                  "replicate_sizes": None if rep is None else rep.points}
    return Plan(mech.name, mech.describe(), _jsonable(mech.params()), mech.guarantee.to_dict(),
                central, n, float(level), z, assumptions, stats, min_useful, simulation,
                tuple(notes), groups_out, summary)


class _Replicates:
    """Standard errors of statistics the estimator gives none for: the standard deviation over
    ``count`` simulated releases. LDP: fresh synthetic records and reports each time, at the
    sizes of a grid (the plan's n times powers of 4 within [2, :data:`REPLICATE_MAX`], each
    simulated once), log-log interpolated between the two around m, extrapolated beyond with
    the top segment's slope clamped between flat and 1/sqrt(n) (an estimator's error never
    falls faster than the parametric rate; RVNS's tail quantiles measurably fall slower).
    Central: fresh release noise on the accumulator at m (computed per m)."""

    def __init__(self, sim: Simulation, names: list[str], count: int, central: bool,
                 seed: int, n: int) -> None:
        self.sim, self.names, self.count, self.central, self.seed = \
            sim, names, count, central, seed
        self._sd: dict[int, dict[str, np.ndarray]] = {}
        if central:
            self.source = (f"simulated: the SD over {count} releases' noise at this size (the "
                           "estimator gives no stderr)")
            return
        self.cap = max(2, int(REPLICATE_MAX))
        self.a = max(2, min(int(n), self.cap))
        self.k_min = -int(math.floor(math.log(self.a / 2) / math.log(4) + 1e-9))
        self.k_max = int(math.floor(math.log(self.cap / self.a) / math.log(4) + 1e-9))
        self.source = (f"simulated: the SD over {count} simulated releases at sizes n x 4^k "
                       f"around each size, log-log interpolated (beyond {self.cap:,}: the "
                       "last slope, between flat and 1/sqrt(n)); the estimator gives no stderr")

    @property
    def points(self) -> list[int]:
        return sorted(self._sd)

    def _point(self, k: int) -> int:
        return self.a * 4 ** k if k >= 0 else self.a // 4 ** (-k)

    def _sds(self, values: list[dict[str, np.ndarray]]) -> dict[str, tuple]:
        """name -> (SD per cell, its relative standard error per cell: sqrt((2 + kappa) / 4R),
        kappa the replicates' excess kurtosis, at least 0)."""
        out = {}
        for name in self.names:
            rows = [v[name] for v in values if name in v]
            if len(rows) < 2 or len({r.size for r in rows}) != 1:
                continue
            arr = np.vstack(rows)
            with np.errstate(invalid="ignore", divide="ignore"):
                ok = np.isfinite(arr).sum(axis=0) >= 4
                sd = np.full(arr.shape[1], np.nan)
                rel = np.full(arr.shape[1], np.nan)
                if ok.any():
                    a = arr[:, ok]
                    sd[ok] = np.nanstd(a, axis=0, ddof=1)
                    c = a - np.nanmean(a, axis=0)
                    kurt = np.nanmean(c ** 4, axis=0) / np.nanmean(c ** 2, axis=0) ** 2 - 3
                    r = np.isfinite(a).sum(axis=0)
                    rel[ok] = np.sqrt((2 + np.maximum(np.nan_to_num(kurt), 0)) / (4 * r))
            out[name] = (sd, rel)
        return out

    def _values(self, e: Estimate | None) -> dict[str, np.ndarray]:
        if e is None:
            return {}
        return {name: v for name in self.names
                if (v := _numeric_value(e.statistics.get(name))) is not None}

    def _simulate(self, m: int) -> dict[str, np.ndarray]:
        if m in self._sd:
            return self._sd[m]
        vals = []
        if self.central:
            acc = self.sim.acc(m)
            for r in range(self.count):
                est = self.sim.make_estimator((self.seed + 1) * 1_000_003 + r)
                try:
                    vals.append(self._values(est.finalize(acc)))
                except (LdpBeamError, ValueError, ZeroDivisionError):
                    pass
        else:
            est = self.sim.est
            for r in range(self.count):
                g = np.random.default_rng([self.seed, 2, m, r])
                rep = self.sim.records(m, g)
                try:
                    vals.append(self._values(est.finalize(est.add(est.create(), rep))))
                except (LdpBeamError, ValueError, ZeroDivisionError, FloatingPointError):
                    pass
        self._sd[m] = self._sds(vals)
        return self._sd[m]

    def estimate(self, name: str, m: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(SD per cell at size m, the relative standard error of that SD per cell)."""
        if self.central:
            sd, rel = self._simulate(m).get(name, (None, None))
            return _random_part(sd), rel
        on_grid = [k for k in range(self.k_min, self.k_max + 1) if self._point(k) == m]
        if self.k_min == self.k_max:  # one grid size: 1/sqrt(n) from it
            ks = [0]
        elif on_grid:
            ks = on_grid
        else:
            k = math.log(m / self.a) / math.log(4)
            lo = min(max(int(math.floor(k + 1e-9)), self.k_min), self.k_max - 1)
            ks = [lo, lo + 1]
        for k in ks:
            self._simulate(self._point(k))
        pts = [(p, *self._sd[p][name]) for p in self.points if name in self._sd[p]]
        if not pts or len({sd.size for _, sd, _ in pts}) != 1:
            return None, None
        for p, sd, rel in pts:
            if p == m:
                return _random_part(sd), rel
        sd, rel = _loglog(pts, m)
        return _random_part(sd), rel


def _random_part(sd: np.ndarray | None) -> np.ndarray | None:
    """None for a statistic that did not vary over the releases (not a random output)."""
    if sd is None or not sd.size:
        return None
    if np.isfinite(sd).any() and not (np.nan_to_num(sd) > 0).any():
        return None
    return sd


def _loglog(pts: list[tuple[int, np.ndarray, np.ndarray]], m: int
            ) -> tuple[np.ndarray, np.ndarray]:
    """The SD at size m from SDs at the sizes ``pts`` (sorted; with their relative standard
    errors): linear in (log n, log SD) between two of them; beyond them, the nearest segment's
    slope clamped to [-1/2, 0]; one size: slope -1/2. Returns (SD, its relative standard error:
    the two sizes' errors propagated through the interpolation or extrapolation)."""
    x = np.log([p for p, _, _ in pts])
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.log(np.vstack([sd for _, sd, _ in pts]))
    e = np.vstack([rel for _, _, rel in pts])
    lm = math.log(m)
    if len(pts) == 1:
        return np.exp(y[0] - 0.5 * (lm - x[0])), e[0]
    if x[0] <= lm <= x[-1]:
        i = max(min(int(np.searchsorted(x, lm)), len(x) - 1), 1)
        t = (lm - x[i - 1]) / (x[i] - x[i - 1])
        with np.errstate(invalid="ignore"):
            sd = np.exp(y[i - 1] + t * (y[i] - y[i - 1]))
        return sd, np.sqrt(((1 - t) * e[i - 1]) ** 2 + (t * e[i]) ** 2)
    i, j = (0, 1) if lm < x[0] else (len(x) - 2, len(x) - 1)
    k = i if lm < x[0] else j
    d = abs(lm - x[k]) / (x[j] - x[i])  # grid steps beyond the nearest size
    with np.errstate(invalid="ignore"):
        slope = np.clip((y[j] - y[i]) / (x[j] - x[i]), -0.5, 0.0)
        sd = np.exp(y[k] + slope * (lm - x[k]))
    other = j if k == i else i
    return sd, np.sqrt(((1 + d) * e[k]) ** 2 + (d * e[other]) ** 2)


def _group_sizes(groups: Any) -> list[tuple[str | None, int]]:
    if groups is None:
        return []
    if isinstance(groups, Mapping):
        items = [(str(k), v) for k, v in groups.items()]
    else:
        try:
            seq = list(groups)
        except TypeError:
            raise ParameterError("groups", groups, "a sequence of group sizes or a mapping key "
                                 "-> size") from None
        items = [(f"#{i + 1}", v) for i, v in enumerate(seq)]
    out = []
    for k, v in items:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ParameterError("groups", v, "group sizes: integers >= 0")
        out.append((k, int(v)))
    if not out:
        raise ParameterError("groups", groups, "at least one group size")
    return out


def _shown(keyed: list[tuple[str | None, int]]) -> list[tuple[str | None, int]]:
    if len(keyed) <= SHOWN_GROUPS:
        return keyed
    order = sorted(keyed, key=lambda kv: kv[1])
    small = SHOWN_GROUPS - SHOWN_GROUPS // 3
    return order[:small] + order[-(SHOWN_GROUPS - small):]


# --------------------------------------------------------------------------- counting an input
def _open_table(path: str, text_columns: Iterable[str] = ()) -> tuple[Any, int, bool]:
    """(a pyarrow dataset of the Parquet or CSV table at ``path``, its number of files, whether
    it is Parquet). ``path``: a file, a folder (entries starting with . or _ skipped) or a
    glob. CSV: ``text_columns`` are read as text, the empty cell is missing (as the pipelines
    read it)."""
    # lazy: pyarrow.dataset costs 0.5 s at import (measured: it loads pandas) and pyarrow 0.08 s;
    # this core module loads neither (a plan from a built mechanism needs no table), only
    # counting an input table does
    import pyarrow as pa
    import pyarrow.dataset as ds

    if any(c in path for c in "*?[") and not os.path.exists(path):
        files = sorted(glob.glob(path))
    elif os.path.isdir(path):
        files = sorted(os.path.join(dp, f) for dp, dn, fs in os.walk(path) for f in fs
                       if not f.startswith((".", "_")))
    elif os.path.isfile(path):
        files = [path]
    else:
        raise PlanError(f"--input {path!r}: no such file, folder or glob")
    if not files:
        raise PlanError(f"--input {path!r}: no files")
    with open(files[0], "rb") as fh:
        parquet = fh.read(4) == b"PAR1"
    if parquet:
        fmt: Any = "parquet"
    else:
        import pyarrow.csv as pcsv  # lazy: pyarrow.csv, 0.05 s at import (measured), CSV only

        fmt = ds.CsvFileFormat(convert_options=pcsv.ConvertOptions(
            null_values=[""], strings_can_be_null=True,
            column_types={c: pa.string() for c in text_columns if c}))
    try:
        return ds.dataset(files, format=fmt), len(files), parquet
    except (pa.ArrowInvalid, OSError) as exc:
        raise PlanError(f"--input {path!r}: not a readable {'Parquet' if parquet else 'CSV'} "
                        f"table ({exc})") from None


def input_columns(path: str) -> list[str]:
    """The column names of the table at ``path`` (its schema only)."""
    return list(_open_table(path)[0].schema.names)


def count_input(path: str, unit: str | None = None, by: str | None = None) -> dict:
    """Count a Parquet or CSV table without reading its values: the rows (Parquet: from the
    footers), or the distinct non-missing values of the ``unit`` column, and with ``by`` the rows
    (or distinct units) of each value of that column (a missing key is the key "", as
    ``estimate --by`` keys it). Reads only the ``unit`` and ``by`` columns (pyarrow).

    ``path``: a file, a folder of files or a glob. Returns ``{"n", "what", "groups" (key ->
    size, with ``by``), "files", "format"}``."""
    # lazy: pyarrow and pyarrow.compute cost 0.2 s at import (measured; see _open_table)
    import pyarrow as pa
    import pyarrow.compute as pc

    data, n_files, parquet = _open_table(path, (unit, by))
    names = data.schema.names
    for opt, col in (("--privacy-unit", unit), ("--by", by)):
        if col and col not in names:
            shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
            raise PlanError(f"{opt} {col!r}: the input has no such column (columns: {shown})")
    out: dict[str, Any] = {"files": n_files, "format": "parquet" if parquet else "csv",
                           "input": path}
    cols = [c for c in (by, unit) if c]
    if not cols:
        out["n"] = int(data.count_rows())
        out["what"] = "rows"
        return out
    out["what"] = f"distinct privacy units ({unit})" if unit else "rows"
    seen: Any = None  # distinct (by, unit) pairs or units so far
    counts: dict[str, int] = {}
    n_rows = 0

    def add_counts(t: Any) -> None:  # the rows (or distinct units) of each key of ``by``
        agg = t.group_by([by]).aggregate([([], "count_all")])
        for k, c in zip(agg.column(by).to_pylist(), agg.column("count_all").to_pylist()):
            key = "" if k is None else str(k)
            counts[key] = counts.get(key, 0) + int(c)

    for batch in data.to_batches(columns=cols):
        t = pa.Table.from_batches([batch])
        n_rows += t.num_rows
        if unit:
            t = t.filter(pc.is_valid(t.column(unit))).group_by(cols).aggregate([]).select(cols)
            seen = t if seen is None else pa.concat_tables([seen, t.cast(seen.schema)])
            if seen.num_rows > 4 * t.num_rows + 1_000_000:
                seen = seen.group_by(cols).aggregate([]).select(cols)
        else:
            add_counts(t)
    if unit:
        if seen is None:
            out["n"] = 0
        else:
            seen = seen.group_by(cols).aggregate([]).select(cols)
            if by:
                out["n"] = int(pc.count_distinct(seen.column(unit)).as_py())
                add_counts(seen)
            else:
                out["n"] = int(seen.num_rows)
        out["rows"] = n_rows
    else:
        out["n"] = n_rows
    if by:
        out["groups"] = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        out["by"] = by
    return out


__all__ = ["plan", "Plan", "StatPlan", "GroupPlan", "count_input", "input_columns",
           "parse_assumption",
           "RoleAssumption", "PlanError", "SIM_MAX", "LDP_POOL", "REPLICATE_MAX",
           "DEFAULT_REPLICATES"]
