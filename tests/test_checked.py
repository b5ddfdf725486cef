"""Checked mode: with PYTHON_NATIVE_CHECK=1 every fired override is compared with aten's kernel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import python_native as pn
from conftest import always, marked_sub
from python_native.core.registry import REGISTRY
from python_native.features.checked import OverrideMismatch

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def check_on(monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")


def good_sub(self, other, alpha=1):
    return torch.add(self, other, alpha=-alpha)


def bound_impl(handle):
    return handle._slot.namespace[f"_pn_impl_{handle.uid}"]


def test_off_binds_the_plain_impl(overrides, monkeypatch):
    monkeypatch.delenv("PYTHON_NATIVE_CHECK", raising=False)
    handle = overrides("sub.Tensor", always, marked_sub)
    assert bound_impl(handle) is marked_sub
    x = torch.ones(3)
    assert torch.equal(torch.sub(x, x), torch.full((3,), 1000.0))  # a wrong impl goes unnoticed


def test_matching_override_passes(overrides, check_on):
    handle = overrides("sub.Tensor", always, good_sub)
    assert bound_impl(handle) is not good_sub
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    assert torch.allclose(torch.sub(x, y, alpha=2), x - 2 * y)
    assert torch.allclose(torch.sub(x, 3), x - 3)  # a Python number in a Tensor parameter


def test_wrong_values_raise_naming_the_override(overrides, check_on):
    handle = overrides("sub.Tensor", always, marked_sub)
    x = torch.ones(3)
    with pytest.raises(OverrideMismatch, match=rf"{handle.name}.*sub\.Tensor @ CPU.*differs from aten") as info:
        torch.sub(x, x)
    assert isinstance(info.value, AssertionError) and "Mismatched elements" in str(info.value)
    assert pn.OverrideMismatch is OverrideMismatch


@pytest.mark.parametrize(
    ("impl", "message"),
    [
        (lambda self, other, alpha=1: None, "returned None"),
        (lambda self, other, alpha=1: good_sub(self, other, alpha).double(), "dtype torch.float64"),
        (lambda self, other, alpha=1: good_sub(self, other, alpha)[:1], r"shape \(1, 3\)"),
        (lambda self, other, alpha=1: good_sub(self, other, alpha).t().contiguous().t(), "strides"),
    ],
    ids=["none", "dtype", "shape", "strides"],
)
def test_wrong_kind_of_result_is_caught(overrides, check_on, impl, message):
    overrides("sub.Tensor", always, impl)
    x = torch.randn(2, 3)
    with pytest.raises(OverrideMismatch, match=message):
        torch.sub(x, x)


def test_tuple_results(overrides, check_on):
    def bad_layer_norm(input, normalized_shape, weight, bias, eps):
        with pn.operations_disabled("native_layer_norm"):
            out, mean, rstd = torch.ops.aten.native_layer_norm.default(input, normalized_shape, weight, bias, eps)
        return out + 1, mean, rstd

    overrides("native_layer_norm", always, bad_layer_norm)
    with pn.triton.disabled(), pytest.raises(OverrideMismatch, match="output 0"):
        torch.ops.aten.native_layer_norm.default(torch.randn(3, 8), (8,), None, None, 1e-5)


def floats(self, other) -> bool:
    return isinstance(other, torch.Tensor) and self.dtype == other.dtype == torch.float32


def exact_mul(self, other):
    with pn.operations_disabled("mul"):
        return torch.mul(self, other)


def test_derived_forms_compare_the_functional_result_and_keep_inputs(overrides, check_on):
    overrides("mul.Tensor", always, exact_mul, derive_forms=True)
    x, y = torch.randn(5), torch.randn(5)
    expected = exact_mul(x, y)
    xs = x.clone()
    xs.mul_(y)  # the reference must not run aten's in-place kernel on the caller's tensor
    assert torch.allclose(xs, expected)
    out = torch.empty(5)
    torch.mul(x, y, out=out)
    assert torch.allclose(out, expected)
    x0 = x.clone()
    torch.mul(x, y)
    assert torch.equal(x, x0)


def test_derived_form_mismatch_raises(overrides, check_on):
    overrides("mul.Tensor", floats, lambda self, other: exact_mul(self, other) + 1, derive_forms=["inplace"])
    x = torch.ones(3)
    with pytest.raises(OverrideMismatch, match=r"mul_\.Tensor"):
        x.mul_(x)


def test_switch_is_read_at_registration(overrides, monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")
    handle = overrides("sub.Tensor", always, marked_sub)
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "0")
    with pytest.raises(OverrideMismatch):
        torch.sub(torch.ones(2), torch.ones(2))
    handle.remove()
    handle = overrides("sub.Tensor", always, marked_sub)
    assert bound_impl(handle) is marked_sub


def test_triton_overrides_pass_checked_mode():
    """The Triton library itself, through Triton's interpreter, agrees with aten under checking."""
    code = (
        "import torch, torch.nn.functional as F\n"
        "import python_native as pn\n"
        "from python_native.features.checked import OverrideMismatch\n"
        "assert pn.get_dsl_operations('triton'), 'no triton override installed'\n"
        "x = torch.randn(4, 32, requires_grad=True)\n"
        "w = torch.randn(32, requires_grad=True)\n"
        "with pn.trace() as t:\n"
        "    y = F.layer_norm(x, (32,), w) .softmax(-1).log_softmax(-1)\n"
        "    y = F.silu(y) + F.gelu(y, approximate='tanh')\n"
        "    y.sum().backward()\n"
        "    torch.bmm(torch.randn(2, 3, 1), torch.randn(2, 1, 4))\n"
        "fired = sorted(set(t.ops('override')))\n"
        "assert len(fired) >= 4, fired\n"
        "print('checked', fired)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1",
           "PYTHON_NATIVE_CHECK": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checked" in r.stdout


def test_registry_leaves_checked_wrapper_out_of_handles(overrides, check_on):
    handle = overrides("sub.Tensor", always, good_sub)
    assert handle.impl is good_sub and handle in REGISTRY.overrides()
