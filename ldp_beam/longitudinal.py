"""Longitudinal telemetry: memoized randomization on the device, per-unit loss on the collector.

A device that reports the same value every window and randomizes it afresh each time spends
epsilon every window: after t windows an observer averages t independent reports and the value
is plain. Two remedies, both from RAPPOR (Erlingsson, Pihur and Korolova 2014):

**Memoization** (:class:`Memoized`, any registered LDP mechanism). The draws of a report are a
keyed pseudo-random function of ``(device secret, unit, value)``: ``RandomSource(key)`` with the
stream id a keyed BLAKE2b digest of the unit's and the value's canonical text (and of the
mechanism with its parameters), offset 0. The same (unit, value) therefore always yields the same
report — RAPPOR's *permanent randomized response* — and what it protects is exactly this:

* a unit's loss over its whole lifetime is at most ``epsilon x (number of distinct values it
  ever reported)`` (:func:`unit_loss`): every distinct value is one epsilon-LDP report, and
  every repeat is a copy of it, which tells an observer nothing new, so **repeats cost
  nothing**;
* **the leak it introduces**: reports are now a function of the value, so a change of report
  reveals a change of value (with certainty), and an unchanged report suggests an unchanged
  value (two different values may still give the same report); a collector sees *when* a unit's
  value changes, not what it changed to;
* on a small domain an observer can also link reports: units (or windows) with the same report
  are more likely to hold the same value, and a value a unit returns to re-sends its old report,
  so the reports of the same value of a unit are linkable across time. The device secret is what
  keeps the reports unpredictable: whoever holds it can recompute every report (it must never
  leave the device), and a different secret per device makes units independent;
* the draws also depend on the mechanism and its parameters, so the same value memoized under
  two mechanisms is two independent reports (two epsilons), not one report seen twice.

**Two layers, for GRR** (:class:`TwoLayerGRR`, L-GRR of Arcolezi, Couchot, Al Bouna and Xiao,
"Improving the utility of locally differentially private protocols for longitudinal and
multidimensional frequency estimates", Digital Communications and Networks 2022). The memoized
permanent report is a GRR with ``eps_perm`` of the value; every report sends a fresh GRR of that
permanent report (the *instantaneous* layer), calibrated so that one report alone is
``eps_1``-LDP (``eps_1 < eps_perm``). Guarantee: ``eps_perm`` for the whole lifetime of each
distinct value (all reports are post-processing of the permanent one), ``eps_1`` against an
observer of a single report; a change of report no longer reveals a change of value. The two
layers compose to a GRR with ``eps_1`` exactly (tested), so reports of one window are estimated by
the GRR estimator of ``GRR(eps_1)``.

**On the collector** (:class:`UnitState`, used by ``ldp-beam stream --privacy-unit``): reports
are bounded per unit and window, and each unit's cumulative loss is tracked across windows in a
SQLite file and capped. The accounting rules (:meth:`UnitState.admit`):

* per window, at most ``k`` reports of a unit are estimated, chosen by the smallest keyed
  priorities (uniform among the unit's reports when they are all present at once; the batch's
  bounding algorithm, :func:`ldp_beam.bounding.bound_candidates`); the rest are counted as
  ``bounded_out`` and never estimated;
* an estimated report costs its epsilon; a report flagged memoized (a ``memo`` id naming the
  device's (unit, value) slot, :meth:`Memoized.memo_ids`) costs 0 when the same memo id of the
  same unit was already charged *with the same report*: memoization makes the repeat a copy. A
  memo id that comes back with a different report cannot be a copy and is charged again (and
  counted as ``memo_mismatch``). This is an honest upper bound when the producer memoizes
  (:class:`Memoized`) and names each distinct (unit, value) by its own memo id; it is only as
  honest as that flag: a producer that reuses a memo id for a *different* value whose report
  happens to be the same, or that flags fresh randomizations as memoized, is under-counted, and
  the collector cannot tell;
* a report that would take its unit's cumulative loss past the cap ``B`` is counted as
  ``over_budget`` and dropped, never estimated (its unit's other reports are still considered:
  a memoized repeat costs nothing and may still fit);
* a report recorded for a window stays recorded: a re-executed or re-read window re-selects the
  same reports without charging them again, and a window's reports from an earlier run count
  against its ``k``. Unit values are stored only as keyed hashes (the key, 32 bytes of OS
  entropy, lives in the same file: the file is the trusted side's and is never published).

Nothing here imports Apache Beam.
"""
from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .core import CentralRelease, Mechanism, Reports
from .errors import InvalidRecordsError, ParameterError
from .estimators import estimator_for
from .mechanisms.categorical import GRR, urr_probabilities
from .prf import derive_key, keyed_digest
from .privacy import LDP, PrivacyGuarantee
from .rng import RandomSource, RngLike, as_source, draw_uniforms

#: what a memoized report's guarantee says about repeats and the leak (see the module docstring)
MEMO_NOTE = (
    "Memoized (RAPPOR's permanent randomized response): the same (unit, value) always sends the "
    "same report, keyed by the device's secret, so a unit's lifetime loss is at most epsilon x "
    "the number of distinct values it reported and a repeat costs nothing. Leak: a change of "
    "report reveals a change of value, an unchanged report suggests an unchanged value, and on "
    "a small domain reports of the same value can be linked.")

# --------------------------------------------------------------------------- canonical text
def unit_text(value: Any) -> str:
    """The canonical text of a privacy-unit id: a string as it is, an integer (or an integral
    float: ``7.0`` is the unit ``7``) in decimal. Anything else (None, a boolean, a fractional
    number, a list) raises ValueError: an id must name one unit unambiguously."""
    if isinstance(value, (bool, np.bool_)) or value is None:
        raise ValueError(f"privacy unit {value!r}: expected a string or an integer id")
    if isinstance(value, str):
        if not value.strip():  # "" or only whitespace names nobody (as in batch bounding)
            raise ValueError("privacy unit is empty or only whitespace: expected a non-empty "
                             "string or an integer id")
        return value
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and \
            float(value).is_integer():
        return str(int(value))
    raise ValueError(f"privacy unit {value!r}: expected a string or an integer id, not a "
                     f"{type(value).__name__}")


def value_texts(mechanism: Mechanism, cols: Mapping[str, np.ndarray]) -> list[str]:
    """The canonical text of each row of checked input columns (``mechanism.check``): a
    category as its declared label, a number as the shortest text of its double (``-0.0`` is
    ``0.0``), roles joined in the mechanism's order."""
    parts = []
    for r in mechanism.roles:
        if r.name not in cols:
            continue
        c = np.asarray(cols[r.name])
        if r.kind == "category":
            labels = mechanism.labels(r.name)
            texts = [labels[int(i)] for i in c]
        else:
            texts = [repr(float(x) + 0.0) for x in c]
        parts.append([f"{r.name}={t}" for t in texts])
    return ["\x1e".join(row) for row in zip(*parts)] if parts else []


def canonical_rows(mechanism: Mechanism, values: Any, units: Any
                   ) -> tuple[dict, list[str], list[str]]:
    """``(checked columns, unit texts, value texts)`` of a batch of values sent by ``units``
    (one id per row). Raises InvalidRecordsError for invalid values, ParameterError for a
    wrong number of ids."""
    cols, reasons = mechanism.check(values)
    if reasons.bad.any():
        raise InvalidRecordsError(reasons.as_dict(), reasons.n)
    n = reasons.n
    units = None if isinstance(units, (str, bytes)) else list(units)
    if units is None or len(units) != n:
        raise ParameterError("units", "a string" if units is None else f"{len(units)} ids",
                             f"one privacy-unit id per value ({n})")
    return cols, [unit_text(u) for u in units], value_texts(mechanism, cols)


def _digest(key: bytes, *parts: str, size: int = 16) -> bytes:
    """A keyed BLAKE2b digest of length-prefixed parts (so no two part lists collide)."""
    data = b"".join(len(b).to_bytes(8, "big") + b for b in (p.encode("utf-8") for p in parts))
    return keyed_digest(key, data, size)


def unit_loss(units: Sequence[Any], values: Sequence[Any], epsilon: float) -> dict[str, float]:
    """Lifetime loss of memoized reporting per unit: ``epsilon x`` the number of distinct values
    the unit reported (repeats cost nothing). ``units`` and ``values`` are parallel sequences of
    what each report was made from (values compared by their text, units by :func:`unit_text`).
    """
    if len(units) != len(values):
        raise ParameterError("values", f"{len(values)} values", f"one per unit ({len(units)})")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not epsilon >= 0:
        raise ParameterError("epsilon", epsilon, "a number >= 0")
    distinct: dict[str, set] = {}
    for u, v in zip(units, values):
        distinct.setdefault(unit_text(u), set()).add(str(v))
    return {u: float(epsilon) * len(vs) for u, vs in distinct.items()}


# --------------------------------------------------------------------------- memoization
class Memoized:
    """Memoized randomization of any LDP ``mechanism`` on a device holding ``device_secret``
    (at least 16 bytes of secret entropy, e.g. ``os.urandom(32)``, stored on the device and
    never sent): :meth:`perturb` sends, for every (unit, value), the same report forever (see
    the module docstring for what that protects and what it leaks).

    Cost: one keyed AES stream per *distinct* (unit, value) of a call (about 20,000 a second
    here); rows repeating a (unit, value) share it."""

    def __init__(self, mechanism: Mechanism, device_secret: bytes) -> None:
        if not isinstance(mechanism, Mechanism):
            raise ParameterError("mechanism", mechanism, "a registered LDP mechanism instance")
        if isinstance(mechanism, CentralRelease):
            raise ParameterError("mechanism", mechanism.name, "an LDP mechanism (a central-DP "
                                 "release has no per-report randomization to memoize)")
        if mechanism.draws < 1:
            raise ParameterError("mechanism", mechanism.name, "a mechanism that draws noise")
        if not isinstance(device_secret, (bytes, bytearray)) or len(device_secret) < 16:
            raise ParameterError("device_secret", "<secret>" if isinstance(
                device_secret, (bytes, bytearray)) else type(device_secret).__name__,
                "at least 16 bytes of secret entropy (os.urandom(32)), kept on the device")
        self.mechanism = mechanism
        secret = bytes(device_secret)
        self._noise_key = derive_key(secret, "memoize", "noise")
        self._slot_key = derive_key(secret, "memoize", "slot")
        self._memo_key = derive_key(secret, "memoize", "memo-id")
        self._source = RandomSource(key=self._noise_key)
        self._config = mechanism.describe()

    def __repr__(self) -> str:  # never the secret
        return f"Memoized({self.mechanism.describe()})"

    @property
    def guarantee(self) -> PrivacyGuarantee:
        """One report's guarantee, with what memoization adds (``params['memoized']``)."""
        g = self.mechanism.guarantee
        return PrivacyGuarantee(g.kind, g.epsilon, g.delta,
                                notes=(g.notes + " " if g.notes else "") + MEMO_NOTE,
                                claim=g.claim, params={**g.params, "memoized": True})

    def perturb(self, values: Any, units: Any) -> Reports:
        """The memoized reports of ``values`` (a column, or a mapping role -> column, as the
        mechanism's ``perturb`` takes) sent by ``units`` (one id per row): row i's draws are
        those of record 0 of stream ``sids[i]`` of ``RandomSource(key)``, a 64-bit keyed
        BLAKE2b digest of (mechanism, unit, value) under a key derived from the device secret.
        Raises :class:`~ldp_beam.errors.InvalidRecordsError` for invalid values."""
        cols, us, vs = canonical_rows(self.mechanism, values, units)
        n = len(us)
        if n == 0:
            return self.mechanism.empty_reports()
        sids = np.array([int.from_bytes(_digest(self._slot_key, self._config, u, v, size=8),
                                        "big") for u, v in zip(us, vs)], dtype=np.uint64)
        uniq, first, inverse = np.unique(sids, return_index=True, return_inverse=True)
        draws = self.mechanism.draws
        u = np.empty((len(uniq), draws), order="F")
        for j, sid in enumerate(uniq.tolist()):
            u[j] = self._source.uniforms(1, draws, stream=int(sid), offset=0)[0]
        reports = self.mechanism.randomize({k: np.asarray(c)[first] for k, c in cols.items()}, u)
        return {k: np.asarray(v)[inverse] for k, v in reports.items()}

    def memo_ids(self, values: Any, units: Any) -> np.ndarray:
        """The opaque memo id of each row's (unit, value) slot, to send beside the report (the
        field a collector names with ``--memo-field``) so that it charges a repeat nothing: a
        keyed digest under its own key, so the id reveals nothing about the value, but the
        same (unit, value) always has the same id — the collector learns exactly when a unit's
        value changes or returns to an earlier one (no more than the memoized reports suggest)."""
        _, us, vs = canonical_rows(self.mechanism, values, units)
        return np.array(["m" + _digest(self._memo_key, self._config, u, v).hex()
                         for u, v in zip(us, vs)], dtype=object)

    def loss(self, values: Any, units: Any) -> dict[str, float]:
        """Each unit's lifetime loss from these reports: epsilon x its distinct values."""
        _, us, vs = canonical_rows(self.mechanism, values, units)
        return unit_loss(us, vs, self.mechanism.guarantee.epsilon)


# --------------------------------------------------------------------------- L-GRR
@dataclass(frozen=True)
class TwoLayerGRR:
    """L-GRR (Arcolezi et al. 2022): a memoized permanent GRR with ``eps_perm``, then per report
    an instantaneous GRR of the permanent report, calibrated so that a single report is
    ``eps_1``-LDP (``0 < eps_1 < eps_perm``). See the module docstring for the guarantee.

    With p1 = e^a / (e^a + k - 1), q1 = 1 / (e^a + k - 1) (a = eps_perm) and the instantaneous
    keep probability p2 (q2 = (1 - p2) / (k - 1)), a report equals the value with probability
    pc = p1 p2 + (1 - p1) q2 = q1 + p2 (p1 - q1), and any other label with (1 - pc) / (k - 1):
    a GRR channel. Setting pc = e^b / (e^b + k - 1) (b = eps_1) gives
    p2 = (pc - q1) / (p1 - q1), in (1/k, 1) exactly when 0 < b < a."""

    eps_perm: float
    eps_1: float
    domain: tuple[str, ...]

    def __post_init__(self) -> None:
        perm = GRR(self.eps_perm, self.domain)  # validates eps_perm and the domain
        object.__setattr__(self, "domain", perm.domain)
        object.__setattr__(self, "eps_perm", float(self.eps_perm))
        if isinstance(self.eps_1, bool) or not isinstance(self.eps_1, (int, float)) or \
                not 0 < self.eps_1 < self.eps_perm:
            raise ParameterError("eps_1", self.eps_1, f"a number in (0, eps_perm = "
                                 f"{self.eps_perm:g}) (eps_1 = eps_perm is memoization alone: "
                                 "Memoized(GRR(eps_perm, domain), secret))")
        object.__setattr__(self, "eps_1", float(self.eps_1))

    @property
    def k(self) -> int:
        return len(self.domain)

    @property
    def permanent(self) -> GRR:
        return GRR(self.eps_perm, self.domain)

    @property
    def irr_keep(self) -> float:
        """p2: the probability that the instantaneous layer keeps the permanent report."""
        p1, q1, _ = urr_probabilities(self.eps_perm, self.k)
        pc, _, _ = urr_probabilities(self.eps_1, self.k)
        return (pc - q1) / (p1 - q1)

    @property
    def eps_irr(self) -> float:
        """The instantaneous layer's own epsilon: ln(p2 / q2)."""
        p2 = self.irr_keep
        return math.log(p2 * (self.k - 1) / (1.0 - p2))

    @property
    def instantaneous(self) -> GRR:
        return GRR(self.eps_irr, self.domain)

    @property
    def channel(self) -> GRR:
        """The composed channel of one report: GRR with ``eps_1`` (its estimator is GRR's)."""
        return GRR(self.eps_1, self.domain)

    def composed_matrix(self) -> np.ndarray:
        """Q_irr @ Q_perm, the transition matrix of one report (equal to ``channel``'s)."""
        return self.instantaneous.transition_matrix() @ self.permanent.transition_matrix()

    @property
    def guarantee(self) -> PrivacyGuarantee:
        return PrivacyGuarantee(
            LDP, self.eps_1,
            notes=(f"L-GRR (Arcolezi et al. 2022): each report is eps_1 = {self.eps_1:g}-LDP "
                   f"against an observer of that report alone; all reports of one distinct "
                   f"value of a unit, however many, cost eps_perm = {self.eps_perm:g} in total "
                   "(they are post-processing of one memoized permanent GRR), so a unit's "
                   "lifetime loss is at most eps_perm x its distinct values. A change of "
                   "report does not reveal a change of value."),
            params={"eps_perm": self.eps_perm, "eps_1": self.eps_1, "eps_irr": self.eps_irr,
                    "memoized": True})

    def client(self, device_secret: bytes) -> "TwoLayerClient":
        return TwoLayerClient(self, device_secret)

    def estimator(self):
        """The estimator of one window's reports (one per unit): GRR(eps_1)'s."""
        return estimator_for(self.channel)

    def loss(self, values: Any, units: Any) -> dict[str, float]:
        """Each unit's lifetime loss: eps_perm x its distinct values."""
        _, us, vs = canonical_rows(self.permanent, values, units)
        return unit_loss(us, vs, self.eps_perm)


class TwoLayerClient:
    """The device side of :class:`TwoLayerGRR`: the permanent layer memoized under the device's
    secret, the instantaneous layer fresh per report (``rng``: OS entropy by default)."""

    def __init__(self, scheme: TwoLayerGRR, device_secret: bytes) -> None:
        self.scheme = scheme
        self.permanent = Memoized(scheme.permanent, device_secret)
        self._irr = scheme.instantaneous

    def __repr__(self) -> str:
        return f"TwoLayerClient({self.scheme!r})"

    def perturb(self, values: Any, units: Any, rng: RngLike = None, *,
                stream: int | None = None, offset: int | None = None) -> Reports:
        memo = self.permanent.perturb(values, units)["v"].astype(np.int64)
        u = draw_uniforms(as_source(rng), len(memo), self._irr.draws, stream=stream,
                          offset=offset)
        return self._irr.randomize({"value": memo}, u)


# --------------------------------------------------------------------------- the collector
class UnitStateError(ValueError):
    """The per-unit state cannot be used as asked (another unit field, another seed...)."""


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # one row per report estimated (or released) in a window: its cost, and for a memoized
    # report its memo slot and the digest of its content
    "CREATE TABLE IF NOT EXISTS reports (unit TEXT NOT NULL, window INTEGER NOT NULL, "
    "slot TEXT NOT NULL, memo TEXT, digest TEXT, epsilon REAL NOT NULL, run TEXT NOT NULL, "
    "recorded REAL NOT NULL, PRIMARY KEY (unit, window, slot))",
    "CREATE INDEX IF NOT EXISTS reports_memo ON reports (unit, memo)",
)
SCHEMA_VERSION = 1
#: the cumulative epsilon of each unit of ``temp.cand`` (:func:`_candidates`)
_SPENT = ("SELECT r.unit, SUM(r.epsilon) FROM reports r JOIN temp.cand c ON r.unit = c.unit "
          "GROUP BY r.unit")
BUDGET_TOLERANCE = 1e-9  # relative: k x eps summed in floating point still fits a cap of k x eps


@dataclass
class Admission:
    """What :meth:`UnitState.admit` decided for one window (or pane): ``selected`` (unit hash
    -> the candidates to estimate, already charged), and the counts: ``reports`` (all of the
    window's valid reports) = ``estimated`` + ``bounded_out`` + ``over_budget``;
    ``memo_repeats`` (estimated at no cost), ``memo_mismatch`` (flagged memoized but charged:
    the memo id came back with another report), ``charged`` (epsilon added this time, summed
    over units), ``units``, ``units_over_budget`` and ``max_unit_loss`` (the largest
    cumulative loss among the window's units, after it)."""

    selected: dict = field(default_factory=dict)
    reports: int = 0
    estimated: int = 0
    bounded_out: int = 0
    over_budget: int = 0
    memo_repeats: int = 0
    memo_mismatch: int = 0
    charged: float = 0.0
    units: int = 0
    units_over_budget: int = 0
    max_unit_loss: float = 0.0

    def counts(self) -> dict:
        return {k: getattr(self, k) for k in (
            "reports", "estimated", "bounded_out", "over_budget", "memo_repeats",
            "memo_mismatch", "units", "units_over_budget")} | {
            "charged": round(self.charged, 12), "max_unit_loss": round(self.max_unit_loss, 12)}

    def rows(self) -> list:
        """The selected candidates' rows, unit by unit in hash order."""
        return [c[4] for u in sorted(self.selected) for c in self.selected[u]]


class UnitState:
    """The durable per-unit state of a stream with a privacy unit: a SQLite file (WAL,
    ``synchronous=FULL``), created with a 32-byte secret of OS entropy (or, seeded, one derived
    from the seed: reproducible and NOT private — whoever knows the seed can invert the unit
    hashes on a guessable id space) from which the unit hashes and the selection priorities
    are keyed. It holds only keyed hashes of unit ids, never an id. ``privacy_unit``: the field
    name, recorded at creation; reopening for another field is an error (hashes would not
    match). Open it where it is used (one connection per thread); it pickles as its path."""

    FILE = "units.sqlite"

    def __init__(self, path: str, privacy_unit: str, *, seed_secret: bytes | None = None,
                 timeout: float = 60.0) -> None:
        if not isinstance(privacy_unit, str) or not privacy_unit:
            raise ParameterError("privacy_unit", privacy_unit, "a record field name")
        self.path = os.path.abspath(path)
        self.privacy_unit = privacy_unit
        self.timeout = float(timeout)
        self._local = threading.local()
        new = not os.path.exists(self.path)
        if new:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)  # the secret lives here
            os.close(fd)
        with self._tx() as cur:
            for stmt in _SCHEMA:
                cur.execute(stmt)
            meta = dict(cur.execute("SELECT key, value FROM meta").fetchall())
            if "secret" not in meta:
                secret = seed_secret if seed_secret is not None else os.urandom(32)
                meta = {"secret": secret.hex(), "privacy_unit": privacy_unit,
                        "schema_version": str(SCHEMA_VERSION), "created": repr(time.time()),
                        "seeded": "1" if seed_secret is not None else "0"}
                cur.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", meta.items())
        if meta["privacy_unit"] != privacy_unit:
            raise UnitStateError(
                f"{self.path} tracks privacy unit {meta['privacy_unit']!r}, not "
                f"{privacy_unit!r}: its unit hashes would not match (use another output "
                "folder for another unit)")
        if int(meta.get("schema_version", "0")) != SCHEMA_VERSION:
            raise UnitStateError(f"{self.path}: schema version {meta.get('schema_version')}, "
                                 f"this ldp-beam reads {SCHEMA_VERSION}")
        self._secret = bytes.fromhex(meta["secret"])
        if seed_secret is not None and self._secret != seed_secret:
            raise UnitStateError(f"{self.path} was created with another key than this seed's "
                                 "(or unseeded): a seeded run needs a fresh output folder")
        self.seeded = meta.get("seeded") == "1"

    def __reduce__(self):
        return _reopen, (self.path, self.privacy_unit, self.timeout)

    def __repr__(self) -> str:
        return f"UnitState({self.path!r}, {self.privacy_unit!r})"

    # -- keys (the trusted side's)
    def key(self, purpose: str) -> bytes:
        """A sub-key of the state's secret for one use ("unit", "source", "select")."""
        return derive_key(self._secret, "units", purpose)

    # -- the connection
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def _tx(self, write: bool = True):
        cur = self._conn().cursor()
        cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield cur
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        else:
            cur.execute("COMMIT")
        finally:
            cur.close()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- reading
    def spent(self, units: Iterable[str] | None = None) -> dict[str, float]:
        """Cumulative epsilon per unit hash (every unit if ``units`` is None)."""
        with self._tx(write=False) as cur:
            if units is None:
                return {u: float(s) for u, s in cur.execute(
                    "SELECT unit, SUM(epsilon) FROM reports GROUP BY unit")}
            _candidates(cur, units)
            return {u: float(s) for u, s in cur.execute(_SPENT)}

    def max_loss(self) -> float:
        """The largest cumulative epsilon of one unit (0 when none is recorded): what the
        stream's deployment has cost a person (:mod:`ldp_beam.pipelines.stream_account`), in one
        SQL pass (10^6 units: 1.1 s here; building :meth:`spent`'s dict took 2.7 s)."""
        with self._tx(write=False) as cur:
            (m,) = cur.execute("SELECT MAX(s) FROM (SELECT SUM(epsilon) AS s FROM reports "
                               "GROUP BY unit)").fetchone()
        return 0.0 if m is None else float(m)

    def recorded(self, window: int | None = None) -> list[tuple]:
        """``(unit, window, slot, memo, epsilon, run)`` of the reports recorded (in
        ``window``, µs, or all), in order."""
        with self._tx(write=False) as cur:
            sql = "SELECT unit, window, slot, memo, epsilon, run FROM reports"
            args: tuple = ()
            if window is not None:
                sql += " WHERE window = ?"
                args = (int(window),)
            return cur.execute(sql + " ORDER BY unit, window, slot", args).fetchall()

    # -- the decision
    def admit(self, window: int, run: str, candidates: Mapping[str, tuple[int, list]],
              k: int, epsilon: float, cap: float | None = None, group: int = 1) -> Admission:
        """Decide, in one transaction, which reports of one window are estimated (see the
        module docstring): ``candidates`` maps a unit hash to ``(n, cands)``, its ``n`` valid
        reports in the window and the ``cands`` (at most ``k`` would do; more are fine) with
        the smallest priorities, ``(priority, slot, memo, digest, row)``; candidates with the
        same slot are one record read twice (the second is bounded out). ``epsilon``: the cost
        of one report; ``cap``: the per-unit cumulative cap (None: none). ``group``: a central
        release calibrated to ``group`` rows per unit charges ``epsilon`` once per ``group``
        rows of a unit in the window (the 1st, the group+1-th... row recorded in it), so j
        rows cost ceil(j / group) x epsilon (group privacy); LDP reports: 1. Idempotent: what
        is already recorded for the window is selected again without a new charge."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ParameterError("max_reports_per_unit", k, "an integer >= 1")
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ParameterError("group", group, "an integer >= 1")
        out = Admission()
        if not candidates:
            return out
        limit = None if cap is None else cap * (1 + BUDGET_TOLERANCE) + 1e-12
        now = time.time()
        with self._tx() as cur:
            _candidates(cur, candidates)
            spent = dict(cur.execute(_SPENT).fetchall())
            in_window: dict[str, set] = {}
            for u, slot in cur.execute(
                    "SELECT r.unit, r.slot FROM reports r JOIN temp.cand c ON r.unit = c.unit "
                    "WHERE r.window = ?", (int(window),)):
                in_window.setdefault(u, set()).add(slot)
            memos: dict[tuple, set] = {}
            if any(c[2] is not None for _, cs in candidates.values() for c in cs):
                for u, memo, digest in cur.execute(
                        "SELECT r.unit, r.memo, r.digest FROM reports r JOIN temp.cand c "
                        "ON r.unit = c.unit WHERE r.memo IS NOT NULL"):
                    memos.setdefault((u, memo), set()).add(digest)
            new_rows = []
            for u in sorted(candidates):
                n, cands = candidates[u]
                seen_slots: set = set()  # by priority, one candidate per slot
                cands = [c for c in sorted(cands, key=lambda c: c[:2])
                         if not (c[1] in seen_slots or seen_slots.add(c[1]))]
                recorded = in_window.get(u, set())
                loss = float(spent.get(u, 0.0))
                chosen = [c for c in cands if c[1] in recorded]
                room = k - len(recorded)
                over = 0
                for c in cands:
                    if c[1] in recorded:
                        continue
                    if room <= 0:
                        break
                    cost = float(epsilon) if (k - room) % group == 0 else 0.0
                    memo, digest = c[2], c[3]
                    if memo is not None:
                        seen = memos.get((u, memo))
                        if seen is not None and digest in seen:
                            cost = 0.0
                        elif seen is not None:
                            out.memo_mismatch += 1
                    if limit is not None and loss + cost > limit:
                        over += 1
                        continue
                    loss += cost
                    room -= 1
                    chosen.append(c)
                    out.charged += cost
                    out.memo_repeats += memo is not None and cost == 0.0
                    if memo is not None:
                        memos.setdefault((u, memo), set()).add(digest)
                    new_rows.append((u, int(window), c[1], memo, digest, cost, run, now))
                out.selected[u] = chosen
                out.reports += int(n)
                out.estimated += len(chosen)
                out.over_budget += over
                out.bounded_out += int(n) - len(chosen) - over
                out.units += 1
                out.units_over_budget += over > 0
                out.max_unit_loss = max(out.max_unit_loss, loss)
            cur.executemany("INSERT INTO reports (unit, window, slot, memo, digest, epsilon, "
                            "run, recorded) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", new_rows)
        return out


def _candidates(cur: sqlite3.Cursor, units: Iterable[str]) -> None:
    cur.execute("CREATE TEMP TABLE IF NOT EXISTS cand (unit TEXT PRIMARY KEY)")
    cur.execute("DELETE FROM temp.cand")
    cur.executemany("INSERT OR IGNORE INTO temp.cand (unit) VALUES (?)", ((u,) for u in units))


def _reopen(path: str, privacy_unit: str, timeout: float) -> UnitState:
    return UnitState(path, privacy_unit, timeout=timeout)


def unit_hash(key: bytes, value: Any) -> str:
    """A unit id as the collector keeps it: ``"u"`` + a keyed BLAKE2b digest of its canonical
    text (:func:`unit_text`; ValueError for an id that is not a string or an integer)."""
    return "u" + _digest(key, unit_text(value)).hex()


class UnitHasher:
    """:func:`unit_hash` under one key, remembering up to ``cache`` ids (a stream sees the same
    units again and again); raises ValueError as :func:`unit_hash` does."""

    def __init__(self, key: bytes, cache: int = 1 << 16) -> None:
        self.key, self.size = key, cache
        self._seen: dict = {}

    def __call__(self, value: Any) -> str:
        try:
            memo = (type(value), value)
            out = self._seen.get(memo)
        except TypeError:  # unhashable: not an id (unit_hash says why)
            return unit_hash(self.key, value)
        if out is None:
            out = unit_hash(self.key, value)
            if len(self._seen) >= self.size:
                self._seen.clear()
            self._seen[memo] = out
        return out

    def __reduce__(self):
        return UnitHasher, (self.key, self.size)


def priority(key: bytes, identity: str) -> tuple[int, str]:
    """A record's keyed selection priority (a 64-bit integer: the k smallest of a unit's
    reports in a window are estimated) and its slot id, both from a keyed digest of its
    identity (file, line and content): deterministic under re-execution and restarts, and
    unpredictable without the key."""
    d = keyed_digest(key, identity.encode("utf-8"))
    return int.from_bytes(d[:8], "big"), d.hex()


__all__ = ["Admission", "MEMO_NOTE", "Memoized", "TwoLayerClient", "TwoLayerGRR", "UnitHasher",
           "UnitState", "UnitStateError", "canonical_rows", "priority", "unit_hash",
           "unit_loss", "unit_text", "value_texts"]
