"""Fault isolation: a bad piece from outside (a DSL runtime, the dump folder, an ordering function,
an environment variable) costs only what depends on it, is named in the status report, and the
report never raises."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import python_native as pn
from conftest import always, marked_sub
from python_native.foundations import env, faults
from python_native.tools import report

ROOT = Path(__file__).resolve().parent.parent


def run(code: str, **variables: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [variables.pop("PYTHONPATH", ""), str(ROOT)])),
               "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1", **variables}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environ, timeout=300)


def last_json(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def clean_faults():
    yield
    faults._problems.clear()


# ----- a DSL runtime that is installed but raises on import -----

# Every overridden op, forward and backward, through the public torch API.
CALL_EVERY_OP = """
import json, warnings
import torch, torch.nn.functional as F
import python_native as pn
from python_native.tools import report

def calls():
    x = torch.randn(4, 16, requires_grad=True)
    out = [F.softmax(x, -1), F.log_softmax(x, -1), F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x),
           F.layer_norm(x, (16,), torch.ones(16), torch.zeros(16))]
    sum(o.sum() for o in out).backward()
    out.append(torch.bmm(torch.randn(2, 3, 1), torch.randn(2, 1, 5)))
    return out

installed = sorted({o.op for o in pn.overrides() if o.dsl == "triton"})
before = (pn.triton.available, pn.triton.unavailable_reason)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with pn.trace() as t:
        got = calls()
    again = calls()  # routed around the DSL from now on: no new failure, no new warning
with pn.triton.disabled():
    torch.manual_seed(0); ref = calls()
torch.manual_seed(0); now = calls()
data = pn.status()
text = report.render(data)
print(json.dumps({
    "installed": installed, "before": before,
    "after": [pn.triton.available, pn.triton.unavailable_reason],
    "warnings": [str(w.message) for w in caught if "triton" in str(w.message)],
    "overrides_fired": sorted({e.op for e in t.events if e.outcome == "override"}),
    "active": [o["op"] for o in data["overrides"] if o["dsl"] == "triton" and o["active"]],
    "problems": [p["source"] for p in data["problems"]],
    "equal": all(torch.allclose(a, b) for a, b in zip(now, ref)),
    "in_report": "broken triton" in text and "why unavailable" in text,
}))
"""


def test_triton_that_raises_on_import_serves_aten_and_is_named_in_status(tmp_path):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("raise RuntimeError('broken triton build: undefined symbol')\n")
    out = last_json(run(CALL_EVERY_OP, PYTHONPATH=str(tmp_path)))
    assert "native_layer_norm" in out["installed"] and "bmm" in out["installed"]
    assert out["before"] == [True, None]  # nothing imports triton before the first kernel call
    available, reason = out["after"]
    assert not available and "broken triton" in reason and "import" in reason
    assert out["active"] == [] and "triton" in out["problems"] and out["in_report"]
    assert len(out["warnings"]) == 1, out["warnings"]
    assert out["equal"]
    # The status command of a process that found the failure, and of a fresh one, both run.
    r = run("import sys; from python_native.__main__ import main; sys.exit(main(['status']))", PYTHONPATH=str(tmp_path))
    assert r.returncode == 0 and "triton" in r.stdout, r.stderr[-2000:]


def test_an_impl_that_hands_on_reaches_the_next_override_then_aten(overrides, x):
    from python_native.core import errors

    def unavailable(self, other, alpha=1):
        raise errors.OverrideUnavailable("no runtime here")

    overrides("sub.Tensor", always, unavailable, priority=2)
    overrides("sub.Tensor", always, marked_sub, priority=1)
    with pn.trace() as t:
        assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
    assert [e.outcome for e in t.events] == ["override", "override"]
    with pn.operations_disabled("sub.Tensor"), pn.trace():
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    def mul_unavailable(self, other):
        raise errors.OverrideUnavailable("no runtime here")

    overrides("mul.Tensor", None, mul_unavailable, unconditional_override=True)
    assert torch.equal(torch.mul(x, x), torch.from_numpy(x.numpy() * x.numpy()))


# ----- the dump folder -----

def test_unwritable_dump_dir_keeps_every_override_and_is_reported_once(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = last_json(run("""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, python_native as pn
            from python_native_dsls.triton.ops import all_overrides
            x = torch.randn(3, 8)
            with pn.triton.disabled():  # toggles compile new routers: still no error
                torch.softmax(x, -1)
            with pn.trace() as t:
                torch.softmax(x, -1)
        data = pn.status()
        print(json.dumps({
            "expected": sorted({s.op for s in all_overrides()}),
            "installed": sorted({o.op for o in pn.overrides() if o.dsl == "triton" and o.derived_from is None}),
            "fired": t.ops("override"),
            "warnings": [str(w.message) for w in caught if "DUMP_DIR" in str(w.message)],
            "problems": {p["source"]: p["problem"] for p in data["problems"]},
            "row": next(e for e in data["environment"] if e["name"] == "PYTHON_NATIVE_DUMP_DIR")["problem"],
        }))
    """, PYTHON_NATIVE_DUMP_DIR=str(blocker / "routers")))
    assert out["installed"] == out["expected"] and out["fired"] == ["_softmax"]
    assert len(out["warnings"]) == 1 and "cannot write generated routers" in out["warnings"][0]
    assert "PYTHON_NATIVE_DUMP_DIR" in out["problems"] and "Not a directory" in out["row"]


def test_dump_dir_problem_clears_once_writable(tmp_path, monkeypatch, overrides, clean_faults):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PYTHON_NATIVE_DUMP_DIR", str(blocker / "x"))
    with pytest.warns(UserWarning, match="cannot write generated routers"):
        overrides("sub.Tensor", always, marked_sub)
    assert faults.problem_of("PYTHON_NATIVE_DUMP_DIR")
    monkeypatch.setenv("PYTHON_NATIVE_DUMP_DIR", str(tmp_path / "ok"))
    with pn.trace():  # new (traced) routers: dumped
        pass
    assert faults.problem_of("PYTHON_NATIVE_DUMP_DIR") is None and list((tmp_path / "ok").iterdir())


# ----- ordering functions -----

ORDER_MODULE = """
def raises(op, key, overrides):
    raise RuntimeError("ordering exploded")

def junk(op, key, overrides):
    return 42
"""


@pytest.mark.parametrize("fn", ["raises", "junk"])
def test_ordering_function_from_the_environment_that_fails_keeps_every_override(tmp_path, fn):
    (tmp_path / "orders.py").write_text(ORDER_MODULE)
    out = last_json(run("""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, python_native as pn
            from python_native_dsls.triton.ops import all_overrides
        from python_native.tools import report
        data = pn.status()
        print(json.dumps({
            "expected": sorted({s.op for s in all_overrides()}),
            "installed": sorted({o.op for o in pn.overrides() if o.dsl == "triton" and o.active and o.derived_from is None}),
            "warnings": [str(w.message) for w in caught if "ORDER_FN" in str(w.message)],
            "problems": [p["source"] for p in data["problems"]],
            "rendered": "PYTHON_NATIVE_ORDER_FN" in report.render(data).partition("DSLs")[0],
        }))
    """, PYTHONPATH=str(tmp_path), PYTHON_NATIVE_ORDER_FN=f"orders.{fn}"))
    assert out["installed"] == out["expected"]
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "ordering exploded" in out["warnings"][0] if fn == "raises" else "permutation" in out["warnings"][0]
    assert out["problems"] == ["PYTHON_NATIVE_ORDER_FN"] and out["rendered"]


def test_ordering_function_failing_later_keeps_the_default_order(overrides, x, clean_faults):
    def only_sub(op, key, found):
        if op == "mul.Tensor":
            raise KeyError(op)
        return list(found)

    first = overrides("sub.Tensor", always, marked_sub)
    pn.reorder_overrides(only_sub)  # fine on every slot there is now
    with pytest.warns(UserWarning, match="pn.reorder_overrides: ordering function .* failed for mul.Tensor"):
        a = overrides("mul.Tensor", always, lambda s, o: torch.full_like(s, 7.0))
    b = overrides("mul.Tensor", always, lambda s, o: torch.full_like(s, 8.0))  # reported once only
    assert a.active and b.active and first.active
    assert torch.equal(torch.mul(x, x), torch.full_like(x, 7.0))  # default order: registration
    assert "pn.reorder_overrides" in {p["source"] for p in pn.status()["problems"]}
    pn.reorder_overrides(None)
    assert "pn.reorder_overrides" not in {p["source"] for p in pn.status()["problems"]}


def test_bad_ordering_path_is_named(monkeypatch, clean_faults):
    from python_native.core.ordering import Ordering

    monkeypatch.setenv("PYTHON_NATIVE_ORDER_FN", "not a path")
    with pytest.warns(UserWarning, match="not a dotted path"):
        assert Ordering().function() is None
    assert "PYTHON_NATIVE_ORDER_FN" in {p["source"] for p in pn.status()["problems"]}


# ----- environment variables -----

@pytest.mark.parametrize("reader, names", [
    (env.check_overrides, env.CHECK), (env.skip_version_check, env.SKIP_VERSION_CHECK),
    (env.cutedsl_opted_in, env.CUTEDSL), (env.overrides_disabled, env.DISABLE_ALL),
])
def test_malformed_flag_warns_once_counts_as_unset_and_is_named(monkeypatch, reader, names, clean_faults):
    monkeypatch.setenv(names[0], "maybe")
    with pytest.warns(UserWarning, match=f"{names[0]}: 'maybe' is not a flag value"):
        assert reader() is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reader() is False  # warned once
    row = next(e for e in pn.status()["environment"] if e["name"] == names[0])
    assert row["value"] == "maybe" and "not a flag value" in row["problem"]
    assert "problem: 'maybe' is not a flag value" in report.render(pn.status())
    for spelling, expected in (("on", True), ("TRUE", True), ("0", False), ("off", False)):
        monkeypatch.setenv(names[0], spelling)
        assert reader() is expected
    assert faults.problem_of(names[0]) is None


def test_malformed_kill_switch_leaves_the_overrides_on():
    out = last_json(run("""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, python_native as pn
        print(json.dumps({"active": sum(o.active for o in pn.overrides() if o.dsl == "triton"),
                          "warnings": [str(w.message) for w in caught if "PYTHON_NATIVE_DISABLE" in str(w.message)]}))
    """, PYTHON_NATIVE_DISABLE="perhaps"))
    assert out["active"] > 0 and len(out["warnings"]) == 1


def test_bad_cute_dsl_arch_falls_back_to_the_device(monkeypatch, clean_faults):
    compiler = pytest.importorskip("python_native_dsls.cutedsl.kernels.compiler", reason="needs nvidia-cutlass-dsl")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setenv("CUTE_DSL_ARCH", "hopper")
    with pytest.warns(UserWarning, match="CUTE_DSL_ARCH: 'hopper' is not a GPU architecture"):
        assert compiler.device_arch() == "sm_90a"
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
    assert compiler.device_arch() == "sm_100a"


# ----- the status report never raises -----

def test_status_survives_a_section_that_raises(monkeypatch):
    from python_native.features import calibration
    from python_native.panel import native_bridge

    def broken(*args):
        raise RuntimeError("calibration table exploded")

    monkeypatch.setattr(calibration, "describe", broken)
    monkeypatch.setattr(native_bridge, "origin_of", broken)
    data = pn.status()
    assert data["dsls"] and "calibration" not in data
    sources = " ".join(p["source"] + p["problem"] for p in data["problems"])
    assert "calibration table exploded" in sources and "override" in sources
    text = report.render(data)
    assert "Problems" in text and "calibration table exploded" in text


def test_status_survives_a_broken_third_party_dsl():
    class Broken:
        def runtime_available(self):
            raise OSError("driver gone")

        def runtime_version(self):
            raise OSError("driver gone")

        def skipped_overrides(self):
            raise OSError("driver gone")

    from python_native.foundations import dsl_registry

    pn.register_dsl("brokendsl", Broken())
    try:
        data = pn.status()
        entry = next(d for d in data["dsls"] if d["name"] == "brokendsl")
        assert entry["available"] is False and entry["version"] is None
        report.render(data)
    finally:
        dsl_registry._dsls.pop("brokendsl")
