"""Hand a cond's layout analysis to the impl it selects, so that the impl does not redo it.

A cond that accepts its inputs ``stash``es the plan it worked out (row views, strides); the impl
``take``s it back. The slot is per thread and holds one plan: the router calls the impl right after
its cond on the same thread. A plan is only handed over for the very same tensor objects with the
same sizes and strides and the same extra arguments, so an impl called any other way (directly,
after a cond whose impl never ran) finds no match and recomputes. Plans hold metadata only,
which keeps them valid under FakeTensor and meta tensors.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

_slot = threading.local()


def _layouts(tensors: tuple[torch.Tensor, ...]) -> tuple:
    return tuple((t.size(), t.stride()) for t in tensors)


def stash(tag: str, tensors: tuple[torch.Tensor, ...], extra: Any, plan: Any) -> None:
    """Leave ``plan`` for the impl of ``tag`` called next on ``tensors`` with ``extra``."""
    _slot.entry = (tag, tensors, _layouts(tensors), extra, plan)


def take(tag: str, tensors: tuple[torch.Tensor, ...], extra: Any) -> Any:
    """The plan stashed for exactly these arguments (emptying the slot), or None."""
    entry = getattr(_slot, "entry", None)
    if entry is None:
        return None
    _slot.entry = None
    s_tag, s_tensors, s_layouts, s_extra, plan = entry
    if s_tag != tag or len(s_tensors) != len(tensors) or any(a is not b for a, b in zip(s_tensors, tensors, strict=True)):
        return None
    if s_extra != extra or s_layouts != _layouts(tensors):
        return None
    return plan
