"""A commit's safety net: the commit lock, the journal, and undoing a commit.

:meth:`RunOutputs.commit <.outputs.RunOutputs.commit>` takes turns with other commits to the
same manifest (:func:`_commit_lock`), records its changes in a journal before the first one and
keeps every previous version (:data:`PREVIOUS_SUFFIX`; tables through ``write_tidy(keep=)``).
This module puts them back when the commit fails (:func:`_undo`), removes them when it succeeds
(:func:`_drop_kept`), and settles the commit of a run whose process died in it, from its journal
in its abandoned staging folder, when the next run sweeps the folder (:func:`sweep_stale`,
:func:`recover_commit`). See :mod:`.outputs` for the whole protocol.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import shutil
import socket
import time
from typing import Any, Mapping, Sequence

from ldp_beam.ledger import redact
from ldp_beam.locks import flocked

from .files import (OutputError, _delete, _fs, _join, _listing, _local, _move, _partial, _reason,
                    exists, file_digest, is_table_url, is_url, location, open_read,
                    read_manifest)

STAGING_PREFIX = ".ldp-beam-staging-"
OWNER_FILE = "OWNER"
REMOTE_STALE_SECONDS = 24 * 3600
#: a previous output (or manifest) kept beside its final place while a commit runs, so that a
#: commit that fails, or a process killed during one, can be rolled back (see RunOutputs.commit)
PREVIOUS_SUFFIX = ".ldp-beam-previous"
#: the commit's journal, in the staging folder: what it changes and where the previous versions
#: are kept, written before the first change
JOURNAL = "_commit.json"


# --------------------------------------------------------------------------- stale staging
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _abandoned(owner: dict, age: float) -> bool:
    """Whether a staging folder (or a commit lock file) with this owner record and age (seconds)
    belongs to nobody, judged without a lock (see :func:`_held` and :func:`_commit_lock` for
    this host's owners, whose lock tells).

    An owner on this host: abandoned when its process is gone. An owner on another host (a
    shared NFS folder, a Dask cluster, an object store): whether its process lives cannot be
    asked, so it is abandoned only once it is :data:`REMOTE_STALE_SECONDS` old, on a local and
    a remote folder alike: a live run's folder on a shared disk is never removed under it. No
    owner record yet: abandoned after a minute (a run that has just created its folder writes
    its owner next)."""
    if owner.get("host") == socket.gethostname():
        return not _pid_alive(int(owner.get("pid", -1)))
    if not owner:
        return age >= 60.0  # else just created by a run that has not written its owner yet
    return age >= REMOTE_STALE_SECONDS


def _held(path: str) -> bool:
    """Whether a live process holds a ``flock`` on ``path`` (a run's staging folder's owner
    file, locked for the run's life; the kernel drops the lock when the run dies)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return flocked(fd)
    finally:
        os.close(fd)


def sweep_stale(folder: str, flags: Sequence[str] = (),
                urls: Mapping[str, str] | None = None) -> list[str]:
    """Remove staging folders in ``folder`` whose owner process on this host is gone (a run
    killed before it could clean up: no process holds the ``flock`` the run keeps on its owner
    file, whatever process id the file names; a folder of an earlier version, without that lock:
    its pid is gone), or whose owner is on another host and which are
    :data:`REMOTE_STALE_SECONDS` old (see :func:`_abandoned`). Returns what was removed."""
    if is_url(folder):
        return _sweep_remote(folder, flags, urls)
    removed = []
    for d in glob.glob(os.path.join(folder, STAGING_PREFIX + "*")):
        owner = _read_owner(os.path.join(d, OWNER_FILE))
        if owner.get("flock") and owner.get("host") == socket.gethostname():
            gone = not _held(os.path.join(d, OWNER_FILE))  # a reused pid does not matter
        else:
            gone = _abandoned(owner, _age(d))
        if not gone or not _settled(d, flags, urls):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _settled(staging: str, flags: Sequence[str], urls: Mapping[str, str] | None) -> bool:
    """Whether an abandoned staging folder can go: its run died before committing, or the
    commit it died in is now settled (:func:`recover_commit`); else it is kept, with a warning,
    for a later run to try again."""
    problems = recover_commit(staging, flags, urls)
    if problems:
        logging.getLogger(__name__).warning(
            "the commit of the run that left %s is not settled yet (%s); its staging folder "
            "and journal are kept for the next run", staging, "; ".join(problems))
    return not problems


def _sweep_remote(folder: str, flags: Sequence[str],
                  urls: Mapping[str, str] | None = None) -> list[str]:
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
                    owner = _owner(fh.read())
            except OSError:
                pass
        age = time.time() - max(m for _, m in objs)
        if not _abandoned(owner, age) or not _settled(d, flags, urls):
            continue
        _delete([p for p, _ in objs], flags)
        removed.append(d)
    return removed


def _owner(raw: bytes) -> dict:
    """An owner record (a staging folder's ``OWNER``, a commit lock's content) from its bytes:
    ``{}`` when it is empty (not written yet), not JSON or not a JSON object."""
    try:
        held = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return held if isinstance(held, dict) else {}


def _read_owner(path: str) -> dict:
    """:func:`_owner` of a local file (``{}`` when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            return _owner(fh.read())
    except OSError:
        return {}


def _unlocked(where: str, why: str) -> None:
    logging.getLogger(__name__).warning(
        "the commit to %s is not locked (%s): two runs committing to it at the same moment are "
        "not excluded", where, why)


def _taking(lock: str, left: dict, age: float) -> None:
    """Say that the leftover commit lock ``lock`` (owner ``left``, ``age`` seconds old) is taken,
    and why: its run of this host is gone, or else its age (another host's or no owner)."""
    if left.get("host") == socket.gethostname() and age < REMOTE_STALE_SECONDS:
        why = "its process is gone"
    elif age >= 3600:
        why = f"no live owner can be seen; it is {age / 3600:.1f} hours old"
    else:
        why = f"no owner recorded; it is {age:.0f} s old"
    logging.getLogger(__name__).warning("taking the commit lock %s left by run %s (%s)", lock,
                                        left.get("run_id", "unknown"), why)


def _age(path: str) -> float:
    try:
        return time.time() - os.stat(path).st_mtime
    except OSError:
        return 0.0


@contextlib.contextmanager
def _commit_lock(manifest: str, run_id: str, step: list[str], makedirs: Any = None,
                 flags: Sequence[str] = ()):
    """Commits to one local manifest, one at a time, through ``MANIFEST.lock`` beside it: the
    commit creates it (``O_EXCL``) or opens the one there, holds an exclusive ``flock`` on it
    for its whole duration, writes its owner ``{host, pid, run_id}`` into it and removes it,
    still holding the lock, when the commit ends, whatever happens. Held: this commit is refused
    with an :class:`OutputError` naming the holder, and nothing changes.

    The kernel drops the lock when its holder dies, so a lock file that names a run of this
    host and that nobody holds was left by a killed run: it is taken, whatever process id it
    names (a reused pid does not keep it), and since it is taken by its lock, not removed and
    created again, two runs cannot both take it over. A file that names another host's run is
    taken only once it is :data:`REMOTE_STALE_SECONDS` old, and one with no owner yet only once
    it is a minute old: on a shared disk mounted without lock support (NFS ``nolock``) another
    host's lock cannot be seen. A file its holder removed between another run's open and lock
    is opened again. A rollback by :func:`recover_commit` takes the same lock.

    An ``s3://`` manifest's lock is the object ``MANIFEST.lock`` beside it, created by a
    conditional write (:func:`_object_lock`). Not locked, with a warning: another URL manifest
    (``gs://``...: Beam's FileSystems have no conditional writes) and a file system that
    refuses ``flock``. There only the check again in :meth:`RunOutputs._commit
    <.outputs.RunOutputs._commit>` (an output or manifest created while the run ran is refused
    without ``force``) guards two runs."""
    path = (manifest if is_url(manifest) else _local(manifest)) + ".lock"
    me = socket.gethostname()

    def refuse(held: dict, hint: str = "") -> OutputError:
        host = held.get("host")
        where = "" if host in (None, me) else f" on host {host}"
        return OutputError(
            f"another run ({held.get('run_id', 'not yet named')}{where}) is committing to "
            f"these outputs (manifest {location(manifest)!r}, its lock {path}): nothing was "
            f"committed; run again once it has finished (with --force to replace its "
            f"outputs){hint}")

    step[:] = ["taking the commit lock", path]
    if path.startswith("s3://"):
        with _object_lock(path, run_id, flags, refuse):
            yield
        return
    if is_url(manifest):
        _unlocked(location(manifest), "Beam's FileSystems have no conditional writes there")
        yield
        return
    (makedirs or (lambda d: os.makedirs(d, exist_ok=True)))(os.path.dirname(path))

    for _ in range(100):  # each pass but the last saw the file removed by the run it waited on
        try:
            fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(path, os.O_RDWR), False
            except FileNotFoundError:
                continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise refuse(_read_owner(path)) from None
        except OSError as exc:  # ENOLCK, EOPNOTSUPP...: a file system without locks
            os.close(fd)
            _unlocked(location(manifest), _reason(exc))
            try:
                yield
            finally:
                if created:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            return
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # locked a file its holder had removed: open the new one
    else:
        raise OutputError(f"could not take the commit lock {path}: it was removed and created "
                          "again 100 times while this run tried; nothing was committed")
    if not created:
        # this host's owner: gone, since its lock was free; another host's or none yet: by age
        left, age = _read_owner(path), _age(path)
        if left.get("host") != me and not _abandoned(left, age):
            os.close(fd)
            raise refuse(left)
        _taking(path, left, age)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"host": me, "pid": os.getpid(), "run_id": run_id}).encode())
        yield
    finally:
        try:
            os.unlink(path)  # before the unlock: a run waiting on this file opens a new one
        except OSError as exc:
            logging.getLogger(__name__).warning(
                "could not remove the commit lock %s (%s); the next commit takes it", path,
                _reason(exc))
        os.close(fd)


_CONFLICT = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


@contextlib.contextmanager
def _object_lock(url: str, run_id: str, flags: Sequence[str], refuse: Any):
    """:func:`_commit_lock` for an ``s3://`` manifest: the lock object ``url`` is created only
    if absent (``If-None-Match: *``), so of two runs one creates it and the other is refused
    with ``refuse(its owner)``; it is deleted at the end only if it is still this run's
    (``If-Match`` its ETag; on a store without conditional deletes, its ETag read first). No
    kernel can say whether an object's owner lives, so a leftover lock is taken when
    :func:`_abandoned` says so (this host's run: its process is gone; another host's: a day
    old), or once it is a day old whatever it names; taking it is a write conditional on the
    ETag read, so two runs cannot both take one stale lock. A lock whose
    owner is this very run (a retried request that had landed) is its own. An S3-compatible
    store that refuses conditional writes (``NotImplemented``) commits unlocked, with a
    warning; errors of the store refuse the commit before anything changed."""
    # lazy: optional dependency (the [s3] extra: boto3); an s3:// manifest has it
    from botocore.exceptions import BotoCoreError, ClientError
    from ldp_beam.transforms.io import s3_client  # lazy: Beam, 1.2 s at import (see location())

    bucket, _, key = url[len("s3://"):].partition("/")
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "run_id": run_id}
    body = json.dumps(owner).encode()

    def code(exc: ClientError) -> str:
        return str(exc.response.get("Error", {}).get("Code", ""))

    def put(**condition: str) -> str | None:
        """The new lock's ETag, or None when the condition failed (another run's lock)."""
        try:
            return client.put_object(Bucket=bucket, Key=key, Body=body, **condition)["ETag"]
        except ClientError as exc:
            if code(exc) in _CONFLICT:
                return None
            raise

    try:
        client = s3_client(url, flags)
        for _ in range(100):  # each pass but the last saw the lock released by its holder
            etag = put(IfNoneMatch="*")
            if etag is not None:
                break
            try:
                got = client.get_object(Bucket=bucket, Key=key)
            except ClientError as exc:
                if code(exc) in ("NoSuchKey", "404"):
                    continue
                raise
            left = _owner(got["Body"].read())
            age = time.time() - got["LastModified"].timestamp()
            if left == owner:
                etag = got["ETag"]
                break
            if not (_abandoned(left, age) or age >= REMOTE_STALE_SECONDS):
                raise refuse(left, f"; if that run is no longer running, delete {url}")
            etag = put(IfMatch=got["ETag"])
            if etag is None:  # another run took it first
                raise refuse({})
            _taking(url, left, age)
            break
        else:
            raise OutputError(f"could not take the commit lock {url}: it was released and "
                              "taken again 100 times while this run tried; nothing was committed")
    except (ClientError, BotoCoreError) as exc:
        if not isinstance(exc, ClientError) or code(exc) not in ("NotImplemented", "501"):
            raise OutputError(f"could not take the commit lock {url}: {exc}; nothing was "
                              "committed") from None
        _unlocked(url, f"the object store refuses conditional writes: {exc}")
        etag = None
    try:
        yield
    finally:
        try:
            if etag is not None:
                try:
                    client.delete_object(Bucket=bucket, Key=key, IfMatch=etag)
                except ClientError as exc:
                    # a store without conditional deletes (AWS has them since September 2025):
                    # removed only if the lock is still this run's; another run's is kept
                    if code(exc) in _CONFLICT or \
                            client.head_object(Bucket=bucket, Key=key)["ETag"] != etag:
                        raise
                    client.delete_object(Bucket=bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            logging.getLogger(__name__).warning(
                "could not remove the commit lock %s (%s); the next commit of this host takes "
                "it once this process is gone, another host's after a day", url, exc)


# --------------------------------------------------------------------------- rollback
_UNKNOWN = object()  # a location whose state cannot be told: never equal to anything


def _look(path: str, flags: Sequence[str] = ()) -> Any:
    """How the final location ``path`` looks now: None when nothing is there, else something
    that changes when a file is moved there (locally device, inode, size and mtime; on an
    object store size, modification time and checksum; a DuckDB table: its database file's; a
    PostgreSQL table: whether it and its kept previous version exist), or :data:`_UNKNOWN` when
    it cannot be told (an error: an unreachable server, say)."""
    try:
        if is_table_url(path):
            # lazy: Beam (see _plan)
            from ldp_beam.transforms.sinks import _duckdb_path, previous_table, tidy_table_exists

            if path.lower().startswith("duckdb:"):
                db = _duckdb_path(path)
                return tuple(_stat(f) for f in (db, db + ".wal"))
            # PostgreSQL replaces a table in one transaction that also renames the previous one
            # to its kept name: whether it committed shows in which of the two exist
            return (tidy_table_exists(path), tidy_table_exists(path, kept=previous_table(path)))
        if not is_url(path):
            return _stat(_local(path))
        if not exists(path, flags):
            return None
        fs = _fs(path, flags)
        # the checksum (S3's ETag, GCS's CRC32C) too: modification times there are whole
        # seconds, so a new object of the same size landed in the same second looks the same
        return tuple(sorted((m.path, m.size_in_bytes, m.last_updated_in_seconds,
                             fs.checksum(m.path))
                            for m in fs.match([path])[0].metadata_list)) or None
    except Exception:  # noqa: BLE001 - cannot tell: counted as changed (the entry stays pending)
        return _UNKNOWN


def _stat(path: str) -> tuple | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _remove(path: str, flags: Sequence[str] = ()) -> None:
    """Remove the file or object at ``path`` if there is one (raises if it cannot)."""
    if is_url(path):
        if exists(path, flags):
            _delete([path], flags)
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(_local(path))


def _keep(final: str, keep: str, flags: Sequence[str]) -> None:
    """Keep the file at ``final`` as ``keep`` before it is replaced: locally a hard link (the
    same bytes, nothing copied; a copy where the file system has no hard links), on an object
    store a server-side copy."""
    if is_url(final):
        _fs(final, flags).copy([final], [keep])
        return
    try:
        os.link(_local(final), _local(keep))
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP,
                             errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        with _partial(_local(keep)) as tmp:
            shutil.copy2(_local(final), tmp)
            os.replace(tmp, _local(keep))


def _redacted(change: dict) -> dict:
    """A change as the journal stores it: a database URL without its password (in the user
    part or a ``password=`` parameter)."""
    return {**change, "table": redact(change["table"])} if "table" in change else change


def _undo(plan: Sequence[dict], flags: Sequence[str], run_id: str) -> list[str]:
    """Put back what run ``run_id``'s commit ``plan`` changed; returns what could not be put
    back (empty when everything is as before the commit).

    First its own new manifest, if it landed, is removed (were that impossible, nothing else is
    touched: every output was moved in before the manifest, so the commit then stands whole).
    Then each output: a previous version that was kept is put back over the final place
    (locally one rename); a previous version with no kept copy was never replaced (the copy is
    made first), so it is left alone; where there was no previous version, what the commit put
    there is removed (a file only when its SHA-256 is the one the commit moved in; a table when
    it exists). The previous manifest comes back last, and only when every output did (never a
    manifest vouching for a mixture); what is left is for a later :func:`recover_commit`."""
    manifest = plan[0]["path"]
    try:
        if _manifest_run(manifest, flags) == run_id:
            _remove(manifest, flags)
    except Exception as exc:  # noqa: BLE001 - the new manifest stands over all new outputs
        return [f"its new manifest {location(manifest)} could not be removed "
                f"({_reason(exc) if isinstance(exc, OSError) else exc}), so the commit stands "
                "whole: every new output is in place under it"]
    problems: list[str] = []
    for c in reversed(plan):
        if c["role"] == "manifest" and problems:
            break  # never a manifest vouching for outputs not put back: left for a retry
        try:
            if "table" in c:
                # lazy: Beam (see _plan)
                from ldp_beam.transforms.sinks import restore_tidy, tidy_table_exists

                if tidy_table_exists(c["table"], c["keep"] if c["previous"] else None):
                    restore_tidy(c["table"], c["keep"])
            elif c["previous"]:
                if exists(c["keep"], flags):
                    _move(c["keep"], c["path"], flags)
                    _remove(c["keep"], flags)  # a rename onto its own hard link leaves it
            elif exists(c["path"], flags) and (
                    c.get("sha256") is None
                    or file_digest(c["path"], flags)["sha256"] == c["sha256"]):
                _remove(c["path"], flags)
        except Exception as exc:  # noqa: BLE001 - said, and the journal is kept for a retry
            where = location(c["table"] if "table" in c else c["path"])
            problems.append(f"the {c['role'].replace('_', ' ')} {where}: "
                            f"{_reason(exc) if isinstance(exc, OSError) else exc}")
    return problems


def _manifest_run(path: str, flags: Sequence[str]) -> str | None:
    """The run id the manifest at ``path`` names; None when there is none (raises when it
    exists but cannot be read: a commit is never judged from a manifest misread)."""
    if not exists(path, flags):
        return None
    run = read_manifest(path, flags).get("run_id")
    return None if run is None else str(run)


def _journals(folder: str, flags: Sequence[str], exclude: str = "") -> list[str]:
    """The commit journals in the staging folders of ``folder`` but ``exclude``'s: commits not
    settled yet."""
    pattern = _join(folder, STAGING_PREFIX + "*/" + JOURNAL)
    found = (_local_glob(pattern) if not is_url(folder)
             else [p for p, _ in _listing(pattern, flags)])
    return sorted(p for p in found if not p.startswith(_join(exclude, "")))


def _local_glob(pattern: str) -> list[str]:
    return glob.glob(_local(pattern))


def _drop_kept(plan: Sequence[dict], flags: Sequence[str]) -> list[str]:
    """Remove the previous versions a committed ``plan`` kept; returns what could not be."""
    problems = []
    for c in plan:
        if not c["previous"]:
            continue
        try:
            if "table" in c:
                from ldp_beam.transforms.sinks import drop_tidy  # lazy: Beam (see _plan)

                drop_tidy(c["table"], c["keep"])
            else:
                _remove(c["keep"], flags)
        except Exception as exc:  # noqa: BLE001 - a warning: the run is committed
            problems.append(f"{c['keep']}: {exc}")
    return problems


def recover_commit(staging: str, flags: Sequence[str] = (),
                   urls: Mapping[str, str] | None = None) -> list[str] | None:
    """Settle the commit of a run whose process died during it (``kill -9``, a lost machine),
    from the journal in its abandoned staging folder. None when the folder holds no journal
    (the run died before committing: nothing of it is in place). Under the manifest's commit
    lock, by what the manifest's place holds now:

    * a manifest naming the run: its commit had finished; the kept previous versions go;
    * none, or the one the run replaced: every change is rolled back (:func:`_undo`);
    * a manifest naming another run: a later commit superseded it; nothing is touched;
    * a manifest that cannot be read: nothing is touched (a commit is never judged from a
      misread), and the journal stays for a later try.

    The journal stores database URLs without their password; ``urls`` maps such a URL to the
    one the current run was given (the same output), with which it is reached. Returns what
    could not be settled (empty: done; the folder can go)."""
    path = _join(staging, JOURNAL)
    if not exists(path, flags):
        return None
    try:
        with open_read(path, flags) as fh:
            journal = json.loads(fh.read())
        plan, manifest = journal["changes"], journal["manifest"]
        run, replaces = str(journal["run_id"]), journal.get("replaces")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"its commit journal {path} cannot be read ({exc})"]
    plan = [{**c, "table": (urls or {}).get(c["table"], c["table"])} if "table" in c else c
            for c in plan]
    log = logging.getLogger(__name__)
    try:
        with _commit_lock(manifest, "recovery-of-" + run, ["", ""], flags=flags):
            try:
                now = _manifest_run(manifest, flags)
            except (OSError, ValueError) as exc:
                return [f"its manifest {location(manifest)} cannot be read now "
                        f"({_reason(exc) if isinstance(exc, OSError) else exc})"]
            if now == run:
                problems = _drop_kept(plan, flags)
                log.warning("run %s was stopped after its commit had finished (manifest %s): "
                            "removed the previous versions it kept; its ledger entry stays "
                            "pending until `ldp-beam ledger --resolve %s --as committed`", run,
                            location(manifest), run)
            elif now is not None and now != replaces:
                problems = []
                log.warning("run %s was stopped during its commit, which run %s's commit has "
                            "since replaced (manifest %s): nothing of it is rolled back", run,
                            now, location(manifest))
            else:
                problems = _undo(plan, flags, run)
                log.warning("run %s was stopped during its commit: %s; its ledger entry stays "
                            "pending and counts as spent (its new outputs may have been read "
                            "while they were in place): `ldp-beam ledger --resolve %s`", run,
                            "rolled back, the previous outputs and manifest are back"
                            if not problems else "its rollback is incomplete", run)
    except OutputError as exc:  # its lock is held by a live run: settled on a later sweep
        return [str(exc)]
    return problems
