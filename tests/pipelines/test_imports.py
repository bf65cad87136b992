"""Imports at module top, unless a measured start-up cost says otherwise (issue 25).

* Every import inside a function of every installed module (each ``.py`` file under ldp_beam/,
  pipelines/ and transforms/, found by globbing: :data:`MODULES`) carries a ``# lazy: REASON``
  comment on its line, or in the comment lines directly above it (above its group of imports):
  an optional dependency (``# lazy: optional dependency (the [duckdb] extra)``), a measured cost
  on a path that should not pay it (``# lazy: scipy.stats costs 720 ms at import (measured),
  ...``) or an import cycle (naming the modules). Anything else belongs at the top of the module.
* No import circle: the module-level imports of every module form no cycle (checked on the
  source), and each package entry point, and each module of :data:`FRESH_IMPORT`, imports first
  in a fresh interpreter.
* The start-up the lazy imports protect: the command line (which imports outputs.py, the
  ledger and lifecycle.py for every command) loads neither Beam nor pyarrow, pandas, scipy or
  dp_accounting; the device client loads neither pyarrow, pandas, scipy nor cryptography.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: the folders of the installed packages: repository folder -> installed package name
#: (pyproject.toml's package-dir)
PACKAGE_DIRS = {"ldp_beam": "ldp_beam", "pipelines": "ldp_beam.pipelines",
                "transforms": "ldp_beam.transforms"}


def _module_name(path: Path) -> str:
    folder, *rest = path.relative_to(REPO).with_suffix("").parts
    if rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([PACKAGE_DIRS[folder], *rest])


#: the modules held to the rule (repository path -> installed module name): every .py file of
#: the installed packages, subpackages included (ldp_beam/reproduce/, central/, ...), excluding
#: nothing
MODULES = {path.relative_to(REPO).as_posix(): _module_name(path)
           for folder in PACKAGE_DIRS for path in sorted((REPO / folder).rglob("*.py"))}

#: outside the core, the modules imported first in a fresh interpreter: the Beam layer's modules
#: the rule first covered (issue 25; ~2 s each, Beam itself), and the stdlib-only helpers that
#: CI also loads by path (~15 ms each)
FRESH_OUTSIDE_CORE = (
    "transforms/io.py", "transforms/write.py", "transforms/sinks.py", "transforms/sources.py",
    "transforms/pubsub_lander.py", "transforms/stream_results.py", "transforms/spool.py",
    "transforms/batches.py", "transforms/read.py", "pipelines/estimate.py", "pipelines/outputs.py",
    "pipelines/provenance.py", "pipelines/emit.py", "pipelines/pubsub_stream.py",
    "pipelines/lifecycle.py", "pipelines/ledger_cli.py", "pipelines/collect.py",
    "pipelines/datasets.py", "pipelines/postgres_server.py", "pipelines/pubsub_emulator.py",
)

#: the modules imported first in a fresh interpreter: every module of the core (ldp_beam/, its
#: subpackages included; no Beam: 0.1-0.5 s each) and those above. Not every module of
#: pipelines/ and transforms/: most load Beam, and all of them took ~25 s more on two CPUs
#: (measured)
FRESH_IMPORT = sorted({MODULES[p] for p in MODULES if p.startswith("ldp_beam/")}
                      | {MODULES[p] for p in FRESH_OUTSIDE_CORE})

LAZY = "# lazy:"


def _function_imports(tree: ast.AST) -> list[ast.stmt]:
    """The import statements that run when a function (or lambda) runs, not at import."""
    found: list[ast.stmt] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return found


def _has_reason(line: str) -> bool:
    _, sep, reason = line.partition(LAZY)
    return bool(sep) and len(reason.strip()) >= 3


def unexplained_imports(source: str) -> list[tuple[int, str]]:
    """(line, text) of each function-level import without a ``# lazy:`` reason on its lines or
    in the comments directly above it (looking past the imports of its group)."""
    lines = source.splitlines()
    tree = ast.parse(source)
    import_lines = {n for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for n in range(node.lineno, node.end_lineno + 1)}
    bad = []
    for node in _function_imports(tree):
        own = lines[node.lineno - 1:node.end_lineno]
        if any(_has_reason(t) for t in own):
            continue
        n, ok = node.lineno - 1, False  # 1-based number of the line above
        while n >= 1 and not ok:
            text = lines[n - 1].strip()
            if n in import_lines or text.startswith("#"):
                ok = _has_reason(text)
                n -= 1
            else:
                break
        if not ok:
            bad.append((node.lineno, lines[node.lineno - 1].strip()))
    return bad


@pytest.mark.parametrize("path", sorted(MODULES))
def test_function_level_imports_say_why_they_are_lazy(path):
    bad = unexplained_imports((REPO / path).read_text(encoding="utf-8"))
    assert not bad, (
        f"{path}: imports inside functions without a '# lazy: REASON' comment (move them to the "
        "module top, or say why not: an optional dependency, or the measured cost and the path "
        "that should not pay it):\n" + "\n".join(f"  line {n}: {t}" for n, t in bad))


def test_the_scan_sees_what_it_should():
    src = '''
import os

def f():
    import json
    import csv  # lazy: optional dependency (the [csv] extra)
    # lazy: costs 700 ms at import (measured), only g needs it
    import wave
    from zipfile import ZipFile
    if True:
        import re
    # lazy:
    import abc
    return lambda: __import__("x")

class C:
    import math  # at import time: not function-level

    def m(self):
        from . import sibling
'''
    got = [t for _, t in unexplained_imports(src)]
    assert got == ["import json", "import re", "import abc", "from . import sibling"]


def _fresh_import(module: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import {module}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO / "tests")


def _check(module: str, proc: subprocess.Popen) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"import {module} in a fresh interpreter failed:\n{err[-3000:]}"


@pytest.mark.parametrize("module", ["ldp_beam", "ldp_beam.transforms",
                                    "ldp_beam.pipelines.estimate", "ldp_beam.pipelines.cli"])
def test_entry_points_import_first_in_a_fresh_interpreter(module):
    _check(module, _fresh_import(module))


def test_each_module_imports_first_in_a_fresh_interpreter():
    """An import circle shows only when one of its modules is the first imported. (A module of
    ldp_beam.transforms imports after the package's __init__, so those that __init__ imports
    are covered by the entry point above.)"""
    init = ast.parse((REPO / "transforms/__init__.py").read_text(encoding="utf-8"))
    by_init = {f"ldp_beam.transforms.{n.module}" for n in init.body
               if isinstance(n, ast.ImportFrom) and n.level == 1}

    def first(module: str) -> tuple[str, int, str]:
        proc = _fresh_import(module)
        _, err = proc.communicate(timeout=300)
        return module, proc.returncode, err

    # one interpreter per CPU at a time: all ~80 at once would hold several GB (40-200 MB each)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(first, sorted(set(FRESH_IMPORT) - by_init)))
    failed = [f"import {m} in a fresh interpreter failed:\n{err[-3000:]}"
              for m, code, err in results if code != 0]
    assert not failed, "\n".join(failed)


def _loaded(module: str, heavy: tuple[str, ...]) -> list[str]:
    code = (f"import sys, {module}; "
            f"print(' '.join(m for m in {heavy!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=REPO / "tests", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.split()


def test_the_command_line_starts_without_beam_or_pyarrow():
    """What the lazy imports in outputs.py, ldp_beam/ledger/ and lifecycle.py keep out of
    every command's start-up (``--help`` and ``ledger`` included)."""
    heavy = ("apache_beam", "pyarrow", "pandas", "scipy", "dp_accounting")
    assert _loaded("ldp_beam.pipelines.cli", heavy) == []


def test_the_device_client_starts_without_pandas_pyarrow_or_scipy():
    """What the lazy imports in ldp_beam/core.py and ldp_beam/prf.py keep out of
    ``import ldp_beam.client``."""
    assert _loaded("ldp_beam.client", ("pyarrow", "pandas", "scipy", "apache_beam",
                                       "cryptography")) == []


def test_a_command_builds_its_pipeline_without_importing_ipython(tmp_path):
    """Beam asks at its first transform whether it runs in an IPython shell, importing IPython
    wherever it is installed (0.2-0.25 s); the console script marks IPython absent instead
    (cli.entry), and the run still works."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"c": ["a", "b", "a"]}), tmp_path / "t.parquet")
    code = ("import sys; from ldp_beam.pipelines.cli import entry; "
            f"sys.argv = ['ldp-beam', 'collect', '-i', {str(tmp_path / 't.parquet')!r}, "
            f"'-m', 'grr', '-p', 'domain=a,b', '--epsilon', '1', '--column', 'c', "
            f"'-o', {str(tmp_path / 'r.parquet')!r}, '-q']; code = entry(); "
            "print(code, 'IPython' in sys.modules, sys.modules.get('IPython') is None)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, LDP_BEAM_LEDGER=str(tmp_path / "l.db")))
    assert r.returncode == 0, r.stderr[-3000:]
    # the None entry is there: without the guard, a Python with IPython loads the module and
    # one without it records no entry for the failed import
    assert r.stdout.split()[-3:] == ["0", "True", "True"], r.stdout


def _top_level_imports(path: Path, name: str) -> set[str]:
    """The package modules ``name`` imports when it is imported (its module-level imports,
    those under a module-level ``if``/``try`` included; not those inside functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = set(MODULES.values())
    found: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.If, ast.Try)):
            stack.extend(ast.iter_child_nodes(node))
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:
                pkg = base
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                mod = f"{pkg}.{mod}" if mod else pkg
            found.update({mod} & known)
            found.update(f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known)
    return found - {name}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while comp[-1:] != [v]:
                comp.append(stack.pop())
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_module_imports_itself_through_others():
    """No import circle among all the installed modules at import time (issue 25 found two in
    transforms/: combine -> perturb -> rows -> combine and io <-> sources); a circle a function
    closes lazily says so with a ``# lazy:`` reason (the rule above)."""
    graph = {name: _top_level_imports(REPO / path, name) for path, name in MODULES.items()}
    assert sum(map(len, graph.values())) > 200  # the scan sees the imports it should
    assert import_cycles(graph) == []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
