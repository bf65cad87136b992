"""The plugin registry: every mechanism and its estimator, by name.

Built-in families are listed in :data:`BUILTINS`. Third-party packages add their own
through the entry-point group ``ldp_beam.plugins``: each entry point names a callable that takes
the :class:`Registry` and calls :meth:`Registry.register`. The CLI, the pipelines and the Beam
layer know families only through this registry, so a plugin needs no change anywhere else.

The process-wide registry (:func:`get_registry`) imports a built-in family's modules when that
family is first used (its name looked up, a mechanism of its class given), not all of them up
front: importing every family's mechanism, estimator and central modules cost each command
~0.14 s of CPU (measured in ``ldp-beam estimate``, after its own imports), most of it for
families the command never touched. :func:`_register_builtins` still imports them all.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import threading
import types
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, Callable

from .core import Configured, Estimator, Mechanism
from .errors import ParameterError, UnknownPluginError
from .privacy import NONE

ENTRY_POINT_GROUP = "ldp_beam.plugins"


@dataclass(frozen=True)
class Plugin:
    name: str
    mechanism: type[Mechanism]
    estimator: Callable[..., Estimator]
    summary: str = ""
    source: str = "ldp-beam"


class Registry:
    def __init__(self) -> None:
        self._plugins: dict[str, Plugin] = {}
        self._deferred: dict[str, tuple[str, str, str, str]] = {}  # see register_deferred
        self._order: list[str] = []  # every name, in registration order
        self._lock = threading.RLock()  # deferred families are imported under it
        self.load_errors: dict[str, str] = {}

    def register(self, name: str, mechanism: type[Mechanism], estimator: Callable[..., Estimator],
                 summary: str = "", source: str = "ldp-beam") -> None:
        if name in self._plugins or name in self._deferred:
            by = self._plugins[name].source if name in self._plugins else "ldp-beam"
            raise ValueError(f"a mechanism named {name!r} is already registered (by {by})")
        if not (isinstance(mechanism, type) and issubclass(mechanism, Configured)):
            raise TypeError(f"{name}: mechanism must be a Mechanism or CentralRelease subclass")
        self._plugins[name] = Plugin(name, mechanism, estimator,
                                     summary or (mechanism.__doc__ or "").strip().split("\n")[0],
                                     source)
        if name not in self._order:  # (a deferred family keeps its place)
            self._order.append(name)

    def register_deferred(self, name: str, mechanism: str, estimator: str) -> None:
        """Register a built-in family by where its classes live (``"module:Class"``); the
        modules are imported, and the family registered with :meth:`register`, when the name
        is looked up or a mechanism of that class is given (:meth:`plugin_of`)."""
        if name in self._plugins or name in self._deferred:
            raise ValueError(f"a mechanism named {name!r} is already registered")
        mod, cls = mechanism.split(":")
        with self._lock:
            self._deferred[name] = (mod, cls, *estimator.split(":"))
            self._order.append(name)

    def _resolve(self, name: str) -> None:
        with self._lock:
            spec = self._deferred.get(name)
            if spec is None:
                return
            mod, cls, est_mod, est_cls = spec
            mech, est = _load(f"{mod}:{cls}"), _load(f"{est_mod}:{est_cls}")
            del self._deferred[name]
            self.register(name, mech, est)

    def names(self) -> list[str]:
        return sorted(self._order)

    def get(self, name: str) -> Plugin:
        plugin = self._plugins.get(name)
        if plugin is None:
            with self._lock:  # (another thread may be importing it)
                self._resolve(name)
                plugin = self._plugins.get(name)
        if plugin is None:
            raise UnknownPluginError(f"unknown mechanism {name!r}; registered: "
                                     f"{', '.join(self.names())}")
        return plugin

    def plugin_of(self, mechanism: Mechanism) -> Plugin:
        """The first family registered with ``mechanism``'s class (deferred families whose
        class has its module and name are imported first; if none matches, all are)."""
        t = type(mechanism)
        with self._lock:
            for name, spec in list(self._deferred.items()):
                if (spec[0], spec[1]) == (t.__module__, t.__qualname__):
                    self._resolve(name)
            for attempt in (0, 1):
                for name in self._order:
                    p = self._plugins.get(name)
                    if p is not None and t is p.mechanism:
                        return p
                if attempt == 0:  # a class defined elsewhere under another name: import all
                    for name in list(self._deferred):
                        self._resolve(name)
        raise UnknownPluginError(f"mechanism class {type(mechanism).__name__} is not registered")

    def build(self, name: str, params: dict[str, Any], *,
              allow_no_guarantee: bool = False) -> Mechanism:
        """Build mechanism ``name``; string values (from a command line) are converted by the
        dataclass field types.

        A configuration whose guarantee has no finite epsilon (kind ``none``, or an infinite
        epsilon: e.g. RVNS with delta <= d, DPHR's ``variant='paper'``, StructureFirst without a
        public ``F``, OSPDPRR's ``mode='paper'``) is refused with a :class:`ParameterError`
        naming the parameters responsible, unless ``allow_no_guarantee=True`` (the command
        line's ``--allow-no-guarantee``): such configurations exist to replicate papers, and
        their guarantee's ``describe()`` says "no finite guarantee" in every output.
        """
        cls = self.get(name).mechanism
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        kwargs = {}
        for key, raw in params.items():
            if key not in fields:
                raise ParameterError(key, raw, f"a parameter of {name}: {sorted(fields)}")
            kwargs[key] = convert(raw, hints[key], key) if isinstance(raw, str) else raw
        missing = [f for f, fd in fields.items() if _required(fd) and f not in kwargs]
        if missing:
            raise ParameterError(missing[0], None, f"a value: {name} requires "
                                 f"{', '.join(missing)} (no default)", _required_hint(missing))
        if not isinstance(allow_no_guarantee, bool):
            raise ParameterError("allow_no_guarantee", allow_no_guarantee, "True or False")
        mech = cls(**kwargs)
        if not allow_no_guarantee:
            check_finite_guarantee(mech)
        return mech

    def example_params(self, name: str) -> dict[str, Any]:
        """Values for the required parameters of ``name`` that build it, for showing its
        guarantee (``ldp-beam list``): ``lower=0``/``upper=1`` for bounds, 1.0 otherwise."""
        cls = self.get(name).mechanism
        return {f.name: _EXAMPLE_VALUES.get(f.name, 1.0) for f in dataclasses.fields(cls)
                if f.init and _required(f)}

    def estimator_for(self, mechanism: Mechanism, **options: Any) -> Estimator:
        """The registered estimator for ``mechanism``; string option values (from a command
        line) are converted by the estimator constructor's annotations."""
        factory = self.plugin_of(mechanism).estimator
        if any(isinstance(v, str) for v in options.values()):
            sig = inspect.signature(factory)
            try:
                hints = typing.get_type_hints(factory.__init__ if isinstance(factory, type)
                                              else factory)
            except Exception:
                hints = {}
            accepts_any = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
            for key, raw in list(options.items()):
                if key not in sig.parameters and not accepts_any:
                    names = [n for n in sig.parameters if n != "mechanism"]
                    raise ParameterError(key, raw, f"an option of the {mechanism.name} estimator: "
                                         f"{names or 'it takes none'}")
                if isinstance(raw, str) and key in hints:
                    options[key] = convert(raw, hints[key], key)
        return factory(mechanism, **options)

    def describe(self) -> list[dict]:
        out = []
        for name in self.names():
            p = self.get(name)
            hints = typing.get_type_hints(p.mechanism)
            params = []
            notes = getattr(p.mechanism, "DEFAULT_NOTES", {})
            for f in dataclasses.fields(p.mechanism):
                default = None if f.default is dataclasses.MISSING else f.default
                row = {"name": f.name, "type": _type_name(hints[f.name]),
                       "required": _required(f), "default": default}
                if f.name in notes:  # a default resolved from other parameters when built
                    row["default_note"] = notes[f.name]
                params.append(row)
            out.append({"name": name, "family": p.mechanism.family, "summary": p.summary,
                        "source": p.source, "parameters": params,
                        "roles": [{"name": r.name, "required": r.required, "kind": r.kind}
                                  for r in p.mechanism.roles],
                        "report_fields": _report_fields(p.mechanism)})
        return out


#: what a user should know about a parameter that has no default
_REQUIRED_HINTS = {
    "lower": "declare the domain [lower, upper] of the data: no default domain fits arbitrary "
             "data, values outside it are dead-lettered and the estimates and noise are "
             "calibrated to it",
}
_REQUIRED_HINTS["upper"] = _REQUIRED_HINTS["lower"]
_EXAMPLE_VALUES = {"lower": 0.0, "upper": 1.0}


def _required(f: dataclasses.Field) -> bool:
    """Whether a dataclass field has no default."""
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _required_hint(missing: list[str]) -> str:
    return "; ".join(dict.fromkeys(_REQUIRED_HINTS[m] for m in missing if m in _REQUIRED_HINTS))


def has_finite_guarantee(mechanism: Mechanism) -> bool:
    """Whether ``mechanism``'s guarantee has a finite epsilon (and is not of kind ``none``)."""
    g = mechanism.guarantee
    return g.kind != NONE and math.isfinite(g.epsilon)


def check_finite_guarantee(mechanism: Mechanism) -> None:
    """Raise :class:`ParameterError` if ``mechanism`` has no finite guarantee, naming the
    parameters responsible (from the mechanism's ``no_guarantee_reason()`` where it has one)."""
    if has_finite_guarantee(mechanism):
        return
    g = mechanism.guarantee
    explain = getattr(mechanism, "no_guarantee_reason", None)
    names: tuple[str, ...] = ()
    why = ""
    if callable(explain):
        names, why = explain()
    if not why:
        why = g.notes.split(". ")[0] if g.notes else g.describe()
    params = mechanism.params()
    names = tuple(n for n in names if n in params)
    name = names[0] if names else "allow_no_guarantee"
    value = params[name] if names else False
    also = "".join(f", with {n} = {params[n]!r}" for n in names[1:])
    raise ParameterError(
        name, value, f"a configuration with a finite privacy guarantee{also}: {mechanism.name} "
        f"with these parameters has {g.describe()}: {why}",
        "to run it anyway, e.g. to replicate a paper: allow_no_guarantee=True, on the command "
        "line --allow-no-guarantee; every output then says 'no finite guarantee'")


def _report_fields(cls: type[Mechanism]) -> list | str:
    fields = cls.report_fields
    if isinstance(fields, property):  # depends on the parameters (e.g. RVNS: y1..yk)
        return (fields.__doc__ or "").strip() or "depends on the parameters"
    return [list(f) for f in fields]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def convert(raw: str, tp: Any, name: str) -> Any:
    """Convert a command-line string to the annotated type of parameter ``name``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and raw.strip().lower() in ("none", "null", ""):
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return convert(raw, a, name)
            except ParameterError:
                continue
        raise ParameterError(name, raw, f"a value of type {_type_name(tp)}")
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp) or (str,)
        return tuple(convert(x.strip(), inner, name) for x in raw.split(",") if x.strip())
    try:
        if tp is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if tp is int:
            return int(raw)
        if tp is float:
            v = float(raw)
            if math.isnan(v):
                raise ValueError(raw)
            return v
        if tp is str:
            return raw
    except ValueError:
        raise ParameterError(name, raw, f"a value of type {_type_name(tp)}") from None
    raise ParameterError(name, raw, f"a parameter settable from the command line ({tp})")


#: the built-in families in registration order: (name, mechanism class, estimator), as
#: ``"module:Class"`` (imported when used, see :meth:`Registry.register_deferred`); the same
#: families :func:`_register_builtins` imports and registers
BUILTINS = (
    ("bisample", "ldp_beam.mechanisms.bisample:BiSample",
     "ldp_beam.estimators.bisample:BiSampleEstimator"),
    ("bisample-md", "ldp_beam.mechanisms.bisample:BiSampleMD",
     "ldp_beam.estimators.bisample:BiSampleEstimator"),
    ("harmony", "ldp_beam.mechanisms.mean_baselines:Harmony",
     "ldp_beam.estimators.mean_baselines:HarmonyEstimator"),
    ("pm", "ldp_beam.mechanisms.mean_baselines:PiecewiseMechanism",
     "ldp_beam.estimators.mean_baselines:PiecewiseEstimator"),
    ("privkvm", "ldp_beam.mechanisms.mean_baselines:PrivKVM",
     "ldp_beam.estimators.mean_baselines:PrivKVMEstimator"),
    ("rvns", "ldp_beam.mechanisms.rvns:RVNS", "ldp_beam.estimators.rvns:RVNSEstimator"),
    ("laplace-dp", "ldp_beam.mechanisms.continuous_baselines:LaplaceNoise",
     "ldp_beam.estimators.continuous_baselines:NoiseKDEEstimator"),
    ("generalized-gaussian", "ldp_beam.mechanisms.continuous_baselines:GeneralizedGaussianNoise",
     "ldp_beam.estimators.continuous_baselines:NoiseKDEEstimator"),
    ("square-wave", "ldp_beam.mechanisms.continuous_baselines:SquareWave",
     "ldp_beam.estimators.continuous_baselines:SquareWaveEMSEstimator"),
    ("grr", "ldp_beam.mechanisms.categorical:GRR",
     "ldp_beam.estimators.joint:CategoricalEstimator"),
    ("urr", "ldp_beam.mechanisms.categorical:URR",
     "ldp_beam.estimators.joint:CategoricalEstimator"),
    ("jurr", "ldp_beam.mechanisms.joint:JuRR", "ldp_beam.estimators.joint:JuRREstimator"),
    ("cprr", "ldp_beam.mechanisms.joint:CPRR", "ldp_beam.estimators.joint:ProductURREstimator"),
    ("jd-grr", "ldp_beam.mechanisms.joint:JDGRR",
     "ldp_beam.estimators.joint:ProductURREstimator"),
    ("tdrr", "ldp_beam.mechanisms.joint:TDRR", "ldp_beam.estimators.joint:TDRREstimator"),
    ("dphr", "ldp_beam.central.dphr:DPHR",
     "ldp_beam.central.histogram:HistogramReleaseEstimator"),
    ("laplace-histogram", "ldp_beam.central.histogram:IdentityLaplace",
     "ldp_beam.central.histogram:HistogramReleaseEstimator"),
    ("structure-first", "ldp_beam.central.histogram_baselines:StructureFirst",
     "ldp_beam.central.histogram:HistogramReleaseEstimator"),
    ("ahp", "ldp_beam.central.histogram_baselines:AHP",
     "ldp_beam.central.histogram:HistogramReleaseEstimator"),
    ("ospdprr", "ldp_beam.central.ospdprr:OSPDPRR",
     "ldp_beam.central.ospdprr:OSPDPRREstimator"),
    ("osdp-rr", "ldp_beam.central.osdprr:OsdpRR", "ldp_beam.central.osdprr:OsdpRREstimator"),
    ("central-count", "ldp_beam.central.count:CentralCount",
     "ldp_beam.central.count:CentralCountEstimator"),
    ("privacy-id-count", "ldp_beam.central.count:PrivacyIdCount",
     "ldp_beam.central.count:CentralCountEstimator"),
    ("central-sum", "ldp_beam.central.sum:CentralSum", "ldp_beam.central.sum:CentralSumEstimator"),
    ("central-mean", "ldp_beam.central.mean:CentralMean",
     "ldp_beam.central.mean:CentralMeanEstimator"),
    ("central-variance", "ldp_beam.central.variance:CentralVariance",
     "ldp_beam.central.variance:CentralVarianceEstimator"),
    ("central-quantiles", "ldp_beam.central.quantiles:CentralQuantiles",
     "ldp_beam.central.quantiles:CentralQuantilesEstimator"),
)


def _register_deferred_builtins(reg: Registry) -> None:
    for name, mech, est in BUILTINS:
        reg.register_deferred(name, mech, est)


def _register_builtins(reg: Registry) -> None:
    """Import and register every built-in family of :data:`BUILTINS` now (the process-wide
    registry defers this per family: :func:`_register_deferred_builtins`)."""
    for name, mech, est in BUILTINS:
        reg.register(name, _load(mech), _load(est))


def _load(where: str) -> Any:
    """The class at ``"module:Class"``."""
    mod, cls = where.split(":")
    return getattr(importlib.import_module(mod), cls)


def load_plugins(reg: Registry) -> None:
    """Call every ``ldp_beam.plugins`` entry point with the registry. A plugin that fails to load
    is reported in ``reg.load_errors`` (and by ``ldp-beam list``), never silently ignored."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()(reg)
        except Exception as exc:  # a broken plugin must not break the built-ins
            reg.load_errors[ep.name] = f"{type(exc).__name__}: {exc}"


@functools.lru_cache(maxsize=1)
def get_registry() -> Registry:
    """The process-wide registry: built-ins plus installed plugins (built once, then cached; a
    built-in family's modules are imported when it is first used)."""
    reg = Registry()
    _register_deferred_builtins(reg)
    load_plugins(reg)
    return reg


def build_mechanism(name: str, *, allow_no_guarantee: bool = False, **params: Any) -> Mechanism:
    """Build a registered mechanism from keyword parameters (see :meth:`Registry.build`)."""
    return get_registry().build(name, params, allow_no_guarantee=allow_no_guarantee)
