"""Every traced fallback says why: conds' explanations, switches, calibration gates, unavailable DSLs."""

from __future__ import annotations

import json

import pytest
import torch

import python_native as pn

# isort: split
from conftest import TEST_DSL, always, marked_sub
from python_native import codegen
from python_native_dsls.triton import device_type

DEVICE = device_type()  # where the Triton overrides run (their tests' inputs live there)

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


def two_d(self, other, alpha):
    return self.dim() == 2


def counting_explain(calls):
    def explain(self, other, alpha):
        calls.append(self.shape)
        return f"a {self.dim()}-d input (takes 2-d)"

    return explain


def fallback_reasons(trace):
    return [e.reason for e in trace.events if e.outcome == "fallback"]


def test_a_declining_cond_with_an_explanation_shows_it_in_the_event_and_table(overrides, x):
    calls = []
    overrides("sub.Tensor", two_d, marked_sub, explain=counting_explain(calls))
    with pn.trace() as t:
        torch.sub(x, x)  # accepted: no reason asked
        out = torch.sub(torch.ones(3), torch.ones(3))
    assert torch.equal(out, torch.zeros(3))  # aten ran
    assert [(e.outcome, e.reason) for e in t.events] == [
        ("override", None), ("fallback", f"{TEST_DSL}: a 1-d input (takes 2-d)")]
    assert calls == [torch.Size([3])]  # only the decline was explained
    header, _, row = t.table().splitlines()
    assert header.split()[-1] == "reason"
    assert row.endswith(f"{TEST_DSL}: a 1-d input (takes 2-d)")


def test_a_cond_without_explanation_says_cond_declined(overrides):
    overrides("sub.Tensor", two_d, marked_sub)
    with pn.trace() as t:
        torch.sub(torch.ones(3), torch.ones(3))
    assert fallback_reasons(t) == [f"{TEST_DSL}: cond declined"]


def test_a_cond_object_carries_its_own_explanation(overrides):
    class Cond:
        def __call__(self, s, o, alpha):
            return s.dim() == 2

        def explain(self, s, o, alpha):
            return "dtype float64" if s.dtype == torch.float64 else None

    overrides("sub.Tensor", Cond(), marked_sub)
    with pn.trace() as t:
        torch.sub(torch.ones(3, dtype=torch.float64), 1)
        torch.sub(torch.ones(3), 1)  # the explanation has nothing to say: the generic reason
    assert fallback_reasons(t) == [f"{TEST_DSL}: dtype float64", f"{TEST_DSL}: cond declined"]


def test_each_declining_override_is_named_in_order(overrides):
    overrides("sub.Tensor", two_d, marked_sub, explain=lambda s, o, alpha: "not 2-d", priority=2)
    overrides("sub.Tensor", lambda s, o, alpha: False, marked_sub, explain=lambda s, o, alpha: "never")
    with pn.trace() as t:
        torch.sub(torch.ones(3), torch.ones(3))
    assert fallback_reasons(t) == [f"{TEST_DSL}: not 2-d; {TEST_DSL}: never"]


def test_an_untraced_call_never_asks_for_an_explanation(overrides, x):
    calls = []
    overrides("sub.Tensor", two_d, marked_sub, explain=counting_explain(calls))
    for _ in range(3):
        torch.sub(torch.ones(3), torch.ones(3))
    assert calls == []
    assert "_pn_explain" not in pn.router_source("sub.Tensor", "CPU")
    with pn.trace():
        torch.sub(torch.ones(3), torch.ones(3))
        assert "_pn_explain" in pn.router_source("sub.Tensor", "CPU")
    torch.sub(torch.ones(3), torch.ones(3))
    assert calls == [torch.Size([3])]


def test_a_raising_explanation_never_breaks_the_call(overrides):
    def explain(s, o, alpha):
        raise ValueError("boom")

    overrides("sub.Tensor", two_d, marked_sub, explain=explain)
    with pn.trace() as t:
        out = torch.sub(torch.ones(3), torch.ones(3))
    assert torch.equal(out, torch.zeros(3))
    assert fallback_reasons(t) == [f"{TEST_DSL}: cond declined (its explanation raised ValueError: boom)"]


def test_an_explanation_must_be_callable(overrides):
    with pytest.raises(TypeError, match="explain must be a callable.*'not 2-d'"):
        overrides("sub.Tensor", two_d, marked_sub, explain="not 2-d")


@pytest.mark.parametrize("switch, reason", [
    (lambda: getattr(pn, TEST_DSL).disabled(), f"DSL {TEST_DSL} disabled by a scope"),
    (lambda: pn.operations_disabled("sub"), "op sub disabled by a scope"),
    (lambda: pn.dispatch_keys_disabled("CPU"), "dispatch key CPU disabled by a scope"),
])
def test_switched_off_overrides_name_the_switch(overrides, x, switch, reason):
    overrides("sub.Tensor", always, marked_sub)
    with pn.trace() as t, switch():
        out = torch.sub(x, x)
    assert torch.equal(out, torch.zeros_like(x))
    assert fallback_reasons(t) == [f"{TEST_DSL}: {reason}"]


def test_an_explicit_disable_names_the_switch_without_scope(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    pn.disable_operations("sub.Tensor")
    with pn.trace() as t:
        torch.sub(x, x)
    assert fallback_reasons(t) == [f"{TEST_DSL}: op sub.Tensor disabled"]


def test_an_unavailable_impl_says_so(overrides, x):
    def impl(self, other, alpha):
        raise codegen.OverrideUnavailable("no runtime here")

    overrides("sub.Tensor", always, impl)
    with pn.trace() as t:
        out = torch.sub(x, x)
    assert torch.equal(out, torch.zeros_like(x))
    assert fallback_reasons(t) == [f"{TEST_DSL}: unavailable (no runtime here)"]


def test_a_calibration_gate_decline_names_calibration(overrides, calib):
    from calibration_testing import FAKE_DEVICE, table

    rows = [{"dsl": TEST_DSL, "op": "sub.Tensor", "dtype": "float32", "bucket": 5, "wins": True},
            {"dsl": TEST_DSL, "op": "sub.Tensor", "dtype": "float32", "bucket": 11, "wins": False}]
    path = calib.shipped.parent / "table.json"
    path.write_text(json.dumps(table(rows=rows)))
    calib.env(path)
    calib.device(FAKE_DEVICE)
    overrides("sub.Tensor", two_d, marked_sub, explain=lambda s, o, alpha: "not 2-d")
    small, large = torch.ones(2, 8), torch.ones(16, 64)  # 16 elements (bucket 5), 1024 (bucket 11)
    with pn.trace() as t:
        assert torch.equal(torch.sub(small, small), torch.full_like(small, 1000))  # the override wins here
        assert torch.equal(torch.sub(large, large), torch.zeros_like(large))  # aten is faster here
        torch.sub(torch.ones(3), torch.ones(3))  # the gate lets it through, the cond declines
    assert [e.outcome for e in t.events] == ["override", "fallback", "fallback"]
    assert fallback_reasons(t) == [
        f"{TEST_DSL}: calibration: aten is faster for float32 inputs of 1024 elements (rows of width 64) on {FAKE_DEVICE}",
        f"{TEST_DSL}: not 2-d",
    ]


def test_bmm_with_an_inner_dimension_says_not_an_outer_product():
    if "bmm" not in pn.get_dsl_operations("triton"):
        pytest.skip("the Triton bmm override is not installed here")
    a, b = torch.randn(2, 3, 4, device=DEVICE), torch.randn(2, 4, 5, device=DEVICE)
    with pn.trace() as t:
        out = torch.bmm(a, b)
        torch.bmm(torch.randn(2, 3, 1, device=DEVICE), torch.randn(2, 1, 5, device=DEVICE))
    torch.testing.assert_close(out, a @ b)
    assert [(e.op, e.outcome) for e in t.events] == [("bmm", "fallback"), ("bmm", "override")]
    assert t.events[0].reason.startswith("triton: not an outer product: inner dimension K = 4 > 1")
    assert "not an outer product" in t.table()


def _triton_installed(op: str) -> None:
    if op not in pn.get_dsl_operations("triton"):
        pytest.skip(f"the Triton {op} override is not installed here")


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("op, call, reason", [
    ("_softmax", lambda: torch.softmax(_randn(4, 8, dtype=torch.float64), -1), "dtype float64"),
    ("_softmax", lambda: torch.softmax(_randn(4, 8), 0), "dim 0 is not the last dim of size > 1"),
    ("native_layer_norm", lambda: torch.nn.functional.layer_norm(_randn(2, 70000), (70000,)),
     "rows of width 70000 exceed the kernel's 16384"),
    ("native_layer_norm", lambda: torch.nn.functional.layer_norm(_randn(4, 8), (8,), torch.ones(16, device=DEVICE)[::2]),
     "weight is not contiguous"),
    ("silu", lambda: torch.nn.functional.silu(_randn(4, 8)[:, ::2]), "layout: not dense"),
    ("gelu", lambda: torch.nn.functional.gelu(_randn(4, 8).double()), "dtype float64"),
    ("native_dropout", lambda: torch.ops.aten.native_dropout(_randn(4, 8, dtype=torch.float64), 0.5, True),
     "dtype float64"),
    ("native_dropout", lambda: torch.ops.aten.native_dropout(_randn(4, 8), 0.5, False), "train=False"),
    ("native_dropout_backward", lambda: torch.ops.aten.native_dropout_backward(
        _randn(8, 4).t(), torch.ones(4, 8, dtype=torch.bool, device=DEVICE), 2.0),
     "layout: grad and mask differ in shape or strides"),
    ("bernoulli_.float", lambda: _randn(4, 8, dtype=torch.float64).bernoulli_(0.5), "dtype float64"),
])
def test_the_triton_ops_explain_their_declines(op, call, reason):
    _triton_installed(op)
    with pn.trace() as t:
        call()
    events = [e for e in t.events if e.op == op]
    assert events and events[0].outcome == "fallback"
    assert events[0].reason.startswith(f"triton: {reason}"), events[0].reason


def test_rms_norm_explains_its_declines_where_it_is_not_installed():
    from python_native_dsls.triton.ops import rms_norm

    x = _randn(4, 8)
    assert rms_norm.rms_norm_explain(x.double(), (8,), None, None).startswith("dtype float64")
    assert rms_norm.rms_norm_explain(x, (4,), None, None) == "normalized_shape (4,) is not the trailing shape of (4, 8)"
    assert rms_norm.rms_norm_explain(x, (8,), torch.ones(4, device=DEVICE), None) == "weight shape (4,) is not (8,)"
