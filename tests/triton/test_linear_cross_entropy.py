"""``torch.ops.python_native.linear_cross_entropy``: the Triton override against the unfused aten path.

Every case runs three ways: the fused op with the overrides (the Triton kernels must fire, forward
and backward), ``F.cross_entropy(F.linear(...))`` with the Triton DSL disabled (aten), and the
same in float64 (the truth). Small chunk budgets make every call span several chunks.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from triton_testing import DEVICE, assert_matches, assert_routed, requires_triton, seeded  # noqa: F401

import python_native as pn
from python_native.ops import cross_entropy_chunks
from python_native_dsls.triton.kernels import tuning

pytestmark = requires_triton

OPS = ("linear_cross_entropy.forward", "linear_cross_entropy.backward")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of a few hundred logits, so that 64 tokens take several chunks and slices."""
    monkeypatch.setattr(cross_entropy_chunks, "MIN_CHUNK_ELEMENTS", 256)


def make_inputs(n: int, hidden: int, vocab: int, dtype: torch.dtype, bias: bool = True, ignore_every: int = 5):
    x = torch.randn(n, hidden, device=DEVICE).to(dtype)
    w = (torch.randn(vocab, hidden, device=DEVICE) / hidden**0.5).to(dtype)
    b = torch.randn(vocab, device=DEVICE).to(dtype) if bias else None
    t = torch.randint(0, vocab, (n,), device=DEVICE)
    if ignore_every:
        t[::ignore_every] = -100
    return x, w, t, b


def fused(x, w, t, b, **options):
    return torch.ops.python_native.linear_cross_entropy(x, w, t, b, options.get("reduction", "mean"),
                                                        options.get("ignore_index", -100),
                                                        options.get("label_smoothing", 0.0))


def unfused(x, w, t, b, **options):
    return F.cross_entropy(F.linear(x, w, b), t, **options)


def run(fn, x, w, t, b, grad_seed: int, dtype=None, scope=None, **options):
    """``fn`` forward and backward on fresh leaves: ``(loss, grads, trace events)``."""
    leaves = [v.detach().to(dtype or v.dtype).requires_grad_(True) if v is not None else None for v in (x, w, b)]
    with scope or contextlib.nullcontext(), pn.trace() as trace:
        out = fn(leaves[0], leaves[1], t, leaves[2], **options)
        gen = torch.Generator().manual_seed(grad_seed)
        grad = torch.randn(out.shape, generator=gen).to(out.device, out.dtype)
        out.backward(grad)
    grads = [v.grad if v is not None else None for v in leaves]
    return out.detach(), grads, trace.events


def check(x, w, t, b, **options):
    """The fused op with its Triton overrides matches aten's unfused path; returns the fused run's events."""
    got, got_grads, events = run(fused, x, w, t, b, 1, **options)
    ref, ref_grads, ref_events = run(unfused, x, w, t, b, 1, scope=pn.triton.disabled(), **options)
    truth, truth_grads, _ = run(unfused, x, w, t, b, 1, dtype=torch.float64, scope=pn.triton.disabled(), **options)
    fired = {e.op for e in events if e.dsl == "triton" and e.outcome == "override"}
    assert set(OPS) <= fired, events
    assert not [e for e in ref_events if e.dsl == "triton"]
    assert_matches(got, ref, truth, "loss")
    for name, g, r, tr in zip(("input", "weight", "bias"), got_grads, ref_grads, truth_grads, strict=True):
        assert (g is None) == (r is None), name
        if r is not None:
            assert_matches(g, r, tr, f"gradient of {name}", grad=True)
    return events


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("reduction", "label_smoothing"), [("mean", 0.0), ("mean", 0.1), ("sum", 0.0), ("none", 0.1)])
@pytest.mark.override
def test_matches_the_unfused_path(dtype, reduction, label_smoothing):
    """64 tokens × 32 hidden × 100 classes, a fifth of the targets ignored, with a bias."""
    check(*make_inputs(64, 32, 100, dtype), reduction=reduction, label_smoothing=label_smoothing)


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.override
def test_more_tokens_than_classes_takes_token_chunks_in_backward(reduction):
    """N > V: the backward slices tokens and accumulates the weight gradient in fp32."""
    check(*make_inputs(64, 16, 40, torch.bfloat16), reduction=reduction, label_smoothing=0.05)


@pytest.mark.parametrize("vocab", [100, 37])
@pytest.mark.override
def test_rows_wider_than_a_block_stream_in_steps(monkeypatch, vocab):
    """A vocabulary that is no multiple of the kernel's column block: several steps, a partial last one."""
    monkeypatch.setattr(tuning, "CROSS_ENTROPY_BLOCK", 32)
    check(*make_inputs(48, 32, vocab, torch.float32, bias=False), reduction="sum", label_smoothing=0.2)
    check(*make_inputs(48, 8, vocab, torch.float16, bias=False, ignore_every=3), reduction="mean")


@pytest.mark.override
def test_ignore_index_that_is_a_class_and_no_bias():
    x, w, t, _ = make_inputs(32, 16, 50, torch.float32, ignore_every=0)
    t[::4] = 7  # class 7 is ignored: its tokens count for nothing
    check(x, w, t, None, ignore_index=7, label_smoothing=0.1)


@pytest.mark.override
def test_every_target_ignored_gives_nan_mean_and_zero_gradients():
    x, w, t, b = make_inputs(16, 8, 20, torch.float32, ignore_every=1)
    loss, grads, events = run(fused, x, w, t, b, 0)
    assert_routed(events, dict.fromkeys(OPS), "every target ignored")
    ref, _, _ = run(unfused, x, w, t, b, 0, scope=pn.triton.disabled())
    assert loss.isnan() and ref.isnan()
    assert all(bool((g == 0).all()) for g in grads)


@pytest.mark.override
def test_falls_back_to_the_chunked_reference_when_disabled():
    x, w, t, b = make_inputs(64, 32, 100, torch.float32)
    with pn.operations_disabled("linear_cross_entropy"):
        events = check_reference(x, w, t, b, label_smoothing=0.1)
    assert {(e.op, e.dsl, e.outcome) for e in events if e.op in OPS} == {(op, None, "fallback") for op in OPS}
    assert pn.is_operation_disabled("linear_cross_entropy.backward") is False  # the scope has closed


def check_reference(x, w, t, b, **options):
    got, got_grads, events = run(fused, x, w, t, b, 2, **options)
    ref, ref_grads, _ = run(unfused, x, w, t, b, 2, scope=pn.triton.disabled(), **options)
    truth, truth_grads, _ = run(unfused, x, w, t, b, 2, dtype=torch.float64, scope=pn.triton.disabled(), **options)
    assert_matches(got, ref, truth, "loss")
    for g, r, tr in zip(got_grads, ref_grads, truth_grads, strict=True):
        assert_matches(g, r, tr, "gradient", grad=True)
    return events


@pytest.mark.override
def test_the_python_function_calls_the_op():
    x, w, t, b = make_inputs(8, 8, 12, torch.float32)
    with pn.trace() as trace:
        loss = pn.linear_cross_entropy(x, w, t, b, label_smoothing=0.1)
    assert [e.op for e in trace.events if e.outcome == "override"] == ["linear_cross_entropy.forward"]
    torch.testing.assert_close(loss, unfused(x, w, t, b, label_smoothing=0.1))


@pytest.mark.parametrize("mode", ["bypass", "keep"])
@pytest.mark.override
def test_torch_compile_runs_the_override_in_both_modes(mode):
    """The custom op is opaque in compiled graphs in either mode; at run time the router decides."""
    x, w, t, b = make_inputs(32, 16, 50, torch.float32)
    torch._dynamo.reset()
    with pn.compile_mode_set(mode), torch._inductor.config.patch(force_disable_caches=True):
        compiled = torch.compile(lambda *a: pn.linear_cross_entropy(*a, label_smoothing=0.1), fullgraph=True)
        got, got_grads, events = run(lambda *a, **k: compiled(*a), x, w, t, b, 3)
        with pn.operations_disabled("linear_cross_entropy"):  # honoured without recompiling
            off, _, off_events = run(lambda *a, **k: compiled(*a), x, w, t, b, 3)
    torch._dynamo.reset()
    assert {e.op for e in events if e.dsl == "triton" and e.outcome == "override" and e.op in OPS} == set(OPS)
    assert {e.outcome for e in off_events if e.op in OPS} == {"fallback"}
    ref, ref_grads, _ = run(fused, x, w, t, b, 3, label_smoothing=0.1)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(off, ref)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
