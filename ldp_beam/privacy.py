"""What a release costs: privacy guarantees and their composition.

Every mechanism and every estimate carries a :class:`PrivacyGuarantee`. The guarantee is the one
we can defend, which is not always the one a paper claims: where they differ, ``claim`` keeps the
paper's statement and ``notes`` says why we do not repeat it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

#: The kinds of guarantee ldp-beam reports.
LDP = "LDP"  # local DP: every pair of inputs, every output
ULDP = "ULDP"  # utility-optimized LDP (sensitive inputs protected, non-sensitive ones may leak)
CENTRAL = "central-DP"  # the curator sees true values, the release is DP
NEIGHBOURHOOD_LDP = "neighbourhood-LDP"  # LDP only for inputs within a declared distance
PERSONALIZED = "personalized-DP"
NONE = "none"  # replication of a paper's rule that carries no defensible guarantee
KINDS = (LDP, ULDP, CENTRAL, NEIGHBOURHOOD_LDP, PERSONALIZED, NONE)


@dataclass(frozen=True)
class PrivacyGuarantee:
    """A privacy promise: ``kind`` with ``epsilon`` (and ``delta`` where the kind needs one).

    ``epsilon`` is ``math.inf`` for kind ``none``. ``claim`` is what the source paper states when it
    differs from what we report; ``notes`` explains the difference or any condition of the promise.
    """

    kind: str
    epsilon: float
    delta: float = 0.0
    notes: str = ""
    claim: str = ""
    params: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"guarantee kind {self.kind!r} is not one of {KINDS}")
        if not (self.epsilon >= 0):
            raise ValueError(f"guarantee epsilon {self.epsilon!r} must be >= 0")
        if not (0.0 <= self.delta <= 1.0):
            raise ValueError(f"guarantee delta {self.delta!r} must be in [0, 1]")

    def describe(self) -> str:
        if self.kind == NONE:
            return "no finite guarantee: no privacy guarantee (replication only)"
        if math.isinf(self.epsilon):
            return f"no finite guarantee: no finite epsilon ({self.kind}; see the notes)"
        if self.delta:
            return f"{self.kind} with epsilon={self.epsilon:g}, delta={self.delta:g}"
        return f"{self.kind} with epsilon={self.epsilon:g}"

    def to_dict(self) -> dict:
        eps = None if math.isinf(self.epsilon) else self.epsilon
        return {"kind": self.kind, "epsilon": eps, "delta": self.delta, "notes": self.notes,
                "claim": self.claim, "params": dict(self.params), "summary": self.describe()}


#: Appended to the notes of LDP mechanisms whose report is a double computed from the input (PM,
#: Square Wave, Laplace-DP, the generalized Gaussian): see docs/floating_point.md.
FLOAT_OUTPUT_NOTE = (
    " Floating-point caveat: the report is a double computed from the input, so which doubles "
    "can occur depends on the input; the epsilon stated is that of the real-number mechanism and "
    "does not cover attacks on the report's low-order bits (Mironov 2012). A baseline for "
    "accuracy comparisons; see docs/floating_point.md.")

#: From strongest to weakest: a composition of mixed kinds promises only the weakest one. An LDP
#: release is also neighbourhood-LDP and central DP for the same epsilon; ULDP protects only
#: sensitive values, so it is the weakest of the DP kinds here.
STRENGTH = (LDP, NEIGHBOURHOOD_LDP, CENTRAL, PERSONALIZED, ULDP)


def compose(guarantees: Iterable[PrivacyGuarantee]) -> PrivacyGuarantee:
    """Sequential composition of releases about the same people: epsilons and deltas add up.

    Releases of different kinds compose to the weakest kind among them (see ``STRENGTH``); a
    release with no guarantee makes the whole composition carry none.
    """
    gs = list(guarantees)
    if not gs:
        raise ValueError("compose() needs at least one guarantee")
    kinds = {g.kind for g in gs}
    if NONE in kinds:
        return PrivacyGuarantee(NONE, math.inf, notes="a component carries no guarantee")
    kind = max(kinds, key=STRENGTH.index)
    notes = f"sequential composition of {len(gs)} releases"
    if len(kinds) > 1:
        notes += f" of kinds {', '.join(sorted(kinds))}; stated as the weakest, {kind}"
    return PrivacyGuarantee(kind, sum(g.epsilon for g in gs),
                            min(1.0, sum(g.delta for g in gs)), notes=notes)


#: What every output of a seeded run says (reports' metadata, the CLI's privacy line, estimates).
SEEDED_TEXT = ("seeded run: reproducible, not private - whoever knows or guesses the seed can "
               "recompute the noise and remove it (a small integer seed is found by trying "
               "candidates against the reports in well under a second)")


def run_guarantee(g: PrivacyGuarantee, *, seeded: bool = False, public: Iterable[str] = ()
                  ) -> dict:
    """A guarantee as a run states it (``to_dict`` plus what the run changed about it).

    A seeded run promises nothing: its summary says "seeded" and "not private", and ``kind`` keeps
    the mechanism's kind only under ``unseeded_kind`` so that no reader mistakes it for a
    guarantee. Public columns copied beside the reports are named (they are not protected).
    """
    d = g.to_dict()
    d["seeded"] = bool(seeded)
    public = list(public)
    if public:
        d["public_columns"] = public
        d["summary"] += (f"; the reports also carry the column(s) {', '.join(public)} unprotected "
                         "(declared public)")
    if seeded:
        d["unseeded_summary"] = d["summary"]
        d["summary"] = f"{SEEDED_TEXT}; unseeded it would be: {d['summary']}"
    return d
