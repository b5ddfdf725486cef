"""torch.backends conventions: the master switch, flags(), is_available()/version(), scopes that
enable, torch's functions as op names, a dir() of the public API, and names checked everywhere."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import python_native as pn
from conftest import TEST_DSL, always, marked_sub
from python_native.tools.report import render

both_fronts = pytest.mark.both_fronts  # dispatcher-level tests run under both fronts


def routed(x) -> bool:
    return bool(torch.sub(x, x)[0, 0] == 1000)


# ----- the master switch and flags() -----


@both_fronts
def test_the_master_switch_turns_every_override_off_and_keeps_the_others(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    getattr(pn, TEST_DSL).disable()
    pn.enabled = False
    assert not pn.enabled and not routed(x)
    getattr(pn, TEST_DSL).enable()
    assert not routed(x)  # the master switch still holds it off
    pn.enabled = True
    assert pn.enabled and routed(x)
    pn.enabled = 0
    with pn.trace() as t:
        torch.sub(x, x)
    assert t.events[0].reason == f"{TEST_DSL}: every override disabled (pn.enabled is False)"
    assert pn.status()["enabled"] is False and "pn.enabled is False: every override is off" in render(pn.status())
    pn.enabled = 1
    assert pn.status()["enabled"] is True and "pn.enabled is False" not in render(pn.status())
    with pytest.raises(TypeError, match="pn.enabled must be a bool"):
        pn.enabled = "no"


@both_fronts
def test_flags_scopes_the_master_switch_and_each_dsl_and_restores(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    with pn.flags(enabled=False):
        assert not pn.enabled and not routed(x)
        with pn.flags(enabled=True):
            assert pn.enabled and routed(x)  # scopes enable as well as disable
        assert not routed(x)
    assert pn.enabled and routed(x)
    with pn.flags(**{TEST_DSL: False}):
        assert not routed(x) and pn.is_dsl_disabled(TEST_DSL)
    getattr(pn, TEST_DSL).disable()
    with pn.flags(**{TEST_DSL: True}), getattr(pn, TEST_DSL).flags(enabled=True):
        assert routed(x)
    assert not routed(x)
    getattr(pn, TEST_DSL).enable()

    @pn.flags(enabled=False)
    def off(y):
        return routed(y)

    assert off(x) is False and routed(x)


def test_flags_checks_its_arguments():
    with pytest.raises(TypeError, match=r"no DSL is named 'trion'; did you mean 'triton'"):
        pn.flags(trion=False)
    with pytest.raises(TypeError, match="needs enabled"):
        pn.flags()
    with pytest.raises(ValueError, match="bool"):
        pn.flags(enabled=2)


@both_fronts
def test_frozen_flags_refuse_assigning_enabled_but_not_flags(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    torch.backends.disable_global_flags()
    try:
        with pytest.raises(RuntimeError, match=r"pn.enabled.*disable_global_flags.*pn.flags\(enabled=False\)"):
            pn.enabled = False
        with pn.flags(enabled=False):
            assert not routed(x)
    finally:
        torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    assert pn.enabled and routed(x)


# ----- is_available() and version() -----


def test_is_available_and_version_beside_the_attributes():
    assert pn.is_available() is True  # the test DSL is available here
    assert pn.version() == pn.__version__
    ctl = getattr(pn, TEST_DSL)
    assert ctl.is_available() is ctl.available is True
    assert ctl.version() == ctl.version and str(ctl.version()) == "1.2.3" and ctl.version.major == 1
    for name in pn.all_dsls:
        version = getattr(pn, name).version
        assert (version() is None) == (not version)
        if not version:
            assert version == None and version.major is None  # noqa: E711  (it equals None, as torch's test reads it)


# ----- scopes that enable -----


@both_fronts
def test_operations_enabled_and_dispatch_keys_enabled_override_outer_disables(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    pn.disable_operations("sub")
    with pn.operations_enabled("sub"):
        assert routed(x) and not pn.is_operation_disabled("sub")
        with pn.operations_disabled("sub"):
            assert not routed(x)  # the innermost scope decides
        assert routed(x)
    assert not routed(x)  # the explicit disable stands after the scope
    pn.enable_operations("sub")
    with pn.dispatch_keys_disabled("CPU"), pn.dispatch_keys_enabled("CPU"):
        assert routed(x)
    with pn.operations_enabled("sub"):
        pn.disable_operations("sub")  # an explicit switch inside wins, and stays after
        assert not routed(x)
    assert not routed(x)
    pn.enable_operations("sub")


# ----- torch's functions as op names -----


@both_fronts
@pytest.mark.parametrize("fn", [torch.sub, torch.Tensor.sub, torch.ops.aten.sub, torch.ops.aten.sub.Tensor],
                         ids=["torch.sub", "Tensor.sub", "packet", "overload"])
def test_torch_functions_name_their_op_in_every_switch(fn, overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    with pn.operations_disabled(fn):
        assert not routed(x) and pn.is_operation_disabled(fn)
    assert routed(x)
    pn.disable_operations(fn)
    assert not routed(x)
    pn.enable_operations(fn)
    assert routed(x)


@pytest.mark.parametrize("fn", [torch.softmax, F.softmax, torch.Tensor.softmax, torch.ops.aten._softmax.default])
def test_softmax_callables_cover_forward_and_backward(fn):
    expected = pn.operation_names().get("softmax")
    if not expected:
        pytest.skip("no softmax override is installed here")
    with pn.operations_disabled(fn):
        assert all(pn.is_operation_disabled(op) for op in expected)
    assert not pn.is_operation_disabled("softmax")


def test_layer_norm_functional_names_its_public_op():
    with pn.operations_disabled(F.layer_norm):
        assert pn.is_operation_disabled("layer_norm")


def test_a_callable_that_names_no_op_is_refused_naming_it():
    def my_softmax(x):
        return x

    with pytest.raises(TypeError, match=r"my_softmax.*not one of torch's functions.*torch.softmax"):
        pn.operations_disabled(my_softmax)
    with pytest.raises(ValueError, match=r"torch.nn.functional.cross_entropy: no op is named 'cross_entropy'"):
        pn.disable_operations(F.cross_entropy)
    with pytest.raises(TypeError, match=r"cannot name an op by int 3.*OpOverload"):
        pn.operations_disabled(3)


# ----- dir(pn) and names checked -----


def test_dir_lists_the_public_api_and_the_dsls_only():
    names = set(dir(pn))
    assert {"trace", "flags", "enabled", "operations_enabled", "is_available", "version", "speckey"} <= names
    assert set(pn.all_dsls) <= names
    for internal in ("torch", "annotations", "REGISTRY", "sys", "difflib", "op_names", "Scope", "logs", "ops"):
        assert internal not in names, internal
    assert all(hasattr(pn, name) for name in names)


def test_unknown_dsl_names_are_named_with_a_suggestion():
    with pytest.warns(UserWarning, match=r"no DSL is named 'trion'; did you mean 'triton'"):
        assert pn.get_dsl_operations("trion") == []
    with pytest.warns(UserWarning, match=r"did you mean 'triton'"):
        assert pn.operation_names("trion") == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pn.get_dsl_operations("triton")


def test_a_misspelt_outcome_is_refused_with_a_suggestion(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    with pn.trace() as t:
        torch.sub(x, x)
    assert t.ops("override") == ["sub.Tensor"]
    with pytest.raises(ValueError, match=r"no outcome is named 'overide'; did you mean 'override'"):
        t.ops("overide")


def test_a_misspelt_environment_variable_is_named_once_with_the_right_one():
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    import torch, python_native as pn\n"
        "messages = [str(w.message) for w in caught if 'PYTHON_NATIVE_TRITON_INTERPRETER' in str(w.message)]\n"
        "print(len(messages), messages[0])\n"
        "print([p['fix'] for p in pn.status()['problems'] if p['source'] == 'PYTHON_NATIVE_TRITON_INTERPRETER'])\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHON_NATIVE_TRITON_INTERPRETER": "1", "HOME": str(__import__("pathlib").Path.home())}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    first, status = out.stdout.strip().splitlines()[-2:]
    assert first.startswith("1 ") and "did you mean PYTHON_NATIVE_TRITON_INTERPRET?" in first
    assert "did you mean PYTHON_NATIVE_TRITON_INTERPRET?" in status
