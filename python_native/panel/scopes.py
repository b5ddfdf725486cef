"""Scopes over the switches: names held off (or on) from enter to exit, safe against interrupts.

``operations_disabled``, ``operations_enabled``, ``pn.<dsl>.disabled()``, ``dispatch_keys_disabled``
and ``pn.flags`` return a ``Scope``: one or more parts ``(kind, names, off)`` held with one token.
The state change is the last step of enter and the first of exit, each undo is idempotent, and
``__exit__`` does not poll for interrupts as it starts (see ``foundations.interrupts``): a
``KeyboardInterrupt`` anywhere in enter or exit leaves no switch changed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from python_native.core.registry import REGISTRY
from python_native.foundations import interrupts, uncompiled

F = TypeVar("F", bound=Callable[..., Any])
Part = tuple[str, tuple[str, ...], bool]  # (kind, names, off): "op", ("bmm",), True


def _hold(parts: tuple[Part, ...], token: int) -> None:
    for kind, names, off in parts:
        REGISTRY.hold(kind, names, token, off)


def _undo(parts: tuple[Part, ...], entry: list, entries: list | None) -> None:
    """Release ``entry``'s token from every part, forget the entry, resume Dynamo: idempotent."""
    token, paused = entry
    for kind, names, _ in parts:
        REGISTRY.release(kind, names, token)
    if entries:
        if entries[-1] is entry:
            entries.pop()
        else:  # another thread entered the same scope since: remove this entry where it is
            for i in range(len(entries) - 1, -1, -1):
                if entries[i] is entry:
                    del entries[i]
                    break
    if paused is not None:
        uncompiled.resume(paused)


class Scope:
    """A reference-counted switch: holds ``names`` of ``kind`` off (``off=True``) or on from enter to exit.

    The same object may be entered again (even from another thread); each entry takes its own
    hold, and each exit releases the most recent hold it took, whether the body raised or not.
    Inside a function ``torch.compile`` runs, the block runs eagerly, outside any graph (see
    ``uncompiled``).
    """

    __slots__ = ("_parts", "_entries")

    def __init__(self, kind: str = "op", names: tuple[str, ...] = (), off: bool = True, *,
                 parts: tuple[Part, ...] = ()):
        self._parts: tuple[Part, ...] = parts or ((kind, names, off),)
        self._entries: list[list] = []  # per entry: [token, Dynamo pause]

    @uncompiled.entering
    def __enter__(self) -> None:
        entry = None
        try:
            entry = [REGISTRY.switches.new_token(), None]
            self._entries.append(entry)
            entry[1] = uncompiled.pause()
            for kind, names, off in self._parts:  # the state change: the last step
                REGISTRY.hold(kind, names, entry[0], off)
        except BaseException:
            if entry is not None:
                _undo(self._parts, entry, self._entries)
            raise

    @uncompiled.entering
    @interrupts.unpolled_entry
    def __exit__(self, *exc_info: object) -> None:
        interrupts.undo_last(self, self._entries, self._undo)  # the state change: the first step

    def _undo(self, entry: list) -> None:
        _undo(self._parts, entry, self._entries)

    def __reduce__(self) -> tuple:
        """A scope pickles as what it switches; the holds it has open stay with this process."""
        return (_rebuild, (self._parts,))

    @uncompiled.opaque
    def __call__(self, fn: F) -> F:
        """Decorator use, like torch's flag scopes: ``fn`` runs with the names held.

        Each call takes its own hold with a local token, so concurrent calls from several
        threads never release one another's holds. Called from compiled code, ``fn`` runs eagerly.
        """
        if not callable(fn):
            raise TypeError(f"a python_native scope decorates a callable, got {type(fn).__name__}: {fn!r}")
        parts = self._parts

        @functools.wraps(fn)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            entry = None
            try:
                entry = [REGISTRY.switches.new_token(), None]
                entry[1] = uncompiled.pause()
                _hold(parts, entry[0])
                return fn(*args, **kwargs)
            finally:
                if entry is not None:
                    try:
                        _undo(parts, entry, None)
                    except BaseException:
                        _undo(parts, entry, None)
                        raise

        return uncompiled.entering(scoped)  # type: ignore[return-value]

    def __repr__(self) -> str:
        described = "; ".join(f"{'disabling' if off else 'enabling'} {kind} {list(names)}" for kind, names, off in
                              self._parts)
        return f"<python_native scope {described}>"


def _rebuild(parts: tuple[Part, ...]) -> Scope:
    return Scope(parts=parts)
