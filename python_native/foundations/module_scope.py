"""Which ``nn.Module`` a routed call runs in: the qualified name a patched forward sets.

A patched model's forwards (``python_native.patching``) set the name of the module they run in
(``"model.layers.0.mlp"``) for the length of the call; the declared ops keep it for their backward;
``pn.trace()`` reads it into each event's ``module``. A context variable: each thread and task
sees its own, and setting it costs a few attribute reads, traced or not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_current: ContextVar[str | None] = ContextVar("python_native_module", default=None)

current = _current.get
set_current = _current.set
reset = _current.reset


@contextlib.contextmanager
def inside(name: str | None) -> Iterator[None]:
    """Calls inside the block run in module ``name`` (None: outside any patched module)."""
    token = _current.set(name)
    try:
        yield
    finally:
        _current.reset(token)
