"""Problems with the pieces python-native reads from outside, found where each piece is read.

Environment variables, the dump folder, the kernel cache folder, a user's ordering function and a
DSL's runtime are outside our control. A bad one must cost only what depends on it: its reader
falls back (the default value, the default order, no dump, no cache, aten's kernels), reports the
problem here and carries on. Each problem is warned about once (a ``UserWarning`` naming the piece,
what is wrong and the fix) and stays listed in ``pn.status()`` and the status report until the
piece is fine again.
"""

from __future__ import annotations

import os
import threading
import warnings

_problems: dict[str, dict[str, str]] = {}  # source -> {"source", "problem", "fix"}
_lock = threading.Lock()


def report(source: str, problem: str, fix: str, *, stacklevel: int = 2, located: bool = True) -> None:
    """Record that ``source`` (a variable's name, a DSL, a folder) has ``problem``; warn the first
    time this problem is reported for it. ``fix`` says what the user can do (and what is used meanwhile).
    ``located=False``: the warning names no line of code (the fix is in the environment), so it is one line."""
    entry = {"source": source, "problem": problem, "fix": fix}
    with _lock:
        new = _problems.get(source) != entry
        _problems[source] = entry
    if not new:
        return
    message = f"python_native: {source}: {problem}; {fix}"
    if located:
        warnings.warn(message, UserWarning, stacklevel=stacklevel + 1)
    else:
        warnings.warn_explicit(message, UserWarning, "<environment>", 0, module="python_native")


def resolve(source: str) -> None:
    """``source`` is fine again (the variable was corrected, the folder became writable)."""
    if source in _problems:
        with _lock:
            _problems.pop(source, None)


def problem_of(source: str) -> str | None:
    entry = _problems.get(source)
    return None if entry is None else entry["problem"]


def current() -> list[dict[str, str]]:
    """Every open problem, in the order first reported: ``{"source", "problem", "fix"}`` each."""
    with _lock:
        return [dict(entry) for entry in _problems.values()]


def _renew_lock_in_child() -> None:
    """A forked child must not inherit the lock another thread held at the fork."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock_in_child)
