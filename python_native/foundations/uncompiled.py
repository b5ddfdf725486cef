"""Keeping torch.compile's Dynamo out of the panel: scopes and traces are never part of a graph.

A scope or a trace changes which router the dispatcher runs, for the whole process, while it is
open: nothing a graph can hold. So, inside a function ``torch.compile`` runs:

- the panel's functions are ``opaque``: Dynamo never inlines them (a graph break, as at a
  ``torch.compiler.disable``d function) and never compiles their frames or the frames they call;
- a ``with`` block of a scope or a trace makes Dynamo run the function eagerly (it cannot
  resume inside the block of a context manager it does not know), and the block itself runs
  with Dynamo's frame callback off (``pause`` on enter, ``resume`` on exit): the routers, conds,
  impls and kernels it calls run as plain Python, as in eager code, never compiled by Dynamo.

Nothing is wrapped: the marks live on the code objects (Dynamo's per-code frame strategy) and
cost nothing per call; without Dynamo's C hooks (another torch) every helper does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

REASON = "python_native's scopes and traces switch routers for the whole process; they run outside compiled graphs"

try:
    from torch._C._dynamo import eval_frame as _eval_frame

    _set_eval_frame = _eval_frame.set_eval_frame
    _set_strategy = _eval_frame.set_code_exec_strategy
    _Action = _eval_frame._FrameAction
    _SKIP_ALL = _eval_frame._FrameExecStrategy(_Action.SKIP, _Action.SKIP)  # the frame and all it calls
    _SKIP_OWN = _eval_frame._FrameExecStrategy(_Action.SKIP, _Action.DEFAULT)  # the frame only
except (ImportError, AttributeError):  # pragma: no cover - a torch without Dynamo's C hooks
    _set_eval_frame = _set_strategy = None
    _SKIP_ALL = _SKIP_OWN = None


def _mark(fn: F, strategy: Any) -> F:
    code = getattr(fn, "__code__", None)
    if _set_strategy is not None and code is not None:
        _set_strategy(code, strategy)
    fn._torchdynamo_disable = True  # type: ignore[attr-defined]  # Dynamo's own mark: never inlined
    fn._torchdynamo_disable_msg = REASON  # type: ignore[attr-defined]
    return fn


def opaque(fn: F) -> F:
    """Dynamo never inlines ``fn``, nor compiles its frame or anything it calls; returns ``fn`` itself."""
    return _mark(fn, _SKIP_ALL)


def entering(fn: F) -> F:
    """Like ``opaque`` for functions that ``pause`` Dynamo (its frame only is skipped, so that the
    callback it switches off stays off after it returns: a strategy skipping its callees too would
    restore the callback on return)."""
    return _mark(fn, _SKIP_OWN)


@entering
def pause() -> tuple[int, Any] | None:
    """Switch Dynamo's frame callback off in this thread; the token to hand ``resume`` (None when it was off)."""
    if _set_eval_frame is None:
        return None
    prior = _set_eval_frame(None)
    return None if prior is None else (threading.get_ident(), prior)


@entering
def resume(token: tuple[int, Any] | None) -> None:
    """Put back the callback ``pause`` switched off, in the thread that paused it."""
    if token is not None and token[0] == threading.get_ident() and _set_eval_frame is not None:
        _set_eval_frame(token[1])
