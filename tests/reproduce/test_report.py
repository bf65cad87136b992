"""The reproduction report collects every family's claims and figures into one markdown file,
and the results block of docs/reproductions.md (once the README's) is generated from the same
outputs."""
import json

import pytest

from ldp_beam.reproduce.report import (EVIDENCE_CHARS, README_BEGIN_LINE, README_END, TITLES,
                                       describe_run, readme_block, results_section,
                                       update_readme, write_report)


def test_report_lists_claims_verdicts_and_figures(tmp_path):
    fam = tmp_path / "dphr"
    fam.mkdir()
    claims = [{"claim": "DPHR has the lowest MSE", "verdict": "reproduced",
               "evidence": "11 of 12 cells | e.g. " + "x" * 1000},
              {"claim": "sound DPHR too", "verdict": "differs", "evidence": "0 of 12"}]
    (fam / "dphr_claims.json").write_text(json.dumps(claims))
    (fam / "fig3_HEPTH.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    path = write_report(str(tmp_path), ["dphr", "uldp"], {"run": "quick", "seed": 7})
    text = open(path).read()
    assert "- run: quick" in text and "- seed: 7" in text
    assert "| [dphr](#dphr) | 2 | differs: 1, reproduced: 1 |" in text
    assert "| [uldp](#uldp) | 0 | no claims written |" in text
    assert "| DPHR has the lowest MSE | **reproduced** | 11 of 12 cells \\| e.g. " in text
    long_cell = [line for line in text.splitlines() if line.startswith("| DPHR has")][0]
    assert "…" in long_cell and len(long_cell) < EVIDENCE_CHARS + 100
    assert "![dphr: fig3_HEPTH](dphr/fig3_HEPTH.png)" in text
    assert "(the recipe wrote no claims)" in text


def _fake_outputs(root, gz=False):
    """DIR/dphr with records, claims and figures; DIR/uldp with records only; no bisample."""
    import gzip

    out = root / "out"
    dphr, uldp = out / "dphr", out / "uldp"
    dphr.mkdir(parents=True)
    uldp.mkdir()
    claims = [{"claim": "DPHR wins", "verdict": "reproduced", "evidence": "12 of 12"},
              {"claim": "sound DPHR wins", "verdict": "differs", "evidence": "0 | 12"}]
    (dphr / "dphr_claims.json").write_text(json.dumps(claims))
    (dphr / "fig3_HEPTH.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (dphr / "other.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (dphr / "dphr.json").write_text(json.dumps([{"seed": 7, "quick": False}] * 3))
    records = json.dumps([{"seed": 5, "quick": True}, {"seed": 4, "quick": True}])
    if gz:
        with gzip.open(uldp / "uldp.json.gz", "wt") as fh:
            fh.write(records)
    else:
        (uldp / "uldp.json").write_text(records)
    return out


def test_write_report_derives_the_runs_from_the_records(tmp_path):
    for gz in (False, True):
        out = _fake_outputs(tmp_path / str(gz), gz=gz)
        text = open(write_report(str(out), ["dphr", "uldp", "bisample"])).read()
        assert "- dphr: full run, seed 7, 3 records" in text
        assert "- uldp: quick run, seeds 4, 5, 2 records" in text
        assert "- bisample: no records file" in text


def test_describe_run():
    assert describe_run(None) == "no records file"
    assert describe_run([{"seed": 1, "quick": True}, {"seed": 1, "quick": False}]) == \
        "mixed quick and full runs, seed 1, 2 records"
    assert describe_run([{}]) == "run (quick or full not recorded), seed not recorded, 1 records"


def test_results_section(tmp_path):
    out = _fake_outputs(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results_dphr.md").write_text("# DPHR\n")
    fams = ["bisample", "uldp", "dphr"]
    text = results_section(str(out), fams, "out", readme=str(tmp_path / "README.md"))
    assert text == results_section(str(out), fams, "out", str(tmp_path),
                                   readme=str(tmp_path / "README.md"))  # deterministic
    # no project root above the page (no pyproject.toml, no mkdocs.yml): paths from its folder
    assert "`ldp-beam reproduce report --out out --readme README.md`" in text
    assert "`ldp-beam reproduce report --out out --readme FILE`" in \
        results_section(str(out), fams, "out")  # which page: not known, not guessed
    assert "| dphr | full run, seed 7, 3 records | 2 | differs: 1, reproduced: 1 |" in text
    assert "| uldp | quick run, seeds 4, 5, 2 records | 0 | claims file missing |" in text
    assert "| bisample | no records file | 0 | claims file missing |" in text
    sections = dict(s.split("\n", 1) for s in text.split("\n### ")[1:])
    dphr = sections[TITLES["dphr"]]
    assert "Run: full run, seed 7, 3 records. Setup, full tables and discussion: " \
           "[docs/results_dphr.md](docs/results_dphr.md)." in dphr
    assert "| DPHR wins | reproduced | 12 of 12 |" in dphr
    assert "| sound DPHR wins | **differs** | 0 \\| 12 |" in dphr
    assert "](out/dphr/fig3_HEPTH.png)" in dphr and "other.png" not in dphr
    uldp = sections[TITLES["uldp"]]
    assert "docs/results_uldp.md" not in uldp and "![" not in uldp  # no page, no figure
    assert "the claims file `out/uldp/uldp_claims.json` is missing" in uldp
    assert "`out/bisample/bisample.json` is missing" in sections[TITLES["bisample"]]
    (out / "uldp" / "uldp_claims.json").write_text("[]")
    text = results_section(str(out), fams, "out")
    assert "| uldp | quick run, seeds 4, 5, 2 records | 0 | no claims written |" in text
    assert "the recipe wrote no claims to `out/uldp/uldp_claims.json`" in text
    with pytest.raises(ValueError, match="link_base 'elsewhere'"):
        results_section(str(out), fams, "elsewhere")


def test_results_section_names_the_command_from_the_project_root(tmp_path, monkeypatch):
    """The block lives in docs/reproductions.md (the README was shortened): its provenance line
    names the command that regenerates it as run from the project root, whatever the working
    directory or spelling of the paths; links stay relative to the page, and the family pages
    beside it are linked."""
    proj = tmp_path / "proj"
    docs = proj / "docs"
    docs.mkdir(parents=True)
    (proj / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    out = _fake_outputs(docs).rename(docs / "figures")
    (docs / "results_dphr.md").write_text("# DPHR\n")
    page = docs / "reproductions.md"
    fams = ["bisample", "uldp", "dphr"]
    text = results_section(str(out), fams, "figures", str(docs), readme=str(page))
    assert text.startswith("Generated by `ldp-beam reproduce report --out docs/figures --readme "
                           "docs/reproductions.md` from the recipe outputs in "
                           "`docs/figures/FAMILY/`."), text[:300]
    assert "README" not in text
    sections = dict(s.split("\n", 1) for s in text.split("\n### ")[1:])
    dphr = sections[TITLES["dphr"]]
    assert "[results_dphr.md](results_dphr.md)" in dphr  # relative to docs/reproductions.md
    assert "](figures/dphr/fig3_HEPTH.png)" in dphr
    assert ("the claims file `docs/figures/uldp/uldp_claims.json` is missing "
            "(`ldp-beam reproduce uldp --out docs/figures/uldp` writes it)") in text
    monkeypatch.chdir(docs)
    assert results_section("figures", fams, "figures", ".", readme="reproductions.md") == text


def test_update_readme_replaces_only_the_block(tmp_path):
    readme = tmp_path / "README.md"
    before, after = "# title\n\nprose\n\n", "\n## next\n\ntail\n"
    readme.write_text(before + README_BEGIN_LINE + "\nold block\n" + README_END + after)
    assert update_readme(str(readme), "new\nblock\n")
    assert readme.read_text() == (before + README_BEGIN_LINE + "\n\nnew\nblock\n\n" +
                                  README_END + after)
    assert readme_block(str(readme)) == "new\nblock"
    assert not update_readme(str(readme), "new\nblock")
    for broken in ("no markers\n", README_BEGIN_LINE + "\n",
                   README_END + "\n" + README_BEGIN_LINE + "\n"):
        readme.write_text(broken)
        with pytest.raises(ValueError, match="README.md"):
            update_readme(str(readme), "x")
        assert readme.read_text() == broken
