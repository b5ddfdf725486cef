"""The reduction kernels compile for an H100 (sm_90) without a GPU: Triton's frontend and ptxas see
the code paths the interpreter runs as Python (constexpr branches, dtype constexprs, the combines)."""

from __future__ import annotations

import textwrap

import pytest
from triton_testing import compile_in_fresh_process

SCRIPT = textwrap.dedent("""
    import torch, triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from python_native_dsls.triton.kernels import reductions as K

    PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float64: "*fp64", torch.int64: "*i64",
           torch.uint8: "*u8", torch.bool: "*i1", torch.int32: "*i32"}
    # (kernel, x dtype, out dtype, OP, CAST, ACC, HAS_XI, WITH_INDEX, WRITE_V, WRITE_I, FINAL)
    CASES = [
        (K._rows_kernel, torch.bfloat16, torch.bfloat16, 1, None, tl.float32, False, False, True, False, True),
        (K._rows_kernel, torch.float32, torch.float32, 3, None, tl.float32, True, True, True, True, True),
        (K._rows_kernel, torch.float32, torch.bfloat16, 0, tl.bfloat16, tl.float32, False, False, True, False, True),
        (K._cols_kernel, torch.uint8, torch.int64, 4, None, tl.int64, False, True, False, True, True),
        (K._cols_kernel, torch.bool, torch.int64, 2, None, tl.int64, False, False, True, False, True),
        (K._cols_kernel, torch.float64, torch.float64, 1, None, tl.float64, False, False, True, False, False),
    ]
    for fn, x, out, *flags in CASES:
        names = [p.name for p in fn.params]
        consts = dict(zip(names[-10:], [*flags, 8, 128]))
        sig = {n: {"X": PTR[x], "XI": "*i64", "OUT": PTR[out], "OUT_I": "*i64"}.get(n, "i32") for n in names[:-10]}
        sig.update({n: "constexpr" for n in consts})
        src = ASTSource(fn, sig, constexprs={(names.index(n),): v for n, v in consts.items()})
        kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        assert kernel.asm["cubin"]
    print("compiled", len(CASES))
""")


@pytest.mark.slow  # compiles every variant for sm_90a: CI's second step runs it
def test_reduction_kernels_compile_for_sm90():
    assert compile_in_fresh_process(SCRIPT, PYTHON_NATIVE_DISABLE="1").strip().splitlines()[-1] == "compiled 6"
