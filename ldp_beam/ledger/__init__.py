"""A budget ledger: every collection and release recorded, and a total budget per dataset.

What it holds
-------------
A dataset is a **name**, not its bytes: the people a budget protects stay the same people when
their table grows by a row, is re-exported or is moved. Its name is the run's ``--dataset NAME``,
else the input's canonical location (:func:`~ldp_beam.pipelines.datasets.dataset_identity`: the real path of a local file,
folder or glob, a URL without its credentials, a database table's canonical URL). Budgets
(``ldp_beam_datasets``), spending and per-unit stream spending (``ldp_beam_unit_spend``) are kept
per dataset name, whatever its content becomes.

One row per run (``ldp_beam_entries``): the run id, the command, the dataset's name, the location
it was read from and a fingerprint of the *content* read (a SHA-256 of the data, kept only to
re-publish an identical central release, :meth:`Ledger.find_release`, and to show which runs read
which version of the data), the privacy unit, the mechanism and its parameters, the epsilon and
delta it spends, the time, the status, its outputs (paths with size and SHA-256) and, for a
central release, the released JSON itself (what was published; never exact counts).

Budgets change only on purpose. :meth:`Ledger.set_budget` (``ldp-beam ledger --set-budget EPS
--dataset NAME --why TEXT``) is the recorded act that sets, raises or lowers one; a run's
``--budget`` may only set a budget where none is recorded, confirm the recorded one or lower it.
Every change is a row of ``ldp_beam_budget_changes`` (the new and previous budget, when, the OS
user and host, why, and the run that made it, if one did): :meth:`Ledger.budget_changes`.

Backends: a SQLite file (the default; WAL journal, ``synchronous=FULL``, a busy timeout; keep it
on a local disk, as SQLite's locking is not reliable over network file systems) or a shared team
database on PostgreSQL (psycopg 3). Both use the same tables, created when absent (unless
``Ledger.open(..., create=False)``: reading a ledger never creates one), with a schema version
(2) and a random ``ledger_id`` in ``ldp_beam_meta``. Many processes opening a new SQLite ledger at
once all succeed: switching it to WAL and creating its tables are retried while another holds the
lock, up to the timeout. URLs: ``sqlite://FILE`` (the text after ``sqlite://`` is the path as
written, the rule of every ldp-beam URL: ``sqlite://ledger.db`` is relative,
``sqlite:///abs/ledger.db`` absolute; see :func:`sqlite_path`), a bare file path, or
``postgresql://user[:password]@host:port/database``. Without a URL: ``$LDP_BEAM_LEDGER`` (a URL or
a file path), else ``$XDG_DATA_HOME/ldp-beam/ledger.db`` (``~/.local/share/ldp-beam/ledger.db``).

Schema 1 (budgets per content fingerprint) is migrated in place, in one transaction, when a
ledger is opened: each entry's dataset becomes the location it was read from; each fingerprint's
budget carries to every location read under it (the smallest where several differ: conservative),
recorded in ``ldp_beam_budget_changes`` as "migrated from schema 1"; per-unit stream spending
carries to its stream's location. Nothing is lost (the counts are checked before it commits). A
ledger written by a newer ldp-beam is refused.

Phases, so that nothing is published unrecorded and a crash is safe
-------------------------------------------------------------------
1. :meth:`Ledger.reserve`, before the pipeline runs (before any noise is drawn): in one
   transaction that holds the dataset's row (``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR
   UPDATE`` on PostgreSQL, so two concurrent runs cannot both fit where only one does), compose
   what the dataset has spent, refuse with :class:`BudgetExceeded` if this run would exceed the
   budget (or if its ``--budget`` would raise the recorded one), refuse a central release with
   :class:`ReleaseInProgress` while an identical one (same request, same data) is still
   pending, else insert a ``pending`` row.
2. :meth:`Reservation.prepare`, after the run succeeded and *before* its outputs are moved into
   place: in one transaction, check that the ledger is still the one the run reserved in (for
   SQLite the same file, by device and inode, still a SQLite database, with the same
   ``ledger_id``; for PostgreSQL the same ``ledger_id``) and that the entry is still pending, and
   store its outputs and release; the entry stays pending. A ledger deleted, replaced, damaged or
   unreachable at that point raises :class:`LedgerUnavailable` and the run publishes nothing.
3. :meth:`Reservation.commit`, after the outputs are in place: the same identity check, and the
   row becomes ``committed`` (``commit`` without ``prepare`` stores the outputs itself).
   :meth:`Reservation.leave_pending` records a note and leaves the entry pending, for a run that
   may have published part of its outputs; a reservation left (an error) after ``prepare`` is
   left pending the same way, never aborted.
4. :meth:`Reservation.abort`: a run that failed (nothing published) gives its reservation back.
   (``abort`` and ``leave_pending`` write to the ledger the entry is in, whatever is at its path
   now: they only ever give back or annotate the run's own entry.)

A ``pending`` row whose process died (``kill -9``, a lost machine) stays pending and **counts as
spent** until an operator decides with ``ldp-beam ledger --resolve RUN_ID --as
committed|aborted``: the ledger cannot tell whether the process got as far as publishing (its
staged files held noisy values; a remote runner may have written elsewhere), so it assumes the
worst, which errs on the side of privacy.

Composition
-----------
Every non-aborted entry of a dataset counts, whatever its privacy unit or kind (an epsilon-LDP
collection is also an epsilon-DP release about the same people; a per-user guarantee implies the
per-record one): conservative, never an under-count.

* Pure epsilon (every delta 0): the epsilons add up exactly (``math.fsum``): sequential
  composition is tight for pure DP in general.
* Anything with delta > 0: Google's ``dp_accounting``, privacy loss distributions
  (``dp_accounting.pld``): a run that declares its noise (``accounting=[{"noise": "gaussian",
  "sigma": ..., "sensitivity": ...}]``, or ``"laplace"`` with ``"scale"``) is composed through
  its exact privacy loss distribution (``from_gaussian_mechanism`` / ``from_laplace_mechanism``);
  any other run through the dominating pair of a generic (epsilon, delta)-DP mechanism
  (``from_privacy_parameters``), which composes to the optimal composition bound (Kairouz, Oh and
  Viswanath 2015; the tests check it against the closed form). The PLD accountant is used rather
  than the RDP one because it is tight for both (RDP cannot take a generic (epsilon, delta)
  mechanism and is loose for pure ones); ``pessimistic_estimate`` discretization keeps the result
  an upper bound. The epsilon reported is at the budget's delta (``--budget-delta``), and never
  more than basic composition (sum of epsilons, sum of deltas) where that holds at the same delta.

Per-unit spending (streams)
---------------------------
A stream keeps its units' spending in its own state, ``OUT/units.sqlite``
(:class:`ldp_beam.longitudinal.UnitState`: one spend store, beside the key of its unit hashes).
Each stream run has an entry here (command ``stream``) at what it added to the largest loss
one unit took in its deployment, so a deployment's entries sum to that loss
(:mod:`ldp_beam.pipelines.stream_account`; :meth:`Ledger.commit` and :meth:`Ledger.resolve`
take the ``epsilon`` spent, at most the reservation). The ledger's ``ldp_beam_unit_spend`` table
and ``unit_salt`` remain in the schema only so that ledgers written by earlier versions keep
their rows through the migration; nothing writes them.

Where it is
-----------
The public names are imported here from the package's modules: :mod:`~ldp_beam.ledger.store`
(:class:`Ledger`, :class:`Reservation`, :func:`open_ledger`), :mod:`~ldp_beam.ledger.accounting`
(:class:`Spent`, :func:`compose`, :class:`BudgetExceeded`: composition, pure),
:mod:`~ldp_beam.ledger.names` (ledger URLs, dataset names and locations, release request keys),
:mod:`~ldp_beam.ledger.backends` (the tables, SQLite and PostgreSQL),
:mod:`~ldp_beam.ledger.migrate` (schema 1 and its migration) and :mod:`~ldp_beam.ledger.base`
(constants, the other errors).

The ledger runs on the launcher (the trusted side), never inside a Beam worker, and this package
imports no Beam.
"""
from __future__ import annotations

from .accounting import BudgetExceeded, Spent, check_accounting, compose
from .base import (BUDGET_TOLERANCE, DATASET_NAME_MAX, DEFAULT_TIMEOUT, RAISE_HINT,
                   SCHEMA_VERSION, STATUSES, LedgerError, LedgerNotFound, LedgerUnavailable)
from .names import (DATABASE_SCHEMES, by_content, canonical_location, check_dataset_name, default_url, redact,
                    release_request, request_key, sqlite_path)
from .store import Ledger, ReleaseInProgress, Reservation, open_ledger

__all__ = ["BudgetExceeded", "Ledger", "LedgerError", "LedgerNotFound", "LedgerUnavailable",
           "ReleaseInProgress", "Reservation", "Spent", "by_content", "canonical_location",
           "check_dataset_name",
           "compose", "default_url", "open_ledger", "redact",
           "release_request", "request_key", "check_accounting",
           "BUDGET_TOLERANCE", "DATABASE_SCHEMES", "DATASET_NAME_MAX", "DEFAULT_TIMEOUT",
           "RAISE_HINT", "SCHEMA_VERSION", "STATUSES", "sqlite_path"]
