"""``bench --prove-replay``: replayed calls against Python-served ones on this GPU, and the proof.

For every replayable override (softmax and log-softmax forward and backward, layer norm and RMS
norm forward and backward, bmm outer) at a few shapes and dtypes: the call served through Python
with replay off, then recorded and replayed with replay on. A case passes when the front replayed
it (its counter moved) and every output equals the Python path's bit for bit, with the same
sizes, strides and dtype. Calibration gates are suspended meanwhile, so that small calls fire. A
run where every case passes writes the proof (``features.front.proof``) that turns replay on by
default for this GPU model and these torch and Triton versions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_SHAPES = ((8, 64), (256, 1024), (4, 9000))  # tiny, medium, long rows (several launches)


def _norm_args(m: int, n: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    def r(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dt)

    return {"x": r(m, n), "g": r(m, n), "w": r(n), "b": r(n), "mean": r(m, 1, dt=torch.float32),
            "rstd": r(m, 1, dt=torch.float32).abs() + 0.5}


def cases() -> list[tuple[str, str, Callable[[], Any]]]:
    """``(label, overridden aten op, call)`` per case."""
    aten = torch.ops.aten
    out: list[tuple[str, str, Callable[[], Any]]] = []
    for m, n in _SHAPES:
        for dtype in (torch.float32, torch.bfloat16):
            a = _norm_args(m, n, dtype)
            x, g, w, b, mean, rstd = a["x"], a["g"], a["w"], a["b"], a["mean"], a["rstd"]
            y = x.softmax(-1)
            tag = f"{m}x{n} {str(dtype).removeprefix('torch.')}"
            out += [
                (f"softmax {tag}", "_softmax", lambda x=x: aten._softmax(x, -1, False)),
                (f"log_softmax {tag}", "_log_softmax", lambda x=x: aten._log_softmax(x, -1, False)),
                (f"softmax backward {tag}", "_softmax_backward_data",
                 lambda g=g, y=y, d=dtype: aten._softmax_backward_data(g, y, -1, d)),
                (f"log_softmax backward {tag}", "_log_softmax_backward_data",
                 lambda g=g, y=y, d=dtype: aten._log_softmax_backward_data(g, y, -1, d)),
                (f"layer_norm {tag}", "native_layer_norm",
                 lambda x=x, w=w, b=b, n=n: aten.native_layer_norm(x, [n], w, b, 1e-5)),
                (f"layer_norm backward {tag}", "native_layer_norm_backward",
                 lambda g=g, x=x, mean=mean, rstd=rstd, w=w, b=b, n=n: aten.native_layer_norm_backward(
                     g, x, [n], mean, rstd, w, b, [True, True, True])),
                (f"rms_norm {tag}", "_fused_rms_norm", lambda x=x, w=w, n=n: aten._fused_rms_norm(x, [n], w, 1e-6)),
                (f"rms_norm backward {tag}", "_fused_rms_norm_backward",
                 lambda g=g, x=x, rstd=rstd, w=w, n=n: aten._fused_rms_norm_backward(g, x, [n], rstd, w, [True, True])),
            ]
    a3, c3 = torch.randn(4, 32, 1, device="cuda"), torch.randn(4, 1, 48, device="cuda")
    out.append(("bmm outer 4x32x1 @ 4x1x48", "bmm", lambda: aten.bmm(a3, c3)))
    return out


def _tensors(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _same(expected: list[Any], got: list[Any]) -> str:
    """Why ``got`` differs from ``expected`` ('' when it does not)."""
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if (e is None) != (g is None):
            return f"output {i}: one path returned None"
        if e is None:
            continue
        if (e.shape, e.stride(), e.dtype) != (g.shape, g.stride(), g.dtype):
            return f"output {i}: layout {tuple(g.shape)}/{g.stride()}/{g.dtype}, expected {tuple(e.shape)}/{e.stride()}"
        if not torch.equal(e, g):
            return f"output {i}: values differ (max {(e.float() - g.float()).abs().max().item():.3g})"
    return ""


def _replayed(front: Any, op: str) -> int:
    slot = next((s for s in front._state.fronts if s.key == ("aten", op, "CUDA")), None)
    return -1 if slot is None else int(front._state.fronts[slot].replay_stats()["replayed"])


def run_case(label: str, op: str, call: Callable[[], Any]) -> dict[str, Any]:
    """One case: Python-served, then recorded and replayed; its verdict."""
    from python_native.features import front
    from python_native.features.front import replay

    if _replayed(front, op) < 0:
        return {"case": label, "op": op, "passed": None, "problem": "not installed here"}
    with replay.forced(False):
        expected = _tensors(call())
    with replay.forced(True):
        call()
        before = _replayed(front, op)
        got = _tensors(call())
        torch.cuda.synchronize()
        moved = _replayed(front, op) - before
    problem = "" if moved == 1 else f"not replayed ({'no front on the slot' if before < 0 else 'kept on Python'})"
    problem = problem or _same(expected, got)
    return {"case": label, "op": op, "passed": not problem, "problem": problem}


def prove() -> tuple[list[dict[str, Any]], str]:
    """Every case on this GPU; ``(results, why no proof can be made here or '')``."""
    from python_native.features import calibration, front

    if not torch.cuda.is_available():
        return [], "--prove-replay needs a CUDA GPU"
    if front.current() != "compiled":
        return [], f"the compiled front is not serving ({front.describe()['why']}); build it with `precompile`"
    problem = front._state.module.replay_driver_problem()
    if problem:
        return [], f"the CUDA driver cannot launch replays: {problem}"
    with calibration.suspended():
        return [run_case(label, op, call) for label, op, call in cases()], ""
