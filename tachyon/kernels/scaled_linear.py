"""8-bit weights and 8-bit activations (W8A8): fp8 E4M3 on Hopper's tensor cores, or SmoothQuant-style int8.

The math and the layouts are `quant_ref.py`'s (`scaled_linear_ref` is the oracle): weight [N, K] in
float8_e4m3fn or int8 with a float32 scale per output feature; each row of x quantized with its own scale
(max|x_row| / QMAX) or a static one, y = (x_q @ weight.T) * s_x * s_w + bias.

Two paths, by rows:
- up to MAX_ROW_WALK_ROWS (decode): `_w8a8_row_kernel`, a program per row and strip of output features that
  finds its row's scale (one pass over x, which is small), then walks K quantizing x in registers exactly as
  the reference does and accumulating the 8-bit products in fp32. One launch a layer; the time is the weight's
  bytes over the memory bandwidth (one byte a weight, as int8 weight-only).
- above (prefill, large batches): `_quantize_rows_kernel` writes x_q and its scales, then the GEMM runs on tensor
  cores: fp8 through `torch._scaled_mm` (row-wise scales: s_x per row, s_w per column, bf16 out), int8 through
  `torch._int_mm` (int32 out) and `_int_epilogue_kernel` (scales, bias, cast).
Shapes the cuBLAS paths do not take (K or N not a multiple of 16, an fp16 or fp32 x for fp8) go through the
row walk at any number of rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tachyon.kernels import pdl
from tachyon.kernels.quant_linear import _int8_to_float, _num_sms, _output, _sum_splits, split_k
from tachyon.kernels.quant_ref import SCALED_QMAX, check_scaled_args, quantize_rows_ref, scaled_linear_ref  # noqa: F401

MAX_ROW_WALK_ROWS = 16  # up to this many rows a linear layer is bandwidth-bound: the row walk
ROW_WALK_CONFIG = (16, 512, 4, 4)  # BLOCK_N, BLOCK_K, num_warps, num_stages
_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2**23: (v + it) - it rounds |v| < 2**22 to the nearest even integer


@triton.jit
def _quantize(v, FP8: tl.constexpr, QMAX: tl.constexpr):
    """x / s_x -> its 8-bit value, as fp32 (E4M3: saturate and round to nearest; int8: round half even, clamp)."""
    v = tl.minimum(tl.maximum(v, -QMAX), QMAX)
    if FP8:
        return v.to(tl.float8e4nv).to(tl.float32)
    return (v + _ROUND) - _ROUND


@triton.jit
def _w8a8_row_kernel(
    x_ptr, w_ptr, ws_ptr, xs_ptr, b_ptr, out_ptr,
    N, K, K_SPLIT, stride_xm, stride_om, stride_os,
    FP8: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    offs_k = tl.arange(0, BLOCK_K)
    if STATIC:
        s_x = tl.load(xs_ptr)
    else:  # max|x_row| / QMAX (at least 1e-12 / QMAX)
        amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            amax = tl.maximum(amax, tl.abs(tl.load(x_row + k0 + offs_k, mask=k0 + offs_k < K, other=0.0).to(tl.float32)))
        s_x = tl.maximum(tl.max(amax, axis=0), 1e-12) / QMAX
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + offs_k
        mask_k = kk < K
        x = tl.load(x_row + kk, mask=mask_k, other=0.0).to(tl.float32)
        xq = _quantize(x / s_x, FP8, QMAX)
        w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
        wf = w.to(tl.float32) if FP8 else _int8_to_float(w)
        acc += tl.sum(wf * xq[None, :], axis=1)
    acc = acc * (tl.load(ws_ptr + offs_n, mask=mask_n, other=0.0) * s_x)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    out = out_ptr + pid_k.to(tl.int64) * stride_os + pid_m.to(tl.int64) * stride_om
    tl.store(out + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, xs_out_ptr, xs_in_ptr, K, stride_xm,
                          FP8: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr, BLOCK_K: tl.constexpr,
                          PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    offs = tl.arange(0, BLOCK_K)
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


@triton.jit
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


def quantize_rows(x: torch.Tensor, qtype: torch.dtype, input_scale: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_q [M, K] in qtype, fp32 scales [M]), as quantize_rows_ref, in one launch."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    q = torch.empty(m, k, dtype=qtype, device=x.device)
    xs = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        _quantize_rows_kernel[(m,)](x, q, xs, input_scale if input_scale is not None else xs, k, x.stride(0),
                                    FP8=qtype == torch.float8_e4m3fn, QMAX=SCALED_QMAX[qtype],
                                    STATIC=input_scale is not None, BLOCK_K=min(1024, triton.next_power_of_2(k)),
                                    num_warps=4, **pdl.launch_args())
    return q, xs


def _row_walk(x, weight, weight_scale, bias, input_scale, y, config: tuple) -> torch.Tensor:
    block_n, block_k, warps, stages = config
    m, k = x.shape
    n = weight.shape[0]
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    block_k = min(block_k, max(16, triton.next_power_of_2(k)))
    k_tiles = triton.cdiv(k, block_k)
    tiles = triton.cdiv(n, block_n)
    split = split_k(m * tiles, k_tiles, m * n * 4, n * k, _num_sms(x.device))
    k_split = triton.cdiv(k_tiles, split) * block_k
    split = triton.cdiv(k, k_split)
    dst = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    _w8a8_row_kernel[(m, tiles, split)](
        x, weight, weight_scale, input_scale if input_scale is not None else weight_scale,
        bias if bias is not None else y, dst, n, k, k_split, x.stride(0), n, m * n,
        FP8=weight.dtype == torch.float8_e4m3fn, QMAX=SCALED_QMAX[weight.dtype], STATIC=input_scale is not None,
        HAS_BIAS=bias is not None and split == 1, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=warps, num_stages=stages, **pdl.launch_args(),
    )
    if split > 1:
        _sum_splits(dst, bias, y)
    return y


def gemm_path(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x's rows go through cuBLAS (row-wise fp8 `_scaled_mm`, `_int_mm`) rather than the row walk."""
    m, k = x.shape
    n = weight.shape[0]
    if m <= MAX_ROW_WALK_ROWS or not x.is_cuda or k % 16 or n % 16:
        return False
    return weight.dtype == torch.int8 or x.dtype == torch.bfloat16


def scaled_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None,
                  config: tuple | None = None, out: torch.Tensor | None = None, force_walk: bool = False
                  ) -> torch.Tensor:
    """x [M, K] @ W8A8 weight [N, K] (+ bias) -> [M, N] in x's dtype (the module docstring has the paths).
    config: the row walk's (BLOCK_N, BLOCK_K, num_warps, num_stages); force_walk: the row walk at any M."""
    n, k = check_scaled_args(x, weight, weight_scale, bias, input_scale, "scaled_linear")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if not (weight.is_contiguous() and weight_scale.is_contiguous()):
        raise ValueError("scaled_linear: weight and weight_scale must be contiguous")
    m = x.shape[0]
    walk = force_walk or not gemm_path(x, weight)
    y = _output(x, n, out) if walk or out is not None or weight.dtype == torch.int8 else None
    if m == 0:
        return y
    if walk:
        return _row_walk(x, weight, weight_scale, bias, input_scale, y, config or ROW_WALK_CONFIG)
    xq, xs = quantize_rows(x, weight.dtype, input_scale)
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
