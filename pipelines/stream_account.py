"""What a stream spends in the team's budget ledger (:mod:`ldp_beam.ledger`).

A batch run reserves its guarantee's epsilon before it draws noise and commits it with its
outputs (:class:`~.run.Run`). A stream cannot know its cost in advance: it publishes window
after window, for as long as it runs, and a restart continues the same deployment (the same
output folder). What a deployment has cost a person is the largest loss any one unit has taken
over its whole life, ``M``; every run of the deployment records in the ledger what it added to
``M``, so the entries of a deployment sum to ``M`` whatever the number of runs:

* **with a privacy unit**, ``M`` is the largest cumulative loss in the stream's per-unit state
  (``OUT/units.sqlite``, :class:`ldp_beam.longitudinal.UnitState`: exact, durable, written in the
  same transaction that admits a report). A run reserves the most it can add: up to the unit
  cap (``--unit-budget``), and never past the dataset's budget in the ledger — where the budget
  leaves less room than the unit cap, or there is no unit cap, **the unit cap becomes** the
  loss already taken plus what the budget has left, so no person can ever be taken past the
  dataset's budget by the stream (the run says so). Without either, the reservation is
  unbounded (infinite) until the run ends. At the end it commits the increase of ``M``.
* **without a privacy unit** the guarantee is per record only: each record is estimated by one
  deployment once (a restart re-reads only unsettled files, and a central window's releases
  count across restarts), so a record's loss over the deployment's life is the stream
  guarantee's epsilon (a central window's releases composed). The deployment's first run that
  publishes records it; later runs record 0.

The entry is settled whatever ends the run: committed with what was spent when anything was
published or charged (a stream publishes as it goes, so a failed run has spent what it
published), given back when nothing was. A run killed outright leaves its reservation pending,
counted as spent; the deployment's next run on the same host settles it exactly (the
deployment's largest unit loss less what its committed entries account for), and an operator
resolves one of another host (``ldp-beam ledger --resolve``), as for any run.

The dataset is ``--dataset NAME``, else the source: the spool folder's real path, or
``pubsub://projects/P/subscriptions/S``. Its content fingerprint, which a stream does not have,
is recorded as ``stream:`` and the output folder (the deployment).
"""
from __future__ import annotations

import math
import os
import socket
from typing import Any, Mapping

from ldp_beam.ledger import BUDGET_TOLERANCE, Ledger, canonical_location, check_dataset_name
from ldp_beam.transforms.stream_results import jsonl_rows
from ldp_beam.transforms.windowed import ESTIMATES, PrivacyUnit, StreamConfigError

from .lifecycle import ledger_state


def stream_dataset(source: str, out_dir: str, name: str | None = None) -> dict:
    """The ledger identity of a stream deployment reading ``source`` (a spool folder or a
    ``pubsub://`` subscription) into ``out_dir`` (see the module docstring)."""
    uri = canonical_location(source)
    return {"dataset": check_dataset_name(name) if name is not None else uri, "uri": uri,
            "fingerprint": "stream:" + os.path.realpath(out_dir)}


def published_before(out_dir: str) -> bool:
    """Whether any run of the deployment in ``out_dir`` published a pane."""
    path = os.path.join(out_dir, ESTIMATES)
    if not os.path.exists(path):
        return False
    with open(path) as fh:
        return any(line.strip() for line in fh)


def published_by(out_dir: str, run_id: str) -> bool:
    """Whether run ``run_id`` published a pane in ``out_dir``."""
    return any(row.get("run") == run_id for row in jsonl_rows(os.path.join(out_dir, ESTIMATES)))


class StreamAccount:
    """One stream run's ledger entry (see the module docstring): :meth:`open` before anything
    is read, then :meth:`settle` whatever ends the run. After :meth:`open`,
    ``cap_from_budget`` is the unit cap the dataset's budget imposes, when it is lower than the
    stream's own (:meth:`~ldp_beam.transforms.windowed.WindowedEstimate.cap_units` applies it).
    """

    def __init__(self, url: str | None, dataset: Mapping[str, Any], out_dir: str, run_id: str,
                 *, mechanism: Any, guarantee: Mapping[str, Any], unit: PrivacyUnit | None,
                 seeded: bool, budget: float | None = None,
                 budget_delta: float | None = None) -> None:
        self.url, self.dataset, self.out_dir, self.run_id = url, dict(dataset), out_dir, run_id
        self.mechanism, self.guarantee, self.unit, self.seeded = (
            mechanism, dict(guarantee), unit, seeded)
        self.budget, self.budget_delta = budget, budget_delta
        self.led: Ledger | None = None
        self.entry: Any = None
        self.loss_before = 0.0
        self.reserved = 0.0
        self.cap_from_budget: float | None = None
        self.recorded: float | None = None
        self.orphans: list[dict] = []

    # -- M, the deployment's largest loss of one unit
    def loss(self) -> float:
        if self.unit is not None:
            return self.unit.state.max_loss()
        return float(self.guarantee["epsilon"]) if published_before(self.out_dir) else 0.0

    def open(self) -> "StreamAccount":
        """Reserve the most this run can add to the deployment's largest unit loss, after the
        budget check (:meth:`Ledger.reserve`); with a privacy unit, first lower the unit cap to
        what the dataset's budget leaves."""
        delta = float(self.guarantee.get("delta") or 0.0)
        if self.unit is not None and delta > 0:
            raise StreamConfigError(
                f"--privacy-unit {self.unit.field}: {self.mechanism.name} has delta={delta:g}; "
                "the stream's per-unit state accounts epsilon only, so its spend cannot be "
                "recorded in the budget ledger")
        self.led = Ledger.open(self.url)
        try:
            self.loss_before = m0 = self.loss()
            self.orphans = self._settle_orphans(m0)
            if self.unit is None:
                self.reserved = max(0.0, float(self.guarantee["epsilon"]) - m0)
            else:
                self.reserved = self._unit_room(m0)
            self.entry = self.led.reserve(
                self.run_id, self.dataset, command="stream", mechanism=self.mechanism.name,
                params=self.mechanism.params(), epsilon=self.reserved,
                delta=delta if self.reserved > 0 else 0.0, kind=self.guarantee.get("kind"),
                unit=None if self.unit is None else self.unit.field, seeded=self.seeded,
                budget=self.budget, budget_delta=self.budget_delta,
                note=f"stream deployment {self.dataset['fingerprint'][len('stream:'):]}")
        except BaseException:
            self.led.close()
            self.led = None
            raise
        return self

    def _settle_orphans(self, m0: float) -> list[dict]:
        """Settle, exactly, the earlier runs of this deployment that a kill left pending (run on
        this host by a process that is gone): together they added to the deployment's largest
        unit loss what its committed entries do not account for, ``m0`` less their sum; that
        remainder is committed to them, oldest first, each at most its reservation, and a run
        that published and charged nothing is aborted. A pending run of another host, or of a
        process still alive, is left to an operator (``ldp-beam ledger --resolve``)."""
        mine = [e for e in self.led.entries(dataset=self.dataset["dataset"])
                if e["fingerprint"] == self.dataset["fingerprint"] and e["run_id"] != self.run_id]
        orphans = [e for e in mine if e["status"] == "pending" and _gone(e)]
        rest = max(0.0, m0 - math.fsum(e["epsilon"] for e in mine if e["status"] == "committed"))
        settled = []
        for e in orphans:
            amount = min(rest, float(e["epsilon"]))
            rest -= amount
            why = f"settled by the restart {self.run_id} of its stream"
            if amount > 0 or published_by(self.out_dir, e["run_id"]):
                self.led.resolve(e["run_id"], "committed", why + " (what its units were "
                                 "charged, from the stream's per-unit state)"
                                 if self.unit is not None else why, epsilon=amount)
                settled.append({"run": e["run_id"], "as": "committed", "epsilon": amount})
            else:
                self.led.resolve(e["run_id"], "aborted", why + ": it published and charged "
                                 "nothing")
                settled.append({"run": e["run_id"], "as": "aborted", "epsilon": 0.0})
        return settled

    def _unit_room(self, m0: float) -> float:
        """What this run may add to the largest unit loss: the unit cap less ``m0``, the cap
        lowered to ``m0`` plus the dataset's remaining budget where that is less."""
        recorded = self.led.budget(self.dataset["dataset"])[0]
        budget = recorded if self.budget is None else \
            self.budget if recorded is None else min(self.budget, recorded)
        left = None
        if budget is not None:
            left = max(0.0, budget - self.led.spent(self.dataset["dataset"]).epsilon)
            if left <= budget * BUDGET_TOLERANCE + 1e-12:
                raise StreamConfigError(
                    f"dataset {self.dataset['dataset']!r}: its budget epsilon={budget:g} is "
                    "spent; this stream could not estimate a single report (`ldp-beam ledger "
                    "--set-budget` raises it, recorded with why)")
        if left is not None and not math.isfinite(float(self.guarantee["epsilon"])):
            raise StreamConfigError(
                f"dataset {self.dataset['dataset']!r} has a budget (epsilon={budget:g}); "
                f"{self.mechanism.name} has no finite epsilon, so no report of it fits one")
        cap = self.unit.budget
        if left is not None and (cap is None or m0 + left < cap):
            cap = self.cap_from_budget = m0 + left
        return math.inf if cap is None else max(0.0, cap - m0)

    def settle(self, failed: BaseException | None = None,
               published: bool | None = None) -> dict | None:
        """Commit what the run added to the deployment's largest unit loss, or give the
        reservation back when it published and charged nothing. ``published``: whether this
        run released a pane, when its summary knows (its own ledger rows); None (a failed run)
        reads the deployment's estimates for it. Returns what the summary says about the
        ledger (None if :meth:`open` did not reserve)."""
        entry, self.entry = self.entry, None  # settled once, whatever happens below
        if entry is None:
            return None
        try:
            added = max(0.0, self.loss() - self.loss_before)
            if self.unit is None:
                added = min(added, self.reserved)
            if published is None:
                published = published_by(self.out_dir, self.run_id)
            if added > 0 or published:
                entry.commit(outputs={"stream": self.out_dir}, epsilon=added)
                self.recorded = added
            else:
                entry.abort("the stream published nothing and charged no unit"
                                 + (f" ({type(failed).__name__}: {failed})" if failed else ""))
            state = ledger_state(self.led, self.dataset["dataset"], self.url)
        finally:
            self.led.close()
        return {**state, "run_epsilon": self.recorded, "reserved": self.reserved,
                "settled_killed_runs": self.orphans,
                "unit_cap_from_budget": self.cap_from_budget,
                "deployment_max_unit_loss": self.loss_before + (self.recorded or 0.0)}


def settle_or_say(account: StreamAccount, log: Any, failed: BaseException | None = None,
                  published: bool | None = None) -> dict | None:
    """``account.settle(failed, published)``; a ledger that cannot be settled (unreachable, replaced)
    leaves the entry pending, counted at what the run reserved (never less than it spent): that
    is said (``log`` and the returned ``error``), not raised over the run's own outcome."""
    try:
        return account.settle(failed, published)
    except Exception as exc:
        said = (f"the ledger entry of run {account.run_id} was not settled ({exc}); it stays "
                "pending and counts at what the run reserved until it is resolved (`ldp-beam "
                f"ledger --resolve {account.run_id}`, or this deployment's next run on this "
                "host)")
        log(said)
        return {"error": said, "pending": account.run_id}


def _gone(entry: Mapping[str, Any]) -> bool:
    """Whether the process that reserved ``entry`` is gone: it ran on this host and no process
    has its id (a reused id reads as alive: left pending, the conservative side)."""
    if entry.get("host") != socket.gethostname() or not entry.get("pid"):
        return False
    pid = int(entry["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


__all__ = ["StreamAccount", "stream_dataset", "published_before", "published_by",
           "settle_or_say"]
