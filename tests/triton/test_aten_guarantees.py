"""aten's errors and guarantees through the Triton overrides: Scalar arguments the op's dtype cannot
hold raise aten's error, and under ``torch.use_deterministic_algorithms(True)`` every override
either declines (saying why) or returns the same bits run to run; the documented list of the ops
that decline is the registered ops' declarations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from triton_testing import DEVICE, assert_routed, deterministic, requires_triton, seeded  # noqa: F401

import python_native as pn
import python_native_dsls.cutedsl.ops as cutedsl_ops
from python_native.tools.verify.drivers import DRIVERS
from python_native.tools.verify.samples import Sample
from python_native_dsls.conds import params_of
from python_native_dsls.triton.ops import families

pytestmark = requires_triton

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _all_built():
    return [b for f in families() + cutedsl_ops.families() for b in f]


def _index_add(inplace: bool):
    def call(dtype: torch.dtype, alpha):
        s = torch.zeros(4, 3, device=DEVICE, dtype=dtype)
        src = torch.ones(6, 3, device=DEVICE, dtype=dtype)
        idx = torch.tensor([0, 1, 2, 3, 0, 1], device=DEVICE)
        return s.index_add_(0, idx, src, alpha=alpha) if inplace else torch.index_add(s, 0, idx, src, alpha=alpha)
    return call


# Every registered op with a Scalar argument: (dtype, value) -> the public call.
SCALAR_CALLS = {"index_add": _index_add(False), "index_add_": _index_add(True)}

# Values each dtype cannot hold: aten's checked conversion raises on every one.
OUT_OF_RANGE = {
    torch.float16: (1e5, -65536.0 * 2, 2**20, 1e39),
    torch.bfloat16: (1e39, -1e300, 2**200),
    torch.float32: (1e39, -1e300, 2**200),
    torch.float64: (2**1100,),
    torch.int32: (2**31, -(2**31) - 1, float("inf")),
    torch.int64: (2**63, -(2**63) - 1, float("nan")),
}


def test_the_scalar_grid_covers_every_registered_op_with_a_scalar_argument():
    with_scalars = {b.op.op for b in _all_built() if any(p.scalar for p in params_of(b.op.lib, b.op.op))}
    assert with_scalars == set(SCALAR_CALLS)


def _raised(fn) -> tuple[type, str] | None:
    try:
        fn()
    except Exception as e:
        return type(e), str(e)
    return None


# float64's only value is an int Python's argument parser refuses (OverflowError) before any dispatch:
# no override is asked, so that case is not one that asserts an override declined.
@pytest.mark.parametrize("dtype", [pytest.param(d, marks=() if d == torch.float64 else pytest.mark.override)
                                   for d in OUT_OF_RANGE], ids=str)
@pytest.mark.parametrize("op", list(SCALAR_CALLS))
def test_scalars_the_dtype_cannot_hold_raise_atens_error(op, dtype):
    for value in OUT_OF_RANGE[dtype]:
        with pn.triton.disabled():
            expected = _raised(lambda value=value: SCALAR_CALLS[op](dtype, value))
        assert expected is not None, f"aten takes {op} with {value!r} at {dtype}"
        with pn.trace() as trace:
            got = _raised(lambda value=value: SCALAR_CALLS[op](dtype, value))
        assert got == expected, f"{op}({value!r}) at {dtype}"
        if expected[0] is OverflowError:  # refused by the argument parser: nothing was dispatched
            assert not trace.events, f"{op}({value!r}) at {dtype}: {trace.events}"
        else:  # the override's guard declined it, and aten's kernel raised
            assert_routed(trace.events, {op: "cannot be converted to"}, f"{op}({value!r}) at {dtype}")


def test_the_refusal_names_the_value():
    built = next(b for b in families() if b.name == "scatter_add")["index_add"]
    s = torch.zeros(4, 3, device=DEVICE, dtype=torch.float16)
    idx, src = torch.tensor([0, 1], device=DEVICE), torch.ones(2, 3, device=DEVICE, dtype=torch.float16)
    assert built.cond(s, 0, idx, src, alpha=1e5) is None
    assert "alpha = 100000.0 cannot be converted to float16" in built.explain(s, 0, idx, src, alpha=1e5)
    assert built.cond(s, 0, idx, src, alpha=2.0) is not None


def _traced_run(sample: Sample):
    torch.manual_seed(0)
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in sample.inputs]
    with pn.trace() as trace:
        out = sample.fn(*leaves)
        out = out if isinstance(out, torch.Tensor) else out[0]
        if out.requires_grad and out.numel():
            out.backward(torch.ones_like(out))
    return [out.detach(), *(t.grad for t in leaves)], [e for e in trace.events if e.dsl == "triton"]


def _same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    bits = (lambda t: t.reshape(-1).contiguous().view(torch.uint8)) if a.numel() else (lambda t: t)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def _first_served(driver) -> Sample:
    """The first float32 sample the overrides serve (outside deterministic mode)."""
    for sample in driver.cases(torch.float32, DEVICE):
        try:
            events = _traced_run(sample)[1]
        except RuntimeError:  # a sample aten's own autograd refuses (scatter_add's source wider than its index)
            continue
        if any(e.outcome == "override" for e in events):
            return sample
    raise AssertionError("no float32 sample of the driver reaches an override")


@pytest.mark.parametrize("op", list(DRIVERS))
@pytest.mark.override
def test_under_deterministic_algorithms_every_override_declines_or_repeats_its_bits(op, request):
    sample = _first_served(DRIVERS[op])
    request.getfixturevalue("deterministic")
    first, events = _traced_run(sample)
    again, _ = _traced_run(sample)
    declared = {b.op.op: b.op for b in _all_built()}
    for e in events:
        if e.outcome == "override":
            assert declared[e.op].nondeterministic is None or declared[e.op].deterministic_when, e.op
    served = [e for e in events if e.outcome == "override"]
    if served:
        assert all(_same_bits(a, b) for a, b in zip(first, again, strict=True)), f"{op}: results vary run to run"
    declined = {e.op for e in events if e.outcome == "fallback"} & {
        name for name, o in declared.items() if o.nondeterministic is not None}
    for name in declined:
        assert any(e.op == name and "deterministic algorithms are on" in (e.reason or "") for e in events), events


@pytest.mark.usefixtures("deterministic")
@pytest.mark.parametrize("op", ["scatter_add", "scatter_add_", "index_add", "index_add_"])
def test_declared_nondeterministic_ops_decline_floats_and_say_why(op):
    built = next(b for b in families() if b.name == "scatter_add")[op]
    s, src = torch.zeros(4, 3, device=DEVICE), torch.ones(6, 3, device=DEVICE)
    idx = torch.tensor([0, 1, 2, 3, 0, 1], device=DEVICE)
    args = (s, 0, idx[:, None].expand(6, 3), src) if op.startswith("scatter") else (s, 0, idx, src)
    kwargs = {} if op.startswith("scatter") else {"alpha": 1}
    assert built.cond(*args, **kwargs) is None
    assert built.explain(*args, **kwargs) == f"deterministic algorithms are on: {built.op.nondeterministic}"
    integers = (s.long(), *args[1:3], src.long())
    assert built.cond(*integers, **kwargs) is not None  # integer sums are exact in any order


def _documented() -> set[str]:
    page = (DOCS / "user-guide.md").read_text()
    section = page.split("### Deterministic algorithms", 1)[1].split("\n#", 1)[0]
    return {m.group(1) for line in section.splitlines() if line.startswith("|") and not line.startswith("| op")
            for m in [re.match(r"\| `([^`]+)`", line)] if m}


def test_the_documented_list_is_the_declared_one():
    declared = {b.op.op for b in _all_built() if b.op.nondeterministic is not None}
    assert declared and _documented() == declared


def _lazy(t: torch.Tensor) -> torch.Tensor:
    """A copy-on-write clone of ``t`` (sharing its memory until either is written)."""
    lazy = torch._lazy_clone(t.detach())
    assert torch._C._is_cow_tensor(lazy)
    return lazy.requires_grad_(t.is_floating_point())


@pytest.mark.parametrize("op", [op for op in DRIVERS if not DRIVERS[op].check])  # random ops: checked elsewhere
@pytest.mark.override
def test_copy_on_write_inputs_give_atens_results(op):
    sample = _first_served(DRIVERS[op])
    torch.manual_seed(0)
    sources = [t.detach().clone() for t in sample.inputs]
    kept = [t.clone() for t in sources]
    leaves = [_lazy(t) for t in sources]
    with pn.trace() as trace:
        out = sample.fn(*leaves)
        out = out if isinstance(out, torch.Tensor) else out[0]
        if out.requires_grad and out.numel():
            out.backward(torch._lazy_clone(torch.ones_like(out)))
    assert any(e.dsl == "triton" and e.outcome == "override" for e in trace.events)
    with pn.triton.disabled():
        expected, _ = _traced_run(Sample(sample.source, sample.fn, kept))
    for got, ref in zip([out.detach(), *(t.grad for t in leaves)], expected, strict=True):
        assert (got is None) == (ref is None)
        if got is not None:
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4, equal_nan=True)
    assert all(torch.equal(s, k) for s, k in zip(sources, kept, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
@pytest.mark.parametrize("op", ["scatter_add_", "index_add_"])
@pytest.mark.override
def test_in_place_calls_on_copy_on_write_inputs_write_only_their_own_memory(op, dtype):
    idx = torch.tensor([0, 1, 2, 3, 0, 1], device=DEVICE)
    source, src = torch.arange(12, device=DEVICE).reshape(4, 3).to(dtype), torch.ones(6, 3, device=DEVICE, dtype=dtype)
    call = ((lambda s, v: s.scatter_add_(0, idx[:, None].expand(6, 3), v)) if op == "scatter_add_"
            else (lambda s, v: s.index_add_(0, idx, v)))
    kept = source.clone()
    lazy, lazy_src = torch._lazy_clone(source), torch._lazy_clone(src)
    with pn.trace() as trace:
        got = call(lazy, lazy_src)
    assert [e.op for e in trace.events if e.dsl == "triton" and e.outcome == "override"] == [op]
    with pn.triton.disabled():
        expected = call(kept.clone(), src.clone())
    assert got is lazy and torch.equal(lazy, expected) and torch.equal(source, kept)


SCALAR_VALUES = (0, 1, -1, 255, 256, -129, 2**15, 2**31, -(2**31) - 1, 2**63, 65504.0, 65520.0, 1e5, 3.4e38, 1e39,
                 float("inf"), float("nan"), 1e-50, 2**1100 // 2**100)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
                                   torch.uint8, torch.int16, torch.int32, torch.int64], ids=str)
def test_the_scalar_conversion_rule_is_atens(dtype):
    """``scalars.converts`` says exactly where aten's checked conversion (``add``'s alpha) raises."""
    from python_native_dsls import scalars

    t = torch.zeros(1, dtype=dtype)
    for value in SCALAR_VALUES:
        if not dtype.is_floating_point and isinstance(value, float):
            continue  # aten refuses a float alpha for integer tensors before converting it
        with pn.triton.disabled():
            raised = _raised(lambda value=value: torch.add(t, t, alpha=value))
        assert scalars.converts(value, dtype) == (raised is None), f"{value!r} at {dtype}: {raised}"


def test_guards_name_what_they_check():
    from python_native_dsls.conds import FLOAT32, Guards, make_cond, params_of
    from python_native_dsls.family import Family, Op

    params = params_of("aten", "index_add")
    with pytest.raises(ValueError, match="'index' is not a scalar parameter"):
        make_cond("c", params, ("self",), lambda *a, **k: "no", guards=Guards(scalars=(("index", FLOAT32),)))
    with pytest.raises(ValueError, match="converts to 'nowhere'"):
        make_cond("c", params, ("self",), lambda *a, **k: "no", guards=Guards(scalars=(("alpha", "nowhere"),)))
    with pytest.raises(ValueError, match="deterministic_when 'unknown_name"):
        make_cond("c", params, ("self",), lambda *a, **k: "no", guards=Guards("atomics", "unknown_name > 0"))
    family = Family("triton", "bad", [Op("index_add", lambda *a, **k: "no", lambda *a, **k: None, ("self",),
                                         replayable=True, nondeterministic="atomics")], kernels="scatter_add")
    assert "a replayable op must be deterministic" in family.problem


def test_a_float32_scalar_guard_declines_what_float32_cannot_hold():
    from python_native_dsls.conds import FLOAT32, Guards, make_cond, params_of

    plan = ("a plan",)
    cond, _ = make_cond("c", params_of("aten", "index_add"), ("self",), lambda *a, **k: plan,
                        guards=Guards(scalars=(("alpha", FLOAT32),)))
    s, idx = torch.zeros(2, device=DEVICE), torch.tensor([0], device=DEVICE)
    assert cond(s, 0, idx, s[:1], alpha=0.5) is plan
    assert cond(s, 0, idx, s[:1], alpha=1e-50) is None
    assert "below float32's normal range" in cond.refusal(s, 0, idx, s[:1], alpha=1e-50)
    assert "overflows float32" in cond.refusal(s, 0, idx, s[:1], alpha=1e39)
