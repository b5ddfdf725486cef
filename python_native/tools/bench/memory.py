"""Peak memory of one call: CUDA's allocator statistics on a GPU, the profiler's allocation events on CPU.

``peak_bytes(fn, device)`` is the most memory the call had allocated at once beyond what was
allocated when it started: its temporaries and whatever it returns (or leaves behind, such as
parameter gradients). On CPU torch keeps no allocator statistics, so the call runs under
``torch.profiler`` with ``profile_memory=True`` and the peak is replayed from the allocator's
allocation and free events in time order (every CPU tensor allocation is reported there).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def peak_bytes(fn: Callable[[], object], device: str) -> int:
    """Most bytes ``fn()`` holds at once, above what was allocated before it ran."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        raise RuntimeError("this torch's profiler reports no allocation events: CPU peak memory cannot be measured")
    events = sorted((e.start_ns(), e.nbytes()) for e in results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak
