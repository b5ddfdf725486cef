"""Compile once, reuse everywhere: specializations, their compilation, the disk cache and loading.

A ``Specialization`` names one compiled program: which kernel, the dtypes it reads and writes, the CTA
size (from the row's size class) and its compile-time flags. Sizes and strides are symbolic in the
compiled code, so one specialization serves every shape of its class.

Launch path: programs are compiled with ``--enable-tvm-ffi`` and exported as an object file. Once
loaded (``cutlass.runtime.load_module``) a program is a ``tvm_ffi.Function`` that takes torch
tensors directly through DLPack and reads the current CUDA stream from TVM-FFI's environment
stream, so a launch is one C call: no per-call conversion to cute tensors, no argument packing in
Python and no JIT executor. The function is looked up once per specialization (``SpecializationCache``)
and then called with the tensors of each call.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_tensor
from cutlass.runtime import load_module, make_fake_stream

from python_native.foundations import env, logs, safe_write
from python_native.foundations.kernel_cache import EntryKey, KernelCache, package_version, source_fingerprint
from python_native.foundations.speckey import SpecializationCache

from ..specialization import Specialization
from ..target import DSL_NAME, dispatch_key, runtime_version
from . import norm, reduce, softmax

# Every source a binary is built from: the kernels, this compiler, and the specialization that names it.
_BACKEND_DIR = Path(__file__).parent.parent
SOURCES = [
    _BACKEND_DIR / name
    for name in (
        "kernels/_blocks.py", "kernels/norm.py", "kernels/reduce.py", "kernels/softmax.py", "kernels/compiler.py",
        "specialization.py",
    )
]

VECTOR_KERNELS = frozenset({"norm_forward", "softmax_forward", "row_reduce"})
DTYPES = {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


def vector_width(v: Specialization) -> int:
    """Elements per access: 16 bytes of the input dtype for ``vec`` specializations, else 1."""
    return 16 * 8 // DTYPES[v.dtype].width if "vec" in v.flags else 1


def _rows(dtype: type, vec: int = 1) -> Any:
    """A row matrix: rows of ``vec``-divisible length and stride, 16-byte aligned when ``vec > 1``."""
    align = 16 if vec > 1 else None
    shape = (cute.sym_int(), cute.sym_int(divisibility=vec))
    return make_fake_tensor(dtype, shape, (cute.sym_int(64, divisibility=vec), 1), assumed_align=align)


def _vector(dtype: type, vec: int = 1) -> Any:
    return make_fake_tensor(dtype, (cute.sym_int(divisibility=vec),), (1,), assumed_align=16 if vec > 1 else None)


def _program(v: Specialization) -> tuple[Any, tuple]:
    """The host function and its compile-time argument placeholders."""
    x, out, f32 = DTYPES[v.dtype], DTYPES[v.out_dtype], cutlass.Float32
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    f, vec = v.flags, vector_width(v)
    if vec > 1 and v.kernel not in VECTOR_KERNELS:
        raise ValueError(f"kernel {v.kernel!r} has no vectorized specialization; {sorted(VECTOR_KERNELS)} do")
    if v.kernel == "norm_forward":
        fn = norm.forward_program(v.threads, vec, "rms" in f, "weight" in f, "bias" in f)
        args = (_rows(x, vec), _vector(x, vec), _vector(x, vec), _rows(out, vec), _vector(f32), _vector(f32),
                f32(1e-5), stream)
    elif v.kernel == "norm_backward":
        fn = norm.backward_program(v.threads, "rms" in f, "weight" in f, "bias" in f)
        args = (_rows(x), _rows(x), _vector(x), _vector(f32), _vector(f32), _rows(out), _rows(f32), _rows(f32),
                cutlass.Int32(1), stream)
    elif v.kernel == "softmax_forward":
        fn = softmax.forward_program(v.threads, vec, "log" in f)
        args = (_rows(x, vec), _rows(out, vec), stream)
    elif v.kernel == "softmax_backward":
        fn = softmax.backward_program(v.threads, "log" in f)
        args = (_rows(x), _rows(x), _rows(out), stream)
    elif v.kernel == "row_reduce":
        kinds = [k for k in reduce.KINDS if k in f]
        if len(kinds) != 1:
            raise ValueError(f"row_reduce needs exactly one of the flags {list(reduce.KINDS)}, got {sorted(f)}")
        fn = reduce.program(v.threads, vec, kinds[0])
        args = (_rows(x, vec), _vector(out), stream)
    else:
        raise ValueError(f"unknown CuTe DSL kernel {v.kernel!r}; expected one of norm_forward, norm_backward, "
                         "softmax_forward, softmax_backward, row_reduce")
    return fn, args


def known_archs() -> list[str]:
    """The ``--gpu-arch`` values this CuTe DSL release compiles for (``sm_80`` ... ``sm_90a`` ...)."""
    try:
        from cutlass.base_dsl.enums import Arch
    except ImportError:  # another release: the compiler itself checks the value
        return []
    return [arch.name for arch in Arch]


def compile_to_object(v: Specialization, arch: str) -> bytes:
    """Compile ``v`` for ``arch`` (e.g. ``sm_90a``) into an object file; needs no GPU."""
    fn, args = _program(v)
    compiled = cute.compile(fn, *args, options=f"--enable-tvm-ffi --gpu-arch {arch}")
    with tempfile.TemporaryDirectory(prefix="python-native-") as tmp:
        path = os.path.join(tmp, "kernel.o")
        compiled.export_to_c(path, function_name=v.symbol())
        return Path(path).read_bytes()


def versions() -> dict[str, str]:
    """Versions a binary depends on besides its own source."""
    import torch

    return {"cutlass-dsl": str(runtime_version()), "torch": torch.__version__, "python-native": package_version()}


@functools.cache
def source_hash() -> str:
    return source_fingerprint(*SOURCES)


def entry_key(v: Specialization, arch: str) -> EntryKey:
    return EntryKey({"dsl": DSL_NAME, "specialization": v.describe(), "arch": arch, "versions": versions(),
                     "source": source_hash()})


def build(v: Specialization, arch: str, cache: KernelCache | None = None) -> tuple[bytes, bool, float]:
    """``(object, cached, milliseconds)``: from the disk cache, or compiled and stored there.

    Each build is a compile event (``TORCH_LOGS=python_native_compile``), cache hits included."""
    cache = cache if cache is not None else KernelCache()
    start = time.perf_counter()
    payload, cached = cache.get_or_build(entry_key(v, arch), lambda: compile_to_object(v, arch))
    seconds = time.perf_counter() - start
    if logs.compile_logging():
        flags = "+".join(sorted(v.flags)) or "no flags"
        logs.kernel_compiled(DSL_NAME, op_of(v), dispatch_key(), seconds, v.kernel,
                             detail=f"{arch}, {v.dtype} -> {v.out_dtype}, {v.threads} threads, {flags}, "
                                    + ("read from the kernel cache" if cached else "compiled"))
    return payload, cached, seconds * 1e3


def op_of(v: Specialization) -> str:
    """The aten op a specialization's program serves (its kernel family and flags say which)."""
    rms, log = "rms" in v.flags, "log" in v.flags
    return {
        "norm_forward": "_fused_rms_norm" if rms else "native_layer_norm",
        "norm_backward": "_fused_rms_norm_backward" if rms else "native_layer_norm_backward",
        "softmax_forward": "_log_softmax" if log else "_softmax",
        "softmax_backward": "_log_softmax_backward_data" if log else "_softmax_backward_data",
    }.get(v.kernel, v.kernel)


_loaded_modules: list[Any] = []  # loaded code must outlive every function taken from it
_load_lock = threading.Lock()


def load_object(payload: bytes, symbol: str) -> Any:
    """The ``tvm_ffi.Function`` named ``symbol`` in an exported object file."""
    with tempfile.TemporaryDirectory(prefix="python-native-") as tmp, _load_lock:
        path = os.path.join(tmp, symbol + ".o")
        safe_write.write(path, payload, create=False)
        module = load_module(path, enable_tvm_ffi=True)
        fn = getattr(module, symbol)
        _loaded_modules.append(module)
    return fn


def device_arch(index: int | None = None) -> str:
    """The ``--gpu-arch`` of a CUDA device: ``sm_90a`` on an H100 (arch-specific features on)."""
    override = env.cute_dsl_arch()  # checked there: None when it is no architecture (reported)
    if override:
        return override
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def _load(v: Specialization, arch: str) -> Any:
    payload, _, _ = build(v, arch)
    return load_object(payload, v.symbol())


_functions: SpecializationCache[Any] = SpecializationCache(_load)


def function(v: Specialization, arch: str) -> Any:
    """The launchable program for ``v`` on ``arch``: loaded once per process, compiled once per machine."""
    return _functions.get((v, arch), v, arch)
