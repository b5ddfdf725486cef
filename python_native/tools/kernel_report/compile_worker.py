"""Compile Triton kernels for a GPU target on a machine without one, and read what ptxas made of them.

Run as ``python -m python_native.tools.kernel_report.compile_worker ARCH_CAPABILITY`` with the launches
to compile as JSON on stdin (``compile.request``); prints one JSON result per launch. It runs in a
process of its own with Triton's interpreter off, so that the kernels are Triton's JIT functions
and compile exactly as they do for a GPU (the interpreter's rounding helpers included only there).

Per kernel: Triton's compile for ``GPUTarget("cuda", capability, 32)`` (the same pipeline a launch
runs: Triton IR, PTX, then the ptxas shipped in Triton's wheel), cached in Triton's cache dir;
shared memory and warps from the compiled kernel's metadata; registers and local memory (spills)
from ``cuobjdump -res-usage`` on the cubin, since the driver that reports them at load time needs a GPU.
Per kernel too: the int32 address arithmetic that can pass 2**31 (``offsets``), read from the TTIR
of the specialization with every int argument an int32.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from typing import Any

_RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _tool(name: str) -> str:
    """A CUDA binary Triton ships (``TRITON_CUOBJDUMP_PATH``-style overrides are honoured by Triton's knobs)."""
    from triton import knobs

    tool = getattr(knobs.nvidia, name, None)
    path = getattr(tool, "path", None) if tool is not None else None
    if path:
        return path
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers per thread, stack and local bytes per thread, static shared bytes, from the cubin."""
    from python_native.foundations import safe_write

    path = safe_write.new_temp_file(cubin, suffix=".cubin")
    try:
        out = subprocess.run([_tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True, check=True)
    finally:
        os.unlink(path)
    match = _RES.search(out.stdout)
    if match is None:
        raise RuntimeError(f"cuobjdump printed no resource usage: {out.stdout.strip()[:200]}")
    regs, stack, shared, local = map(int, match.groups())
    return {"regs": regs, "stack": stack, "static_shared": shared, "local": local}


def _argument(a: Any) -> Any:
    import torch

    if isinstance(a, dict) and "tensor" in a:
        dtype = getattr(torch, a["tensor"])
        t = torch.empty(64, dtype=dtype)
        return t if a["aligned"] else t[1:]
    return a


def _bound(request: dict, capability: int, args: list) -> tuple:
    """``(jit function, backend, target, ASTSource, options)`` of ``request`` with ``args``."""
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = getattr(importlib.import_module(request["module"]), request["kernel"])
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    constexprs = {k: tl.dtype(v["tl_dtype"]) if isinstance(v, dict) else v for k, v in request["constexprs"].items()}
    kwargs = dict(constexprs, num_warps=request["num_warps"])
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return fn, backend, target, ASTSource(fn, signature, constexprs, attrs), options


def compile_one(request: dict, capability: int) -> dict:
    """Compile one launch; returns its figures or ``{"error": ...}``."""
    from triton.compiler import compile

    _, _, target, source, options = _bound(request, capability, list(map(_argument, request["args"])))
    kernel = compile(source, target=target, options=options.__dict__)
    usage = resource_usage(kernel.asm["cubin"])
    return {"shared": int(kernel.metadata.shared), "num_warps": int(kernel.metadata.num_warps), **usage}


def _generic(a: Any) -> Any:
    """An argument as the worst case specializes it: every int an int32 that is neither 1 nor a
    multiple of 16 (Triton folds the first into a constant and tags the second)."""
    if isinstance(a, int) and not isinstance(a, bool):
        return 3
    return _argument(a)


def int32_sites(request: dict, capability: int) -> list[str]:
    """The int32 address arithmetic of the kernel that can pass 2**31 (``offsets``), read from the
    Triton IR of its specialization with every int argument an int32: front end and TTIR passes only."""
    from triton._C.libtriton import ir
    from triton.compiler.compiler import Language

    from python_native.tools.kernel_report.offsets import int32_sites as sites

    _, backend, target, source, options = _bound(request, capability, [_generic(a) for a in request["args"]])
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                            context)
    stages: dict[str, Any] = {}
    backend.add_stages(stages, options, Language.TRITON)
    return [site.describe() for site in sites(stages["ttir"](module, {}).str())]


def _figures(request: dict, capability: int) -> dict:
    """``compile_one``'s figures and ``int32_sites``, each failure reported in place of its figure."""
    out: dict[str, Any] = {}
    for name, step in (("compiled", compile_one), ("int32", int32_sites)):
        try:
            value = step(request, capability)
        except Exception as e:  # reported per kernel; the others still compile
            cause = e
            while cause.__cause__ is not None:  # Triton's compile errors wrap the one that says why
                cause = cause.__cause__
            message = str(cause).strip().splitlines()
            value = {"error": f"{type(cause).__name__}: {message[-1] if message else ''}"}
        if name == "compiled":
            out.update(value)
        elif isinstance(value, dict):
            out["int32_error"] = value["error"]
        else:
            out["int32"] = value
    return out


def main() -> int:
    capability = int(sys.argv[1])
    json.dump([_figures(request, capability) for request in json.load(sys.stdin)], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
