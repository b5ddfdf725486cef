"""Override variants: declared at registration, chosen per op (set, scope, environment), baked into
the router, shown by the trace and the status report."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import python_native as pn

# isort: split
from conftest import always
from python_native_dsls.triton import device_type

pytestmark = pytest.mark.both_fronts  # dispatcher-level: each test under both fronts

ROOT = Path(__file__).resolve().parent.parent


def plus(n: float):
    """A sub that differs visibly from aten's by ``n`` (and never calls aten::sub)."""

    def impl(self, other, alpha=1):
        return torch.add(self, torch.neg(other) * alpha) + n

    return impl


def sub_with_variants(overrides, **kwargs):
    return overrides("sub.Tensor", always, plus(1000), variants={"fast": plus(2000), "exact": plus(3000)}, **kwargs)


def test_runs_default_then_switches(overrides, x):
    handle = sub_with_variants(overrides)
    assert handle.variants.keys() == {"default", "fast", "exact"}
    assert pn.get_override_variant("sub.Tensor") == "default"
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
    pn.set_override_variant("sub.Tensor", "fast")
    assert pn.get_override_variant("sub") == "fast"
    with pn.trace() as t:
        assert torch.equal(torch.sub(x, x), torch.full_like(x, 2000))
    assert [(e.outcome, e.override, e.variant) for e in t.events] == [("override", handle.name, "fast")]
    assert "fast" in t.table()
    pn.set_override_variant(torch.ops.aten.sub.Tensor, None)  # None: back to the default
    assert pn.get_override_variant("sub.Tensor") == "default"
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))


def test_aten_passes_calls_through(overrides, x):
    handle = sub_with_variants(overrides)
    pn.set_override_variant("aten::sub.Tensor", "aten")
    assert not handle.active
    with pn.trace() as t:
        assert torch.equal(torch.sub(x, x), torch.zeros_like(x))  # the original kernel ran
    assert [(e.outcome, e.variant) for e in t.events] == [("fallback", None)]
    assert "_pn_impl" not in pn.router_source("sub.Tensor", "CPU")  # the router skips the override entirely
    pn.set_override_variant("sub.Tensor", "exact")
    assert handle.active and torch.equal(torch.sub(x, x), torch.full_like(x, 3000))


def test_scope_restores_also_on_exception(overrides, x):
    sub_with_variants(overrides)
    pn.set_override_variant("sub.Tensor", "fast")
    with pn.override_variant("sub.Tensor", "exact"):
        assert torch.equal(torch.sub(x, x), torch.full_like(x, 3000))
        with pn.override_variant("sub.Tensor", "aten"):
            assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
        assert pn.get_override_variant("sub.Tensor") == "exact"
    assert pn.get_override_variant("sub.Tensor") == "fast"
    with pytest.raises(KeyError), pn.override_variant("sub.Tensor", "default"):
        assert torch.equal(torch.sub(x, x), torch.full_like(x, 1000))
        raise KeyError("boom")
    assert pn.get_override_variant("sub.Tensor") == "fast"
    assert torch.equal(torch.sub(x, x), torch.full_like(x, 2000))

    @pn.override_variant("sub.Tensor", "exact")
    def inside():
        return torch.sub(x, x)

    assert torch.equal(inside(), torch.full_like(x, 3000))
    assert pn.get_override_variant("sub.Tensor") == "fast"


def test_unknown_names_and_ops_raise(overrides, x):
    sub_with_variants(overrides)
    with pytest.raises(ValueError, match=r"no variant 'slow'.*\['default', 'fast', 'exact'\].*'aten'"):
        pn.set_override_variant("sub.Tensor", "slow")
    with pytest.raises(ValueError, match="no variant 'slow'"):
        pn.override_variant("sub.Tensor", "slow")
    with pytest.raises(ValueError, match="no override of 'mul.Tensor'"):
        pn.set_override_variant("mul.Tensor", "fast")
    with pytest.raises(ValueError, match="no override"):
        pn.get_override_variant("mul.Tensor")
    with pytest.raises(TypeError, match="variant name must be a str"):
        pn.set_override_variant("sub.Tensor", 3)
    assert pn.get_override_variant("sub.Tensor") == "default"  # nothing changed


def test_registration_checks_variants(overrides):
    with pytest.raises(ValueError, match="'aten' is reserved"):
        overrides("sub.Tensor", always, plus(1), variants={"aten": plus(2)})
    with pytest.raises(ValueError, match="'default' is the impl argument"):
        overrides("sub.Tensor", always, plus(1), variants={"default": plus(2)})
    with pytest.raises(TypeError, match="variant 'x' must be callable"):
        overrides("sub.Tensor", always, plus(1), variants={"x": 3})
    with pytest.raises(ValueError, match="identifiers"):
        overrides("sub.Tensor", always, plus(1), variants={"not a name": plus(2)})
    assert not [o for o in pn.overrides() if o.dsl == "testdsl"]


def test_derived_overrides_follow_the_functional_choice(overrides, x):
    handle = sub_with_variants(overrides, derive_forms=True)
    assert {d.op for d in handle.derived} == {"sub_.Tensor", "sub.out"}
    pn.set_override_variant("sub.Tensor", "fast")
    assert all(d.variant == "fast" for d in handle.derived)
    y = x.clone()
    y.sub_(x)
    assert torch.equal(y, torch.full_like(x, 2000))
    out = torch.empty_like(x)
    torch.sub(x, x, out=out)
    assert torch.equal(out, torch.full_like(x, 2000))
    with pn.override_variant("sub", "aten"):
        y = x.clone()
        y.sub_(x)
        assert torch.equal(y, torch.zeros_like(x))


def test_status_shows_variants(overrides):
    from python_native.tools import report

    sub_with_variants(overrides)
    pn.set_override_variant("sub.Tensor", "exact")
    entry = next(o for o in pn.status()["overrides"] if o["dsl"] == "testdsl")
    assert entry["variants"] == ["default", "fast", "exact"] and entry["variant"] == "exact"
    assert "variants: default, fast, exact*, aten" in report.render(pn.status())
    names = [row["name"] for row in pn.status()["environment"]]
    assert "PYTHON_NATIVE_VARIANTS" in names


def test_removal_leaves_nothing_behind(overrides, x):
    fast = plus(2000)
    handle = pn.register_op_override("testdsl", "aten", "sub.Tensor", "CPU", always, plus(1000), variants={"fast": fast})
    pn.set_override_variant("sub.Tensor", "fast")
    scope = pn.override_variant("sub.Tensor", "default")
    ref = weakref.ref(fast)
    del fast
    with scope:
        handle.remove()
    assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    with pytest.raises(ValueError, match="no override"):
        pn.get_override_variant("sub.Tensor")
    del handle, scope
    gc.collect()
    assert ref() is None


def test_triton_softmax_long_row_variants():
    """The Triton softmax's long-row paths are variants: each gives softmax's values and gradients."""
    if not any(o.dsl == "triton" and o.op == "_softmax" for o in pn.overrides()):
        pytest.skip("the Triton softmax override is not installed here")
    assert {"split", "streamed"} <= set(next(o for o in pn.overrides() if o.op == "_softmax").variants)
    x = torch.randn(2, 20000, device=device_type(), requires_grad=True)  # where the Triton overrides run
    grad = torch.randn(2, 20000, device=device_type())
    expected = torch.softmax(x.detach(), -1)
    ref = x.detach().clone().requires_grad_()
    with pn.override_variant("softmax", "aten"):
        torch.softmax(ref, -1).backward(grad)
    for variant in ("split", "streamed"):
        x.grad = None
        with pn.override_variant("softmax", variant), pn.trace() as t:
            y = torch.softmax(x, -1)
            y.backward(grad)
        assert [(e.op, e.outcome, e.variant) for e in t.events] == [
            ("_softmax", "override", variant), ("_softmax_backward_data", "override", variant),
        ]
        torch.testing.assert_close(y, expected)
        torch.testing.assert_close(x.grad, ref.grad)


FRESH = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
    import python_native as pn
x = torch.randn(4, 8)
with pn.trace() as t:
    torch.softmax(x, -1)
    torch.log_softmax(x, -1)
print(json.dumps({
    "softmax": pn.get_override_variant("softmax"),
    "log_softmax": pn.get_override_variant("log_softmax"),
    "events": [[e.op, e.outcome, e.variant] for e in t.events],
    "warnings": [str(w.message) for w in caught if "PYTHON_NATIVE_VARIANTS" in str(w.message)],
}))
"""


def _fresh(value: str) -> dict:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON_NATIVE_TRITON_INTERPRET": "1", "TRITON_INTERPRET": "1",
               "PYTHON_NATIVE_VARIANTS": value}
    proc = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, env=environ, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_environment_seeds_the_choice_in_a_fresh_process(dispatch_front):
    if dispatch_front == "compiled":
        pytest.skip("a fresh process: one front is enough")
    got = _fresh("aten::_softmax=aten; log_softmax=streamed; nonsense; =x; bmm=1bad")
    assert got["softmax"] == "aten" and got["log_softmax"] == "streamed"
    assert got["events"] == [["_softmax", "fallback", None], ["_log_softmax", "override", "streamed"]]
    malformed = [w for w in got["warnings"] if "malformed" in w]
    assert len(malformed) == 1 and all(bad in malformed[0] for bad in ("nonsense", "=x", "bmm=1bad"))


def test_checked_mode_checks_the_chosen_variant(overrides, x, monkeypatch):
    monkeypatch.setenv("PYTHON_NATIVE_CHECK", "1")
    sub_with_variants_exact = overrides("sub.Tensor", always, plus(0), variants={"wrong": plus(1000)})
    assert torch.equal(torch.sub(x, x), torch.zeros_like(x))
    pn.set_override_variant("sub.Tensor", "wrong")
    with pytest.raises(pn.OverrideMismatch, match=sub_with_variants_exact.name):
        torch.sub(x, x)
    pn.set_override_variant("sub.Tensor", None)
    assert torch.equal(torch.sub(x, x), torch.zeros_like(x))


def test_environment_entry_for_an_op_registered_later(overrides, x, monkeypatch):
    from python_native.core import variants
    from python_native.foundations import faults

    monkeypatch.setattr(variants, "_seeds", [("aten::sub.Tensor", "fast"), ("mul", "nope")])
    handle = sub_with_variants(overrides)
    assert handle.variant == "fast" and torch.equal(torch.sub(x, x), torch.full_like(x, 2000))
    with pytest.warns(UserWarning, match="PYTHON_NATIVE_VARIANTS \\(mul\\).*no variant 'nope'"):
        overrides("mul.Tensor", always, lambda self, other: self * other + 1)
    assert pn.get_override_variant("mul.Tensor") == "default"
    assert any("mul" in p["source"] for p in pn.status()["problems"])
    faults.resolve("PYTHON_NATIVE_VARIANTS (mul)")
