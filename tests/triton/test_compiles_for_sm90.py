"""The group norm and dropout kernels compile for sm_90a, also on machines without a GPU.

The interpreter runs the kernels' Python, not Triton's compiler: a kernel can pass every
interpreted test and still fail to compile for a GPU. Triton compiles to a cubin without a device
(it ships ptxas), so this runs everywhere Triton's NVIDIA backend is installed, in a process of its
own with the interpreter off.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import inspect
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from python_native_dsls.triton.kernels import dropout, group_norm as gn, group_norm_backward as gb

    def build(kernel, pointers, floats, constexprs, warps):
        params = list(inspect.signature(kernel.fn).parameters)
        signature = {p: "constexpr" if p in constexprs else pointers.get(p) or ("fp32" if p in floats else "i32")
                     for p in params}
        aligned = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if p in pointers}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
        assert compiled.asm["cubin"], kernel

    for dt in ("bf16", "fp32"):
        t, f = "*" + dt, "*fp32"
        for final, c, hw in ((True, 1, 4096), (False, 16, 128)):
            build(gn._gn_stats_kernel, dict(X=t, PART=f, MEAN=t, RSTD=t, STATS=f), {"eps"},
                  dict(FINAL=final, BLOCK_C=c, BLOCK_HW=hw), 8)
        build(gn._gn_finalize_kernel, dict(PART=f, MEAN=t, RSTD=t, STATS=f), {"eps"}, dict(BLOCK_R=256, BLOCK_S=4), 4)
        for c, hw in ((1, 4096), (512, 4)):
            build(gn._gn_normalize_kernel, dict(X=t, W=t, B=t, Y=t, STATS=f), set(),
                  dict(HAS_W=True, HAS_B=True, BLOCK_C=c, BLOCK_HW=hw), 8)
            build(gb._gn_bwd_sums_kernel, dict(DY=t, X=t, MEAN=t, PART=f), set(), dict(BLOCK_C=c, BLOCK_HW=hw), 16)
            build(gb._gn_bwd_dx_kernel, dict(DY=t, X=t, W=t, MEAN=t, RSTD=t, COEF=f, DX=t), set(),
                  dict(HAS_W=True, BLOCK_C=c, BLOCK_HW=hw), 8)
        build(gb._gn_bwd_coeffs_kernel, dict(PART=f, W=t, RSTD=t, COEF=f), {"group_size"}, dict(HAS_W=True, BLOCK_C=16), 4)
        build(gb._gn_bwd_params_kernel, dict(PART=f, RSTD=t, DW=t, DB=t), set(),
              dict(NEED_DW=True, NEED_DB=True, BLOCK_C=256), 4)
        build(dropout._dropout_kernel, dict(X=t, Y=t, MASK="*i1", SEED="*i64"), {"scale"}, dict(BLOCK=4096), 4)
        build(dropout._bernoulli_kernel, dict(OUT=t, SEED="*i64"), set(), dict(BLOCK=4096), 4)
        build(dropout._masked_scale_kernel, dict(DY=t, MASK="*i1", DX=t), {"scale"}, dict(BLOCK=4096), 4)
    print("compiled")
''')


@pytest.mark.slow  # compiles every variant for sm_90a: CI's second step runs it
def test_kernels_compile_for_sm90():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_NATIVE_TRITON_INTERPRET", "TRITON_INTERPRET")}
    env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", TRITON_DEFAULT_FP_FUSION="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stdout + proc.stderr
