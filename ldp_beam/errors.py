"""Errors raised by ldp-beam.

Configuration errors name the parameter, the offending value and the valid range, so that a
message read in a pipeline log is enough to fix the call.
"""
from __future__ import annotations


class LdpBeamError(Exception):
    """Base class of every error ldp-beam raises on purpose."""


class ParameterError(LdpBeamError, ValueError):
    """A parameter is outside its valid range (raised once, when an object is built)."""

    def __init__(self, name: str, value: object, valid: str, hint: str = "") -> None:
        self.name, self.value, self.valid = name, value, valid
        msg = f"parameter {name!r} = {value!r} is invalid: expected {valid}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class LimitError(ParameterError):
    """A size parameter exceeds one of the caps of :mod:`ldp_beam.limits` (raised before anything
    of that size is allocated). The message names the parameter, its value, the cap and the
    environment variable that raises it.

    Attributes: ``name``/``value`` (the parameter, as :class:`ParameterError`), ``cap`` (the cap's
    name), ``limit`` (its value in force) and ``env_var``.
    """

    def __init__(self, name: str, value: int, cap: str, limit: int, env_var: str,
                 what: str) -> None:
        self.name, self.value, self.cap, self.limit, self.env_var, self.what = \
            name, value, cap, limit, env_var, what
        self.valid = f"at most {limit:,} (the {cap!r} cap)"
        msg = (f"parameter {name!r} = {value:,} exceeds the size cap {cap!r} = {limit:,} "
               f"({what}); nothing was allocated. Reduce it, or raise the cap with the "
               f"environment variable {env_var}={value} if the machine can afford it")
        LdpBeamError.__init__(self, msg)

    def __reduce__(self):  # picklable (Beam ships errors between processes)
        return (type(self), (self.name, self.value, self.cap, self.limit, self.env_var,
                             self.what))


class InvalidRecordsError(LdpBeamError, ValueError):
    """Some input records cannot be perturbed (core API; the Beam layer dead-letters them)."""

    def __init__(self, reasons: dict[int, str], n_records: int) -> None:
        self.reasons = reasons
        first = list(reasons.items())[:5]
        shown = "; ".join(f"row {i}: {r}" for i, r in first)
        more = "" if len(reasons) <= 5 else f"; ... ({len(reasons) - 5} more)"
        super().__init__(f"{len(reasons)} of {n_records} records are invalid: {shown}{more}")


class EmptyAccumulatorError(LdpBeamError, ValueError):
    """finalize() was called on an accumulator that cannot support an estimate."""


class UnknownPluginError(LdpBeamError, KeyError):
    """A mechanism name that the registry does not know."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want a readable sentence
        return str(self.args[0])
