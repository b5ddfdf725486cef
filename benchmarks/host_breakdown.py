"""Where the host time of a tiny softmax goes on a GPU, stage by stage (run on a CUDA machine).

``PYTHONPATH=. python benchmarks/host_breakdown.py``. Prints microseconds per call (median of
loops of back-to-back calls, GPU synchronized around each loop) for:

- aten ``add`` and ``_softmax`` before this package is imported, and again after it is (a change
  there would be a cost the package puts on every op);
- the softmax override through the dispatcher, its Python part with the launch stubbed, and the
  pieces of a launch: Triton's ``kernel[grid](...)``, ``compiled.run`` and the bound launcher the
  override uses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("PYTHON_NATIVE_TRITON_INTERPRET", "0")
os.environ.setdefault("TRITON_INTERPRET", "0")

from host_overhead import loop_us  # noqa: E402  (after the mode is chosen)


def per_call_us(fn: Callable[[], object], number: int = 2000, repeat: int = 7) -> float:
    return loop_us(fn, number, repeat, warmup=100)


def main() -> int:
    import torch

    x = torch.randn(8, 64, device="cuda")
    aten = torch.ops.aten
    rows = [
        ("aten add, package not imported", per_call_us(lambda: torch.add(x, x))),
        ("aten _softmax, package not imported", per_call_us(lambda: aten._softmax(x, -1, False))),
        ("torch.empty_like", per_call_us(lambda: torch.empty_like(x))),
    ]
    import python_native as pn
    from python_native_dsls.triton import testing
    from python_native_dsls.triton.kernels import launch
    from python_native_dsls.triton.kernels.softmax_rows import FWD
    from python_native_dsls.triton.plans.tiles import row_config

    rows += [
        ("aten add, package imported", per_call_us(lambda: torch.add(x, x))),
        ("override _softmax (dispatcher to launch)", per_call_us(lambda: aten._softmax(x, -1, False))),
    ]
    with pn.triton.disabled():
        rows.append(("_softmax with triton disabled (router fallback)", per_call_us(lambda: aten._softmax(x, -1, False))))
    with testing.stubbed_launches():
        rows.append(("override _softmax, launch stubbed", per_call_us(lambda: aten._softmax(x, -1, False))))
    y = torch.empty_like(x)
    args, cfg = (x, y, 8, 64, 64, 1), row_config(8, 64)
    constexprs = (False, cfg.block_m, cfg.block_n)
    grid = ((8 + cfg.block_m - 1) // cfg.block_m,)
    fwd = FWD
    kwargs = dict(zip(fwd.constexprs, constexprs, strict=True))
    rows.append(("Launcher call (bound launch)", per_call_us(lambda: fwd(grid, args, cfg.num_warps, *constexprs))))
    rows.append(("triton kernel[grid](...)", per_call_us(lambda: fwd.kernel[grid](*args, num_warps=cfg.num_warps, **kwargs))))
    key = next(iter(fwd._compiled), None)
    if key is not None:
        bound_launch, prefix = fwd._compiled[key]
        stream = torch.cuda.current_stream().cuda_stream
        rows.append(("bound launch alone", per_call_us(lambda: bound_launch(grid[0], 1, 1, stream, *prefix, *args, *constexprs))))
        compiled = fwd.kernel[grid](*args, num_warps=cfg.num_warps, **kwargs)
        rows.append((
            "compiled.run alone",
            per_call_us(lambda: compiled.run(grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata,
                                             None, None, None, *args, *constexprs)),
        ))
        rows.append(("launch key (spec_key)", per_call_us(lambda: launch.spec_key(args))))
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; 8x64 fp32; us per call")
    for name, us in rows:
        print(f"{name:52} {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
