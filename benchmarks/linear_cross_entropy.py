"""Peak memory and time of the fused linear cross-entropy against the unfused path, for an LLM's head.

Run: ``python benchmarks/linear_cross_entropy.py [--device cpu|cuda] [--tokens N --hidden H --vocab V]
[--dtype bfloat16] [--repeat R]``. Defaults: on CUDA 8192 tokens × 4096 hidden × 128256 classes in
bfloat16 (Llama 3's head); on CPU 512 × 256 × 8192 in float32, scaled down. Each variant runs the
mean loss forward and backward (gradients of the input and the weight; no bias; a tenth of the
targets ignored), in one process, on the same inputs:

- *unfused*: ``F.cross_entropy(F.linear(x, w), t)`` with every DSL disabled: aten's kernels;
- *fused, Triton*: ``pn.linear_cross_entropy`` with its Triton override (on a GPU; under the
  interpreter its time means nothing, so CPU runs leave it out unless ``--interpreted``);
- *fused, reference*: the same call with the override switched off, the chunked reference in plain torch;
- *Liger-Kernel*: its fused linear cross-entropy, where installed (GPU).

Peak memory is the most the call holds at once beyond the inputs (``python_native.tools.bench.memory``:
CUDA's allocator statistics, or on CPU the allocator events torch's profiler records); it includes
the gradients the call leaves behind, which every variant produces alike. Time is the median of
``--repeat`` runs after a warm-up (CUDA events around the call on a GPU). Ratios are against *unfused*.
It has its own script rather than rows in ``python -m python_native bench``: those rows time
bandwidth-bound ops by bytes moved, and what this op is for is the memory it does not take.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

import python_native as pn
from python_native.tools.bench.memory import peak_bytes
from python_native.tools.bench.timing import median_ms


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--interpreted", action="store_true", help="on CPU, also run the Triton override (interpreter)")
    args = p.parse_args()
    gpu = args.device == "cuda"
    args.tokens = args.tokens or (8192 if gpu else 512)
    args.hidden = args.hidden or (4096 if gpu else 256)
    args.vocab = args.vocab or (128256 if gpu else 8192)
    args.dtype = getattr(torch, args.dtype or ("bfloat16" if gpu else "float32"))
    return args


def _no_dsls():
    """Every DSL off: aten's own kernels (the unfused path a user runs without this package)."""
    import contextlib

    stack = contextlib.ExitStack()
    for name in pn.all_dsls:
        stack.enter_context(getattr(pn, name).disabled())
    return stack


def variants(device: str, interpreted: bool) -> dict[str, tuple[Callable, Callable]]:
    """name -> (loss function, scope factory)."""
    import contextlib

    out = {
        "unfused (aten)": (lambda x, w, t: F.cross_entropy(F.linear(x, w), t), _no_dsls),
        "fused, reference": (pn.linear_cross_entropy, lambda: pn.operations_disabled("linear_cross_entropy")),
    }
    triton_here = any(o.op == "linear_cross_entropy.forward" and o.dsl == "triton" and o.active for o in pn.overrides())
    if triton_here and (device == "cuda" or interpreted):
        out["fused, Triton"] = (pn.linear_cross_entropy, contextlib.nullcontext)
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except Exception:
        pass
    else:
        if device == "cuda":
            out["Liger-Kernel"] = (lambda x, w, t: liger_fused_linear_cross_entropy(x, w, t), _no_dsls)
    return out


def main() -> None:
    args = parse()
    torch.manual_seed(0)
    n, h, v, device = args.tokens, args.hidden, args.vocab, args.device
    x = torch.randn(n, h, device=device).to(args.dtype).requires_grad_(True)
    w = (torch.randn(v, h, device=device) / h**0.5).to(args.dtype).requires_grad_(True)
    t = torch.randint(0, v, (n,), device=device)
    t[::10] = -100
    itemsize = torch.finfo(args.dtype).bits // 8
    print(f"{n} tokens x {h} hidden x {v} classes, {str(args.dtype).removeprefix('torch.')}, on {device}"
          f" (torch {torch.__version__}); the logits alone: {n * v * itemsize / 2**20:.1f} MiB")
    rows = []
    for name, (loss_fn, scope) in variants(device, args.interpreted).items():
        def step(loss_fn=loss_fn, scope=scope):
            x.grad = w.grad = None
            with scope():
                loss_fn(x, w, t).backward()

        step()  # warm-up: first launches, allocator
        x.grad = w.grad = None
        peak = peak_bytes(step, device)
        ms = median_ms(step, device, args.repeat)
        rows.append((name, peak, ms))
    base_peak, base_ms = rows[0][1], rows[0][2]
    print(f"{'variant':<20} {'peak MiB':>10} {'vs unfused':>11} {'ms':>10} {'vs unfused':>11}")
    for name, peak, ms in rows:
        print(f"{name:<20} {peak / 2**20:>10.1f} {peak / base_peak:>10.2f}x {ms:>10.1f} {ms / base_ms:>10.2f}x")


if __name__ == "__main__":
    main()
