"""What the quantized linears' kernels and launchers share: the K-split decision, the fp32 partials' fixed-order
sum (a second kernel, or the last split of each tile inside the first: `finish_split`), the output buffer check,
the SM count, the store of one nibble position's outputs, moving a nibble under a float's exponent bits
(kernels/quant_linear.py, scaled_linear.py, awq_mma.py)."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tachyon import envs
from tachyon.kernels import pdl


def split_k(programs: int, k_tiles: int, partial_bytes: int, weight_bytes: int, num_sms: int) -> int:
    """How many ways to split K: doubled while the (M, N) tiles give fewer than two programs per SM, each split
    keeps at least 4 K tiles, and the fp32 partials (written, then read) stay within a quarter of the weight's
    bytes."""
    split = 1
    while programs * split < 2 * num_sms and k_tiles >= 8 * split and 4 * split * partial_bytes <= weight_bytes // 4:
        split *= 2
    return split


@functools.cache
def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # the interpreter: an H100/H200's count, so CPU tests take the same split decisions


@triton.jit(do_not_specialize=["MN"])
def _sum_splits_kernel(p_ptr, b_ptr, y_ptr, MN, N, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """y = sum over the SPLIT_K fp32 partials [SPLIT_K, M, N] (+ bias), in split order."""
    pdl.enter(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.load(p_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(p_ptr + s * MN + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def output_buffer(x: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    if out.shape != (x.shape[0], n) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} [{x.shape[0]}, {n}], got {out.dtype} "
                         f"{tuple(out.shape)}")
    return out


def sum_splits(partials: torch.Tensor, bias, y: torch.Tensor) -> None:
    """y = the sum of the fp32 K-split partials [split, m, n] (+ bias), in a fixed order: deterministic."""
    split, m, n = partials.shape
    block = 1024
    _sum_splits_kernel[(triton.cdiv(m * n, block),)](
        partials, bias if bias is not None else y, y, m * n, n, SPLIT_K=split, HAS_BIAS=bias is not None,
        BLOCK=block, num_warps=4, **pdl.launch_args(),
    )


# The one-row walks can sum their K splits themselves: every program stores its fp32 partial, then takes a ticket
# from its output tile's counter; the tile's last program reads the partials back (from L2, just written) and sums
# them in split order, the same sums as _sum_splits_kernel, so the result is bit for bit the same, with one launch
# a linear instead of two. The counters are one int32 buffer per device, zero between launches (the last program
# puts its tile's back), so the kernels that use them must not run on two streams at once: the engine runs its
# steps on one. TACHYON_SPLIT_FINISH=1 turns it on (off by default until an end-to-end run measures it).
SPLIT_COUNTERS = 1 << 15
_counters: dict = {}


def split_finish_enabled() -> bool:
    return bool(envs.flag("TACHYON_SPLIT_FINISH"))


def split_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's zeroed tile counters for a launch of `tiles` output tiles that finishes its own splits, or None
    (use sum_splits): off, more tiles than SPLIT_COUNTERS, or first asked for inside a CUDA graph capture (the
    buffer must not come from a graph's private memory pool)."""
    if not split_finish_enabled() or tiles > SPLIT_COUNTERS:
        return None
    return device_counters(device)


def device_counters(device: torch.device) -> torch.Tensor | None:
    """The device's SPLIT_COUNTERS zeroed int32 tickets (shared by every kernel that finishes its own splits: one
    stream runs them one after another), or None when first asked for inside a CUDA graph capture."""
    buf = _counters.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _counters[device] = torch.zeros(SPLIT_COUNTERS, dtype=torch.int32, device=device)
    return buf


@triton.jit
def _fence_gpu(token):
    """fence.acq_rel.gpu in every thread (returns token): orders its earlier stores before a later signal."""
    return tl.inline_asm_elementwise("fence.acq_rel.gpu;\n mov.u32 $0, $1;", "=r,r", [token], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def take_ticket(cnt_ptr, tile, FENCE: tl.constexpr):
    """A program's ticket from counter `tile` (0 for the first to arrive), taken once its stores are done: FENCE
    (compiled kernels) makes every thread's stores visible GPU-wide first. The program that draws the last ticket
    fences again (_fence_gpu) before it reads the others' stores, and puts the counter back to 0."""
    if FENCE:
        tile = _fence_gpu(tile)
    tl.debug_barrier()
    return tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")


@triton.jit
def finish_split(p_ptr, cnt_ptr, b_ptr, y_ptr, tile, row, col0, N, MN, SPLIT, NCOLS: tl.constexpr,
                 HAS_BIAS: tl.constexpr, FENCE: tl.constexpr):
    """Called by every program of a split launch after it stored its fp32 partial of y[row, col0:col0 + NCOLS]
    (split s at p_ptr + s * MN + row * N): the last of the tile's SPLIT programs to arrive sums the partials in
    split order (+ bias), stores y and zeroes the tile's counter; the others return. FENCE (compiled kernels):
    each thread's stores are made visible GPU-wide before the ticket is taken, and the reader fences after it."""
    ticket = take_ticket(cnt_ptr, tile, FENCE)
    if ticket == SPLIT - 1:
        if FENCE:
            tile = _fence_gpu(tile)
        offs = col0 + tl.arange(0, NCOLS)
        mask = offs < N
        src = p_ptr + row.to(tl.int64) * N + offs
        acc = tl.load(src, mask=mask, other=0.0, cache_modifier=".cg")
        for s in range(1, SPLIT):
            acc += tl.load(src + s * MN, mask=mask, other=0.0, cache_modifier=".cg")
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row.to(tl.int64) * N + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)
        tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def store_word_columns(out_rows, b_ptr, y, offs_p, mask_p, mask_r, HAS_BIAS: tl.constexpr, J: tl.constexpr):
    """Store y [P, R] as outputs 8p + J of rows out_rows [1, R] (+ bias): the accumulator of nibble position J of
    the packed columns offs_p, in the kernels that keep one per position."""
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_p * 8 + J, mask=mask_p, other=0.0).to(tl.float32)[:, None]
    tl.store(out_rows + offs_p[:, None] * 8 + J, y.to(out_rows.dtype.element_ty), mask=mask_p[:, None] & mask_r[None, :])


@triton.jit
def store_eight_positions(out_rows, b_ptr, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, offs_p, mask_p, mask_r,
                          HAS_BIAS: tl.constexpr):
    """store_word_columns for the eight accumulators of a kernel that keeps one per nibble position."""
    store_word_columns(out_rows, b_ptr, acc0, offs_p, mask_p, mask_r, HAS_BIAS, 0)
    store_word_columns(out_rows, b_ptr, acc1, offs_p, mask_p, mask_r, HAS_BIAS, 1)
    store_word_columns(out_rows, b_ptr, acc2, offs_p, mask_p, mask_r, HAS_BIAS, 2)
    store_word_columns(out_rows, b_ptr, acc3, offs_p, mask_p, mask_r, HAS_BIAS, 3)
    store_word_columns(out_rows, b_ptr, acc4, offs_p, mask_p, mask_r, HAS_BIAS, 4)
    store_word_columns(out_rows, b_ptr, acc5, offs_p, mask_p, mask_r, HAS_BIAS, 5)
    store_word_columns(out_rows, b_ptr, acc6, offs_p, mask_p, mask_r, HAS_BIAS, 6)
    store_word_columns(out_rows, b_ptr, acc7, offs_p, mask_p, mask_r, HAS_BIAS, 7)


@triton.jit
def nibble_at_12_or_16(q, J: tl.constexpr):
    """UNPACK 2: nibble J of q moved to bit 12 (J even) or 16 (J odd) of a word, the rest zero. Four shifts a word
    (q << 12, q << 4, q >> 4, q >> 12 hold nibble pairs 0-1, 2-3, 4-5, 6-7 at bits 12..19), one LOP3 a value."""
    if J < 2:
        src = q << 12
    elif J < 4:
        src = q << 4
    elif J < 6:
        src = q >> 4
    else:
        src = q >> 12
    return src & (0xF << (12 + 4 * (J % 2)))
