"""GPU kernels of one benchmark row, with the overrides on and off (torch.profiler, CUDA time).

``PYTHONPATH=. python benchmarks/profile_case.py rms_norm fwd+bwd 32768x1024 float32`` prints,
for the override and for aten, the kernels one call launches and their CUDA time: the way to see
which kernel makes a row of ``python -m python_native bench`` slow.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PYTHON_NATIVE_TRITON_INTERPRET", "0")
os.environ.setdefault("TRITON_INTERPRET", "0")


def main(argv: list[str]) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import python_native as pn
    from python_native.tools import bench

    op, mode, shape, dtype = argv[0], argv[1], tuple(int(s) for s in argv[2].split("x")), getattr(torch, argv[3])
    case = bench.Case(op, mode, shape, dtype)
    inputs = bench.make_inputs(case, "cuda")
    fn = bench.runner(case, bench.torch_function(op), inputs)

    def run_once() -> None:
        for leaf in inputs.leaves:
            leaf.grad = None
        fn()

    for label, scope in (("override", None), ("aten", pn.triton.disabled)):
        ctx = scope() if scope else torch.autograd.profiler.record_function("override")
        with ctx:
            for _ in range(5):
                run_once()
            torch.cuda.synchronize()
            with pn.trace() as t, profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    run_once()
                torch.cuda.synchronize()
            host = []
            for _ in range(20):  # host time to enqueue one call, the GPU idle at its start
                torch.cuda.synchronize()
                start = time.perf_counter()
                run_once()
                host.append((time.perf_counter() - start) * 1e6)
                torch.cuda.synchronize()
            timed = bench.gpu_timer()(fn, inputs.leaves)
        fired = sorted({f"{e.op}:{e.outcome}" for e in t.events})
        print(f"=== {case.label} {argv[3]} — {label}; routed: {fired}")
        print(f"host us to enqueue one call: median {statistics.median(host):.1f}; do_bench {timed:.4f} ms")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=8, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
