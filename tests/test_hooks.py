"""Features plug into the core through one ``Hooks`` object each: registered once, checked, ordered."""

from __future__ import annotations

import json

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
    ({"status_key": ""}, TypeError, "status_key must be a non-empty str or None, got str: ''"),
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


@pytest.fixture
def plugged():
    """Register hooks for one test; every one registered is unregistered after it."""
    names = []

    def plug(hooks):
        names.append(extensions.register(hooks).name)
        return hooks

    yield plug
    for name in names:
        if name in {h.name for h in extensions.registered()}:  # a test may unregister one itself
            extensions.unregister(name)


def _cli(capsys, *args: str) -> str:
    """What ``python -m python_native status ...`` prints, in this process (so it sees its hooks)."""
    from python_native.__main__ import main

    assert main(["status", *args]) == 0
    return capsys.readouterr().out


def test_a_features_status_section_is_in_the_status_report(plugged, capsys):
    section = {"queued": 3, "state": "draining", "sizes": [1, 2]}
    plugged(extensions.Hooks("toy feature", status=lambda: dict(section), status_key="toy"))
    data = pn.status()
    assert data["toy"] == section
    keys = list(data)  # between the report's own data and the environment switches
    assert keys.index("custom_ops") < keys.index("toy") < keys.index("environment")
    assert "Toy\n  queued: 3\n  state: draining\n  sizes: [1, 2]" in _cli(capsys)
    assert json.loads(_cli(capsys, "--json"))["toy"] == section
    extensions.unregister("toy feature")
    assert "toy" not in pn.status() and "Toy\n" not in _cli(capsys)
    plugged(extensions.Hooks("lines feature", status=lambda: ["all quiet", "nothing queued"]))
    assert pn.status()["lines feature"] == ["all quiet", "nothing queued"]  # keyed by its name by default
    assert "Lines feature\n  all quiet\n  nothing queued" in report.render(pn.status())


def test_the_built_in_sections_come_from_the_features_hooks():
    hooks = {h.status_key: h for h in extensions.registered() if h.status is not None}
    assert {"calibration": "calibration gate", "compile": "compile mode", "front": "compiled front"}.items() \
        <= {key: h.name for key, h in hooks.items()}.items()
    compile_mode = hooks["compile"]
    extensions.unregister(compile_mode.name)
    try:
        assert "compile" not in pn.status() and "calibration" in pn.status()
    finally:
        extensions.register(compile_mode)
    assert pn.status()["compile"]["mode"] == pn.compile_mode


@pytest.mark.parametrize("section,words", [
    (RuntimeError("queue lost"), "gathering it raised RuntimeError: queue lost"),
    ({"handle": object()}, "gathering it raised TypeError: Object of type object is not JSON serializable"),
])
def test_a_status_that_raises_or_is_not_plain_data_is_a_problem_naming_the_feature(plugged, capsys, section, words):
    def status():
        if isinstance(section, Exception):
            raise section
        return section

    plugged(extensions.Hooks("toy feature", status=status, status_key="toy"))
    data = pn.status()
    assert "toy" not in data
    [problem] = [p for p in data["problems"] if "toy feature" in p["source"]]
    assert problem["source"] == "status report: the 'toy feature' feature's status" and problem["problem"] == words
    assert {"dsls", "overrides", "calibration", "compile", "front", "environment", "legend"} <= set(data)
    text = _cli(capsys)
    assert "the 'toy feature' feature's status" in text and "Dispatch front" in text and "Environment switches" in text


def test_a_status_key_is_one_features_and_never_the_reports_own(plugged):
    with pytest.raises(ValueError, match="status key 'front' is taken by the hooks 'compiled front'"):
        extensions.register(extensions.Hooks("toy feature", status=dict, status_key="front"))
    plugged(extensions.Hooks("toy feature", status=lambda: {"x": 1}, status_key="dsls"))
    data = pn.status()
    assert isinstance(data["dsls"], list)  # the report's own DSL list stands
    assert any("'toy feature'" in p["source"] and "status key 'dsls' is one of the report's own keys" in p["problem"]
               for p in data["problems"])


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
