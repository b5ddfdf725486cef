"""The names users type: public op names, the forward/backward rule, and a warning for every unknown name."""

from __future__ import annotations

import warnings

import pytest
import torch

import python_native as pn

# isort: split
from conftest import TEST_DSL, always
from python_native_dsls.triton import device_type

DEVICE = device_type()  # where the Triton overrides run: their inputs must live there to reach them

requires_triton_softmax = pytest.mark.skipif(
    not {"_softmax", "_softmax_backward_data", "native_layer_norm"} <= set(pn.get_dsl_operations("triton")),
    reason="the Triton softmax and layer norm are not installed here",
)


def _softmax_outcomes() -> dict[str, str]:
    """Each softmax op's outcome for one forward and backward of ``torch.softmax`` (Triton's kernels)."""
    x = torch.randn(4, 32, device=DEVICE, requires_grad=True)
    with pn.trace() as t:
        torch.softmax(x, -1).sum().backward()
    return {e.op: e.outcome for e in t.events if e.op in ("_softmax", "_softmax_backward_data")}


ROUTED = {"_softmax": "override", "_softmax_backward_data": "override"}
OFF = {"_softmax": "fallback", "_softmax_backward_data": "fallback"}
BACKWARD_OFF = {"_softmax": "override", "_softmax_backward_data": "fallback"}


@requires_triton_softmax
@pytest.mark.parametrize(
    ("name", "expected"),
    [("softmax", OFF), ("_softmax", OFF), ("aten::_softmax.default", OFF), (torch.ops.aten._softmax, OFF),
     ("_softmax_backward_data", BACKWARD_OFF)],
    ids=["public", "aten-forward", "qualified", "packet", "aten-backward"],
)
def test_a_name_covers_forward_and_backward_in_every_switch(name, expected):
    assert _softmax_outcomes() == ROUTED
    with pn.operations_disabled(name):
        assert _softmax_outcomes() == expected
        assert pn.is_operation_disabled(name)
    assert _softmax_outcomes() == ROUTED and not pn.is_operation_disabled(name)
    pn.disable_operations(name)
    try:
        assert _softmax_outcomes() == expected and pn.is_operation_disabled(name)
        # The predicates follow the same rule: the public name is off only when all it covers is.
        assert pn.is_operation_disabled("softmax") == (expected == OFF)
        assert pn.is_operation_disabled("_softmax_backward_data")
    finally:
        pn.enable_operations(name)
    assert _softmax_outcomes() == ROUTED
    assert not pn.is_operation_disabled("softmax") and not pn.is_operation_disabled("_softmax_backward_data")


@requires_triton_softmax
def test_enabling_a_backward_name_leaves_the_forward_off():
    pn.disable_operations("softmax")
    try:
        pn.enable_operations("_softmax_backward_data")
        assert _softmax_outcomes() == {"_softmax": "fallback", "_softmax_backward_data": "override"}
        assert not pn.is_operation_disabled("softmax")
    finally:
        pn.enable_operations("softmax")


@requires_triton_softmax
def test_layer_norm_public_name_covers_native_layer_norm_and_its_backward():
    norm = torch.nn.LayerNorm(32, device=DEVICE)
    x = torch.randn(4, 32, device=DEVICE, requires_grad=True)

    def outcomes():
        with pn.trace() as t:
            norm(x).sum().backward()
        return {e.op: e.outcome for e in t.events if "layer_norm" in e.op}

    assert outcomes() == {"native_layer_norm": "override", "native_layer_norm_backward": "override"}
    with pn.operations_disabled("layer_norm"):
        assert outcomes() == {"native_layer_norm": "fallback", "native_layer_norm_backward": "fallback"}


def test_operation_names_lists_every_builtin_op_under_its_public_name():
    installed = set(pn.get_dsl_operations("triton"))
    if not installed:
        pytest.skip("no Triton override installed here")
    names = pn.operation_names("triton")
    assert {op for ops in names.values() for op in ops} == installed
    # Every built-in op declares the name PyTorch users type: no aten name stands alone, and no
    # backward is listed as a name of its own.
    assert all(not key.startswith("_") and "backward" not in key for key in names), names
    expected = {"softmax": ["_softmax", "_softmax_backward_data"], "gelu": ["gelu", "gelu_backward"],
                "layer_norm": ["native_layer_norm", "native_layer_norm_backward"], "bmm": ["bmm"]}
    for public, ops in expected.items():
        if ops[0] in installed:
            assert names[public] == ops
    assert set(names) <= set(pn.operation_names())


def test_register_op_override_declares_a_public_name(overrides):
    def marked_neg(self):
        return self * -1 + 1000

    overrides("neg", always, marked_neg, public_name="testdsl_negative")
    x = torch.tensor([1.0, 2.0])
    assert torch.neg(x)[0] == 999
    assert pn.operation_names(TEST_DSL) == {"testdsl_negative": ["neg"]}
    with pn.operations_disabled("testdsl_negative"):
        assert torch.neg(x)[0] == -1 and pn.is_operation_disabled("neg")
    assert torch.neg(x)[0] == 999


@pytest.mark.parametrize("call", [pn.disable_operations, pn.enable_operations, pn.operations_disabled,
                                  pn.is_operation_disabled], ids=lambda f: f.__name__)
def test_unknown_names_warn_with_a_suggestion_every_time(overrides, call):
    for _ in range(2):  # a name already seen warns again
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call("bmmm")
        assert [str(w.message) for w in caught] == ["python_native: no op is named 'bmmm'; did you mean bmm?"]
        assert caught[0].filename == __file__  # points at the caller's line
    if "softmax" in pn.operation_names():
        with pytest.warns(UserWarning, match="did you mean softmax"):
            call("softmx")


@pytest.mark.parametrize("call", [pn.disable_operations, pn.enable_operations, pn.operations_disabled,
                                  pn.disable_dispatch_keys, pn.enable_dispatch_keys, pn.dispatch_keys_disabled],
                         ids=lambda f: f.__name__)
def test_a_switch_without_a_name_raises(call):
    with pytest.raises(TypeError, match=rf"{call.__name__}\(\) needs at least one"):
        call()


def test_misspelt_dsl_names_get_a_suggestion():
    with pytest.warns(UserWarning, match="no DSL is named 'trion'; did you mean 'triton'"):
        assert pn.is_dsl_disabled("trion") is False
    with pytest.raises(AttributeError, match="did you mean 'triton'"):
        pn.trion  # noqa: B018


@pytest.mark.parametrize("bad", [2, -1, 10])
def test_enabled_refuses_integers_other_than_0_and_1(overrides, bad):
    overrides("sub.Tensor", always, lambda self, other, alpha=1: self)
    ctl = getattr(pn, TEST_DSL)
    with pytest.raises(ValueError, match=f"enabled must be a bool \\(or 0/1\\), got {bad}"):
        ctl.enabled = bad
    assert ctl.enabled
