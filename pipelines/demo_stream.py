"""``ldp-beam demo --stream``: live telemetry end to end on a real broker, in about 30 seconds.

1. Google's Pub/Sub emulator is started on the loopback address (:mod:`.pubsub_emulator`;
   always stopped at the end, also on Ctrl-C), with a topic and a subscription;
2. simulated devices (:data:`DEVICES` :class:`~ldp_beam.client.Reporter` s, one thread) perturb
   each of their answers to "how did you travel?" with GRR on the device and publish the
   reports, event time = now, :data:`RATE` reports/s in all. The true distribution of answers
   shifts from one window to the next (:data:`SHARES`), so the estimates visibly follow it; the
   producer logs, per window, how many reports it published and their true answers (which only
   the simulation knows);
3. the collector, :func:`~ldp_beam.pipelines.pubsub_stream.run_pubsub_stream` (what ``ldp-beam
   stream --subscription`` runs), lands every message durably, then acks it, and estimates
   each :data:`WINDOW`-second event-time window once the watermark (the wall clock less
   :data:`LAG` seconds) has passed its end;
4. each window is printed as its estimate is released: the estimated share of every answer
   (unbiased, with its standard error) beside the true share and count, and the number of
   reports estimated beside the number published. At the end, the collector's summary: every
   published report landed and estimated once.

The devices' noise comes from OS entropy (a device never seeds its noise); ``seed`` seeds only
the simulation of the true answers. Outputs (the stream's ``estimates.jsonl``, its spool and
its curator-only bookkeeping) stay in ``out_dir`` (a new temporary folder by default).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from typing import Any, TextIO

import numpy as np

from ldp_beam.client import Reporter
from ldp_beam.registry import build_mechanism

from .common import scratch_ledger
from .pubsub_emulator import EmulatorUnavailable, PubSubEmulator, unavailable

WINDOW = 5.0  # seconds of event time per window
WINDOWS = 4  # windows the devices report in
LAG = 3.0  # the watermark trails the wall clock by this much: time for reports to land
DEVICES = 8
TICK = 0.25  # each device reports every TICK seconds ...
PER_TICK = 25  # ... this many answers (so RATE reports/s in all)
RATE = DEVICES * PER_TICK / TICK
PER_MESSAGE = 5  # reports per Pub/Sub message
LABELS = ("walk", "bike", "transit", "car")
#: the true distribution of answers in the devices' 1st, 2nd, ... window (then again)
SHARES = ((0.55, 0.25, 0.15, 0.05), (0.15, 0.55, 0.20, 0.10), (0.10, 0.15, 0.60, 0.15),
          (0.05, 0.10, 0.25, 0.60))
START_DELAY = 4.0  # the devices start at the first window boundary this long after the call


class _Devices(threading.Thread):
    """The simulated devices: every :data:`TICK` s, each publishes :data:`PER_TICK` perturbed
    answers drawn from its window's true distribution; ``truth[window start µs]`` counts what
    was published (after the broker accepted it) per answer."""

    def __init__(self, topic: str, mech: Any, first_us: int, window_us: int, windows: int,
                 seed: Any) -> None:
        super().__init__(name="ldp-beam-demo-devices", daemon=True)
        self.topic, self.mech = topic, mech
        self.first_us, self.window_us, self.windows = first_us, window_us, windows
        self.end_us = first_us + window_us * windows
        self.rng = np.random.default_rng(None if seed is None else int(
            str(seed).encode().hex(), 16) % 2 ** 63)
        self.truth: dict[int, list[int]] = {}
        self.published = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        reporters = []
        try:
            reporters = [Reporter(self.mech, device_id=f"demo-device-{i + 1}", topic=self.topic,
                                  reports_per_message=PER_MESSAGE) for i in range(DEVICES)]
            wait = self.first_us / 1e6 - time.time()
            if wait > 0 and self.stop.wait(wait):
                return
            nxt = time.monotonic()
            while not self.stop.is_set():
                for rep in reporters:
                    us = time.time_ns() // 1000
                    if us >= self.end_us:
                        return
                    start = us - (us - self.first_us) % self.window_us
                    k = (start - self.first_us) // self.window_us
                    codes = self.rng.choice(len(LABELS), PER_TICK, p=SHARES[k % len(SHARES)])
                    receipt = rep.report_many([LABELS[c] for c in codes], us / 1e6)
                    if receipt.published != PER_TICK:
                        raise RuntimeError(f"{receipt.published} of {PER_TICK} reports "
                                           "published")
                    counts = self.truth.setdefault(start, [0] * len(LABELS))
                    for c in codes.tolist():
                        counts[c] += 1
                    self.published += PER_TICK
                nxt += TICK
                self.stop.wait(max(0.0, nxt - time.monotonic()))
        except BaseException as exc:  # reported by the demo
            self.error = exc
        finally:
            self.finished.set()
            for rep in reporters:
                try:
                    rep.close()
                except Exception:  # noqa: BLE001 - the demo is ending anyway
                    pass


def _hhmmss(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%H:%M:%S")


def window_lines(row: dict, truth: list[int] | None) -> list[str]:
    """One window's block: the estimate beside the truth."""
    start, end = row["window_start_epoch"], row["window_end_epoch"]
    n = row.get("n_reports", 0)
    published = sum(truth) if truth else 0
    freq = row["statistics"]["frequency"]
    lines = [f"window {_hhmmss(start)}-{_hhmmss(end)} UTC: {n:,} reports estimated, "
             f"{published:,} published",
             f"  {'answer':<9}{'true count':>11}{'true share':>12}{'estimate':>11} +/- s.e."
             f"{'est. count':>13}"]
    for i, label in enumerate(row["params"]["domain"]):
        true_n = truth[i] if truth else 0
        share = true_n / published if published else float("nan")
        v, se = freq["value"][i], freq["stderr"][i]
        lines.append(f"  {label:<9}{true_n:>11,}{share:>12.3f}{v:>11.3f} +/- {se:.3f}"
                     f"{v * n:>13,.0f}")
    return lines


def _last_panes(path: str) -> dict[float, dict]:
    rows: dict[float, dict] = {}
    try:
        with open(path) as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break  # being written
                r = json.loads(line)
                w = r["window_start_epoch"]
                if w not in rows or r["pane"]["index"] >= rows[w]["pane"]["index"]:
                    rows[w] = r
    except FileNotFoundError:
        pass
    return rows


def run_demo_stream(out_dir: str | None = None, epsilon: float = 3.0, seed: Any = None,
                    stream: TextIO | None = None, windows: int = WINDOWS,
                    window_seconds: float = WINDOW) -> dict:
    """Run the live demo (see the module docstring); returns the windows printed (``{window
    start: {"estimate": row, "truth": counts}}``), the stream's summary and the totals. Raises
    :class:`~.pubsub_emulator.EmulatorUnavailable` (one line: what to install) without Java,
    the emulator or the Pub/Sub client."""
    why = unavailable()
    if why:
        raise EmulatorUnavailable(f"demo --stream needs Google's Pub/Sub emulator: {why}")
    # lazy: Beam (pubsub_stream, transforms.windowed) costs 1.3 s at import (measured, after
    # the CLI's imports): without Java or the emulator the check above says in one line what to
    # install, without paying it
    from ldp_beam.transforms.windowed import ESTIMATES
    from .pubsub_stream import run_pubsub_stream

    out_dir = os.path.abspath(out_dir or tempfile.mkdtemp(prefix="ldp-beam-demo-stream-"))
    os.makedirs(out_dir, exist_ok=True)
    mech = build_mechanism("grr", epsilon=epsilon, domain=LABELS)
    window_us = int(round(window_seconds * 1e6))
    lock = threading.Lock()
    stream = stream or sys.stdout  # resolved per call: a default bound at import outlives a redirect

    def w(text: str) -> None:
        with lock:
            stream.write(text + "\n")
            stream.flush()

    w(f"\nldp-beam demo --stream: {DEVICES} simulated devices report how they travelled "
      f"({', '.join(LABELS)}), {RATE:,.0f} reports/s, for {windows} windows of "
      f"{window_seconds:g} s; each answer is perturbed on the device with GRR "
      f"({mech.guarantee.describe()}) and published to Pub/Sub; the collector lands every "
      f"message, then acks it, and estimates each window {LAG:g} s after its end")
    w("  starting Google's Pub/Sub emulator on 127.0.0.1 ...")
    printed: dict[float, dict] = {}
    with PubSubEmulator(start_timeout=90) as emu:
        topic = emu.topic()
        sub = emu.subscription(topic, ack_deadline=10)
        w(f"  emulator {emu.host}: topic {topic}, subscription {sub}")
        now_us = time.time_ns() // 1000
        first_us = -(-(now_us + int(START_DELAY * 1e6)) // window_us) * window_us
        devices = _Devices(topic, mech, first_us, window_us, windows, seed)
        stop = threading.Event()
        estimates = os.path.join(out_dir, ESTIMATES)
        starts = [(first_us + k * window_us) / 1e6 for k in range(windows)]
        give_up = devices.end_us / 1e6 + LAG + 30.0

        def show(start: float, row: dict, note: str = "") -> None:
            truth = devices.truth.get(int(round(start * 1e6)))
            printed[start] = {"estimate": row, "truth": truth}
            w("\n" + "\n".join(window_lines(row, truth)) + note)

        def watch() -> None:
            """Print each window once its estimate is out; stop the collector after the
            last one (or when it is overdue, or the devices failed)."""
            while not stop.is_set():
                rows = _last_panes(estimates)
                for start in starts:
                    if start in rows and start not in printed and \
                            time.time() >= start + window_seconds:
                        show(start, rows[start])
                if len(printed) == windows or time.time() > give_up or (
                        devices.error is not None):
                    stop.set()
                    return
                stop.wait(0.5)

        watcher = threading.Thread(target=watch, name="ldp-beam-demo-watch", daemon=True)
        w(f"  devices report from {_hhmmss(first_us / 1e6)} UTC to "
          f"{_hhmmss(devices.end_us / 1e6)} UTC; the collector's output: {out_dir}")
        try:
            devices.start()
            watcher.start()
            with scratch_ledger() as ledger:  # as the batch demo's runs
                summary = run_pubsub_stream(
                    sub, out_dir, mech, window_seconds=window_seconds, watermark_lag=LAG,
                    poll_seconds=0.5, stop=stop, progress=False, drain_seconds=5.0,
                    lander_options={"pull_timeout": 1.0}, ledger=ledger)
        finally:
            stop.set()
            devices.stop.set()
            devices.join(15)
            watcher.join(5)
    if devices.error is not None:
        raise RuntimeError(f"the simulated devices failed: {devices.error!r}") \
            from devices.error
    stopped_at = time.time()
    rows = _last_panes(estimates)  # a window released at the stop, not printed yet
    for start in starts:
        if start in rows and start not in printed:
            early = stopped_at < start + window_seconds + LAG
            show(start, rows[start], "\n  (released by the stop while the window was open: its "
                 "last reports had not landed yet)" if early else "")
    records = summary.get("records", {})
    lander = summary.get("lander", {})
    estimated = sum(p["estimate"].get("n_reports", 0) for p in printed.values())
    w(f"\n  {devices.published:,} reports published by {DEVICES} devices; "
      f"{lander.get('landed', 0):,} landed ({lander.get('duplicates', 0):,} duplicates, "
      f"{lander.get('dead_lettered', 0):,} dead-lettered); {estimated:,} estimated in "
      f"{len(printed)} window(s); the collector's books reconcile: {summary.get('reconciles')}")
    if len(printed) < windows:
        w(f"  stopped before every window was estimated ({len(printed)} of {windows})")
    w("  (the true answers are printed only because the devices are simulated; the "
      "collector never sees them)")
    w(f"  outputs in {out_dir}")
    return {"windows": printed, "summary": summary, "published": devices.published,
            "records": records, "out_dir": out_dir}
