"""``bmm`` with an inner dimension of 1 (batched outer product)."""

from __future__ import annotations

import pytest
import torch
from triton_testing import DTYPES, assert_matches, compare, make, requires_triton, run, seeded  # noqa: F401

import python_native as pn

pytestmark = [requires_triton, pytest.mark.override]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,m,n", [(3, 5, 7), (2, 64, 300), (1, 1, 1), (4, 300, 2)])
def test_outer_product_matches_aten(dtype, b, m, n):
    a, c = make(b, m, 1, dtype=dtype, requires_grad=False), make(b, 1, n, dtype=dtype, requires_grad=False)
    with pn.trace() as t:
        got = torch.bmm(a, c)
    with pn.triton.disabled():
        ref = torch.bmm(a, c)
    assert ("triton", "override") in {(e.dsl, e.outcome) for e in t.events if e.op == "bmm"}
    assert_matches(got, ref, torch.bmm(a.double(), c.double()), "bmm")
    assert got.is_contiguous()


def test_strided_operands_and_matmul_operator():
    base_a = make(4, 9, 3, requires_grad=False)
    base_c = make(4, 2, 11, requires_grad=False)
    a = base_a[:, :, 1:2]  # stride (27, 3, 1)
    c = base_c.transpose(1, 2).transpose(1, 2)[:, 1:2, :]
    expanded = make(1, 1, 11, requires_grad=False).expand(4, 1, 11)  # batch stride 0
    with pn.trace() as t:
        outs = [a @ c, torch.bmm(a, expanded)]
    with pn.triton.disabled():
        refs = [a @ c, torch.bmm(a, expanded)]
    assert [e.outcome for e in t.events if e.op == "bmm"] == ["override", "override"]
    for got, ref in zip(outs, refs, strict=True):
        torch.testing.assert_close(got, ref)


def test_gradients_flow_and_backward_bmms_fall_back():
    got = compare(torch.bmm, [make(2, 6, 1), make(2, 1, 5)], ["bmm"])
    # The backward contracts over M or N, not 1: those bmm calls are aten's.
    assert [(e.dsl, e.outcome) for e in got.events if e.op == "bmm"] == [
        ("triton", "override"),
        (None, "fallback"),
        (None, "fallback"),
    ]


@pytest.mark.parametrize("case", ["inner_dim_2", "float64", "mixed_dtypes"])
def test_declined_inputs_fall_back(case):
    k = 2 if case == "inner_dim_2" else 1
    dtype = torch.float64 if case == "float64" else torch.float32
    a = make(2, 3, k, dtype=dtype, requires_grad=False)
    c = make(2, k, 4, dtype=torch.float16 if case == "mixed_dtypes" else dtype, requires_grad=False)
    with pn.trace() as t:
        try:
            torch.bmm(a, c)
        except RuntimeError:
            assert case == "mixed_dtypes"  # aten rejects it; the override never claims it
    assert [(e.dsl, e.outcome) for e in t.events if e.op == "bmm"] == [(None, "fallback")]


def test_switches_turn_the_override_off():
    a, c = make(2, 3, 1, requires_grad=False), make(2, 1, 4, requires_grad=False)
    for scope in (pn.triton.disabled(), pn.operations_disabled("bmm")):
        with scope, pn.trace() as t:
            torch.bmm(a, c)
        assert [(e.dsl, e.outcome) for e in t.events if e.op == "bmm"] == [(None, "fallback")]
