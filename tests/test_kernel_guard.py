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
from declared_calls import captured_call, first_forward

import python_native as pn

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


def _public_call(fam: family.Family) -> Callable[[], object] | None:
    """A public call reaching the family: the first case verify drives the family's first forward
    through (its declaration's ``Op.verify``); None without one."""
    for built in fam:
        driver = built.op.verify
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


def _not_installed() -> dict[tuple[str, str], family.Family]:
    """The families not installed here, by (DSL, family): each is checked through its impl."""
    found = {("cutedsl", f.name): f for f in cutedsl_ops.families()}
    installed = set(_installed_families())
    return {**{("triton", f.name): f for f in triton_ops.families() if f.name not in installed}, **found}


def _impl_call(fam: family.Family) -> Callable[[], object]:
    """The family's first forward impl, called without a plan on the arguments its verify driver's
    first case passes the op (on the backend's device: CPU tensors stand in for CUDA ones where the
    kernels run on CUDA, as the import fails before a launch). The impl reaches its kernels first;
    the unmeasured ops model patching declares plan the call before loading them."""
    built = first_forward(fam)
    args, kwargs = captured_call(built, DEVICE)
    return lambda: built.op.impl(*args, **kwargs)


@pytest.mark.parametrize("dsl, name", list(_not_installed()))
def test_an_impl_whose_kernels_fail_to_import_hands_the_call_on(dsl, name, request):
    from python_native_dsls.cutedsl.ops import _rows

    call = _impl_call(_not_installed()[(dsl, name)])  # before the kernels break: it runs the public call
    request.getfixturevalue("broken_kernels")
    _rows._launchers.clear()  # loaded programs would not need the import
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(errors.OverrideUnavailable, match="failed to import"):
            call()
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
