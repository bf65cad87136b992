"""The one JSON encoder of ldp-beam: every JSON text the package writes goes through it.

One conversion for what :mod:`json` cannot encode (:func:`_default`): numpy scalars and 0-d
arrays become their Python scalar, other arrays (and anything with ``tolist``) lists, sets sorted
lists, bytes UTF-8 text (undecodable bytes replaced), anything else (datetime, Decimal, a
dataclass, ...) its ``str``. Tuples are lists, as :mod:`json` writes them.

The call sites differ only in layout and in what a non-finite float becomes (``nan=``):

- ``"token"`` writes ``NaN``/``Infinity`` (what :func:`json.loads` reads back). The ledger needs
  it: a release (an estimate over no rows is NaN) must be stored and read back as it was, and the
  bytes of a request key (SHA-256 of :func:`dumps` with ``compact=True``) must never change, or a
  ledger stops recognising an identical release. Output documents (manifests, curator and summary
  files: :func:`json_bytes`) keep it too, as they always wrote; the device client checks each
  report value itself before encoding (with a message naming the value), and the Pub/Sub lander
  re-encodes a record it parsed with :func:`json.loads` (which accepts ``NaN``) as it came.
- ``"null"`` writes ``null`` (:func:`jsonable` first): JSON-lines records (:func:`json_line`), read
  by other tools that accept only standard JSON, where a missing value (a NaN in a dead-lettered
  record) is a null.
- ``"error"`` refuses (``ValueError``), for a caller that wants no silent change.

No Beam, no pyarrow, not even numpy is imported: numpy values are recognised by their methods.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

NAN_MODES = ("token", "null", "error")


def _default(x: Any) -> Any:
    if hasattr(x, "item") and getattr(x, "ndim", 0) == 0:
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    if isinstance(x, (bytes, bytearray)):
        return x.decode("utf-8", "replace")
    return str(x)


def jsonable(x: Any) -> Any:
    """``x`` as plain JSON types (dict, list, str, int, float, bool, None), converted as
    :func:`_default` does, with every non-finite float (numpy's too) as None."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if x is None or isinstance(x, (str, int)):
        return x
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return jsonable(_default(x))


_ENCODERS: dict[tuple, Callable[[Any], str]] = {}


def encoder(*, nan: str = "token", sort_keys: bool = True, compact: bool = False,
            indent: int | None = None, ensure_ascii: bool = True) -> Callable[[Any], str]:
    """A function object -> JSON text, built once per set of options (for loops over records;
    same text as :func:`dumps`). ``compact`` drops the spaces after ``,`` and ``:``."""
    key = (nan, sort_keys, compact, indent, ensure_ascii)
    enc = _ENCODERS.get(key)
    if enc is None:
        if nan not in NAN_MODES:
            raise ValueError(f"nan={nan!r}: expected one of {NAN_MODES}")
        encode = json.JSONEncoder(sort_keys=sort_keys, indent=indent, ensure_ascii=ensure_ascii,
                                  allow_nan=nan == "token", default=_default,
                                  separators=(",", ":") if compact else None).encode
        enc = _ENCODERS[key] = (lambda obj: encode(jsonable(obj))) if nan == "null" else encode
    return enc


def dumps(obj: Any, **options: Any) -> str:
    """``obj`` as JSON text; ``options`` as :func:`encoder` (sorted keys, ``NaN`` tokens, ASCII
    and :mod:`json`'s separators unless told)."""
    return encoder(**options)(obj)


def json_line(obj: Any) -> str:
    """One JSON-lines record (no newline): sorted keys, standard JSON (non-finite floats null)."""
    return encoder(nan="null")(obj)


def json_bytes(obj: Any) -> bytes:
    """A JSON document file: indented by 2, keys in their order, ``NaN`` tokens, final newline."""
    return (dumps(obj, indent=2, sort_keys=False) + "\n").encode()


def write_json_atomic(path: str, obj: Any) -> None:
    """:func:`json_bytes` of ``obj`` to the local file ``path`` (folders created), written beside
    it and renamed over it, so that a reader sees the old file or the new one, never a part."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "wb") as fh:
        fh.write(json_bytes(obj))
    os.replace(path + ".tmp", path)
