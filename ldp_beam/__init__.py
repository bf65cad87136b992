"""ldp-beam: privacy-preserving data collection and estimation, on numpy and Apache Beam.

The core (this package, minus ``ldp_beam.transforms`` and ``ldp_beam.pipelines``) never imports
Apache Beam. Quick tour::

    from ldp_beam import build_mechanism, estimator_for
    mech = build_mechanism("bisample-md", epsilon=1.0, lower=0, upper=100)
    reports = mech.perturb({"value": ages})          # on the device
    est = estimator_for(mech).estimate(reports)      # at the collector
    est["mean"].value, est["mean"].ci()
"""
from .core import Estimate, Estimator, Mechanism, Role, Statistic
from .errors import (EmptyAccumulatorError, InvalidRecordsError, LdpBeamError, LimitError,
                     ParameterError, UnknownPluginError)
from .estimators import estimator_for
from .privacy import PrivacyGuarantee, compose
from .registry import build_mechanism, get_registry
from .rng import RandomSource, RunKey

__version__ = "0.1.0"
__all__ = ["Estimate", "Estimator", "Mechanism", "Role", "Statistic", "PrivacyGuarantee",
           "compose", "RandomSource", "RunKey", "build_mechanism", "estimator_for", "get_registry",
           "EmptyAccumulatorError", "InvalidRecordsError", "LdpBeamError", "LimitError", "ParameterError",
           "UnknownPluginError", "__version__"]
