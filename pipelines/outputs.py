"""Commit or nothing: a run's outputs are staged, then committed together, manifest last.

A batch run (``collect``, ``estimate``, a central release) writes every output into a private
staging folder beside its manifest, ``DIR/.ldp-beam-staging-RUNID/``, on the same file system: a
local folder, or a prefix of any Beam FileSystems URL (``s3://bucket/prefix/``, ``gs://...``), in
which case the pipeline's workers write there through Beam's FileSystems and the launcher reads
the run's small intermediate results (the tally, the estimate lines) back the same way: nothing
is gathered through the launcher's local disk. Only when the pipeline has finished and its counts
check out does :meth:`RunOutputs.commit` move them into place:

0. the commit's journal (``_commit.json`` in the staging folder) records every change it will
   make and where each previous version is kept;
1. the previous manifest is set aside first (renamed ``MANIFEST.ldp-beam-previous``), so from
   this point no manifest vouches for a mixture of old and new files;
2. every staged file replaces its final path (locally ``os.replace``: atomic per file; on an
   object store Beam's ``FileSystems.rename``, a server-side copy then a delete: each object is
   replaced whole), its previous version kept first as ``NAME.ldp-beam-previous`` (locally a
   hard link, on an object store a server-side copy); every database table output
   (``duckdb:///FILE?table=T``, ``postgresql://...?table=T``) is written from its staged
   Parquet file in one transaction that renames the previous table ``T__ldp_beam_previous``;
3. the new manifest, naming the run id and each file it covers with its size and SHA-256 (a table
   with its row count), is written last; then the kept previous versions are removed.

A reader who finds a manifest can therefore trust the files it lists (and can check them). A run
either commits all of its outputs or leaves the previous ones as they were: one that fails or
is interrupted before step 1 has changed nothing; a failure during steps 1-3 puts every kept
previous version back, the manifest last, before the error is raised (an output that was moved
in was visible for that moment, which the error and :attr:`RunOutputs.published` say); a
process killed during steps 1-3 leaves no manifest, and the next run that stages in the
manifest's folder finds the journal in the dead run's staging folder and rolls the commit back
(or, when its manifest was written, removes the kept versions):
:func:`.rollback.recover_commit`. Paths, URLs and the file operations are in :mod:`.files`;
the lock, the journal and the undo in :mod:`.rollback`.
The staging folder is removed whatever happens (but for a rollback that could not finish: its
journal stays for the next run); one left by a process killed with ``kill -9`` is
removed by the next run that stages in the same folder (its owner process is gone: no process
holds the ``flock`` a run keeps on its folder's owner file for its life; a staging
folder owned by another host, on a shared NFS folder or an object store alike, is removed only
once it is :data:`REMOTE_STALE_SECONDS` old, since whether that host's process lives cannot be
asked).

Two runs on the same outputs (both started without ``force``, both passed the check at their
start): the first to commit wins. Every commit without ``force`` checks again, before it changes
anything, that no output and no manifest exists at its final place; one created while the run ran
(another run committed first) refuses the commit with one :class:`OutputError` and nothing of
either run's is changed. Commits to one local manifest take turns: a commit holds an exclusive
``flock`` on ``MANIFEST.lock`` beside it for its duration (the file names its owner: host, pid,
run id); a commit finding it held is refused (nothing committed). The kernel drops the lock of a
process that dies, so a lock file left by a killed run of this host is simply taken, whatever pid
it names; one naming another host's run (whose lock a disk mounted without lock support cannot
show) is taken only once it is :data:`REMOTE_STALE_SECONDS` old.
An ``s3://`` manifest's lock is the object ``MANIFEST.lock``, created only if absent (a
conditional write); a leftover one is taken once its run of this host is gone or it is a day old.
A ``gs://`` manifest has no lock (Beam's FileSystems have no conditional writes; the emulator
here has none to test one against): only the check again guards it, with a warning, so two
commits to one ``gs://`` manifest at the very same moment are not excluded.

Every local path (each output, the manifest, the staging folder) is resolved once, as the file
system will resolve it (:func:`real_path`: ``os.path.realpath`` of the path as given, so
``lnk/..`` goes up from the link's target as the kernel does, not from ``lnk``'s own folder),
and :class:`RunOutputs` checks and writes those same real paths: the manifest names them.

Refused before anything runs (when :class:`RunOutputs` is built, before the caller reserves any
budget), each with one :class:`OutputError` naming the option and the path:

* an output equal to or inside an input (``collect -i X -o X`` would otherwise read a file it is
  replacing), by real path whatever the spelling (symlinks, ``..``), by the input's glob, and,
  for an existing file, by (st_dev, st_ino) against every file of the input (a hard link to an
  input is the input); two outputs at one path; an output naming a folder;
* an existing output (a file, an object, or a database table) unless the caller passes
  ``force`` (the CLI's ``--force``);
* a local output that cannot be written: a component of its folder is a file; its nearest
  existing folder is not writable (``os.access``, then a probe file really created and removed:
  ``os.access`` says yes to root where a write still fails); a name the run writes (the output's,
  ``NAME.tmp``, ``NAME.ldp-beam-partial``, the manifest's, the staging folder's) longer than the
  file system's ``PC_NAME_MAX``, or a path longer than its ``PC_PATH_MAX``.

:func:`check_output_format` (called by the pipelines) refuses an output whose suffix says another
format than the one written (``collect -o out.csv`` would write Parquet under that name).

A file-system error while staging or committing is raised as one :class:`OutputError` saying
what failed on which path and in which state it left the outputs; during the commit,
:attr:`RunOutputs.published` says which outputs were moved into place (nothing new was visible
when it is empty). No temporary file
(``NAME.tmp``, ``NAME.ldp-beam-partial``), staging folder, or folder the run created and left
empty survives a failure.
"""
from __future__ import annotations

import fcntl
import fnmatch
import glob
import io
import json
import logging
import os
import shutil
import socket
import stat
import uuid
from typing import Any, Iterable, Mapping, Sequence

from ldp_beam.errors import LdpBeamError
from ldp_beam.jsonio import json_bytes
from ldp_beam.ledger import redact

from .files import (PARTIAL_SUFFIX, OutputError, RunFailed, _delete, _join, _listing, _local,
                    _move, _parent, _reason, _unlink_quiet, count_lines, exists, file_digest,
                    is_table_url, is_url, location, open_read, read_json_lines, real_path,
                    verify, write_bytes)
from .rollback import (_UNKNOWN, JOURNAL, OWNER_FILE, PREVIOUS_SUFFIX, STAGING_PREFIX,
                       _commit_lock, _drop_kept, _journals, _keep, _look, _manifest_run,
                       _redacted, _remove, _undo, sweep_stale)

#: what callers of this module use from the two below it (the run's outputs are its interface)
__all__ = ["JOURNAL", "OWNER_FILE", "PARTIAL_SUFFIX", "PREVIOUS_SUFFIX", "PROBE_PREFIX",
           "STAGING_PREFIX", "OutputError", "RunFailed", "RunOutputs", "check_output_format",
           "check_outputs", "location", "preflight", "real_path", "sweep_stale", "verify"]


# --------------------------------------------------------------------------- checks
_GLOB_CHARS = "*?["
PROBE_PREFIX = ".ldp-beam-probe-"
# bytes kept free below PC_PATH_MAX for what the run and Beam write inside the staging folder
# (``_tally.jsonl``, ``beam-temp-NAME-UUID/UUID``, ...)
STAGING_RESERVE = 128
_DEFAULT_OPTIONS = {"reports": "--output", "estimate": "--output", "release": "--output",
                    "dead_letter": "--dead-letter", "curator": "--side-outputs",
                    "manifest": "--output"}


def _is_glob(path: str) -> bool:
    return any(c in path for c in _GLOB_CHARS)


def _real_pattern(pattern: str) -> str:
    """A local glob with its fixed folders resolved as :func:`real_path` does (the wildcard
    components kept as they are)."""
    parts = pattern.split(os.sep)
    i = next(k for k, c in enumerate(parts) if _is_glob(c))
    fixed = os.sep.join(parts[:i]) or (os.sep if pattern.startswith(os.sep) else ".")
    return os.path.join(os.path.realpath(fixed), *parts[i:])


def _glob_match(path: str, pattern: str) -> bool:
    """Whether ``glob.glob(pattern)`` would name ``path`` (both real paths): component by
    component, a wildcard never crossing a ``/`` nor matching a leading ``.``."""
    a, b = path.split(os.sep), pattern.split(os.sep)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if not _is_glob(y):
            if x != y:
                return False
        elif (x.startswith(".") and not y.startswith(".")) or not fnmatch.fnmatchcase(x, y):
            return False
    return True


def _file_id(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the regular file at ``path`` (links followed), else None."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


class _Inputs:
    """The local inputs of a run as the file system sees them: every real path an input names
    (the path or pattern itself, a glob's matches, each file of a folder, recursively), the
    (st_dev, st_ino) of each of those files (so a hard link to an input is the input too), and
    each glob pattern with its folders resolved (a file created later may match it)."""

    def __init__(self, inputs: Iterable[str]) -> None:
        self.reals: dict[str, str] = {}                   # real path -> input as given
        self.ids: dict[tuple[int, int], tuple[str, str]] = {}  # id -> (real path, input)
        self.globs: list[tuple[str, str]] = []            # (real pattern, input)
        for pat in inputs:
            if not pat or ("://" in pat and not pat.startswith("file://")):
                continue
            p = _local(pat)
            self.reals.setdefault(real_path(p), pat)
            matches = [p] if os.path.lexists(p) else []
            if _is_glob(p):
                self.globs.append((_real_pattern(p), pat))
                matches += glob.glob(p)
            for m in matches:
                self._add(m, pat)
                if m == p and os.path.isdir(m):  # a folder named outright: read recursively
                    for d, _dirs, names in os.walk(m):
                        for n in names:
                            self._add(os.path.join(d, n), pat)

    def _add(self, path: str, src: str) -> None:
        real = real_path(path)
        self.reals.setdefault(real, src)
        fid = _file_id(path)
        if fid is not None:
            self.ids.setdefault(fid, (real, src))

    def overlap(self, real: str) -> str | None:
        """Why the local real path ``real`` (an output, or a file the run writes beside one) is
        an input, or None."""
        for src, given in self.reals.items():
            if real == src:
                return f"it is an input ({given}, {src})"
            if real.startswith(src.rstrip(os.sep) + os.sep):
                return f"it is inside an input folder ({given}, {src})"
        for pattern, given in self.globs:
            if _glob_match(real, pattern):
                return f"it is an input: the input pattern {given} names it"
        fid = _file_id(real)
        if fid is not None and fid in self.ids:
            src, given = self.ids[fid]
            return f"it is an input: the same file as {src} (a hard link; input {given})"
        if os.path.isdir(real):
            for src, given in self.reals.items():
                if src.startswith(real.rstrip(os.sep) + os.sep):
                    return f"it is a folder holding the input {src} ({given})"
        return None


def _option(role: str, labels: Mapping[str, str] | None) -> str:
    return (labels or {}).get(role) or _DEFAULT_OPTIONS.get(role) or f"the {role} output"


def _who(role: str, given: str, real: str, labels: Mapping[str, str] | None) -> str:
    """How a refusal names an output: the option, the path as given, the role, and the real
    path when it differs from the path as given."""
    noun = "the manifest" if role == "manifest" else f"the {role.replace('_', ' ')} output"
    if "://" in given and not given.startswith("file://"):
        return f"{_option(role, labels)} {location(given)} ({noun})"
    really = "" if real == os.path.abspath(_local(given)) else f", really {_long(real)}"
    return f"{_option(role, labels)} {_long(given)} ({noun}{really})"


def _long(path: str) -> str:
    """A path for a one-line message: whole unless it is very long."""
    return path if len(path) <= 320 else f"{path[:150]}...{path[-150:]}"


def _url_overlap(out: str, src: str) -> str | None:
    """'is' / 'inside' when the URL ``out`` is the URL input ``src`` (a file, a prefix or a
    glob) or lies below it, else None."""
    if _is_glob(src):
        return "inside" if fnmatch.fnmatchcase(out, src) or fnmatch.fnmatchcase(
            out, src.rstrip("/") + "/**") else None
    if out.rstrip("/") == src.rstrip("/"):
        return "is"
    return "inside" if out.startswith(src.rstrip("/") + "/") else None


def _same_table(a: str, b: str) -> bool:
    from ldp_beam.transforms.sources import parse_settings, redact  # lazy: Beam (see location())

    try:
        base_a, set_a, _ = parse_settings(a)
        base_b, set_b, _ = parse_settings(b)
    except Exception:  # noqa: BLE001 - not a table URL the readers know
        return False
    return redact(base_a) == redact(base_b) and bool(set_a.get("table")) and \
        set_a.get("table") == set_b.get("table")


def check_outputs(outputs: Mapping[str, str], inputs: Iterable[str], force: bool,
                  flags: Sequence[str] = (), *, labels: Mapping[str, str] | None = None,
                  extra: Mapping[str, Iterable[str]] | None = None) -> None:
    """Refuse outputs that would overwrite or land inside an input, collide, name a folder, or
    already exist (unless ``force``): local paths, Beam FileSystems URLs and database tables
    alike.

    ``outputs`` maps a role to its path as given (the manifest under the role ``"manifest"``);
    a local path is judged as the module docstring says. ``labels`` maps a role to the option
    that set it (messages name it; default ``--output``, ``--dead-letter``, ...); ``extra`` maps
    a role to further local real paths the run writes for it (its temporary files, the staging
    folder), checked against the inputs the same way."""
    inputs = [i for i in inputs if i]
    ins = _Inputs(inputs)
    url_ins = [i for i in inputs if is_url(i)]
    table_ins = [i for i in inputs if is_table_url(i)]
    seen: dict[str, str] = {}
    reals: dict[str, str] = {}
    for role, path in outputs.items():
        real = location(path) if "://" in path and not path.startswith("file://") \
            else real_path(path)
        reals[role] = real
        who = _who(role, path, real, labels)
        never = (": a run never writes over what it reads; choose another "
                 f"{_option(role, labels)}")
        if real in seen:
            raise OutputError(f"{who}: it is the same path as the {seen[real]} output; give "
                              "them different paths")
        seen[real] = role.replace("_", " ")
        if is_table_url(path):
            for src in table_ins:
                if _same_table(path, src):
                    raise OutputError(f"{who}: it is an input table{never}")
            continue
        if is_url(path):
            for src in url_ins:
                how = _url_overlap(path, src)
                if how:
                    raise OutputError(f"{who}: it is {'an' if how == 'is' else 'inside an'} "
                                      f"input ({src}){never}")
            if path.endswith("/"):
                raise OutputError(f"{who}: give a file path, not a folder")
            continue
        why = ins.overlap(real)
        if why:
            raise OutputError(f"{who}: {why}{never}")
        for other in (extra or {}).get(role, ()):
            why = ins.overlap(other)
            if why:
                raise OutputError(f"{who}: the run writes {other} for it, and {why}{never}")
        if _local(path).endswith(("/", os.sep)) or os.path.isdir(real):
            raise OutputError(f"{who}: give a file path, not a folder")
    existing = []
    for role, p in outputs.items():
        if is_table_url(p):
            from ldp_beam.transforms.sinks import tidy_table_exists  # lazy: Beam (see location())

            if tidy_table_exists(p):
                existing.append(location(p))
        elif exists(reals[role], flags):
            existing.append(p if reals[role] == os.path.abspath(_local(p))
                            else f"{p} (really {reals[role]})")
    if existing and not force:
        raise OutputError(f"output {existing[0]} exists"
                          + (f" (and {len(existing) - 1} more)" if len(existing) > 1 else "")
                          + ": pass --force (force=True) to replace it; the previous outputs are "
                          "replaced only once the new run has succeeded")


def check_output_format(option: str, path: str, allowed: Sequence[str], *,
                        what: str | None = None) -> None:
    """Refuse an output whose name says another format than the one written: ``path`` must end
    in one of the ``allowed`` suffixes (``(".parquet",)``, ``(".jsonl",)``, ...; case ignored, a
    URL's ``?query`` left out), and must name a file, not a folder (a path ending in ``/`` or
    an existing directory). A database table URL is not judged here (the caller does). Raises
    :class:`OutputError` naming ``option``, ``path`` and the allowed suffixes; ``what`` says
    what is written (default: the formats the suffixes stand for)."""
    if is_table_url(path):
        return
    allowed = tuple(allowed)
    ends = " or ".join(allowed)
    kinds = list(dict.fromkeys(_FORMAT_NAMES.get(a.lower(), a) for a in allowed))
    said = what or f"this output is written as {' / '.join(kinds)}"
    local = not is_url(path)
    if path.endswith("/") or (local and (path.endswith(os.sep)
                                         or os.path.isdir(_local(path)))):
        raise OutputError(f"{option} {path}: give a file path, not a folder ({said}: a path "
                          f"ending in {ends})")
    low = path.split("?", 1)[0].lower() if not local else path.lower()
    if not low.endswith(tuple(a.lower() for a in allowed)):
        given = next((n for s, n in _FORMAT_NAMES.items() if low.endswith(s)), None)
        not_that = f", not {given}" if given and given not in kinds and not what else ""
        raise OutputError(f"{option} {path}: {said}{not_that}; give a path ending in {ends}")


_FORMAT_NAMES = {".parquet": "Parquet", ".pq": "Parquet", ".csv": "CSV", ".json": "JSON",
                 ".jsonl": "JSON lines", ".csv.gz": "CSV"}


# --------------------------------------------------------------------------- preflight
def _limits(folder: str) -> tuple[int, int]:
    """(PC_NAME_MAX, PC_PATH_MAX) of the file system holding ``folder`` (255 and 4096 when the
    system does not say; no limit when it says -1)."""
    out = []
    for key, default in (("PC_NAME_MAX", 255), ("PC_PATH_MAX", 4096)):
        try:
            v = os.pathconf(folder, key)
        except (OSError, ValueError):
            v = default
        out.append(v if v and v > 0 else (1 << 31))
    return out[0], out[1]


def _nearest_existing(folder: str) -> tuple[str, list[str]]:
    """The nearest existing ancestor of the real folder ``folder`` (itself when it exists) and
    the folders below it that a run would create, top down."""
    missing = []
    d = folder
    while not os.path.lexists(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        missing.append(d)
        d = parent
    return d, missing[::-1]


def _short(name: str) -> str:
    return name if len(name) <= 64 else f"{name[:30]}...{name[-30:]}"


def _probe(folder: str) -> None:
    """Create then remove an empty file in ``folder``: the only test a write will succeed
    (``os.access`` says yes to root even where a write fails: an immutable folder, a read-only
    or special file system, a root-squashed NFS export)."""
    for _ in range(3):
        probe = os.path.join(folder, PROBE_PREFIX + uuid.uuid4().hex[:12])
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        _unlink_quiet(probe)
        return


def preflight(targets: Iterable[tuple[str, str, str, Sequence[str]]],
              labels: Mapping[str, str] | None = None) -> None:
    """Check, before anything runs, that every local file the run will write can be written.

    ``targets``: (role, path as given, real path, names the run writes in its folder: its own
    name first, then ``NAME.tmp``, ``NAME.ldp-beam-partial``, a staging folder, ``FOLDER/NAME``
    for a file inside it). The folder must exist or be creatable (no component of it is an
    existing file); every name must fit the file system's ``PC_NAME_MAX`` and every path its
    ``PC_PATH_MAX`` (the outputs' own names are judged before the names written beside them);
    the nearest existing folder must be writable: ``os.access``, then :func:`_probe`. Raises
    one :class:`OutputError` per refusal, naming the option, the path and what is wrong."""
    targets = list(targets)
    found = []
    for role, given, real, names in targets:
        who = _who(role, given, real, labels)
        folder = os.path.dirname(real)
        anc, missing = _nearest_existing(folder)
        if not os.path.isdir(anc):
            raise OutputError(f"{who}: {anc} is a file, not a folder, so nothing can be written "
                              f"in {folder}; choose another {_option(role, labels)}")
        name_max, path_max = _limits(anc)
        for sub in missing:
            base = os.path.basename(sub)
            if len(os.fsencode(base)) > name_max:
                raise OutputError(f"{who}: the folder name {_short(base)} is "
                                  f"{len(os.fsencode(base))} bytes, more than the {name_max} a "
                                  "name may have on this file system (PC_NAME_MAX); choose a "
                                  f"shorter {_option(role, labels)}")
        found.append((role, who, folder, anc, name_max, path_max, list(names)))
    for first in (True, False):
        for role, who, folder, anc, name_max, path_max, names in found:
            for name in names[:1] if first else names[1:]:
                # a name may hold a "/": a file the run writes in a folder it makes
                for part in name.split("/"):
                    n = len(os.fsencode(part))
                    if n > name_max:
                        what = "its name" if first else \
                            f"the name {_short(part)}, which the run writes in {folder},"
                        raise OutputError(f"{who}: {what} is {n} bytes, more than the "
                                          f"{name_max} a name may have on this file system "
                                          f"(PC_NAME_MAX); choose a shorter "
                                          f"{_option(role, labels)}")
                full = os.path.join(folder, name)
                if len(os.fsencode(full)) + 1 > path_max:
                    raise OutputError(f"{who}: the path {_short(full)} is "
                                      f"{len(os.fsencode(full))} bytes, more than this file "
                                      f"system allows (PC_PATH_MAX {path_max}, with its final "
                                      "NUL); choose a shorter path")
    probed: set[str] = set()
    for role, who, folder, anc, *_ in found:
        if anc in probed:
            continue
        if not os.access(anc, os.W_OK | os.X_OK):
            raise OutputError(f"{who}: the folder {anc} is not writable by this user (uid "
                              f"{os.geteuid()}); choose another {_option(role, labels)}")
        try:
            _probe(anc)
        except OSError as exc:
            raise OutputError(f"{who}: cannot create a file in the folder {anc}: "
                              f"{_reason(exc)}; choose another {_option(role, labels)}") from None
        probed.add(anc)


# --------------------------------------------------------------------------- the run's outputs
class RunOutputs:
    """Stage a run's outputs and commit them together (see the module docstring).

    ``outputs`` maps a role ("reports", "dead_letter", "estimate", ...) to its final path, URL
    or database table; ``manifest`` is the final path or URL of the manifest (written last; the
    staging folder is beside it). ``options``: the run's Beam arguments (``--s3_endpoint_url``
    and the other object-store settings are taken from them). Use as a context manager: leaving
    it without :meth:`commit` (an error, an interrupt) discards the staged files.
    """

    def __init__(self, outputs: Mapping[str, str], manifest: str, run_id: str,
                 inputs: Iterable[str] = (), force: bool = False,
                 options: Iterable[str] = (), *,
                 labels: Mapping[str, str] | None = None) -> None:
        # lazy: Beam, 1.2 s at import (measured; see location())
        from ldp_beam.transforms.io import beam_flags, check_object_store

        self.given = dict(outputs)  # the paths as the caller gave them (messages name them)
        self.run_id = run_id
        self.force = force
        self.labels = dict(labels or {})
        self.flags = tuple(beam_flags(list(options)))
        self.committed = False
        self.published: list[str] = []  # roles moved into place by commit ("manifest" last)
        self.manifest_removed = False  # whether commit set the previous manifest aside
        self.rollback_problems: list[str] = []  # what a failed commit could not put back
        self.visible: list[str] = []  # roles a failed commit may have shown readers (new)
        self._started: list[str] = []  # roles the commit began to move or write into place
        self._before: dict[str, Any] = {}  # how each final location looked before the commit
        self._made: list[str] = []  # local folders this run created (removed if left empty)
        self._staging_made = False
        self._owner_fd: int | None = None  # the staging folder's owner file, locked (flock)
        if is_table_url(manifest):
            raise OutputError(f"the manifest {location(manifest)!r} must be a file path or "
                              "URL, not a database table")
        for p in [manifest, *self.given.values()]:
            # reachable, credentials, bucket: before anything runs
            if p.startswith(("s3://", "gs://")):
                check_object_store(p, self.flags)
        # every local path as the file system resolves it, used for the checks AND the writes
        self.outputs = {role: real_path(p) for role, p in self.given.items()}
        self.manifest = real_path(manifest)
        self.folder = _parent(self.manifest)
        self.staging = _join(self.folder, STAGING_PREFIX + run_id)
        self.remote = is_url(self.staging)
        local = {role: p for role, p in self.outputs.items() if "://" not in p}
        extra = {role: [p + ".tmp", p + PARTIAL_SUFFIX, p + PREVIOUS_SUFFIX]
                 for role, p in local.items()}
        if not self.remote:
            extra["manifest"] = [self.manifest + ".tmp", self.manifest + PARTIAL_SUFFIX,
                                 self.manifest + PREVIOUS_SUFFIX, self.staging]
        # a dead run's commit in this folder is settled first: its outputs are rolled back
        # (or its commit finished) before this run looks at what exists
        sweep_stale(self.folder, self.flags, urls={
            redact(p): p for p in self.outputs.values() if is_table_url(p)})
        check_outputs({**self.given, "manifest": manifest}, inputs, force, self.flags,
                      labels=self.labels, extra=extra)
        targets = [(role, self.given[role], p, _beside(p)) for role, p in local.items()]
        if not self.remote:
            inside = [f"{os.path.basename(self.staging)}/{os.path.basename(self.staged(r))}.tmp"
                      for r in self.outputs] + [os.path.basename(self.staging) + "/" + n
                                                for n in (OWNER_FILE, "_manifest.json.tmp",
                                                          JOURNAL)]
            targets.append(("manifest", manifest, self.manifest,
                            [*_beside(self.manifest), os.path.basename(self.staging), *inside]))
        preflight(targets, self.labels)
        if not self.remote:  # room for what Beam writes inside the staging folder
            _, path_max = _limits(_nearest_existing(self.folder)[0])
            if len(os.fsencode(self.staging)) + 1 + STAGING_RESERVE + 1 > path_max:
                raise OutputError(
                    f"{_who('manifest', manifest, self.manifest, self.labels)}: its folder's "
                    f"path is too long for the run's staging folder {_short(self.staging)} and "
                    f"the files in it (PC_PATH_MAX {path_max}); choose a shorter path")

    def __enter__(self) -> "RunOutputs":
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "run_id": self.run_id}
        if self.remote:
            owner = json.dumps(owner).encode()
            try:
                write_bytes(_join(self.staging, OWNER_FILE), owner, self.flags)
            except OSError as exc:  # Beam's BeamIOError is one
                self.discard()
                raise OutputError(f"creating the staging folder {self.staging} failed: "
                                  f"{_reason(exc)}; nothing ran and nothing was written (the "
                                  "previous outputs are untouched)") from None
            return self
        step = "creating the folder"
        try:
            self._makedirs(self.folder)
            step = "creating the staging folder"
            os.makedirs(self.staging)
            self._staging_made = True
            # held for the run's life: a sweep by another run tells a live owner from a dead
            # one by this lock, not by a process id that may have been reused
            self._owner_fd = os.open(os.path.join(self.staging, OWNER_FILE),
                                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fcntl.flock(self._owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                owner["flock"] = True
            except OSError:  # a file system without locks: the process id is judged
                pass
            os.write(self._owner_fd, json.dumps(owner).encode())
        except OSError as exc:
            path = exc.filename or self.staging
            self._cleanup()
            raise OutputError(f"{step} {path} failed: {_reason(exc)}; nothing ran and nothing "
                              "was written (the previous outputs are untouched)") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.discard()

    def _makedirs(self, folder: str) -> None:
        """``os.makedirs(folder)``, remembering the folders it creates (a run that does not
        commit removes them again when they are empty)."""
        self._made += [d for d in _nearest_existing(folder)[1] if d not in self._made]
        os.makedirs(folder, exist_ok=True)  # (one that fails half way: its part is removed)

    def _cleanup(self) -> None:
        """Remove what this run created locally and did not commit: its staging folder (only
        when it made it: a folder of the same name is another run's) and the folders it created
        that are still empty."""
        if self._staging_made:
            shutil.rmtree(self.staging, ignore_errors=True)
            self._staging_made = False
        self._release_owner()
        if not self.committed:
            for d in sorted(self._made, key=len, reverse=True):
                try:
                    os.rmdir(d)
                except OSError:
                    pass  # not empty (something was published there), or already gone
            self._made = []

    def _release_owner(self) -> None:
        if self._owner_fd is not None:
            os.close(self._owner_fd)  # drops the staging folder's lock
            self._owner_fd = None

    def discard(self) -> None:
        """Remove the staging folder and everything in it (and, when the run did not commit,
        the local folders it created that are still empty)."""
        if self.rollback_problems:  # the journal stays for the next run to finish the rollback
            self._release_owner()
            return
        if self.remote:
            try:
                _delete([p for p, _ in _listing(self.staging + "/**", self.flags)], self.flags)
            except Exception as exc:  # noqa: BLE001 - the next run in this folder sweeps it
                logging.getLogger(__name__).warning(
                    "could not remove the staging folder %s (%s); the next run there removes "
                    "it", self.staging, exc)
        self._cleanup()

    def staged(self, role: str) -> str:
        """Where the pipeline writes output ``role`` (inside the staging folder; a database
        table is staged as a Parquet file of its rows)."""
        final = self.outputs[role]
        return _join(self.staging, role + (".parquet" if is_table_url(final)
                                           else _suffix(final)))

    def scratch(self, name: str) -> str:
        """A staging path for an intermediate file (never committed)."""
        return _join(self.staging, "_" + name)

    def location(self, role: str) -> str:
        return location(self.outputs[role])

    def digest(self, role: str) -> dict:
        """Size and SHA-256 of the staged output ``role``."""
        return file_digest(self.staged(role), self.flags)

    # reading and writing staged files (local, or through Beam's FileSystems)
    def exists(self, path: str) -> bool:
        return exists(path, self.flags)

    def open(self, path: str):
        return open_read(path, self.flags)

    def open_text(self, path: str):
        return io.TextIOWrapper(open_read(path, self.flags), encoding="utf-8")

    def write(self, path: str, data: bytes) -> None:
        write_bytes(path, data, self.flags)

    def write_json(self, path: str, obj: Any) -> None:
        write_bytes(path, json_bytes(obj), self.flags)

    def read_json_lines(self, path: str) -> list[dict]:
        return read_json_lines(path, self.flags)

    def count_lines(self, path: str) -> int:
        return count_lines(path, self.flags)

    def commit(self, manifest: dict) -> dict:
        """Move every staged output into place, then write ``manifest`` (with the run id and the
        files it covers) last. Returns the manifest as written.

        Without ``force``, an output or manifest that exists at its final place now (created
        while the run ran: another run on the same outputs committed first) refuses the commit
        with an :class:`OutputError` before anything is changed. A local manifest's commits take
        turns through a ``flock`` on ``MANIFEST.lock`` (see :func:`.rollback._commit_lock`); one
        held by another run refuses this commit, nothing changed. An ``s3://`` manifest's lock
        is an object created only if absent; a ``gs://`` manifest has none, only the check
        again.

        All or nothing: before the first change, the commit writes its journal (``_commit.json``
        in the staging folder: each change and where the previous version is kept) and keeps
        every previous version (an output file as ``NAME.ldp-beam-previous``, locally a hard
        link; the manifest renamed so; a database table kept as ``T__ldp_beam_previous`` in the
        transaction that writes the new one). A failure on the way puts every previous version
        back (:func:`.rollback._undo`) before raising; a process killed during the commit is
        rolled back (or, when its manifest was written, finished) by the next run that stages
        in the manifest's folder (:func:`.rollback.recover_commit`). Once the manifest is
        written the kept versions are removed.

        :attr:`published` lists the roles that were moved into place (``"manifest"`` last, once
        the commit is complete): an output listed there was visible to readers, for a moment
        when the commit then failed and was rolled back. :attr:`manifest_removed` says whether
        the previous manifest was set aside. A failure is raised as one :class:`OutputError`
        saying what failed on which path and in which state it left the outputs (also in its
        ``published`` attribute); when the rollback itself fails, :attr:`rollback_problems`
        names what could not be put back and the staging folder (with the journal) is left for
        the next run to finish the rollback."""
        self.published, self.manifest_removed, self.rollback_problems = [], False, []
        self.visible, self._started, self._before = [], [], {}
        step = ["reading the staged outputs in", self.staging]
        try:
            with _commit_lock(self.manifest, self.run_id, step, self._makedirs, self.flags):
                return self._commit(manifest, step)
        except (OSError, LdpBeamError) as exc:
            err = OutputError(self._failure(step, exc))
            err.published = list(self.published)
            raise err from exc
        finally:
            if not self.committed and not self.rollback_problems:
                self.discard()

    def _failure(self, step: list[str], exc: BaseException) -> str:
        what, path = step
        reason = _reason(exc) if isinstance(exc, OSError) else str(exc)
        if self.rollback_problems:
            state = (f"rolling back failed ({'; '.join(self.rollback_problems)}); no manifest "
                     f"vouches for the outputs; the commit's journal is kept in {self.staging} "
                     "and the next run that stages in this folder finishes the rollback")
        elif self.visible:
            state = (f"rolled back: every output and the manifest are as before the commit "
                     f"(the new {', '.join(self.visible)} were in place for a moment)")
        elif self.manifest_removed or self._started:
            state = ("rolled back: nothing new was published; the previous outputs and manifest "
                     "are as they were")
        else:
            state = "nothing was published; the previous outputs and manifest are untouched"
        if isinstance(exc, OutputError) and not self.manifest_removed and not self._started:
            return str(exc)  # refused by a check, before anything changed: its own words
        return f"commit failed {what} {path}: {reason}; {state}"

    def _commit(self, manifest: dict, step: list[str]) -> dict:
        files = {}
        tables = {}
        for role, final in self.outputs.items():
            staged = self.staged(role)
            step[:] = [f"reading the staged {role} output", staged]
            if not self.exists(staged):
                raise OutputError(f"the run produced no {role} output ({staged}): not committed")
            if is_table_url(final):
                # lazy: pyarrow.parquet costs 41 ms at import (measured); the CLI imports this
                # module for every command, --help and `ledger` included
                import pyarrow.parquet as pq

                with self.open(staged) as fh:
                    tables[role] = pq.read_table(fh)
                files[role] = {"table": location(final), "rows": tables[role].num_rows}
            else:
                files[role] = {"path": location(final), **self.digest(role)}
        if not self.force:  # a table created since the run started is not replaced unasked
            from ldp_beam.transforms.sinks import tidy_table_exists  # lazy: Beam (see location())

            for role in tables:
                if tidy_table_exists(self.outputs[role]):
                    raise OutputError(f"output {location(self.outputs[role])!r} was created "
                                      "while the run ran: pass --force (force=True) to replace "
                                      "it; nothing was committed")
            # nor a file or the manifest: another run on the same outputs committed first
            # (checked under the commit lock, before the previous manifest is touched)
            for role, final in [*((r, f) for r, f in self.outputs.items() if r not in tables),
                                ("manifest", self.manifest)]:
                step[:] = [f"checking the {role} output" if role != "manifest"
                           else "checking the manifest", final]
                if exists(final, self.flags):
                    what = ("the manifest" if role == "manifest"
                            else f"the {role.replace('_', ' ')} output")
                    raise OutputError(f"{what} {location(final)!r} was created while the run "
                                      "ran (another run on the same outputs committed first): "
                                      "pass --force (force=True) to replace it; nothing was "
                                      "committed")
        manifest = {"run_id": self.run_id, **manifest, "files": files}
        step[:] = ["looking for an unsettled commit in", self.folder]
        for other in _journals(self.folder, self.flags, self.staging):
            raise OutputError(
                f"an earlier run's commit in this folder is not settled (its journal {other}: "
                "its process died during the commit and its rollback could not finish, or a "
                "run on another host is committing): nothing was committed; the warning "
                "logged when this run started says what is missing; run again once it is "
                "settled")
        plan = self._plan(files, step)
        journal = self.scratch(JOURNAL[1:])
        step[:] = ["writing the commit's journal", journal]
        self.write_json(journal, {"run_id": self.run_id, "manifest": self.manifest,
                                  "replaces": _manifest_run(self.manifest, self.flags),
                                  "changes": [_redacted(c) for c in plan]})
        try:
            self._apply(plan, tables, manifest, step)
        except BaseException:
            self.visible = self._shown(plan)
            self.rollback_problems = _undo(plan, self.flags, self.run_id)
            raise
        self.committed = True
        for problem in _drop_kept(plan, self.flags):
            logging.getLogger(__name__).warning(
                "run %s is committed, but a previous version kept during its commit could not "
                "be removed: %s", self.run_id, problem)
        self.discard()
        return manifest

    def _plan(self, files: Mapping[str, dict], step: list[str]) -> list[dict]:
        """What the commit changes, the manifest first, each with where its previous version is
        kept and whether there is one. A kept version left by an earlier commit (one that could
        not be removed) is removed first, so every kept version a rollback finds is this
        commit's."""
        plan = []
        for role, final in [("manifest", self.manifest), *self.outputs.items()]:
            if is_table_url(final):
                # lazy: Beam (see location()); a republished release commits without a pipeline
                from ldp_beam.transforms.sinks import drop_tidy, previous_table, tidy_table_exists

                keep = previous_table(final)
                step[:] = [f"checking the {role} table", location(final)]
                drop_tidy(final, keep)
                self._before[role] = _look(final, self.flags)  # once an old kept one is gone
                plan.append({"role": role, "table": final, "keep": keep,
                             "previous": tidy_table_exists(final)})
                continue
            self._before[role] = _look(final, self.flags)
            keep = final + PREVIOUS_SUFFIX
            step[:] = ["removing an earlier commit's kept version", keep]
            _remove(keep, self.flags)
            _remove(keep + PARTIAL_SUFFIX, self.flags)
            step[:] = [f"checking the {role} output", final]
            plan.append({"role": role, "path": final, "keep": keep,
                         "previous": exists(final, self.flags),
                         "sha256": files.get(role, {}).get("sha256")})
        return plan

    def _shown(self, plan: Sequence[dict]) -> list[str]:
        """The roles a failed commit may have shown readers in a new version, looked at before
        the rollback: those it moved into place (:attr:`published`), and those it began to move
        or write whose final location now holds something else than before the commit or
        cannot be told (a move can land its file and still raise: on an object store a rename
        copies, then deletes the staged object, and that delete can fail)."""
        where = {c["role"]: c.get("table") or c["path"] for c in plan}
        shown = []
        for role in self._started:
            if role in self.published:
                shown.append(role)
                continue
            now, was = _look(where[role], self.flags), self._before.get(role, _UNKNOWN)
            if now is not None and (now is _UNKNOWN or was is _UNKNOWN or now != was):
                shown.append(role)
        return shown

    def _apply(self, plan: list[dict], tables: Mapping[str, Any], manifest: dict,
               step: list[str]) -> None:
        head, *changes = plan
        if head["previous"]:  # from here no manifest vouches for a mixture
            step[:] = ["setting the previous manifest aside", self.manifest]
            _move(self.manifest, head["keep"], self.flags)
            self.manifest_removed = True
        for c in changes:
            role = c["role"]
            self._started.append(role)
            if "table" in c:  # replaced in one transaction, the previous table renamed
                from ldp_beam.transforms.sinks import write_tidy  # lazy: Beam (see _plan)

                step[:] = [f"writing the {role} table", location(c["table"])]
                write_tidy(tables[role], c["table"], mode="replace",
                           keep=c["keep"] if c["previous"] else None)
            else:
                final = c["path"]
                if c["previous"]:
                    step[:] = [f"keeping the previous {role} output as", c["keep"]]
                    _keep(final, c["keep"], self.flags)
                step[:] = [f"moving the {role} output into place at", final]
                if not is_url(final):
                    self._makedirs(os.path.dirname(final))
                _move(self.staged(role), final, self.flags)
            self.published.append(role)
        tmp = self.scratch("manifest.json")
        step[:] = ["writing the manifest", self.manifest]
        write_bytes(tmp, json_bytes(manifest), self.flags)
        if not is_url(self.manifest):
            self._makedirs(os.path.dirname(self.manifest))
        self._started.append("manifest")
        _move(tmp, self.manifest, self.flags)
        self.published.append("manifest")


def _beside(real: str) -> list[str]:
    """The names the run writes in a local output's folder: its own, then its temporary file
    and the partial copy a move across file systems makes."""
    base = os.path.basename(real)
    return [base, base + ".tmp", base + PARTIAL_SUFFIX, base + PREVIOUS_SUFFIX]


def _suffix(path: str) -> str:
    base = os.path.basename(path.rstrip("/"))
    for ext in (".deadletter.jsonl", ".jsonl", ".json", ".parquet", ".csv"):
        if base.endswith(ext):
            return ext
    return os.path.splitext(base)[1]
