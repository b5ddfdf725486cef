"""The ops model patching routes to (``python_native.ops``): references equal to what the modules
compute, bit for bit; backwards right (gradcheck in float64); schema, fake kernel and autograd
registrations sound (``torch.library.opcheck``); an override attaches to each and the public name
switches it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import python_native as pn
from conftest import TEST_DSL
from python_native import ops
from python_native.foundations import tolerances

OPS = torch.ops.python_native


def _llama_norm(x, w, eps):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _gemma_norm(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + w.float())).type_as(x)


def _olmo2_norm(x, w, eps):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (w * h).to(x.dtype)


def _rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def _apply_rotary(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _new_gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


@pytest.fixture
def references():
    """The references alone: an installed override (the Triton kernels) must not serve these checks."""
    with pn.operations_disabled("rms_norm", "swiglu", "geglu", "rotary", "gelu_tanh", "quick_gelu"):
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_references_are_the_hand_written_modules_bit_for_bit(dtype, references):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 16, generator=g).to(dtype)  # a q/k norm's 4-D input
    w = torch.randn(16, generator=g).to(dtype)
    assert torch.equal(ops.rms_norm(x, w, 1e-6), _llama_norm(x, w, 1e-6))
    assert torch.equal(ops.rms_norm(x, w, 1e-6, 1.0, True), _gemma_norm(x, w, 1e-6))
    assert torch.equal(ops.rms_norm(x, w, 1e-6, 0.0, True), _olmo2_norm(x, w, 1e-6))
    assert torch.equal(ops.rms_norm(x, w.float(), 1e-6), _llama_norm(x, w.float(), 1e-6))  # promotes, as the module
    gate_up = torch.randn(5, 32, generator=g).to(dtype)
    gate, up = gate_up.chunk(2, -1)  # row-strided halves
    assert torch.equal(ops.swiglu(gate, up), F.silu(gate) * up)
    for approximate in ("none", "tanh"):
        assert torch.equal(ops.geglu(gate, up, approximate), F.gelu(gate, approximate=approximate) * up)
    assert torch.equal(ops.gelu_tanh(x), _new_gelu(x))
    assert torch.equal(ops.quick_gelu(x), x * torch.sigmoid(1.702 * x))
    q, k = torch.randn(2, 4, 5, 8, generator=g).to(dtype), torch.randn(2, 2, 5, 8, generator=g).to(dtype)
    cos, sin = torch.randn(2, 5, 8, generator=g).to(dtype), torch.randn(2, 5, 8, generator=g).to(dtype)
    for got, want in zip(ops.rotary(q, k, cos, sin), _apply_rotary(q, k, cos, sin), strict=True):
        assert torch.equal(got, want)
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # (batch, seq, heads, dim): unsqueeze_dim=2
    for got, want in zip(ops.rotary(qt, kt, cos, sin, 2), _apply_rotary(qt, kt, cos, sin, 2), strict=True):
        assert torch.equal(got, want)


def _double(*shapes, grad=True):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=grad) for s in shapes]


@pytest.mark.parametrize(("module", "offset", "weight_in_fp32"),
                         [(_llama_norm, 0.0, False), (_gemma_norm, 1.0, True), (_olmo2_norm, 0.0, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_backward_is_the_modules_gradient(module, offset, weight_in_fp32, dtype, references):
    """The modules compute in fp32 whatever the input (a float64 gradcheck cannot see past that):
    against autograd through the module's own ops, in fp32 for bf16 inputs."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, 64, generator=g).to(dtype).requires_grad_()
    w = (1.0 + 0.1 * torch.randn(64, generator=g)).to(dtype).requires_grad_()
    grad = torch.randn(3, 2, 64, generator=g).to(dtype)
    got = torch.autograd.grad(ops.rms_norm(x, w, 1e-6, offset, weight_in_fp32), (x, w), grad)
    x32, w32 = (t.detach().float().requires_grad_() for t in (x, w))
    want = torch.autograd.grad(module(x32, w32, 1e-6), (x32, w32), grad.float())
    tol = tolerances.tolerance(dtype, tolerances.ACCUMULATING)  # gradients: sums of rounded terms
    for a, b in zip(got, want, strict=True):
        assert a.dtype == dtype
        torch.testing.assert_close(a.float(), b, rtol=tol.rtol, atol=tol.atol_for(b))


@pytest.mark.slow
def test_gated_activation_and_rotary_backwards_are_derivatives(references):
    gate, up = _double((4, 6), (4, 6))
    assert torch.autograd.gradcheck(ops.swiglu, (gate, up))
    for approximate in ("none", "tanh"):
        assert torch.autograd.gradcheck(lambda g, u, a=approximate: ops.geglu(g, u, a), (gate, up))
    (x,) = _double((5, 7))
    assert torch.autograd.gradcheck(ops.gelu_tanh, (x,))
    assert torch.autograd.gradcheck(ops.quick_gelu, (x,))
    q, k, cos, sin = _double((2, 3, 4, 6), (2, 1, 4, 6), (2, 4, 6), (2, 4, 6))
    assert torch.autograd.gradcheck(ops.rotary, (q, k, cos, sin))  # cos and sin take gradients too
    assert torch.autograd.gradcheck(lambda q, k: ops.rotary(q, k, cos.detach(), sin.detach()), (q, k))


def test_gated_backward_is_autograds_bit_for_bit(references):
    """The gated ops' reference backwards run the ops autograd runs for ``act(gate) * up``."""
    gate, up = (t.float().detach().requires_grad_() for t in _double((6, 10), (6, 10), grad=False))
    grad = torch.randn(6, 10)
    plain = torch.autograd.grad(F.silu(gate) * up, (gate, up), grad)
    assert all(map(torch.equal, torch.autograd.grad(ops.swiglu(gate, up), (gate, up), grad), plain))
    plain = torch.autograd.grad(F.gelu(gate, approximate="tanh") * up, (gate, up), grad)
    assert all(map(torch.equal, torch.autograd.grad(ops.geglu(gate, up, "tanh"), (gate, up), grad), plain))


@pytest.mark.parametrize("case", ["rms_norm", "rms_norm_gemma", "swiglu", "geglu", "rotary", "gelu_tanh", "quick_gelu"])
def test_registrations_pass_opcheck(case, references):
    x, w, gate, up = (t.detach().float().requires_grad_() for t in _double((3, 8), (8,), (3, 8), (3, 8)))
    q, k, cos, sin = (t.detach().float().requires_grad_() for t in _double((1, 2, 3, 8), (1, 1, 3, 8), (1, 3, 8), (1, 3, 8)))
    op, args = {
        "rms_norm": (OPS.rms_norm.default, (x, w, 1e-6)),
        "rms_norm_gemma": (OPS.rms_norm.default, (x, w, 1e-6, 1.0, True)),
        "swiglu": (OPS.swiglu.default, (gate, up)),
        "geglu": (OPS.geglu.default, (gate, up, "tanh")),
        "rotary": (OPS.rotary.default, (q, k, cos.detach(), sin.detach())),
        "gelu_tanh": (OPS.gelu_tanh.default, (x,)),
        "quick_gelu": (OPS.quick_gelu.default, (x,)),
    }[case]
    torch.library.opcheck(op, args)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="weight must be 1-D of the input's last dim"):
        ops.rms_norm(torch.randn(2, 8), torch.randn(4), 1e-6)
    with pytest.raises(ValueError, match="gate and up must have one shape"):
        ops.swiglu(torch.randn(2, 8), torch.randn(2, 4))
    with pytest.raises(ValueError, match="approximate='fast'; allowed"):
        ops.geglu(torch.randn(2, 8), torch.randn(2, 8), "fast")
    with pytest.raises(ValueError, match="one dim more than cos"):
        ops.rotary(torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 8), torch.randn(2, 8))


def _ours(trace) -> list[tuple[str, str]]:
    return [(e.op, e.outcome) for e in trace.events if e.op.startswith("swiglu")]


def test_an_override_attaches_and_the_public_name_switches_forward_and_backward():
    """A stand-in override at the CPU key serves ``swiglu`` and its backward; ``operations_disabled("swiglu")``
    hands both to the references, with the trace saying so."""
    calls = []

    def forward(gate, up):
        calls.append("forward")
        return F.silu(gate) * up

    def backward(grad_output, gate, up):
        calls.append("backward")
        return torch.ops.aten.silu_backward(grad_output * up, gate), grad_output * F.silu(gate)

    # priority=1: ahead of the Triton overrides the interpreter installs at the same key
    handles = [pn.register_op_override(TEST_DSL, "python_native", "swiglu", "CPU", None, forward,
                                       unconditional_override=True, public_name="swiglu", priority=1),
               pn.register_op_override(TEST_DSL, "python_native", "swiglu_backward", "CPU", None, backward, unconditional_override=True,
                                       public_name="swiglu", backward=True, priority=1)]
    try:
        gate, up = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)
        with pn.trace() as t:
            ops.swiglu(gate, up).sum().backward()
        assert calls == ["forward", "backward"]
        assert _ours(t) == [("swiglu", "override"), ("swiglu_backward", "override")]
        with pn.operations_disabled("swiglu"), pn.trace() as t:
            ops.swiglu(gate, up).sum().backward()
        assert calls == ["forward", "backward"]
        assert _ours(t) == [("swiglu", "fallback"), ("swiglu_backward", "fallback")]
        assert all("disabled" in e.reason for e in t.events if e.op.startswith("swiglu"))
    finally:
        for handle in handles:
            handle.remove()


def test_a_custom_op_shares_an_aten_name_only_where_aten_has_no_kernel():
    from python_native.foundations import custom_ops

    with pytest.raises(ValueError, match="aten_namesake=True needs an aten op 'softmax' that is only a composite; "
                                         "aten::softmax.int_out has kernels of its own"):
        custom_ops.declare("softmax(Tensor x) -> Tensor", reference=torch.clone, fake=torch.empty_like, aten_namesake=True)
    with pytest.raises(ValueError, match="aten has no op 'pn_test_nowhere'"):
        custom_ops.declare("pn_test_nowhere(Tensor x) -> Tensor", reference=torch.clone, fake=torch.empty_like,
                         aten_namesake=True)
    assert {"rms_norm", "rms_norm_backward"} <= {d.name for d in custom_ops.defined()}
    # One public name for aten's RMS norm overrides and this op: a switch covers both.
    from python_native.foundations import public_names

    assert {"rms_norm", "rms_norm_backward"} <= set(public_names.covered("rms_norm"))
