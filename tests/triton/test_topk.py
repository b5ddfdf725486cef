"""``torch.topk`` (and its ``out=`` form) through the Triton override: values, indices, NaN order,
ties, unsorted results, chunked wide rows, gradients, declines and switches."""

from __future__ import annotations

import pytest
import torch
from triton_testing import (  # noqa: F401
    DEVICE,
    DTYPES,
    aten,
    compare,
    make,
    requires_triton,
    run,
    seeded,
    traced,
    unmeasured_installed,
)

import python_native as pn
from python_native_dsls.triton.ops import topk as topk_ops
from python_native_dsls.triton.plans import select

pytestmark = [requires_triton, pytest.mark.override, pytest.mark.usefixtures("unmeasured_installed")]  # topk is unmeasured

NAN, INF = float("nan"), float("inf")


def assert_topk_contract(x, k, dim, largest, values, indices):
    """Values equal aten's exactly (NaN where aten has NaN), int64 indices name elements holding
    those values, each element once per row."""
    ref_values, ref_indices = aten(lambda: torch.topk(x, k, dim, largest))
    assert values.dtype == x.dtype and indices.dtype == torch.int64
    assert values.shape == ref_values.shape == indices.shape and values.stride() == ref_values.stride()
    assert torch.equal(values.isnan(), ref_values.isnan())
    assert torch.equal(values.nan_to_num(), ref_values.nan_to_num())
    held = x.gather(dim, indices)
    assert torch.equal(held.isnan(), values.isnan()) and torch.equal(held.nan_to_num(), values.nan_to_num())
    assert (indices.sort(dim).values.diff(dim=dim) != 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("shape,k,dim", [
    ((5, 37), 3, -1),  # iterative selection
    ((5, 37), 20, -1),  # bitonic selection
    ((7,), 7, 0),  # k equal to the row
    ((4, 10, 5), 4, 1),  # a middle dim: rows strided by the inner dim
    ((3, 64), 33, 1),
])
def test_values_and_indices_follow_aten(dtype, largest, shape, k, dim):
    x = make(*shape, dtype=dtype, requires_grad=False)
    (values, indices), fired = traced(lambda: torch.topk(x, k, dim, largest))
    assert fired == ["topk"]
    assert_topk_contract(x, k, dim, largest, values, indices)
    if dtype == torch.float32:  # no ties among float32 normals: aten's indices are the same elements
        assert torch.equal(indices, aten(lambda: torch.topk(x, k, dim, largest)).indices)


def test_strided_inputs_and_method_and_out_forms():
    sliced = make(6, 90, requires_grad=False)[:, 5:70]
    transposed = make(40, 6, requires_grad=False).t()
    for x, dim in ((sliced, -1), (transposed, 1), (transposed, 0)):
        (values, indices), fired = traced(lambda x=x, dim=dim: x.topk(5, dim))
        assert fired == ["topk"]
        assert_topk_contract(x, 5, dim, True, values, indices)
    x = make(4, 30, requires_grad=False)
    out = (torch.empty(0, device=DEVICE), torch.empty(0, dtype=torch.int64, device=DEVICE))
    result, fired = traced(lambda: torch.topk(x, 6, largest=False, out=out))
    assert fired == ["topk.values"] and result.values is out[0] and result.indices is out[1]
    assert_topk_contract(x, 6, -1, False, *out)


@pytest.mark.parametrize("k", [4, 40])
def test_nan_ranks_above_inf_as_in_aten(k):
    x = make(4, 50, requires_grad=False)
    x[0, [3, 30]] = NAN
    x[1, :45] = NAN  # more NaNs than the smallest k leaves out
    x[2, 7], x[2, 9], x[3, 1] = INF, -INF, NAN
    x[3, 2], x[3, 4] = -0.0, 0.0
    for largest in (True, False):
        (values, indices), fired = traced(lambda largest=largest: torch.topk(x, k, largest=largest))
        assert fired == ["topk"]
        assert_topk_contract(x, k, -1, largest, values, indices)
        assert values[0, :2].isnan().all() if largest else not values[0].isnan().any()
        assert values[1].isnan().all() if largest else values[1, -1].isnan() == (k > 5)


def test_ties_take_the_lowest_index_first():
    x = torch.tensor([[1.0, 2.0, 2.0, 2.0, 1.0, 3.0, 2.0], [0.0] * 7], device=DEVICE)
    (values, indices), fired = traced(lambda: torch.topk(x, 3))
    assert fired == ["topk"]  # the kernel's order, not aten's (which promises none among ties)
    assert values.tolist() == [[3.0, 2.0, 2.0], [0.0, 0.0, 0.0]]
    assert indices.tolist() == [[5, 1, 2], [0, 1, 2]]
    (values, indices), fired = traced(lambda: torch.topk(x, 3, largest=False))
    assert fired == ["topk"]
    assert values.tolist() == [[1.0, 1.0, 2.0], [0.0, 0.0, 0.0]] and indices.tolist() == [[0, 4, 1], [0, 1, 2]]


@pytest.mark.parametrize("k", [5, 24])
def test_unsorted_returns_the_same_set(k):
    x = make(6, 80, requires_grad=False)
    (values, indices), fired = traced(lambda: torch.topk(x, k, sorted=False))
    ref_values, ref_indices = aten(lambda: torch.topk(x, k, sorted=False))
    assert fired == ["topk"]
    assert torch.equal(values.sort(-1).values, ref_values.sort(-1).values)
    assert torch.equal(indices.sort(-1).values, ref_indices.sort(-1).values)


@pytest.mark.parametrize("k,one_pass,chunk", [
    (3, 4096, 2048),
    pytest.param(7, 256, 64, marks=pytest.mark.slow),  # three stages and more: a minute in the interpreter
    pytest.param(40, 256, 256, marks=pytest.mark.slow),
])
def test_wide_rows_are_narrowed_in_stages(monkeypatch, k, one_pass, chunk):
    """Rows wider than one program's block go through scratch rows of candidates; the small
    limits make several stages run on rows the interpreter handles quickly."""
    monkeypatch.setattr(select, "ONE_PASS", one_pass)
    monkeypatch.setattr(select, "CHUNK", chunk)
    topk_ops.FAMILY.clear_plans()
    try:
        x = make(3, 9000 if one_pass == 4096 else 3000, requires_grad=False)
        x[0, 100], x[1, 2500:2600] = NAN, NAN
        x[2, 1000:1040] = 5.0  # ties across chunks
        plan = topk_ops.FAMILY["topk"].cond(x, k, -1, True, True)
        assert len(plan.stages) >= (2 if one_pass == 4096 else 3)
        for largest in (True, False):
            (values, indices), fired = traced(lambda largest=largest: torch.topk(x, k, largest=largest))
            assert fired == ["topk"]
            assert_topk_contract(x, k, -1, largest, values, indices)
            if largest:  # equal values (the NaNs, the fives): lowest index first, across chunks
                assert indices[1].tolist() == list(range(2500, 2500 + k))
                assert indices[2].tolist() == list(range(1000, 1000 + k))
    finally:
        topk_ops.FAMILY.clear_plans()


def test_gradient_matches_aten():
    compare(lambda x: torch.topk(x, 6).values, [make(5, 40)], ["topk"])
    compare(lambda x: torch.topk(x, 20, dim=0, largest=False).values * 2, [make(30, 4)], ["topk"])


@pytest.mark.parametrize("case", ["float64", "int32", "k above the bound", "k = 0", "0-dim", "empty"])
def test_declined_calls_fall_back_to_aten(case):
    x = {"float64": make(4, 30, dtype=torch.float64), "int32": torch.randint(0, 9, (4, 30), dtype=torch.int32, device=DEVICE),
         "k above the bound": make(2, select.K_MAX + 10), "k = 0": make(4, 30), "0-dim": make(1)[0],
         "empty": make(0, 30)}[case].detach()
    k = {"k above the bound": select.K_MAX + 1, "k = 0": 0, "0-dim": 1}.get(case, 3)
    result = run(lambda t: torch.topk(t, k).values, [x])
    assert result.fell_back("topk") and not result.triton_events()
    assert torch.equal(result.out, aten(lambda: torch.topk(x, k).values))


def test_listed_and_switched_off():
    assert {"topk", "topk.values"} <= set(pn.get_dsl_operations("triton"))
    x = make(4, 32, requires_grad=False)
    for scope in (pn.triton.disabled(), pn.operations_disabled("topk")):
        result = run(lambda t: torch.topk(t, 3).values, [x], scope=scope)
        assert not result.triton_events() and result.fell_back("topk")
