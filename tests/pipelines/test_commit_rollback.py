"""A commit is all or nothing even when its process dies in it (a review, 2026-11-28).

A run's commit keeps every previous version (an output file as ``NAME.ldp-beam-previous``, the
manifest set aside so, a table renamed ``T__ldp_beam_previous``) and writes a journal into its
staging folder before it changes anything. These tests kill a real committing process with
SIGKILL half way through, and after its manifest is written, and check that the next run that
stages in the folder puts the previous run's outputs and manifest back (or, when the commit had
finished, keeps the new ones and removes the kept versions), and that a table output is rolled
back in its database as well.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from ldp_beam.pipelines import outputs as outputs_mod
from ldp_beam.pipelines.outputs import JOURNAL, PREVIOUS_SUFFIX, RunOutputs, verify

# A committing process that SIGKILLs itself: "during" when it is about to move the dead
# letters into place (the first output already moved, the previous manifest set aside),
# "after" once the new manifest is written (before the kept versions are removed).
_COMMITTER = textwrap.dedent("""
    import os, signal, sys
    from ldp_beam.pipelines import outputs as o

    folder, run, when, table = sys.argv[1:5]
    roles = {"dead_letter": folder + "/d.jsonl"}
    roles = {("estimate" if table else "reports"): table or folder + "/r.parquet", **roles}
    real = o._move

    def move(src, dst, flags=()):
        if when == "during" and o.STAGING_PREFIX in src and dst.endswith("d.jsonl"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(src, dst, flags)

    o._move = move
    if when == "after":
        o._drop_kept = lambda plan, flags: os.kill(os.getpid(), signal.SIGKILL)
    outs = o.RunOutputs(roles, folder + "/m.json", run, force=True)
    with outs:
        for role in roles:
            data = open(sys.argv[5], "rb").read() if role == "estimate" else b"new-" + role[0].encode()
            outs.write(outs.staged(role), data)
        outs.commit({"command": "test"})
""")


def _outputs(folder, run_id, table=None, **kw) -> RunOutputs:
    roles = {"dead_letter": str(folder / "d.jsonl")}
    roles = {("estimate" if table else "reports"): table or str(folder / "r.parquet"), **roles}
    return RunOutputs(roles, str(folder / "m.json"), run_id, **kw)


def _commit_old(folder, table=None, tidy=None):
    outs = _outputs(folder, "old", table, force=True)
    with outs:
        for role in outs.outputs:
            outs.write(outs.staged(role), tidy if role == "estimate" else b"old-" + role[0].encode())
        outs.commit({"command": "test"})


def _killed(folder, when, table="", tidy=b""):
    """Run the committing process to its SIGKILL; returns the staging folder it left."""
    src = folder.parent / "tidy.parquet"
    src.write_bytes(tidy)
    proc = subprocess.run([sys.executable, "-c", _COMMITTER, str(folder), "new", when, table,
                           str(src)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    staging = folder / (outputs_mod.STAGING_PREFIX + "new")
    assert (staging / JOURNAL).exists()
    return staging


def _names(folder):
    return sorted(os.listdir(folder))


def test_a_process_killed_during_its_commit_is_rolled_back_by_the_next_run(tmp_path, caplog):
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder)
    _killed(folder, "during")
    # the mixture it left: new reports, old dead letters, no manifest (set aside)
    assert (folder / "r.parquet").read_bytes() == b"new-r"
    assert (folder / "d.jsonl").read_bytes() == b"old-d"
    assert not (folder / "m.json").exists()
    assert (folder / ("m.json" + PREVIOUS_SUFFIX)).exists()
    with caplog.at_level(logging.WARNING, logger=outputs_mod.__name__):
        with _outputs(folder, "later", force=True):
            pass  # staging in the folder sweeps the dead run's folder, settling its commit
    assert "run new was stopped during its commit" in caplog.text
    assert (folder / "r.parquet").read_bytes() == b"old-r"
    assert (folder / "d.jsonl").read_bytes() == b"old-d"
    assert json.loads((folder / "m.json").read_text())["run_id"] == "old"
    assert verify(str(folder / "m.json")) == []
    assert _names(folder) == ["d.jsonl", "m.json", "r.parquet"]


def test_a_process_killed_during_its_first_commit_leaves_nothing(tmp_path):
    """No previous run: the outputs the dead commit moved in are removed again."""
    folder = tmp_path / "out"
    folder.mkdir()
    _killed(folder, "during")
    assert (folder / "r.parquet").read_bytes() == b"new-r"
    with _outputs(folder, "later"):
        pass
    assert _names(folder) == []


def test_a_process_killed_after_its_manifest_keeps_its_commit(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder)
    _killed(folder, "after")
    assert (folder / ("r.parquet" + PREVIOUS_SUFFIX)).read_bytes() == b"old-r"
    with _outputs(folder, "later", force=True):
        pass
    assert json.loads((folder / "m.json").read_text())["run_id"] == "new"
    assert verify(str(folder / "m.json")) == []
    assert (folder / "r.parquet").read_bytes() == b"new-r"
    assert _names(folder) == ["d.jsonl", "m.json", "r.parquet"]


def test_the_settling_waits_for_the_lock_of_a_live_commit(tmp_path, caplog):
    """A dead run's commit is settled under the manifest's commit lock: while a live run holds
    it, the dead run's staging folder and journal stay (for a later run)."""
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder)
    staging = _killed(folder, "during")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / "m.json.lock").write_text(json.dumps(
            {"host": os.uname().nodename, "pid": live.pid, "run_id": "live"}))
        with caplog.at_level(logging.WARNING, logger=outputs_mod.__name__):
            with _outputs(folder, "later", force=True):
                pass
        assert staging.exists() and "not settled yet" in caplog.text
        assert (folder / "r.parquet").read_bytes() == b"new-r"
    finally:
        live.kill()
        live.wait()
    with _outputs(folder, "later2", force=True):
        pass
    assert not staging.exists() and (folder / "r.parquet").read_bytes() == b"old-r"
    assert _names(folder) == ["d.jsonl", "m.json", "r.parquet"]


def test_a_table_output_is_rolled_back_in_its_database(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    from ldp_beam.transforms.sinks import tidy_bytes

    folder = tmp_path / "out"
    folder.mkdir()
    db = tmp_path / "t.duckdb"
    url = f"duckdb://{db}?table=est"
    old = tidy_bytes([{"statistic": "mean", "value": 0.25}], "parquet")
    new = tidy_bytes([{"statistic": "mean", "value": 0.75}, {"statistic": "n", "value": 2.0}],
                     "parquet")
    _commit_old(folder, url, old)

    def rows():
        con = duckdb.connect(str(db), read_only=True)
        try:
            tables = sorted(r[0] for r in con.execute(
                "SELECT table_name FROM information_schema.tables").fetchall())
            return tables, con.execute("SELECT value FROM est ORDER BY value").fetchall()
        finally:
            con.close()

    assert rows() == (["est"], [(0.25,)])
    _killed(folder, "during", url, new)
    assert rows()[1] == [(0.75,), (2.0,)]  # the new table was in, the old one kept aside
    with _outputs(folder, "later", url, force=True):
        pass
    assert rows() == (["est"], [(0.25,)])
    assert json.loads((folder / "m.json").read_text())["run_id"] == "old"
    assert (folder / "d.jsonl").read_bytes() == b"old-d"


@pytest.fixture(params=["duckdb", "postgresql"])
def table_db(request, tmp_path):
    """(a table output URL, a function returning (tables, the table's values)) on DuckDB, or on
    the session's real PostgreSQL server (a fresh database)."""
    if request.param == "duckdb":
        duckdb = pytest.importorskip("duckdb")
        db = tmp_path / "t.duckdb"

        def look():
            con = duckdb.connect(str(db), read_only=True)
            try:
                return ([r[0] for r in con.execute(
                    "SELECT table_name FROM information_schema.tables").fetchall()],
                    [r[0] for r in con.execute("SELECT value FROM est ORDER BY value").fetchall()])
            finally:
                con.close()

        return f"duckdb://{db}?table=est", look
    pytest.importorskip("adbc_driver_postgresql")
    psycopg = pytest.importorskip("psycopg")
    url = request.getfixturevalue("fresh_pg_url")

    def look():
        with psycopg.connect(url) as con:
            tables = [r[0] for r in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                "'public'").fetchall()]
            return tables, [r[0] for r in con.execute("SELECT value FROM est ORDER BY value")]

    return url + ("&" if "?" in url else "?") + "table=est", look


def test_a_failed_commit_rolls_a_table_back_in_process(tmp_path, monkeypatch, table_db):
    """The manifest cannot be written: the table written a moment before is put back, in
    DuckDB and in a real PostgreSQL alike."""
    from ldp_beam.pipelines.outputs import OutputError
    from ldp_beam.transforms.sinks import tidy_bytes

    url, look = table_db
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder, url, tidy_bytes([{"statistic": "mean", "value": 0.25}], "parquet"))
    assert look() == (["est"], [0.25])
    outs = _outputs(folder, "new", url, force=True)
    real = outputs_mod._move

    def move(src, dst, flags=()):
        if dst.endswith("m.json") and src.endswith("_manifest.json"):
            raise OSError(5, "Input/output error", dst)
        return real(src, dst, flags)

    with outs:
        outs.write(outs.staged("estimate"),
                   tidy_bytes([{"statistic": "mean", "value": 0.75}], "parquet"))
        outs.write(outs.staged("dead_letter"), b"new-d")
        monkeypatch.setattr(outputs_mod, "_move", move)
        with pytest.raises(OutputError, match="^commit failed writing the manifest .*rolled "
                           "back: every output and the manifest are as before the commit"):
            outs.commit({"command": "test"})
    assert outs.visible == ["estimate", "dead_letter"]
    assert look() == (["est"], [0.25])
    assert json.loads((folder / "m.json").read_text())["run_id"] == "old"
    assert _names(folder) == ["d.jsonl", "m.json"]
