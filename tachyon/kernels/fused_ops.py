"""Small memory-bound fusions: residual add + RMSNorm, SiLU-and-mul, rotary embedding.

Each matches its torch reference in tachyon/layers (norm.py, activation.py, rotary.py) rounding for rounding:
intermediate results are cast to the storage dtype wherever the reference materialises a tensor.

The norm and SiLU-and-mul may also quantize their output rows for the fp8/w8a8 linear that reads them
(`*_quant`): the same 8-bit values and scales as `scaled_linear.quantize_rows` of their output, written by the
program that holds the row anyway, so the linear skips that launch and that read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tachyon.kernels import pdl
from tachyon.kernels.kv_write import to_cache
from tachyon.kernels.quant_ref import SCALED_QMAX
from tachyon.kernels.scaled_linear import QUANTIZE_ONE_TILE, _quantize, quantize_rows

_TORCH_TO_TL = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


# ---------------------------------------------------------------------------------------------- RMSNorm


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr,
    stride_x, stride_res, stride_out, stride_new_res,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, X_DTYPE: tl.constexpr, BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
    q_ptr=None, xs_out_ptr=None, xs_in_ptr=None, QUANT: tl.constexpr = False, FP8: tl.constexpr = False,
    QMAX: tl.constexpr = 127.0, STATIC: tl.constexpr = False,
):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X_DTYPE)  # the reference materialises x + residual
        tl.store(new_res_ptr + row * stride_new_res + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * rstd).to(X_DTYPE).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (w * normed).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, y, mask=mask)
    if QUANT:
        _quantize_row(y.to(tl.float32), q_ptr + row * n_cols + cols, mask, xs_out_ptr + row, xs_in_ptr,
                      FP8, QMAX, STATIC)


@triton.jit
def _quantize_row(y, q_row, mask, xs_out, xs_in, FP8: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr):
    """A whole row held in registers (fp32, masked lanes 0) -> its 8-bit values and scale, as
    `_quantize_rows_kernel` computes them from the stored row."""
    if STATIC:
        s_x = tl.load(xs_in)
    else:
        s_x = tl.maximum(tl.max(tl.abs(y), axis=0), 1e-12) / QMAX
    tl.store(q_row, _quantize(y / s_x, FP8, QMAX).to(q_row.dtype.element_ty), mask=mask)
    tl.store(xs_out, s_x)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                       quant: tuple[torch.dtype, torch.Tensor | None] | None = None):
    """Same contract as `RMSNorm.forward`: residual None -> (norm(x), None); else (norm(x + res), x + res).
    quant (qtype, static input scale or None): the output's rows quantized too, returned third as (q, scales)
    (`quantize_rows` of the output, for a 2-D x)."""
    shape = x.shape
    H = shape[-1]
    x2 = x.reshape(-1, H)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    res_dtype = x.dtype if residual is None else torch.promote_types(x.dtype, residual.dtype)
    out = torch.empty(shape, dtype=torch.promote_types(weight.dtype, res_dtype), device=x.device)
    out2 = out.view(-1, H)
    if residual is None:
        res2 = new_res2 = x2  # unused
        new_res = None
    else:
        res2 = residual.reshape(-1, H)
        if res2.stride(-1) != 1:
            res2 = res2.contiguous()
        new_res = torch.empty(shape, dtype=res_dtype, device=x.device)
        new_res2 = new_res.view(-1, H)
    qargs = {}
    if quant is not None:
        qtype, input_scale = quant
        q = torch.empty(rows, H, dtype=qtype, device=x.device)
        xs = torch.empty(rows, dtype=torch.float32, device=x.device)
        qargs = dict(q_ptr=q, xs_out_ptr=xs, xs_in_ptr=input_scale if input_scale is not None else xs, QUANT=True,
                     FP8=qtype == torch.float8_e4m3fn, QMAX=SCALED_QMAX[qtype], STATIC=input_scale is not None)
    if rows:
        block = triton.next_power_of_2(H)
        _add_rms_norm_kernel[(rows,)](
            x2, res2, weight, out2, new_res2,
            x2.stride(0), res2.stride(0), out2.stride(0), new_res2.stride(0),
            H, eps,
            HAS_RESIDUAL=residual is not None, X_DTYPE=_TORCH_TO_TL[res_dtype], BLOCK=block,
            num_warps=min(max(block // 256, 1), 16), **pdl.launch_args(), **qargs,
        )
    if quant is None:
        return out, new_res
    return out, new_res, (q, xs)


# ---------------------------------------------------------------------------------------------- SiLU


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_out, d, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)  # F.silu rounds here
    tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x = [gate | up] along the last dim -> silu(gate) * up."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    out2 = out.view(-1, d)
    if x2.shape[0] == 0:
        return out
    block = min(triton.next_power_of_2(d), 1024)
    _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(d, block))](
        x2, out2, x2.stride(0), out2.stride(0), d, BLOCK=block, num_warps=4, **pdl.launch_args(),
    )
    return out


@triton.jit
def _silu_and_mul_quant_kernel(x_ptr, out_ptr, q_ptr, xs_out_ptr, xs_in_ptr, stride_x, stride_out, d,
                               FP8: tl.constexpr, QMAX: tl.constexpr, STATIC: tl.constexpr, BLOCK: tl.constexpr,
                               PDL: tl.constexpr = False):
    """A program per row, the whole row at once (d <= QUANTIZE_ONE_TILE): silu(gate) * up as
    `_silu_and_mul_kernel`, and its 8-bit values and scale."""
    pdl.enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + d + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
    y = (act * up).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, y, mask=mask)
    _quantize_row(y.to(tl.float32), q_ptr + row * d + cols, mask, xs_out_ptr + row, xs_in_ptr, FP8, QMAX, STATIC)


def silu_and_mul_quant(x: torch.Tensor, qtype: torch.dtype, input_scale: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """x [M, 2d] -> (silu(gate) * up [M, d], (its rows quantized to qtype [M, d], fp32 scales [M])): one launch
    for rows up to QUANTIZE_ONE_TILE long, else `silu_and_mul` and then `quantize_rows`."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if d > QUANTIZE_ONE_TILE:
        out = silu_and_mul(x2)
        return out, quantize_rows(out, qtype, input_scale)
    m = x2.shape[0]
    out = torch.empty(m, d, dtype=x.dtype, device=x.device)
    q = torch.empty(m, d, dtype=qtype, device=x.device)
    xs = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        block = triton.next_power_of_2(d)
        _silu_and_mul_quant_kernel[(m,)](
            x2, out, q, xs, input_scale if input_scale is not None else xs, x2.stride(0), out.stride(0), d,
            FP8=qtype == torch.float8_e4m3fn, QMAX=SCALED_QMAX[qtype], STATIC=input_scale is not None, BLOCK=block,
            num_warps=max(4, min(16, block // 1024)), **pdl.launch_args())
    return out, (q, xs)


# ---------------------------------------------------------------------------------------------- rotary


@triton.jit
def _rotate(x_ptr, stride_t, stride_h, t, cos, sin, num_heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    """Rotate all heads of token t in place: [x1 | x2] -> [x1 c - x2 s | x2 c + x1 s]. Returns the two
    rotated halves as stored ([BLOCK_H, HALF] each, in x's dtype)."""
    h = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, HALF)[None, :]
    mask = h < num_heads
    p1 = x_ptr + t * stride_t + h * stride_h + i
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    r1 = (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty)
    r2 = (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty)
    tl.store(p1, r1, mask=mask)
    tl.store(p1 + HALF, r2, mask=mask)
    return r1, r2


@triton.jit
def _cos_sin(pos_ptr, cs_ptr, stride_cs, t, HALF: tl.constexpr):
    """cos and sin of token t's position, [1, HALF] each in fp32."""
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i = tl.arange(0, HALF)[None, :]
    cos = tl.load(cs_ptr + pos * stride_cs + i).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + i).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, cs_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
    num_q_heads, num_k_heads,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(pos_ptr, cs_ptr, stride_cs, t, HALF)
    _rotate(q_ptr, stride_qt, stride_qh, t, cos, sin, num_q_heads, HALF, BLOCK_HQ)
    _rotate(k_ptr, stride_kt, stride_kh, t, cos, sin, num_k_heads, HALF, BLOCK_HK)


def _rotary_shapes(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """(T, Hq, D, Hkv), after checking what the kernels assume of q, k and the cache."""
    T, Hq, D = q.shape
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    assert cos_sin_cache.shape[-1] == D and D & (D - 1) == 0, "rotary dim must equal head_dim, a power of 2"
    return T, Hq, D, k.shape[1]


def rotary(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """Same result as `RotaryEmbedding.forward`, but rotates q [T, Hq, D] and k [T, Hkv, D] in place.

    q and k may be strided views (e.g. of a fused qkv output) as long as the head dim is contiguous.
    cos_sin_cache is [max_pos, D] = [cos | sin]; D must be a power of two.
    """
    T, Hq, D, Hk = _rotary_shapes(q, k, cos_sin_cache)
    if T == 0:
        return q, k
    _rotary_kernel[(T,)](
        positions, q, k, cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        Hq, Hk,
        HALF=D // 2, BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HK=triton.next_power_of_2(Hk),
        num_warps=4, **pdl.launch_args(),
    )
    return q, k


# ------------------------------------------------------------------------------------- rotary + KV write


@triton.jit
def _rotary_write_kv_kernel(
    pos_ptr, q_ptr, k_ptr, v_ptr, cs_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cs,
    stride_cb, stride_cslot, stride_ch,  # k_cache and v_cache share a layout; head dim contiguous
    num_q_heads, num_k_heads, k_inv_scale, v_inv_scale,
    HALF: tl.constexpr, PAGE: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, FP8: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(pos_ptr, cs_ptr, stride_cs, t, HALF)
    _rotate(q_ptr, stride_qt, stride_qh, t, cos, sin, num_q_heads, HALF, BLOCK_HQ)
    # k: rotated once, stored in place and (unless padding) into its cache slot with v beside it
    k1, k2 = _rotate(k_ptr, stride_kt, stride_kh, t, cos, sin, num_k_heads, HALF, BLOCK_HK)
    h = tl.arange(0, BLOCK_HK)[:, None]
    i = tl.arange(0, HALF)[None, :]
    mask = h < num_k_heads
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        dst = (slot // PAGE) * stride_cb + (slot % PAGE) * stride_cslot + h * stride_ch + i
        kt = kc_ptr.dtype.element_ty
        tl.store(kc_ptr + dst, to_cache(k1, k_inv_scale, FP8, kt), mask=mask)
        tl.store(kc_ptr + dst + HALF, to_cache(k2, k_inv_scale, FP8, kt), mask=mask)
        pv = v_ptr + t * stride_vt + h * stride_vh + i
        v1 = tl.load(pv, mask=mask)
        v2 = tl.load(pv + HALF, mask=mask)
        tl.store(vc_ptr + dst, to_cache(v1, v_inv_scale, FP8, kt), mask=mask)
        tl.store(vc_ptr + dst + HALF, to_cache(v2, v_inv_scale, FP8, kt), mask=mask)


def rotary_write_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """`rotary` then `write_kv` in one launch: rotates q and k in place and writes the rotated k and v of
    token t into cache slot slot_mapping[t] (skipped where it is negative). Same rounding as the two apart
    (an fp8 cache: scaled by k_scale / v_scale and saturated, as write_kv does)."""
    T, Hq, D, Hk = _rotary_shapes(q, k, cos_sin_cache)
    assert v.stride(-1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    if T == 0:
        return
    _rotary_write_kv_kernel[(T,)](
        positions, q, k, v, cos_sin_cache, k_cache, v_cache, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos_sin_cache.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        Hq, Hk, 1.0 / k_scale, 1.0 / v_scale,
        HALF=D // 2, PAGE=k_cache.shape[1], BLOCK_HQ=triton.next_power_of_2(Hq), BLOCK_HK=triton.next_power_of_2(Hk),
        FP8=k_cache.element_size() == 1,
        num_warps=4, **pdl.launch_args(),
    )
