"""Checked mode judges random ops by their contract: a reproducible draw with aten's statistics.

The overrides here draw with ``torch.rand`` (another stream than aten's kernels), so a bitwise
comparison with aten would fail every call; the contract passes them, and catches each way of
breaking it: scaling, mask, kept fraction, probability, reproducibility, a draw that never moves.
"""

from __future__ import annotations

import pytest
import torch

from conftest import always
from python_native.features.checked import OverrideMismatch


@pytest.fixture
def checked(overrides, monkeypatch):
    """Register an override in checked mode, ahead of any other at its slot."""
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")
    return lambda op, impl, **kw: overrides(op, always, impl, priority=100, **kw)


def fp32_scale(p: float) -> torch.Tensor:
    return torch.tensor(0.0 if p == 1 else 1.0 / (1.0 - p), dtype=torch.float32)


def good_dropout(input, p, train):
    """native_dropout as aten's CUDA kernel computes it, from a ``torch.rand`` draw."""
    if train is False:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    mask = torch.rand(input.shape, device=input.device) >= p
    return (input.float() * mask * fp32_scale(p)).to(input.dtype), mask


def half_dropout(input, p, train):
    """As aten's CPU kernel: the scale rounded to the input's dtype."""
    mask = torch.rand(input.shape, device=input.device) >= p
    return input * mask.to(input.dtype) * torch.tensor(1.0 / (1.0 - p), dtype=input.dtype), mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_dropout_with_another_draw_passes(checked, dtype, p):
    checked("native_dropout", good_dropout, derive_forms=("out",))
    x = torch.randn(64, 96).to(dtype)
    x[0, :2] = float("nan")
    out, mask = torch.native_dropout(x, p, True)
    if p in (0.0, 1.0):  # nothing left to chance: all kept, or none
        assert bool(mask.all()) == bool(mask.any()) == (p == 0.0)
    out0, out1 = torch.empty_like(x), torch.empty_like(x, dtype=torch.bool)
    torch.ops.aten.native_dropout.out(x, p, True, out0=out0, out1=out1)  # derived: the same contract
    torch.native_dropout(x, p, False)


def test_dropout_scaled_in_the_inputs_dtype_passes(checked):
    checked("native_dropout", half_dropout)
    torch.native_dropout(torch.randn(64, 96, dtype=torch.float16), 0.1, True)


def test_checked_mode_keeps_the_random_stream(checked):
    checked("native_dropout", good_dropout)
    x = torch.randn(32, 32)
    torch.manual_seed(7)
    out, mask = torch.native_dropout(x, 0.5, True)
    after = torch.rand(4)
    torch.manual_seed(7)
    plain_out, plain_mask = good_dropout(x, 0.5, True)
    assert torch.equal(mask, plain_mask) and torch.equal(out, plain_out)
    assert torch.equal(after, torch.rand(4))  # the generator moved once, as without checking


def unscaled(input, p, train):
    out, mask = good_dropout(input, p, train)
    return input * mask, mask


def other_mask(input, p, train):
    return good_dropout(input, p, train)[0], good_dropout(input, p, train)[1]


def half_kept(input, p, train):
    mask = torch.rand(input.shape) >= (1 + p) / 2
    return (input * mask * fp32_scale(p)), mask


@pytest.mark.parametrize(
    ("impl", "message"),
    [
        (unscaled, r"output is not input \* mask \* \(1 / \(1 - p\)\) at p = 0.3"),
        (other_mask, r"output is not input \* mask"),
        (half_kept, r"elements kept, where aten's distribution gives 4300.8 ±"),
        (lambda input, p, train: (good_dropout(input, p, train)[0], torch.ones_like(input, dtype=torch.uint8)),
         r"output 1 returned dtype torch.uint8; aten returns torch.bool"),
    ],
    ids=["scale", "mask", "kept-fraction", "mask-dtype"],
)
def test_broken_dropout_raises(checked, impl, message):
    checked("native_dropout", impl)
    with pytest.raises(OverrideMismatch, match=rf"aten::native_dropout @ CPU.*{message}"):
        torch.native_dropout(torch.randn(64, 96), 0.3, True)


def test_dropout_outside_training_and_its_backward_are_compared_bit_for_bit(checked):
    checked("native_dropout", lambda input, p, train: (input * 2, torch.ones_like(input, dtype=torch.bool)))
    checked("native_dropout_backward", lambda grad, mask, scale: grad * mask * scale * 1.01)
    x = torch.randn(8, 8)
    with pytest.raises(OverrideMismatch, match="native_dropout @ CPU.*differs from aten"):
        torch.native_dropout(x, 0.3, False)
    with pytest.raises(OverrideMismatch, match="native_dropout_backward @ CPU.*differs from aten"):
        torch.ops.aten.native_dropout_backward(x, x > 0, 2.0)


def fill(self, values):
    self.copy_(values)
    return self


@pytest.mark.parametrize(
    ("impl", "message"),
    [
        (lambda self, p=0.5, *, generator=None: fill(self, torch.rand(self.shape, generator=generator) < p + 0.1),
         r"bernoulli contract: \d+ of 10000 elements are 1, where aten's distribution gives 5000.0 ±"),
        (lambda self, p=0.5, *, generator=None: fill(self, 2 * (torch.rand(self.shape) < p)),
         "bernoulli contract: values other than 0 and 1"),
        (lambda self, p=0.5, *, generator=None: fill(self, torch.rand(self.shape, generator=PRIVATE) < p),
         "random draw contract: not reproducible"),
        (lambda self, p=0.5, *, generator=None: fill(self, torch.rand(self.shape, generator=fixed()) < p),
         "bernoulli contract: the draw advanced no torch generator"),
    ],
    ids=["probability", "values", "not-reproducible", "never-advances"],
)
def test_broken_bernoulli_raises(checked, impl, message):
    checked("bernoulli_.float", impl)
    with pytest.raises(OverrideMismatch, match=rf"aten::bernoulli_\.float @ CPU.*{message}"):
        torch.empty(100, 100).bernoulli_(0.5)


PRIVATE = torch.Generator().manual_seed(1)  # advanced by each call, restored by nobody


def fixed() -> torch.Generator:
    return torch.Generator().manual_seed(1)


def good_bernoulli(self, p=0.5, *, generator=None):
    return fill(self, torch.rand(self.shape, generator=generator) < p)


def test_bernoulli_with_a_generator_passes_and_leaves_it_as_the_plain_draw(checked):
    checked("bernoulli_.float", good_bernoulli)
    gen = torch.Generator().manual_seed(3)
    drawn = torch.empty(50, 50).bernoulli_(0.25, generator=gen)
    plain_gen = torch.Generator().manual_seed(3)
    plain = good_bernoulli(torch.empty(50, 50), 0.25, generator=plain_gen)
    assert torch.equal(drawn, plain)
    assert torch.equal(gen.get_state(), plain_gen.get_state())  # moved once, as by the plain draw


def test_bernoulli_per_element_probabilities(checked):
    def tensor_p(self, p, *, generator=None):
        return fill(self, torch.rand(self.shape, generator=generator) < p)

    handle = checked("bernoulli_.Tensor", tensor_p)
    p = torch.tensor([0.0, 1.0, 0.5, 0.9]).repeat(500)
    drawn = torch.empty(2000).bernoulli_(p)
    assert drawn[0::4].sum() == 0 and drawn[1::4].sum() == 500
    handle.remove()
    checked("bernoulli_.Tensor", lambda self, p, *, generator=None: tensor_p(self, 0.5))
    with pytest.raises(OverrideMismatch, match="bernoulli contract: elements whose probability is 0 or 1 are not sure"):
        torch.empty(2000).bernoulli_(p)


def test_other_random_ops_need_a_reproducible_draw_of_atens_kind(checked):
    def exponential(self, lambd=1.0, *, generator=None, source=None):
        return fill(self, -torch.rand(self.shape, generator=source or generator).log() / lambd)

    handle = checked("exponential_", exponential)
    torch.empty(10).exponential_(2.0)
    handle.remove()
    handle = checked("exponential_", lambda self, lambd=1.0, *, generator=None: exponential(self, lambd, source=PRIVATE))
    with pytest.raises(OverrideMismatch, match=r"aten::exponential_ @ CPU.*random draw contract: not reproducible"):
        torch.empty(10).exponential_()
    handle.remove()
    checked("exponential_", lambda self, lambd=1.0, *, generator=None: exponential(self.double(), lambd))
    with pytest.raises(OverrideMismatch, match=r"exponential_ @ CPU\) returned dtype torch.float64"):
        torch.empty(10).exponential_()
