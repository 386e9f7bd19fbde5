"""The gemv kernel's several-rows path with and without a K split, compiled for sm_90 on the CPU (no GPU):
registers, spills, shared memory, cp.async loads (../sm90_static_20261207e/harness.py)."""
from harness import compile_report

from tachyon.kernels.gemv import _gemv_kernel

types = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*fp32", M="i32", N="i32", K="i32", stride_xm="i32",
             stride_wn="i32", stride_ym="i32", K_SPLIT="i32")
div = ["x_ptr", "w_ptr", "b_ptr", "y_ptr", "N", "K", "stride_xm", "stride_wn", "stride_ym", "K_SPLIT"]
for m_pad, bn, bk, w, s in [(64, 32, 256, 4, 4), (16, 16, 256, 4, 4), (64, 64, 128, 8, 4)]:
    consts = dict(HAS_BIAS=False, ONE_ROW=False, M_PAD=m_pad, IEEE=False, BLOCK_N=bn, BLOCK_K=bk, LATE_REDUCE=False,
                  PDL=True)
    compile_report(_gemv_kernel, types, consts, div, w, s, tag=f"gemv rows<={m_pad} {bn}x{bk}")
