"""Every override inside a captured CUDA graph: captured with the override on, replayed, compared
with the same call made eagerly (skipped without a CUDA device).

One fresh process runs every (op, DSL) the calibration run knows how to call (every family at
the CUDA key, unmeasured ones included: ``PYTHON_NATIVE_UNMEASURED=1``), with the calibration
gates suspended so the override serves these small shapes. Per op: the eager call must fire the
override (the trace says so); the arguments are cloned inside the captured block, so a replay
starts from the same inputs, and its outputs must match the eager ones (random ops: a fresh draw
per replay, of the right rate, and consistent with their own mask).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

_SCRIPT = r"""
import json, sys, torch
import python_native as pn
from python_native.features import calibration
from python_native.foundations import dsl_registry
from python_native.tools.bench import calibrating

RANDOM = {"native_dropout", "bernoulli_.float"}


def cloned(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out if o is not None for t in flat(o)] if isinstance(out, (list, tuple)) else []


def judge_random(symbol, args, first, second):
    if symbol == "native_dropout":
        (out, mask), (_, mask2) = first, second
        rate = 1 - mask.float().mean().item()
        torch.testing.assert_close(out, args[0] * mask / (1 - args[1]))
    else:
        mask, mask2 = first, second
        rate = mask.float().mean().item()
        assert set(mask.unique().tolist()) <= {0.0, 1.0}
    if abs(rate - args[1]) > 0.05:  # dropout's p is the rate dropped, bernoulli's the rate kept
        raise AssertionError(f"rate {rate:.3f}, asked {args[1]}")
    if torch.equal(mask, mask2):
        raise AssertionError("two replays drew the same mask")


def case(symbol, dsl, every):
    builders = calibrating._calibration_args()
    op = calibrating.aten_op(symbol)
    torch.manual_seed(0)
    x = torch.randn(64, 256, device="cuda")
    pristine = cloned(builders[symbol](x, torch.randn_like(x)))

    def step():
        return op(*cloned(pristine))

    with calibrating._only(dsl, every):
        with pn.trace() as t:
            eager = step()
        fired = any(e.op == symbol and e.dsl == dsl and e.outcome == "override" for e in t.events)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: kernels compile here
            step()
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        graph.replay()
        torch.cuda.synchronize()
        first = [o.clone() for o in flat(captured)]
        graph.replay()
        torch.cuda.synchronize()
        second = [o.clone() for o in flat(captured)]
    if symbol in RANDOM:
        judge_random(symbol, pristine, first if symbol != "bernoulli_.float" else first[0],
                     second if symbol != "bernoulli_.float" else second[0])
    else:
        torch.testing.assert_close(first, flat(eager))
        torch.testing.assert_close(second, flat(eager))
    return fired


results = {}
every = dsl_registry.names()
with calibration.suspended():
    for symbol, dsls in calibrating.calibrated_dsls().items():
        for dsl in dsls:
            try:
                results[f"{dsl} {symbol}"] = {"fired": case(symbol, dsl, every), "error": None}
            except Exception as e:
                results[f"{dsl} {symbol}"] = {"fired": None, "error": f"{type(e).__name__}: {e}"[:2000]}
print(json.dumps(results))
"""


@cache
def _results() -> dict:
    env = {**os.environ, "PYTHON_NATIVE_UNMEASURED": "1", "PYTHON_NATIVE_CUTEDSL": "1"}
    env.pop("PYTHON_NATIVE_TRITON_INTERPRET", None)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def _cases() -> list[str]:
    """The (DSL, op) pairs the script runs; known without CUDA from the calibration run's builders."""
    from python_native.tools.bench import calibrating

    return sorted(calibrating._calibration_args())


@pytest.mark.parametrize("symbol", _cases())
def test_the_override_replays_in_a_captured_graph_as_it_ran_eagerly(symbol):
    found = {key: value for key, value in _results().items() if key.split(" ", 1)[1] == symbol}
    if not found:
        pytest.skip(f"no DSL installs an override of {symbol} on this machine")
    for key, result in found.items():
        assert result["error"] is None, f"{key}: {result['error']}"
        assert result["fired"], f"{key}: the override did not serve the eager call"
