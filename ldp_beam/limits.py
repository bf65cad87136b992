"""Caps on every size parameter, checked before anything of that size is allocated.

A size parameter (histogram ``bins``, declared label domains, an estimator's grid ``m`` or fine
``bins``, items per user, reports per user, groups of a per-key estimation) decides how much
memory or time a run takes. Every mechanism, estimator and central release checks the sizes it is
about to allocate against the caps below when it is built, and a configuration over a cap fails at
once with a :class:`~ldp_beam.errors.LimitError` (a :class:`~ldp_beam.errors.ParameterError`, so
the command line exits with status 2) naming the parameter, its value, the cap and the environment
variable that raises it. What is checked is the size that will be allocated: for CPRR the product
|x_domain| x |y_domain|, for a dense transition matrix its square, for RVNS's reconstruction the
report bins times m.

The defaults keep every allowed configuration within a few GiB on a 24 GiB machine, with room for
two Beam workers and the other processes on it. Each cap, its environment variable and default:

``cells`` -- ``LDP_BEAM_MAX_CELLS``, default 16,777,216 (2^24)
    Cells of any table, matrix or grid built from a parameter: histogram buckets or categories; a
    joint table |X| x |Y| (CPRR, JD-GRR, JuRR, TDRR) and the per-cell lookup tables its
    perturbation builds; a dense transition matrix (the square of its domain); the density
    estimators' fine ``bins`` and their kernel matrices (m x bins); RVNS's reconstruction matrix
    (report bins x m for EM, m x m for the paper's method); the square-wave EMS matrix
    (d x output bins); StructureFirst's v-optimal table (k x buckets); the accumulators of all
    the groups of a per-key estimation together. One float64 table of 2^24 cells is 128 MiB; the
    heaviest paths hold several such arrays at once. Measured peaks at the cap (one process):
    CPRR on 4096 x 4096 labels, perturbing 65,536 records and releasing the joint table,
    1.3 GiB; square-wave EMS with d = output bins = 4096, 0.9 GiB; RVNS EM with m = 4096,
    0.5 GiB.

``grouping_buckets`` -- ``LDP_BEAM_MAX_GROUPING_BUCKETS``, default 65,536 (2^16)
    Buckets of the histogram releases whose grouping takes time quadratic in the number of
    buckets (dphr, structure-first, ahp). Memory is linear; time is not: 16,384 buckets take
    1.3 s (dphr's optimal grouping) and 2.6 s (the paper's approximate sort) here, so the cap is
    about a minute, and 10^6 buckets would take hours.

``groups`` -- ``LDP_BEAM_MAX_GROUPS``, default 100,000
    Groups (distinct keys) of a per-key estimation (``--by``): one accumulator and one released
    estimate per group. The groups' accumulators together are also held to ``cells`` (see
    :func:`check_groups`).

``items`` -- ``LDP_BEAM_MAX_ITEMS``, default 256
    Items per user ``k`` of OSPDPRR and OsdpRR: 3k input roles per row, and in OSPDPRR's
    data-reference modes a held row of up to 2k doubles per user (4 KiB at the cap, i.e. 4 GiB
    per million users).

``reports_per_user`` -- ``LDP_BEAM_MAX_REPORTS_PER_USER``, default 1,000
    Reports per user ``k`` of RVNS: a batch of 65,536 records draws 65,536 x (k + 1) uniforms and
    emits k report columns (about 1 GiB per batch at the cap).

``user_cells`` -- ``LDP_BEAM_MAX_USER_CELLS``, default 134,217,728 (2^27)
    Cells of the users' rows a per-user central release holds at once. Only OSPDPRR's
    data-reference modes (``sound-public``, ``paper``) hold rows: one float64 row of k_T + k
    cells per user (their TOPSIS references and A/B need every user, and the seeded release is
    addressed by the sorted rows). The default ``sound-self`` mode and OsdpRR release in one
    pass with a constant accumulator (each row's sampling drawn where it is read) and are not
    held to this cap. The cap is checked as rows arrive (``add`` and ``merge``), before they
    are stored, so a run over it fails with this error instead of exhausting memory: 1 GiB of
    rows at the default, 67 million users of one item (k_T = k = 1). See
    :mod:`ldp_beam.central.ospdprr` for the measured peaks and for the multi-pass plan that
    would make the data-reference modes independent of the number of users too.

Raise a cap by setting its environment variable to a larger integer (``1_000_000`` and ``1e6``
are accepted), e.g. ``LDP_BEAM_MAX_CELLS=100000000 ldp-beam collect ...``; it is read at every
check, so it also works inside a running process (tests use ``monkeypatch.setenv``). The pipeline
layer checks the number of ``--by`` groups with ``check_groups(n, cells_per_group, "--by")``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from .errors import LimitError, ParameterError


@dataclass(frozen=True)
class Cap:
    """One named cap: its default and what it bounds (shown in the error message)."""

    name: str
    default: int
    what: str

    @property
    def env_var(self) -> str:
        return env_var(self.name)


CAPS: dict[str, Cap] = {c.name: c for c in (
    Cap("cells", 1 << 24, "cells of any table, matrix or grid ldp-beam allocates from a "
        "parameter; 8 bytes each, 128 MiB per table at the default cap"),
    Cap("grouping_buckets", 1 << 16, "buckets of a histogram release whose grouping takes time "
        "quadratic in the number of buckets (dphr, structure-first, ahp): about a minute at the "
        "default cap"),
    Cap("groups", 100_000, "groups of a per-key estimation: one accumulator and one estimate "
        "per group"),
    Cap("items", 256, "items per user: 3k input roles per row (and a held row of up to 2k "
        "doubles per user in OSPDPRR's data-reference modes)"),
    Cap("reports_per_user", 1000, "reports per user: a batch draws (k + 1) uniforms and emits "
        "k report columns per record"),
    Cap("user_cells", 1 << 27, "cells of the users' rows OSPDPRR's data-reference modes "
        "(sound-public, paper) hold at once: users x (target items + items); 8 bytes each, "
        "1 GiB at the default cap (see ldp_beam.central.ospdprr for the multi-pass plan that "
        "would lift it; sound-self and osdp-rr hold no rows)"),
)}


def env_var(name: str) -> str:
    """The environment variable that overrides cap ``name``: ``LDP_BEAM_MAX_<NAME>``."""
    return f"LDP_BEAM_MAX_{name.upper()}"


def _get(name: str) -> Cap:
    try:
        return CAPS[name]
    except KeyError:
        raise KeyError(f"no cap named {name!r}; caps: {sorted(CAPS)}") from None


def cap(name: str) -> int:
    """The cap ``name`` in force: its environment variable if set, else the default."""
    c = _get(name)
    return env_cap(c.env_var, c.default)


def env_cap(env_var: str, default: int) -> int:
    """A size cap from ``env_var`` (``1_000_000`` and ``1e6`` accepted), else ``default``."""
    raw = os.environ.get(env_var, "").strip()
    if not raw:
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        try:
            f = float(raw.replace("_", ""))
        except ValueError:
            f = math.nan
        value = int(f) if math.isfinite(f) and f.is_integer() else 0
    if value < 1:
        raise ParameterError(env_var, raw, "a positive integer (a size cap; see "
                             "ldp_beam.limits)")
    return value


def caps() -> dict[str, int]:
    """Every cap in force, by name."""
    return {name: cap(name) for name in CAPS}


def check_cap(name: str, value: Any, param: str) -> int:
    """Check a size about to be allocated against cap ``name``; returns it as an int.

    ``param`` names what the user set, as they set it (``"bins"``, ``"m"``,
    ``"x_domain x y_domain"``, ``"--by"``). Raises :class:`~ldp_beam.errors.LimitError` when
    ``value`` exceeds the cap in force.
    """
    limit = cap(name)
    v = int(value)
    if v > limit:
        c = _get(name)
        raise LimitError(param, v, name, limit, c.env_var, c.what)
    return v


def check_groups(n_groups: int, cells_per_group: int = 1, param: str = "--by") -> int:
    """The pipeline layer's check of a per-key estimation before it builds the groups: at most
    the ``groups`` cap of groups, and their accumulators together (``n_groups`` x
    ``cells_per_group``, e.g. ``estimator.create().size``) within the ``cells`` cap."""
    n = check_cap("groups", n_groups, param)
    per = max(1, int(cells_per_group))
    check_cap("cells", n * per, f"{param} ({n:,} groups x {per:,} accumulator cells each)")
    return n


def product(*sizes: Any) -> int:
    """The exact product of sizes (Python integers: no overflow)."""
    return math.prod(int(s) for s in sizes)


__all__ = ["CAPS", "Cap", "cap", "caps", "check_cap", "check_groups", "env_var", "product"]
