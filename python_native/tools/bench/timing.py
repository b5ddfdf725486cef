"""Timers of a benchmark call (GPU per-call, GPU back-to-back, CPU) and the device's copy bandwidth."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

Fn = Callable[[], object]
Timer = Callable[[Fn, list[torch.Tensor]], float]


def gpu_timer() -> Timer:
    import triton.testing

    def measure(fn: Fn, leaves: list[torch.Tensor]) -> float:
        return triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=leaves or None, return_mode="median")

    return measure


def gpu_throughput_timer(loops: int = 5, budget_ms: float = 20.0) -> Timer:
    """Milliseconds per call of back-to-back calls (CUDA events around a loop; median of ``loops``).

    Unlike ``do_bench``, which times each call alone after flushing the cache, this charges a call
    whatever it costs the stream in steady state, host time included: for small inputs the host is
    the bottleneck, and that is what a user's eager loop pays. Calibration uses it, so that an
    override whose kernel is quick but whose launch is not still loses where it should.
    """

    def measure(fn: Fn, leaves: list[torch.Tensor]) -> float:
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        n = max(1, min(10_000, int(budget_ms / max(start.elapsed_time(end), 1e-3))))
        samples = []
        for _ in range(loops):
            start.record()
            for _ in range(n):
                fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / n)
        return statistics.median(samples)

    return measure


def cpu_timer(repeats: int = 3) -> Timer:
    def measure(fn: Fn, leaves: list[torch.Tensor]) -> float:
        samples = []
        for _ in range(repeats + 1):
            for leaf in leaves:
                leaf.grad = None
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples[1:])  # the first run compiles/warms up

    return measure


def copy_bandwidth(device: str, timer: Timer, nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy of a large tensor (read + write counted)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), [])
    return 2 * nbytes / (ms * 1e-3)


def median_ms(fn: Fn, device: str, repeat: int) -> float:
    """Median milliseconds of ``repeat`` calls of ``fn()``, each timed on its own (CUDA events on a
    GPU, the wall clock on a CPU): for whole steps, where one call is long enough to time alone.
    The caller warms up first."""
    samples = []
    for _ in range(repeat):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(samples)
