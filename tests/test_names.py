"""Names users type: op symbols in every spelling torch has, dispatch keys, DSL names, overloads."""

from __future__ import annotations

import threading

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, always, marked_sub
from python_native.panel import controller

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


def bmm_marked(self, mat2):
    return torch.ops.aten.mm.default(self[0], mat2[0]).unsqueeze(0) + 1000


def bmm_routed() -> bool:
    a = torch.ones(1, 2, 2)
    return bool(torch.bmm(a, a)[0, 0, 0] == 1002)


@pytest.mark.parametrize(
    "spelling",
    ["aten::bmm", torch.ops.aten.bmm.default, torch.ops.aten.bmm, "aten::bmm.default"],
    ids=["namespaced", "overload", "packet", "namespaced-overload"],
)
def test_op_spellings_act_on_the_op(overrides, spelling):
    overrides("bmm", always, bmm_marked)
    assert bmm_routed()
    pn.disable_operations(spelling)
    assert not bmm_routed()
    assert pn.is_operation_disabled(spelling) and pn.is_operation_disabled("bmm")
    pn.enable_operations(spelling)
    assert bmm_routed() and not pn.is_operation_disabled(spelling)
    with pn.operations_disabled(spelling):
        assert not bmm_routed()
    assert bmm_routed()


def test_op_from_another_namespace_is_refused():
    with pytest.raises(ValueError, match="prims"):
        pn.disable_operations("prims::mul")
    with pytest.raises(TypeError, match="OpOverload"):
        pn.disable_operations(3)


def test_dispatch_key_case_suggestion():
    controller._keys_checked.clear()
    with pytest.warns(UserWarning, match="did you mean 'CUDA'"):
        pn.disable_dispatch_keys("cuda")
    with pytest.warns(UserWarning, match="did you mean 'CPU'"):
        pn.dispatch_keys_disabled("cpu")
    pn.enable_dispatch_keys("cuda")


@pytest.mark.parametrize("key", ["", "NoSuchKey", "Dense", "Meta", "AutogradCUDA", "Sparse", "Quantized", "AutocastCUDA", "Python"])
def test_keys_no_override_can_fire_at_warn_like_torchs_panel_accepts_them(key, overrides, x):
    """Torch's own panel takes any key name; ours warns (naming why and the accepted keys) and goes on."""
    overrides("sub.Tensor", always, marked_sub)
    for call in (pn.disable_dispatch_keys, pn.enable_dispatch_keys, pn.is_dispatch_key_disabled):
        controller._keys_checked.clear()
        with pytest.warns(UserWarning, match="accepted keys: CPU, CUDA" if key in torch._C.DispatchKey.__members__ else "is not a dispatch key"):
            call(key)
    controller._keys_checked.clear()
    with pytest.warns(UserWarning, match=repr(key)):
        with pn.dispatch_keys_disabled(key):
            assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))  # our override still fires at CPU
    assert pn.is_dispatch_key_disabled(key) is False
    with pytest.raises(TypeError, match="dispatch keys must be str"):
        pn.disable_dispatch_keys(None)
    pn.enable_dispatch_keys("SparseCUDA", torch._C.DispatchKey.CUDA)


def test_is_dsl_disabled_checks_type():
    with pytest.raises(TypeError, match="int"):
        pn.is_dsl_disabled(3)
    assert pn.is_dsl_disabled(TEST_DSL) is False


def test_bare_name_without_default_overload_is_value_error(overrides):
    overrides("sub.Tensor", always, marked_sub)
    with pytest.raises(ValueError, match="sub.Tensor"):
        pn.router_source("sub", "CPU")
    with pytest.raises(ValueError, match="no default overload.*add.Tensor"):
        pn.register_op_override(TEST_DSL, "aten", "add", "CPU", always, marked_sub)
    assert "sub.Tensor" in pn.router_source("sub.Tensor", "CPU")


def plus_one_mul(self, other):
    return torch.ops.aten.mul.Tensor(self, other) + 1


def test_derived_forms_report_disabled_with_their_op(overrides):
    overrides("mul.Tensor", always, plus_one_mul, derive_forms=True)
    x = torch.ones(3)
    pn.disable_operations("mul")
    try:
        for name in ("mul_.Tensor", "mul.out", "mul_", "mul.Tensor"):
            assert pn.is_operation_disabled(name), name
        y = x.clone()
        y.mul_(x)
        assert torch.equal(y, x)  # the in-place form is really off too
    finally:
        pn.enable_operations("mul")
    assert not pn.is_operation_disabled("mul_.Tensor")
    with pn.operations_disabled("mul.Tensor"):
        assert pn.is_operation_disabled("mul.out")
    assert not pn.is_operation_disabled("mul.out")


# ----- torch.backends conventions -----

def routed(x) -> bool:
    return bool(torch.sub(x, x)[0, 0] == 1000)


def test_scopes_are_decorators(overrides, x):
    overrides("sub.Tensor", always, marked_sub)

    @pn.operations_disabled("sub")
    def by_op():
        return routed(x)

    @pn.dispatch_keys_disabled("CPU")
    def by_key():
        return routed(x)

    @getattr(pn, TEST_DSL).disabled()
    def by_dsl():
        return routed(x)

    for fn in (by_op, by_key, by_dsl):
        assert fn() is False
        assert routed(x)
    assert by_op.__name__ == "by_op"


def test_decorator_scope_from_several_threads(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    barrier = threading.Barrier(4)
    seen: list[bool] = []

    @pn.operations_disabled("sub.Tensor")
    def body():
        barrier.wait(timeout=10)
        seen.append(routed(x))
        barrier.wait(timeout=10)

    threads = [threading.Thread(target=body) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [False] * 4
    assert routed(x) and not pn.is_operation_disabled("sub.Tensor")


def test_enabled_accepts_truthy_ints(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    ctl = getattr(pn, TEST_DSL)
    ctl.enabled = 0
    assert not ctl.enabled and not routed(x)
    ctl.enabled = 1
    assert ctl.enabled and routed(x)
    for bad in ("0", "false", None, 1.5):
        with pytest.raises(TypeError, match="enabled must be a bool"):
            ctl.enabled = bad
    assert ctl.enabled
