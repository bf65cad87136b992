"""Commit or nothing: a run's outputs are staged, then committed together, manifest last.

A batch run (``collect``, ``estimate``, a central release) writes every output into a private
staging folder beside its manifest, ``DIR/.ldp-beam-staging-RUNID/``, on the same file system: a
local folder, or a prefix of any Beam FileSystems URL (``s3://bucket/prefix/``, ``gs://...``), in
which case the pipeline's workers write there through Beam's FileSystems and the launcher reads
the run's small intermediate results (the tally, the estimate lines) back the same way: nothing
is gathered through the launcher's local disk. Only when the pipeline has finished and its counts
check out does :meth:`RunOutputs.commit` move them into place:

1. the previous manifest is removed first, so from this point no manifest vouches for a mixture
   of old and new files;
2. every database table output (``duckdb:///FILE?table=T``, ``postgresql://...?table=T``) is
   written from its staged Parquet file, replaced in one transaction; then every staged file
   replaces its final path (locally ``os.replace``: atomic per file; on an object store Beam's
   ``FileSystems.rename``, a server-side copy then a delete: each object is replaced whole);
3. the new manifest, naming the run id and each file it covers with its size and SHA-256 (a table
   with its row count), is written last.

A reader who finds a manifest can therefore trust the files it lists (and can check them); a run
that fails or is interrupted before step 1 leaves the previous outputs and manifest untouched; one
interrupted during steps 1-3 leaves no manifest (outputs not committed, never a stale claim).
The staging folder is removed whatever happens; one left by a process killed with ``kill -9`` is
removed by the next run that stages in the same folder (its owner process is gone; on an object
store, a staging folder owned by another host is removed once it is :data:`REMOTE_STALE_SECONDS`
old, since whether that host's process lives cannot be asked).

Refused before anything runs: an output equal to or inside an input (``collect -i X -o X`` would
otherwise read a file it is replacing), two outputs at one path, and an existing output (a file,
an object, or a database table) unless the caller passes ``force`` (the CLI's ``--force``).
"""
from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
import socket
import time
from typing import Any, Iterable, Mapping, Sequence

from ldp_beam.errors import LdpBeamError

STAGING_PREFIX = ".ldp-beam-staging-"
OWNER_FILE = "OWNER"
REMOTE_STALE_SECONDS = 24 * 3600
TABLE_SCHEMES = ("duckdb", "postgresql", "postgres")


class RunFailed(LdpBeamError):
    """A run that finished but must not commit (unreadable input, counts that do not add up);
    the previous outputs are untouched. The CLI exits 1."""


class OutputError(LdpBeamError, ValueError):
    """An output that cannot be written safely (the message names the path and the option)."""


# --------------------------------------------------------------------------- paths and URLs
def is_table_url(path: str) -> bool:
    """A database table output (``duckdb:///FILE?table=T``, ``postgresql://...?table=T``)."""
    return "://" in path and path.split("://", 1)[0].lower() in TABLE_SCHEMES


def is_url(path: str) -> bool:
    """A file on a Beam FileSystems URL (``s3://``, ``gs://``, ...), not a local path nor a
    database table."""
    return "://" in path and not path.startswith("file://") and not is_table_url(path)


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(_local(path)))


def location(path: str) -> str:
    """How manifests and messages name an output: a local path made absolute, a URL as given (a
    database URL without its password)."""
    if is_table_url(path):
        from ldp_beam.transforms.sources import redact

        return redact(path)
    return path if is_url(path) else os.path.abspath(_local(path))


def _parent(path: str) -> str:
    if is_url(path):
        return path.rstrip("/").rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(_local(path)))


def _join(folder: str, name: str) -> str:
    return folder.rstrip("/") + "/" + name if is_url(folder) else os.path.join(folder, name)


def _fs(path: str, flags: Sequence[str]):
    from ldp_beam.transforms.io import _filesystem

    return _filesystem(path, flags)


def exists(path: str, flags: Sequence[str] = ()) -> bool:
    """Whether a file or object exists (local paths, or any Beam FileSystems URL)."""
    if is_url(path):
        return _fs(path, flags).exists(path)
    return os.path.lexists(_local(path))


def open_read(path: str, flags: Sequence[str] = ()):
    """A binary file object reading ``path`` (local, or through Beam's FileSystems)."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes

        return _fs(path, flags).open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return open(_local(path), "rb")


def open_write(path: str, flags: Sequence[str] = ()):
    """A binary file object writing ``path`` (local: parent folders created; a URL: through
    Beam's FileSystems, the object appearing whole when the file is closed)."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes

        return _fs(path, flags).create(path, compression_type=CompressionTypes.UNCOMPRESSED)
    os.makedirs(os.path.dirname(os.path.abspath(_local(path))), exist_ok=True)
    return open(_local(path), "wb")


def write_bytes(path: str, data: bytes, flags: Sequence[str] = ()) -> None:
    """Write ``data`` to ``path`` whole: locally through a temporary file replaced atomically
    (after fsync), on an object store as one object."""
    if is_url(path):
        with open_write(path, flags) as fh:
            fh.write(data)
        return
    path = _local(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, default=_default) + "\n").encode()


def read_json_lines(path: str, flags: Sequence[str] = ()) -> list[dict]:
    """The JSON objects of a JSON-lines file written by the pipeline (local or any URL)."""
    with open_read(path, flags) as fh:
        return [json.loads(line) for line in io.TextIOWrapper(fh, encoding="utf-8")
                if line.strip()]


def count_lines(path: str, flags: Sequence[str] = ()) -> int:
    """Non-blank lines of a file (0 when it does not exist)."""
    if not exists(path, flags):
        return 0
    with open_read(path, flags) as fh:
        return sum(1 for line in fh if line.strip())


def _listing(pattern: str, flags: Sequence[str]) -> list[tuple[str, float]]:
    """(path, last modified) of the objects matching a FileSystems glob (``**`` crosses
    folders)."""
    found = _fs(pattern, flags).match([pattern])[0].metadata_list
    return [(m.path, float(m.last_updated_in_seconds or 0.0)) for m in found]


def _delete(paths: Sequence[str], flags: Sequence[str]) -> None:
    if paths:
        _fs(paths[0], flags).delete(list(paths))


# --------------------------------------------------------------------------- checks
def input_paths(inputs: Iterable[str]) -> list[str]:
    """Every local path an input pattern names: the pattern itself (a file or folder) and its
    matches."""
    out: list[str] = []
    for pat in inputs:
        if not pat or "://" in pat:
            continue
        out.append(_real(pat))
        out += [_real(p) for p in glob.glob(pat)]
    return sorted(set(out))


def _url_overlap(out: str, src: str) -> str | None:
    """'is' / 'inside' when the URL ``out`` is the URL input ``src`` (a file, a prefix or a
    glob) or lies below it, else None."""
    import fnmatch

    if any(c in src for c in "*?["):
        return "inside" if fnmatch.fnmatchcase(out, src) or fnmatch.fnmatchcase(
            out, src.rstrip("/") + "/**") else None
    if out.rstrip("/") == src.rstrip("/"):
        return "is"
    return "inside" if out.startswith(src.rstrip("/") + "/") else None


def _same_table(a: str, b: str) -> bool:
    from ldp_beam.transforms.sources import parse_settings, redact

    try:
        base_a, set_a, _ = parse_settings(a)
        base_b, set_b, _ = parse_settings(b)
    except Exception:  # noqa: BLE001 - not a table URL the readers know
        return False
    return redact(base_a) == redact(base_b) and bool(set_a.get("table")) and \
        set_a.get("table") == set_b.get("table")


def check_outputs(outputs: Mapping[str, str], inputs: Iterable[str], force: bool,
                  flags: Sequence[str] = ()) -> None:
    """Refuse outputs that would overwrite or land inside an input, collide, or already exist
    (unless ``force``): local paths, Beam FileSystems URLs and database tables alike."""
    inputs = [i for i in inputs if i]
    ins = input_paths(inputs)
    url_ins = [i for i in inputs if is_url(i)]
    table_ins = [i for i in inputs if is_table_url(i)]
    seen: dict[str, str] = {}
    for role, path in outputs.items():
        real = location(path) if "://" in path and not path.startswith("file://") \
            else _real(path)
        if real in seen:
            raise OutputError(f"the {role} output and the {seen[real]} output are the same "
                              f"path {path!r}: give them different paths")
        seen[real] = role
        if is_table_url(path):
            for src in table_ins:
                if _same_table(path, src):
                    raise OutputError(f"the {role} output {location(path)!r} is an input table: "
                                      "a run never writes over what it reads; choose another "
                                      "--output")
            continue
        if is_url(path):
            for src in url_ins:
                how = _url_overlap(path, src)
                if how:
                    raise OutputError(f"the {role} output {path!r} is "
                                      f"{'an' if how == 'is' else 'inside an'} input ({src}): a "
                                      "run never writes over what it reads; choose another "
                                      "--output")
            continue
        for src in ins:
            if real == src or real.startswith(src.rstrip(os.sep) + os.sep):
                raise OutputError(f"the {role} output {path!r} is {'an' if real == src else 'inside an'}"
                                  f" input ({src}): a run never writes over what it reads; "
                                  "choose another --output")
            if os.path.isdir(real) and src.startswith(real.rstrip(os.sep) + os.sep):
                raise OutputError(f"the {role} output {path!r} is a folder holding the input "
                                  f"{src}; choose another --output")
    existing = []
    for p in outputs.values():
        if is_table_url(p):
            from ldp_beam.transforms.sinks import tidy_table_exists

            if tidy_table_exists(p):
                existing.append(location(p))
        elif exists(p, flags):
            existing.append(p)
    if existing and not force:
        raise OutputError(f"output {existing[0]!r} exists"
                          + (f" (and {len(existing) - 1} more)" if len(existing) > 1 else "")
                          + ": pass --force (force=True) to replace it; the previous outputs are "
                          "replaced only once the new run has succeeded")
    for p in existing:
        if "://" not in p and os.path.isdir(p) and not os.path.islink(p):
            raise OutputError(f"output {p!r} is a folder: give a file path")


# --------------------------------------------------------------------------- stale staging
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _abandoned(owner: dict, age: float, remote: bool) -> bool:
    """Whether a staging folder with this owner record and age (seconds) belongs to nobody."""
    if owner.get("host") == socket.gethostname():
        return not _pid_alive(int(owner.get("pid", -1)))
    if not owner:
        return age >= 60.0  # else just created by a run that has not written its owner yet
    return not remote or age >= REMOTE_STALE_SECONDS


def sweep_stale(folder: str, flags: Sequence[str] = ()) -> list[str]:
    """Remove staging folders in ``folder`` whose owner process on this host is gone (a run
    killed before it could clean up). Returns what was removed."""
    if is_url(folder):
        return _sweep_remote(folder, flags)
    removed = []
    for d in glob.glob(os.path.join(folder, STAGING_PREFIX + "*")):
        try:
            with open(os.path.join(d, OWNER_FILE)) as fh:
                owner = json.load(fh)
        except (OSError, ValueError):
            owner = {}
        if not _abandoned(owner, _age(d), remote=False):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _sweep_remote(folder: str, flags: Sequence[str]) -> list[str]:
    base = folder.rstrip("/") + "/"
    groups: dict[str, list[tuple[str, float]]] = {}
    for path, mtime in _listing(base + STAGING_PREFIX + "**", flags):
        name = path[len(base):].split("/", 1)[0]
        groups.setdefault(base + name, []).append((path, mtime))
    removed = []
    for d, objs in sorted(groups.items()):
        owner: dict = {}
        if any(p == d + "/" + OWNER_FILE for p, _ in objs):
            try:
                with open_read(d + "/" + OWNER_FILE, flags) as fh:
                    owner = json.loads(fh.read())
            except (OSError, ValueError):
                owner = {}
        age = time.time() - max(m for _, m in objs)
        if not _abandoned(owner, age, remote=True):
            continue
        _delete([p for p, _ in objs], flags)
        removed.append(d)
    return removed


def _age(path: str) -> float:
    try:
        return time.time() - os.stat(path).st_mtime
    except OSError:
        return 0.0


def file_digest(path: str, flags: Sequence[str] = ()) -> dict:
    """``{"bytes", "sha256"}`` of a file (local, or read through Beam's FileSystems)."""
    h = hashlib.sha256()
    n = 0
    with open_read(path, flags) as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


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
                 options: Iterable[str] = ()) -> None:
        from ldp_beam.transforms.io import beam_flags, check_object_store

        self.outputs = dict(outputs)
        self.manifest = manifest
        self.run_id = run_id
        self.force = force
        self.flags = tuple(beam_flags(list(options)))
        if is_table_url(manifest):
            raise OutputError(f"the manifest {location(manifest)!r} must be a file path or "
                              "URL, not a database table")
        for p in [manifest, *self.outputs.values()]:
            if p.startswith("s3://"):  # reachable, credentials, bucket: before anything runs
                check_object_store(p, self.flags)
        check_outputs({**self.outputs, "manifest": manifest}, inputs, force, self.flags)
        self.folder = _parent(manifest)
        self.staging = _join(self.folder, STAGING_PREFIX + run_id)
        self.remote = is_url(self.staging)
        self.committed = False

    def __enter__(self) -> "RunOutputs":
        owner = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "run_id": self.run_id}).encode()
        if self.remote:
            sweep_stale(self.folder, self.flags)
            write_bytes(_join(self.staging, OWNER_FILE), owner, self.flags)
            return self
        os.makedirs(self.folder, exist_ok=True)
        sweep_stale(self.folder)
        os.makedirs(self.staging)
        with open(os.path.join(self.staging, OWNER_FILE), "wb") as fh:
            fh.write(owner)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.discard()

    def discard(self) -> None:
        """Remove the staging folder and everything in it."""
        if not self.remote:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        try:
            _delete([p for p, _ in _listing(self.staging + "/**", self.flags)], self.flags)
        except Exception as exc:  # noqa: BLE001 - the next run in this folder sweeps it
            import logging

            logging.getLogger(__name__).warning(
                "could not remove the staging folder %s (%s); the next run there removes it",
                self.staging, exc)

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
        files it covers) last. Returns the manifest as written."""
        files = {}
        tables = {}
        for role, final in self.outputs.items():
            staged = self.staged(role)
            if not self.exists(staged):
                raise OutputError(f"the run produced no {role} output ({staged}): not committed")
            if is_table_url(final):
                import pyarrow.parquet as pq

                with self.open(staged) as fh:
                    tables[role] = pq.read_table(fh)
                files[role] = {"table": location(final), "rows": tables[role].num_rows}
            else:
                files[role] = {"path": location(final), **self.digest(role)}
        if not self.force:  # a table created since the run started is not replaced unasked
            from ldp_beam.transforms.sinks import tidy_table_exists

            for role in tables:
                if tidy_table_exists(self.outputs[role]):
                    raise OutputError(f"output {location(self.outputs[role])!r} was created "
                                      "while the run ran: pass --force (force=True) to replace "
                                      "it; nothing was committed")
        manifest = {"run_id": self.run_id, **manifest, "files": files}
        if exists(self.manifest, self.flags):  # from here no manifest vouches for a mixture
            if is_url(self.manifest):
                _delete([self.manifest], self.flags)
            else:
                os.remove(_local(self.manifest))
        for role, table in tables.items():  # each table replaced in one transaction
            from ldp_beam.transforms.sinks import write_tidy

            write_tidy(table, self.outputs[role], mode="replace")
        for role, final in self.outputs.items():
            if role not in tables:
                _move(self.staged(role), final, self.flags)
        tmp = self.scratch("manifest.json")
        write_bytes(tmp, json_bytes(manifest), self.flags)
        _move(tmp, self.manifest, self.flags)
        self.committed = True
        self.discard()
        return manifest


def _suffix(path: str) -> str:
    base = os.path.basename(path.rstrip("/"))
    for ext in (".deadletter.jsonl", ".jsonl", ".json", ".parquet", ".csv"):
        if base.endswith(ext):
            return ext
    return os.path.splitext(base)[1]


def _move(src: str, dst: str, flags: Sequence[str] = ()) -> None:
    """Put the staged file ``src`` at ``dst``, replacing it: ``os.replace`` locally (a copy
    beside the target then a replace across devices), ``FileSystems.rename`` within one file
    system, a streamed copy then a delete between two."""
    if not is_url(src) and not is_url(dst):
        src, dst = _local(src), _local(dst)
        os.makedirs(os.path.dirname(os.path.abspath(dst)) or ".", exist_ok=True)
        try:
            os.replace(src, dst)
        except OSError:  # another file system: copy beside the target, then replace atomically
            tmp = dst + ".ldp-beam-partial"
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
            os.remove(src)
        return
    if is_url(src) and is_url(dst) and src.split("://", 1)[0] == dst.split("://", 1)[0]:
        _fs(src, flags).rename([src], [dst])
        return
    if not is_url(dst):  # local target: copy beside it, then replace atomically
        dst = _local(dst)
        os.makedirs(os.path.dirname(os.path.abspath(dst)) or ".", exist_ok=True)
        tmp = dst + ".ldp-beam-partial"
        with open_read(src, flags) as fi, open(tmp, "wb") as fo:
            shutil.copyfileobj(fi, fo, 1 << 22)
        os.replace(tmp, dst)
    else:
        with open_read(src, flags) as fi, open_write(dst, flags) as fo:
            shutil.copyfileobj(fi, fo, 1 << 22)
    if is_url(src):
        _delete([src], flags)
    else:
        os.remove(_local(src))


def _default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, tuple):
        return list(x)
    return str(x)


def read_manifest(path: str, flags: Sequence[str] = ()) -> dict:
    with open_read(path, flags) as fh:
        return json.loads(fh.read())


def verify(manifest_path: str, flags: Sequence[str] = ()) -> list[str]:
    """Problems with a committed run's files (empty when every file matches its manifest;
    database tables are listed with their row count, not checked here)."""
    man = read_manifest(manifest_path, flags)
    problems = []
    for role, f in man.get("files", {}).items():
        if "path" not in f:
            continue
        if not exists(f["path"], flags):
            problems.append(f"{role}: {f['path']} is missing")
        elif file_digest(f["path"], flags) != {"bytes": f["bytes"], "sha256": f["sha256"]}:
            problems.append(f"{role}: {f['path']} differs from the manifest")
    return problems
