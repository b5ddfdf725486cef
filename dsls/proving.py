"""What ``verify`` and ``bench`` need of an op, declared with it (``Op.verify``, ``Op.bench_rows``).

An op's checks and benchmark rows sit in its family's declaration, so a new op brings them along
and the tools iterate the declarations: ``python -m python_native verify`` drives each forward
through its ``Driver`` (the backward through the same calls), ``bench`` (and ``inspect``, which
plans bench's rows) measures each ``BenchRow``. Light: torch only, no DSL, nothing run at import.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

__all__ = ["BOTH", "FORWARD", "BenchRow", "Driver", "LlmCase", "Sample", "Tensors", "elementwise_bytes", "leaf", "rand",
           "x_input"]


@dataclass
class Sample:
    """One call: ``fn(*inputs)``; ``source`` names where it came from (a catalogue case or OpInfo).
    ``meta``: the call's keyword arguments where a check needs them (dropout's ``p``)."""

    source: str
    fn: Callable[..., torch.Tensor]
    inputs: Sequence[torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)


def rand(*shape: int, dtype: torch.dtype, device: str, scale: float = 1.0) -> torch.Tensor:
    """Normal values drawn in float32 (the same draws for every dtype), scaled, then cast."""
    return (torch.randn(*shape, dtype=torch.float32, device=device) * scale).to(dtype)


@dataclass(frozen=True)
class Driver:
    """How to reach an op from Python: its own cases and the OpInfo names whose samples hit it.

    ``cases(dtype, device)`` yields ``Sample``s of the public call; ``backward_ops`` are the ops
    its backward reaches (checked on the same samples). ``check``, for ops whose results are
    random, judges a sample's run with the overrides (``got``) and aten's (``ref``), each with
    ``out``, ``grads`` and ``grad_out``, by structure in place of values; it returns what is
    wrong (empty: nothing).
    """

    cases: Callable[[torch.dtype, str], Iterator[Sample]]
    opinfos: tuple[str, ...] = ()
    backward_ops: tuple[str, ...] = ()
    check: Callable[[Sample, Any, Any], list[str]] | None = None


Tensors = dict[str, Any]  # a row's inputs by name, with ``leaves`` (gradients reset) and ``dy`` (or None)

FORWARD = ("fwd",)
BOTH = ("fwd", "fwd+bwd")


class LlmCase(NamedTuple):
    """One row of a full run at a shape of LLM training or inference, in its own mode and dtype
    (measured where that dtype is among those asked for)."""

    mode: str
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16


@dataclass(frozen=True)
class BenchRow:
    """A benchmark row of an op: its shapes, inputs, call and the bytes it must move.

    ``inputs(shape, dtype, device, grad)`` makes the tensors by name, with ``leaves`` (the tensors
    whose gradients are reset between runs) and ``dy`` (the output's gradient, or None without
    ``grad``); ``call`` runs the op on them; ``formula`` is the plain-torch code the op replaces,
    which Inductor compiles for its column (None: no such column); ``bytes(shape, mode, itemsize)``
    is the least any kernel must move (``mode``: ``"fwd"`` or ``"fwd+bwd"``); ``flops(shape, mode)``,
    for a row bound by its matrix products, the FLOPs they do (a rate is taken from them), else None.

    ``quick`` and ``full`` shapes are measured in every dtype asked for and in each of ``modes``
    (``FORWARD`` for ops whose backward is aten's own formula, or that have none); ``llm`` adds
    rows of a full run, each with its own mode and dtype.
    """

    name: str
    quick: tuple[tuple[int, ...], ...]
    full: tuple[tuple[int, ...], ...]
    inputs: Callable[[tuple[int, ...], torch.dtype, str, bool], Tensors]
    call: Callable[[Tensors], Any]
    bytes: Callable[[tuple[int, ...], str, int], int]
    formula: Callable[[Tensors], Any] | None = None
    modes: tuple[str, ...] = BOTH
    llm: tuple[LlmCase, ...] = ()
    flops: Callable[[tuple[int, ...], str], int] | None = None


def leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """``t`` as a leaf of its own, asking for its gradient where ``grad``."""
    return t.detach().requires_grad_(grad)


def x_input(scale: float = 1.0) -> Callable[[tuple[int, ...], torch.dtype, str, bool], Tensors]:
    """``BenchRow.inputs`` of a one-tensor op: ``x`` of the row's shape (normal values times ``scale``),
    and a ``dy`` like it."""

    def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, grad: bool) -> Tensors:
        x = leaf(torch.randn(*shape, device=device, dtype=dtype) * scale, grad)
        dy = torch.randn(*shape, device=device, dtype=dtype) if grad else None
        return {"x": x, "leaves": [x] if grad else [], "dy": dy}

    return inputs


def elementwise_bytes(forward: int, backward: int) -> Callable[[tuple[int, ...], str, int], int]:
    """``BenchRow.bytes`` of an op that moves ``forward`` tensors of the row's shape (``backward``
    with its backward: ``"fwd+bwd"`` rows), each once."""

    def moved(shape: tuple[int, ...], mode: str, itemsize: int) -> int:
        return itemsize * math.prod(shape) * (backward if mode == "fwd+bwd" else forward)

    return moved
