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
"""

from __future__ import annotations

from dataclasses import dataclass

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


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V ([T, Hkv, D]) into the paged caches at slot_mapping (negative slots are skipped)."""
    nb, bs, h, d = k_cache.shape
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        k, v, slot_mapping = k[valid], v[valid], slot_mapping[valid]
    k_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(nb * bs, h, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_kv_ref(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence's K or V: [length, Hkv, D]."""
    bs = cache.shape[1]
    nblocks = (length + bs - 1) // bs
    return cache[block_table[:nblocks].long()].flatten(0, 1)[:length]


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Reference attention: gathers each sequence's pages and runs SDPA (causal with an offset)."""
    T, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    out = torch.empty_like(q)
    q_lens = meta.query_lens_cpu
    s_lens = meta.seq_lens_cpu
    if q_lens is None:
        q_lens = (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).tolist()
    if s_lens is None:
        s_lens = meta.seq_lens.tolist()
    nd = meta.num_decodes
    if nd > 0:
        # Decodes batched: pad each context to the longest one and mask the tail.
        max_len = max(s_lens[:nd])
        bs = k_cache.shape[1]
        nblocks = (max_len + bs - 1) // bs
        bt = meta.block_tables[:nd, :nblocks].long()
        kk = k_cache[bt].flatten(1, 2)[:, :max_len]  # [nd, L, Hkv, D]
        vv = v_cache[bt].flatten(1, 2)[:, :max_len]
        lens = torch.tensor(s_lens[:nd], device=q.device)
        mask = torch.arange(max_len, device=q.device)[None, :] < lens[:, None]  # [nd, L]
        qd = q[:nd].unsqueeze(2)  # [nd, Hq, 1, D]
        o = F.scaled_dot_product_attention(
            qd, kk.transpose(1, 2).to(q.dtype), vv.transpose(1, 2).to(q.dtype),
            attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=Hq != Hkv)
        out[:nd] = o.squeeze(2)
    start = nd
    for i in range(nd, len(q_lens)):
        ql, sl = q_lens[i], s_lens[i]
        qi = q[start:start + ql].transpose(0, 1)  # [Hq, ql, D]
        ki = gather_kv_ref(k_cache, meta.block_tables[i], sl).transpose(0, 1).to(q.dtype)
        vi = gather_kv_ref(v_cache, meta.block_tables[i], sl).transpose(0, 1).to(q.dtype)
        if ql == sl:
            o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=Hq != Hkv)
        else:
            # query j sits at position sl - ql + j and sees keys 0 .. sl - ql + j
            mask = torch.arange(sl, device=q.device)[None, :] <= (sl - ql + torch.arange(ql, device=q.device))[:, None]
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=Hq != Hkv)
        out[start:start + ql] = o.transpose(0, 1)
        start += ql
    return out


class TorchAttentionBackend:
    """Runs anywhere; the oracle that the Triton kernels are tested against."""

    name = "torch"

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv_ref(k, v, k_cache, v_cache, meta.slot_mapping)
        return paged_attention_ref(q, k_cache, v_cache, meta, scale)


def get_attention_backend(name: str):
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        from tachyon.kernels.attention_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; use 'torch' or 'triton'")
