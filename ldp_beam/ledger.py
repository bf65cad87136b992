"""A budget ledger: every collection and release recorded, and a total budget per dataset.

What it holds
-------------
One row per run (``ldp_beam_entries``): the run id, the command, the dataset (the URI it was read
from and a fingerprint of its *content*, see :func:`dataset_identity`), the privacy unit, the
mechanism and its parameters, the epsilon and delta it spends, the time, the status, its outputs
(paths with size and SHA-256) and, for a central release, the released JSON itself (what was
published; never exact counts). Budgets live per dataset fingerprint (``ldp_beam_datasets``), and
per-unit spending of longitudinal streams in ``ldp_beam_unit_spend``.

Backends: a SQLite file (the default; WAL journal, ``synchronous=FULL``, a busy timeout; keep it
on a local disk, as SQLite's locking is not reliable over network file systems) or a shared team
database on PostgreSQL (psycopg 3). Both use the same tables, created when absent,
with a schema version in ``ldp_beam_meta``. URLs: ``sqlite:///FILE`` (``FILE`` as written:
``sqlite:///ledger.db`` is relative, ``sqlite:////abs/ledger.db`` absolute, as in SQLAlchemy),
a bare file path, or ``postgresql://user[:password]@host:port/database``. Without a URL:
``$LDP_BEAM_LEDGER`` (a URL or a file path), else ``$XDG_DATA_HOME/ldp-beam/ledger.db``
(``~/.local/share/ldp-beam/ledger.db``).

Two phases, so that nothing is published unrecorded and a crash is safe
----------------------------------------------------------------------
1. :meth:`Ledger.reserve`, before the pipeline runs (before any noise is drawn): in one
   transaction that holds the dataset's row (``BEGIN IMMEDIATE`` on SQLite, ``SELECT ... FOR
   UPDATE`` on PostgreSQL, so two concurrent runs cannot both fit where only one does), compose
   what the dataset has spent, refuse with :class:`BudgetExceeded` if this run would exceed the
   budget, else insert a ``pending`` row.
2. :meth:`Ledger.commit`, after the run succeeded and *before* its outputs are moved into place:
   the row becomes ``committed`` with its outputs and release. A ledger that cannot be reached at
   that point raises :class:`LedgerUnavailable` and the run publishes nothing.
3. :meth:`Ledger.abort`: a run that failed (nothing published) gives its reservation back.

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
:meth:`Ledger.admit_units` records one row per (stream, unit, window) in a batch and refuses units
whose cumulative epsilon would pass a cap; unit values are stored only as keyed hashes
(:meth:`Ledger.unit_hash`, keyed by a random salt kept in the ledger).

The ledger runs on the launcher (the trusted side), never inside a Beam worker, and this module
imports no Beam.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import glob
import hashlib
import json
import math
import os
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from .errors import LdpBeamError, ParameterError

SCHEMA_VERSION = 1
DEFAULT_TIMEOUT = 5.0  # seconds: to connect, and to wait for a lock held by another run
STATUSES = ("pending", "committed", "aborted")
#: Relative slack on budget comparisons, so that 0.1 + 0.2 + 0.7 fits a budget of 1.
BUDGET_TOLERANCE = 1e-9
_ADVISORY_KEY = 0x6C6470626561  # PostgreSQL advisory lock serialising schema creation


# ----------------------------------------------------------------------------------- errors
class LedgerError(LdpBeamError):
    """A ledger operation that cannot be done as asked (a run id recorded twice, committing a run
    that is not pending, a ledger written by a newer ldp-beam)."""


class LedgerUnavailable(LedgerError):
    """The ledger cannot be reached, opened or locked in time. Raised before any noise is drawn
    (at open or reserve) or, at commit, before anything is published; the message names
    ``--ledger`` and the URL (without its password)."""


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
        return env if "://" in env else "sqlite:///" + env
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return "sqlite:///" + os.path.join(base, "ldp-beam", "ledger.db")


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
    return None if x is None else json.dumps(x, sort_keys=sort_keys, separators=(",", ":"),
                                              default=_json_default)


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    return str(x)


def _loads(x: str | None) -> Any:
    return None if x is None else json.loads(x)


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:  # no passwd entry in a container
        return str(os.getuid())


# ------------------------------------------------------------------------- dataset identity
_GLOB_CHARS = "*?["


def dataset_identity(input: str, options: Any = ()) -> dict:
    """The identity of the data a run reads: ``{"uri", "fingerprint", "files", "bytes"}``.

    The fingerprint identifies the *data*, not the path: a copy of the same file elsewhere has the
    same fingerprint (and spends the same budget); changing one value changes it. It is the
    SHA-256 of each file's bytes, streamed (about 1.7 GB/s here: a 1 GB dataset costs ~0.6 s, less
    than reading it through the pipeline), combined over the files sorted by their name relative
    to the input (a directory, or the folder part of a glob; a single file contributes its content
    only, so a renamed copy matches). Why the whole content rather than a Parquet footer (sizes,
    row counts and statistics): changing one value that is neither a minimum nor a maximum can
    leave the footer and the file size unchanged, so the footer would let a changed dataset pass
    for the old one; and CSV files have no footer. Limits (documented, not hidden): the same rows
    re-encoded (another compression, row order, a CSV re-quoted) fingerprint differently, so the
    budget is a guard against re-running on the same data, not against someone who rewrites it.

    Local paths, folders and globs are read as ``ReadTable`` reads them (a folder's entries whose
    names start with ``.`` or ``_`` are skipped; sub-folders are read recursively); a URI with a
    scheme (``gs://``, ``s3://``, ``file://``, ...) through ``pyarrow.fs`` (for ``s3://``, the
    endpoint, region and keys among Beam's ``--s3_...`` arguments in ``options``, if any, else
    the environment's)."""
    if not isinstance(input, str) or not input:
        raise ParameterError("--input", input, "a file, folder, glob or URI")
    pre = _PREFETCHED.pop(input, None)
    if pre is not None:  # hashed in the background since the command started
        thread, box = pre
        thread.join()
        if "identity" in box and _local_signature(input) == box["signature"]:
            return dict(box["identity"])
    return _dataset_identity(input, options)


_PREFETCHED: dict[str, tuple[threading.Thread, dict]] = {}


def prefetch_dataset_identity(input: Any) -> None:
    """Start :func:`dataset_identity` of a local input (a file, folder or glob) on a background
    thread, so its hashing (which releases the GIL) overlaps what the command does before it
    needs the fingerprint: importing Beam and building the pipeline (~1 s), against ~0.1 s to
    hash a 10^7-row Parquet file. :func:`dataset_identity` then waits for it and takes its
    result only if every file still has the size, modification time and inode it had before it
    was hashed (else it hashes again); a failure there is left to that call to report. URIs and
    databases are not prefetched."""
    if not isinstance(input, str) or not input or "://" in input or input in _PREFETCHED:
        return
    box: dict = {}

    def work() -> None:
        try:
            sig = _local_signature(input)  # before hashing: a file changed meanwhile differs
            box["identity"] = _dataset_identity(input, ())
            box["signature"] = sig
        except Exception:  # noqa: BLE001 - dataset_identity reports it when it is asked
            box.clear()

    thread = threading.Thread(target=work, name="ldp-beam-fingerprint", daemon=True)
    _PREFETCHED[input] = (thread, box)
    thread.start()


def _local_signature(input: str) -> list | None:
    """Each local file of ``input`` with its size, modification time and inode (None when
    there is none to read)."""
    try:
        paths, _ = _local_paths(input)
    except ParameterError:
        return None
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:  # gone: hashed again, which reports it
            return None
        out.append((p, st.st_size, st.st_mtime_ns, st.st_ino))
    return out


def _dataset_identity(input: str, options: Any = ()) -> dict:
    if input.split("://", 1)[0].lower() in DATABASE_SCHEMES:
        return _database_identity(input)
    if "://" in input:
        files = _remote_files(input, options)
    else:
        files = _local_files(input)
    h = hashlib.sha256(b"ldp-beam/dataset/v1\n")
    total = 0
    single = len(files) == 1
    for name, size, digest in sorted(files):
        h.update(f"{'' if single else name}\0{size}\0{digest}\n".encode())
        total += size
    return {"uri": input if "://" in input else os.path.abspath(input),
            "fingerprint": "sha256:" + h.hexdigest(), "files": len(files), "bytes": total}


DATABASE_SCHEMES = ("duckdb", "postgresql", "postgres", "iceberg")


def _database_identity(input: str) -> dict:
    """A table or query in a database is identified by what it names (the URL without its
    password, and the table or query), not by its content: hashing a warehouse table would cost a
    full scan of it. The budget then follows the table as it changes over time, which can only
    over-count what its people have spent, never under-count; a copy of the table under another
    name is another dataset (say so to the operator: a copy does not reset a person's budget)."""
    from urllib.parse import parse_qsl, urlsplit

    parts = urlsplit(redact(input))
    query = "&".join(f"{k}={v}" for k, v in sorted(parse_qsl(parts.query)))
    canonical = f"{parts.scheme.lower()}://{parts.netloc}{parts.path}" + (f"?{query}" if query
                                                                          else "")
    h = hashlib.sha256(b"ldp-beam/dataset/table/v1\n" + canonical.encode())
    return {"uri": canonical, "fingerprint": "sha256:" + h.hexdigest(), "files": 0, "bytes": 0}


def stream_identity(name: str) -> dict:
    """The identity of an unbounded source (a spool folder, a subscription): its name, since its
    content is not known in advance. Per-unit spending (:meth:`Ledger.admit_units`) is kept
    against it."""
    if not isinstance(name, str) or not name:
        raise ParameterError("stream", name, "the name of a spool folder or subscription")
    uri = name if "://" in name else os.path.abspath(name)
    return {"uri": uri, "fingerprint": "stream:" + hashlib.sha256(uri.encode()).hexdigest(),
            "files": None, "bytes": None}


def _hash_stream(read) -> tuple[int, str]:
    h = hashlib.sha256()
    n = 0
    while True:
        chunk = read(1 << 22)
        if not chunk:
            return n, h.hexdigest()
        n += len(chunk)
        h.update(chunk)


def _local_paths(input: str) -> tuple[list[str], str]:
    """The files a local input names, as ``ReadTable`` reads them, and the folder their names
    are relative to."""
    if os.path.isdir(input):
        base = input
        paths = []
        for entry in sorted(os.listdir(input)):
            if entry.startswith((".", "_")):
                continue
            full = os.path.join(input, entry)
            if os.path.isdir(full):
                for root, dirs, names in os.walk(full):
                    dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                    paths += [os.path.join(root, f) for f in sorted(names)
                              if not f.startswith((".", "_"))]
            else:
                paths.append(full)
    else:
        paths = sorted(p for p in glob.glob(input) if os.path.isfile(p))
        cut = min([input.index(c) for c in _GLOB_CHARS if c in input] or [len(input)])
        base = os.path.dirname(input[:cut]) if cut < len(input) else os.path.dirname(input)
    if not paths:
        raise ParameterError("--input", input, "an existing file, a folder holding files, or a "
                             "glob that matches files", hint="the ledger fingerprints the data "
                             "before the run")
    return paths, base


def _local_files(input: str) -> list[tuple[str, int, str]]:
    paths, base = _local_paths(input)
    out = []
    for p in paths:
        try:
            with open(p, "rb") as fh:
                size, digest = _hash_stream(fh.read)
        except OSError as exc:
            raise ParameterError("--input", input, "readable files",
                                 hint=f"cannot read {p}: {exc}") from exc
        out.append((os.path.relpath(p, base or "."), size, digest))
    return out


def _s3_settings(options: Any) -> dict:
    """pyarrow S3FileSystem keywords from Beam's ``--s3_...`` arguments in a list (read here
    without Beam; empty: the environment's settings)."""
    args = [str(a) for a in (options or ())]
    got: dict = {}
    for i, a in enumerate(args):
        for name in ("s3_endpoint_url", "s3_region_name", "s3_access_key_id",
                     "s3_secret_access_key", "s3_session_token"):
            if a.startswith(f"--{name}="):
                got[name] = a.split("=", 1)[1]
            elif a == f"--{name}" and i + 1 < len(args):
                got[name] = args[i + 1]
    kw: dict = {}
    if got.get("s3_endpoint_url"):
        kw["endpoint_override"] = got["s3_endpoint_url"]
    if got.get("s3_region_name"):
        kw["region"] = got["s3_region_name"]
    if got.get("s3_access_key_id") and got.get("s3_secret_access_key"):
        kw.update(access_key=got["s3_access_key_id"], secret_key=got["s3_secret_access_key"],
                  session_token=got.get("s3_session_token"))
    return kw


def _remote_files(input: str, options: Any = ()) -> list[tuple[str, int, str]]:
    import pyarrow.fs as pafs

    try:
        kw = _s3_settings(options) if input.startswith("s3://") else {}
        if kw:
            fs, path = pafs.S3FileSystem(**kw), input[len("s3://"):]
        else:
            fs, path = pafs.FileSystem.from_uri(input)
        info = fs.get_file_info(path)
    except Exception as exc:  # an unknown scheme, no credentials, an unreachable store
        raise ParameterError("--input", input, "a URI pyarrow.fs can read (file://, s3://, "
                             "gs://, hdfs://)", hint=f"fingerprinting it failed: {exc}") from exc
    if info.type == pafs.FileType.Directory:
        infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                 if i.type == pafs.FileType.File
                 and not any(part.startswith((".", "_"))
                             for part in os.path.relpath(i.path, path).split("/"))]
        base = path
    elif info.type == pafs.FileType.File:
        infos, base = [info], os.path.dirname(path)
    else:
        raise ParameterError("--input", input, "an existing file or folder (globs are for local "
                             "paths)")
    if not infos:
        raise ParameterError("--input", input, "a folder holding files")
    out = []
    for i in sorted(infos, key=lambda i: i.path):
        with fs.open_input_stream(i.path) as fh:
            size, digest = _hash_stream(fh.read)
        out.append((os.path.relpath(i.path, base), size, digest))
    return out


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
_SCHEMA = [
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

_ENTRY_COLUMNS = ("run_id", "status", "started", "finished", "command", "fingerprint", "uri",
                  "unit", "mechanism", "kind", "params", "epsilon", "delta", "accounting",
                  "budget_epsilon", "budget_delta", "request_key", "release", "outputs",
                  "republished_from", "seeded", "host", "pid", "os_user", "note")


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


class _SQLite:
    def __init__(self, path: str, url: str, timeout: float) -> None:
        self.path, self.url, self.timeout = path, url, timeout
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
            self.conn = sqlite3.connect(path, timeout=timeout, isolation_level=None,
                                        check_same_thread=False)
            self.conn.execute("PRAGMA foreign_keys = ON")
            mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot use a WAL journal (got {mode})")
            self.conn.execute("PRAGMA synchronous = FULL")  # a committed entry survives a crash
        except (sqlite3.Error, OSError) as exc:
            raise self.unavailable(exc) from exc

    def unavailable(self, exc: BaseException) -> LedgerUnavailable:
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and ("locked" in text or "busy" in text):
            return LedgerUnavailable(
                f"--ledger {self.url}: the ledger is locked by another process for more than "
                f"{self.timeout:g} s ({text}); nothing was run, no noise was drawn. Retry when "
                "the other run has recorded its entry")
        return LedgerUnavailable(f"--ledger {self.url}: cannot use the SQLite ledger "
                                 f"{self.path} ({type(exc).__name__}: {text}); nothing was run, "
                                 "no noise was drawn")

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

    def errors(self) -> tuple:
        return (sqlite3.Error,)

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()


class _Postgres:
    def __init__(self, url: str, timeout: float) -> None:
        self.url, self.shown, self.timeout = url, redact(url), timeout
        try:
            import psycopg
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
            return LedgerUnavailable(
                f"--ledger {self.shown}: the ledger is locked by another run for more than "
                f"{self.timeout:g} s ({text}); nothing was run, no noise was drawn")
        return LedgerUnavailable(f"--ledger {self.shown}: cannot reach the PostgreSQL ledger "
                                 f"({type(exc).__name__}: {text}); nothing was run, no noise "
                                 "was drawn")

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

    def errors(self) -> tuple:
        return (self.psycopg.Error,)

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()


# ----------------------------------------------------------------------------------- ledger
@dataclass(frozen=True)
class UnitAdmission:
    """Which units a stream window may use: ``admitted`` (their spend recorded, or already
    recorded for this window), ``refused`` (unit hash -> epsilon already spent, over the cap)."""

    admitted: list
    refused: dict


class Reservation:
    """A pending ledger entry (see :meth:`Ledger.reserve`). As a context manager, leaving it
    without :meth:`commit` (an error, an interrupt) aborts it: nothing was published. A process
    killed outright leaves it pending, and it counts as spent until resolved."""

    def __init__(self, ledger: "Ledger", run_id: str, entry: dict, spent: Spent,
                 budget: tuple[float | None, float | None]) -> None:
        self.ledger, self.run_id, self.entry = ledger, run_id, entry
        self.spent_before, self.budget = spent, budget
        self.status = "pending"

    def commit(self, outputs: Mapping[str, Any] | None = None,
               release: Mapping[str, Any] | None = None) -> None:
        self.ledger.commit(self.run_id, outputs, release)
        self.status = "committed"

    def abort(self, reason: str = "") -> None:
        self.ledger.abort(self.run_id, reason)
        self.status = "aborted"

    def __enter__(self) -> "Reservation":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.status != "pending":
            return
        try:
            self.abort(f"run failed: {exc_type.__name__}: {exc}" if exc_type else
                       "left without commit")
        except LedgerError:
            pass  # cannot reach the ledger: the entry stays pending and counts as spent

    def __repr__(self) -> str:
        return f"Reservation({self.run_id!r}, {self.status})"


class Ledger:
    """A budget ledger on SQLite or PostgreSQL (see the module docstring). Open with
    :meth:`open`; one object per thread; close it (or use it as a context manager)."""

    def __init__(self, backend: Any, url: str) -> None:
        self._db = backend
        self.url = redact(url)
        self._lock = threading.RLock()
        self._salt: bytes | None = None

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, url: str | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> "Ledger":
        """Open (and create if absent) the ledger at ``url`` (default: :func:`default_url`).
        Raises :class:`LedgerUnavailable` if it cannot be reached or opened within ``timeout``
        seconds, :class:`~ldp_beam.errors.ParameterError` naming ``--ledger`` for a URL of an
        unknown form."""
        if isinstance(url, Ledger):
            return url
        url = default_url() if url is None or url == "" else str(url)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ParameterError("timeout", timeout, "a number of seconds > 0")
        scheme = url.split("://", 1)[0].lower() if "://" in url else ""
        if scheme in ("postgresql", "postgres"):
            backend: Any = _Postgres(url, timeout)
        elif scheme in ("sqlite", ""):
            path = url[len("sqlite:///"):] if scheme else url
            if scheme and not url.startswith("sqlite:///"):
                raise ParameterError("--ledger", url, "sqlite:///FILE (three slashes, then the "
                                     "file's path: sqlite:////abs/ledger.db is absolute)")
            if not path or path == ":memory:" or path.startswith("file:"):
                raise ParameterError("--ledger", url, "a SQLite file (sqlite:///FILE): the "
                                     "ledger must outlive the run")
            backend = _SQLite(os.path.expanduser(path), url, timeout)
        else:
            raise ParameterError("--ledger", redact(url), "sqlite:///FILE, a file path or "
                                 "postgresql://USER@HOST:PORT/DATABASE")
        led = cls(backend, url)
        try:
            led._ensure_schema()
        except BaseException:
            backend.close()
            raise
        return led

    def _ensure_schema(self) -> None:
        db = self._db
        try:
            present = db.has_schema()
        except db.errors() as exc:
            raise db.unavailable(exc) from None
        if not present:
            with db.transaction(write=True) as tx:
                if isinstance(db, _Postgres):
                    tx.execute(f"SELECT pg_advisory_xact_lock({_ADVISORY_KEY})")
                for stmt in _SCHEMA:
                    tx.execute(stmt)
                tx.execute("INSERT INTO ldp_beam_meta (key, value) VALUES (?, ?) "
                           "ON CONFLICT (key) DO NOTHING", ("schema_version", str(SCHEMA_VERSION)))
                tx.execute("INSERT INTO ldp_beam_meta (key, value) VALUES (?, ?) "
                           "ON CONFLICT (key) DO NOTHING", ("unit_salt", os.urandom(16).hex()))
                tx.execute("INSERT INTO ldp_beam_meta (key, value) VALUES (?, ?) "
                           "ON CONFLICT (key) DO NOTHING", ("created", _now()))
        with db.transaction(write=False) as tx:
            row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = ?", ("schema_version",))
        version = int(row[0]) if row else 0
        if version != SCHEMA_VERSION:
            raise LedgerError(f"--ledger {self.url}: the ledger's schema version is {version}, "
                              f"this ldp-beam reads version {SCHEMA_VERSION}"
                              + ("; upgrade ldp-beam" if version > SCHEMA_VERSION else ""))

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

    def _dataset_row(self, tx: _Tx, ds: Mapping[str, Any]) -> None:
        tx.execute("INSERT INTO ldp_beam_datasets (fingerprint, uri, first_seen) VALUES (?, ?, ?) "
                   "ON CONFLICT (fingerprint) DO NOTHING", (ds["fingerprint"], ds["uri"], _now()))

    def _locked(self, ds: Mapping[str, Any]) -> contextlib.AbstractContextManager:
        """A write transaction holding ``ds``'s row (created if new)."""
        @contextlib.contextmanager
        def cm():
            with self._tx(write=True) as tx:
                self._dataset_row(tx, ds)
                if tx.pg:  # the dataset's row serialises reservations and admissions on it
                    tx.execute("SELECT fingerprint FROM ldp_beam_datasets WHERE fingerprint = ? "
                               "FOR UPDATE", (ds["fingerprint"],))
                yield tx
        return cm()

    # ------------------------------------------------------------------ budget
    def reserve(self, run_id: str, dataset: Mapping[str, Any], *, command: str, mechanism: str,
                epsilon: float, delta: float = 0.0, params: Mapping[str, Any] | None = None,
                unit: str | None = None, kind: str | None = None,
                accounting: Any = None, budget: float | None = None,
                budget_delta: float | None = None, request: Mapping[str, Any] | None = None,
                seeded: bool = False, republished_from: str | None = None,
                note: str = "") -> Reservation:
        """Record that run ``run_id`` is about to spend ``epsilon`` (and ``delta``) on
        ``dataset`` (from :func:`dataset_identity`), after checking the budget, in one
        transaction. Call it before any noise is drawn.

        ``budget``/``budget_delta``: the dataset's total (the CLI's ``--budget``/
        ``--budget-delta``). Given, it is recorded as the dataset's budget (with this entry);
        omitted, the budget recorded for the dataset applies (none: no limit, still recorded).
        Raises :class:`BudgetExceeded` (naming the parameter, the budget, what was spent and by
        which runs, and what this run asks) if the composed spending with this run would exceed
        it; :class:`LedgerUnavailable` if the ledger cannot be reached or locked in time.
        ``request`` (from :func:`release_request`) marks a central release that
        :meth:`find_release` can find again; ``republished_from`` a 0-epsilon re-publication."""
        if not isinstance(run_id, str) or not run_id:
            raise ParameterError("run_id", run_id, "a non-empty string (RunKey.run_id)")
        for name, v in (("dataset.fingerprint", dataset.get("fingerprint")),
                        ("dataset.uri", dataset.get("uri"))):
            if not isinstance(v, str) or not v:
                raise ParameterError(name, v, "a non-empty string (from dataset_identity)")
        epsilon, delta = _check_eps_delta(epsilon, delta)
        if budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, (int, float)) \
                    or not math.isfinite(budget) or budget < 0:
                raise ParameterError("--budget", budget, "a finite epsilon >= 0")
            budget = float(budget)
        if budget_delta is not None:
            if isinstance(budget_delta, bool) or not isinstance(budget_delta, (int, float)) \
                    or not 0 <= budget_delta < 1:
                raise ParameterError("--budget-delta", budget_delta, "a number in [0, 1)")
            budget_delta = float(budget_delta)
            if budget is None:
                raise ParameterError("--budget-delta", budget_delta, "given with --budget EPS")
        comps = check_accounting(accounting)
        unit = unit or "record"
        entry = {"run_id": run_id, "status": "pending", "started": _now(), "finished": None,
                 "command": command, "fingerprint": dataset["fingerprint"],
                 "uri": dataset["uri"], "unit": unit, "mechanism": mechanism, "kind": kind,
                 "params": _dumps(dict(params or {})), "epsilon": epsilon, "delta": delta,
                 "accounting": _dumps(comps), "budget_epsilon": None, "budget_delta": None,
                 "request_key": None if request is None else request_key(
                     dataset["fingerprint"], request),
                 "release": None, "outputs": None, "republished_from": republished_from,
                 "seeded": int(bool(seeded)), "host": socket.gethostname(), "pid": os.getpid(),
                 "os_user": _user(), "note": note or None}
        with self._locked(dataset) as tx:
            if tx.one("SELECT 1 FROM ldp_beam_entries WHERE run_id = ?", (run_id,)):
                raise LedgerError(f"run {run_id} is already in the ledger {self.url}: a run id "
                                  "is recorded once (RunKey.new() makes a fresh one)")
            rec = tx.one("SELECT budget_epsilon, budget_delta FROM ldp_beam_datasets WHERE "
                         "fingerprint = ?", (dataset["fingerprint"],))
            if budget is not None:
                b_eps, b_delta = budget, budget_delta
            else:
                b_eps, b_delta = rec if rec else (None, None)
            rows = self._live(tx, dataset["fingerprint"])
            before = compose(rows, b_delta if b_delta is not None else None)
            if b_eps is not None and (epsilon > 0 or delta > 0):
                self._check_budget(dataset, rows, before, entry, b_eps, b_delta,
                                   given=budget is not None)
            if budget is not None and (rec is None or (rec[0], rec[1]) != (budget, budget_delta)):
                tx.execute("UPDATE ldp_beam_datasets SET budget_epsilon = ?, budget_delta = ?, "
                           "budget_set = ? WHERE fingerprint = ?",
                           (budget, budget_delta, entry["started"], dataset["fingerprint"]))
            entry["budget_epsilon"], entry["budget_delta"] = b_eps, b_delta
            tx.execute(f"INSERT INTO ldp_beam_entries ({', '.join(_ENTRY_COLUMNS)}) VALUES "
                       f"({', '.join('?' * len(_ENTRY_COLUMNS))})",
                       [entry[c] for c in _ENTRY_COLUMNS])
        return Reservation(self, run_id, entry, before, (b_eps, b_delta))

    def _live(self, tx: _Tx, fingerprint: str) -> list[dict]:
        cols = ("run_id", "command", "mechanism", "epsilon", "delta", "accounting", "status",
                "started", "unit", "seeded")
        rows = tx.all(f"SELECT {', '.join(cols)} FROM ldp_beam_entries WHERE fingerprint = ? "
                      "AND status IN ('pending', 'committed') ORDER BY started, run_id",
                      (fingerprint,))
        return [dict(zip(cols, r)) for r in rows]

    def _check_budget(self, ds, rows, before: Spent, entry: dict, b_eps: float,
                      b_delta: float | None, given: bool) -> None:
        eps, delta = entry["epsilon"], entry["delta"]
        src = "--budget" if given else "--budget (recorded for this dataset)"
        where = f"dataset {ds['uri']} (fingerprint {ds['fingerprint'][:19]})"
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
            "drawn; raise --budget only if the dataset's owner agrees",
            before, (eps, delta))

    def spent(self, fingerprint: str, unit: str | None = None, delta: float | None = None
              ) -> Spent:
        """What dataset ``fingerprint`` (or one privacy ``unit`` of it) has spent: committed and
        pending entries, composed (at ``delta``, default the dataset's budget delta)."""
        with self._tx(write=False) as tx:
            rows = self._live(tx, fingerprint)
            rec = tx.one("SELECT budget_delta FROM ldp_beam_datasets WHERE fingerprint = ?",
                         (fingerprint,))
        if unit is not None:
            rows = [r for r in rows if r["unit"] == unit]
        return compose(rows, delta if delta is not None else (rec[0] if rec else None))

    def budget(self, fingerprint: str) -> tuple[float | None, float | None]:
        """The budget recorded for a dataset: (epsilon, delta), (None, None) if none."""
        with self._tx(write=False) as tx:
            rec = tx.one("SELECT budget_epsilon, budget_delta FROM ldp_beam_datasets WHERE "
                         "fingerprint = ?", (fingerprint,))
        return (rec[0], rec[1]) if rec else (None, None)

    # ------------------------------------------------------------------ outcome
    def commit(self, run_id: str, outputs: Mapping[str, Any] | None = None,
               release: Mapping[str, Any] | None = None) -> None:
        """Mark ``run_id``'s reservation committed with its ``outputs`` (role -> path, bytes,
        sha256) and, for a central release, the ``release`` as published. Call it before the
        outputs are moved into place: if it raises, publish nothing."""
        with self._tx(write=True) as tx:
            row = tx.one("SELECT status FROM ldp_beam_entries WHERE run_id = ?", (run_id,))
            if row is None:
                raise LedgerError(f"run {run_id} has no reservation in {self.url}: reserve "
                                  "before the run draws any noise")
            if row[0] != "pending":
                raise LedgerError(f"run {run_id} is {row[0]} in {self.url}, not pending: it "
                                  "must not publish (an operator resolved it, or it ran twice)")
            tx.execute("UPDATE ldp_beam_entries SET status = 'committed', finished = ?, "
                       "outputs = ?, release = ? WHERE run_id = ? AND status = 'pending'",
                       (_now(), _dumps(outputs), _dumps(release, sort_keys=False), run_id))

    def abort(self, run_id: str, reason: str = "") -> bool:
        """Give back a pending reservation of a run that published nothing. Returns False if it
        was already aborted; raises :class:`LedgerError` for a committed run (spent for good)."""
        with self._tx(write=True) as tx:
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

    def resolve(self, run_id: str, status: str, note: str = "") -> None:
        """An operator's decision on a pending run whose process is gone: ``committed`` (it may
        have published: stays spent) or ``aborted`` (it certainly published nothing)."""
        if status not in ("committed", "aborted"):
            raise ParameterError("--as", status, "committed or aborted")
        with self._tx(write=True) as tx:
            row = tx.one("SELECT status FROM ldp_beam_entries WHERE run_id = ?", (run_id,))
            if row is None:
                raise ParameterError("--resolve", run_id, "the run id of a pending entry",
                                     hint=f"no such run in {self.url}")
            if row[0] != "pending":
                raise ParameterError("--resolve", run_id, "the run id of a pending entry",
                                     hint=f"it is {row[0]}")
            tx.execute("UPDATE ldp_beam_entries SET status = ?, finished = ?, note = ? WHERE "
                       "run_id = ? AND status = 'pending'",
                       (status, _now(), f"resolved as {status} by {_user()}"
                        + (f": {note}" if note else ""), run_id))

    def find_release(self, fingerprint: str, request: Mapping[str, Any]) -> dict | None:
        """The committed release of an identical request (same data fingerprint and the same
        :func:`release_request`), most recent first: ``{"run_id", "release", "outputs",
        "finished"}``; None if there is none. A re-run publishes it again instead of drawing new
        noise (recorded with epsilon 0 and ``republished_from``)."""
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
    def entries(self, dataset: str | None = None, status: str | None = None) -> list[dict]:
        """Every entry, oldest first (``dataset``: a fingerprint, its prefix, or a URI)."""
        sql = f"SELECT {', '.join(_ENTRY_COLUMNS)} FROM ldp_beam_entries"
        args: list[Any] = []
        where = []
        if dataset:
            prefix = dataset.replace("%", "").replace("_", "")
            where.append("(fingerprint = ? OR uri = ? OR fingerprint LIKE ? OR fingerprint LIKE ?)")
            args += [dataset, _as_uri(dataset), prefix + "%", "sha256:" + prefix + "%"]
        if status:
            if status not in STATUSES:
                raise ParameterError("--status", status, " or ".join(STATUSES))
            where.append("status = ?")
            args.append(status)
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._tx(write=False) as tx:
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
        """Totals per dataset, with its budget and what remains, per privacy unit and per day
        (UTC); each total composed as :meth:`spent` does."""
        entries = self.entries(dataset)
        with self._tx(write=False) as tx:
            budgets = {r[0]: r[1:] for r in tx.all(
                "SELECT fingerprint, uri, budget_epsilon, budget_delta FROM ldp_beam_datasets")}
        by_fp: dict[str, list[dict]] = {}
        for e in entries:
            by_fp.setdefault(e["fingerprint"], []).append(e)
        out = []
        for fp, es in by_fp.items():
            uri, b_eps, b_delta = budgets.get(fp, (es[0]["uri"], None, None))
            live = [e for e in es if e["status"] != "aborted"]
            total = compose(live, b_delta)
            units, days = {}, {}
            for key, group in (("unit", units), ("day", days)):
                sel: dict[str, list] = {}
                for e in live:
                    sel.setdefault(e["unit"] if key == "unit" else e["started"][:10], []).append(e)
                for k, v in sorted(sel.items()):
                    group[k] = compose(v, b_delta).to_dict()
            out.append({"fingerprint": fp, "uri": uri,
                        "uris": sorted({e["uri"] for e in es}),
                        "budget": None if b_eps is None else {"epsilon": b_eps,
                                                               "delta": b_delta},
                        "spent": total.to_dict(),
                        "remaining": None if b_eps is None or math.isinf(total.epsilon)
                        else max(0.0, b_eps - total.epsilon),
                        "aborted": sum(1 for e in es if e["status"] == "aborted"),
                        "units": units, "days": days})
        return out

    # ------------------------------------------------------------------ per-unit (streams)
    def unit_hash(self, value: Any) -> str:
        """A unit value as the ledger stores it: a keyed BLAKE2b hash (the key is a random salt
        kept in the ledger), never the value itself."""
        if self._salt is None:
            with self._tx(write=False) as tx:
                row = tx.one("SELECT value FROM ldp_beam_meta WHERE key = 'unit_salt'")
            self._salt = bytes.fromhex(row[0])
        return hashlib.blake2b(str(value).encode(), key=self._salt, digest_size=16).hexdigest()

    def admit_units(self, dataset: Mapping[str, Any], window: str, units: Iterable[str],
                    epsilon: float, cap: float, run_id: str) -> UnitAdmission:
        """For one window of a stream: record that each unit (a :meth:`unit_hash`) spends
        ``epsilon`` in ``window``, unless its cumulative spending would pass ``cap`` (then it is
        refused and nothing is recorded for it). A unit already recorded for this window is
        admitted again without spending twice (a re-fired or re-run window). Pure-epsilon sums
        (per-unit stream reports are epsilon-LDP); one batched transaction per call."""
        epsilon, _ = _check_eps_delta(epsilon, 0.0)
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 0:
            raise ParameterError("unit cap", cap, "an epsilon >= 0")
        units = sorted(set(units))
        window = str(window)
        admitted, refused, new = [], {}, []
        with self._locked(dataset) as tx:
            spent, already = {}, set()
            among, arg = tx.among(units)
            for u, total, here in tx.all(
                    "SELECT unit_hash, SUM(epsilon), MAX(CASE WHEN window_id = ? THEN 1 ELSE 0 "
                    "END) FROM ldp_beam_unit_spend WHERE fingerprint = ? AND unit_hash IN "
                    f"{among} GROUP BY unit_hash", (window, dataset["fingerprint"], arg)):
                spent[u] = float(total)
                if here:
                    already.add(u)
            for u in units:
                if u in already:
                    admitted.append(u)
                elif spent.get(u, 0.0) + epsilon <= cap * (1 + BUDGET_TOLERANCE) + 1e-12:
                    admitted.append(u)
                    new.append(u)
                else:
                    refused[u] = spent.get(u, 0.0)
            now = _now()
            tx.executemany("INSERT INTO ldp_beam_unit_spend (fingerprint, unit_hash, window_id, "
                           "epsilon, run_id, recorded) VALUES (?, ?, ?, ?, ?, ?)",
                           [(dataset["fingerprint"], u, window, epsilon, run_id, now)
                            for u in new])
        return UnitAdmission(admitted, refused)

    def unit_spent(self, fingerprint: str, units: Iterable[str] | None = None) -> dict[str, float]:
        """Cumulative epsilon per unit hash of a stream (all its units if ``units`` is None)."""
        with self._tx(write=False) as tx:
            return self._unit_spent(tx, fingerprint, None if units is None else sorted(set(units)))

    def _unit_spent(self, tx: _Tx, fingerprint: str, units: list[str] | None) -> dict[str, float]:
        base = ("SELECT unit_hash, SUM(epsilon) FROM ldp_beam_unit_spend WHERE fingerprint = ?")
        if units is None:
            return {u: float(s) for u, s in tx.all(base + " GROUP BY unit_hash", (fingerprint,))}
        among, arg = tx.among(units)
        return {u: float(t) for u, t in tx.all(base + f" AND unit_hash IN {among} GROUP BY "
                                                "unit_hash", (fingerprint, arg))}


def _as_uri(x: str) -> str:
    return x if "://" in x else os.path.abspath(x)


def _check_eps_delta(epsilon: Any, delta: Any) -> tuple[float, float]:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
        raise ParameterError("epsilon", epsilon, "a number >= 0 (math.inf for a run without a "
                             "finite guarantee)")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta <= 1:
        raise ParameterError("delta", delta, "a number in [0, 1]")
    return float(epsilon), float(delta)


def open_ledger(url: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Ledger:
    """``Ledger.open(url)``: the ledger named by ``--ledger`` (default: :func:`default_url`)."""
    return Ledger.open(url, timeout=timeout)


__all__ = ["BudgetExceeded", "Ledger", "LedgerError", "LedgerUnavailable", "Reservation",
           "Spent", "UnitAdmission", "compose", "dataset_identity", "default_url",
           "open_ledger", "redact", "release_request", "request_key", "stream_identity",
           "check_accounting", "SCHEMA_VERSION"]
