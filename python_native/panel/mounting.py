"""The module type of ``python_native``, and its mounting at ``torch.backends.python_native``.

``python_native`` is a module whose class adds the attributes that must be computed on access
(``all_dsls``, ``available_dsls``) and ``pn.<dsl>`` controllers, like torch's own backend
modules. Mounting puts that same module object at ``torch.backends.python_native``.
"""

from __future__ import annotations

import difflib
import importlib
import sys
import types
from functools import cache
from typing import TYPE_CHECKING

from python_native.core.registry import REGISTRY
from python_native.features import calibration, compiled
from python_native.foundations import dsl_registry
from python_native.foundations.switches import ALL
from python_native.panel import bootstrap as _bootstrap

if TYPE_CHECKING:
    from python_native.panel.controller import DSLController

# Attributes of the module class, computed on each read; with the package's ``__all__`` they are
# the public API (``dir(pn)``, the names no DSL may take), set by ``mount``.
COMPUTED = ("all_dsls", "available_dsls", "enabled", "compile_mode", "benchmark")
PUBLIC_API: tuple[str, ...] = COMPUTED


@cache
def controller(name: str) -> DSLController:
    from python_native.panel.controller import DSLController  # with the first pn.<dsl>: import torch needs none

    return DSLController(name)


class PythonNativeModule(types.ModuleType):
    """``pn`` itself: a module with computed attributes and one controller per DSL."""

    @property
    def all_dsls(self) -> list[str]:
        _bootstrap.apply_env_changes()
        return dsl_registry.names()

    @property
    def available_dsls(self) -> list[str]:
        """The DSLs whose runtime can run here (``pn.status()`` says why one has no override installed)."""
        _bootstrap.apply_env_changes()
        return [name for name in dsl_registry.names() if dsl_registry.available(name)]

    @property
    def enabled(self) -> bool:
        """The master switch, as ``torch.backends.cudnn.enabled``: False turns every override of every
        DSL off (the other switches keep their state underneath); ``pn.flags(enabled=...)`` scopes it."""
        return not REGISTRY.is_off("all", ALL)

    @enabled.setter
    def enabled(self, value: bool) -> None:
        from python_native.panel.controller import flag_value, refuse_if_frozen

        refuse_if_frozen("pn.enabled", f"pn.flags(enabled={bool(value)!r})")
        on = flag_value(value, "pn.enabled")
        REGISTRY.enable("all", (ALL,)) if on else REGISTRY.disable("all", (ALL,))

    @property
    def compile_mode(self) -> str:
        """How overrides meet torch.compile: "bypass" (default) or "keep" (see docs/compile.md)."""
        return compiled.get()

    @compile_mode.setter
    def compile_mode(self, mode: str) -> None:
        # Like torch's backend flags (and ``pn.<dsl>.enabled``): bare assignment is refused after
        # ``torch.backends.disable_global_flags()``; the scoped form still works.
        from python_native.panel.controller import refuse_if_frozen

        refuse_if_frozen("pn.compile_mode", f"pn.compile_mode_set({mode!r})")
        compiled.set_mode(mode)

    @property
    def benchmark(self) -> bool | str:
        """Measure overrides against aten on first use, like ``torch.backends.cudnn.benchmark``: False
        (default), True (every size no table measured) or "unmeasured" (only where no table speaks);
        seeded by ``PYTHON_NATIVE_BENCHMARK`` (see docs/benchmarks.md)."""
        return calibration.benchmark()

    @benchmark.setter
    def benchmark(self, value: bool | str) -> None:
        from python_native.panel.controller import refuse_if_frozen

        refuse_if_frozen("pn.benchmark", f"pn.benchmark_set({value!r})")
        calibration.set_benchmark(value)

    def __reduce__(self) -> tuple:
        """``pn`` pickles by reference: unpickling imports it (one panel per process)."""
        return (importlib.import_module, ("python_native",))

    def __getattr__(self, name: str):
        # Dunders are looked up during imports (inspect, pickling): never resolve them as DSLs.
        if not (name.startswith("__") and name.endswith("__")):
            if dsl_registry.is_known(name):
                return controller(name)
        if name.startswith("__"):
            raise AttributeError(f"module 'python_native' has no attribute {name!r}")
        dsls = self.all_dsls
        close = difflib.get_close_matches(name, [*dsls, *PUBLIC_API], n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise AttributeError(f"module 'python_native' has no attribute {name!r}; {hint}(DSLs: {dsls})")

    def __dir__(self) -> list[str]:
        """The public API and the DSL controllers, with the module's own dunders; no imports or helpers."""
        names = {n for n in super().__dir__() if n.startswith("__") and n.endswith("__")} | set(PUBLIC_API)
        try:
            names |= set(self.all_dsls)
        except Exception:  # a broken third-party DSL must not break dir()
            pass
        return sorted(names)


def mount(module: types.ModuleType) -> None:
    """Make ``module`` (python_native itself) the object at ``torch.backends.python_native``."""
    global PUBLIC_API
    PUBLIC_API = COMPUTED + tuple(module.__all__)
    dsl_registry.reserve_names(frozenset(PUBLIC_API))
    module.__class__ = PythonNativeModule
    sys.modules["torch.backends.python_native"] = module
    backends = sys.modules.get("torch.backends")
    if backends is not None:
        backends.python_native = module
