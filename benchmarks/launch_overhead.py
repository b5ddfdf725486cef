"""Host-side cost of a routed Triton override on tiny inputs, with only the kernel launch stubbed.

Run: ``python benchmarks/launch_overhead.py`` (Triton's interpreter at the CPU key) or
``python benchmarks/launch_overhead.py --cuda`` (overrides at the CUDA key). Each op is called
through ``torch`` or ``torch.ops.aten`` so the whole path runs: dispatcher -> router -> cond ->
impl -> launcher. Two figures per op:

- *stubbed*: the launch is replaced where it starts (``stubbed_launches``): routing, the cond's
  plan, the impl and its output allocations;
- *GPU path*: on a machine without a GPU, the launch path a GPU call takes runs in full on CPU
  tensors (``simulated_device``): the plan's bound launcher, its device, hook and alignment checks
  and the call of the compiled launcher, which alone is a no-op. This is the Python part of a hit.

The baseline is a plain aten ``torch.add`` of two tiny tensors on the same device, timed in the
same process. A third reference, *routing floor*, is an override whose cond accepts and whose impl
returns its input: the dispatcher's entry into Python and the router, which no library code can
avoid; *op floor* is the same per op (an override of that very op whose cond accepts and whose
impl returns precomputed outputs): the dispatcher's boxed entry for the op's own schema; *Python
floor* adds fresh outputs to it (the impl returns ``torch.empty_like`` of each of aten's outputs,
the cheapest allocation Python has): the least any override written in Python pays for a hit on
that op, before its cond and kernel; *beyond it* is the GPU path (the stubbed figure where the
path is not simulated) less the Python floor. Figures are medians of single timed calls (clock cost
subtracted), with the tenth percentile next to them.

On CPU a last table times the *replayed hit*: the compiled front serves the call from the launches
recorded for its key (``features/front/replay.py``), without entering Python, launching through the
front's stand-in (which only records what it is given) on the simulated device. ``x GPU path``
compares it with the Python path's figure above.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run from a checkout: the backends live next to the control plane.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _select_backend(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="overrides at the CUDA key instead of the interpreter's CPU")
    parser.add_argument("--number", type=int, default=2000, help="calls per figure (times --repeat)")
    parser.add_argument("--repeat", type=int, default=5, help="multiplies --number")
    args = parser.parse_args(argv)
    # Before torch is imported: importing torch installs the overrides at the key the mode selects.
    mode = "0" if args.cuda else "1"
    os.environ["PYTHON_NATIVE_TRITON_INTERPRET"] = mode
    os.environ["TRITON_INTERPRET"] = mode
    return args


# Ops without a torch binding are called through their OpOverload (``torch.ops.aten.X.default``);
# their ratio is taken against ``torch.ops.aten.add.Tensor``, the same calling convention, so that
# the Python cost of ``torch.ops`` itself is not charged to the override.
VIA_TORCH_OPS = frozenset({"native_layer_norm_backward", "_fused_rms_norm_backward", "silu_backward", "gelu_backward"})


def _cases(device: str) -> dict[str, Callable[[], object]]:
    import torch

    aten = torch.ops.aten
    x = torch.randn(8, 64, device=device)
    g = torch.randn(8, 64, device=device)
    w = torch.randn(64, device=device)
    b = torch.randn(64, device=device)
    y = torch.softmax(x, -1)
    _, mean, rstd = aten.native_layer_norm(x, [64], w, b, 1e-5)
    a3, c3 = torch.randn(2, 8, 1, device=device), torch.randn(2, 1, 16, device=device)
    nn = torch._C._nn
    return {
        "_softmax": lambda: torch._softmax(x, -1, False),
        "_log_softmax": lambda: torch._log_softmax(x, -1, False),
        "_softmax_backward_data": lambda: torch._softmax_backward_data(g, y, -1, x.dtype),
        "_log_softmax_backward_data": lambda: torch._log_softmax_backward_data(g, y, -1, x.dtype),
        "native_layer_norm": lambda: torch.native_layer_norm(x, [64], w, b, 1e-5),
        "native_layer_norm_backward": lambda: aten.native_layer_norm_backward.default(
            g, x, [64], mean, rstd, w, b, [True, True, True]
        ),
        "_fused_rms_norm": lambda: torch._fused_rms_norm(x, [64], w, 1e-5),
        "_fused_rms_norm_backward": lambda: aten._fused_rms_norm_backward.default(g, x, [64], rstd, w, [True, True]),
        "silu": lambda: nn.silu(x),
        "silu_backward": lambda: aten.silu_backward.default(g, x),
        "gelu": lambda: nn.gelu(x),
        "gelu_backward": lambda: aten.gelu_backward.default(g, x),
        "bmm": lambda: torch.bmm(a3, c3),
    }


def timed_us(fn: Callable[[], object], number: int, repeat: int) -> tuple[float, float]:
    """(median, tenth percentile) microseconds of single calls, ``number * repeat`` of them.

    Single calls are timed, not batches: on a shared machine preemption lands in a few calls
    and leaves the median alone, where it would inflate every batch. The cost of reading the
    clock is measured the same way and subtracted.
    """
    clock = time.perf_counter_ns

    def sample(f: Callable[[], object]) -> list[int]:
        f()
        out = []
        for _ in range(number * repeat):
            start = clock()
            f()
            out.append(clock() - start)
        out.sort()
        return out

    overhead = statistics.median(sample(lambda: None))
    times = sample(fn)
    return (statistics.median(times) - overhead) / 1e3, (times[len(times) // 10] - overhead) / 1e3


def _routing_floor(key: str, device: str, number: int, repeat: int) -> tuple[float, float]:
    """An override that accepts and returns its input at once, on ``aten::sub.Tensor``."""
    import torch
    from packaging.version import Version

    import python_native as pn

    if "launchbench" not in pn.all_dsls:
        info = {"runtime_available": lambda: True, "runtime_version": lambda: Version("0")}
        pn.register_dsl("launchbench", type("LaunchBench", (), {k: staticmethod(v) for k, v in info.items()}))
    handle = pn.register_op_override(
        "launchbench", "aten", "sub.Tensor", key, lambda *a, **k: True, lambda self, other, alpha=1: self
    )
    try:
        a, b = torch.randn(8, 64, device=device), torch.randn(8, 64, device=device)
        return timed_us(lambda: torch.sub(a, b), number, repeat)
    finally:
        handle.remove()


def _op_floors(op: str, fn: Callable[[], object], key: str, number: int, repeat: int) -> tuple[float, float]:
    """Median us of ``fn`` routed to an override of ``op`` whose cond accepts and whose impl
    returns (1) aten's outputs, computed beforehand: the dispatcher's boxed entry into Python and
    the router for this op's schema (list, optional and scalar arguments cost more to box than two
    tensors), with no work of the library's in it; (2) a fresh ``torch.empty_like`` of each of
    them: that entry plus the outputs a hit must allocate. Triton's own override is switched off
    meanwhile."""
    import torch

    import python_native as pn

    empty_like = torch.empty_like
    with pn.triton.disabled():
        outputs = fn()
        if isinstance(outputs, torch.Tensor):
            def fresh(*args: object, **kwargs: object) -> object:
                return empty_like(outputs)
        else:
            def fresh(*args: object, **kwargs: object) -> object:
                return tuple(map(empty_like, outputs))
        floors = []
        for impl in (lambda *a, **k: outputs, fresh):
            handle = pn.register_op_override("launchbench", "aten", op, key, lambda *a, **k: True, impl)
            try:
                floors.append(timed_us(fn, number, repeat)[0])
            finally:
                handle.remove()
    return floors[0], floors[1]


def main(argv: list[str]) -> int:
    args = _select_backend(argv)
    import torch

    import python_native as pn  # noqa: F401  (installs the overrides)
    import python_native_dsls.triton as backend
    from python_native_dsls.triton.ops import all_overrides
    from python_native_dsls.triton.testing import simulated_device, stubbed_launches

    device = backend.device_type()
    installed = {spec.op for spec in all_overrides()}
    a, b = torch.randn(8, 64, device=device), torch.randn(8, 64, device=device)
    add_med, add_best = timed_us(lambda: torch.add(a, b), args.number, args.repeat)
    add_op = torch.ops.aten.add.Tensor
    ops_add_med, ops_add_best = timed_us(lambda: add_op(a, b), args.number, args.repeat)
    floor_med, floor_best = _routing_floor(backend.dispatch_key(), device, args.number, args.repeat)  # registers the bench DSL
    print(f"device {device}, torch {torch.__version__}; tiny inputs (8x64); us/call median (p10)")
    print(f"{'aten add (torch.add)':30} {add_med:8.2f} ({add_best:6.2f})")
    print(f"{'aten add (torch.ops)':30} {ops_add_med:8.2f} ({ops_add_best:6.2f})   baseline of the ops marked *")
    print(f"{'routing floor':30} {floor_med:8.2f} ({floor_best:6.2f})   x add {floor_med / add_med:6.2f}")
    cases = {op: fn for op, fn in _cases(device).items() if op in installed}
    for op in _cases(device):
        if op not in installed:
            print(f"{op:30} not installed at this key")
    stubbed = _timed_fired(cases, stubbed_launches, args)
    simulated = _timed_fired(cases, simulated_device, args) if device == "cpu" else {}
    print(f"{'':30} {'stubbed':>8} {'':8}   {'x add':>6}   {'GPU path':>8}   {'x add':>6}   {'op floor':>8}"
          f"   {'Py floor':>8}   {'x add':>6}   beyond it")
    ratios = []
    # The per-op floors register and remove overrides: measured after every figure above.
    for op, fn in cases.items():
        if op not in stubbed:
            print(f"{op:30} declined (no launch)")
            continue
        base = ops_add_med if op in VIA_TORCH_OPS else add_med
        med, best = stubbed[op]
        full = simulated.get(op, (med, best))[0]
        ratios.append(full / base)
        label = f"{op} *" if op in VIA_TORCH_OPS else op
        op_floor, py_floor = _op_floors(op, fn, backend.dispatch_key(), args.number, args.repeat)
        gpu = f"{full:8.2f}   {full / base:6.2f}" if op in simulated else f"{'-':>8}   {'-':>6}"
        print(f"{label:30} {med:8.2f} ({best:6.2f})   {med / base:6.2f}   {gpu}   {op_floor:8.2f}"
              f"   {py_floor:8.2f}   {py_floor / base:6.2f}   {full - py_floor:6.2f}")
    if ratios:
        which = "GPU path" if simulated else "stubbed"
        print(f"median over overrides ({which}): {statistics.median(ratios):.2f}x aten add; "
              f"highest {max(ratios):.2f}x")
    if device == "cpu":
        _print_replayed(cases, args, {op: ops_add_med if op in VIA_TORCH_OPS else add_med for op in cases}, simulated)
    return 0


def _print_replayed(cases: dict[str, Callable[[], object]], args: argparse.Namespace, bases: dict[str, float],
                    simulated: dict[str, tuple[float, float]]) -> None:
    """The replayed hit: the compiled front serves the call from its record, launching through the
    front's stand-in (which records the launch; no kernel runs), on the simulated device."""
    replayed = _timed_replayed(cases, args)
    if not replayed:
        print("replayed hit: not measured (the compiled front is not serving; `python -m python_native precompile`)")
        return
    print(f"replayed hit (compiled front, stand-in launch)   {'us':>8}          {'x add':>6}   {'x GPU path':>10}")
    ratios = []
    for op in cases:
        if op not in replayed:
            print(f"{op:30} not replayed")
            continue
        med, best = replayed[op]
        ratios.append(med / bases[op])
        path = f"{med / simulated[op][0]:10.2f}" if op in simulated else f"{'-':>10}"
        label = f"{op} *" if op in VIA_TORCH_OPS else op
        print(f"{label:46} {med:8.2f} ({best:6.2f})   {med / bases[op]:6.2f}   {path}")
    if ratios:
        print(f"replayed hits: median {statistics.median(ratios):.2f}x aten add; highest {max(ratios):.2f}x")


def _timed_replayed(cases: dict[str, Callable[[], object]], args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """(median, p10) per op whose second call the front replayed."""
    from python_native.features import front
    from python_native.features.front import replay
    from python_native_dsls.triton.testing import simulated_device

    if front.current() != "compiled":
        return {}
    module = front._state.module
    timings = {}
    module.replay_select_test_launch(True)
    try:
        with simulated_device(), replay.forced(True):
            for op, fn in cases.items():
                fn()  # recorded
                module.replay_test_launches()
                fn()
                if module.replay_test_launches():  # replayed: the stand-in was given its launches
                    timings[op] = timed_us(fn, args.number, args.repeat)
                    module.replay_test_launches()
    finally:
        module.replay_select_test_launch(False)
    return timings


def _timed_fired(
    cases: dict[str, Callable[[], object]], mode: Callable[[], Any], args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """(median, p10) per op whose override launched a kernel under ``mode`` (a launch context)."""
    timings = {}
    with mode() as launched:
        for op, fn in cases.items():
            launched.clear()
            fn()
            fn()  # a plan's first call binds its launcher; the second takes the bound path
            if launched:
                timings[op] = timed_us(fn, args.number, args.repeat)
    return timings


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
