"""Dropout on the Philox kernels: ``F.dropout``, ``torch.native_dropout``, its backward, ``bernoulli_``.

The masks come from another random stream than aten's, so results are checked by their
contract: a bool mask, kept elements ``x * scale`` with aten's scale, dropped ones zero, the
gradient following the mask, the kept fraction within bounds, and the same seed giving the same mask.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch
import torch.nn.functional as F
from triton_testing import DEVICE, DTYPES, assert_routed, make, requires_triton, seeded, unmeasured_installed  # noqa: F401

import python_native as pn

pytestmark = [requires_triton, pytest.mark.usefixtures("unmeasured_installed")]

FWD, BWD, FILL = "native_dropout", "native_dropout_backward", "bernoulli_.float"
ON_GPU = DEVICE == "cuda"
# The op the public ``F.dropout`` reaches: aten's composite picks native_dropout on GPUs only.
PUBLIC = FWD if ON_GPU else FILL


def _fired(trace, op: str) -> bool:
    return ("triton", "override") in {(e.dsl, e.outcome) for e in trace.events if e.op == op}


def _scale(p: float) -> torch.Tensor:
    """aten's ``1 / (1 - p)`` as its kernel applies it: fp32 of the double (CPU), or of 1 / fp32(1 - p) (CUDA)."""
    keep = struct.unpack("f", struct.pack("f", 1.0 - p))[0] if ON_GPU else 1.0 - p
    return torch.tensor(1.0 / keep, dtype=torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.override
def test_public_call_reaches_the_override_and_keeps_atens_contract(dtype):
    x = make(64, 96, dtype=dtype)
    with pn.trace() as t:
        y = F.dropout(x, 0.3, training=True)
        y.backward(torch.ones_like(y))
    assert _fired(t, PUBLIC)
    kept = x.grad != 0
    if ON_GPU:  # native_dropout: x * mask * scale in fp32, rounded once
        expected = (x.detach().float() * kept * _scale(0.3)).to(dtype)
    else:  # aten's composite around bernoulli_: x * mask.div_(1 - p), in the input's dtype
        expected = x.detach() * kept.to(dtype).div_(0.7)
    assert torch.equal(y.detach(), expected)
    assert torch.equal(x.grad, (kept.float() * _scale(0.3)).to(dtype) if ON_GPU else kept.to(dtype).div_(0.7))
    assert 0 < int(kept.sum()) < kept.numel()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
@pytest.mark.override
def test_native_dropout_mask_output_and_gradient(dtype, layout):
    x = make(4, 6, 5, 5, dtype=dtype, requires_grad=False)
    x = x.to(memory_format=torch.channels_last) if layout == "channels_last" else x
    x = x.transpose(0, 3) if layout == "transposed" else x
    x.requires_grad_()
    with pn.trace() as t:
        y, mask = torch.native_dropout(x, 0.4, True)
        y.backward(torch.ones_like(y))
    assert _fired(t, FWD)
    # At the CUDA key the backward takes only a gradient dense in its suggested memory format:
    # aten's CUDA kernel gives its result that layout, not a transposed gradient's own.
    if ON_GPU and layout == "transposed":
        assert {(e.dsl, e.outcome) for e in t.events if e.op == BWD} == {(None, "fallback")}
    else:
        assert _fired(t, BWD)
    with pn.triton.disabled():
        ref_y, ref_mask = torch.native_dropout(x.detach(), 0.4, True)
    assert mask.dtype == ref_mask.dtype == torch.bool
    assert y.shape == ref_y.shape and y.dtype == ref_y.dtype
    assert y.stride() == ref_y.stride() and mask.stride() == ref_mask.stride()
    scale = _scale(0.4)
    assert torch.equal(y.detach(), (x.detach().float() * mask * scale).to(dtype))
    assert torch.equal(x.grad, (mask * scale).to(dtype))


@pytest.mark.override
def test_same_seed_same_mask_and_the_generator_advances():
    x = make(32, 100, requires_grad=False)
    with pn.trace() as t:
        torch.manual_seed(123)
        first = torch.native_dropout(x, 0.5, True)[1]
        second = torch.native_dropout(x, 0.5, True)[1]
        torch.manual_seed(123)
        again = torch.native_dropout(x, 0.5, True)[1]
        assert torch.equal(first, again)
        assert not torch.equal(first, second)  # each call draws afresh
        torch.manual_seed(123)
        public = F.dropout(x, 0.5, training=True)
        torch.manual_seed(123)
        assert torch.equal(public, F.dropout(x, 0.5, training=True))
    assert _fired(t, FWD) and _fired(t, PUBLIC)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.override
def test_kept_fraction_within_statistical_bounds(p):
    x = torch.ones(512, 512, device=DEVICE)
    with pn.trace() as t:
        mask = torch.native_dropout(x, p, True)[1]
    assert _fired(t, FWD)
    n = mask.numel()
    assert abs(float(mask.float().mean()) - (1 - p)) < 6 * math.sqrt(p * (1 - p) / n)
    rows = mask.float().mean(1)  # no row (no program's share) systematically off
    assert float((rows - (1 - p)).abs().max()) < 6 * math.sqrt(p * (1 - p) / 512)


@pytest.mark.override
def test_p_zero_keeps_everything_as_a_copy():
    x = make(10, 10, requires_grad=False)
    x[0, 0] = float("nan")
    with pn.trace() as t:
        y, mask = torch.native_dropout(x, 0.0, True)
    assert _fired(t, FWD)
    assert bool(mask.all()) and y.data_ptr() != x.data_ptr()
    torch.testing.assert_close(y, x, rtol=0, atol=0, equal_nan=True)


@pytest.mark.skipif(ON_GPU, reason="p = 1 declines at the CUDA key (aten's zeros_like shortcut)")
@pytest.mark.override
def test_p_one_gives_what_atens_cpu_kernel_gives():
    x = torch.tensor([1.0, -2.0, float("nan"), float("inf"), 0.0])
    with pn.trace() as t:
        y, mask = torch.native_dropout(x, 1.0, True)
    assert _fired(t, FWD)
    with pn.triton.disabled():
        ref_y, ref_mask = torch.native_dropout(x, 1.0, True)
    assert torch.equal(mask, ref_mask) and not bool(mask.any())
    torch.testing.assert_close(y, ref_y, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(y), torch.signbit(ref_y))  # -2 * 0 * 0 is -0 in both


DECLINED = {"train=False": "train=False: aten returns a copy", "empty": "empty input", "float64": "dtype float64",
            "non-dense": "layout: not dense", "p out of range": "p = 1.5 is outside [0, 1]"}


@pytest.mark.parametrize("case", list(DECLINED))
@pytest.mark.override
def test_declined_calls_are_atens(case):
    x = make(6, 8, requires_grad=False)
    p, train = 0.5, True
    if case == "train=False":
        train = False
    elif case == "empty":
        x = make(0, 8, requires_grad=False)
    elif case == "float64":
        x = make(6, 8, dtype=torch.float64, requires_grad=False)
    elif case == "non-dense":
        x = make(6, 16, requires_grad=False)[:, ::2]
    else:
        p = 1.5
    with pn.trace() as t:
        try:
            got = torch.native_dropout(x, p, train)
        except RuntimeError as e:
            got = e
    assert_routed(t.events, {FWD: DECLINED[case]}, case)
    if case == "train=False":
        assert torch.equal(got[0], x) and got[0].data_ptr() != x.data_ptr() and bool(got[1].all())


@pytest.mark.override
def test_backward_equals_atens_exactly():
    dy = make(7, 9, requires_grad=False)
    dy[0, 0] = float("nan")
    mask = torch.rand(7, 9, device=DEVICE) > 0.3
    mask[0, 0] = False  # a dropped NaN gradient stays NaN: dy * mask * scale, as aten
    with pn.trace() as t:
        got = torch.ops.aten.native_dropout_backward(dy, mask, 1.25)
    assert _fired(t, BWD)
    with pn.triton.disabled():
        ref = torch.ops.aten.native_dropout_backward(dy, mask, 1.25)
    torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.override
def test_out_forms():
    x = make(5, 6, requires_grad=False)
    y, mask = torch.empty(0, device=DEVICE), torch.empty(0, dtype=torch.bool, device=DEVICE)
    with pn.trace() as t:
        torch.ops.aten.native_dropout.out(x, 0.5, True, out0=y, out1=mask)
        dx = torch.empty(0, device=DEVICE)
        torch.ops.aten.native_dropout_backward.out(x, mask, 2.0, out=dx)
    assert _fired(t, "native_dropout.out") and _fired(t, "native_dropout_backward.out")
    assert torch.equal(y, x * mask * 2.0) and torch.equal(dx, x * mask * 2.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.override
def test_bernoulli_fills_ones_and_zeros(dtype):
    out = torch.empty(256, 256, dtype=dtype, device=DEVICE)
    with pn.trace() as t:
        out.bernoulli_(0.25)
    assert _fired(t, FILL)
    assert bool(((out == 0) | (out == 1)).all())
    assert abs(float(out.float().mean()) - 0.25) < 6 * math.sqrt(0.25 * 0.75 / out.numel())
    assert bool((torch.empty_like(out).bernoulli_(0.0) == 0).all())
    assert bool((torch.empty_like(out).bernoulli_(1.0) == 1).all())


@pytest.mark.override
def test_bernoulli_with_a_generator_and_atens_errors():
    out = torch.empty(64, 64, device=DEVICE)
    gen = torch.Generator(device=DEVICE)
    with pn.trace() as t:
        first = out.bernoulli_(0.5, generator=gen.manual_seed(7)).clone()
        assert torch.equal(first, out.bernoulli_(0.5, generator=gen.manual_seed(7)))
    assert_routed(t.events, {FILL: None}, "bernoulli_ with a generator")
    with pn.triton.disabled(), pytest.raises(RuntimeError) as aten_error:
        out.bernoulli_(1.5)
    with pn.trace() as t, pytest.raises(RuntimeError) as error:
        out.bernoulli_(1.5)
    assert str(error.value) == str(aten_error.value)
    assert_routed(t.events, {FILL: "p = 1.5 is outside [0, 1]"}, "bernoulli_(1.5)")


@pytest.mark.parametrize(("generator", "tensor", "current", "same"), [
    ("cuda", "cuda:0", 0, True),  # torch.Generator("cuda") reports no index: the current device
    ("cuda", "cuda:1", 0, False),
    ("cuda", "cuda:1", 1, True),
    ("cuda:1", "cuda:0", 1, False),
    ("cuda:0", "cuda:0", 1, True),
    ("cpu", "cpu", None, True),
    ("cpu", "cuda:0", 0, False),
    ("cuda", "cpu", 0, False),
])
def test_a_generator_without_an_index_draws_for_the_current_device(generator, tensor, current, same):
    from python_native_dsls.triton.ops.dropout import same_device

    asked = []
    found = same_device(torch.device(generator), torch.device(tensor), lambda kind: asked.append(kind) or current)
    assert found is same and set(asked) <= {torch.device(generator).type}


@pytest.mark.override
def test_feature_dropout_reaches_bernoulli():
    x = make(4, 6, 3, 3)
    with pn.trace() as t:
        y = F.dropout2d(x, 0.5, training=True)
    assert _fired(t, FILL)
    per_channel = (y.detach() != 0).flatten(2).float()
    assert bool(((per_channel.amax(-1) == per_channel.amin(-1))).all())  # whole channels kept or dropped


@pytest.mark.override
def test_switches_and_listing():
    assert {FWD, BWD, FILL, "native_dropout.out", "native_dropout_backward.out"} <= set(pn.get_dsl_operations("triton"))
    x = make(8, 8, requires_grad=False)
    for scope in (pn.triton.disabled(), pn.operations_disabled(FWD, BWD, FILL)):
        with scope, pn.trace() as t:
            F.dropout(x, 0.5, training=True)
            torch.native_dropout(x, 0.5, True)
        assert not [e for e in t.events if e.dsl == "triton"]
