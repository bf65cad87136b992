"""Server-side estimators. Build one from a mechanism with :func:`estimator_for`."""
from __future__ import annotations

from typing import Any

from .. import registry
from ..core import Estimator, Mechanism


def estimator_for(mechanism: Mechanism, **options: Any) -> Estimator:
    """The registered estimator for ``mechanism`` (built-in or plugin)."""
    # registry.get_registry looked up per call: tests swap in a fresh registry (load_test_plugin)
    return registry.get_registry().estimator_for(mechanism, **options)


__all__ = ["estimator_for"]
