"""Scopes and traces that an asynchronous exception cannot leave half open.

A ``KeyboardInterrupt`` (or any exception another thread raises into this one) is delivered where
the interpreter polls for it: when a Python function starts, after a call returns, on a backward
jump. The panel's scopes and traces follow one pattern against it:

- ``__enter__`` makes its state change (a switch hold, a trace opened) as its last step, inside a
  ``try`` whose handler undoes it: an interrupt anywhere in ``__enter__`` leaves nothing changed,
  and the ``with`` statement, which only calls ``__exit__`` once ``__enter__`` returned, owes nothing.
- ``__exit__`` undoes the state change as its first step, inside a ``try`` whose handler runs the
  undo once more: every undo is idempotent, so one cut short by an interrupt is finished.
- ``__exit__`` must not poll on entry: an interrupt delivered as it starts would escape before its
  first line, and the ``with`` statement never calls it again. ``unpolled_entry`` moves that poll
  to its first call (inside its ``try``). C-level context managers (locks, files) have no such
  entry; this gives the panel's the same guarantee, and Python's own ``with`` takes care of the rest.

One interrupt per enter or exit is handled wherever it lands; a second one that arrives while the
first is being handled can still cut the handling short, as in any Python code.
"""

from __future__ import annotations

import dis
import sys
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# CPython versions whose RESUME instruction polls at a function's start (oparg 0) and not after a
# ``yield from`` (oparg 2): there the poll of an entry can be moved by changing its oparg.
_RESUME = dis.opmap.get("RESUME")
KNOWN = sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] <= (3, 14)
_START, _UNPOLLED = 0, 2


def unpolled_entry(fn: F) -> F:
    """``fn`` (an ``__exit__``) no longer handles pending interrupts as it starts; they are handled
    at its first call instead. Returns ``fn``; unchanged where the interpreter is not one we know."""
    code = fn.__code__
    raw = bytearray(code.co_code)
    if not KNOWN or _RESUME is None:
        return fn
    for offset in range(0, min(len(raw), 16), 2):  # RESUME follows only the frame-setup instructions
        if raw[offset] == _RESUME:
            if raw[offset + 1] == _START:
                raw[offset + 1] = _UNPOLLED
                fn.__code__ = code.replace(co_code=bytes(raw))
            break
    return fn


def is_unpolled(fn: Callable[..., Any]) -> bool:
    """Whether ``unpolled_entry`` changed ``fn`` (for the tests)."""
    raw = fn.__code__.co_code
    return any(raw[i] == _RESUME and raw[i + 1] == _UNPOLLED for i in range(0, min(len(raw), 16), 2))


@unpolled_entry
def undo_last(owner: object, entries: list, undo: Callable[[Any], None]) -> None:
    """The body of a scope's ``__exit__``: ``undo`` the most recent of ``entries`` (idempotent, so
    it is run once more when an interrupt cut it short). Called first thing by an unpolled
    ``__exit__``, and itself unpolled on entry, so no interrupt lands before its ``try``."""
    try:
        entry = entries[-1]
    except IndexError:
        raise RuntimeError(f"{owner!r} was exited more times than it was entered") from None
    try:
        undo(entry)
    except BaseException:
        undo(entry)  # an interrupt cut it short: finish it
        raise
