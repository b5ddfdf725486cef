"""The order in which a slot's overrides are tried: priority, registration, then the user's function.

The user's function comes from ``pn.reorder_overrides(fn)`` or, loaded once, from the dotted
path in ``PYTHON_NATIVE_ORDER_FN``; it receives each slot's overrides in default order and must
return a permutation of them.
"""

from __future__ import annotations

import importlib
import warnings

from python_native import env
from python_native.core.handles import OrderFn, OverrideHandle


class Ordering:
    """The process's ordering rule; the registry asks it for every slot it (re)orders."""

    def __init__(self) -> None:
        self._fn: OrderFn | None = None
        self._loaded = False

    def ordered(self, op: str, key: str, overrides: list[OverrideHandle]) -> list[OverrideHandle]:
        """Priority first (higher runs first), then registration order, then the user's function."""
        ordered = sorted(overrides, key=lambda o: (-o.priority, o.uid))
        fn = self.function()
        if fn is None:
            return ordered
        result = list(fn(op, key, list(ordered)))
        if sorted(id(o) for o in result) != sorted(id(o) for o in ordered):
            raise ValueError(
                f"ordering function {fn!r} must return a permutation of the overrides it was given "
                f"for {op} @ {key}"
            )
        return result

    def function(self) -> OrderFn | None:
        """The user's ordering function, from the environment on first use.

        A path that cannot be imported must not cost any override its place: it is reported once
        (a UserWarning naming the variable and the import error) and the default order is used.
        """
        if not self._loaded:
            self._loaded = True
            setting = env.order_fn_setting()
            if setting is not None:
                variable, path = setting
                try:
                    self._fn = import_callable(path, variable)
                except ValueError as e:
                    warnings.warn(f"python_native: {e}; using the default order", UserWarning, stacklevel=3)
        return self._fn

    def swap(self, fn: OrderFn | None) -> tuple[OrderFn | None, bool]:
        """Use ``fn`` from now on; returns what ``restore`` needs to undo it."""
        if fn is not None and not callable(fn):
            raise TypeError(f"ordering function must be callable or None, got {type(fn).__name__}: {fn!r}")
        previous = (self._fn, self._loaded)
        self._fn, self._loaded = fn, True
        return previous

    def restore(self, previous: tuple[OrderFn | None, bool]) -> None:
        self._fn, self._loaded = previous


def import_callable(path: str, variable: str) -> OrderFn:
    module_name, _, attr = path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except Exception as e:  # whatever the user's module raises while importing
        raise ValueError(f"ordering function {path!r} (from {variable}) could not be imported: {e}") from e
    if not callable(fn):
        raise ValueError(f"ordering function {path!r} (from {variable}) is not callable: {fn!r}")
    return fn
