"""Three exact shortcuts for Apache Beam's pipeline construction: patches of Beam internals, so
OFF by default everywhere (the ``ldp-beam`` command line included) and on only when asked for,
by one opt-in with three doors:

* the Python API: call :func:`install` once before building pipelines (:func:`uninstall` undoes
  it);
* the command line: the global flag ``ldp-beam --beam-speedups COMMAND ...``;
* the environment: ``LDP_BEAM_SPEEDUPS=1`` (read by the command line, as the flag; a Python
  program asks :func:`enabled` and calls :func:`install` itself). ``LDP_BEAM_SPEEDUPS=0`` or
  unset: off.

Most of what they save is Beam's own fixed cost per pipeline (~0.5 s of a DirectRunner run on
Beam 2.77, IPython's import ~0.3 s of it), which a plain Beam pipeline pays as well, so without
them the README's pipeline still keeps pace with plain Beam: ``ldp-beam bench --only
api-readme`` builds it by hand against the plain-Beam reference built the same way, with and
without the opt-in (2026-11-27, 2 cores, load 3.8-9.7 from other work, medians of six benches
of three runs each: without, 0.89 / 0.99 of the reference at 10^6 rows (bisample-md / grr) and
0.99 / 1.19 at 10^7; with, against the reference also patched, 0.77 / 0.86 and 1.09 / 1.40, and
2.06 / 2.01 and 1.54 / 1.72 against the reference as Beam ships). They are an upstream-style fix
kept here until Beam makes it.

Measured with py-spy on ``ldp-beam estimate`` at 10^7 rows (Beam 2.77, DirectRunner): a
pipeline of ~100 leaf transforms called ``userstate.get_dofn_specs`` ~1,200 times (every ParDo is
checked when it is built, by the DirectRunner's runner choice and twice per ``to_runner_api``,
which runs once for the Prism attempt and once for the FnApiRunner), each one running
``inspect.signature`` on every method of the DoFn: ~38,000 signature computations, ~0.6 s of a
~4 s process. And the first ``Pipeline.apply`` imported IPython (~0.15-0.2 s) only to learn that
no IPython shell is running.

All three return exactly what Beam's own functions return; they only skip work whose result
is already known:

* :func:`_args_defaults` memoizes ``apache_beam.transforms.core.get_function_args_defaults``
  (the positional argument names and their defaults that Beam reads from a DoFn method). For a
  plain Python function ``f`` (``type(f) is types.FunctionType``) or a bound method of one, that
  result is a function of ``f.__code__`` and ``f.__defaults__`` alone: ``inspect.signature``
  reads a function's parameters from its code object, their defaults from ``__defaults__`` (the
  keyword-only defaults and the annotations it also reads never reach Beam's result, which keeps
  only positional parameters' names and defaults), and a bound method's signature is its
  function's with the first parameter dropped. The only other inputs ``inspect.signature``
  consults for such a function are attributes in its ``__dict__``: ``__wrapped__`` (followed by
  ``inspect.unwrap``), ``__signature__``, and ``_partialmethod`` / ``__partialmethod__``
  (``functools.partialmethod``). So the memo holds, per function, the code object and defaults
  tuple it was computed from (by identity; a tuple cannot change in place), and answers only
  when both are still the function's own and none of those four attributes is set; anything
  else (a builtin, a ``functools.partial``, a callable object, a decorated wrapper) goes to
  Beam's function untouched. The answer is Beam's own lists, copied (callers get fresh lists, as
  before; the default objects are the same objects). Functions are held weakly.
* :func:`_is_in_ipython` answers ``False`` without importing IPython when IPython is not
  imported: an IPython shell (terminal or Jupyter kernel) exists only once IPython's
  ``InteractiveShell`` has been created, which imports the ``IPython`` package, so with no
  ``"IPython"`` in ``sys.modules`` Beam's ``is_in_ipython`` would import it and return False
  (``get_ipython()`` is None). Otherwise Beam's function answers.

* :func:`_view_as` memoizes ``PipelineOptions.view_as(cls)`` per options object and class.
  Beam calls it ~450 times while building one command's pipeline (``SetupOptions``,
  ``TypeOptions``, ... from inside ``CombinePerKey``, ``ParDo`` and the runner), and each call
  builds an ``argparse`` parser of that class's options and parses the flags again (~5,600
  ``add_argument`` calls per release, 0.1-0.2 s). A view holds nothing of its own but the parse of
  the flags (``_visible_options``, read only for the option names) and the options object's
  ``_all_options`` dict, shared by every view, which every read and write goes through; the first
  call also copies into that dict the class's defaults it lacks, which later calls would find
  already there. So the view of a class is reused while the options object's flags (a list or
  tuple, compared by value) and its ``_all_options`` (by identity) are the ones it was made from;
  flags of another kind (``None`` means ``sys.argv``) go to Beam's method every time.

Guarded against Beam changes: :func:`install` patches only Beam versions whose functions were
read and checked (:data:`VERIFIED_BEAM`), and only when each function to replace is still the one
expected (same module attribute, same names referenced by its code: :data:`_FINGERPRINTS`).
Otherwise it installs nothing and says why (:func:`status`); Beam then runs exactly as shipped.
:func:`uninstall` restores the originals.
"""
from __future__ import annotations

import os
import sys
import threading
import types
import weakref
from typing import Any, Callable

# Beam's internals that are patched, imported guarded: a Beam version other than the verified
# ones may lack one, and then install() installs nothing and status() says why (_check)
try:
    import apache_beam
    from apache_beam.options import pipeline_options
    from apache_beam.transforms import core
    from apache_beam.typehints import decorators
    from apache_beam.utils import interactive_utils
except Exception as exc:  # noqa: BLE001 - no Beam, or a layout we do not know
    _NOT_FOUND: str | None = f"Beam internals not found ({exc!r})"
else:
    _NOT_FOUND = None

#: Beam versions whose ``get_function_args_defaults``, ``get_signature``, ``is_in_ipython`` and
#: ``PipelineOptions.view_as`` were read and found as described above (a new version installs
#: nothing until checked)
VERIFIED_BEAM = ("2.77.",)

#: the names each replaced function's code refers to in the verified versions (sorted, nested
#: code included): a changed body refers to other names, and nothing is then installed
_FINGERPRINTS = {
    "get_function_args_defaults": (
        "POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "Parameter", "default", "empty",
        "get_signature", "inspect", "items", "kind", "parameters", "values"),
    "get_signature": (
        "POSITIONAL_OR_KEYWORD", "Parameter", "Signature", "VAR_KEYWORD", "VAR_POSITIONAL",
        "ValueError", "_MethodDescriptorType", "__objclass__", "annotation", "empty", "inspect",
        "isinstance", "list", "normalize", "parameters", "replace", "return_annotation",
        "signature", "type", "typehints", "values"),
    "is_in_ipython": (
        "IPython", "ImportError", "KeyboardInterrupt", "SystemExit", "_LOGGER", "get_ipython",
        "info"),
    "view_as": ("_all_options", "_flags", "_visible_option_list", "_visible_options", "getattr"),
}

#: function attributes that change what inspect.signature reports for a plain function
_SIGNATURE_ATTRS = frozenset(("__wrapped__", "__signature__", "_partialmethod",
                              "__partialmethod__"))

_lock = threading.Lock()
_installed: dict[tuple[str, str], Any] = {}  # (module, attribute) -> the original
_why_not: str | None = None
_memo: "weakref.WeakKeyDictionary[types.FunctionType, tuple]" = weakref.WeakKeyDictionary()
_memo_bound: "weakref.WeakKeyDictionary[types.FunctionType, tuple]" = \
    weakref.WeakKeyDictionary()
_original_args_defaults: Callable[[Any], tuple] | None = None
_original_is_in_ipython: Callable[[], bool] | None = None
_original_view_as: Callable[[Any, type], Any] | None = None
_views: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _args_defaults(f: Any) -> tuple[list, list]:
    """``get_function_args_defaults(f)``, memoized where provably the same (module docstring)."""
    original = _original_args_defaults
    if type(f) is types.MethodType:
        fn, memo = f.__func__, _memo_bound
    else:
        fn, memo = f, _memo
    if type(fn) is not types.FunctionType or not _SIGNATURE_ATTRS.isdisjoint(fn.__dict__):
        return original(f)
    code, defaults = fn.__code__, fn.__defaults__
    hit = memo.get(fn)
    if hit is None or hit[0] is not code or hit[1] is not defaults:
        args, defs = original(f)
        hit = (code, defaults, tuple(args), tuple(defs))
        memo[fn] = hit
    return list(hit[2]), list(hit[3])


def _is_in_ipython() -> bool:
    """Beam's ``is_in_ipython``, without importing IPython when it is not imported."""
    if "IPython" not in sys.modules:
        return False
    return _original_is_in_ipython()


def _view_as(self: Any, cls: type) -> Any:
    """``PipelineOptions.view_as``, one view per options object and class while its flags and
    options dict are the ones the view was made from (module docstring)."""
    original = _original_view_as
    state = self.__dict__
    flags = state.get("_flags")
    if type(flags) not in (list, tuple):
        return original(self, cls)
    try:
        per = _views.get(self)
    except TypeError:  # not weakly referenceable or not hashable
        return original(self, cls)
    snap = tuple(flags)
    hit = None if per is None else per.get(cls)
    if hit is not None and hit[0] == snap and hit[1]._all_options is state.get("_all_options"):
        return hit[1]
    view = original(self, cls)
    if per is None:
        per = _views[self] = {}
    per[cls] = (snap, view)
    return view


def _names(fn: Any) -> tuple[str, ...] | None:
    """Every name a function's code refers to, nested code (comprehensions) included, sorted:
    the same whether or not the Python version inlines comprehensions."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return tuple(sorted(names))


def _check() -> tuple[dict[tuple[str, str], Any], str | None]:
    """The patches to make ({(module, attribute): replacement}), or why none is made."""
    if _NOT_FOUND is not None:
        return {}, _NOT_FOUND
    version = getattr(apache_beam, "__version__", "")
    if not version.startswith(VERIFIED_BEAM):
        return {}, (f"Beam {version} is not a verified version ({', '.join(VERIFIED_BEAM)}x): "
                    "its internals were not checked")
    expect = {"get_function_args_defaults": getattr(core, "get_function_args_defaults", None),
              "get_signature": getattr(decorators, "get_signature", None),
              "is_in_ipython": getattr(interactive_utils, "is_in_ipython", None),
              "view_as": getattr(getattr(pipeline_options, "PipelineOptions", None), "view_as",
                                 None)}
    for name, fn in expect.items():
        if _names(fn) != _FINGERPRINTS[name]:
            return {}, f"Beam's {name} is not the verified one"
    if getattr(core, "get_signature", None) is not decorators.get_signature:
        return {}, "Beam's core.get_signature is not typehints.decorators.get_signature"
    patches = {("apache_beam.transforms.core", "get_function_args_defaults"): _args_defaults,
               ("apache_beam.utils.interactive_utils", "is_in_ipython"): _is_in_ipython,
               ("apache_beam.options.pipeline_options", "PipelineOptions.view_as"): _view_as}
    # modules that imported is_in_ipython by name (a module imported later binds the patched one)
    for mod in ("apache_beam.pipeline", "apache_beam.runners.direct.direct_runner"):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, "is_in_ipython"):
            if m.is_in_ipython is not expect["is_in_ipython"]:
                return {}, f"{mod}.is_in_ipython is not Beam's interactive_utils.is_in_ipython"
            patches[(mod, "is_in_ipython")] = _is_in_ipython
    return patches, None


#: the environment variable of the opt-in (:func:`enabled`)
ENV = "LDP_BEAM_SPEEDUPS"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def enabled(flag: bool = False, environ: "dict[str, str] | None" = None) -> bool:
    """Were the shortcuts asked for: ``flag`` (the command line's ``--beam-speedups``) or
    ``LDP_BEAM_SPEEDUPS`` set to 1 (``true``/``yes``/``on``; unset, empty, 0, ``false``, ``no``,
    ``off``: not asked). Another value is a ValueError, not a silent off."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{ENV}={value!r}: expected 1 (on) or 0 (off)")
    return bool(flag) or value in _ON


def install() -> bool:
    """Install the shortcuts (idempotent): the Python API's opt-in (off unless called). False,
    with :func:`status` saying why, when Beam is not a verified version or its functions
    differ; Beam then runs exactly as shipped."""
    global _why_not, _original_args_defaults, _original_is_in_ipython, _original_view_as
    with _lock:
        if _installed:
            return True
        patches, _why_not = _check()
        if not patches:
            return False
        _original_args_defaults = core.get_function_args_defaults
        _original_is_in_ipython = interactive_utils.is_in_ipython
        _original_view_as = pipeline_options.PipelineOptions.view_as
        for (mod, attr), new in patches.items():
            owner, name = _owner(mod, attr)
            _installed[(mod, attr)] = getattr(owner, name)
            setattr(owner, name, new)
        return True


def _owner(mod: str, attr: str) -> tuple[Any, str]:
    """The object holding a patched name: the module, or a class of it (``Class.name``)."""
    owner: Any = sys.modules[mod]
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def uninstall() -> None:
    """Restore Beam's own functions (and forget the memo)."""
    with _lock:
        for (mod, attr), old in _installed.items():
            owner, name = _owner(mod, attr)
            setattr(owner, name, old)
        _installed.clear()
        _memo.clear()
        _memo_bound.clear()
        _views.clear()


def status() -> str:
    """'installed', or why not."""
    if _installed:
        return "installed"
    return f"not installed: {_why_not or 'off by default (install() was not called)'}"
