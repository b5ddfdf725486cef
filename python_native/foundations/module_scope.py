"""Which ``nn.Module`` a routed call runs in: the qualified name a patched forward sets.

A patched model's forwards (``python_native.patching``) set the name of the module they run in
(``"model.layers.0.mlp"``) for the length of the call; the custom ops keep it for their backward;
``pn.trace()`` reads it into each event's ``module``. A thread-local attribute rather than a
context variable: Dynamo traces attribute writes on it (a compiled patched model keeps one graph)
where it cannot trace ``ContextVar.set``; setting it costs an attribute write, traced or not.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class _Scope(threading.local):
    def __init__(self) -> None:  # each thread's default, in the instance: Dynamo guards on it as on any attribute
        self.name: str | None = None


scope = _Scope()


def current() -> str | None:
    """The qualified name of the patched module the calling thread runs in, or None."""
    return scope.name


@contextlib.contextmanager
def inside(name: str | None) -> Iterator[None]:
    """Calls inside the block run in module ``name`` (None: outside any patched module)."""
    previous = scope.name
    scope.name = name
    try:
        yield
    finally:
        scope.name = previous
