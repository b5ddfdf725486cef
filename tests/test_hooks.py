"""Features plug into the core through one ``Hooks`` object each: registered once, checked, ordered."""

from __future__ import annotations

import pytest

import python_native as pn
from python_native.core import extensions
from python_native.tools import report


def test_every_feature_registers_once_in_a_fixed_order():
    names = [h.name for h in extensions.registered()]
    assert {"calibration gate", "checked mode", "compile mode", "compiled front"} <= set(names)
    assert names.index("checked mode") < names.index("compiled front")  # the check sits inside replay's recorder
    assert extensions.POINTS.wrap_impl[-1] is next(h.wrap_impl for h in extensions.registered()
                                                   if h.name == "compiled front")


def test_a_second_registration_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="'checked mode' are already registered"):
        extensions.register(extensions.Hooks("checked mode"))


@pytest.mark.parametrize("fields,error,words", [
    ({"wrap_cond": 3}, TypeError, "wrap_cond must be callable or None, got int: 3"),
    ({"call_gates": "x"}, TypeError, "call_gates must be a CallGates or None"),
    ({"order": "first"}, TypeError, "order must be an int"),
])
def test_a_field_of_the_wrong_kind_is_refused_by_name(fields, error, words):
    with pytest.raises(error, match=words):
        extensions.Hooks("bad", **fields)


def test_bad_names_and_unknown_unregistrations_are_refused():
    with pytest.raises(ValueError, match="non-empty name"):
        extensions.Hooks(" ")
    with pytest.raises(TypeError, match="register takes a Hooks"):
        extensions.register(lambda: None)
    with pytest.raises(ValueError, match="no hooks named 'nobody'"):
        extensions.unregister("nobody")


def test_a_features_status_section_is_in_the_status_report():
    def lines():
        return ["all quiet", "nothing queued"]

    extensions.register(extensions.Hooks("test feature", status=lines))
    try:
        data = pn.status()
        assert data["features"]["test feature"] == ["all quiet", "nothing queued"]
        assert "Test feature\n  all quiet\n  nothing queued" in report.render(data)
    finally:
        extensions.unregister("test feature")
    assert "test feature" not in pn.status().get("features", {})


def test_a_listener_that_raises_is_logged_and_the_others_still_hear(caplog):
    heard = []

    def broken(*args):
        raise RuntimeError("listener broke")

    extensions.register(extensions.Hooks("a broken listener", overrides_changed=broken))
    extensions.register(extensions.Hooks("b listener", overrides_changed=lambda: heard.append(1)))
    try:
        extensions.notify(extensions.POINTS.overrides_changed)
    finally:
        extensions.unregister("a broken listener")
        extensions.unregister("b listener")
    assert heard == [1] and "listener broke" in caplog.text
