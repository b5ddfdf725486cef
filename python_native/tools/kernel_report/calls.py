"""The aten calls a benchmark row makes, and the Triton overrides that can take them.

A row of ``python -m python_native bench`` (``bench.rows``: op, mode, shape, dtype) is run on
``meta`` tensors, its forward and (fwd+bwd rows) its backward, while a dispatch mode records every
aten call with its arguments: the shapes, strides and dtypes the overrides' conds will see, at
full size, in no time and no memory. A new op family is covered once its rows are in the benchmark.

Composites that pick the overridden op only on CUDA decompose on ``meta`` (``F.rms_norm`` calls
``_fused_rms_norm`` on CUDA and its pieces elsewhere); ``CUDA_CALLS`` states what a GPU run of
such a row calls instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from python_native.tools.bench import rows


@dataclass
class Call:
    """One aten call: the op's symbol as overrides name it, and its arguments as the schema has them
    (positional ones, keyword-only ones, every default filled in)."""

    op: str
    args: tuple
    kwargs: dict = field(default_factory=dict)


def _rms_norm_calls(inputs: rows.Inputs, backward: bool) -> list[Call]:
    """``F.rms_norm(x, (n,), w, 1e-6)`` on CUDA: the fused op, and its backward for both inputs."""
    x, w = inputs.x.detach(), inputs.w.detach()
    n = x.shape[-1]
    calls = [Call("_fused_rms_norm", (x, [n], w, 1e-6))]
    if backward:
        rstd = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
        calls.append(Call("_fused_rms_norm_backward", (inputs.dy, x, [n], rstd, w, [True, True])))
    return calls


# Bench ops whose torch call reaches the overridden op only on CUDA: what such a call makes there.
CUDA_CALLS: dict[str, Callable[[rows.Inputs, bool], list[Call]]] = {"rms_norm": _rms_norm_calls}


def _op_symbol(func: torch._ops.OpOverload) -> str:
    packet = func._schema.name.split("::", 1)[1]
    overload = func._overloadname
    return packet if overload == "default" else f"{packet}.{overload}"


def _normalized(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Call:
    """The call as a router passes it: positional parameters positionally, keyword-only ones by
    name, defaults filled in."""
    positional, keywords = [], {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            value = args[i]
        elif a.name in kwargs:
            value = kwargs[a.name]
        else:
            value = a.default_value
        if a.kwarg_only:
            keywords[a.name] = value
        else:
            positional.append(value)
    return Call(_op_symbol(func), tuple(positional), keywords)


class _Recorder(TorchDispatchMode):
    def __init__(self, wanted: set[str]) -> None:
        super().__init__()
        self.wanted = wanted
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _op_symbol(func) in self.wanted:
            self.calls.append(_normalized(func, args, kwargs))
        return func(*args, **kwargs)


def calls_of(case: rows.Case, wanted: set[str]) -> list[Call]:
    """The calls of ``case`` to ops in ``wanted``, in the order a run makes them, on meta tensors."""
    backward = case.mode == "fwd+bwd"
    inputs = rows.make_inputs(case, "meta")
    if case.op in CUDA_CALLS:
        return [c for c in CUDA_CALLS[case.op](inputs, backward) if c.op in wanted]
    with _Recorder(wanted) as recorder:
        y = rows.torch_function(case.op)(inputs)
        if backward:
            rows.backward(y, inputs.dy)
    return recorder.calls


def triton_overrides() -> dict[str, Any]:
    """Every override of every Triton op family, by op symbol: ``(family name, spec)`` for each op
    the families of ``python_native_dsls.triton.ops`` declare, installed at this key or not."""
    from python_native_dsls.triton import ops

    specs: dict[str, Any] = {}
    for family in sorted(ops.families(), key=lambda f: f.name):
        for spec in family.specs:
            specs.setdefault(spec.op, (family.name, spec))
    return specs


def materialize(value: Any) -> Any:
    """A CPU stand-in for a recorded argument: same sizes, strides and dtype, memory not touched
    (pages are mapped only where a kernel reads them); integer tensors are zeros, valid indices."""
    if isinstance(value, torch.Tensor):
        if value.dtype.is_floating_point or value.dtype.is_complex:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).zero_()
    if isinstance(value, (list, tuple)):
        return type(value)(materialize(v) for v in value)
    return value
