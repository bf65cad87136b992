"""What every part of the budget ledger (:mod:`ldp_beam.ledger`) shares: its constants, its
errors, and the helpers its rows are written with (JSON, the time, the OS user)."""
from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
from typing import Any

from ..errors import LdpBeamError
from ..jsonio import dumps

SCHEMA_VERSION = 2
DEFAULT_TIMEOUT = 5.0  # seconds: to connect, and to wait for a lock held by another run
STATUSES = ("pending", "committed", "aborted")
#: Relative slack on budget comparisons, so that 0.1 + 0.2 + 0.7 fits a budget of 1.
BUDGET_TOLERANCE = 1e-9
_ADVISORY_KEY = 0x6C6470626561  # PostgreSQL advisory lock serialising schema creation
#: The longest dataset name (``--dataset``) the ledger accepts.
DATASET_NAME_MAX = 200
#: What a hint says about raising a budget.
RAISE_HINT = ("raising a dataset's budget is its own recorded act: ldp-beam ledger --set-budget "
              "EPS --dataset NAME --why TEXT")
_NOTHING_RUN = "nothing was run, no noise was drawn"


# ----------------------------------------------------------------------------------- errors
class LedgerError(LdpBeamError):
    """A ledger operation that cannot be done as asked (a run id recorded twice, committing a run
    that is not pending, a ledger written by a newer ldp-beam)."""


class LedgerUnavailable(LedgerError):
    """The ledger cannot be reached, opened or locked in time, or is no longer the ledger the run
    reserved in (deleted, replaced or damaged since it was opened). Raised before any noise is
    drawn (at open or reserve) or, at :meth:`ldp_beam.ledger.Reservation.prepare`, before
    anything is published; the message names ``--ledger`` and the URL (without its password).
    ``busy`` is True when another process held the lock for longer than the timeout."""

    busy = False


class LedgerNotFound(LedgerError):
    """``Ledger.open(url, create=False)`` (reading, listing) found no ledger there: a SQLite path
    that does not exist or holds no ledger, a PostgreSQL database without the ledger's tables.
    Nothing was created. The message names ``--ledger``."""


# ---------------------------------------------------------------------------- helpers
def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace(
        "+00:00", "Z")


def _dumps(x: Any, sort_keys: bool = True) -> str | None:
    """Compact JSON, NaN as a token (request keys hash these bytes: see :mod:`.jsonio`)."""
    return None if x is None else dumps(x, compact=True, sort_keys=sort_keys)


def _loads(x: str | None) -> Any:
    return None if x is None else json.loads(x)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in a container
        return str(os.getuid())

