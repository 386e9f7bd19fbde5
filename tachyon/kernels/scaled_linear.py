"""8-bit weights and 8-bit activations (W8A8): fp8 E4M3 on Hopper's tensor cores, or SmoothQuant-style int8.

The math and the layouts are `quant_ref.py`'s (`scaled_linear_ref` is the oracle): weight [N, K] in
float8_e4m3fn or int8 with a float32 scale per output feature; each row of x quantized with its own scale
(max|x_row| / QMAX) or a static one, y = (x_q @ weight.T) * s_x * s_w + bias.

Paths, by rows, chosen per GPU model, layer shape and row bucket by `default_scaled_config` from the table that
`benchmarks/scaled_kernels.py --write-tuned` measures (tachyon/kernels/quant_tuned/<GPU>.json); without one, the
walk up to MAX_ROW_WALK_ROWS rows and cuBLAS above:
- up to MAX_ROW_WALK_ROWS (decode), one launch a layer, the time the weight's bytes over the memory bandwidth
  (one byte a weight, as int8 weight-only):
  "walk": `_w8a8_row_kernel`, a program per row and strip of output features that finds its row's scale (one
  pass over x, which is small), then walks K quantizing x in registers as the reference does and accumulating
  the 8-bit products in fp32 on the CUDA cores; "lwalk": the same, its sum over K reduced across threads once at
  the end rather than once per K tile;
  "dot": `_w8a8_dot_kernel`, all rows in one program per strip, weight tile @ x_q.T on tensor cores (rows padded
  to 16), so each x tile is quantized once per strip and the weight is read once whatever the rows;
  "qwalk", "qdot": the same after `_quantize_rows_kernel` (one more launch): no program reads x for its scale
  (the dot at 16 rows otherwise reads all 16 rows of x before its first weight byte).
- above (prefill, large batches): `_quantize_rows_kernel` writes x_q and its scales, then
  "cublas": fp8 through `torch._scaled_mm` (row-wise scales: s_x per row, s_w per column, bf16 out), int8 through
  `torch._int_mm` (int32 out) and `_int_epilogue_kernel` (scales, bias, cast); or
  "gemm": `_w8a8_gemm_kernel`, an 8-bit tensor-core GEMM with the scales and bias in its epilogue (the int32
  products never go to memory).
- "wo" at any rows where the table measured it fastest: the weight-only kernels of int8 weight-only
  (`quant_linear.weight8_linear`: the one-row FMA walk, or the weight tile cast to x's dtype for a tensor-core dot),
  x not quantized. The same weight bytes as the walk; no activation rounding, so its output is the weight-only
  product (`scaled_weight_only_ref`), nearer the unquantized layer than the W8A8 one. It exists because the
  quantizing kernels lose to it at 2-16 rows (H200: fp8 `dot` down_proj 16 rows 49.1 us, int8 weight-only 22.0).
Shapes the cuBLAS paths do not take (K or N not a multiple of 16, an fp16 or fp32 x for fp8) go through the
row walk at any number of rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tachyon.kernels import pdl
from tachyon.kernels.quant_linear import _int8_to_float, row_bucket, tuned_entry, tuned_key, weight8_linear
from tachyon.kernels.quant_ref import (  # noqa: F401
    SCALED_QMAX,
    check_scaled_args,
    quantize_rows_ref,
    scaled_linear_ref,
    scaled_weight_only_ref,
)
from tachyon.kernels.splits import finish_split, num_sms, output_buffer, split_counters, split_k, sum_splits

MAX_ROW_WALK_ROWS = 16  # up to this many rows a linear layer is bandwidth-bound: the row walk
ROW_WALK_CONFIG = ("walk", 16, 512, 4, 4)  # kind, BLOCK_N, BLOCK_K, num_warps, num_stages
WALK_KINDS = ("walk", "lwalk", "dot", "qwalk", "qdot")  # the small-rows kernels (`_row_walk`)
CUBLAS_CONFIG = ("cublas",)  # quantize_rows, then torch._scaled_mm (fp8) or torch._int_mm + _int_epilogue_kernel
# ("wo", BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages): x unquantized through the weight-only kernels
# (an INT8_CONFIGS entry after the kind; BLOCK_M 1 the FMA walk, a program per row; 16+ a tensor-core dot)
WO_SMALL_CONFIGS = [("wo", 1, 16, 512, 0, 4, 4), ("wo", 1, 8, 512, 0, 4, 4), ("wo", 16, 32, 256, 0, 4, 4),
                    ("wo", 16, 16, 512, 0, 4, 4), ("wo", 16, 64, 256, 0, 8, 3), ("wo", 16, 32, 512, 0, 4, 3),
                    ("wo", 16, 64, 128, 0, 4, 4)]
SMALL_CONFIGS = [("walk", 16, 512, 4, 4), ("walk", 8, 512, 4, 4), ("walk", 32, 256, 4, 4), ("walk", 16, 1024, 8, 3),
                 ("walk", 32, 512, 8, 3), ("walk", 64, 256, 8, 3), ("walk", 8, 2048, 8, 2), ("walk", 16, 2048, 8, 2),
                 ("lwalk", 16, 256, 4, 4), ("lwalk", 8, 512, 4, 4), ("lwalk", 32, 128, 4, 4), ("lwalk", 16, 512, 8, 3),
                 ("lwalk", 32, 256, 8, 3), ("qwalk", 32, 256, 4, 4), ("qwalk", 32, 512, 8, 3), ("qwalk", 16, 1024, 8, 3),
                 ("dot", 64, 128, 4, 4), ("dot", 64, 256, 4, 3), ("dot", 128, 128, 4, 3), ("dot", 32, 256, 4, 4),
                 ("dot", 128, 256, 8, 3), ("dot", 64, 512, 4, 3), ("qdot", 64, 128, 4, 4), ("qdot", 64, 256, 4, 3),
                 ("qdot", 128, 128, 4, 3), ("qdot", 32, 256, 4, 4), ("qdot", 128, 256, 8, 3), ("qdot", 64, 512, 4, 4),
                 ("qdot", 128, 512, 8, 2)] + WO_SMALL_CONFIGS
# above MAX_ROW_WALK_ROWS: cuBLAS or the fused GEMM ("gemm", BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages),
# or the weight-only dot
GEMM_CONFIGS = [CUBLAS_CONFIG, ("gemm", 32, 128, 128, 4, 4), ("gemm", 64, 128, 128, 4, 4), ("gemm", 64, 256, 128, 8, 3),
                ("gemm", 128, 128, 128, 8, 3), ("gemm", 128, 256, 128, 8, 3), ("gemm", 16, 128, 256, 4, 4),
                ("wo", 32, 64, 256, 0, 4, 3), ("wo", 64, 64, 128, 0, 4, 4), ("wo", 64, 128, 128, 0, 4, 3)]
QUANTIZE_ONE_TILE = 16384  # rows up to this long are quantized from registers (at most 32 fp32 a thread)
_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2**23: (v + it) - it rounds |v| < 2**22 to the nearest even integer


def default_scaled_config(x: torch.Tensor, weight: torch.Tensor) -> tuple:
    """The config for x's rows: the one `benchmarks/scaled_kernels.py --write-tuned` measured fastest for this GPU
    model, layer shape and row bucket (tachyon/kernels/quant_tuned/), else the row walk up to MAX_ROW_WALK_ROWS
    rows and cuBLAS above (the row walk where cuBLAS does not take the shape: see `cublas_takes`)."""
    m = x.shape[0]
    if weight.is_cuda:
        fmt = "fp8" if weight.dtype == torch.float8_e4m3fn else "w8a8"
        cfg = tuned_entry(weight.device, fmt, row_bucket(m), tuned_key(*weight.shape))
        if cfg is not None and (cfg[0] != "cublas" or cublas_takes(x, weight)) and (
                cfg[0] not in ("dot", "qdot") or m <= MAX_ROW_WALK_ROWS):
            return cfg
    return CUBLAS_CONFIG if m > MAX_ROW_WALK_ROWS and cublas_takes(x, weight) else ROW_WALK_CONFIG


@triton.jit
def _quantize(v, FP8: tl.constexpr, QMAX: tl.constexpr):
    """x / s_x -> its 8-bit value, as fp32 (E4M3: saturate and round to nearest; int8: round half even, clamp)."""
    v = tl.minimum(tl.maximum(v, -QMAX), QMAX)
    if FP8:
        return v.to(tl.float8e4nv).to(tl.float32)
    return (v + _ROUND) - _ROUND


@triton.jit
def _quantize8(v, FP8: tl.constexpr, QMAX: tl.constexpr):
    """x / s_x -> its 8-bit value in the 8-bit type itself (E4M3 or int8), for tensor-core dots."""
    v = tl.minimum(tl.maximum(v, -QMAX), QMAX)
    if FP8:  # (an else, not a fall-through: Triton types every return it reaches, and these two differ)
        q = v.to(tl.float8e4nv)
    else:
        q = ((v + _ROUND) - _ROUND).to(tl.int8)
    return q


@triton.jit(do_not_specialize=["M"])
def _w8a8_dot_kernel(
    x_ptr, w_ptr, ws_ptr, xs_ptr, b_ptr, out_ptr,
    M, N, K, K_SPLIT, stride_xm, stride_om, stride_os,
    FP8: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREQ: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """All M <= BLOCK_M rows in one program per strip of output features: W [BLOCK_N, BLOCK_K] @ x_q.T
    [BLOCK_K, BLOCK_M] on tensor cores (the weight is the MMA's wide operand, the rows its narrow one), int32
    accumulation for int8 (exact), fp32 for fp8. Each program finds its rows' scales, then quantizes each x tile
    once, shared by BLOCK_N outputs. PREQ: x is already quantized (`quantize_rows`) and xs_ptr holds its [M]
    scales, so no program reads the rows twice for their scales."""
    pdl.enter(PDL)
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    if PREQ:
        s_x = tl.load(xs_ptr + offs_m, mask=mask_m, other=1.0)
    elif STATIC:
        s_x = tl.load(xs_ptr) + tl.zeros((BLOCK_M,), dtype=tl.float32)
    else:
        amax = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xm = mask_m[:, None] & (k0 + offs_k < K)[None, :]
            amax = tl.maximum(amax, tl.abs(tl.load(x_rows + k0 + offs_k[None, :], mask=xm, other=0.0).to(tl.float32)))
        s_x = tl.maximum(tl.max(amax, axis=1), 1e-12) / QMAX
    inv = 1.0 / s_x
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32 if FP8 else tl.int32)
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        if PREQ:
            xq = tl.load(x_rows + kk[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        else:
            x = tl.load(x_rows + kk[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0).to(tl.float32)
            xq = _quantize8(x * inv[:, None], FP8, QMAX)
        acc = tl.dot(w, tl.trans(xq), acc, out_dtype=acc.dtype)
    y = acc.to(tl.float32) * tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)[:, None] * s_x[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    out = out_ptr + pid_k.to(tl.int64) * stride_os + offs_m.to(tl.int64)[None, :] * stride_om + offs_n[:, None]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask_m[None, :] & mask_n[:, None])


@triton.jit
def _w8a8_row_kernel(
    x_ptr, w_ptr, ws_ptr, xs_ptr, b_ptr, out_ptr, y_ptr, cnt_ptr,
    N, K, K_SPLIT, stride_xm, stride_om, stride_os,
    FP8: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AMAX_BLOCK: tl.constexpr, LATE_REDUCE: tl.constexpr,
    PREQ: tl.constexpr = False, FINISH: tl.constexpr = False, FINISH_BIAS: tl.constexpr = False,
    FENCE: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """One row and a strip of BLOCK_N output features per program (a K range of it when K is split). The row's
    scale comes first: max|x_row| in AMAX_BLOCK-wide loads (x is in L2, so few wide loads beat many serial ones
    before the first weight byte is asked for). LATE_REDUCE keeps a [BLOCK_N, BLOCK_K] fp32 sum and reduces it
    across threads once, after the walk, instead of once per K tile. PREQ: x is already quantized
    (`quantize_rows`) and xs_ptr holds its [M] scales: the walk starts with the weight. FINISH: out_ptr holds fp32
    partials and the tile's last split sums them into y_ptr (splits.finish_split)."""
    pdl.enter(PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    offs_k = tl.arange(0, BLOCK_K)
    if PREQ:
        s_x = tl.load(xs_ptr + pid_m)
    elif STATIC:
        s_x = tl.load(xs_ptr)
    else:  # max|x_row| / QMAX (at least 1e-12 / QMAX)
        offs_a = tl.arange(0, AMAX_BLOCK)
        amax = tl.zeros((AMAX_BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, AMAX_BLOCK):
            amax = tl.maximum(amax, tl.abs(tl.load(x_row + k0 + offs_a, mask=k0 + offs_a < K, other=0.0).to(tl.float32)))
        s_x = tl.maximum(tl.max(amax, axis=0), 1e-12) / QMAX
    inv = 1.0 / s_x  # one division a program, a multiply an element
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if LATE_REDUCE:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        if PREQ:
            xq = tl.load(x_row + kk, mask=mask_k, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_row + kk, mask=mask_k, other=0.0).to(tl.float32)
            xq = _quantize(x * inv, FP8, QMAX)
        w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        wf = w.to(tl.float32) if FP8 else _int8_to_float(w)
        if LATE_REDUCE:
            acc2 += wf * xq[None, :]
        else:
            acc += tl.sum(wf * xq[None, :], axis=1)
    if LATE_REDUCE:
        acc = tl.sum(acc2, axis=1)
    acc = acc * (tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0) * s_x)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    out = out_ptr + pid_k.to(tl.int64) * stride_os + pid_m.to(tl.int64) * stride_om
    tl.store(out + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)
    if FINISH:
        finish_split(out_ptr, cnt_ptr, b_ptr, y_ptr, pid_m * tl.num_programs(1) + pid_n, pid_m, pid_n * BLOCK_N, N,
                     stride_os, tl.num_programs(2), BLOCK_N, FINISH_BIAS, FENCE)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, xs_out_ptr, xs_in_ptr, K, stride_xm,
                          FP8: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr, BLOCK_K: tl.constexpr,
                          ONE_TILE: tl.constexpr = False, PDL: tl.constexpr = False):
    """A program per row: its scale (max|x| / QMAX, or the static one) and its 8-bit values. ONE_TILE: the row
    fits one BLOCK_K load (K <= QUANTIZE_ONE_TILE), so it is read once."""
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    offs = tl.arange(0, BLOCK_K)
    if ONE_TILE:  # the row in registers: one load for its scale and its values
        mask = offs < K
        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
        if STATIC:
            s_x = tl.load(xs_in_ptr)
        else:
            s_x = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / QMAX
        tl.store(q_ptr + row * K + offs, _quantize(x / s_x, FP8, QMAX).to(q_ptr.dtype.element_ty), mask=mask)
    else:
        if STATIC:
            s_x = tl.load(xs_in_ptr)
        else:  # as _w8a8_row_kernel's
            amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                amax = tl.maximum(amax, tl.abs(tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32)))
            s_x = tl.maximum(tl.max(amax, axis=0), 1e-12) / QMAX
        for k0 in range(0, K, BLOCK_K):
            mask = k0 + offs < K
            x = tl.load(x_row + k0 + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(q_ptr + row * K + k0 + offs, _quantize(x / s_x, FP8, QMAX).to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(xs_out_ptr + row, s_x)


@triton.jit(do_not_specialize=["M"])
def _int_epilogue_kernel(acc_ptr, xs_ptr, ws_ptr, b_ptr, out_ptr, M, N, HAS_BIAS: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    idx = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    acc = tl.load(acc_ptr + idx, mask=mask, other=0).to(tl.float32)
    acc = acc * tl.load(xs_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    acc = acc * tl.load(ws_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + idx, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M"])
def _w8a8_gemm_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, b_ptr, out_ptr, M, N, K,
                      FP8: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PDL: tl.constexpr = False):
    """out [M, N] = (x_q [M, K] @ W [N, K].T) * s_x[:, None] * s_w[None, :] (+ bias), x_q already quantized
    (`quantize_rows`): an 8-bit tensor-core GEMM with the scales in its epilogue, so the int32 products never go
    to memory (torch._int_mm writes them, and a second kernel reads them back). Tiles in groups of GROUP_M rows
    of tiles, so neighbouring programs share weight tiles in L2."""
    pdl.enter(PDL)
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % rows
    pid_n = (pid % (GROUP_M * tiles_n)) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < N
    a_ptrs = xq_ptr + offs_m.to(tl.int64)[:, None] * K + offs_k[None, :]
    b_ptrs = w_ptr + offs_n.to(tl.int64)[None, :] * K + offs_k[:, None]  # [BLOCK_K, BLOCK_N], K-major
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32 if FP8 else tl.int32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = k0 + offs_k < K
        a = tl.load(a_ptrs + k0, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs + k0, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, out_dtype=acc.dtype)
    y = acc.to(tl.float32) * tl.load(xs_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
    y = y * tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def quantize_rows(x: torch.Tensor, qtype: torch.dtype, input_scale: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_q [M, K] in qtype, fp32 scales [M]), as quantize_rows_ref, in one launch."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    q = torch.empty(m, k, dtype=qtype, device=x.device)
    xs = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        one = k <= QUANTIZE_ONE_TILE
        block_k = triton.next_power_of_2(k) if one else 1024
        _quantize_rows_kernel[(m,)](x, q, xs, input_scale if input_scale is not None else xs, k, x.stride(0),
                                    FP8=qtype == torch.float8_e4m3fn, QMAX=SCALED_QMAX[qtype],
                                    STATIC=input_scale is not None, BLOCK_K=block_k, ONE_TILE=one,
                                    num_warps=max(4, min(16, block_k // 1024)), **pdl.launch_args())
    return q, xs


def _row_walk(x, weight, weight_scale, bias, input_scale, y, config: tuple, pre=None) -> torch.Tensor:
    """Up to MAX_ROW_WALK_ROWS rows (any number with a walk config): config (kind, BLOCK_N, BLOCK_K, num_warps,
    num_stages), kind one of WALK_KINDS; a bare 4-tuple is a "walk" one. "lwalk" is the walk with LATE_REDUCE;
    "qwalk" and "qdot" quantize the rows first (`quantize_rows`, one launch, unless `pre` holds them) and then
    walk or dot the 8-bit rows."""
    kind, block_n, block_k, warps, stages = config if len(config) == 5 else ("walk", *config)
    dot = kind in ("dot", "qdot") and x.shape[0] <= MAX_ROW_WALK_ROWS
    preq = kind in ("qwalk", "qdot")
    m, k = x.shape
    n = weight.shape[0]
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    block_k = min(block_k, max(32 if dot else 16, triton.next_power_of_2(k)))
    k_tiles = triton.cdiv(k, block_k)
    tiles = triton.cdiv(n, block_n)
    programs = tiles if dot else m * tiles
    split = split_k(programs, k_tiles, m * n * 4, n * k, num_sms(x.device))
    k_split = triton.cdiv(k_tiles, split) * block_k
    split = triton.cdiv(k, k_split)
    dst = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    if preq:
        x, xs = pre if pre is not None else quantize_rows(x, weight.dtype, input_scale)
    else:
        xs = input_scale if input_scale is not None else weight_scale
    args = (x, weight, weight_scale, xs, bias if bias is not None else y, dst)
    meta = dict(FP8=weight.dtype == torch.float8_e4m3fn, QMAX=SCALED_QMAX[weight.dtype],
                STATIC=input_scale is not None and not preq, HAS_BIAS=bias is not None and split == 1,
                BLOCK_N=block_n, BLOCK_K=block_k, PREQ=preq, num_warps=warps, num_stages=stages, **pdl.launch_args())
    if dot:
        _w8a8_dot_kernel[(tiles, split)](*args, m, n, k, k_split, x.stride(0), n, m * n,
                                         BLOCK_M=MAX_ROW_WALK_ROWS, **meta)
    else:  # the scale's loads: 16 elements a thread, as wide as x's row (a power of 2)
        amax_block = min(triton.next_power_of_2(k), max(block_k, 16 * 32 * warps))
        counters = split_counters(x.device, m * tiles) if split > 1 else None
        _w8a8_row_kernel[(m, tiles, split)](*args, y, counters if counters is not None else y, n, k, k_split,
                                            x.stride(0), n, m * n, AMAX_BLOCK=amax_block,
                                            LATE_REDUCE=kind == "lwalk", FINISH=counters is not None,
                                            FINISH_BIAS=bias is not None, FENCE=x.device.type == "cuda", **meta)
        if counters is not None:
            return y
    if split > 1:
        sum_splits(dst, bias, y)
    return y


def cublas_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether cuBLAS (row-wise fp8 `_scaled_mm`, `_int_mm`) takes these shapes and dtypes: K and N multiples of
    16; fp8 with bf16 activations (its row-wise scales give bf16 out) at any rows, int8 above 16 rows (`_int_mm`'s
    least). Up to MAX_ROW_WALK_ROWS rows fp8 goes to cuBLAS only where the tuned table measured it faster."""
    m, k = x.shape
    n = weight.shape[0]
    if not x.is_cuda or k % 16 or n % 16:
        return False
    if weight.dtype == torch.int8:
        return m > MAX_ROW_WALK_ROWS
    return x.dtype == torch.bfloat16


def gemm_path(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x's rows are quantized first and then multiplied (cuBLAS or the fused GEMM), rather than walked."""
    return default_scaled_config(x, weight)[0] in ("cublas", "gemm")


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None,
                  config: tuple | None = None, out: torch.Tensor | None = None, force_walk: bool = False,
                  pre: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """x [M, K] @ W8A8 weight [N, K] (+ bias) -> [M, N] in x's dtype (the module docstring has the paths).
    config: a SMALL_CONFIGS or GEMM_CONFIGS entry (default: `default_scaled_config`; a bare 4-tuple is a "walk"
    one); force_walk: the small-rows path at any M (config, else ROW_WALK_CONFIG; a "dot" config serves up to
    MAX_ROW_WALK_ROWS rows, the walk above). pre: x's rows already quantized, (`quantize_rows(x, weight.dtype,
    input_scale)`'s q and scales, which a fused producer wrote): the paths that quantize first take them."""
    n, k = check_scaled_args(x, weight, weight_scale, bias, input_scale, "scaled_linear")
    if pre is not None and (pre[0].dtype != weight.dtype or pre[0].shape != x.shape or pre[1].shape != x.shape[:1]):
        raise ValueError(f"scaled_linear: pre holds {pre[0].dtype} {tuple(pre[0].shape)} rows and "
                         f"{tuple(pre[1].shape)} scales; x {tuple(x.shape)} and a {weight.dtype} weight need "
                         f"{weight.dtype} {tuple(x.shape)} and ({x.shape[0]},)")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if not (weight.is_contiguous() and weight_scale.is_contiguous()):
        raise ValueError("scaled_linear: weight and weight_scale must be contiguous")
    m = x.shape[0]
    if force_walk:
        config = config or ROW_WALK_CONFIG
    elif config is None:
        config = default_scaled_config(x, weight)
    elif config[0] == "cublas" and not cublas_takes(x, weight):
        raise ValueError(f"scaled_linear: cuBLAS does not take {m} rows of {x.dtype} x {weight.dtype} [{n}, {k}]")
    kind = config[0] if isinstance(config[0], str) else "walk"
    y = output_buffer(x, n, out) if kind != "cublas" or out is not None or weight.dtype == torch.int8 else None
    if m == 0:
        return y
    if kind == "wo":
        return weight8_linear(x, weight, weight_scale, bias, y, config[1:])
    if kind in WALK_KINDS:
        return _row_walk(x, weight, weight_scale, bias, input_scale, y, config, pre)
    xq, xs = pre if pre is not None else quantize_rows(x, weight.dtype, input_scale)
    if kind == "gemm":
        _, block_m, block_n, block_k, warps, stages = config
        grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
        _w8a8_gemm_kernel[grid](xq, xs, weight, weight_scale, bias if bias is not None else y, y, m, n, k,
                                FP8=weight.dtype == torch.float8_e4m3fn, HAS_BIAS=bias is not None,
                                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=min(block_k, max(32, triton.next_power_of_2(k))),
                                GROUP_M=8, num_warps=warps, num_stages=stages, **pdl.launch_args())
        return y
    if weight.dtype == torch.float8_e4m3fn:
        r = torch._scaled_mm(xq, weight.t(), scale_a=xs[:, None], scale_b=weight_scale[None, :],
                             out_dtype=torch.bfloat16)
        if bias is not None:
            r += bias
        if out is None:
            return r
        return y.copy_(r)
    acc = torch._int_mm(xq, weight.t())
    block_m, block_n = 32, 128
    _int_epilogue_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
        acc, xs, weight_scale, bias if bias is not None else y, y, m, n, HAS_BIAS=bias is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, **pdl.launch_args())
    return y
