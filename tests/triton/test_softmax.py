"""Softmax and log-softmax through ``F.softmax`` / ``F.log_softmax``, forward and backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_testing import DTYPES, compare, make, requires_triton, run, seeded  # noqa: F401

import python_native as pn
from conftest import CALL_PASSED
from python_native_dsls.layout import reduced_rows
from python_native_dsls.triton.ops import softmax as softmax_ops

pytestmark = requires_triton

OPS = {
    "softmax": (F.softmax, "_softmax", "_softmax_backward_data"),
    "log_softmax": (F.log_softmax, "_log_softmax", "_log_softmax_backward_data"),
}


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((5, 37), -1), ((2, 3, 128), 2), ((64, 300), 1), ((4, 19, 1), 1), ((7,), 0)])
@pytest.mark.override
def test_matches_aten(kind, dtype, shape, dim):
    fn, fwd, bwd = OPS[kind]
    compare(lambda x: fn(x, dim), [make(*shape, dtype=dtype, scale=3.0)], [fwd, bwd])


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.override
def test_long_rows_stream_in_chunks(kind, monkeypatch):
    import python_native_dsls.triton.kernels.softmax_long as softmax_long
    from python_native_dsls.triton.plans import rows as row_plans

    # Shrink the single-block limit (plans read it when built) so the long-row kernels run on a
    # small shape, and plan afresh under it.
    monkeypatch.setattr(row_plans, "MAX_ROW_BLOCK", 64)
    monkeypatch.setattr(softmax_long, "LOOP_BLOCK", 32)
    ran = []
    for name in ("forward", "backward"):
        real = getattr(softmax_long, name)
        monkeypatch.setattr(softmax_long, name, lambda *a, _real=real, _name=name: ran.append(_name) or _real(*a))
    softmax_ops.FAMILY.clear_plans()
    try:
        fn, fwd, bwd = OPS[kind]
        x = make(3, 250, scale=4.0)
        with torch.no_grad():
            x[0, :100] = float("-inf")  # a chunk holding only -inf must not poison the running sum
        compare(lambda x: fn(x, -1), [x], [fwd, bwd])
        assert {"forward", "backward"} <= set(ran)
    finally:
        softmax_ops.FAMILY.clear_plans()  # plans built under the shrunken limit must not outlive it


@pytest.mark.override
def test_strided_rows_and_transposed_input():
    fn, fwd, bwd = OPS["softmax"]
    sliced = make(8, 90, requires_grad=False)[:, 5:70].requires_grad_()
    transposed = make(40, 6, requires_grad=False).t().requires_grad_()
    compare(lambda x: fn(x, -1), [sliced], [fwd, bwd])
    compare(lambda x: fn(x, 1), [transposed], [fwd, bwd])


@pytest.mark.parametrize("case", ["float64", "inner_dim"])
@pytest.mark.override
def test_declined_inputs_fall_back(case):
    x = make(6, 20, dtype=torch.float64) if case == "float64" else make(6, 20)
    dim = -1 if case == "float64" else 0  # reducing a dim that is not innermost
    result = run(lambda x: F.softmax(x, dim), [x])
    why = "dtype float64" if case == "float64" else "dim 0 is not the last dim"
    assert result.declined("_softmax", why) and result.declined("_softmax_backward_data", why)
    assert not result.triton_events()


@pytest.mark.override
def test_switches_turn_the_override_off():
    x = make(4, 32)
    for scope, why in ((pn.triton.disabled(), "DSL triton disabled"),
                       (pn.operations_disabled("_log_softmax", "_log_softmax_backward_data"), "op _log_softmax")):
        result = run(lambda x: F.log_softmax(x, -1), [x], scope=scope)
        assert not result.triton_events()
        assert result.declined("_log_softmax", why) and result.declined("_log_softmax_backward_data", why)


@pytest.mark.parametrize("log", [False, True])
def test_half_to_float_kernels(log):
    """fp16 in, fp32 out: the CUDA-only ``half_to_float`` path, run directly on the kernels."""
    x = make(6, 50, dtype=torch.float16, requires_grad=False, scale=3.0)
    forward = softmax_ops.log_softmax_impl if log else softmax_ops.softmax_impl
    backward = softmax_ops.log_softmax_backward_impl if log else softmax_ops.softmax_backward_impl
    ref_fn = torch.log_softmax if log else torch.softmax
    y = forward(x, 1, True)
    assert y.dtype == torch.float32
    with pn.triton.disabled():
        torch.testing.assert_close(y, ref_fn(x.float(), 1))
    dy = torch.randn(6, 50, device=x.device)
    dx = backward(dy, y, 1, torch.float16)
    with pn.triton.disabled():
        ref = torch.ops.aten._log_softmax_backward_data if log else torch.ops.aten._softmax_backward_data
        torch.testing.assert_close(dx, ref(dy, y, 1, torch.float32).half())
    # Only CUDA has the half_to_float conversion; elsewhere the cond leaves it to aten.
    assert bool(softmax_ops.FAMILY["_softmax"].cond(x, 1, True)) == (x.device.type == "cuda")


def test_reduced_rows_views():
    x = torch.empty(2, 3, 5, 1)
    assert reduced_rows(x, 2) == (6, 5, 5, 1)
    assert reduced_rows(x, -2) == (6, 5, 5, 1)
    assert reduced_rows(x, 1) is None  # later dims are not all of size 1
    assert reduced_rows(x.transpose(0, 1), 2) is None  # leading dims do not collapse
    assert reduced_rows(torch.empty(4, 8).t(), 1) == (8, 4, 1, 8)


@pytest.fixture
def long_row_limits(monkeypatch, request):
    """Lower the long-row limits so that small shapes take each long-row path (and check they did)."""
    import python_native_dsls.triton.kernels.softmax_long as softmax_long
    from python_native_dsls.triton.kernels import tuning
    from python_native_dsls.triton.plans import rows as row_plans

    ran = []
    for name in ("forward", "backward"):
        real = getattr(softmax_long, name)
        monkeypatch.setattr(softmax_long, name, lambda *a, _real=real, _name=name: ran.append(_name) or _real(*a))

    def lower(single_max: int, slice_cols: int, max_slices: int = tuning.SOFTMAX_MAX_SLICES) -> None:
        monkeypatch.setattr(row_plans, "MAX_ROW_BLOCK", 32)  # rows past 32 are long rows (read when planning)
        monkeypatch.setattr(tuning, "SOFTMAX_SINGLE_MAX", single_max)
        monkeypatch.setattr(tuning, "SOFTMAX_SLICE", slice_cols)
        monkeypatch.setattr(tuning, "SOFTMAX_MAX_SLICES", max_slices)
        softmax_ops.FAMILY.clear_plans()

    yield lower
    softmax_ops.FAMILY.clear_plans()  # plans built under the lowered limit must not outlive it
    if request.node.stash.get(CALL_PASSED, False):  # a failed test has said what went wrong
        assert {"forward", "backward"} <= set(ran), "the long-row kernels never ran"


def _with_inf(x: torch.Tensor, slice_cols: int) -> torch.Tensor:
    """-inf over the first slice of one row and scattered over another."""
    x = x.detach().clone()
    x[0, :slice_cols] = float("-inf")
    x[-1, 3::7] = float("-inf")
    return x.requires_grad_()


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.override
def test_wide_rows_held_whole_by_one_program(kind, dtype):
    fn, fwd, bwd = OPS[kind]
    x = make(2, 20001, dtype=dtype, scale=4.0)
    with torch.no_grad():
        x[1, :5000] = float("-inf")
    compare(lambda x: fn(x, -1), [x], [fwd, bwd])


@pytest.mark.parametrize("kind,dtype", [("softmax", torch.bfloat16), ("log_softmax", torch.float32)])
@pytest.mark.override
def test_vocabulary_rows_split_across_programs(kind, dtype):
    """Past the single-program limit (default limits): rows cut into slices, partials merged."""
    fn, fwd, bwd = OPS[kind]
    x = make(2, 70001, dtype=dtype, scale=4.0, requires_grad=False)
    with torch.no_grad():
        x[1, 16384:32768] = float("-inf")  # a whole slice of -inf
    compare(lambda x: fn(x, -1), [x.requires_grad_()], [fwd, bwd])


@pytest.mark.slow  # 37 rows x 8 slices per dtype in the interpreter; the split path is also covered below
@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_split_rows_many_rows_and_infinities(kind, dtype, long_row_limits):
    long_row_limits(single_max=64, slice_cols=128)
    fn, fwd, bwd = OPS[kind]
    x = _with_inf(make(37, 1000, dtype=dtype, scale=4.0), 128)  # 8 slices, the last one partial
    compare(lambda x: fn(x, -1), [x], [fwd, bwd])


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.parametrize("limits", [(64, 128, 1024), (64, 32, 4), (16384, 16384, 1024)])
@pytest.mark.override
def test_rows_of_only_minus_infinity_are_nan_like_aten(kind, limits, long_row_limits):
    """On the split (lowered limits), streamed (too many slices) and whole-row paths."""
    long_row_limits(*limits)
    fn, fwd, bwd = OPS[kind]
    x = make(3, 300, scale=4.0, requires_grad=False)
    x[1] = float("-inf")
    got = run(lambda x: fn(x, -1), [x.requires_grad_()])
    ref = run(lambda x: fn(x, -1), [x], scope=pn.triton.disabled())
    assert got.overridden(fwd) and got.overridden(bwd)
    for g, r in ((got.out, ref.out), (got.grads[0], ref.grads[0])):
        assert g[1].isnan().all() and r[1].isnan().all()
        torch.testing.assert_close(g[::2], r[::2])


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.override
def test_split_rows_strided_inputs(kind, long_row_limits):
    long_row_limits(single_max=64, slice_cols=64)
    fn, fwd, bwd = OPS[kind]
    sliced = make(6, 400, requires_grad=False)[:, 7:300].requires_grad_()
    transposed = make(300, 5, requires_grad=False).t().requires_grad_()
    compare(lambda x: fn(x, -1), [sliced], [fwd, bwd])
    compare(lambda x: fn(x, 1), [transposed], [fwd, bwd])


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.override
def test_rows_with_too_many_slices_stream(kind, long_row_limits):
    long_row_limits(single_max=64, slice_cols=32, max_slices=4)
    fn, fwd, bwd = OPS[kind]
    compare(lambda x: fn(x, -1), [_with_inf(make(5, 300, scale=4.0), 32)], [fwd, bwd])


@pytest.mark.parametrize("kind", OPS)
@pytest.mark.override
def test_wide_single_program_rows_with_lowered_limit(kind, long_row_limits):
    """Rows between the packed kernels' limit and the single-program limit, many of them."""
    long_row_limits(single_max=512, slice_cols=128)
    fn, fwd, bwd = OPS[kind]
    compare(lambda x: fn(x, -1), [_with_inf(make(33, 300, scale=4.0), 64)], [fwd, bwd])
