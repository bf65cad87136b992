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

from ldp_beam.central.dphr import DPHR, approximate_sort, optimal_grouping
from ldp_beam.noise import discrete_laplace, discrete_laplace_scale
from ldp_beam.registry import get_registry
from ldp_beam.reproduce.datasets import chi2_truncated
from ldp_beam.rng import RandomSource

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
    # finalize on another parameter set (e.g. a larger domain) than perturb/accumulate use
    estimate_params: dict | None = None
    estimate_data: Callable[[int, np.random.Generator], Any] | None = None
    rows_are_reports: bool = False  # one report spans several fields (x, y): count rows
    # randomized-response style (a few uniforms and comparisons per record): perturbation should
    # reach at least this fraction of the raw uniform-draw rate (per draw)
    uniform_fraction_target: float | None = None


def _uniform(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 100, n)


RR_FRACTION = 0.2  # issue 7: RR-style perturbation >= 20% of the raw uniform-draw rate


def _codes(*sizes: int) -> Callable[[int, np.random.Generator], dict]:
    """Integer category codes (the labels are "0".."k-1"), skewed towards small codes. eps = 4
    keeps JuRR valid with 25 x 25 sensitive labels (it needs eps > ln 26 = 3.26)."""
    roles = ("x", "y") if len(sizes) == 2 else ("value",)

    def make(n: int, rng: np.random.Generator) -> dict:
        return {r: np.minimum(rng.geometric(3.0 / k, n) - 1, k - 1) for r, k in zip(roles, sizes)}
    return make


def _joint(k: int, sensitive: bool = True, eps: float = 4.0) -> dict:
    labels = tuple(str(i) for i in range(k))
    params = dict(epsilon=eps, x_domain=labels, y_domain=labels)
    if sensitive:
        params.update(x_sensitive=labels[: k // 4], y_sensitive=labels[: k // 4])
    return params


def _joint_profile(sensitive: bool = True, perturb_target: float | None = None) -> Profile:
    """The issue's targets: perturb on a 20 x 20 domain, accumulate 20M reports/s, finalize
    (raw + consistent joint, per-cell SEs, marginals with SEs, conditionals) on 100 x 100
    under 10 ms."""
    return Profile(_joint(20, sensitive), _codes(20, 20), perturb_target=perturb_target,
                   uniform_fraction_target=RR_FRACTION,
                   accumulate_target=20e6, estimate_targets={"default": 0.010},
                   estimate_params=_joint(100, sensitive), estimate_data=_codes(100, 100),
                   rows_are_reports=True)


_MEAN = dict(epsilon=1.0, lower=0.0, upper=100.0)
_RR = dict(uniform_fraction_target=RR_FRACTION)
PROFILES: dict[str, Profile] = {
    "bisample": Profile(_MEAN, _uniform, **_RR),
    "bisample-md": Profile(_MEAN, _uniform, **_RR),
    "harmony": Profile(_MEAN, _uniform, **_RR),
    "pm": Profile(_MEAN, _uniform),
    "privkvm": Profile(_MEAN, _uniform),
    "rvns": Profile(
        dict(lower=0.0, upper=10.0, d=2.0, k=1), lambda n, rng: chi2_truncated(3, n, rng, 10.0),
        estimators={"fast m=100": {"m": 100}, "fast m=1000": {"m": 1000},
                    "paper m=100": {"m": 100, "method": "paper"},
                    "paper m=1000": {"m": 1000, "method": "paper"}},
        perturb_target=5e6, accumulate_target=20e6,
        estimate_targets={"fast m=100": 0.05, "fast m=1000": 1.0},
        quick_skip=("paper m=1000",)),
    "cprr": _joint_profile(perturb_target=5e6),
    "jurr": _joint_profile(),
    "tdrr": _joint_profile(),
    "jd-grr": _joint_profile(sensitive=False),
    "urr": Profile(dict(epsilon=1.0, domain=tuple(str(i) for i in range(20)),
                        sensitive=tuple(str(i) for i in range(5))), _codes(20), **_RR),
    "grr": Profile(dict(epsilon=1.0, domain=tuple(str(i) for i in range(20))), _codes(20),
                   **_RR),
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
    cases = (("aes-counter uniforms", "uniforms/s", lambda: src.uniforms(rows, 1)),
             ("pcg64 uniforms", "uniforms/s", lambda: pcg.random(rows)),
             ("np.bincount", "ints/s", lambda: np.bincount(ints, minlength=4)))
    return [_rec(name, "reference", metric, rows, _best(fn, repeats)[0])
            for name, metric, fn in cases]


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
    if prof.uniform_fraction_target is not None:
        r["fraction_target"] = prof.uniform_fraction_target
        r["meets_fraction_target"] = bool(r["fraction_of_uniform_rate"]
                                          >= prof.uniform_fraction_target)
    out.append(r)
    mech_e, reports_e = mech, reports
    if prof.estimate_params is not None:  # finalize on another domain (e.g. 100 x 100)
        mech_e = reg.build(name, dict(prof.estimate_params))
        cols_e, _ = mech_e.check((prof.estimate_data or prof.data)(min(rows, 10**6), rng))
        reports_e = mech_e.perturb_valid(cols_e, src)
    for label, opts in prof.estimators.items():
        if quick and label in prof.quick_skip:
            continue
        est = reg.estimator_for(mech, **opts)
        if label == next(iter(prof.estimators)):
            t, acc = _best(lambda: est.add(est.create(), reports), repeats)
            n_values = rows if prof.rows_are_reports else \
                sum(np.asarray(v).size for v in reports.values())
            out.append(_rec(name, "accumulate", "reports/s", n_values, t, eps,
                            prof.accumulate_target, report_fields=len(reports)))
        if mech_e is not mech or label != next(iter(prof.estimators)):
            est = reg.estimator_for(mech_e, **opts)
            acc = est.add(est.create(), reports_e)
        slow = "paper" in label  # SLSQP: one timed call (m = 1000 takes minutes), no warm-up
        if not slow:
            est.finalize(acc)  # warm caches (e.g. a transition matrix built once per estimator)
        t, _ = _best(lambda: est.finalize(acc), 1 if slow else repeats)
        extra = {"domain": "x".join(map(str, mech_e.shape))} if hasattr(mech_e, "shape") else {}
        out.append(_rec(name, "estimate", "finalize seconds", est.n_reports(acc), t, eps,
                        prof.estimate_targets.get(label), per_second=False, estimator=label,
                        options=opts, **extra))
    return out


def bench_histograms(quick: bool, repeats: int) -> list[dict]:
    """DPHR's O(n^2) grouping programme (targets: n = 4096 under 1 s, n = 16384 under 10 s) and
    whole releases (sound and paper variants) on DPBench-sized histograms."""
    gen = np.random.default_rng()
    out = []
    sizes = (4096,) if quick else (4096, 16384)
    targets = {4096: 1.0, 16384: 10.0}
    for n in sizes:
        counts = gen.poisson(gen.gamma(0.5, 40.0, n))
        v = np.sort(counts + gen.laplace(0, 2.0, n))
        t, _ = _best(lambda: optimal_grouping(v, 0.5), 1 if n > 4096 else repeats)
        out.append(_rec("dphr", "estimate", "grouping seconds", n, t, 1.0, targets[n],
                        per_second=False, estimator="optimal_grouping (DP)", buckets=n))
        t, _ = _best(lambda: approximate_sort(counts, 0.5, gen), 1)
        out.append(_rec("dphr", "estimate", "approximate sort seconds", n, t, 1.0,
                        per_second=False, estimator="approximate_sort (paper)", buckets=n))
        for variant in ("sound", "paper"):
            mech = DPHR(1.0, variant=variant)
            t, _ = _best(lambda: mech.release_counts(counts, gen), 1)
            out.append(_rec("dphr", "estimate", "release seconds", n, t, 1.0, per_second=False,
                            estimator=f"release_counts ({variant})", buckets=n))
    return out + bench_noise(quick, repeats)


def bench_noise(quick: bool, repeats: int) -> list[dict]:
    """The exact discrete Laplace sampler behind every central release (docs/floating_point.md)
    against numpy's floating-point Laplace, in one large batch and in the small batches of a
    single release (8 buckets, as in the audit; 4096, a DPBench histogram)."""
    gen = np.random.default_rng()
    t_scale = discrete_laplace_scale(1, 1.0)
    out = []
    big = 200_000 if quick else 1_000_000
    t, _ = _best(lambda: discrete_laplace(gen, t_scale, big), repeats)
    out.append(_rec("discrete-laplace", "noise", "draws/s", big, t, 1.0,
                    estimator="exact (integer arithmetic)"))
    t, _ = _best(lambda: gen.laplace(0.0, 1.0, big), repeats)
    out.append(_rec("numpy laplace", "noise", "draws/s", big, t, 1.0,
                    estimator="floating point (reference only)"))
    for size in (8, 4096):
        calls = max(1, 20_000 // size)
        t, _ = _best(lambda: [discrete_laplace(gen, t_scale, size) for _ in range(calls)],
                     repeats)
        out.append(_rec("discrete-laplace", "noise", "release seconds", size, t / calls, 1.0,
                        per_second=False, estimator=f"one release of {size} draws"))
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
    if not only or "dphr" in only:
        progress.note("dphr: grouping programme and releases")
        out += bench_histograms(quick, repeats)
    for name in skipped:
        if name != "dphr":
            progress.note(f"{name}: no benchmark profile (a plugin?); skipped")
    return out
