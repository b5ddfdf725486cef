"""The built-in patch rules: one module per custom op, named after the op module it routes to.

``rms_norm.py`` routes to ``python_native/ops/rms_norm_op.py``, ``gated.py`` to ``gated_op.py``, and
so on (``layer_norm.py`` reports LayerNorms, which aten's ``layer_norm`` serves). A module here is a
rule module by being here: ``register_all`` lists the package, and no list names the modules, so a
new custom op's rule is one module dropped beside the others. Each declares

- ``RULES``: its ``PatchRule``s, in the order they are tried;
- ``PRIORITY``: an int, its place in the try-order: the rules of a higher priority are tried first
  (the most specific recognition first); equal priorities go by module name.

A module whose import raises, or whose ``RULES`` or ``PRIORITY`` is not that, or whose rule names
one registered already, is left out alone: its rules are not registered, the others are, and
``pn.status()``'s problems name it. Modules named ``_*`` and those without ``RULES`` are helpers.
"""

from __future__ import annotations

import pkgutil
from importlib import import_module
from types import ModuleType

from python_native.foundations import faults
from python_native.patching import rules as rules_

FIX = "pn.patch uses the other rules meanwhile; fix the module or remove it"


def _checked(module: ModuleType) -> str | None:
    """Why ``module``'s declarations cannot be registered, or None."""
    priority, found = getattr(module, "PRIORITY", None), getattr(module, "RULES", None)
    if type(priority) is not int:
        return f"PRIORITY must be an int (its place in the try-order), got {priority!r}"
    if not isinstance(found, (list, tuple)) or not all(isinstance(r, rules_.PatchRule) for r in found):
        return f"RULES must be a list of PatchRule, got {found!r}"
    return None


def discover(package: str, broken: dict[str, str]) -> list[ModuleType]:
    """The rule modules of ``package`` in the order their rules are registered: the lowest priority
    first, so that the highest is tried first. A module that fails to import or declares its rules
    wrongly is left out, its name and why put in ``broken``."""
    found = []
    for info in sorted(pkgutil.iter_modules(import_module(package).__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.ispkg:
            continue
        name = f"{package}.{info.name}"
        try:
            module = import_module(name)
        except Exception as e:  # a broken rule module: every other rule stays
            broken[name] = f"failed to import: {type(e).__name__}: {e}"
            continue
        if not hasattr(module, "RULES"):
            continue
        why = _checked(module)
        if why is None:
            found.append(module)
        else:
            broken[name] = why
    by_name_last_first = sorted(found, key=lambda m: m.__name__, reverse=True)  # equal priorities: tried by name
    return sorted(by_name_last_first, key=lambda m: m.PRIORITY)  # a stable sort keeps that order within one


def _register(module: ModuleType) -> str | None:
    """Register ``module``'s rules, last first (the first is then tried first): all or none."""
    handles = []
    for rule in reversed(module.RULES):
        try:
            handles.append(rules_.register(rule))
        except ValueError as e:  # a name registered already
            for handle in handles:
                handle.remove()
            return f"its rule {rule.name!r} is not registered: {e}"
    return None


def register_all(package: str = __name__) -> list[str]:
    """Register the rules of every rule module of ``package`` (see the module's docstring); a module
    left out is reported to ``faults`` (``pn.status()``'s problems). The modules registered, by name."""
    broken: dict[str, str] = {}
    registered = []
    for module in discover(package, broken):
        why = _register(module)
        if why is None:
            registered.append(module.__name__)
            faults.resolve(f"patch rules {module.__name__}")
        else:
            broken[module.__name__] = why
    for name, why in broken.items():
        faults.report(f"patch rules {name}", f"its rules are left out: {why}", FIX)
    return registered
