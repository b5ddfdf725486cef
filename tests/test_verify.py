"""``python -m python_native verify``: overrides checked against aten through the CLI and the API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import python_native as pn  # first: registers the backends

# isort: split
import python_native_dsls.triton as backend
from python_native.tools import verify

ROOT = Path(__file__).resolve().parent.parent
# The checkout under test comes first on the path, whichever copy the environment has installed. The CLI
# runs the Triton kernels through Triton's interpreter at the CPU key, on a GPU machine too.
ENV = {**os.environ, "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "python_native", "verify", *args],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=600)


_RUNNABLE = """
import json, torch, python_native as pn
keys = {"CPU"} | ({"CUDA"} if torch.cuda.is_available() else set())
print(json.dumps(sorted({o.op for o in pn.overrides() if o.derived_from is None and o.active and o.dispatch_key in keys})))
"""


def _runnable_under_cli_env() -> set[str]:
    """The active overrides a process started like the CLI's installs at a key this machine runs
    (this process's own may sit at another key: the CUDA one where the kernels run on a GPU)."""
    proc = subprocess.run([sys.executable, "-c", _RUNNABLE], env=ENV, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_softmax_json_passes_and_covers_forward_and_backward():
    proc = _cli("--op", "softmax", "--json", "--max-samples", "1")  # the public name: forward and backward
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"]
    # Every variant is checked (rows "_softmax [split]", ...); coverage counts the ops.
    assert {r["op"] for r in report["rows"]} == {
        f"{op}{suffix}" for op in ("_softmax", "_softmax_backward_data") for suffix in ("", " [split]", " [streamed]")
    }
    assert {r["dtype"] for r in report["rows"]} == {"float32", "float16", "bfloat16"}
    assert all(r["fired"] > 0 and r["status"] == "ok" for r in report["rows"])
    assert report["coverage"]["ops"] == {"_softmax": True, "_softmax_backward_data": True}
    # A relative error stands beside each absolute one (ours and aten's), in the table too.
    for r in report["rows"]:
        for ours, rel in (("max_error", "max_rel_error"), ("max_error_aten", "max_rel_error_aten")):
            assert r[rel] >= 0 and (r[rel] > 0) == (r[ours] > 0), r
    header = verify.render(report).splitlines()[0].split()
    assert header[4:10] == ["max", "err", "ours", "rel", "max", "err"] and header[11] == "rel"


@pytest.mark.slow  # every override, every dtype: minutes in the interpreter
def test_full_run_covers_every_installed_override():
    proc = _cli("--json", "--max-samples", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    cov = report["coverage"]
    assert report["ok"] and cov["covered"] == cov["installed"] > 0 and not cov["unchecked"]
    installed = _runnable_under_cli_env()
    assert "_softmax" in installed and "native_layer_norm" in installed
    assert set(cov["ops"]) == installed


def test_unknown_op_is_a_clear_error():
    proc = _cli("--op", "nosuch")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "'nosuch'" in proc.stderr and "softmax" in proc.stderr


def _wrong_softmax(self, dim, half_to_float):
    return torch.zeros_like(self)


def _raising_impl(self, dim, half_to_float):
    raise RuntimeError("kernel cannot do this")


@pytest.mark.parametrize("impl, expected", [(_wrong_softmax, "elements off"), (_raising_impl, "raised on input its cond accepted")])
def test_bad_override_is_reported(impl, expected):
    # At the key of the library it outranks: verify reports one _softmax row per (DSL, key).
    key = backend.dispatch_key()
    handle = pn.register_op_override("triton", "aten", "_softmax", key, lambda *a: True, impl, priority=100)
    try:
        report = verify.verify(op="_softmax", max_samples=2, dtypes=(torch.float32,))
    finally:
        handle.remove()
    assert not report["ok"]
    softmax = next(r for r in report["rows"] if r["op"] == "_softmax")
    assert softmax["status"] == "FAIL" and any(expected in f for f in softmax["failures"])
    assert "MISMATCH" in verify.render(report)


def test_mismatch_admits_results_closer_to_float64_than_aten():
    truth = torch.tensor([1.0, 2.0], dtype=torch.float64)
    aten = torch.tensor([1.5, 2.0])
    assert verify.mismatch(torch.tensor([1.0, 2.0]), aten, truth, "x") is None
    assert "1/2 elements off" in verify.mismatch(torch.tensor([3.0, 2.0]), aten, truth, "x")


def _doubling_dropout(input, p, train):
    mask = torch.rand_like(input) >= p
    return input * mask * 2.0, mask  # the wrong scale, whatever p is


def test_dropout_is_judged_by_structure():
    """Random results cannot be compared with aten's value by value: a dropout keeping the right
    fraction with a wrong scale fails, the library's own passes."""
    report = verify.verify(op="native_dropout", max_samples=4, dtypes=(torch.float32,))
    assert report["ok"], verify.render(report)
    key = backend.dispatch_key()
    handle = pn.register_op_override("triton", "aten", "native_dropout", key, lambda *a: True, _doubling_dropout,
                                     priority=100)
    try:
        report = verify.verify(op="native_dropout", max_samples=4, dtypes=(torch.float32,))
    finally:
        handle.remove()
    dropout = next(r for r in report["rows"] if r["op"] == "native_dropout" and r["failures"])
    assert any("scale 2, expected" in f for f in dropout["failures"]), dropout["failures"]


def test_every_declared_op_has_a_driver_that_knows_its_forward():
    """Every op of every family is driven: a forward by its own driver, a backward through the driver
    of the forward declared under the same public name (the families say which is which)."""
    from python_native_dsls.cutedsl.ops import families as cutedsl_families
    from python_native_dsls.triton.ops import families as triton_families

    for family in [*triton_families(), *cutedsl_families()]:
        forwards = {b.op.public_name: b.spec.op for b in family if not b.op.backward}
        for built in family:
            op = built.spec.op
            if built.op.backward:
                assert verify.FORWARD_OF.get(op) == forwards[built.op.public_name], (family.name, op)
            else:
                assert op in verify.DRIVERS, (family.name, op)


def test_the_drivers_are_the_declarations_own_and_nothing_else():
    """verify keeps no table of ops: its drivers are exactly those the declarations carry
    (``Op.verify``), each forward op of both backends has one, an op both backends declare has one
    driver object for both, and no module of the package builds a driver of its own."""
    from python_native_dsls.catalogue import built_ops

    declared: dict[str, object] = {}
    for built in built_ops():
        if built.op.backward:
            continue
        assert built.op.verify is not None, f"{built.op.lib}::{built.spec.op} declares no verify driver (Op.verify)"
        assert declared.setdefault(built.spec.op, built.op.verify) is built.op.verify, built.spec.op
    assert verify.DRIVERS.keys() == declared.keys()
    for op, driver in verify.DRIVERS.items():
        own = declared[op]
        assert (driver.cases, driver.opinfos, driver.check) == (own.cases, own.opinfos, own.check), op
        assert driver.backward_ops == own.backward_ops or not own.backward_ops, op
    builders = [p.relative_to(ROOT) for p in (ROOT / "python_native").rglob("*.py") if "Driver(" in p.read_text()]
    assert builders == []
