import re

from harness import compile_report, sass_loop_stats

from tachyon.kernels.scaled_linear import _w8a8_gemm_kernel

div = ["xq_ptr", "xs_ptr", "w_ptr", "ws_ptr", "b_ptr", "out_ptr", "M", "N", "K"]
for fp8, wt in ((False, "*i8"), (True, "*fp8e4nv")):
    types = dict(xq_ptr=wt, xs_ptr="*fp32", w_ptr=wt, ws_ptr="*fp32", b_ptr="*bf16", out_ptr="*bf16",
                 M="i32", N="i32", K="i32")
    for bm, bn, bk, w, s in [(128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (64, 128, 128, 4, 4)]:
        consts = dict(FP8=fp8, HAS_BIAS=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, PDL=False)
        tag = f"{'fp8' if fp8 else 'int8'} gemm {bm}x{bn}x{bk}"
        k = compile_report(_w8a8_gemm_kernel, types, consts, div, w, s, tag=tag)
        ptx = k.asm["ptx"]
        print(tag, "wgmma kinds", sorted(set(re.findall(r"wgmma\.mma_async\.[\w.]+", ptx)))[:3],
              "mma.sync", ptx.count("mma.sync"), "ldmatrix", ptx.count("ldmatrix"))
        sass_loop_stats(tag)
