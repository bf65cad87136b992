"""A third-party plugin, installed as a package, is usable from the CLI and a Beam pipeline
without any change to ldp-beam (entry-point group ``ldp_beam.plugins``)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[1] / "plugin_pkg"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(site), str(PLUGIN)],
                   check=True, capture_output=True)
    return site


def _run(site, code, cwd):
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_plugin_from_cli(plugin_site, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"smokes": [0, 1] * 500 + [3]}), tmp_path / "t.parquet")
    code = (
        "import sys, json\n"
        "from ldp_beam.pipelines.cli import main\n"
        "assert main(['list']) == 0\n"
        "rc = main(['collect', '-i', 't.parquet', '-c', 'smokes', '-m', 'coinflip',\n"
        "           '--epsilon', '2', '--seed', '3', '-o', 'r.parquet'])\n"
        "assert rc == 0, rc\n"
        "assert main(['estimate', '-i', 'r.parquet', '-o', 'e.json']) == 0\n")
    r = _run(plugin_site, code, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "coinflip  [coinflip; from ldp-beam-coinflip]" in r.stdout
    est = json.loads((tmp_path / "e.json").read_text())
    s = est["estimate"]["statistics"]["share_yes"]
    assert est["estimate"]["n_reports"] == 1000
    assert abs(s["value"] - 0.5) < 4 * s["stderr"]
    dead = (tmp_path / "r.parquet.deadletter.jsonl").read_text()
    assert "value: 3.0 is not 0 or 1" in dead


def test_plugin_in_beam_pipeline(plugin_site, tmp_path):
    code = (
        "import apache_beam as beam, numpy as np\n"
        "from ldp_beam import build_mechanism, estimator_for\n"
        "from ldp_beam.transforms import Perturb, EstimateGlobally\n"
        "m = build_mechanism('coinflip', epsilon=1.0)\n"
        "with beam.Pipeline() as p:\n"
        "    out = p | beam.Create([{'value': np.array([0., 1., 1., 1.] * 250)}]) | Perturb(m)\n"
        "    (out.reports | EstimateGlobally(estimator_for(m))\n"
        "     | beam.Map(lambda e: print('N', e.n_reports, e['share_yes'].value)))\n")
    r = _run(plugin_site, code, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("N "))
    assert line.split()[1] == "1000"


def test_broken_plugin_is_reported_not_fatal(tmp_path):
    site = tmp_path / "site"
    dist = site / "broken_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[ldp_beam.plugins]\nbroken = no_such_module:register\n")
    r = _run(site, "from ldp_beam.pipelines.cli import main; raise SystemExit(main(['list']))",
             tmp_path)
    assert r.returncode == 0
    assert "bisample-md" in r.stdout
    assert "plugin 'broken' failed to load: ModuleNotFoundError" in r.stderr


def test_audit_of_the_installed_plugin_is_refused_in_one_line(plugin_site, tmp_path):
    """`ldp-beam audit --only coinflip` raised ZeroDivisionError (issue 26): the plugin defines
    no audit_profile(), so it is refused with one line (exit 2) naming the reason and what the
    plugin must provide (a whole run lists it as not audited: tests/reproduce/test_audit.py)."""
    r = subprocess.run([sys.executable, "-m", "ldp_beam.pipelines.cli", "audit", "--quick", "-q",
                        "--only", "coinflip"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=str(plugin_site)))
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ldp-beam audit: error: coinflip (plugin from ldp-beam-coinflip) "
                               "cannot be audited: CoinFlip has no audit_profile(); "), r.stderr
    assert "ldp_beam.audit.AuditProfile(matrix, inputs, output_code)" in r.stderr
