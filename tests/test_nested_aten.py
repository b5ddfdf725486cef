"""Disabled means aten all the way down: inside a disabled op's aten kernel no override runs, while
direct calls of the ops it calls inside still run theirs (the Triton overrides, on CPU through the
interpreter, under both fronts)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import python_native as pn
from python_native_dsls.triton import device_type

pytestmark = pytest.mark.both_fronts

DEVICE = device_type()
installed = set(pn.get_dsl_operations("triton"))


def needs(*ops: str):
    return pytest.mark.skipif(not set(ops) <= installed or DEVICE != "cpu",
                              reason=f"needs the Triton overrides of {ops} at the CPU key")


def outcomes(fn) -> list[tuple[str, str]]:
    with pn.trace() as t:
        fn()
    return [(e.op, e.outcome) for e in t.events]


X = torch.randn(8, 64)


@needs("mean.dim", "sum.dim_IntList")
def test_a_disabled_mean_sums_with_aten_and_a_direct_sum_still_runs_the_override():
    assert outcomes(lambda: X.mean(-1)) == [("mean.dim", "override")]
    with pn.operations_disabled("mean"):
        assert outcomes(lambda: X.mean(-1)) == [("mean.dim", "fallback")]  # no sum.IntList_out inside it
        out = torch.empty(8)
        assert outcomes(lambda: torch.sum(X, [-1], out=out)) == [("sum.IntList_out", "override")]
        torch.testing.assert_close(X.mean(-1), X.double().mean(-1).float())
    with pn.operations_disabled(torch.mean):  # the same through torch's function
        assert outcomes(lambda: torch.mean(X, -1, out=torch.empty(8))) == [("mean.out", "fallback")]
    assert outcomes(lambda: X.mean(-1)) == [("mean.dim", "override")]


@needs("index_add", "scatter_add_")
def test_a_disabled_index_add_scatters_with_aten():
    index = torch.arange(8)
    with pn.operations_disabled("index_add"):
        assert outcomes(lambda: torch.zeros(8, 64).index_add(0, index, X)) == [("index_add", "fallback")]
        direct = outcomes(lambda: torch.zeros(8, 64).scatter_add_(0, torch.zeros(8, 64, dtype=torch.long), X))
        assert direct == [("scatter_add_", "override")]


@needs("native_dropout", "bernoulli_.float")
def test_a_disabled_dropout_draws_with_aten_on_its_composite_path_too():
    assert outcomes(lambda: F.dropout(X, 0.5, True)) == [("bernoulli_.float", "override")]
    with pn.operations_disabled("dropout"), pn.trace() as t:
        F.dropout(X, 0.5, True)
        torch.nn.Dropout(0.3)(X)
        torch.empty(8).bernoulli_(0.3)  # a direct call: not inside dropout
        torch.native_dropout(X, 0.5, True)
    assert [(e.op, e.outcome) for e in t.events] == [
        ("bernoulli_.float", "fallback"), ("bernoulli_.float", "fallback"), ("bernoulli_.float", "override"),
        ("native_dropout", "fallback"),  # its CPU kernel's bernoulli_ runs inside it: no event
    ]
    assert t.events[0].reason == "inside torch.nn.functional.dropout, which is disabled"
    assert outcomes(lambda: F.dropout(X, 0.5, True)) == [("bernoulli_.float", "override")]


@needs("native_group_norm")
def test_a_disabled_out_form_runs_its_generated_kernel_without_the_functional_override():
    x = X.reshape(8, 8, 8)

    def call():
        outs = (torch.empty(8, 8, 8), torch.empty(8, 4), torch.empty(8, 4))
        torch.ops.aten.native_group_norm.out(x, torch.ones(8), torch.zeros(8), 8, 8, 8, 4, 1e-5,
                                             out0=outs[0], out1=outs[1], out2=outs[2])

    assert outcomes(call) == [("native_group_norm.out", "override")]
    with pn.operations_disabled("native_group_norm.out"):
        assert outcomes(call) == [("native_group_norm.out", "fallback")]
        assert outcomes(lambda: torch.native_group_norm(x, None, None, 8, 8, 8, 4, 1e-5))[0][1] == "override"


@needs("mean.dim", "sum.dim_IntList", "_softmax")
def test_untouched_routers_neither_set_nor_check_the_guard():
    for op in ("sum.IntList_out", "mean.dim", "_softmax"):
        assert "_pn_nested_aten" not in pn.router_source(op, "CPU")
    with pn.operations_disabled("softmax"):  # an op whose kernel calls none of ours
        assert "_pn_nested_aten" not in pn.router_source("sum.IntList_out", "CPU")
        assert "_pn_nested_aten" not in pn.router_source("_softmax", "CPU")
    with pn.operations_disabled("mean"):
        assert "_pn_nested_aten.depth += 1" in pn.router_source("mean.dim", "CPU")
        assert "if _pn_nested_aten.depth:" in pn.router_source("sum.IntList_out", "CPU")
    assert "_pn_nested_aten" not in pn.router_source("sum.IntList_out", "CPU")


@needs("mean.dim")
def test_a_slots_links_are_worked_out_once_per_list_of_overrides(monkeypatch):
    """Every toggle asks each touched slot for its links: a slot whose overrides did not change
    answers from what it kept, without reading the kernel-call table again."""
    from python_native.core import nested_aten
    from python_native.core.registry import REGISTRY

    slot = REGISTRY.slots[("aten", "mean.dim", "CPU")]
    first = nested_aten.links(slot)

    class Unread(dict):
        def get(self, *args):
            raise AssertionError("the kernel-call table was read again for an unchanged slot")

    monkeypatch.setattr(nested_aten, "KERNEL_CALLS", Unread())
    assert nested_aten.links(slot) is first
