"""Google's Pub/Sub emulator for tests: a thin re-export of ``ldp_beam.pipelines.pubsub_emulator``
(pipelines/pubsub_emulator.py), which ``ldp-beam demo --stream`` and ``ldp-beam bench --only
stream`` use too: a free loopback port, a bounded start, always stopped (see that module).

``python tests/pubsub_emulator.py`` (``.ci/run``, before the package is installed) exits 1 with a
clear message when java or the emulator is missing; on a clean checkout the module is loaded
from its file, since ``ldp_beam.pipelines`` is importable only once installed.
"""
from __future__ import annotations

import os
import sys

try:
    from ldp_beam.pipelines import pubsub_emulator as _impl
except ImportError:  # a clean checkout (.ci/run checks before pip install): load it by path
    import importlib.util

    _path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "pipelines",
                         "pubsub_emulator.py")
    _spec = importlib.util.spec_from_file_location("ldp_beam_pubsub_emulator", _path)
    _impl = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_impl)

LAUNCHER, SDK_ROOTS, PROJECT, INSTALL_HINT = (_impl.LAUNCHER, _impl.SDK_ROOTS, _impl.PROJECT,
                                              _impl.INSTALL_HINT)
EmulatorUnavailable = _impl.EmulatorUnavailable
PubSubEmulator = _impl.PubSubEmulator
find_launcher, find_java, missing = _impl.find_launcher, _impl.find_java, _impl.missing
client_missing, unavailable, free_port = _impl.client_missing, _impl.unavailable, _impl.free_port

if __name__ == "__main__":  # .ci/run: fail clearly before the tests if the emulator cannot run
    sys.exit(_impl.main())
