"""The README's promises: it opens with its two commands, its tour runs as written (the Python
block, then the command-line block, in one folder), it stays short, and its links lead to pages
that exist. The rest of the documentation is tested by test_docs.py (the site, its links, its
code blocks, the paper-reproduction results block)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents
            if (p / "README.md").exists() and (p / "pyproject.toml").exists())
README = ROOT / "README.md"


def _blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def test_readme_tour_executes(tmp_path):
    """The Python tour, then the command-line tour (collect, estimate, a central release per key,
    a stream of the Python tour's reports), in one folder with its own budget ledger."""
    (python,) = _blocks("python")
    tour = _blocks("bash")[2]
    env = dict(os.environ, LDP_BEAM_LEDGER=str(tmp_path / "ledger.db"))
    (tmp_path / "tour.py").write_text(python)
    r = subprocess.run([sys.executable, "tour.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LDP with epsilon=2" in r.stdout
    assert re.search(r"^beam: 20000 \d+\.\d$", r.stdout, re.M)
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", tour], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    est = json.loads((tmp_path / "estimate.json").read_text())["estimate"]
    assert {"mean", "missing_rate"} <= set(est["statistics"])
    release = json.loads((tmp_path / "income_by_region.json").read_text())
    assert sorted(release["estimates"]) == ["east", "north", "south", "west"]
    assert release["guarantee"]["unit"] == "user_id"
    windows = [json.loads(s) for s in (tmp_path / "stream-out" / "estimates.jsonl").open()]
    assert len(windows) == 3 and sum(w["n_reports"] for w in windows) == 20_000


def test_readme_opens_with_the_two_commands():
    cmds = _blocks("bash")[:2]
    assert [c.strip("\n") for c in cmds] == ['python -m pip install . && ldp-beam demo',
                                             'python -m pip install -e ".[test]" && pytest']
    ci = (ROOT / ".ci" / "run").read_text()
    assert cmds[1].strip("\n") in ci


def test_readme_is_short_and_its_links_resolve():
    """Under 200 lines (everything else is in docs/), and every relative link names a file of
    the repository."""
    text = README.read_text()
    assert len(text.splitlines()) < 200
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [u.split("#")[0] for u in links if "://" not in u and not u.startswith("#")]
    assert len(local) >= 10
    missing = [u for u in local if not (ROOT / u).exists()]
    assert not missing, missing
