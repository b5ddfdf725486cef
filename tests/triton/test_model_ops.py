"""The Triton kernels of the ops model patching declares: ``python_native::rms_norm`` (its casting
modes), ``swiglu``, ``geglu``, ``rotary``, ``gelu_tanh`` and ``quick_gelu``, forward and backward.

Each override's impl runs on its cond's plan and is held to the op's formula in plain torch (as
the declarations' references compute it), run in the same dtype and in float64: within the
dtype's tolerance of the former, or no further from the latter (``verify.mismatch``). Backward
impls are compared with autograd through the same formulas. Inputs include row views (the halves
of a chunked projection, row slices), odd widths and transposed q/k.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from triton_testing import DEVICE, DTYPES, assert_matches, lower_register_max, make, requires_triton, seeded  # noqa: F401

from python_native_dsls.triton.ops import gated, model_activations, model_rms_norm, rotary

pytestmark = requires_triton


def rms_norm_reference(x, w, eps, offset, weight_in_fp32):
    h = x.to(torch.float32) if x.dtype != torch.float64 else x
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight_in_fp32:
        return (h * (offset + (w.float() if w.dtype != torch.float64 else w))).to(x.dtype)
    return (w if offset == 0.0 else offset + w) * h.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def rotary_reference(q, k, cos, sin, unsqueeze_dim):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def gelu_tanh_reference(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def quick_gelu_reference(x):
    return x * torch.sigmoid(1.702 * x)


def _run(fn, inputs, grads, wide):
    """``fn`` and autograd's gradients of its differentiable inputs (None for the others)."""
    leaves = [t.detach().to(torch.float64 if wide and t.is_floating_point() else t.dtype).requires_grad_(g)
              for t, g in zip(inputs, grads, strict=True)]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    return outs, leaves


def check(fn, inputs, differentiable, forward, backward):
    """``forward(*inputs)`` and ``backward(grads_out, *inputs)`` (the impls) against ``fn`` in the
    inputs' dtype and in float64; ``differentiable``: which inputs get gradients."""
    got = forward(*inputs)
    got = got if isinstance(got, tuple) else (got,)
    ref, ref_leaves = _run(fn, inputs, differentiable, wide=False)
    truth, truth_leaves = _run(fn, inputs, differentiable, wide=True)
    grads_out = [make(*o.shape, dtype=o.dtype, requires_grad=False) for o in ref]
    for i, (g, r, t) in enumerate(zip(got, ref, truth, strict=True)):
        assert g.shape == r.shape and g.dtype == r.dtype, (i, g.shape, g.dtype, r.shape, r.dtype)
        assert_matches(g, r.detach(), t.detach(), f"output {i}")
    torch.autograd.backward(ref, grads_out)
    torch.autograd.backward(truth, [g.double() for g in grads_out])
    got_grads = backward(*grads_out, *inputs)
    got_grads = got_grads if isinstance(got_grads, tuple) else (got_grads,)
    wanted = [(r, t) for r, t, d in zip(ref_leaves, truth_leaves, differentiable, strict=True) if d]
    assert len(got_grads) == len(wanted)
    for i, (g, (r, t)) in enumerate(zip(got_grads, wanted, strict=True)):
        assert g.shape == r.shape and g.dtype == r.grad.dtype, (i, g.dtype, r.grad.dtype)
        assert_matches(g, r.grad, t.grad, f"gradient {i}", grad=True)


def planned(op, *args):
    """The plan ``op`` (one op of a family) makes for the call; its cond must take the call."""
    plan = op.cond(*args)
    assert plan is not None, op.explain(*args)
    return plan


# ----- rms_norm -----

MODES = {"llama": (0.0, False), "llama, 1 + weight": (1.0, False), "gemma": (1.0, True)}


def _rms_norm_check(x, w, offset, weight_in_fp32, eps=1e-6):
    def forward(x, w):
        plan = planned(model_rms_norm.FAMILY["rms_norm"], x, w, eps, offset, weight_in_fp32)
        return model_rms_norm.rms_norm_impl(x, w, eps, offset, weight_in_fp32, plan=plan)

    def backward(dy, x, w):
        plan = planned(model_rms_norm.FAMILY["rms_norm_backward"], dy, x, w, eps, offset, weight_in_fp32)
        return model_rms_norm.rms_norm_backward_impl(dy, x, w, eps, offset, weight_in_fp32, plan=plan)

    check(lambda x, w: rms_norm_reference(x, w, eps, offset, weight_in_fp32), [x, w], [True, True], forward, backward)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_rms_norm_modes(dtype, mode):
    offset, weight_in_fp32 = MODES[mode]
    x = make(3, 2, 50, dtype=dtype, requires_grad=False)[..., :37]  # odd width, rows at a stride of 50
    _rms_norm_check(x, make(37, dtype=dtype, requires_grad=False, scale=0.3), offset, weight_in_fp32)


def test_rms_norm_fp32_weight_promotes_in_llama_mode():
    """The weight multiplies the normalized rows cast back to bfloat16: the fp32 result shows it."""
    x, w = make(4, 48, dtype=torch.bfloat16, requires_grad=False), make(48, requires_grad=False)
    for offset in (0.0, 1.0):
        out = model_rms_norm.rms_norm_impl(x, w, 1e-5, offset)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, rms_norm_reference(x, w, 1e-5, offset, False))
    assert model_rms_norm.rms_norm_impl(x, w, 1e-5, 1.0, True).dtype == torch.bfloat16
    _rms_norm_check(x, w, 0.0, False)


def test_rms_norm_head_dim_of_4d_q():
    """q/k norms: (batch, seq, heads, head_dim) normalized over head_dim."""
    _rms_norm_check(make(2, 3, 4, 16, dtype=torch.bfloat16, requires_grad=False),
                    make(16, dtype=torch.bfloat16, requires_grad=False), 1.0, True)


def test_rms_norm_of_transposed_q():
    """Gemma 3 normalizes q after the transpose to (batch, heads, seq, head_dim): rows collapse only
    with the heads and seq dims swapped back; the result keeps q's layout."""
    q = make(2, 5, 4, 16, dtype=torch.bfloat16, requires_grad=False).transpose(1, 2)
    w = make(16, dtype=torch.bfloat16, requires_grad=False, scale=0.1)
    _rms_norm_check(q, w, 1.0, True)
    assert model_rms_norm.rms_norm_impl(q, w, 1e-6, 1.0, True).stride() == q.stride()


def test_rms_norm_streamed_backward(monkeypatch):
    paths = lower_register_max(monkeypatch, 64)
    x = make(5, 200, requires_grad=False)
    _rms_norm_check(x, make(200, requires_grad=False), 0.0, False)
    _rms_norm_check(x.bfloat16(), make(200, dtype=torch.bfloat16, requires_grad=False), 1.0, True)
    assert set(paths) == {"columns"}


# ----- swiglu, geglu -----

GATED = {"swiglu": ("swiglu", None), "geglu": ("geglu", "none"), "geglu tanh": ("geglu", "tanh")}


def _gated_check(name, gate, up):
    op, approximate = GATED[name]
    act = F.silu if approximate is None else (lambda t: F.gelu(t, approximate=approximate))
    extra = () if approximate is None else (approximate,)
    fwd, bwd = gated.FAMILY[op], gated.FAMILY[f"{op}_backward"]
    impl, backward_impl = getattr(gated, f"{op}_impl"), getattr(gated, f"{op}_backward_impl")

    def forward(g, u):
        return impl(g, u, *extra, plan=planned(fwd, g, u, *extra))

    def backward(dy, g, u):
        return backward_impl(dy, g, u, *extra, plan=planned(bwd, dy, g, u, *extra))

    check(lambda g, u: act(g) * u, [gate, up], [True, True], forward, backward)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", GATED)
def test_gated_on_the_halves_of_a_fused_projection(name, dtype):
    gate, up = make(3, 2, 2 * 37, dtype=dtype, requires_grad=False, scale=3.0).chunk(2, -1)
    assert gate.stride() == (148, 74, 1)
    _gated_check(name, gate, up)


def test_gated_interleaved_halves_and_an_expanded_gradient():
    gate_up = make(4, 2 * 19, requires_grad=False)
    gate, up = gate_up[:, ::2], gate_up[:, 1::2]  # column stride 2
    _gated_check("swiglu", gate, up)
    dy = torch.ones((), device=DEVICE).expand(4, 19)  # what ``out.sum().backward()`` hands the backward
    dg, du = gated.swiglu_backward_impl(dy, gate, up, plan=planned(gated.FAMILY["swiglu_backward"], dy, gate, up))
    torch.testing.assert_close(du, F.silu(gate))
    torch.testing.assert_close(dg, torch.ops.aten.silu_backward(up.contiguous(), gate))


def test_gated_separate_projections_and_a_row_slice():
    _gated_check("swiglu", make(5, 64, requires_grad=False), make(8, 64, requires_grad=False)[:5])
    _gated_check("geglu tanh", make(2, 3, 9, dtype=torch.bfloat16, requires_grad=False),
                 make(2, 3, 16, dtype=torch.bfloat16, requires_grad=False)[..., :9])


# ----- gelu_tanh, quick_gelu -----

POINTWISE = {"gelu_tanh": gelu_tanh_reference, "quick_gelu": quick_gelu_reference}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", POINTWISE)
@pytest.mark.parametrize("layout", ["dense", "row view"])
def test_pointwise(name, dtype, layout):
    reference = POINTWISE[name]
    fwd, bwd = model_activations.FAMILY[name], model_activations.FAMILY[f"{name}_backward"]
    x = make(3, 77, dtype=dtype, requires_grad=False, scale=4.0)
    x = x if layout == "dense" else x[:, 5:60]
    impl = getattr(model_activations, f"{name}_impl")
    backward_impl = getattr(model_activations, f"{name}_backward_impl")
    check(reference, [x], [True], lambda t: impl(t, plan=planned(fwd, t)),
          lambda dy, t: backward_impl(dy, t, plan=planned(bwd, dy, t)))


def test_pointwise_keeps_a_dense_layout():
    x = make(30, 7, requires_grad=False).t()
    out = model_activations.quick_gelu_impl(x, plan=planned(model_activations.FAMILY["quick_gelu"], x))
    assert out.stride() == x.stride()
    torch.testing.assert_close(out, quick_gelu_reference(x))


# ----- rotary -----

def _rotary_inputs(layout, dtype):
    b, h, kv, s, d = 2, 4, 2, 5, 16
    if layout == "transposed q/k, unsqueeze_dim=1":  # (batch, seq, heads, dim) views transposed, as attention does
        q = make(b, s, h, d, dtype=dtype, requires_grad=False).transpose(1, 2)
        k = make(b, s, kv, d, dtype=dtype, requires_grad=False).transpose(1, 2)
        cos, sin, dim = make(b, s, d, dtype=dtype, requires_grad=False), make(b, s, d, dtype=dtype, requires_grad=False), 1
    elif layout == "unsqueeze_dim=2, one set of positions for the batch":
        q, k = make(b, s, h, d, dtype=dtype, requires_grad=False), make(b, s, kv, d, dtype=dtype, requires_grad=False)
        cos, sin, dim = make(1, s, d, dtype=dtype, requires_grad=False), make(1, s, d, dtype=dtype, requires_grad=False), 2
    else:  # partial rotary: the first 8 of 24 channels of each head
        q = make(b, h, s, 24, dtype=dtype, requires_grad=False)[..., :8]
        k = make(b, kv, s, 24, dtype=dtype, requires_grad=False)[..., :8]
        cos, sin, dim = make(b, s, 8, dtype=dtype, requires_grad=False), make(b, s, 8, dtype=dtype, requires_grad=False), 1
    return q, k, cos, sin, dim


ROTARY_LAYOUTS = ["transposed q/k, unsqueeze_dim=1", "unsqueeze_dim=2, one set of positions for the batch",
                  "partial rotary slices"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ROTARY_LAYOUTS)
def test_rotary(layout, dtype):
    q, k, cos, sin, dim = _rotary_inputs(layout, dtype)

    def forward(q, k, cos, sin):
        return rotary.rotary_impl(q, k, cos, sin, dim, plan=planned(rotary.FAMILY["rotary"], q, k, cos, sin, dim))

    def backward(gq, gk, q, k, cos, sin):
        return rotary.rotary_backward_impl(gq, gk, cos, sin, dim,
                                           plan=planned(rotary.FAMILY["rotary_backward"], gq, gk, cos, sin, dim))

    check(lambda q, k, c, s: rotary_reference(q, k, c, s, dim), [q, k, cos, sin], [True, True, False, False],
          forward, backward)


def test_rotary_backward_of_an_expanded_gradient():
    q, k, cos, sin, dim = _rotary_inputs(ROTARY_LAYOUTS[0], torch.float32)
    gq, gk = (torch.ones((), device=DEVICE).expand(t.shape) for t in (q, k))
    dq, dk = rotary.rotary_backward_impl(gq, gk, cos, sin, dim,
                                         plan=planned(rotary.FAMILY["rotary_backward"], gq, gk, cos, sin, dim))
    qq = q.detach().requires_grad_()
    rotary_reference(qq, k, cos, sin, dim)[0].sum().backward()
    torch.testing.assert_close(dq, qq.grad)
    assert dk.shape == k.shape


def test_rotary_keeps_the_layout_of_transposed_q():
    q, k, cos, sin, dim = _rotary_inputs(ROTARY_LAYOUTS[0], torch.float32)
    q_out, k_out = rotary.rotary_impl(q, k, cos, sin, dim)
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()


# ----- declines say why -----

def test_declines_name_the_reason():
    x = make(4, 20, requires_grad=False)
    tangled = make(3, 4, 10, requires_grad=False).transpose(0, 1)  # leading dims that make no single row stride
    assert "do not collapse to one row stride" in gated.FAMILY["swiglu"].explain(tangled, tangled)
    assert gated.FAMILY["swiglu"].cond(tangled, tangled) is None
    assert "differs" in gated.FAMILY["swiglu"].explain(x[:, :10], x[:, :10].double())
    assert "approximate='erf'" in gated.FAMILY["geglu"].explain(x, x, "erf")
    assert "weight shape (19,)" in model_rms_norm.FAMILY["rms_norm"].explain(x, x[0, :19], 1e-6, 0.0, False)
    assert "float64" in model_rms_norm.FAMILY["rms_norm"].explain(x.double(), x[0].double(), 1e-6, 0.0, False)
    q = make(2, 3, 4, 6, requires_grad=False)
    assert "even" in rotary.FAMILY["rotary"].explain(q[..., :5], q[..., :5], q[0, 0, :, :5], q[0, 0, :, :5], 1)
    assert "does not broadcast" in rotary.FAMILY["rotary"].explain(q, q, make(5, 6, requires_grad=False),
                                                         make(5, 6, requires_grad=False), 0)
    assert "float64" in model_activations.FAMILY["quick_gelu"].explain(x.double())
    with pytest.raises(ValueError, match="cannot take this call"):
        gated.swiglu_impl(tangled, tangled)
