"""Estimates and releases as tidy tables, and their writers (Parquet, CSV, DuckDB, PostgreSQL).

The tidy form has one row per statistic, cell, group and window. :data:`TIDY_SCHEMA` holds every
column there is, in order; docs/guides/outputs.md says what each means (``grid_x`` is the
``grid`` statistic's point; ``n_reports`` is null for central-DP releases, which do not publish
their exact count). A table holds only the columns its output uses (:func:`tidy_schema`), in
that order, as a function of its family (its mechanism's registered name) and of whether it is
grouped or windowed, never of the data, so a table appended to run after run keeps the same
columns: :data:`CORE_COLUMNS` always; :data:`GROUP_COLUMNS` only for a grouped output
(``--by``); :data:`WINDOW_COLUMNS` only for a stream's panes; of :data:`CELL_COLUMNS` those the
family declares it fills: the ``tidy_cells`` class attribute of its mechanism or release class
(:attr:`ldp_beam.core.Configured.tidy_cells`), found through the registry
(:func:`family_cells`). A family that declares nothing (a plugin's, by default) or a mechanism
name the registry does not know gets every cell column; rows of several families in one table
get the union of their declarations.

A row that fills a cell column its family does not declare, or a column its table's schema
does not have, is an error (:class:`TidySchemaError`), never dropped.

:func:`tidy_rows` turns one estimate (``Estimate.to_dict()``, or the output of ``ldp-beam
estimate``/``release``/a stream pane) into these rows (dicts with every column of
:data:`TIDY_SCHEMA`, null where unused); :func:`tidy_table` makes the table of its schema
(:func:`tidy_output_table`: of a whole output, grouped and windowed as the output is, whatever
its rows); :func:`write_tidy` writes them to a ``.parquet`` or ``.csv`` path (local or any
Beam FileSystems URL such as ``s3://``), a DuckDB table ``duckdb:///FILE.db?table=T`` or a
PostgreSQL table ``postgresql://USER@HOST:PORT/DB?table=T`` (an append goes by column name,
or is refused when the table lacks a column of the rows: :func:`write_tidy`); :class:`WriteTidy`
does that from a Beam step, gathering the rows into one writer (a DuckDB file takes one writer
at a time; a database table is written in one transaction).

A database table replaced with ``keep=NAME`` is not dropped but kept as ``NAME`` (in its
schema; :func:`previous_table` gives the usual name: PostgreSQL renames it, DuckDB copies it,
since it cannot rename a table with an index) in the transaction that creates the new one, so
a run's commit can roll the replacement back (:func:`restore_tidy`: the old table, or no table
where there was none, in one transaction) or, once committed, remove the kept table
(:func:`drop_tidy`).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import re
from typing import Any, Iterable, Mapping

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ldp_beam.errors import ParameterError, UnknownPluginError
from ldp_beam.privacy import SEEDED_KIND, is_seeded_guarantee
from ldp_beam.registry import get_registry
from ldp_beam.urls import check_new_file, url_file

from .io import SourceError, _error_text
from .write import fs_open
from .sources import (CONNECT_TIMEOUT, _adbc_connect, _pg_error, parse_settings, quote_ident,
                      redact)

from .s3compat import apply as _s3_fixes

_s3_fixes()  # empty objects and one boto3 client per settings on s3:// (see .s3compat)

Z95 = 1.959963984540054  # the normal quantile of 0.975, as Statistic.ci uses

TIDY_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("mechanism", pa.string()), ("statistic", pa.string()),
    ("group_by", pa.string()), ("group", pa.string()),
    ("window_start", pa.string()), ("window_end", pa.string()),
    ("i", pa.int64()), ("j", pa.int64()),
    ("label", pa.string()), ("x_label", pa.string()), ("y_label", pa.string()),
    ("bin_low", pa.float64()), ("bin_high", pa.float64()), ("grid_x", pa.float64()),
    ("probability", pa.float64()),
    ("value", pa.float64()), ("value_text", pa.string()), ("clipped", pa.float64()),
    ("stderr", pa.float64()), ("ci_low", pa.float64()), ("ci_high", pa.float64()),
    ("n_reports", pa.int64()),
    ("guarantee", pa.string()), ("guarantee_kind", pa.string()), ("epsilon", pa.float64()),
    ("delta", pa.float64()), ("seeded", pa.bool_()),
    ("note", pa.string()), ("error", pa.string()),
])
TIDY_COLUMNS = tuple(TIDY_SCHEMA.names)
#: in every tidy table
CORE_COLUMNS = ("run_id", "mechanism", "statistic", "value", "stderr", "ci_low", "ci_high",
                "n_reports", "guarantee", "guarantee_kind", "epsilon", "delta", "seeded", "note",
                "error")
#: in a grouped output's table only (``--by``)
GROUP_COLUMNS = ("group_by", "group")
#: in a stream pane's table only
WINDOW_COLUMNS = ("window_start", "window_end")
#: in the table of a family that declares them (``tidy_cells``; every one when it declares none)
CELL_COLUMNS = ("i", "j", "label", "x_label", "y_label", "bin_low", "bin_high", "grid_x",
                "probability", "value_text", "clipped")
assert sorted(CORE_COLUMNS + GROUP_COLUMNS + WINDOW_COLUMNS + CELL_COLUMNS) == sorted(TIDY_COLUMNS)
WRITE_MODES = ("replace", "append")
#: what :func:`previous_table` appends to a table's name
PREVIOUS_TABLE_SUFFIX = "__ldp_beam_previous"
#: the bytes of an identifier PostgreSQL keeps (NAMEDATALEN - 1; longer ones are cut)
IDENTIFIER_BYTES = 63


class TidySchemaError(ValueError):
    """A tidy row that does not fit its table's schema: a column its family does not declare,
    a column the table does not have, or a declaration naming no cell column (one line)."""


def family_cells(mechanism: str | None) -> tuple[str, ...]:
    """The cell columns of family ``mechanism`` (a registered name), in :data:`CELL_COLUMNS`
    order: what its mechanism or release class declares (``tidy_cells``), or every cell column
    when it declares nothing (``None``), when the name is not registered or when it is None."""
    if mechanism is None:
        return CELL_COLUMNS
    try:
        cls = get_registry().get(str(mechanism)).mechanism
    except UnknownPluginError:
        return CELL_COLUMNS
    declared = getattr(cls, "tidy_cells", None)
    if declared is None:
        return CELL_COLUMNS
    if isinstance(declared, str) or not all(isinstance(c, str) for c in declared):
        raise TidySchemaError(f"{mechanism}: {cls.__name__}.tidy_cells must be a tuple of cell "
                              f"column names, not {declared!r}")
    unknown = sorted(set(declared) - set(CELL_COLUMNS))
    if unknown:
        raise TidySchemaError(f"{mechanism}: {cls.__name__}.tidy_cells names {unknown}, which "
                              f"are not tidy cell columns {list(CELL_COLUMNS)}")
    return tuple(c for c in CELL_COLUMNS if c in declared)


def tidy_schema(mechanisms: str | Iterable[str | None] | None = (), *, grouped: bool = False,
                windowed: bool = False) -> pa.Schema:
    """The tidy table's schema for rows of ``mechanisms`` (one registered name or several; the
    union of their cell columns; none known: every cell column): the core columns, the group
    columns when ``grouped``, the window columns when ``windowed``, in :data:`TIDY_SCHEMA`'s
    order and types. A function of these arguments only, never of the data."""
    names = [mechanisms] if isinstance(mechanisms, str) or mechanisms is None else \
        list(mechanisms)
    known = list(dict.fromkeys(m for m in names if m is not None))
    cells = set(CELL_COLUMNS) if not known else {c for m in known for c in family_cells(m)}
    keep = set(CORE_COLUMNS) | cells | (set(GROUP_COLUMNS) if grouped else set()) | \
        (set(WINDOW_COLUMNS) if windowed else set())
    return pa.schema([f for f in TIDY_SCHEMA if f.name in keep])


# --------------------------------------------------------------------------- flattening
def _number(x: Any) -> float | None:
    """``x`` as a float (booleans as 0/1); None when it is not a number."""
    numeric = (bool, np.bool_, int, float, np.integer, np.floating)
    return float(x) if isinstance(x, numeric) else None


def _cell(arr: Any, idx: tuple) -> Any:
    if arr is None:
        return None
    try:
        for k in idx:
            arr = arr[k]
    except (IndexError, TypeError, KeyError):
        return None
    return arr


def _probabilities(note: str, n: int) -> list[float] | None:
    m = re.search(r"probabilities \[([^\]]*)\]", note or "")
    if not m:
        return None
    try:
        ps = [float(p) for p in m.group(1).split(",") if p.strip()]
    except ValueError:
        return None
    return ps if len(ps) == n else None


def _seq(params: Mapping[str, Any], key: str, n: int) -> list | None:
    """``params[key]`` as a list when it is a list or tuple of ``n`` items, else None."""
    v = params.get(key)
    return list(v) if isinstance(v, (list, tuple)) and len(v) == n else None


def _labels(name: str, n: int, params: Mapping[str, Any], stats: Mapping[str, Any],
            note: str) -> list[dict]:
    """Per-cell label columns of a vector statistic of length ``n``."""
    out = [dict() for _ in range(n)]
    grid = stats.get("grid", {}).get("value") if isinstance(stats.get("grid"), Mapping) else None
    if name == "grid" or (name in ("density", "cdf", "pdf") and isinstance(grid, list)
                          and len(grid) == n):
        xs = grid if name != "grid" else stats[name].get("value")
        for c, x in zip(out, xs):
            c["grid_x"] = _number(x)
        return out
    if name == "quantiles":
        ps = _probabilities(note, n)
        if ps is not None:
            for c, p in zip(out, ps):
                c["probability"] = p
        return out
    key = {"marginal_x": "x_domain", "marginal_y": "y_domain"}.get(name)
    labels = _seq(params, key, n) if key else \
        _seq(params, "domain", n) or _seq(params, "categories", n)
    if labels is not None:
        for c, lab in zip(out, labels):
            c["label"] = str(lab)
        return out
    edges = params.get("bucket_edges")  # a histogram release's (ldp_beam.central.histogram)
    bins, lo, hi = params.get("bins"), params.get("lower"), params.get("upper")
    if not (isinstance(edges, (list, tuple)) and len(edges) == n + 1) and \
            isinstance(bins, int) and bins == n and lo is not None and hi is not None:
        # an output written before releases carried their edges: bins equal buckets
        edges = np.linspace(float(lo), float(hi), n + 1)
    if isinstance(edges, (list, tuple, np.ndarray)) and len(edges) == n + 1:
        edges = [float(e) for e in edges]
        for k, c in enumerate(out):
            c["bin_low"], c["bin_high"] = float(edges[k]), float(edges[k + 1])
    return out


def _guarantee_fields(g: Any, seeded: Any) -> dict:
    """The guarantee columns of a tidy row. A seeded run (``seeded`` given, or a guarantee that
    says ``seeded``/``private: false``/the seeded kind) promises nothing, whatever the guarantee
    dict carries: kind :data:`ldp_beam.privacy.SEEDED_KIND`, null epsilon and delta."""
    if not isinstance(g, Mapping):
        s = None if seeded is None else bool(seeded)
        return {"guarantee": None if g is None else str(g),
                "guarantee_kind": SEEDED_KIND if s else None,
                "epsilon": None, "delta": None, "seeded": s}
    s = g.get("seeded", seeded)
    if bool(seeded) or is_seeded_guarantee(dict(g)):
        return {"guarantee": g.get("summary"), "guarantee_kind": SEEDED_KIND,
                "epsilon": None, "delta": None, "seeded": True}
    return {"guarantee": g.get("summary"), "guarantee_kind": g.get("kind"),
            "epsilon": _number(g.get("epsilon")), "delta": _number(g.get("delta")),
            "seeded": None if s is None else bool(s)}


def tidy_rows(estimate: Mapping[str, Any], group_key: Any = None, window: Any = None, *,
              by: str | None = None, run_id: str | None = None, guarantee: Any = None,
              seeded: bool | None = None, mechanism: str | None = None) -> list[dict]:
    """One estimate or release (``Estimate.to_dict()``: ``mechanism``, ``n_reports``,
    ``params``, ``guarantee``, ``statistics``; or ``{"error", ...}``) -> tidy rows (dicts with
    every column of :data:`TIDY_SCHEMA`, null where unused; :func:`tidy_table` keeps the
    columns of their schema).

    ``group_key``: the group's value (with ``by`` naming its column); ``window``: ``(start,
    end)`` or a dict with ``window_start``/``window_end``; ``guarantee``/``seeded``: the run's
    (used when the estimate carries none); ``mechanism``: the run's (used when the estimate
    names none, e.g. a failed or suppressed group, so its row has its family's schema too).
    Scalars give one row; a vector one row per cell with its label, bucket edges (the release's
    ``bucket_edges``), grid point or probability; a matrix one row per cell with its x and y
    labels. An estimate with an ``error`` (or ``suppressed``: a group too small to say
    anything, see :class:`~ldp_beam.pipelines.estimate.GroupRule`) gives one row saying so
    (nothing is dropped)."""
    if not isinstance(estimate, Mapping):
        raise ParameterError("estimate", type(estimate).__name__, "an estimate dict")
    w_start = w_end = None
    if isinstance(window, Mapping):
        w_start, w_end = window.get("window_start"), window.get("window_end")
    elif window is not None:
        w_start, w_end = window
    g = estimate.get("guarantee", guarantee)
    base = {c: None for c in TIDY_COLUMNS}
    base.update({"run_id": run_id, "mechanism": estimate.get("mechanism", mechanism),
                 "group_by": by, "group": None if group_key is None else str(group_key),
                 "window_start": None if w_start is None else str(w_start),
                 "window_end": None if w_end is None else str(w_end),
                 "n_reports": estimate.get("n_reports")})
    base.update(_guarantee_fields(g if g is not None else guarantee, seeded))
    if "statistics" not in estimate:
        return [{**base, "error": "suppressed: " + str(estimate["suppressed"])
                 if "suppressed" in estimate else
                 str(estimate.get("error", "no statistics in the estimate"))}]
    params = estimate.get("params") or {}
    stats = estimate["statistics"]
    rows: list[dict] = []
    for name, st in stats.items():
        if not isinstance(st, Mapping):
            st = {"value": st}
        value, se, clipped = st.get("value"), st.get("stderr"), st.get("clipped")
        note = st.get("note") or None
        shape = np.shape(value) if isinstance(value, (list, tuple)) else ()
        if len(shape) > 2:
            raise ValueError(f"statistic {name!r} has {len(shape)} dimensions; the tidy form "
                             "takes scalars, vectors and matrices")
        if len(shape) == 0:
            cells = [((), {})]
        elif len(shape) == 1:
            cells = [((i,), lab) for i, lab in
                     enumerate(_labels(name, shape[0], params, stats, note or ""))]
        else:
            xl, yl = _seq(params, "x_domain", shape[0]), _seq(params, "y_domain", shape[1])
            cells = [((i, j), {"x_label": None if xl is None else str(xl[i]),
                               "y_label": None if yl is None else str(yl[j])})
                     for i in range(shape[0]) for j in range(shape[1])]
        for idx, labels in cells:
            v = _cell(value, idx)
            num = _number(v)
            row = {**base, **labels, "statistic": name, "note": note, "value": num,
                   "value_text": None if num is not None or v is None else str(v),
                   "clipped": _number(_cell(clipped, idx)), "stderr": _number(_cell(se, idx))}
            if idx:
                row["i"], row["j"] = idx[0], (idx[1] if len(idx) > 1 else None)
            if num is not None and row["stderr"] is not None and math.isfinite(num):
                ci = st.get("ci95") if not idx else None
                lo, hi = ci if ci else (num - Z95 * row["stderr"], num + Z95 * row["stderr"])
                row["ci_low"], row["ci_high"] = float(lo), float(hi)
            rows.append(row)
    return rows


def tidy_output(output: Mapping[str, Any], run_id: str | None = None) -> list[dict]:
    """The whole output of ``ldp-beam estimate`` or a release (``{"estimate": ...}`` or, with
    ``--by``, ``{"by": COLUMN, "estimates": {key: ...}}``; a stream pane's window fields are
    used when present) -> tidy rows of every group."""
    window = output if "window_start" in output else None
    kw = {"run_id": run_id, "guarantee": output.get("guarantee"), "seeded": output.get("seeded"),
          "mechanism": output.get("mechanism")}
    if "estimates" in output:
        return [row for key, est in output["estimates"].items()
                for row in tidy_rows(est, key, window, by=output.get("by"), **kw)]
    return tidy_rows(output.get("estimate", output), None, window, **kw)


def tidy_table(rows: Iterable[Mapping[str, Any]], schema: pa.Schema | None = None) -> pa.Table:
    """Tidy rows -> an Arrow table of their schema (columns a row leaves out are null).

    ``schema``: by default :func:`tidy_schema` of the rows' families (their ``mechanism``),
    grouped when a row has a group and windowed when one has a window (rows made by
    :func:`tidy_output` have them exactly when their output is grouped or windowed, and
    :func:`tidy_output_table` pins both from the output itself); or a schema of columns of
    :data:`TIDY_SCHEMA` to use as it is (e.g. a table's that is appended to daily).

    Nothing is dropped: a column that is not a tidy column, a value in a cell column the row's
    family does not declare (``tidy_cells``), or a value in a column the schema does not have
    raises :class:`TidySchemaError`."""
    rows = list(rows)
    for r in rows:
        extra = set(r) - set(TIDY_COLUMNS)
        if extra:
            raise TidySchemaError(f"tidy rows have unknown column(s) {sorted(extra)}")
    cells = {m: family_cells(m) for m in dict.fromkeys(r.get("mechanism") for r in rows)
             if m is not None}
    if schema is None:
        schema = tidy_schema(cells, grouped=any(r.get(c) is not None for r in rows
                                                for c in GROUP_COLUMNS),
                             windowed=any(r.get(c) is not None for r in rows
                                          for c in WINDOW_COLUMNS))
    else:
        foreign = [f.name for f in schema if TIDY_SCHEMA.get_field_index(f.name) < 0
                   or TIDY_SCHEMA.field(f.name).type != f.type]
        if foreign:
            raise TidySchemaError(f"schema: {foreign} are not columns of TIDY_SCHEMA (with its "
                                  "types)")
    names = set(schema.names)
    for r in rows:
        filled = {c for c, v in r.items() if v is not None}
        m = r.get("mechanism")
        undeclared = sorted((filled & set(CELL_COLUMNS)) - set(cells.get(m, CELL_COLUMNS)),
                            key=TIDY_COLUMNS.index)
        if undeclared:
            raise TidySchemaError(
                f"a tidy row of {m} (statistic {r.get('statistic')!r}) fills cell column(s) "
                f"{undeclared}, which {m} does not declare (its tidy_cells: "
                f"{list(cells[m])}); declare them on its mechanism class: nothing is dropped")
        outside = sorted(filled - names, key=TIDY_COLUMNS.index)
        if outside:
            raise TidySchemaError(
                f"a tidy row of {m} (statistic {r.get('statistic')!r}) fills column(s) "
                f"{outside}, which the table's schema does not have ({schema.names}): "
                "nothing is dropped")
    return pa.Table.from_pylist([{c: r.get(c) for c in schema.names} for r in rows],
                                schema=schema)


def tidy_output_table(output: Mapping[str, Any], run_id: str | None = None) -> pa.Table:
    """The whole output (as :func:`tidy_output` reads it) as a tidy table whose schema follows
    from the output's shape only: its family (``mechanism``, else its estimates'), grouped when
    it has ``estimates``, windowed when it has ``window_start`` (a stream pane), so even an
    output whose every group failed has its family's columns."""
    rows = tidy_output(output, run_id=run_id)
    mechs = [output.get("mechanism")] + [r.get("mechanism") for r in rows]
    return tidy_table(rows, tidy_schema(mechs, grouped="estimates" in output,
                                        windowed="window_start" in output))


# --------------------------------------------------------------------------- writers
def tidy_format(url: str) -> str:
    """``parquet``, ``csv``, ``duckdb``, ``postgresql`` or ``json`` (the nested form)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "duckdb":
        return "duckdb"
    if scheme in ("postgresql", "postgres"):
        return "postgresql"
    low = url.split("?", 1)[0].lower()
    if low.endswith((".parquet", ".pq")):
        return "parquet"
    if low.endswith(".csv"):
        return "csv"
    if low.endswith(".json"):
        return "json"
    raise ParameterError("output", url, "a .parquet, .csv or .json path, "
                         "duckdb:///FILE.db?table=T or postgresql://USER@HOST:PORT/DB?table=T")


def _table_setting(url: str) -> str:
    _, settings, other = parse_settings(url)
    table = settings.get("table")
    if not table or set(settings) - {"table"}:
        raise ParameterError("output", redact(url), "a database URL with table=NAME only")
    quote_ident(table)
    return table


#: how a tidy table is written as a whole file, by format
_FILE_WRITERS = {"parquet": pq.write_table, "csv": pacsv.write_csv}


def tidy_bytes(rows: Iterable[Mapping[str, Any]] | pa.Table, fmt: str) -> bytes:
    """Tidy rows encoded as a whole ``parquet`` or ``csv`` file (for a writer that puts the
    bytes somewhere itself, e.g. a run's staging folder on an object store)."""
    table = rows if isinstance(rows, pa.Table) else tidy_table(rows)
    if fmt not in _FILE_WRITERS:
        raise ParameterError("fmt", fmt, "parquet or csv")
    buf = io.BytesIO()
    _FILE_WRITERS[fmt](table, buf)
    return buf.getvalue()


def tidy_table_exists(url: str, kept: str | None = None) -> bool:
    """Whether the table a ``duckdb:///FILE?table=T`` or ``postgresql://...?table=T`` output
    names exists already (a DuckDB file that does not exist holds no table), or, with ``kept``,
    the table of that bare name in its schema (:func:`previous_table`). A name without a schema
    is looked for where it would be written: DuckDB's current schema, PostgreSQL's search
    path. Errors name the output (an unreachable server, a file that is not a DuckDB
    database)."""
    fmt = tidy_format(url)
    name = _table_setting(url) if kept is None else _kept_table(url, kept, "kept")
    if fmt == "duckdb":
        import duckdb  # lazy: optional dependency (the [duckdb] extra)

        path = _duckdb_path(url)
        if not os.path.exists(path):
            return False
        try:
            con = duckdb.connect(path, read_only=True)
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"{redact(url)}: cannot open the DuckDB database: "
                              f"{_error_text(exc)}") from None
        try:
            return _duck_has_table(con, name)
        finally:
            con.close()
    if fmt == "postgresql":
        con = _pg_connect(url)
        try:
            cur = con.cursor()
            literal = quote_ident(name).replace("'", "''")
            cur.execute(f"SELECT to_regclass('{literal}') IS NOT NULL")
            found = bool(cur.fetchone()[0])
            cur.close()
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"{redact(url)}: cannot check table {name}: "
                              f"{_pg_error(exc)}") from None
        finally:
            con.close()
        return found
    raise ParameterError("output", url, "duckdb:///FILE.db?table=T or "
                         "postgresql://USER@HOST:PORT/DB?table=T")


def _duckdb_path(url: str) -> str:
    return url_file(url)


def _pg_connect(url: str):
    """An ADBC connection to the PostgreSQL database of ``url`` (our ``table=`` setting taken
    out, a connect timeout added); errors name the output."""
    base, _, other = parse_settings(url)
    params = dict(other)
    params.setdefault("connect_timeout", str(CONNECT_TIMEOUT))
    conninfo = base + "?" + "&".join(f"{k}={v}" for k, v in params.items())
    return _adbc_connect(conninfo, redact(url), "writing")


def write_tidy(rows: Iterable[Mapping[str, Any]] | pa.Table, url: str,
               mode: str = "replace", keep: str | None = None) -> int:
    """Write tidy rows to ``url``; returns the number of rows written.

    ``.parquet``/``.csv``: one file (replaced). ``duckdb:///FILE.db?table=T`` and
    ``postgresql://...?table=T``: ``mode="replace"`` replaces the table (its columns become
    the rows' schema), ``"append"`` adds rows (creating the table when missing); either way in
    one transaction, so readers see the old rows or all the new ones. An append inserts by
    column name: into a table with more columns (e.g. one written with the full
    :data:`TIDY_SCHEMA` before tables held only their family's columns) the rows go in with
    nulls in the others; a table that lacks a column of the rows' schema (written for another
    family, or grouped or windowed differently) is refused with a one-line
    :class:`~ldp_beam.transforms.io.SourceError` naming the columns, and left as it was.

    ``keep`` (a replaced database table only; e.g. :func:`previous_table`): a bare table name
    (no schema; not the table's own). The table replaced is not dropped but kept under it
    (renamed; in DuckDB copied), in the table's schema and in the transaction that creates the
    new one (nothing is kept when there was no table); a table of that name left by an earlier
    write is dropped first, in the same transaction. :func:`restore_tidy` puts the kept table
    back, :func:`drop_tidy` removes it. ``keep`` with ``mode="append"`` or a file output is a
    :class:`~ldp_beam.errors.ParameterError`. Errors name the output."""
    if mode not in WRITE_MODES:
        raise ParameterError("mode", mode, f"one of {WRITE_MODES}")
    if keep is not None and mode != "replace":
        raise ParameterError("keep", keep, 'None with mode="append" (a table is kept only when '
                             'it is replaced)')
    kept = None if keep is None else _kept_table(url, keep, "keep")
    table = rows if isinstance(rows, pa.Table) else tidy_table(rows)
    fmt = tidy_format(url)
    if fmt in _FILE_WRITERS:
        with fs_open(url, "w") as fh:
            _FILE_WRITERS[fmt](table, fh)
    elif fmt == "duckdb":
        _write_duckdb(table, url, mode, kept)
    elif fmt == "postgresql":
        _write_postgres(table, url, mode, kept)
    else:
        raise ParameterError("output", url, "a tidy table output (.parquet, .csv, duckdb://, "
                             "postgresql://); the nested .json form is written by the pipeline")
    return table.num_rows


def _duck_has_table(con: Any, name: str) -> bool:
    """Whether DuckDB connection ``con`` holds table ``name`` (``T``: in the current schema)."""
    parts = name.split(".")
    return con.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = "
                       "coalesce(?, current_schema()) AND table_name = ?",
                       [parts[0] if len(parts) == 2 else None, parts[-1]]).fetchone()[0] > 0


@contextlib.contextmanager
def _transaction(url: str, what: str):
    """A cursor on the database of ``url`` (DuckDB: the connection) in one transaction, committed
    when the block ends and rolled back if it raises; errors are a :class:`SourceError` naming
    the output and ``what`` was being done."""
    duck = tidy_format(url) == "duckdb"
    if duck:
        import duckdb  # lazy: optional dependency (the [duckdb] extra)

        path = _duckdb_path(url)
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            con = cur = duckdb.connect(path)
        except Exception as exc:  # noqa: BLE001
            raise SourceError(f"{redact(url)}: cannot open the DuckDB database for writing: "
                              f"{_error_text(exc)}") from None
    else:
        con = _pg_connect(url)
    try:
        if duck:
            con.execute("BEGIN TRANSACTION")
        else:
            cur = con.cursor()
        yield cur
        if duck:
            con.execute("COMMIT")
        else:
            con.commit()
            cur.close()
    except Exception as exc:  # noqa: BLE001
        with contextlib.suppress(Exception):
            con.execute("ROLLBACK") if duck else con.rollback()
        if isinstance(exc, SourceError):
            raise
        raise SourceError(f"{redact(url)}: {what} failed: "
                          f"{_error_text(exc) if duck else _pg_error(exc)}") from None
    finally:
        con.close()


def _write_duckdb(table: pa.Table, url: str, mode: str, kept: str | None = None) -> None:
    name = _table_setting(url)
    check_new_file(url, _duckdb_path(url), "--output")
    t = quote_ident(name)
    with _transaction(url, f"writing table {name}") as con:
        con.register("__ldp_tidy", table)
        if mode == "replace":
            if kept is not None:
                # kept as a copy, not renamed: DuckDB refuses to rename a table with an index
                con.execute(f"DROP TABLE IF EXISTS {quote_ident(kept)}")
                if _duck_has_table(con, name):
                    con.execute(f"CREATE TABLE {quote_ident(kept)} AS SELECT * FROM {t}")
            con.execute(f"CREATE OR REPLACE TABLE {t} AS SELECT * FROM __ldp_tidy")
        else:
            parts = name.split(".")
            q = ("SELECT column_name FROM information_schema.columns WHERE "
                 + ("table_schema = ? AND " if len(parts) == 2 else "")
                 + "table_name = ? ORDER BY ordinal_position")
            _check_append(url, name, [r[0] for r in con.execute(q, parts).fetchall()],
                          table.schema.names)
            con.execute(f"CREATE TABLE IF NOT EXISTS {t} AS SELECT * FROM __ldp_tidy LIMIT 0")
            con.execute(f"INSERT INTO {t} BY NAME SELECT * FROM __ldp_tidy")


def _write_postgres(table: pa.Table, url: str, mode: str, kept: str | None = None) -> None:
    name = _table_setting(url)
    parts = name.split(".")
    schema_name, tname = parts[0] if len(parts) == 2 else None, parts[-1]
    with _transaction(url, f"writing table {name}") as cur:
        if mode == "replace":
            if kept is not None:  # the old table renamed to kept (a kept one of old dropped)
                _no_dependents(cur, url, name)
                cur.execute(f"DROP TABLE IF EXISTS {quote_ident(kept)}")
                cur.execute(f"ALTER TABLE IF EXISTS {quote_ident(name)} RENAME TO "
                            f"{quote_ident(kept.split('.')[-1])}")
            else:
                cur.execute(f"DROP TABLE IF EXISTS {quote_ident(name)}")
            cur.adbc_ingest(tname, table, mode="create", db_schema_name=schema_name)
            return
        literal = quote_ident(name).replace("'", "''")
        cur.execute(f"SELECT attname FROM pg_attribute WHERE attrelid = "
                    f"to_regclass('{literal}') AND attnum > 0 AND NOT attisdropped "
                    "ORDER BY attnum")
        have = [r[0] for r in cur.fetchall()]
        cols = list(table.schema.names)
        if have:
            _check_append(url, name, have, cols)
        if not have or have == cols:
            cur.adbc_ingest(tname, table, mode="create_append", db_schema_name=schema_name)
        else:  # by name (whatever the driver's COPY does): through a temporary table
            cur.adbc_ingest("__ldp_tidy_append", table, mode="create", temporary=True)
            listed = ", ".join(quote_ident(c) for c in cols)
            cur.execute(f"INSERT INTO {quote_ident(name)} ({listed}) SELECT {listed} "
                        'FROM "__ldp_tidy_append"')
            cur.execute('DROP TABLE "__ldp_tidy_append"')


def _clip_identifier(name: str) -> str:
    """``name`` as PostgreSQL keeps it: cut to :data:`IDENTIFIER_BYTES` bytes of UTF-8, never
    inside a character."""
    return name.encode("utf-8")[:IDENTIFIER_BYTES].decode("utf-8", "ignore")


def previous_table(url: str) -> str:
    """The bare name (no schema) under which a replacement keeps the table ``url`` names
    (``duckdb:///FILE?table=T``, ``postgresql://...?table=T``; ``write_tidy(keep=...)``):
    ``T__ldp_beam_previous`` for table (or ``SCHEMA.``) ``T``. A name that would be longer than
    :data:`IDENTIFIER_BYTES` bytes (PostgreSQL cuts longer ones) is ``T`` cut, then ``_`` and 8
    hex digits of the SHA-256 of ``T``, then the suffix: always the same for the same table,
    and two long names with the same beginning keep their tables apart."""
    if tidy_format(url) not in ("duckdb", "postgresql"):
        raise ParameterError("output", redact(url), "duckdb:///FILE.db?table=T or "
                             "postgresql://USER@HOST:PORT/DB?table=T")
    bare = _table_setting(url).split(".")[-1]
    name = bare + PREVIOUS_TABLE_SUFFIX
    if len(name.encode("utf-8")) <= IDENTIFIER_BYTES:
        return name
    tail = "_" + hashlib.sha256(bare.encode("utf-8")).hexdigest()[:8] + PREVIOUS_TABLE_SUFFIX
    head = bare.encode("utf-8")[:IDENTIFIER_BYTES - len(tail)].decode("utf-8", "ignore")
    return head + tail


def _kept_table(url: str, keep: Any, param: str) -> str:
    """The table ``keep`` (a bare name) in the schema of the table ``url`` names: ``SCHEMA.K``
    or ``K``. Refuses (:class:`~ldp_beam.errors.ParameterError` naming ``param``) a file
    output, a name with a schema, and the table's own name (compared as the database does:
    DuckDB ignores case, PostgreSQL keeps :data:`IDENTIFIER_BYTES` bytes)."""
    fmt = tidy_format(url)
    if fmt not in ("duckdb", "postgresql"):
        raise ParameterError(param, keep, "a table name only for a duckdb:// or postgresql:// "
                             "table output")
    parts = _table_setting(url).split(".")
    if not isinstance(keep, str) or not keep or "." in keep:
        raise ParameterError(param, keep, "a bare table name (no schema: it is the table's)")
    same = keep.lower() == parts[-1].lower() if fmt == "duckdb" else \
        _clip_identifier(keep) == _clip_identifier(parts[-1])
    if same:
        raise ParameterError(param, keep, f"a name other than the table's own ({parts[-1]}); "
                             "e.g. previous_table(url)")
    return ".".join(parts[:-1] + [keep])


def _no_dependents(cur: Any, url: str, name: str) -> None:
    """Refuse to keep a PostgreSQL table that views (or other objects) depend on: a rename
    would carry them to the kept table, so they would go on showing the old rows, and it could
    never be dropped. A replacement without keeping fails on them as well (``DROP TABLE``)."""
    literal = quote_ident(name).replace("'", "''")
    cur.execute("SELECT DISTINCT c.relname FROM pg_depend d JOIN pg_rewrite r ON d.objid = "
                "r.oid JOIN pg_class c ON r.ev_class = c.oid WHERE d.refobjid = "
                f"to_regclass('{literal}') AND c.oid <> d.refobjid ORDER BY 1")
    views = [r[0] for r in cur.fetchall()]
    if views:
        raise SourceError(f"{redact(url)}: table {name} cannot be replaced: the view(s) "
                          f"{', '.join(views)} depend on it; drop them (or write the output "
                          "to another table and point them there)")


def restore_tidy(url: str, keep: str) -> None:
    """Undo ``write_tidy(rows, url, keep=keep)``: in one transaction, drop the table ``url``
    names if it exists, then rename table ``keep`` (bare; in that table's schema) back to its
    name if it exists. The database then holds the table as it was before (its rows, columns
    and types) or, when there was none, no table. A DuckDB file that does not exist is left
    so. Errors name the output."""
    kept = _kept_table(url, keep, "keep")
    name = _table_setting(url)
    _alter_tables(url, [f"DROP TABLE IF EXISTS {quote_ident(name)}",
                        f"ALTER TABLE IF EXISTS {quote_ident(kept)} RENAME TO "
                        f"{quote_ident(name.split('.')[-1])}"],
                  f"restoring table {name} from {kept}")


def drop_tidy(url: str, name: str) -> None:
    """Drop table ``name`` (bare; in the schema of the table ``url`` names, never that table
    itself) if it exists, e.g. the table a committed replacement kept (:func:`previous_table`).
    A DuckDB file that does not exist is left so. Errors name the output."""
    kept = _kept_table(url, name, "name")
    _alter_tables(url, [f"DROP TABLE IF EXISTS {quote_ident(kept)}"], f"dropping table {kept}")


def _alter_tables(url: str, statements: list[str], what: str) -> None:
    """Run ``statements`` on the database of ``url`` in one transaction (all or none); errors
    name the output and ``what`` was being done."""
    if tidy_format(url) == "duckdb" and not os.path.exists(_duckdb_path(url)):
        return  # no database: no table to drop or rename (and no file is created)
    with _transaction(url, what) as cur:
        for statement in statements:
            cur.execute(statement)


def _check_append(url: str, name: str, have: list[str], cols: Iterable[str]) -> None:
    """Refuse to append rows of columns ``cols`` to table ``name`` of columns ``have`` (empty:
    no table yet) when the table lacks one of them: the rows' values there would be lost."""
    missing = [c for c in cols if c not in have] if have else []
    if missing:
        raise SourceError(
            f"{redact(url)}: cannot append to table {name}: it has no column(s) {missing} of "
            "these tidy rows (a table written for another family, or grouped or windowed "
            "differently); append to a table of the same kind of output or replace it")


def _write_all(rows: list, url: str, mode: str, schema: pa.Schema | None = None) -> int:
    return write_tidy(rows if schema is None else tidy_table(rows, schema), url, mode)


class WriteTidy(beam.PTransform):
    """Tidy rows (dicts) -> one write to ``url`` from a single Beam step (all rows gathered
    first: a DuckDB file takes one writer, a database table one transaction). Outputs the
    number of rows written. ``schema``: the table's (:func:`tidy_schema`; default: the rows',
    see :func:`tidy_table`). Estimates are small (one row per statistic, cell, group and
    window), so gathering them is cheap."""

    def __init__(self, url: str, mode: str = "replace", schema: pa.Schema | None = None) -> None:
        super().__init__()
        if mode not in WRITE_MODES:
            raise ParameterError("mode", mode, f"one of {WRITE_MODES}")
        tidy_format(url)
        self.url, self.mode, self.schema = url, mode, schema

    def expand(self, pcoll):
        return (pcoll | "Gather" >> beam.combiners.ToList()
                | "Write" >> beam.Map(_write_all, self.url, self.mode, self.schema))
