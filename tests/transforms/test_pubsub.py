"""Live telemetry on a real broker: Google's Pub/Sub emulator, started here on 127.0.0.1.

Devices publish with :class:`ldp_beam.client.Reporter` (and ``ldp-beam emit``); the collector
lands with :class:`ldp_beam.transforms.pubsub_lander.Lander` into a spool folder. What is
proven: every report lands once with its id and event time (one report per message and
batched); a re-published batch lands once; a ``kill -9`` of the lander at each point of its
landing (before the record's commit, between commit and rename, between rename and ack) loses
nothing and lands nothing twice after a restart; poison messages are dead-lettered and acked;
raw values never appear in what is published. The landing rate is measured beside a plain
pull-and-ack client draining the same backlog.

One emulator for the module (tests/pubsub_emulator.py: a free loopback port, bounded start,
always stopped); each test makes its own topic and subscriptions. Skipped only when java or the
emulator is absent (.ci/run fails in that case).
"""
from __future__ import annotations

import glob
import importlib.util
import io
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

_spec = importlib.util.spec_from_file_location(
    "ldp_beam_pubsub_emulator_helper",  # tests/pubsub_emulator.py
    os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "pubsub_emulator.py"))
pubsub_emulator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pubsub_emulator)

pytest.importorskip("google.cloud.pubsub_v1", reason="google-cloud-pubsub is not installed "
                    "(pip install -e '.[pubsub]')")

from ldp_beam.client import BatchPublisher, PublishError, Reporter, SCHEMA_KEY  # noqa: E402
from ldp_beam.transforms.pubsub_lander import (CRASH_ENV, LANDER_DIR, TEMP_PREFIX,  # noqa: E402
                                               Lander, LanderError, drain_plain)
from ldp_beam.transforms.spool import event_micros  # noqa: E402

DOMAIN = ("alpha-secret-label", "bravo-secret-label", "charlie-secret-label")
GRR = {"epsilon": 1.0, "domain": ",".join(DOMAIN)}


def _lines(spool: str) -> list[dict]:
    """Every record in the spool's files (new, claimed or done)."""
    out = []
    for sub in ("", ".claimed", ".done"):
        for path in sorted(glob.glob(os.path.join(spool, sub, "*.jsonl"))):
            with open(path) as fh:
                out.extend(json.loads(line) for line in fh if line.strip())
    return out


def _land(sub: str, spool: str, messages: int, timeout: float = 60.0, **kw) -> Lander:
    lander = Lander(sub, spool, **kw)
    with lander:
        lander.run(timeout, stop_when=lambda ld: ld.stats.messages >= messages)
    return lander


def _values(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [DOMAIN[i] for i in rng.integers(0, len(DOMAIN), n)]


# --------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("per_message", [1, 50])
def test_reporter_publishes_and_lander_lands_every_report_once(emulator, tmp_path, per_message):
    topic = emulator.topic()
    sub = emulator.subscription(topic)
    n = 700
    times = 1_700_000_000 + np.arange(n) * 0.37 + 0.000001  # microseconds that must survive
    with Reporter("grr", params=GRR, device_id="device-7", topic=topic,
                  seq_store=str(tmp_path / "dev"), batch_size=256,
                  reports_per_message=per_message) as rep:
        receipt = rep.report_many(_values(n), times)
    assert receipt.published == n and not receipt.invalid and rep.pending() == 0
    assert len(set(receipt.ids)) == n
    n_messages = n if per_message == 1 else -(-256 // per_message) * 2 + -(-(n - 512) //
                                                                             per_message)
    lander = _land(sub, str(tmp_path / "spool"), n_messages)
    lines = _lines(str(tmp_path / "spool"))
    assert len(lines) == n and lander.stats.landed == n and lander.stats.duplicates == 0
    assert lander.stats.messages == n_messages and lander.stats.acked == n_messages
    by_id = {ln["report_id"]: ln for ln in lines}
    assert set(by_id) == set(receipt.ids)
    for rid, t in zip(receipt.ids, times):
        assert event_micros(by_id[rid]["ts"]) == int(round(t * 1_000_000))
    assert {ln["v"] for ln in lines} <= {0, 1, 2}
    assert lander.landed_ids() == set(receipt.ids)


def test_a_republished_batch_lands_once_and_a_restarted_device_reuses_no_id(emulator,
                                                                            tmp_path):
    """The broker accepts a batch but the device never hears so (its publish 'times out'): the
    batch stays in the outbox, and the restarted device re-publishes it byte for byte (same
    ids, same noise). The collector lands it once; the device's next reports have fresh ids."""
    topic = emulator.topic()
    sub = emulator.subscription(topic)
    state = str(tmp_path / "dev")

    class LostReply(BatchPublisher):
        def publish_batch(self, topic, messages, timeout=60.0):
            super().publish_batch(topic, messages, timeout)  # the broker has it ...
            raise TimeoutError("no reply")  # ... the device does not know

    first = Reporter("grr", params=GRR, device_id="dev-r", topic=topic, seq_store=state,
                     publisher=LostReply())
    with pytest.raises(PublishError, match="same report ids"):
        first.report_many(_values(40))
    outbox = os.listdir(os.path.join(state, "outbox"))
    assert len(outbox) == 1 and first.pending() == 40
    with open(os.path.join(state, "outbox", outbox[0])) as fh:
        kept = fh.read()
    assert not any(label in kept for label in DOMAIN)  # the outbox holds reports, not values

    again = Reporter("grr", params=GRR, device_id="dev-r", topic=topic, seq_store=state)
    assert again.pending() == 40
    assert again.flush() == 40 and again.pending() == 0
    later = again.report_many(_values(10, seed=1))
    again.close()
    lander = _land(sub, str(tmp_path / "spool"), 90)
    lines = _lines(str(tmp_path / "spool"))
    ids = [ln["report_id"] for ln in lines]
    assert len(ids) == 50 == len(set(ids)) and lander.stats.duplicates == 40
    assert set(later.ids) <= set(ids)
    assert lander.stats.dead_lettered == 0  # same id, same report: a duplicate, no conflict


# --------------------------------------------------------------------------- kill -9
def _lander_process(sub: str, spool: str, crash: str) -> subprocess.Popen:
    env = {**os.environ, CRASH_ENV: crash}
    return subprocess.Popen(
        [sys.executable, "-m", "ldp_beam.transforms.pubsub_lander", "--subscription", sub,
         "--spool", spool, "--max-messages", "20", "--duration", "60", "--quiet"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_kill_9_at_each_point_of_landing_loses_nothing_and_lands_nothing_twice(emulator,
                                                                               tmp_path):
    """A lander process is killed (SIGKILL, by itself at a chosen point of its first batch of
    20 messages): before the landed record's commit, between the commit and the rename into
    the spool, between the rename and the ack. A restarted lander repairs what it must, the
    unacknowledged batch is redelivered after its ack deadline (10 s), and every one of the 50
    reports is in the spool exactly once. The three cases run side by side (one wait)."""
    n = 50
    cases = {}
    for crash in ("before-commit", "after-commit", "after-rename"):
        topic = emulator.topic()
        sub = emulator.subscription(topic, ack_deadline=10)
        with Reporter("grr", params=GRR, device_id=f"dev-{crash}", topic=topic,
                      seq_store=str(tmp_path / crash / "dev")) as rep:
            ids = rep.report_many(_values(n)).ids
        spool = str(tmp_path / crash / "spool")
        cases[crash] = (sub, spool, ids, _lander_process(sub, spool, crash))
    for crash, (sub, spool, ids, proc) in cases.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == -9, (crash, proc.returncode, err[-2000:])
        temps = glob.glob(os.path.join(spool, TEMP_PREFIX + "*"))
        landed = _lines(spool)
        if crash == "after-rename":  # landed, recorded, never acknowledged
            assert len(landed) == 20 and not temps
        else:  # written to a temporary file only
            assert landed == [] and len(temps) == 1

    landers: dict[str, Lander] = {}

    def restart(crash: str) -> None:
        sub, spool, ids, _ = cases[crash]
        # 30 messages never pulled + the 20 of the killed batch, redelivered after 10 s
        landers[crash] = _land(sub, spool, n, timeout=60)

    threads = [threading.Thread(target=restart, args=(c,)) for c in cases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    for crash, (sub, spool, ids, _) in cases.items():
        lander = landers[crash]
        lines = _lines(spool)
        got = [ln["report_id"] for ln in lines]
        assert sorted(got) == sorted(ids), crash  # every report, each once
        assert not glob.glob(os.path.join(spool, TEMP_PREFIX + "*")), crash
        assert lander.stats.messages == n and lander.stats.dead_lettered == 0, crash
        if crash == "before-commit":  # nothing was recorded: the redelivery lands them
            assert lander.stats.duplicates == 0 and lander.stats.recovered == 0
        elif crash == "after-commit":  # the restart renamed the file in; redelivery = dups
            assert lander.stats.recovered == 1 and lander.stats.duplicates == 20
        else:
            assert lander.stats.recovered == 1 and lander.stats.duplicates == 20
        assert lander.landed_ids() == set(ids)


# --------------------------------------------------------------------------- poison
def test_poison_messages_are_dead_lettered_with_their_reason_and_acked(emulator, tmp_path):
    from google.cloud import pubsub_v1

    topic = emulator.topic()
    sub = emulator.subscription(topic, ack_deadline=10)
    pub = pubsub_v1.PublisherClient()
    ts = "2024-05-01T00:00:00Z"
    poison = [
        (b"not json at all", {"report_id": "p1", "ts": ts}, "corrupt JSON"),
        (b"[1, 2, 3]", {"report_id": "p2", "ts": ts}, "not an object"),
        # a batched message: its line without an id is dead-lettered, the other line lands
        (b'{"v": 1, "ts": 1}\n{"v": 2, "report_id": "ok-in-batch", "ts": 1}', {"ts": ts},
         "no report id"),
        (b'{"v": 1, "report_id": "p4"}', {}, "no event time"),
        (b'{"v": 1, "report_id": "p5", "ts": "yesterday"}', {}, "neither epoch seconds"),
        (b"\xff\xfe\x00garbage", {"report_id": "p6", "ts": ts}, "not UTF-8"),
        (b'{"v": 1, "pad": "' + b"x" * (2 << 20) + b'"}', {"report_id": "p7", "ts": ts},
         "larger than the limit"),
        (b'{"v": 1, "report_id": "' + b"z" * 300 + b'", "ts": 1}', {}, "invalid report id"),
    ]
    good = (b'{"v": 2}', {"report_id": "good-1", "ts": ts})
    futures = [pub.publish(topic, data, **attrs) for data, attrs, _ in poison]
    futures.append(pub.publish(topic, good[0], **good[1]))
    for f in futures:
        f.result(timeout=30)
    spool = str(tmp_path / "spool")
    lander = _land(sub, spool, len(futures))
    assert lander.stats.messages == 9 and lander.stats.acked == 9
    assert lander.stats.dead_lettered == len(poison) and lander.stats.landed == 2
    lines = {ln["report_id"]: ln for ln in _lines(spool)}
    assert sorted(lines) == ["good-1", "ok-in-batch"]
    assert event_micros(lines["good-1"]["ts"]) == event_micros(ts)
    with open(os.path.join(spool, LANDER_DIR, "deadletter.jsonl")) as fh:
        dead = [json.loads(line) for line in fh]
    assert len(dead) == len(poison)
    for _, _, why in poison:
        hits = [d for d in dead if why in d["reason"]]
        assert len(hits) == 1, (why, [d["reason"] for d in dead])
        assert hits[0]["message_id"] and len(hits[0]["data"]) <= 1000
    big = next(d for d in dead if "larger than the limit" in d["reason"])
    assert big["size"] > 2 << 20
    # acknowledged: nothing comes back once the ack deadline (10 s) has passed
    time.sleep(11)
    from google.cloud import pubsub_v1 as ps

    client = ps.SubscriberClient()
    resp = client.pull(request={"subscription": sub, "max_messages": 100}, timeout=5.0,
                       retry=None)
    client.close()
    assert len(resp.received_messages) == 0


# --------------------------------------------------------------------------- privacy
@pytest.mark.parametrize("per_message,memoize", [(1, None), (20, True)])
def test_raw_values_never_leave_the_client(emulator, tmp_path, per_message, memoize):
    """What the broker holds (every message's data and attributes, pulled back raw) never
    contains a value's text, nor the device id (sent only when asked, as a unit field)."""
    from google.cloud import pubsub_v1

    topic = emulator.topic()
    sub = emulator.subscription(topic)
    values = _values(200, seed=3)
    with Reporter("grr", params=GRR, device_id="device-secret-id", topic=topic,
                  seq_store=str(tmp_path / "dev"), reports_per_message=per_message,
                  memoize=memoize) as rep:
        rep.report_many(values)
        for v in values[:5]:
            rep.report(v)
    client = pubsub_v1.SubscriberClient()
    seen, blobs = 0, []
    deadline = time.monotonic() + 30
    expected = 205 if per_message == 1 else -(-200 // per_message) + 1
    while seen < expected and time.monotonic() < deadline:
        resp = client.pull(request={"subscription": sub, "max_messages": 1000}, timeout=5.0,
                           retry=None)
        for rm in resp.received_messages:
            blobs.append(rm.message.data)
            blobs.extend(f"{k}={v}".encode() for k, v in rm.message.attributes.items())
        seen += len(resp.received_messages)
        if resp.received_messages:
            client.acknowledge(request={"subscription": sub, "ack_ids": [
                rm.ack_id for rm in resp.received_messages]}, timeout=10.0)
    client.close()
    assert seen == expected
    wire = b"\n".join(blobs)
    for label in DOMAIN + ("secret",):
        assert label.encode() not in wire, label
    assert b"device-secret-id" not in wire
    if memoize:
        assert b"memo_id" in wire  # the slot id travels; the secret and the value do not
        secret = open(tmp_path / "dev" / "secret", "rb").read()
        assert secret not in wire and secret.hex().encode() not in wire


# --------------------------------------------------------------------------- the CLI
def test_emit_publishes_a_column_and_prints_how_many(emulator, tmp_path, capsys, monkeypatch):
    from ldp_beam.pipelines import emit

    topic = emulator.topic()
    sub = emulator.subscription(topic)
    csv = tmp_path / "in.csv"
    rows = _values(120, seed=5)
    csv.write_text("fruit,t\n" + "".join(f"{v},{1_700_000_000 + i}\n"
                                         for i, v in enumerate(rows)) + "not-a-label,5\n"
                   + f"{rows[0]},yesterday\n")  # a valid value with an invalid time
    code = emit.main(["--topic", topic, "--device-id", "cli-dev", "-i", str(csv), "-c", "fruit",
                      "--timestamp-column", "t", "-m", "grr", "-p", "epsilon=1", "-p",
                      f"domain={GRR['domain']}", "--state", str(tmp_path / "st"),
                      "--reports-per-message", "25"])
    out, err = capsys.readouterr()
    assert code == 1, err  # one value was invalid: listed, not sent
    assert "published 120 reports" in out and "row 121" in err and "not-a-label" in err
    assert "row 122" in err and "'yesterday' is not epoch seconds" in err
    lander = _land(sub, str(tmp_path / "spool"), 5)
    lines = _lines(str(tmp_path / "spool"))
    assert len(lines) == 120 and lander.stats.messages == 5
    assert sorted(event_micros(ln["ts"]) // 1_000_000 for ln in lines) == \
        [1_700_000_000 + i for i in range(120)]
    # standard input, one value per line; the second run continues the device's sequence
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(v + "\n" for v in rows[:7])))
    assert emit.main(["--topic", topic, "--device-id", "cli-dev", "-m", "grr", "-p",
                      "epsilon=1", "-p", f"domain={GRR['domain']}", "--state",
                      str(tmp_path / "st")]) == 0
    assert "published 7 reports" in capsys.readouterr().out
    _land(sub, str(tmp_path / "spool"), 7)
    assert len({ln["report_id"] for ln in _lines(str(tmp_path / "spool"))}) == 127


@pytest.mark.parametrize("args,option", [
    (["--topic", "nope"], "--topic"),
    (["--topic", "projects/p/topics/t", "-i", "/does/not/exist.csv", "-c", "x"], "--input"),
    (["--topic", "projects/p/topics/t", "--batch-size", "0"], "--batch-size"),
    (["--topic", "projects/p/topics/t", "-m", "nosuch"], "--mechanism"),
    (["--topic", "projects/p/topics/t", "-m", "dphr", "-p", "epsilon=1"], "--mechanism"),
])
def test_emit_option_errors_are_one_line_naming_the_option(tmp_path, capsys, args, option):
    from ldp_beam.pipelines import emit

    code = emit.main([*args, "--device-id", "d", "--state", str(tmp_path / "st"),
                      *(["-m", "grr", "-p", "epsilon=1", "-p", "domain=a,b"]
                        if "-m" not in args else [])])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("ldp-beam emit: error: " + option), err


# --------------------------------------------------------------------------- bounded
def test_stop_ends_the_lander_within_its_pull_timeout_and_one_lander_per_spool(emulator,
                                                                               tmp_path):
    topic = emulator.topic()
    sub = emulator.subscription(topic)
    lander = Lander(sub, str(tmp_path / "spool"), pull_timeout=1.0)
    lander.open()
    with pytest.raises(LanderError, match="another lander"):
        Lander(sub, str(tmp_path / "spool")).open()
    t = threading.Thread(target=lander.run)
    t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    lander.stop()
    t.join(timeout=10)
    assert not t.is_alive() and time.monotonic() - t0 < 3.0
    lander.close()


def test_the_client_imports_neither_beam_nor_the_pubsub_client():
    code = ("import sys, ldp_beam.client as c; "
            "bad = [m for m in sys.modules if m.startswith(('apache_beam', 'google.cloud'))]; "
            "print(bad); assert not bad; assert c.SCHEMA_KEY")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    from ldp_beam.transforms.batches import SCHEMA_KEY as BEAM_KEY

    assert SCHEMA_KEY == BEAM_KEY


# --------------------------------------------------------------------------- rate
def test_landing_rate_beside_a_plain_pull_client_on_the_same_backlog(emulator, tmp_path):
    """One backlog, two subscriptions: a plain client pulls and acks one (the broker's own
    rate, no parsing, no disk), the lander lands the other. Both rates are printed; the ratio
    must stay well above noise (the issue's goal is >= 0.5 on an idle machine)."""
    topic = emulator.topic()
    plain_sub = emulator.subscription(topic, ack_deadline=60)
    land_sub = emulator.subscription(topic, ack_deadline=60)
    n = 20_000
    with Reporter("grr", params=GRR, device_id="bench", topic=topic,
                  seq_store=str(tmp_path / "dev")) as rep:
        t0 = time.perf_counter()
        rep.report_many(_values(n))
        publish_rate = n / (time.perf_counter() - t0)
    got, seconds = drain_plain(plain_sub, expected=n, timeout=120)
    assert got == n
    plain_rate = got / seconds
    t0 = time.perf_counter()
    lander = _land(land_sub, str(tmp_path / "spool"), n, timeout=120)
    land_rate = n / (time.perf_counter() - t0)
    assert lander.stats.landed == n
    # batched messages: 100 reports each
    topic2 = emulator.topic()
    sub2 = emulator.subscription(topic2, ack_deadline=60)
    m = 50_000
    with Reporter("grr", params=GRR, device_id="bench2", topic=topic2, batch_size=10_000,
                  seq_store=str(tmp_path / "dev2"), reports_per_message=100) as rep:
        rep.report_many(_values(m))
    t0 = time.perf_counter()
    lander2 = _land(sub2, str(tmp_path / "spool2"), m // 100, timeout=120)
    batched_rate = m / (time.perf_counter() - t0)
    assert lander2.stats.landed == m
    record = {"publish_messages_per_s": round(publish_rate), "plain_pull_messages_per_s":
              round(plain_rate), "lander_messages_per_s": round(land_rate),
              "ratio": round(land_rate / plain_rate, 3),
              "lander_batched_reports_per_s": round(batched_rate)}
    print("\npubsub rates:", json.dumps(record))
    assert land_rate / plain_rate > 0.2, record


# --------------------------------------------------------------------------- stream prototype
def test_pubsub_stream_lands_then_streams_the_spool(emulator, tmp_path):
    """pipelines/pubsub_stream.py: a backlog (event times 20 s ago) and reports published while
    the stream runs, one re-published batch among them, are estimated per window, each report
    once, and the run reconciles."""
    from ldp_beam.pipelines.pubsub_stream import run_pubsub_stream
    from ldp_beam.registry import build_mechanism

    mech = build_mechanism("grr", epsilon=1.0, domain=GRR["domain"])
    topic = emulator.topic()
    sub = emulator.subscription(topic, ack_deadline=10)
    state = str(tmp_path / "dev")
    with Reporter(mech, device_id="dev-s", topic=topic, seq_store=state) as rep:
        rep.report_many(_values(300), time.time() - 20)

    def live():
        time.sleep(3)
        with Reporter(mech, device_id="dev-s", topic=topic, seq_store=state) as rep:
            rep.report_many(_values(100, seed=2))
        dup = Reporter(mech, device_id="dev-t", topic=topic, seq_store=str(tmp_path / "dev2"),
                       publisher=_Twice())
        dup.report_many(_values(50, seed=4))  # published twice: counted once

    feeder = threading.Thread(target=live)
    feeder.start()
    out = str(tmp_path / "out")
    summary = run_pubsub_stream(sub, out, mech, window_seconds=2, watermark_lag=4,
                                poll_seconds=0.5, duration=12, progress=False)
    feeder.join(30)
    assert summary["lander"]["landed"] == 450 and summary["lander"]["duplicates"] == 50
    assert summary["records"]["in_windows"] == 450, summary["records"]
    assert summary["reconciles"] is True
    rows = [json.loads(line) for line in open(os.path.join(out, "estimates.jsonl"))]
    last = {}
    for r in rows:  # the last pane of each window holds its estimate
        w = r["window_start"]
        if w not in last or r["pane"]["index"] > last[w]["pane"]["index"]:
            last[w] = r
    assert rows and sum(r["n_reports"] for r in last.values()) == 450
    # the team's ledger knows the stream by its subscription, not by the landing folder
    assert summary["ledger"]["dataset"] == f"pubsub://{sub}"
    assert summary["ledger"]["run_epsilon"] == 1.0  # per record: the report's epsilon, once


class _Twice(BatchPublisher):
    def publish_batch(self, topic, messages, timeout=60.0):
        super().publish_batch(topic, messages, timeout)
        return super().publish_batch(topic, messages, timeout)


# --------------------------------------------------------------------------- without a broker
class _FakeSubscriber:
    """Pull answers scripted in advance; acks recorded (the lander's own logic, no broker)."""

    def __init__(self, batches):
        self.batches, self.acked = list(batches), []

    def pull(self, request, timeout, retry):
        from types import SimpleNamespace

        return SimpleNamespace(received_messages=self.batches.pop(0) if self.batches else [])

    def acknowledge(self, request, timeout, retry):
        self.acked.extend(request["ack_ids"])


def _fake_message(i, data, **attrs):
    from types import SimpleNamespace

    return SimpleNamespace(ack_id=f"ack-{i}", message=SimpleNamespace(
        data=data, attributes=attrs, message_id=f"m{i}", publish_time=None))


def test_a_reused_id_with_another_report_is_a_conflict_and_retention_forgets_old_ids(tmp_path):
    ts = "2024-05-01T00:00:00.000000Z"
    fake = _FakeSubscriber([
        [_fake_message(1, b'{"v":1}', report_id="r1", ts=ts)],
        [],  # (ends the first batch's gathering)
        [_fake_message(2, b'{"v":2}', report_id="r1", ts=ts),  # same id, another report
         _fake_message(3, b'{"v":1}', report_id="r1", ts=ts)],  # the same report again
    ])
    spool = str(tmp_path / "spool")
    with Lander("projects/p/subscriptions/s", spool, subscriber=fake) as lander:
        assert lander.land_once() == 1 and lander.land_once() == 2
        assert lander.stats.landed == 1 and lander.stats.duplicates == 1
        assert lander.stats.dead_lettered == 1 and fake.acked == ["ack-1", "ack-2", "ack-3"]
    dead = [json.loads(x) for x in open(os.path.join(spool, LANDER_DIR, "deadletter.jsonl"))]
    assert "different report" in dead[0]["reason"] and dead[0]["report_id"] == "r1"
    assert [ln["v"] for ln in _lines(spool)] == [1]
    fake.batches = [[_fake_message(4, b'{"v":1}', report_id="r1", ts=ts)]]
    with Lander("projects/p/subscriptions/s", spool, subscriber=fake,
                retention_seconds=0.0) as lander:
        assert lander.prune() == 1 and lander.landed_ids() == set()
        lander.land_once()  # past the retention, a re-published report lands again
        assert lander.stats.landed == 1
    assert [ln["v"] for ln in _lines(spool)] == [1, 1]


def test_cli_emit_then_stream_subscription_counts_every_report_once(emulator, tmp_path):
    """The command line end to end: `ldp-beam emit` publishes from a device (event times in the
    past), the same batch is published again by a retrying device, and `ldp-beam stream
    --subscription ... --once` lands the backlog (fsync, then ack) and estimates each report
    once."""
    from ldp_beam.pipelines.cli import main

    topic = emulator.topic()
    sub = emulator.subscription(topic, ack_deadline=10)
    csv = tmp_path / "in.csv"
    rows = _values(200, seed=9)
    csv.write_text("fruit,t\n" + "".join(f"{v},{1_700_000_000 + i}\n"
                                         for i, v in enumerate(rows)))
    args = ["emit", "--topic", topic, "--device-id", "cli-dev", "-i", str(csv), "-c", "fruit",
            "--timestamp-column", "t", "-m", "grr", "-p", "epsilon=1", "-p",
            f"domain={GRR['domain']}", "--state", str(tmp_path / "st"), "-q"]
    assert main(args) == 0
    out = tmp_path / "out"
    code = main(["stream", "--subscription", sub, "-o", str(out), "-m", "grr", "-p",
                 "epsilon=1", "-p", f"domain={GRR['domain']}", "--window", "60", "--once",
                 "--quiet"])
    assert code == 0
    summary = json.loads((out / "curator" / "summary.json").read_text())
    assert summary["reconciles"] is True
    rows_out = [json.loads(line) for line in open(out / "estimates.jsonl")]
    last = {}
    for r in rows_out:
        w = r["window_start"]
        if w not in last or r["pane"]["index"] > last[w]["pane"]["index"]:
            last[w] = r
    assert sum(r["n_reports"] for r in last.values()) == 200
    assert main(["stream", "--spool", str(tmp_path), "--landing-dir", str(tmp_path / "x"),
                 "-o", str(tmp_path / "o2"), "-m", "grr", "-p", "epsilon=1", "-p",
                 f"domain={GRR['domain']}", "--once"]) == 2
