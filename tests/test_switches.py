"""Disabling by DSL, op and dispatch key; reference-counted scopes; controller properties."""

from __future__ import annotations

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, always, marked_sub

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


def routed(x) -> bool:
    return bool(torch.sub(x, x)[0, 0] == 1000)


def test_controller_surface():
    assert torch.backends.python_native is pn
    assert {"triton", "cutedsl", TEST_DSL} <= set(pn.all_dsls)
    assert set(pn.available_dsls) <= set(pn.all_dsls)
    assert pn.triton is pn.triton
    ctl = getattr(pn, TEST_DSL)
    assert ctl.name == TEST_DSL and ctl.available and str(ctl.version) == "1.2.3"
    assert repr(ctl) == f"DSLController({TEST_DSL}, available, enabled)"
    assert {"trace", "operations_disabled", "triton", TEST_DSL} <= set(dir(pn))
    with pytest.raises(AttributeError, match="nosuchdsl"):
        pn.nosuchdsl  # noqa: B018
    with pytest.warns(UserWarning, match="no DSL is named 'nosuchdsl'"):
        assert pn.get_dsl_operations("nosuchdsl") == []


def test_dsl_switches(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    ctl = getattr(pn, TEST_DSL)
    assert pn.get_dsl_operations(TEST_DSL) == ["sub.Tensor"]
    ctl.disable()
    assert not routed(x) and not ctl.enabled and pn.is_dsl_disabled(TEST_DSL)
    assert "disabled" in repr(ctl)
    ctl.enable()
    assert routed(x)
    ctl.enabled = False
    assert not routed(x)
    ctl.enabled = True
    with ctl.disabled():
        assert not routed(x)
    assert routed(x)


def test_enabled_setter_respects_frozen_flags():
    torch.backends.disable_global_flags()
    try:
        with pytest.raises(RuntimeError, match="disable_global_flags"):
            pn.triton.enabled = False
    finally:
        torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True  # no public re-enable
    assert pn.triton.enabled


def test_bare_and_qualified_op_names(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    for name in ("sub", "sub.Tensor"):
        pn.disable_operations(name)
        assert not routed(x) and pn.is_operation_disabled("sub.Tensor")
        pn.enable_operations(name)
        assert routed(x)
    pn.disable_operations("sub.Scalar")  # another overload: this one keeps routing
    assert routed(x) and not pn.is_operation_disabled("sub.Tensor")
    pn.disable_operations("bmm.default")
    assert pn.is_operation_disabled("bmm")


def test_dispatch_key_switches(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    pn.disable_dispatch_keys("CPU")
    assert not routed(x) and pn.is_dispatch_key_disabled("CPU")
    pn.enable_dispatch_keys("CPU")
    assert routed(x)
    with pn.dispatch_keys_disabled("CPU"):
        assert not routed(x)
    with pn.dispatch_keys_disabled("CUDA"):
        assert routed(x)
    assert routed(x)


def test_nested_scopes_are_reference_counted(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    outer, inner = pn.operations_disabled("sub"), pn.operations_disabled("sub")
    with outer:
        with inner:
            assert not routed(x)
        assert not routed(x)  # the outer scope still holds it
    assert routed(x)
    with pn.operations_disabled("sub"):
        with getattr(pn, TEST_DSL).disabled():
            assert not routed(x)
        assert not routed(x)
    assert routed(x)


def test_scope_never_undoes_explicit_disable(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    pn.disable_operations("sub")
    with pn.operations_disabled("sub"):
        assert not routed(x)
    assert not routed(x) and pn.is_operation_disabled("sub")
    pn.enable_operations("sub")
    assert routed(x)


def test_explicit_enable_lifts_open_scopes(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    scope = pn.operations_disabled("sub")
    with scope:
        pn.enable_operations("sub")
        assert routed(x)
        with pn.operations_disabled("sub"):
            assert not routed(x)
    assert routed(x)


def test_scopes_restore_when_body_raises(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    for scope in (pn.operations_disabled("sub"), getattr(pn, TEST_DSL).disabled(), pn.dispatch_keys_disabled("CPU")):
        with pytest.raises(ZeroDivisionError):
            with scope:
                assert not routed(x)
                1 / 0  # noqa: B018
        assert routed(x)


def test_disabled_before_registration_applies_to_new_overrides(overrides, x):
    with pn.operations_disabled("sub"):
        handle = overrides("sub.Tensor", always, marked_sub)
        assert not handle.active and not routed(x)
    assert handle.active and routed(x)


def test_disabled_slot_runs_captured_kernel_without_conds(overrides, x):
    calls = []
    overrides("sub.Tensor", lambda *a, **k: calls.append(1) or True, marked_sub)
    with pn.operations_disabled("sub"):
        torch.sub(x, x)
        assert "_pn_cond" not in pn.router_source("sub.Tensor", "CPU")
    assert calls == []


def test_the_most_recent_scope_decides_and_explicit_switches_lift_contrary_holds(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    off, on = pn.operations_disabled("sub"), pn.operations_enabled("sub")
    with off:
        with on:
            assert routed(x)
            with off:  # the same object entered again: its own hold, the newest
                assert not routed(x)
            assert routed(x)
        assert not routed(x)
    assert routed(x)
    with on:
        pn.disable_operations("sub")  # lifts the scope's hold on: off from now on
        assert not routed(x)
    assert not routed(x)
    with off:
        pn.enable_operations("sub")  # lifts the scope's hold off
        assert routed(x)
    assert routed(x)
