"""Every op family loads its kernels through the one guarded import (``python_native_dsls.family``):
a DSL runtime that breaks after installation serves aten's result, warns once, and is named in
``pn.status()``; and no op module can import its kernels any other way.

The failure is made where a broken runtime would surface: the kernel module's import, on the first
launch after installation. Each family is checked on its own (a DSL whose runtime failed is routed
around as a whole, so one family's failure would hide the next one's), the DSL restored afterwards.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import python_native as pn
from python_native.tools import verify

# isort: split
import python_native_dsls.triton as triton_backend
from python_native.core import errors
from python_native.core.registry import REGISTRY
from python_native.foundations import dsl_registry, faults
from python_native_dsls import family
from python_native_dsls.cutedsl import ops as cutedsl_ops
from python_native_dsls.triton import ops as triton_ops

ROOT = Path(__file__).resolve().parent.parent
DEVICE = triton_backend.device_type()


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE)


def _public_call(fam: family.Family) -> Callable[[], object] | None:
    """A public call reaching the family: the first case verify drives the family's first forward
    through (its declaration's ``Op.verify``, or verify's own table for aten ops); None without one."""
    for built in fam:
        driver = verify.DRIVERS.get(built.spec.op)
        if not built.op.backward and driver is not None:
            sample = next(iter(driver.cases(torch.float32, DEVICE)))
            return lambda: sample.fn(*sample.inputs)
    return None


def _shapes(out: object) -> list[torch.Size]:
    return [t.shape for t in (out if isinstance(out, (tuple, list)) else (out,))]


PUBLIC_CALLS = {f.name: call for f in triton_ops.families() if (call := _public_call(f)) is not None}


@pytest.fixture
def broken_kernels(monkeypatch):
    """From now on every kernel module's import raises, as a runtime broken after installation
    would; afterwards the DSLs are routable again and the failure forgotten."""

    def broken(module: str):
        raise ImportError(f"undefined symbol in the runtime (importing {module})")

    family.forget_kernels()
    monkeypatch.setattr(family, "import_module", broken)
    yield
    monkeypatch.undo()
    family.forget_kernels()
    for dsl in ("triton", "cutedsl"):
        dsl_registry._runtime_failures.pop(dsl, None)
        faults.resolve(dsl)
        with REGISTRY.lock:
            REGISTRY.unroutable_dsls.discard(dsl)
            REGISTRY.refresh_all()


def test_every_triton_family_has_a_public_call_here():
    """Every family's declarations lead to a public call (verify's driver of a forward op)."""
    assert set(PUBLIC_CALLS) == {f.name for f in triton_ops.families()}


def _installed_families() -> list[str]:
    if not triton_backend.runtime_available():
        return []
    installed = set(pn.get_dsl_operations("triton"))
    return [f.name for f in triton_ops.families() if {s.op for s in f.specs} <= installed]


@pytest.mark.parametrize("name", [n for n in PUBLIC_CALLS if n in _installed_families()])
def test_a_broken_runtime_serves_aten_warns_once_and_is_named(name, broken_kernels):
    call = PUBLIC_CALLS[name]
    with pn.triton.disabled():
        torch.manual_seed(0)
        expected = call()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        with pn.trace() as t:
            got = call()
        again = call()  # routed around the DSL from now on: no second failure, no second warning
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert _shapes(again) == _shapes(expected)
    # The override was chosen and its kernels failed to load: the call went on to aten.
    failed = [e for e in t.events if e.outcome == "fallback" and "failed to import" in (e.reason or "")]
    assert failed and "undefined symbol in the runtime" in failed[0].reason, [(e.op, e.reason) for e in t.events]
    ours = [str(w.message) for w in caught if "python_native: triton" in str(w.message)]
    assert len(ours) == 1 and "failed to import" in ours[0], ours
    problems = {p["source"]: p["problem"] for p in pn.status()["problems"]}
    assert "undefined symbol in the runtime" in problems["triton"]
    assert pn.triton.available is False and "failed to import" in pn.triton.unavailable_reason


def _impl_calls() -> dict[tuple[str, str], tuple]:
    """Per family not installed here, one op's impl and arguments: called without a plan, the impl
    reaches its kernels first (CPU tensors stand in for CUDA ones: the import fails before a launch).
    The ops model patching declares are unmeasured: on a GPU without a calibration table they are not
    installed, and their impls plan the call (on the backend's device) before loading the kernels."""
    from python_native_dsls.cutedsl.ops import layer_norm, reductions, rms_norm, softmax
    from python_native_dsls.triton.ops import gated, model_activations, model_rms_norm, moe, rotary
    from python_native_dsls.triton.ops import rms_norm as triton_rms_norm

    x, y = torch.randn(4, 16), _randn(4, 16)
    return {
        ("cutedsl", "softmax"): (softmax.softmax_impl, (x, -1, False)),
        ("cutedsl", "layer_norm"): (layer_norm.layer_norm_impl, (x, [16], None, None, 1e-5)),
        ("cutedsl", "rms_norm"): (rms_norm.rms_norm_impl, (x, [16], None, None)),
        ("cutedsl", "reductions"): (reductions.FAMILY["amax"].op.impl, (x, [1])),
        ("triton", "rms_norm"): (triton_rms_norm.rms_norm_impl, (x, [16], None, None)),
        ("triton", "model_rms_norm"): (model_rms_norm.rms_norm_impl, (y, y[0], 1e-6)),
        ("triton", "gated"): (gated.swiglu_impl, (y, y)),
        ("triton", "rotary"): (rotary.rotary_impl, (y.view(1, 1, 4, 16), y.view(1, 1, 4, 16), y[None], y[None])),
        ("triton", "model_activations"): (model_activations.quick_gelu_impl, (y,)),
        ("triton", "moe"): (moe.experts_impl, (y, torch.zeros(4, 1, dtype=torch.long), y[:, :1], y.view(1, 4, 16)[:, :2],
                                                y.view(1, 16, 4)[:, :, :1])),
    }


def test_every_family_not_installed_here_is_checked_through_its_impl():
    every = {("triton", f.name) for f in triton_ops.families()} | {("cutedsl", f.name) for f in cutedsl_ops.families()}
    reached = {("triton", n) for n in _installed_families()} | set(_impl_calls())
    assert every <= reached, every - reached


@pytest.mark.parametrize("dsl, name", list(_impl_calls()))
def test_an_impl_whose_kernels_fail_to_import_hands_the_call_on(dsl, name, broken_kernels):
    from python_native_dsls.cutedsl.ops import _rows

    _rows._launchers.clear()  # loaded programs would not need the import
    impl, args = _impl_calls()[(dsl, name)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(errors.OverrideUnavailable, match="failed to import"):
            impl(*args)
    assert [str(w.message) for w in caught if f"python_native: {dsl}" in str(w.message)]
    assert "undefined symbol in the runtime" in {p["source"]: p["problem"] for p in pn.status()["problems"]}[dsl]


def _imports(tree: ast.AST) -> list[str]:
    """Every module an AST imports, relative ones with their dots."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found += [base] + [f"{base}.{a.name}" if node.module else base + a.name for a in node.names]
    return found


@pytest.mark.parametrize("backend", ["triton", "cutedsl"])
def test_no_op_module_imports_kernels_past_the_guard(backend):
    """Kernels (and with them the DSL runtime) load only through ``family.kernel_loader``: an op
    module that imported them itself would skip the guard, as eight families once did."""
    offenders = []
    for path in sorted((ROOT / "dsls" / backend / "ops").glob("*.py")):
        for name in _imports(ast.parse(path.read_text())):
            if (name.startswith("..kernels") or ".kernels" in name.replace("python_native_dsls.", "", 1)
                    or name.split(".")[0] in ("triton", "cutlass")):
                offenders.append(f"{path.name}: {name}")
    assert offenders == []
    runtime_users = [p.relative_to(ROOT) for p in (ROOT / "dsls").rglob("*.py") if "runtime_import(" in p.read_text()]
    assert sorted(map(str, runtime_users)) == ["dsls/family.py", "dsls/spec.py"]
