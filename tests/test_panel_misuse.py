"""Misusing the panel: scopes exited too often, pickling, frozen global flags."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import python_native as pn
from conftest import always, marked_sub

# ----- scopes exited more often than entered -----


@pytest.mark.parametrize("make", [lambda: pn.operations_disabled("sub"), lambda: pn.testdsl.disabled(),
                                  lambda: pn.dispatch_keys_disabled("CPU")], ids=["op", "dsl", "key"])
def test_scope_exit_without_enter_or_twice_is_a_clear_error(make, overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    scope = make()
    with pytest.raises(RuntimeError, match="exited more times than it was entered"):
        scope.__exit__(None, None, None)
    scope.__enter__()
    scope.__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="exited more times than it was entered"):
        scope.__exit__(None, None, None)
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))  # nothing was left switched off
    with scope:  # and the scope still works
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))


# ----- pickling -----


def test_handles_and_traces_refuse_pickling_saying_why(overrides):
    handle = overrides("sub.Tensor", always, marked_sub)
    for obj, why in ((handle, "live registration"), (pn.trace(), "pickle trace.events")):
        with pytest.raises(TypeError, match=why):
            pickle.dumps(obj)
        with pytest.raises(TypeError, match=why):
            copy.copy(obj)
    with pn.trace() as t:
        torch.sub(torch.ones(1), torch.ones(1))
    assert pickle.loads(pickle.dumps(t.events)) == t.events


def test_the_panel_and_scopes_pickle_by_what_they_are(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    assert pickle.loads(pickle.dumps(pn)) is pn
    assert pickle.loads(pickle.dumps({"backend": torch.backends.python_native}))["backend"] is pn
    scope = pn.operations_disabled("sub.Tensor")
    with scope:
        restored = pickle.loads(pickle.dumps(scope))  # an open scope's holds stay with it
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
    with restored:
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    with pytest.raises(RuntimeError, match="exited more times"):
        restored.__exit__(None, None, None)


# ----- torch.backends.disable_global_flags() -----


@pytest.fixture
def frozen_flags():
    name = "__allow_nonbracketed_mutation_flag"
    before = getattr(torch.backends, name)
    torch.backends.disable_global_flags()
    try:
        yield
    finally:
        setattr(torch.backends, name, before)


def test_frozen_flags_refuse_bare_assignment_only_as_torch_does(frozen_flags, overrides, x):
    """Torch freezes bare assignment of its flags (``cudnn.enabled = False``) and so does its own
    python_native panel (``pn.<dsl>.enabled = ...``); calls and scopes stay allowed, since torch's
    test harness freezes flags for every test. We follow it, and freeze ``pn.compile_mode = ...`` too."""
    assert torch.backends.flags_frozen()
    overrides("sub.Tensor", always, marked_sub)
    with pytest.raises(RuntimeError, match=r"pn.testdsl.enabled.*disable_global_flags.*pn.testdsl.disabled\(\)"):
        pn.testdsl.enabled = False
    with pytest.raises(RuntimeError, match=r"pn.compile_mode.*compile_mode_set\('keep'\)"):
        pn.compile_mode = "keep"
    assert pn.testdsl.enabled and pn.compile_mode == "bypass"
    with pn.testdsl.disabled(), pn.compile_mode_set("keep"):
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x)) and pn.compile_mode == "keep"
    pn.testdsl.disable()
    assert not pn.testdsl.enabled
    pn.testdsl.enable()
    pn.disable_operations("sub.Tensor")
    assert pn.is_operation_disabled("sub.Tensor")
    pn.enable_operations("sub.Tensor")
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
