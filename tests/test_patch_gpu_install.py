"""On a GPU, ``pn.patch`` installs the overrides of the ops it routes to that a backend held back as
unmeasured, and has them timed on their first call per (dtype, size): the faster serves after.

The CPU key stands for a GPU key here: CPU tensors report a fake GPU's device key, a fake clock
times the first calls, and a backend (the test DSL) registers its ``rms_norm`` kernels at the CPU
key as a backend does at a GPU key with nothing timed there: held back, named as left out."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

# isort: split
import python_native as pn
from conftest import TEST_DSL
from python_native.core import extensions
from python_native.core.registry import REGISTRY
from python_native.foundations import custom_ops, dsl_registry
from python_native.ops import rms_norm_op
from python_native.panel import dsl_support
from python_native.tools import tiny_models
from python_native_dsls.spec import OverrideSpec

HELD = ("rms_norm", "rms_norm_backward")


def _forward(input, weight, eps, offset=0.0, weight_in_fp32=False):
    return rms_norm_op._reference(input, weight, eps, offset, weight_in_fp32)


def _backward(grad_output, input, weight, eps, offset, weight_in_fp32):
    return rms_norm_op._reference_backward(grad_output, input, weight, eps, offset, weight_in_fp32)


def _specs() -> list[OverrideSpec]:
    return [OverrideSpec("rms_norm", lambda *a, **k: True, _forward, measured=False, lib=custom_ops.NAMESPACE),
            OverrideSpec("rms_norm_backward", lambda *a, **k: True, _backward, measured=False,
                         lib=custom_ops.NAMESPACE)]


def _ours(key: str = "CPU") -> list:
    """The test DSL's overrides of the held ops installed at ``key``."""
    return [o for op in HELD if (slot := REGISTRY.slots.get((custom_ops.NAMESPACE, op, key)))
            for o in slot.overrides if o.dsl == TEST_DSL]


def _take_out(key: str) -> None:
    for o in _ours(key):
        REGISTRY.remove(o)
    dsl_support._held.pop((TEST_DSL, key), None)


@pytest.fixture
def gpu(calib, monkeypatch):
    """A fake GPU behind the CPU key, timed by a fake clock, where the test DSL's ``rms_norm``
    kernels are held back as unmeasured (and listed as left out by its ``skipped_overrides``);
    Triton held off, so only they can serve. Yields the clock."""
    from first_use_testing import patching_on_a_fake_gpu

    with patching_on_a_fake_gpu(calib, monkeypatch) as clock:
        real = dsl_support.unmeasured_reason
        monkeypatch.setattr(dsl_support, "unmeasured_reason",
                            lambda op, dsl, key: "not timed on this GPU" if dsl == TEST_DSL else real(op, dsl, key))
        skipped: dict[str, str] = {}
        monkeypatch.setattr(dsl_registry.get(TEST_DSL), "skipped_overrides", lambda: dict(skipped), raising=False)
        assert dsl_support.register_specs(TEST_DSL, "CPU", _specs(), skipped) == []
        clock.skipped = skipped
        try:
            with pn.triton.disabled():
                yield clock
        finally:
            _take_out("CPU")


def _norm() -> torch.nn.Module:
    return tiny_models.build("llama", num_hidden_layers=1).model.norm


def _status() -> dict:
    return next(d for d in pn.status()["dsls"] if d["name"] == TEST_DSL)


@pytest.mark.override
@pytest.mark.parametrize(("timings", "outcome"), [((1.0, 2.0), "override"), ((2.0, 1.0), "fallback")])
def test_patch_on_a_gpu_installs_the_held_kernels_and_times_each_once(gpu, timings, outcome):
    gpu.timings = lambda numel: timings  # (override ms, reference ms)
    assert set(_status()["skipped"]) == set(HELD) and _ours() == []
    norm = _norm()
    x = torch.randn(2, 5, norm.weight.shape[0])
    with pn.patched(norm) as report:
        assert sorted(o.op for o in _ours()) == sorted(HELD)  # installed at the key, by pn.patch
        serves = report.patched[0].serves
        assert f"{TEST_DSL} override of python_native::rms_norm installed at CPU by pn.patch" in serves
        assert "timed on its first call" in serves
        assert _status()["skipped"] == {}  # no longer named as left out
        with pn.trace() as first:
            norm(x)
        with pn.trace() as again:
            norm(x)
    assert gpu.asked == [tuple(x.shape)]  # timed once, on the first call of its size
    for t in (first, again):  # the verdict is kept
        assert [(e.op, e.dsl if e.outcome == "override" else None, e.outcome) for e in t.events
                if e.op.startswith("rms_norm")] == [("rms_norm", TEST_DSL if outcome == "override" else None, outcome)]
    assert sorted(o.op for o in _ours()) == sorted(HELD)  # unpatching leaves them installed (docstring)


def test_a_second_patch_does_not_install_twice(gpu):
    first, second = _norm(), _norm()
    with pn.patched(first), pn.patched(second) as report:
        assert sorted(o.op for o in _ours()) == sorted(HELD)
        assert "installed at CPU by pn.patch" not in report.patched[0].serves
        assert report.patched[0].serves.startswith(f"{TEST_DSL} override")


def test_pn_benchmark_false_stops_both_the_install_and_the_timing(gpu):
    pn.benchmark = False
    norm = _norm()
    with pn.patched(norm) as report:
        norm(torch.randn(2, 5, norm.weight.shape[0]))
    assert _ours() == [] and gpu.asked == []
    assert "by pn.patch" not in report.patched[0].serves and "timed" not in report.patched[0].serves
    assert set(_status()["skipped"]) == set(HELD)


def test_off_a_gpu_nothing_is_installed(gpu, calib):
    calib.device("cpu")  # CPU tensors are on the CPU again
    with pn.patched(_norm()) as report:
        assert _ours() == []
    assert "by pn.patch" not in report.patched[0].serves


def test_a_failing_install_leaves_the_registry_and_dispatcher_as_they_were(gpu, monkeypatch):
    real = REGISTRY.register
    slots = {k: list(s.overrides) for k, s in REGISTRY.slots.items()}
    dumps = [torch._C._dispatch_dump(f"{custom_ops.NAMESPACE}::{op}") for op in HELD]

    def register(dsl, lib, op, *args, **kwargs):
        if op == "rms_norm_backward":
            raise RuntimeError("no room for rms_norm_backward")
        return real(dsl, lib, op, *args, **kwargs)

    monkeypatch.setattr(REGISTRY, "register", register)
    norm = _norm()
    x = torch.randn(2, 5, norm.weight.shape[0])
    with pn.patched(norm) as report:
        assert {k: list(s.overrides) for k, s in REGISTRY.slots.items()} == slots
        assert _ours() == [] and [torch._C._dispatch_dump(f"{custom_ops.NAMESPACE}::{op}") for op in HELD] == dumps
        assert "failed to install at CPU, none was: RuntimeError: no room for rms_norm_backward" in report.patched[0].serves
        assert set(_status()["skipped"]) == set(HELD)  # still held, still named
        with pn.trace() as t:
            out = norm(x)
    assert [e.outcome for e in t.events if e.op == "rms_norm"] == ["fallback"]  # the module's own code ran
    torch.testing.assert_close(out, norm(x), rtol=0, atol=0)
    monkeypatch.setattr(REGISTRY, "register", real)
    assert sorted(extensions.install_held(HELD, "CPU")) == sorted(f"{TEST_DSL} {op}" for op in HELD)  # held still


def test_held_kernels_install_at_the_cuda_key_all_or_none(calib, monkeypatch):
    """The CUDA key itself, without a GPU: kept when left out as unmeasured, installed when asked."""
    from calibration_testing import H100

    monkeypatch.delenv("PYTHON_NATIVE_UNMEASURED", raising=False)
    calib.gpus([H100])
    skipped: dict[str, str] = {}
    try:
        assert dsl_support.register_specs(TEST_DSL, "CUDA", _specs(), skipped) == []
        assert set(skipped) == set(HELD) and _ours("CUDA") == []
        assert extensions.install_held(("rms_norm",), "CPU") == []  # held at another key
        assert extensions.install_held(("rms_norm",), "CUDA") == [f"{TEST_DSL} rms_norm"]
        assert [o.op for o in _ours("CUDA")] == ["rms_norm"] and set(skipped) == {"rms_norm_backward"}
        assert extensions.install_held(("rms_norm",), "CUDA") == []  # once
    finally:
        _take_out("CUDA")
