"""Progress of long work: a tqdm bar with an ETA on a terminal, a final rate line, or silence.

What shows (all on stderr):

* a **bar** (tqdm: rows done, rate and ETA when the total is known; a count, the elapsed time and
  the rate when it is not) only when stderr is a terminal and the run is not ``--quiet``;
* a **final line** with the rows read and rows/s over the wall time after every pipeline run of
  ``collect``, ``estimate`` and the central releases, unless ``--quiet`` (also when stderr is a
  file or a pipe: logs keep the rate);
* nothing at all with ``--quiet`` (errors still go to stderr).

The command line switches pipeline progress on with :func:`configure` (``enabled=True``); the
Python API stays silent unless asked, so library users and embedding code see no output they did
not request. :class:`~ldp_beam.pipelines.records.Progress` (``reproduce``, ``audit``, ``bench``)
reads ``quiet`` from here too.

tqdm is imported only when a bar is drawn (``import ldp_beam`` stays light).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from typing import Any, Callable, TextIO


@dataclasses.dataclass
class Settings:
    """What the command line asked for. ``enabled``: pipeline runs report progress (off for the
    Python API); ``quiet``: nothing but errors on stderr; ``label``: the command's name, the bar's
    and the rate line's prefix."""

    enabled: bool = False
    quiet: bool = False
    label: str = "ldp-beam"


SETTINGS = Settings()


def configure(*, enabled: bool | None = None, quiet: bool | None = None,
              label: str | None = None) -> Settings:
    """Set what progress is shown; returns the settings before the call (to restore them)."""
    before = dataclasses.replace(SETTINGS)
    if enabled is not None:
        SETTINGS.enabled = bool(enabled)
    if quiet is not None:
        SETTINGS.quiet = bool(quiet)
    if label is not None:
        SETTINGS.label = str(label)
    return before


def restore(settings: Settings) -> None:
    """Put back settings returned by :func:`configure`."""
    configure(enabled=settings.enabled, quiet=settings.quiet, label=settings.label)


def is_terminal(stream: Any) -> bool:
    """Is ``stream`` an interactive terminal (a bar may be drawn on it)?"""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def make_bar(total: int | None, desc: str, unit: str, stream: TextIO, **kw: Any) -> Any:
    """A tqdm bar on ``stream`` (tqdm imported here, lazily). ``total=None``: indeterminate
    (count, elapsed time and rate, no ETA)."""
    # lazy: tqdm costs 0.04 s at import (measured); the command line imports this module at
    # start-up (`ldp-beam --help` included), and a bar is drawn only on a terminal
    import tqdm

    tqdm.tqdm.monitor_interval = 0  # no monitor thread: our bars are updated by their owner
    try:
        cols = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        cols = 0
    size = {"dynamic_ncols": True} if cols > 0 else {"ncols": 100, "nrows": 24}  # size unknown
    return tqdm.tqdm(total=total, desc=desc, unit=unit, file=stream, mininterval=0.2, leave=True,
                     **size, **kw)


def rate_text(rows: int | None, seconds: float, note: str = "") -> str:
    """``read 1,000,000 rows in 2.31 s (432,900 rows/s)``: the rate over the wall time;
    ``note`` says where the count comes from when it is not the reader's counter."""
    if rows is None:
        return (f"finished in {seconds:.2f} s (rows read unknown: the runner reports no "
                "metrics)")
    rate = rows / seconds if seconds > 0 else float("inf")
    return f"read {rows:,} rows{note} in {seconds:.2f} s ({rate:,.0f} rows/s)"


class RunProgress:
    """Progress of one pipeline run, from its start to its final line.

    ``total``: a function giving the rows the run will read (None: unknown), called on the
    ticker thread so that counting never delays the run. ``live``: a function giving the rows
    read so far (None: not known now); :meth:`set_live` replaces it (e.g. by a metrics query once
    an asynchronous runner has returned its result). The bar is redrawn every ``interval``
    seconds by a daemon thread; :meth:`finish` stops it and prints the final line."""

    def __init__(self, label: str, *, bar: bool, line: bool, stream: TextIO | None = None,
                 total: Callable[[], int | None] | None = None,
                 live: Callable[[], int | None] | None = None, interval: float = 0.25) -> None:
        self.label = label
        self.show_bar, self.show_line = bar, line
        self.stream = stream if stream is not None else sys.stderr
        self._total_fn, self._live = total, live
        self.interval = interval
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.bar: Any = None
        self.total: int | None = None  # the rows to read, once counted
        self.t0 = time.perf_counter()

    def start(self) -> "RunProgress":
        self.t0 = time.perf_counter()
        if self.show_bar:
            self.bar = make_bar(None, self.label, "rows", self.stream, unit_scale=True)
            self._thread = threading.Thread(target=self._tick, name="ldp-beam-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def set_live(self, live: Callable[[], int | None] | None, interval: float | None = None
                 ) -> None:
        with self._lock:
            self._live = live
            if interval is not None:
                self.interval = interval

    def _tick(self) -> None:
        if self._total_fn is not None:
            try:
                total = self._total_fn()
            except Exception:  # counting is best effort: an unreadable file is the run's error
                total = None
            self.total = total
            with self._lock:
                if total is not None and not self._stop.is_set():
                    self.bar.total = int(total)
                    self.bar.refresh()
        ticks, counted = 0, False
        while not self._stop.wait(self.interval):
            with self._lock:
                live = self._live
            try:
                n = live() if live is not None else None
            except Exception:  # metrics unavailable at the moment: keep the elapsed time going
                n = None
            ticks += 1
            with self._lock:
                if self._stop.is_set():
                    break
                if n is not None and n > self.bar.n:
                    self.bar.update(n - self.bar.n)
                    if not counted:
                        self.bar.set_postfix_str("", refresh=False)
                    counted = True
                elif not counted and ticks * self.interval >= 3.0:  # say why it stays at 0
                    self.bar.set_postfix_str("the runner reports no rows until it ends")
                else:
                    self.bar.refresh()

    def finish(self, rows: int | None, ok: bool = True, passes: int = 1) -> float:
        """Stop the bar (at ``rows`` when known) and, after a successful run, print the final
        line. Without ``rows`` (a runner that reports no metrics), the rows of the input from
        its metadata, said so. ``passes``: how many times the run reads the same input (2 for
        the per-unit bound, which reads it twice to keep memory flat); the line then gives the
        input's rows beside the rows read, so 8,000 rows read are not taken for 8,000 input
        rows. Returns the wall time in seconds."""
        seconds = time.perf_counter() - self.t0
        with self._lock:
            self._stop.set()
        if self._thread is not None:  # a slow count or metrics call need not hold the run up:
            self._thread.join(timeout=5.0)  # once stopped, the thread leaves the bar alone
        note = ""
        if rows is None and ok and self._total_fn is not None:
            if self.total is None and (self._thread is None or not self._thread.is_alive()):
                try:
                    self.total = self._total_fn()
                except Exception:  # best effort
                    self.total = None
            if self.total is not None:
                rows, note = self.total, " (the input's rows, from its metadata: the runner " \
                                         "reports no metrics)"
        if passes > 1 and rows is not None:
            note += (f" (the {rows // passes:,} input rows, read in {passes} passes: the "
                     "per-unit bound reads its input twice to keep memory flat)")
        if self.bar is not None:
            if ok and rows is not None:
                if self.bar.total is not None and self.bar.total < rows:
                    self.bar.total = rows
                self.bar.n = rows
                self.bar.set_postfix_str("", refresh=False)
                self.bar.refresh()
            self.bar.close()
        if ok and self.show_line:
            self.stream.write(f"{self.label}: {rate_text(rows, seconds, note)}\n")
            self.stream.flush()
        return seconds


def pipeline_progress(total: Callable[[], int | None] | None = None,
                      stream: TextIO | None = None) -> RunProgress | None:
    """The progress of a pipeline run as the settings ask: None when disabled (the Python API)
    or quiet; a bar only on a terminal; else the final line alone."""
    s = SETTINGS
    if not s.enabled or s.quiet:
        return None
    stream = stream if stream is not None else sys.stderr
    return RunProgress(s.label, bar=is_terminal(stream), line=True, stream=stream, total=total)


__all__ = ["Settings", "SETTINGS", "configure", "restore", "is_terminal", "make_bar",
           "rate_text", "RunProgress", "pipeline_progress"]
