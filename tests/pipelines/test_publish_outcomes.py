"""How lifecycle.publish settles a run when something happens during the commit (a review,
2026-11-28), with a real RunOutputs in tmp_path and a real SQLite ledger:

* a SIGINT arriving during the commit is held; once the outputs and the ledger entry are
  committed it is raised as an Interrupted that says the run committed, and the command line
  says so (it used to print "nothing was committed ... reservation given back");
* a move that puts its file in place and then raises (an object store's rename: copy, then a
  failed delete of the staged object) leaves the entry pending, not aborted: ``published`` is
  empty then, but the output's location changed (``visible``, looked at before the commit is
  rolled back: the new file was there for a moment, and the rollback takes it away again).
"""
from __future__ import annotations

import errno
import os
import shutil
import signal

import pytest

from ldp_beam.ledger import Ledger
from ldp_beam.pipelines import cli, lifecycle
from ldp_beam.pipelines import outputs as outputs_mod
from ldp_beam.pipelines.lifecycle import Interrupted
from ldp_beam.pipelines.outputs import OutputError, RunOutputs

DATASET = {"dataset": "/data/a.csv", "uri": "/data/a.csv", "fingerprint": "sha256:aaa"}


@pytest.fixture
def handlers():
    """lifecycle's SIGINT/SIGTERM handlers for the test, the previous ones restored after."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    lifecycle.install_signal_handlers()
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    lifecycle._pending.clear()


def _outputs(folder, cls=RunOutputs, run_id="run-1", **kw):
    return cls({"reports": str(folder / "r.parquet"), "dead_letter": str(folder / "d.jsonl")},
               str(folder / "r.parquet.manifest.json"), run_id, **kw)


def _stage(outs, reports=b"new-r", dead_letter=b"new-d"):
    outs.write(outs.staged("reports"), reports)
    outs.write(outs.staged("dead_letter"), dead_letter)


def _status(led, run_id="run-1"):
    return {e["run_id"]: e for e in led.entries()}[run_id]["status"]


def _reserve(led, run_id="run-1"):
    return led.reserve(run_id, DATASET, command="collect", mechanism="grr", epsilon=0.5)


class SignalledOutputs(RunOutputs):
    """A RunOutputs that receives SIGINT while it commits (when it digests its staged files,
    before anything is moved into place)."""

    def digest(self, role):
        if getattr(self, "_committing", False) and not getattr(self, "_signalled", False):
            self._signalled = True
            os.kill(os.getpid(), signal.SIGINT)
        return super().digest(role)

    def commit(self, manifest):
        self._committing = True
        try:
            return super().commit(manifest)
        finally:
            self._committing = False


def test_an_interrupt_during_the_commit_is_reported_as_committed(tmp_path, handlers, capsys):
    folder = tmp_path / "out"
    with Ledger.open("sqlite:///" + str(tmp_path / "l.db")) as led:
        outs = _outputs(folder, SignalledOutputs)
        with pytest.raises(Interrupted) as caught:
            with outs, _reserve(led) as entry:
                _stage(outs)
                lifecycle.publish(entry, outs, {"command": "test"})
        assert outs._signalled  # the signal did arrive during the commit
        assert _status(led) == "committed"
    assert (folder / "r.parquet").read_bytes() == b"new-r"
    assert (folder / "r.parquet.manifest.json").exists()
    stop = caught.value
    assert stop.committed and stop.entry == "committed" and stop.run_id == "run-1"
    assert stop.manifest == str(folder / "r.parquet.manifest.json")
    assert cli._interrupted("collect", stop) == 130
    err = capsys.readouterr().err
    assert "nothing was committed" not in err and "given back" not in err
    assert "run-1 committed" in err and str(folder / "r.parquet.manifest.json") in err
    assert "its ledger entry is committed" in err


def test_an_interrupt_before_publishing_still_says_nothing_was_committed(capsys):
    """The message for an ordinary interrupt (nothing published) is unchanged."""
    assert cli._interrupted("collect", Interrupted(signal.SIGTERM)) == 143
    assert "nothing was committed" in capsys.readouterr().err


def _copy_then_fail(monkeypatch, copy: bool):
    """outputs._move that, on its first move of a staged output into place, copies the file
    there (when ``copy``) and then raises: an object store's rename whose delete of the staged
    object fails."""
    real = outputs_mod._move
    calls = []

    def move(src, dst, flags=()):
        if not calls and outputs_mod.STAGING_PREFIX in src and not src.endswith(
                "_manifest.json"):
            calls.append(dst)
            if copy:  # landed as a move lands: a new file at dst (never written through it)
                shutil.copyfile(src, dst + ".landing")
                os.replace(dst + ".landing", dst)
            raise OSError(errno.EIO, os.strerror(errno.EIO), src)
        return real(src, dst, flags)

    monkeypatch.setattr(outputs_mod, "_move", move)
    return calls


def _failed_publish(tmp_path, monkeypatch, previous, copy):
    """publish() with the first move failing (after copying its file into place when ``copy``),
    over a committed run's outputs and manifest when ``previous`` (replaced with --force):
    (the folder, the RunOutputs, the entry's status, its note)."""
    folder = tmp_path / "out"
    folder.mkdir()
    if previous:
        (folder / "r.parquet").write_bytes(b"old-r")
        (folder / "d.jsonl").write_bytes(b"old-d")
        (folder / "r.parquet.manifest.json").write_bytes(b"{}")
    with Ledger.open("sqlite:///" + str(tmp_path / "l.db")) as led:
        outs = _outputs(folder, force=previous)
        with outs, _reserve(led) as entry:
            _stage(outs)
            with monkeypatch.context() as m:
                _copy_then_fail(m, copy=copy)
                with pytest.raises(OutputError):
                    lifecycle.publish(entry, outs, {"command": "test"})
        note = {e["run_id"]: e for e in led.entries()}["run-1"]["note"]
        return folder, outs, _status(led), note


@pytest.mark.parametrize("previous", [False, True], ids=["new", "replacing"])
def test_a_move_that_lands_then_raises_leaves_the_entry_pending(tmp_path, monkeypatch,
                                                                 previous):
    folder, outs, status, note = _failed_publish(tmp_path, monkeypatch, previous, copy=True)
    assert outs.published == []  # what the old code judged by
    first = list(outs.outputs)[0]
    assert outs.visible == [first] and status == "pending"  # it was seen: its spend counted
    assert "may have published" in note and "--resolve run-1" in note
    path = folder / ("d.jsonl" if first == "dead_letter" else "r.parquet")
    if previous:  # rolled back: the previous version is back
        assert path.read_bytes().startswith(b"old-")
    else:
        assert not path.exists()


def test_a_move_that_fails_before_landing_still_aborts(tmp_path, monkeypatch):
    """Provably nothing moved (every location as before): the reservation is given back."""
    folder, _, status, _ = _failed_publish(tmp_path, monkeypatch, True, copy=False)
    assert status == "aborted"
    assert (folder / "r.parquet").read_bytes() == b"old-r"
    assert (folder / "d.jsonl").read_bytes() == b"old-d"


def test_an_interrupt_during_a_failed_publish_that_left_it_pending_says_so(
        tmp_path, monkeypatch, handlers, capsys):
    """A signal held while a commit failed half way: the entry stays pending, and the message
    says so instead of "reservation given back"."""
    folder = tmp_path / "out"
    with Ledger.open("sqlite:///" + str(tmp_path / "l.db")) as led:
        outs = _outputs(folder)
        real = outputs_mod._move

        def move(src, dst, flags=()):
            shutil.copyfile(src, dst)
            os.kill(os.getpid(), signal.SIGINT)
            raise OSError(errno.EIO, os.strerror(errno.EIO), src)

        with outs, _reserve(led) as entry:
            _stage(outs)
            with monkeypatch.context() as m:
                m.setattr(outputs_mod, "_move", move)
                with pytest.raises(Interrupted) as caught:
                    lifecycle.publish(entry, outs, {"command": "test"})
        assert real is outputs_mod._move
        assert _status(led) == "pending"
    stop = caught.value
    assert not stop.committed and stop.entry == "pending"
    assert cli._interrupted("collect", stop) == 130
    err = capsys.readouterr().err
    assert "given back" not in err and "stays pending" in err and "run-1" in err
