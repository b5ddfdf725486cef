"""The worked example of ``docs/dsl-authors.md`` (a new op from scratch: ``hardsigmoid``) is real.

The page's two modules, a Triton kernel module and the family declaring the op, are read from the
page as written and loaded where the page says they live (``python_native_dsls.triton.kernels`` and
``.ops``), their relative imports included. Installed at the backend's key, the family's overrides
take ``F.hardsigmoid`` and its backward through the dispatcher: the trace shows the hits, the
results equal aten's, and a call the kernels decline says why.
"""

from __future__ import annotations

import re
import sys
from importlib import import_module
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from triton_testing import DEVICE, KEY, requires_triton

import python_native as pn

# isort: split
import python_native_dsls.triton.kernels as kernels_package
import python_native_dsls.triton.ops as ops_package
from python_native.foundations import public_names
from python_native.panel import dsl_support

pytestmark = requires_triton

PAGE = Path(__file__).resolve().parents[2] / "docs" / "dsl-authors.md"
FENCE = re.compile(r"^```python notest\n(.*?)^```\s*$", re.S | re.M)
MODULES = {"kernels": "dsls/triton/kernels/hardsigmoid.py", "ops": "dsls/triton/ops/hardsigmoid.py"}


def page_module(path: str) -> str:
    """The page's block that begins with ``# <path>``."""
    found = [body for body in FENCE.findall(PAGE.read_text()) if body.startswith(f"# {path}\n")]
    assert len(found) == 1, f"docs/dsl-authors.md shows {path} {len(found)} times"
    return found[0]


@pytest.fixture
def example_family(tmp_path, monkeypatch):
    """The page's family, loaded in place and installed at the backend's key; all of it gone afterwards."""
    for package, folder in ((kernels_package, "kernels"), (ops_package, "ops")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "hardsigmoid.py").write_text(page_module(MODULES[folder]))
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path / folder)])
    monkeypatch.setattr(public_names, "_groups", dict(public_names._groups))
    monkeypatch.setattr(public_names, "_forwards", dict(public_names._forwards))
    module = import_module("python_native_dsls.triton.ops.hardsigmoid")
    handles = dsl_support.register_specs("triton", KEY, module.FAMILY.specs)
    try:
        yield module.FAMILY, handles
    finally:
        for handle in handles:
            handle.remove()
        module.FAMILY.kernels.cache_clear()
        for name in ("python_native_dsls.triton.ops.hardsigmoid", "python_native_dsls.triton.kernels.hardsigmoid"):
            sys.modules.pop(name, None)


def test_the_example_is_about_forty_lines_of_spec():
    lines = [line for line in page_module(MODULES["ops"]).splitlines() if line.strip()]
    assert len(lines) <= 45


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.override
def test_the_dispatcher_routes_hardsigmoid_to_the_example_kernels(example_family, dtype):
    family, handles = example_family
    assert {h.op for h in handles} == {"hardsigmoid", "hardsigmoid_backward"}
    x = (torch.randn(6, 33, device=DEVICE) * 4).to(dtype)
    x[0, :4] = torch.tensor([-3.0, 3.0, 0.0, -0.0])  # the kinks, where the gradient is 0
    dy = torch.randn(6, 33, device=DEVICE).to(dtype)
    with pn.triton.disabled():
        leaf = x.clone().requires_grad_()
        expected = F.hardsigmoid(leaf)
        expected.backward(dy)
    leaf_ours = x.clone().requires_grad_()
    with pn.trace() as t:
        got = F.hardsigmoid(leaf_ours)
        got.backward(dy)
    assert t.ops("override") == ["hardsigmoid", "hardsigmoid_backward"]
    assert {e.dsl for e in t.events if e.outcome == "override"} == {"triton"}
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(leaf_ours.grad, leaf.grad, rtol=0, atol=0)
    assert pn.operation_names("triton")["hardsigmoid"] == ["hardsigmoid", "hardsigmoid_backward"]


@pytest.mark.override
def test_the_example_says_why_it_declines(example_family):
    with pn.trace() as t:
        F.hardsigmoid(torch.randn(4, 8, dtype=torch.float64, device=DEVICE))
        F.hardsigmoid(torch.randn(4, 8, device=DEVICE)[:, ::2])
    assert [e.outcome for e in t.events] == ["fallback", "fallback"]
    assert t.events[0].reason == "triton: dtype float64 (the kernels take bfloat16, float16, float32)"
    assert t.events[1].reason == "triton: layout: not dense (a broadcast or gappy view)"
