"""The custom op ``python_native::linear_cross_entropy`` itself: its chunked reference, errors, memory.

The Triton override has its own tests (``tests/triton/test_linear_cross_entropy.py``); here every
call runs the reference (the op's overrides switched off), which must equal aten's unfused
``F.cross_entropy(F.linear(...))`` and never hold all the logits at once.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import python_native as pn

# isort: split
from python_native.ops import cross_entropy_chunks
from python_native.tools.bench.memory import peak_bytes
from python_native_dsls.triton import device_type


def reference_only():
    """The op's overrides off (its reference runs), and the Triton DSL too (aten's unfused path)."""
    scope = contextlib.ExitStack()
    scope.enter_context(pn.operations_disabled("linear_cross_entropy"))
    scope.enter_context(pn.triton.disabled())
    return scope


@pytest.fixture(autouse=True)
def _reference_only(request):
    if "overrides_on" in request.fixturenames:
        yield
        return
    with reference_only():
        yield


def inputs(n=64, hidden=32, vocab=100, dtype=torch.float64, bias=True, device="cpu"):
    torch.manual_seed(0)
    x = torch.randn(n, hidden, dtype=dtype, device=device, requires_grad=True)
    w = (torch.randn(vocab, hidden, dtype=dtype, device=device) / hidden**0.5).requires_grad_(True)
    b = torch.randn(vocab, dtype=dtype, device=device, requires_grad=True) if bias else None
    t = torch.randint(0, vocab, (n,), device=device)
    t[::4] = -100
    return x, w, t, b


@pytest.mark.parametrize("budget", [64, 1 << 20], ids=["many chunks", "one chunk"])
@pytest.mark.parametrize("shape", [(64, 32, 100), (64, 16, 40)], ids=["N<V: vocabulary slices", "N>V: token chunks"])
@pytest.mark.parametrize(("reduction", "label_smoothing"), [("mean", 0.0), ("sum", 0.2), ("none", 0.1)])
def test_reference_equals_the_unfused_path_in_float64(monkeypatch, budget, shape, reduction, label_smoothing):
    monkeypatch.setattr(cross_entropy_chunks, "MIN_CHUNK_ELEMENTS", budget)
    x, w, t, b = inputs(*shape, device=device_type())  # where the (switched-off) Triton override sits
    options = {"reduction": reduction, "label_smoothing": label_smoothing}
    with pn.trace() as trace:
        got = pn.linear_cross_entropy(x, w, t, b, **options)
        grad = torch.randn_like(got)
        got_grads = torch.autograd.grad(got, (x, w, b), grad)
    assert {(e.op, e.outcome) for e in trace.events if e.op.startswith("linear_cross_entropy")} == {
        ("linear_cross_entropy.forward", "fallback"), ("linear_cross_entropy.backward", "fallback")}
    ref = F.cross_entropy(F.linear(x, w, b), t, **options)
    ref_grads = torch.autograd.grad(ref, (x, w, b), grad)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)


def test_gradients_only_where_asked():
    x, w, t, b = inputs()
    w.requires_grad_(False)
    loss = pn.linear_cross_entropy(x, w, t, b)
    gx, gb = torch.autograd.grad(loss, (x, b))
    rx, rb = torch.autograd.grad(F.cross_entropy(F.linear(x, w, b), t), (x, b))
    torch.testing.assert_close((gx, gb), (rx, rb))
    lse = torch.ops.python_native.linear_cross_entropy.forward(x, w, t, b)[1]
    grads = torch.ops.python_native.linear_cross_entropy.backward(
        torch.tensor(1.0, dtype=x.dtype), x, w, t, b, lse, "mean", -100, 0.0, [False, True, False])
    assert grads[0].numel() == 0 and grads[2].numel() == 0 and grads[1].shape == w.shape


def test_float32_reference_holds_a_chunk_of_logits_not_all_of_them(monkeypatch):
    """Peak memory of forward and backward (CPU allocator events), against aten's unfused path."""
    monkeypatch.setattr(cross_entropy_chunks, "MIN_CHUNK_ELEMENTS", 4096)
    x, w, t, _ = inputs(64, 16, 2000, torch.float32, bias=False)
    logits_bytes = 64 * 2000 * 4

    def fused():
        pn.linear_cross_entropy(x, w, t).backward()

    def unfused():
        F.cross_entropy(F.linear(x, w), t).backward()

    fused_peak, unfused_peak = peak_bytes(fused, "cpu"), peak_bytes(unfused, "cpu")
    assert unfused_peak >= 2 * logits_bytes, unfused_peak  # the logits and their log-softmax, at least
    # The weight gradient (a quarter of the logits here) plus one chunk and per-token statistics.
    assert fused_peak < logits_bytes // 2, (fused_peak, logits_bytes)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda x, w, t, b: pn.linear_cross_entropy(x, w, t, b, reduction="avg"), ValueError,
     r"reduction='avg'; allowed: \['mean', 'sum', 'none'\]"),
    (lambda x, w, t, b: pn.linear_cross_entropy(x, w, t, b, label_smoothing=1.5), ValueError,
     r"label_smoothing=1.5 must be within \[0.0, 1.0\]"),
    (lambda x, w, t, b: pn.linear_cross_entropy(x[None], w, t, b), ValueError, r"input must be 2-D .* got shape \(1, 64, 32\)"),
    (lambda x, w, t, b: pn.linear_cross_entropy(x, w[:, :8], t, b), ValueError, r"weight must be \(vocabulary > 0, hidden=32\)"),
    (lambda x, w, t, b: pn.linear_cross_entropy(x, w, t.float(), b), ValueError, r"target must be 1-D of 64 class indices"),
    (lambda x, w, t, b: pn.linear_cross_entropy(x, w, t, b[:5]), ValueError, r"bias must be 1-D of 100"),
    (lambda x, w, t, b: pn.linear_cross_entropy(x, w.double(), t, b), ValueError, r"weight is torch.float64 on cpu; input is torch.float32"),
    (lambda x, w, t, b: pn.linear_cross_entropy(x, w, torch.cat([t[:-1], t.new_tensor([100])]), b), IndexError,
     r"target 100 is out of bounds for 100 classes \(allowed: 0..99, or ignore_index=-100\)"),
])
@pytest.mark.parametrize("overrides_on", [False, True], ids=["reference", "overrides on"])
def test_bad_input_is_named(call, error, message, overrides_on):
    x, w, t, b = inputs(dtype=torch.float32)
    with contextlib.nullcontext() if overrides_on else reference_only():
        with pytest.raises(error, match=message):
            call(x, w, t, b)


def test_compiled_calls_check_shapes_when_traced():
    x, w, t, b = inputs()
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, t: pn.linear_cross_entropy(x, w, t), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"weight must be \(vocabulary > 0, hidden=32\)"):
        compiled(x, w[:, :8], t)
    torch._dynamo.reset()


def test_autocast_runs_the_gemms_in_its_dtype_like_f_linear():
    x, w, t, b = inputs(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = pn.linear_cross_entropy(x, w, t, b)
        ref = F.cross_entropy(F.linear(x, w, b), t)
    assert loss.dtype == ref.dtype == torch.float32  # autocast runs cross-entropy in fp32
    grads = torch.autograd.grad(loss, (x, w, b))
    ref_grads = torch.autograd.grad(ref, (x, w, b))
    torch.testing.assert_close(loss.float(), ref, rtol=2e-2, atol=2e-2)
    for g, r in zip(grads, ref_grads, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-3)
