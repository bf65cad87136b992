"""``ldp-beam bench --only stream`` and ``--only stream-soak``: live telemetry through Google's
Pub/Sub emulator (issue 24), measured against a plain pull client on the same backlog, and the
collector's memory over a long run at a steady rate. The harness and the other sections are in
:mod:`.bench`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from ldp_beam.client import PublishError, Reporter
from ldp_beam.registry import build_mechanism

from . import pubsub_emulator  # its functions looked up when called (tests replace them)
from .bench_sources import stop_processes
from .records import SectionFailed, make_record

#: the domain of the stream's GRR reports
_DOMAIN = tuple(str(i) for i in range(20))

#: issue 24's goals: the lander at least half the plain pull client's messages/s on the same
#: backlog, and at least 20,000 reports/s with batched messages
STREAM_TARGETS = {"ratio_to_plain_pull": 0.5, "reports_per_second": 20_000}
#: backlog sizes: single-report messages (plain pull and lander, ``rounds`` interleaved
#: rounds), batched reports (``per_message`` a message), Beam's backlog (single-report
#: messages) and how long Beam may take to drain it; 50 reports a message keep 1,000 messages
#: (a full pull batch of the lander) under its 8 MiB batch cap. A `--once` drain ends at the
#: first empty pull.
STREAM_SIZES = {
    False: {"messages": 20_000, "rounds": 3, "reports": 210_000, "per_message": 50,
            "batched_rounds": 2, "beam_messages": 5_000, "beam_seconds": 40.0},
    True: {"messages": 10_000, "rounds": 2, "reports": 105_000, "per_message": 50,
           "batched_rounds": 1, "beam_messages": 2_000, "beam_seconds": 25.0},
}
STREAM_EPSILON = 2.0
SOAK_SECONDS = 300.0  # ``--only stream-soak`` without ``--soak SECONDS``
SOAK_RATE = 500.0  # reports/s published during the soak

# Beam's ReadFromPubSub on the DirectRunner (--streaming), draining a backlog: run(), count
# what reaches a DoFn (a side file per bundle, read here), stop at the count or the deadline
# with cancel() (given 5 s: it takes ~30 s on the DirectRunner) and leave with os._exit.
_BEAM_PUBSUB_CHILD = r"""
import json, os, sys, threading, time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def main():
    cfg = json.loads(sys.argv[1])
    side = cfg["side"]

    class Count(beam.DoFn):
        def start_bundle(self):
            self.n, self.first = 0, None

        def process(self, msg):
            if self.first is None:
                self.first = time.time()
            self.n += 1

        def finish_bundle(self):
            if self.n:
                with open(side, "a") as fh:
                    fh.write(f"{self.n} {self.first} {time.time()}\n")

    p = beam.Pipeline(options=PipelineOptions(["--streaming", "--runner=DirectRunner"]))
    _ = (p | beam.io.ReadFromPubSub(subscription=cfg["subscription"], with_attributes=True)
         | beam.ParDo(Count()))
    started = time.time()
    result = p.run()
    deadline = time.monotonic() + cfg["timeout"]
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            with open(side) as fh:
                rows = [line.split() for line in fh if line.strip()]
        except FileNotFoundError:
            rows = []
        if sum(int(r[0]) for r in rows) >= cfg["expected"]:
            break
    stopper = threading.Thread(target=result.cancel, daemon=True)
    stopper.start()
    stopper.join(5.0)
    with open(side) as fh:
        rows = [line.split() for line in fh if line.strip()]
    print(json.dumps({"messages": sum(int(r[0]) for r in rows), "started": started,
                      "first": min((float(r[1]) for r in rows), default=None),
                      "last": max((float(r[2]) for r in rows), default=None),
                      "bundles": len(rows)}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
"""


def _stream_record(mode: str, metric: str, value: Any, stamp: dict, note: str,
                   target: float | None = None, target_of: str | None = None,
                   **extra: Any) -> dict:
    return make_record(
        "bench", "synthetic", "grr", STREAM_EPSILON, metric, value, stage="stream",
        path="pubsub", mode=mode, broker="Google's Pub/Sub emulator on 127.0.0.1",
        target=target, target_of=target_of,
        meets_target=None if target is None or value is None else bool(value >= target),
        note=note, **extra, **(stamp or {}))


def _stream_values(n: int, rng: Any) -> list[str]:
    """``n`` skewed labels of the 20 (as the element path's records)."""
    codes = np.minimum(rng.geometric(0.15, n) - 1, 19)
    return [_DOMAIN[c] for c in codes.tolist()]


def _publish(topic: str, mech: Any, values: list[str], per_message: int,
             event_time: float | None = None) -> float:
    """Publish ``values`` as reports (``per_message`` a message) through the device client;
    returns the seconds it took."""
    t = time.perf_counter()
    with Reporter(mech, device_id=f"bench-{os.getpid()}", topic=topic, batch_size=10_000,
                  reports_per_message=per_message) as rep:
        receipt = rep.report_many(values, event_time)
    if receipt.published != len(values):
        raise RuntimeError(f"published {receipt.published:,} of {len(values):,} reports")
    return time.perf_counter() - t


def _land(sub: str, spool: str, messages: int, subscriber: Any, timeout: float = 120.0
          ) -> tuple[Any, float]:
    """The lander on ``sub`` until ``messages`` were landed and acked: (its stats, seconds,
    the landed record's opening included)."""
    # lazy: Beam (ldp_beam.transforms, which pubsub_lander imports) costs 1.3 s at import
    # (measured); every `ldp-beam bench` imports this module (pipelines/bench.py), and only the
    # stream section needs it
    from ldp_beam.transforms.pubsub_lander import Lander

    t = time.perf_counter()
    lander = Lander(sub, spool, subscriber=subscriber)
    with lander:
        lander.run(timeout, stop_when=lambda ld: ld.stats.messages >= messages)
    secs = time.perf_counter() - t
    if lander.stats.messages < messages:
        raise RuntimeError(f"the lander received {lander.stats.messages:,} of {messages:,} "
                           f"messages in {timeout:g} s")
    return lander.stats, secs


def _stream_skipped(why: str, stamp: dict | None, mode: str = "all") -> list[dict]:
    rec = _stream_record(mode, "skipped", None, stamp or {}, f"not measured: {why}")
    rec["skipped"] = why
    return [rec]


def stream_bench(tmp: str, progress: Any = None, *, quick: bool = False,
                 sizes: dict | None = None, stamp: dict | None = None,
                 env: dict | None = None) -> list[dict]:
    """``bench --only stream``: live telemetry through Google's Pub/Sub emulator, started here
    on the loopback address (and always stopped), every rate measured in this run:

    * ``plain-pull``: a plain pull-and-ack client (:func:`~ldp_beam.transforms.pubsub_lander.
      drain_plain`: no parsing, no disk) draining a backlog of single-report messages published
      by :class:`~ldp_beam.client.Reporter`: the broker's own rate;
    * ``lander``: the :class:`~ldp_beam.transforms.pubsub_lander.Lander` landing the same
      backlog (another subscription of the same topic: pull, fsync, record the ids, rename into
      the spool, ack); its value is the ratio of its messages/s to the plain client's (goal
      >= 0.5). The two run in interleaved rounds after an unmeasured warm-up round (the
      emulator's JVM is slower at first), the fastest round of each kept;
    * ``lander-batched``: the lander on messages of ``per_message`` reports, in reports/s (goal
      >= 20,000);
    * ``end-to-end``: :func:`~ldp_beam.pipelines.pubsub_stream.run_pubsub_stream` with
      ``once=True`` on the same batched backlog: landed, then windowed and estimated by the
      spool stream (Beam's start-up included; the landing ends with one empty pull of up to
      1 s), reports/s over its wall time, beside the same goal;
    * ``beam-pubsub``: Beam's ``ReadFromPubSub`` (``--streaming`` DirectRunner, in a fresh
      process) draining a backlog of single-report messages, messages/s from its first
      element to its last (its start-up excluded), beside the plain client; no goal.

    Without Java, the emulator or the Pub/Sub client, one record says so (``skipped``)."""
    say = progress.note if progress is not None else (lambda text: None)
    why = pubsub_emulator.unavailable()
    if why:
        say(f"stream: skipped: {why}")
        return _stream_skipped(why, stamp)
    cfg = dict(STREAM_SIZES[bool(quick)], **(sizes or {}))
    mech = build_mechanism("grr", epsilon=STREAM_EPSILON, domain=_DOMAIN)
    rng = np.random.default_rng()
    out: list[dict] = []
    folder = tempfile.mkdtemp(prefix="stream-", dir=tmp)
    say("stream: starting Google's Pub/Sub emulator")
    with pubsub_emulator.PubSubEmulator(start_timeout=90, heap="512m") as emu:
        try:
            _stream_measure(emu, mech, cfg, folder, rng, say, out, stamp or {}, env)
        except Exception as exc:
            raise SectionFailed(f"{type(exc).__name__}: {str(exc)[-1500:]}", out) from exc
    return out


def _stream_measure(emu: Any, mech: Any, cfg: dict, folder: str, rng: Any, say: Any,
                    out: list[dict], stamp: dict, env: dict | None) -> None:
    from google.cloud import pubsub_v1  # lazy: optional dependency (the [pubsub] extra)

    # lazy: Beam (pubsub_lander, pubsub_stream) costs 1.3 s at import (measured; see _land)
    from ldp_beam.transforms.pubsub_lander import drain_plain
    from .pubsub_stream import run_pubsub_stream

    n, rounds = cfg["messages"], cfg["rounds"]
    client = pubsub_v1.SubscriberClient()
    try:
        # warm-up (not measured): the emulator's JVM compiles its hot paths on first use
        topic = emu.topic()
        warm = [emu.subscription(topic, ack_deadline=60) for _ in range(2)]
        _publish(topic, mech, _stream_values(n, rng), 1)
        drain_plain(warm[0], expected=n, timeout=60, subscriber=client)
        _land(warm[1], os.path.join(folder, "warm"), n, client)

        # one backlog of n single-report messages, a subscription per measured run
        topic = emu.topic()
        subs = [(emu.subscription(topic, ack_deadline=60), emu.subscription(topic,
                                                                            ack_deadline=60))
                for _ in range(rounds)]
        pub_secs = _publish(topic, mech, _stream_values(n, rng), 1)
        say(f"stream: published {n:,} single-report messages ({n / pub_secs:,.0f}/s); plain "
            f"pull client and lander, {rounds} interleaved rounds")
        plain, landed = [], []
        for k, (plain_sub, land_sub) in enumerate(subs):
            got, secs = drain_plain(plain_sub, expected=n, timeout=60, subscriber=client)
            if got != n:
                raise RuntimeError(f"the plain pull client received {got:,} of {n:,} messages")
            plain.append(secs)
            stats, secs = _land(land_sub, os.path.join(folder, f"spool-{k}"), n, client)
            if stats.landed != n:
                raise RuntimeError(f"the lander landed {stats.landed:,} of {n:,} reports")
            landed.append(secs)
        plain_rate, land_rate = n / min(plain), n / min(landed)
        ratio = land_rate / plain_rate
        goal = STREAM_TARGETS["ratio_to_plain_pull"]
        out.append(_stream_record(
            "plain-pull", "messages/s", plain_rate, stamp,
            "a plain pull-and-ack client (no parsing, no disk) draining a backlog of "
            "single-report messages: the broker's own rate; the fastest of the rounds",
            messages=n, seconds=min(plain), rounds=rounds,
            all_rates=[round(n / s) for s in plain], publish_messages_per_second=n / pub_secs))
        out.append(_stream_record(
            "lander", "ratio to plain pull", ratio, stamp,
            "the lander (pull, fsync, ids recorded, rename into the spool, ack) on the same "
            "backlog (another subscription of the topic), rounds interleaved with the plain "
            "client's; value: its messages/s over the plain client's (both the fastest round)",
            target=goal, target_of="ratio_to_plain_pull", messages=n, seconds=min(landed),
            rounds=rounds, messages_per_second=land_rate, plain_pull_messages_per_second=
            plain_rate, ratio_to_plain_pull=ratio, all_rates=[round(n / s) for s in landed]))
        say(f"stream: plain pull {plain_rate:,.0f} messages/s; lander {land_rate:,.0f} "
            f"messages/s = {ratio:.2f} of it (goal >= {goal:g}: "
            f"{'met' if ratio >= goal else 'NOT MET'})")

        # batched: m reports, per_message a message
        m, per, brounds = cfg["reports"], cfg["per_message"], cfg["batched_rounds"]
        topic = emu.topic()
        bsubs = [emu.subscription(topic, ack_deadline=60) for _ in range(brounds + 1)]
        msgs = -(-m // per)
        pub_secs = _publish(topic, mech, _stream_values(m, rng), per, time.time() - 30)
        say(f"stream: published {m:,} reports in {msgs:,} messages of {per} "
            f"({m / pub_secs:,.0f} reports/s); the lander, then run_pubsub_stream(once=True)")
        bsecs = []
        for k, sub in enumerate(bsubs[:-1]):
            stats, secs = _land(sub, os.path.join(folder, f"batched-{k}"), msgs, client)
            if stats.landed != m:
                raise RuntimeError(f"the lander landed {stats.landed:,} of {m:,} reports")
            bsecs.append(secs)
        rate = m / min(bsecs)
        goal = STREAM_TARGETS["reports_per_second"]
        out.append(_stream_record(
            "lander-batched", "reports/s", rate, stamp,
            f"the lander on messages of {per} reports (JSON lines, each with its id and event "
            f"time), landed and acked; the fastest of {brounds}",
            target=goal, target_of="reports_per_second", reports=m, messages=msgs,
            reports_per_message=per, seconds=min(bsecs), rounds=brounds,
            messages_per_second=msgs / min(bsecs), reports_per_second=rate,
            all_rates=[round(m / s) for s in bsecs], publish_reports_per_second=m / pub_secs))
        say(f"stream: lander, batched: {rate:,.0f} reports/s (goal >= {goal:,}: "
            f"{'met' if rate >= goal else 'NOT MET'})")
    finally:
        client.close()

    e2e_out = os.path.join(folder, "e2e")
    t = time.perf_counter()
    # the lander's defaults, as `ldp-beam stream --subscription --once` runs it
    summary = run_pubsub_stream(bsubs[-1], e2e_out, mech, once=True, window_seconds=60.0,
                                progress=False, drain_seconds=120.0)
    secs = time.perf_counter() - t
    in_windows = summary["records"]["in_windows"]
    if summary["lander"]["landed"] != m or in_windows != m or summary["reconciles"] is not True:
        raise RuntimeError(f"run_pubsub_stream: {m:,} reports published, "
                           f"{summary['lander']['landed']:,} landed, {in_windows:,} estimated "
                           f"(reconciles: {summary['reconciles']})")
    rate = m / secs
    out.append(_stream_record(
        "end-to-end", "reports/s", rate, stamp,
        "run_pubsub_stream(once=True) on the same batched backlog, as `ldp-beam stream "
        "--subscription --once` runs it: landed (the drain ends at the first batch of fewer "
        "than 1,000 messages), then windowed and estimated by the spool stream on the "
        "DirectRunner, Beam's start-up included; reports/s over its wall time (the 20,000 "
        "reports/s goal is the lander's: lander-batched)",
        reports=m, messages=msgs,
        reports_per_message=per, seconds=secs, reports_per_second=rate,
        landing_seconds=summary["lander"]["seconds"], stream_seconds=summary["seconds"],
        windows=summary["windows"], reconciles=summary["reconciles"]))
    say(f"stream: end to end (land, window, estimate): {rate:,.0f} reports/s in {secs:.1f} s "
        f"(landing {summary['lander']['seconds']:.1f} s, stream {summary['seconds']:.1f} s; "
        f"no goal of its own)")

    # Beam's ReadFromPubSub on the DirectRunner, in a fresh process
    nb = cfg["beam_messages"]
    topic = emu.topic()
    sub = emu.subscription(topic, ack_deadline=60)
    _publish(topic, mech, _stream_values(nb, rng), 1)
    say(f"stream: Beam's ReadFromPubSub (DirectRunner, --streaming) draining {nb:,} messages")
    script = os.path.join(folder, "beam_pubsub.py")
    with open(script, "w") as fh:
        fh.write(_BEAM_PUBSUB_CHILD)
    side = os.path.join(folder, "beam-counts.txt")
    child = {"subscription": sub, "side": side, "timeout": cfg["beam_seconds"],
             "expected": nb}
    r = subprocess.run([sys.executable, script, json.dumps(child)], capture_output=True,
                       text=True, timeout=cfg["beam_seconds"] + 120,
                       env=dict(env or os.environ, **emu.env()))
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"Beam's ReadFromPubSub child failed ({r.returncode}): "
                           f"{r.stderr[-1500:]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    span = (got["last"] - got["first"]) if got["messages"] else None
    beam_rate = got["messages"] / span if span else None
    out.append(_stream_record(
        "beam-pubsub", "messages/s", beam_rate, stamp,
        "Beam's ReadFromPubSub(with_attributes=True) on the DirectRunner (--streaming, a "
        "fresh process) draining a backlog of single-report messages to a counting DoFn: "
        "messages/s from its first element to its last (start-up excluded); stopped with "
        "cancel(); at most once on the DirectRunner (it acks on pull); no goal",
        messages=got["messages"], expected=nb, seconds=span,
        seconds_with_startup=(got["last"] - got["started"]) if got["messages"] else None,
        bundles=got["bundles"], drained=got["messages"] >= nb,
        ratio_to_plain_pull=None if beam_rate is None else beam_rate / plain_rate,
        plain_pull_messages_per_second=plain_rate))
    say(f"stream: Beam's ReadFromPubSub: {got['messages']:,} of {nb:,} messages, "
        + ("none" if beam_rate is None else f"{beam_rate:,.0f} messages/s = "
           f"{beam_rate / plain_rate:.2f} of the plain pull client"))


def _rss_mb(pid: int) -> float | None:
    """A process's resident set (MiB): psutil if installed, else /proc/PID/status VmRSS."""
    try:
        import psutil  # lazy: optional dependency (psutil, in no extra: /proc without it)
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss / 2 ** 20
        except psutil.Error:
            return None
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def rss_trend(samples: list[tuple[float, float]], warmup: float) -> dict:
    """What the soak says about memory, from ``(seconds since start, RSS MiB)`` samples.

    The samples after ``warmup`` seconds (imports, the first windows) are fitted with a least
    squares line. ``slope_mb_per_10min`` is its slope; ``growth_mb`` its rise over the fitted
    span; ``noise_mb`` the standard deviation of the samples around it (the collector's RSS
    jitters with garbage collection, bundles, the lander's batches); ``growth_se_mb`` the
    standard error of that rise. Memory is *flat* when the rise stays within what that noise
    explains, ``bound_mb`` = max(3 x noise + 3 x growth_se, 2% of the median RSS): a rise
    larger than three standard deviations of the jitter (and than its own uncertainty) is a
    trend, not noise; the 2% floor keeps a nearly noiseless run from flagging a few hundred
    KiB. ``bound_mb_per_10min`` is that bound as a slope over the fitted span."""
    pts = [(t, r) for t, r in samples if t >= warmup and r is not None]
    if len(pts) < 3:
        raise ValueError(f"{len(pts)} RSS samples after the {warmup:g} s warm-up: too few to "
                         "fit a trend (a longer soak or more frequent samples)")
    t = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    tc = t - t.mean()
    sxx = float((tc ** 2).sum())
    slope = float((tc * (y - y.mean())).sum() / sxx)
    resid = y - (y.mean() + slope * tc)
    noise = float(np.sqrt((resid ** 2).sum() / (len(y) - 2)))
    span = float(t[-1] - t[0])
    growth = slope * span
    growth_se = noise / np.sqrt(sxx) * span
    bound = max(3 * noise + 3 * growth_se, 0.02 * float(np.median(y)))
    return {"samples": len(pts), "span_seconds": span, "slope_mb_per_10min": slope * 600,
            "growth_mb": growth, "noise_mb": noise, "growth_se_mb": float(growth_se),
            "bound_mb": bound, "bound_mb_per_10min": bound / span * 600 if span else None,
            "flat": bool(growth <= bound), "first_mb": float(y[0]), "last_mb": float(y[-1]),
            "max_mb": float(y.max()), "median_mb": float(np.median(y))}


def stream_soak(seconds: float, tmp: str, progress: Any = None, *, rate: float = SOAK_RATE,
                interval: float | None = None, warmup: float | None = None,
                stamp: dict | None = None, env: dict | None = None) -> list[dict]:
    """``bench --only stream-soak`` (or ``--soak SECONDS``): ``ldp-beam stream --subscription
    ... --duration SECONDS`` runs live as its own process (10 s windows, watermark lag 3 s)
    while a device publishes ``rate`` reports/s (event time now, 10 reports a message) from
    this process until ~15 s before the collector's end; the collector's RSS is sampled every
    ``interval`` seconds (default: seconds/60, within 1-10 s) and summarized by
    :func:`rss_trend` after ``warmup`` (default: 20% of the run, at most 120 s): first (after
    the warm-up), last and max RSS, the slope in MB per 10 min and whether that is flat within
    the samples' noise. The collector must estimate every published report and reconcile."""
    say = progress.note if progress is not None else (lambda text: None)
    why = pubsub_emulator.unavailable()
    if why:
        say(f"stream-soak: skipped: {why}")
        return _stream_skipped(why, stamp, mode="soak")
    interval = interval or min(10.0, max(1.0, seconds / 60))
    warmup = min(120.0, 0.2 * seconds) if warmup is None else warmup
    folder = tempfile.mkdtemp(prefix="soak-", dir=tmp)
    out_dir = os.path.join(folder, "out")
    mech = build_mechanism("grr", epsilon=STREAM_EPSILON, domain=_DOMAIN)
    say(f"stream-soak: starting Google's Pub/Sub emulator; then {seconds:g} s of a live "
        f"collector at {rate:g} reports/s, its RSS sampled every {interval:g} s")
    # the emulator keeps what it was sent in its JVM heap: with the default 256 MiB it stopped
    # answering (connection timeouts) after ~116k messages (1.16M reports, 38 min at 500/s),
    # twice at the same count, loaded or not; an hour at 500 reports/s is 180k messages
    with pubsub_emulator.PubSubEmulator(start_timeout=90, heap="2g") as emu:
        topic = emu.topic()
        sub = emu.subscription(topic, ack_deadline=30)
        cmd = [sys.executable, "-m", "ldp_beam.pipelines.cli", "stream", "--subscription", sub,
               "-o", out_dir, "-m", "grr", "--epsilon", str(STREAM_EPSILON), "-p",
               "domain=" + ",".join(_DOMAIN), "--window", "10", "--watermark-lag", "3",
               "--poll", "1", "--duration", f"{seconds:g}", "--quiet"]
        log = open(os.path.join(folder, "collector.log"), "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(env or os.environ,
                                                                   **emu.env()))
        stop = threading.Event()
        published: list[int] = [0]
        failure: list[BaseException] = []
        publish_until = time.monotonic() + max(1.0, seconds - 15.0)

        retries: list[int] = [0]

        def publish() -> None:
            rng = np.random.default_rng()
            tick = 0.2
            per_tick = max(1, int(round(rate * tick)))
            try:
                with Reporter(mech, device_id="soak-device", topic=topic, batch_size=1000,
                              reports_per_message=10) as rep:
                    nxt = time.monotonic()
                    while not stop.is_set() and time.monotonic() < publish_until:
                        try:  # counted once accepted (a retried batch may be accepted twice
                            # by the broker; the collector counts its report ids once)
                            rep.report_many(_stream_values(per_tick, rng))
                        except PublishError:
                            # as a device does: the batch is kept and sent again (same ids) by
                            # the next flush; a broker starved of CPU for a minute (a test suite
                            # on the same 2 cores) must not end the soak
                            retries[0] += 1
                            while not stop.is_set():
                                stop.wait(1.0)
                                try:
                                    rep.flush()
                                    break
                                except PublishError:
                                    retries[0] += 1
                            nxt = time.monotonic()
                        if rep.pending() == 0:
                            published[0] += per_tick
                        nxt += tick
                        stop.wait(max(0.0, nxt - time.monotonic()))
            except BaseException as exc:  # reported after the collector's end
                failure.append(exc)

        thread = threading.Thread(target=publish, name="soak-publisher", daemon=True)
        t0 = time.monotonic()
        samples: list[tuple[float, float]] = []
        try:
            thread.start()
            deadline = t0 + seconds + 120
            next_note = t0 + 60
            while proc.poll() is None and time.monotonic() < deadline:
                rss = _rss_mb(proc.pid)
                if rss is not None and proc.poll() is None:
                    samples.append((time.monotonic() - t0, rss))
                if time.monotonic() >= next_note:
                    say(f"stream-soak: {time.monotonic() - t0:.0f} s, collector RSS "
                        f"{samples[-1][1] if samples else float('nan'):.0f} MiB, "
                        f"{published[0]:,} reports published")
                    next_note += 60
                time.sleep(max(0.0, interval - (time.monotonic() - t0) % interval))
        finally:
            stop.set()
            thread.join(30)
            stop_processes([proc])
            log.close()
    with open(os.path.join(folder, "collector.log"), "rb") as fh:
        tail = fh.read()[-2000:].decode("utf-8", "replace")
    if failure:
        raise RuntimeError(f"the soak's publisher failed: {failure[0]!r}")
    if proc.returncode != 0:
        raise RuntimeError(f"the collector exited with {proc.returncode}: {tail}")
    from ldp_beam.transforms.windowed import SUMMARY  # lazy: Beam, 1.3 s (see _land)

    with open(os.path.join(out_dir, SUMMARY)) as fh:
        summary = json.load(fh)
    trend = rss_trend(samples, warmup)
    in_windows = summary["records"]["in_windows"]
    rec = _stream_record(
        "soak", "RSS slope MB/10 min", trend["slope_mb_per_10min"], stamp or {},
        f"`ldp-beam stream --subscription` live for {seconds:g} s (a process of its own) while "
        f"a device published {rate:g} reports/s; its RSS every {interval:g} s; the slope of "
        f"a least-squares line through the samples after {warmup:g} s; target: the rise the "
        "samples' noise explains (rss_trend), as a slope", seconds=seconds,
        rate=rate, interval=interval, warmup=warmup, published=published[0],
        publish_retries=retries[0],
        landed=summary["lander"]["landed"], in_windows=in_windows,
        reconciles=summary["reconciles"], windows=summary["windows"],
        rss_start_mb=samples[0][1] if samples else None,
        rss_samples=[[round(t, 1), round(r, 2)] for t, r in samples], **trend)
    rec.update(target=trend["bound_mb_per_10min"], target_of="slope_mb_per_10min",
               meets_target=trend["flat"])
    say(f"stream-soak: RSS first {trend['first_mb']:.0f} MiB (after {warmup:g} s), last "
        f"{trend['last_mb']:.0f}, max {trend['max_mb']:.0f}; slope "
        f"{trend['slope_mb_per_10min']:+.2f} MB/10 min (noise {trend['noise_mb']:.2f} MB; flat "
        f"within {trend['bound_mb']:.1f} MB: {'yes' if trend['flat'] else 'NO'}); "
        f"{published[0]:,} reports published, {in_windows:,} estimated")
    if in_windows != published[0] or summary["reconciles"] is not True:
        raise SectionFailed(f"the soak's collector estimated {in_windows:,} of "
                             f"{published[0]:,} published reports (reconciles: "
                             f"{summary['reconciles']})", [rec])
    return [rec]


def _stream_line(by_mode: dict[str, dict]) -> str:
    """The performance table's line for the stream section's records (keyed by mode)."""
    def met(r: dict) -> str:
        return "met" if r.get("meets_target") else "**not met**"

    parts = []
    if r := by_mode.get("plain-pull"):
        parts.append(f"a plain pull client {r['value']:,.0f} messages/s")
    if r := by_mode.get("lander"):
        parts.append(f"the lander {r['messages_per_second']:,.0f} messages/s, "
                     f"{r['value']:.2f} of it (goal ≥ {r['target']:g}: {met(r)})")
    if r := by_mode.get("lander-batched"):
        parts.append(f"batched ({r['reports_per_message']} reports a message) "
                     f"{r['value']:,.0f} reports/s (goal ≥ {r['target']:,.0f}: {met(r)})")
    if r := by_mode.get("end-to-end"):
        parts.append(f"end to end, landed and estimated (`stream --subscription --once`, "
                     f"Beam's start-up included) {r['value']:,.0f} reports/s")
    if r := by_mode.get("beam-pubsub"):
        parts.append(f"Beam's `ReadFromPubSub` on the DirectRunner {r['value']:,.0f} "
                     f"messages/s" + (f" ({r['ratio_to_plain_pull']:.2f} of the plain client)"
                                      if r.get("ratio_to_plain_pull") else ""))
    if r := by_mode.get("soak"):
        parts.append(f"a {r['seconds'] / 60:.0f}-minute soak at {r['rate']:g} reports/s: "
                     f"collector RSS {r['first_mb']:.0f} → {r['last_mb']:.0f} MiB (max "
                     f"{r['max_mb']:.0f}), {r['slope_mb_per_10min']:+.1f} MB per 10 min "
                     f"({'flat' if r['flat'] else '**growing**'} within the samples' noise)")
    return ("Live stream through Google's Pub/Sub emulator (`--only stream`, one run): "
            + "; ".join(parts) + ".")


