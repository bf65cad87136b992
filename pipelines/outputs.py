"""Commit or nothing: a run's outputs are staged, then committed together, manifest last.

A batch run (``collect``, ``estimate``, a central release) writes every output into a private
staging folder beside its final location, ``DIR/.ldp-beam-staging-RUNID/``, on the same file
system. Only when the pipeline has finished and its counts check out does :meth:`RunOutputs.commit`
move them into place:

1. the previous manifest is removed first, so from this point no manifest vouches for a mixture
   of old and new files;
2. every staged file replaces its final path (``os.replace``: atomic per file);
3. the new manifest, naming the run id and each file it covers with its size and SHA-256, is
   written last (atomically).

A reader who finds a manifest can therefore trust the files it lists (and can check them); a run
that fails or is interrupted before step 1 leaves the previous outputs and manifest untouched; one
interrupted during steps 1-3 leaves no manifest (outputs not committed, never a stale claim).
The staging folder is removed whatever happens; one left by a process killed with ``kill -9`` is
removed by the next run that stages in the same folder (its owner process is gone).

Refused before anything runs: an output equal to or inside an input (``collect -i X -o X`` would
otherwise read a file it is replacing), two outputs at one path, and an existing output unless the
caller passes ``force`` (the CLI's ``--force``).
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import socket
from typing import Any, Iterable, Mapping

from ldp_beam.errors import LdpBeamError

STAGING_PREFIX = ".ldp-beam-staging-"
OWNER_FILE = "OWNER"


class RunFailed(LdpBeamError):
    """A run that finished but must not commit (unreadable input, counts that do not add up);
    the previous outputs are untouched. The CLI exits 1."""


class OutputError(LdpBeamError, ValueError):
    """An output that cannot be written safely (the message names the path and the option)."""


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def input_paths(inputs: Iterable[str]) -> list[str]:
    """Every path an input pattern names: the pattern itself (a file or folder) and its matches."""
    out: list[str] = []
    for pat in inputs:
        if not pat or "://" in pat:
            continue
        out.append(_real(pat))
        out += [_real(p) for p in glob.glob(pat)]
    return sorted(set(out))


def check_outputs(outputs: Mapping[str, str], inputs: Iterable[str], force: bool) -> None:
    """Refuse outputs that would overwrite or land inside an input, collide, or already exist
    (unless ``force``)."""
    ins = input_paths(inputs)
    seen: dict[str, str] = {}
    for role, path in outputs.items():
        real = _real(path)
        if real in seen:
            raise OutputError(f"the {role} output and the {seen[real]} output are the same "
                              f"path {path!r}: give them different paths")
        seen[real] = role
        for src in ins:
            if real == src or real.startswith(src.rstrip(os.sep) + os.sep):
                raise OutputError(f"the {role} output {path!r} is {'an' if real == src else 'inside an'}"
                                  f" input ({src}): a run never writes over what it reads; "
                                  "choose another --output")
            if os.path.isdir(real) and src.startswith(real.rstrip(os.sep) + os.sep):
                raise OutputError(f"the {role} output {path!r} is a folder holding the input "
                                  f"{src}; choose another --output")
    existing = [p for p in outputs.values() if os.path.lexists(p)]
    if existing and not force:
        raise OutputError(f"output {existing[0]!r} exists"
                          + (f" (and {len(existing) - 1} more)" if len(existing) > 1 else "")
                          + ": pass --force (force=True) to replace it; the previous outputs are "
                          "replaced only once the new run has succeeded")
    for p in existing:
        if os.path.isdir(p) and not os.path.islink(p):
            raise OutputError(f"output {p!r} is a folder: give a file path")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(folder: str) -> list[str]:
    """Remove staging folders in ``folder`` whose owner process on this host is gone (a run
    killed before it could clean up). Returns what was removed."""
    removed = []
    for d in glob.glob(os.path.join(folder, STAGING_PREFIX + "*")):
        try:
            with open(os.path.join(d, OWNER_FILE)) as fh:
                owner = json.load(fh)
        except (OSError, ValueError):
            owner = {}
        if owner.get("host") == socket.gethostname() and _pid_alive(int(owner.get("pid", -1))):
            continue
        if not owner and _young(d):
            continue  # just created by a run that has not written its owner file yet
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _young(path: str, seconds: float = 60.0) -> bool:
    import time

    try:
        return time.time() - os.stat(path).st_mtime < seconds
    except OSError:
        return False


def file_digest(path: str) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return {"bytes": os.path.getsize(path), "sha256": h.hexdigest()}


class RunOutputs:
    """Stage a run's outputs and commit them together (see the module docstring).

    ``outputs`` maps a role ("reports", "dead_letter", "estimate", ...) to its final path;
    ``manifest`` is the final path of the manifest (written last). Use as a context manager:
    leaving it without :meth:`commit` (an error, an interrupt) discards the staged files.
    """

    def __init__(self, outputs: Mapping[str, str], manifest: str, run_id: str,
                 inputs: Iterable[str] = (), force: bool = False) -> None:
        self.outputs = dict(outputs)
        self.manifest = manifest
        self.run_id = run_id
        check_outputs({**self.outputs, "manifest": manifest}, inputs, force)
        self.folder = os.path.dirname(os.path.abspath(manifest))
        self.staging = os.path.join(self.folder, STAGING_PREFIX + run_id)
        self.committed = False

    def __enter__(self) -> "RunOutputs":
        os.makedirs(self.folder, exist_ok=True)
        sweep_stale(self.folder)
        os.makedirs(self.staging)
        with open(os.path.join(self.staging, OWNER_FILE), "w") as fh:
            json.dump({"pid": os.getpid(), "host": socket.gethostname(), "run_id": self.run_id},
                      fh)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.discard()

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def staged(self, role: str) -> str:
        """Where the pipeline writes output ``role`` (inside the staging folder)."""
        return os.path.join(self.staging, role + _suffix(self.outputs[role]))

    def scratch(self, name: str) -> str:
        """A staging path for an intermediate file (never committed)."""
        return os.path.join(self.staging, "_" + name)

    def commit(self, manifest: dict) -> dict:
        """Move every staged output into place, then write ``manifest`` (with the run id and the
        files it covers) last. Returns the manifest as written."""
        files = {}
        for role, final in self.outputs.items():
            staged = self.staged(role)
            if not os.path.exists(staged):
                raise OutputError(f"the run produced no {role} output ({staged}): not committed")
            files[role] = {"path": os.path.abspath(final), **file_digest(staged)}
        manifest = {"run_id": self.run_id, **manifest, "files": files}
        if os.path.lexists(self.manifest):
            os.remove(self.manifest)  # from here no manifest vouches for a mixture
        for role, final in self.outputs.items():
            os.makedirs(os.path.dirname(os.path.abspath(final)) or ".", exist_ok=True)
            _move(self.staged(role), final)
        tmp = os.path.join(self.staging, "_manifest.json")
        with open(tmp, "w") as fh:
            json.dump(manifest, fh, indent=2, default=_default)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        _move(tmp, self.manifest)
        self.committed = True
        self.discard()
        return manifest


def _suffix(path: str) -> str:
    base = os.path.basename(path)
    for ext in (".deadletter.jsonl", ".jsonl", ".json", ".parquet", ".csv"):
        if base.endswith(ext):
            return ext
    return os.path.splitext(base)[1]


def _move(src: str, dst: str) -> None:
    try:
        os.replace(src, dst)
    except OSError:  # another file system: copy beside the target, then replace atomically
        tmp = dst + ".ldp-beam-partial"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        os.remove(src)


def _default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def read_manifest(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


def verify(manifest_path: str) -> list[str]:
    """Problems with a committed run's files (empty when every file matches its manifest)."""
    man = read_manifest(manifest_path)
    problems = []
    for role, f in man.get("files", {}).items():
        if not os.path.exists(f["path"]):
            problems.append(f"{role}: {f['path']} is missing")
        elif file_digest(f["path"]) != {"bytes": f["bytes"], "sha256": f["sha256"]}:
            problems.append(f"{role}: {f['path']} differs from the manifest")
    return problems
