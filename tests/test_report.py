"""The reproduction report collects every family's claims and figures into one markdown file."""
import json

from ldp_beam.evaluation.report import EVIDENCE_CHARS, write_report


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
