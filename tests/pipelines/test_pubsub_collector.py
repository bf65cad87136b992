"""The collector of live telemetry against Google's Pub/Sub emulator (issue 24).

* ``kill -9`` of the whole collector (``ldp-beam stream --subscription``: lander and stream)
  while devices keep publishing, then a restart: every window is published exactly once, with
  the count of reports the producer logged for it; nothing is counted twice.
* Beam's own ``ReadFromPubSub`` path (``--beam-pubsub``) runs on the DirectRunner, honours
  ``--duration``, fires the windows open at the stop, and states that it is at most once.

One emulator for the module (a free loopback port, a bounded start, always stopped).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("google.cloud.pubsub_v1", reason="google-cloud-pubsub is not installed "
                    "(pip install -e '.[pubsub]')")

from ldp_beam_test_helpers import read_jsonl  # noqa: E402
from ldp_beam.client import Reporter  # noqa: E402

DOMAIN = ("a", "b", "c", "d")
GRR = {"epsilon": 1.0, "domain": ",".join(DOMAIN)}
WINDOW = 2
# the emulator's subscriptions have a 10 s ack deadline: what a killed collector had pulled comes
# back after it, so the watermark lag covers it (the collector says so when it does not)
LAG = 12


class Producer(threading.Thread):
    """Devices publishing at a steady rate with event time = now; logs how many reports each
    window got (by the event time it stamped)."""

    def __init__(self, topic: str, state: str, seconds: float, rate: float = 200.0,
                 per_message: int = 1) -> None:
        super().__init__(daemon=True)
        self.topic, self.state, self.seconds, self.rate = topic, state, seconds, rate
        self.per_message = per_message
        self.per_window: Counter = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = np.random.default_rng(7)
        try:
            with Reporter("grr", params=GRR, device_id="fleet", topic=self.topic,
                          seq_store=self.state, batch_size=20,
                          reports_per_message=self.per_message) as rep:
                end = time.time() + self.seconds
                while time.time() < end:
                    t0 = time.time()
                    times = np.full(20, t0)
                    rep.report_many([DOMAIN[i] for i in rng.integers(0, 4, 20)], times)
                    self.per_window[int(t0 // WINDOW) * WINDOW] += 20
                    time.sleep(max(0.0, 20 / self.rate - (time.time() - t0)))
        except BaseException as exc:  # reported by the test
            self.error = exc


def _collector(sub: str, out, duration: float, log) -> subprocess.Popen:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.Popen(
        [sys.executable, "-m", "ldp_beam.pipelines.cli", "stream", "--subscription", sub,
         "-m", "grr", "-p", "epsilon=1", "-p", f"domain={GRR['domain']}", "--window",
         str(WINDOW), "--poll", "0.2", "--duration", str(duration), "-o", str(out),
         "--watermark-lag", str(LAG)],
        stdout=subprocess.PIPE, stderr=log, env=env, text=True)


def test_kill_9_of_the_collector_with_live_devices_then_a_restart_counts_every_report_once(
        emulator, tmp_path):
    topic = emulator.topic()
    sub = emulator.subscription(topic)
    out = tmp_path / "out"
    producer = Producer(topic, str(tmp_path / "device"), seconds=16.0, per_message=5)
    log = open(tmp_path / "collector.txt", "w")
    first = _collector(sub, out, 120, log)
    producer.start()
    ends = time.time() + 16.0
    try:
        deadline = time.time() + 60
        claimed = out / "spool" / ".claimed"
        while not (claimed.exists() and os.listdir(claimed)):  # running: landed files are read
            assert first.poll() is None and time.time() < deadline, \
                (tmp_path / "collector.txt").read_text()
            time.sleep(0.05)
        time.sleep(1.7 * WINDOW)  # mid-window, mid-landing
        assert producer.is_alive(), "the producer ended before the kill: lengthen it"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
    time.sleep(1.0)  # the devices go on publishing while the collector is down
    # the restart runs until the devices' last window has closed (a clean stop at the end)
    second = _collector(sub, out, max(5.0, ends - time.time()) + 2 * WINDOW + LAG + 4, log)
    try:
        producer.join(60)
        so, _ = second.communicate(timeout=120)
    finally:
        if second.poll() is None:
            second.kill()
        log.close()
    assert producer.error is None, producer.error
    assert second.returncode == 0, (tmp_path / "collector.txt").read_text()
    rows = read_jsonl(out / "estimates.jsonl")
    panes = Counter((r["window_start_epoch"], r["pane"]["index"]) for r in rows)
    assert max(panes.values()) == 1, "a pane was published twice"
    got = {int(r["window_start_epoch"]): r["n_reports"] for r in rows}
    assert got == dict(producer.per_window), (got, dict(producer.per_window))
    assert sum(got.values()) == sum(producer.per_window.values())
    summary = json.loads((out / "curator" / "summary.json").read_text())
    assert summary["reconciles"] and summary["delivery"].startswith("exactly once")


def test_beam_read_from_pubsub_runs_honours_duration_and_says_at_most_once(emulator, tmp_path):
    from ldp_beam.pipelines.stream import run_stream
    from ldp_beam.registry import build_mechanism

    topic = emulator.topic()
    sub = emulator.subscription(topic)
    producer = Producer(topic, str(tmp_path / "device"), seconds=5.0, rate=100)
    producer.start()
    t0 = time.monotonic()
    s = run_stream(str(tmp_path / "out"), build_mechanism("grr", **GRR), subscription=sub,
                   window_seconds=WINDOW, duration=6.0, progress=False)
    took = time.monotonic() - t0
    producer.join(30)
    assert producer.error is None
    # stopped at the duration, then one window and a margin to let open windows fire, then at
    # most 5 s for the cancel (start-up of Beam and the pipeline: up to 15 s on this machine)
    assert took < 6.0 + (WINDOW + 2.0) + 5.0 + 15.0, took
    assert s["delivery"].startswith("at most once")
    rows = read_jsonl(tmp_path / "out" / "estimates.jsonl")
    assert rows and sum(r["n_reports"] for r in rows) == s["records"]["in_windows"] > 0
    published = sum(producer.per_window.values())
    r = s["records"]
    assert r["read"] == r["in_windows"] + r["invalid"] + r["dropped_by_windowing"]
    assert r["in_windows"] <= r["read"] <= published
    # what Beam's DirectRunner watermark (the wall clock) drops is counted, never hidden
    assert s["reconciles"] == (r["dropped_by_windowing"] == 0)


def test_results_topic_gets_each_pane_with_its_release_id(emulator, tmp_path):
    from google.cloud import pubsub_v1

    from ldp_beam.pipelines.stream import run_stream
    from ldp_beam.registry import build_mechanism
    from ldp_beam_test_helpers import write_file

    mech = build_mechanism("grr", **GRR)
    spool = tmp_path / "spool"
    spool.mkdir()
    t0 = 1_700_000_000
    rep = mech.perturb({"value": np.array(list(DOMAIN) * 10)}, rng=3)
    recs = [{"v": int(v)} for v in rep["v"]]
    write_file(spool, "a.jsonl", [{**r, "ts": t0 + 1 + (i % 2) * 10} for i, r in enumerate(recs)])
    topic = emulator.topic()
    sub = emulator.subscription(topic)
    out = tmp_path / "out"
    for _ in range(2):  # the second run re-sends the unsettled panes: same release ids
        run_stream(str(out), mech, spool=str(spool), window_seconds=10, once=True,
                   progress=False, results_topic=topic)
    rows = {f"{r['window_start']}/{r['pane']['index']}": r
            for r in read_jsonl(out / "estimates.jsonl")}
    assert len(rows) == 2
    client = pubsub_v1.SubscriberClient()
    got: list = []
    deadline = time.time() + 30
    while len(got) < 4 and time.time() < deadline:
        resp = client.pull(subscription=sub, max_messages=10, timeout=10)
        got += resp.received_messages
        if resp.received_messages:
            client.acknowledge(subscription=sub,
                               ack_ids=[m.ack_id for m in resp.received_messages])
    by_id = {}
    for m in got:
        by_id.setdefault(m.message.attributes["release_id"], []).append(
            json.loads(m.message.data))
    assert set(by_id) == set(rows)  # deduplicated by release_id, a subscriber has each once
    for rid, copies in by_id.items():
        assert all(c == rows[rid] for c in copies)


def test_cli_beam_pubsub_runs_and_says_at_most_once(emulator, tmp_path):
    topic = emulator.topic()
    sub = emulator.subscription(topic)
    producer = Producer(topic, str(tmp_path / "device"), seconds=3.0, rate=100)
    producer.start()
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [sys.executable, "-m", "ldp_beam.pipelines.cli", "stream", "--subscription", sub,
         "--beam-pubsub", "-m", "grr", "-p", "epsilon=1", "-p", f"domain={GRR['domain']}",
         "--window", str(WINDOW), "--duration", "4", "-o", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=120)
    producer.join(30)
    summary = json.loads((tmp_path / "out" / "curator" / "summary.json").read_text())
    assert summary["delivery"].startswith("at most once"), proc.stderr
    # exit 0 only when every record read is in a window; else 1, and the summary says why
    assert proc.returncode == (0 if summary["reconciles"] else 1), proc.stderr
    assert "through Beam's ReadFromPubSub" in proc.stderr
