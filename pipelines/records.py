"""Measurement records and progress lines, shared by ``ldp-beam bench``, ``audit`` and the
reproductions (:mod:`ldp_beam.reproduce`; their figures and command line are in
:mod:`ldp_beam.reproduce.recipe`).

A *record* is one measured number, a flat JSON-able dict with at least
``{"experiment", "dataset", "method", "epsilon", "metric", "value"}`` plus any parameters of the
measurement (``n``, ``reps``, ``seed``, ...) and, where the paper gives one, ``"paper_value"``.
This is the machine-readable form ``ldp-beam reproduce`` writes (DESIGN.md, "Command line").
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Mapping, TextIO

import numpy as np

REQUIRED_KEYS = ("experiment", "dataset", "method", "epsilon", "metric", "value")


def _plain(x: Any) -> Any:
    """numpy scalars/arrays -> Python numbers/lists; non-finite floats -> None (valid JSON)."""
    if isinstance(x, np.ndarray):
        return [_plain(v) for v in x.tolist()]
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def make_record(experiment: str, dataset: str, method: str, epsilon: float | None, metric: str,
                value: Any, *, paper_value: Any = None, **params: Any) -> dict:
    """One measurement as a JSON-able dict (NaN/inf become ``None``).

    ``params`` (n, reps, seed, ...) are added as extra keys; ``paper_value`` only when given.
    """
    rec = {"experiment": experiment, "dataset": dataset, "method": method,
           "epsilon": None if epsilon is None else _plain(float(epsilon)), "metric": metric,
           "value": _plain(value)}
    for k, v in params.items():
        if k in rec:
            raise ValueError(f"record parameter {k!r} clashes with a required key")
        rec[k] = _plain(v)
    if paper_value is not None:
        rec["paper_value"] = _plain(paper_value)
    return rec


def check_records(records: Iterable[Mapping]) -> None:
    """Raise ``ValueError`` if a record lacks a required key or is not JSON-serializable."""
    for i, r in enumerate(records):
        missing = [k for k in REQUIRED_KEYS if k not in r]
        if missing:
            raise ValueError(f"record {i} lacks {missing}: {dict(r)!r}")
        json.dumps(r, allow_nan=False)


def write_records(records: Iterable[Mapping], path: str | os.PathLike) -> str:
    """Write records as a JSON list (strict JSON: no NaN). Creates parent folders. Returns path."""
    records = list(records)
    check_records(records)
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(records, fh, indent=1, allow_nan=False)
        fh.write("\n")
    return path


def select(records: Iterable[Mapping], **match: Any) -> list[Mapping]:
    """Records whose keys equal every ``match`` item (a list/tuple/set value matches any member)."""
    out = []
    for r in records:
        ok = True
        for k, v in match.items():
            rv = r.get(k)
            if isinstance(v, (list, tuple, set, frozenset)):
                if rv not in v:
                    ok = False
                    break
            elif rv != v:
                ok = False
                break
        if ok:
            out.append(r)
    return out


class Progress:
    """Progress on stderr: ``[bisample] fig4 EXP eps=1.0 (12/40)`` lines, or, when stderr is a
    terminal, one tqdm bar over the ``total`` steps (the current step as its label, an ETA) with
    notes and tables printed above it, and a final line ``[bisample] 40 steps in 93.1 s (0.43
    steps/s)`` when the bar closes (:meth:`close`: at the end of a recipe, or at exit).

    ``step(label)`` advances the counter; ``note(text)`` prints without advancing.
    ``enabled=False`` makes it silent, and so does ``--quiet`` (:mod:`ldp_beam.progress`);
    ``sink`` (a callable taking the line) replaces the stream; ``bar=False`` forces lines
    (None: a bar exactly when the command line asked for progress -- ``reproduce``, ``audit``,
    see :func:`ldp_beam.progress.configure` -- the stream is a terminal and no sink is given).
    """

    def __init__(self, family: str, total: int | None = None, *, stream: TextIO | None = None,
                 enabled: bool = True, sink: Callable[[str], Any] | None = None,
                 bar: bool | None = None) -> None:
        from ldp_beam.progress import SETTINGS

        self.family = family
        self.total = total
        self.count = 0
        self.enabled = enabled and not SETTINGS.quiet
        self.sink = sink
        self._stream = stream
        self._bar_wanted = bar
        self._bar: Any = None
        self._t0 = time.perf_counter()

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _use_bar(self) -> bool:
        if not self.enabled or self.sink is not None:
            return False
        if self._bar_wanted is not None:
            return self._bar_wanted
        from ldp_beam.progress import SETTINGS, is_terminal

        return SETTINGS.enabled and is_terminal(self.stream)

    def _emit(self, line: str) -> None:
        if not self.enabled:
            return
        if self.sink is not None:
            self.sink(line)
            return
        if self._bar is not None:
            self._bar.write(line, file=self.stream)
            return
        stream = self.stream
        stream.write(line + "\n")
        stream.flush()

    def step(self, label: str) -> None:
        self.count += 1
        if self._use_bar():
            if self._bar is None:
                import atexit

                from ldp_beam.progress import make_bar

                self._bar = make_bar(self.total or None, f"[{self.family}]", "step",
                                     self.stream)
                atexit.register(self.close)
            elif self.total and self._bar.total != self.total:
                self._bar.total = self.total
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update(self.count - 1 - self._bar.n)  # the steps before this one are done
            return
        of = f"{self.count}/{self.total}" if self.total else f"{self.count}"
        self._emit(f"[{self.family}] {label} ({of})")

    def block(self, text: str) -> None:
        """Emit a multi-line text (a results table) as is, line by line."""
        for line in text.splitlines():
            self._emit(line)

    def note(self, text: str) -> None:
        self._emit(f"[{self.family}] {text} [{time.perf_counter() - self._t0:.1f}s]")

    def close(self) -> None:
        """Close the bar (if one is drawn) and print the final line with the steps per second.
        Lines mode prints nothing more (each step had its line). Idempotent."""
        bar, self._bar = self._bar, None
        if bar is None:
            return
        bar.update(self.count - bar.n)
        bar.close()
        secs = time.perf_counter() - self._t0
        rate = self.count / secs if secs > 0 else float("inf")
        self.stream.write(f"[{self.family}] {self.count} steps in {secs:.1f} s "
                          f"({rate:.3g} steps/s)\n")
        self.stream.flush()


def as_progress(progress: Any, family: str) -> Progress:
    """Normalize a recipe's ``progress`` argument: None/True -> stderr, False -> silent, a
    :class:`Progress` as is, any other callable -> a Progress that hands it each line."""
    if isinstance(progress, Progress):
        return progress
    if progress is None or progress is True:
        return Progress(family)
    if progress is False:
        return Progress(family, enabled=False)
    if callable(progress):
        return Progress(family, sink=progress)
    raise TypeError(f"progress must be None, a bool, a Progress or a callable, not "
                    f"{type(progress).__name__}")


class SectionFailed(RuntimeError):
    """A section failed after some of its records were measured: they are kept."""

    def __init__(self, message: str, records: list[dict]) -> None:
        super().__init__(message)
        self.records = records
