"""The one rule by which an ldp-beam URL names a local file (docs/guides/sources-sinks.md, "URL
rules"): the text after ``scheme://`` and before any ``?`` is the file's path as written,
percent-decoded, relative to the current folder unless it starts with ``/`` (several leading
slashes are one). ``duckdb://hr.db`` is ``./hr.db``, ``duckdb:///srv/hr.db`` is ``/srv/hr.db``;
``sqlite://``, ``duckdb://`` and ``iceberg://`` (a catalog file) follow it alike, as ``file://``
does. A new file is never created directly in the filesystem root: there a URL is far more
likely SQLAlchemy's habit (``sqlite:///team.db`` for ``./team.db``) than a wish."""
from __future__ import annotations

import os
from urllib.parse import unquote

from .errors import ParameterError


def url_file(url: str) -> str:
    """The local file ``url`` names by the rule above ("" when it names none)."""
    path = unquote(url.split("://", 1)[-1].split("?", 1)[0])
    return "/" + path.lstrip("/") if path.startswith("//") else path


def check_new_file(url: str, path: str, option: str) -> None:
    """Refuse to create ``path`` (what ``url`` names) directly in the filesystem root, saying
    what to write for the file in the current folder; an existing file there is used."""
    if not os.path.exists(path) and os.path.dirname(os.path.abspath(path)) == os.sep:
        scheme, name = url.split("://", 1)[0], path.lstrip("/").split("?", 1)[0]
        raise ParameterError(option, url, "a file below a folder (a new file is not created at "
                             "the filesystem root)", f"this URL names {path}; for {name} in the "
                             f"current folder write {scheme}://{name}")


__all__ = ["url_file", "check_new_file"]
