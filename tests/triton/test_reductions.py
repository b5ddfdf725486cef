"""Reductions over one dim through the public torch calls: values, indices, dtypes, shapes and
gradients equal aten's, NaN, infinities and ties exactly as aten orders them."""

from __future__ import annotations

import pytest
import torch
from triton_testing import DEVICE, DTYPES, assert_matches, compare, make, requires_triton, run, seeded  # noqa: F401

import python_native as pn

pytestmark = [requires_triton, pytest.mark.override]

NAN, INF = float("nan"), float("inf")
INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)

# name -> (public call, aten op it reaches)
CALLS = {
    "sum": (lambda x, d, k: x.sum(d, keepdim=k), "sum.dim_IntList"),
    "mean": (lambda x, d, k: x.mean(d, keepdim=k), "mean.dim"),
    "prod": (lambda x, d, k: x.prod(d, keepdim=k), "prod.dim_int"),
    "amax": (lambda x, d, k: x.amax(d, keepdim=k), "amax"),
    "amin": (lambda x, d, k: torch.amin(x, d, keepdim=k), "amin"),
    "argmax": (lambda x, d, k: x.argmax(d, keepdim=k), "argmax"),
    "argmin": (lambda x, d, k: torch.argmin(x, dim=d, keepdim=k), "argmin"),
    "max": (lambda x, d, k: tuple(torch.max(x, d, keepdim=k)), "max.dim"),
    "min": (lambda x, d, k: tuple(x.min(dim=d, keepdim=k)), "min.dim"),
}
ORDERED = ("amax", "amin", "argmax", "argmin", "max", "min")


def both(fn, *args):
    """``fn(*args)`` with the overrides (and the trace of it) and under ``pn.triton.disabled()``."""
    with pn.trace() as t:
        got = fn(*args)
    with pn.triton.disabled():
        ref = fn(*args)
    return got, ref, t


def assert_same(got, ref, truth=None) -> None:
    """Equal dtypes and shapes; values equal (NaN where aten has NaN), or, given the float64
    ``truth``, within ``verify``'s rule (close to aten's, or no further from the truth)."""
    if isinstance(ref, tuple):
        for g, r in zip(got, ref, strict=True):
            assert_same(g, r)
        return
    assert (got.dtype, got.shape) == (ref.dtype, ref.shape)
    if truth is None or not ref.is_floating_point():
        assert torch.equal(got.isnan(), ref.isnan()) if ref.is_floating_point() else True
        assert torch.equal(got.nan_to_num(), ref.nan_to_num()), (got, ref)
    elif ref.dtype == torch.float64:  # no wider truth: equal up to summation order
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12, equal_nan=True)
    else:
        assert_matches(got, ref, truth, "values")


def check(name: str, x: torch.Tensor, dim: int, keepdim: bool = False):
    fn, op = CALLS[name]
    got, ref, t = both(fn, x, dim, keepdim)
    assert op in t.ops("override"), f"{name}: {[(e.op, e.outcome) for e in t.events]}"
    if name in ORDERED or not x.is_floating_point():
        assert_same(got, ref)
    else:
        with pn.triton.disabled():
            assert_same(got, ref, fn(x.double(), dim, keepdim))
    return got


# fp64 takes the fp32 paths with a wider accumulator: one shape shows it.
FLOAT_CASES = [(dtype, shape, dim) for dtype in DTYPES for shape, dim in
               [((5, 37), -1), ((5, 37), 0), ((2, 3, 9), 1), ((3, 4, 1), 1)]] + [(torch.float64, (5, 37), -1)]


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("dtype,shape,dim", FLOAT_CASES)
def test_float_values_match_aten(name, dtype, shape, dim):
    x = make(*shape, dtype=dtype, requires_grad=False, scale=3.0)
    if name == "prod":
        x = (torch.rand(*shape, device=DEVICE) + 0.5).to(dtype)
    check(name, x, dim, keepdim=len(shape) == 3)


@pytest.mark.parametrize("name", [n for n in CALLS if n != "mean"])
@pytest.mark.parametrize("dtype", INTS)
def test_integers_match_aten_exactly(name, dtype):
    x = torch.randint(0, 100 if dtype == torch.uint8 else 50, (4, 33), device=DEVICE).to(dtype)
    if dtype != torch.uint8:
        x -= 25
    for dim in (1, 0):
        got = check(name, x, dim, keepdim=dim == 0)
    if name in ("sum", "prod"):
        assert got.dtype == torch.int64  # aten's integer sums and products


def test_integer_sums_wrap_as_aten_does():
    big = torch.full((3, 40), 2**62, dtype=torch.int64, device=DEVICE)
    check("sum", big, 1)
    check("prod", torch.full((2, 70), 3, dtype=torch.int32, device=DEVICE), 1)
    fn = lambda x: x.sum(1, dtype=torch.int8)  # noqa: E731
    got, ref, t = both(fn, torch.full((2, 9), 100, dtype=torch.int16, device=DEVICE))
    assert "sum.dim_IntList" in t.ops("override") and got.dtype == torch.int8 and torch.equal(got, ref)


def test_bool_sums_and_products_count_as_int64():
    x = torch.rand(6, 19, device=DEVICE) > 0.5
    assert check("sum", x, 1).dtype == torch.int64
    check("prod", x, 0)


@pytest.mark.parametrize("dtype", (*DTYPES, torch.float64))
@pytest.mark.parametrize("name", ORDERED)
def test_nan_inf_and_ties_follow_aten(name, dtype):
    """NaN wins (its first index), infinities order as numbers, all-NaN and all--inf rows, ties pick
    the first index: checked along rows and along columns."""
    rows = torch.tensor([
        [1.0, NAN, 3.0, NAN, 2.0, 0.0],
        [NAN] * 6,
        [-INF] * 6,
        [INF] * 6,
        [INF, 2.0, INF, 1.0, -INF, -INF],
        [2.0, 5.0, 5.0, 1.0, 1.0, 5.0],
        [-INF, NAN, INF, 0.0, -0.0, 0.0],
        [-0.0, 0.0, -0.0, 0.0, 0.0, -0.0],
    ], device=DEVICE).to(dtype)
    check(name, rows, 1)
    check(name, rows, 0, keepdim=True)
    check(name, rows.t().contiguous().t(), 1)  # column-major: rows strided in memory


@pytest.mark.parametrize("name", CALLS)
def test_strided_transposed_and_expanded_inputs(name):
    base = make(6, 40, requires_grad=False, scale=2.0)
    if name == "prod":
        base = torch.rand(6, 40, device=DEVICE) + 0.5
    sliced = base[:, 3:30:3]  # strided rows of a wider buffer
    for x in (sliced, sliced.t(), base.t(), base[:, :1].expand(6, 9), base.view(6, 4, 10)[1:4]):
        for dim in range(x.ndim):
            check(name, x, dim)
    check(name, base.view(2, 3, 40).transpose(0, 2), 1)  # the dims on either side each collapse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["sum", "mean", "amax", "amin", "max", "prod"])
def test_gradients_equal_aten(name, dtype):
    """The forward overrides keep aten's derivative formulas (their ops may route to overrides too)."""
    fn, op = CALLS[name]
    x = make(4, 3, 17, dtype=dtype, scale=2.0)
    if name == "prod":
        x = (torch.rand(4, 3, 17, device=DEVICE) + 0.5).to(dtype).requires_grad_()

    def call(t: torch.Tensor, dim: int, keepdim: bool) -> torch.Tensor:
        out = fn(t, dim, keepdim)
        return out[0] if name == "max" else out

    for dim, keepdim in ((-1, False), (1, True)):
        compare(lambda t, dim=dim, keepdim=keepdim: call(t, dim, keepdim), [x], [op])
    if name in ("amax", "max"):  # ties share amax's gradient; max.dim's goes to the first index
        tied = x.detach().clone()
        tied[..., 5] = tied[..., 2] = tied.amax(-1) + 1
        compare(lambda t: call(t, -1, False), [tied.requires_grad_()], [op])


def test_amax_backward_routes_its_mask_count_to_the_sum_override():
    x = make(3, 8)
    result = run(lambda t: t.amax(-1), [x])
    assert result.overridden("amax") and result.overridden("sum.dim_IntList")


@pytest.mark.parametrize("src, dtype", [
    (torch.float16, torch.float32), (torch.bfloat16, torch.float64), (torch.float32, torch.float64),
    (torch.float32, torch.bfloat16), (torch.float32, torch.float16), (torch.float64, torch.float32),
    (torch.float16, torch.bfloat16), (torch.int32, torch.float32), (torch.int64, torch.float64),
    (torch.int8, torch.int64), (torch.uint8, torch.int32), (torch.bool, torch.int64),
])
def test_dtype_argument_casts_like_aten(src, dtype):
    x = make(5, 300, requires_grad=False, scale=20.0).to(src)
    for fn, op in ((lambda t: t.sum(1, dtype=dtype), "sum.dim_IntList"), (lambda t: t.prod(1, dtype=dtype), "prod.dim_int"),
                   (lambda t: t.mean(0, dtype=dtype), "mean.dim")):
        if op == "mean.dim" and not dtype.is_floating_point:
            continue
        if op == "prod.dim_int":
            x = x[:, :4]
        got, ref, t = both(fn, x)
        assert op in t.ops("override") and got.dtype == ref.dtype == dtype
        with pn.triton.disabled():  # the exact reduction of the elements cast to ``dtype``
            truth = fn(x.to(dtype).double()) if dtype.is_floating_point else None
        assert_same(got, ref, truth)


def test_half_results_accumulate_in_fp32():
    """A bf16 row whose running bf16 sum would stall: fp32 accumulation keeps every term."""
    x = torch.full((1, 4096), 1.0, dtype=torch.bfloat16, device=DEVICE)
    assert check("sum", x, 1).item() == 4096.0
    assert check("mean", x, 1).item() == 1.0
