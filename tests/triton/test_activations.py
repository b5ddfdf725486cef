"""SiLU and GELU (exact and tanh) through ``torch.nn.functional``, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_testing import DEVICE, DTYPES, compare, make, requires_triton, run, seeded  # noqa: F401

import python_native as pn

pytestmark = requires_triton

ACTIVATIONS = {
    "silu": (F.silu, "silu", "silu_backward"),
    "gelu": (F.gelu, "gelu", "gelu_backward"),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "gelu", "gelu_backward"),
}


@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 77), (5000,)])
@pytest.mark.override
def test_matches_aten(name, dtype, shape):
    fn, fwd, bwd = ACTIVATIONS[name]
    compare(fn, [make(*shape, dtype=dtype, scale=4.0)], [fwd, bwd])


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's numpy
@pytest.mark.parametrize("name", ACTIVATIONS)
@pytest.mark.override
def test_extreme_inputs(name):
    fn, fwd, bwd = ACTIVATIONS[name]
    values = [-1e4, -100.0, -20.0, -5.0, -1e-6, 0.0, 1e-6, 5.0, 20.0, 100.0, 1e4]
    x = torch.tensor(values, device=DEVICE).requires_grad_()
    compare(fn, [x], [fwd, bwd])


@pytest.mark.parametrize("layout", ["channels_last", "transposed"])
@pytest.mark.override
def test_dense_permuted_layouts_stay_on_triton(layout):
    if layout == "channels_last":
        x = make(2, 6, 5, 3, requires_grad=False).to(memory_format=torch.channels_last).requires_grad_()
    else:
        x = make(30, 7, requires_grad=False).t().requires_grad_()
    fn, fwd, bwd = ACTIVATIONS["gelu"]
    got = compare(fn, [x], [fwd, bwd])
    assert got.out.stride() == x.stride()  # aten keeps a dense input's layout; so do the kernels


@pytest.mark.parametrize("case", ["float64", "gappy_view"])
@pytest.mark.override
def test_declined_inputs_fall_back(case):
    if case == "float64":
        x = make(4, 10, dtype=torch.float64)
    else:
        x = make(4, 20, requires_grad=False)[:, ::2].requires_grad_()
    result = run(F.silu, [x])
    why = "dtype float64" if case == "float64" else "layout: neither dense nor rows with a contiguous last dim"
    assert result.declined("silu", why) and result.declined("silu_backward", why) and not result.triton_events()


@pytest.mark.override
def test_switches_turn_the_override_off():
    x = make(4, 32)
    for scope, why in ((pn.triton.disabled(), "DSL triton disabled"),
                       (pn.operations_disabled("gelu", "gelu_backward"), "op gelu")):
        result = run(F.gelu, [x], scope=scope)
        assert not result.triton_events()
        assert result.declined("gelu", why) and result.declined("gelu_backward", why)


@pytest.mark.parametrize("name", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.override
def test_row_views_stay_on_triton(name, dtype):
    """The halves of a fused projection (rows at a stride, the last dim contiguous), forward and backward."""
    fn, fwd, bwd = ACTIVATIONS[name]
    gate_up = make(3, 2, 2 * 37, dtype=dtype, scale=3.0)
    got = compare(lambda t: fn(t.chunk(2, -1)[0]) * t.chunk(2, -1)[1], [gate_up], [fwd, bwd])
    assert got.out.is_contiguous()
