"""Op families as declarations (``python_native_dsls.family``): the cond, its explanation and the plan
cache built from one ``plan_or_why`` per op and its layout key.

The conds and what traces say of their declines come from the same function, so they cannot
drift: over a table of calls, a call is declined exactly where a reason is given, and the reason is
the expected one. Every family is covered from its declarations, not the table: each forward op
takes the call its first verify case makes, and declines it on a device the kernels never run on.
"""

from __future__ import annotations

import pytest
import torch
from declared_calls import captured_call, first_forward
from torch.utils import _pytree as pytree

import python_native as pn  # noqa: F401  (first: the backends register through it)

# isort: split
import python_native_dsls.triton as triton_backend
from python_native_dsls import family
from python_native_dsls.family import Family, Op
from python_native_dsls.triton import ops as triton_ops

DEVICE = triton_backend.device_type()
OTHER = "meta"  # a device the Triton kernels never run on


def t(*shape: int, dtype: torch.dtype = torch.float32, device: str = DEVICE) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device="cpu").to(device)


def _families() -> dict[str, Family]:
    return {f.name: f for f in triton_ops.families()}


def _calls() -> list[tuple[str, str, tuple, dict, str | None]]:
    """``(family, op, args, kwargs, reason)``: reason None where the kernels take the call, else
    how the reason starts."""
    x, idx = t(4, 8), torch.tensor([[0, 3, 1, 2, 0, 1, 3, 2]], device=DEVICE)
    img, stats = t(2, 4, 3, 5), t(2, 2)
    mean, rstd = t(4, 1), t(4, 1).abs()
    f64 = "dtype float64 (the kernels take bfloat16, float16, float32)"
    return [
        ("softmax", "_softmax", (x, -1, False), {}, None),
        ("softmax", "_softmax", (x, 0, False), {}, "dim 0 is not the last dim of size > 1"),
        ("softmax", "_softmax", (x.double(), 1, False), {}, f64),
        ("softmax", "_log_softmax", (t(4, 8, device=OTHER), 1, False), {}, "device meta"),
        ("softmax", "_softmax_backward_data", (x, x, 1, torch.float32), {}, None),
        ("softmax", "_softmax_backward_data", (x.half(), x, 1, torch.float32), {}, "grad_output dtype float16"),
        ("layer_norm", "native_layer_norm", (x, [8], t(8), t(8), 1e-5), {}, None),
        ("layer_norm", "native_layer_norm", (x, [8], t(8).half(), None, 1e-5), {}, "weight dtype float16"),
        ("layer_norm", "native_layer_norm", (x, [4], None, None, 1e-5), {},
         "normalized_shape (4,) is not the trailing shape of (4, 8)"),
        ("layer_norm", "native_layer_norm_backward", (x, x, [8], mean, rstd, t(8), None, [True, True, False]), {},
         None),
        ("layer_norm", "native_layer_norm_backward", (x, x, [8], mean, rstd, None, None, [True, True, False]), {},
         "a gradient asked for the weight, which is None"),
        ("layer_norm", "native_layer_norm_backward", (x, x, [8], t(3, 1), rstd, None, None, [True, False, False]),
         {}, "mean has 3 values for 4 rows"),
        ("rms_norm", "_fused_rms_norm", (x, [8], t(8), None), {}, None),
        ("rms_norm", "_fused_rms_norm", (x[:, ::2], [4], None, None), {}, None),
        ("rms_norm", "_fused_rms_norm_backward", (x, x, [8], rstd, None, [True, False]), {}, None),
        ("rms_norm", "_fused_rms_norm_backward", (x.t(), x, [8], rstd, None, [True, False]), {},
         "grad_out shape (8, 4) differs from the input's (4, 8)"),
        ("activations", "silu", (x,), {}, None),
        ("activations", "silu", (x[:, ::2],), {}, "layout: neither dense nor rows with a contiguous last dim"),
        ("activations", "silu", (x[:, :4],), {}, None),  # rows at a stride: the halves of a fused projection
        ("activations", "silu_backward", (x[:, :4], x[:, 2:6]), {}, None),
        ("activations", "gelu", (x,), {"approximate": "tanh"}, None),
        ("activations", "gelu", (x,), {"approximate": "bogus"}, "approximate='bogus'"),
        ("activations", "gelu_backward", (x, x.t().contiguous().t()), {"approximate": "none"},
         "layout: neither dense nor rows with a contiguous last dim"),  # the input's columns are strided
        ("activations", "gelu_backward", (t(4, 4), x), {"approximate": "none"}, "layout: operands differ"),
        ("bmm", "bmm", (t(2, 3, 1), t(2, 1, 4)), {}, None),
        ("bmm", "bmm", (t(2, 3, 2), t(2, 2, 4)), {}, "not an outer product: inner dimension K = 2"),
        ("group_norm", "native_group_norm", (img, None, None, 2, 4, 15, 2, 1e-5), {}, None),
        ("group_norm", "native_group_norm", (img, None, None, 2, 4, 15, 3, 1e-5), {},
         "C = 4 is not divisible by group = 3"),
        ("group_norm", "native_group_norm_backward", (img, img, stats, stats, None, 2, 4, 15, 2, [True] * 3), {},
         None),
        ("group_norm", "native_group_norm_backward", (img, img, stats.half(), stats, None, 2, 4, 15, 2, [True] * 3),
         {}, "mean dtype float16 differs"),
        ("dropout", "native_dropout", (x, 0.2, True), {}, None),
        ("dropout", "native_dropout", (x, 0.2, False), {}, "train=False"),
        ("dropout", "native_dropout", (x, 1.5, True), {}, "p = 1.5 is outside [0, 1]"),
        ("dropout", "native_dropout_backward", (x, x > 0, 1.25), {}, None),
        ("dropout", "native_dropout_backward", (x, x, 1.25), {}, "mask dtype float32"),
        ("dropout", "bernoulli_.float", (x, 0.5), {"generator": None}, None),
        ("dropout", "bernoulli_.float", (x, -0.5), {"generator": None}, "p = -0.5 is outside [0, 1]"),
        ("reductions", "sum.dim_IntList", (x, [1]), {}, None),
        ("reductions", "sum.dim_IntList", (x, [0, 1]), {}, "dim=[0, 1]: the kernels reduce over exactly one dim"),
        ("reductions", "mean.dim", (x.int(), [1]), {}, "mean of int32 without a float dtype="),
        ("reductions", "argmax", (x, None), {}, "dim=None"),
        ("reductions", "max.dim", (x, 1), {}, None),
        ("topk", "topk", (x, 3, 1, True, True), {}, None),
        ("topk", "topk", (x, 9, 1, True, True), {}, "k = 9 exceeds the dim's size 8"),
        ("scatter_add", "scatter_add", (torch.zeros(4, 8, device=DEVICE), 0, idx, t(1, 8)), {}, None),
        ("scatter_add", "scatter_add", (x, 0, idx.int(), x), {}, "index dtype int32"),
        ("scatter_add", "index_add", (torch.zeros(5, 3, device=DEVICE), 0, idx[0, :2], t(2, 3)), {"alpha": 2}, None),
        ("scatter_add", "index_add_", (x, 0, idx[0, :2], x[:2]), {"alpha": 1}, "in place: self overlaps source"),
        ("linear_cross_entropy", "linear_cross_entropy.forward",
         (t(4, 8), t(10, 8), torch.tensor([1, 0, 9, 3], device=DEVICE), None, "mean", -100, 0.0), {}, None),
        ("linear_cross_entropy", "linear_cross_entropy.forward",
         (t(4, 8), t(10, 8), torch.tensor([1, 0, 9, 3], device=DEVICE), None, "max", -100, 0.0), {},
         "reduction='max'"),
        # the ops model patching declares (python_native::...)
        ("model_rms_norm", "rms_norm", (x, t(8), 1e-6, 0.0, False), {}, None),
        ("model_rms_norm", "rms_norm", (t(2, 3, 4, 8).transpose(1, 2), t(8), 1e-6, 1.0, True), {}, None),
        ("model_rms_norm", "rms_norm", (x, t(4), 1e-6, 0.0, False), {}, "weight shape (4,) is not (8,)"),
        ("model_rms_norm", "rms_norm", (x.double(), t(8).double(), 1e-6, 0.0, False), {}, f64),
        ("model_rms_norm", "rms_norm_backward", (x, x, t(8), 1e-6, 0.0, False), {}, None),
        ("model_rms_norm", "rms_norm_backward", (x.t(), x, t(8), 1e-6, 0.0, False), {},
         "grad_output shape (8, 4) differs from the input's (4, 8)"),
        ("gated", "swiglu", tuple(t(4, 16).chunk(2, -1)), {}, None),
        ("gated", "swiglu", (x, x.half()), {}, "up dtype float16 differs from gate's float32"),
        ("gated", "geglu", (x, x, "erf"), {}, "approximate='erf'"),
        ("gated", "geglu_backward", (x, x, x, "tanh"), {}, None),
        ("rotary", "rotary", (t(2, 5, 4, 8).transpose(1, 2), t(2, 5, 2, 8).transpose(1, 2), t(2, 5, 8), t(2, 5, 8), 1),
         {}, None),
        ("rotary", "rotary", (t(2, 4, 5, 7), t(2, 4, 5, 7), t(2, 5, 7), t(2, 5, 7), 1), {}, "head dims q 7, k 7, cos 7"),
        ("rotary", "rotary_backward", (t(2, 4, 5, 8), t(2, 2, 5, 8), t(2, 5, 8), t(2, 5, 8), 1), {}, None),
        ("model_activations", "quick_gelu", (x[:, ::2],), {}, None),  # any column stride
        ("model_activations", "gelu_tanh", (t(0, 3),), {}, "empty input"),
        ("model_activations", "gelu_tanh_backward", (x, x.double()), {}, f64),
        ("moe", "moe_route", (x, 2, "softmax", False, True), {}, None),
        ("moe", "moe_route", (x, 3, "sigmoid", False, True, 1e-20, t(8), 4, 2, 2.5), {}, None),
        ("moe", "moe_route", (x, 5, "sigmoid", False, True, 1e-20, t(8), 4, 2, 2.5), {},
         "top_k=5 exceeds the 4 experts of the topk_group=2 chosen groups"),
        ("moe", "moe_route_backward", (t(4, 2), x, idx.view(4, 2), 2), {"topk_first": True}, None),
        ("moe", "moe_experts", (t(6, 16), idx.view(4, 2).repeat(2, 1)[:6], t(6, 2), t(4, 16, 16), t(4, 16, 8)), {},
         None),
        ("moe", "moe_experts", (t(6, 16).double(), idx.view(4, 2)[:3].repeat(2, 1), t(6, 2), t(4, 16, 16).double(),
                                t(4, 16, 8).double()), {}, "hidden dtype float64"),
        ("moe", "moe_experts", (t(6, 16), idx.view(4, 2)[:3].repeat(2, 1), t(6, 2), t(4, 16, 16), t(4, 16, 8), None,
                                t(16, 4).t()), {}, "down_bias at column stride 4"),
        ("moe", "moe_experts_backward", (t(6, 16), t(6, 16), idx.view(4, 2)[:3].repeat(2, 1), t(6, 2), t(4, 16, 16),
                                         t(4, 16, 8), None, None, "silu", False, False, 7.0, 1.702, "sum"), {}, None),
    ]


@pytest.mark.parametrize("name", sorted(_families()))
def test_every_forward_takes_its_first_verify_case_and_declines_it_elsewhere(name):
    """Derived from the declarations: the arguments the first case of each forward's verify driver
    passes the op are planned, and the same call on the meta device is declined with a reason."""
    fam = _families()[name]
    first_forward(fam)  # fails naming a family that declares no driver
    for built in fam:
        if built.op.backward:
            continue
        args, kwargs = captured_call(built, DEVICE)
        assert built.cond(*args, **kwargs) and built.explain(*args, **kwargs) is None, built.explain(*args, **kwargs)
        args, kwargs = pytree.tree_map_only(torch.Tensor, lambda x: x.to(OTHER), (args, kwargs))
        why = built.explain(*args, **kwargs)
        assert built.cond(*args, **kwargs) is None and why is not None and why.startswith(f"device {OTHER}"), why


@pytest.mark.parametrize("case", _calls(), ids=lambda c: f"{c[1]}-{c[4] or 'accepted'}")
def test_a_call_is_declined_exactly_where_a_reason_is_given(case):
    name, op, args, kwargs, reason = case
    built = _families()[name][op]
    plan, why = built.cond(*args, **kwargs), built.explain(*args, **kwargs)
    if reason is None:
        assert plan and why is None, why
        assert built.cond(*args, **kwargs) is plan  # the second call is a cache hit: the same plan
    else:
        assert plan is None and why is not None and why.startswith(reason), why


def test_fake_tensors_are_planned_directly_and_alike():
    from torch._subclasses.fake_tensor import FakeTensorMode

    built = _families()["softmax"]["_softmax"]
    x = t(8, 300)
    real = built.cond(x, -1, False)
    before = len(built.cache)
    with FakeTensorMode() as mode:
        fake = built.cond(mode.from_tensor(x), -1, False)
    assert fake._replace(serial=0) == real._replace(serial=0) and len(built.cache) == before


def _toy(key: tuple[str, ...], **op: object) -> Family:
    def plan_or_why(self, other, alpha=1):
        return "not 2-d" if self.ndim != 2 else ("plan", tuple(self.shape), alpha)

    return Family("testdsl", "toy", [Op("sub.Tensor", plan_or_why, lambda *a, **k: None, key, **op)], kernels="x.y")


def test_the_generated_cond_keys_tensors_by_layout_and_values_as_they_are():
    built = _toy(("self", "other", "alpha"))["sub.Tensor"]
    a = torch.ones(2, 3)
    assert built.cond(a, a, alpha=2) == ("plan", (2, 3), 2) and len(built.cache) == 1
    assert built.cond(a.clone(), a, alpha=2) is built.cond(a, a, alpha=2) and len(built.cache) == 1
    assert built.cond(a, a, alpha=3) == ("plan", (2, 3), 3) and len(built.cache) == 2
    assert built.cond(torch.ones(3), a) is None and built.explain(torch.ones(3), a) == "not 2-d"
    assert "_pn_lookup(_pn_k, _pn_MISSING)" in built.cond.source


def test_a_per_call_check_declines_what_no_key_holds():
    seen = []

    def check(plan, self, other, alpha=1):
        seen.append(plan)
        return "overlaps" if self is other else None

    built = _toy(("self", "other"), check=check)["sub.Tensor"]
    a, b = torch.ones(2, 2), torch.ones(2, 2)
    assert built.cond(a, b) and built.cond(a, a) is None and built.explain(a, a) == "overlaps"
    assert len(seen) == 3 and len(built.cache) == 1


@pytest.mark.parametrize("key, message", [
    (("self", "bogus"), "layout key 'bogus' names bogus: neither a parameter"),
    (("alpha",), "names no tensor parameter"),
    (("self", "tuple(("), "not an expression"),
])
def test_a_bad_layout_key_is_named_when_the_family_is_declared(key, message):
    toy = _toy(key)
    assert toy.specs == [] and message in toy.problem


def test_a_family_of_an_op_this_torch_lacks_is_left_out_with_why():
    toy = Family("testdsl", "toy", [Op("no_such_op_here", lambda x: "no", lambda x: x, ("x",))], kernels="x.y")
    skipped: dict[str, str] = {}
    assert family.installable([toy], "CPU", skipped) == []
    assert skipped == {"toy": "aten::no_such_op_here does not exist"}


def test_families_of_one_kernel_module_share_its_loader():
    names = {f.name: f for f in triton_ops.families()}
    assert names["layer_norm"].kernels is names["rms_norm"].kernels
    assert names["softmax"].kernels is not names["layer_norm"].kernels


def test_a_family_is_found_by_being_in_the_ops_package_and_a_broken_one_disables_only_itself(tmp_path, monkeypatch):
    """No list names the families: a module of ``ops`` declaring a ``FAMILY`` is one. A module that fails
    to import is left out alone, named with its error where the status report reads what was skipped."""
    (tmp_path / "zz_broken_family.py").write_text("raise ImportError('a missing dependency')\n")
    (tmp_path / "zz_helper.py").write_text("VALUE = 1  # no FAMILY: a helper, not a family\n")
    monkeypatch.setattr(triton_ops, "__path__", [*triton_ops.__path__, str(tmp_path)])
    names = [f.name for f in triton_ops.families()]
    assert names == sorted(names) and {"softmax", "moe"} <= set(names)
    saved = dict(triton_ops.SKIPPED)
    try:
        specs = {s.op for s in triton_ops.all_overrides()}
        assert "a missing dependency" in triton_ops.SKIPPED["zz_broken_family"]
        triton = next(d for d in pn.status()["dsls"] if d["name"] == "triton")
        assert "zz_broken_family" in triton["skipped"] and "failed to import" in triton["skipped"]["zz_broken_family"]
        assert "zz_helper" not in triton["skipped"]
        assert specs >= {s.op for s in _families()["softmax"].specs} or "softmax" in triton_ops.SKIPPED
    finally:
        triton_ops.SKIPPED.clear()
        triton_ops.SKIPPED.update(saved)
