"""Every CuTe DSL kernel compiles for sm_90a without a GPU, and its exported object loads."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cutedsl_testing import requires_cutlass

pytestmark = requires_cutlass

# One specialization per kernel and flag combination, dtypes spread over them to keep the run short.
CASES = [
    ("norm_forward", "bfloat16", "bfloat16", 128, {"rms", "weight"}),
    ("norm_forward", "float32", "float32", 512, {"rms"}),
    ("norm_forward", "float16", "float16", 256, {"weight", "bias"}),
    ("norm_forward", "bfloat16", "bfloat16", 128, set()),
    ("norm_forward", "bfloat16", "bfloat16", 256, {"rms", "weight", "vec"}),
    ("norm_forward", "float32", "float32", 128, {"weight", "bias", "vec"}),
    ("norm_backward", "bfloat16", "bfloat16", 256, {"rms", "weight"}),
    ("norm_backward", "float32", "float32", 128, {"weight", "bias"}),
    ("softmax_forward", "float16", "float32", 512, set()),
    ("softmax_forward", "bfloat16", "bfloat16", 128, {"log"}),
    ("softmax_forward", "float16", "float32", 128, {"log", "vec"}),
    ("softmax_forward", "bfloat16", "bfloat16", 512, {"vec"}),
    ("softmax_backward", "float32", "float16", 256, set()),
    ("softmax_backward", "float32", "float32", 128, {"log"}),
    ("row_reduce", "bfloat16", "bfloat16", 128, {"sum"}),
    ("row_reduce", "float32", "float32", 512, {"mean", "vec"}),
    ("row_reduce", "float16", "float16", 256, {"max", "vec"}),
    ("row_reduce", "bfloat16", "bfloat16", 128, {"min"}),
]


EM_CUDA = 190


def embedded_cubin_sm(obj: bytes) -> int:
    """SM number of the CUDA ELF (cubin) embedded in an exported host object (low byte of e_flags)."""
    start = obj.find(b"\x7fELF", 1)
    assert start > 0, "no embedded cubin"
    (machine,) = struct.unpack_from("<H", obj, start + 18)
    (flags,) = struct.unpack_from("<I", obj, start + 48)
    assert machine == EM_CUDA
    return flags & 0xFF


@pytest.fixture(scope="module")
def compiler():
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from python_native_dsls.cutedsl.kernels import compiler

    return compiler


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{'+'.join(sorted(c[4])) or 'plain'}")
def test_kernel_compiles_for_sm90a(compiler, case):
    from python_native_dsls.cutedsl.specialization import Specialization

    kernel, dtype, out_dtype, threads, flags = case
    obj = compiler.compile_to_object(Specialization(kernel, dtype, out_dtype, threads, frozenset(flags)), "sm_90a")
    assert obj.startswith(b"\x7fELF") and embedded_cubin_sm(obj) == 90


def test_arch_reaches_the_cubin(compiler):
    from python_native_dsls.cutedsl.specialization import Specialization

    obj = compiler.compile_to_object(Specialization("softmax_backward", "float32", "float32", 128), "sm_80")
    assert embedded_cubin_sm(obj) == 80


PTX_PROBE = """
import json, re, sys
from python_native_dsls.cutedsl.kernels import compiler
from python_native_dsls.cutedsl.specialization import Specialization
out = {}
for kernel in ("norm_forward", "softmax_forward"):
    for vec in (False, True):
        flags = frozenset({"vec"} if vec else set())
        fn, args = compiler._program(Specialization(kernel, "bfloat16", "bfloat16", 128, flags))
        ptx = compiler.cute.compile(fn, *args, options="--enable-tvm-ffi --gpu-arch sm_90a --keep-ptx").__ptx__
        out[f"{kernel}-{vec}"] = sorted(set(re.findall(r"(?:ld|st)\\.global[.\\w]*", ptx)))
print(json.dumps(out))
"""


def test_vec_specializations_move_16_bytes_per_access(tmp_path):
    """The ``vec`` specializations load and store bf16 rows 128 bits at a time (per-row fp32 statistics
    stay scalar); the plain ones move one element per access. Run apart: ``--keep-ptx`` writes
    files into the dump folder, which the compiler fixes when it is first used."""
    import json

    root = str(Path(__file__).resolve().parents[2])  # this checkout, whatever the working directory
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "CUTE_DSL_DUMP_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    r = subprocess.run([sys.executable, "-c", PTX_PROBE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    accesses = {k: set(v) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    for kernel in ("norm_forward", "softmax_forward"):
        vec, plain = accesses[f"{kernel}-True"], accesses[f"{kernel}-False"]
        assert {"ld.global.v4.b32", "st.global.v4.b32"} <= vec, vec
        assert not any(op.endswith(("16", ".v2.b32")) for op in vec), vec
        assert not any(".v4" in op for op in plain) and any(op.endswith("16") for op in plain), plain


def test_backward_kernels_have_no_vec_specialization(compiler):
    from python_native_dsls.cutedsl.specialization import Specialization

    with pytest.raises(ValueError, match="'norm_backward' has no vectorized specialization"):
        compiler.compile_to_object(Specialization("norm_backward", "float32", "float32", 128, frozenset({"vec"})), "sm_90a")


def test_row_reduce_needs_one_reduction_flag(compiler):
    from python_native_dsls.cutedsl.specialization import Specialization

    for flags in ({"vec"}, {"sum", "max"}):
        with pytest.raises(ValueError, match="row_reduce needs exactly one of the flags"):
            compiler.compile_to_object(Specialization("row_reduce", "float32", "float32", 128, frozenset(flags)), "sm_90a")


def test_unknown_kernel_is_named(compiler):
    from python_native_dsls.cutedsl.specialization import Specialization

    with pytest.raises(ValueError, match="unknown CuTe DSL kernel 'nope'"):
        compiler.compile_to_object(Specialization("nope", "float32", "float32", 128), "sm_90a")


def test_cached_object_loads_in_a_fresh_process(tmp_path):
    """Compile through the disk cache, then load the entry in another process as an impl would."""
    code = textwrap.dedent("""
        import os, sys
        from python_native_dsls.cutedsl.kernels import compiler
        from python_native_dsls.cutedsl.specialization import Specialization
        v = Specialization("softmax_forward", "float32", "float32", 128, frozenset({"log"}))
        payload, cached, _ = compiler.build(v, "sm_90a")
        fn = compiler.load_object(payload, v.symbol())
        print(cached, type(fn).__name__)
    """)
    env = {**os.environ, "PYTHON_NATIVE_CACHE_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "",
           "TORCH_LOGS": "python_native_compile"}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-3000:]
    assert [r.stdout.split()[-2:] for r in runs] == [["False", "Function"], ["True", "Function"]]
    # Each build is a compile event: op, override variant, key and seconds, through TORCH_LOGS.
    for r, how in zip(runs, ("compiled)", "read from the kernel cache)"), strict=True):
        events = [line for line in r.stderr.splitlines() if "python_native: cutedsl compiled" in line]
        assert len(events) == 1, r.stderr[-3000:]
        assert "softmax_forward for op _log_softmax (variant default) at CUDA in " in events[0], events[0]
        assert events[0].endswith(how) and "sm_90a" in events[0], events[0]
