"""Randomness (issue 8, Reliability): production paths never use a fixed seed, and two unseeded
runs differ.

* Every LDP mechanism, perturbing the same 2,000 valid rows twice without ``rng``, gives
  different reports; every central release, finalized twice without a seed, differs.
* No production source file (``ldp_beam/``, ``transforms/``, ``pipelines/``) seeds a generator
  with a literal, calls a global ``seed()``, passes a literal ``rng=``/``seed=`` or gives a
  ``seed``/``rng`` parameter a default other than None; ``RandomSource()`` is unseeded; the
  pipelines' and the CLI's seed defaults are None.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pathlib
import pkgutil
import warnings

import numpy as np
import pytest

import ldp_beam
from ldp_beam.core import CentralRelease
from ldp_beam.registry import get_registry
from ldp_beam_test_helpers import SAMPLE_PARAMS, valid_columns
from ldp_beam.rng import RandomSource, as_source

REG = get_registry()
BUILTINS = [d["name"] for d in REG.describe() if d["source"] == "ldp-beam"]

CENTRAL = [n for n in BUILTINS if issubclass(REG.get(n).mechanism, CentralRelease)]
LOCAL = [n for n in BUILTINS if n not in CENTRAL]
N = 2000


def valid_input(mech, n, seed=0):
    """Valid rows for every role (the data generator is seeded: only the *noise* must vary)."""
    return valid_columns(mech, n, np.random.default_rng(seed))


def test_every_builtin_has_sample_params():
    assert sorted(SAMPLE_PARAMS) == sorted(BUILTINS)
    assert LOCAL and CENTRAL


# --------------------------------------------------------------------------- two runs differ
@pytest.mark.parametrize("name", LOCAL)
def test_two_unseeded_perturbations_differ(name):
    """Every report of these mechanisms is random with each outcome's probability bounded away
    from 1 (epsilon <= 2 on small domains: e.g. a 1-bit report repeats in an independent run with
    probability p^2 + (1-p)^2 <= 0.8 for p = e^eps / (1 + e^eps), eps <= 2); continuous reports
    (PM, Laplace, Gaussian, square wave, RVNS) repeat with probability 0. So two independent runs
    on 2,000 rows give identical reports with probability below 0.8^2000 ~ 1e-194."""
    mech = REG.build(name, SAMPLE_PARAMS[name])
    assert mech.draws > 0, f"{name}: an LDP mechanism must draw noise"
    data = valid_input(mech, N)
    a, b = mech.perturb(data), mech.perturb(data)
    assert set(a) == set(b) == {f for f, _ in mech.report_fields}
    assert all(len(v) == N for v in a.values())
    assert any(not np.array_equal(a[k], b[k]) for k in a), \
        f"{name}: two unseeded runs gave identical reports"
    # ... and an explicitly unseeded source differs as well
    c = mech.perturb(data, rng=RandomSource())
    assert any(not np.array_equal(a[k], c[k]) for k in a)


#: releases of one integer: a count plus discrete Laplace noise of scale t = 1/epsilon = 1, so two
#: independent releases are equal with probability sum_k P(Z = k)^2
#: = ((1 - q)/(1 + q))^2 (1 + q^2)/(1 - q^2) ~ 0.28 (q = e^(-1/t)): compared over 30 releases
ONE_COUNT = {"central-count", "privacy-id-count"}


def _release(est, acc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.finalize(acc.copy()).to_dict()


@pytest.mark.parametrize("name", CENTRAL)
def test_two_unseeded_central_releases_differ(name):
    """A central release adds noise (Laplace on many cells or on a fine grid: equal draws have
    probability ~0; a single noisy count: see ONE_COUNT) or, for the sampling releases, draws a
    fresh sample of 2,000 records (plus noise, except osdp-rr): two unseeded runs over the same
    data are independent releases. A run is records (where
    ospdprr's sound-self and osdp-rr draw each record's sampling, from a fresh OS-entropy
    source; nothing is drawn for the histogram families) and finalize (the release's noise,
    from an estimator built without a seed)."""
    mech = REG.build(name, SAMPLE_PARAMS[name])
    est = REG.estimator_for(mech)  # no seed
    assert getattr(est, "seed", None) is None
    data = valid_input(mech, N)
    acc = est.add(est.create(), mech.records(data))
    first = _release(est, acc)
    second = _release(est, est.add(est.create(), mech.records(data)))
    assert first["n_reports"] is None  # a central release does not publish the record count
    if name in ONE_COUNT:  # 30 independent releases all equal: probability ~0.28^29 < 1e-15
        more = [_release(est, est.add(est.create(), mech.records(data))) for _ in range(28)]
        assert any(first["statistics"] != r["statistics"] for r in [second] + more), \
            f"{name}: 30 unseeded releases are identical"
    else:
        assert first["statistics"] != second["statistics"], \
            f"{name}: two unseeded releases are identical"
    # the seeded estimator, by contrast, repeats itself (the control: the test can see equality)
    seeded = REG.estimator_for(mech, seed=5)
    assert _release(seeded, acc)["statistics"] == _release(seeded, acc)["statistics"]


def test_unseeded_sources():
    src = RandomSource()
    assert not src.seeded and src.seed is None
    assert not as_source(None).seeded
    assert RandomSource(7).seeded
    a, b = RandomSource().uniforms(64, 2), RandomSource().uniforms(64, 2)
    assert not np.array_equal(a, b)  # 128 doubles from independent OS-keyed AES streams
    # the unseeded generator() is the source's own OS-keyed generator, not a fixed one
    assert not np.array_equal(RandomSource().generator().random(8),
                              RandomSource().generator().random(8))


# --------------------------------------------------------------------------- no fixed seed
ROOT = pathlib.Path(ldp_beam.__file__).resolve().parent.parent
SOURCE_DIRS = ("ldp_beam", "transforms", "pipelines")
# constructors of random generators / seed sequences: a literal argument is a fixed seed
RNG_CALLS = {"default_rng", "RandomSource", "Random", "RandomState", "SeedSequence",
             "AESCounter", "PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937"}
SEED_NAMES = ("seed", "rng", "random_state")


def _is_seedish(name: str | None) -> bool:
    return bool(name) and (name in SEED_NAMES or name.endswith("_seed") or name == "seeds")


def _literal(node: ast.AST) -> bool:
    """An int/str/bytes literal (possibly negated), i.e. a fixed seed; None is not one."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and node.value is not None \
        and not isinstance(node.value, bool)


def fixed_seed_uses(path: pathlib.Path) -> list[str]:
    """Every fixed seed in one source file, as 'file:line: code'."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []

    def hit(node, why):
        out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {why}: {ast.unparse(node)[:100]}")

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults))
            pairs += [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
            for arg, default in pairs:
                if _is_seedish(arg.arg) and not (isinstance(default, ast.Constant)
                                                  and default.value is None):
                    hit(default, f"parameter {arg.arg!r} defaults to a fixed value")
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if name == "seed":  # np.random.seed(...), random.seed(...): global seeding
                hit(node, "global seed() call")
            elif name in RNG_CALLS and (any(_literal(x) for x in node.args[:1])
                                        or any(k.arg in ("seed", "key") and _literal(k.value)
                                               for k in node.keywords)):
                hit(node, "generator seeded with a literal")
            for k in node.keywords:
                if _is_seedish(k.arg) and _literal(k.value):
                    hit(node, f"literal {k.arg}=")
    return out


def production_files() -> list[pathlib.Path]:
    files = [p for d in SOURCE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    return [p for p in files if "tests" not in p.relative_to(ROOT).parts]


def test_scanner_finds_fixed_seeds(tmp_path, monkeypatch):
    """The scanner itself: each kind of fixed seed is reported, OS-entropy forms are not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import numpy as np, random\n"
        "g = np.random.default_rng(42)\n"
        "s = RandomSource('fixed')\n"
        "np.random.seed(1)\n"
        "random.seed(2)\n"
        "def f(x, seed=0): pass\n"
        "def h(x, *, rng: int = -3): pass\n"
        "m.perturb(x, rng=7)\n"
        "ok = np.random.default_rng()\n"
        "ok2 = RandomSource(seed)\n"
        "def g2(x, seed=None): pass\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    lines = sorted(int(h.split(":")[1]) for h in fixed_seed_uses(bad))
    assert lines == [2, 3, 4, 5, 6, 7, 8], lines


def test_production_paths_never_use_a_fixed_seed():
    files = production_files()
    names = {str(p.relative_to(ROOT)) for p in files}
    assert {"ldp_beam/rng.py", "transforms/perturb.py", "pipelines/collect.py"} <= names
    hits = [h for p in files for h in fixed_seed_uses(p)]
    assert not hits, "fixed seeds in production code:\n" + "\n".join(hits)


def _modules(package: str):
    pkg = importlib.import_module(package)
    yield pkg
    for info in pkgutil.iter_modules(pkg.__path__, package + "."):
        yield importlib.import_module(info.name)


@pytest.mark.parametrize("package", ["ldp_beam.pipelines", "ldp_beam.transforms"])
def test_pipeline_seed_defaults_are_none(package):
    """Every function or class of the Beam layer and the pipelines that takes a seed has no
    default seed (None: OS entropy) — checked on the imported objects, not the text."""
    checked = []
    for mod in _modules(package):
        for obj in vars(mod).values():
            if getattr(obj, "__module__", None) != mod.__name__ or not callable(obj):
                continue
            targets = [obj] + ([v for v in vars(obj).values() if inspect.isfunction(v)]
                               if inspect.isclass(obj) else [])
            for fn in targets:
                try:
                    sig = inspect.signature(fn)
                except (TypeError, ValueError):
                    continue
                for p in sig.parameters.values():
                    if _is_seedish(p.name) and p.default is not inspect.Parameter.empty:
                        checked.append(f"{mod.__name__}.{getattr(fn, '__qualname__', fn)}")
                        assert p.default is None, \
                            f"{checked[-1]}({p.name}={p.default!r}): a fixed default seed"
    assert checked  # the check saw the seed parameters (run_collect, PerturbFn, ...)
    if package == "ldp_beam.pipelines":
        from ldp_beam.pipelines.collect import run_collect
        from ldp_beam.pipelines.demo import run_demo

        assert inspect.signature(run_collect).parameters["seed"].default is None
        assert inspect.signature(run_demo).parameters["seed"].default is None
    else:
        from ldp_beam.transforms.perturb import PerturbFn

        assert inspect.signature(PerturbFn.__init__).parameters["seed"].default is None


def test_cli_seed_defaults_are_none():
    from ldp_beam.pipelines.cli import build_parser

    parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert subs
    seen = []
    for name, sub in subs[0].choices.items():
        for action in sub._actions:
            if action.dest == "seed" or "--seed" in action.option_strings:
                seen.append(name)
                assert action.default is None, f"ldp-beam {name} --seed defaults to " \
                                               f"{action.default!r}"
    assert {"collect", "demo"} <= set(seen), seen
    # parsing a command without --seed leaves it None
    a = parser.parse_args(["demo"])
    assert getattr(a, "seed", None) is None
