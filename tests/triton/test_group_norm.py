"""Group norm through ``F.group_norm``: forward and backward on the Triton kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_testing import (  # noqa: F401
    DEVICE,
    DTYPES,
    assert_routed,
    compare,
    make,
    requires_triton,
    run,
    seeded,
    unmeasured_installed,
)

import python_native as pn

pytestmark = [requires_triton, pytest.mark.usefixtures("unmeasured_installed")]

FWD, BWD = "native_group_norm", "native_group_norm_backward"
CL, CL3D = torch.channels_last, torch.channels_last_3d


def _input(shape, dtype=torch.float32, layout=torch.contiguous_format, scale=1.0):
    x = make(*shape, dtype=dtype, requires_grad=False, scale=scale).contiguous(memory_format=layout)
    return x.requires_grad_()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups,layout", [
    ((2, 6, 5, 7), 3, torch.contiguous_format),
    ((2, 8, 6, 6), 4, CL),
    ((2, 4, 3, 3, 3), 2, CL3D),
    ((3, 6, 10), 6, torch.contiguous_format),
    ((4, 12), 3, torch.contiguous_format),
])
@pytest.mark.override
def test_affine_matches_aten(shape, groups, layout, dtype):
    x, w, b = _input(shape, dtype, layout), make(shape[1], dtype=dtype), make(shape[1], dtype=dtype)
    got = compare(lambda x, w, b: F.group_norm(x, groups, w, b), [x, w, b], [FWD, BWD])
    ref = F.group_norm(x.detach(), groups, w.detach(), b.detach())
    assert got.out.stride() == ref.stride() and got.grads[0].stride() == x.stride()  # aten's formats


def _reference(x, groups, w=None, b=None, eps=1e-5):
    """Group norm from plain torch ops (for what aten's CPU kernel cannot do)."""
    n, c = x.shape[:2]
    var, mean = torch.var_mean(x.reshape(n, groups, -1), -1, unbiased=False, keepdim=True)
    y = ((x.reshape(n, groups, -1) - mean) * torch.rsqrt(var + eps)).reshape(x.shape)
    shape = [1, c] + [1] * (x.ndim - 2)
    y = y if w is None else y * w.view(shape)
    return y if b is None else y + b.view(shape)


@pytest.mark.parametrize("params", ["none", "weight"])
@pytest.mark.override
def test_optional_parameters(params):
    x = _input((2, 8, 4, 4), layout=CL)
    if params == "weight":
        compare(lambda x, w: F.group_norm(x, 2, w), [x, make(8)], [FWD, BWD])
    else:
        compare(lambda x: F.group_norm(x, 2), [x], [FWD, BWD])


@pytest.mark.override(aten_raises=RuntimeError)  # aten's kernel cannot take this call
def test_bias_without_weight():
    """A bias gradient without a weight: aten's CPU kernel fails there ("tensor does not have a
    device"); the override returns the gradient, checked against plain torch ops in float64."""
    x, b = _input((2, 8, 4, 4), layout=CL), make(8)
    dy = make(2, 8, 4, 4, requires_grad=False)
    got = run(lambda x, b: F.group_norm(x, 2, None, b), [x, b], dy)
    assert got.overridden(FWD) and got.overridden(BWD)
    wide = [t.detach().double().requires_grad_() for t in (x, b)]
    _reference(wide[0], 2, None, wide[1]).backward(dy.double())
    torch.testing.assert_close(got.out, _reference(x.detach(), 2, None, b.detach()))
    for g, r in zip(got.grads, wide, strict=True):
        torch.testing.assert_close(g, r.grad.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.override
def test_statistics_shaped_like_aten():
    x, w = make(3, 8, 5, 5, dtype=torch.bfloat16, requires_grad=False), make(8, dtype=torch.bfloat16)
    args = (x, w.detach(), None, 3, 8, 25, 4, 1e-5)
    with pn.trace() as t:
        got = torch.ops.aten.native_group_norm(*args)
    with pn.triton.disabled():
        ref = torch.ops.aten.native_group_norm(*args)
    assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == FWD}
    for g, r in zip(got, ref, strict=True):
        assert g.shape == r.shape and g.dtype == r.dtype and g.stride() == r.stride()
        torch.testing.assert_close(g, r, atol=1e-2, rtol=1.6e-2)


@pytest.mark.parametrize("mask", [(True, False, False), (False, True, True), (True, True, False), (False, False, True)])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.override(aten_raises=RuntimeError)  # without a weight, aten's kernel cannot give parameter gradients
def test_backward_respects_output_mask(mask, with_weight):
    x = make(2, 6, 4, 4, requires_grad=False)
    w = make(6, requires_grad=False) if with_weight else None
    _, mean, rstd = torch.ops.aten.native_group_norm(x, w, None, 2, 6, 16, 3, 1e-5)
    dy = make(2, 6, 4, 4, requires_grad=False)
    args = (dy, x, mean, rstd, w, 2, 6, 16, 3, list(mask))
    with pn.trace() as t:
        got = torch.ops.aten.native_group_norm_backward(*args)
    assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == BWD}
    if with_weight or not (mask[1] or mask[2]):
        with pn.triton.disabled():
            ref = torch.ops.aten.native_group_norm_backward(*args)
    else:  # aten's CPU kernel fails on parameter gradients without a weight: plain torch ops instead
        wide = [t.double().requires_grad_() for t in (x, torch.ones(6, device=DEVICE), torch.zeros(6, device=DEVICE))]
        _reference(*wide[:1], 3, *wide[1:]).backward(dy.double())
        ref = [t.grad.float() if wanted else None for t, wanted in zip(wide, mask, strict=True)]
    for g, r, wanted in zip(got, ref, mask, strict=True):
        assert (g is None) == (r is None) == (not wanted)
        if wanted:
            assert g.dtype == r.dtype and g.shape == r.shape
            torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


@pytest.mark.override
def test_expanded_and_differently_laid_out_gradients():
    """``y.sum().backward()`` hands the backward an expanded gradient; a channels-last input may
    get a contiguous one: both stay on the kernels, strided as they come."""
    x, w = _input((2, 8, 5, 5), layout=CL), make(8)
    got = run(lambda x, w: F.group_norm(x, 4, w).sum(), [x, w])
    ref = run(lambda x, w: F.group_norm(x, 4, w).sum(), [x, w], scope=pn.triton.disabled())
    assert got.overridden(BWD)
    for g, r in zip(got.grads, ref.grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)
    compare(lambda x: F.group_norm(x, 2) * 1.0, [x], [FWD, BWD])  # contiguous grad of a channels-last y


@pytest.mark.override
def test_long_groups_split_their_statistics(monkeypatch):
    """Small tiles and many programs wanted: each group's statistics and each channel's sums come
    from several programs, combined afterwards."""
    from python_native_dsls.triton.ops import group_norm as ops
    from python_native_dsls.triton.plans import group_norm as plans

    monkeypatch.setattr(plans, "TILE", {dtype: 64 for dtype in plans.TILE})
    monkeypatch.setattr(plans, "programs_wanted", lambda device: 64)
    ops.FAMILY.clear_plans()
    try:
        for layout in (torch.contiguous_format, CL):
            x, w, b = _input((2, 8, 9, 9), layout=layout, scale=3.0), make(8), make(8)
            plan = plans.group_norm_plan(x, 2, 8, 81, 2)
            assert plan.splits > 1 and plan.sum_splits > 1, plan
            compare(lambda x, w, b: F.group_norm(x, 2, w, b), [x, w, b], [FWD, BWD])
    finally:
        ops.FAMILY.clear_plans()


@pytest.mark.override
def test_large_mean_small_spread():
    """Statistics relative to a shift, deviations from each tile's own mean: a mean 10^4 times
    the spread cancels nothing in the output. The input gradient then hinges on the fp32 rounding
    of the saved mean (the same for aten): judged as a whole, no further from float64 than aten's."""
    from python_native.tools.verify import max_error

    x = (make(2, 4, 16, 16, requires_grad=False) * 1e-1 + 1e3).requires_grad_()
    dy = make(2, 4, 16, 16, requires_grad=False)
    got = run(lambda x: F.group_norm(x, 2), [x], dy)
    ref = run(lambda x: F.group_norm(x, 2), [x], dy, scope=pn.triton.disabled())
    truth = run(lambda x: F.group_norm(x, 2), [x.detach().double().requires_grad_()], dy.double(),
                scope=pn.triton.disabled())
    assert got.overridden(FWD) and got.overridden(BWD)
    assert max_error(got.out, truth.out) <= max_error(ref.out, truth.out)
    assert max_error(got.grads[0], truth.grads[0]) <= 1.1 * max_error(ref.grads[0], truth.grads[0])


@pytest.mark.override
def test_negative_eps_gives_nan_as_aten():
    x = make(2, 4, 3, 3, requires_grad=False)
    args = (x, None, None, 2, 4, 9, 2, -10.0)
    with pn.trace() as t:
        got = torch.ops.aten.native_group_norm(*args)
    assert_routed(t.events, {FWD: None}, "eps = -10")
    with pn.triton.disabled():
        ref = torch.ops.aten.native_group_norm(*args)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, equal_nan=True)


@pytest.mark.override
def test_out_form():
    x, w, b = make(2, 6, 4, 4, requires_grad=False), make(6, requires_grad=False), make(6, requires_grad=False)
    outs = [torch.empty(0, device=DEVICE) for _ in range(3)]
    with pn.trace() as t:
        torch.ops.aten.native_group_norm.out(x, w, b, 2, 6, 16, 3, 1e-5, out0=outs[0], out1=outs[1], out2=outs[2])
    assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == "native_group_norm.out"}
    with pn.triton.disabled():
        ref = torch.ops.aten.native_group_norm(x, w, b, 2, 6, 16, 3, 1e-5)
    for g, r in zip(outs, ref, strict=True):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("case", ["float64", "mixed_weight_dtype", "empty_batch"])
@pytest.mark.override
def test_declined_inputs_fall_back(case):
    x, w = make(2, 8, 3, 3), make(8)
    if case == "float64":
        x, w = make(2, 8, 3, 3, dtype=torch.float64), make(8, dtype=torch.float64)
    elif case == "mixed_weight_dtype":
        x = make(2, 8, 3, 3, dtype=torch.bfloat16)
    elif case == "empty_batch":
        x = make(0, 8, 3, 3)
    try:
        with pn.triton.disabled():
            F.group_norm(x.detach(), 4, w.detach())
    except RuntimeError as error:  # aten's CUDA kernel refuses a weight of another dtype than the input
        aten_error = str(error)
    else:
        aten_error = None
    if case == "mixed_weight_dtype" and aten_error is not None:
        with pn.trace() as t, pytest.raises(RuntimeError) as error:
            F.group_norm(x, 4, w)
        assert str(error.value) == aten_error  # declined: aten's own error, not one of the kernel's
        outcomes = {(e.dsl, e.outcome) for e in t.events if e.op == FWD}
        assert outcomes == {(None, "fallback")} and not [e for e in t.events if e.dsl == "triton"]
        return
    assert aten_error is None, aten_error
    result = run(lambda x, w: F.group_norm(x, 4, w), [x, w])
    assert result.fell_back(FWD) and not result.triton_events()


@pytest.mark.override
def test_groups_that_do_not_divide_get_atens_error():
    x = make(2, 8, 3, 3, requires_grad=False)
    with pn.triton.disabled(), pytest.raises(RuntimeError) as aten_error:
        torch.ops.aten.native_group_norm(x, None, None, 2, 8, 9, 3, 1e-5)
    with pn.trace() as t, pytest.raises(RuntimeError) as error:
        torch.ops.aten.native_group_norm(x, None, None, 2, 8, 9, 3, 1e-5)
    assert str(error.value) == str(aten_error.value) and "divisible" in str(error.value)
    assert_routed(t.events, {FWD: "C = 8 is not divisible by group = 3"}, "3 groups of 8 channels")


@pytest.mark.override
def test_non_dense_input_gets_atens_error():
    x = make(2, 8, 6, 6, requires_grad=False)[:, :, ::2]
    with pn.triton.disabled(), pytest.raises(RuntimeError) as aten_error:
        torch.ops.aten.native_group_norm(x, None, None, 2, 8, 18, 2, 1e-5)
    with pn.trace() as t, pytest.raises(RuntimeError) as error:
        torch.ops.aten.native_group_norm(x, None, None, 2, 8, 18, 2, 1e-5)
    assert str(error.value) == str(aten_error.value)
    assert_routed(t.events, {FWD: "layout: not dense"}, "a gappy input")


@pytest.mark.override
def test_switches_and_listing():
    assert {FWD, BWD, "native_group_norm.out"} <= set(pn.get_dsl_operations("triton"))
    x, w = make(2, 4, 3, 3), make(4)
    assert run(lambda x, w: F.group_norm(x, 2, w), [x, w]).overridden(FWD)
    for scope in (pn.triton.disabled(), pn.operations_disabled(FWD, BWD)):
        result = run(lambda x, w: F.group_norm(x, 2, w), [x, w], scope=scope)
        assert not result.triton_events()
        assert result.fell_back(FWD) and result.fell_back(BWD)

