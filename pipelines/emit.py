"""``ldp-beam emit``: perturb values on this device and publish the reports to Pub/Sub.

The command-line face of :class:`ldp_beam.client.Reporter`: it reads values from a CSV or
Parquet column (streamed a record batch at a time) or from standard input (one value per line,
or CSV with a header when ``--column`` is given with ``--input -``), perturbs them here with the
mechanism (``--mechanism`` and ``-p NAME=VALUE``, or ``--reports-schema`` FILE: the metadata
``collect`` writes), and publishes the reports to ``--topic projects/P/topics/T`` as device
``--device-id``, each with its report id and event time (``--timestamp-column``, else now). Raw
values never leave the process. The device's state (sequence numbers, batches not yet accepted
by the broker, the memoization secret) lives in ``--state`` (default
``$XDG_STATE_HOME/ldp-beam/devices/ID-HASH``, ``~/.local/state`` without it): a second run
continues the sequence and first re-sends what an earlier run could not publish.

Prints how many reports it published. Exit codes: 0 published everything; 1 some values were
invalid (listed on stderr, not sent; the rest were published) or publishing failed (the batch
is kept in the state folder and sent again by the next run); 2 bad options (one line naming
the option). Imports neither Apache Beam nor, before publishing, the Pub/Sub client.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import sys
from typing import Any, Iterator

import numpy as np

from ldp_beam.core import CentralRelease
from ldp_beam.errors import LdpBeamError

from .cli import UsageError, _kv as _cli_kv, check_privacy_strength

CHUNK_ROWS = 65_536  # rows read from the input at a time


class EmitError(ValueError):
    """A bad option or input, in one line naming the option."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``emit`` subcommand to ``subparsers``; returns its parser."""
    e = subparsers.add_parser("emit", help="perturb values on this device and publish the "
                              "reports to a Pub/Sub topic (the telemetry client)")
    e.add_argument("--topic", required=True, help="projects/PROJECT/topics/TOPIC")
    e.add_argument("--device-id", required=True,
                   help="this device's stable id (it enters the report ids; never the values)")
    e.add_argument("--input", "-i", default="-",
                   help="a CSV or Parquet file, or - for standard input (default): one value "
                        "per line, or CSV with a header when --column is given")
    e.add_argument("--column", "-c", action="append",
                   help="input column for the mechanism's required roles, in order (needed "
                        "for a file)")
    e.add_argument("--role", action="append", metavar="ROLE=COLUMN",
                   help="map another role to a column")
    e.add_argument("--timestamp-column", metavar="COLUMN",
                   help="the column with each value's event time (epoch seconds or ISO 8601; "
                        "default: the time of sending)")
    e.add_argument("--mechanism", "-m", help="a registered mechanism name (see `ldp-beam list`)")
    e.add_argument("--param", "-p", action="append", metavar="NAME=VALUE",
                   help="a mechanism parameter, repeatable")
    e.add_argument("--epsilon", type=float, help="shorthand for -p epsilon=VALUE")
    e.add_argument("--reports-schema", metavar="FILE",
                   help="take the mechanism and its parameters from this reports Parquet "
                        "file's metadata (as written by collect)")
    e.add_argument("--allow-no-guarantee", action="store_true",
                   help="run a configuration with no finite privacy guarantee")
    e.add_argument("--state", metavar="DIR",
                   help="the device's state folder (sequence numbers, unsent batches, "
                        "memoization secret); default under $XDG_STATE_HOME or ~/.local/state")
    e.add_argument("--batch-size", type=int, default=1000,
                   help="reports perturbed, stored and published together (default 1000)")
    e.add_argument("--reports-per-message", type=int, default=1,
                   help="reports per Pub/Sub message (default 1: each report's id and event "
                        "time are also message attributes, as Beam's ReadFromPubSub reads)")
    e.add_argument("--memoize", action="store_true",
                   help="memoized randomization (the same value always sends the same report; "
                        "a secret kept in the state folder)")
    e.add_argument("--unit-field", metavar="FIELD",
                   help="also send the device id in this report field, as the privacy unit of "
                        "`stream --privacy-unit FIELD`")
    e.add_argument("--timeout", type=float, default=60.0,
                   help="seconds a batch's publishing may take (default 60)")
    e.add_argument("--quiet", "-q", action="store_true", help="print only the result line")
    return e


# --------------------------------------------------------------------------- options
def _kv(items: list[str] | None, opt: str) -> dict[str, str]:
    """NAME=VALUE options, parsed as every other command parses them."""
    try:
        return _cli_kv(items, opt)
    except UsageError as exc:
        raise EmitError(str(exc)) from None


def default_state(device_id: str) -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    tag = hashlib.sha256(device_id.encode()).hexdigest()[:16]
    return os.path.join(base, "ldp-beam", "devices", tag)


def _mechanism(a: argparse.Namespace) -> Any:
    # lazy: ldp_beam.client (the mechanisms) costs 8 ms at import (measured); the CLI imports
    # this module to build its parser, for every command
    from ldp_beam.client import mechanism_from

    params: dict[str, Any] = _kv(a.param, "--param")
    if a.epsilon is not None:
        params["epsilon"] = a.epsilon
    try:
        if a.reports_schema:
            if not os.path.isfile(a.reports_schema):
                raise EmitError(f"--reports-schema {a.reports_schema!r}: no such file")
            import pyarrow.parquet as pq  # lazy: pyarrow, 33 ms (measured; see _chunks_table)

            try:
                schema = pq.read_schema(a.reports_schema)
            except Exception as exc:
                raise EmitError(f"--reports-schema {a.reports_schema!r}: not a Parquet file "
                                f"({type(exc).__name__})") from None
            mech = mechanism_from(schema, params, a.allow_no_guarantee)
            if a.mechanism and a.mechanism != mech.name:
                raise EmitError(f"--mechanism {a.mechanism!r}: the reports schema was made by "
                                f"{mech.name!r}")
            return mech
        if not a.mechanism:
            raise EmitError("--mechanism: name the mechanism (-m NAME -p NAME=VALUE ...), or "
                            "give --reports-schema FILE")
        return mechanism_from(a.mechanism, params, a.allow_no_guarantee)
    except EmitError:
        raise
    except (LdpBeamError, ValueError, KeyError) as exc:
        opt = "--reports-schema" if a.reports_schema else "--mechanism/--param"
        raise EmitError(f"{opt}: {exc}") from None


def _roles(mech: Any, columns: list[str] | None, roles: list[str] | None) -> dict[str, str]:
    out = _kv(roles, "--role")
    required = [r.name for r in mech.roles if r.required]
    if len(columns or []) > len(required):
        raise EmitError(f"--column: given {len(columns)} times but {mech.name} has "
                        f"{len(required)} required role(s) {required}")
    for role, col in zip(required, columns or []):
        out[role] = col
    known = {r.name for r in mech.roles}
    for role in out:
        if role not in known:
            raise EmitError(f"--role {role}: {mech.name} has roles {sorted(known)}")
    return out


# --------------------------------------------------------------------------- reading
def _chunks_stdin_lines(stream: Any) -> Iterator[tuple[dict, None]]:
    while rows := [line.rstrip("\r\n") for line in itertools.islice(stream, CHUNK_ROWS)]:
        yield {"value": np.array(rows, dtype=object)}, None


def _column_array(col: Any) -> np.ndarray:
    arr = col.to_numpy(zero_copy_only=False)
    return arr if arr.dtype != object else np.asarray(arr, dtype=object)


def _chunks_table(path: str, wanted: dict[str, str], ts_col: str | None
                  ) -> Iterator[tuple[dict, Any]]:
    """(role -> column chunk, timestamps or None) from a Parquet or CSV file (or CSV on stdin)."""
    # lazy: pyarrow costs 33 ms at import (measured); the CLI imports this module to build its
    # parser, for every command, and only `emit --input FILE` reads a table
    import pyarrow as pa

    names = list(dict.fromkeys(list(wanted.values()) + ([ts_col] if ts_col else [])))
    if path != "-" and _is_parquet(path):
        import pyarrow.parquet as pq  # lazy: pyarrow (above)

        pf = pq.ParquetFile(path)
        have = pf.schema_arrow.names
        _check_columns(names, have)
        batches = pf.iter_batches(batch_size=CHUNK_ROWS, columns=names)
    else:
        import pyarrow.csv as pcsv  # lazy: pyarrow (above)

        source = sys.stdin.buffer if path == "-" else path
        try:
            reader = pcsv.open_csv(source, read_options=pcsv.ReadOptions(block_size=1 << 22),
                                   convert_options=pcsv.ConvertOptions(
                                       column_types={n: pa.string() for n in names},
                                       strings_can_be_null=False))
        except pa.ArrowInvalid as exc:
            raise EmitError(f"--input {path!r}: not a readable CSV ({exc})") from None
        _check_columns(names, reader.schema.names)
        batches = reader
    for rb in batches:
        if rb.num_rows == 0:
            continue
        cols = {role: _column_array(rb.column(rb.schema.get_field_index(c)))
                for role, c in wanted.items()}
        ts = None if ts_col is None else _column_array(rb.column(rb.schema.get_field_index(
            ts_col)))
        yield cols, ts


def _is_parquet(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"PAR1"


def _check_columns(names: list[str], have: list[str]) -> None:
    for n in names:
        if n not in have:
            shown = ", ".join(have[:20]) + (" ..." if len(have) > 20 else "")
            raise EmitError(f"--column/--timestamp-column: the input has no column {n!r} "
                            f"(columns: {shown})")


def _times(ts: Any, n: int) -> tuple[np.ndarray, dict[int, str]]:
    """Event times in epoch seconds (NaN for bad rows) and row -> reason."""
    from ldp_beam.client import event_seconds  # lazy: 8 ms (measured; see _mechanism)

    out = np.full(n, np.nan)
    bad: dict[int, str] = {}
    for i, v in enumerate(ts.tolist() if isinstance(ts, np.ndarray) else ts):
        if isinstance(v, str):
            v = v.strip()
        try:
            out[i] = event_seconds(v if not (isinstance(v, float) and np.isnan(v)) else None)
        except ValueError:
            bad[i] = f"--timestamp-column: {v!r} is not epoch seconds nor ISO 8601 text"
    return out, bad


# --------------------------------------------------------------------------- the command
def cmd_emit(a: argparse.Namespace) -> int:
    """Run ``ldp-beam emit``; returns the exit code. Raises :class:`EmitError` (one line naming
    the option) for bad options, which the command line prints as ``ldp-beam emit: error: ...``
    with exit code 2."""
    from ldp_beam.client import PublishError, Reporter, topic_path  # lazy: see _mechanism

    if not a.topic.startswith("projects/") or len(a.topic.split("/")) != 4 or \
            a.topic.split("/")[2] != "topics":
        raise EmitError(f"--topic {a.topic!r}: expected projects/PROJECT/topics/TOPIC")
    topic = topic_path(a.topic)
    if not a.device_id or "\n" in a.device_id:
        raise EmitError(f"--device-id {a.device_id!r}: expected a non-empty one-line id")
    for opt, v in (("--batch-size", a.batch_size), ("--reports-per-message",
                                                    a.reports_per_message)):
        if v < 1:
            raise EmitError(f"{opt} {v}: expected an integer >= 1")
    if not (a.timeout > 0):
        raise EmitError(f"--timeout {a.timeout}: expected seconds > 0")
    if a.input != "-" and not os.path.isfile(a.input):
        raise EmitError(f"--input {a.input!r}: no such file")
    mech = _mechanism(a)
    # an epsilon above 10 needs --allow-weak-privacy where it is chosen here
    check_privacy_strength(mech, a, "emit", chosen=not a.reports_schema or bool(a.param)
                           or a.epsilon is not None)
    if isinstance(mech, CentralRelease):
        raise EmitError(f"--mechanism {mech.name}: a central-DP release, whose reports are the "
                        "raw values: it runs at the curator (ldp-beam estimate/stream), never "
                        "on a device")
    if a.input != "-" and not a.column and not a.role:
        raise EmitError("--column: name the input column(s) to read from the file")
    roles = _roles(mech, a.column, a.role) if (a.column or a.role) else None
    if roles is None:
        required = [r.name for r in mech.roles if r.required]
        if len(required) != 1:
            raise EmitError(f"--column: {mech.name} reads {len(required)} roles {required}: "
                            "give a CSV with a header and --column for each")
        if a.timestamp_column:
            raise EmitError("--timestamp-column: needs a table input (a file, or CSV on "
                            "standard input with --column)")
    state = a.state or default_state(a.device_id)
    say = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        reporter = Reporter(mech, device_id=a.device_id, topic=topic, seq_store=state,
                            batch_size=a.batch_size, reports_per_message=a.reports_per_message,
                            memoize=True if a.memoize else None, unit_field=a.unit_field,
                            timeout=a.timeout)
    except ValueError as exc:
        opt = "--unit-field" if "unit_field" in str(exc) else "--state"
        raise EmitError(f"{opt}: {exc}") from None
    published, rows, invalid = 0, 0, []
    n_invalid = 0
    try:
        retried = reporter.pending()
        if retried:
            say(f"ldp-beam emit: re-sending {retried:,} report(s) an earlier run could not "
                "publish")
            published += reporter.flush()
        if roles is None:
            chunks = ((({mech.roles[0].name: c["value"]}), t)
                      for c, t in _chunks_stdin_lines(sys.stdin))
        else:
            chunks = _chunks_table(a.input, roles, a.timestamp_column)
        for cols, ts in chunks:
            n = len(next(iter(cols.values())))
            secs, bad = (None, {}) if ts is None else _times(ts, n)
            keep = np.ones(n, dtype=bool)
            keep[list(bad)] = False
            idx = np.flatnonzero(keep)
            receipt = reporter.report_many({k: v[idx] for k, v in cols.items()},
                                           None if secs is None else secs[idx],
                                           skip_invalid=True)
            published += receipt.published
            found = [(rows + i + 1, why) for i, why in bad.items()] + [
                (rows + int(idx[j]) + 1, why) for j, why in receipt.invalid.items()]
            invalid += found[:5 - len(invalid)]
            n_invalid += len(found)
            rows += n
        reporter.close()
    except PublishError as exc:
        print(f"ldp-beam emit: could not publish: {exc} ({reporter.pending():,} report(s) kept in "
              f"{os.path.join(state, 'outbox')}; run emit again to send them)", file=sys.stderr)
        print(f"published {published:,} reports to {topic} as device {a.device_id!r} before the "
              "failure")
        return 1
    print(f"published {published:,} reports to {topic} as device {a.device_id!r} "
          f"({reporter.guarantee.describe()} per report)")
    if n_invalid:
        shown = "; ".join(f"row {r}: {w}" for r, w in sorted(invalid)[:5])
        print(f"ldp-beam emit: {n_invalid:,} of {rows:,} values were invalid and not sent: "
              f"{shown}" + (" ..." if n_invalid > 5 else ""), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``emit`` on its own (what ``ldp-beam emit`` does once wired into the CLI)."""
    ap = argparse.ArgumentParser(prog="ldp-beam")
    sub = ap.add_subparsers(dest="command", required=True)
    add_parser(sub)
    a = ap.parse_args(["emit", *(sys.argv[1:] if argv is None else argv)])
    try:
        return cmd_emit(a)
    except ValueError as exc:
        print(f"ldp-beam emit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
