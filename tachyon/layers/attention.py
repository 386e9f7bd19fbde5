"""Attention over the paged KV cache, behind one backend interface.

The batch is packed: S sequences, their new tokens laid end to end (T tokens in all), decodes first.

    tokens:          | s0 | s1 | s2 ...........| s3 ......|
    query_start_loc:  0    1    2              9          14      (S + 1 entries)
    seq_lens:         the context length of each sequence after this step (cached + new tokens)

Sequence i's new tokens sit at positions seq_lens[i] - q_len_i ... seq_lens[i] - 1 and attend causally to
every earlier position of the same sequence. Its KV lives in blocks block_tables[i, :]; token position p is
at slot block_tables[i, p // block_size] * block_size + p % block_size of each layer's cache
`[num_blocks, block_size, num_kv_heads, head_dim]`. slot_mapping[t] says where token t's new K/V go
(-1 = padding, not written).

An fp8 cache (--kv-cache-dtype fp8) holds E4M3 values with one scale per layer for K and one for V: it stores
K / k_scale saturated at 448, and attention reads K = entry * k_scale. The kernels fold k_scale into the softmax
scale and v_scale into the output (softmax(q.k * scale * k_scale) . v_entries * v_scale), so no element is
rescaled on the read side. The scales are the attention layers' `k_scale` / `v_scale`, set once before serving
(tachyon.worker.model_runner.calibrate_kv_scales).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    query_start_loc: torch.Tensor  # [S + 1] int32
    seq_lens: torch.Tensor  # [S] int32
    block_tables: torch.Tensor  # [S, max_blocks] int32
    num_decodes: int  # the first num_decodes sequences have exactly one new token
    max_query_len: int
    max_seq_len: int
    # host copies for the reference backend's per-sequence loop
    query_lens_cpu: list[int] | None = None
    seq_lens_cpu: list[int] | None = None
    # index tensors the reference backend builds at the first layer and reuses for the others
    ref_cache: dict = field(default_factory=dict, repr=False)


FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter new K/V ([T, Hkv, D]) into the paged caches at slot_mapping (negative slots are skipped); an fp8
    cache gets K / k_scale and V / v_scale, saturated."""
    nb, bs, h, d = k_cache.shape
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    if k_cache.element_size() == 1:  # fp8, written through byte views (the CPU has no fp8 index_copy_)
        k = (k.float() / k_scale).clamp(-FP8_MAX, FP8_MAX).to(k_cache.dtype).view(torch.uint8)
        v = (v.float() / v_scale).clamp(-FP8_MAX, FP8_MAX).to(v_cache.dtype).view(torch.uint8)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    k_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def _ref_indices(meta: AttentionMetadata, block_size: int, device) -> dict:
    """Flat cache slots of every context token, built once per step (all layers share them).

    decodes:  slots [nd, L] padded with slot 0 (the null block) + mask [nd, 1, 1, L], or for one
              decode just its L slots (no mask needed: one query sees every key);
    prefills: per sequence, the slots of its sl context tokens.
    """
    c = meta.ref_cache
    if c:
        return c
    q_lens = meta.query_lens_cpu
    s_lens = meta.seq_lens_cpu
    if q_lens is None:
        q_lens = (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).tolist()
    if s_lens is None:
        s_lens = meta.seq_lens.tolist()
    c["q_lens"], c["s_lens"] = q_lens, s_lens
    nd = meta.num_decodes
    bt = meta.block_tables.long()
    offs = torch.arange(block_size, device=device)

    def slots(i: int, length: int) -> torch.Tensor:
        nblocks = (length + block_size - 1) // block_size
        return (bt[i, :nblocks, None] * block_size + offs).flatten()[:length]

    if nd == 1:
        c["decode_slots"] = slots(0, s_lens[0])
    elif nd > 1:
        max_len = max(s_lens[:nd])
        pad = torch.zeros(nd, max_len, dtype=torch.long, device=device)
        for i in range(nd):
            pad[i, : s_lens[i]] = slots(i, s_lens[i])
        lens = torch.tensor(s_lens[:nd], device=device)
        c["decode_slots"] = pad
        c["decode_mask"] = (torch.arange(max_len, device=device)[None, :] < lens[:, None])[:, None, None, :]
    c["prefill_slots"] = [slots(i, s_lens[i]) for i in range(nd, len(q_lens))]
    return c


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float, k_scale: float = 1.0,
                        v_scale: float = 1.0) -> torch.Tensor:
    """Reference attention: gathers each sequence's context from the pages and runs SDPA (an fp8 cache's
    scales folded in: the softmax scale times k_scale, the output times v_scale)."""
    scale = scale * k_scale
    T, Hq, D = q.shape
    nb, bs, Hkv, _ = k_cache.shape
    gqa = Hq != Hkv
    c = _ref_indices(meta, bs, q.device)
    k_flat, v_flat = k_cache.view(nb * bs, Hkv, D), v_cache.view(nb * bs, Hkv, D)
    out = torch.empty_like(q)
    nd = meta.num_decodes
    if nd == 1:
        k = k_flat[c["decode_slots"]].transpose(0, 1).to(q.dtype)  # [Hkv, L, D]
        v = v_flat[c["decode_slots"]].transpose(0, 1).to(q.dtype)
        out[0] = F.scaled_dot_product_attention(q[0].unsqueeze(1), k, v, scale=scale, enable_gqa=gqa).squeeze(1)
    elif nd > 1:
        kk = k_flat[c["decode_slots"]].transpose(1, 2).to(q.dtype)  # [nd, Hkv, L, D]
        vv = v_flat[c["decode_slots"]].transpose(1, 2).to(q.dtype)
        o = F.scaled_dot_product_attention(q[:nd].unsqueeze(2), kk, vv, attn_mask=c["decode_mask"], scale=scale,
                                           enable_gqa=gqa)
        out[:nd] = o.squeeze(2)
    start = nd
    for i, ctx in enumerate(c["prefill_slots"]):
        ql, sl = c["q_lens"][nd + i], c["s_lens"][nd + i]
        qi = q[start:start + ql].transpose(0, 1)  # [Hq, ql, D]
        ki = k_flat[ctx].transpose(0, 1).to(q.dtype)
        vi = v_flat[ctx].transpose(0, 1).to(q.dtype)
        if ql == sl:
            o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            # query j sits at position sl - ql + j and sees keys 0 .. sl - ql + j
            mask = torch.arange(sl, device=q.device)[None, :] <= (sl - ql + torch.arange(ql, device=q.device))[:, None]
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=gqa)
        out[start:start + ql] = o.transpose(0, 1)
        start += ql
    return out if v_scale == 1.0 else out * v_scale


class TorchAttentionBackend:
    """Runs anywhere; the oracle that the Triton kernels are tested against."""

    name = "torch"

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float, k_scale: float = 1.0,
                v_scale: float = 1.0) -> torch.Tensor:
        write_kv_ref(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        return paged_attention_ref(q, k_cache, v_cache, meta, scale, k_scale, v_scale)


def get_attention_backend(name: str):
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        from tachyon.layers.triton_backend import TritonAttentionBackend  # imports Triton: only when asked

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; use 'torch' or 'triton'")
