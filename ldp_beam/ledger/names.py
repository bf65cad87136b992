"""Dataset names and ledger URLs (:mod:`ldp_beam.ledger`): the default ledger, the file a
``sqlite://`` URL names, a URL without its password, a dataset's name and canonical location,
and the key of a central release request."""
from __future__ import annotations

import hashlib
import os
import unicodedata
from typing import Any, Mapping
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ..errors import ParameterError
from ..urls import url_file
from .base import DATASET_NAME_MAX, _dumps


# ----------------------------------------------------------------------------- URLs
def default_url() -> str:
    """``$LDP_BEAM_LEDGER`` (a URL or a file path), else a SQLite file under the user's data
    folder (``$XDG_DATA_HOME/ldp-beam/ledger.db``, ``~/.local/share/ldp-beam/ledger.db``)."""
    env = os.environ.get("LDP_BEAM_LEDGER", "").strip()
    if env:
        return env if "://" in env else "sqlite://" + env
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return "sqlite://" + os.path.join(base, "ldp-beam", "ledger.db")


def sqlite_path(url: str) -> str:
    """The file a ``sqlite://`` ledger URL names, by the one rule of every ldp-beam URL
    (``file://``, ``duckdb://``, ``iceberg://`` alike; docs/guides/sources-sinks.md): the text
    after ``scheme://`` is the path as written. ``sqlite://team.db`` is ``team.db`` relative to
    the current folder, ``sqlite:///srv/team.db`` the absolute ``/srv/team.db`` (so is
    ``sqlite:////srv/team.db``: extra leading slashes are one).

    SQLAlchemy reads ``sqlite:///team.db`` as relative: where that reading names an existing
    file and this one a different file, the URL is refused rather than a new, empty ledger
    opened beside the one that holds the spending."""
    path = url_file(url)
    if path.lstrip("/") == ":memory:":
        return ":memory:"
    if path.startswith("/") and not url[len("sqlite:///"):].startswith("/"):
        old = url[len("sqlite:///"):]  # what the SQLAlchemy rule read: relative
        if old and os.path.exists(os.path.expanduser(old)) and (
                not os.path.exists(path) or not os.path.samefile(old, path)):
            raise ParameterError(
                "--ledger", url, f"sqlite://FILE, where FILE is the path as written: this URL "
                f"names {path} (absolute), but {old} exists in the current folder; write "
                f"sqlite://{old} (or {old}) for it, or sqlite:///{path} for {path}",
                "every ldp-beam URL takes the text after scheme:// as the path; SQLAlchemy's "
                "relative sqlite:///FILE is not followed")
    return path


def redact(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` query parameter)."""
    if "@" not in url and "password" not in url.lower():
        return url  # nothing to hide (a SQLite file: kept exactly as written)
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable ledger URL>"
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        if ":" in user:
            user = user.split(":", 1)[0] + ":***"
        netloc = user + "@" + host
    query = "&".join("password=***" if q.lower().startswith("password=") else q
                     for q in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# ------------------------------------------------------------------------- dataset identity
_GLOB_CHARS = "*?["


def check_dataset_name(name: Any) -> str:
    """A dataset name as the ledger keeps it (``--dataset``): 1 to :data:`DATASET_NAME_MAX`
    characters, no control or invisible formatting characters (a newline, a zero-width space: two
    names that look the same must be the same), no leading or trailing space. Raises
    :class:`~ldp_beam.errors.ParameterError` naming ``--dataset``."""
    valid = (f"a name of 1 to {DATASET_NAME_MAX} characters without control characters or "
             "leading/trailing spaces")
    if not isinstance(name, str) or not name.strip():
        raise ParameterError("--dataset", name, valid)
    if len(name) > DATASET_NAME_MAX:
        raise ParameterError("--dataset", name[:40] + "...", valid,
                             hint=f"it has {len(name)} characters")
    bad = [c for c in name if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")]
    if bad:
        raise ParameterError("--dataset", name, valid, hint=f"it holds {bad[0]!r}")
    if name != name.strip():
        raise ParameterError("--dataset", name, valid)
    return name


#: Query parameters of a URL that carry credentials: dropped from a dataset's location.
_SECRET_PARAMS = ("password", "passwd", "secret", "secret_key", "access_key", "session_token",
                  "token", "sig", "signature", "x-amz-signature", "x-amz-credential",
                  "x-amz-security-token")


def _url_location(url: str, what: str = "--input") -> str:
    """``url`` without credentials: no user part (``user:password@`` is dropped entirely), no
    password, key or token query parameter; the scheme and host lower-cased."""
    try:
        urlsplit(url)
        parts = urlsplit(redact(url))
    except ValueError as exc:
        raise ParameterError(what, "<unparsable URL>", "a URL (scheme://host/path)") from exc
    host = parts.netloc.rsplit("@", 1)[-1].lower()
    query = "&".join(q for q in parts.query.split("&")
                     if q and q.split("=", 1)[0].lower() not in _SECRET_PARAMS)
    return urlunsplit((parts.scheme.lower(), host, parts.path, query, parts.fragment))


def canonical_location(input: str) -> str:
    """The default dataset name of an input: where it is, canonically.

    A local file or folder: the real path of the path as given (symbolic links resolved in
    order, so ``link/../x`` is the ``x`` beside the link's target); a glob: the real path of its
    folder part joined with the pattern part; a URL: the URL without credentials (no user part,
    no password, key or token parameter); a database table or query: its canonical table URL
    (the password hidden, query parameters sorted)."""
    scheme = input.split("://", 1)[0].lower() if "://" in input else ""
    if scheme in DATABASE_SCHEMES:
        return _table_url(input)
    if scheme:
        return _url_location(input)
    if any(c in input for c in _GLOB_CHARS) and not os.path.exists(input):
        cut = min(input.index(c) for c in _GLOB_CHARS if c in input)
        folder = os.path.dirname(input[:cut])
        pattern = input[len(folder):].lstrip(os.sep)
        return os.path.join(os.path.realpath(folder or os.curdir), pattern)
    return os.path.realpath(input)


DATABASE_SCHEMES = ("duckdb", "postgresql", "postgres", "iceberg")


def by_content(input: str) -> bool:
    """Whether an input's fingerprint is of its content (files), not of its name (a database
    table or query, identified by what it names: hashing a warehouse table would cost a full
    scan). Only the releases of the former are ever re-published."""
    return input.split("://", 1)[0].lower() not in DATABASE_SCHEMES


def _table_url(input: str) -> str:
    """A database table's canonical URL: the password hidden, query parameters sorted."""
    parts = urlsplit(redact(input))
    query = "&".join(f"{k}={v}" for k, v in sorted(parse_qsl(parts.query)))
    return f"{parts.scheme.lower()}://{parts.netloc}{parts.path}" + (f"?{query}" if query
                                                                     else "")


def request_key(fingerprint: str, request: Mapping[str, Any]) -> str:
    """The key of a release request: the data fingerprint and everything that determines what is
    released (mechanism, parameters, privacy unit and bounds, columns, options, a seed)."""
    return hashlib.sha256(_dumps({"fingerprint": fingerprint, **dict(request)}).encode()
                          ).hexdigest()


def release_request(mechanism: str, params: Mapping[str, Any], columns: Mapping[str, str],
                    options: Mapping[str, Any] | None = None, unit: str = "record",
                    seed: str | None = None, **more: Any) -> dict:
    """What makes two central releases identical requests (see
    :meth:`ldp_beam.ledger.Ledger.find_release`)."""
    return {"mechanism": mechanism, "params": dict(params), "columns": dict(columns),
            "options": dict(options or {}), "unit": unit, "seed": seed, **more}


def _name_of(dataset: Any, what: str = "dataset") -> str:
    """A dataset's name: a string as is, or the ``"dataset"`` of a :func:`~ldp_beam.pipelines.datasets.dataset_identity`
    dict (its ``"uri"`` for a dict made before datasets had names)."""
    name = (dataset.get("dataset") or dataset.get("uri")) if isinstance(dataset, Mapping) \
        else dataset
    if not isinstance(name, str) or not name:
        raise ParameterError(what, dataset, "a dataset name, or the dict from dataset_identity")
    return name
