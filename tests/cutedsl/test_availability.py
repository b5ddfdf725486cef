"""``pn.cutedsl``: availability with a precise reason, version from metadata, no cutlass import."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from cutedsl_testing import INSTALLED, requires_cutlass

import python_native as pn
from python_native_dsls.cutedsl import ops


def test_importing_python_native_imports_no_cutlass():
    code = (
        "import sys, torch, python_native as pn\n"
        "pn.cutedsl.available, pn.cutedsl.version, pn.cutedsl.unavailable_reason\n"
        "import python_native_dsls.cutedsl.ops\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cutlass', 'tvm_ffi'))\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_unavailable_without_a_gpu_and_says_why():
    assert pn.cutedsl.available is False
    reason = pn.cutedsl.unavailable_reason
    if INSTALLED:
        assert reason.startswith("no CUDA device")
    else:
        assert "nvidia-cutlass-dsl not installed" in reason or "apache-tvm-ffi not installed" in reason
    assert pn.get_dsl_operations("cutedsl") == []


@requires_cutlass
def test_version_reported_when_installed():
    from importlib.metadata import version

    assert str(pn.cutedsl.version) == version("nvidia-cutlass-dsl")


def test_every_family_declares_overrides_and_precompile_specializations():
    ops_by_family = {f.name: {s.op for s in f.specs} for f in ops.families()}
    assert ops_by_family == {
        "rms_norm": {"_fused_rms_norm", "_fused_rms_norm_backward"},
        "softmax": {"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"},
        "layer_norm": {"native_layer_norm", "native_layer_norm_backward"},
        "reductions": {"sum.dim_IntList", "mean.dim", "amax", "amin"},
    }
    declared = {op for op, _, _ in ops.precompile_specializations()}
    assert declared == set().union(*ops_by_family.values())


def test_families_left_out_are_recorded_with_why(monkeypatch):
    """A family whose ops lack a CUDA kernel to fall back to is not installed, and SKIPPED says so."""
    from python_native_dsls import family

    monkeypatch.setattr(family, "has_kernel", lambda op, key, lib="aten": op != "native_layer_norm_backward")
    installed = {s.op for s in ops.all_overrides()}
    assert "native_layer_norm" not in installed and "_softmax" in installed
    assert ops.SKIPPED["layer_norm"] == "aten::native_layer_norm_backward has no kernel at CUDA to fall back to"


def _cond(module, op: str):
    return module.FAMILY[op].cond


def test_conds_reject_what_the_kernels_do_not_take():
    """Metadata-only checks; a CPU tensor is never taken, and neither is a non-unit column stride."""
    from python_native_dsls.cutedsl.ops import _rows, layer_norm, reductions, rms_norm, softmax, why

    x = torch.randn(4, 8)
    assert not _cond(reductions, "sum.dim_IntList")(x, [-1]) and not _cond(reductions, "amax")(x, [1])
    assert not _cond(rms_norm, "_fused_rms_norm")(x, [8], None, None)
    assert not _cond(softmax, "_softmax")(x, 1, False)
    assert not _cond(layer_norm, "native_layer_norm")(x, [8], None, None, 1e-5)
    assert softmax.FAMILY["_softmax"].explain(x, 1, False) == "device cpu: the kernels run on CUDA devices"
    meta = torch.empty(6, 8, device="meta")
    assert why.rows(_rows.as_rows(meta, 1)) is None
    assert why.rows(_rows.as_rows(meta[::2], 1)) is None  # row slices: any row stride
    assert why.rows(_rows.as_rows(meta.t(), 1)).startswith("layout: the rows' columns are 8 apart")
    assert why.rows(_rows.as_rows(torch.empty(0, 8, device="meta"), 1)) == "empty input"
    assert _rows.size_class(1024) == ("short", 128) and _rows.size_class(1025)[0] == "medium"
    assert _rows.size_class(256 * 1024) == ("long", 512)
    with pytest.raises(ValueError, match="unknown size class 'huge'"):
        _rows.threads_of("huge")


def test_reduction_conds_take_unit_stride_last_dims_only(monkeypatch):
    """With the device check passed (meta tensors stand in for CUDA ones): one dim, the last that is
    not of size 1, with unit stride; float dtypes; no ``dtype=`` cast; no empty or zero-dim input.
    Each decline has its reason, and each plan is the rows and the result's shape."""
    from python_native_dsls.cutedsl.ops import reductions, why

    monkeypatch.setattr(why, "device", lambda *tensors: None)
    reductions.FAMILY.clear_plans()
    summed, maxed = reductions.FAMILY["sum.dim_IntList"], reductions.FAMILY["amax"]
    meta = torch.empty(6, 8, device="meta")
    assert summed.cond(meta, [-1]) == ((6, 8, 8, 1), (6,))
    assert summed.cond(meta[::2], [1], True) == ((3, 8, 16, 1), (3, 1))
    assert maxed.cond(torch.empty(6, 8, 1, device="meta"), [1])
    assert summed.cond(meta, [1], dtype=torch.float32)
    for dim in ([0], [0, 1], None, []):
        assert not summed.cond(meta, dim) and summed.explain(meta, dim)
    assert summed.explain(meta, [0, 1]) == "dim=[0, 1]: the kernels reduce over exactly one dim"
    assert not maxed.cond(meta.t(), [1])  # columns strided
    assert summed.explain(meta.half(), [1], dtype=torch.float32) == "dtype=float32 (the kernels return the input's float16)"
    assert maxed.explain(meta.to(torch.int32), [1]).startswith("dtype int32")
    assert maxed.explain(torch.empty(6, 0, device="meta"), [1]) == "empty input"
    assert summed.explain(torch.empty((), device="meta"), [0]) == "a 0-d input"
    assert all(not spec.measured for spec in reductions.FAMILY.specs)
    assert {op for op, _, _ in reductions.precompile_specializations()} == set(reductions.KINDS)
    reductions.FAMILY.clear_plans()
