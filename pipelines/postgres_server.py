"""A throw-away PostgreSQL server from the machine's own packages: bounded, always stopped.

Used by ``ldp-beam bench --only sources`` and the tests (``tests/postgres_server.py`` re-exports
it; fixtures in ``tests/conftest.py``). ``find_binaries()``: ``initdb``, ``postgres``, ``pg_ctl``
in Debian's ``/usr/lib/postgresql/*/bin`` (newest first), then ``$PATH``; ``missing()`` says why
no server can run here, or None. ``PostgresServer.start()`` (or ``with PostgresServer.running()``)
runs initdb in a fresh temp folder and ``postgres`` on a free 127.0.0.1 port (Unix socket in that
folder; ``trust`` for the superuser ``ldpbeam``); as root, through ``runuser`` as ``postgres``
(or a system user ``ldpbeam-pg`` it creates): PostgreSQL refuses root. Start-up is bounded
(``start_timeout``; ready when ``postmaster.pid`` says so, as ``pg_ctl -w`` checks, no client
library needed), a taken port is retried, and a failure stops the server and raises
:class:`PostgresStartError` with the end of its log. ``stop()`` (also at exit): ``pg_ctl stop -m
fast``, else SIGKILL of the postmaster and its backends; the folder is removed.
``create_database()`` needs psycopg; ``cpu_seconds()`` reads the server's CPU time from /proc.
Nothing of ldp-beam is needed at import: the file can be loaded by path before installation.
"""
from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Iterator

try:  # the package's error base class; a plain Exception when loaded by path
    from ldp_beam.errors import LdpBeamError as _Base
except ImportError:  # pragma: no cover - a clean checkout, before pip install
    class _Base(Exception):
        pass

SUPERUSER = "ldpbeam"
BINARIES = ("initdb", "postgres", "pg_ctl")
INSTALL_HINT = "install the Debian package postgresql (.ci/run does)"


class PostgresStartError(_Base, RuntimeError):
    """No PostgreSQL server could be started here (the message says why)."""


def _version_key(path: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", path)) or (0,)


def find_binaries() -> str | None:
    """The folder holding ``initdb``, ``postgres`` and ``pg_ctl``, or None."""
    found = shutil.which("initdb")
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    for d in candidates + ([os.path.dirname(os.path.realpath(found))] if found else []):
        if all(os.access(os.path.join(d, b), os.X_OK) for b in BINARIES):
            return d
    return None


def missing() -> str | None:
    """Why no server can be started here (None: it can)."""
    if find_binaries() is None:
        return ("no PostgreSQL server binaries (initdb, postgres, pg_ctl) in "
                f"/usr/lib/postgresql/*/bin or on PATH: {INSTALL_HINT}")
    if os.geteuid() == 0 and not shutil.which("runuser"):
        return ("running as root without runuser (util-linux): PostgreSQL refuses to run as "
                "root, and the server cannot be started as another user")
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _service_user() -> str | None:
    """As root: the user the server runs as (created if needed); otherwise None (run as is)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "ldpbeam-pg"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    try:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        "ldpbeam-pg"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PostgresStartError("running as root, PostgreSQL refuses root, and there is no "
                                 f"'postgres' user to run it as (useradd failed: {exc})") from exc
    return "ldpbeam-pg"


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (state is [0], ppid [1]), or None."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    return [int(d) for d in os.listdir("/proc")
            if d.isdigit() and (_stat(int(d)) or [None, None])[1] == str(pid)]


def _is_backend(pid: int) -> bool:
    """A client session's backend (its title names the client address), not one of the
    server's background processes."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            title = fh.read().decode(errors="replace")
    except OSError:
        return False
    return "127.0.0.1(" in title or "[local]" in title


class PostgresServer:
    """One cluster and its server; ``SETTINGS`` are its ``-c`` options, ``START_TIMEOUT`` the
    default bound (seconds) on initdb and on the server's start (a subclass may change both)."""

    SETTINGS = {"listen_addresses": "127.0.0.1", "max_connections": "40",
                "shared_buffers": "16MB"}
    START_TIMEOUT = 30.0

    def __init__(self, start_timeout: float | None = None) -> None:
        why = missing()
        if why:
            raise PostgresStartError(why)
        self.bindir = find_binaries()
        self.start_timeout = start_timeout or self.START_TIMEOUT
        self.user = _service_user()
        self.folder = tempfile.mkdtemp(prefix="ldp-beam-pg-")
        self.data = os.path.join(self.folder, "data")
        self.log = os.path.join(self.folder, "server.log")
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        if self.user:
            pw = pwd.getpwnam(self.user)
            os.chown(self.folder, pw.pw_uid, pw.pw_gid)
            os.chmod(self.folder, 0o700)
        atexit.register(self.stop)

    @classmethod
    def start(cls, start_timeout: float | None = None) -> "PostgresServer":
        """A new cluster, its server accepting connections (stop it with ``stop()``)."""
        server = cls(start_timeout)
        try:
            server._initdb()
            for _ in range(3):  # a port taken between free_port() and the bind: retry
                server.port = free_port()
                if server._run():
                    return server
            raise PostgresStartError("PostgreSQL did not start on a free port in 3 attempts:\n"
                                     + server.log_tail())
        except BaseException:
            server.stop()
            raise

    @classmethod
    @contextlib.contextmanager
    def running(cls, start_timeout: float | None = None) -> Iterator["PostgresServer"]:
        server = cls.start(start_timeout)
        try:
            yield server
        finally:
            server.stop()

    def _cmd(self, *args: str) -> list[str]:
        return (["runuser", "-u", self.user, "--"] if self.user else []) + list(args)

    def _initdb(self) -> None:
        try:
            r = subprocess.run(self._cmd(os.path.join(self.bindir, "initdb"), "-D", self.data,
                                         "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                                         "--locale=C", "--no-sync"),
                               capture_output=True, text=True, timeout=self.start_timeout)
        except subprocess.TimeoutExpired as exc:
            raise PostgresStartError(f"initdb took over {self.start_timeout:g} s") from exc
        if r.returncode != 0:
            raise PostgresStartError(f"initdb failed ({r.returncode}): {r.stderr[-2000:]}")

    def _pidfile(self) -> list[str]:
        """postmaster.pid's lines (pid, data, start, port, socket dir, address, shm, status)."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as fh:
                return fh.read().splitlines()
        except OSError:
            return []

    def _run(self) -> bool:
        """Start postgres on self.port; True once it accepts connections, False if it exited
        (e.g. the port was taken); PostgresStartError if it is not up within start_timeout."""
        opts = [a for k, v in self.SETTINGS.items() for a in ("-c", f"{k}={v}")]
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                self._cmd(os.path.join(self.bindir, "postgres"), "-D", self.data,
                          "-p", str(self.port), "-k", self.folder, *opts),
                stdout=logf, stderr=subprocess.STDOUT)  # same process group: Ctrl-C stops it
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            lines = self._pidfile()
            if len(lines) >= 8 and lines[3].strip() == str(self.port) \
                    and lines[7].strip() == "ready":
                return True
            time.sleep(0.05)
        raise PostgresStartError(f"PostgreSQL did not accept connections within "
                                 f"{self.start_timeout:g} s:\n" + self.log_tail())

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log, errors="replace") as fh:
                return fh.read()[-n:]
        except OSError:
            return "(no server log)"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def admin_url(self) -> str:
        return self.url("postgres")

    def create_database(self, name: str) -> str:
        """A fresh, empty database (dropped first if it exists); returns its URL."""
        # lazy: optional dependency (the [postgres] extra: psycopg); the server itself needs no
        # client library, and this file is loaded by path before installation
        import psycopg

        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name {name!r}: lower-case letters, digits, _")
        with psycopg.connect(self.admin_url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def _postmaster(self) -> int | None:
        lines = self._pidfile()
        return int(lines[0]) if lines and lines[0].strip().isdigit() else None

    def cpu_seconds(self, settle: bool = False) -> float | None:
        """CPU seconds (user + system) the server's processes have used so far: the
        postmaster's own and its ended children's (ended backends are added to the
        postmaster's once reaped), plus its running children's; None where /proc cannot tell.
        ``settle``: first wait (up to 5 s) for the backends of ended sessions to be reaped."""
        pid = self._postmaster()
        if pid is None:
            return None
        if settle:  # a backend of an ended session, or a zombie not yet reaped, is waited for
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(
                    (_stat(c) or ["Z"])[0] == "Z" or _is_backend(c) for c in _children(pid)):
                time.sleep(0.05)
        own = _stat(pid)
        if own is None:
            return None
        total = sum(int(x) for x in own[11:15])  # utime, stime, cutime, cstime
        for st in filter(None, map(_stat, _children(pid))):
            total += int(st[11]) + int(st[12])
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """Shut the server down (fast), SIGKILL it and its backends if that fails, and remove
        the folder. Safe to call more than once."""
        atexit.unregister(self.stop)
        try:
            if self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    subprocess.run(self._cmd(os.path.join(self.bindir, "pg_ctl"), "stop", "-D",
                                             self.data, "-m", "fast", "-w", "-t", "20"),
                                   capture_output=True, timeout=30)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:  # the postmaster by its pid file, its
                    pid = self._postmaster()       # backends, then runuser
                    for p in ([pid] + _children(pid)) if pid else []:
                        with contextlib.suppress(OSError):
                            os.kill(p, signal.SIGKILL)
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            self.proc = None
            shutil.rmtree(self.folder, ignore_errors=True)
