"""Fixtures: a test DSL overriding real aten ops at the CPU key, clean state per test, and both
dispatch fronts for the dispatcher-level modules.

A module marked ``pytestmark = pytest.mark.both_fronts`` runs each of its tests twice: with the
Python routers alone and with the compiled front above them (built once per session into the user
cache; where no C++ compiler can build it, the compiled half skips with the compiler's reason).

A test marked ``override`` asserts from a trace that an override ran (or declined, saying why). With
``--overrides-off``, run under ``PYTHON_NATIVE_DISABLE=1``, each such test is a strict xfail: one
that still passes with no override installed fails the run, so a test that would compare aten with
aten cannot claim to check an override; every unmarked test must still pass.
"""

from __future__ import annotations

import functools
import os
import types

import pytest
import torch
from packaging.version import Version

import python_native as pn
from python_native.core.registry import REGISTRY
from python_native.foundations import env

TEST_DSL = "testdsl"

if TEST_DSL not in pn.all_dsls:
    pn.register_dsl(
        TEST_DSL,
        types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: Version("1.2.3")),
    )


FRONTS = ("python", "compiled")
OVERRIDES_OFF = "--overrides-off"


def pytest_addoption(parser):
    parser.addoption(
        OVERRIDES_OFF, action="store_true",
        help="with PYTHON_NATIVE_DISABLE=1: every test marked `override` must fail (strict xfail), "
             "every other test must pass",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "both_fronts: run each test with the Python routers and the compiled front")
    if config.getoption(OVERRIDES_OFF) and not env.overrides_disabled():
        raise pytest.UsageError(
            f"{OVERRIDES_OFF} expects the tests marked `override` to fail because no override runs, but "
            f"{env.DISABLE_ALL[0]} is {os.environ.get(env.DISABLE_ALL[0])!r}: set {env.DISABLE_ALL[0]}=1 "
            f"(or leave out {OVERRIDES_OFF})"
        )


def pytest_collection_modifyitems(config, items):
    """Under ``--overrides-off``, a test marked ``override`` must fail, by an assertion; or, marked
    ``override(aten_raises=E)``, by aten's own error ``E`` on an input only the override serves."""
    if not config.getoption(OVERRIDES_OFF):
        return
    reason = f"{env.DISABLE_ALL[0]}=1: no override runs, so a test asserting that one ran must fail"
    for item in items:
        marker = item.get_closest_marker("override")
        if marker is None:
            continue
        unknown = set(marker.kwargs) - {"aten_raises"}
        if marker.args or unknown:
            raise pytest.UsageError(f"{item.nodeid}: pytest.mark.override takes only aten_raises=<an exception "
                                    f"type>, got {marker.args} {sorted(unknown)}")
        also = marker.kwargs.get("aten_raises", ())
        raises = (AssertionError, *(also if isinstance(also, tuple) else (also,)))
        item.add_marker(pytest.mark.xfail(strict=True, raises=raises, reason=reason))


CALL_PASSED = pytest.StashKey[bool]()  # whether a test's own body passed (for fixtures' checks after it)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.stash[CALL_PASSED] = report.passed
    return report


def pytest_generate_tests(metafunc):
    if metafunc.definition.get_closest_marker("both_fronts") is not None:
        metafunc.fixturenames.append("dispatch_front")
        metafunc.parametrize("dispatch_front", FRONTS, indirect=True)


@functools.cache
def compiled_front_problem() -> str | None:
    """Build the compiled front once for the session (or find it cached); why it cannot be, else None."""
    from python_native.features import front

    try:
        front.ensure_built()
    except Exception as e:  # no compiler, or a compiler that fails: only the compiled half skips
        return f"the compiled front cannot be built here: {e}"
    return None


@pytest.fixture
def dispatch_front(request):
    """The front serving this test (parametrized by ``both_fronts``)."""
    from python_native.features import front

    name = request.param
    if name == "compiled":
        problem = compiled_front_problem()
        if problem is not None:
            pytest.skip(problem)
    with front.serving(name):
        yield name


@pytest.fixture
def overrides():
    """Register overrides through this list; each is removed and every switch reset afterwards."""
    handles: list = []

    def register(op: str, cond, impl, **kwargs):
        handle = pn.register_op_override(TEST_DSL, "aten", op, kwargs.pop("key", "CPU"), cond, impl, **kwargs)
        handles.append(handle)
        return handle

    yield register
    for handle in handles:
        handle.remove()
    REGISTRY.reset_switches()
    pn.reorder_overrides(None)


def router_calls(target, fn, key: str = "CPU") -> int:
    """How many times a router ran during ``fn()``: ``target`` is a slot, or an op whose slot is
    ``aten::<op> @ key``. The router is Python code, so a call that reaches it shows a ``call``
    event for one of its code objects to a profile hook."""
    import sys

    slot = REGISTRY.slots[("aten", target, key)] if isinstance(target, str) else target
    codes = {code for _, code in slot.codes.values()} | {slot.entry.__code__}
    seen = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            seen.append(frame.f_code)

    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return len(seen)


def always(*args, **kwargs) -> bool:
    return True


def marked_sub(self, other, alpha=1):
    """A sub that differs visibly from aten's (it adds 1000) and never calls aten::sub."""
    return torch.add(self, torch.neg(other) * alpha) + 1000


@pytest.fixture
def x():
    return torch.arange(6, dtype=torch.float32).reshape(2, 3)


@pytest.fixture
def calib(tmp_path, monkeypatch):
    """Isolated calibration sources (``calibration_testing.Sources``); everything restored afterwards."""
    from calibration_testing import Sources

    from python_native.features import calibration

    yield Sources(tmp_path, monkeypatch)
    calibration.set_device_key_fn(None)
    monkeypatch.undo()
    calibration.reset()


@pytest.fixture
def bench(calib, monkeypatch):
    """pn.benchmark on, on a fake GPU with a faked clock (``first_use_testing.Bench``); off afterwards."""
    from first_use_testing import Bench

    found = Bench(calib, monkeypatch)
    yield found
    found.close()


@pytest.fixture(autouse=True)
def unfrozen_torch_flags():
    """Importing torch's own test utilities (OpInfo samples, through verify) freezes torch's flags
    for the rest of the process (``torch.backends.disable_global_flags()``), and then bare
    assignment of ``pn.<dsl>.enabled`` is refused, as torch refuses its own. Each test starts with
    flags as a user's process has them; tests of the frozen behaviour freeze them themselves."""
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True
    yield
