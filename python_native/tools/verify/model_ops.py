"""Drivers of the MoE ops model patching routes to: ``python_native::moe_route`` and ``moe_experts``,
forward and backward (the other ops model patching routes to carry theirs in their declarations:
``Op.verify``).

Each is reached through ``torch.ops.python_native``; with the DSL disabled the call runs the op's
reference (what the module it replaces computes), and in float64 that reference is the truth.
Inputs include what model code hands these ops: routers of each model family's variant, experts in
both weight layouts with an expert given no token.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from python_native.tools.verify.samples import Driver, Sample, rand


def _ops():
    return torch.ops.python_native


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
    "moe_route": Driver(_route_cases, (), ("moe_route_backward",)),
    "moe_experts": Driver(_experts_cases, (), ("moe_experts_backward",)),
}
