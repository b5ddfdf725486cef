"""The group norm, dropout, norm backward and long-row softmax kernels compile for sm_90a, also on
machines without a GPU.

The interpreter runs the kernels' Python, not Triton's compiler: a kernel can pass every
interpreted test and still fail to compile for a GPU. Triton compiles to a cubin without a device
(it ships ptxas), so this runs everywhere Triton's NVIDIA backend is installed, in a process of its
own with the interpreter off.
"""

from __future__ import annotations

import textwrap

import pytest
from triton_testing import compile_in_fresh_process

SCRIPT = textwrap.dedent('''
    import inspect
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from python_native_dsls.triton.kernels import dropout, group_norm as gn, group_norm_backward as gb
    from python_native_dsls.triton.kernels import norm_backward as nb, softmax_long as sl

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
        nbp = dict(DY=t, X=t, W=t, MEAN=f, RSTD=f, DX=t, PART=f, C1=f, C2=f)
        for rms in (False, True):
            flags = dict(IS_RMS=rms, HAS_W=True, NEED_DX=True, NEED_DW=True, NEED_DB=not rms, CAST_X=rms)
            build(nb._norm_bwd_rows_kernel, nbp, {"eps", "w_offset"}, dict(flags, RSTD_FROM_X=rms, BLOCK_M=4, BLOCK_N=1024), 4)
            build(nb._norm_bwd_row_sums_kernel, nbp, {"eps", "w_offset"},
                  dict(IS_RMS=rms, HAS_W=True, CAST_X=rms, RSTD_FROM_X=rms, BLOCK_M=4, BLOCK_N=512), 4)
            build(nb._norm_bwd_cols_kernel, nbp, {"w_offset"}, dict(flags, BLOCK_M=8, BLOCK_N=256), 4)
        slp = dict(X=t, Y=t, DY=t, DX=t, PMAX=f, PSUM=f, PDOT=f)
        build(sl._softmax_slice_stats_kernel, slp, set(), dict(BLOCK_N=2048), 8)
        for log in (False, True):
            build(sl._softmax_fwd_looped_kernel, slp, set(), dict(LOG=log, BLOCK_N=4096), 16)
            build(sl._softmax_bwd_looped_kernel, slp, set(), dict(LOG=log, BLOCK_N=4096), 16)
            build(sl._softmax_slice_write_kernel, slp, set(), dict(LOG=log, BLOCK_S=64, BLOCK_N=2048), 8)
            build(sl._softmax_slice_dot_kernel, slp, set(), dict(LOG=log, BLOCK_N=2048), 8)
            build(sl._softmax_slice_grad_kernel, slp, set(), dict(LOG=log, BLOCK_S=64, BLOCK_N=2048), 8)
    print("compiled")
''')


@pytest.mark.slow  # compiles every variant for sm_90a: CI's second step runs it
def test_kernels_compile_for_sm90():
    assert "compiled" in compile_in_fresh_process(SCRIPT, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
