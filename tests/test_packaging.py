"""Packaging: only the ldp_beam namespace is installed; the core never imports Beam."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_core_never_imports_beam(tmp_path):
    code = ("import sys, ldp_beam, ldp_beam.mechanisms, ldp_beam.estimators, ldp_beam.central, "
            "ldp_beam.evaluation\n"
            "from ldp_beam import build_mechanism, estimator_for\n"
            "m = build_mechanism('bisample-md', epsilon=1.0, lower=-1.0, upper=1.0)\n"
            "estimator_for(m).estimate(m.perturb([0.1, 0.2, -0.3, 0.9] * 100, rng=1))\n"
            "bad = sorted(x for x in sys.modules if x.startswith('apache_beam'))\n"
            "sys.exit('core imported ' + ', '.join(bad[:3]) if bad else 0)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for py in (REPO / "ldp_beam").rglob("*.py"):
        text = py.read_text()
        assert "import apache_beam" not in text and "from apache_beam" not in text, py
