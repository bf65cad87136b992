"""A prototype of ``ldp-beam stream --subscription``: land with the Lander, stream the spool.

:func:`run_pubsub_stream` runs a :class:`~ldp_beam.transforms.pubsub_lander.Lander` in a thread
that lands the subscription's messages into a spool folder (durably, then acks, deduplicated by
report id) and runs the existing spool stream (:func:`ldp_beam.pipelines.stream.run_stream`
with ``spool=``) over that folder. Everything the spool stream does then holds for Pub/Sub too:
claims that survive restarts, watermarks from the data, late records dead-lettered with their
reason, central-DP release ranges (the spool marks them; Beam's ``ReadFromPubSub`` path
cannot), privacy units and memo ids. The delivery guarantee is the lander's (see
:mod:`ldp_beam.transforms.pubsub_lander`): Pub/Sub's at-least-once made exactly-once in effect
by the landed record; the spool's own restart guarantees take it from there.

**Order of a run.** The lander opens first (its lock, and the repair of a batch a crash left
between commit and rename), then lands the backlog already waiting (until a pull comes back
empty, at most ``drain_seconds``) so that it is in the spool's first listing (whose files are
all on time); then the stream starts, and the lander keeps landing in its thread. When the
stream ends (``duration``, ``stop``, SIGINT/SIGTERM), the lander finishes its batch in hand and
stops; what it landed after the stream's last poll stays in the spool for the next run. A
lander that fails stops the stream and is raised after it, with the stream's summary written.
With ``once=True`` the backlog is landed and read once (a bounded run), with no lander thread.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Mapping

from ldp_beam.core import Mechanism
from ldp_beam.transforms.pubsub_lander import Lander, LanderError
from ldp_beam.transforms.windowed import SUMMARY

from .common import write_json
from .stream import run_stream


DELIVERY = ("exactly once in effect: each message landed (fsynced, its report ids recorded) "
            "before its ack, a redelivered or re-published report counted once, the spool "
            "re-read after a crash")


def run_pubsub_stream(subscription: str, output_dir: str, mechanism: Mechanism, *,
                      spool_dir: str | None = None,
                      lander_options: Mapping[str, Any] | None = None,
                      drain_seconds: float = 30.0, duration: float | None = None,
                      stop: threading.Event | None = None, progress: bool = True,
                      **stream_kwargs: Any) -> dict:
    """Land ``subscription`` into ``spool_dir`` (default ``OUTPUT/spool``) and stream it with
    :func:`~ldp_beam.pipelines.stream.run_stream` (``stream_kwargs``: its options, e.g.
    ``window_seconds``, ``watermark_lag``, ``privacy_unit``); returns the stream's summary with
    the lander's counts under ``"lander"``. ``lander_options``: keyword options of
    :class:`~ldp_beam.transforms.pubsub_lander.Lander` (attribute names, ``max_messages``...)."""
    if "spool" in stream_kwargs or "subscription" in stream_kwargs:
        raise ValueError("run_pubsub_stream takes the subscription and lands it into "
                         "spool_dir: do not pass spool= or subscription=")
    spool = os.path.abspath(spool_dir or os.path.join(output_dir, "spool"))
    os.makedirs(output_dir, exist_ok=True)
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else None
    stop = stop or threading.Event()
    if stream_kwargs.get("dataset") is None:  # in the ledger: the subscription, not its landing
        stream_kwargs["dataset"] = f"pubsub://{subscription}"
    lander = Lander(subscription, spool, say=say, **dict(lander_options or {}))
    lander.open()
    _check_lag(lander, stream_kwargs, say)
    failure: list[BaseException] = []
    try:
        drain_backlog(lander, drain_seconds, stop)  # on time in the stream's first listing
        if stream_kwargs.get("once"):  # a bounded run: the backlog landed, read once
            summary = run_stream(output_dir, mechanism, spool=spool, duration=duration,
                                 stop=stop, progress=progress, **stream_kwargs)
        else:
            thread = threading.Thread(target=_land, args=(lander, stop, failure),
                                      name="ldp-beam-lander", daemon=True)
            thread.start()
            try:
                summary = run_stream(output_dir, mechanism, spool=spool, duration=duration,
                                     stop=stop, progress=progress, **stream_kwargs)
            finally:
                lander.stop()
                thread.join(timeout=lander.pull_timeout + lander.gather_seconds
                            + lander.ack_timeout * 2 + 10)
    finally:
        lander.close()
    # the run's summary file again, with the lander's counts and the delivery guarantee
    summary.update(lander=asdict(lander.stats), spool=spool, delivery=DELIVERY)
    write_json(os.path.join(output_dir, SUMMARY), summary)
    if failure:
        raise LanderError(f"the lander stopped the stream: {failure[0]}") from failure[0]
    return summary


def _check_lag(lander: Lander, kw: Mapping[str, Any], say: Any) -> None:
    """Messages pulled but not acked when a collector dies come back after the subscription's
    ack deadline; to be on time in their windows after a restart, the watermark lag plus the
    allowed lateness must cover it. Say so when it does not (they would be dead-lettered as
    too late: counted, not lost)."""
    try:
        sub = lander._client().get_subscription(subscription=lander.subscription, timeout=10)
        deadline = float(sub.ack_deadline_seconds)
    except Exception:  # a missing permission: this check is advice, not a condition
        return
    cover = float(kw.get("watermark_lag") or 0.0) + float(kw.get("allowed_lateness") or 0.0)
    if say is not None and cover < deadline and not kw.get("once"):
        say(f"ldp-beam stream: note: the subscription's ack deadline is {deadline:g}s and "
            f"--watermark-lag plus --allowed-lateness is {cover:g}s: after a crash, messages "
            "the dead collector had pulled come back up to that late and are dead-lettered as "
            f"too late; give --watermark-lag {deadline + 2:g} (or a lateness) to count them")


def drain_backlog(lander: Lander, seconds: float, stop: threading.Event) -> int:
    """Land the backlog waiting on the subscription: batches until a pull comes back empty
    (caught up with the live rate: a steady producer does not hold the stream back; a batch
    closed by its size or time limit is not the end of the backlog), ``seconds`` or ``stop``;
    returns the messages landed."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end and not stop.is_set():
        n += lander.land_once()
        if getattr(lander, "caught_up", True):
            break
    return n


def _land(lander: Lander, stop: threading.Event, failure: list) -> None:
    try:
        lander.run()
    except BaseException as exc:  # stop the stream; raised by run_pubsub_stream after it
        failure.append(exc)
        stop.set()
