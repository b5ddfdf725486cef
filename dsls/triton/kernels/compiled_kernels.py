"""What the launcher knows of Triton's kernels: their declared parameters, their compiled objects'
launchers (called directly where their layout is known), and a launch described for replay.

``describe`` turns one launch of a compiled kernel into what a CUDA driver launch takes, the way
the launcher Triton generates per kernel builds it (checked against Triton 3.6's generated C
launcher and 3.9's generic one, which agree): every parameter whose signature type is not
``constexpr`` (Triton also makes ints equal to 1 and None constexpr), in declaration order, a
pointer for each ``*dtype`` type and the C type of each number type (floats packed to their
width), then the two scratch pointers (null: kernels that need scratch are not described); grid
x times the cluster size (``num_ctas``), ``32 * num_warps`` threads, the kernel's dynamic shared
memory.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from python_native.foundations.launches import POINTER, Launch

# Triton versions whose CUDA launcher object is known field by field: for them a launch calls the
# compiled C launcher directly, skipping the Python ``__call__`` that only allocates scratch
# buffers (none for these kernels). Other versions go through ``compiled.run``.
DIRECT_LAUNCH_VERSIONS = ("3.6.",)
# Triton versions whose kernel parameter layout ``describe`` follows (see the module docstring).
DESCRIBED_VERSIONS = ("3.6.", "3.7.", "3.8.", "3.9.")

_NUMBER_CODES = {
    "i1": "i8", "i8": "i8", "i16": "i16", "i32": "i32", "i64": "i64",
    "u1": "u8", "u8": "u8", "u16": "u16", "u32": "u32", "u64": "u64",
    "fp16": "f16", "bf16": "bf16", "fp32": "f32", "f32": "f32", "fp64": "f64",
}


def declared_params(kernel: Any) -> list[tuple[str, bool]] | None:
    """``(name, is_constexpr)`` per parameter of a ``@triton.jit`` kernel (also an interpreted one,
    which keeps only its Python function), or None when they cannot be told."""
    params = getattr(kernel, "params", None)
    if params is not None:
        return [(p.name, bool(p.is_constexpr)) for p in params]
    fn = getattr(kernel, "fn", None)
    if fn is None:
        return None
    return [
        (name, p.annotation is tl.constexpr or str(p.annotation).endswith("constexpr"))
        for name, p in inspect.signature(fn).parameters.items()
    ]


def bind(compiled: Any) -> tuple[Callable[..., Any], tuple]:
    """``(launch, prefix)`` for a compiled kernel: a launch is
    ``launch(grid_x, grid_y, grid_z, stream, *prefix, *args, *constexprs)``."""
    run = compiled.run
    hooks = (compiled.packed_metadata, None, None, None)  # launch metadata, enter hook, exit hook: none
    if (
        triton.__version__.startswith(DIRECT_LAUNCH_VERSIONS)
        and callable(getattr(run, "launch", None))
        and getattr(run, "global_scratch_size", None) == 0
        and getattr(run, "profile_scratch_size", None) == 0
        and hasattr(run, "launch_cooperative_grid")
        and hasattr(run, "launch_pdl")
    ):
        return run.launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None, *hooks)
    return run, (compiled.function, *hooks)


def compiled_usable(compiled: Any) -> bool:
    """A compiled kernel, loaded by its first launch, whose launcher the fast path knows how to
    call (Triton 3.6 and later: ``run``, ``function``, ``packed_metadata``; not a pending future)."""
    return (
        compiled is not None
        and not hasattr(compiled, "result")
        and getattr(compiled, "function", None) is not None
        and hasattr(compiled, "packed_metadata")
        and callable(getattr(compiled, "run", None))
    )


def _param(ty: Any, value: Any) -> tuple[str, Any] | str:
    """One kernel parameter as ``(code, value)``, or why it cannot be replayed."""
    if not isinstance(ty, str):
        return f"a tuple parameter ({ty})"
    if ty.startswith("*"):
        if value is None or isinstance(value, torch.Tensor):
            return (POINTER, value)
        return f"a pointer given as {type(value).__name__}"
    code = _NUMBER_CODES.get(ty)
    if code is None:
        return f"parameter type {ty}"
    return (code, float(value) if code[0] in "fb" else int(value))


def describe(compiled: Any, grid: tuple, values: tuple) -> Launch | str:
    """The launch of ``compiled`` over ``grid`` with ``values`` (every parameter of the kernel, in
    declaration order, constexprs included), or why it cannot be replayed."""
    if not triton.__version__.startswith(DESCRIBED_VERSIONS):
        return f"Triton {triton.__version__}'s launcher layout is not one replay knows"
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    run = getattr(compiled, "run", None)
    if not compiled_usable(compiled) or not isinstance(signature, dict):
        return "the launch returned no compiled kernel with a signature"
    if getattr(run, "global_scratch_size", 0) or getattr(run, "profile_scratch_size", 0):
        return "the kernel needs scratch memory"
    if getattr(run, "gsan_enabled", False):
        return "the kernel is instrumented (gsan)"
    if len(signature) != len(values):
        return f"{len(values)} values for {len(signature)} parameters"
    params = []
    for ty, value in zip(signature.values(), values, strict=True):
        if ty == "constexpr":
            continue
        found = _param(ty, value)
        if isinstance(found, str):
            return found
        params.append(found)
    params += [(POINTER, None), (POINTER, None)]  # global and profile scratch: none
    num_warps, num_ctas, shared = compiled.packed_metadata
    g = (*grid, 1, 1, 1)
    return Launch(
        function=int(compiled.function), grid=(int(g[0]) * num_ctas, int(g[1]), int(g[2])),
        block=(32 * num_warps, 1, 1), shared=int(shared), cluster=(int(num_ctas), 1, 1),
        cooperative=bool(getattr(run, "launch_cooperative_grid", False)), pdl=bool(getattr(run, "launch_pdl", False)),
        params=tuple(params),
    )
