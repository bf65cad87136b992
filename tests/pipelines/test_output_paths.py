"""Output paths as the file system sees them (issue 23): an output reached through a symlink and
``..``, a hard link, or an input's glob is the input and is refused; a folder, a read-only folder
(also for root, whom ``chmod`` does not stop), a name or path too long for the file system, and a
suffix naming another format are refused before anything runs, each with one OutputError naming
the option and the path; a commit that fails midway says what was published and leaves no
partial file."""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ldp_beam.pipelines import outputs as outputs_mod
from ldp_beam.pipelines.outputs import (PARTIAL_SUFFIX, PREVIOUS_SUFFIX, STAGING_PREFIX,
                                        OutputError, RunOutputs, check_output_format,
                                        real_path, verify)

GRR = ("-m", "grr", "--epsilon", "1", "-p", "domain=a,b,c,d")


def _table(path, n=500, seed=0):
    rng = np.random.default_rng(seed)
    pq.write_table(pa.table({"v": rng.choice(list("abcd"), n), "uid": np.arange(n)}), path)
    return path


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """ROOT/data/X.parquet (the input), ROOT/data/sub/, and the working folder ROOT/work with
    ``lnk -> ../data/sub``: ``lnk/../X.parquet`` is ROOT/work/X.parquet as text (abspath), but
    the file system follows ``lnk`` first and reaches ROOT/data/X.parquet, the input."""
    data, work = tmp_path / "data", tmp_path / "work"
    (data / "sub").mkdir(parents=True)
    work.mkdir()
    _table(data / "X.parquet")
    os.symlink("../data/sub", work / "lnk")
    monkeypatch.chdir(work)
    assert os.path.abspath("lnk/../X.parquet") == str(work / "X.parquet")
    assert real_path("lnk/../X.parquet") == str(data / "X.parquet")
    return tmp_path


def _files(folder) -> dict:
    """Every file below ``folder`` with its bytes (symlinks not followed)."""
    out = {}
    for d, _dirs, names in os.walk(folder):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, folder)] = None if os.path.islink(p) else open(p, "rb").read()
    return out


def _leftovers(folder) -> list[str]:
    """Temporary files, partial copies, probes and staging folders anywhere below ``folder``."""
    found = []
    for d, dirs, names in os.walk(folder):
        for n in names + dirs:
            if n.endswith((".tmp", PARTIAL_SUFFIX, PREVIOUS_SUFFIX)) or n.startswith(
                    (STAGING_PREFIX, outputs_mod.PROBE_PREFIX)):
                found.append(os.path.join(d, n))
    return found


def _refused(match: str, *args, **kwargs) -> str:
    with pytest.raises(OutputError, match=match) as err:
        RunOutputs(*args, **kwargs)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def _cli(tmp, *args):
    from ldp_beam_test_helpers import run_cli

    return run_cli(*args, "--ledger", f"sqlite:///{tmp}/l.db")


# ------------------------------------------------------------------ the symlink findings
def test_output_through_a_symlink_and_dotdot_is_the_input(tree):
    msg = _refused("is an input", {"reports": "lnk/../X.parquet", "dead_letter": "d.jsonl"},
                   "lnk/../X.parquet.manifest.json", "r1", inputs=["../data/X.parquet"],
                   force=True)
    assert msg.startswith("--output lnk/../X.parquet (the reports output, really "
                          f"{tree / 'data' / 'X.parquet'})")
    msg = _refused("is an input", {"reports": "r.parquet", "dead_letter": "lnk/../X.parquet"},
                   "r.parquet.manifest.json", "r1", inputs=["../data/X.parquet"], force=True)
    assert msg.startswith("--dead-letter lnk/../X.parquet (the dead letter output")
    # an estimate over reports R: its output lnk/../R.parquet is R
    _table(tree / "data" / "R.parquet", seed=1)
    before = _files(tree / "data")
    msg = _refused("is an input", {"estimate": "lnk/../R.parquet",
                                   "dead_letter": "lnk/../R.parquet.deadletter.jsonl"},
                   "lnk/../R.parquet.manifest.json", "r2", inputs=["../data/R.parquet"],
                   force=True)
    assert msg.startswith("--output lnk/../R.parquet (the estimate output")
    # the input as a folder: lnk/../ is inside it
    _refused("inside an input", {"reports": "lnk/../new.parquet", "dead_letter": "d.jsonl"},
             "m.json", "r3", inputs=["../data"])
    # the input as a glob: lnk/../new.parquet would be read by the next run of the same command
    _refused("input pattern", {"reports": "lnk/../new.parquet", "dead_letter": "d.jsonl"},
             "m.json", "r4", inputs=["../data/*.parquet"])
    assert _files(tree / "data") == before and _leftovers(tree) == []


def test_symlinked_output_file_and_file_urls_are_the_input(tree):
    os.symlink("../data/X.parquet", "s.parquet")
    _refused("is an input", {"reports": "s.parquet", "dead_letter": "d.jsonl"}, "m.json", "r1",
             inputs=["../data/X.parquet"], force=True)
    _refused("is an input", {"reports": f"file://{os.getcwd()}/lnk/../X.parquet",
                             "dead_letter": "d.jsonl"}, "m.json", "r1",
             inputs=[f"file://{tree}/data/X.parquet"], force=True)


def test_the_resolved_paths_are_the_ones_written(tree):
    """A legitimate output through ``lnk/..``: stored, staged beside and committed at its real
    path, and the manifest names the real path."""
    outs = RunOutputs({"reports": "lnk/../ok.parquet", "dead_letter": "lnk/../ok.jsonl"},
                      "lnk/../ok.parquet.manifest.json", "r1", inputs=["../data/X.parquet"])
    data = str(tree / "data")
    assert outs.outputs == {"reports": f"{data}/ok.parquet", "dead_letter": f"{data}/ok.jsonl"}
    assert outs.manifest == f"{data}/ok.parquet.manifest.json"
    assert outs.staging == f"{data}/{STAGING_PREFIX}r1"
    with outs:
        assert os.path.isdir(outs.staging)
        outs.write(outs.staged("reports"), b"reports")
        outs.write(outs.staged("dead_letter"), b"")
        man = outs.commit({"command": "test"})
    assert man["files"]["reports"]["path"] == f"{data}/ok.parquet"
    assert (tree / "data" / "ok.parquet").read_bytes() == b"reports"
    assert not (tree / "work" / "ok.parquet").exists()
    assert outs.published == ["reports", "dead_letter", "manifest"]
    assert verify(outs.manifest) == [] and _leftovers(tree) == []


def test_cli_symlink_findings_exit_2_and_leave_the_input_byte_for_byte(tree):
    tmp = tree
    before = _files(tree / "data")
    code, _, se = _cli(tmp, "collect", "-i", "../data/X.parquet", "-c", "v", *GRR,
                       "-o", "lnk/../X.parquet", "--force")
    assert code == 2 and "is an input" in se and _files(tree / "data") == before
    code, _, se = _cli(tmp, "collect", "-i", "../data/X.parquet", "-c", "v", *GRR,
                       "-o", "r.parquet", "--dead-letter", "lnk/../X.parquet", "--force")
    assert code == 2 and "--dead-letter" in se and _files(tree / "data") == before
    # reports R, then an estimate whose output lnk/../R.parquet is R
    code, _, se = _cli(tmp, "collect", "-i", "../data/X.parquet", "-c", "v", *GRR,
                       "-o", "../data/R.parquet")
    assert code == 0, se
    before = _files(tree / "data")
    code, _, se = _cli(tmp, "estimate", "-i", "../data/R.parquet", "-o", "lnk/../R.parquet",
                       "--force")
    assert code == 2 and "is an input" in se and _files(tree / "data") == before
    assert _leftovers(tree) == []


# ------------------------------------------------------------------ hard links
def test_a_hard_link_to_an_input_is_the_input(tree):
    os.link("../data/X.parquet", "h.parquet")
    msg = _refused("hard link", {"reports": "h.parquet", "dead_letter": "d.jsonl"}, "m.json",
                   "r1", inputs=["../data/X.parquet"], force=True)
    assert msg.startswith("--output h.parquet") and str(tree / "data" / "X.parquet") in msg
    # a file of an input folder, found recursively; and the manifest as a hard link
    (tree / "data" / "sub" / "deep").mkdir()
    _table(tree / "data" / "sub" / "deep" / "part.parquet")
    os.link(tree / "data" / "sub" / "deep" / "part.parquet", "p.json")
    _refused("hard link", {"reports": "r.parquet", "dead_letter": "d.jsonl"}, "p.json", "r2",
             inputs=["../data"], force=True)
    # a hard link to a glob's match
    _refused("hard link", {"reports": "r.parquet", "dead_letter": "h.parquet"}, "m.json", "r3",
             inputs=["../data/*.parquet"], force=True)


def test_cli_hard_link_output_exits_2(tree):
    os.link("../data/X.parquet", "h.parquet")
    before = _files(tree / "data")
    code, _, se = _cli(tree, "collect", "-i", "../data/X.parquet", "-c", "v", *GRR,
                       "-o", "h.parquet", "--force")
    assert code == 2 and "hard link" in se and _files(tree / "data") == before
    assert (tree / "work" / "h.parquet").read_bytes() == (tree / "data" / "X.parquet").read_bytes()


# ------------------------------------------------------------------ folders
def test_a_trailing_slash_or_a_folder_is_refused(tree):
    msg = _refused("give a file path, not a folder",
                   {"reports": "newdir/", "dead_letter": "d.jsonl"}, "newdir/.manifest.json",
                   "r1", inputs=["../data/X.parquet"])
    assert msg.startswith("--output newdir/")
    os.mkdir("adir.parquet")
    _refused("give a file path, not a folder",
             {"reports": "adir.parquet", "dead_letter": "d.jsonl"}, "m.json", "r1", force=True)
    assert not os.path.exists("newdir") and _leftovers(tree) == []
    for path in ("newdir/", "adir.parquet", "s3://bucket/prefix/"):
        with pytest.raises(OutputError, match="give a file path, not a folder"):
            check_output_format("--output", path, (".parquet",))


def test_cli_trailing_slash_exits_2_without_a_traceback(tree):
    code, _, se = _cli(tree, "collect", "-i", "../data/X.parquet", "-c", "v", *GRR,
                       "-o", "newdir/")
    assert code == 2 and "not a folder" in se and "Traceback" not in se
    assert not os.path.exists("newdir") and _leftovers(tree) == []


def test_a_folder_component_that_is_a_file_is_refused(tree):
    (tree / "work" / "f.txt").write_text("x")
    msg = _refused("is a file, not a folder",
                   {"reports": "f.txt/sub/r.parquet", "dead_letter": "d.jsonl"}, "m.json", "r1")
    assert msg.startswith("--output f.txt/sub/r.parquet")
    _refused("is a file, not a folder", {"reports": "r.parquet", "dead_letter": "f.txt/d.jsonl"},
             "m.json", "r1")
    assert (tree / "work" / "f.txt").read_text() == "x" and _leftovers(tree) == []


# ------------------------------------------------------------------ read-only folders
def test_a_read_only_folder_is_refused_for_a_user(tree):
    """chmod 0o555 stops a user. As root (whom it does not stop) the check runs in a child
    process whose capabilities are all dropped with ``setpriv`` (uid 0 without CAP_DAC_OVERRIDE
    is held to the folder's mode like any user, and ``os.access`` says so)."""
    ro = tree / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.geteuid() != 0:
            msg = _refused("not writable", {"reports": str(ro / "r.parquet"),
                                            "dead_letter": "d.jsonl"}, "m.json", "r1")
        else:
            if not shutil.which("setpriv"):
                pytest.skip("setpriv is needed to drop root's capabilities")
            code = ("from ldp_beam.pipelines.outputs import RunOutputs\n"
                    "try:\n"
                    f"    RunOutputs({{'reports': {str(ro / 'sub' / 'r.parquet')!r}, "
                    f"'dead_letter': {str(tree / 'd.jsonl')!r}}}, "
                    f"{str(tree / 'm.json')!r}, 'r1')\n"
                    "except Exception as e:\n"
                    "    print(type(e).__name__, e)\n")
            run = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all",
                                  sys.executable, "-c", code],
                                 capture_output=True, text=True, timeout=120)
            if "Operation not permitted" in run.stderr:
                pytest.skip(f"setpriv cannot drop capabilities here: {run.stderr.strip()}")
            msg = run.stdout.strip()
        assert msg.startswith("OutputError --output") or msg.startswith("--output"), msg
        assert "not writable" in msg and str(ro) in msg
        assert os.listdir(ro) == [] and _leftovers(tree) == []
    finally:
        ro.chmod(0o755)


def _immutable(folder) -> None:
    """``chattr +i``: nobody, root included, can create a file in ``folder``."""
    if os.geteuid() != 0 or not shutil.which("chattr"):
        pytest.skip("chattr +i needs root")
    run = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if run.returncode != 0:
        pytest.skip(f"chattr +i is not supported here: {run.stderr.strip()}")


@pytest.fixture
def immutable(tree):
    folder = tree / "frozen"
    folder.mkdir()
    yield folder
    subprocess.run(["chattr", "-i", str(folder)], capture_output=True)


def test_a_folder_root_cannot_write_is_refused(tree, immutable, monkeypatch):
    """As root, chmod does not stop a write; ``chattr +i`` does (os.access sees it here). Where
    os.access says yes and the write still fails (an NFS export squashing root, sysfs: see the
    next test), the probe file catches it: os.access is made to say yes over the same real
    immutable folder, and the real create fails."""
    _immutable(immutable)
    msg = _refused("not writable",
                   {"reports": str(immutable / "r.parquet"), "dead_letter": "d.jsonl"},
                   "m.json", "r1")
    assert msg.startswith(f"--output {immutable / 'r.parquet'} (the reports output)")
    monkeypatch.setattr(outputs_mod.os, "access", lambda *a, **k: True)
    msg = _refused("cannot create a file in the folder",
                   {"reports": str(immutable / "r.parquet"), "dead_letter": "d.jsonl"},
                   "m.json", "r1")
    assert f"--output {immutable / 'r.parquet'}" in msg and "Operation not permitted" in msg
    # a folder to be created below it: the nearest existing folder is probed
    _refused("cannot create a file in the folder",
             {"reports": "r.parquet", "dead_letter": str(immutable / "a" / "b" / "d.jsonl")},
             "m.json", "r1")
    assert os.listdir(immutable) == [] and _leftovers(tree) == []


def test_a_special_file_system_root_cannot_write_is_refused_by_the_probe():
    """sysfs, for real: root's os.access says yes, creating a file there fails (EACCES)."""
    if not os.path.isdir("/sys/kernel") or not os.access("/sys", os.W_OK):
        pytest.skip("no writable-looking /sys here")
    _refused("cannot create a file in the folder /sys",
             {"reports": "/sys/ldp-beam-test/r.parquet", "dead_letter": "/sys/d.jsonl"},
             "/sys/ldp-beam-test/m.json", "r1")


def test_cli_read_only_folder_as_root_exits_2(tree, immutable):
    _immutable(immutable)
    code, _, se = _cli(tree, "collect", "-i", "../data/X.parquet", "-c", "v", *GRR,
                       "-o", str(immutable / "r.parquet"))
    assert code == 2 and "not writable" in se and "Traceback" not in se
    assert os.listdir(immutable) == [] and _leftovers(tree) == []


# ------------------------------------------------------------------ names and paths too long
def test_a_248_character_name_is_refused_before_anything_is_written(tree):
    name = "n" * 240 + ".parquet"
    assert len(name) == 248 and len(name + ".manifest.json") > 255
    msg = _refused("PC_NAME_MAX", {"reports": name, "dead_letter": "d.jsonl"},
                   name + ".manifest.json", "r1", inputs=["../data/X.parquet"])
    assert msg.startswith(f"--output {name}.manifest.json (the manifest)")
    assert "its name is 262 bytes, more than the 255" in msg
    # the output's own name fits, what is written beside it does not
    name = "n" * 240 + ".parquet"
    msg = _refused("PC_NAME_MAX", {"reports": name, "dead_letter": "d.jsonl"}, "m.json", "r1")
    assert f"{PARTIAL_SUFFIX}, which the run writes in" in msg
    # a folder to create whose name is too long
    _refused("folder name", {"reports": "x" * 300 + "/r.parquet", "dead_letter": "d.jsonl"},
             "m.json", "r1")
    # the staging folder's name (the run id is part of it)
    _refused(f"the name {STAGING_PREFIX}", {"reports": "r.parquet", "dead_letter": "d.jsonl"},
             "m.json", "r" * 250)
    assert sorted(os.listdir(".")) == ["lnk"] and _leftovers(tree) == []


def test_a_path_longer_than_path_max_is_refused(tree):
    deep = "/".join(["d" * 200] * 21) + "/r.parquet"
    msg = _refused("PC_PATH_MAX", {"reports": deep, "dead_letter": "d.jsonl"}, "m.json", "r1")
    assert msg.startswith("--output ddd") and len(msg) < 1000
    assert sorted(os.listdir(".")) == ["lnk"]


def test_cli_248_character_name_exits_2_and_writes_nothing(tree):
    name = "n" * 240 + ".parquet"
    code, _, se = _cli(tree, "collect", "-i", "../data/X.parquet", "-c", "v", *GRR, "-o", name)
    assert code == 2 and "PC_NAME_MAX" in se and "Traceback" not in se
    assert sorted(os.listdir(".")) == ["lnk"] and _leftovers(tree) == []


# ------------------------------------------------------------------ format follows suffix
def test_check_output_format():
    for path in ("out.csv", "out.json", "out", "s3://b/out.csv"):
        with pytest.raises(OutputError) as err:
            check_output_format("--output", path, (".parquet",))
        msg = str(err.value)
        assert msg.startswith(f"--output {path}: ") and "give a path ending in .parquet" in msg
    with pytest.raises(OutputError, match="written as Parquet, not CSV"):
        check_output_format("--output", "out.csv", (".parquet", ".pq"))
    with pytest.raises(OutputError, match="collect writes Parquet reports; give a path ending"):
        check_output_format("--output", "out.csv", (".parquet",),
                            what="collect writes Parquet reports")
    with pytest.raises(OutputError, match=r"^--dead-letter d\.json: .*JSON lines.*\.jsonl$"):
        check_output_format("--dead-letter", "d.json", (".jsonl",))
    with pytest.raises(OutputError, match=r"ending in \.json or \.parquet or \.csv"):
        check_output_format("--output", "e.txt", (".json", ".parquet", ".csv"))
    for path in ("x.parquet", "X.PARQUET", "x.pq", "s3://b/p/x.parquet", "file:///t/x.parquet",
                 "duckdb:///t/x.db?table=t", "postgresql://u@h/db?table=t"):
        check_output_format("--output", path, (".parquet", ".pq"))  # no error
    check_output_format("--dead-letter", "r.parquet.deadletter.jsonl", (".jsonl",))
    for path in ("e.json", "e.parquet", "e.csv"):
        check_output_format("--output", path, (".json", ".parquet", ".csv"))


# ------------------------------------------------------------------ failures while committing
def _outputs(folder, run_id, dead_letter=None, **kw) -> RunOutputs:
    """The outputs of run ``run_id``: reports FOLDER/r.parquet, dead letters FOLDER/d.jsonl (or
    ``dead_letter``), the manifest beside the reports."""
    return RunOutputs({"reports": str(folder / "r.parquet"),
                       "dead_letter": str(dead_letter or folder / "d.jsonl")},
                      str(folder / "r.parquet.manifest.json"), run_id, **kw)


def _stage(outs, reports=b"new-r", dead_letter=b"new-d"):
    """Both outputs written into the staging folder."""
    outs.write(outs.staged("reports"), reports)
    outs.write(outs.staged("dead_letter"), dead_letter)


def _previous_run(folder):
    """A committed run: reports 'old-r', dead letters 'old-d', its manifest."""
    outs = _outputs(folder, "old")
    with outs:
        _stage(outs, b"old-r", b"old-d")
        outs.commit({"command": "test"})
    return outs


def _failing_replace(monkeypatch, fails, error: int = errno.EIO):
    """os.replace that fails, from now on, for every call for which ``fails(src, dst)`` holds."""
    real = os.replace
    calls = []

    def replace(src, dst, *a, **k):
        calls.append((str(src), str(dst)))
        if fails(str(src), str(dst)):
            raise OSError(error, os.strerror(error), str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(outputs_mod.os, "replace", replace)
    return calls


def _moving_in(name):
    """A replace that moves a staged file to the final place ``name``."""
    return lambda src, dst: STAGING_PREFIX in src and os.path.basename(dst) == name


def _old_run_intact(folder):
    """The previous run's outputs and manifest as it committed them, nothing else left."""
    assert (folder / "r.parquet").read_bytes() == b"old-r"
    assert (folder / "d.jsonl").read_bytes() == b"old-d"
    man = folder / "r.parquet.manifest.json"
    assert json.loads(man.read_text())["run_id"] == "old" and verify(str(man)) == []
    assert sorted(os.listdir(folder)) == ["d.jsonl", "r.parquet", "r.parquet.manifest.json"]


def test_a_commit_failing_on_the_second_output_rolls_the_first_back(tmp_path, monkeypatch):
    _previous_run(tmp_path)
    outs = _outputs(tmp_path, "new", force=True)
    with outs:
        _stage(outs)
        _failing_replace(monkeypatch, _moving_in("d.jsonl"))
        with pytest.raises(OutputError) as err:
            outs.commit({"command": "test"})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"commit failed moving the dead_letter output into place at {tmp_path / 'd.jsonl'}: "
        "Input/output error (OSError); rolled back: every output and the manifest are as "
        "before the commit (the new reports were in place for a moment)")
    assert outs.published == ["reports"] and err.value.published == ["reports"]
    assert outs.visible == ["reports"] and not outs.rollback_problems
    assert outs.manifest_removed and not outs.committed
    _old_run_intact(tmp_path)


def test_a_commit_failing_on_the_first_output_published_nothing(tmp_path, monkeypatch):
    _previous_run(tmp_path)
    outs = _outputs(tmp_path, "new", tmp_path / "new" / "sub" / "d.jsonl", force=True)
    with outs:
        _stage(outs)
        _failing_replace(monkeypatch, _moving_in("r.parquet"), errno.ENOSPC)
        with pytest.raises(OutputError, match="rolled back: nothing new was published; the "
                           "previous outputs and manifest are as they were$") as err:
            outs.commit({"command": "test"})
    assert outs.published == [] and err.value.published == [] and outs.manifest_removed
    assert outs.visible == [] and "No space left on device" in str(err.value)
    assert not (tmp_path / "new").exists()  # the folder the commit would have filled
    _old_run_intact(tmp_path)


def test_a_commit_that_cannot_set_the_old_manifest_aside_changes_nothing(tmp_path,
                                                                         monkeypatch):
    _previous_run(tmp_path)
    before = _files(tmp_path)
    outs = _outputs(tmp_path, "new", force=True)
    with outs:
        _stage(outs)
        _failing_replace(monkeypatch, lambda src, dst: dst.endswith(".manifest.json"
                                                                    + PREVIOUS_SUFFIX),
                         errno.EACCES)
        with pytest.raises(OutputError, match="^commit failed setting the previous manifest "
                           "aside .*nothing was published; the previous outputs and manifest "
                           "are untouched$"):
            outs.commit({"command": "test"})
    assert outs.published == [] and not outs.manifest_removed
    assert _files(tmp_path) == before and _leftovers(tmp_path) == []


def test_a_move_across_file_systems_that_fails_leaves_no_partial_copy(tmp_path, monkeypatch):
    """EXDEV: the staged file is copied to DST.ldp-beam-partial, then replaced; the replace
    fails and the partial copy is removed."""
    _previous_run(tmp_path)
    outs = _outputs(tmp_path, "new", force=True)
    with outs:
        _stage(outs)
        real = os.replace

        def replace(src, dst, *a, **k):
            if _moving_in("r.parquet")(str(src), str(dst)):  # staged -> final: another device
                raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), str(dst))
            if str(src).endswith(PARTIAL_SUFFIX):
                assert os.path.exists(src)  # the copy was made beside the target...
                raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
            return real(src, dst, *a, **k)

        monkeypatch.setattr(outputs_mod.os, "replace", replace)
        with pytest.raises(OutputError, match="nothing new was published"):
            outs.commit({"command": "test"})
    assert outs.published == [] and outs.visible == []
    _old_run_intact(tmp_path)  # ...and is gone again


def test_the_manifest_write_failing_after_the_outputs_removes_them_again(tmp_path,
                                                                        monkeypatch):
    outs = _outputs(tmp_path, "new")
    with outs:
        _stage(outs)
        _failing_replace(monkeypatch, lambda src, dst: dst.endswith(".manifest.json"))
        with pytest.raises(OutputError, match="^commit failed writing the manifest .*rolled "
                           r"back: .*\(the new reports, dead_letter were in place for a "
                           r"moment\)$") as err:
            outs.commit({"command": "test"})
    assert err.value.published == ["reports", "dead_letter"] and not outs.manifest_removed
    assert os.listdir(tmp_path) == []  # no previous version: the new files are removed


def test_a_rollback_that_cannot_finish_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """The dead letters cannot be moved in, and the reports' previous version cannot be put
    back: the error says so, no manifest vouches for the mixture, the journal stays, and the
    next run staging in the folder (once this run's process is gone) finishes the rollback."""
    _previous_run(tmp_path)
    outs = _outputs(tmp_path, "new", force=True)
    with outs:
        _stage(outs)
        with monkeypatch.context() as m:
            _failing_replace(m, lambda src, dst: _moving_in("d.jsonl")(src, dst) or (
                src.endswith("r.parquet" + PREVIOUS_SUFFIX)))
            with pytest.raises(OutputError, match="rolling back failed .*the reports "
                               f".*{tmp_path / 'r.parquet'}.*journal is kept in"):
                outs.commit({"command": "test"})
    assert outs.rollback_problems and os.path.isdir(outs.staging)
    assert (tmp_path / "r.parquet").read_bytes() == b"new-r"
    assert not (tmp_path / "r.parquet.manifest.json").exists()
    # the process that owned the staging folder is gone (a dead pid stands in for it)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    owner = os.path.join(outs.staging, outputs_mod.OWNER_FILE)
    with open(owner) as fh:
        rec = json.load(fh)
    with open(owner, "w") as fh:
        json.dump({**rec, "pid": dead.pid}, fh)
    with _outputs(tmp_path, "later", force=True):
        pass
    _old_run_intact(tmp_path)


def test_a_staging_folder_that_cannot_be_made_is_one_line_and_leaves_nothing(tmp_path,
                                                                            monkeypatch):
    outs = _outputs(tmp_path / "a" / "b", "new")
    real = os.makedirs

    def makedirs(path, *a, **k):
        if os.path.basename(str(path)).startswith(STAGING_PREFIX):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(outputs_mod.os, "makedirs", makedirs)
    with pytest.raises(OutputError) as err:
        with outs:
            pytest.fail("the body must not run")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(
        f"creating the staging folder {outs.staging} failed: No space left on device")
    assert os.listdir(tmp_path) == []  # a/b, made for the manifest, removed again


def test_a_run_that_fails_removes_the_folders_it_made(tmp_path):
    outs = _outputs(tmp_path / "a", "new")
    with pytest.raises(RuntimeError):
        with outs:
            outs.write(outs.staged("reports"), b"x")
            raise RuntimeError("the pipeline failed")
    assert os.listdir(tmp_path) == []


def test_publish_settles_the_ledger_entry_by_published(tmp_path, monkeypatch):
    """lifecycle.publish reads ``outs.visible``: something was moved into place (and rolled
    back) -> the entry stays pending; nothing was -> it is aborted."""
    from ldp_beam.pipelines import lifecycle

    class Entry:
        run_id = "new"
        state = None

        def prepare(self, *a):
            pass

        def leave_pending(self, why):
            self.state = ("pending", why)

        def abort(self, why):
            self.state = ("aborted", why)

        def commit(self):
            self.state = ("committed", "")

    for fail_on, state in (("d.jsonl", "pending"), ("r.parquet", "aborted")):
        folder = tmp_path / fail_on
        folder.mkdir()
        _previous_run(folder)
        outs = _outputs(folder, "new", force=True)
        entry = Entry()
        with outs:
            _stage(outs)
            with monkeypatch.context() as m:
                _failing_replace(m, _moving_in(fail_on))
                with pytest.raises(OutputError):
                    lifecycle.publish(entry, outs, {"command": "test"})
        assert entry.state[0] == state, entry.state
        _old_run_intact(folder)
        assert _leftovers(folder) == []
