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
