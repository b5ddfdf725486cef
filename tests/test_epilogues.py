"""In-place and out= variants derived from one functional kernel."""

from __future__ import annotations

import pytest
import torch

import python_native as pn
from conftest import always

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


def plus_one_mul(self, other):
    """A mul that is visibly ours (adds 1) and never calls aten::mul in any variant."""
    shape = torch.broadcast_shapes(self.shape, other.shape)
    return torch.addcmul(torch.ones(shape, dtype=torch.result_type(self, other)), self, other)


def float_tensors(self, other) -> bool:
    """Only what ``plus_one_mul`` handles: the test helpers' own muls (bools, numbers) stay aten's."""
    return (
        isinstance(self, torch.Tensor) and isinstance(other, torch.Tensor)
        and self.dtype == other.dtype == torch.float32
    )


def test_derive_all_variants(overrides):
    handle = overrides("mul.Tensor", float_tensors, plus_one_mul, derive_variants=True)
    assert sorted(o.op for o in handle.derived) == ["mul.out", "mul_.Tensor"]
    a, b = torch.full((3,), 2.0), torch.full((3,), 3.0)
    assert torch.equal(a * b, torch.full((3,), 7.0))
    c = a.clone()
    assert c.mul_(b) is c and torch.equal(c, torch.full((3,), 7.0))
    out = torch.empty(0)
    assert torch.mul(a, b, out=out) is out and torch.equal(out, torch.full((3,), 7.0))
    with pn.trace() as t:
        a.clone().mul_(b)
    assert ("mul_.Tensor", "override") in [(e.op, e.outcome) for e in t.events]
    assert "_pn_fits(" in pn.router_source("mul_.Tensor", "CPU")
    pn.disable_operations("mul")  # the source op's name covers its derived variants
    assert torch.equal(a.clone().mul_(b), torch.full((3,), 6.0))
    pn.enable_operations("mul")
    handle.remove()
    assert all(o.removed for o in handle.derived)
    assert torch.equal(a.clone().mul_(b), torch.full((3,), 6.0))


def test_inplace_that_cannot_hold_result_goes_to_aten(overrides):
    overrides("mul.Tensor", lambda s, o: isinstance(o, torch.Tensor), plus_one_mul, derive_variants=["inplace"])
    small, big = torch.ones(1), torch.ones(3)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        small.mul_(big)  # aten's own error
    ints = torch.ones(3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="can't be cast"):
        ints.mul_(torch.full((3,), 0.5))


def test_out_is_resized_and_multi_output(overrides):
    overrides("mul.Tensor", float_tensors, plus_one_mul, derive_variants=["out"])
    out = torch.empty(5)
    with pytest.warns(UserWarning, match="resized"):
        torch.mul(torch.ones(2), torch.ones(2), out=out)
    assert out.shape == (2,) and torch.equal(out, torch.full((2,), 2.0))

    def ln(input, normalized_shape, weight, bias, eps):
        with pn.operations_disabled("native_layer_norm"):
            out, mean, rstd = torch.native_layer_norm(input, normalized_shape, weight, bias, eps)
        return out + 1, mean, rstd

    overrides("native_layer_norm", always, ln, derive_variants=["out"])
    x = torch.randn(2, 4)
    outs = (torch.empty(0), torch.empty(0), torch.empty(0))
    got = torch.ops.aten.native_layer_norm.out(x, [4], None, None, 1e-5, out0=outs[0], out1=outs[1], out2=outs[2])
    assert all(g is o for g, o in zip(got, outs, strict=True))
    with pn.operations_disabled("native_layer_norm"):
        ref = torch.native_layer_norm(x, [4], None, None, 1e-5)
    torch.testing.assert_close(outs[0], ref[0] + 1)
    torch.testing.assert_close(outs[2], ref[2])


def test_missing_variant_is_an_error(overrides):
    with pytest.raises(ValueError, match="no inplace variant"):
        overrides("bmm", always, lambda s, m: s, derive_variants=["inplace"])
    with pytest.raises(ValueError, match="unknown variant"):
        overrides("mul.Tensor", always, plus_one_mul, derive_variants=["sideways"])


def _aten_error(call):
    with pn.testdsl.disabled():
        try:
            call()
        except RuntimeError as e:
            return str(e)
    return None


@pytest.mark.parametrize("out_dtype", [torch.float64, torch.float16, torch.int64])
def test_out_of_another_dtype_does_what_aten_does(overrides, out_dtype):
    """aten's relu.out refuses an out= of another dtype, mul.out computes and casts: the derived
    variant hands any out= of another dtype to aten's kernel, whichever it does."""
    overrides("relu", always, lambda x: x.clamp(min=0) + 1000, derive_variants=True)
    overrides("mul.Tensor", float_tensors, plus_one_mul, derive_variants=True)
    x = torch.tensor([-1.0, 2.0])
    call = lambda: torch.ops.aten.relu.out(x, out=torch.empty(2, dtype=out_dtype))  # noqa: E731
    expected = _aten_error(call)
    assert expected is not None and "Expected out tensor to have dtype float" in expected
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float"):
        call()
    out = torch.empty(2, dtype=out_dtype)
    if out_dtype == torch.int64:
        with pytest.raises(RuntimeError, match="can't be cast"):
            torch.mul(x, x, out=out)
    else:
        assert torch.mul(x, x, out=out) is out and torch.equal(out, torch.tensor([1.0, 4.0], dtype=out_dtype))
    same = torch.empty(0)
    assert torch.ops.aten.relu.out(x, out=same) is same and same.tolist() == [1000.0, 1002.0]  # ours
