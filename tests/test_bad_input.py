"""Bad input gets clear errors, and a failing registration changes nothing."""

from __future__ import annotations

import itertools

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, always, marked_sub
from python_native.core.registry import REGISTRY

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts


def register(*args, **kwargs):
    return pn.register_op_override(*args, **kwargs)


@pytest.mark.parametrize("key", ["Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd"])
def test_non_backend_keys_rejected(key):
    with pytest.raises(ValueError, match=key):
        register(TEST_DSL, "aten", "sub.Tensor", key, always, marked_sub)


def test_bad_names_rejected():
    with pytest.raises(ValueError, match="does not exist.*did you mean"):
        register(TEST_DSL, "aten", "subb.Tensor", "CPU", always, marked_sub)
    with pytest.raises(ValueError, match="nosuch_namespace::sub does not exist"):
        register(TEST_DSL, "nosuch_namespace", "sub", "CPU", always, marked_sub)
    with pytest.raises(ValueError, match="is not an operator namespace"):
        register(TEST_DSL, "not a namespace", "sub", "CPU", always, marked_sub)
    with pytest.raises(ValueError, match="AutogradCPU"):
        register(TEST_DSL, "aten", "sub.Tensor", "AutogradCPU", always, marked_sub)
    with pytest.raises(ValueError, match="'CPUU' is not a dispatch key; did you mean CPU"):
        register(TEST_DSL, "aten", "sub.Tensor", "CPUU", always, marked_sub)
    with pytest.raises(ValueError, match="unknown DSL 'nodsl'"):
        register("nodsl", "aten", "sub.Tensor", "CPU", always, marked_sub)
    with pytest.raises(ValueError, match="CompositeImplicitAutograd"):
        register(TEST_DSL, "aten", "rms_norm", "CPU", always, marked_sub)


_fresh_names = itertools.count()


def _meta_only_op(name: str) -> torch.library.Library:
    """``pn_test_fallback::<name>``: an op with a Meta kernel and none at CPU."""
    lib = torch.library.Library("pn_test_fallback", "FRAGMENT")
    try:
        lib.define(f"{name}(Tensor x) -> Tensor")
        lib.impl(name, lambda x: torch.empty_like(x), "Meta")
    except BaseException:
        lib._destroy()
        raise
    return lib


def _refused_for_want_of_a_kernel(name: str) -> None:
    """Registering at CPU is refused and leaves no override behind (even where it wrongly succeeds)."""
    before = len(pn.overrides())
    handle = None
    try:
        with pytest.raises(ValueError, match=f"pn_test_fallback::{name} has no kernel at CPU to fall back to"):
            handle = register(TEST_DSL, "pn_test_fallback", name, "CPU", always, lambda x: x)
    finally:
        if handle is not None:
            handle.remove()
    assert len(pn.overrides()) == before


def _overridden_over(lib: torch.library.Library, name: str, factor: float) -> None:
    """With a CPU kernel (``x * factor``) the op is overridden there, and falls back to that kernel."""
    lib.impl(name, lambda x: x * factor, "CPU")
    handle = register(TEST_DSL, "pn_test_fallback", name, "CPU", always, lambda x: x * 3)
    op = getattr(torch.ops.pn_test_fallback, name)
    try:
        assert op(torch.ones(2)).tolist() == [3.0, 3.0]
        with pn.operations_disabled(f"pn_test_fallback::{name}"):
            assert op(torch.ones(2)).tolist() == [factor, factor]
    finally:
        handle.remove()


def test_op_of_any_namespace_needs_a_kernel_at_the_key_to_fall_back_to():
    """The core takes an op of any namespace because it exists and has a kernel to fall back to."""
    # A name never defined before in this process (each front's run defines its own): an op destroyed
    # and defined again under the same name while a slot on it waits out its grace is another case.
    name = f"meta_only_{next(_fresh_names)}"
    lib = _meta_only_op(name)
    try:
        _refused_for_want_of_a_kernel(name)
        _overridden_over(lib, name, 2.0)
    finally:
        lib._destroy()
    assert REGISTRY.settle()


def test_bad_callables_and_types_rejected():
    with pytest.raises(ValueError, match="unconditional_override=True"):
        register(TEST_DSL, "aten", "sub.Tensor", "CPU", None, marked_sub)
    with pytest.raises(TypeError, match="cond must be callable"):
        register(TEST_DSL, "aten", "sub.Tensor", "CPU", 3, marked_sub)
    with pytest.raises(TypeError, match="impl must be callable"):
        register(TEST_DSL, "aten", "sub.Tensor", "CPU", always, "nope")
    with pytest.raises(TypeError, match="op_symbol must be a str"):
        register(TEST_DSL, "aten", 5, "CPU", always, marked_sub)
    with pytest.raises(TypeError, match="dsl must be a str"):
        register(None, "aten", "sub.Tensor", "CPU", always, marked_sub)
    with pytest.raises(TypeError, match=r"cannot name an op by int 3: op names are str"):
        pn.disable_operations(3)
    with pytest.raises(TypeError, match="dispatch keys must be str"):
        pn.disable_dispatch_keys(7)
    with pytest.raises(TypeError):
        pn.register_dsl("bad", object())
    with pytest.raises(ValueError, match="clashes"):
        pn.register_dsl("trace", type("M", (), {"runtime_available": lambda: True, "runtime_version": lambda: None}))


def test_unknown_op_in_disable_warns_with_close_matches():
    with pytest.warns(UserWarning, match="no op is named 'bmmm'.*bmm"):
        pn.disable_operations("bmmm")
    pn.enable_operations("bmm")
    REGISTRY.reset_switches()


def test_failing_registration_leaves_everything_as_it_was(overrides, monkeypatch):
    x = torch.ones(2, 2)
    first = overrides("sub.Tensor", always, marked_sub)
    before_source = pn.router_source("sub.Tensor", "CPU")
    before = list(pn.overrides())

    def failing(*args, **kwargs):
        raise RuntimeError("ordering failed")

    # Ordering is the last step before the dispatcher changes: a failure there must change nothing.
    with monkeypatch.context() as m:
        m.setattr(REGISTRY.ordering, "ordered", failing)
        with pytest.raises(RuntimeError, match="ordering failed"):
            pn.register_op_override(TEST_DSL, "aten", "sub.Tensor", "CPU", always, lambda *a, **k: None)
        with pytest.raises(RuntimeError, match="ordering failed"):
            pn.register_op_override(TEST_DSL, "aten", "div.Tensor", "CPU", always, lambda *a, **k: None)
    assert list(pn.overrides()) == before and first.active
    assert pn.router_source("sub.Tensor", "CPU") == before_source
    with pytest.raises(KeyError):
        pn.router_source("div.Tensor", "CPU")  # never installed in the dispatcher
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
    assert torch.equal(torch.div(x, x), torch.ones_like(x))


def test_bad_ordering_function_is_refused_and_changes_nothing(overrides):
    overrides("sub.Tensor", always, marked_sub)
    with pytest.raises(ValueError, match="permutation"):
        pn.reorder_overrides(lambda op, key, found: found[:0])
    with pytest.raises(TypeError):
        pn.reorder_overrides(5)
    assert torch.equal(torch.sub(torch.ones(1), torch.ones(1)), torch.full((1,), 1000.0))


@pytest.mark.parametrize("key", ["Dense", "Sparse", "Quantized"])
def test_functionality_keys_are_refused_at_registration(key):
    before = torch._C._dispatch_dump("aten::sub.Tensor")
    with pytest.raises(ValueError, match=f"{key!r} names a functionality"):
        pn.register_op_override(TEST_DSL, "aten", "sub.Tensor", key, None, lambda s, o, alpha: s, unconditional_override=True)
    assert torch._C._dispatch_dump("aten::sub.Tensor") == before
