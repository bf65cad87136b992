"""ldp_beam.transforms.beam_speed: the memoized Beam argument inspection and the IPython check
return exactly what Beam's own functions return, and nothing is installed when Beam differs;
the shortcuts are off unless asked for (CLI and Python API alike)."""
import functools
import inspect
import json
import os
import subprocess
import sys
import types

import apache_beam as beam
import pytest
from apache_beam.runners.common import MethodWrapper
from apache_beam.transforms import core, userstate
from apache_beam.utils import interactive_utils

from ldp_beam.transforms import beam_speed


@pytest.fixture
def pristine():
    """Beam as shipped for the test; the shortcuts re-installed after it if they were before
    (a command line test with --beam-speedups installs them in this process)."""
    was = beam_speed.status() == "installed"
    beam_speed.uninstall()
    yield
    beam_speed.uninstall()
    if was:
        assert beam_speed.install()


def _same(a, b):
    """Equal argument names, and the very same default objects."""
    assert a[0] == b[0]
    assert len(a[1]) == len(b[1]) and all(x is y for x, y in zip(a[1], b[1])), (a, b)


class _Stateful(beam.DoFn):
    BUF = userstate.BagStateSpec("buf", beam.coders.VarIntCoder())
    TIMER = userstate.TimerSpec("t", beam.TimeDomain.WATERMARK)

    def process(self, kv, buf=beam.DoFn.StateParam(BUF), t=beam.DoFn.TimerParam(TIMER),
                w=beam.DoFn.WindowParam, *rest, key_only=1, **kw):
        yield kv

    @userstate.on_timer(TIMER)
    def fire(self, buf=beam.DoFn.StateParam(BUF)):
        return []


class _Wrapped(beam.DoFn):
    @staticmethod
    def helper(a, b=2):
        return a

    def process(self, x, y=3):
        yield x


def _decorated(fn):
    @functools.wraps(fn)
    def inner(*a, **k):
        return fn(*a, **k)
    return inner


def _callables():
    """Every method Beam inspects on a range of DoFns (Beam's own, ours, stateful), and other
    callables: bound and plain functions, wrappers, partials, builtins, classes, lambdas."""
    from ldp_beam import build_mechanism
    from ldp_beam.transforms import PerturbFn

    dofns = [_Stateful(), _Wrapped(), core.CallableWrapperDoFn(lambda x, k=5: x),
             PerturbFn(build_mechanism("grr", epsilon=1.0, domain=("a", "b")), {"value": "x"})]
    out = []
    for d in dofns:
        for name in dir(d):
            m = getattr(d, name, None)
            if isinstance(m, types.MethodType):
                out.append(m)
    out += [_decorated(lambda a, b=1: a), functools.partial(lambda a, b, c=1: a, 1), len,
            str.strip, dict, lambda *a, **k: None, lambda a, /, b=1, *, c=2: a, _Wrapped.helper,
            MethodWrapper.__init__]
    return out


def test_memo_returns_beams_own_answer(pristine):
    original = core.get_function_args_defaults
    assert beam_speed.install()
    calls = _callables()
    assert len(calls) > 60
    for f in calls:
        want = original(f)
        _same(beam_speed._args_defaults(f), want)
        _same(beam_speed._args_defaults(f), want)  # from the memo
        # fresh lists every time, as Beam's function gives: a caller may change its copy
        got = beam_speed._args_defaults(f)
        got[0].append("x")
        _same(beam_speed._args_defaults(f), want)


def test_memo_follows_changed_functions(pristine):
    assert beam_speed.install()

    def f(a, b=1, c=2):
        return a

    first = beam_speed._args_defaults(f)
    assert first == (["a", "b", "c"], [1, 2])
    f.__defaults__ = (7,)
    assert beam_speed._args_defaults(f) == (["a", "b", "c"], [7])
    f.__code__ = (lambda x, y=0: x).__code__
    f.__defaults__ = (0,)
    assert beam_speed._args_defaults(f) == (["x", "y"], [0])
    f.__signature__ = inspect.Signature([inspect.Parameter("z", inspect.Parameter.POSITIONAL_ONLY)])
    assert beam_speed._args_defaults(f) == (["z"], [])
    del f.__signature__

    def g(q, r=5):
        return q

    f.__wrapped__ = g
    assert beam_speed._args_defaults(f) == (["q", "r"], [5])
    del f.__wrapped__
    assert beam_speed._args_defaults(f) == (["x", "y"], [0])
    # a bound method: the function's answer without its first parameter, memoized apart
    obj = _Wrapped()
    assert beam_speed._args_defaults(obj.process) == (["x", "y"], [3])
    assert beam_speed._args_defaults(_Wrapped.process) == (["self", "x", "y"], [3])


def _shown(x):
    """A default value comparable across two builds of the same pipeline (not by address)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    spec = getattr(x, "state_spec", None) or getattr(x, "timer_spec", None)
    return (type(x).__name__, getattr(spec, "name", None))


def test_pipeline_inspection_identical(pristine):
    """Every ParDo of a real ldp-beam pipeline: Beam's state/timer specs and each method's
    wrapper (argument names and defaults, DoFn parameters among them) are the same with the
    shortcuts."""
    from ldp_beam import build_mechanism, estimator_for
    from ldp_beam.transforms import EstimateGlobally, Perturb

    mech = build_mechanism("grr", epsilon=1.0, domain=("a", "b", "c"))

    def pardos():
        p = beam.Pipeline()
        _ = (p | beam.Create([{"x": "a"}, {"x": "b"}]) | Perturb(mech, columns={"value": "x"})
             ).reports | EstimateGlobally(estimator_for(mech))
        _ = p | "S" >> beam.Create([(1, 2)]) | beam.ParDo(_Stateful())
        found = []

        class V(beam.pipeline.PipelineVisitor):
            def visit_transform(self, node):
                if isinstance(node.transform, beam.ParDo):
                    found.append((node.full_label, node.transform.dofn))

        p.visit(V())
        return found

    def inspect_all(found):
        rows = []
        for label, d in found:
            state, timers = userstate.get_dofn_specs(d)
            methods = {}
            for name in dir(d):
                if isinstance(getattr(d, name, None), types.MethodType):
                    w = MethodWrapper(d, name)
                    methods[name] = (list(w.args), [_shown(x) for x in w.defaults])
            rows.append((label, type(d).__name__, sorted(s.name for s in state),
                         sorted(t.name for t in timers), methods))
        return rows

    before = inspect_all(pardos())
    assert beam_speed.install()
    after = inspect_all(pardos())
    assert len(before) > 10
    assert before == after
    assert any(r[2] for r in after)  # the stateful DoFn's specs were seen


def test_ipython_check(pristine, monkeypatch):
    assert beam_speed.install()
    assert beam.pipeline.is_in_ipython is beam_speed._is_in_ipython
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    assert interactive_utils.is_in_ipython() is False
    assert "IPython" not in sys.modules  # answered without importing it
    # IPython imported and a shell running: Beam's own check answers (True)
    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: object()
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert interactive_utils.is_in_ipython() is True
    fake.get_ipython = lambda: None
    assert interactive_utils.is_in_ipython() is False


def test_not_installed_when_beam_differs(pristine, monkeypatch):
    original = core.get_function_args_defaults
    original_ipython = interactive_utils.is_in_ipython
    monkeypatch.setattr(beam, "__version__", "2.99.0")
    assert not beam_speed.install()
    assert "not a verified version" in beam_speed.status()
    assert core.get_function_args_defaults is original
    monkeypatch.undo()

    def changed(f):  # a Beam whose function reads something else
        sig = inspect.signature(f)
        return list(sig.parameters), []

    monkeypatch.setattr(core, "get_function_args_defaults", changed)
    assert not beam_speed.install()
    assert "get_function_args_defaults is not the verified one" in beam_speed.status()
    assert core.get_function_args_defaults is changed
    assert interactive_utils.is_in_ipython is original_ipython  # nothing half-installed
    monkeypatch.undo()

    assert beam_speed.status() == "not installed: Beam's get_function_args_defaults is not " \
        "the verified one"
    assert beam_speed.install() and beam_speed.status() == "installed"
    beam_speed.uninstall()
    assert core.get_function_args_defaults is original
    assert interactive_utils.is_in_ipython is original_ipython
    assert beam.pipeline.is_in_ipython is original_ipython


def test_view_as_memo_returns_views_equal_to_beams(pristine):
    """A memoized view reads and writes the same shared options as Beam's own view; changed
    flags or a replaced options dict make a new view; flags that are not a list or tuple (None:
    sys.argv) always go to Beam's method; uninstall restores it."""
    from apache_beam.options.pipeline_options import (DebugOptions, PipelineOptions,
                                                      SetupOptions, StandardOptions,
                                                      TypeOptions)

    original = PipelineOptions.view_as
    assert beam_speed.install()
    assert PipelineOptions.view_as is beam_speed._view_as
    flags = ["--runner=DirectRunner", "--experiments=a", "--pickle_library=cloudpickle"]
    ours = PipelineOptions(list(flags))
    beams = PipelineOptions(list(flags))
    for cls in (StandardOptions, SetupOptions, TypeOptions, DebugOptions, PipelineOptions):
        a, b = ours.view_as(cls), original(beams, cls)
        assert type(a) is type(b) and a.get_all_options() == b.get_all_options()
        assert ours.view_as(cls) is a  # the same view, not parsed again
    ours.view_as(DebugOptions).experiments.append("b")  # writes reach every view
    original(beams, DebugOptions).experiments.append("b")
    assert ours.view_as(DebugOptions).experiments == ["a", "b"]
    ours.view_as(StandardOptions).streaming = True
    original(beams, StandardOptions).streaming = True
    assert ours.view_as(StandardOptions).streaming and ours.get_all_options()["streaming"]
    view = ours.view_as(SetupOptions)
    for o in (ours, beams):
        o._flags.append("--sdk_location=x")  # changed flags: a new parse, as Beam's
    assert ours.view_as(SetupOptions) is not view
    assert ours.view_as(SetupOptions).get_all_options() == \
        original(beams, SetupOptions).get_all_options()
    ours._all_options = dict(ours._all_options)  # replaced dict: a new view on it
    assert ours.view_as(SetupOptions)._all_options is ours._all_options
    no_flags = PipelineOptions()
    assert no_flags.view_as(StandardOptions) is not no_flags.view_as(StandardOptions)
    beam_speed.uninstall()
    assert PipelineOptions.view_as is original
    assert not beam_speed._views


def test_enabled_reads_the_flag_and_the_environment():
    assert not beam_speed.enabled(environ={})
    assert beam_speed.enabled(True, environ={})
    for on in ("1", "true", "YES", " on "):
        assert beam_speed.enabled(environ={"LDP_BEAM_SPEEDUPS": on})
    for off in ("", "0", "false", "no", "off"):
        assert not beam_speed.enabled(environ={"LDP_BEAM_SPEEDUPS": off})
        assert beam_speed.enabled(True, environ={"LDP_BEAM_SPEEDUPS": off})  # the flag asks
    with pytest.raises(ValueError, match="LDP_BEAM_SPEEDUPS"):
        beam_speed.enabled(environ={"LDP_BEAM_SPEEDUPS": "2"})
    # the former switch means nothing now: off is the default
    assert not beam_speed.enabled(environ={"LDP_BEAM_NO_BEAM_SPEEDUPS": "0"})


# After the code runs in a fresh process: is each function Beam's own (the one it had before
# the code ran) or the shortcut? Prints {"patched": [...], "status": ..., "code": ...}.
_PROBE = r"""
import json, sys
import apache_beam.pipeline as bp
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import core
from apache_beam.utils import interactive_utils


def now():
    return (core.get_function_args_defaults, interactive_utils.is_in_ipython, bp.is_in_ipython,
            PipelineOptions.view_as)


before = now()
code = None
if sys.argv[1] == "cli":
    from ldp_beam.pipelines.cli import main

    code = main(sys.argv[2:])
else:  # the README's pipeline, as a user writes it; then the Python API's opt-in
    import apache_beam as beam
    import numpy as np
    from ldp_beam import build_mechanism, estimator_for
    from ldp_beam.transforms import EstimateGlobally, Perturb

    mech = build_mechanism("bisample-md", epsilon=2.0, lower=0, upper=100)
    ages = np.random.default_rng(7).uniform(18, 90, 2_000)
    with beam.Pipeline(runner="DirectRunner") as p:
        out = p | beam.Create([{"age": ages}]) | Perturb(mech, columns={"value": "age"})
        out.reports | EstimateGlobally(estimator_for(mech)) | beam.Map(lambda e: None)
        out.dead_letter | beam.Map(print)
    if sys.argv[2:] == ["install"]:
        from ldp_beam.transforms import beam_speed

        code = beam_speed.install()
from ldp_beam.transforms import beam_speed

print(json.dumps({"code": code, "status": beam_speed.status(),
                  "patched": [a is not b for a, b in zip(before, now())]}))
"""

_VERIFIED = beam.__version__.startswith(beam_speed.VERIFIED_BEAM)


def _probe(tmp_path, *args, env=None):
    environ = {k: v for k, v in os.environ.items() if k != "LDP_BEAM_SPEEDUPS"}
    environ.update(env or {})
    r = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True,
                       timeout=300, env=environ, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path_factory.mktemp("speedups") / "t.parquet"
    pq.write_table(pa.table({"v": ["a", "b"] * 50}), path)
    return path


@pytest.mark.parametrize("flag, env, asked", [
    ((), {}, False),                                    # the default: Beam as shipped
    ((), {"LDP_BEAM_SPEEDUPS": "0"}, False),
    (("--beam-speedups",), {}, True),                   # the global flag
    ((), {"LDP_BEAM_SPEEDUPS": "1"}, True),             # the environment
])
def test_cli_patches_beam_only_when_asked(tmp_path, tiny_table, flag, env, asked):
    out, err = _probe(tmp_path, "cli", *flag, "collect", "-q", "-i", str(tiny_table), "-c", "v",
                      "-m", "grr", "--epsilon", "1", "-p", "domain=a,b",
                      "-o", str(tmp_path / "r.parquet"), env=env)
    assert out["code"] == 0, err
    assert (tmp_path / "r.parquet").exists()
    if asked and _VERIFIED:
        assert out["patched"] == [True] * 4 and out["status"] == "installed"
    else:
        assert out["patched"] == [False] * 4, out
        assert out["status"].startswith("not installed")
        if asked:  # asked for on an unverified Beam: said so, and Beam runs as shipped
            assert "beam speedups not installed" in err
        else:
            assert out["status"] == "not installed: off by default (install() was not called)"


def test_cli_refuses_an_unclear_switch(tmp_path, tiny_table):
    out, err = _probe(tmp_path, "cli", "collect", "-q", "-i", str(tiny_table), "-c", "v", "-m",
                      "grr", "--epsilon", "1", "-p", "domain=a,b", "-o",
                      str(tmp_path / "r.parquet"), env={"LDP_BEAM_SPEEDUPS": "maybe"})
    assert out["code"] == 2 and "LDP_BEAM_SPEEDUPS='maybe'" in err
    assert out["patched"] == [False] * 4 and not (tmp_path / "r.parquet").exists()


def test_python_api_patches_beam_only_after_install(tmp_path):
    out, _ = _probe(tmp_path, "api")  # the README's pipeline: Beam as shipped
    assert out["patched"] == [False] * 4 and out["code"] is None
    assert out["status"] == "not installed: off by default (install() was not called)"
    out, _ = _probe(tmp_path, "api", env={"LDP_BEAM_SPEEDUPS": "1"})  # the CLI's switch only
    assert out["patched"] == [False] * 4
    out, _ = _probe(tmp_path, "api", "install")  # the opt-in
    assert out["code"] is _VERIFIED and out["patched"] == [_VERIFIED] * 4
