"""INT4 (W4A16) on tensor cores for 1-64 rows, from a K-major packing (quant_ref.pack_int4_kmajor), and the same
product on the natural layout (`_awq_mma_natural_kernel`, the "mma" kind of quant_linear.awq_linear). The K-major
path is Hopper's default (layers/linear.awq_kmajor_wanted; TACHYON_AWQ_MMA=0 opts out; repack_awq_kmajor repacks
every AWQ layer whose K is a multiple of 128): 1.6-1.9x quant_linear's kernels at 16 rows on the H200 (2.0-2.8x on
the H100), 1.04-1.28x at one row with the 2-warp configs (benchmarks/results/h200/issue14/run32, h100/issue14/run31).

Why another layout. The natural/AWQ packing holds 8 *columns* in a word, so a dot tile needs the nibbles spread
into 8 columns (a reshape), and Triton moves the dequantized tile through shared memory to the MMA's operand
layout; that round trip is what bounds quant_linear.py's 16-row tile near 1 TB/s. Here a word holds 8 *rows*
of K for one output column, 16 rows apart:

    K-major word [16 t + i, n], nibble j  =  q[128 t + 16 j + i, n]        (t a 128-row tile of K, i in 0..15)

so the j-th 16-row slice of a 128-row tile is (word >> 4j) & 15 of the *same* loaded [N, 16] block: eight
elementwise extractions of one load, each the A operand of one dot([BLOCK_N, 16] x [16, BLOCK_M]) (out^T =
W^T x^T, the weight on the MMA's M side, the activation rows on its N side, at least 16 of them). No reshape, no
int-to-float conversion: the nibble under the bits of 1024 (fp16, 0x6400) or 128 (bf16, 0x4300) *is* the
half-precision number 1024 + v (128 + v), exact; the offset comes off with the zero point in fp32 once a group:

    y[m, n] += s[g, n] * (sum_k (off + q[k, n]) x[m, k]  -  (off + z[g, n]) * sum_k x[m, k])

(sum_k x from a [rows, 128] load of the tile's x for G >= 128, else a dot with ones). On sm_90 the nibbles come
out of a small PTX block, about one instruction a value, in the MMA operand's own registers: Triton loads the
words through shared memory (cp.async, pipelined) straight into that layout. Above MMA_MAX_ROWS rows the weight is
dequantized once and multiplied by cuBLAS. Zero points and scales keep the natural layout (qzeros [K/G, N/8],
scales [K/G, N]). K % 128 == 0; G a power of two >= 32 (it divides 128 or 128 divides it). Activations fp16 or
bf16 (fp32 has no 16-bit magic number).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tachyon.kernels import pdl
from tachyon.kernels.quant_ref import (  # noqa: F401  (the K-major layout and its reference live there)
    KMAJOR_TILE,  # rows of K a block of words covers: 16 word rows x 8 nibbles
    awq_kmajor_ref,
    check_awq_args,
    check_awq_kmajor_args,
    dequantize_kmajor_ref,
    pack_int4_kmajor,
    unpack_int4_kmajor,
)
from tachyon.kernels.splits import (
    finish_split,
    nibble_at_12_or_16,
    num_sms,
    output_buffer,
    split_counters,
    split_k,
    store_eight_positions,
    sum_splits,
)

# (BLOCK_N, BLOCK_M, SPLIT_K, num_warps, num_stages); SPLIT_K 0: split_k picks it from the shape. On Hopper
# Triton makes a warpgroup MMA (wgmma) of the tile when num_warps is a multiple of 4 and BLOCK_N of 64; with a
# register operand it waits for each one before the next. num_warps 2 makes the same tile Ampere's mma.sync
# (no wait, several in flight): the 2-warp entries use 128-254 registers without spills (benchmarks/awq_mma_sass.py)
# and win: over llama3-70b's four layers at 1, 16 and 64 rows, (256, 16, 0, 2, 3) ran on average 1.04-1.09x each
# layer's best time on the H200 and the H100 (runs 32, 31), the 4-warp (128, 16, 0, 4, 3) 1.14-1.23x. The first
# entry is the default of shapes no table covers.
MMA_CONFIGS = [(256, 16, 0, 2, 3), (128, 16, 0, 4, 3), (128, 16, 0, 2, 3), (64, 16, 0, 2, 3), (128, 16, 8, 2, 3),
               (64, 64, 0, 2, 3), (64, 16, 0, 4, 3), (256, 16, 0, 8, 3), (256, 16, 0, 4, 3), (128, 16, 0, 4, 4),
               (128, 16, 4, 4, 3), (128, 16, 8, 4, 3), (128, 64, 0, 8, 3), (64, 64, 0, 4, 3), (128, 128, 0, 8, 3)]
# ("direct", BLOCK_N, BLOCK_M, SPLIT_K, num_warps, num_stages): the same kernel with the weight dequantized into
# the MMA operand ((q - z) * s in x's dtype: packed HADD2 + HMUL2, one instruction a value), so nothing per output
# and row is done a group: candidates for 16-64 rows, where the fp32 epilogue and the sum of x grow with the rows
# (a 64-row tile ran at ~146 TFLOP/s on the H200, run 32). Offline sm_90 compiles (benchmarks/results/cpu/
# awq_mma_sass/direct.md): 3.2-3.9 SASS instructions a weight value at 32-64 rows against 5.4-7.3 for the epilogue
# kernel, the operand in registers; 8 warps on a 128-column tile (or 4 on 64) send it through shared memory instead.
DIRECT_CONFIGS = [("direct", 128, 64, 0, 4, 3), ("direct", 128, 64, 0, 4, 4), ("direct", 256, 64, 0, 8, 3),
                  ("direct", 128, 32, 0, 4, 3), ("direct", 256, 32, 0, 4, 3), ("direct", 64, 32, 0, 2, 3),
                  ("direct", 128, 16, 0, 2, 3)]
# the untuned default from 17 rows: on an H100 at 64 rows it ran llama3-70b's four layers on average 1.06x each
# one's best config and 1.36-1.57x faster than MMA_CONFIGS[0] (the epilogue kernel is compute-bound there: the
# H200's run-32 times matched the H100's within 2.5%), llama3-8b's 1.30x the best and 1.49-1.68x faster than
# MMA_CONFIGS[0] (benchmarks/results/h100/session_20261207b/config_ranking.txt); the 70B 64-row step replayed in
# 39.1 ms instead of 57.0
DIRECT_DEFAULT = ("direct", 256, 32, 0, 4, 3)
# above this many rows the weight is dequantized once and multiplied by cuBLAS ("dequant"): on the H200 (run 29)
# 16-row tiles over the rows beat the taller tiles at 64 rows and dequant + cuBLAS wins from ~80 rows
MMA_MAX_ROWS = 64
_MAGIC = {torch.float16: (0x6400, 1024), torch.bfloat16: (0x4300, 128)}


@triton.jit
def _kmajor_dequant_kernel(qw_ptr, qz_ptr, s_ptr, w_ptr, N, N8, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                           PDL: tl.constexpr = False):
    """w [K, N] = (q - z) * s for one 128-row tile of K (pid 0) and BLOCK_N columns (pid 1)."""
    pdl.enter(PDL)
    t, pid_n = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_i = tl.arange(0, 16)
    q = tl.load(qw_ptr + (t * 16 + offs_i).to(tl.int64)[:, None] * N + offs_n[None, :], mask=mask_n[None, :],
                other=0)
    for j in tl.static_range(8):
        kk = t * 128 + 16 * j + offs_i  # [16]
        g = (t * 128 + 16 * j) // GROUP
        z = (tl.load(qz_ptr + g * N8 + offs_n // 8, mask=mask_n, other=0) >> ((offs_n % 8) * 4)) & 0xF
        s = tl.load(s_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        w = (((q >> (4 * j)) & 0xF) - z[None, :]).to(tl.float32) * s[None, :]
        tl.store(w_ptr + kk.to(tl.int64)[:, None] * N + offs_n[None, :], w.to(w_ptr.dtype.element_ty),
                 mask=mask_n[None, :])


def dequantize_kmajor(qweight_k: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                      block_n: int = 256, warps: int = 4) -> torch.Tensor:
    """The dense [K, N] weight in scales' dtype, on the GPU in one pass (the many-row path: then cuBLAS)."""
    k, n = qweight_k.shape[0] * 8, qweight_k.shape[1]
    w = torch.empty(k, n, dtype=scales.dtype, device=qweight_k.device)
    _kmajor_dequant_kernel[(k // KMAJOR_TILE, triton.cdiv(n, block_n))](
        qweight_k, qzeros, scales, w, n, n // 8, GROUP=group_size, BLOCK_N=block_n, num_warps=warps,
        **pdl.launch_args())
    return w


# Nibble J of two words -> two halves off + q in one register, for the MMA's A operand (which holds elements k,
# k + 1 of a row in one register: Triton hands such a pair to one asm block). PRMT takes the low (J < 4) or high
# 16 bits of each word side by side, SHR brings nibble J % 4 of both to bits 0 and 16, LOP3 keeps them under the
# magic number's bits ((t & 0x000F000F) | magic). About one instruction a value: the PRMT is shared by the four J of
# a half, the SHR of J % 4 == 0 is free. Operands (pack 2): $0 the result; $1 $2 the two words, $3 PRMT's selector,
# $5 the shift ($4, $6 their copies). Anything per row in this chain (a zero point) stops Triton from loading the
# words straight into the operand's registers (checked on the compiled IR), hence the offset and zero in fp32 after.
# On Hopper; the interpreter takes the plain-Triton path.
_NIBBLE_ASM_BF16 = tl.constexpr("""{
.reg .b32 t;
prmt.b32 t, $1, $2, $3;
shr.b32 t, t, $5;
lop3.b32 $0, t, 0x000F000F, 0x43004300, 0xEA;
}""")
_NIBBLE_ASM_F16 = tl.constexpr("""{
.reg .b32 t;
prmt.b32 t, $1, $2, $3;
shr.b32 t, t, $5;
lop3.b32 $0, t, 0x000F000F, 0x64006400, 0xEA;
}""")


@triton.jit
def _nibble(q, like, J: tl.constexpr, MAGIC: tl.constexpr, ASM: tl.constexpr):
    """q [BLOCK_N, 16] words -> [BLOCK_N, 16] halves (like's dtype) off + q_J, exact."""
    if ASM:
        if J < 4:
            sel = tl.full((1, 1), 0x5410, tl.int32)
        else:
            sel = tl.full((1, 1), 0x7632, tl.int32)
        sh = tl.full((1, 1), 4 * (J % 4), tl.int32)
        if MAGIC == 0x4300:
            asm: tl.constexpr = _NIBBLE_ASM_BF16
        else:
            asm: tl.constexpr = _NIBBLE_ASM_F16
        return tl.inline_asm_elementwise(asm, "=r,r,r,r,r,r,r", [q, sel, sh], dtype=like.dtype, is_pure=True,
                                         pack=2)
    else:
        return (((q >> (4 * J)) & 0xF) | MAGIC).to(tl.int16).to(like.dtype, bitcast=True)


@triton.jit
def _group_zero_scale(qz_ptr, s_ptr, g, N8, N, offs_n, mask_n, zero_shift, OFFSET: tl.constexpr):
    """Group g's zero point (+ OFFSET) and scale for the columns offs_n, in fp32 (the zero exact)."""
    zw = tl.load(qz_ptr + g * N8 + offs_n // 8, mask=mask_n, other=0)
    z = ((zw >> zero_shift) & 0xF).to(tl.float32) + OFFSET
    return z, tl.load(s_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)


@triton.jit(do_not_specialize=["M"])
def _awq_mma_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, out_ptr,
    M, N, N8, K, K_SPLIT, stride_xm, stride_om, stride_os,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    MAGIC: tl.constexpr, OFFSET: tl.constexpr, ASM: tl.constexpr, XTILE: tl.constexpr, PDL: tl.constexpr = False,
    DIRECT: tl.constexpr = False,
):
    """Program (pid_n, pid_m, pid_k): outputs [BLOCK_N] x rows [BLOCK_M] over one K split of whole 128-row
    tiles. Per tile one [BLOCK_N, 16] load of words, eight dots of K 16 on q - z (exact in halves); the group's
    scale goes on the dots' fp32 sum every E dots (E = min(GROUP, 128) / 16). DIRECT: the dots take the weight
    itself, (q - z) * s rounded to x's dtype, into one accumulator (no per-group epilogue over the [BLOCK_N,
    BLOCK_M] tile, no sum of x: the work that grows with the rows; XTILE must be off)."""
    pdl.enter(PDL)
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    E: tl.constexpr = min(GROUP, 128) // 16
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_i = tl.arange(0, 16)
    q_ptrs = qw_ptr + offs_i.to(tl.int64)[None, :] * N + offs_n[:, None]  # [BLOCK_N, 16]
    x_ptrs = x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm + offs_i[:, None]  # [16, BLOCK_M]: x^T
    zero_shift = (offs_n % 8) * 4
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    q_ptrs += (k_start // 8).to(tl.int64) * N
    if XTILE:  # the tile's sum of x from a [BLOCK_M, 128] load of its own, one ahead (GROUP >= 128)
        xt_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + tl.arange(0, 128)[None, :]
        xt_next = tl.load(xt_ptrs + k_start, mask=mask_m[:, None], other=0.0)
    for k0 in range(k_start, k_end, 128):
        q = tl.load(q_ptrs, mask=mask_n[:, None], other=0)
        q_ptrs += 16 * N
        if XTILE:
            xt = xt_next
            xt_next = tl.load(xt_ptrs + (k0 + 128), mask=mask_m[:, None] & (k0 + 128 < k_end), other=0.0)
        for j in tl.static_range(8):
            xj = tl.load(x_ptrs + (k0 + 16 * j), mask=mask_m[None, :], other=0.0)
            a = _nibble(q, xj, j, MAGIC, ASM)
            if DIRECT:
                if j % E == 0:  # the group's offset + zero (exact in halves) and scale, a column each
                    z, sc = _group_zero_scale(qz_ptr, s_ptr, (k0 + 16 * j) // GROUP, N8, N, offs_n, mask_n,
                                              zero_shift, OFFSET)
                    zo = z.to(xj.dtype)[:, None]
                    sc = sc.to(xj.dtype)[:, None]
                acc = tl.dot((a - zo) * sc, xj, acc)
            else:
                if j % E == 0:
                    part = tl.dot(a, xj)
                else:
                    part = tl.dot(a, xj, part)
                if XTILE:
                    if j == 7:
                        xs = tl.sum(xt.to(tl.float32), axis=1)[None, :]
                else:
                    ones = tl.full((BLOCK_N, 16), 1.0, xj.dtype)
                    if j % E == 0:
                        xs = tl.dot(ones, xj)  # every row: sum_k x (tensor cores idle here anyway)
                    else:
                        xs = tl.dot(ones, xj, xs)
                if (j + 1) % E == 0:
                    z, sc = _group_zero_scale(qz_ptr, s_ptr, (k0 + 16 * (j + 1 - E)) // GROUP, N8, N, offs_n,
                                              mask_n, zero_shift, OFFSET)
                    acc += sc[:, None] * (part - z[:, None] * xs)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    y = out_ptr + pid_k.to(tl.int64) * stride_os + offs_m.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
    tl.store(y, acc.to(out_ptr.dtype.element_ty), mask=mask_n[:, None] & mask_m[None, :])


@triton.jit
def _nat_dot(q, xj, part, J: tl.constexpr, FIRST: tl.constexpr, MAGIC: tl.constexpr, ASM: tl.constexpr):
    """The dot of nibble J of the natural-layout words q [P, 16] (outputs 8p + J) with x^T [16, BLOCK_M]."""
    a = _nibble(q, xj, J, MAGIC, ASM)
    if FIRST:
        return tl.dot(a, xj)
    else:
        return tl.dot(a, xj, part)


@triton.jit
def _nat_epilogue(acc, part, zw, xs, s_row, offs_p, mask_p, J: tl.constexpr, OFFSET: tl.constexpr):
    """acc += s * (part - (off + z) * sum x) for outputs 8p + J: zw [P] the group's zero words, s_row its scales."""
    z = ((zw >> (4 * J)) & 0xF).to(tl.float32) + OFFSET
    s = tl.load(s_row + offs_p * 8 + J, mask=mask_p, other=0.0).to(tl.float32)
    return acc + s[:, None] * (part - z[:, None] * xs)


@triton.jit(do_not_specialize=["M"])
def _awq_mma_natural_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, out_ptr,
    M, N, N8, K, K_SPLIT, stride_xm, stride_om, stride_os,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_M: tl.constexpr,
    MAGIC: tl.constexpr, OFFSET: tl.constexpr, ASM: tl.constexpr, XTILE: tl.constexpr, PDL: tl.constexpr = False,
):
    """The same tensor-core product on the natural layout (qweight [K, N / 8], 8 columns a word): a [BLOCK_P, 16]
    block of words (BLOCK_P packed columns, 16 rows of K) gives eight A operands, nibble j of every word being
    output 8p + j, so each j has its own accumulator [BLOCK_P, BLOCK_M] (8 * BLOCK_P outputs a program). No
    repacking: the one-row walk and this kernel read the same weight."""
    pdl.enter(PDL)
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    E: tl.constexpr = min(GROUP, 128) // 16
    offs_p = pid_n * BLOCK_P + tl.arange(0, BLOCK_P)
    mask_p = offs_p < N8
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_i = tl.arange(0, 16)
    q_ptrs = qw_ptr + offs_i.to(tl.int64)[None, :] * N8 + offs_p[:, None]  # [BLOCK_P, 16]
    x_ptrs = x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm + offs_i[:, None]  # [16, BLOCK_M]: x^T
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)
    acc0 = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    acc4 = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    acc5 = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    acc6 = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    acc7 = tl.zeros((BLOCK_P, BLOCK_M), dtype=tl.float32)
    part0 = acc0
    part1 = acc0
    part2 = acc0
    part3 = acc0
    part4 = acc0
    part5 = acc0
    part6 = acc0
    part7 = acc0
    q_ptrs += k_start.to(tl.int64) * N8
    if XTILE:
        xt_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + tl.arange(0, 128)[None, :]
        xt_next = tl.load(xt_ptrs + k_start, mask=mask_m[:, None], other=0.0)
    for k0 in range(k_start, k_end, 128):
        if XTILE:
            xt = xt_next
            xt_next = tl.load(xt_ptrs + (k0 + 128), mask=mask_m[:, None] & (k0 + 128 < k_end), other=0.0)
        for i in tl.static_range(8):
            q = tl.load(q_ptrs, mask=mask_p[:, None], other=0)
            q_ptrs += 16 * N8
            xj = tl.load(x_ptrs + (k0 + 16 * i), mask=mask_m[None, :], other=0.0)
            part0 = _nat_dot(q, xj, part0, 0, i % E == 0, MAGIC, ASM)
            part1 = _nat_dot(q, xj, part1, 1, i % E == 0, MAGIC, ASM)
            part2 = _nat_dot(q, xj, part2, 2, i % E == 0, MAGIC, ASM)
            part3 = _nat_dot(q, xj, part3, 3, i % E == 0, MAGIC, ASM)
            part4 = _nat_dot(q, xj, part4, 4, i % E == 0, MAGIC, ASM)
            part5 = _nat_dot(q, xj, part5, 5, i % E == 0, MAGIC, ASM)
            part6 = _nat_dot(q, xj, part6, 6, i % E == 0, MAGIC, ASM)
            part7 = _nat_dot(q, xj, part7, 7, i % E == 0, MAGIC, ASM)
            if XTILE:
                if i == 7:
                    xs = tl.sum(xt.to(tl.float32), axis=1)[None, :]
            else:
                ones = tl.full((BLOCK_P, 16), 1.0, xj.dtype)
                if i % E == 0:
                    xs = tl.dot(ones, xj)
                else:
                    xs = tl.dot(ones, xj, xs)
            if (i + 1) % E == 0:
                g = (k0 + 16 * (i + 1 - E)) // GROUP
                zw = tl.load(qz_ptr + g * N8 + offs_p, mask=mask_p, other=0)
                s_row = s_ptr + g * N
                acc0 = _nat_epilogue(acc0, part0, zw, xs, s_row, offs_p, mask_p, 0, OFFSET)
                acc1 = _nat_epilogue(acc1, part1, zw, xs, s_row, offs_p, mask_p, 1, OFFSET)
                acc2 = _nat_epilogue(acc2, part2, zw, xs, s_row, offs_p, mask_p, 2, OFFSET)
                acc3 = _nat_epilogue(acc3, part3, zw, xs, s_row, offs_p, mask_p, 3, OFFSET)
                acc4 = _nat_epilogue(acc4, part4, zw, xs, s_row, offs_p, mask_p, 4, OFFSET)
                acc5 = _nat_epilogue(acc5, part5, zw, xs, s_row, offs_p, mask_p, 5, OFFSET)
                acc6 = _nat_epilogue(acc6, part6, zw, xs, s_row, offs_p, mask_p, 6, OFFSET)
                acc7 = _nat_epilogue(acc7, part7, zw, xs, s_row, offs_p, mask_p, 7, OFFSET)
    out_rows = out_ptr + pid_k.to(tl.int64) * stride_os + offs_m.to(tl.int64)[None, :] * stride_om
    store_eight_positions(out_rows, b_ptr, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, offs_p, mask_p, mask_m,
                          HAS_BIAS)


@triton.jit
def _walk_slice(q, xj, xsum, magic, J: tl.constexpr):
    """sum_i v_J[n, i] x_J[i] for every column n: nibble J of the [BLOCK_N, 16] words (rows 16J.. of the tile)."""
    B: tl.constexpr = 12 + 4 * (J % 2)  # where the nibble now sits (the shifts serve two nibbles each)
    f = (nibble_at_12_or_16(q, J) | magic).to(tl.float32, bitcast=True)  # 2**23 + v 2**B
    return tl.sum(f * xj[None, :], axis=1) * (1.0 / (1 << B)) - xsum * (1 << (23 - B))


@triton.jit
def _kmajor_walk_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, out_ptr, y_ptr, cnt_ptr,
    N, N8, K, K_SPLIT, stride_xm, stride_om, stride_os, magic,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr,
    FINISH: tl.constexpr = False, FINISH_BIAS: tl.constexpr = False, FENCE: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """The one-row FMA walk on the K-major layout (a program per row, pid 0): BLOCK_N = VEC x 32 x num_warps columns
    along the lanes, a [BLOCK_N, 16] block of words a 128-row tile, its 16 rows inside each thread, so the sum over
    K stays in the thread. Nibble j of the block is rows 16j..16j+15 of the tile for every column: one SHF shared by
    two nibbles and one LOP3 put it under 2**23's exponent bits at bit b (12 or 16), the float 2**23 + v 2**b, one FFMA
    a value; the 2**23 x the slice's sum of x comes off per slice, the zero point and scale per group. FINISH:
    out_ptr holds fp32 partials and the tile's last split sums them into y_ptr (splits.finish_split)."""
    pdl.enter(PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    E: tl.constexpr = min(GROUP, 128) // 16
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = tl.max_contiguous(tl.multiple_of(offs_n, VEC), VEC)
    mask_n = offs_n < N
    offs_i = tl.arange(0, 16)
    q_ptrs = qw_ptr + offs_i.to(tl.int64)[None, :] * N + offs_n[:, None]  # [BLOCK_N, 16]
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    zero_shift = (offs_n % 8) * 4
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    q_ptrs += (k_start // 8).to(tl.int64) * N
    for k0 in range(k_start, k_end, 128):
        q = tl.load(q_ptrs, mask=mask_n[:, None], other=0).to(tl.uint32, bitcast=True)
        q_ptrs += 16 * N
        for j in tl.static_range(8):
            xj = tl.load(x_row + k0 + 16 * j + offs_i).to(tl.float32)  # [16], the same for every column
            xsum = tl.sum(xj, axis=0)
            dot = _walk_slice(q, xj, xsum, magic, j)
            if j % E == 0:
                part = dot
                xs = xsum
            else:
                part += dot
                xs += xsum
            if (j + 1) % E == 0:
                g = (k0 + 16 * (j + 1 - E)) // GROUP
                zw = tl.load(qz_ptr + g * N8 + offs_n // 8, mask=mask_n, other=0)
                z = ((zw >> zero_shift) & 0xF).to(tl.float32)
                s = tl.load(s_ptr + g * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
                acc += s * (part - z * xs)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    y = out_ptr + pid_k.to(tl.int64) * stride_os + pid_m.to(tl.int64) * stride_om + offs_n
    tl.store(y, acc.to(out_ptr.dtype.element_ty), mask=mask_n)
    if FINISH:
        finish_split(out_ptr, cnt_ptr, b_ptr, y_ptr, pid_m * tl.num_programs(1) + pid_n, pid_m, pid_n * BLOCK_N, N,
                     stride_os, tl.num_programs(2), BLOCK_N, FINISH_BIAS, FENCE)


def default_mma_config(m: int) -> tuple:
    """The config for m rows where no tuned one is known: 16-row tiles up to 16 rows, the direct variant's 32-row
    tiles up to MMA_MAX_ROWS, then dequant + cuBLAS."""
    if m <= 16:
        return MMA_CONFIGS[0]
    return DIRECT_DEFAULT if m <= MMA_MAX_ROWS else ("dequant",)


def _asm(device: torch.device) -> bool:
    """The PTX nibble path: compiled kernels on sm_90+ (measured there; the interpreter runs no PTX)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


# ("walk", BLOCK_N, num_warps, SPLIT_K): the one-row walk (a program per row), for 1-4 rows; SPLIT_K 0 picks it
# (4 or 8 columns a thread: 3.4 or 3.2 SASS instructions a value in an offline sm_90 compile, no spills)
WALK_CONFIGS = [("walk", 256, 2, 0), ("walk", 512, 4, 0), ("walk", 512, 2, 0), ("walk", 1024, 4, 0),
                ("walk", 256, 2, 4), ("walk", 512, 2, 4), ("walk", 256, 2, 8), ("walk", 128, 1, 0)]
WALK_MAX_ROWS = 4


def _plan_splits(x, y, k: int, group_size: int, scales, programs: int, split: int, sms_factor: int = 1):
    """(K rows a split, splits, where the kernel writes: y, or fp32 partials [splits, M, N] for sum_splits) for
    whole 128-row tiles; split 0 takes split_k's choice for `programs` programs (sms_factor: programs an SM / 2)."""
    m, n = y.shape
    k_tiles = k // KMAJOR_TILE
    if split == 0:
        groups = k // group_size
        weight_bytes = k * n // 2 + groups * n // 2 + groups * n * scales.element_size()
        split = split_k(programs, k_tiles, m * n * 4, weight_bytes, sms_factor * num_sms(x.device))
    k_split = triton.cdiv(k_tiles, max(1, min(split, k_tiles))) * KMAJOR_TILE
    split = triton.cdiv(k, k_split)  # no empty splits
    dst = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    return k_split, split, dst


def _launch_walk(x, qweight_k, qzeros, scales, group_size: int, bias, y, config: tuple) -> torch.Tensor:
    _, block_n, warps, split = config
    m, k = x.shape
    n = y.shape[1]
    block_n = min(block_n, max(32 * warps, triton.next_power_of_2(n)))
    vec = max(1, block_n // (32 * warps))
    tiles = triton.cdiv(n, block_n)
    k_split, split, dst = _plan_splits(x, y, k, group_size, scales, tiles * m, split, sms_factor=2)  # 4 an SM
    counters = split_counters(x.device, m * tiles) if split > 1 else None
    _kmajor_walk_kernel[(m, tiles, split)](
        x, qweight_k, qzeros, scales, bias if bias is not None else y, dst, y, counters if counters is not None else y,
        n, n // 8, k, k_split, x.stride(0), n, m * n, 0x4B000000, GROUP=group_size,
        HAS_BIAS=bias is not None and split == 1, BLOCK_N=block_n, VEC=vec, FINISH=counters is not None,
        FINISH_BIAS=bias is not None, FENCE=x.device.type == "cuda", num_warps=warps, num_stages=1,
        **pdl.launch_args(),
    )
    if split > 1 and counters is None:
        sum_splits(dst, bias, y)
    return y


def awq_mma_linear(x: torch.Tensor, qweight_k: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                   group_size: int, bias: torch.Tensor | None = None, config: tuple | None = None,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [K, N] (+ bias) -> [M, N] in x's dtype; w from the K-major qweight (pack_int4_kmajor) and the
    natural qzeros/scales. config: an MMA_CONFIGS or DIRECT_CONFIGS entry, a WALK_CONFIGS entry (up to
    WALK_MAX_ROWS rows) or ("dequant",); None takes default_mma_config's."""
    n, k = check_awq_kmajor_args(x, qweight_k, qzeros, scales, group_size, bias, "awq_mma_linear")
    if x.dtype not in _MAGIC:
        raise TypeError(f"awq_mma_linear: x must be float16 or bfloat16, got {x.dtype} (awq_kmajor_ref takes fp32)")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if not (qweight_k.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous()):
        raise ValueError("awq_mma_linear: qweight, qzeros and scales must be contiguous")
    y = output_buffer(x, n, out)
    m = x.shape[0]
    if m == 0:
        return y
    config = config if config is not None else default_mma_config(m)
    if config[0] == "dequant":
        w = dequantize_kmajor(qweight_k, qzeros, scales, group_size)
        return torch.matmul(x, w, out=y) if bias is None else torch.addmm(bias, x, w, out=y)
    if config[0] == "walk":
        return _launch_walk(x, qweight_k, qzeros, scales, group_size, bias, y, config)
    direct = config[0] == "direct"
    block_n, block_m, split, warps, stages = config[1:] if direct else config
    block_m = max(16, min(block_m, triton.next_power_of_2(m)))
    grid_n, grid_m = triton.cdiv(n, block_n), triton.cdiv(m, block_m)
    k_split, split, dst = _plan_splits(x, y, k, group_size, scales, grid_n * grid_m, split)
    magic, offset = _MAGIC[x.dtype]
    _awq_mma_kernel[(grid_n, grid_m, split)](
        x, qweight_k, qzeros, scales, bias if bias is not None else y, dst, m, n, n // 8, k, k_split,
        x.stride(0), n, m * n, GROUP=group_size, HAS_BIAS=bias is not None and split == 1,
        BLOCK_N=block_n, BLOCK_M=block_m, MAGIC=magic, OFFSET=offset, ASM=_asm(x.device),
        XTILE=group_size >= KMAJOR_TILE and not direct, DIRECT=direct, num_warps=warps, num_stages=stages,
        **pdl.launch_args(),
    )
    if split > 1:
        sum_splits(dst, bias, y)
    return y


# (BLOCK_P packed columns = 8 * BLOCK_P outputs, BLOCK_M, SPLIT_K, num_warps, num_stages) for the natural layout
NATURAL_CONFIGS = [(64, 16, 0, 4, 2), (64, 16, 0, 4, 3), (32, 16, 0, 4, 2), (64, 16, 4, 4, 2), (64, 64, 0, 8, 2),
                   (64, 128, 0, 8, 2)]


def awq_mma_natural(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                    group_size: int, bias: torch.Tensor | None = None, config: tuple | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """awq_linear's product (natural qweight int32 [K, N // 8]) on tensor cores: _awq_mma_natural_kernel.
    K % 128 == 0; x fp16 or bf16. config: a NATURAL_CONFIGS entry (default the first)."""
    n, k = check_awq_args(x, qweight, qzeros, scales, group_size, bias, "awq_mma_natural")
    if k % KMAJOR_TILE:
        raise ValueError(f"awq_mma_natural: K = {k} must be a multiple of {KMAJOR_TILE}")
    if x.dtype not in _MAGIC:
        raise TypeError(f"awq_mma_natural: x must be float16 or bfloat16, got {x.dtype}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    y = output_buffer(x, n, out)
    m = x.shape[0]
    if m == 0:
        return y
    block_p, block_m, split, warps, stages = config if config is not None else NATURAL_CONFIGS[0]
    block_m = max(16, min(block_m, triton.next_power_of_2(m)))
    n8 = n // 8
    grid_n, grid_m = triton.cdiv(n8, block_p), triton.cdiv(m, block_m)
    k_split, split, dst = _plan_splits(x, y, k, group_size, scales, grid_n * grid_m, split)
    magic, offset = _MAGIC[x.dtype]
    _awq_mma_natural_kernel[(grid_n, grid_m, split)](
        x, qweight, qzeros, scales, bias if bias is not None else y, dst, m, n, n8, k, k_split,
        x.stride(0), n, m * n, GROUP=group_size, HAS_BIAS=bias is not None and split == 1,
        BLOCK_P=block_p, BLOCK_M=block_m, MAGIC=magic, OFFSET=offset, ASM=_asm(x.device),
        XTILE=group_size >= KMAJOR_TILE, num_warps=warps, num_stages=stages, **pdl.launch_args(),
    )
    if split > 1:
        sum_splits(dst, bias, y)
    return y
