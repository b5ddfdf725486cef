"""The compiled dispatch front: which calls never enter Python, how it is built, chosen and reported.

Whether a call entered Python is read from the profiler hook (``conftest.router_calls``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import python_native as pn
from conftest import TEST_DSL, always, compiled_front_problem, marked_sub, router_calls
from python_native.core import extensions
from python_native.core.registry import REGISTRY
from python_native.features import calibration, front

pytestmark = pytest.mark.skipif(compiled_front_problem() is not None, reason=str(compiled_front_problem()))

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def compiled():
    with front.serving("compiled"):
        yield


def _mode(op: str) -> str:
    return front.describe()["slots"][f"aten::{op} @ CPU"]


def test_a_hit_enters_the_router_and_a_disabled_op_does_not(compiled, overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    assert _mode("sub.Tensor") == "python"
    assert router_calls("sub.Tensor", lambda: torch.sub(x, x)) == 1
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000.0))
    with pn.operations_disabled("sub"):
        assert _mode("sub.Tensor") == "fallback"
        assert router_calls("sub.Tensor", lambda: torch.sub(x, x)) == 0
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    with getattr(pn, TEST_DSL).disabled():
        assert router_calls("sub.Tensor", lambda: torch.sub(x, x)) == 0  # nothing active in the slot
    assert router_calls("sub.Tensor", lambda: torch.sub(x, x)) == 1


def test_python_front_enters_the_router_for_every_call(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    with front.serving("python"):
        with pn.operations_disabled("sub"):
            assert router_calls("sub.Tensor", lambda: torch.sub(x, x)) == 1


def test_a_trace_sees_every_call_through_the_front(compiled, overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    with pn.operations_disabled("sub"):
        with pn.trace() as t:
            assert _mode("sub.Tensor") == "python"
            torch.sub(x, x)
        assert _mode("sub.Tensor") == "fallback"
    assert [e.outcome for e in t.events] == ["fallback"]


class GatedCond:
    """A cond that declines float32 calls of size bucket 3 (4..7 elements) in narrow rows, and says
    so through the front's extension point (``declared``)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, self_, other, alpha=1):
        self.calls += 1
        return not (self_.dtype == torch.float32 and self_.numel().bit_length() == 3
                    and self_.shape[-1] < calibration.WIDE_ROW)

    def decline_masks(self, dispatch_key):
        return {"float32": (1 << 3, 0)} if dispatch_key == "CPU" else None


@pytest.fixture
def declared():
    """GatedCond's masks offered to the front as a feature's gates would offer them."""
    extensions.register(extensions.Hooks("test gates", call_gates=extensions.CallGates(
        calibration.WIDE_ROW, lambda cond: cond.decline_masks if isinstance(cond, GatedCond) else None)))
    yield
    extensions.unregister("test gates")


def test_calls_the_gate_surely_declines_never_enter_python(compiled, declared, overrides):
    cond = GatedCond()
    overrides("sub.Tensor", cond, marked_sub)
    assert _mode("sub.Tensor") == "gated"
    small = torch.ones(2, 3)  # 6 elements: bucket 3, declined
    assert router_calls("sub.Tensor", lambda: torch.sub(small, small)) == 0 and cond.calls == 0
    assert torch.equal(torch.sub(small, small), torch.zeros_like(small))
    for other in (torch.ones(4, 4), torch.ones(2, 3, dtype=torch.float64)):  # another bucket, another dtype
        assert router_calls("sub.Tensor", lambda o=other: torch.sub(o, o)) == 1
    assert cond.calls == 2


def test_a_cond_no_feature_declared_keeps_its_calls_in_python(compiled, overrides):
    overrides("sub.Tensor", GatedCond(), marked_sub)  # masks of its own, but no feature offers them
    assert _mode("sub.Tensor") == "python"


def test_the_front_classifies_rows_by_the_gates_own_wide_row(compiled, overrides, calib, tmp_path):
    """One rule: the front is made with calibration's WIDE_ROW, and declines in C++ exactly the
    calls the gate declines on either side of it (narrow rows lose here, wide ones win)."""
    wide = calibration.WIDE_ROW
    rows = [{"dsl": TEST_DSL, "op": "sub.Tensor", "dtype": "float32", "bucket": 14, "last_dim": d, "wins": d >= wide}
            for d in (wide - 1, wide)]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"format": calibration.FORMAT, "device": "cpu", "rows": rows}))
    calib.env(path)
    handle = overrides("sub.Tensor", always, marked_sub)
    assert _mode("sub.Tensor") == "gated"
    assert front._state.fronts[handle.slot].wide_row == wide
    gate = calibration.gate_of(handle.routed_cond)
    for cols in (wide - 1, wide):
        x = torch.ones(3, cols)  # 3 * 4095 and 3 * 4096 elements: the same size bucket, 14
        declined = gate(x, x) is False
        assert declined == (cols < wide)
        assert router_calls("sub.Tensor", lambda x=x: torch.sub(x, x)) == (0 if declined else 1)
        expected = torch.zeros_like(x) if declined else torch.full_like(x, 1000.0)
        assert torch.equal(torch.sub(x, x), expected)


def test_an_override_without_masks_keeps_its_calls_in_python(compiled, declared, overrides):
    cond = GatedCond()
    overrides("sub.Tensor", cond, marked_sub)
    overrides("sub.Tensor", always, marked_sub, priority=-1)  # no masks: nothing is surely declined
    assert _mode("sub.Tensor") == "python"


def test_checked_mode_keeps_every_call_in_python(compiled, declared, overrides, monkeypatch, x):
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")
    overrides("sub.Tensor", GatedCond(), lambda self, other, alpha=1: torch.ops.aten.sub.Tensor(self + 0, other, alpha=alpha))
    assert _mode("sub.Tensor") == "python"


def test_remove_leaves_the_dispatcher_as_it_was(compiled, x):
    assert REGISTRY.settle()  # slots emptied by earlier tests have left the dispatcher
    before = torch._C._dispatch_dump("aten::sub.Tensor")
    handle = pn.register_op_override(TEST_DSL, "aten", "sub.Tensor", "CPU", always, marked_sub)
    assert "python_native compiled front" in torch._C._dispatch_dump("aten::sub.Tensor")
    handle.remove()
    assert REGISTRY.settle()
    assert torch._C._dispatch_dump("aten::sub.Tensor") == before


def test_switching_fronts_moves_every_slot(overrides, x):
    overrides("sub.Tensor", always, marked_sub)
    with front.serving("compiled"):
        assert "python_native compiled front" in torch._C._dispatch_dump("aten::sub.Tensor")
        assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000.0))
    with front.serving("python"):
        assert "python_native compiled front" not in torch._C._dispatch_dump("aten::sub.Tensor")
        assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000.0))


# ----- choosing, building and reporting the front (fresh processes) -----

def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1", **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=900)


def _status(**env: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "python_native", "status", "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", **env}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)["front"]


@pytest.mark.slow
def test_status_says_which_front_serves_and_why():
    cached = _status()
    assert cached["front"] == "compiled" and "cached build" in cached["why"] and cached["library"]
    forced = _status(PYTHON_NATIVE_FRONT="python")
    assert forced["front"] == "python" and "PYTHON_NATIVE_FRONT=python" in forced["why"]


def test_without_a_cached_build_import_compiles_nothing_and_says_how(tmp_path):
    info = _status(PYTHON_NATIVE_CACHE_DIR=str(tmp_path))
    assert info["front"] == "python" and "precompile" in info["why"]
    assert not any(tmp_path.rglob("*.so"))


def _logging_compiler(tmp_path: Path) -> tuple[Path, Path]:
    """A C++ compiler that logs each run to a file, then runs the real one."""
    log = tmp_path / "compiler.log"
    cxx = tmp_path / "logging-c++"
    cxx.write_text(f"#!/bin/sh\necho run >> {log}\nexec c++ \"$@\"\n")
    cxx.chmod(0o755)
    return cxx, log


@pytest.mark.slow  # compiles the front in a fresh cache
def test_precompile_builds_it_once_across_processes_and_then_reports_it_cached(tmp_path):
    cxx, log = _logging_compiler(tmp_path)
    env = {**os.environ, "PYTHON_NATIVE_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(cxx)}
    cmd = [sys.executable, "-m", "python_native", "precompile", "--dsl", "front", "--json"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out)["front"])
    assert log.read_text().count("run") == 1  # four processes, one build
    assert sorted(r["cached"] for r in results) == [False, True, True, True]
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert json.loads(again.stdout)["front"]["cached"] is True
    info = _status(PYTHON_NATIVE_CACHE_DIR=str(tmp_path / "cache"), CXX=str(cxx))
    assert info["front"] == "compiled" and info["library"] == results[0]["library"]


def test_forcing_the_compiled_front_makes_a_failed_build_an_error(tmp_path):
    broken = tmp_path / "broken-c++"
    broken.write_text("#!/bin/sh\necho 'fatal: this compiler is broken' >&2\nexit 3\n")
    broken.chmod(0o755)
    proc = _python("import python_native", PYTHON_NATIVE_FRONT="compiled", PYTHON_NATIVE_CACHE_DIR=str(tmp_path),
                   CXX=str(broken), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert proc.returncode != 0
    assert "BuildError" in proc.stderr and "this compiler is broken" in proc.stderr


def test_forcing_the_python_front_restores_the_routers_alone():
    proc = _python(textwrap.dedent("""
        import torch, python_native as pn
        from python_native.features import front
        assert front.current() == "python", front.describe()
        assert not any("compiled front" in torch._C._dispatch_dump(n) for n in ("aten::_softmax", "aten::silu"))
        print("ok")
    """), PYTHON_NATIVE_FRONT="python")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


# ----- removing an override while other threads call its op -----

_STRESS = r"""
import sys, threading, time, types, torch, torch.backends.python_native as pn
for name in ("d1", "d2"):
    pn.register_dsl(name, types.SimpleNamespace(runtime_available=lambda: True, runtime_version=lambda: "1"))
x = torch.randn(8, 32)
ops = [("relu", torch.relu, lambda s: s.clamp(min=0)), ("neg", torch.neg, lambda s: s * -1),
       ("sigmoid", torch.sigmoid, lambda s: 1 / (1 + torch.exp(-s)))]
stop, errors, calls = False, [], [0]

def call(op, fn):
    try:
        while not stop:
            assert torch.allclose(fn(x), getattr(torch, op)(x.double()).float(), atol=1e-6)
            calls[0] += 1
    except BaseException as e:
        errors.append(repr(e))

threads = [threading.Thread(target=call, args=(op, fn)) for op, fn, _ in ops for _ in range(2)]
for t in threads:
    t.start()
end, cycles = time.time() + float(sys.argv[1]), 0
while time.time() < end:
    for op, _, impl in ops:
        for dsl in ("d1", "d2"):
            pn.register_op_override(dsl, "aten", op, "CPU", cond=lambda s: True, impl=impl).remove()
        both = [pn.register_op_override(dsl, "aten", op, "CPU", cond=lambda s: True, impl=impl) for dsl in ("d1", "d2")]
        for h in both:
            h.remove()
    cycles += 1
stop = True
for t in threads:
    t.join()
assert not errors, errors[:3]
print("cycles", cycles, "calls", calls[0], pn.front.current())
"""


@pytest.mark.slow
@pytest.mark.parametrize("which", ["python", "compiled"])
def test_removing_an_ops_last_override_under_calling_threads_never_crashes(which, tmp_path):
    script = tmp_path / "stress.py"
    script.write_text(_STRESS)
    proc = subprocess.run([sys.executable, str(script), "8"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON_NATIVE_FRONT": which})
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-3000:])
    assert f" {which}" in proc.stdout and "cycles" in proc.stdout, proc.stdout
