"""torch's own functions as op names: ``operations_disabled(torch.softmax)``, ``F.layer_norm``, ``torch.Tensor.mean``.

A PyTorch function names the op of the same name: ``torch.softmax`` and
``torch.nn.functional.softmax`` name ``softmax`` (which covers ``_softmax`` and its backward, see
``public_names``), ``torch.mean`` names ``mean`` (every overload). ``torch.ops`` overloads and
packets name their aten op directly (``controller`` handles those). A function that is not
torch's, or whose name no op has, is refused with the reason and what is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

ACCEPTED = (
    "op names are str ('softmax', 'aten::_softmax', 'add.Tensor'), torch.ops OpOverloads and "
    "OpOverloadPackets (torch.ops.aten._softmax.default), or torch's functions named like the op "
    "(torch.softmax, torch.nn.functional.softmax, torch.Tensor.softmax)"
)
_TENSOR_TYPES = (torch.Tensor, torch._C.TensorBase)


def label(fn: Any) -> str:
    """How a user would spell ``fn``: ``torch.nn.functional.softmax``, ``torch.Tensor.mean``."""
    objclass = getattr(fn, "__objclass__", None)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    if objclass in _TENSOR_TYPES:
        return f"torch.Tensor.{name}"
    module = getattr(fn, "__module__", None)
    if module in ("torch._C._nn", "torch._C._VariableFunctions"):
        module = "torch.nn.functional" if module == "torch._C._nn" else "torch"
    return f"{module}.{name}" if module else repr(fn)


def is_torch_function(fn: Any) -> bool:
    """Whether ``fn`` is one of torch's functions or Tensor methods (not a user's callable)."""
    if getattr(fn, "__objclass__", None) in _TENSOR_TYPES:
        return True
    module = getattr(fn, "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


def op_name_of(fn: Callable[..., Any], known: Callable[[str], bool]) -> str:
    """The op name ``fn`` stands for; ``TypeError`` for a callable that is not torch's, ``ValueError``
    for one of torch's whose name ``known`` rejects (no op, public or aten, has it)."""
    if not is_torch_function(fn):
        raise TypeError(f"cannot name an op by {label(fn)} ({type(fn).__name__}): it is not one of torch's "
                        f"functions; {ACCEPTED}")
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not known(name):
        raise ValueError(f"cannot name an op by {label(fn)}: no op is named {name!r}; {ACCEPTED} "
                         "(pn.operation_names() lists the overridden ops)")
    return name
