"""Files, objects and tables a run writes, wherever they are: the few operations the outputs
and their commit need, each the same for a local path and a Beam FileSystems URL (``s3://``,
``gs://``): what a path is (:func:`is_url`, :func:`is_table_url`, :func:`real_path`,
:func:`location`), whether it exists, reading, writing whole (:func:`write_bytes`), moving into
place (:func:`_move`), deleting, listing, digesting, and reading and verifying a manifest. The
errors a run's outputs raise (:class:`OutputError`, :class:`RunFailed`) live here too.
:mod:`.outputs` checks and commits a run's outputs with them; :mod:`.rollback` undoes a commit.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
from typing import Sequence

from ldp_beam.errors import LdpBeamError

TABLE_SCHEMES = ("duckdb", "postgresql", "postgres")
PARTIAL_SUFFIX = ".ldp-beam-partial"


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


def real_path(path: str) -> str:
    """The path the file system will use for a local ``path`` (URLs and tables: as given).

    ``os.path.realpath`` of the path as given, never ``abspath`` first: ``abspath`` collapses
    ``lnk/..`` as text, while the kernel follows the link ``lnk`` and then goes up from its
    target. Each existing component is resolved (a symlink followed before a ``..`` after it is
    applied); the part that does not exist yet is appended to its existing parent's real path.
    """
    if "://" in path and not path.startswith("file://"):
        return path
    return os.path.realpath(_local(path))


def location(path: str) -> str:
    """How manifests and messages name an output: a local path made absolute, a URL as given (a
    database URL without its password)."""
    if is_table_url(path):
        # lazy: Beam (ldp_beam.transforms) costs 1.2 s at import (measured); the CLI imports this
        # module for every command, --help and `ledger` included
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
    from ldp_beam.transforms.io import _filesystem  # lazy: Beam (see location())

    return _filesystem(path, flags)


def exists(path: str, flags: Sequence[str] = ()) -> bool:
    """Whether a file or object exists (local paths, or any Beam FileSystems URL)."""
    if is_url(path):
        return _fs(path, flags).exists(path)
    return os.path.lexists(_local(path))


def open_read(path: str, flags: Sequence[str] = ()):
    """A binary file object reading ``path`` (local, or through Beam's FileSystems)."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes  # lazy: Beam (see location())

        return _fs(path, flags).open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return open(_local(path), "rb")


def open_write(path: str, flags: Sequence[str] = ()):
    """A binary file object writing ``path`` (local: parent folders created; a URL: through
    Beam's FileSystems, the object appearing whole when the file is closed)."""
    if is_url(path):
        from apache_beam.io.filesystem import CompressionTypes  # lazy: Beam (see location())

        return _fs(path, flags).create(path, compression_type=CompressionTypes.UNCOMPRESSED)
    os.makedirs(os.path.dirname(os.path.abspath(_local(path))), exist_ok=True)
    return open(_local(path), "wb")


def write_bytes(path: str, data: bytes, flags: Sequence[str] = ()) -> None:
    """Write ``data`` to ``path`` whole: locally through a temporary file replaced atomically
    (after fsync), on an object store as one object. A failure leaves no temporary file."""
    if is_url(path):
        with open_write(path, flags) as fh:
            fh.write(data)
        return
    path = _local(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with _partial(path, ".tmp") as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


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


def _reason(exc: OSError) -> str:
    why = exc.strerror or str(exc) or type(exc).__name__
    return f"{why} ({type(exc).__name__})"


def file_digest(path: str, flags: Sequence[str] = ()) -> dict:
    """``{"bytes", "sha256"}`` of a file (local, or read through Beam's FileSystems)."""
    h = hashlib.sha256()
    n = 0
    with open_read(path, flags) as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


def _move(src: str, dst: str, flags: Sequence[str] = ()) -> None:
    """Put the staged file ``src`` at ``dst``, replacing it: ``os.replace`` locally (across
    devices, a copy beside the target, ``DST.ldp-beam-partial``, then a replace),
    ``FileSystems.rename`` within one file system, a streamed copy then a delete between two.
    A failure leaves no partial copy; the staged file is left to the staging folder's removal
    once it is in place."""
    if not is_url(src) and not is_url(dst):
        src, dst = _local(src), _local(dst)
        os.makedirs(os.path.dirname(os.path.abspath(dst)) or ".", exist_ok=True)
        try:
            os.replace(src, dst)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            # another file system: copy beside the target, then replace atomically
            with _partial(dst) as tmp:
                shutil.copyfile(src, tmp)
                os.replace(tmp, dst)
            _unlink_quiet(src)
        return
    if is_url(src) and is_url(dst) and src.split("://", 1)[0] == dst.split("://", 1)[0]:
        _fs(src, flags).rename([src], [dst])
        return
    if not is_url(dst):  # local target: copy beside it, then replace atomically
        dst = _local(dst)
        os.makedirs(os.path.dirname(os.path.abspath(dst)) or ".", exist_ok=True)
        with _partial(dst) as tmp:
            with open_read(src, flags) as fi, open(tmp, "wb") as fo:
                shutil.copyfileobj(fi, fo, 1 << 22)
            os.replace(tmp, dst)
    else:
        with open_read(src, flags) as fi, open_write(dst, flags) as fo:
            shutil.copyfileobj(fi, fo, 1 << 22)
    if is_url(src):
        _delete([src], flags)
    else:
        _unlink_quiet(_local(src))


@contextlib.contextmanager
def _partial(dst: str, suffix: str = PARTIAL_SUFFIX):
    """``DST.ldp-beam-partial`` (or ``DST`` + ``suffix``): a stale one removed first (never
    written through: it may be a link), removed again if the write or the replace fails."""
    tmp = dst + suffix
    _unlink_quiet(tmp)
    try:
        yield tmp
    except BaseException:
        _unlink_quiet(tmp)
        raise


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
