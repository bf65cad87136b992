"""The process-wide registry imports a built-in family when it is used, and holds exactly the
families, classes and estimators that importing them all registers."""
import dataclasses
import subprocess
import sys

import pytest

from ldp_beam.errors import UnknownPluginError
from ldp_beam.registry import (BUILTINS, Registry, _register_builtins,
                               _register_deferred_builtins)


def test_deferred_builtins_match_the_imported_ones():
    eager, deferred = Registry(), Registry()
    _register_builtins(eager)
    _register_deferred_builtins(deferred)
    assert deferred.names() == eager.names()
    assert [b[0] for b in BUILTINS] == list(eager._plugins)  # same registration order
    for name in eager.names():
        assert deferred.get(name) == eager.get(name)  # classes, estimator, summary, source
    assert deferred.describe() == eager.describe()


def test_plugin_of_resolves_the_family_of_a_mechanism():
    from ldp_beam.mechanisms.bisample import BiSample
    from ldp_beam.mechanisms.categorical import GRR

    reg = Registry()
    _register_deferred_builtins(reg)
    grr = GRR(epsilon=1.0, domain=("a", "b"))
    assert reg.plugin_of(grr).name == "grr"
    assert type(reg.estimator_for(grr)).__name__ == "CategoricalEstimator"

    @dataclasses.dataclass(frozen=True)
    class Unregistered(BiSample):
        NAME = "unregistered"

    with pytest.raises(UnknownPluginError, match="not registered"):
        reg.plugin_of(Unregistered(epsilon=1.0, lower=0.0, upper=1.0))
    with pytest.raises(ValueError, match="already registered"):
        reg.register("ospdprr", BiSample, type(reg.estimator_for(grr)))
    with pytest.raises(UnknownPluginError, match="unknown mechanism 'nope'"):
        reg.get("nope")


def test_a_command_imports_only_the_families_it_uses():
    code = ("import sys; from ldp_beam import build_mechanism, estimator_for; "
            "m = build_mechanism('grr', epsilon=1.0, domain=('a', 'b')); estimator_for(m); "
            "print(sorted(k for k in sys.modules if k.startswith('ldp_beam.central') "
            "or k.startswith('ldp_beam.estimators.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    loaded = eval(r.stdout.strip().splitlines()[-1])
    assert "ldp_beam.estimators.joint" in loaded
    assert not any(m.startswith("ldp_beam.central.") for m in loaded), loaded


def test_plugin_of_answers_the_first_registered_name_as_before():
    from ldp_beam.estimators.joint import CategoricalEstimator
    from ldp_beam.mechanisms.categorical import GRR

    grr = GRR(epsilon=1.0, domain=("a", "b"))
    for fill in (_register_builtins, _register_deferred_builtins):
        reg = Registry()
        fill(reg)
        reg.register("grr-again", GRR, CategoricalEstimator, source="a-plugin")
        assert reg.plugin_of(grr).name == "grr"
        assert reg.names()[-1] == "urr" and "grr-again" in reg.names()
