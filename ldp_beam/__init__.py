"""ldp-beam: privacy-preserving data collection and estimation, on numpy and Apache Beam.

The core (this package, minus ``ldp_beam.transforms`` and ``ldp_beam.pipelines``) never imports
Apache Beam. Quick tour::

    from ldp_beam import build_mechanism, estimator_for
    mech = build_mechanism("bisample-md", epsilon=1.0, lower=0, upper=100)
    reports = mech.perturb({"value": ages})          # on the device
    est = estimator_for(mech).estimate(reports)      # at the collector
    est["mean"].value, est["mean"].ci()
"""
import importlib
from typing import Any

# The public names, imported from their modules when first used (PEP 562): ``import ldp_beam``
# (and ``ldp-beam --help``, ``from ldp_beam.errors import ...``) loads neither numpy nor the
# mechanisms (~0.01 s instead of ~0.15 s); ``from ldp_beam import build_mechanism`` loads what
# that name needs.
_LAZY = {
    **dict.fromkeys(("Estimate", "Estimator", "Mechanism", "Role", "Statistic"), ".core"),
    **dict.fromkeys(("EmptyAccumulatorError", "InvalidRecordsError", "LdpBeamError", "LimitError",
                     "ParameterError", "UnknownPluginError"), ".errors"),
    "estimator_for": ".estimators",
    **dict.fromkeys(("PrivacyGuarantee", "compose"), ".privacy"),
    **dict.fromkeys(("build_mechanism", "get_registry"), ".registry"),
    **dict.fromkeys(("RandomSource", "RunKey"), ".rng"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ldp_beam' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later uses are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"
__all__ = ["Estimate", "Estimator", "Mechanism", "Role", "Statistic", "PrivacyGuarantee",
           "compose", "RandomSource", "RunKey", "build_mechanism", "estimator_for", "get_registry",
           "EmptyAccumulatorError", "InvalidRecordsError", "LdpBeamError", "LimitError",
           "ParameterError", "UnknownPluginError", "__version__"]
