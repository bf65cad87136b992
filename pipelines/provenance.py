"""Reports carry their provenance (issue 23): tie every reports file to the ``collect`` run that
committed it before ``estimate`` reads it.

``collect`` writes ``REPORTS.parquet`` (the mechanism, its parameters, seededness, the privacy
unit and the run id in the Arrow schema metadata) and, last, ``REPORTS.parquet.manifest.json``
(the run id, the file's size and SHA-256, the number of reports, the same configuration).
:func:`verify_reports` lists exactly the files an estimate reads (:class:`ReadTable`'s listing)
and, for each, finds the manifest that committed it — ``FILE.manifest.json`` beside it, else (a
file renamed, or moved with its folder) any ``*.manifest.json`` in its folder whose reports file
has the same SHA-256 — then checks:

* per file: a manifest exists and was written by ``collect``; the file's bytes and SHA-256 are
  the manifest's (not edited, truncated or appended to); its Parquet row count is the manifest's
  ``records.reported``; its schema metadata (mechanism, parameters, seeded, privacy unit) is the
  manifest's; its metadata's run id (absent in files written before it was recorded) is the
  manifest's;
* across files: no run and no manifest is used twice (a copied file: its reports would count
  twice); the mechanism, parameters, privacy unit and seededness agree.

The provenance problems (no manifest, a file that differs from it, a duplicate, input that is
not Parquet files with manifests: CSV, a database table) raise :class:`ProvenanceError` unless
``unverified`` (the CLI's ``--unverified``), in which case they are returned and every output of
the estimate says so. Reports of different configurations are refused whatever ``unverified``
says (:class:`MixedReportsError`): estimating eps 0.5 and eps 4 reports as one population is
wrong arithmetic, not missing paperwork.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import pyarrow.parquet as pq

from ldp_beam.errors import LdpBeamError
from ldp_beam.transforms import ReadTable, mechanism_metadata
from ldp_beam.transforms.io import open_input, table_format
from ldp_beam.jsonio import dumps

from .files import _listing, _parent, exists, file_digest, is_url, location, open_read

#: what every refusal for missing or broken provenance ends with
UNVERIFIED_HINT = "pass --unverified to estimate them anyway; every output then says so"
#: how an unverified estimate's guarantee summary starts (and so every output that states it)
UNVERIFIED_PREFIX = "UNVERIFIED reports (--unverified): "
#: problems named in a refusal's message (the rest are counted)
SHOWN_PROBLEMS = 3


class ProvenanceError(LdpBeamError, ValueError):
    """Reports whose provenance cannot be verified (the command line exits 2, in one line).
    ``problems``: every problem found."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)


class MixedReportsError(ProvenanceError):
    """Reports of different configurations (mechanism, parameters, privacy unit, seededness) in
    one input: refused even with ``unverified``."""


@dataclass(frozen=True)
class Provenance:
    """What :func:`verify_reports` found: the files read, the ``collect`` runs they come from
    (``{"run_id", "files", "reported", "manifest", "seeded"}`` each), the configuration they
    agree on (None where no file carries metadata) and whether everything verified
    (``problems``: what did not)."""

    files: tuple[str, ...]
    runs: list[dict] = field(default_factory=list)
    mechanism: str | None = None
    params: dict | None = None
    seeded: bool | None = None
    privacy_unit: dict | None = None
    verified: bool = True
    problems: tuple[str, ...] = ()

    @property
    def run_ids(self) -> list[str]:
        return [r["run_id"] for r in self.runs]

    def verification(self) -> dict:
        """``{"verified", "problems"}``: what the estimate's outputs state."""
        return {"verified": self.verified, "problems": list(self.problems)}

    def to_dict(self) -> dict:
        return {**self.verification(), "runs": [dict(r) for r in self.runs],
                "files": list(self.files), "mechanism": self.mechanism, "params": self.params,
                "seeded": self.seeded, "privacy_unit": self.privacy_unit}


# ------------------------------------------------------------------------------ configuration
def _norm(x: Any) -> Any:
    """A JSON value as JSON would give it back (tuples are lists, keys are text)."""
    return json.loads(dumps(x))


def _unit(u: Any) -> dict | None:
    if not u:
        return None
    return {"column": u.get("column"),
            "max_reports_per_unit": int(u.get("max_reports_per_unit", 1) or 1)}


def config_of(meta: dict) -> dict:
    """The configuration a reports file's metadata (or its manifest) states: mechanism,
    parameters, seededness and privacy unit, normalized for comparison."""
    return {"mechanism": meta.get("mechanism"), "params": _norm(meta.get("params") or {}),
            "seeded": bool(meta.get("seeded", False)),
            "privacy_unit": _unit(meta.get("privacy_unit"))}


def _value_text(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else json.dumps(v) if not isinstance(v, str) else v


def config_differences(a: dict, b: dict) -> list[tuple[str, str]]:
    """How two configurations (:func:`config_of`) differ: ``(a's side, b's side)`` pairs such as
    ``("epsilon=0.5", "epsilon=4")`` or ``("seeded", "unseeded")``."""
    out = []
    if a["mechanism"] != b["mechanism"]:
        out.append((f"mechanism {a['mechanism']}", f"mechanism {b['mechanism']}"))
    else:
        pa_, pb = a["params"], b["params"]
        for k in sorted(set(pa_) | set(pb)):
            if pa_.get(k) != pb.get(k):
                out.append((f"{k}={_value_text(pa_.get(k))}" if k in pa_ else f"no {k}",
                            f"{k}={_value_text(pb.get(k))}" if k in pb else f"no {k}"))
    if a["seeded"] != b["seeded"]:
        out.append(("seeded reports" if a["seeded"] else "unseeded reports",
                    "seeded reports" if b["seeded"] else "unseeded reports"))
    if a["privacy_unit"] != b["privacy_unit"]:
        def unit_text(u: Any) -> str:
            return ("no privacy unit" if u is None else f"privacy unit {u['column']!r} (at most "
                    f"{u['max_reports_per_unit']} report(s) each)")
        out.append((unit_text(a["privacy_unit"]), unit_text(b["privacy_unit"])))
    return out


def _read_footer(path: str, flags: Sequence[str]) -> tuple[dict | None, int | None, str | None]:
    """(ldp-beam schema metadata or None, row count, None) of a Parquet file, or (None, None,
    the reason it could not be read)."""
    try:
        with open_input(path, tuple(flags)) as fh:
            pf = pq.ParquetFile(fh)
            return mechanism_metadata(pf.schema_arrow), pf.metadata.num_rows, None
    except Exception as exc:  # noqa: BLE001 - a damaged file: named as a problem
        return None, None, f"{type(exc).__name__}: {exc}"


def _is_parquet(path: str) -> bool:
    try:
        return table_format(path) == "parquet"
    except ValueError:
        return False


def agreed_metadata(files: Iterable[str], flags: Sequence[str] = (),
                    input: str | None = None,
                    footers: dict | None = None) -> dict | None:
    """The ldp-beam metadata of the Parquet reports ``files`` (that of the first file carrying
    any), after checking that every file carrying metadata states the same mechanism,
    parameters, privacy unit and seededness; None when no file carries any (CSV, Parquet written
    by hand). Raises :class:`MixedReportsError` naming two files and what differs."""
    first: tuple[str, dict] | None = None
    for f in files:
        if not _is_parquet(f):
            continue
        meta = (footers[f] if footers is not None and f in footers
                else _read_footer(f, flags))[0]
        if meta is None:
            continue
        if first is None:
            first = (f, meta)
            continue
        diff = config_differences(config_of(first[1]), config_of(meta))
        if diff:
            raise MixedReportsError(
                f"--input {input or os.path.dirname(location(f))}: mixes reports of different "
                f"configurations: {location(first[0])} has "
                + ", ".join(d[0] for d in diff) + f" but {location(f)} has "
                + ", ".join(d[1] for d in diff)
                + "; estimate each configuration on its own (--unverified does not apply: "
                "estimating them together would be wrong, not merely unverified)")
    return None if first is None else first[1]


# ------------------------------------------------------------------------------ manifests
def _folder_manifests(folder: str, flags: Sequence[str]) -> list[str]:
    if is_url(folder):
        try:
            return sorted(p for p, _ in _listing(folder.rstrip("/") + "/*.manifest.json",
                                                   flags))
        except Exception:  # noqa: BLE001 - nothing listable: no manifest found
            return []
    return sorted(glob.glob(os.path.join(glob.escape(folder), "*.manifest.json")))


def _load(path: str, flags: Sequence[str]) -> tuple[dict | None, str | None]:
    try:
        with open_read(path, flags) as fh:
            man = json.loads(fh.read())
        return (man, None) if isinstance(man, dict) else (None, "not a JSON object")
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"


class _Manifests:
    """Manifests read once per run of :func:`verify_reports` (a folder's are listed once)."""

    def __init__(self, flags: Sequence[str]) -> None:
        self.flags = flags
        self.loaded: dict[str, tuple[dict | None, str | None]] = {}
        self.folders: dict[str, list[str]] = {}

    def load(self, path: str) -> tuple[dict | None, str | None]:
        if path not in self.loaded:
            self.loaded[path] = _load(path, self.flags)
        return self.loaded[path]

    def find(self, path: str, sha256: str) -> tuple[str | None, dict | None, str | None]:
        """(manifest path, manifest, problem) of the reports file ``path`` with this digest."""
        beside = path + ".manifest.json"
        if exists(beside, self.flags):
            man, err = self.load(beside)
            if man is None:
                return beside, None, f"its manifest {location(beside)} cannot be read ({err})"
            return beside, man, None
        folder = _parent(path)
        if folder not in self.folders:
            self.folders[folder] = _folder_manifests(folder, self.flags)
        for cand in self.folders[folder]:
            man, _ = self.load(cand)
            rep = ((man or {}).get("files") or {}).get("reports") or {}
            if isinstance(rep, dict) and rep.get("sha256") == sha256:
                return cand, man, None
        return None, None, None


# ------------------------------------------------------------------------------ verification
def verify_reports(input: str, beam_args: Iterable[str] = (), *, unverified: bool = False,
                   read: Any = None) -> "Provenance":
    """Verify the provenance of the reports an estimate of ``input`` reads (see the module
    docstring). Returns the :class:`Provenance`; raises :class:`ProvenanceError` listing the
    first problems (unless ``unverified``: they are then returned in ``problems``) and
    :class:`MixedReportsError` for reports of different configurations (always).

    ``read``: the :class:`~ldp_beam.transforms.ReadTable` the estimate reads with (else one is
    made from ``input`` and ``beam_args``), so the files checked are exactly those read."""
    if read is None:
        read = ReadTable(input, options=list(beam_args))
    flags = tuple(read.flags)
    problems: list[str] = []
    if read.kind != "files":
        problems.append(f"{read.source_name} is a {read.kind} source, not the Parquet files "
                        "collect writes: it has no manifest, so where its reports come from "
                        "cannot be checked")
        return _finish(input, Provenance(files=(), problems=tuple(problems), verified=False),
                       unverified)
    files = list(read.files)
    footers = {f: _read_footer(f, flags) for f in files if _is_parquet(f)}
    meta = agreed_metadata(files, flags, input, footers)  # mixed configurations: always refused
    manifests = _Manifests(flags)
    runs: dict[str, dict] = {}
    used: dict[str, str] = {}  # manifest -> the file it was matched to
    seeded_any = False
    for f in files:
        where = location(f)
        if not _is_parquet(f):
            problems.append(f"{where} is not a Parquet file: only the Parquet reports collect "
                            "writes have a manifest, so where these reports come from cannot be "
                            "checked")
            continue
        fmeta, rows, err = footers[f]
        if err is not None:
            problems.append(f"{where} cannot be read as Parquet ({err})")
            continue
        if fmeta is not None:
            seeded_any = seeded_any or bool(fmeta.get("seeded", False))
        digest = file_digest(f, flags)
        man_path, man, problem = manifests.find(f, digest["sha256"])
        if problem:
            problems.append(f"{where}: {problem}")
            continue
        if man is None:
            problems.append(f"{where} has no manifest (neither {os.path.basename(where)}"
                            ".manifest.json beside it nor a manifest in its folder naming its "
                            "SHA-256): it was not committed by collect, or its manifest was "
                            "deleted")
            continue
        mloc = location(man_path)
        seeded_any = seeded_any or bool(man.get("seeded", False))
        if man.get("command") != "collect":
            problems.append(f"{where}: its manifest {mloc} was written by "
                            f"{man.get('command')!r}, not collect")
            continue
        rid = str(man.get("run_id"))
        if mloc in used or rid in runs:
            other = used.get(mloc) or runs[rid]["files"][0]
            problems.append(f"{where} and {other} are the same collect run {rid} (manifest "
                            f"{mloc}): a copied file, whose reports would be counted twice")
            if rid in runs:
                runs[rid]["files"].append(where)
            continue
        used[mloc] = where
        rep = (man.get("files") or {}).get("reports") or {}
        if {"bytes": rep.get("bytes"), "sha256": rep.get("sha256")} != digest:
            problems.append(f"{where} differs from its manifest {mloc} ({digest['bytes']:,} "
                            f"bytes, SHA-256 {digest['sha256'][:12]}..., where collect committed "
                            f"{rep.get('bytes')} bytes, SHA-256 {str(rep.get('sha256'))[:12]}"
                            "...): edited, appended to or replaced since")
        reported = (man.get("records") or {}).get("reported")
        if rows != reported:
            shown = f"{reported:,}" if isinstance(reported, int) else repr(reported)
            problems.append(f"{where} holds {rows:,} reports where its manifest {mloc} says "
                            f"collect reported {shown}")
        if fmeta is None:
            problems.append(f"{where} carries no mechanism metadata where its manifest {mloc} "
                            f"names {man.get('mechanism')}")
        else:
            diff = config_differences(config_of(fmeta), config_of(man))
            if diff:
                problems.append(f"{where}: its Parquet metadata says "
                                + ", ".join(d[0] for d in diff) + f" where its manifest {mloc} "
                                "says " + ", ".join(d[1] for d in diff) + " (metadata edited)")
            if fmeta.get("run_id") is not None and str(fmeta["run_id"]) != rid:
                problems.append(f"{where}: its Parquet metadata names run {fmeta['run_id']} "
                                f"where its manifest {mloc} names run {rid}")
        runs[rid] = {"run_id": rid, "files": [where], "reported": reported, "manifest": mloc,
                     "seeded": bool(man.get("seeded", False))}
    cfg = config_of(meta) if meta is not None else None
    prov = Provenance(
        files=tuple(location(f) for f in files), runs=list(runs.values()),
        mechanism=None if cfg is None else cfg["mechanism"],
        params=None if meta is None else dict(meta.get("params") or {}),
        seeded=None if cfg is None else (seeded_any or cfg["seeded"]),
        privacy_unit=None if cfg is None else cfg["privacy_unit"],
        verified=not problems, problems=tuple(problems))
    return _finish(input, prov, unverified)


def _finish(input: str, prov: Provenance, unverified: bool) -> Provenance:
    if prov.problems and not unverified:
        shown = "; ".join(prov.problems[:SHOWN_PROBLEMS])
        more = len(prov.problems) - SHOWN_PROBLEMS
        raise ProvenanceError(
            f"--input {input}: {len(prov.problems)} provenance problem(s): {shown}"
            + (f" (and {more} more)" if more > 0 else "") + f"; {UNVERIFIED_HINT}",
            prov.problems)
    return prov


def mark_unverified(guarantee: dict, prov: Provenance) -> dict:
    """The guarantee an estimate states: unchanged for verified reports; for unverified ones its
    summary starts with :data:`UNVERIFIED_PREFIX` (and ``verified`` is False)."""
    if prov.verified:
        return guarantee
    g = dict(guarantee)
    g["summary"] = UNVERIFIED_PREFIX + str(g.get("summary", ""))
    g["verified"] = False
    return g
