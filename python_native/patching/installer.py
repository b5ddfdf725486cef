"""``patch`` and ``unpatch``: the rules' decisions over a model's modules, installed and undone.

``patch`` has ``matching.match`` decide, per module of ``model.named_modules()`` and per function
their forwards call, which rule takes it (or why none does), inside ``probe.session()`` (every DSL
off) and ``probe.preserved(model)`` (nothing a probe did to the model stays). Then it installs:

- a module's replacement as an instance attribute ``forward`` (``nn.Module.__call__`` finds it
  before the class's; hooks run as before): a ``runtime.Installed`` that sets the module scope and
  holds the module, rule and plan its replacement is built from, so a deep copy or an unpickled
  copy of the model computes with its own modules, and the custom ops the rule routes to: a call
  no override of them serves runs the module's own forward (``runtime.serves``);
- a function's replacement as a dispatcher in its modeling module's globals, which serves only
  patched callers; each caller's forward is wrapped to say so. Several patched models share a
  dispatcher; the last ``unpatch`` puts the original function back.

The patch's state lives on the model (attribute ``STATE``): copies carry it, and each copy takes
its share of the patched functions (given back by ``unpatch`` or when the copy is collected).
``unpatch`` removes exactly what ``patch`` installed, so the model computes bit for bit what it
computed before.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torch import nn

from python_native.features import calibration
from python_native.patching import matching, probe, runtime
from python_native.patching import rules as rules_
from python_native.patching.report import OWN_CODE, PatchReport
from python_native.patching.rules import PatchRule

log = logging.getLogger("python_native")

_lock = threading.RLock()


@dataclasses.dataclass(frozen=True)
class _Function:
    """A patched module-level function, by name (a copy of the model re-installs its dispatcher)."""

    module: str  # the modeling module's name
    name: str
    replacement: Callable[..., Any]
    plan: Any
    ops: tuple[str, ...] = ()  # the custom ops whose overrides must serve a call (``runtime.serves``)


class _State:
    """A patched model's patch: carried by the model itself (``STATE``), so a deep copy or an
    unpickled model carries one over its own modules, and takes its users' share of the functions."""

    undone = False  # unpatched (through this model or another handle on its modules: a shallow copy)

    def __init__(self, report: PatchReport):
        self.report = report
        self.forwards: list[runtime.Installed] = []
        self.functions: list[_Function] = []
        self.release: Callable[[], Any] = lambda: None

    def hold(self) -> None:
        """Take this model's share of its functions' dispatchers; ``release()`` (by ``unpatch``, or
        when the model is collected unpatched) gives it back."""
        for function in self.functions:
            _acquire(function)
        self.release = weakref.finalize(self, _release, list(self.functions))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "release"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        with _lock:
            self.hold()


STATE = "_python_native_patch"  # the patched model's attribute holding its _State
_functions: dict[tuple[str, str], list[Any]] = {}  # (module, name) -> [globals, dispatcher, original, users]


def _state(model: nn.Module) -> _State | None:
    state = model.__dict__.get(STATE)
    if isinstance(state, _State) and state.undone:  # a shallow copy of this model was unpatched
        _forget(model, state)
        return None
    return state if isinstance(state, _State) else None


def _forget(model: nn.Module, state: _State) -> None:
    """``model`` no longer holds ``state``, nor, where it is a shallow copy, the root's forward."""
    del model.__dict__[STATE]
    own = model.__dict__.get("forward")
    if isinstance(own, runtime.Installed) and any(own is f for f in state.forwards) and own.target is not model:
        _restore(model, own)


def is_patched(model: nn.Module) -> bool:
    return _state(model) is not None


def report_of(model: nn.Module) -> PatchReport | None:
    state = _state(model)
    return None if state is None else state.report


def _selected(names: Iterable[str] | None) -> list[PatchRule]:
    everything = rules_.registered()
    if names is None:
        return everything
    names = [names] if isinstance(names, str) else list(names)
    known = {r.name for r in everything}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"no patch rule is named {', '.join(map(repr, unknown))}; rules: {sorted(known)}")
    return [r for r in everything if r.name in names]


def _install_forward(state: _State, module: nn.Module, name: str, owner: nn.Module | None = None,
                     replacement: Callable[..., Any] | None = None, plan: Any = None, ops: tuple[str, ...] = ()) -> None:
    had_own = "forward" in module.__dict__
    installed = runtime.Installed(name, module, owner, replacement, plan, caller=replacement is None,
                                  had_own=had_own, previous=module.__dict__.get("forward"), ops=ops)
    installed.build()
    state.forwards.append(installed)
    module.__dict__["forward"] = installed


def _acquire(function: _Function) -> None:
    """One more patched model's share of ``function``'s dispatcher (installed by the first)."""
    namespace = vars(importlib.import_module(function.module))
    key = (function.module, function.name)
    entry = _functions.get(key)
    if entry is None or namespace.get(function.name) is not entry[1]:
        current = namespace[function.name]
        original = getattr(current, "__python_native_original__", current)
        dispatcher = runtime.dispatcher(original, function.replacement(original, function.plan), function.ops)
        entry = _functions[key] = [namespace, dispatcher, original, 0]
        namespace[function.name] = dispatcher
    entry[3] += 1


def _install(model: nn.Module, taken: list, functions: list, state: _State) -> None:
    names = {id(m): matching.display_name(n, model) for n, m in model.named_modules()}
    for display, module, rule, plan in taken:
        replacement = rule.replacement(module, plan)
        targets = replacement if isinstance(replacement, Mapping) else {module: replacement}
        ops = runtime.rule_ops(rule.ops, plan)
        for target in targets:  # the module decides whether the op serves; the others it takes follow
            _install_forward(state, target, names.get(id(target), display), module, rule.replacement, plan,
                             ops if target is module else ())
    for namespace, fname, _function, rule, plan, callers in functions:
        state.functions.append(_Function(namespace["__name__"], fname, rule.replacement, plan,
                                         runtime.rule_ops(rule.ops, plan)))
        for display, module in callers:
            if "forward" not in module.__dict__:
                _install_forward(state, module, display)
    state.hold()


def patch(model: nn.Module, rules: Iterable[str] | None = None, *, dry_run: bool = False) -> PatchReport:
    """Route ``model``'s recognised modules and functions to the package's ops, in place."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"pn.patch takes an nn.Module, got {type(model).__name__}")
    selected = _selected(rules)
    with _lock:
        if is_patched(model):
            return _state(model).report
        report = PatchReport(type(model).__name__)
        devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
        with probe.session(devices), probe.preserved(model):
            taken, functions = matching.match(model, selected, report, "would patch" if dry_run else "patched")
        _say_what_serves(model, report, measure=not dry_run)  # after the probes, which held every DSL off
        if dry_run:
            return report
        state = _State(report)
        try:
            _install(model, taken, functions, state)
        except BaseException:
            _undo(state)
            raise
        model.__dict__[STATE] = state
    for entry in report.patched:
        log.info("python_native: patched %s %s (%d) with rule %s: %s", entry.kind, entry.target, entry.instances,
                 entry.rule, entry.detail)
    return report


def _say_what_serves(model: nn.Module, report: PatchReport, measure: bool) -> None:
    """Each routed entry's ``serves`` on the model's device; on a GPU (unless the user set
    ``pn.benchmark = False``) the ops they route to are installed there and timed on first use."""
    device = next((p.device for p in model.parameters()), None)
    key = "CPU" if device is None or device.type == "cpu" else device.type.upper()  # as runtime.device_key
    ops = sorted({op for entry in report.patched for op in entry.custom_ops})
    timed = measure and device is not None and bool(ops) and calibration.measure_on_first_use(ops, device)
    installed = runtime.install_for_timing(tuple(ops), key) if timed else {}  # held back until timed
    for entry in report.patched:
        entry.serves = runtime.serving_text(entry.custom_ops, key) + installed.get((entry.custom_ops or ("",))[0], "")
        if timed and not entry.serves.startswith(OWN_CODE):
            entry.serves += "; each (dtype, size) timed on its first call against the op's reference, the faster serves"


def _restore(module: nn.Module, installed: runtime.Installed) -> None:
    if installed.had_own:
        module.__dict__["forward"] = installed.previous
    else:
        del module.__dict__["forward"]


def _undo(state: _State) -> None:
    for installed in reversed(state.forwards):
        module = installed.target
        current = module.__dict__.get("forward")
        if current is installed:
            _restore(module, installed)
        elif current is not None:  # none: a copied part of the model unpatched on its own already
            log.warning("python_native: unpatch: %s's forward was replaced after patching; left as it is",
                        type(module).__name__)
        installed.retire()
    state.undone = True
    state.release()


def _unpatch_copied(model: nn.Module) -> bool:
    """Unpatch a copy of a patched model's part (``copy.deepcopy(model.layers[0])``): it holds
    patched forwards over its own modules, and no patch of its own."""
    found = [(m, f) for m in model.modules() if isinstance(f := m.__dict__.get("forward"), runtime.Installed)]
    held = sorted({f.name for _, f in found if not f.copied})
    if held:
        raise ValueError(f"pn.unpatch({type(model).__name__}): its modules {held} belong to a patched model; "
                         "unpatch the model pn.patch was given")
    for module, installed in found:
        _restore(module, installed)
        installed.retire()
    return bool(found)


def _release(functions: list[_Function]) -> None:
    """Give back one model's share of each of ``functions``: the last puts the original back."""
    with _lock:
        for function in reversed(functions):
            key = (function.module, function.name)
            entry = _functions.get(key)
            if entry is None:
                continue
            entry[3] -= 1
            if entry[3] <= 0:
                namespace, dispatcher, original, _ = _functions.pop(key)
                if namespace.get(function.name) is dispatcher:
                    namespace[function.name] = original


def unpatch(model: nn.Module) -> bool:
    """Undo ``patch(model)`` exactly (through a shallow copy too: both are unpatched); a deep copy
    of a patched part is unpatched alone (overrides it installed stay: ``runtime.install_for_timing``).
    False when nothing in ``model`` is patched."""
    with _lock:
        state = _state(model)
        if state is None:
            return _unpatch_copied(model)
        _forget(model, state)
        _undo(state)
    return True
