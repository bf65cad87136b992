"""A throw-away PostgreSQL server for tests: a thin re-export of
``ldp_beam.pipelines.postgres_server`` (pipelines/postgres_server.py), which ``ldp-beam bench
--only sources`` uses too: the machine's own binaries, a free loopback port, a bounded start,
always stopped (see that module). The fixtures ``pg_server``, ``pg_url`` and ``fresh_pg_url``
are in tests/conftest.py; on a clean checkout the module is loaded from its file, since
``ldp_beam.pipelines`` is importable only once installed.
"""
from __future__ import annotations

import os

try:
    from ldp_beam.pipelines import postgres_server as _impl
except ImportError:  # a clean checkout, before pip install: load it by path
    import importlib.util

    _path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "pipelines",
                         "postgres_server.py")
    _spec = importlib.util.spec_from_file_location("ldp_beam_postgres_server", _path)
    _impl = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_impl)

SUPERUSER, INSTALL_HINT = _impl.SUPERUSER, _impl.INSTALL_HINT
PostgresServer, PostgresStartError = _impl.PostgresServer, _impl.PostgresStartError
find_binaries, missing, free_port = _impl.find_binaries, _impl.missing, _impl.free_port
