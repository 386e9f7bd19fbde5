"""Scatter the new tokens' K and V into the paged cache (torch reference: `layers.attention.write_kv_ref`).

Token t goes to slot s = slot_mapping[t], i.e. cache[s // block_size, s % block_size]; s < 0 is padding.
One program per token copies all kv heads of both K and V, so k/v may be strided views of a fused qkv output.
An fp8 cache stores K / k_scale and V / v_scale, saturated at E4M3's largest finite value (448).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tachyon.kernels import pdl


@triton.jit
def to_cache(x, inv_scale, FP8: tl.constexpr, dtype: tl.constexpr):
    """A K or V value as the cache stores it: scaled and saturated for an fp8 cache, plainly cast otherwise."""
    if FP8:
        return tl.clamp(x.to(tl.float32) * inv_scale, -448.0, 448.0).to(dtype)  # E4M3's largest finite
    return x.to(dtype)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_cb, stride_cs, stride_ch, stride_cd,  # k_cache and v_cache share a layout
    num_heads, head_dim, k_inv_scale, v_inv_scale,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, FP8: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < num_heads) & (d < head_dim)
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + h * stride_ch + d * stride_cd
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    tl.store(kc_ptr + dst, to_cache(k, k_inv_scale, FP8, kc_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    tl.store(vc_ptr + dst, to_cache(v, v_inv_scale, FP8, vc_ptr.dtype.element_ty), mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """k, v: [T, Hkv, D] (any strides); caches: [num_blocks, block_size, Hkv, D]; slot_mapping: [T] int.
    k_scale, v_scale: an fp8 cache's scales (ignored for other caches)."""
    T, H, D = k.shape
    if T == 0:
        return
    assert k_cache.stride() == v_cache.stride() and k_cache.shape == v_cache.shape
    _write_kv_kernel[(T,)](
        k, v, k_cache, v_cache, slot_mapping,
        *k.stride(), *v.stride(), *k_cache.stride(),
        H, D, 1.0 / k_scale, 1.0 / v_scale,
        BLOCK_SIZE=k_cache.shape[1], BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D),
        FP8=k_cache.element_size() == 1,
        num_warps=4 if H * D >= 2048 else 1, **pdl.launch_args(),
    )
