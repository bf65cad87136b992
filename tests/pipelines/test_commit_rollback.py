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
from ldp_beam.pipelines import rollback as rollback_mod
from ldp_beam.pipelines.outputs import JOURNAL, PREVIOUS_SUFFIX, RunOutputs, verify
from ldp_beam_test_helpers import held_lock

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
            data = b"new-" + role[0].encode()
            if role == "estimate":
                data = open(sys.argv[5], "rb").read()
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
            data = tidy if role == "estimate" else b"old-" + role[0].encode()
            outs.write(outs.staged(role), data)
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
    with caplog.at_level(logging.WARNING, logger=rollback_mod.__name__):
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
    with held_lock(folder / "m.json.lock", {"host": os.uname().nodename, "run_id": "live"}):
        with caplog.at_level(logging.WARNING, logger=rollback_mod.__name__):
            with _outputs(folder, "later", force=True):
                pass
        assert staging.exists() and "not settled yet" in caplog.text
        assert (folder / "r.parquet").read_bytes() == b"new-r"
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


def _manifest_fails(folder, url, monkeypatch) -> RunOutputs:
    """Commit a new estimate table (0.75) and dead letters to ``url`` and ``folder`` with the
    manifest's write failing; checks the error says all was rolled back."""
    from ldp_beam.pipelines.outputs import OutputError
    from ldp_beam.transforms.sinks import tidy_bytes

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
    return outs


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
    from ldp_beam.transforms.sinks import tidy_bytes

    url, look = table_db
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder, url, tidy_bytes([{"statistic": "mean", "value": 0.25}], "parquet"))
    assert look() == (["est"], [0.25])
    outs = _manifest_fails(folder, url, monkeypatch)
    assert outs.visible == ["estimate", "dead_letter"]
    assert look() == (["est"], [0.25])
    assert json.loads((folder / "m.json").read_text())["run_id"] == "old"
    assert _names(folder) == ["d.jsonl", "m.json"]


@pytest.mark.parametrize("lands", [False, True], ids=["fails-before", "lands-then-raises"])
def test_whether_a_failed_table_write_was_visible_is_known(tmp_path, monkeypatch, table_db,
                                                          lands):
    """A table write that fails before its transaction commits showed readers nothing (the
    run's entry can be aborted, its budget given back); one that committed and then raised did
    (the entry stays pending). Told apart in DuckDB (its file) and PostgreSQL (which of the
    table and its kept version exist) alike; a PostgreSQL table used to count as visible
    whenever its write had begun."""
    from ldp_beam.pipelines.outputs import OutputError
    from ldp_beam.transforms import sinks
    from ldp_beam.transforms.sinks import tidy_bytes

    url, look = table_db
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder, url, tidy_bytes([{"statistic": "mean", "value": 0.25}], "parquet"))
    real = sinks.write_tidy

    def write_tidy(*args, **kw):
        if lands:
            real(*args, **kw)
        raise OSError(5, "Input/output error")

    outs = _outputs(folder, "new", url, force=True)
    with outs:
        outs.write(outs.staged("estimate"),
                   tidy_bytes([{"statistic": "mean", "value": 0.75}], "parquet"))
        outs.write(outs.staged("dead_letter"), b"new-d")
        monkeypatch.setattr(sinks, "write_tidy", write_tidy)
        with pytest.raises(OutputError, match="rolled back"):
            outs.commit({"command": "test"})
    assert outs.visible == (["estimate"] if lands else [])
    assert look() == (["est"], [0.25])


# ------------------------------------------------------------------ a review's findings
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _dead_journal(folder, run, changes, replaces=None):
    """A staging folder left by run ``run``, whose process is gone, with its commit journal."""
    staging = folder / (outputs_mod.STAGING_PREFIX + run)
    staging.mkdir()
    (staging / outputs_mod.OWNER_FILE).write_text(json.dumps(
        {"pid": _dead_pid(), "host": os.uname().nodename, "run_id": run}))
    (staging / JOURNAL).write_text(json.dumps({"run_id": run, "manifest": str(folder / "m.json"),
                                               "replaces": replaces, "changes": changes}))
    return staging


def _file_change(folder, role, name, previous, data=None):
    import hashlib

    path = str(folder / name)
    return {"role": role, "path": path, "keep": path + PREVIOUS_SUFFIX, "previous": previous,
            "sha256": None if data is None else hashlib.sha256(data).hexdigest()}


def test_a_journal_a_later_commit_superseded_removes_nothing(tmp_path, caplog):
    """A first-ever run died right after writing its journal; another run committed since (its
    manifest names it). The old journal must not roll back that later commit: its dead letters
    have the same bytes as the dead run's would have had, its manifest is another run's."""
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder)
    plan = [_file_change(folder, "manifest", "m.json", False),
            _file_change(folder, "reports", "r.parquet", False, b"old-r"),
            _file_change(folder, "dead_letter", "d.jsonl", False, b"old-d")]
    staging = _dead_journal(folder, "dead", plan)
    before = {n: (folder / n).read_bytes() for n in _names(folder) if n.endswith(("n", "t", "l"))}
    with caplog.at_level(logging.WARNING, logger=rollback_mod.__name__):
        with _outputs(folder, "later", force=True):
            pass
    assert "which run old's commit has since replaced" in caplog.text
    assert not staging.exists()
    assert {n: (folder / n).read_bytes() for n in before} == before
    assert json.loads((folder / "m.json").read_text())["run_id"] == "old"


def test_a_commit_refuses_while_another_commit_in_the_folder_is_unsettled(tmp_path):
    """A run that died during its commit after this run had started (so this run's sweep
    could not settle it): this commit is refused before it changes anything, so it can never
    remove the dead run's only kept copies."""
    from ldp_beam.pipelines.outputs import OutputError

    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder)
    outs = _outputs(folder, "new", force=True)
    with outs:
        for role in outs.outputs:
            outs.write(outs.staged(role), b"new")
        (folder / ("r.parquet" + PREVIOUS_SUFFIX)).write_bytes(b"older-r")
        _dead_journal(folder, "dead", [
            _file_change(folder, "manifest", "m.json", False),
            _file_change(folder, "reports", "r.parquet", True, b"old-r")], replaces="older")
        with pytest.raises(OutputError, match="an earlier run's commit in this folder is not "
                           "settled .*nothing was committed"):
            outs.commit({"command": "test"})
    assert (folder / ("r.parquet" + PREVIOUS_SUFFIX)).read_bytes() == b"older-r"
    assert (folder / "r.parquet").read_bytes() == b"old-r"


def test_an_unreadable_manifest_keeps_the_journal(tmp_path, caplog):
    """Whether a dead run's commit finished is read from the manifest: one that cannot be read
    now is no answer, so nothing is touched and the journal stays."""
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder)
    (folder / "m.json").write_text("{not json")
    staging = _dead_journal(folder, "dead", [
        _file_change(folder, "manifest", "m.json", True),
        _file_change(folder, "reports", "r.parquet", False, b"old-r")])
    with caplog.at_level(logging.WARNING, logger=rollback_mod.__name__):
        with _outputs(folder, "later", force=True):
            pass
    assert staging.exists() and "cannot be read now" in caplog.text
    assert (folder / "r.parquet").read_bytes() == b"old-r"


def test_a_landed_manifest_is_removed_before_anything_is_put_back(tmp_path, monkeypatch):
    """The new manifest lands and its move then raises (an object store's copy, then a failed
    delete), and the reports' previous version cannot be put back: the new manifest must not
    stay over outputs that are now partly old, and the previous one stays aside."""
    from ldp_beam.pipelines.outputs import OutputError

    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder)
    outs = _outputs(folder, "new", force=True)
    real = outputs_mod._move

    def move(src, dst, flags=()):
        if src.endswith("_manifest.json"):
            real(src, dst, flags)
            raise OSError(5, "Input/output error", src)
        if src.endswith("r.parquet" + PREVIOUS_SUFFIX):
            raise OSError(13, "Permission denied", dst)
        return real(src, dst, flags)

    with outs:
        for role in outs.outputs:
            outs.write(outs.staged(role), b"new-" + role[0].encode())
        monkeypatch.setattr(outputs_mod, "_move", move)  # the commit's moves
        monkeypatch.setattr(rollback_mod, "_move", move)  # and the rollback's
        with pytest.raises(OutputError, match="rolling back failed .*no manifest vouches"):
            outs.commit({"command": "test"})
    assert not (folder / "m.json").exists()
    assert (folder / ("m.json" + PREVIOUS_SUFFIX)).exists()
    monkeypatch.setattr(outputs_mod, "_move", real)
    monkeypatch.setattr(rollback_mod, "_move", real)
    owner = os.path.join(outs.staging, outputs_mod.OWNER_FILE)
    rec = json.loads(open(owner).read())
    with open(owner, "w") as fh:
        json.dump({**rec, "pid": _dead_pid()}, fh)
    with _outputs(folder, "later", force=True):
        pass
    assert json.loads((folder / "m.json").read_text())["run_id"] == "old"
    assert (folder / "r.parquet").read_bytes() == b"old-r"
    assert _names(folder) == ["d.jsonl", "m.json", "r.parquet"]


def test_a_duckdb_table_of_that_name_in_another_schema_is_not_the_previous_one(tmp_path,
                                                                             monkeypatch):
    duckdb = pytest.importorskip("duckdb")

    folder = tmp_path / "out"
    folder.mkdir()
    db = tmp_path / "t.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE SCHEMA other; CREATE TABLE other.est AS SELECT 1 AS x")
    con.close()
    _manifest_fails(folder, f"duckdb://{db}?table=est", monkeypatch)
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT table_schema, table_name FROM information_schema.tables"
                           ).fetchall() == [("other", "est")]
    finally:
        con.close()


def test_a_postgresql_table_with_a_view_on_it_is_refused_and_left_whole(tmp_path,
                                                                      fresh_pg_url):
    """A rename would carry the view to the kept table (showing old rows for good): the table
    write refuses, naming the view, and the commit rolls back."""
    psycopg = pytest.importorskip("psycopg")
    pytest.importorskip("adbc_driver_postgresql")
    from ldp_beam.pipelines.outputs import OutputError
    from ldp_beam.transforms.sinks import tidy_bytes

    url = fresh_pg_url + ("&" if "?" in fresh_pg_url else "?") + "table=est"
    folder = tmp_path / "out"
    folder.mkdir()
    _commit_old(folder, url, tidy_bytes([{"statistic": "mean", "value": 0.25}], "parquet"))
    with psycopg.connect(fresh_pg_url, autocommit=True) as con:
        con.execute("CREATE VIEW dash AS SELECT value FROM est")
    outs = _outputs(folder, "new", url, force=True)
    with outs:
        outs.write(outs.staged("estimate"),
                   tidy_bytes([{"statistic": "mean", "value": 0.75}], "parquet"))
        outs.write(outs.staged("dead_letter"), b"new-d")
        with pytest.raises(OutputError, match="the view.s. dash depend on it"):
            outs.commit({"command": "test"})
    with psycopg.connect(fresh_pg_url) as con:
        assert con.execute("SELECT value FROM dash").fetchall() == [(0.25,)]
        assert sorted(r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()) == ["dash", "est"]
    assert json.loads((folder / "m.json").read_text())["run_id"] == "old"
    assert (folder / "d.jsonl").read_bytes() == b"old-d"


def test_the_journal_holds_no_password_and_recovery_uses_the_runs_own_url(tmp_path,
                                                                         monkeypatch):
    url = "postgresql://u:s3cret@localhost:5/db?sslmode=disable&password=s3cret&table=t"
    change = {"role": "estimate", "table": url, "keep": "t__ldp_beam_previous",
              "previous": True}
    stored = outputs_mod._redacted(change)["table"]
    assert "s3cret" not in stored and stored.startswith("postgresql://u:***@")
    folder = tmp_path / "out"
    folder.mkdir()
    staging = _dead_journal(folder, "dead", [_file_change(folder, "manifest", "m.json", False),
                                             outputs_mod._redacted(change)])
    seen = []
    monkeypatch.setattr(rollback_mod, "_undo", lambda plan, flags, run: seen.append(plan) or [])
    assert rollback_mod.recover_commit(str(staging), urls={stored: url}) == []
    assert seen[0][1]["table"] == url

