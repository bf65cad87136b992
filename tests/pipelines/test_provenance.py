"""Reports carry their provenance (issue 23): ``estimate`` ties every reports file to the
``collect`` manifest that committed it and reads only verified reports of one configuration.

Each finding of the operator's report is a test, end to end: reports collected with the real
``collect`` into a folder, then estimated through the command line."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from ldp_beam.pipelines.cli import main
from ldp_beam.pipelines.provenance import (UNVERIFIED_HINT, UNVERIFIED_PREFIX, MixedReportsError,
                                           ProvenanceError, verify_reports)
from ldp_beam.transforms.batches import SCHEMA_KEY

HINT = "pass --unverified to estimate them anyway; every output then says so"


def _cli(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main([*map(str, args)])
    return code, capsys.readouterr().err


def _ledger(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'l.db'}"


def _collect(capsys, tmp_path, out, *, eps: float = 2.0, n: int = 3000, seed: int | None = None,
             data_seed: int = 0) -> dict:
    """Collect ``n`` GRR reports (domain a, b, c) of a fresh input into ``out``; its manifest."""
    rng = np.random.default_rng(data_seed)
    src = tmp_path / f"in-{out.stem}-{data_seed}.parquet"
    pq.write_table(pa.table({"v": rng.choice(list("abc"), n, p=[0.5, 0.3, 0.2])}), src)
    args = ["collect", "-q", "-i", src, "-c", "v", "-m", "grr", "--epsilon", eps,
            "-p", "domain=a,b,c", "-o", out, "--ledger", _ledger(tmp_path)]
    if seed is not None:
        args += ["--seed", seed]
    code, err = _cli(capsys, *args)
    assert code == 0, err
    return json.loads((out.parent / (out.name + ".manifest.json")).read_text())


def _estimate(capsys, tmp_path, input, output, *extra: str) -> tuple[int, str]:
    return _cli(capsys, "estimate", "-q", "-i", input, "-o", output, "--ledger",
                _ledger(tmp_path), *extra)


def test_reports_of_two_epsilons_in_one_folder_are_refused(tmp_path, capsys):
    """Finding 1: eps 0.5 and eps 4 reports in one folder were estimated as eps 0.5 (the first
    file's metadata), 112 standard errors off. Refused, naming both files and what differs, and
    --unverified does not change that (mixing configurations is wrong arithmetic)."""
    rep = tmp_path / "reports"
    _collect(capsys, tmp_path, rep / "a.parquet", eps=0.5)
    _collect(capsys, tmp_path, rep / "b.parquet", eps=4, data_seed=1)
    for extra in ((), ("--unverified",)):
        code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json", *extra)
        assert code == 2, err
        assert "a.parquet" in err and "b.parquet" in err, err
        assert "epsilon=0.5" in err and "epsilon=4" in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "e.json").exists()
    with pytest.raises(MixedReportsError):
        verify_reports(str(rep), unverified=True)


def test_edited_metadata_is_refused(tmp_path, capsys):
    """Finding 2: Parquet metadata edited from eps 2 to 5 gave frequencies 16 SE off labelled
    "epsilon=5". The file no longer matches its manifest (bytes, SHA-256, configuration)."""
    rep = tmp_path / "reports"
    _collect(capsys, tmp_path, rep / "r.parquet", eps=2)
    table = pq.read_table(rep / "r.parquet")
    meta = json.loads(table.schema.metadata[SCHEMA_KEY])
    meta["params"]["epsilon"] = 5.0
    pq.write_table(table.replace_schema_metadata({SCHEMA_KEY: json.dumps(meta).encode()}),
                   rep / "r.parquet")
    code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json")
    assert code == 2, err
    assert "--input" in err and err.strip().endswith(HINT), err
    assert "differs from its manifest" in err and "epsilon=5" in err, err
    assert not (tmp_path / "e.json").exists()
    with pytest.raises(ProvenanceError) as exc:
        verify_reports(str(rep / "r.parquet"))
    assert any("metadata edited" in p for p in exc.value.problems)


def test_duplicated_rows_are_refused(tmp_path, capsys):
    """Finding 3: 5,000 duplicated rows gave n_reports 25,000 where the manifest says 20,000
    (here 5,000 more on 5,000 collected)."""
    rep = tmp_path / "reports"
    man = _collect(capsys, tmp_path, rep / "r.parquet", n=5000)
    assert man["records"]["reported"] == 5000
    table = pq.read_table(rep / "r.parquet")
    pq.write_table(pa.concat_tables([table, table]), rep / "r.parquet")
    code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json")
    assert code == 2, err
    assert "10,000 reports where its manifest" in err and "reported 5,000" in err, err
    assert not (tmp_path / "e.json").exists()


def test_deleted_manifest_is_refused_unless_unverified_and_every_output_says_so(tmp_path,
                                                                                capsys):
    """Finding 4: a deleted manifest went unnoticed. Refused; with --unverified estimated, and
    the JSON, the tidy CSV and the estimate's manifest all say UNVERIFIED."""
    rep = tmp_path / "reports"
    _collect(capsys, tmp_path, rep / "r.parquet")
    (rep / "r.parquet.manifest.json").unlink()
    code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json")
    assert code == 2, err
    assert "has no manifest" in err and err.strip().endswith(HINT), err
    assert not (tmp_path / "e.json").exists()

    code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json", "--unverified")
    assert code == 0, err
    out = json.loads((tmp_path / "e.json").read_text())
    assert out["verification"]["verified"] is False
    assert any("has no manifest" in p for p in out["verification"]["problems"])
    assert out["runs"] == []
    assert out["guarantee"]["summary"].startswith(UNVERIFIED_PREFIX)
    assert out["estimate"]["guarantee"]["summary"].startswith(UNVERIFIED_PREFIX)
    assert out["estimate"]["n_reports"] == 3000
    man = json.loads((tmp_path / "e.json.manifest.json").read_text())
    assert man["verification"]["verified"] is False and man["verification"]["problems"]
    assert man["guarantee"]["summary"].startswith(UNVERIFIED_PREFIX)

    code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.csv", "--unverified")
    assert code == 0, err
    rows = pacsv.read_csv(tmp_path / "e.csv").to_pylist()
    assert rows and all(r["guarantee"].startswith(UNVERIFIED_PREFIX) for r in rows)
    man = json.loads((tmp_path / "e.csv.manifest.json").read_text())
    assert man["verification"]["verified"] is False


def test_seeded_and_unseeded_reports_are_refused(tmp_path, capsys):
    """Finding 5: a folder with a seeded and an unseeded file was labelled "LDP with
    epsilon=2", seeded=false. Refused, also with --unverified."""
    rep = tmp_path / "reports"
    _collect(capsys, tmp_path, rep / "a.parquet", seed=7)
    _collect(capsys, tmp_path, rep / "b.parquet", data_seed=1)
    for extra in ((), ("--unverified",)):
        code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json", *extra)
        assert code == 2, err
        assert "a.parquet" in err and "b.parquet" in err, err
        assert "seeded" in err and "unseeded" in err, err
    assert not (tmp_path / "e.json").exists()


def test_a_seeded_run_alone_is_estimated_as_seeded(tmp_path, capsys):
    rep = tmp_path / "reports"
    _collect(capsys, tmp_path, rep / "a.parquet", seed=7)
    code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json")
    assert code == 0, err
    out = json.loads((tmp_path / "e.json").read_text())
    assert out["seeded"] is True and out["guarantee"]["seeded"] is True


def test_two_runs_of_one_configuration_are_estimated_together(tmp_path, capsys):
    """Two collect runs with the same configuration in one folder: accepted, the estimate
    counts both and names both runs."""
    rep = tmp_path / "reports"
    a = _collect(capsys, tmp_path, rep / "a.parquet", n=3000)
    b = _collect(capsys, tmp_path, rep / "b.parquet", n=2000, data_seed=1)
    code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json")
    assert code == 0, err
    out = json.loads((tmp_path / "e.json").read_text())
    assert out["estimate"]["n_reports"] == 5000
    assert sorted(out["runs"]) == sorted([a["run_id"], b["run_id"]])
    assert out["verification"] == {"verified": True, "problems": []}
    assert not out["guarantee"]["summary"].startswith(UNVERIFIED_PREFIX)
    assert out["params"]["epsilon"] == 2.0 and out["seeded"] is False
    man = json.loads((tmp_path / "e.json.manifest.json").read_text())
    assert sorted(man["runs"]) == sorted([a["run_id"], b["run_id"]])
    assert man["verification"]["verified"] is True
    assert sorted(r["reported"] for r in man["verification"]["runs"]) == [2000, 3000]


def test_a_copied_file_is_refused(tmp_path, capsys):
    """The same run twice (a copied file): its reports would count twice."""
    rep = tmp_path / "reports"
    _collect(capsys, tmp_path, rep / "a.parquet")
    shutil.copyfile(rep / "a.parquet", rep / "a-copy.parquet")
    code, err = _estimate(capsys, tmp_path, rep, tmp_path / "e.json")
    assert code == 2, err
    assert "same collect run" in err and "a-copy.parquet" in err, err
    assert not (tmp_path / "e.json").exists()


def test_a_renamed_file_is_found_by_its_checksum(tmp_path, capsys):
    """A reports file renamed in its folder is tied to its manifest by SHA-256."""
    rep = tmp_path / "reports"
    a = _collect(capsys, tmp_path, rep / "a.parquet")
    (rep / "a.parquet").rename(rep / "renamed.parquet")
    prov = verify_reports(str(rep))
    assert prov.verified and prov.run_ids == [a["run_id"]]
    assert prov.runs[0]["manifest"].endswith("a.parquet.manifest.json")


def test_reports_without_manifests_need_unverified(tmp_path):
    """CSV reports and Parquet written by hand have no manifest: refused unless unverified."""
    pacsv.write_csv(pa.table({"v": [0, 1, 2, 1]}), tmp_path / "r.csv")
    with pytest.raises(ProvenanceError) as exc:
        verify_reports(str(tmp_path / "r.csv"))
    assert str(exc.value).startswith("--input ") and str(exc.value).endswith(UNVERIFIED_HINT)
    prov = verify_reports(str(tmp_path / "r.csv"), unverified=True)
    assert not prov.verified and prov.problems and prov.runs == []
    assert prov.to_dict()["verified"] is False
