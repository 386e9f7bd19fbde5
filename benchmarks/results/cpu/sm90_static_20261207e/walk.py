from harness import compile_report, sass_loop_stats

from tachyon.kernels.gemv import _gemv_kernel
from tachyon.kernels.scaled_linear import _w8a8_row_kernel

types = dict(x_ptr="*bf16", w_ptr="*fp8e4nv", ws_ptr="*fp32", xs_ptr="*fp32", b_ptr="*bf16", out_ptr="*bf16", y_ptr="*bf16", cnt_ptr="*i32",
             N="i32", K="i32", K_SPLIT="i32", stride_xm="i32", stride_om="i32", stride_os="i32")
div = ["x_ptr","w_ptr","ws_ptr","xs_ptr","b_ptr","out_ptr","y_ptr","cnt_ptr","N","K","K_SPLIT","stride_xm","stride_om","stride_os"]
for bn, bk, w, s in [(16, 512, 4, 4), (8, 512, 4, 4)]:
    consts = dict(FP8=True, QMAX=448.0, STATIC=False, HAS_BIAS=False, BLOCK_N=bn, BLOCK_K=bk, AMAX_BLOCK=4096, LATE_REDUCE=False, PREQ=False, FINISH=False, FINISH_BIAS=False, FENCE=False, PDL=False)
    compile_report(_w8a8_row_kernel, types, consts, div, w, s, tag=f"fp8walk {bn}x{bk}")
    sass_loop_stats(f"fp8walk {bn}x{bk}")
t2 = dict(x_ptr="*bf16", w_ptr="*bf16", b_ptr="*bf16", y_ptr="*bf16", M="i32", N="i32", K="i32", stride_xm="i32", stride_wn="i32", stride_ym="i32")
for bn, bk, w, s, late in [(8, 512, 4, 4, True), (32, 256, 4, 4, False)]:
    consts = dict(HAS_BIAS=False, ONE_ROW=True, M_PAD=16, IEEE=False, BLOCK_N=bn, BLOCK_K=bk, LATE_REDUCE=late, PDL=False)
    compile_report(_gemv_kernel, t2, consts, ["x_ptr","w_ptr","b_ptr","y_ptr","N","K","stride_xm","stride_wn","stride_ym"], w, s, tag=f"bf16gemv {bn}x{bk}")
    sass_loop_stats(f"bf16gemv {bn}x{bk}")
