"""What a run read: the identity and content fingerprint the budget ledger records
(:mod:`ldp_beam.ledger`), computed on the launcher where the input is.

A dataset is its ``--dataset`` name, else its canonical location
(:func:`ldp_beam.ledger.canonical_location`, which the ledger also uses to match names); the
content fingerprint (a SHA-256 of the bytes read) is kept on each entry only to re-publish an
identical release. Fingerprinting reads local files, object stores (s3:// with Beam's ``--s3_*``
options, gs:// at ``STORAGE_EMULATOR_HOST`` when set) and database tables: I/O that belongs beside
the commands, not in the core ledger.
"""
from __future__ import annotations

import datetime as _dt
import glob
import hashlib
import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from ldp_beam.errors import ParameterError
from ldp_beam.ledger import by_content, canonical_location, check_dataset_name
from ldp_beam.ledger.names import _GLOB_CHARS, _table_url

def dataset_identity(input: str, options: Any = (), name: str | None = None) -> dict:
    """The identity of the data a run reads: ``{"dataset", "uri", "fingerprint", "files",
    "bytes"}``.

    ``dataset`` is what budgets and spending are kept against: ``name`` when given (the run's
    ``--dataset``, checked by :func:`check_dataset_name`), else the input's
    :func:`canonical_location`, which ``uri`` always is. A table that grows by a row keeps its
    name, so its people's budget goes on counting; a copy at another path is another dataset
    unless it is given the same ``--dataset`` name.

    The fingerprint identifies the *content* read, only to re-publish an identical central
    release rather than draw it again (:meth:`Ledger.find_release`) and to show which runs read
    which version of the data: the SHA-256 of each file's bytes, streamed (~1.7 GB/s), combined
    over the files sorted by their name relative to the input (a directory, or a glob's folder
    part; a single file contributes its content only, so a renamed copy matches). The whole
    content, not a Parquet footer: one changed value that is neither a minimum nor a maximum can
    leave the footer and the size unchanged, and CSV has no footer. The same rows re-encoded
    (compression, row order, quoting) fingerprint differently: drawn (and spent) again, never
    re-published from different data.

    Local paths, folders and globs are read as ``ReadTable`` reads them (a folder's entries whose
    names start with ``.`` or ``_`` are skipped; sub-folders are read recursively); a URI with a
    scheme (``gs://``, ``s3://``, ``file://``, ...) through ``pyarrow.fs`` (for ``s3://``, the
    endpoint, region and keys among Beam's ``--s3_...`` arguments in ``options``, if any, else
    the environment's; for ``gs://``, the emulator named by ``STORAGE_EMULATOR_HOST``, if any),
    with bounded retries and a stall limit (:data:`REMOTE_RETRY_SECONDS`,
    :data:`REMOTE_STALL_SECONDS`), waited for where SIGINT/SIGTERM still stop the command."""
    if not isinstance(input, str) or not input:
        raise ParameterError("--input", input, "a file, folder, glob or URI")
    if name is not None:
        name = check_dataset_name(name)
    ident = None
    pre = _PREFETCHED.pop(input, None)
    if pre is not None:  # hashed in the background since the command started
        thread, box = pre
        thread.join()
        if "identity" in box and _local_signature(input) == box["signature"]:
            ident = dict(box["identity"])
    if ident is None:
        ident = _dataset_identity(input, options)
    if name is not None:
        ident["dataset"] = name
    return ident


_PREFETCHED: dict[str, tuple[threading.Thread, dict]] = {}


def prefetch_dataset_identity(input: Any, name: str | None = None) -> None:
    """Start :func:`dataset_identity` of a local input (a file, folder or glob) on a background
    thread, so its hashing (which releases the GIL) overlaps what the command does before it
    needs the fingerprint: importing Beam and building the pipeline (~1 s), against ~0.1 s to
    hash a 10^7-row Parquet file. :func:`dataset_identity` then waits for it and takes its
    result only if every file still has the size, modification time and inode it had before it
    was hashed (else it hashes again); a failure there is left to that call to report. URIs and
    databases are not prefetched. ``name`` (the ``--dataset``) is not needed here: the name is
    the one :func:`dataset_identity` is given."""
    if not isinstance(input, str) or not input or "://" in input or input in _PREFETCHED:
        return
    box: dict = {}

    def work() -> None:
        try:
            sig = _local_signature(input)  # before hashing: a file changed meanwhile differs
            box["identity"] = _dataset_identity(input, ())
            box["signature"] = sig
        except Exception:  # noqa: BLE001 - dataset_identity reports it when it is asked
            box.clear()

    thread = threading.Thread(target=work, name="ldp-beam-fingerprint", daemon=True)
    _PREFETCHED[input] = (thread, box)
    thread.start()


def _local_signature(input: str) -> list | None:
    """Each local file of ``input`` with its size, modification time and inode (None when
    there is none to read)."""
    try:
        paths, _ = _local_paths(input)
    except ParameterError:
        return None
    out = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:  # gone: hashed again, which reports it
            return None
        out.append((p, st.st_size, st.st_mtime_ns, st.st_ino))
    return out


def _dataset_identity(input: str, options: Any = ()) -> dict:
    if not by_content(input):
        return _database_identity(input)
    if "://" in input:
        files = _remote_files(input, options)
    else:
        files = _local_files(input)
    h = hashlib.sha256(b"ldp-beam/dataset/v1\n")
    total = 0
    single = len(files) == 1
    for name, size, digest in sorted(files):
        h.update(f"{'' if single else name}\0{size}\0{digest}\n".encode())
        total += size
    where = canonical_location(input)
    return {"dataset": where, "uri": where, "fingerprint": "sha256:" + h.hexdigest(),
            "files": len(files), "bytes": total}


def _database_identity(input: str) -> dict:
    """A table or query in a database is identified by what it names (the URL without its
    password, and the table or query), not by its content: hashing a warehouse table would cost a
    full scan of it. The budget then follows the table as it changes over time, which can only
    over-count what its people have spent, never under-count; a copy of the table under another
    name is another dataset unless it is given the same ``--dataset`` name."""
    canonical = _table_url(input)
    h = hashlib.sha256(b"ldp-beam/dataset/table/v1\n" + canonical.encode())
    return {"dataset": canonical, "uri": canonical, "fingerprint": "sha256:" + h.hexdigest(),
            "files": 0, "bytes": 0}


def _hash_stream(read) -> tuple[int, str]:
    h, n = hashlib.sha256(), 0
    for chunk in iter(lambda: read(1 << 22), b""):
        n += len(chunk)
        h.update(chunk)
    return n, h.hexdigest()


def _local_paths(input: str) -> tuple[list[str], str]:
    """The files a local input names, as ``ReadTable`` reads them, and the folder their names
    are relative to."""
    if os.path.isdir(input):
        base = input
        paths = []
        for entry in sorted(os.listdir(input)):
            if entry.startswith((".", "_")):
                continue
            full = os.path.join(input, entry)
            if os.path.isdir(full):
                for root, dirs, names in os.walk(full):
                    dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
                    paths += [os.path.join(root, f) for f in sorted(names)
                              if not f.startswith((".", "_"))]
            else:
                paths.append(full)
    else:
        paths = sorted(p for p in glob.glob(input) if os.path.isfile(p))
        cut = min([input.index(c) for c in _GLOB_CHARS if c in input] or [len(input)])
        base = os.path.dirname(input[:cut]) if cut < len(input) else os.path.dirname(input)
    if not paths:
        raise ParameterError("--input", input, "an existing file, a folder holding files, or a "
                             "glob that matches files", hint="the ledger fingerprints the data "
                             "before the run")
    return paths, base


def _local_files(input: str) -> list[tuple[str, int, str]]:
    paths, base = _local_paths(input)
    out = []
    for p in paths:
        try:
            with open(p, "rb") as fh:
                size, digest = _hash_stream(fh.read)
        except OSError as exc:
            raise ParameterError("--input", input, "readable files",
                                 hint=f"cannot read {p}: {exc}") from exc
        out.append((os.path.relpath(p, base or "."), size, digest))
    return out


def _s3_settings(options: Any) -> dict:
    """pyarrow S3FileSystem keywords from Beam's ``--s3_...`` arguments in a list (read here
    without Beam; empty: the environment's settings)."""
    args = [str(a) for a in (options or ())]
    got: dict = {}
    for i, a in enumerate(args):
        name, eq, value = a[2:].partition("=")
        if a.startswith("--s3_") and (eq or i + 1 < len(args)):
            got[name] = value if eq else args[i + 1]
    kw: dict = {}
    if got.get("s3_endpoint_url"):
        kw["endpoint_override"] = got["s3_endpoint_url"]
    if got.get("s3_region_name"):
        kw["region"] = got["s3_region_name"]
    if got.get("s3_access_key_id") and got.get("s3_secret_access_key"):
        kw.update(access_key=got["s3_access_key_id"], secret_key=got["s3_secret_access_key"],
                  session_token=got.get("s3_session_token"))
    return kw


#: How long pyarrow's GCS client goes on retrying a failing request while fingerprinting a
#: ``gs://`` input (its own default is 15 minutes, spent inside one C++ call): an unreachable
#: store is a ParameterError after about this long, up to twice it with the last backoff
#: (measured: a limit of 5 s gave up after 9.7 s against a closed port). S3 is bounded by the
#: AWS SDK's defaults (1 s connect timeout, 3 attempts: ~6 s against a closed port or an
#: unknown host).
REMOTE_RETRY_SECONDS = 10
#: The fingerprint of a remote input gives up when its store sends nothing for this long: a
#: store that accepts connections and never answers would hold one request for the client's
#: own timeout (2 minutes for GCS, measured), retried. Longer than a whole retry sequence
#: (twice REMOTE_RETRY_SECONDS, above), so a store that answers after retries is waited for;
#: progress is marked after each MiB read, so any transfer faster than ~35 kB/s is never cut.
REMOTE_STALL_SECONDS = 30
_REMOTE_CHUNK = 1 << 20


def _gcs_settings() -> dict:
    """pyarrow GcsFileSystem keywords: a bounded retry time and, when ``STORAGE_EMULATOR_HOST``
    names an emulator (the variable Google's clients and Beam's GCS FileSystem follow, which
    ``pyarrow.fs.FileSystem.from_uri`` ignores), its endpoint, reached anonymously as they do."""
    kw: dict = {"retry_time_limit": _dt.timedelta(seconds=REMOTE_RETRY_SECONDS)}
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if host:
        parts = urlsplit(host if "://" in host else "http://" + host)
        kw.update(anonymous=True, scheme=parts.scheme, endpoint_override=parts.netloc)
    return kw


def _remote_files(input: str, options: Any = ()) -> list[tuple[str, int, str]]:
    """:func:`_remote_files_now` on a worker thread, watched: pyarrow's calls block in C++,
    where no signal handler runs and no Python timeout applies. The calling thread waits in
    short joins, so SIGINT/SIGTERM unwind the command at once, and gives up with a
    ParameterError when the store sends nothing for REMOTE_STALL_SECONDS (the abandoned daemon
    thread ends with the process)."""
    box: dict = {"progress": time.monotonic()}

    def work() -> None:
        try:
            box["files"] = _remote_files_now(input, options, box)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name="ldp-beam-fingerprint-remote", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.2)
        if thread.is_alive() and time.monotonic() - box["progress"] > REMOTE_STALL_SECONDS:
            raise ParameterError("--input", input, "a store that answers", hint=f"fingerprinting "
                                 f"it got nothing from the store for {REMOTE_STALL_SECONDS} s")
    if "error" in box:
        raise box["error"]
    return box["files"]


def _remote_files_now(input: str, options: Any = (), box: dict | None = None
                      ) -> list[tuple[str, int, str]]:
    box = {} if box is None else box

    def mark() -> None:
        box["progress"] = time.monotonic()

    try:
        kw = _s3_settings(options) if input.startswith("s3://") else {}
        if kw:
            fs, path = pafs.S3FileSystem(**kw), input[len("s3://"):]
        elif input.startswith("gs://"):
            fs, path = pafs.GcsFileSystem(**_gcs_settings()), input[len("gs://"):]
        else:
            fs, path = pafs.FileSystem.from_uri(input)
        info = fs.get_file_info(path)
    except Exception as exc:  # an unknown scheme, no credentials, an unreachable store
        raise ParameterError("--input", input, "a URI pyarrow.fs can read (file://, s3://, "
                             "gs://, hdfs://)", hint=f"fingerprinting it failed: {exc}") from exc
    mark()
    if info.type == pafs.FileType.Directory:
        try:
            listed = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        except OSError as exc:
            raise ParameterError("--input", input, "a folder that can be listed",
                                 hint=f"fingerprinting it failed: {exc}") from exc
        mark()
        infos = [i for i in listed if i.type == pafs.FileType.File
                 and not any(part.startswith((".", "_"))
                             for part in os.path.relpath(i.path, path).split("/"))]
        base = path
    elif info.type == pafs.FileType.File:
        infos, base = [info], os.path.dirname(path)
    else:
        raise ParameterError("--input", input, "an existing file or folder (globs are for local "
                             "paths)")
    if not infos:
        raise ParameterError("--input", input, "a folder holding files")
    out = []
    for i in sorted(infos, key=lambda i: i.path):
        try:
            with fs.open_input_stream(i.path) as fh:
                def read(_: int, fh=fh) -> bytes:
                    chunk = fh.read(_REMOTE_CHUNK)
                    mark()
                    return chunk

                size, digest = _hash_stream(read)
        except OSError as exc:
            raise ParameterError("--input", input, "readable files",
                                 hint=f"cannot read {i.path}: {exc}") from exc
        out.append((os.path.relpath(i.path, base), size, digest))
    return out


