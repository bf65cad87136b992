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
   budget (or if its ``--budget`` would raise the recorded one), else insert a ``pending`` row.
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

The ledger runs on the launcher (the trusted side), never inside a Beam worker, and this module
imports no Beam.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import getpass
import hashlib
import json
import math
import os
import random
import shlex
import socket
import sqlite3
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from .errors import LdpBeamError, ParameterError
from .jsonio import dumps
from .urls import check_new_file, url_file

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
    drawn (at open or reserve) or, at :meth:`Reservation.prepare`, before anything is published;
    the message names ``--ledger`` and the URL (without its password). ``busy`` is True when
    another process held the lock for longer than the timeout."""

    busy = False


class LedgerNotFound(LedgerError):
    """``Ledger.open(url, create=False)`` (reading, listing) found no ledger there: a SQLite path
    that does not exist or holds no ledger, a PostgreSQL database without the ledger's tables.
    Nothing was created. The message names ``--ledger``."""


class BudgetExceeded(ParameterError):
    """A run would exceed a dataset's budget (or a budget without delta cannot hold a run with
    delta). Raised before any noise is drawn. ``name`` is the parameter to change (``--budget`` or
    ``--budget-delta``), ``value`` its value; ``spent`` the :class:`Spent` so far, ``asked`` the
    run's (epsilon, delta)."""

    def __init__(self, name: str, value: object, message: str, spent: "Spent | None" = None,
                 asked: tuple[float, float] | None = None) -> None:
        self.name, self.value, self.valid = name, value, message
        self.spent, self.asked, self.message = spent, asked, message
        LdpBeamError.__init__(self, message)

    def __reduce__(self):
        return (type(self), (self.name, self.value, self.message, self.spent, self.asked))


# ----------------------------------------------------------------------------- URLs
def default_url() -> str:
    """``$LDP_BEAM_LEDGER`` (a URL or a file path), else a SQLite file under the user's data
    folder (``$XDG_DATA_HOME/ldp-beam/ledger.db``, ``~/.local/share/ldp-beam/ledger.db``)."""
    env = os.environ.get("LDP_BEAM_LEDGER", "").strip()
    if env:
        return env if "://" in env else "sqlite://" + env
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return "sqlite://" + os.path.join(base, "ldp-beam", "ledger.db")


def sqlite_path(url: str) -> str:
    """The file a ``sqlite://`` ledger URL names, by the one rule of every ldp-beam URL
    (``file://``, ``duckdb://``, ``iceberg://`` alike; docs/guides/sources-sinks.md): the text
    after ``scheme://`` is the path as written. ``sqlite://team.db`` is ``team.db`` relative to
    the current folder, ``sqlite:///srv/team.db`` the absolute ``/srv/team.db`` (so is
    ``sqlite:////srv/team.db``: extra leading slashes are one).

    SQLAlchemy reads ``sqlite:///team.db`` as relative; so did ldp-beam before. Where that
    reading names an existing file and this one a different file, the URL is refused rather
    than a new, empty ledger opened beside the one that holds the spending."""
    path = url_file(url)
    if path.lstrip("/") == ":memory:":
        return ":memory:"
    if path.startswith("/") and not url[len("sqlite:///"):].startswith("/"):
        old = url[len("sqlite:///"):]  # what the SQLAlchemy rule read: relative
        if old and os.path.exists(os.path.expanduser(old)) and (
                not os.path.exists(path) or not os.path.samefile(old, path)):
            raise ParameterError(
                "--ledger", url, f"sqlite://FILE, where FILE is the path as written: this URL "
                f"names {path} (absolute), but {old} exists in the current folder; write "
                f"sqlite://{old} (or {old}) for it, or sqlite:///{path} for {path}",
                "every ldp-beam URL takes the text after scheme:// as the path; SQLAlchemy's "
                "relative sqlite:///FILE is not followed")
    return path


def redact(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` query parameter)."""
    if "@" not in url and "password" not in url.lower():
        return url  # nothing to hide (a SQLite file: kept exactly as written)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable ledger URL>"
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            user = user.split(":", 1)[0] + ":***"
        netloc = user + "@" + host
    query = "&".join("password=***" if q.lower().startswith("password=") else q
                     for q in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


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


# ------------------------------------------------------------------------- dataset identity
_GLOB_CHARS = "*?["


def check_dataset_name(name: Any) -> str:
    """A dataset name as the ledger keeps it (``--dataset``): 1 to :data:`DATASET_NAME_MAX`
    characters, no control or invisible formatting characters (a newline, a zero-width space: two
    names that look the same must be the same), no leading or trailing space. Raises
    :class:`~ldp_beam.errors.ParameterError` naming ``--dataset``."""
    valid = (f"a name of 1 to {DATASET_NAME_MAX} characters without control characters or "
             "leading/trailing spaces")
    if not isinstance(name, str) or not name.strip():
        raise ParameterError("--dataset", name, valid)
    if len(name) > DATASET_NAME_MAX:
        raise ParameterError("--dataset", name[:40] + "...", valid,
                             hint=f"it has {len(name)} characters")
    bad = [c for c in name if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    if bad:
        raise ParameterError("--dataset", name, valid, hint=f"it holds {bad[0]!r}")
    if name != name.strip():
        raise ParameterError("--dataset", name, valid)
    return name


#: Query parameters of a URL that carry credentials: dropped from a dataset's location.
_SECRET_PARAMS = ("password", "passwd", "secret", "secret_key", "access_key", "session_token",
                  "token", "sig", "signature", "x-amz-signature", "x-amz-credential",
                  "x-amz-security-token")


def _url_location(url: str, what: str = "--input") -> str:
    """``url`` without credentials: no user part (``user:password@`` is dropped entirely), no
    password, key or token query parameter; the scheme and host lower-cased."""
    try:
        urlsplit(url)
        parts = urlsplit(redact(url))
    except ValueError as exc:
        raise ParameterError(what, "<unparsable URL>", "a URL (scheme://host/path)") from exc
    host = parts.netloc.rsplit("@", 1)[-1].lower()
    query = "&".join(q for q in parts.query.split("&")
                     if q and q.split("=", 1)[0].lower() not in _SECRET_PARAMS)
    return urlunsplit((parts.scheme.lower(), host, parts.path, query, parts.fragment))


def canonical_location(input: str) -> str:
    """The default dataset name of an input: where it is, canonically.

    A local file or folder: the real path of the path as given (symbolic links resolved in
    order, so ``link/../x`` is the ``x`` beside the link's target); a glob: the real path of its
    folder part joined with the pattern part; a URL: the URL without credentials (no user part,
    no password, key or token parameter); a database table or query: its canonical table URL
    (the password hidden, query parameters sorted)."""
    scheme = input.split("://", 1)[0].lower() if "://" in input else ""
    if scheme in DATABASE_SCHEMES:
        return _table_url(input)
    if scheme:
        return _url_location(input)
    if any(c in input for c in _GLOB_CHARS) and not os.path.exists(input):
        cut = min(input.index(c) for c in _GLOB_CHARS if c in input)
        folder = os.path.dirname(input[:cut])
        pattern = input[len(folder):].lstrip(os.sep)
        return os.path.join(os.path.realpath(folder or os.curdir), pattern)
    return os.path.realpath(input)


DATABASE_SCHEMES = ("duckdb", "postgresql", "postgres", "iceberg")


def _table_url(input: str) -> str:
    """A database table's canonical URL: the password hidden, query parameters sorted."""
    parts = urlsplit(redact(input))
    query = "&".join(f"{k}={v}" for k, v in sorted(parse_qsl(parts.query)))
    return f"{parts.scheme.lower()}://{parts.netloc}{parts.path}" + (f"?{query}" if query
                                                                     else "")


def request_key(fingerprint: str, request: Mapping[str, Any]) -> str:
    """The key of a release request: the data fingerprint and everything that determines what is
    released (mechanism, parameters, privacy unit and bounds, columns, options, a seed)."""
    return hashlib.sha256(_dumps({"fingerprint": fingerprint, **dict(request)}).encode()
                          ).hexdigest()


def release_request(mechanism: str, params: Mapping[str, Any], columns: Mapping[str, str],
                    options: Mapping[str, Any] | None = None, unit: str = "record",
                    seed: str | None = None, **more: Any) -> dict:
    """What makes two central releases identical requests (see :meth:`Ledger.find_release`)."""
    return {"mechanism": mechanism, "params": dict(params), "columns": dict(columns),
            "options": dict(options or {}), "unit": unit, "seed": seed, **more}


# ------------------------------------------------------------------------------ composition
@dataclass(frozen=True)
class Spent:
    """What a dataset (or one unit, one day) has spent.

    ``epsilon`` holds at ``delta``: the exact sum when every entry is pure, else the
    ``dp_accounting`` PLD composition at the target delta (``method`` says which).
    ``epsilon_sum``/``delta_sum`` are basic composition, for reference. ``entries`` are the runs
    counted (dicts with run_id, command, mechanism, epsilon, delta, status, started)."""

    epsilon: float
    delta: float
    epsilon_sum: float
    delta_sum: float
    runs: int
    pending: int
    method: str
    entries: tuple = field(default=(), repr=False)

    def to_dict(self) -> dict:
        return {"epsilon": _finite(self.epsilon), "delta": self.delta,
                "epsilon_sum": _finite(self.epsilon_sum), "delta_sum": self.delta_sum,
                "runs": self.runs, "pending": self.pending, "method": self.method}


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x


_NOISES = {"gaussian": ("sigma",), "laplace": ("scale",), "eps-delta": ("epsilon", "delta")}


def check_accounting(accounting: Any) -> list[dict] | None:
    """Validate a run's noise description (a list of components; see :func:`compose`)."""
    if accounting is None:
        return None
    comps = [accounting] if isinstance(accounting, Mapping) else list(accounting)
    out = []
    for i, c in enumerate(comps):
        where = f"accounting[{i}]"
        if not isinstance(c, Mapping) or c.get("noise") not in _NOISES:
            raise ParameterError(where, c, "a dict with noise one of " + ", ".join(_NOISES))
        c = dict(c)
        for k in _NOISES[c["noise"]] + ("sensitivity",):
            v = c.get(k, 1.0 if k == "sensitivity" else None)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            lo_ok = ok and (v >= 0 if k in ("epsilon", "delta") else v > 0)
            if not lo_ok or (k == "delta" and v >= 1):
                raise ParameterError(f"{where}.{k}", v, "a finite number > 0" if k not in (
                    "epsilon", "delta") else "a number in [0, 1)" if k == "delta"
                                     else "a finite number >= 0")
            c[k] = float(v)
        count = c.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ParameterError(f"{where}.count", count, "an integer >= 1")
        c["count"] = count
        out.append(c)
    return out


def compose(entries: Sequence[Mapping[str, Any]], delta: float | None = None) -> Spent:
    """Compose ledger entries (each with ``epsilon``, ``delta`` and optionally ``accounting``).

    Pure epsilon (every delta 0): the exact sum. Otherwise ``dp_accounting``'s PLD composition at
    ``delta`` (default: the sum of the entries' deltas), capped by basic composition where that
    holds at ``delta``. An entry's ``accounting`` (a list of ``{"noise": "gaussian", "sigma",
    "sensitivity", "count"}``, ``{"noise": "laplace", "scale", "sensitivity", "count"}`` or
    ``{"noise": "eps-delta", "epsilon", "delta", "count"}``) describes its noise exactly; without
    one, the entry is a generic (epsilon, delta)-DP mechanism."""
    entries = list(entries)
    eps_sum = math.fsum(float(e["epsilon"]) for e in entries)
    delta_sum = min(1.0, math.fsum(float(e["delta"]) for e in entries))
    pending = sum(1 for e in entries if e.get("status") == "pending")
    shown = tuple({k: e.get(k) for k in ("run_id", "command", "mechanism", "epsilon", "delta",
                                         "status", "started", "unit", "seeded")}
                  for e in entries)
    if delta_sum == 0.0:
        return Spent(eps_sum, 0.0, eps_sum, 0.0, len(entries), pending,
                     "exact sum (pure epsilon)", shown)
    target = delta_sum if delta is None else float(delta)
    if math.isinf(eps_sum):
        return Spent(math.inf, target, eps_sum, delta_sum, len(entries), pending,
                     "no finite guarantee", shown)
    pld_eps = _pld_epsilon(entries, target, eps_sum)
    basic = eps_sum if delta_sum <= target else math.inf
    return Spent(min(pld_eps, basic), target, eps_sum, delta_sum, len(entries), pending,
                 f"dp_accounting PLD composition at delta={target:g}"
                 + (" (basic composition is tighter here)" if basic < pld_eps else ""), shown)


def _pld_epsilon(entries: Sequence[Mapping[str, Any]], target: float, eps_sum: float) -> float:
    # lazy: dp_accounting costs 1.1 s at import (measured); only entries with a delta compose
    # through it, and the CLI imports the ledger for every command
    from dp_accounting.pld import common, privacy_loss_distribution as pld

    # One discretisation for every PLD (compose needs it); coarser for large totals so the
    # composed distribution stays small. Pessimistic discretisation: an upper bound whatever it is.
    interval = max(1e-4, eps_sum / 20000.0)
    groups: dict[str, int] = {}
    for e in entries:
        comps = check_accounting(_loads(e["accounting"]) if isinstance(e.get("accounting"), str)
                                 else e.get("accounting"))
        if comps is None:
            comps = [{"noise": "eps-delta", "epsilon": float(e["epsilon"]),
                      "delta": float(e["delta"]), "count": 1}]
        for c in comps:
            if c["noise"] == "eps-delta" and c["epsilon"] == 0 and c["delta"] == 0:
                continue  # a re-publication, a post-processing: no privacy loss
            key = _dumps({k: v for k, v in c.items() if k != "count"})
            groups[key] = groups.get(key, 0) + c["count"]
    if not groups:
        return 0.0
    total = None
    for key, count in sorted(groups.items()):
        c = json.loads(key)
        if c["noise"] == "gaussian":
            one = pld.from_gaussian_mechanism(c["sigma"], sensitivity=c["sensitivity"],
                                              value_discretization_interval=interval)
        elif c["noise"] == "laplace":
            one = pld.from_laplace_mechanism(c["scale"], sensitivity=c["sensitivity"],
                                             value_discretization_interval=interval)
        else:
            one = pld.from_privacy_parameters(
                common.DifferentialPrivacyParameters(c["epsilon"], c["delta"]),
                value_discretization_interval=interval)
        part = one.self_compose(count) if count > 1 else one
        total = part if total is None else total.compose(part)
    return float(total.get_epsilon_for_delta(target))


# ------------------------------------------------------------------------------- backends
#: Schema 1 (budgets per content fingerprint), kept to migrate it (and to build one in a test).
_SCHEMA_V1 = [
    """CREATE TABLE IF NOT EXISTS ldp_beam_meta (
        key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS ldp_beam_datasets (
        fingerprint TEXT PRIMARY KEY, uri TEXT NOT NULL, first_seen TEXT NOT NULL,
        budget_epsilon DOUBLE PRECISION, budget_delta DOUBLE PRECISION, budget_set TEXT)""",
    """CREATE TABLE IF NOT EXISTS ldp_beam_entries (
        run_id TEXT PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('pending', 'committed', 'aborted')),
        started TEXT NOT NULL, finished TEXT, command TEXT NOT NULL,
        fingerprint TEXT NOT NULL REFERENCES ldp_beam_datasets (fingerprint),
        uri TEXT NOT NULL, unit TEXT NOT NULL, mechanism TEXT NOT NULL, kind TEXT,
        params TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        accounting TEXT, budget_epsilon DOUBLE PRECISION, budget_delta DOUBLE PRECISION,
        request_key TEXT, release TEXT, outputs TEXT, republished_from TEXT,
        seeded INTEGER NOT NULL, host TEXT, pid INTEGER, os_user TEXT, note TEXT)""",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_fp ON ldp_beam_entries (fingerprint)",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_req ON ldp_beam_entries (request_key)",
    """CREATE TABLE IF NOT EXISTS ldp_beam_unit_spend (
        fingerprint TEXT NOT NULL, unit_hash TEXT NOT NULL, window_id TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL, run_id TEXT NOT NULL, recorded TEXT NOT NULL,
        PRIMARY KEY (fingerprint, unit_hash, window_id))""",
]

#: Schema 2: datasets, budgets and per-unit spending keyed by the dataset's name.
_SCHEMA_META = """CREATE TABLE IF NOT EXISTS ldp_beam_meta (
        key TEXT PRIMARY KEY, value TEXT NOT NULL)"""
_SCHEMA_TABLES = [
    """CREATE TABLE IF NOT EXISTS ldp_beam_datasets (
        dataset TEXT PRIMARY KEY, first_seen TEXT NOT NULL,
        budget_epsilon DOUBLE PRECISION, budget_delta DOUBLE PRECISION, budget_set TEXT)""",
    """CREATE TABLE IF NOT EXISTS ldp_beam_entries (
        run_id TEXT PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('pending', 'committed', 'aborted')),
        started TEXT NOT NULL, finished TEXT, command TEXT NOT NULL,
        dataset TEXT NOT NULL REFERENCES ldp_beam_datasets (dataset),
        fingerprint TEXT NOT NULL, uri TEXT NOT NULL, unit TEXT NOT NULL,
        mechanism TEXT NOT NULL, kind TEXT,
        params TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL,
        accounting TEXT, budget_epsilon DOUBLE PRECISION, budget_delta DOUBLE PRECISION,
        request_key TEXT, release TEXT, outputs TEXT, republished_from TEXT,
        seeded INTEGER NOT NULL, host TEXT, pid INTEGER, os_user TEXT, note TEXT)""",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_dataset ON ldp_beam_entries (dataset)",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_fp ON ldp_beam_entries (fingerprint)",
    "CREATE INDEX IF NOT EXISTS ldp_beam_entries_req ON ldp_beam_entries (request_key)",
    """CREATE TABLE IF NOT EXISTS ldp_beam_budget_changes (
        dataset TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION,
        previous_epsilon DOUBLE PRECISION, previous_delta DOUBLE PRECISION,
        changed TEXT NOT NULL, os_user TEXT, host TEXT, why TEXT NOT NULL, run_id TEXT)""",
    "CREATE INDEX IF NOT EXISTS ldp_beam_budget_changes_dataset ON ldp_beam_budget_changes "
    "(dataset, changed)",
    """CREATE TABLE IF NOT EXISTS ldp_beam_unit_spend (
        dataset TEXT NOT NULL, unit_hash TEXT NOT NULL, window_id TEXT NOT NULL,
        epsilon DOUBLE PRECISION NOT NULL, run_id TEXT NOT NULL, recorded TEXT NOT NULL,
        PRIMARY KEY (dataset, unit_hash, window_id))""",
]
_SCHEMA = [_SCHEMA_META] + _SCHEMA_TABLES

_ENTRY_COLUMNS = ("run_id", "status", "started", "finished", "command", "dataset",
                  "fingerprint", "uri", "unit", "mechanism", "kind", "params", "epsilon",
                  "delta", "accounting", "budget_epsilon", "budget_delta", "request_key",
                  "release", "outputs", "republished_from", "seeded", "host", "pid", "os_user",
                  "note")
_V1_ENTRY_COLUMNS = tuple(c for c in _ENTRY_COLUMNS if c != "dataset")
_CHANGE_COLUMNS = ("dataset", "epsilon", "delta", "previous_epsilon", "previous_delta",
                   "changed", "os_user", "host", "why", "run_id")


class _Tx:
    """One transaction's statements, written with ``?`` placeholders for both backends."""

    def __init__(self, cur: Any, pg: bool) -> None:
        self.cur, self.pg = cur, pg

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        self.cur.execute(sql.replace("?", "%s") if self.pg else sql, tuple(args))
        return self.cur

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.cur.executemany(sql.replace("?", "%s") if self.pg else sql, list(rows))

    def among(self, values: Sequence[str]) -> tuple[str, Any]:
        """``(subquery, parameter)`` for ``column IN subquery`` over many values, as one
        parameter (an array, a JSON list): one statement whatever the number, and a plan that
        hashes them (a list of 500 placeholders was prepared by psycopg into a generic plan that
        compared every row with every value: 165 ms a query at 10,000 units)."""
        if self.pg:
            return "(SELECT unnest(?::text[]))", list(values)
        return "(SELECT value FROM json_each(?))", json.dumps(list(values))

    def one(self, sql: str, args: Sequence[Any] = ()) -> tuple | None:
        return self.execute(sql, args).fetchone()

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[tuple]:
        return list(self.execute(sql, args).fetchall())


def _busy(exc: BaseException) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection holds the lock (worth waiting for)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED (+ extended)
        return True
    text = str(exc)
    return "locked" in text or "busy" in text


def _nap(deadline: float, attempt: int) -> None:
    """A short, jittered sleep before retrying a busy step (never past ``deadline``)."""
    left = deadline - time.monotonic()
    if left > 0:
        time.sleep(min(left, random.uniform(0.5, 1.5) * min(0.05, 0.002 * 2 ** min(attempt, 5))))


_SQLITE_MAGIC = b"SQLite format 3\x00"


class _SQLite:
    def __init__(self, path: str, url: str, timeout: float, create: bool = True) -> None:
        self.path, self.url, self.timeout = path, url, timeout
        self.abspath = os.path.abspath(path)  # identity checks: whatever the working directory
        deadline = time.monotonic() + timeout
        folder = os.path.dirname(os.path.abspath(path))
        try:
            if create:
                os.makedirs(folder, exist_ok=True)
                self.conn = sqlite3.connect(path, timeout=timeout, isolation_level=None,
                                            check_same_thread=False)
            else:  # mode=rw: never creates the file (nor its folder)
                self.conn = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=rw",
                                            timeout=timeout, isolation_level=None,
                                            check_same_thread=False, uri=True)
        except sqlite3.OperationalError as exc:
            if not create:
                raise LedgerNotFound(f"--ledger {url}: no ledger at {path} ({exc}); nothing "
                                     "was created") from exc
            raise self.unavailable(exc) from exc
        except (sqlite3.Error, OSError) as exc:
            raise self.unavailable(exc) from exc
        # Switching to WAL takes the database's exclusive lock and can fail at once with
        # SQLITE_BUSY (without the busy handler) while another connection opens the same new
        # file: retried with short sleeps up to the timeout, like every step of opening.
        attempt = 0
        while True:
            try:
                self.conn.execute("PRAGMA foreign_keys = ON")
                if create:  # reading only: an existing ledger is in WAL mode already (and
                    # another SQLite file is not changed)
                    mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                    if str(mode).lower() != "wal":
                        raise sqlite3.OperationalError(f"cannot use a WAL journal (got {mode})")
                self.conn.execute("PRAGMA synchronous = FULL")  # a committed entry survives
                break
            except sqlite3.Error as exc:
                if _busy(exc) and time.monotonic() < deadline:
                    _nap(deadline, attempt)
                    attempt += 1
                    continue
                self.close()
                raise self.unavailable(exc) from exc

    def unavailable(self, exc: BaseException) -> LedgerUnavailable:
        text = str(exc)
        if _busy(exc):
            err = LedgerUnavailable(
                f"--ledger {self.url}: the ledger is locked by another process for more than "
                f"{self.timeout:g} s ({text}); {_NOTHING_RUN}. Retry when the other run has "
                "recorded its entry")
            err.busy = True
            return err
        return LedgerUnavailable(f"--ledger {self.url}: cannot use the SQLite ledger "
                                 f"{self.path} ({type(exc).__name__}: {text}); {_NOTHING_RUN}")

    def wait_at_most(self, seconds: float) -> None:
        """The busy timeout of the next statements (what is left of an open's timeout)."""
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute(f"PRAGMA busy_timeout = {max(1, int(seconds * 1000))}")

    def file_id(self) -> tuple[int, int] | None:
        """(st_dev, st_ino) of the ledger's file now; None if there is none."""
        try:
            st = os.stat(self.abspath)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def file_problems(self, file_id: tuple[int, int] | None) -> list[str]:
        """How the file at the ledger's path differs from the one opened (``file_id``)."""
        try:
            st = os.stat(self.abspath)
        except FileNotFoundError:
            return [f"{self.path} no longer exists"]
        except OSError as exc:
            return [f"{self.path} cannot be read ({exc})"]
        if (st.st_dev, st.st_ino) != file_id:
            return [f"{self.path} is another file now (device/inode {st.st_dev}/{st.st_ino}, "
                    f"was {file_id[0]}/{file_id[1]})" if file_id else
                    f"{self.path} is another file now"]
        try:
            with open(self.abspath, "rb") as fh:
                head = fh.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            return [f"{self.path} cannot be read ({exc})"]
        if head != _SQLITE_MAGIC:
            return [f"{self.path} is no longer a SQLite database (it begins {head[:16]!r})"]
        return []

    @contextlib.contextmanager
    def transaction(self, write: bool) -> Iterator[_Tx]:
        # BEGIN IMMEDIATE takes the database's write lock at once (waiting up to the busy
        # timeout): a reservation's read of what was spent and its insert are one serial step.
        try:
            self.conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except sqlite3.Error as exc:
            raise self.unavailable(exc) from exc
        try:
            yield _Tx(self.conn.cursor(), False)
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.IntegrityError):
                raise LedgerError(f"--ledger {self.url}: {exc}") from exc
            if isinstance(exc, sqlite3.Error):
                raise self.unavailable(exc) from exc
            raise
        try:
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            raise self.unavailable(exc) from exc

    def has_schema(self) -> bool:
        return self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                                 "'ldp_beam_meta'").fetchone() is not None

    def has_schema_tx(self, tx: "_Tx") -> bool:
        return tx.one("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                      "'ldp_beam_meta'") is not None

    def errors(self) -> tuple:
        return (sqlite3.Error,)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()


class _Postgres:
    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.shown, self.timeout = url, redact(url), timeout
        try:
            import psycopg  # lazy: optional dependency (the [postgres] extra)
        except ImportError as exc:
            raise LedgerUnavailable(f"--ledger {self.shown}: a PostgreSQL ledger needs psycopg "
                                    "(pip install 'ldp-beam[postgres]')") from exc
        self.psycopg = psycopg
        self.conn = None
        self.connect()

    def connect(self) -> None:
        try:
            # libpq's connect_timeout bounds the whole connection (a refused port fails at once,
            # a server that never answers after timeout seconds; libpq's minimum is 2 s)
            self.conn = self.psycopg.connect(self.url, autocommit=True,
                                             connect_timeout=max(2, math.ceil(self.timeout)),
                                             application_name="ldp-beam ledger")
        except self.psycopg.Error as exc:
            raise self.unavailable(exc) from None

    def unavailable(self, exc: BaseException) -> LedgerUnavailable:
        text = " ".join(str(exc).split())
        if self.url and ":" in self.url:  # never echo a password libpq may have quoted
            pw = urlsplit(self.url).password
            if pw:
                text = text.replace(pw, "***")
        errors = self.psycopg.errors
        if isinstance(exc, (errors.LockNotAvailable, errors.QueryCanceled)):
            err = LedgerUnavailable(
                f"--ledger {self.shown}: the ledger is locked by another run for more than "
                f"{self.timeout:g} s ({text}); {_NOTHING_RUN}")
            err.busy = True
            return err
        return LedgerUnavailable(f"--ledger {self.shown}: cannot reach the PostgreSQL ledger "
                                 f"({type(exc).__name__}: {text}); {_NOTHING_RUN}")

    def wait_at_most(self, seconds: float) -> None:
        pass  # lock_timeout is set per transaction

    def file_id(self) -> None:
        return None

    def file_problems(self, file_id: Any) -> list[str]:
        return []

    @contextlib.contextmanager
    def transaction(self, write: bool) -> Iterator[_Tx]:
        psycopg = self.psycopg
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.connect()  # e.g. the server closed an idle connection during a long run
        try:
            ctx = self.conn.transaction()
            ctx.__enter__()
        except psycopg.OperationalError:
            self.connect()  # one reconnection: the connection died while idle
            try:
                ctx = self.conn.transaction()
                ctx.__enter__()
            except psycopg.Error as exc:
                raise self.unavailable(exc) from None
        except psycopg.Error as exc:
            raise self.unavailable(exc) from None
        try:
            cur = self.conn.cursor()
            ms = int(self.timeout * 1000)
            cur.execute(f"SET LOCAL lock_timeout = {ms}")
            cur.execute(f"SET LOCAL statement_timeout = {ms * 6}")
            yield _Tx(cur, True)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                ctx.__exit__(type(exc), exc, exc.__traceback__)
            if isinstance(exc, psycopg.IntegrityError):
                raise LedgerError(f"--ledger {self.shown}: {exc}") from None
            if isinstance(exc, psycopg.Error):
                raise self.unavailable(exc) from None
            raise
        try:
            ctx.__exit__(None, None, None)
        except psycopg.Error as exc:
            raise self.unavailable(exc) from None

    def has_schema(self) -> bool:
        with self.conn.cursor() as cur:
            cur.execute("SELECT to_regclass('ldp_beam_meta') IS NOT NULL")
            return bool(cur.fetchone()[0])

    def has_schema_tx(self, tx: "_Tx") -> bool:
        return bool(tx.one("SELECT to_regclass('ldp_beam_meta') IS NOT NULL")[0])

    def errors(self) -> tuple:
        return (self.psycopg.Error,)

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


# ----------------------------------------------------------------------------------- ledger
class Reservation:
    """A pending ledger entry (see :meth:`Ledger.reserve`).

    Its life: :meth:`prepare` before anything is published (the ledger is still the one the run
    reserved in and the entry still pending; its outputs and release are stored, it stays
    pending), then :meth:`commit` once the outputs are in place. :meth:`leave_pending` (a run
    that may have published part of its outputs) and :meth:`abort` (nothing was published)
    settle it otherwise. As a context manager, leaving it unsettled (an error, an interrupt)
    aborts it if it was not prepared (nothing was published) and leaves it pending, with a note,
    if it was (it may have published: it counts as spent until an operator resolves it). A
    process killed outright leaves it pending, and it counts as spent until resolved."""

    def __init__(self, ledger: "Ledger", run_id: str, entry: dict, spent: Spent,
                 budget: tuple[float | None, float | None]) -> None:
        self.ledger, self.run_id, self.entry = ledger, run_id, entry
        self.dataset = entry.get("dataset")
        self.spent_before, self.budget = spent, budget
        self.status = "pending"
        self.prepared = False
        self.left_pending = False

    def prepare(self, outputs: Mapping[str, Any] | None = None,
                release: Mapping[str, Any] | None = None) -> None:
        """Before anything is published: see :meth:`Ledger.prepare`. If it raises, publish
        nothing."""
        self.ledger.prepare(self.run_id, outputs, release)
        self.prepared = True

    def commit(self, outputs: Mapping[str, Any] | None = None,
               release: Mapping[str, Any] | None = None, *,
               epsilon: float | None = None) -> None:
        """After publishing: see :meth:`Ledger.commit` (``outputs``/``release`` given here
        replace those stored by :meth:`prepare`; omitted, those are kept; ``epsilon``: what the
        run turned out to spend, at most what it reserved)."""
        self.ledger.commit(self.run_id, outputs, release, epsilon=epsilon)
        self.status = "committed"

    def leave_pending(self, note: str) -> None:
        """Record ``note`` and leave the entry pending (it counts as spent until an operator
        resolves it): for a run that may have published part of its outputs."""
        self.ledger.leave_pending(self.run_id, note)
        self.left_pending = True

    def abort(self, reason: str = "") -> None:
        self.ledger.abort(self.run_id, reason)
        self.status = "aborted"

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.status != "pending" or self.left_pending:
            return
        why = f"run failed: {exc_type.__name__}: {exc}" if exc_type else "left without commit"
        try:
            if self.prepared:  # its outputs may be (partly) in place: never claim it was not
                self.leave_pending(f"{why}, after it was prepared to publish: it may have "
                                   "published")
            else:
                self.abort(why)
        except LedgerError:
            pass  # cannot reach the ledger: the entry stays pending and counts as spent

    def __repr__(self) -> str:
        return f"Reservation({self.run_id!r}, {self.status})"


def _name_of(dataset: Any, what: str = "dataset") -> str:
    """A dataset's name: a string as is, or the ``"dataset"`` of a :func:`~ldp_beam.pipelines.datasets.dataset_identity`
    dict (its ``"uri"`` for a dict made before datasets had names)."""
    name = (dataset.get("dataset") or dataset.get("uri")) if isinstance(dataset, Mapping) \
        else dataset
    if not isinstance(name, str) or not name:
        raise ParameterError(what, dataset, "a dataset name, or the dict from dataset_identity")
    return name


def _budget_text(eps: float | None, delta: float | None) -> str:
    if eps is None:
        return "none"
    return f"epsilon={eps:g}" + (f" delta={delta:g}" if delta is not None else "")


class Ledger:
    """A budget ledger on SQLite or PostgreSQL (see the module docstring). Open with
    :meth:`open`; one object per thread; close it (or use it as a context manager).

    ``ledger_id`` is the ledger's random id (``ldp_beam_meta``), read when it was opened;
    ``opened`` when that was (UTC)."""

    def __init__(self, backend: Any, url: str) -> None:
        self._db = backend
        self.url = redact(url)
        self._lock = threading.RLock()
        self.ledger_id: str | None = None
        self._file_id: tuple[int, int] | None = None
        self.opened = _now()

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, url: str | None = None, *, timeout: float = DEFAULT_TIMEOUT,
             create: bool = True) -> "Ledger":
        """Open the ledger at ``url`` (default: :func:`default_url`), creating it if absent
        when ``create`` (a run), never when not (reading, listing: then a SQLite path that does
        not exist or holds no ledger, or a PostgreSQL database without the ledger's tables,
        raises :class:`LedgerNotFound` and creates no file, no folder and no table). A schema-1
        ledger is migrated in place (see the module docstring).

        Raises :class:`LedgerUnavailable` if it cannot be reached or opened within ``timeout``
        seconds (every step of opening a SQLite file, its switch to WAL and its tables'
        creation included, is retried while another process holds the lock, up to the
        timeout), :class:`~ldp_beam.errors.ParameterError` naming ``--ledger`` for a URL of an
        unknown form, :class:`LedgerError` for a ledger written by a newer ldp-beam."""
        if isinstance(url, Ledger):
            return url
        url = default_url() if url is None or url == "" else str(url)
        if isinstance(timeout, bool) or not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ParameterError("timeout", timeout, "a number of seconds > 0")
        deadline = time.monotonic() + timeout
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        before = None
        if scheme in ("postgresql", "postgres"):
            backend: Any = _Postgres(url, timeout)
        elif scheme in ("sqlite", ""):
            path = sqlite_path(url) if scheme else url
            if not path or path == ":memory:" or path.startswith("file:"):
                raise ParameterError("--ledger", url, "a SQLite file (sqlite://FILE): the "
                                     "ledger must outlive the run")
            path = os.path.expanduser(path)
            if create and scheme:
                check_new_file(url, path, "--ledger")
            if not create and not os.path.isfile(path):
                raise LedgerNotFound(f"--ledger {redact(url)}: no ledger at {path} ("
                                     + ("not a file" if os.path.exists(path) else
                                        "no such file") + "); nothing was created")
            with contextlib.suppress(OSError):
                st = os.stat(path)
                before = (st.st_dev, st.st_ino)
            backend = _SQLite(path, url, timeout, create)
        else:
            raise ParameterError("--ledger", redact(url), "sqlite://PATH, a file path or "
                                 "postgresql://USER@HOST:PORT/DATABASE")
        led = cls(backend, url)
        try:
            attempt = 0
            while True:  # every step of opening together within the timeout
                backend.wait_at_most(max(0.001, deadline - time.monotonic()))
                try:
                    led._ensure_schema(create)
                    break
                except LedgerUnavailable as exc:
                    if not exc.busy or time.monotonic() >= deadline:
                        raise
                    _nap(deadline, attempt)
                    attempt += 1
            backend.wait_at_most(timeout)
            led._remember_identity(before)
        except BaseException:
            backend.close()
            raise
        return led

    def _where(self) -> str:
        return self._db.path if isinstance(self._db, _SQLite) else self.url

    def _ensure_schema(self, create: bool) -> None:
        db = self._db
        try:
            present = db.has_schema()
        except db.errors() as exc:
            raise db.unavailable(exc) from None
        if not present:
            if not create:
                raise LedgerNotFound(f"--ledger {self.url}: no ledger at {self._where()} (it "
                                     "holds no ldp-beam ledger tables); nothing was created")
            with self._tx(write=True) as tx:
                if tx.pg:
                    tx.execute(f"SELECT pg_advisory_xact_lock({_ADVISORY_KEY})")
                if not db.has_schema_tx(tx):  # another process may have made it meanwhile
                    for stmt in _SCHEMA:
                        tx.execute(stmt)
                    for key, value in (("schema_version", str(SCHEMA_VERSION)),
                                       ("unit_salt", os.urandom(16).hex()),
                                       ("created", _now()), ("ledger_id", os.urandom(16).hex())):
                        tx.execute("INSERT INTO ldp_beam_meta (key, value) VALUES (?, ?) "
                                   "ON CONFLICT (key) DO NOTHING", (key, value))
        version = self._version()
        if version == 1:
            with self._tx(write=True) as tx:
                if tx.pg:
                    tx.execute(f"SELECT pg_advisory_xact_lock({_ADVISORY_KEY})")
                row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = 'schema_version'")
                if row and int(row[0]) == 1:  # not migrated by another process meanwhile
                    _migrate_v1(tx, self.url)
            version = self._version()
        if version != SCHEMA_VERSION:
            raise LedgerError(f"--ledger {self.url}: the ledger's schema version is {version}, "
                              f"this ldp-beam reads version {SCHEMA_VERSION}"
                              + ("; upgrade ldp-beam" if version > SCHEMA_VERSION else ""))

    def _version(self) -> int:
        with self._tx(write=False) as tx:
            row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = ?", ("schema_version",))
        return int(row[0]) if row else 0

    def _remember_identity(self, before: tuple[int, int] | None) -> None:
        with self._tx(write=False) as tx:
            row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = 'ledger_id'")
        if row is None:
            raise LedgerError(f"--ledger {self.url}: the ledger has no ledger_id in "
                              "ldp_beam_meta (damaged?)")
        self.ledger_id = row[0]
        self._file_id = self._db.file_id()
        if isinstance(self._db, _SQLite) and (
                self._file_id is None or (before is not None and before != self._file_id)):
            raise LedgerUnavailable(f"--ledger {self.url}: {self._db.path} was deleted or "
                                    f"replaced while it was being opened; {_NOTHING_RUN}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({self.url!r})"

    @property
    def backend(self) -> str:
        return "postgresql" if isinstance(self._db, _Postgres) else "sqlite"

    @contextlib.contextmanager
    def _tx(self, write: bool = True) -> Iterator[_Tx]:
        with self._lock, self._db.transaction(write) as tx:
            yield tx

    # ------------------------------------------------------------------ identity
    def _not_the_same(self, problems: list[str], consequence: str) -> LedgerUnavailable:
        err = LedgerUnavailable(
            f"--ledger {self.url}: the ledger is not the one this run reserved in (deleted, "
            f"replaced or damaged since it was opened at {self.opened}: {'; '.join(problems)}); "
            f"{consequence}")
        err.identity = True
        return err

    def _check_identity(self, tx: _Tx, consequence: str) -> None:
        """Inside a transaction: the ledger is the one opened (SQLite: the same file by device
        and inode, still a SQLite database; both: the same ``ledger_id``), else raise."""
        problems = self._db.file_problems(self._file_id)
        if not problems:
            try:
                row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = 'ledger_id'")
            except self._db.errors() as exc:
                problems = [f"its ledger id cannot be read ({type(exc).__name__}: {exc})"]
            else:
                if row is None or row[0] != self.ledger_id:
                    problems = [f"its ledger id is {row[0] if row else 'missing'}, not "
                                f"{self.ledger_id}"]
        if problems:
            raise self._not_the_same(problems, consequence)

    @contextlib.contextmanager
    def _settling(self, consequence: str, check: bool = True) -> Iterator[_Tx]:
        """A write transaction on the ledger this object opened, checked first
        (:meth:`_check_identity`) when ``check``. A damaged file, or a failure while the file is
        not the one opened, raises :class:`LedgerUnavailable` saying so and what it means
        (``consequence``). Without ``check`` (abort, leave_pending: they only ever give back or
        annotate the run's own entry) the write goes to the ledger the entry is in, whatever
        is at its path now."""
        try:
            with self._tx(write=True) as tx:
                if check:
                    self._check_identity(tx, consequence)
                yield tx
        except LedgerUnavailable as exc:
            if getattr(exc, "identity", False):
                raise
            problems = self._db.file_problems(self._file_id)
            cause = exc.__cause__
            if not problems and isinstance(cause, sqlite3.DatabaseError) \
                    and not isinstance(cause, sqlite3.OperationalError):
                problems = [f"it cannot be read as a SQLite database ({cause})"]
            if problems:
                raise self._not_the_same(problems, consequence) from exc
            if consequence == _NOTHING_RUN:
                raise
            again = LedgerUnavailable(str(exc).replace(_NOTHING_RUN, consequence))
            again.busy = exc.busy
            raise again from exc

    # ------------------------------------------------------------------ datasets
    def _dataset_row(self, tx: _Tx, name: str) -> None:
        tx.execute("INSERT INTO ldp_beam_datasets (dataset, first_seen) VALUES (?, ?) "
                   "ON CONFLICT (dataset) DO NOTHING", (name, _now()))

    @contextlib.contextmanager
    def _locked(self, name: str, consequence: str = _NOTHING_RUN) -> Iterator[_Tx]:
        """A write transaction holding dataset ``name``'s row (created if new), on the ledger
        this object opened."""
        with self._settling(consequence) as tx:
            self._dataset_row(tx, name)
            if tx.pg:  # the dataset's row serialises reservations and admissions on it
                tx.execute("SELECT dataset FROM ldp_beam_datasets WHERE dataset = ? FOR UPDATE",
                           (name,))
            yield tx

    def _budget_row(self, tx: _Tx, name: str) -> tuple[float | None, float | None]:
        rec = tx.one("SELECT budget_epsilon, budget_delta FROM ldp_beam_datasets WHERE "
                     "dataset = ?", (name,))
        return (rec[0], rec[1]) if rec else (None, None)

    def _not_a_fingerprint(self, tx: _Tx, name: str) -> None:
        """Spending is kept by dataset name: a data fingerprint given instead (the key before
        schema 2) would read as a dataset with nothing spent, so it is refused."""
        if not name.startswith(("sha256:", "stream:")):
            return
        if tx.one("SELECT 1 FROM ldp_beam_datasets WHERE dataset = ?", (name,)) is None and \
                tx.one("SELECT 1 FROM ldp_beam_entries WHERE fingerprint = ? LIMIT 1", (name,)):
            raise ParameterError("dataset", name, "a dataset's name (dataset_identity(...)"
                                 "['dataset']), not a data fingerprint: budgets and spending "
                                 "are kept per dataset name")

    def _record_budget(self, tx: _Tx, name: str, epsilon: float, delta: float | None,
                       previous: tuple[float | None, float | None], why: str,
                       run_id: str | None) -> dict:
        change = {"dataset": name, "epsilon": epsilon, "delta": delta,
                  "previous_epsilon": previous[0], "previous_delta": previous[1],
                  "changed": _now(), "os_user": _user(), "host": socket.gethostname(),
                  "why": why, "run_id": run_id}
        tx.execute("UPDATE ldp_beam_datasets SET budget_epsilon = ?, budget_delta = ?, "
                   "budget_set = ? WHERE dataset = ?", (epsilon, delta, change["changed"], name))
        tx.execute(f"INSERT INTO ldp_beam_budget_changes ({', '.join(_CHANGE_COLUMNS)}) VALUES "
                   f"({', '.join('?' * len(_CHANGE_COLUMNS))})",
                   [change[c] for c in _CHANGE_COLUMNS])
        return change

    def _last_change(self, tx: _Tx, name: str) -> dict | None:
        row = tx.one(f"SELECT {', '.join(_CHANGE_COLUMNS)} FROM ldp_beam_budget_changes WHERE "
                     "dataset = ? ORDER BY changed DESC LIMIT 1", (name,))
        return None if row is None else dict(zip(_CHANGE_COLUMNS, row))

    def datasets(self) -> list[str]:
        """Every dataset name the ledger knows (with an entry, a budget or stream spending)."""
        with self._tx(write=False) as tx:
            return [r[0] for r in tx.all("SELECT dataset FROM ldp_beam_datasets ORDER BY "
                                         "dataset")]

    # ------------------------------------------------------------------ budget
    def reserve(self, run_id: str, dataset: Mapping[str, Any], *, command: str, mechanism: str,
                epsilon: float, delta: float = 0.0, params: Mapping[str, Any] | None = None,
                unit: str | None = None, kind: str | None = None,
                accounting: Any = None, budget: float | None = None,
                budget_delta: float | None = None, request: Mapping[str, Any] | None = None,
                seeded: bool = False, republished_from: str | None = None,
                note: str = "") -> Reservation:
        """Record that run ``run_id`` is about to spend ``epsilon`` (and ``delta``) on
        ``dataset`` (from :func:`~ldp_beam.pipelines.datasets.dataset_identity`: spending is kept against its ``"dataset"``
        name; its ``"fingerprint"`` and ``"uri"`` are recorded with the entry), after checking
        the budget, in one transaction. Call it before any noise is drawn.

        ``budget``/``budget_delta``: the run's ``--budget``/``--budget-delta``. Where the
        dataset has no budget recorded, it becomes the dataset's budget; where it has one, it
        may confirm it or lower it (recorded in :meth:`budget_changes` with this run's id), never
        raise it: a ``budget`` (or ``budget_delta``) above the recorded one raises
        :class:`BudgetExceeded` naming ``--budget`` (``--budget-delta``), the recorded budget and
        how to raise it (:meth:`set_budget`). A ``budget_delta`` where the recorded budget has no
        delta sets it. Omitted, the budget recorded applies (none: no limit, still recorded).
        Raises :class:`BudgetExceeded` (naming the parameter, the budget, what was spent and by
        which runs, and what this run asks) if the composed spending with this run would exceed
        the budget; :class:`LedgerUnavailable` if the ledger cannot be reached or locked in time,
        or is no longer the one this object opened. ``request`` (from :func:`release_request`)
        marks a central release that :meth:`find_release` can find again;
        ``republished_from`` a 0-epsilon re-publication."""
        if not isinstance(run_id, str) or not run_id:
            raise ParameterError("run_id", run_id, "a non-empty string (RunKey.run_id)")
        if not isinstance(dataset, Mapping):
            raise ParameterError("dataset", dataset, "the dict from dataset_identity")
        name = _name_of(dataset)
        for what, v in (("dataset.fingerprint", dataset.get("fingerprint")),
                        ("dataset.uri", dataset.get("uri"))):
            if not isinstance(v, str) or not v:
                raise ParameterError(what, v, "a non-empty string (from dataset_identity)")
        epsilon, delta = _check_eps_delta(epsilon, delta)
        budget, budget_delta = _check_budget_args(budget, budget_delta, "--budget")
        if budget_delta is not None and budget is None:
            raise ParameterError("--budget-delta", budget_delta, "given with --budget EPS")
        comps = check_accounting(accounting)
        unit = unit or "record"
        entry = {"run_id": run_id, "status": "pending", "started": _now(), "finished": None,
                 "command": command, "dataset": name, "fingerprint": dataset["fingerprint"],
                 "uri": dataset["uri"], "unit": unit, "mechanism": mechanism, "kind": kind,
                 "params": _dumps(dict(params or {})), "epsilon": epsilon, "delta": delta,
                 "accounting": _dumps(comps), "budget_epsilon": None, "budget_delta": None,
                 "request_key": None if request is None else request_key(
                     dataset["fingerprint"], request),
                 "release": None, "outputs": None, "republished_from": republished_from,
                 "seeded": int(bool(seeded)), "host": socket.gethostname(), "pid": os.getpid(),
                 "os_user": _user(), "note": note or None}
        with self._locked(name) as tx:
            if tx.one("SELECT 1 FROM ldp_beam_entries WHERE run_id = ?", (run_id,)):
                raise LedgerError(f"run {run_id} is already in the ledger {self.url}: a run id "
                                  "is recorded once (RunKey.new() makes a fresh one)")
            rec = self._budget_row(tx, name)
            b_eps, b_delta, why = self._run_budget(tx, name, rec, budget, budget_delta)
            rows = self._live(tx, name)
            before = compose(rows, b_delta)
            if b_eps is not None and (epsilon > 0 or delta > 0):
                self._check_budget(dataset, rows, before, entry, b_eps, b_delta,
                                   given=budget is not None)
            if why:
                self._record_budget(tx, name, b_eps, b_delta, rec, why, run_id)
            entry["budget_epsilon"], entry["budget_delta"] = b_eps, b_delta
            tx.execute(f"INSERT INTO ldp_beam_entries ({', '.join(_ENTRY_COLUMNS)}) VALUES "
                       f"({', '.join('?' * len(_ENTRY_COLUMNS))})",
                       [entry[c] for c in _ENTRY_COLUMNS])
        return Reservation(self, run_id, entry, before, (b_eps, b_delta))

    def _run_budget(self, tx: _Tx, name: str, rec: tuple[float | None, float | None],
                    budget: float | None, budget_delta: float | None
                    ) -> tuple[float | None, float | None, str | None]:
        """The budget a run holds to, and why it changes the recorded one (None: it does
        not): a run may set a budget where none is recorded, confirm it or lower it."""
        r_eps, r_delta = rec
        if budget is None:
            return r_eps, r_delta, None
        if r_eps is None:
            return budget, budget_delta, "set by run"
        raised = [("--budget", budget, f"epsilon={r_eps:g}")] if budget > r_eps else []
        if budget_delta is not None and r_delta is not None and budget_delta > r_delta:
            raised.append(("--budget-delta", budget_delta, f"delta={r_delta:g}"))
        if raised:
            last = self._last_change(tx, name)
            since = ("" if last is None else
                     f", {last['why']} by {last['os_user']}@{last['host']} on "
                     f"{last['changed'][:19].replace('T', ' ')} UTC"
                     + (f" (run {last['run_id']})" if last.get("run_id") else ""))
            what, value, _ = raised[0]
            shown = " and ".join(f"{w} {v:g}" for w, v, _ in raised)
            raise BudgetExceeded(
                what, value,
                f"{shown} is above the budget recorded for dataset {name} in {self.url} "
                f"({_budget_text(r_eps, r_delta)}{since}): a run's --budget may set a budget "
                "where none is recorded, confirm the recorded one or lower it, never raise it; "
                f"{RAISE_HINT} (here --dataset {shlex.quote(name)}"
                + (", with --budget-delta DELTA" if what == "--budget-delta" else "")
                + "). Refused before any noise was drawn")
        new_delta = r_delta if budget_delta is None else budget_delta
        if budget == r_eps and new_delta == r_delta:
            return r_eps, r_delta, None
        lowered = budget < r_eps or (r_delta is not None and new_delta < r_delta)
        return budget, new_delta, "lowered by run" if lowered else "set by run"

    def _live(self, tx: _Tx, name: str) -> list[dict]:
        cols = ("run_id", "command", "mechanism", "epsilon", "delta", "accounting", "status",
                "started", "unit", "seeded")
        rows = tx.all(f"SELECT {', '.join(cols)} FROM ldp_beam_entries WHERE dataset = ? "
                      "AND status IN ('pending', 'committed') ORDER BY started, run_id",
                      (name,))
        return [dict(zip(cols, r)) for r in rows]

    def _check_budget(self, ds, rows, before: Spent, entry: dict, b_eps: float,
                      b_delta: float | None, given: bool) -> None:
        eps, delta = entry["epsilon"], entry["delta"]
        src = "--budget" if given else "--budget (recorded for this dataset)"
        name, uri = entry["dataset"], ds["uri"]
        where = (f"dataset {name} ({'read from ' + uri + ', ' if uri != name else ''}data "
                 f"fingerprint {ds['fingerprint'][:19]})")
        asked = f"this run ({entry['command']} {entry['mechanism']}) asks epsilon={eps:g}" + (
            f", delta={delta:g}" if delta else "")
        if (delta > 0 or before.delta_sum > 0) and not b_delta:
            raise BudgetExceeded(
                "--budget-delta", b_delta,
                f"--budget-delta: the budget of {where} is epsilon={b_eps:g} with no delta, "
                f"which cannot hold a run with delta > 0: {asked}"
                + (f"; earlier runs spent delta={before.delta_sum:g}" if before.delta_sum else "")
                + ". Give --budget-delta DELTA (the delta the total epsilon holds at). Refused "
                "before any noise was drawn", before, (eps, delta))
        after = compose(rows + [entry], b_delta)
        if after.epsilon <= b_eps * (1 + BUDGET_TOLERANCE) + 1e-12:
            return
        runs = [r for r in before.entries if r["epsilon"] or r["delta"]]  # not re-publications
        shown = "; ".join(
            f"{r['run_id']} {r['command']} {r['mechanism']} epsilon={r['epsilon']:g}"
            + (f" delta={r['delta']:g}" if r["delta"] else "")
            + (" PENDING (counts until `ldp-beam ledger --resolve`)" if r["status"] == "pending"
               else f" {r['started'][:19]}") for r in runs[-10:])
        more = f"{len(runs) - 10} earlier runs; " if len(runs) > 10 else ""
        how = ("sum" if after.delta == 0 else
               f"composed with dp_accounting's PLD accountant at delta={after.delta:g}")
        spent = ("nothing spent yet" if not runs else
                 f"already spent epsilon={before.epsilon:g}"
                 + (f" at delta={before.delta:g}" if before.delta else "")
                 + f" by {len(runs)} run(s) [{more}{shown}]")
        raise BudgetExceeded(
            "--budget", b_eps,
            f"{src} {b_eps:g} for {where} would be exceeded: {spent}; {asked}; together "
            f"epsilon={after.epsilon:g} ({how}) > {b_eps:g}. Refused before any noise was "
            f"drawn; {RAISE_HINT} (here --dataset {shlex.quote(name)}), only if the dataset's "
            "owner agrees", before, (eps, delta))

    def set_budget(self, dataset: str, epsilon: float, delta: float | None = None, *, why: str,
                   run_id: str | None = None) -> dict:
        """Set, raise or lower dataset ``dataset``'s budget: the recorded act (``ldp-beam
        ledger --set-budget EPS [--budget-delta D] --dataset NAME --why TEXT``), with the OS
        user and host, the time and ``why`` (required). Returns the change recorded
        (:meth:`budget_changes`' form) with ``"spent"`` (:meth:`Spent.to_dict`) so far. A
        budget below what was already spent is recorded (no further run fits it)."""
        name = _name_of(dataset, "--dataset")
        with self._tx(write=False) as tx:
            known = tx.one("SELECT 1 FROM ldp_beam_datasets WHERE dataset = ?", (name,))
        if not known:  # a new name is checked; a known one (a long path, say) is kept as is
            check_dataset_name(name)
        epsilon, delta = _check_budget_args(epsilon, delta, "--set-budget")
        if epsilon is None:
            raise ParameterError("--set-budget", epsilon, "a finite epsilon >= 0")
        if not isinstance(why, str) or not why.strip():
            raise ParameterError("--why", why, "a non-empty reason, recorded with the change "
                                 "(who agreed, a ticket)")
        with self._locked(name, "nothing was changed") as tx:
            rec = self._budget_row(tx, name)
            change = self._record_budget(tx, name, epsilon, delta, rec, why.strip(), run_id)
            spent = compose(self._live(tx, name), delta)
        return {**change, "spent": spent.to_dict()}

    def budget_changes(self, dataset: str | None = None) -> list[dict]:
        """Every budget change (of ``dataset``, a name, or of all datasets), oldest first:
        ``{"dataset", "epsilon", "delta", "previous_epsilon", "previous_delta", "changed",
        "os_user", "host", "why", "run_id"}``."""
        sql = f"SELECT {', '.join(_CHANGE_COLUMNS)} FROM ldp_beam_budget_changes"
        args: tuple = ()
        if dataset is not None:
            sql += " WHERE dataset = ?"
            args = (_name_of(dataset),)
        with self._tx(write=False) as tx:
            rows = tx.all(sql + " ORDER BY changed, dataset", args)
        return [dict(zip(_CHANGE_COLUMNS, r)) for r in rows]

    def spent(self, dataset: str, unit: str | None = None, delta: float | None = None
              ) -> Spent:
        """What dataset ``dataset`` (its name, or a :func:`~ldp_beam.pipelines.datasets.dataset_identity` dict), or one
        privacy ``unit`` of it, has spent: committed and pending entries, composed (at
        ``delta``, default the dataset's budget delta)."""
        name = _name_of(dataset)
        with self._tx(write=False) as tx:
            self._not_a_fingerprint(tx, name)
            rows = self._live(tx, name)
            rec = self._budget_row(tx, name)
        if unit is not None:
            rows = [r for r in rows if r["unit"] == unit]
        return compose(rows, delta if delta is not None else rec[1])

    def budget(self, dataset: str) -> tuple[float | None, float | None]:
        """The budget recorded for a dataset (its name): (epsilon, delta), (None, None) if
        none."""
        name = _name_of(dataset)
        with self._tx(write=False) as tx:
            self._not_a_fingerprint(tx, name)
            return self._budget_row(tx, name)

    def dataset_status(self, dataset: str) -> dict:
        """What a dataset (its name) has: ``{"dataset", "budget": {"epsilon", "delta"} or None,
        "spent": Spent.to_dict(), "remaining": epsilon left (None without a budget; 0 once a
        run without a finite guarantee counts), "runs", "pending"}``."""
        name = _name_of(dataset)
        with self._tx(write=False) as tx:
            self._not_a_fingerprint(tx, name)
            rows = self._live(tx, name)
            b_eps, b_delta = self._budget_row(tx, name)
        total = compose(rows, b_delta)
        return {"dataset": name,
                "budget": None if b_eps is None else {"epsilon": b_eps, "delta": b_delta},
                "spent": total.to_dict(), "remaining": _remaining(b_eps, total),
                "runs": total.runs, "pending": total.pending}

    # ------------------------------------------------------------------ outcome
    def _pending(self, tx: _Tx, run_id: str) -> None:
        row = tx.one("SELECT status FROM ldp_beam_entries WHERE run_id = ?", (run_id,))
        if row is None:
            raise LedgerError(f"run {run_id} has no reservation in {self.url}: reserve "
                              "before the run draws any noise")
        if row[0] != "pending":
            raise LedgerError(f"run {run_id} is {row[0]} in {self.url}, not pending: it "
                              "must not publish (an operator resolved it, or it ran twice)")

    def prepare(self, run_id: str, outputs: Mapping[str, Any] | None = None,
                release: Mapping[str, Any] | None = None) -> None:
        """Before anything of ``run_id`` is published: in one transaction, check that the ledger
        is still the one this object opened (the one the run reserved in) and that the entry is
        still pending, and store its ``outputs`` (role -> path, bytes, sha256) and, for a
        central release, the ``release`` as it will be published. The entry stays pending.
        Raises :class:`LedgerUnavailable` (the ledger deleted, replaced, damaged or unreachable)
        or :class:`LedgerError` (not pending): then publish nothing."""
        with self._settling("nothing was published") as tx:
            self._pending(tx, run_id)
            tx.execute("UPDATE ldp_beam_entries SET outputs = COALESCE(?, outputs), "
                       "release = COALESCE(?, release) WHERE run_id = ? AND status = 'pending'",
                       (_dumps(outputs), _dumps(release, sort_keys=False), run_id))

    def commit(self, run_id: str, outputs: Mapping[str, Any] | None = None,
               release: Mapping[str, Any] | None = None, *,
               epsilon: float | None = None) -> None:
        """Mark ``run_id``'s reservation committed, on the ledger it was reserved in (checked
        as :meth:`prepare` does), with its ``outputs`` and ``release`` (given here, they replace
        what :meth:`prepare` stored; omitted, that is kept). Call :meth:`prepare` before
        publishing and this after; called alone (before the outputs are moved into place) it
        does both: if it raises, publish nothing.

        ``epsilon``: what the run turned out to spend, when it is known only at the end (a
        stream reserves the most its units can lose and spends what they did): never more than
        it reserved, since the budget was checked against the reservation (omitted: the
        reservation)."""
        with self._settling("its entry was not marked committed") as tx:
            self._pending(tx, run_id)
            self._spent_less(tx, run_id, epsilon)
            tx.execute("UPDATE ldp_beam_entries SET status = 'committed', finished = ?, "
                       "outputs = COALESCE(?, outputs), release = COALESCE(?, release) "
                       "WHERE run_id = ? AND status = 'pending'",
                       (_now(), _dumps(outputs), _dumps(release, sort_keys=False), run_id))

    def _spent_less(self, tx: _Tx, run_id: str, epsilon: float | None) -> None:
        """Record that pending run ``run_id`` spent ``epsilon`` (None: what it reserved), never
        more than it reserved: its budget check was for that."""
        if epsilon is None:
            return
        epsilon = _check_eps_delta(epsilon, 0.0)[0]
        reserved = float(tx.one("SELECT epsilon FROM ldp_beam_entries WHERE run_id = ?",
                                (run_id,))[0])
        if epsilon > reserved * (1 + BUDGET_TOLERANCE) + 1e-12:
            raise ParameterError("epsilon", epsilon, f"at most the {reserved:g} run {run_id} "
                                 "reserved (its budget check was for that)")
        tx.execute("UPDATE ldp_beam_entries SET epsilon = ? WHERE run_id = ? AND status = "
                   "'pending'", (min(epsilon, reserved), run_id))

    def leave_pending(self, run_id: str, note: str) -> None:
        """Record ``note`` on ``run_id``'s pending entry and leave it pending: it counts as
        spent until an operator resolves it (a run that may have published part of its
        outputs)."""
        with self._settling("its entry stays as it was", check=False) as tx:
            self._pending(tx, run_id)
            tx.execute("UPDATE ldp_beam_entries SET note = CASE WHEN note IS NULL THEN ? ELSE "
                       "note || '; ' || ? END WHERE run_id = ? AND status = 'pending'",
                       (str(note), str(note), run_id))

    def abort(self, run_id: str, reason: str = "") -> bool:
        """Give back a pending reservation of a run that published nothing. Returns False if it
        was already aborted; raises :class:`LedgerError` for a committed run (spent for good)."""
        with self._settling("its reservation was not given back", check=False) as tx:
            row = tx.one("SELECT status FROM ldp_beam_entries WHERE run_id = ?", (run_id,))
            if row is None:
                raise LedgerError(f"run {run_id} has no entry in {self.url}")
            if row[0] == "aborted":
                return False
            if row[0] == "committed":
                raise LedgerError(f"run {run_id} is committed in {self.url}: what it published "
                                  "stays spent")
            tx.execute("UPDATE ldp_beam_entries SET status = 'aborted', finished = ?, note = ? "
                       "WHERE run_id = ? AND status = 'pending'", (_now(), reason or None,
                                                                   run_id))
        return True

    def resolve(self, run_id: str, status: str, note: str = "", *,
                epsilon: float | None = None) -> None:
        """An operator's decision on a pending run whose process is gone: ``committed`` (it may
        have published: stays spent) or ``aborted`` (it certainly published nothing).
        ``epsilon`` (committed only): what it is known to have spent, at most its reservation
        (a stream's restart knows it from the stream's per-unit state)."""
        if status not in ("committed", "aborted"):
            raise ParameterError("--as", status, "committed or aborted")
        if epsilon is not None and status != "committed":
            raise ParameterError("epsilon", epsilon, "given only to resolve as committed")
        with self._settling("nothing was changed") as tx:
            row = tx.one("SELECT status, note FROM ldp_beam_entries WHERE run_id = ?", (run_id,))
            if row is None:
                raise ParameterError("--resolve", run_id, "the run id of a pending entry",
                                     hint=f"no such run in {self.url}")
            if row[0] != "pending":
                raise ParameterError("--resolve", run_id, "the run id of a pending entry",
                                     hint=f"it is {row[0]}")
            said = f"resolved as {status} by {_user()}" + (f": {note}" if note else "")
            self._spent_less(tx, run_id, epsilon)
            tx.execute("UPDATE ldp_beam_entries SET status = ?, finished = ?, note = ? WHERE "
                       "run_id = ? AND status = 'pending'",
                       (status, _now(), said if not row[1] else f"{row[1]}; {said}", run_id))

    def find_release(self, fingerprint: str, request: Mapping[str, Any]) -> dict | None:
        """The committed release of an identical request (same data fingerprint, whatever the
        dataset's name, and the same :func:`release_request`), most recent first: ``{"run_id",
        "release", "outputs", "finished"}``; None if there is none. A re-run publishes it again
        instead of drawing new noise (recorded with epsilon 0 and ``republished_from``)."""
        key = request_key(fingerprint, request)
        with self._tx(write=False) as tx:
            row = tx.one("SELECT run_id, release, outputs, finished FROM ldp_beam_entries WHERE "
                         "request_key = ? AND fingerprint = ? AND status = 'committed' AND "
                         "release IS NOT NULL AND republished_from IS NULL "
                         "ORDER BY finished DESC LIMIT 1", (key, fingerprint))
        if row is None:
            return None
        return {"run_id": row[0], "release": _loads(row[1]), "outputs": _loads(row[2]),
                "finished": row[3]}

    # ------------------------------------------------------------------ reading
    def _filter(self, tx: _Tx, dataset: str) -> tuple[str, list]:
        """SQL selecting the entries ``dataset`` names: a dataset name or the location an entry
        was read from (a path is taken to its canonical location), else (a prefix of) a data
        fingerprint."""
        try:
            loc = canonical_location(dataset)
        except ParameterError:
            loc = dataset
        by_name = "(dataset = ? OR dataset = ? OR uri = ? OR uri = ?)"
        args: list = [dataset, loc, dataset, loc]
        if tx.one(f"SELECT 1 FROM ldp_beam_entries WHERE {by_name} LIMIT 1", args):
            return by_name, args
        prefix = dataset.replace("%", "").replace("_", "")
        return ("(fingerprint = ? OR fingerprint LIKE ? OR fingerprint LIKE ?)",
                [dataset, prefix + "%", "sha256:" + prefix + "%"])

    def entries(self, dataset: str | None = None, status: str | None = None) -> list[dict]:
        """Every entry, oldest first (``dataset``: a dataset name, a location it was read from,
        or (a prefix of) a data fingerprint)."""
        sql = f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM ldp_beam_entries"
        args: list[Any] = []
        where = []
        if status:
            if status not in STATUSES:
                raise ParameterError("--status", status, " or ".join(STATUSES))
        with self._tx(write=False) as tx:
            if dataset:
                clause, more = self._filter(tx, dataset)
                where.append(clause)
                args += more
            if status:
                where.append("status = ?")
                args.append(status)
            if where:
                sql += " WHERE " + " AND ".join(where)
            rows = tx.all(sql + " ORDER BY started, run_id", args)
        out = []
        for r in rows:
            e = dict(zip(_ENTRY_COLUMNS, r))
            for k in ("params", "accounting", "release", "outputs"):
                e[k] = _loads(e[k])
            e["seeded"] = bool(e["seeded"])
            out.append(e)
        return out

    def summary(self, dataset: str | None = None) -> list[dict]:
        """Totals per dataset name (every entry of each dataset ``dataset`` selects, as
        :meth:`entries` does; all datasets without it, those with only a budget too), with its
        budget, what remains and its budget history, per privacy unit and per day (UTC); each
        total composed as :meth:`spent` does."""
        matched = self.entries(dataset)
        names = list(dict.fromkeys(e["dataset"] for e in matched))
        with self._tx(write=False) as tx:
            budgets = {r[0]: (r[1], r[2]) for r in tx.all(
                "SELECT dataset, budget_epsilon, budget_delta FROM ldp_beam_datasets")}
        if dataset is None:
            names += sorted(n for n, b in budgets.items() if b[0] is not None and n not in names)
            everything = matched
        else:
            if not names and dataset in budgets:
                names = [dataset]
            everything = [e for e in self.entries() if e["dataset"] in set(names)]
        changes: dict[str, list] = {}
        for c in self.budget_changes():
            changes.setdefault(c["dataset"], []).append(c)
        by_name: dict[str, list[dict]] = {n: [] for n in names}
        for e in everything:
            by_name.setdefault(e["dataset"], []).append(e)
        out = []
        for name, es in by_name.items():
            b_eps, b_delta = budgets.get(name, (None, None))
            live = [e for e in es if e["status"] != "aborted"]
            total = compose(live, b_delta)
            units, days = {}, {}
            for key, group in (("unit", units), ("day", days)):
                sel: dict[str, list] = {}
                for e in live:
                    sel.setdefault(e["unit"] if key == "unit" else e["started"][:10], []).append(e)
                for k, v in sorted(sel.items()):
                    group[k] = compose(v, b_delta).to_dict()
            out.append({"dataset": name,
                        "uris": sorted({e["uri"] for e in es}),
                        "fingerprints": list(dict.fromkeys(e["fingerprint"] for e in es)),
                        "budget": None if b_eps is None else {"epsilon": b_eps,
                                                               "delta": b_delta},
                        "spent": total.to_dict(),
                        "remaining": _remaining(b_eps, total),
                        "aborted": sum(1 for e in es if e["status"] == "aborted"),
                        "units": units, "days": days,
                        "budget_changes": changes.get(name, [])})
        return out



def _remaining(b_eps: float | None, total: Spent) -> float | None:
    if b_eps is None:
        return None
    return 0.0 if math.isinf(total.epsilon) else max(0.0, b_eps - total.epsilon)


def _check_budget_args(budget: Any, budget_delta: Any, what: str
                       ) -> tuple[float | None, float | None]:
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) \
                or not math.isfinite(budget) or budget < 0:
            raise ParameterError(what, budget, "a finite epsilon >= 0")
        budget = float(budget)
    if budget_delta is not None:
        if isinstance(budget_delta, bool) or not isinstance(budget_delta, (int, float)) \
                or not 0 <= budget_delta < 1:
            raise ParameterError("--budget-delta", budget_delta, "a number in [0, 1)")
        budget_delta = float(budget_delta)
    return budget, budget_delta


def _migrate_v1(tx: _Tx, url: str) -> None:
    """Schema 1 -> 2 inside the caller's transaction (see the module docstring): every entry
    kept, its dataset the location it was read from; each fingerprint's budget carried to every
    location read under it (the smallest where several differ), recorded as a budget change;
    per-unit spending carried to its stream's location. Raises :class:`LedgerError` (and the
    transaction rolls back) if a count does not match."""
    n_entries = tx.one("SELECT COUNT(*) FROM ldp_beam_entries")[0]
    spend_before = float(tx.one("SELECT COALESCE(SUM(epsilon), 0) FROM ldp_beam_unit_spend")[0])
    for stmt in ("DROP INDEX IF EXISTS ldp_beam_entries_fp",
                 "DROP INDEX IF EXISTS ldp_beam_entries_req"):
        tx.execute(stmt)
    for table in ("entries", "datasets", "unit_spend"):
        tx.execute(f"ALTER TABLE ldp_beam_{table} RENAME TO ldp_beam_v1_{table}")
    for stmt in _SCHEMA_TABLES:
        tx.execute(stmt)
    stream_name = "COALESCE(d.uri, s.fingerprint)"
    stream_join = ("FROM ldp_beam_v1_unit_spend s LEFT JOIN ldp_beam_v1_datasets d ON "
                   "d.fingerprint = s.fingerprint")
    tx.execute("INSERT INTO ldp_beam_datasets (dataset, first_seen) SELECT name, MIN(seen) FROM ("
               "SELECT uri AS name, first_seen AS seen FROM ldp_beam_v1_datasets UNION ALL "
               "SELECT uri, started FROM ldp_beam_v1_entries UNION ALL "
               f"SELECT {stream_name}, s.recorded {stream_join}) AS seen_at GROUP BY name")
    cols = ", ".join(_V1_ENTRY_COLUMNS)
    tx.execute(f"INSERT INTO ldp_beam_entries (dataset, {cols}) SELECT uri, {cols} FROM "
               "ldp_beam_v1_entries")
    tx.execute("INSERT INTO ldp_beam_unit_spend (dataset, unit_hash, window_id, epsilon, run_id, "
               f"recorded) SELECT {stream_name}, s.unit_hash, s.window_id, SUM(s.epsilon), "
               f"MIN(s.run_id), MIN(s.recorded) {stream_join} GROUP BY {stream_name}, "
               "s.unit_hash, s.window_id")
    read_at: dict[str, set] = {}
    for fp, uri in tx.all("SELECT DISTINCT fingerprint, uri FROM ldp_beam_v1_entries"):
        read_at.setdefault(fp, set()).add(uri)
    per: dict[str, list] = {}
    for fp, uri, eps, delta, when in tx.all(
            "SELECT fingerprint, uri, budget_epsilon, budget_delta, budget_set FROM "
            "ldp_beam_v1_datasets WHERE budget_epsilon IS NOT NULL"):
        for where in {uri} | read_at.get(fp, set()):
            per.setdefault(where, []).append((float(eps), None if delta is None
                                              else float(delta), when or ""))
    now, user, host = _now(), _user(), socket.gethostname()
    for name, budgets in sorted(per.items()):
        eps = min(b[0] for b in budgets)
        deltas = [b[1] for b in budgets if b[1] is not None]
        delta = min(deltas) if deltas else None
        distinct = sorted({(b[0], b[1]) for b in budgets}, key=lambda b: (b[0], b[1] or 0.0))
        why = "migrated from schema 1"
        if len(distinct) > 1:
            why += (" (the smallest of the budgets of the data read there: "
                    + "; ".join(_budget_text(e, d) for e, d in distinct) + ")")
        tx.execute("UPDATE ldp_beam_datasets SET budget_epsilon = ?, budget_delta = ?, "
                   "budget_set = ? WHERE dataset = ?",
                   (eps, delta, max(b[2] for b in budgets) or now, name))
        tx.execute(f"INSERT INTO ldp_beam_budget_changes ({', '.join(_CHANGE_COLUMNS)}) VALUES "
                   f"({', '.join('?' * len(_CHANGE_COLUMNS))})",
                   (name, eps, delta, None, None, now, user, host, why, None))
    n_after = tx.one("SELECT COUNT(*) FROM ldp_beam_entries")[0]
    spend_after = float(tx.one("SELECT COALESCE(SUM(epsilon), 0) FROM ldp_beam_unit_spend")[0])
    if n_after != n_entries or abs(spend_after - spend_before) > 1e-9 * max(1.0, spend_before):
        raise LedgerError(f"--ledger {url}: migrating the ledger from schema 1 would change it "
                          f"({n_entries} entries -> {n_after}, unit spend {spend_before:g} -> "
                          f"{spend_after:g}); nothing was changed")
    for table in ("entries", "unit_spend", "datasets"):
        tx.execute(f"DROP TABLE ldp_beam_v1_{table}")
    tx.execute("UPDATE ldp_beam_meta SET value = ? WHERE key = 'schema_version'",
               (str(SCHEMA_VERSION),))
    for key, value in (("ledger_id", os.urandom(16).hex()), ("migrated_from_1", now)):
        tx.execute("INSERT INTO ldp_beam_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO "
                   "NOTHING", (key, value))


def _check_eps_delta(epsilon: Any, delta: Any) -> tuple[float, float]:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
        raise ParameterError("epsilon", epsilon, "a number >= 0 (math.inf for a run without a "
                             "finite guarantee)")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta <= 1:
        raise ParameterError("delta", delta, "a number in [0, 1]")
    return float(epsilon), float(delta)


def open_ledger(url: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                create: bool = True) -> Ledger:
    """``Ledger.open(url)``: the ledger named by ``--ledger`` (default: :func:`default_url`)."""
    return Ledger.open(url, timeout=timeout, create=create)


__all__ = ["BudgetExceeded", "Ledger", "LedgerError", "LedgerNotFound", "LedgerUnavailable",
           "Reservation", "Spent", "canonical_location", "check_dataset_name",
           "compose", "default_url", "open_ledger", "redact",
           "release_request", "request_key", "check_accounting",
           "DATASET_NAME_MAX", "RAISE_HINT", "SCHEMA_VERSION"]
