"""Shared pieces of the Triton library tests: skip rules, running a function with and without the
overrides, and reading the trace."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pytest
import torch

import python_native as pn  # first: importing dsls.triton before python_native skips its registration

# isort: split
import dsls.triton as backend

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


def leaf_copy(t: torch.Tensor) -> torch.Tensor:
    """A fresh leaf with ``t``'s values, sizes and strides (so strided test inputs stay strided)."""
    copy = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    return copy.copy_(t.detach()).requires_grad_(t.requires_grad)


def run(
    fn: Callable[..., torch.Tensor],
    inputs: Sequence[torch.Tensor],
    grad_out: torch.Tensor | None = None,
    scope: contextlib.AbstractContextManager | None = None,
) -> Run:
    """``fn(*inputs)`` and its backward against ``grad_out`` on fresh leaf copies, traced."""
    leaves = [leaf_copy(t) for t in inputs]
    with scope or contextlib.nullcontext(), pn.trace() as trace:
        out = fn(*leaves)
        if out.requires_grad:
            out.backward(torch.ones_like(out) if grad_out is None else grad_out)
    return Run(out.detach(), [t.grad for t in leaves], list(trace.events))


# torch.testing.assert_close defaults: (rtol, atol).
TOLERANCES = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


@pytest.fixture(autouse=True)
def seeded() -> None:
    """Every test draws the same inputs whatever runs before it (import it into a test module)."""
    torch.manual_seed(0)


def assert_matches(got: torch.Tensor, ref: torch.Tensor, truth: torch.Tensor, what: str, grad: bool = False) -> None:
    """``got`` is within the dtype's default tolerance of aten's ``ref``, or no further from the
    float64 ``truth`` than ``ref`` is (plus that tolerance).

    The second clause admits results more accurate than aten's: its CPU kernels accumulate some
    half-precision reductions (layer norm's weight gradient, for one) in half precision. For
    half-precision gradients the absolute tolerance also scales with the largest gradient: they
    are sums of many rounded terms whose cancellation leaves small elements with errors of the
    terms' size, not of their own.
    """
    assert got.shape == ref.shape and got.dtype == ref.dtype, f"{what}: {got.shape}/{got.dtype} vs {ref.shape}/{ref.dtype}"
    rtol, atol = TOLERANCES[got.dtype]
    g, r, t = got.double(), ref.double(), truth.double()
    if grad and got.dtype != torch.float32 and t.numel():
        atol += rtol * t.abs().max().item()
    close = (g - r).abs() <= atol + rtol * r.abs()
    no_worse = (g - t).abs() <= (r - t).abs() + atol + rtol * t.abs()
    ok = close | no_worse | (g == r) | (g.isnan() & r.isnan())
    if not bool(ok.all()):
        i = int((~ok).flatten().nonzero()[0])
        raise AssertionError(
            f"{what}: {int((~ok).sum())}/{ok.numel()} elements off; first at flat index {i}: "
            f"got {g.flatten()[i].item()}, aten {r.flatten()[i].item()}, float64 {t.flatten()[i].item()}"
        )


def compare(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], ops: Iterable[str]) -> Run:
    """Run ``fn`` forward and backward with the overrides, with the Triton DSL disabled, and in
    float64; values and gradients must agree (see ``assert_matches``), and each of ``ops`` must
    have been served by a Triton override."""
    probe = fn(*[t.detach() for t in inputs])
    grad_out = torch.randn_like(probe, dtype=torch.float32).to(probe.dtype)  # in the output's layout
    got = run(fn, inputs, grad_out)
    ref = run(fn, inputs, grad_out, scope=pn.triton.disabled())
    wide = [leaf_copy(t.detach().double()).requires_grad_(t.requires_grad) for t in inputs]
    truth = run(fn, wide, grad_out.double(), scope=pn.triton.disabled())
    assert not ref.triton_events() and not truth.triton_events()
    for op in ops:
        assert got.overridden(op), f"{op}: {got.outcomes(op) or 'never dispatched'}"
    assert_matches(got.out, ref.out, truth.out, "output")
    for i, (g, r, t) in enumerate(zip(got.grads, ref.grads, truth.grads, strict=True)):
        assert (g is None) == (r is None), f"gradient {i}: {g} vs {r}"
        if r is not None:
            assert_matches(g, r, t, f"gradient of input {i}", grad=True)
    return got
