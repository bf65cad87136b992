"""A real, throw-away PostgreSQL server for tests, started from the machine's own packages.

``PostgresServer.start()`` finds ``initdb`` and ``postgres`` (``/usr/lib/postgresql/*/bin``, the
Debian layout, newest version first, then ``$PATH``), creates a cluster in a fresh folder under
the temp directory, and runs ``postgres`` on a free loopback port (TCP on 127.0.0.1 only; its Unix
socket in the same folder), with ``trust`` authentication for the superuser ``ldpbeam``. PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` user the Debian package
creates (or, if there is none, as a system user ``ldpbeam-pg`` made with ``useradd``), through
``runuser``. Start-up is bounded (``start_timeout``, 30 s): a server that is not accepting
connections by then is stopped and the error shows the end of its log. ``stop()`` shuts it down
(``pg_ctl stop -m fast``, then SIGKILL if needed) and removes the folder.

``find_binaries()`` returns None when no PostgreSQL binaries exist: the tests skip with that
reason (CI installs the ``postgresql`` Debian package first, see ``.ci/run``).
"""
from __future__ import annotations

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

SUPERUSER = "ldpbeam"


def _version_key(path: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", path)) or (0,)


def find_binaries() -> str | None:
    """The folder holding ``initdb``, ``postgres`` and ``pg_ctl``, or None."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True):
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "postgres", "pg_ctl")):
            return d
    found = shutil.which("initdb")
    if found:
        d = os.path.dirname(os.path.realpath(found))
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("postgres", "pg_ctl")):
            return d
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
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    "ldpbeam-pg"], check=True, capture_output=True, timeout=30)
    return "ldpbeam-pg"


class PostgresServer:
    def __init__(self, bindir: str, start_timeout: float = 30.0) -> None:
        self.bindir = bindir
        self.start_timeout = start_timeout
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

    def _cmd(self, *args: str) -> list[str]:
        return (["runuser", "-u", self.user, "--"] if self.user else []) + list(args)

    @classmethod
    def start(cls, start_timeout: float = 30.0) -> "PostgresServer":
        bindir = find_binaries()
        if bindir is None:
            raise RuntimeError("no PostgreSQL binaries (initdb, postgres, pg_ctl) found")
        server = cls(bindir, start_timeout)
        try:
            server._initdb()
            for attempt in range(3):  # a port taken between free_port() and the bind: retry
                server.port = free_port()
                if server._run():
                    return server
            raise RuntimeError("PostgreSQL did not start on a free port in 3 attempts:\n"
                               + server.log_tail())
        except BaseException:
            server.stop()
            raise

    def _initdb(self) -> None:
        deadline = self.start_timeout
        r = subprocess.run(self._cmd(os.path.join(self.bindir, "initdb"), "-D", self.data,
                                     "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
                                     "--locale=C", "--no-sync"),
                           capture_output=True, text=True, timeout=deadline)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}): {r.stderr[-2000:]}")

    def _run(self) -> bool:
        """Start postgres on self.port; True once it accepts connections, False if it exited
        (e.g. the port was taken); RuntimeError if it is not up within start_timeout."""
        import psycopg

        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                self._cmd(os.path.join(self.bindir, "postgres"), "-D", self.data,
                          "-p", str(self.port), "-k", self.folder,
                          "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=40",
                          "-c", "shared_buffers=16MB"),
                stdout=logf, stderr=subprocess.STDOUT)  # same process group: Ctrl-C stops it
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            try:
                psycopg.connect(self.admin_url(), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL did not accept connections within "
                           f"{self.start_timeout:g} s:\n" + self.log_tail())

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log, errors="replace") as fh:
                return fh.read()[-n:]
        except OSError:
            return "(no server log)"

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def admin_url(self) -> str:
        return self.url("postgres")

    def create_database(self, name: str) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name {name!r}: lower-case letters, digits, _")
        with psycopg.connect(self.admin_url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name}")
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            subprocess.run(self._cmd(os.path.join(self.bindir, "pg_ctl"), "stop", "-D",
                                     self.data, "-m", "fast", "-w", "-t", "20"),
                           capture_output=True, timeout=30)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # the postmaster by its own pid file, then runuser
                try:
                    with open(os.path.join(self.data, "postmaster.pid")) as fh:
                        os.kill(int(fh.readline()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.folder, ignore_errors=True)
