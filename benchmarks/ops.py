"""Triton overrides against aten, per op, dtype and shape, through the public torch API.

On a GPU: ``PYTHONPATH=. python benchmarks/ops.py`` times realistic shapes (4096x4096, LLM
hidden sizes) with ``triton.testing.do_bench`` (median of many runs, warm-up first). Without a GPU,
``PYTHON_NATIVE_TRITON_INTERPRET=1 python benchmarks/ops.py --quick`` runs tiny shapes through
Triton's interpreter: that proves the script end to end, its timings say nothing about speed.

Each row times the same torch call twice in one process: overrides on, then under
``pn.triton.disabled()`` (aten), and reports whether the override fired (via ``pn.trace()``) and
the speedup. Only rows where the override fired count towards the geometric mean.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import python_native as pn

Case = tuple[str, Callable[[], object]]


def cases(device: str, dtype: torch.dtype, quick: bool) -> list[Case]:
    rows = [(4, 64), (7, 100)] if quick else [(4096, 4096), (8192, 4096), (16384, 5120), (4096, 8192), (32768, 1024)]
    out: list[Case] = []
    for m, n in rows:
        x = torch.randn(m, n, device=device, dtype=dtype)
        w = torch.randn(n, device=device, dtype=dtype)
        b = torch.randn(n, device=device, dtype=dtype)
        xg = x.clone().requires_grad_()
        out += [
            (f"layer_norm fwd {m}x{n}", lambda x=x, n=n, w=w, b=b: F.layer_norm(x, (n,), w, b)),
            (f"layer_norm fwd+bwd {m}x{n}", lambda x=xg, n=n, w=w, b=b: F.layer_norm(x, (n,), w, b).sum().backward()),
            (f"rms_norm fwd {m}x{n}", lambda x=x, n=n, w=w: F.rms_norm(x, (n,), w)),
            (f"softmax fwd {m}x{n}", lambda x=x: torch.softmax(x, -1)),
            (f"softmax fwd+bwd {m}x{n}", lambda x=xg: torch.softmax(x, -1).sum().backward()),
            (f"log_softmax fwd {m}x{n}", lambda x=x: torch.log_softmax(x, -1)),
            (f"silu fwd {m}x{n}", lambda x=x: F.silu(x)),
            (f"silu fwd+bwd {m}x{n}", lambda x=xg: F.silu(x).sum().backward()),
            (f"gelu fwd {m}x{n}", lambda x=x: F.gelu(x)),
            (f"gelu tanh fwd {m}x{n}", lambda x=x: F.gelu(x, approximate="tanh")),
        ]
    for bsz, mm, nn in ([(2, 8, 16)] if quick else [(64, 1024, 1024), (256, 512, 512), (16, 4096, 4096)]):
        a = torch.randn(bsz, mm, 1, device=device, dtype=dtype)
        c = torch.randn(bsz, 1, nn, device=device, dtype=dtype)
        out.append((f"bmm outer {bsz}x{mm}x{nn}", lambda a=a, c=c: torch.bmm(a, c)))
    return out


def timer(device: str) -> Callable[[Callable[[], object]], float]:
    if device == "cuda":
        import triton.testing

        return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")

    def cpu_ms(fn: Callable[[], object]) -> float:
        fn()
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    return cpu_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU interpreter smoke run)")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    args = parser.parse_args(argv)
    if not pn.triton.available:
        print(f"triton DSL unavailable: {pn.triton.unavailable_reason}")
        return 1
    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu (Triton interpreter)"
    print(f"device {name}; torch {torch.__version__}; triton {pn.triton.version}")
    print(f"{'case':<34} {'dtype':<9} {'fired':<6} {'triton ms':>10} {'aten ms':>10} {'speedup':>8}")
    measure = timer(device)
    speedups = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for label, fn in cases(device, dtype, args.quick):
            with pn.trace() as t:
                fn()
            fired = any(e.dsl == "triton" for e in t.events)
            ours = measure(fn)
            with pn.triton.disabled():
                base = measure(fn)
            ratio = base / ours if ours else float("nan")
            if fired:
                speedups.append(ratio)
            print(f"{label:<34} {dtype_name:<9} {'yes' if fired else 'no':<6} {ours:10.4f} {base:10.4f} {ratio:7.2f}x")
    if speedups:
        geo = math.exp(sum(math.log(r) for r in speedups) / len(speedups))
        print(f"geometric-mean speedup where an override fired: {geo:.2f}x over {len(speedups)} rows; "
              f"slowest {min(speedups):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
