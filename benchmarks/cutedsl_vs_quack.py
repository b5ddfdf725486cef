"""The CuTe DSL overrides against aten and QuACK on one GPU, forward and forward+backward.

    PYTHONPATH=. python benchmarks/cutedsl_vs_quack.py [--dtypes bfloat16,float32] [--quick]

Each row times the same PyTorch call three ways in one process: aten (both DSLs off), ours (the
CuTe DSL overrides alone: Triton off, the calibration gate off so the kernel itself is timed) and
QuACK's function for the op where installed ("–" otherwise). Before timing, a traced call must show
the CuTe DSL override serving every op of the row; a row it does not serve says so instead of
timing aten twice. Medians of ``triton.testing.do_bench`` (CUDA events, warm-up first); ``%bw`` is
our bytes moved over our time against the device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

os.environ.setdefault("PYTHON_NATIVE_CALIBRATION", "off")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import python_native as pn  # noqa: E402

SHAPES = [(4096, 1024), (8192, 4096), (16384, 4096), (4096, 8192), (2048, 16384), (1024, 32768)]
QUICK = [(4096, 1024), (8192, 4096)]
Call = Callable[[], object]


def _timer() -> Callable[[Call], float]:
    from triton.testing import do_bench

    return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")


def _quack(op: str):
    try:
        if op == "rms_norm":
            from quack.rmsnorm import rmsnorm

            return lambda x, w: rmsnorm(x, w, eps=1e-6)
        if op == "softmax":
            from quack.softmax import softmax

            return lambda x, w: softmax(x)
    except ImportError:
        return None
    return None


def _ours(op: str):
    if op == "rms_norm":
        return lambda x, w: F.rms_norm(x, [x.shape[-1]], w, 1e-6)
    if op == "layer_norm":
        return lambda x, w: F.layer_norm(x, [x.shape[-1]], w, None, 1e-5)
    return lambda x, w: F.softmax(x, dim=-1)


SERVED = {
    ("rms_norm", False): {"_fused_rms_norm"}, ("rms_norm", True): {"_fused_rms_norm", "_fused_rms_norm_backward"},
    ("layer_norm", False): {"native_layer_norm"},
    ("layer_norm", True): {"native_layer_norm", "native_layer_norm_backward"},
    ("softmax", False): {"_softmax"}, ("softmax", True): {"_softmax", "_softmax_backward_data"},
}


def _call(fn, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, backward: bool) -> Call:
    if not backward:
        return lambda: fn(x, w)
    leaves = [x, w]
    return lambda: torch.autograd.grad(fn(x, w), leaves, dy, allow_unused=True)


def _bytes(op: str, m: int, n: int, size: int, backward: bool) -> int:
    # Forward reads x and writes y; forward+backward adds reading x (or y) and dy and writing dx.
    # Per-row statistics and the weight are negligible at these widths.
    return m * n * size * (5 if backward else 2)


def _copy_bandwidth() -> float:
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _timer()(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3)


def _served(fn: Call, ops: set[str]) -> set[str]:
    with pn.trace() as trace:
        fn()
    torch.cuda.synchronize()
    return ops - {e.op for e in trace.events if e.dsl == "cutedsl" and e.outcome == "override"}


def run(dtypes: list[torch.dtype], shapes: list[tuple[int, int]]) -> None:
    time = _timer()
    copy_bw = _copy_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}; copy bandwidth {copy_bw / 1e12:.2f} TB/s; torch {torch.__version__}")
    print(f"{'op':<11}{'pass':<9}{'dtype':<10}{'shape':>13}{'aten ms':>10}{'cutedsl':>10}{'quack':>10}"
          f"{'aten/ours':>10}{'quack/ours':>11}{'%bw':>6}")
    pn.cutedsl.enable()
    for op in ("rms_norm", "layer_norm", "softmax"):
        for backward in (False, True):
            for dtype in dtypes:
                for m, n in shapes:
                    x = torch.randn(m, n, device="cuda", dtype=dtype, requires_grad=backward)
                    w = torch.randn(n, device="cuda", dtype=dtype, requires_grad=backward)
                    dy = torch.randn(m, n, device="cuda", dtype=dtype)
                    head = f"{op:<11}{'fwd+bwd' if backward else 'fwd':<9}{str(dtype)[6:]:<10}{f'{m}x{n}':>13}"
                    ours = _call(_ours(op), x, w, dy, backward)
                    with pn.triton.disabled():
                        missing = _served(ours, SERVED[op, backward])
                        if missing:
                            print(f"{head}  not served by CuTe DSL: {sorted(missing)}")
                            continue
                        ours_ms = time(ours)
                    with pn.triton.disabled(), pn.cutedsl.disabled():
                        aten_ms = time(ours)
                    peer = _quack(op)
                    quack_ms = time(_call(peer, x, w, dy, backward)) if peer else None
                    bw = _bytes(op, m, n, x.element_size(), backward) / (ours_ms * 1e-3) / copy_bw
                    quack = f"{quack_ms:>10.4f}" if quack_ms else f"{'–':>10}"
                    ratio = f"{quack_ms / ours_ms:>11.2f}" if quack_ms else f"{'–':>11}"
                    print(f"{head}{aten_ms:>10.4f}{ours_ms:>10.4f}{quack}{aten_ms / ours_ms:>10.2f}{ratio}"
                          f"{100 * bw:>5.0f}%", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="two shapes only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device (CuTe DSL kernels run only there)", file=sys.stderr)
        return 2
    if not pn.cutedsl.available:
        print(f"CuTe DSL is not available here: {pn.cutedsl.unavailable_reason}", file=sys.stderr)
        return 2
    try:
        dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    except AttributeError as e:
        parser.error(f"unknown dtype in --dtypes {args.dtypes!r}: {e}")
    run(dtypes, QUICK if args.quick else SHAPES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
