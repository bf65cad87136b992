"""The README's promises: its Python tour runs as written, its first two commands exist, and its
results block is generated from the committed recipe outputs."""
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_tour_executes(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 3
    script = tmp_path / "tour.py"
    script.write_text("\n".join(blocks))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "LDP with epsilon=2" in r.stdout
    assert "parameter 'epsilon' = 0 is invalid: expected a finite number > 0" in r.stdout
    assert re.search(r"^beam: 20000 \d+\.\d$", r.stdout, re.M)


def test_readme_opens_with_the_two_commands():
    text = README.read_text()
    cmds = re.findall(r"```bash\n(.*?)\n```", text, re.S)[:2]
    assert cmds == ['python -m pip install . && ldp-beam demo',
                    'python -m pip install -e ".[test]" && pytest']
    ci = (README.parent / ".ci" / "run").read_text()
    assert cmds[1] in ci


def test_readme_results_block_is_generated_from_the_committed_outputs():
    """The README's results block is exactly what `ldp-beam reproduce report --out docs/figures
    --readme README.md` writes from the committed recipe outputs (rerun it after changing them)."""
    from ldp_beam.reproduce.report import readme_block, results_section
    from ldp_beam.pipelines.cli import FAMILIES

    root = README.parent
    expected = results_section(str(root / "docs" / "figures"), FAMILIES, "docs/figures")
    assert readme_block(str(README)) == expected.strip("\n"), (
        "README.md's results block is stale: run `ldp-beam reproduce report --out docs/figures "
        "--readme README.md`")
