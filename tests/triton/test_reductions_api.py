"""Reductions through the panel: what the conds decline (and aten's errors for it), ``out=``
forms, switches, the op listing, the split path for long reduced axes, and the rule that keeps
ops no GPU has timed off GPUs."""

from __future__ import annotations

import pytest
import torch
from test_reductions import CALLS, NAN, both, check
from triton_testing import DEVICE, KEY, assert_routed, make, requires_triton, seeded  # noqa: F401

import python_native as pn
from python_native_dsls.triton.ops import reductions

pytestmark = requires_triton

OPS = [op for _, op in CALLS.values()]


def plan_for(op: str, x: torch.Tensor, dim: int, keepdim: bool):
    """The cached plan of reduction ``op`` (``sum``, ``max``...) over ``dim``, through its cond."""
    symbol, listed = reductions.OPS[op][0], reductions.OPS[op][4]
    return reductions.FAMILY[symbol].cond(x, [dim] if listed else dim, keepdim)


def fell_back(fn, *args) -> None:
    """``fn`` reached its aten op, which the override declined, and gives aten's result."""
    got, ref, t = both(fn, *args)
    assert t.events and all(e.outcome == "fallback" for e in t.events), [(e.op, e.outcome) for e in t.events]
    if isinstance(ref, torch.Tensor):
        assert got.dtype == ref.dtype and torch.equal(got.nan_to_num(), ref.nan_to_num())


@pytest.mark.parametrize("fn", [
    lambda x: x.sum((0, 1)), lambda x: x.sum(dim=None), lambda x: x.mean([0, -1]), lambda x: x.amax((0, 1)),
    lambda x: torch.amax(x, []), lambda x: x.argmax(), lambda x: x.argmin(dim=None, keepdim=True),
    lambda x: x.sum(1, dtype=torch.int64), lambda x: x.to(torch.float64).sum(1, dtype=torch.float16),
    lambda x: x.to(torch.complex64).sum(1), lambda x: (x > 0).amax(1), lambda x: (x > 0).max(1),
    lambda x: x.to(torch.int32).sum(1, dtype=torch.bfloat16), lambda x: x.view(2, 3, 4)[:, 1:].sum(-1),
    lambda x: x[0, 0].sum(0), lambda x: x[0, 0].amax(0), lambda x: x.sum(1, dtype=torch.bool),
], ids=["sum-2-dims", "sum-all", "mean-2-dims", "amax-2-dims", "amax-all", "argmax-flat", "argmin-flat",
        "float-to-int", "fp64-to-fp16", "complex", "bool-amax", "bool-max", "int-to-bf16", "uncollapsible",
        "zero-dim-sum", "zero-dim-amax", "to-bool"])
@pytest.mark.override
def test_declined_calls_run_aten(fn):
    fell_back(fn, make(6, 4, requires_grad=False))


@pytest.mark.parametrize("fn, error, op, why", [
    (lambda x: x[:, :0].amax(1), "Expected reduction dim 1 to have non-zero size", "amax", "empty input"),
    (lambda x: x[:, :0].argmin(1), "Expected reduction dim 1 to have non-zero size", "argmin", "empty input"),
    (lambda x: torch.max(x[:, :0], 1), "Expected reduction dim 1 to have non-zero size", "max.dim", "empty input"),
    (lambda x: (x > 0).argmax(1), "does not support bool", "argmax", "dtype bool"),
    (lambda x: x.to(torch.int64).mean(1), "could not infer output dtype", "mean.dim", "mean of int64"),
    (lambda x: x.to(torch.uint16).amax(1), "not implemented for 'UInt16'", "amax", "dtype uint16"),
    (lambda x: x.sum(2), "Dimension out of range", "sum.dim_IntList", "dim 2 is out of range"),
    (lambda x: x.argmax(-3), "Dimension out of range", "argmax", "dim -3 is out of range"),
])
@pytest.mark.override
def test_aten_errors_are_aten_own(fn, error, op, why):
    """The override declines, saying why, and aten's kernel raises its own error."""
    x = make(3, 5, requires_grad=False)
    with pn.triton.disabled(), pytest.raises((RuntimeError, IndexError, NotImplementedError), match=error):
        fn(x)
    with pn.trace() as t, pytest.raises((RuntimeError, IndexError, NotImplementedError), match=error):
        fn(x)
    assert_routed(t.events, {op: why}, error)


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.override
def test_empty_inputs_give_aten_results(name):
    fn, _ = CALLS[name]
    fell_back(fn, make(0, 4, requires_grad=False), 1, False)
    if name in ("sum", "mean", "prod"):
        fell_back(fn, make(3, 0, requires_grad=False), 1, True)  # zeros, NaN, ones


@pytest.mark.override
def test_out_forms_route_and_write_like_aten():
    x = make(4, 33, requires_grad=False)
    out = torch.empty(0, device=DEVICE)
    got, ref, t = both(lambda: torch.sum(x, 1, out=out).clone())
    assert "sum.IntList_out" in t.ops("override") and torch.allclose(got, ref, rtol=1e-5, atol=1e-6)
    values, indices = torch.empty(0, device=DEVICE), torch.empty(0, dtype=torch.int64, device=DEVICE)
    with pn.trace() as t:
        result = torch.max(x, 1, out=(values, indices))
    assert result[0] is values and result[1] is indices and "max.dim_max" in t.ops("override")
    assert torch.equal(indices, x.argmax(1))
    for call, op in [(lambda o: torch.argmin(x, 0, out=o), "argmin.out"), (lambda o: torch.mean(x, 0, out=o), "mean.out"),
                     (lambda o: torch.prod(x, 1, out=o), "prod.int_out"), (lambda o: torch.amax(x, 1, out=o), "amax.out")]:
        target = torch.empty(0, dtype=torch.int64 if op == "argmin.out" else x.dtype, device=DEVICE)
        got, ref, t = both(lambda call=call, target=target: call(target).clone())
        assert op in t.ops("override") and got.dtype == ref.dtype and torch.allclose(got.double(), ref.double())
    with pytest.warns(UserWarning, match="resized"):
        torch.amin(x, 1, out=torch.empty(7, device=DEVICE))


@pytest.mark.override
def test_out_of_another_dtype_goes_to_aten():
    """aten computes a reduction in the out's dtype (or refuses it): the out= override serves the call
    and its epilogue hands such a write to aten."""
    x = make(3, 200, requires_grad=False, scale=1e3)
    for dtype in (torch.float64, torch.float16, torch.int64):
        got, ref, t = both(lambda dtype=dtype: torch.sum(x, 1, out=torch.empty(0, dtype=dtype, device=DEVICE)))
        assert got.dtype == dtype and torch.equal(got, ref)
        assert_routed(t.events, {"sum.IntList_out": None}, f"sum into a {dtype} out")
    with pn.trace() as t:
        with pytest.raises(RuntimeError, match="Expected the dtype for input and out to match"):
            torch.amax(x, 1, out=torch.empty(0, dtype=torch.float64, device=DEVICE))
        with pytest.raises(RuntimeError, match="Expected out tensor to have dtype long int"):
            torch.argmax(x, 1, out=torch.empty(0, dtype=torch.int32, device=DEVICE))
    assert_routed(t.events, {"amax.out": None, "argmax.out": None}, "outs aten refuses")


@pytest.mark.override
def test_switches_and_listing():
    listed = pn.get_dsl_operations("triton")
    assert set(OPS) <= set(listed)
    assert {"sum.IntList_out", "mean.out", "prod.int_out", "amax.out", "argmax.out", "max.dim_max", "min.dim_min"} <= set(listed)
    x = make(4, 16, requires_grad=False)
    for scope in (pn.triton.disabled(), pn.operations_disabled("amax")):
        with scope, pn.trace() as t:
            x.amax(1)
        assert not [e for e in t.events if e.dsl == "triton"]
    with pn.operations_disabled("max"), pn.trace() as t:
        torch.max(x, 1)
        x.sum(1)
    assert t.ops("override") == ["sum.dim_IntList"]


@pytest.mark.override
def test_long_reduced_axes_split_into_slices(monkeypatch):
    """Few kept positions and a long reduced axis: per-slice partials, then a second launch;
    NaN, ties and indices survive the merge. Limits shrunk so that small shapes take the path."""
    from python_native_dsls.triton.plans import reduce as plans

    monkeypatch.setattr(plans, "STEP", 128)
    monkeypatch.setattr(plans, "MIN_SLICE", 128)
    monkeypatch.setattr(plans, "INNER_BLOCK", 4)
    reductions.FAMILY.clear_plans()
    try:
        rows, cols = make(2, 700, requires_grad=False), make(2, 300, 3, requires_grad=False)
        rows[0, 450] = NAN
        rows[1, 100] = rows[1, 600] = rows[1].max() + 1  # a tie across slices: the first index wins
        cols[1, 10, 2] = NAN
        for x, dim in ((rows, 1), (cols, 1), (rows.t(), 0)):
            for name in CALLS:
                assert plan_for(CALLS[name][1].split(".")[0], x, dim, False).n_slices > 1
                check(name, (x.abs() * 0.01 + 0.995) if name == "prod" else x, dim)
    finally:
        reductions.FAMILY.clear_plans()


def test_plans_are_cached_per_layout_and_fake_tensors_plan_alike():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = make(8, 300, requires_grad=False)
    plan = plan_for("sum", x, 1, False)
    assert plan_for("sum", x.clone(), 1, False) is plan
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        planned = plan_for("sum", fake, 1, False)
    assert planned is not None and planned._replace(serial=0) == plan._replace(serial=0)


def test_an_impl_called_without_a_plan_names_what_it_cannot_take():
    x = make(3, 4, requires_grad=False)
    assert torch.equal(reductions.FAMILY["amax"].op.impl(x, [1]), x.amax(1))
    with pytest.raises(ValueError, match=r"amax: .*\(dim=\[0, 1\]"):
        reductions.FAMILY["amax"].op.impl(x, [0, 1])
