"""Performance benchmarks of the core (``ldp-beam bench``): JSON records, never unit tests.

Each record has the common fields of DESIGN.md (experiment, dataset, method, epsilon, metric,
value) plus ``stage`` (reference, perturb, accumulate, estimate), ``rows``, ``seconds``,
``rows_per_second``, and where an issue states one, ``target`` and ``meets_target``. The physical
reference (uniform draws and bincounts per second) is measured in the same run so every rate can
also be read as a fraction of it (``fraction_of_uniform_rate``). All timings are single-threaded
numpy, i.e. per core; each is the best of ``repeats`` runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..registry import get_registry
from ..rng import RandomSource
from .datasets import chi2_truncated
from .records import Progress, make_record


@dataclass(frozen=True)
class Profile:
    """How to benchmark one registered mechanism: its parameters, input data, and the estimator
    option sets to time at finalize (label -> options), with targets from the issues."""

    params: dict
    data: Callable[[int, np.random.Generator], np.ndarray]
    estimators: dict[str, dict] = field(default_factory=lambda: {"default": {}})
    perturb_target: float | None = None  # rows/s per core
    accumulate_target: float | None = None
    estimate_targets: dict[str, float] = field(default_factory=dict)  # label -> seconds
    quick_skip: tuple[str, ...] = ()  # estimator labels skipped with --quick


def _uniform(lo: float, hi: float) -> Callable[[int, np.random.Generator], np.ndarray]:
    return lambda n, rng: rng.uniform(lo, hi, n)




_MEAN = dict(epsilon=1.0, lower=0.0, upper=100.0)
PROFILES: dict[str, Profile] = {
    "bisample": Profile(_MEAN, _uniform(0, 100)),
    "bisample-md": Profile(_MEAN, _uniform(0, 100)),
    "harmony": Profile(_MEAN, _uniform(0, 100)),
    "pm": Profile(_MEAN, _uniform(0, 100)),
    "privkvm": Profile(_MEAN, _uniform(0, 100)),
    "rvns": Profile(
        dict(lower=0.0, upper=10.0, d=2.0, k=1), lambda n, rng: chi2_truncated(3, n, rng, 10.0),
        estimators={"fast m=100": {"m": 100}, "fast m=1000": {"m": 1000},
                    "paper m=100": {"m": 100, "method": "paper"},
                    "paper m=1000": {"m": 1000, "method": "paper"}},
        perturb_target=5e6, accumulate_target=20e6,
        estimate_targets={"fast m=100": 0.05, "fast m=1000": 1.0},
        quick_skip=("paper m=1000",)),
}


def _best(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _rec(name: str, stage: str, metric: str, rows: int, seconds: float, eps: Any = None,
         target: float | None = None, per_second: bool = True, **extra: Any) -> dict:
    rate = rows / seconds if seconds > 0 else float("inf")
    value = rate if per_second else seconds
    r = make_record("bench", "synthetic", name, eps, metric, value, stage=stage, rows=rows,
               seconds=seconds, rows_per_second=rate, **extra)
    if target is not None:
        r["target"] = target
        r["meets_target"] = bool(value >= target) if per_second else bool(value <= target)
    return r


def reference(rows: int, repeats: int) -> list[dict]:
    """The machine's physical reference: uniforms/s (our AES source and numpy's PCG64) and
    np.bincount ints/s."""
    src = RandomSource()
    pcg = np.random.default_rng()
    ints = pcg.integers(0, 4, rows)
    out = []
    t, _ = _best(lambda: src.uniforms(rows, 1), repeats)
    out.append(_rec("aes-counter uniforms", "reference", "uniforms/s", rows, t))
    t, _ = _best(lambda: pcg.random(rows), repeats)
    out.append(_rec("pcg64 uniforms", "reference", "uniforms/s", rows, t))
    t, _ = _best(lambda: np.bincount(ints, minlength=4), repeats)
    out.append(_rec("np.bincount", "reference", "ints/s", rows, t))
    return out


def bench_mechanism(name: str, prof: Profile, rows: int, repeats: int, quick: bool,
                    uniform_rate: float) -> list[dict]:
    reg = get_registry()
    mech = reg.build(name, dict(prof.params))
    rng = np.random.default_rng()
    x = prof.data(rows, rng)
    src = RandomSource()
    eps = prof.params.get("epsilon")
    out = []
    t, (cols, _) = _best(lambda: mech.check(x), repeats)
    out.append(_rec(name, "perturb", "validated rows/s", rows, t, eps))
    t, reports = _best(lambda: mech.perturb_valid(cols, src), repeats)
    r = _rec(name, "perturb", "perturbed rows/s", rows, t, eps, prof.perturb_target)
    r["fraction_of_uniform_rate"] = r["rows_per_second"] * mech.draws / uniform_rate
    r["draws_per_row"] = mech.draws
    out.append(r)
    for label, opts in prof.estimators.items():
        if quick and label in prof.quick_skip:
            continue
        est = reg.estimator_for(mech, **opts)
        if label == next(iter(prof.estimators)):
            t, acc = _best(lambda: est.add(est.create(), reports), repeats)
            n_values = sum(np.asarray(v).size for v in reports.values())
            out.append(_rec(name, "accumulate", "reports/s", n_values, t, eps,
                            prof.accumulate_target, report_fields=len(reports)))
        else:
            acc = est.add(est.create(), reports)
        slow = "paper" in label  # SLSQP: one timed call (m = 1000 takes minutes), no warm-up
        if not slow:
            est.finalize(acc)  # warm caches (e.g. a transition matrix built once per estimator)
        t, _ = _best(lambda: est.finalize(acc), 1 if slow else repeats)
        out.append(_rec(name, "estimate", "finalize seconds", rows, t, eps,
                        prof.estimate_targets.get(label), per_second=False, estimator=label,
                        options=opts))
    return out


def run(quick: bool = False, only: list[str] | None = None,
        progress: Progress | None = None) -> list[dict]:
    """Benchmark the reference and every registered mechanism that has a profile."""
    progress = progress or Progress("bench")
    rows = 1_000_000 if quick else 10_000_000
    repeats = 2 if quick else 3
    out = reference(rows, repeats)
    uniform_rate = out[0]["rows_per_second"]
    reg = get_registry()
    names = [n for n in reg.names() if n in PROFILES and (not only or n in only)]
    skipped = [n for n in reg.names() if n not in PROFILES and (not only or n in only)]
    progress.total = len(names)
    for name in names:
        progress.step(name)
        out += bench_mechanism(name, PROFILES[name], rows, repeats, quick, uniform_rate)
    for name in skipped:
        progress.note(f"{name}: no benchmark profile (a plugin?); skipped")
    return out
