"""Overrides registered through torch's in-tree registry (``torch._native``) obey this panel."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import python_native as pn
from python_native.panel import native_bridge

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("torch._native") is None, reason="this torch has no in-tree registry (torch._native)"
    ),
    pytest.mark.both_fronts,  # dispatcher-level: each test under both fronts
]


@pytest.fixture
def native_override():
    """A torch._native override of aten::sub.Tensor at CPU that adds 1000 to rows of width 3."""
    from torch._native import registry

    calls = []

    def cond(self, other, alpha=1):
        return isinstance(self, torch.Tensor) and self.dim() == 2 and self.shape[-1] == 3

    def impl(self, other, alpha=1):
        calls.append(alpha)
        return torch.add(self, torch.neg(other) * alpha) + 1000

    key = ("sub.Tensor", "CPU")
    before = list(registry._graphs.get(key, []))
    registry.register_op_override("torchdsl", "aten", "sub.Tensor", "CPU", cond, impl)
    yield calls
    registry._graphs[key] = before
    registry._register_overrides_from_graph("sub.Tensor", "CPU", before, filter_state=registry._filter_state)
    if not before:
        registry._graphs.pop(key, None)


def test_torch_native_override_is_adopted_listed_and_traced(native_override):
    from torch._native import registry

    x = torch.ones(2, 3)
    adopted = [h for h in pn.overrides() if native_bridge.origin_of(h) == native_bridge.ORIGIN]
    assert [(h.dsl, h.op, h.dispatch_key) for h in adopted if h.op == "sub.Tensor"] == [("torchdsl", "sub.Tensor", "CPU")]
    assert "torchdsl" in pn.all_dsls
    assert ("sub.Tensor", "CPU") not in registry._aten_override_libs  # torch's router is not installed
    with pn.trace() as t:
        got = torch.sub(x, x)
    assert torch.equal(got, torch.full_like(x, 1000))
    assert [(e.op, e.dsl, e.outcome) for e in t.events] == [("sub.Tensor", "torchdsl", "override")]
    assert native_override == [1]
    assert "_pn_impl_" in pn.router_source("sub.Tensor", "CPU")  # our generated router serves it


def test_torch_native_override_obeys_scopes_and_switches(native_override):
    x = torch.ones(2, 3)
    with pn.operations_disabled("sub"):
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    with pn.torchdsl.disabled():
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    with pn.dispatch_keys_disabled("CPU"):
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
    assert native_override == [1]


def test_torch_native_filters_resync_and_op_is_routed_once(native_override):
    from torch._native import registry

    x = torch.ones(2, 3)
    registry.deregister_op_overrides(disable_dsl_names="torchdsl")
    try:
        assert not [h for h in pn.overrides() if h.dsl == "torchdsl"]
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    finally:
        registry.reenable_op_overrides(enable_dsl_names="torchdsl")
    assert [h.dsl for h in pn.overrides() if h.op == "sub.Tensor"] == ["torchdsl"]
    assert ("sub.Tensor", "CPU") not in registry._aten_override_libs
    with pn.trace() as t:
        torch.sub(x, x)
    assert len(t.events) == 1  # one router: torch's would have produced no event, or a second call


def test_new_process_adopts_torch_native_at_import():
    import os
    import subprocess
    import sys

    code = (
        "import torch, python_native as pn\n"
        "from python_native.panel import native_bridge\n"
        "from torch._native import registry\n"
        "assert not registry._aten_override_libs, registry._aten_override_libs\n"
        "graphs = [(op, key) for (op, key), nodes in registry._graphs.items() if nodes]\n"
        "ours = {(h.op, h.dispatch_key) for h in native_bridge.adopted()}\n"
        "assert set(graphs) <= ours, (graphs, ours)\n"
        "print('ok', len(ours))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_status_report_names_the_origin(native_override):
    from python_native.tools import report

    rows = [o for o in report.collect()["overrides"] if o["op"] == "aten::sub.Tensor"]
    assert [(o["dsl"], o["origin"]) for o in rows] == [("torchdsl", "torch._native")]
    assert "registered through torch._native" in report.render(report.collect())


def test_standalone_lets_torch_route_its_own_overrides_and_then_adopts_them():
    from torch._native import registry

    x = torch.ones(2, 3)
    key = ("sub.Tensor", "CPU")
    before = list(registry._graphs.get(key, []))
    try:
        with native_bridge.standalone():
            registry.register_op_override("torchdsl", "aten", "sub.Tensor", "CPU", lambda *a, **k: True,
                                          lambda s, o, alpha=1: torch.full_like(s, 7.0))
            registry._register_overrides_from_graph("sub.Tensor", "CPU", registry._graphs[key])
            assert key in registry._aten_override_libs  # torch's own router
            assert not [h for h in pn.overrides() if h.op == "sub.Tensor"]
            assert torch.equal(torch.sub(x, x), torch.full_like(x, 7.0))
        assert key not in registry._aten_override_libs
        assert [h.dsl for h in pn.overrides() if h.op == "sub.Tensor"] == ["torchdsl"]
        with pn.torchdsl.disabled():
            assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    finally:
        registry._graphs[key] = before
        registry._register_overrides_from_graph("sub.Tensor", "CPU", before, filter_state=registry._filter_state)
        if not before:
            registry._graphs.pop(key, None)
