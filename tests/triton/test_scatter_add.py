"""``scatter_add`` and ``index_add`` (functional, in place, ``out=``) through the Triton override:
values, dtypes, layouts, gradients, integer exactness, determinism, bounds, declines, switches."""

from __future__ import annotations

import pytest
import torch
from triton_testing import (  # noqa: F401
    DEVICE,
    DTYPES,
    assert_matches,
    assert_routed,
    aten,
    compare,
    deterministic,
    make,
    requires_triton,
    run,
    seeded,
    traced,
)

import python_native as pn
from python_native_dsls.triton.ops import all_overrides

pytestmark = requires_triton

OPS = ("scatter_add", "scatter_add_", "scatter_add.out", "index_add", "index_add_", "index_add.out")


def index(high: int, *shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.randint(0, high, shape, device=DEVICE, dtype=dtype)


def values(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return make(*shape, dtype=dtype, requires_grad=False)
    return torch.randint(-1000, 1000, shape, device=DEVICE, dtype=dtype)


def check_against_aten(fn, *inputs):
    """``fn`` on copies of ``inputs`` with and without the overrides: dtype, shape and strides
    equal; values exact for integers, within verify's rule for floats. Returns what fired."""
    got, fired = traced(lambda: fn(*[t.clone() for t in inputs]))
    ref = aten(lambda: fn(*[t.clone() for t in inputs]))
    assert got.dtype == ref.dtype and got.shape == ref.shape and got.stride() == ref.stride()
    if got.dtype.is_floating_point:
        truth = aten(lambda: fn(*[t.clone().double() if t.is_floating_point() else t for t in inputs]))
        assert_matches(got, ref, truth, "result")
    else:
        assert torch.equal(got, ref)
    return fired


CALLS = {  # op -> fn(self, source) for the MoE layout: 96 token rows into 16 rows of 24
    "scatter_add": lambda idx: lambda s, src: s.scatter_add(0, idx[:, None].expand(src.shape), src),
    "scatter_add_": lambda idx: lambda s, src: s.scatter_add_(0, idx[:, None].expand(src.shape), src),
    "scatter_add.out": lambda idx: lambda s, src: torch.scatter_add(s, 0, idx[:, None].expand(src.shape), src,
                                                                    out=s.new_empty(0)),
    "index_add": lambda idx: lambda s, src: torch.index_add(s, 0, idx, src, alpha=3),
    "index_add_": lambda idx: lambda s, src: s.index_add_(0, idx, src),
    "index_add.out": lambda idx: lambda s, src: torch.index_add(s, 0, idx, src, alpha=-1,
                                                                out=s.new_empty(0)),
}


# aten's CUDA kernels check indices with a device-side assert, which ends the process's CUDA context
# (every later test in the worker would fail): aten's error can be compared only where it raises.
host_checked_indices = pytest.mark.skipif(DEVICE == "cuda", reason="aten asserts on the device for a bad index on CUDA")


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.override
def test_public_calls_reach_the_override_and_match_aten(op, dtype):
    fn = CALLS[op](index(16, 96))
    fired = check_against_aten(fn, values(16, 24, dtype=dtype), values(96, 24, dtype=dtype))
    assert fired == [op]


@pytest.mark.parametrize("case", ["dim 1", "middle dim", "index smaller than src", "transposed self",
                                  "strided src", "negative dim"])
@pytest.mark.override
def test_scatter_add_layouts(case):
    s, src = make(5, 7, requires_grad=False), make(6, 12, requires_grad=False)
    dim, idx = 1, index(7, 5, 9)
    if case == "middle dim":
        s, src, idx = make(3, 4, 5, requires_grad=False), make(3, 6, 5, requires_grad=False), index(4, 3, 6, 5)
    elif case == "index smaller than src":
        dim, idx = 0, index(5, 4, 3)
    elif case == "transposed self":
        s, dim, idx = make(7, 5, requires_grad=False).t(), 0, index(5, 6, 7)
    elif case == "strided src":
        src, idx = make(6, 24, requires_grad=False)[:, ::2], index(7, 5, 12)
    elif case == "negative dim":
        dim = -1
    assert check_against_aten(lambda a, b: a.scatter_add(dim, idx, b), s, src) == ["scatter_add"]
    assert check_against_aten(lambda a, b: a.scatter_add_(dim, idx, b[tuple(map(slice, idx.shape))]), s, src) == [
        "scatter_add_"]


@pytest.mark.parametrize("case", ["dim 1, int32 index", "3-D middle dim", "1-D", "sliced source", "channels last"])
@pytest.mark.override
def test_index_add_layouts(case):
    if case == "dim 1, int32 index":
        s, idx, src, dim = make(4, 9), index(9, 20, dtype=torch.int32), make(4, 20), 1
    elif case == "3-D middle dim":
        s, idx, src, dim = make(2, 5, 3), index(5, 7), make(2, 7, 3), 1
    elif case == "1-D":
        s, idx, src, dim = make(10), index(10, 30), make(30), 0
    elif case == "sliced source":
        s, idx, src, dim = make(16, 8), index(16, 10), make(10, 16)[:, ::2], 0
    else:
        s = make(2, 3, 4, 5).to(memory_format=torch.channels_last)
        idx, src, dim = index(3, 6), make(2, 6, 4, 5), 1
    s, src = s.detach(), src.detach()
    for alpha in (1, 0.5, -2):
        fn = lambda a, b, alpha=alpha: torch.index_add(a, dim, idx, b, alpha=alpha)  # noqa: E731
        assert check_against_aten(fn, s, src) == ["index_add"]
        fn = lambda a, b, alpha=alpha: a.index_add_(dim, idx, b, alpha=alpha)  # noqa: E731
        assert check_against_aten(fn, s, src) == ["index_add_"]


@pytest.mark.override
def test_atomics_under_the_interpreter_sum_every_duplicate():
    """A thousand additions into three rows: every one lands, none is lost to a racing lane."""
    idx = torch.arange(1000, device=DEVICE) % 3
    ones = torch.ones(1000, 4, device=DEVICE, dtype=torch.int64)
    out, fired = traced(lambda: torch.zeros(3, 4, device=DEVICE, dtype=torch.int64).index_add(0, idx, ones))
    assert fired == ["index_add"] and out[:, 0].tolist() == [334, 333, 333]
    src = torch.full((1000, 4), 0.25, device=DEVICE)
    out, fired = traced(lambda: torch.zeros(3, 4, device=DEVICE).scatter_add(0, idx[:, None].expand(1000, 4), src))
    assert fired == ["scatter_add"] and out[:, 0].tolist() == [83.5, 83.25, 83.25]


@pytest.mark.override
def test_gradients_match_aten():
    idx = index(8, 40)
    compare(lambda s, src: s.scatter_add(0, idx[:, None].expand(40, 6), src), [make(8, 6), make(40, 6)],
            ["scatter_add"])
    compare(lambda s, src: torch.index_add(s, 0, idx, src, alpha=-1.5), [make(8, 6), make(40, 6)], ["index_add"])
    compare(lambda s, src: s.clone().index_add_(1, idx[:6], src), [make(3, 8), make(3, 6)], ["index_add_"])


@pytest.mark.usefixtures("deterministic")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.override
def test_deterministic_mode_keeps_floats_on_aten_and_integers_on_the_kernel(op):
    fn = CALLS[op](index(16, 96))
    for dtype, expect in ((torch.float32, []), (torch.bfloat16, []), (torch.int32, [op]), (torch.int64, [op])):
        fired = check_against_aten(fn, values(16, 24, dtype=dtype), values(96, 24, dtype=dtype))
        assert fired == expect, (dtype, fired)


@host_checked_indices
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", [16, -1])
@pytest.mark.override
def test_out_of_range_index_raises_atens_error(op, bad):
    idx = index(16, 96)
    idx[40] = bad
    fn = CALLS[op](idx)
    for dtype in (torch.float32, torch.bfloat16):
        s, src = values(16, 24, dtype=dtype), values(96, 24, dtype=dtype)
        with pytest.raises((RuntimeError, IndexError)) as ours, pn.trace() as t:
            fn(s.clone(), src)
        assert [e.op for e in t.events if e.outcome == "override"] == [op]
        with pytest.raises((RuntimeError, IndexError)) as theirs:
            aten(lambda s=s, src=src: fn(s.clone(), src))
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
        # aten's index_add names the index only where it takes its scatter path (alpha 1 here)
        if not op.startswith("index_add") or op == "index_add_":
            assert str(ours.value) == f"index {bad} is out of bounds for dimension 0 with size 16"


@host_checked_indices
@pytest.mark.parametrize("case", ["1-D", "int32 index", "dim 1, alpha 1"])
@pytest.mark.override
def test_index_add_raises_the_error_of_atens_path(case):
    s, idx, src, dim = make(16, 4, requires_grad=False), index(16, 10), make(10, 4, requires_grad=False), 0
    if case == "1-D":
        s, src = s[:, 0].contiguous(), src[:, 0].contiguous()
    elif case == "int32 index":
        idx = idx.to(torch.int32)
    else:
        s, src, dim = s.t().contiguous(), src.t().contiguous(), 1
    idx[3] = 99
    for op, fn in (("index_add", lambda a: a.index_add(dim, idx, src)), ("index_add_", lambda a: a.index_add_(dim, idx, src))):
        with pn.trace() as t, pytest.raises((RuntimeError, IndexError)) as ours:
            fn(s.clone())
        assert_routed(t.events, {op: None}, f"{op} {case}")  # the override raised it
        with pytest.raises((RuntimeError, IndexError)) as theirs:
            aten(lambda fn=fn: fn(s.clone()))
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


DECLINED = {  # case: (the op routed, the words of its decline)
    "int8": ("index_add", "dtype int8"), "bool": ("index_add", "dtype bool"),
    "int32 scatter index": ("scatter_add", "index dtype int32"), "mixed dtypes": ("index_add", "source dtype float16"),
    "float alpha on ints": ("index_add", "alpha of type float"), "0-dim": ("index_add", "a 0-d self"),
    "empty index": ("index_add", "empty input"), "self overlaps src": ("scatter_add_", "self overlaps source"),
    "expanded self": ("index_add_", "self is not dense"),
}


@pytest.mark.parametrize("case", list(DECLINED))
@pytest.mark.override
def test_declined_calls_fall_back_to_aten(case):
    s, idx, src = make(6, 4, requires_grad=False), index(6, 10), make(10, 4, requires_grad=False)
    fn = lambda a, i, b: a.index_add(0, i, b)  # noqa: E731
    if case in ("int8", "bool"):
        dtype = torch.int8 if case == "int8" else torch.bool
        s, src = s.to(dtype), src.to(dtype)
    elif case == "int32 scatter index":
        fn = lambda a, i, b: a.scatter_add(0, i.to(torch.int32)[:, None].expand(b.shape), b)  # noqa: E731
    elif case == "mixed dtypes":
        src = src.half()
    elif case == "float alpha on ints":
        s, src = s.to(torch.int32), src.to(torch.int32)
        fn = lambda a, i, b: a.index_add(0, i, b, alpha=1.5)  # noqa: E731
    elif case == "0-dim":
        s, idx, src = make(1, requires_grad=False)[0], index(1, 1), make(1, requires_grad=False)[0]
    elif case == "empty index":
        idx, src = idx[:0], src[:0]
    elif case == "self overlaps src":
        fn = lambda a, i, b: a.scatter_add_(0, i[:4, None].expand(4, 4), a[2:])  # noqa: E731
    elif case == "expanded self":
        fn = lambda a, i, b: a[:1].expand(6, 4).index_add_(0, i, b)  # noqa: E731
    with pn.trace() as t:
        try:
            got = fn(s.clone(), idx, src)
        except RuntimeError as e:
            got = e
    assert not [e for e in t.events if e.dsl == "triton" and e.outcome == "override"]
    op, why = DECLINED[case]
    assert_routed(t.events, {op: why}, case)
    try:
        ref = aten(lambda: fn(s.clone(), idx, src))
    except RuntimeError as e:
        ref = e
    if isinstance(ref, Exception):
        assert type(got) is type(ref) and str(got) == str(ref)
    else:
        assert torch.equal(got, ref)


@pytest.mark.override
def test_listed_unmeasured_and_switched_off():
    assert set(OPS) <= set(pn.get_dsl_operations("triton"))
    assert {s.op: s.measured for s in all_overrides() if s.op.rstrip("_") in ("scatter_add", "index_add", "topk")} == {
        "topk": False, "scatter_add": False, "scatter_add_": False, "index_add": False, "index_add_": False}
    s, idx, src = make(6, 4), index(6, 10), make(10, 4)
    for scope in (pn.triton.disabled(), pn.operations_disabled("index_add")):
        result = run(lambda a, b: a.index_add(0, idx, b), [s, src], scope=scope)
        # (aten's own index_add may call scatter_add_ inside, which routes on its own)
        assert not result.overridden("index_add") and result.fell_back("index_add")
    assert not run(lambda a, b: a.index_add(0, idx, b), [s, src], scope=pn.triton.disabled()).triton_events()
