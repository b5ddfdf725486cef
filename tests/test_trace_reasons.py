"""Every traced fallback says why: conds' explanations, switches, calibration gates, unavailable DSLs."""

from __future__ import annotations

import json

import pytest
import torch

import python_native as pn

# isort: split
from conftest import TEST_DSL, always, marked_sub
from python_native.core import errors
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
        raise errors.OverrideUnavailable("no runtime here")

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
    ("silu", lambda: torch.nn.functional.silu(_randn(4, 8)[:, ::2]), "layout: neither dense nor rows with a contiguous last dim"),
    ("gelu", lambda: torch.nn.functional.gelu(_randn(4, 8).double()), "dtype float64"),
    ("native_dropout", lambda: torch.ops.aten.native_dropout(_randn(4, 8, dtype=torch.float64), 0.5, True),
     "dtype float64"),
    ("native_dropout", lambda: torch.ops.aten.native_dropout(_randn(4, 8), 0.5, False), "train=False"),
    ("native_dropout_backward", lambda: torch.ops.aten.native_dropout_backward(
        _randn(8, 4).t(), torch.ones(4, 8, dtype=torch.bool, device=DEVICE), 2.0),
     "layout: grad and mask differ in shape or strides"),
    ("bernoulli_.float", lambda: _randn(4, 8, dtype=torch.float64).bernoulli_(0.5), "dtype float64"),
    ("sum.dim_IntList", lambda: torch.sum(_randn(4, 8), (0, 1)), "dim=[0, 1]: the kernels reduce over exactly one dim"),
    ("prod.dim_int", lambda: torch.prod(_randn(4, 8), 1, dtype=torch.int64),
     "dtype=int64 from float32: the kernels cast to integers only from integers"),
    ("amax", lambda: torch.amax(_randn(2, 3, 4, 5).transpose(2, 3), 1),
     "layout: the dims before dim 1 or those after it do not collapse to one strided axis"),
    ("argmax", lambda: torch.argmax(_randn(4, 8)), "dim=None: the kernels reduce over exactly one dim"),
    ("max.dim", lambda: torch.max(_randn(0, 3), 1), "empty input"),
    ("topk", lambda: torch.topk(_randn(4, 2000), 1500), "k = 1500 exceeds the kernels' limit of 1024"),
    ("topk", lambda: torch.topk(_randn(4, 8, dtype=torch.float64), 2),
     "dtype float64 (the kernels take bfloat16, float16, float32)"),
    ("scatter_add", lambda: torch.zeros(4, dtype=torch.int16, device=DEVICE).scatter_add(
        0, torch.tensor([0, 1], device=DEVICE), torch.ones(2, dtype=torch.int16, device=DEVICE)),
     "dtype int16 (the kernel takes bfloat16, float16, float32, float64, int32, int64)"),
    ("scatter_add_", lambda: _randn(4, 8)[:, ::2].scatter_add_(
        0, torch.zeros(1, 4, dtype=torch.int64, device=DEVICE), _randn(1, 4)), "layout: self is not dense"),
    ("index_add", lambda: torch.zeros(5, dtype=torch.float64, device=DEVICE).index_add(
        0, torch.tensor([0, 1], device=DEVICE), torch.ones(2, dtype=torch.float64, device=DEVICE), alpha=0.1),
     "alpha = 0.1 is not exact in float32"),
    ("index_add_", lambda: torch.zeros(5, dtype=torch.int16, device=DEVICE).index_add_(
        0, torch.tensor([0, 1], device=DEVICE), torch.ones(2, dtype=torch.int16, device=DEVICE)), "dtype int16"),
    ("native_group_norm", lambda: torch.nn.functional.group_norm(_randn(2, 4, 3, dtype=torch.float64), 2),
     "dtype float64 (the kernels take bfloat16, float16, float32)"),
    ("native_group_norm_backward", lambda: torch.ops.aten.native_group_norm_backward(
        *(_randn(*shape, dtype=torch.float64) for shape in ((2, 4, 15), (2, 4, 15), (2, 2), (2, 2), (4,))),
        2, 4, 15, 2, [True, True, True]), "dtype float64 (the kernels take bfloat16, float16, float32)"),
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
    assert rms_norm.FAMILY["_fused_rms_norm"].explain(x.double(), (8,), None, None).startswith("dtype float64")
    assert rms_norm.FAMILY["_fused_rms_norm"].explain(x, (4,), None, None) == "normalized_shape (4,) is not the trailing shape of (4, 8)"
    assert rms_norm.FAMILY["_fused_rms_norm"].explain(x, (8,), torch.ones(4, device=DEVICE), None) == "weight shape (4,) is not (8,)"


def test_the_unmeasured_triton_ops_are_installed_for_these_tests():
    """conftest sets PYTHON_NATIVE_UNMEASURED=1: the explanation cases above run rather than skip."""
    from python_native_dsls.triton import runtime_available
    from python_native_dsls.triton.ops import dropout, group_norm, reductions, scatter_add, topk

    if not runtime_available():
        pytest.skip("the Triton backend is unavailable here")
    unmeasured = {s.op for m in (dropout, group_norm, reductions, scatter_add, topk) for s in m.FAMILY.specs if not s.measured}
    assert {"sum.dim_IntList", "topk", "scatter_add", "index_add_", "native_group_norm_backward"} <= unmeasured
    assert unmeasured <= set(pn.get_dsl_operations("triton"))


_SYMBOLS = {"group_norm": "native_group_norm", "group_norm_backward": "native_group_norm_backward"}


def _explained(module, name: str):
    """A family's cond and explanation by the op's short name (``sum``, ``index_add_``, ``group_norm``)."""
    symbol = module.OPS[name][0] if module.__name__.endswith("reductions") else _SYMBOLS.get(name, name)
    built = module.FAMILY[symbol]
    return built.cond, built.explain


def _accepted_calls():
    from python_native_dsls.triton.ops import group_norm, reductions, scatter_add, topk

    x, ints = _randn(4, 8), torch.arange(32, device=DEVICE).view(4, 8)
    idx, idx32 = torch.tensor([[0, 3, 1, 2, 0, 1, 3, 2]], device=DEVICE), torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    img, w = _randn(2, 4, 3, 5), torch.ones(4, device=DEVICE)
    stats = _randn(2, 2)
    return [
        (reductions, "sum", (x, [1]), {}), (reductions, "sum", (x, [0], True), {"dtype": torch.float64}),
        (reductions, "sum", (ints, [-1]), {}), (reductions, "mean", (x.t(), [0]), {}),
        (reductions, "mean", (ints, [1]), {"dtype": torch.float32}), (reductions, "prod", (x, 0), {}),
        (reductions, "amax", (x, [1]), {}), (reductions, "amin", (x[:, ::2], [0], True), {}),
        (reductions, "argmax", (x, 1), {}), (reductions, "argmin", (ints, 0), {}),
        (reductions, "max", (x, -1), {}), (reductions, "min", (x.expand(3, 4, 8), 1), {}),
        (topk, "topk", (x, 3, 1, True, True), {}), (topk, "topk", (x.t(), 2, 0, False, True), {}),
        (topk, "topk", (_randn(2, 3, 4), 3, 1, True, False), {}),
        (scatter_add, "scatter_add", (torch.zeros(4, 8, device=DEVICE), 0, idx, _randn(1, 8)), {}),
        (scatter_add, "scatter_add_", (torch.zeros(4, 8, device=DEVICE), 0, idx, _randn(1, 8)), {}),
        (scatter_add, "index_add", (torch.zeros(5, 3, device=DEVICE), 0, idx32, _randn(2, 3)), {"alpha": 2}),
        (scatter_add, "index_add_", (torch.zeros(5, 3, dtype=torch.int64, device=DEVICE), 0, idx32,
                                     torch.ones(2, 3, dtype=torch.int64, device=DEVICE)), {"alpha": 1}),
        (group_norm, "group_norm", (img, w, w, 2, 4, 15, 2, 1e-5), {}),
        (group_norm, "group_norm", (img.to(memory_format=torch.channels_last), None, None, 2, 4, 15, 4, 1e-5), {}),
        (group_norm, "group_norm_backward", (_randn(2, 4, 3, 5), img, stats, stats, w, 2, 4, 15, 2, [True] * 3), {}),
        (group_norm, "group_norm_backward", (_randn(2, 4, 1, 1).expand(2, 4, 3, 5), img, stats, stats, None,
                                             2, 4, 15, 2, [True, False, False]), {}),
    ]


def test_the_new_triton_explanations_have_nothing_to_say_where_the_cond_accepts():
    for module, name, args, kwargs in _accepted_calls():
        cond, explain = _explained(module, name)
        assert cond(*args, **kwargs) is not None, (name, args, kwargs)
        assert explain(*args, **kwargs) is None, (name, args, kwargs)


def _declined_calls():
    from python_native_dsls.triton.ops import group_norm, reductions, scatter_add, topk

    x, ints, idx = _randn(4, 8), torch.arange(32, dtype=torch.int32, device=DEVICE).view(4, 8), torch.tensor([0, 1], device=DEVICE)
    shared = torch.zeros(6, device=DEVICE)
    half = _randn(2, 4, 3, dtype=torch.float16)
    return [
        (reductions, "mean", (ints, [1]), {}, "mean of int32 without a float dtype="),
        (reductions, "sum", (x.double(), [1]), {"dtype": torch.float16},
         "dtype=float16 from float64: not rounded as aten rounds"),
        (reductions, "amin", (x, [2]), {}, "dim 2 is out of range for a 2-d input"),
        (reductions, "max", (x > 0, 1), {}, "dtype bool (the max kernels take bfloat16, float16, float32, float64, "),
        (topk, "topk", (x, 9, 1, True, True), {}, "k = 9 exceeds the dim's size 8"),
        (topk, "topk", (x, 0, 1, True, True), {}, "k = 0 (the kernels take 1 <= k <= 1024)"),
        (scatter_add, "scatter_add", (x, 0, idx.int().view(2, 1), x), {}, "index dtype int32 (scatter_add takes int64)"),
        (scatter_add, "scatter_add", (x, 0, torch.zeros(2, 9, dtype=torch.int64, device=DEVICE), _randn(2, 9)), {},
         "index size 9 exceeds self's 8 at dim 1"),
        (scatter_add, "index_add", (x, 0, idx.view(1, 2), x[:2]), {"alpha": 1}, "a 2-d index (index_add takes 1-d)"),
        (scatter_add, "index_add", (torch.zeros(5, dtype=torch.int32, device=DEVICE), 0, idx,
                                    torch.ones(2, dtype=torch.int32, device=DEVICE)), {"alpha": 2**31},
         "alpha = 2147483648 cannot be converted to int32 without overflow (aten raises)"),
        (scatter_add, "index_add_", (shared, 0, idx, shared[2:4]), {"alpha": 1}, "in place: self overlaps source in memory"),
        (group_norm, "group_norm", (_randn(2, 6, 3), None, None, 2, 6, 3, 4, 1e-5), {}, "C = 6 is not divisible by group = 4"),
        (group_norm, "group_norm", (_randn(2, 4, 3), None, None, 2, 4, 5, 2, 1e-5), {},
         "N = 2, C = 4, HxW = 5 do not match the input's shape (2, 4, 3)"),
        (group_norm, "group_norm", (_randn(2, 4, 3), torch.ones(8, device=DEVICE)[::2], None, 2, 4, 3, 2, 1e-5), {},
         "weight is not contiguous"),
        (group_norm, "group_norm_backward", (half, half, _randn(2, 2), _randn(2, 2), None, 2, 4, 3, 2, [True] * 3), {},
         "mean dtype float32 differs from the input's float16"),
        (group_norm, "group_norm_backward", (_randn(2, 4, 5, 3).transpose(2, 3), _randn(2, 4, 3, 5), _randn(2, 2),
                                             _randn(2, 2), None, 2, 4, 15, 2, [True] * 3), {},
         "layout: grad_out's spatial dims do not collapse to one stride"),
    ]


def test_the_new_triton_explanations_name_what_their_cond_declines():
    for module, name, args, kwargs, reason in _declined_calls():
        cond, explain = _explained(module, name)
        assert cond(*args, **kwargs) is None, (name, reason)
        found = explain(*args, **kwargs)
        assert found is not None and found.startswith(reason), (name, found)


def test_scatter_add_explains_the_deterministic_mode():
    from python_native_dsls.triton.ops import scatter_add

    args = (torch.zeros(4, device=DEVICE), 0, torch.tensor([0, 1], device=DEVICE), _randn(2))
    assert scatter_add.FAMILY["scatter_add"].explain(*args) is None
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert scatter_add.FAMILY["scatter_add"].cond(*args) is None
        assert scatter_add.FAMILY["scatter_add"].explain(*args).startswith("deterministic algorithms are on")
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# ----- trace.summary() -----


def test_the_summary_counts_events_per_op_outcome_and_reason(overrides, x):
    overrides("sub.Tensor", two_d, marked_sub, explain=counting_explain([]))
    with pn.trace() as t:
        for _ in range(3):
            torch.sub(x, x)
        for _ in range(2):
            torch.sub(torch.ones(3), torch.ones(3))
        with pn.operations_disabled("sub"):
            torch.sub(x, x)
    summary = t.summary()
    assert list(summary) == [
        ("sub.Tensor", "override", TEST_DSL, None, 3),
        ("sub.Tensor", "fallback", None, f"{TEST_DSL}: a 1-d input (takes 2-d)", 2),
        ("sub.Tensor", "fallback", None, f"{TEST_DSL}: op sub disabled by a scope", 1),
    ]
    assert summary[0].count == 3 and summary.total == 6 and summary.dropped == 0
    assert summary.counts()[("sub.Tensor", "fallback", None, f"{TEST_DSL}: op sub disabled by a scope")] == 1
    lines = str(summary).splitlines()
    assert lines[0].split() == ["op", "outcome", "dsl", "count", "reason"]
    assert lines[1].split()[:4] == ["sub.Tensor", "override", TEST_DSL, "3"]
    assert lines[-1] == "6 events"
    assert json.loads(json.dumps([row._asdict() for row in summary]))[2]["count"] == 1  # plain data


def test_an_empty_trace_summarises_to_nothing():
    with pn.trace() as t:
        pass
    assert list(t.summary()) == [] and str(t.summary()).splitlines() == ["op  outcome  dsl  count  reason", "0 events"]
