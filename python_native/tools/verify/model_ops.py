"""Drivers of the ops model patching declares: ``python_native::rms_norm`` (its casting modes),
``swiglu``, ``geglu``, ``rotary``, ``gelu_tanh``, ``quick_gelu``, ``moe_route`` and ``moe_experts``, forward
and backward.

Each is reached through ``torch.ops.python_native``; with the DSL disabled the call runs the op's
reference (what the module it replaces computes), and in float64 that reference is the truth.
Inputs include what model code hands these ops: the halves of a fused gate/up projection, row
slices, odd widths, q and k transposed from ``(batch, seq, heads, dim)`` with fewer key heads, routers of
each family's variant, experts in both weight layouts with an expert given no token.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

from python_native.tools.verify.samples import Driver, Sample, rand


def _ops():
    return torch.ops.python_native


def _rms_norm_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    modes = {"Llama": (0.0, False), "Llama, 1 + weight": (1.0, False), "Gemma": (1.0, True)}
    inputs = {
        "odd width": rand(3, 37, dtype=dtype, device=device),
        "row slices": rand(4, 96, dtype=dtype, device=device)[:, :64],
        "q/k norm over the head dim": rand(2, 3, 4, 16, dtype=dtype, device=device),
        "1e4 scale": rand(2, 24, dtype=dtype, device=device, scale=1e4),
    }
    for (mode, (offset, fp32)), (name, x) in zip(itertools.cycle(modes.items()), inputs.items()):
        w = rand(x.shape[-1], dtype=dtype, device=device, scale=0.3)
        yield Sample(f"{mode}: {name}",
                     lambda x, w, _o=offset, _f=fp32: _ops().rms_norm(x, w, 1e-6, _o, _f), [x, w])
    x = rand(4, 40, dtype=dtype, device=device)
    yield Sample("Llama: float32 weight", lambda x, w: _ops().rms_norm(x, w, 1e-6),
                 [x, rand(40, dtype=torch.float32, device=device)])


def _gated_cases(op: str, modes: tuple[str | None, ...]):
    """``op``'s cases, each with the next of ``modes`` (geglu's ``approximate``; None: swiglu's none)."""
    def call(approximate: str | None):
        if approximate is None:
            return lambda g, u: getattr(_ops(), op)(g, u)
        return lambda g, u: getattr(_ops(), op)(g, u, approximate)

    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        gate, up = rand(3, 2, 2 * 37, dtype=dtype, device=device, scale=3.0).chunk(2, -1)
        inputs = {
            "halves of a fused gate_up": [gate, up],
            "separate projections": [rand(5, 64, dtype=dtype, device=device), rand(5, 64, dtype=dtype, device=device)],
            "row slices": [rand(4, 48, dtype=dtype, device=device)[:, 8:40], rand(4, 32, dtype=dtype, device=device)],
        }
        for mode, (name, tensors) in zip(itertools.cycle(modes), inputs.items()):
            yield Sample(name if mode is None else f"{name}, approximate={mode!r}", call(mode), tensors)
    return cases


def _rotary_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    b, s, h, kv, d = 2, 5, 4, 2, 16
    angles = torch.rand(b, s, d // 2, device=device) * 6.0
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    q = rand(b, s, h, d, dtype=dtype, device=device).transpose(1, 2)
    k = rand(b, s, kv, d, dtype=dtype, device=device).transpose(1, 2)
    yield Sample("q, k transposed, fewer key heads", lambda q, k, c, s: _ops().rotary(q, k, c, s, 1), [q, k, cos, sin])
    q, k = rand(b, s, h, d, dtype=dtype, device=device), rand(b, s, kv, d, dtype=dtype, device=device)
    yield Sample("unsqueeze_dim=2, positions shared by the batch",
                 lambda q, k, c, s: _ops().rotary(q, k, c, s, 2), [q, k, cos[:1], sin[:1]])
    q, k = rand(b, h, s, 24, dtype=dtype, device=device)[..., :d], rand(b, kv, s, 24, dtype=dtype, device=device)[..., :d]
    yield Sample("partial rotary slices", lambda q, k, c, s: _ops().rotary(q, k, c, s, 1), [q, k, cos, sin])


def _pointwise_cases(op: str):
    def cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
        fn = lambda x: getattr(_ops(), op)(x)  # noqa: E731
        yield Sample("odd width", fn, [rand(3, 37, dtype=dtype, device=device, scale=4.0)])
        yield Sample("transposed", fn, [rand(33, 4, dtype=dtype, device=device).t()])
        yield Sample("row slices", fn, [rand(4, 64, dtype=dtype, device=device, scale=4.0)[:, 3:50]])
        yield Sample("large magnitudes", fn, [rand(2, 24, dtype=dtype, device=device, scale=30.0)])
    return cases


def _route_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    variants = {"softmax, top-k, renormalised (Mixtral)": (2, "softmax", False, True),
                "softmax, top-k (OLMoE)": (3, "softmax", False, False),
                "top-k, then softmax (GPT-OSS)": (4, "softmax", True, False),
                "sigmoid, renormalised, scaled": (2, "sigmoid", False, True)}
    for name, (top_k, scoring, first, renorm) in variants.items():
        yield Sample(name, lambda x, _a=(top_k, scoring, first, renorm): _ops().moe_route(x, *_a, 1e-20, None, 1, 1, 2.0),
                     [rand(7, 8, dtype=dtype, device=device)])


def _experts_cases(dtype: torch.dtype, device: str) -> Iterator[Sample]:
    tokens, size, inner, experts = 7, 32, 24, 4
    g = torch.Generator().manual_seed(0)  # expert 3 gets no token
    indices = torch.stack([torch.randperm(3, generator=g)[:2] for _ in range(tokens)]).to(device)
    for name, transposed, act in (("SwiGLU, F.linear layout", False, "silu"), ("clamped SwiGLU, transposed", True,
                                                                               "clamped_swiglu")):
        shapes = ((experts, size, 2 * inner), (experts, inner, size)) if transposed else \
            ((experts, 2 * inner, size), (experts, size, inner))
        def call(h, w, gu, d, _t=transposed, _a=act):
            return _ops().moe_experts(h, indices, w, gu, d, None, None, _a, _t, _t, 7.0, 1.702, "sum")

        yield Sample(name, call, [rand(tokens, size, dtype=dtype, device=device), rand(tokens, 2, dtype=dtype, device=device),
                                  rand(*shapes[0], dtype=dtype, device=device, scale=0.2),
                                  rand(*shapes[1], dtype=dtype, device=device, scale=0.2)])


DRIVERS: dict[str, Driver] = {
    "rms_norm": Driver(_rms_norm_cases, (), ("rms_norm_backward",)),
    "swiglu": Driver(_gated_cases("swiglu", (None,)), (), ("swiglu_backward",)),
    "geglu": Driver(_gated_cases("geglu", ("tanh", "none")), (), ("geglu_backward",)),
    "rotary": Driver(_rotary_cases, (), ("rotary_backward",)),
    "gelu_tanh": Driver(_pointwise_cases("gelu_tanh"), (), ("gelu_tanh_backward",)),
    "quick_gelu": Driver(_pointwise_cases("quick_gelu"), (), ("quick_gelu_backward",)),
    "moe_route": Driver(_route_cases, (), ("moe_route_backward",)),
    "moe_experts": Driver(_experts_cases, (), ("moe_experts_backward",)),
}
