"""The end of a batch run, written once: settle the ledger, publish, stop cleanly on a signal.

Every batch command (``collect``, ``estimate``, the central releases) ends the same way, and this
module is that way:

1. :func:`publish` first **prepares** the run's ledger entry (:meth:`Reservation.prepare
   <ldp_beam.ledger.Reservation.prepare>`: the ledger is still the one the run reserved in, the
   entry is still pending, its outputs and release are stored) — a ledger deleted, replaced or
   damaged since the reservation stops the run here, with nothing published;
2. then moves the staged outputs into place with the manifest last
   (:meth:`RunOutputs.commit <.outputs.RunOutputs.commit>`). If that fails, the commit has put
   the previous outputs back, and the entry is settled as it truly is: **aborted** when nothing
   new was ever visible, left **pending** (counted as spent, for an operator to resolve) when
   some new output was in place, if only for a moment;
3. and only then marks the entry **committed**. A ledger lost in the milliseconds between 2 and
   3 leaves the entry pending (it counts as spent) and says so; it never claims a commit.

So the ledger never says *committed* for a run that did not commit, and never lets a run publish
without an entry that counts its spend.

Signals: :func:`install_signal_handlers` makes SIGINT and SIGTERM raise :class:`Interrupted`
wherever the main thread is (in a Beam bundle too), so every ``with`` block on the way out runs:
the staging folder is removed and a reserved ledger entry is aborted. During :func:`publish` the
signal is held until the outputs and the ledger agree (:func:`deferred_signals`), and the
:class:`Interrupted` then raised says how the run was settled. The command line prints one line
saying so and exits 130 (SIGINT) or 143 (SIGTERM). :class:`QuietBeamErrors` keeps Beam's
``ERROR`` log lines (a failed bundle's traceback) off the console when the failure is ours (an
interrupt, a size cap, a parameter): the one-line message says everything.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any, Iterator, Mapping

from ldp_beam.errors import LdpBeamError
from ldp_beam.ledger import LedgerError

from . import outputs as _outputs
from .ledger_cli import ledger_outputs


# ------------------------------------------------------------------------------ signals
class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the run unwinds (staging removed, ledger entry aborted).

    A ``KeyboardInterrupt`` (so a ``BaseException``, which no ``except Exception`` swallows)
    because library code that must not lose an interrupt re-raises exactly that class from its
    bare ``except:`` clauses: Beam's ``is_in_ipython`` re-raises ``KeyboardInterrupt`` and
    ``SystemExit`` and logs and drops anything else, so a SIGTERM landing while it imports
    IPython (pipeline construction) was lost and the run committed.

    A signal held by :func:`publish` says how the run was settled, so the command line never
    reports "nothing was committed" for a run that did: :attr:`committed` (the outputs and their
    manifest, :attr:`manifest`, are in place), :attr:`entry` (the ledger entry's state:
    ``"committed"``, ``"pending"`` (spent until ``ldp-beam ledger --resolve``), ``"aborted"``,
    or None when the run stopped before publishing) and :attr:`run_id`. The exit code stays
    ``128 + signum`` (130, 143) whatever was committed."""

    def __init__(self, signum: int, committed: bool = False, manifest: str | None = None,
                 entry: str | None = None, run_id: str | None = None) -> None:
        self.signum = int(signum)
        self.committed = bool(committed)
        self.manifest = manifest
        self.entry = entry
        self.run_id = run_id
        super().__init__(f"interrupted by {signal.Signals(self.signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # 130 for SIGINT, 143 for SIGTERM, as a shell reports it

    def __reduce__(self):
        return (type(self), (self.signum, self.committed, self.manifest, self.entry,
                             self.run_id))


_held = threading.local()
_pending: list[int] = []


def _handler(signum: int, _frame: Any) -> None:
    if getattr(_held, "depth", 0):
        _pending.append(signum)  # raised when the critical section ends
        return
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread (a no-op elsewhere).
    SIGINT is handled even when the process was started with it ignored (a background job of a
    non-interactive shell), so ``kill -INT`` stops a run the same way Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _handler)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends (then raise the first one that arrived)."""
    _held.depth = getattr(_held, "depth", 0) + 1
    try:
        yield
    finally:
        _held.depth -= 1
        if not _held.depth and _pending:
            signum = _pending[0]
            _pending.clear()
            raise Interrupted(signum)


def interruption(exc: BaseException | None) -> Interrupted | None:
    """The :class:`Interrupted` an exception is or wraps (Beam wraps what a bundle raised)."""
    return in_chain(exc, Interrupted)


def in_chain(exc: BaseException | None, kind: type) -> Any:
    """The first exception of type ``kind`` in ``exc``'s cause/context chain (``exc`` itself
    included), or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class QuietBeamErrors(logging.Filter):
    """Drops log records whose exception is, or wraps, an interrupt or an ldp-beam error: Beam
    logs a failed bundle at ERROR with its traceback before re-raising, and the command line
    then reports the same failure in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            text = record.getMessage()
            return not text.startswith(("SystemExit", "Interrupted", "KeyboardInterrupt"))
        return in_chain(exc, (Interrupted, LdpBeamError, KeyboardInterrupt)) is None


def quiet_beam_errors() -> None:
    """Install :class:`QuietBeamErrors` on the root logger's handlers and Beam's loggers."""
    f = QuietBeamErrors()
    for h in logging.getLogger().handlers:
        h.addFilter(f)
    for name in ("apache_beam", "apache_beam.runners.common",
                 "apache_beam.runners.worker.sdk_worker",
                 "apache_beam.runners.portability.fn_api_runner.fn_runner"):
        logging.getLogger(name).addFilter(f)


# ------------------------------------------------------------------------------ publishing
def publish(entry: Any, outs: Any, manifest: Mapping[str, Any],
            release: Mapping[str, Any] | None = None) -> dict:
    """Prepare the ledger entry, commit the outputs, then commit the entry (see the module
    docstring). Returns the manifest as written. Raises what stopped it, with the entry settled:
    aborted only when :meth:`RunOutputs.commit <.outputs.RunOutputs.commit>`'s ``outs.visible``
    (looked at before it rolled back: an output moved into place, or one whose final location
    changed once its move began) is empty, else left pending (the new version may have been
    read, if only for a moment). A SIGINT/SIGTERM meanwhile is held and raised as
    :class:`Interrupted` once the entry is settled, carrying how (``committed``, ``manifest``,
    ``entry``)."""
    settled: dict[str, Any] = {}  # what an interrupt held until the end must report
    try:
        with deferred_signals():
            entry.prepare(ledger_outputs(outs), None if release is None else dict(release))
            try:
                written = outs.commit(dict(manifest))
            except BaseException as exc:
                shown = f"{type(exc).__name__}: {exc}"
                settled["entry"] = "pending"  # unless the abort below is recorded
                try:
                    if getattr(outs, "visible", True):
                        entry.leave_pending(f"publishing failed after some outputs may have "
                                            f"been in place ({shown}); it may have "
                                            f"published: resolve it with `ldp-beam ledger "
                                            f"--resolve {entry.run_id}`")
                    else:
                        entry.abort(f"publishing failed, nothing was published ({shown})")
                        settled["entry"] = "aborted"
                except LedgerError:
                    pass  # cannot reach the ledger: the entry stays pending and counts as spent
                raise
            settled.update(committed=True, entry="pending")
            try:
                entry.commit()
                settled["entry"] = "committed"
            except LedgerError as exc:
                print(f"ldp-beam: warning: the outputs of run {entry.run_id} are committed, but "
                      f"the ledger could not record it ({exc}); its entry stays pending and "
                      f"counts as spent: `ldp-beam ledger --resolve {entry.run_id} --as "
                      f"committed`", file=sys.stderr, flush=True)
    except Interrupted as stop:
        if settled:  # the held signal: say what the run left behind
            stop.committed = bool(settled.get("committed"))
            stop.entry = settled.get("entry")
            stop.run_id = getattr(entry, "run_id", None)
            if stop.committed:
                stop.manifest = _manifest_location(outs)
        raise
    return written


def _manifest_location(outs: Any) -> str | None:
    try:
        return _outputs.location(outs.manifest)
    except Exception:  # noqa: BLE001 - only a message's detail
        return None


def ledger_state(led: Any, dataset: str, url_given: str | None) -> dict:
    """What a run's output says about the ledger: which one it wrote to (and whether it was the
    default, chosen without ``--ledger``), the dataset's name, its budget, spend and what is
    left."""
    status = led.dataset_status(dataset)
    return {"url": led.url, "default": not url_given and not os.environ.get("LDP_BEAM_LEDGER"),
            **status}
