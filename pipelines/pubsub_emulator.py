"""Google's Pub/Sub emulator, started on a free loopback port: bounded, always stopped.

Used by ``ldp-beam demo --stream``, ``ldp-beam bench --only stream`` and the tests
(``tests/pubsub_emulator.py`` re-exports this module; ``python tests/pubsub_emulator.py``, which
``.ci/run`` calls, is :func:`main`).

``find_launcher()`` looks for the emulator's launcher (``$PUBSUB_EMULATOR_LAUNCHER``, then the
Debian package google-cloud-cli-pubsub-emulator's
``/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator``, other Cloud SDK
roots, ``$PATH``) and ``missing()`` says what is absent (the launcher or ``java``), or None;
``client_missing()`` says whether the Python client (google-cloud-pubsub, the ``pubsub`` extra)
is absent. ``PubSubEmulator().start()`` runs the launcher in a new process group on 127.0.0.1 and
a free port, with a small JVM heap, and waits (at most ``start_timeout``, 60 s) until it says it
has started and a real RPC (``list_topics``) answers; a start that fails or times out stops the
process group and raises with the end of its log. ``stop()`` sends SIGTERM to the whole group
(the launcher is a shell script starting java), waits up to 5 s, then SIGKILL; it is also
registered with ``atexit``, so an emulator is never left behind by a crashed caller.
``env()`` is the environment clients need (``PUBSUB_EMULATOR_HOST``); ``topic()`` and
``subscription()`` create uniquely named ones (the emulator's host must be in ``os.environ``:
the clients read it; a ``with PubSubEmulator(): ...`` block starts it, sets that variable and
restores it and stops the emulator on the way out, also on Ctrl-C).

This file imports nothing of ldp-beam at module level that a clean checkout lacks: ``.ci/run``
loads it by path before the package is installed.
"""
from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

try:  # the package's error base class; a plain RuntimeError when loaded by path (.ci/run)
    from ldp_beam.errors import LdpBeamError as _Base
except ImportError:  # pragma: no cover - a clean checkout, before pip install
    class _Base(Exception):
        pass

LAUNCHER = "cloud-pubsub-emulator"
SDK_ROOTS = ("/usr/lib/google-cloud-sdk", "/usr/share/google-cloud-sdk", "/opt/google-cloud-sdk",
             "/snap/google-cloud-sdk/current", os.path.expanduser("~/google-cloud-sdk"))
PROJECT = "ldp-beam-test"
INSTALL_HINT = ("install Java 17 (apt-get install openjdk-17-jre-headless) and Google's Pub/Sub "
                "emulator (apt-get install google-cloud-cli-pubsub-emulator, from Google's Cloud "
                "SDK apt repository), or set PUBSUB_EMULATOR_LAUNCHER to its "
                "cloud-pubsub-emulator launcher")


class EmulatorUnavailable(_Base, RuntimeError):
    """The emulator (or Java, or the Python client) is not installed, or it did not start."""


def find_launcher() -> str | None:
    env = os.environ.get("PUBSUB_EMULATOR_LAUNCHER")
    if env and os.access(env, os.X_OK):
        return env
    for root in SDK_ROOTS:
        for path in glob.glob(os.path.join(root, "platform", "pubsub-emulator", "bin", LAUNCHER)):
            if os.access(path, os.X_OK):
                return path
    return shutil.which(LAUNCHER)


def find_java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def missing() -> str | None:
    """Why the emulator cannot run here (None: it can)."""
    if find_java() is None:
        return "java is not installed (the Pub/Sub emulator needs Java 11+)"
    if find_launcher() is None:
        return ("the Pub/Sub emulator is not installed (Debian package "
                "google-cloud-cli-pubsub-emulator; its launcher cloud-pubsub-emulator)")
    return None


def client_missing() -> str | None:
    """Why the Python Pub/Sub client cannot be used here (None: it can)."""
    try:
        # lazy: optional dependency (the [pubsub] extra: google-cloud-pubsub): this probes
        # whether it is installed; `python tests/pubsub_emulator.py` (.ci/run) loads this file
        # before the package and its extras are installed
        import google.cloud.pubsub_v1  # noqa: F401
    except ImportError:
        return "the Python Pub/Sub client is not installed (pip install 'ldp-beam[pubsub]')"
    return None


def unavailable() -> str | None:
    """:func:`missing` or :func:`client_missing`, with what to install: one line, or None."""
    why = missing()
    if why:
        return f"{why}: {INSTALL_HINT}"
    return client_missing()


def _set_host(value: str | None) -> None:
    """Point this process's Pub/Sub clients at ``value`` (``PUBSUB_EMULATOR_HOST``; None: unset)."""
    if value is None:
        os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    else:
        os.environ["PUBSUB_EMULATOR_HOST"] = value


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PubSubEmulator:
    def __init__(self, start_timeout: float = 60.0, heap: str = "256m") -> None:
        self.start_timeout = start_timeout
        self.heap = heap
        self.folder = tempfile.mkdtemp(prefix="ldp-beam-pubsub-")
        self.log_path = os.path.join(self.folder, "emulator.log")
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._saved_env: list = []  # PUBSUB_EMULATOR_HOST before activate(), to restore

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {"PUBSUB_EMULATOR_HOST": self.host}

    def log_tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""

    def start(self) -> "PubSubEmulator":
        reason = missing()
        if reason:
            raise EmulatorUnavailable(reason)
        launcher = find_launcher()
        last = ""
        for _ in range(2):  # a port taken between free_port() and the bind: try another
            self.port = free_port()
            env = dict(os.environ)
            env["JAVA_OPTS"] = (env.get("JAVA_OPTS", "") + f" -Xmx{self.heap}").strip()
            self._log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(
                [launcher, "--host=127.0.0.1", f"--port={self.port}"], stdout=self._log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, cwd=self.folder)
            atexit.register(self.stop)
            try:
                self._wait_ready()
                return self
            except BaseException as exc:  # also Ctrl-C while waiting: never leave it running
                last = str(exc)
                self.stop(remove=False)
                if not isinstance(exc, Exception):
                    shutil.rmtree(self.folder, ignore_errors=True)
                    raise
        shutil.rmtree(self.folder, ignore_errors=True)
        raise EmulatorUnavailable(f"the Pub/Sub emulator did not start: {last}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"it exited with code {self.proc.returncode}; log:\n"
                                   f"{self.log_tail()}")
            if "Server started" in self.log_tail(100_000) and self._answers():
                return
            time.sleep(0.2)
        raise RuntimeError(f"not ready after {self.start_timeout:g} s; log:\n{self.log_tail()}")

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                pass
        except OSError:
            return False
        # lazy: optional dependency (the [pubsub] extra), absent when .ci/run loads this file
        # by path (see client_missing); it also costs 0.27 s at import (measured)
        from google.cloud import pubsub_v1

        old = os.environ.get("PUBSUB_EMULATOR_HOST")
        _set_host(self.host)
        try:
            client = pubsub_v1.PublisherClient()
            list(client.list_topics(request={"project": f"projects/{PROJECT}"}, timeout=3.0,
                                    retry=None))
            client.stop()
            return True
        except Exception:
            return False
        finally:
            _set_host(old)

    def stop(self, remove: bool = True) -> None:
        self.deactivate()
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:  # the group may outlive its leader (java under the launcher)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        if remove:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- the clients' environment
    def activate(self) -> "PubSubEmulator":
        """Point this process's Pub/Sub clients at the emulator (``PUBSUB_EMULATOR_HOST``);
        :meth:`deactivate` (or :meth:`stop`) restores the previous value."""
        if not self._saved_env:
            self._saved_env.append(os.environ.get("PUBSUB_EMULATOR_HOST"))
        _set_host(self.host)
        return self

    def deactivate(self) -> None:
        if self._saved_env:
            _set_host(self._saved_env.pop())

    def __enter__(self) -> "PubSubEmulator":
        self.start()
        try:
            return self.activate()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- resources (the emulator's host must be in os.environ: the clients read it)
    def topic(self) -> str:
        # lazy: optional dependency (the [pubsub] extra; see client_missing)
        from google.cloud import pubsub_v1

        path = f"projects/{PROJECT}/topics/t-{uuid.uuid4().hex[:12]}"
        pubsub_v1.PublisherClient().create_topic(name=path, timeout=10.0)
        return path

    def subscription(self, topic: str, ack_deadline: int = 10) -> str:
        # lazy: optional dependency (the [pubsub] extra; see client_missing)
        from google.cloud import pubsub_v1

        client = pubsub_v1.SubscriberClient()
        path = f"projects/{PROJECT}/subscriptions/s-{uuid.uuid4().hex[:12]}"
        client.create_subscription(name=path, topic=topic, ack_deadline_seconds=ack_deadline,
                                   timeout=10.0)
        client.close()
        return path


def main() -> int:
    """The command-line check (``.ci/run``): exit 1 with a clear message when java or the
    emulator is missing, else print where they are and exit 0."""
    why = missing()
    if why:
        print(f"Pub/Sub emulator check failed: {why}; the Pub/Sub tests (tests/transforms/test_pubsub.py) "
              f"need it ({INSTALL_HINT})", file=sys.stderr)
        return 1
    print(f"Pub/Sub emulator: {find_launcher()} (java: {find_java()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
