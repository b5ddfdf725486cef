"""The dispatcher really routes to overrides, falls back when conds decline, and stops when disabled."""

from __future__ import annotations

import pytest
import torch

import python_native as pn
from conftest import always, marked_sub

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


def test_override_routes_and_falls_back(overrides, x):
    calls = []

    def cond(self, other, alpha):
        return isinstance(self, torch.Tensor) and self.dim() == 2

    def impl(self, other, alpha):
        calls.append(alpha)
        return marked_sub(self, other, alpha)

    overrides("sub.Tensor", cond, impl)
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
    assert torch.equal(x - x, torch.full_like(x, 1000))
    assert torch.equal(torch.sub(x, x, alpha=2), torch.add(torch.neg(x), 1000))
    assert calls == [1, 1, 2]
    v = torch.ones(3)
    assert torch.equal(torch.sub(v, v), torch.zeros(3))  # declined: aten's kernel
    assert len(calls) == 3


def test_trace_records_overrides_and_fallbacks(overrides, x):
    handle = overrides("sub.Tensor", lambda s, o, alpha: s.dim() == 2, marked_sub)
    with pn.trace() as t:
        torch.sub(x, x)
        torch.sub(torch.ones(3), torch.ones(3))
    assert [(e.op, e.dispatch_key, e.dsl, e.outcome) for e in t.events] == [
        ("sub.Tensor", "CPU", "testdsl", "override"),
        ("sub.Tensor", "CPU", None, "fallback"),
    ]
    assert t.events[0].override == handle.name
    torch.sub(x, x)
    assert len(t.events) == 2  # closed traces record nothing
    assert "_pn_trace" not in pn.router_source("sub.Tensor", "CPU")


def test_first_matching_cond_wins_and_priority_reorders(overrides, x):
    overrides("sub.Tensor", always, lambda s, o, alpha: torch.full_like(s, 1.0))
    overrides("sub.Tensor", always, lambda s, o, alpha: torch.full_like(s, 2.0))
    assert torch.sub(x, x)[0, 0] == 1.0
    overrides("sub.Tensor", always, lambda s, o, alpha: torch.full_like(s, 3.0), priority=5)
    assert torch.sub(x, x)[0, 0] == 3.0
    seen = []
    pn.reorder_overrides(lambda op, key, found: seen.append((op, key)) or list(reversed(found)))
    assert torch.sub(x, x)[0, 0] == 2.0
    overrides("sub.Tensor", always, lambda s, o, alpha: torch.full_like(s, 4.0))  # ordered at registration
    # Other libraries' overrides (the Triton ones, at whatever key they sit) are reordered too.
    assert seen[-1] == ("sub.Tensor", "CPU") and all(key == "CPU" for op, key in seen if op == "sub.Tensor")


def test_unconditional_override_needs_no_cond(overrides, x):
    overrides("sub.Tensor", None, marked_sub, unconditional_override=True)
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
    source = pn.router_source("sub.Tensor", "CPU")
    # No cond is asked; aten's kernel is reached only when the impl hands the call on.
    assert "_pn_cond" not in source
    assert "call_boxed" not in source.partition("except _pn_unavailable:")[0]


def test_remove_restores_aten(overrides, x):
    handle = overrides("sub.Tensor", always, marked_sub)
    assert handle.active
    handle.remove()
    handle.remove()  # idempotent
    assert not handle.active and handle.removed
    assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    assert "testdsl" not in str(pn.get_dsl_operations("testdsl"))


def test_autograd_through_override_uses_aten_formula(overrides):
    seen = []

    def impl(self, other):
        seen.append(self.shape)
        return torch.ops.aten.mul.out(self, other, out=torch.empty_like(self))

    overrides("mul.Tensor", always, impl)
    a = torch.randn(4, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    (a * b).sum().backward()
    assert torch.allclose(a.grad, b.detach()) and torch.allclose(b.grad, a.detach())
    assert len(seen) >= 3  # forward, and the backward formula's muls, all routed


def test_bmm_backward_calls_bmm_without_trouble(overrides):
    def impl(self, mat2):
        return (self.unsqueeze(-1) * mat2.unsqueeze(1)).sum(2)  # never calls bmm

    overrides("bmm", lambda s, m: True, impl)
    a = torch.randn(2, 3, 4, requires_grad=True)
    b = torch.randn(2, 4, 5, requires_grad=True)
    with pn.trace() as t:
        torch.bmm(a, b).sum().backward()
    assert t.ops("override").count("bmm") == 3  # forward + two bmm in the backward formula
    ref_a, ref_b = a.detach().requires_grad_(), b.detach().requires_grad_()
    with pn.operations_disabled("bmm"):
        torch.bmm(ref_a, ref_b).sum().backward()
    torch.testing.assert_close(a.grad, ref_a.grad)
    torch.testing.assert_close(b.grad, ref_b.grad)


def test_impl_and_cond_errors_propagate_unchanged(overrides, x):
    class Boom(Exception):
        pass

    def bad_impl(self, other, alpha):
        raise Boom("impl failed")

    handle = overrides("sub.Tensor", always, bad_impl)
    with pytest.raises(Boom, match="impl failed"):
        torch.sub(x, x)
    handle.remove()

    def bad_cond(self, other, alpha):
        raise KeyError("cond failed")

    overrides("sub.Tensor", bad_cond, marked_sub)
    with pytest.raises(KeyError, match="cond failed"):
        torch.sub(x, x)
    with pn.operations_disabled("sub"):
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))  # registry intact


def test_python_numbers_in_tensor_params_fall_back_like_aten(overrides):
    overrides("mul.Tensor", lambda s, o: False, lambda s, o: None)
    cases = [
        (torch.ones(3, dtype=torch.int32), 2.5),
        (torch.ones(3, dtype=torch.bfloat16) * 3, 0.1),
        (torch.tensor(2.0, dtype=torch.float16), 2.5),
        (torch.ones(2, dtype=torch.int64), 3),
        (torch.ones(2), True),
    ]
    for tensor, number in cases:
        got = tensor * number
        with pn.operations_disabled("mul"):
            want = tensor * number
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_cond_and_impl_receive_full_arguments(overrides):
    seen = {}

    def cond(self, dim, keepdim, *, dtype):
        seen["args"] = (dim, keepdim, dtype)
        return False

    overrides("sum.dim_IntList", cond, lambda *a, **k: None)
    x = torch.ones(2, 3)
    assert torch.equal(x.sum(0), torch.full((3,), 2.0))
    assert seen["args"] == ([0], False, None)
    x.sum(1, keepdim=True, dtype=torch.float64)
    assert seen["args"] == ([1], True, torch.float64)


def test_bool_and_int_arguments_reach_the_captured_kernel(overrides):
    overrides("_softmax", lambda self, dim, half_to_float: False, lambda *a: None)
    x = torch.randn(3, 5)
    with pn.operations_disabled("_softmax"):
        disabled = torch.softmax(x, -1)
    torch.testing.assert_close(torch.softmax(x, -1), disabled)
    torch.testing.assert_close(disabled, torch.exp(x) / torch.exp(x).sum(-1, keepdim=True))
