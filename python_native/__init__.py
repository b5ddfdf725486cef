"""python-native: DSL-written replacements for aten operators, and one panel to control them.

``import torch`` mounts this module at ``torch.backends.python_native`` (through torch's
``torch.backends`` entry-point group); ``import python_native`` returns the same object::

    import torch.backends.python_native as pn

    pn.all_dsls, pn.available_dsls
    with pn.triton.disabled(): ...
    with pn.operations_disabled("bmm"): ...
    with pn.trace() as t: ...

Scopes are decorators too (``@pn.operations_disabled("bmm")``). With ``PYTHON_NATIVE_CHECK=1`` set
before overrides register, each fired override is compared with aten's kernel and a difference
raises ``pn.OverrideMismatch``.

Importing never imports a DSL runtime: kernels load on the first call that needs them.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

# ``logs`` first: it joins torch's TORCH_LOGS names before anything here logs. Features plug into the
# dispatch core when imported: all of them, before any override registers. The operators the package
# adds outside aten (``python_native.ops``) are declared on first use (``_declare_ops``), and the
# parts of the API a process may never use (model patching, the status snapshot, variant choices)
# load on first access (``_LAZY``): ``import torch`` pays only for what installs the overrides.
from python_native.foundations import logs  # noqa: F401

# isort: split
from python_native.core.handles import Cond, Impl, OrderFn, OverrideHandle
from python_native.core.registry import REGISTRY
from python_native.features import calibration, checked, compiled, front  # noqa: F401
from python_native.foundations import custom_ops, dsl_registry, env, public_names, uncompiled
from python_native.foundations.trace_summary import TraceSummary
from python_native.foundations.tracing import DEFAULT_CAPACITY, Trace, TraceEvent
from python_native.panel import bootstrap as _bootstrap
from python_native.panel import mounting as _module

if TYPE_CHECKING:
    from python_native.panel.controller import Scope

# Public names loaded on first access: name -> (module, attribute of it; None: the module itself).
_LAZY: dict[str, tuple[str, str | None]] = {
    "DSLController": ("python_native.panel.controller", "DSLController"),
    "ops": ("python_native.ops", None),
    "linear_cross_entropy": ("python_native.ops", "linear_cross_entropy"),
    "speckey": ("python_native.foundations.speckey", None),
    "OverrideMismatch": ("python_native.features.checked", "OverrideMismatch"),
    "snapshot": ("python_native.panel.snapshot", None),
    **{name: ("python_native.panel.choices", name)
       for name in ("get_override_variant", "override_variant", "set_override_variant")},
    "patching": ("python_native.patching", None),
    **{name: ("python_native.patching", name)
       for name in ("LeftAlone", "PatchReport", "PatchRule", "patch", "patch_rules", "patched", "register_patch_rule",
                    "unpatch")},
    "ReachReport": ("python_native.patching.reach", "ReachReport"),
    "reach": ("python_native.patching.reach", "reach"),
    **{name: ("python_native.panel.explain", name) for name in ("Explanation", "explain")},
}


def __getattr__(name: str):
    """The names of ``_LAZY``, imported on first access and kept (PEP 562)."""
    found = _LAZY.get(name)
    if found is None:
        raise AttributeError(f"module 'python_native' has no attribute {name!r}")
    module_name, attribute = found
    value = importlib.import_module(module_name)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def _panel() -> ModuleType:
    """The panel's controller (switch names and scopes), loaded with the first switch used."""
    from python_native.panel import controller

    return controller


def _declare_ops() -> None:
    """Declare the package's own operators (``torch.ops.python_native.*``): run on first lookup."""
    from python_native import ops  # noqa: F401


custom_ops.declare_on_first_use(_declare_ops)

__version__ = "0.1.0"

__all__ = [
    "get_dsl_operations",
    "operation_names",
    "register_dsl",
    "register_op_override",
    "flags",
    "is_available",
    "version",
    "disable_operations",
    "enable_operations",
    "operations_disabled",
    "operations_enabled",
    "disable_dispatch_keys",
    "enable_dispatch_keys",
    "dispatch_keys_disabled",
    "dispatch_keys_enabled",
    "is_operation_disabled",
    "is_dsl_disabled",
    "is_dispatch_key_disabled",
    "reorder_overrides",
    "overrides",
    "router_source",
    "explain",
    "Explanation",
    "trace",
    "status",
    "compile_mode_set",
    "benchmark_set",
    "decomposition_table",
    "linear_cross_entropy",
    "patch",
    "unpatch",
    "patched",
    "register_patch_rule",
    "patch_rules",
    "reach",
    "PatchRule",
    "PatchReport",
    "LeftAlone",
    "ReachReport",
    "set_override_variant",
    "get_override_variant",
    "override_variant",
    "DSLController",
    "OverrideHandle",
    "OverrideMismatch",
    "Trace",
    "TraceEvent",
    "TraceSummary",
    "speckey",
]


def register_dsl(name: str, module) -> None:
    """Register a DSL: ``module`` has ``runtime_available()`` and ``runtime_version()``."""
    dsl_registry.register_dsl(name, module)


def register_op_override(
    dsl: str,
    lib_symbol: str,
    op_symbol: str,
    dispatch_key: str,
    cond: Cond | None,
    impl: Impl,
    *,
    public_name: str | None = None,
    backward: bool = False,
    **options: Any,
) -> OverrideHandle:
    """Route ``lib_symbol::op_symbol`` at ``dispatch_key`` to ``impl`` whenever ``cond`` accepts.

    ``cond`` and ``impl`` receive the op's arguments as its schema declares them (keyword-only
    ones as keywords, defaults filled in). Calls no cond accepts run the kernel the dispatcher
    had before. Higher ``priority`` runs first; ties run in registration order.
    ``derive_forms=True`` (or ``("inplace", "out")``) also routes the op's in-place and ``out=``
    forms (``relu_``, ``relu.out``) to the same cond and impl, finished by a generated epilogue
    (``derive_variants``, its old name, still works and warns).
    ``impl_takes_plan=True`` hands the cond's result to the impl as the keyword argument ``plan``:
    a cond that works something out about the call (the rows of a tensor, a tile, a grid) returns
    it, truthy, or a falsy value to decline, and the impl uses it instead of working it out again.
    The impl should default ``plan`` to None, and plan for itself then, so it stays callable alone.
    ``public_name`` is the name users type for the op (``"softmax"`` for ``_softmax``), which the
    op switches then accept; ``backward=True`` declares the op the backward of the forward
    registered under the same public name (see ``operation_names``).
    ``explain(*args, **kwargs) -> str | None`` says why ``cond`` declines a call (``"dtype float64"``);
    it is asked only while a trace is open and only for calls the cond declined, and the trace
    event's ``reason`` shows its answer (a cond with an ``explain`` attribute needs no argument).

    ``variants={"name": impl, ...}`` declares alternative impls (same arguments as ``impl``, which
    is the variant named ``"default"``; ``"aten"`` is reserved for the original kernel), chosen
    per op with ``set_override_variant``, ``override_variant`` or ``PYTHON_NATIVE_VARIANTS``.
    """
    _panel().require_overload(lib_symbol, op_symbol)
    handle = REGISTRY.register(dsl, lib_symbol, op_symbol, dispatch_key, cond, impl, **options)
    if public_name is not None:
        public_names.declare(public_name, handle.op, backward=backward)
        from python_native.core import variants

        variants.seed(REGISTRY, handle)  # PYTHON_NATIVE_VARIANTS may name the op by its public name
    return handle


def _with_registry_options(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature, its ``**options`` spelled out as the registry's keywords (defined there only)."""
    own = inspect.signature(fn)
    options = [p for p in inspect.signature(type(REGISTRY).register).parameters.values() if p.kind is p.KEYWORD_ONLY]
    mine = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD]
    return own.replace(parameters=sorted(mine + options, key=lambda p: p.kind))  # stable: positional ones first


register_op_override.__signature__ = _with_registry_options(register_op_override)  # type: ignore[attr-defined]


def get_dsl_operations(dsl_name_: str) -> list[str]:
    """Sorted op symbols the DSL overrides; ``[]`` for a name no DSL has (warned about, with close matches)."""
    _bootstrap.apply_env_changes()
    return REGISTRY.dsl_operations(_panel().dsl_name(dsl_name_, warn_unknown=True))


def is_available() -> bool:
    """Whether overrides can run in this process, as ``torch.backends.cudnn.is_available()``: some
    DSL's runtime can run here and ``PYTHON_NATIVE_DISABLE`` does not turn every override off."""
    _bootstrap.apply_env_changes()
    return not REGISTRY.killed and any(dsl_registry.available(name) for name in dsl_registry.names())


def version() -> str:
    """This package's version (``pn.<dsl>.version()`` gives a DSL runtime's)."""
    return __version__


def overrides() -> list[OverrideHandle]:
    """Every registered override, slot by slot, in routing order."""
    _bootstrap.apply_env_changes()
    return REGISTRY.overrides()


def operation_names(dsl: str | None = None) -> dict[str, list[str]]:
    """The names the op switches accept for the installed overrides (of ``dsl``, or of every DSL),
    each with the aten ops it covers: ``{"softmax": ["_softmax", "_softmax_backward_data"], ...}``.

    A public name covers the forward and the backward declared under it (and the in-place and
    ``out=`` forms derived from them); so does the aten forward's own name (``"_softmax"``),
    while a backward's aten name (``"_softmax_backward_data"``) covers just that op. Ops installed
    without a public name are listed under their aten name.
    """
    _bootstrap.apply_env_changes()
    return _panel().installed_names(dsl)


@uncompiled.opaque
def disable_operations(*op_symbols: str) -> None:
    """Stop routing these ops: a public name (``"softmax"``) or an aten forward's name (``"_softmax"``)
    covers the forward, its backward and their derived forms; ``"add"`` every overload of add,
    ``"add.Tensor"`` that one. See ``operation_names()``."""
    _bootstrap.apply_env_changes()
    REGISTRY.disable("op", _panel().op_names(op_symbols, "disable_operations"))


@uncompiled.opaque
def enable_operations(*op_symbols: str) -> None:
    """Route these ops again (names as ``disable_operations`` takes them), lifting explicit disables
    and open scopes alike."""
    _bootstrap.apply_env_changes()
    REGISTRY.enable("op", _panel().op_names(op_symbols, "enable_operations"))


@uncompiled.opaque
def operations_disabled(*op_symbols: str) -> Scope:
    """Context manager or decorator: these ops (names as ``disable_operations`` takes them) run
    aten's kernels inside the block or call."""
    return _panel().Scope("op", _panel().op_names(op_symbols, "operations_disabled"))


@uncompiled.opaque
def operations_enabled(*op_symbols: str) -> Scope:
    """Context manager or decorator: these ops (names as ``disable_operations`` takes them) route to
    their overrides inside the block or call, even where they are disabled outside it."""
    return _panel().Scope("op", _panel().op_names(op_symbols, "operations_enabled"), off=False)


@uncompiled.opaque
def disable_dispatch_keys(*dispatch_keys: str) -> None:
    """Stop routing every override installed at these keys (``"CUDA"``, ``"CPU"``, ...)."""
    _bootstrap.apply_env_changes()
    REGISTRY.disable("key", _panel().dispatch_key_names(dispatch_keys, "disable_dispatch_keys"))


@uncompiled.opaque
def enable_dispatch_keys(*dispatch_keys: str) -> None:
    _bootstrap.apply_env_changes()
    REGISTRY.enable("key", _panel().dispatch_key_names(dispatch_keys, "enable_dispatch_keys"))


@uncompiled.opaque
def dispatch_keys_disabled(*dispatch_keys: str) -> Scope:
    """Context manager or decorator: overrides at these keys are off inside the block or call."""
    return _panel().Scope("key", _panel().dispatch_key_names(dispatch_keys, "dispatch_keys_disabled"))


@uncompiled.opaque
def dispatch_keys_enabled(*dispatch_keys: str) -> Scope:
    """Context manager or decorator: overrides at these keys are on inside the block or call."""
    return _panel().Scope("key", _panel().dispatch_key_names(dispatch_keys, "dispatch_keys_enabled"), off=False)


@uncompiled.opaque
def flags(enabled: bool | None = None, **dsls: bool) -> Scope:
    """Context manager or decorator, as ``torch.backends.cudnn.flags``: inside the block, ``enabled``
    sets the master switch (``pn.enabled``) and each ``dsl=bool`` (``triton=False``) sets that DSL;
    everything is as it was after it, also when the body raises. Works after
    ``torch.backends.disable_global_flags()``, where bare assignment of ``pn.enabled`` is refused.
    An argument left out (or None) is left as it is."""
    return _panel().flags_scope(enabled, dsls)


@uncompiled.opaque
def is_operation_disabled(op_symbol: str) -> bool:
    """Whether every op ``op_symbol`` covers is off (by the rule of ``disable_operations``): each by its
    own name, its bare name, or (an in-place or ``out=`` form) the name of the op it derives from."""
    return all(_panel().op_is_off(name) for name in _panel().op_targets(op_symbol))


@uncompiled.opaque
def is_dsl_disabled(dsl_name_: str) -> bool:
    """Whether the DSL's overrides are switched off; a name no DSL has warns, with close matches."""
    return REGISTRY.is_off("dsl", _panel().dsl_name(dsl_name_, warn_unknown=True))


@uncompiled.opaque
def is_dispatch_key_disabled(dispatch_key: str) -> bool:
    (name,) = _panel().dispatch_key_names((dispatch_key,))
    return REGISTRY.is_off("key", name)


def reorder_overrides(fn: OrderFn | None) -> None:
    """Reorder every slot with ``fn(op_symbol, dispatch_key, overrides) -> overrides``.

    ``fn`` gets each slot's overrides in default order (priority, then registration) and must
    return a permutation of them; ``None`` restores the default order.
    """
    REGISTRY.reorder(fn)


def router_source(op_symbol: str, dispatch_key: str, lib_symbol: str = "aten") -> str:
    """Source of the router the dispatcher runs now for ``lib_symbol::op_symbol`` at ``dispatch_key``."""
    _panel().require_overload(lib_symbol, op_symbol)
    (key,) = _panel().dispatch_key_names((dispatch_key,))
    return REGISTRY.router_source(op_symbol, key, lib_symbol)


@uncompiled.opaque
def trace(capacity: int = DEFAULT_CAPACITY) -> Trace:
    """Context manager recording one ``TraceEvent`` per routed call while it is open: at most
    ``capacity`` of them (100 000 by default, about 10 MB), the rest counted in ``trace.dropped``.
    It warns when no DSL can run here, so that an empty trace is never a mystery."""
    from python_native.panel import snapshot

    _bootstrap.apply_env_changes()
    snapshot.warn_if_nothing_runs(stacklevel=2)
    return REGISTRY.trace(capacity)


def _get_filter_state():
    """The disabled DSLs, ops and dispatch keys as torch's own panel exposes them to its tests
    (``_dsl_names``, ``_op_symbols``, ``_dispatch_keys``: live sets; see ``panel.filter_state``)."""
    from python_native.panel.filter_state import FILTER_STATE

    return FILTER_STATE


def compile_mode_set(mode: str):
    """Context manager: ``pn.compile_mode`` is ``mode`` inside the block (``"bypass"`` or ``"keep"``)."""
    return compiled.mode_set(mode)


def benchmark_set(value):
    """Context manager: ``pn.benchmark`` is ``value`` inside the block (False, True or ``"unmeasured"``)."""
    return calibration.benchmark_set(value)


def decomposition_table(base=None):
    """For ``ExportedProgram.run_decompositions``: ``base`` (default: torch's export table) with
    every overridden aten op mapped to its opaque ``python_native`` op."""
    return compiled.decomposition_table(base)


def status() -> dict:
    """Everything the status report shows, as plain data."""
    from python_native.panel import snapshot

    _bootstrap.apply_env_changes()
    return snapshot.collect()


_module.mount(sys.modules[__name__])

# Last: the backends use the API above while they register.
_bootstrap.load_builtin_dsls()
env.check_unknown()  # a misspelt PYTHON_NATIVE_* variable is named once, with the one it resembles

del sys
