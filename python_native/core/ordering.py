"""The order in which a slot's overrides are tried: priority, registration, then the user's function.

The user's function comes from ``pn.reorder_overrides(fn)`` or, loaded once, from the dotted
path in ``PYTHON_NATIVE_ORDER_FN``; it receives each slot's overrides in default order and must
return a permutation of them.
"""

from __future__ import annotations

import importlib
import reprlib

from python_native.core.handles import OrderFn, OverrideHandle
from python_native.foundations import env, faults

REORDER_SOURCE = "pn.reorder_overrides"


class Ordering:
    """The process's ordering rule; the registry asks it for every slot it (re)orders."""

    def __init__(self) -> None:
        self._fn: OrderFn | None = None
        self._loaded = False
        self._source = REORDER_SOURCE  # where the function came from, as the status report names it
        self._failed: OrderFn | None = None  # the function whose failure was reported last

    def ordered(
        self, op: str, key: str, overrides: list[OverrideHandle], *, strict: bool = False
    ) -> list[OverrideHandle]:
        """Priority first (higher runs first), then registration order, then the user's function.

        A function that raises or returns anything but a permutation of what it was given must not
        cost any override its place: the slot keeps the default order and the failure is reported
        (once, and in the status report). ``strict`` raises instead (``pn.reorder_overrides``
        validates the function it is handed on every slot there is).
        """
        ordered = sorted(overrides, key=lambda o: (-o.priority, o.uid))
        fn = self.function()
        if fn is None:
            return ordered
        try:
            return _checked_order(fn, op, key, ordered)
        except Exception as e:
            if strict:
                raise
            if self._failed is not fn:
                self._failed = fn
                faults.report(
                    self._source, f"ordering function {fn!r} failed for {op} @ {key}: {e}",
                    "fix it (or reorder with None); slots it fails for keep the default order", stacklevel=4,
                )
            return ordered

    def function(self) -> OrderFn | None:
        """The user's ordering function, from the environment on first use.

        A path that cannot be imported must not cost any override its place: it is reported once
        (a UserWarning naming the variable and the import error, kept in the status report) and
        the default order is used.
        """
        if not self._loaded:
            self._loaded = True
            setting = env.order_fn_setting()
            if setting is not None:
                variable, path = setting
                self._source = variable
                try:
                    self._fn = import_callable(path, variable)
                except ValueError as e:
                    faults.report(variable, str(e), "the default order is used", stacklevel=4)
        return self._fn

    def swap(self, fn: OrderFn | None) -> tuple:
        """Use ``fn`` from now on; returns what ``restore`` needs to undo it."""
        if fn is not None and not callable(fn):
            raise TypeError(f"ordering function must be callable or None, got {type(fn).__name__}: {fn!r}")
        previous = (self._fn, self._loaded, self._source, self._failed)
        self._fn, self._loaded, self._source, self._failed = fn, True, REORDER_SOURCE, None
        return previous

    def restore(self, previous: tuple) -> None:
        self._fn, self._loaded, self._source, self._failed = previous

    def forget_failures(self) -> None:
        """The function in force now replaced any earlier one: their problems are gone."""
        for source in (REORDER_SOURCE, *env.ORDER_FN):
            faults.resolve(source)


def _checked_order(fn: OrderFn, op: str, key: str, ordered: list[OverrideHandle]) -> list[OverrideHandle]:
    raw = fn(op, key, list(ordered))
    try:
        result = list(raw)
    except TypeError:
        result = None
    if result is None or sorted(id(o) for o in result) != sorted(id(o) for o in ordered):
        raise ValueError(
            f"ordering function {fn!r} must return a permutation of the overrides it was given "
            f"for {op} @ {key}, got {reprlib.repr(raw)}"
        )
    return result


def import_callable(path: str, variable: str) -> OrderFn:
    module_name, _, attr = path.rpartition(".")
    if not module_name or not all(part.isidentifier() for part in path.split(".")):
        raise ValueError(f"ordering function {path!r} (from {variable}) is not a dotted path such as pkg.module.function")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except Exception as e:  # whatever the user's module raises while importing
        raise ValueError(f"ordering function {path!r} (from {variable}) could not be imported: {e}") from e
    if not callable(fn):
        raise ValueError(f"ordering function {path!r} (from {variable}) is not callable: {fn!r}")
    return fn
