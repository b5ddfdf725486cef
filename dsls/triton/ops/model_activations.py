"""``python_native::gelu_tanh`` and ``python_native::quick_gelu``, forward and backward.

The ops are declared by ``python_native.ops``: the hand-written activations of model code (GPT-2's
tanh-GELU formula, CLIP's ``x * sigmoid(1.702 * x)``), which otherwise run as several pointwise
aten calls. These overrides run them on the activation kernels of ``silu`` and ``gelu``, with the
layouts of ``silu``'s, and more: dense ones keep their layout, row views at any strides (an
expanded gradient among them) give contiguous results.
"""

from __future__ import annotations

import math

import torch

from python_native.ops import activation_op  # noqa: F401  (declares the ops overridden here)
from python_native_dsls.family import Family, Op
from python_native_dsls.proving import BenchRow, Driver, Sample, elementwise_bytes, rand, x_input

from ..target import DSL_NAME
from .activations import Plan, pointwise_plan_or_why

Tensor = torch.Tensor
NAMESPACE = "python_native"

GELU_TANH = 2
QUICK_GELU = 3  # values match python_native_dsls.triton.kernels.activations


def gelu_tanh_plan_or_why(x: Tensor) -> Plan | str:
    return pointwise_plan_or_why(GELU_TANH, x, unit=False)


def gelu_tanh_backward_plan_or_why(grad_output: Tensor, x: Tensor) -> Plan | str:
    return pointwise_plan_or_why(GELU_TANH, x, grad_output, unit=False)


def quick_gelu_plan_or_why(x: Tensor) -> Plan | str:
    return pointwise_plan_or_why(QUICK_GELU, x, unit=False)


def quick_gelu_backward_plan_or_why(grad_output: Tensor, x: Tensor) -> Plan | str:
    return pointwise_plan_or_why(QUICK_GELU, x, grad_output, unit=False)


def gelu_tanh_impl(x: Tensor, plan: Plan | None = None) -> Tensor:
    return FAMILY.kernels().run_forward(x, plan or FAMILY["gelu_tanh"].require(x))


def gelu_tanh_backward_impl(grad_output: Tensor, x: Tensor, plan: Plan | None = None) -> Tensor:
    plan = plan or FAMILY["gelu_tanh_backward"].require(grad_output, x)
    return FAMILY.kernels().run_backward(grad_output, x, plan)


def quick_gelu_impl(x: Tensor, plan: Plan | None = None) -> Tensor:
    return FAMILY.kernels().run_forward(x, plan or FAMILY["quick_gelu"].require(x))


def quick_gelu_backward_impl(grad_output: Tensor, x: Tensor, plan: Plan | None = None) -> Tensor:
    plan = plan or FAMILY["quick_gelu_backward"].require(grad_output, x)
    return FAMILY.kernels().run_backward(grad_output, x, plan)


def _ops():
    return torch.ops.python_native


def _cases(op: str):
    """``verify``'s cases: what model code hands the op (row slices, transposes, large magnitudes)."""
    def cases(dtype: torch.dtype, device: str):
        fn = lambda x: getattr(_ops(), op)(x)  # noqa: E731
        yield Sample("odd width", fn, [rand(3, 37, dtype=dtype, device=device, scale=4.0)])
        yield Sample("transposed", fn, [rand(33, 4, dtype=dtype, device=device).t()])
        yield Sample("row slices", fn, [rand(4, 64, dtype=dtype, device=device, scale=4.0)[:, 3:50]])
        yield Sample("large magnitudes", fn, [rand(2, 24, dtype=dtype, device=device, scale=30.0)])
    return cases


def _gelu_tanh_formula(t: dict) -> Tensor:
    """GPT-2's MLP activation as its modules write it (what the row's Inductor column compiles)."""
    x = t["x"]
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


# GPT-2's and CLIP's MLP activations; each moves x and y (backward: x, dy, dx too).
_SHAPES = ((4, 64),), ((8192, 3072), (8192, 16384))
_BENCH = {
    "gelu_tanh": BenchRow("gelu_tanh_formula", *_SHAPES, x_input(3.0), lambda t: _ops().gelu_tanh(t["x"]),
                          elementwise_bytes(2, 5), _gelu_tanh_formula),
    "quick_gelu": BenchRow("quick_gelu", *_SHAPES, x_input(3.0), lambda t: _ops().quick_gelu(t["x"]),
                           elementwise_bytes(2, 5), lambda t: t["x"] * torch.sigmoid(1.702 * t["x"])),
}

FAMILY = Family(DSL_NAME, "model_activations", [
    Op("gelu_tanh", gelu_tanh_plan_or_why, gelu_tanh_impl, ("x",), public_name="gelu_tanh", measured=False,
       lib=NAMESPACE, verify=Driver(_cases("gelu_tanh")), bench_rows=(_BENCH["gelu_tanh"],)),
    Op("gelu_tanh_backward", gelu_tanh_backward_plan_or_why, gelu_tanh_backward_impl, ("grad_output", "x"),
       public_name="gelu_tanh", backward=True, measured=False, lib=NAMESPACE, bench=("gelu_tanh_formula",)),
    Op("quick_gelu", quick_gelu_plan_or_why, quick_gelu_impl, ("x",), public_name="quick_gelu", measured=False,
       lib=NAMESPACE, verify=Driver(_cases("quick_gelu")), bench_rows=(_BENCH["quick_gelu"],)),
    Op("quick_gelu_backward", quick_gelu_backward_plan_or_why, quick_gelu_backward_impl, ("grad_output", "x"),
       public_name="quick_gelu", backward=True, measured=False, lib=NAMESPACE, bench=("quick_gelu",)),
], kernels="activations")
