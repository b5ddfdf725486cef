"""In-place and out= forms derived from one functional kernel."""

from __future__ import annotations

import warnings

import pytest
import torch

import python_native as pn
from conftest import always

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


def plus_one_mul(self, other):
    """A mul that is visibly ours (adds 1) and never calls aten::mul in any form."""
    shape = torch.broadcast_shapes(self.shape, other.shape)
    return torch.addcmul(torch.ones(shape, dtype=torch.result_type(self, other)), self, other)


def float_tensors(self, other) -> bool:
    """Only what ``plus_one_mul`` handles: the test helpers' own muls (bools, numbers) stay aten's."""
    return (
        isinstance(self, torch.Tensor) and isinstance(other, torch.Tensor)
        and self.dtype == other.dtype == torch.float32
    )


def test_derive_all_forms(overrides):
    handle = overrides("mul.Tensor", float_tensors, plus_one_mul, derive_forms=True)
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
    pn.disable_operations("mul")  # the source op's name covers its derived forms
    assert torch.equal(a.clone().mul_(b), torch.full((3,), 6.0))
    pn.enable_operations("mul")
    handle.remove()
    assert all(o.removed for o in handle.derived)
    assert torch.equal(a.clone().mul_(b), torch.full((3,), 6.0))


def test_inplace_that_cannot_hold_result_goes_to_aten(overrides):
    overrides("mul.Tensor", lambda s, o: isinstance(o, torch.Tensor), plus_one_mul, derive_forms=["inplace"])
    small, big = torch.ones(1), torch.ones(3)
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        small.mul_(big)  # aten's own error
    ints = torch.ones(3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="can't be cast"):
        ints.mul_(torch.full((3,), 0.5))


def test_out_is_resized_and_multi_output(overrides):
    overrides("mul.Tensor", float_tensors, plus_one_mul, derive_forms=["out"])
    out = torch.empty(5)
    with pytest.warns(UserWarning, match="resized"):
        torch.mul(torch.ones(2), torch.ones(2), out=out)
    assert out.shape == (2,) and torch.equal(out, torch.full((2,), 2.0))

    def ln(input, normalized_shape, weight, bias, eps):
        with pn.operations_disabled("native_layer_norm"):
            out, mean, rstd = torch.native_layer_norm(input, normalized_shape, weight, bias, eps)
        return out + 1, mean, rstd

    overrides("native_layer_norm", always, ln, derive_forms=["out"])
    x = torch.randn(2, 4)
    outs = (torch.empty(0), torch.empty(0), torch.empty(0))
    got = torch.ops.aten.native_layer_norm.out(x, [4], None, None, 1e-5, out0=outs[0], out1=outs[1], out2=outs[2])
    assert all(g is o for g, o in zip(got, outs, strict=True))
    with pn.operations_disabled("native_layer_norm"):
        ref = torch.native_layer_norm(x, [4], None, None, 1e-5)
    torch.testing.assert_close(outs[0], ref[0] + 1)
    torch.testing.assert_close(outs[2], ref[2])


def test_missing_form_is_an_error(overrides):
    with pytest.raises(ValueError, match="no inplace form"):
        overrides("bmm", always, lambda s, m: s, derive_forms=["inplace"])
    with pytest.raises(ValueError, match="unknown form"):
        overrides("mul.Tensor", always, plus_one_mul, derive_forms=["sideways"])


def test_the_old_name_derive_variants_still_derives_and_warns_once(overrides, monkeypatch):
    from python_native.core import arguments

    monkeypatch.setattr(arguments, "_renamed_warned", False)
    with pytest.warns(DeprecationWarning, match="derive_variants is deprecated: pass derive_forms") as caught:
        handle = overrides("mul.Tensor", float_tensors, plus_one_mul, derive_variants=["inplace"])
    assert [w.filename for w in caught] == [__file__.replace("test_epilogues", "conftest")]  # the caller's line
    assert [o.op for o in handle.derived] == ["mul_.Tensor"]
    a, b = torch.full((3,), 2.0), torch.full((3,), 3.0)
    with pn.trace() as t:
        c = a.clone()
        c.mul_(b)
    assert ("mul_.Tensor", "override") in [(e.op, e.outcome) for e in t.events]
    assert torch.equal(c, torch.full((3,), 7.0))
    handle.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second use stays quiet: once per process
        overrides("mul.Tensor", float_tensors, plus_one_mul, derive_variants=True).remove()


def test_both_names_or_an_unknown_keyword_is_a_type_error(overrides):
    with pytest.raises(TypeError, match="derive_variants is the old name of derive_forms: pass derive_forms alone"):
        overrides("mul.Tensor", float_tensors, plus_one_mul, derive_forms=True, derive_variants=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'derive_form'"):
        overrides("mul.Tensor", float_tensors, plus_one_mul, derive_form=True)
    with pytest.raises(TypeError, match="derive_forms must be a bool or an iterable"):
        overrides("mul.Tensor", float_tensors, plus_one_mul, derive_forms="out")


def test_help_shows_every_registration_option():
    import inspect

    params = inspect.signature(pn.register_op_override).parameters
    assert list(params)[:6] == ["dsl", "lib_symbol", "op_symbol", "dispatch_key", "cond", "impl"]
    assert {"unconditional_override", "priority", "derive_forms", "impl_takes_plan", "explain", "variants",
            "public_name", "backward"} == set(list(params)[6:])
    assert "derive_variants" not in params


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
    form hands any out= of another dtype to aten's kernel, whichever it does."""
    overrides("relu", always, lambda x: x.clamp(min=0) + 1000, derive_forms=True)
    overrides("mul.Tensor", float_tensors, plus_one_mul, derive_forms=True)
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
