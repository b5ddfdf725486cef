"""Scopes and traces opened inside a ``torch.compile``d function, in both compile modes: kept out of the
graph, they act at run time as in eager code, Dynamo never traces into the routers or Triton's
interpreter, and nothing of ours makes Dynamo warn."""

from __future__ import annotations

import warnings

import pytest
import torch

import python_native as pn

# isort: split
from python_native_dsls.triton import device_type

pytestmark = pytest.mark.skipif(
    "_softmax" not in pn.get_dsl_operations("triton"), reason="the Triton softmax is not installed here"
)


def with_trace(x):
    y = x * 2
    with pn.trace() as t:
        z = torch.softmax(y, dim=-1)
    return z + 1, [(e.op, e.outcome) for e in t.events]


def with_scope(x):
    y = x * 2
    with pn.operations_disabled("softmax"):
        z = torch.softmax(y, dim=-1)
    return z + 1, []


def with_dsl_scope(x):
    with pn.triton.disabled():
        z = torch.softmax(x * 2, dim=-1)
    return z + 1, []


@pn.operations_disabled("softmax")
def _decorated(y):
    return torch.softmax(y, dim=-1)


def with_decorated(x):
    return _decorated(x * 2) + 1, []


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    pn.compile_mode = "bypass"


@pytest.mark.parametrize("mode", ["bypass", "keep"])
@pytest.mark.parametrize(
    ("fn", "inner", "outer"),
    [(with_trace, [("_softmax", "override")], "override"), (with_scope, [], "fallback"),
     (with_dsl_scope, [], "fallback"), (with_decorated, [], "fallback")],
    ids=["trace", "ops-scope", "dsl-scope", "decorator"],
)
def test_panel_blocks_inside_compiled_functions_act_at_run_time(fresh_dynamo, mode, fn, inner, outer):
    pn.compile_mode = mode
    compiled = torch.compile(fn, backend="aot_eager")
    x = torch.randn(4, 16, device=device_type())  # where the Triton softmax runs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # the first call compiles, the second runs what was compiled
            with pn.trace() as t:
                out, events = compiled(x)
            torch.testing.assert_close(out, torch.softmax(x * 2, dim=-1) + 1)
            assert events == inner
            assert [(e.op, e.outcome) for e in t.events if e.op == "_softmax"] == [("_softmax", outer)]
    ours = [w for w in caught if "python_native" in f"{w.filename} {w.message}" or "Dynamo" in str(w.message)]
    assert ours == [], [str(w.message) for w in ours]
    assert not pn.is_operation_disabled("softmax") and pn.triton.enabled  # every block was closed
