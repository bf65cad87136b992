"""One home for a DP run: the lifecycle every batch command goes through, written once.

A command (``collect``, ``estimate``, a central release, global or per key) is a configuration
of :class:`Run`: which mechanism or release, which outputs, what its pipeline computes between
the read and the write, and what its manifest says. Everything else happens here, in this order,
and nowhere else::

    Run(...)            the run's key (a fresh secret; a seed says "not private") and its reader
    run.columns(...)    role -> column checks against the input's schema (and the privacy unit)
    run.dataset         the input's ledger identity: its name and content fingerprint
    run.prior_release   an identical central release already committed? publish it again
    with run.spend(...) outputs staged (nothing visible yet) and the ledger entry reserved,
                        budget checked, before any noise is drawn
      run.execute(build)  the pipeline: read (bounded per unit) -> validate/perturb ->
                        accumulate -> release, plus dead letters and the tally; then the counts
                        reconcile (input = accepted + dead-lettered + bounded out) or nothing is
                        committed
      run.commit(...)   ledger prepared -> outputs committed (manifest last) -> ledger committed
                        (:func:`~.lifecycle.publish`); a failure settles the entry as it is

The streaming run (:mod:`.stream`) is a ``Run("stream", SOURCE, ...)`` too, for what applies to
an unbounded run: the key, the ledger, the budget, the dataset's name, its ledger step
(:meth:`Run.stream_account`, :mod:`.stream_account`), the guarantee and the Beam transforms; the
rest of its lifecycle differs by nature and is described there.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Iterator, Mapping

import apache_beam as beam
import pyarrow as pa

from ldp_beam.core import Configured
from ldp_beam.ledger import Ledger, by_content
from ldp_beam.privacy import ledger_cost
from ldp_beam.rng import RunKey
from ldp_beam.transforms import ReadTable
from ldp_beam.transforms.units import BoundContributions

from ldp_beam.transforms.tally import Tally

from .common import check_readable, check_reconciles, reconcile, run_pipeline
from .datasets import dataset_identity
from .lifecycle import ledger_state, publish
from .outputs import RunFailed, RunOutputs, location
from .stream_account import StreamAccount, stream_dataset


class Run:
    """One DP run over one input (see the module docstring for the steps).

    ``command``: what the ledger records (``collect``, ``estimate``, ``release``). ``seed``:
    a reproducible, NOT private run (for tests); ``run_key``: a key made by the caller (the demo
    shares one). ``read``: a reader already built for this input (else one is built with
    ``null_values``). ``ledger``/``budget``/``budget_delta``/``dataset``: where the run is
    accounted, the caps it must respect, and the input's name there (default: its canonical
    location). ``force``: replace existing outputs; ``allow_unreadable``: commit although part
    of the input could not be read (it is counted and dead-lettered either way)."""

    def __init__(self, command: str, input: str, *, seed: Any = None,
                 run_key: RunKey | None = None, beam_args: Iterable[str] = (),
                 null_values: Iterable[str] | None = None, read: ReadTable | None = None,
                 ledger: str | None = None, budget: float | None = None,
                 budget_delta: float | None = None, dataset: str | None = None,
                 force: bool = False, allow_unreadable: bool = False) -> None:
        self.command, self.input = command, input
        self.beam_args = list(beam_args)
        self.key = run_key or RunKey.new(seed)
        self._read, self._null_values = read, null_values
        self.ledger_url, self.budget, self.budget_delta = ledger, budget, budget_delta
        self.dataset_name, self.force, self.allow_unreadable = dataset, force, allow_unreadable
        self._dataset: dict | None = None
        self.outs: RunOutputs | None = None
        self.led: Any = None
        self.entry: Any = None

    @property
    def run_id(self) -> str:
        return self.key.run_id

    @property
    def seeded(self) -> bool:
        return self.key.seeded

    @property
    def release_seed(self) -> int:
        """The integer central releases key their noise with: a seeded run's integer seed as
        the core uses it (reproducible tests), else 256 bits derived from the run's secret."""
        seed = self.key.seed
        if self.seeded and str(seed).lstrip("-").isdigit():
            return int(seed)
        return int.from_bytes(self.key.derive("release"), "big")

    # -- read and role checks ------------------------------------------------------------------
    @property
    def read(self) -> ReadTable:
        """The input's reader, built on first use (a stream reads its source itself)."""
        if self._read is None:
            self._read = ReadTable(self.input, options=self.beam_args,
                                   **read_options(self._null_values))
        return self._read

    @property
    def schema(self) -> pa.Schema:
        return self.read.schema

    def columns(self, mech: Configured, columns: Mapping[str, str] | None = None,
                keep: Iterable[str] = (), unit: str | None = None) -> dict[str, str]:
        """The role -> column mapping checked against the input (default: each required role
        reads the column of its name), and the privacy-unit column if any."""
        cols = resolve_columns(mech, self.schema, columns or {
            r.name: r.name for r in mech.roles if r.required}, keep)
        if unit is not None:
            check_unit_column(unit, self.schema, cols, keep)
        return cols

    # -- the dataset ---------------------------------------------------------------------------
    @property
    def dataset(self) -> dict:
        """The input's identity in the ledger (its name and content fingerprint), computed once."""
        if self._dataset is None:
            self._dataset = dataset_identity(self.input, self.beam_args, name=self.dataset_name)
        return self._dataset

    def prior_release(self, request: Mapping[str, Any]) -> dict | None:
        """The committed release of an identical request on the same data, if the ledger has one
        (a re-run publishes it again and draws no new noise). Never for a database table or
        query: its identity is its name, not its content (:func:`dataset_identity`), so an
        identical request on a table that changed since would publish the old release."""
        if not by_content(self.input):
            return None
        with Ledger.open(self.ledger_url) as led:
            return led.find_release(self.dataset["fingerprint"], request)

    # -- outputs and the ledger ----------------------------------------------------------------
    @contextlib.contextmanager
    def spend(self, outputs: Mapping[str, str], manifest: str, mechanism: Configured, *,
              guarantee: Mapping[str, Any] | None = None, unit: str | None = None,
              request: Mapping[str, Any] | None = None, seeded: bool | None = None,
              republished_from: str | None = None, note: str = "") -> Iterator["Run"]:
        """Stage ``outputs`` (role -> location; ``dead_letter`` among them) and reserve the
        run's ledger entry for ``guarantee``'s cost (None: post-processing, epsilon 0, no budget
        check; ``republished_from``: a prior release published again, epsilon 0). The block
        runs the pipeline and commits; leaving it any other way removes the staging and aborts
        the entry."""
        if guarantee is None or republished_from is not None:
            epsilon, delta, kind = 0.0, 0.0, None if guarantee is None else \
                ledger_cost(guarantee)[2]
            caps: dict[str, Any] = {}
        else:
            epsilon, delta, kind = ledger_cost(guarantee)
            caps = {"budget": self.budget, "budget_delta": self.budget_delta}
        outs = RunOutputs(dict(outputs), manifest, self.run_id, inputs=[self.input],
                          force=self.force, options=self.beam_args)
        with outs, Ledger.open(self.ledger_url) as led, led.reserve(
                self.run_id, self.dataset, command=self.command, mechanism=mechanism.name,
                params=mechanism.params(), epsilon=epsilon, delta=delta, kind=kind, unit=unit,
                request=request, seeded=self.seeded if seeded is None else seeded,
                republished_from=republished_from, note=note, **caps) as entry:
            self.outs, self.led, self.entry = outs, led, entry
            try:
                yield self
            finally:
                self.outs, self.led, self.entry = None, None, None

    def staged(self, role: str) -> str:
        return self.outs.staged(role)

    @property
    def dead_letter(self) -> str:
        """Where the pipeline writes the run's dead letters (staged)."""
        return self.outs.staged("dead_letter")

    @property
    def results(self) -> str:
        """Where the pipeline writes its result lines (scratch, read back by :meth:`execute`)."""
        return self.outs.scratch("results.jsonl")

    @property
    def tally_path(self) -> str:
        return self.outs.scratch("tally.jsonl")

    def stream_account(self, out_dir: str, mechanism: Configured, guarantee: Mapping[str, Any],
                       unit: Any) -> StreamAccount:
        """A stream's ledger step (its cost is known only as units are charged; see
        :mod:`.stream_account`), on this run's ledger, budget and dataset name, with the stream
        deployment in ``out_dir`` as its identity. ``open()`` it before anything is read."""
        return StreamAccount(self.ledger_url, stream_dataset(self.input, out_dir,
                                                             self.dataset_name),
                             out_dir, self.run_id, mechanism=mechanism, guarantee=guarantee,
                             unit=unit, seeded=self.seeded, budget=self.budget,
                             budget_delta=self.budget_delta)

    # -- the pipeline --------------------------------------------------------------------------
    def read_rows(self, p: Any, unit: str | None, l0: int = 1, linf: int = 1,
                  partition_fn: Any = None) -> tuple[Any, Any, Any, Any]:
        """Read the input; with a privacy unit, keep at most ``l0`` partitions x ``linf`` rows
        per unit. See :func:`read_bounded`."""
        return read_bounded(p, self.read, unit, self.key, l0, linf, partition_fn)

    def bookkeeping(self, written: Any, rd: Any, accepted: Any, invalid: Any, dropped: Any,
                    unit_dead: Any = None) -> list:
        """The pipeline's dead letters (the reader's and the rows rejected) and its tally, the
        run's last step: written once ``written`` (the main output's write, one element) is
        complete, so it is the pipeline's one terminal."""
        invalid = invalid_rows(invalid, unit_dead)
        return [tally_inputs(written, rd, accepted, invalid, dropped)
                | "Tally" >> Tally(self.tally_path, dead_letter=self.dead_letter)]

    def execute(self, build: Callable[[Any], list],
                reported: Callable[[], int] | None = None) -> tuple[list, dict]:
        """Run the pipeline ``build(p)`` builds; its result lines and reconciled counts, or
        :class:`RunFailed` (nothing is committed). ``reported``: the number of rows written to a
        table output, when the reconciliation counts it there (collect)."""
        run_pipeline(build, self.beam_args)
        outs = self.outs
        rows = outs.read_json_lines(self.results) if outs.exists(self.results) else []
        tally = reconcile(read_tally(outs, self.tally_path), outs.count_lines(self.dead_letter),
                          None if reported is None else reported())
        check_reconciles(tally)
        check_readable(tally, self.dead_letter, self.allow_unreadable, opener=outs.open_text)
        return rows, tally

    # -- the end -------------------------------------------------------------------------------
    def commit(self, manifest: Mapping[str, Any],
               release: Mapping[str, Any] | None = None) -> dict:
        """Settle the ledger and publish the outputs (manifest last); the manifest as written.
        ``release``: what a re-run of the same request may publish again."""
        return publish(self.entry, self.outs, {
            **manifest, "dataset": self.dataset["dataset"], "ledger": self.led.url}, release)

    def ledger_state(self) -> dict:
        """What the output says about the ledger after the run (see :func:`ledger_state`)."""
        if self.led is None:
            with Ledger.open(self.ledger_url) as opened:
                return ledger_state(opened, self.dataset["dataset"], self.ledger_url)
        return ledger_state(self.led, self.dataset["dataset"], self.ledger_url)

    def records(self, tally: Mapping[str, Any]) -> dict:
        """A release's record counts, for the curator's bookkeeping only (never published)."""
        return {"input": tally["input"], "released_from": tally["accepted"],
                "dead_lettered": tally["dead_lettered"], "bounded_out": tally["bounded_out"],
                "unreadable_rows": tally["unreadable_rows"],
                "unreadable_parts": tally["unreadable_parts"],
                "dead_letter": self.outs.location("dead_letter"),
                "reconciles": tally["reconciles"], "counted_from": tally["counted_from"]}


# ------------------------------------------------------------------------- the steps' pieces
def resolve_columns(mech: Configured, schema: pa.Schema, columns: Mapping[str, str],
                    keep: Iterable[str]) -> dict[str, str]:
    """Check the role -> column mapping against the input schema; error with what exists."""
    cols = dict(columns)
    roles = {r.name: r for r in mech.roles}
    for role in cols:
        if role not in roles:
            raise ValueError(f"{mech.name} has no input role {role!r}; roles: {sorted(roles)}")
    for r in mech.roles:
        if r.required and r.name not in cols:
            raise ValueError(f"{mech.name} needs a column for role {r.name!r} "
                             f"(use --column for 'value' or --role {r.name}=COLUMN)")
    for c in list(cols.values()) + list(keep):
        if c not in schema.names:
            raise ValueError(f"input has no column {c!r}; columns: {', '.join(schema.names)}")
    return cols


def check_unit_column(unit: str, schema: pa.Schema, cols: Mapping[str, str],
                      keep: Iterable[str]) -> None:
    """The privacy-unit column exists, is not an input of the mechanism and is never kept."""
    if unit not in schema.names:
        raise ValueError(f"--privacy-unit {unit}: the input has no column {unit!r}; columns: "
                         f"{', '.join(schema.names)}")
    if unit in cols.values():
        raise ValueError(f"--privacy-unit {unit}: the column is an input of the mechanism; the "
                         "privacy unit names a person, it is never perturbed or reported")
    if unit in keep:
        raise ValueError(f"--keep {unit}: the privacy unit identifies a person and can never be "
                         "copied into the reports")


def read_bounded(p: Any, read: Any, unit: str | None, run: RunKey, l0: int, linf: int,
                 partition_fn: Any = None) -> tuple[Any, Any, Any, Any]:
    """Read the input; with a privacy unit, keep at most ``l0`` partitions x ``linf`` rows per
    unit (the input is read twice, so memory stays flat). Returns (reader outputs, rows to use,
    dead letters of rows without a unit, {"bounded_out": n} counts); the last two are None
    without a privacy unit (see :func:`invalid_rows`)."""
    if unit is None:
        rd = p | "ReadTable" >> read
        return rd, rd.batches, None, None
    b = p | "BoundPerUnit" >> BoundContributions(unit, run, l0, linf, partition_fn, source=read)
    return b.read, b.batches, b.dead_letter, b.dropped


def invalid_rows(dead_letter: Any, unit_dead: Any) -> Any:
    """The rows validation dead-lettered, with those that had no privacy unit (if any).

    Without a unit nothing is flattened in: Beam's DirectRunner materializes every multi-input
    Flatten in memory (it never fuses one), so flattening the dead letters with an empty
    PCollection held every one of them (10^6 input rows, half invalid: ~700 MB, not ~280)."""
    if unit_dead is None:
        return dead_letter
    return (dead_letter, unit_dead) | "InvalidRows" >> beam.Flatten()


def tally_inputs(written: Any, rd: Any, accepted: Any, invalid: Any, dropped: Any) -> tuple:
    """What :class:`~ldp_beam.transforms.tally.Tally` takes: the main output's write (it waits
    for it), the reader's batches and dead letters, the accepted rows, the invalid ones and,
    with a privacy unit, the rows its bound left out."""
    parts = (written, rd.batches, rd.dead_letter, accepted, invalid)
    return parts if dropped is None else parts + (dropped,)


def read_tally(outs: RunOutputs, path: str) -> dict:
    """The run's tally (one JSON line the pipeline wrote into the staging folder), read back
    through the staging folder's file system. The pipeline always writes that line (``{}`` for
    an empty input), so a run without it fails: its counts would otherwise read as all zeros
    and "reconcile"."""
    vals = outs.read_json_lines(path) if outs.exists(path) else []
    if len(vals) != 1:
        raise RunFailed(f"the run wrote {len(vals)} tally lines instead of one (the runner lost "
                        "or repeated part of the pipeline's output); its counts cannot be "
                        "checked and nothing was committed")
    return vals[0]


def read_options(null_values: Iterable[str] | None) -> dict:
    """ReadTable keyword arguments for options the user set (``None``: the reader's default)."""
    return {} if null_values is None else {"null_values": tuple(null_values)}


def take_seed(seed: Any, options: dict) -> Any:
    """The run's seed, given once: ``--seed`` or an estimator option ``seed`` (removed from
    ``options``), not both with different values."""
    if "seed" in options:
        given = options.pop("seed")
        if seed is not None and str(seed) != str(given):
            raise ValueError("give the seed once: --seed or --option seed")
        return given
    return seed


__all__ = ["Run", "resolve_columns", "check_unit_column", "read_bounded", "invalid_rows",
           "tally_inputs", "read_tally", "read_options", "take_seed", "location"]
