"""Prefill / extend attention for packed variable-length queries over the paged KV cache.

Sequence i's q_len new tokens sit at positions ctx .. ctx + q_len - 1 with ctx = seq_lens[i] - q_len (tokens
already cached by earlier chunks or a prefix-cache hit); write_kv has already put the new K/V into the cache,
so every key is read from the pages. Query at position p attends to keys 0 .. p.

One program handles a tile of BLOCK_M rows for one kv head: TPB = BLOCK_M // G consecutive query tokens times
the G query heads that share the kv head (row r = token r // G, head r % G), so each K/V tile is loaded once
for all heads of the group. Keys below the tile's first position need no mask; only the tail is masked.

    keys:   0 ............................ ctx + t0 | ctx + t0 .. ctx + t0 + TPB - 1
            full tiles, no mask                      | causal tail, masked
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tachyon.kernels import pdl

_LOG2E = 1.4426950408889634


@triton.jit
def _attend_tile(
    q, acc, m, l_sum, kc_ptr, vc_ptr, bt_row, kv_head, n0, pos, kv_end,
    stride_cb, stride_cs, stride_ch, qk_scale,
    PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr, PRECISION: tl.constexpr,
):
    """One online-softmax step over keys n0 .. n0 + BLOCK_N - 1."""
    n = n0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    if MASKED:
        n_mask = n < kv_end
        page = tl.load(bt_row + n // PAGE, mask=n_mask, other=0).to(tl.int64)
        kv_mask = n_mask[:, None] & (d[None, :] < HEAD_DIM)
    else:
        page = tl.load(bt_row + n // PAGE).to(tl.int64)
        kv_mask = d[None, :] < HEAD_DIM
    off = page * stride_cb + (n % PAGE) * stride_cs + kv_head * stride_ch
    k = tl.load(kc_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k).to(q.dtype), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    if MASKED:
        s = tl.where((n[None, :] <= pos[:, None]) & n_mask[None, :], s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_sum = l_sum * alpha + tl.sum(p, axis=1)
    v = tl.load(vc_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
    return acc, m_new, l_sum


# one compiled kernel whatever the batch mix: the decodes ahead of the prefills, the longest query, the block
# table's width (an eager step's longest context, in blocks)
@triton.jit(do_not_specialize=["seq_start", "num_q_blocks", "stride_bt"])
def _prefill_kernel(
    q_ptr, kc_ptr, vc_ptr, out_ptr, bt_ptr, qsl_ptr, seq_lens_ptr,
    seq_start, num_q_blocks,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch,  # k_cache and v_cache share a layout; head dim is contiguous
    stride_bt, qk_scale, v_scale,  # qk_scale: softmax scale * k_scale * log2(e); v_scale: an fp8 cache's (or 1.0)
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    TPB: tl.constexpr = BLOCK_M // GROUP  # query tokens per tile
    q_block = num_q_blocks - 1 - tl.program_id(0)  # the longest (last) tiles first
    kv_head = tl.program_id(1)
    seq = seq_start + tl.program_id(2)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    t0 = q_block * TPB
    if t0 >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx = seq_len - q_len

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    tok = t0 + r // GROUP
    head = kv_head * GROUP + r % GROUP
    row_mask = (r < TPB * GROUP) & (tok < q_len)
    d_mask = d < HEAD_DIM
    io_mask = row_mask[:, None] & d_mask[None, :]
    tok64 = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + tok64[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :], mask=io_mask,
                other=0.0)
    pos = ctx + tok

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_bt
    kv_end = tl.minimum(ctx + t0 + TPB, seq_len)
    full_end = (ctx + t0) // BLOCK_N * BLOCK_N  # every row sees every key below this
    for n0 in range(0, full_end, BLOCK_N):
        acc, m, l_sum = _attend_tile(q, acc, m, l_sum, kc_ptr, vc_ptr, bt_row, kv_head, n0, pos, kv_end,
                                 stride_cb, stride_cs, stride_ch, qk_scale,
                                 PAGE, HEAD_DIM, BLOCK_N, BLOCK_D, False, PRECISION)
    # the first masked tile holds key full_end <= every row's position, so no row is left all -inf
    for n0 in range(full_end, kv_end, BLOCK_N):
        acc, m, l_sum = _attend_tile(q, acc, m, l_sum, kc_ptr, vc_ptr, bt_row, kv_head, n0, pos, kv_end,
                                 stride_cb, stride_cs, stride_ch, qk_scale,
                                 PAGE, HEAD_DIM, BLOCK_N, BLOCK_D, True, PRECISION)
    out = acc * (v_scale / l_sum)[:, None]
    tl.store(out_ptr + tok64[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=io_mask)


def _tile_config(dtype: torch.dtype, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages); chosen to fit sm_90 registers without spills."""
    if dtype == torch.float32:  # exact fp32 dots run on FMAs: keep tiles small
        return 32, 32, 8, 2
    if head_dim > 64:  # H200, head_dim 128: 64x64 tiles ran 1x4096 in 0.41 ms vs 0.50 (128x64, 8 warps), 8x512
        return 64, 64, 4, 2  # in 0.094 vs 0.109 ms (benchmarks/results/h200/kernels_run2.json, sweeps)
    return 128, 64, 4, 2


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, max_query_len: int,
                      seq_start: int = 0, num_seqs: int | None = None,
                      out: torch.Tensor | None = None, k_scale: float = 1.0, v_scale: float = 1.0) -> torch.Tensor:
    """Causal attention for sequences seq_start .. seq_start + num_seqs - 1 of a packed batch.

    q: [T, Hq, D] (may be a strided view); caches: [num_blocks, block_size, Hkv, D] (new K/V already written);
    query_start_loc: [S + 1]; seq_lens: [S]; block_tables: [S, max_blocks]. max_query_len: a host-side bound on
    the query lengths of those sequences (sizes the grid). Rows of other sequences in `out` are left untouched.
    k_scale, v_scale: what an fp8 cache's entries are multiplied by to give K and V (1.0 for 16-bit caches).
    """
    T, Hq, D = q.shape
    Hkv, page = k_cache.shape[2], k_cache.shape[1]
    assert Hq % Hkv == 0 and q.stride(-1) == 1 and k_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride()
    if num_seqs is None:
        num_seqs = seq_lens.shape[0] - seq_start
    if out is None:
        out = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device)
    if num_seqs == 0 or max_query_len == 0:
        return out
    group = Hq // Hkv
    block_m, block_n, num_warps, num_stages = _tile_config(q.dtype, D)
    block_m = max(block_m, triton.next_power_of_2(group))
    num_q_blocks = triton.cdiv(max_query_len, block_m // group)
    _prefill_kernel[(num_q_blocks, Hkv, num_seqs)](
        q, k_cache, v_cache, out, block_tables, query_start_loc, seq_lens,
        seq_start, num_q_blocks,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), scale * k_scale * _LOG2E, v_scale,
        GROUP=group, HEAD_DIM=D, PAGE=page,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=triton.next_power_of_2(D),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages, **pdl.launch_args(),
    )
    return out
