"""Shared pieces of the Triton library tests: skip rules, running a function with and without the
overrides, and reading the trace."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pytest
import torch

import dsls.triton as backend
import python_native as pn

requires_triton = pytest.mark.skipif(
    not backend.runtime_available(), reason=f"triton backend unavailable: {backend.unavailable_reason()}"
)

DEVICE = backend.device_type()
KEY = backend.dispatch_key()
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Run:
    """Outputs and input gradients of one forward+backward, with the trace events it produced."""

    out: torch.Tensor
    grads: list[torch.Tensor | None]
    events: list

    def outcomes(self, op: str) -> set[tuple[str | None, str]]:
        """``(dsl, outcome)`` pairs recorded for ``op``."""
        return {(e.dsl, e.outcome) for e in self.events if e.op == op}

    def overridden(self, op: str) -> bool:
        return ("triton", "override") in self.outcomes(op)

    def fell_back(self, op: str) -> bool:
        return (None, "fallback") in self.outcomes(op) and not self.overridden(op)

    def triton_events(self) -> list:
        return [e for e in self.events if e.dsl == "triton"]


def make(*shape: int, dtype: torch.dtype = torch.float32, requires_grad: bool = True, scale: float = 1.0) -> torch.Tensor:
    t = torch.randn(*shape, dtype=torch.float32, device=DEVICE) * scale
    return t.to(dtype).requires_grad_(requires_grad)


def run(
    fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    grad_out: torch.Tensor | None = None,
    scope: contextlib.AbstractContextManager | None = None,
) -> Run:
    """``fn(*inputs)`` and its backward against ``grad_out`` on fresh leaf copies, traced."""
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    with scope or contextlib.nullcontext(), pn.trace() as trace:
        out = fn(*leaves)
        if out.requires_grad:
            out.backward(torch.ones_like(out) if grad_out is None else grad_out)
    return Run(out.detach(), [t.grad for t in leaves], list(trace.events))


def compare(
    fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    ops: Iterable[str],
    **tolerances: float,
) -> Run:
    """Run ``fn`` with the overrides and with the Triton DSL disabled; values and gradients must
    agree, and each of ``ops`` must have been served by a Triton override."""
    probe = fn(*[t.detach() for t in inputs])
    grad_out = torch.randn(probe.shape, device=probe.device).to(probe.dtype)
    got = run(fn, inputs, grad_out)
    ref = run(fn, inputs, grad_out, scope=pn.triton.disabled())
    assert not ref.triton_events()
    for op in ops:
        assert got.overridden(op), f"{op}: {got.outcomes(op) or 'never dispatched'}"
    torch.testing.assert_close(got.out, ref.out, **tolerances)
    for g, r in zip(got.grads, ref.grads, strict=True):
        if r is None:
            assert g is None
        else:
            torch.testing.assert_close(g, r, **tolerances)
    return got
