"""Layer norm through ``F.layer_norm``: forward and backward on the Triton kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_testing import DTYPES, Run, assert_routed, compare, lower_register_max, make, requires_triton, run, seeded  # noqa: F401

import python_native as pn

pytestmark = requires_triton

FWD, BWD = "native_layer_norm", "native_layer_norm_backward"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 33), (2, 5, 128), (64, 300), (3, 1)])
@pytest.mark.override
def test_affine_matches_aten(shape, dtype):
    n = shape[-1]
    x, w, b = make(*shape, dtype=dtype), make(n, dtype=dtype), make(n, dtype=dtype)
    compare(lambda x, w, b: F.layer_norm(x, (n,), w, b, eps=1e-5), [x, w, b], [FWD, BWD])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.override
def test_without_affine_over_two_dims(dtype):
    x = make(3, 6, 50, dtype=dtype)
    compare(lambda x: F.layer_norm(x, (6, 50)), [x], [FWD, BWD])


@pytest.mark.override
def test_weight_without_bias():
    x, w = make(8, 96), make(96)
    compare(lambda x, w: F.layer_norm(x, (96,), w, None), [x, w], [FWD, BWD])


@pytest.mark.override
def test_strided_rows_and_columns_stay_on_triton():
    rows_of_wider_buffer = make(16, 200, requires_grad=False)[:, :130].requires_grad_()  # row stride 200
    transposed = make(70, 9, requires_grad=False).t().requires_grad_()  # column stride 9
    w = make(130)
    compare(lambda x, w: F.layer_norm(x, (130,), w), [rows_of_wider_buffer, w], [FWD, BWD])
    compare(lambda x: F.layer_norm(x, (70,)), [transposed], [FWD, BWD])


@pytest.mark.parametrize(
    "case",
    ["float64", "mixed_weight_dtype", "permuted_leading_dims"],
)
@pytest.mark.override
def test_declined_inputs_fall_back(case):
    if case == "float64":
        x, w = make(4, 32, dtype=torch.float64), make(32, dtype=torch.float64)
    elif case == "mixed_weight_dtype":
        x, w = make(4, 32, dtype=torch.bfloat16), make(32)
    else:
        x, w = make(3, 4, 32, requires_grad=False).permute(1, 0, 2).requires_grad_(), make(32)
    if case == "mixed_weight_dtype" and x.device.type == "cuda":
        # aten's CPU kernel accepts half-precision input with fp32 parameters; its CUDA kernel
        # reads the parameters in the input's dtype and rejects the pair. Declined, the call
        # behaves as aten does on the device: the same error.
        with pn.triton.disabled(), pytest.raises(RuntimeError) as aten_error:
            F.layer_norm(x, (32,), w)
        with pn.trace() as trace, pytest.raises(RuntimeError) as error:
            F.layer_norm(x, (32,), w)
        assert str(error.value) == str(aten_error.value)
        result = Run(None, [], list(trace.events))
    else:
        result = run(lambda x, w: F.layer_norm(x, (32,), w), [x, w])
    assert result.fell_back(FWD)
    assert not result.triton_events()


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, True), (True, True, False)])
@pytest.mark.override
def test_backward_respects_output_mask(mask):
    x, w, b = make(6, 40, requires_grad=False), make(40, requires_grad=False), make(40, requires_grad=False)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [40], w, b, 1e-5)
    dy = make(6, 40, requires_grad=False)
    args = (dy, x, [40], mean, rstd, w, b, list(mask))
    with pn.trace() as t:
        got = torch.ops.aten.native_layer_norm_backward(*args)
    with pn.operations_disabled(BWD):
        ref = torch.ops.aten.native_layer_norm_backward(*args)
    assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == BWD}
    for g, r, wanted in zip(got, ref, mask, strict=True):
        assert (g is None) == (not wanted)
        if wanted:
            torch.testing.assert_close(g, r)


@pytest.mark.override
def test_statistics_shaped_like_aten():
    x = make(2, 3, 4, 24, requires_grad=False)
    with pn.trace() as t:
        got = torch.ops.aten.native_layer_norm(x, [4, 24], None, None, 1e-5)
    assert_routed(t.events, {FWD: None}, "two normalized dims")
    with pn.triton.disabled():
        ref = torch.ops.aten.native_layer_norm(x, [4, 24], None, None, 1e-5)
    for g, r in zip(got, ref, strict=True):
        assert g.shape == r.shape and g.dtype == r.dtype
        torch.testing.assert_close(g, r)


@pytest.mark.override
def test_switches_turn_the_override_off():
    x, w = make(4, 32), make(32)
    for scope in (pn.triton.disabled(), pn.operations_disabled(FWD, BWD)):
        result = run(lambda x, w: F.layer_norm(x, (32,), w), [x, w], scope=scope)
        assert not result.triton_events()
        assert result.fell_back(FWD) and result.fell_back(BWD)


@pytest.mark.parametrize("n,dtype", [(20000, torch.float32), (20000, torch.float16), (24577, torch.bfloat16)])
@pytest.mark.override
def test_rows_wider_than_a_register_tile_stream_the_backward(n, dtype):
    """Past the forward's limit the forward falls back, the backward streams column chunks."""
    x, w, b = make(2, n, dtype=dtype), make(n, dtype=dtype), make(n, dtype=dtype)
    compare(lambda x, w, b: F.layer_norm(x, (n,), w, b), [x, w, b], [BWD])


@pytest.mark.parametrize("register_max", [16384, 64])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.override
def test_many_rows_fold_weight_gradients_from_several_programs(register_max, dtype, monkeypatch):
    """Enough rows for several persistent programs (uneven row blocks), on both backward paths:
    the register path, and the streamed one with the register limit lowered."""
    paths = lower_register_max(monkeypatch, register_max)
    x, w, b = make(101, 257, dtype=dtype), make(257, dtype=dtype), make(257, dtype=dtype)
    compare(lambda x, w, b: F.layer_norm(x, (257,), w, b), [x, w, b], [FWD, BWD])
    assert set(paths) == {"rows" if register_max >= 257 else "columns"}


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, True), (False, False, True)])
@pytest.mark.override
def test_streamed_backward_respects_output_mask(mask, monkeypatch):
    paths = lower_register_max(monkeypatch, 32)
    x, w, b = make(37, 90, requires_grad=False), make(90, requires_grad=False), make(90, requires_grad=False)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [90], w, b, 1e-5)
    dy = make(37, 90, requires_grad=False)
    args = (dy, x, [90], mean, rstd, w, b, list(mask))
    got = torch.ops.aten.native_layer_norm_backward(*args)
    with pn.operations_disabled(BWD):
        ref = torch.ops.aten.native_layer_norm_backward(*args)
    for g, r, wanted in zip(got, ref, mask, strict=True):
        assert (g is None) == (not wanted)
        if wanted:
            torch.testing.assert_close(g, r)
    assert set(paths) == {"columns"}


@pytest.mark.override
def test_streamed_backward_of_strided_rows(monkeypatch):
    paths = lower_register_max(monkeypatch, 64)
    rows_of_wider_buffer = make(40, 300, requires_grad=False)[:, :130].requires_grad_()
    transposed = make(150, 9, requires_grad=False).t().requires_grad_()
    compare(lambda x, w: F.layer_norm(x, (130,), w), [rows_of_wider_buffer, make(130)], [FWD, BWD])
    compare(lambda x: F.layer_norm(x, (150,)), [transposed], [FWD, BWD])
    assert set(paths) == {"columns"}
