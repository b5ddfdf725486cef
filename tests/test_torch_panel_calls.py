"""The calls torch's own panel test makes (``test/python_native/test_torch_backends.py`` in the
pytorch repository), through the same entry points, including the private ``_get_filter_state()``
it saves, clears and restores around each test: code written against torch's in-tree panel runs here.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, always, marked_sub


@pytest.fixture
def filter_state_kept():
    """Save the three sets, clear them and enable every DSL; restore them afterwards, as torch's
    test mixin does with the private filter state."""
    state = pn._get_filter_state()
    saved = (set(state._dsl_names), set(state._op_symbols), set(state._dispatch_keys))
    for names in (state._dsl_names, state._op_symbols, state._dispatch_keys):
        names.clear()
    for name in pn.all_dsls:
        getattr(pn, name).enable()
    yield state
    for names, before in zip((state._dsl_names, state._op_symbols, state._dispatch_keys), saved, strict=True):
        names.clear()
        names.update(before)


def routed(x) -> bool:
    return bool(torch.sub(x, x)[0, 0] == 1000)


def test_the_filter_state_is_the_switches_as_live_sets(overrides, x, filter_state_kept):
    overrides("sub.Tensor", always, marked_sub)
    state = filter_state_kept
    pn.disable_operations("sub")
    getattr(pn, TEST_DSL).disable()
    pn.disable_dispatch_keys("CUDA")
    assert "sub" in state._op_symbols and TEST_DSL in state._dsl_names and "CUDA" in state._dispatch_keys
    saved = (set(state._dsl_names), set(state._op_symbols), set(state._dispatch_keys))
    for names in (state._dsl_names, state._op_symbols, state._dispatch_keys):
        names.clear()
    assert routed(x) and not pn.is_operation_disabled("sub") and getattr(pn, TEST_DSL).enabled
    state._op_symbols.update(saved[1])  # restoring a set switches the names back off, at once
    assert not routed(x) and pn.is_operation_disabled("sub")
    state._op_symbols.discard("sub")
    assert routed(x)
    with pn.operations_disabled("sub"):
        assert "sub" in state._op_symbols  # scopes show as torch's panel shows them
    state._dsl_names.add(TEST_DSL)
    assert not getattr(pn, TEST_DSL).enabled and not routed(x)
    state._dsl_names.clear()
    state._dispatch_keys.clear()


def test_discovery_controllers_and_their_properties(filter_state_kept):
    assert isinstance(pn.all_dsls, list) and set(pn.available_dsls) <= set(pn.all_dsls)
    for name in pn.all_dsls:
        dsl = getattr(pn, name)
        assert dsl is getattr(pn, name) and dsl.name == name
        assert isinstance(dsl.available, bool) and isinstance(dsl.enabled, bool)
        assert dsl.version is None or hasattr(dsl.version, "major")
        assert name in repr(dsl) and ("available" in repr(dsl)) and ("enabled" in repr(dsl) or "disabled" in repr(dsl))
        assert all(isinstance(op, str) and op for op in pn.get_dsl_operations(name))
        assert pn.get_dsl_operations(name) == pn.get_dsl_operations(name)
    assert {"available_dsls", "all_dsls", "get_dsl_operations", "disable_operations", "enable_operations",
            "disable_dispatch_keys", "enable_dispatch_keys", "operations_disabled", *pn.all_dsls} <= set(dir(pn))


def test_enable_disable_and_nested_scopes_per_dsl(filter_state_kept):
    first, second = (getattr(pn, name) for name in pn.all_dsls[:2])
    for dsl in (first, second):
        dsl.disable()
        assert not dsl.enabled and pn.is_dsl_disabled(dsl.name)
        dsl.enable()
        assert dsl.enabled and not pn.is_dsl_disabled(dsl.name)
    with first.disabled():
        assert (first.enabled, second.enabled) == (False, True)
        with second.disabled():
            assert (first.enabled, second.enabled) == (False, False)
        assert (first.enabled, second.enabled) == (False, True)
    assert first.enabled and second.enabled


def test_op_and_key_switches_with_names_torch_passes(filter_state_kept):
    op = next(ops[0] for ops in map(pn.get_dsl_operations, pn.all_dsls) if ops)
    pn.disable_operations(op)
    assert pn.is_operation_disabled(op)
    pn.enable_operations(op)
    assert not pn.is_operation_disabled(op)
    with pytest.warns(UserWarning, match="nonexistent_op"):
        pn.disable_operations(op, "nonexistent_op")
    with pytest.warns(UserWarning, match="nonexistent_op"):
        pn.enable_operations(op, "nonexistent_op")
    with pn.operations_disabled(op):
        assert pn.is_operation_disabled(op)
    assert not pn.is_operation_disabled(op)
    pn.disable_dispatch_keys("CUDA", "CPU")
    pn.enable_dispatch_keys("CUDA", "CPU")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty names are warned about; torch's test needs them not to raise
        pn.disable_operations("")
        pn.enable_operations("")
        pn.disable_dispatch_keys("")
        pn.enable_dispatch_keys("")
        assert pn.get_dsl_operations("invalid_dsl") == []
    for missing in ("nonexistent_dsl", "invalid_dsl_name"):
        with pytest.raises(AttributeError):
            getattr(pn, missing)
