"""Skip rules shared by the CuTe DSL tests."""

from __future__ import annotations

import pytest
import torch

import python_native as pn  # noqa: F401  (first: mounts the control plane and registers the DSLs)

# isort: split
import python_native_dsls.cutedsl as backend

INSTALLED = backend._install_problem() is None
requires_cutlass = pytest.mark.skipif(not INSTALLED, reason=f"CuTe DSL not installed: {backend._install_problem()}")
requires_gpu = pytest.mark.skipif(
    not backend.runtime_available(), reason=f"CuTe DSL cannot run here: {backend.unavailable_reason()}"
)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
