"""Packaging: only the ldp_beam namespace is installed; the core never imports Beam, and nothing
but the reproductions' figures imports matplotlib (the `reproduce` extra)."""
import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, cwd, env=None) -> None:
    """Run ``python -c code`` in ``cwd`` (with ``env``, else this environment); it must succeed."""
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_wheel_installs_only_the_ldp_beam_namespace(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(REPO)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("ldp_beam-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ldp_beam", next(t for t in tops if t.endswith(".dist-info"))}
    assert "ldp_beam/transforms/perturb.py" in names
    assert "ldp_beam/pipelines/cli.py" in names
    assert "ldp_beam/pipelines/data/survey_sample.parquet" in names
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt")))
    assert b"ldp-beam = ldp_beam.pipelines.cli:entry" in entry


def test_generic_top_level_names_are_not_importable(tmp_path):
    code = ("import importlib.util, sys\n"
            "assert importlib.util.find_spec('ldp_beam.transforms') is not None\n"
            "for name in ('transforms', 'pipelines'):\n"
            "    try:\n"
            "        __import__(name)\n"
            "    except ImportError:\n"
            "        continue\n"
            "    sys.exit('importable: ' + name)\n")
    _python(code, tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})


def test_core_never_imports_beam(tmp_path):
    code = ("import sys, ldp_beam, ldp_beam.mechanisms, ldp_beam.estimators, ldp_beam.central, "
            "ldp_beam.reproduce\n"
            "from ldp_beam import build_mechanism, estimator_for\n"
            "m = build_mechanism('bisample-md', epsilon=1.0, lower=-1.0, upper=1.0)\n"
            "estimator_for(m).estimate(m.perturb([0.1, 0.2, -0.3, 0.9] * 100, rng=1))\n"
            "bad = sorted(x for x in sys.modules if x.startswith('apache_beam'))\n"
            "sys.exit('core imported ' + ', '.join(bad[:3]) if bad else 0)\n")
    _python(code, tmp_path)
    for py in (REPO / "ldp_beam").rglob("*.py"):
        text = py.read_text()
        assert "import apache_beam" not in text and "from apache_beam" not in text, py


def test_only_figures_import_matplotlib(tmp_path):
    """`pip install ldp-beam` without extras has no matplotlib: the core, the device client and
    the reproductions themselves import without it (checked here with it installed, on
    sys.modules), and no installed module imports it at module level, only ldp_beam/reproduce
    inside the function that draws (ldp_beam.reproduce.recipe.pyplot)."""
    code = ("import sys, ldp_beam, ldp_beam.client\n"
            "from ldp_beam import build_mechanism, estimator_for\n"
            "build_mechanism('bisample-md', epsilon=1.0, lower=0.0, upper=1.0)\n"
            "bad = sorted(m for m in sys.modules\n"
            "             if m.split('.')[0] in ('matplotlib', 'apache_beam'))\n"
            "assert not bad, 'client imported ' + ', '.join(bad[:3])\n"
            "import pkgutil, importlib, ldp_beam.reproduce\n"
            "for m in pkgutil.iter_modules(ldp_beam.reproduce.__path__, 'ldp_beam.reproduce.'):\n"
            "    importlib.import_module(m.name)\n"
            "assert 'matplotlib' not in sys.modules, 'ldp_beam.reproduce imported matplotlib'\n")
    _python(code, tmp_path)
    top_level = []
    for folder in ("ldp_beam", "transforms", "pipelines"):
        for py in (REPO / folder).rglob("*.py"):
            tree = ast.parse(py.read_text(), str(py))
            # module-level statements, including those under a top-level if/try/except/with
            nodes = list(tree.body)
            while nodes:
                node = nodes.pop()
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue  # runs when called (a class body runs at import: searched)
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [node.module or ""]
                else:
                    nodes.extend(n for n in ast.iter_child_nodes(node)
                                 if not isinstance(n, ast.expr))
                    continue
                if any(n.split(".")[0] == "matplotlib" for n in names):
                    top_level.append(f"{py.relative_to(REPO)}:{node.lineno}")
    assert not top_level, "matplotlib imported at module level: " + ", ".join(top_level)
