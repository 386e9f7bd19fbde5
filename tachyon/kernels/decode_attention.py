"""Split-K ("flash-decoding") attention for sequences with exactly one new token, over the paged KV cache.

Stage 1 runs one program per (sequence, kv head, split). Sequence b's context of L = seq_lens[b] tokens is cut
into num_splits chunks of `chunk = ceil(ceil(L / num_splits) / BLOCK_N) * BLOCK_N` tokens; split s covers
[s * chunk, min((s + 1) * chunk, L)) and programs whose chunk starts past L exit at once. Each program loads every
K/V page of its chunk once and scores it against all G = Hq / Hkv query heads of that kv head (one tl.dot with the
heads as rows), keeping an online softmax; it writes the normalised partial output and its log-sum-exp.
Stage 2 runs one program per (sequence, q head) and merges the valid splits by their log-sum-exps. With one
split (large batches fill the GPU without splitting) stage 1 writes the output itself and stage 2 is skipped.

    context:  |--- split 0 ---|--- split 1 ---|-- split 2 --|   (split 3 .. num_splits-1: empty, exit)
    stage 1:     (o0, lse0)      (o1, lse1)     (o2, lse2)
    stage 2:  out = sum_s exp(lse_s - lse) * o_s,   lse = logsumexp_s lse_s

CUDA-graph safe: the grid is (batch, Hkv, num_splits) with num_splits a function of Python ints only, the
scratch comes from a cache keyed by shape, and nothing reads tensor values on the host.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tachyon.kernels import pdl
from tachyon.kernels.splits import SPLIT_COUNTERS, _fence_gpu, device_counters, take_ticket

_LOG2E = 1.4426950408889634


@triton.jit
def _chunk(seq_len, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_CHUNK: tl.constexpr):
    """Tokens per split of a context of seq_len: an even share of NUM_SPLITS rounded up to BLOCK_N, and with
    MIN_CHUNK at least that (then a short context uses fewer splits; the programs past it exit)."""
    chunk = tl.maximum(tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N), 1) * BLOCK_N
    if MIN_CHUNK > 0:
        chunk = tl.maximum(chunk, MIN_CHUNK)
    return chunk


# stride_bt is the width of the step's block table: an eager step's is its longest context in blocks, so Triton's
# specializations (value 1, a multiple of 16) would compile new variants mid-run as contexts grow
@triton.jit(do_not_specialize=["stride_bt"])
def _decode_split_kernel(
    q_ptr, kc_ptr, vc_ptr, bt_ptr, seq_lens_ptr, mid_o_ptr, mid_lse_ptr,
    stride_qt, stride_qh,
    stride_cb, stride_cs, stride_ch,  # k_cache and v_cache share a layout; head dim is contiguous
    stride_bt,
    stride_mo_b, stride_mo_h, stride_mo_s,
    stride_ml_b, stride_ml_h,
    qk_scale,  # softmax scale * k_scale * log2(e): scores live in base 2
    v_scale,  # an fp8 cache's V scale (1.0 for 16-bit caches): the output is sum(p * v) * v_scale
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr,
    out_ptr, stride_ot, stride_oh,
    DIRECT: tl.constexpr,  # one split: write the final output here, no stage 2
    PDL: tl.constexpr = False,
    MIN_CHUNK: tl.constexpr = 0,  # > 0: no split shorter than this (a short context takes fewer splits)
    cnt_ptr=None,  # MERGE: a zeroed int32 ticket per (sequence, kv head)
    MERGE: tl.constexpr = False,  # the last split of a (sequence, kv head) merges them: no stage 2
    FENCE: tl.constexpr = False,  # MERGE in a compiled kernel: GPU-wide fences around the ticket
    BLOCK_S: tl.constexpr = 1,  # MERGE: next_power_of_2(NUM_SPLITS)
):
    pdl.enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    chunk = _chunk(seq_len, NUM_SPLITS, BLOCK_N, MIN_CHUNK)
    start = split * chunk

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    head = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    out_ptrs = out_ptr + b * stride_ot + head[:, None] * stride_oh + d[None, :]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if start >= seq_len:
        # a padding entry (seq_len 0): zeros, as stage 2 would give (with MERGE there is no stage 2: split 0 writes)
        if DIRECT or (MERGE and split == 0):
            tl.store(out_ptrs, tl.zeros([BLOCK_G, BLOCK_D], tl.float32).to(out_ptr.dtype.element_ty), mask=out_mask)
        return
    end = tl.minimum(start + chunk, seq_len)
    q = tl.load(q_ptr + b * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + b * stride_bt
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        page = tl.load(bt_row + n // PAGE, mask=n_mask, other=0).to(tl.int64)
        off = page * stride_cb + (n % PAGE) * stride_cs + kv_head * stride_ch
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(kc_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k).to(q.dtype), input_precision=PRECISION) * qk_scale  # [BLOCK_G, BLOCK_N]
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(vc_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=PRECISION)
        m = m_new

    # every chunk holds at least one token, so l > 0 for every row. One split, or (MIN_CHUNK) a context that fits
    # one: it writes the output itself, and stage 2 skips the sequence
    if DIRECT or (MIN_CHUNK > 0 and seq_len <= chunk):
        tl.store(out_ptrs, (acc * (v_scale / l_sum)[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
        return
    o_ptrs = mid_o_ptr + b * stride_mo_b + head[:, None] * stride_mo_h + split * stride_mo_s + d[None, :]
    tl.store(o_ptrs, acc * (v_scale / l_sum)[:, None], mask=out_mask)
    tl.store(mid_lse_ptr + b * stride_ml_b + head * stride_ml_h + split, m + tl.log2(l_sum), mask=g_mask)
    if MERGE:
        _merge_if_last(mid_o_ptr, mid_lse_ptr, cnt_ptr, out_ptrs, out_mask, b, kv_head, tl.num_programs(1), head,
                       g_mask, d, tl.cdiv(seq_len, chunk), stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b,
                       stride_ml_h, BLOCK_G, BLOCK_D, BLOCK_S, FENCE)


@triton.jit
def _merge_if_last(mid_o_ptr, mid_lse_ptr, cnt_ptr, out_ptrs, out_mask, b, kv_head, num_kv_heads, head, g_mask, d,
                   num_valid, stride_mo_b, stride_mo_h, stride_mo_s, stride_ml_b, stride_ml_h,
                   BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, FENCE: tl.constexpr):
    """After a split stored its partial: take a ticket from the (sequence, kv head)'s counter; the last of its
    num_valid splits merges them by their log-sum-exps (stage 2's sums, its G heads at once), stores the output
    and puts the counter back to 0. FENCE: as splits.finish_split (stores visible GPU-wide before the ticket)."""
    tile = (b * num_kv_heads + kv_head).to(tl.int32)
    ticket = take_ticket(cnt_ptr, tile, FENCE)
    if ticket == num_valid - 1:
        if FENCE:
            tile = _fence_gpu(tile)
        s = tl.arange(0, BLOCK_S)
        lse = tl.load(mid_lse_ptr + b * stride_ml_b + head[:, None] * stride_ml_h + s[None, :],
                      mask=g_mask[:, None] & (s < num_valid)[None, :], other=float("-inf"), cache_modifier=".cg")
        top = tl.max(lse, axis=1)
        top = tl.where(top == float("-inf"), 0.0, top)  # masked (padding) head rows: all weights 0
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for i in range(0, num_valid):
            lse_i = tl.load(mid_lse_ptr + b * stride_ml_b + head * stride_ml_h + i, mask=g_mask, other=float("-inf"),
                            cache_modifier=".cg")
            o = tl.load(mid_o_ptr + b * stride_mo_b + head[:, None] * stride_mo_h + i * stride_mo_s + d[None, :],
                        mask=out_mask, other=0.0, cache_modifier=".cg")
            acc += o * tl.exp2(lse_i - top)[:, None]
        out = acc / tl.maximum(tl.sum(tl.exp2(lse - top[:, None]), axis=1), 1e-30)[:, None]
        tl.store(out_ptrs, out.to(out_ptrs.dtype.element_ty), mask=out_mask)
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def _decode_reduce_kernel(
    mid_o_ptr, mid_lse_ptr, seq_lens_ptr, out_ptr,
    stride_mo_b, stride_mo_h, stride_mo_s,
    stride_ml_b, stride_ml_h,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,
    MIN_CHUNK: tl.constexpr = 0,
):
    pdl.enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    chunk = _chunk(seq_len, NUM_SPLITS, BLOCK_N, MIN_CHUNK)
    num_valid = tl.cdiv(seq_len, chunk)  # splits that stage 1 wrote; 0 for a padding entry (seq_len 0)
    if MIN_CHUNK > 0 and num_valid == 1:  # stage 1 wrote this sequence's output itself
        return

    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < num_valid
    d_mask = d < HEAD_DIM
    lse = tl.load(mid_lse_ptr + b * stride_ml_b + head * stride_ml_h + s, mask=s_mask, other=float("-inf"))
    w = tl.exp2(lse - tl.where(num_valid > 0, tl.max(lse, axis=0), 0.0))  # no valid split: all weights 0
    o = tl.load(mid_o_ptr + b * stride_mo_b + head * stride_mo_h + s[:, None] * stride_mo_s + d[None, :],
                mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    out = tl.sum(o * w[:, None], axis=0) / tl.maximum(tl.sum(w, axis=0), 1e-30)
    tl.store(out_ptr + b * stride_ot + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


_workspace: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _get_workspace(batch: int, num_heads: int, num_splits: int, head_dim: int, device: torch.device):
    """Scratch for the partial results, reused across calls (and across CUDA-graph replays) of one shape."""
    key = (device, batch, num_heads, num_splits, head_dim)
    ws = _workspace.get(key)
    if ws is None:
        ws = (torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=device),
              torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=device))
        _workspace[key] = ws
    return ws


def num_decode_splits(batch: int, num_kv_heads: int, max_seq_len: int, min_chunk: int = 256,
                      max_splits: int = 64, target_programs: int = 512, whole_from: int = 256) -> int:
    """Splits of each context for stage 1: one (no stage 2) once batch x kv heads reaches whole_from programs, else
    the largest power of two that keeps at most target_programs programs, and no more than a context of max_seq_len
    fills at min_chunk tokens a split (rounded up to a power of two).

    Measured on an H100 (132 SMs; benchmarks/results/h100/session_20261207c/decode_sweep.json, llama3-8b's heads,
    CUDA-graph replays at 640-4,096 tokens): one split was fastest from 32 sequences up (256 programs; 32 x 640:
    32.6 us against 36.4 for the 4 splits that 1,024 programs gave, 48 x 640: 45.2 against 51.6), 4 at 16 sequences
    (512 programs), 16 at 1-4 (the 4,096-token bound's cap)."""
    programs = batch * num_kv_heads
    if programs >= whole_from:
        return 1
    want = 1 << (max(1, target_programs // programs).bit_length() - 1)  # a power of two, at most target_programs
    fit = triton.next_power_of_2(triton.cdiv(max_seq_len, min_chunk))
    return max(1, min(want, fit, max_splits))


# No split shorter than this (0: an even share of num_splits whatever the context). Decode graphs fix num_splits
# for the capture's context bound; at a Poisson load's ~640 tokens their 4 splits of ~3 tiles each left stage 1
# latency-bound (H100: 1.75 TB/s of 3.0, benchmarks/results/h100/session_20261207b). A GPU whose table
# (quant_tuned/<GPU>.json, "decode_attention", from `benchmarks/decode_attention_sweep.py --write-tuned`) holds a
# measured pick for the head shape takes that instead.
DECODE_MIN_CHUNK = 0
# The last split of each (sequence, kv head) merges the partials itself (a ticket counter) instead of a second
# launch: off unless this GPU's table says it pays (as DECODE_MIN_CHUNK).
DECODE_FUSED_MERGE = False


@functools.cache
def decode_defaults(device: torch.device, num_kv_heads: int, head_dim: int) -> tuple[int, bool]:
    """(min_chunk, merge) for this GPU and head shape: its measured pick, else (DECODE_MIN_CHUNK,
    DECODE_FUSED_MERGE). Cached: an eager step asks once a layer."""
    from tachyon.kernels.quant_linear import tuned_entry  # the per-GPU tables' reader (a kernels-only import)

    tuned = tuned_entry(device, "decode_attention", "all", f"{num_kv_heads}x{head_dim}")
    if tuned is None:
        return DECODE_MIN_CHUNK, DECODE_FUSED_MERGE
    return int(tuned[0]), bool(tuned[1])

# Stage 1's (BLOCK_N, num_warps, num_stages) for 16-bit caches. H200, head_dim 128: a third stage took batch
# 256 x 4k context from 4.04 to 4.43 TB/s and batch 64 from 3.86 to 4.10 (kernels_run2.json, sweeps)
SPLIT_CONFIG_16BIT = (64, 4, 3)


def _split_config(dtype: torch.dtype) -> tuple[int, int, int]:
    """Stage 1's (BLOCK_N, num_warps, num_stages)."""
    if dtype == torch.float32:  # exact fp32 dots run on FMAs: keep tiles small
        return 16, 4, 2
    return SPLIT_CONFIG_16BIT


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float, max_seq_len: int, out: torch.Tensor | None = None,
                     num_splits: int | None = None, k_scale: float = 1.0, v_scale: float = 1.0,
                     min_chunk: int | None = None, merge: bool | None = None) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context.

    q: [B, Hq, D] (token b belongs to sequence b); caches: [num_blocks, block_size, Hkv, D];
    block_tables: [B, max_blocks]; seq_lens: [B] context lengths including the new token (0 marks a padding
    entry, e.g. of a CUDA-graph batch: its output is 0).
    max_seq_len: a host-side upper bound on seq_lens (under CUDA graphs, the capture-time bound); it only
    chooses the number of splits. Writes into `out` ([B, Hq, D], may be a view) when given.
    k_scale, v_scale: what an fp8 cache's entries are multiplied by to give K and V (1.0 for 16-bit caches).
    min_chunk: no split shorter than this many tokens (rounded up to the tile), so a short context uses fewer of
    the num_splits (one: stage 1 writes its output and stage 2 skips it); None: decode_defaults'.
    merge: the last split of each (sequence, kv head) merges them in stage 1 (a ticket counter), so stage 2 is not
    launched; None: decode_defaults'.
    """
    B, Hq, D = q.shape
    Hkv, page = k_cache.shape[2], k_cache.shape[1]
    assert Hq % Hkv == 0 and q.stride(-1) == 1 and k_cache.stride(-1) == 1
    assert k_cache.stride() == v_cache.stride()
    if out is None:
        out = torch.empty(B, Hq, D, dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    if num_splits is None:
        num_splits = num_decode_splits(B, Hkv, max_seq_len)
    group = Hq // Hkv
    block_d = triton.next_power_of_2(D)
    block_n, num_warps, num_stages = _split_config(q.dtype)
    direct = num_splits == 1
    if min_chunk is None or merge is None:
        tuned_chunk, tuned_merge = decode_defaults(q.device, Hkv, D)
        min_chunk = tuned_chunk if min_chunk is None else min_chunk
        merge = tuned_merge if merge is None else merge
    min_chunk = 0 if direct or min_chunk <= 0 else triton.cdiv(min_chunk, block_n) * block_n
    mid_o, mid_lse = _get_workspace(B, Hq, num_splits, D, q.device)
    counters = device_counters(q.device) if merge and not direct and B * Hkv <= SPLIT_COUNTERS else None
    _decode_split_kernel[(B, Hkv, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, mid_o, mid_lse,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        scale * k_scale * _LOG2E, v_scale,
        GROUP=group, HEAD_DIM=D, PAGE=page, NUM_SPLITS=num_splits,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        out_ptr=out, stride_ot=out.stride(0), stride_oh=out.stride(1), DIRECT=direct, MIN_CHUNK=min_chunk,
        cnt_ptr=counters, MERGE=counters is not None, FENCE=counters is not None and q.device.type == "cuda",
        BLOCK_S=triton.next_power_of_2(num_splits),
        num_warps=num_warps, num_stages=num_stages, **pdl.launch_args(),
    )
    if direct or counters is not None:
        return out
    _decode_reduce_kernel[(B, Hq)](
        mid_o, mid_lse, seq_lens, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=D, NUM_SPLITS=num_splits, BLOCK_N=block_n,
        BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
        num_warps=4 if num_splits * block_d >= 2048 else 2, MIN_CHUNK=min_chunk, **pdl.launch_args(),
    )
    return out
