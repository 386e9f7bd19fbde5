from harness import compile_report

from tachyon.kernels.paged_attention import _prefill_kernel

types = dict(q_ptr="*bf16", kc_ptr="*bf16", vc_ptr="*bf16", out_ptr="*bf16", bt_ptr="*i32", qsl_ptr="*i32", seq_lens_ptr="*i32",
  seq_start="i32", num_q_blocks="i32", stride_qt="i32", stride_qh="i32", stride_ot="i32", stride_oh="i32",
  stride_cb="i32", stride_cs="i32", stride_ch="i32", stride_bt="i32", qk_scale="fp32", v_scale="fp32")
div = ["q_ptr","kc_ptr","vc_ptr","out_ptr","bt_ptr","qsl_ptr","seq_lens_ptr","stride_qt","stride_qh","stride_ot","stride_oh","stride_cb","stride_cs","stride_ch"]
for bm, bn, w, s in [(64,64,4,2),(64,64,4,3),(128,64,8,2),(64,32,4,3)]:
    consts = dict(GROUP=4, HEAD_DIM=128, PAGE=16, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=128, PRECISION="tf32", PDL=False)
    compile_report(_prefill_kernel, types, consts, div, w, s, tag=f"{bm}x{bn}")
