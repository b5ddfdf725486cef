"""The Triton kernels of ``python_native::moe_route`` and ``moe_experts``, forward and backward.

Each call goes through the public op (the trace says the Triton override served it) and is held to
the op's reference run with the DSL off, in the same dtype and in float64 (``verify.mismatch``):
every router variant the families use (DeepSeek-V3's group-limited routing among them, its ties
too), both expert weight layouts and every activation, and the
edge cases of routing: an expert given no token, top-k equal to the number of experts, every
token's first choice the same expert.
"""

from __future__ import annotations

import pytest
import torch
from triton_testing import DEVICE, assert_routed, requires_triton

import python_native as pn
from python_native.ops import moe_experts_op, moe_route_op
from python_native.tools import verify

pytestmark = [requires_triton, pytest.mark.override]

ROUTERS = {
    "Mixtral": dict(top_k=2, renormalize=True, keep_float=True),
    "OLMoE": dict(top_k=3),
    "GPT-OSS": dict(top_k=4, topk_first=True),
    "DeepSeek-V3 without groups": dict(top_k=2, scoring="sigmoid", renormalize=True, renormalize_eps=1e-20,
                                       scaling=2.5),
    "DeepSeek-V3": dict(top_k=3, scoring="sigmoid", renormalize=True, renormalize_eps=1e-20, n_group=4, topk_group=2,
                        scaling=2.5),
    "DeepSeek-V3, topk_group = n_group": dict(top_k=2, scoring="sigmoid", renormalize=True, renormalize_eps=1e-20,
                                              n_group=2, topk_group=2, scaling=2.5),
    "one group kept, no bias": dict(top_k=2, scoring="sigmoid", n_group=4, topk_group=1),
}


def _rand(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=DEVICE, dtype=dtype)


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_(t.is_floating_point()) if t is not None else None for t in tensors]


def _forward_backward(fn, inputs, grad_seed: int = 1):
    """Outputs (the first, differentiable) and the input gradients of ``fn``, and the trace's events."""
    leaves = _leaves(*inputs)
    with pn.trace() as t:
        out = fn(*leaves)
        first = _first(out)
        grads = torch.autograd.grad(first, [x for x in leaves if x is not None and x.requires_grad],
                                    _rand(*first.shape, dtype=first.dtype, seed=grad_seed))
    return out, grads, t.events


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _compare(fn, inputs, what: str):
    got, got_grads, events = _forward_backward(fn, inputs)
    with pn.triton.disabled():
        ref, ref_grads, _ = _forward_backward(fn, inputs)
        truth, truth_grads, _ = _forward_backward(fn, [None if x is None else (x.double() if x.is_floating_point() else x)
                                                       for x in inputs])
    problems = [verify.mismatch(_first(got), _first(ref), _first(truth), f"{what}: output")]
    problems += [verify.mismatch(g, r, t, f"{what}: gradient {i}", grad=True)
                 for i, (g, r, t) in enumerate(zip(got_grads, ref_grads, truth_grads, strict=True))]
    assert not [p for p in problems if p], problems
    return got, ref, events


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", list(ROUTERS))
def test_route_matches_the_reference_forward_and_backward(family, dtype):
    options = dict(ROUTERS[family])
    bias = _rand(8, scale=0.1, seed=3) if options.get("scoring") == "sigmoid" and "no bias" not in family else None

    def route(logits):  # slots in expert order: the references' unsorted top-k may order them otherwise
        weights, indices = moe_route_op.moe_route(logits, bias=bias, **options)
        order = indices.argsort(1)
        return weights.gather(1, order), indices.gather(1, order)

    got, ref, events = _compare(route, [_rand(9, 8, dtype=dtype, seed=2)], family)
    assert_routed(events, {"moe_route": None, "moe_route_backward": None}, family)
    assert torch.equal(got[1], ref[1])  # the same experts chosen
    assert got[0].dtype == ref[0].dtype


GROUPED = dict(scoring="sigmoid", renormalize=True, renormalize_eps=1e-20, scaling=2.5)


def _route_and_grad(logits, bias, top_k, **options):
    """(weights, indices, the logits' gradient) of one routing, slots in expert order, and the trace's events."""
    leaf = logits.detach().clone().requires_grad_()
    with pn.trace() as t:
        w, i = moe_route_op.moe_route(leaf, top_k, bias=bias, **options)
        order = i.argsort(1)
        w, i = w.gather(1, order), i.gather(1, order)
        (grad,) = torch.autograd.grad(w, leaf, _rand(*w.shape, seed=7))
    return w, i, grad, t.events


def test_group_limited_routing_at_deepseek_v3s_shape():
    """256 experts in 8 groups, the 4 best groups kept, 8 experts chosen: the kernel serves it both ways."""
    logits, bias = _rand(6, 256, seed=11), _rand(256, scale=0.05, seed=12)
    options = dict(GROUPED, n_group=8, topk_group=4)
    w, i, grad, events = _route_and_grad(logits, bias, 8, **options)
    assert_routed(events, {"moe_route": None, "moe_route_backward": None}, "DeepSeek-V3's shape")
    with pn.triton.disabled():
        ref_w, ref_i, ref_grad, _ = _route_and_grad(logits, bias, 8, **options)
    assert torch.equal(i, ref_i)
    torch.testing.assert_close(w, ref_w, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)
    groups = (i // 32).tolist()
    assert all(len(set(row)) <= 4 for row in groups)  # within the kept groups only


def test_ties_go_to_the_lower_group_and_expert_with_the_references_weights_and_gradient():
    """Tied groups and tied experts: the kernel keeps the lower ones (any tied choice is the module's),
    and its weights and gradient are the reference's at the experts it chose."""
    a, b = 0.75, -0.5
    logits = torch.tensor([[0.3] * 8,  # every group and expert tied
                           [a, b] * 4,  # groups tied (a + b each), experts a ahead within each
                           [b, a, b, a, a, b, 2.0, -1.0]], device=DEVICE)  # groups 0-2 tied, group 3 ahead
    options = dict(GROUPED, n_group=4, topk_group=2)
    w, i, grad, events = _route_and_grad(logits, None, 2, **options)
    assert_routed(events, {"moe_route": None, "moe_route_backward": None}, "ties")
    assert i.tolist() == [[0, 1], [0, 2], [1, 6]]
    with pn.triton.disabled():
        ref_w, ref_i, _, _ = _route_and_grad(logits, None, 2, **options)
        ref_grad = moe_route_op.BACKWARD(_rand(*w.shape, seed=7), logits, i, 2, "sigmoid", False, True, 1e-20, None,
                                         4, 2, 2.5, False)
    torch.testing.assert_close(w.sort(1).values, ref_w.sort(1).values, rtol=1e-6, atol=0)  # tied values alike
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-7)


def test_group_limited_routing_declines_where_the_kept_groups_hold_fewer_than_top_k_experts():
    logits = _rand(5, 8)
    with pn.trace() as t:
        got = moe_route_op.moe_route(logits, 3, "sigmoid", n_group=4, topk_group=1)
    assert_routed(t.events, {"moe_route": "top_k=3 exceeds the 2 experts of the topk_group=1 chosen groups"},
                  "too few experts kept")
    assert got[1].shape == (5, 3)


def _indices(case: str, tokens: int, top_k: int, experts: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    if case == "all to one":
        rows = [torch.cat([torch.tensor([1]), torch.tensor([e for e in range(experts) if e != 1])[
            torch.randperm(experts - 1, generator=g)][: top_k - 1]]) for _ in range(tokens)]
    else:  # "an idle expert": the last gets no token; "top_k = E": every token to every expert
        pool = experts if case == "top_k = E" else experts - 1
        rows = [torch.randperm(pool, generator=g)[:top_k] for _ in range(tokens)]
    return torch.stack(rows).to(DEVICE)


LAYOUTS = {  # name -> (activation, transposed, interleaved, biases)
    "SwiGLU (Mixtral, Qwen3-MoE, OLMoE)": ("silu", False, False, False),
    "GeGLU": ("gelu", False, False, False),
    "tanh-GeGLU, interleaved": ("gelu_tanh", False, True, False),
    "GPT-OSS": ("clamped_swiglu", True, True, True),
}


@pytest.mark.parametrize("case", ["an idle expert", "top_k = E", "all to one"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_experts_match_the_reference_forward_and_backward(layout, dtype, case):
    activation, transposed, interleaved, biased = LAYOUTS[layout]
    tokens, size, inner, experts = 7, 32, 24, 4
    top_k = {"an idle expert": 2, "top_k = E": experts, "all to one": 3}[case]
    indices = _indices(case, tokens, top_k, experts)
    shapes = ((experts, size, 2 * inner), (experts, inner, size)) if transposed else \
        ((experts, 2 * inner, size), (experts, size, inner))
    inputs = [_rand(tokens, size, dtype=dtype, seed=5), _rand(tokens, top_k, dtype=dtype, seed=6).abs(),
              _rand(*shapes[0], dtype=dtype, scale=0.2, seed=7), _rand(*shapes[1], dtype=dtype, scale=0.2, seed=8),
              _rand(experts, 2 * inner, dtype=dtype, scale=0.1, seed=9) if biased else None,
              _rand(experts, size, dtype=dtype, scale=0.1, seed=10) if biased else None]

    def experts_call(hidden, weights, gate_up, down, gate_up_bias, down_bias):
        return moe_experts_op.moe_experts(hidden, indices, weights, gate_up, down, gate_up_bias, down_bias, activation,
                                          transposed, interleaved, 7.0, 1.702)

    got, _, events = _compare(experts_call, inputs, f"{layout}, {case}")
    assert_routed(events, {"moe_experts": None, "moe_experts_backward": None}, layout)
    if case == "an idle expert":  # no token, no gradient
        leaves = _leaves(*inputs)
        out = experts_call(*leaves)
        grad_gate_up = torch.autograd.grad(out.sum(), leaves[2])[0]
        assert not grad_gate_up[experts - 1].any()


def test_experts_decline_float64_saying_why():
    indices = torch.tensor([[0, 1], [1, 2]], device=DEVICE)
    f64 = torch.float64
    args = (_rand(2, 16, dtype=f64), indices, _rand(2, 2), _rand(3, 16, 16, dtype=f64), _rand(3, 16, 8, dtype=f64))
    with pn.trace() as t:
        got = moe_experts_op.moe_experts(*args)
    with pn.triton.disabled():
        want = moe_experts_op.moe_experts(*args)
    assert_routed(t.events, {"moe_experts": "hidden dtype float64"}, "float64")
    assert torch.equal(got, want)
