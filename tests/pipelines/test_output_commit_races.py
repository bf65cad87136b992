"""Two runs on the same outputs (a review of the lifecycle, 2026-11-28): both passed the check
at their start, so the second used to replace the first's committed outputs and manifest
without --force. Its commit now re-checks, and commits to one manifest take turns (a lock file
beside it); another host's staging folder is left alone until it is old."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from ldp_beam.pipelines.outputs import OutputError, RunOutputs
from ldp_beam_test_helpers import held_lock
from ldp_beam.pipelines.rollback import REMOTE_STALE_SECONDS, _abandoned, sweep_stale


def _staged(tmp_path, run_id, body, force=False):
    outs = RunOutputs({"estimate": str(tmp_path / "e.json")}, str(tmp_path / "e.manifest.json"),
                      run_id, force=force)
    outs.__enter__()
    outs.write(outs.staged("estimate"), body)
    return outs


def test_a_second_run_does_not_replace_the_first_runs_commit_unasked(tmp_path):
    a, b = _staged(tmp_path, "run-a", b"A\n"), _staged(tmp_path, "run-b", b"B\n")
    a.commit({"command": "test"})
    a.__exit__(None, None, None)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(OutputError, match="was created while the run ran.*--force.*nothing "
                       "was committed") as err:
        b.commit({"command": "test"})
    assert str(tmp_path / "e.json") in str(err.value)
    b.__exit__(None, None, None)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before and (tmp_path / "e.json").read_bytes() == b"A\n"
    # asked: replaced
    c = _staged(tmp_path, "run-c", b"C\n", force=True)
    c.commit({"command": "test"})
    c.__exit__(None, None, None)
    assert (tmp_path / "e.json").read_bytes() == b"C\n"
    assert json.loads((tmp_path / "e.manifest.json").read_text())["run_id"] == "run-c"
    assert not (tmp_path / "e.manifest.json.lock").exists()


def _lock(tmp_path, pid):
    """A lock file left behind, naming ``pid``, that no process holds."""
    (tmp_path / "e.manifest.json.lock").write_text(json.dumps(
        {"host": socket.gethostname(), "pid": pid, "run_id": "run-other"}))


def test_a_commit_held_by_a_live_run_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path):
    lock = tmp_path / "e.manifest.json.lock"
    a = _staged(tmp_path, "run-a", b"A\n", force=True)
    with held_lock(lock, {"host": socket.gethostname(), "pid": 1, "run_id": "run-other"}):
        with pytest.raises(OutputError, match="another run \\(run-other\\) is committing"):
            a.commit({"command": "test"})
    a.__exit__(None, None, None)
    assert not (tmp_path / "e.json").exists() and not (tmp_path / "e.manifest.json").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _lock(tmp_path, dead.pid)
    b = _staged(tmp_path, "run-b", b"B\n", force=True)
    b.commit({"command": "test"})
    b.__exit__(None, None, None)
    assert (tmp_path / "e.json").read_bytes() == b"B\n"
    assert not (tmp_path / "e.manifest.json.lock").exists()


def test_another_hosts_staging_folder_is_abandoned_only_when_old():
    owner = {"host": "another-host.invalid", "pid": 1}
    assert not _abandoned(owner, 0.5)  # a shared NFS folder: a live run's
    assert not _abandoned(owner, REMOTE_STALE_SECONDS - 1)
    assert _abandoned(owner, REMOTE_STALE_SECONDS)


def test_a_sweep_leaves_another_hosts_live_staging_folder_alone(tmp_path):
    live = tmp_path / ".ldp-beam-staging-run-a"
    live.mkdir()
    (live / "OWNER").write_text(json.dumps({"host": "another-host.invalid", "pid": 1,
                                            "run_id": "run-a"}))
    (live / "part.parquet").write_bytes(b"A")
    outs = _staged(tmp_path, "run-b", b"B\n")  # entering sweeps the folder
    outs.__exit__(None, None, None)
    assert (live / "part.parquet").read_bytes() == b"A"
    old = time.time() - REMOTE_STALE_SECONDS - 60
    os.utime(live, (old, old))
    assert sweep_stale(str(tmp_path)) == [str(live)] and not live.exists()


def test_the_lock_is_the_kernels_not_the_record_in_the_file(tmp_path):
    """Whether a commit lock is held is asked of the kernel (``flock``), not read from the
    owner record in the file: a file naming a live process (a reused pid) that no process
    holds is taken, and a file naming a dead one that a live run holds (the moment after that
    run took it over, before it wrote its own record) is not: two runs taking over one stale
    lock used to both commit."""
    lock = tmp_path / "e.manifest.json.lock"
    _lock(tmp_path, os.getpid())  # names a live process, held by none
    a = _staged(tmp_path, "run-a", b"A\n")
    a.commit({"command": "test"})
    a.__exit__(None, None, None)
    assert json.loads((tmp_path / "e.manifest.json").read_text())["run_id"] == "run-a"
    assert not lock.exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    b = _staged(tmp_path, "run-b", b"B\n", force=True)
    with held_lock(lock, {"host": socket.gethostname(), "pid": dead.pid, "run_id": "run-x"}):
        old = time.time() - REMOTE_STALE_SECONDS - 60
        os.utime(lock, (old, old))  # neither age
        with pytest.raises(OutputError, match="another run \\(run-x\\) is committing"):
            b.commit({"command": "test"})
    b.__exit__(None, None, None)
    assert (tmp_path / "e.json").read_bytes() == b"A\n"
    assert json.loads((tmp_path / "e.manifest.json").read_text())["run_id"] == "run-a"


def test_a_staging_folder_lives_as_long_as_its_runs_lock_not_its_pid(tmp_path):
    """A sweep tells a live run's staging folder from a dead one's by the flock the run holds
    on its owner file: a folder naming a live process (a reused pid) that nobody holds is
    removed; one naming a dead pid that a live run holds is kept; this run's own folder holds
    its lock until the run ends."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    reused = tmp_path / ".ldp-beam-staging-run-reused"
    reused.mkdir()
    (reused / "OWNER").write_text(json.dumps({"host": host, "pid": os.getpid(), "flock": True}))
    held = tmp_path / ".ldp-beam-staging-run-held"
    held.mkdir()
    with held_lock(held / "OWNER", {"host": host, "pid": dead.pid, "flock": True}):
        outs = _staged(tmp_path, "run-a", b"A\n")
        assert not reused.exists() and held.exists()
        assert sweep_stale(str(tmp_path)) == [] and (tmp_path / ".ldp-beam-staging-run-a").exists()
        outs.__exit__(None, None, None)
    assert sweep_stale(str(tmp_path)) == [str(held)]


def test_another_hosts_or_an_unnamed_lock_file_waits_until_it_is_old(tmp_path, caplog):
    """On a shared disk mounted without lock support, another host's flock cannot be seen: a
    lock file naming another host's run is taken only once it is a day old, and one with no
    owner written yet (just created) only once it is a minute old; the warning says which
    (not that a process is known to be gone)."""
    lock = tmp_path / "e.manifest.json.lock"
    a = _staged(tmp_path, "run-a", b"A\n", force=True)
    lock.write_text(json.dumps({"host": "another-host.invalid", "pid": 1, "run_id": "run-o"}))
    with pytest.raises(OutputError, match="another run \\(run-o on host another-host.invalid"):
        a.commit({"command": "test"})
    lock.write_text("")
    with pytest.raises(OutputError, match="another run \\(not yet named\\)"):
        a.commit({"command": "test"})
    a.__exit__(None, None, None)
    assert not (tmp_path / "e.json").exists() and lock.exists()
    for record, age, why in (
            ("", 61, "no owner recorded; it is 61 s old"),
            (json.dumps({"host": "another-host.invalid", "pid": 1}), REMOTE_STALE_SECONDS + 60,
             "no live owner can be seen; it is 24.0 hours old")):
        caplog.clear()
        lock.write_text(record)
        old = time.time() - age
        os.utime(lock, (old, old))
        b = _staged(tmp_path, "run-b", b"B\n", force=True)
        with caplog.at_level(logging.WARNING, logger="ldp_beam.pipelines.rollback"):
            b.commit({"command": "test"})
        b.__exit__(None, None, None)
        assert (tmp_path / "e.json").read_bytes() == b"B\n" and not lock.exists()
        assert f"taking the commit lock {lock} left by run unknown ({why})" in caplog.text


def test_an_owner_file_that_is_not_a_json_object_counts_as_no_owner(tmp_path):
    """A staging folder whose OWNER holds JSON that is not an object (a list here) is read as
    having no owner, as an unreadable one is: kept while it may be a run just starting, swept
    once a minute old. It used to stop every sweep of the folder with an AttributeError."""
    odd = tmp_path / ".ldp-beam-staging-run-odd"
    odd.mkdir()
    (odd / "OWNER").write_text("[1, 2]")
    assert sweep_stale(str(tmp_path)) == [] and odd.exists()
    old = time.time() - 61
    os.utime(odd, (old, old))
    assert sweep_stale(str(tmp_path)) == [str(odd)] and not odd.exists()
