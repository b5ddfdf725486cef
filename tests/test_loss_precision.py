"""A half-precision model's fused loss keeps fp32's precision.

``linear_cross_entropy.forward`` (the overload the causal-LM loss rule and the composite call,
and the one overrides take) returns its loss in fp32 for bf16 inputs, per token and reduced: the
Triton kernels and the chunked reference compute each token's loss in fp32, and nothing rounds it
to bf16 before the rule sums the tokens. So a patched bf16 model's loss is as close to the fp32
model's as transformers' own bf16 loss (which takes the cross-entropy of fp32 copies of the
logits), and so are its gradients (the loss's gradient reaches each token in fp32).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import python_native as pn
from python_native.core.registry import REGISTRY

OVERRIDES = ("serving", "off")


def _installed_at_cpu() -> bool:
    """Whether an override of the op sits at the CPU key (the Triton kernels under the interpreter;
    where they run on a GPU, none does)."""
    slot = REGISTRY.slots.get(("python_native", "linear_cross_entropy.forward", "CPU"))
    return slot is not None and bool(slot.overrides)


def _overrides(setting: str):
    """The op's override (the Triton kernels under the interpreter), or its chunked reference."""
    if setting == "off":
        return pn.operations_disabled("linear_cross_entropy")
    if not _installed_at_cpu():
        pytest.skip("no backend serves linear_cross_entropy at the CPU key here")
    return contextlib.nullcontext()


def _outcomes(trace) -> set[tuple[str, str]]:
    return {(e.op, e.outcome) for e in trace.events if e.op.startswith("linear_cross_entropy")}


def _expected_outcomes(setting: str) -> set[tuple[str, str]]:
    """What the trace holds of the call: the override served, or it fell back to the reference; with
    no override at the CPU key no router stands in front of the reference, and nothing is traced."""
    if setting == "serving":
        return {("linear_cross_entropy.forward", "override")}
    return {("linear_cross_entropy.forward", "fallback")} if _installed_at_cpu() else set()


@pytest.mark.parametrize("overrides", OVERRIDES)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_the_forward_loss_of_bf16_inputs_is_fp32_within_fp32_rounding(reduction, overrides):
    """Against the cross-entropy of fp32 copies of the same bf16 logits: equal within fp32 rounding,
    where a loss rounded to bf16 is off by up to 2**-9 of its size."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g).bfloat16()
    w = (torch.randn(128, 32, generator=g) / 4).bfloat16()
    b = torch.randn(128, generator=g).bfloat16()
    t = torch.randint(0, 128, (64,), generator=g)
    t[::7] = -100
    want = F.cross_entropy(F.linear(x, w, b).float(), t, reduction=reduction)
    with _overrides(overrides), pn.trace() as trace:
        loss, lse = torch.ops.python_native.linear_cross_entropy.forward(x, w, t, b, reduction)
    assert _outcomes(trace) == _expected_outcomes(overrides)
    assert loss.dtype == lse.dtype == torch.float32
    torch.testing.assert_close(loss, want, rtol=2e-6, atol=2e-6)
    # The composite returns the input's dtype, as F.cross_entropy does, rounded once from fp32.
    with _overrides(overrides):
        public = pn.linear_cross_entropy(x, w, t, b, reduction)
    assert public.dtype == torch.bfloat16 and torch.equal(public, loss.bfloat16())


def _step(m, batch) -> tuple[float, dict[str, torch.Tensor]]:
    from patch_testing import step

    loss, grads = step(m, batch)
    return loss.double().item(), {n: g.double() for n, g in grads.items()}


def _gradient_error(grads: dict[str, torch.Tensor], exact: dict[str, torch.Tensor]) -> float:
    """The worst parameter's relative error (in the 2-norm)."""
    return max(float((grads[n] - g).norm() / g.norm()) for n, g in exact.items())


@pytest.mark.parametrize("overrides", OVERRIDES)
@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma", "gpt2"])
def test_a_patched_bf16_loss_is_as_close_to_fp32_as_transformers_own(family, overrides):
    """The loss rule alone (the hidden states are then the model's own, bit for bit): the patched
    bf16 loss and gradients are at least as close to the fp32 model's as the unpatched bf16 model's,
    within fp32 rounding."""
    pytest.importorskip("transformers")
    from patch_testing import aten_overrides_off, inputs, model

    fp32, bf16 = model(family), model(family, dtype=torch.bfloat16)
    batch = inputs(fp32)
    with aten_overrides_off():
        exact, exact_grads = _step(fp32, batch)
        plain, plain_grads = _step(bf16, batch)
        with _overrides(overrides), pn.patched(bf16, ["causal_lm_loss"]) as report, pn.trace() as trace:
            patched, patched_grads = _step(bf16, batch)
    assert [e.rule for e in report.patched] == ["causal_lm_loss"]
    # Switched off, no override serves the op: the model's own loss ran (the patched forward says so).
    served = {("linear_cross_entropy.forward", "override"), ("linear_cross_entropy.backward", "override")}
    assert _outcomes(trace) == (served if overrides == "serving" else {("linear_cross_entropy.forward", "fallback")})
    plain_error, patched_error = abs(plain - exact), abs(patched - exact)
    assert patched_error <= plain_error + 1e-6 * abs(exact), (exact, plain, patched)
    assert _gradient_error(patched_grads, exact_grads) <= 1.001 * _gradient_error(plain_grads, exact_grads)
