"""Weight-only quantized linear layers, INT8 per output channel and AWQ-style INT4 (W4A16), with torch references.

INT8: qweight int8 [N, K] (nn.Linear's layout), scales [N]:  y = x @ (q * s[:, None]).T + b
INT4: qweight int32 [K, N/8], qzeros int32 [K/G, N/8], scales [K/G, N]:  w[k, n] = (q[k, n] - z[g, n]) * s[g, n]
      with g = k // G, and y = x @ w + b. Packing, "natural order" (nibble j of word p is column 8p + j):

          qweight[k, p] = q[k, 8p+7] << 28 | q[k, 8p+6] << 24 | ... | q[k, 8p+1] << 4 | q[k, 8p]

Kernels per format; the config (and the row bucket's list of them) picks one:
- BLOCK_M 1 (INT8 at one row): a program walks K for a strip of BLOCK_N outputs with wide loads of the packed
  weight, unpacks it in registers (bit tricks, no int-to-float conversions) and accumulates with fp32 FMAs;
- "gemv" (INT4 at 1..4 rows, _awq_gemv_kernel): columns along lanes, the K sum kept inside each thread, a program
  per row (the rows of one column tile run side by side, so the weight comes from DRAM once); "rgemv"
  (_awq_gemv_rows_kernel) the same walk with up to ROWS rows in one program, each word unpacked once for all;
- BLOCK_M 16 and larger (the skinny and GEMM tiles): the weight tile is dequantized in registers to x's dtype and
  fed to tl.dot with fp32 accumulation. INT8 applies its scale after the K loop; an INT4 tile never crosses a group
  (BLOCK_K divides G), so it has one scale and zero row;
- "dequant" (INT4, default above 512 rows): the whole weight dequantized to x's dtype, then cuBLAS;
- "mma" (INT4, 1-16 rows, where a tuned table picks it): the tensor-core product of kernels/awq_mma.py on this
  layout; `awq_kmajor_linear` runs the same kernels on a K-major repacked weight (Hopper's default; TACHYON_AWQ_MMA).
Up to 16 rows the time is the weight's bytes over the memory bandwidth: INT4 K*N/2 + (K/G)*N*(scale bytes + 1/2),
INT8 K*N + N*(scale bytes). Where the (M, N) tiles are too few to fill the GPU, K is split over SPLIT_K programs
that write fp32 partials to a workspace, and a second kernel sums them in a fixed order (deterministic).
"""

from __future__ import annotations

import functools
import json
import os

import torch
import triton
import triton.language as tl

from tachyon.kernels import pdl
from tachyon.kernels.awq_mma import MMA_MAX_ROWS, awq_mma_linear, awq_mma_natural, default_mma_config
from tachyon.kernels.quant_ref import (  # noqa: F401  (the layouts and references live beside, Triton-free)
    awq_linear_ref,
    check_awq_args,
    check_int8_args,
    int8_linear_ref,
    pack_int4,
    unpack_int4,
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

# (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages[, late_reduce]) per row bucket; the first of each
# list is the default. BLOCK_M 1 is the one-row FMA walk (one program per row); SPLIT_K 0 means `split_k` picks
# it from the shape; late_reduce keeps a BLOCK_N x BLOCK_K fp32 accumulator and reduces it once after the loop.
# For INT4, BLOCK_K is clipped to the group size. An INT4 entry ("gemv", BLOCK_P, BLOCK_K, num_warps, prefetch
# [, unpack]) is the one-row walk with the sum over K kept inside each thread (_awq_gemv_kernel): BLOCK_P packed
# columns per program (BLOCK_P / (32 * num_warps) words a thread, 1, 2 or 4), BLOCK_K rows per iteration; unpack
# 0: exact magic-number unpack (LOP3 + FADD + FFMA a value), 1: int-to-float, 2: no FADD (the 2**23 offsets come
# off once a tile, ~1e-5 relative; fp32 activations take 0 instead). A GPU with a measured table
# (quant_tuned/<device>.json, from benchmarks/quant_kernels.py --write-tuned) takes its per-shape configs.
# ("rgemv", BLOCK_P, BLOCK_K, num_warps, ROWS, unpack) walks ROWS rows in one program (a speculative verification's
# 1 + k tokens, a small batch): one load and unpack of each word, ROWS FFMAs a value.
# An INT4 entry ("dequant", BLOCK_K, BLOCK_N, num_warps) dequantizes the whole weight to x's dtype (one pass,
# _awq_dequant_kernel) and multiplies with cuBLAS: 4.5 bytes a weight instead of 0.5, paid back at many rows.
INT8_CONFIGS = {
    "one_row": [(1, 16, 512, 0, 4, 4), (1, 8, 512, 0, 4, 4), (1, 16, 1024, 0, 8, 3), (1, 32, 256, 0, 4, 4),
                (1, 8, 1024, 0, 4, 4, True)],
    "few": [(1, 16, 512, 0, 4, 4), (1, 8, 512, 0, 4, 4), (16, 32, 256, 0, 4, 4), (16, 16, 512, 0, 4, 4)],
    "skinny": [(16, 32, 256, 0, 4, 4), (16, 16, 512, 0, 4, 4), (16, 64, 256, 0, 8, 3), (16, 32, 512, 0, 4, 3)],
    "gemm": [(64, 128, 128, 0, 4, 3), (64, 64, 128, 0, 4, 4), (128, 128, 64, 0, 8, 3), (128, 256, 64, 1, 8, 3)],
    "prefill": [(64, 128, 128, 0, 4, 3), (128, 128, 64, 0, 8, 3), (128, 256, 64, 1, 8, 3)],
}
_GEMV_FEW = [("gemv", 128, 64, 4, False, 2), ("gemv", 128, 32, 4, False, 2), ("gemv", 64, 32, 1, False, 2),
             ("gemv", 32, 32, 1, False, 2)]
_DEQUANT = [("dequant", 32, 256, 4), ("dequant", 64, 128, 4), ("dequant", 32, 512, 8)]
_RGEMV_FEW = [("rgemv", 128, 32, 4, 4, 2), ("rgemv", 128, 16, 4, 4, 2), ("rgemv", 64, 32, 2, 4, 2),
              ("rgemv", 128, 32, 4, 2, 2)]
_RGEMV_SKINNY = [("rgemv", 128, 16, 4, 8, 2), ("rgemv", 128, 32, 4, 8, 2), ("rgemv", 64, 16, 2, 8, 2),
                 ("rgemv", 128, 16, 4, 16, 2)]
# ("mma", BLOCK_P, BLOCK_M, SPLIT_K, num_warps, num_stages): the tensor-core product of kernels/awq_mma.py on the
# same natural layout (8 * BLOCK_P outputs a program, up to BLOCK_M = 16 rows; K % 128 == 0, fp16/bf16, else the
# bucket's first config runs). Never a bucket's default: a GPU's tuned table picks it where it measures faster.
_MMA = [("mma", 64, 16, 0, 4, 2), ("mma", 64, 16, 0, 4, 3), ("mma", 64, 16, 4, 4, 2), ("mma", 64, 16, 8, 4, 2)]
AWQ_CONFIGS = {
    "one_row": [("gemv", 256, 32, 4, False, 2), ("gemv", 128, 64, 4, False, 2), ("gemv", 256, 64, 4, False, 2),
                ("gemv", 512, 32, 4, False, 2), ("gemv", 128, 32, 4, False, 2), ("gemv", 256, 32, 8, False, 2),
                ("gemv", 64, 32, 1, False, 2), ("gemv", 32, 32, 1, False, 2), ("gemv", 128, 32, 4, True, 2),
                ("gemv", 128, 64, 4, False, 0), ("gemv", 256, 32, 8, False, 0), ("gemv", 128, 32, 4, False, 0),
                ("gemv", 32, 32, 1, False, 0), ("gemv", 128, 32, 4, False, 1), (1, 128, 64, 0, 4, 4, True)] + _MMA,
    "few": _GEMV_FEW + [(16, 128, 128, 0, 4, 3), (16, 64, 128, 0, 4, 4)] + _DEQUANT[:1] + _RGEMV_FEW + _MMA,
    "skinny": [(16, 128, 128, 0, 4, 3), (16, 64, 128, 0, 4, 4), (16, 256, 64, 0, 8, 3), (16, 32, 128, 0, 4, 4)]
              + _GEMV_FEW[:2] + _DEQUANT + _RGEMV_SKINNY + _MMA,
    "gemm": [(64, 128, 64, 0, 4, 3), (64, 64, 128, 0, 4, 4), (128, 128, 64, 0, 8, 3), (128, 256, 64, 1, 8, 3)]
            + _DEQUANT,
    "prefill": _DEQUANT + [(128, 128, 64, 0, 8, 3), (128, 256, 64, 1, 8, 3)],
}
GEMV_PROGRAMS_PER_SM = 4  # the one-row INT4 walk splits K until it has this many programs per SM
MAX_FEW_ROWS = 4  # up to this many rows the one-row walks (a program per row, the weight shared in L2) compete
MAX_SKINNY_ROWS = 16  # up to this many rows a linear layer is bandwidth-bound
MAX_GEMM_ROWS = 512  # above this many rows (a prefill) dequantizing the whole weight for cuBLAS is cheap
_MAGIC = tl.constexpr(0x4B000000)  # the bits of the float 2**23: OR-ing in v < 2**23 gives the float 2**23 + v


TUNED_DIR = os.path.join(os.path.dirname(__file__), "quant_tuned")


@functools.cache
def _tuned_table(device_name: str) -> dict:
    """The per-shape configs that `benchmarks/quant_kernels.py --write-tuned` measured on this GPU model:
    quant_tuned/<device name>.json, {"awq"|"int8": {bucket: {"NxK": config}}}; {} where none was measured."""
    path = os.path.join(TUNED_DIR, device_name.replace(" ", "_") + ".json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        table = json.load(f)
    return {fmt: {b: {shape: tuple(c) for shape, c in shapes.items()} for b, shapes in buckets.items()}
            for fmt, buckets in table.get("configs", {}).items()}


def merge_tuned(path: str, entries: dict[tuple[str, str, str], list], notes: dict, new_table: dict) -> None:
    """What the tuning scripts write (`--write-tuned`): entries {(format, row bucket, key): config} merged into the
    per-GPU table at path (the rest of it stays; new_table's keys start a file that is not there) and the top-level
    notes (who made them) set."""
    try:
        with open(path) as f:
            table = json.load(f)
    except FileNotFoundError:
        table = dict(new_table)
    table.update(notes)
    configs = table.setdefault("configs", {})
    for (fmt, bucket, key), cfg in entries.items():
        configs.setdefault(fmt, {}).setdefault(bucket, {})[key] = cfg
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)


@functools.cache
def _device_table(index: int) -> dict:
    return _tuned_table(torch.cuda.get_device_name(index))


def tuned_key(n: int, k: int, group_size: int | None = None) -> str:
    """A layer's key in the tuned table: "NxK", and "gG" after it for INT4 (a config's BLOCK_K depends on G)."""
    return f"{n}x{k}" if group_size is None else f"{n}x{k}g{group_size}"


def tuned_entry(device: torch.device, fmt: str, bucket: str, key: str):
    """This GPU's tuned config (tachyon/kernels/quant_tuned/) for a format, row bucket and tuned_key, or None."""
    if device.type != "cuda":
        return None
    return _device_table(device.index or 0).get(fmt, {}).get(bucket, {}).get(key)


def default_config(fmt: str, m: int, n: int, k: int, device: torch.device, group_size: int | None = None) -> tuple:
    """The config for m rows of an [N, K] layer: the tuned one for this GPU and shape, else the bucket's first."""
    bucket = row_bucket(m)
    tuned = tuned_entry(device, fmt, bucket, tuned_key(n, k, group_size))
    if tuned is not None:
        return tuned
    return (AWQ_CONFIGS if fmt == "awq" else INT8_CONFIGS)[bucket][0]


def row_bucket(m: int) -> str:
    """Which config list serves m rows: "one_row", "few" (2..4), "skinny" (5..16), "gemm" (17..512) or
    "prefill"."""
    if m <= 1:
        return "one_row"
    if m <= MAX_FEW_ROWS:
        return "few"
    if m <= MAX_SKINNY_ROWS:
        return "skinny"
    return "gemm" if m <= MAX_GEMM_ROWS else "prefill"


# ---------------------------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _spread8(packed):
    """[R, P] -> [R, 8P]: column c holds packed[:, c // 8] (interleave keeps the copies in one thread)."""
    w = tl.interleave(packed, packed)
    w = tl.interleave(w, w)
    return tl.interleave(w, w)


@triton.jit
def _int4_minus_zero(q, z, BLOCK_N: tl.constexpr):
    """q [R, BLOCK_N // 8], z [1, BLOCK_N // 8] packed words -> fp32 [R, BLOCK_N] of q - z (column 8p + j from
    nibble j), exact, in about two instructions per value, no int-to-float conversion: a nibble at bit b < 20 under
    2**23's exponent bits is the float 2**23 + v * 2**b, and (that) * 2**-b - (2**(23-b) + z) is one exact FMA.
    Nibbles 0..4 sit in bits 0..19 of the word; 5..7 are moved there by one shift per word."""
    j = tl.arange(0, BLOCK_N) % 8  # a constant per register: the selects and masks fold away
    b = tl.where(j >= 5, 4 * j - 12, 4 * j)  # the nibble's bit in its source word
    q = q.to(tl.uint32, bitcast=True)
    lo = _spread8((q & 0xFFFFF) | _MAGIC)
    hi = _spread8(((q >> 12) & 0xFFF00) | _MAGIC)
    src = tl.where((j >= 5)[None, :], hi, lo)
    f = (src & ((0xF << b) | _MAGIC)[None, :]).to(tl.float32, bitcast=True)
    zn = (_spread8(z.to(tl.uint32, bitcast=True)) >> (4 * j)[None, :]) & 0xF
    offset = ((1 << (23 - b))[None, :] + zn).to(tl.float32)
    inv = ((127 - b) << 23).to(tl.float32, bitcast=True)  # 2**-b
    return f * inv[None, :] - offset


@triton.jit
def _int8_to_float(w):
    """int8 -> fp32 without an int-to-float conversion (a quarter-rate instruction): flipping the byte's top bit
    gives v + 128 in 0..255, and under 2**23's exponent bits that is the float 2**23 + v + 128."""
    u = w.to(tl.uint8, bitcast=True).to(tl.uint32)
    return (u ^ (_MAGIC | 0x80)).to(tl.float32, bitcast=True) - 8388736.0  # 2**23 + 128


@triton.jit
def _weight8_to_float(w):
    """An int8 or float8 E4M3 weight tile -> fp32 (the one-row walk's FMAs)."""
    if w.dtype == tl.float8e4nv:
        return w.to(tl.float32)
    return _int8_to_float(w)


@triton.jit(do_not_specialize=["M"])
def _int8_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
    M, N, K, K_SPLIT, stride_xm, stride_om, stride_os,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LATE_REDUCE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K
    out = out_ptr + pid_k.to(tl.int64) * stride_os
    scale = tl.load(s_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    if BLOCK_M == 1:
        x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if LATE_REDUCE:
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            kk = k0 + offs_k
            mask_k = kk < K  # K_SPLIT is a multiple of BLOCK_K: only the last tile of K is partial
            w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            x = tl.load(x_row + kk, mask=mask_k, other=0.0)
            prod = _weight8_to_float(w) * x.to(tl.float32)[None, :]
            if LATE_REDUCE:
                acc2 += prod
            else:
                acc += tl.sum(prod, axis=1)
        if LATE_REDUCE:
            acc = tl.sum(acc2, axis=1)
        acc = acc * scale
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        tl.store(out + pid_m.to(tl.int64) * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            kk = k0 + offs_k
            mask_k = kk < K
            x = tl.load(x_rows + kk[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=mask_n[:, None] & mask_k[None, :], other=0.0)
            w = tl.trans(w.to(x_ptr.dtype.element_ty))  # |q| <= 128 and E4M3 (3 mantissa bits): exact in fp16, bf16
            if IEEE:
                acc = tl.dot(x, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
        acc = acc * scale[None, :]
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        y = out + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(y, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit(do_not_specialize=["M"])
def _awq_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, out_ptr,
    M, N, N8, K, K_SPLIT, stride_xm, stride_om, stride_os,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LATE_REDUCE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_p = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)  # packed columns; N % 8 == 0
    mask_p = offs_p < N8
    offs_k = tl.arange(0, BLOCK_K)
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)  # BLOCK_K divides G divides K: no partial K tiles
    out = out_ptr + pid_k.to(tl.int64) * stride_os
    if BLOCK_M == 1:
        x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        if LATE_REDUCE:
            acc2 = tl.zeros((BLOCK_K, BLOCK_N), dtype=tl.float32)
    else:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < M
        x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        kk = k0 + offs_k
        g = k0 // GROUP
        q = tl.load(qw_ptr + kk.to(tl.int64)[:, None] * N8 + offs_p[None, :], mask=mask_p[None, :], other=0)
        z = tl.load(qz_ptr + g * N8 + offs_p, mask=mask_p, other=0)
        s = tl.load(s_ptr + g.to(tl.int64) * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        w = _int4_minus_zero(q, z[None, :], BLOCK_N)  # fp32 [BLOCK_K, BLOCK_N]
        if BLOCK_M == 1:
            x = tl.load(x_row + kk).to(tl.float32)
            if LATE_REDUCE:
                acc2 += w * (x[:, None] * s[None, :])
            else:
                acc += tl.sum(w * x[:, None], axis=0) * s
        else:
            x = tl.load(x_rows + kk[None, :], mask=mask_m[:, None], other=0.0)
            w = (w * s[None, :]).to(x_ptr.dtype.element_ty)
            if IEEE:
                acc = tl.dot(x, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(x, w, acc)
    if BLOCK_M == 1:
        if LATE_REDUCE:
            acc = tl.sum(acc2, axis=0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        tl.store(out + pid_m.to(tl.int64) * stride_om + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        y = out + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
        tl.store(y, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _nibble(q, magic, J: tl.constexpr, UNPACK: tl.constexpr):
    """q [P, BLOCK_K] packed words (uint32, transposed) -> fp32 [P, BLOCK_K]: nibble J of each word times 2**b, b the
    nibble's bit in the word it is read from (the 2**-b goes on the partial sum afterwards).
    UNPACK 0: the nibble under 2**23's exponent bits, (q & mask | magic) as a float minus 2**23 (nibbles 5..7 from
    q >> 12): one LOP3 (magic is a runtime value, so it sits in a register beside the mask immediate), one FADD
    per value. UNPACK 1: (q & mask) converted to float (I2FP). UNPACK 2: 2**23 + v 2**b, no FADD (_tile_term takes
    the 2**23 off a tile's sum)."""
    if UNPACK == 0:
        if J < 5:
            w = (q & (0xF << (4 * J))) | magic
        else:
            w = ((q >> 12) & (0xF << (4 * J - 12))) | magic
        f = w.to(tl.float32, bitcast=True) - 8388608.0
    elif UNPACK == 1:
        f = (q & (0xF << (4 * J))).to(tl.float32)
    else:
        f = (nibble_at_12_or_16(q, J) | magic).to(tl.float32, bitcast=True)
    return f


@triton.jit
def _nibble_dot(q, x, magic, J: tl.constexpr, UNPACK: tl.constexpr):
    """[P]: sum over a tile's BLOCK_K rows of `_nibble` times x [1, BLOCK_K] (one FFMA a value)."""
    return tl.sum(_nibble(q, magic, J, UNPACK) * x, axis=1)


@triton.jit
def _nibble_bit(J: tl.constexpr, UNPACK: tl.constexpr):
    """b of `_nibble`: where nibble J sits in the word it is read from."""
    if UNPACK == 2:
        B: tl.constexpr = 12 + 4 * (J % 2)
    elif J < 5 or UNPACK == 1:
        B: tl.constexpr = 4 * J
    else:
        B: tl.constexpr = 4 * J - 12
    return B


@triton.jit
def _zero_and_scale(zw, s_row, offs_p, mask_p, J: tl.constexpr, UNPACK: tl.constexpr):
    """The group's zero point and scale of outputs 8p + J, [P] each; with UNPACK 2 the zero also takes off the
    2**23 * 2**-B * sum x the nibbles carry (exact powers of two)."""
    z = ((zw >> (4 * J)) & 0xF).to(tl.float32)
    if UNPACK == 2:
        z += 1 << (23 - _nibble_bit(J, UNPACK))
    return z, tl.load(s_row + offs_p * 8 + J, mask=mask_p, other=0.0).to(tl.float32)


@triton.jit
def _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, J: tl.constexpr, UNPACK: tl.constexpr):
    """A tile's contribution to outputs 8p + J, [P]: s * (sum_k q x - z * sum_k x); the tile is inside one group."""
    dot = _nibble_dot(q, x, magic, J, UNPACK) * (1.0 / (1 << _nibble_bit(J, UNPACK)))
    z, s = _zero_and_scale(zw, s_row, offs_p, mask_p, J, UNPACK)
    return s * (dot - z * xsum)


@triton.jit
def _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, J: tl.constexpr, UNPACK: tl.constexpr):
    """`_tile_term` for ROWS rows at once, [P, ROWS]: x [ROWS, BLOCK_K], xsum [ROWS]; the nibble is unpacked once
    and multiplied into every row (ROWS FFMAs a value)."""
    f = _nibble(q, magic, J, UNPACK)
    dot = tl.sum(f[:, None, :] * x[None, :, :], axis=2) * (1.0 / (1 << _nibble_bit(J, UNPACK)))
    z, s = _zero_and_scale(zw, s_row, offs_p, mask_p, J, UNPACK)
    return s[:, None] * (dot - z[:, None] * xsum[None, :])


@triton.jit
def _store_col(out_row, b_ptr, y, offs_p, mask_p, HAS_BIAS: tl.constexpr, J: tl.constexpr):
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_p * 8 + J, mask=mask_p, other=0.0).to(tl.float32)
    tl.store(out_row + offs_p * 8 + J, y.to(out_row.dtype.element_ty), mask=mask_p)


@triton.jit
def _awq_gemv_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, out_ptr, y_ptr, cnt_ptr,
    N, N8, K, K_SPLIT, stride_xm, stride_om, stride_os, magic,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    PREFETCH: tl.constexpr, UNPACK: tl.constexpr, VEC: tl.constexpr, FINISH: tl.constexpr = False,
    FINISH_BIAS: tl.constexpr = False, FENCE: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """One row (program axis 0) times BLOCK_P packed columns (8 * BLOCK_P outputs) over one K split, BLOCK_K rows
    (inside one group) per iteration. BLOCK_P = VEC words x 32 lanes x num_warps puts every lane and warp along the
    columns, so the sum over a tile's rows stays inside each thread: no shuffles, no shared memory. Each nibble
    position j has its own accumulator [BLOCK_P]; the zero point comes off per tile, s * (sum q x - z * sum x).
    FINISH: out_ptr holds fp32 partials and the tile's last split sums them into y_ptr (splits.finish_split)."""
    pdl.enter(PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_p = pid_n * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_p = tl.max_contiguous(tl.multiple_of(offs_p, VEC), VEC)  # VEC words a thread: 32 * VEC * warps = BLOCK_P
    mask_p = offs_p < N8
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = qw_ptr + offs_k.to(tl.int64)[None, :] * N8 + offs_p[:, None]  # [P, BLOCK_K]: P first, so that
    mask = mask_p[:, None]  # with VEC 1 (no contiguity either way) the lanes still go along P
    x_row = x_ptr + pid_m.to(tl.int64) * stride_xm
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)  # K_SPLIT and K are multiples of GROUP, GROUP of BLOCK_K
    acc0 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc4 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc5 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc6 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc7 = tl.zeros((BLOCK_P,), dtype=tl.float32)
    w_ptrs += k_start.to(tl.int64) * N8
    step = BLOCK_K * N8
    if PREFETCH:
        q_next = tl.load(w_ptrs, mask=mask, other=0)
    for k0 in range(k_start, k_end, BLOCK_K):
        if PREFETCH:
            q = q_next.to(tl.uint32, bitcast=True)
            w_ptrs += step
            q_next = tl.load(w_ptrs, mask=mask & (k0 + BLOCK_K < k_end), other=0)
        else:
            q = tl.load(w_ptrs, mask=mask, other=0).to(tl.uint32, bitcast=True)
            w_ptrs += step
        x = tl.load(x_row + k0 + offs_k).to(tl.float32)
        xsum = tl.sum(x, axis=0)
        x = x[None, :]
        g = k0 // GROUP
        zw = tl.load(qz_ptr + g * N8 + offs_p, mask=mask_p, other=0).to(tl.uint32, bitcast=True)
        s_row = s_ptr + g.to(tl.int64) * N
        acc0 += _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 0, UNPACK)
        acc1 += _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 1, UNPACK)
        acc2 += _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 2, UNPACK)
        acc3 += _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 3, UNPACK)
        acc4 += _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 4, UNPACK)
        acc5 += _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 5, UNPACK)
        acc6 += _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 6, UNPACK)
        acc7 += _tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 7, UNPACK)
    out_row = out_ptr + pid_k.to(tl.int64) * stride_os + pid_m.to(tl.int64) * stride_om
    _store_col(out_row, b_ptr, acc0, offs_p, mask_p, HAS_BIAS, 0)
    _store_col(out_row, b_ptr, acc1, offs_p, mask_p, HAS_BIAS, 1)
    _store_col(out_row, b_ptr, acc2, offs_p, mask_p, HAS_BIAS, 2)
    _store_col(out_row, b_ptr, acc3, offs_p, mask_p, HAS_BIAS, 3)
    _store_col(out_row, b_ptr, acc4, offs_p, mask_p, HAS_BIAS, 4)
    _store_col(out_row, b_ptr, acc5, offs_p, mask_p, HAS_BIAS, 5)
    _store_col(out_row, b_ptr, acc6, offs_p, mask_p, HAS_BIAS, 6)
    _store_col(out_row, b_ptr, acc7, offs_p, mask_p, HAS_BIAS, 7)
    if FINISH:
        finish_split(out_ptr, cnt_ptr, b_ptr, y_ptr, pid_m * tl.num_programs(1) + pid_n, pid_m, pid_n * BLOCK_P * 8,
                     N, stride_os, tl.num_programs(2), BLOCK_P * 8, FINISH_BIAS, FENCE)


@triton.jit(do_not_specialize=["M"])
def _awq_gemv_rows_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, b_ptr, out_ptr,
    M, N, N8, K, K_SPLIT, stride_xm, stride_om, stride_os, magic,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
    UNPACK: tl.constexpr, VEC: tl.constexpr, PDL: tl.constexpr = False,
):
    """`_awq_gemv_kernel` for ROWS rows in one program (program axis 0: a group of ROWS rows): each packed word is
    loaded and unpacked once and its values multiplied into every row, so a verification of k proposed tokens or a
    small batch reads and unpacks the weight once instead of once a row. Accumulators [BLOCK_P, ROWS] per nibble."""
    pdl.enter(PDL)
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_p = pid_n * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_p = tl.max_contiguous(tl.multiple_of(offs_p, VEC), VEC)
    mask_p = offs_p < N8
    offs_r = pid_m * ROWS + tl.arange(0, ROWS)
    mask_r = offs_r < M
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = qw_ptr + offs_k.to(tl.int64)[None, :] * N8 + offs_p[:, None]  # [P, BLOCK_K]
    x_rows = x_ptr + offs_r.to(tl.int64)[:, None] * stride_xm + offs_k[None, :]  # [ROWS, BLOCK_K]
    k_start = pid_k * K_SPLIT
    k_end = tl.minimum(k_start + K_SPLIT, K)  # K_SPLIT and K are multiples of GROUP, GROUP of BLOCK_K
    acc0 = tl.zeros((BLOCK_P, ROWS), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_P, ROWS), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_P, ROWS), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_P, ROWS), dtype=tl.float32)
    acc4 = tl.zeros((BLOCK_P, ROWS), dtype=tl.float32)
    acc5 = tl.zeros((BLOCK_P, ROWS), dtype=tl.float32)
    acc6 = tl.zeros((BLOCK_P, ROWS), dtype=tl.float32)
    acc7 = tl.zeros((BLOCK_P, ROWS), dtype=tl.float32)
    w_ptrs += k_start.to(tl.int64) * N8
    step = BLOCK_K * N8
    for k0 in range(k_start, k_end, BLOCK_K):
        q = tl.load(w_ptrs, mask=mask_p[:, None], other=0).to(tl.uint32, bitcast=True)
        w_ptrs += step
        x = tl.load(x_rows + k0, mask=mask_r[:, None], other=0.0).to(tl.float32)
        xsum = tl.sum(x, axis=1)
        g = k0 // GROUP
        zw = tl.load(qz_ptr + g * N8 + offs_p, mask=mask_p, other=0).to(tl.uint32, bitcast=True)
        s_row = s_ptr + g.to(tl.int64) * N
        acc0 += _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 0, UNPACK)
        acc1 += _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 1, UNPACK)
        acc2 += _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 2, UNPACK)
        acc3 += _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 3, UNPACK)
        acc4 += _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 4, UNPACK)
        acc5 += _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 5, UNPACK)
        acc6 += _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 6, UNPACK)
        acc7 += _rows_tile_term(q, x, xsum, zw, s_row, offs_p, mask_p, magic, 7, UNPACK)
    out_rows = out_ptr + pid_k.to(tl.int64) * stride_os + offs_r.to(tl.int64)[None, :] * stride_om
    store_eight_positions(out_rows, b_ptr, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, offs_p, mask_p, mask_r,
                          HAS_BIAS)


# ---------------------------------------------------------------------------------------------------------------
# launchers


@triton.jit
def _awq_dequant_kernel(qw_ptr, qz_ptr, s_ptr, w_ptr, N, N8, GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
                        BLOCK_N: tl.constexpr, PDL: tl.constexpr = False):
    """w [K, N] = (q - z) * s for a BLOCK_K x BLOCK_N tile (BLOCK_K divides G: one zero and scale row)."""
    pdl.enter(PDL)
    pid_k, pid_n = tl.program_id(0), tl.program_id(1)
    kk = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    offs_p = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_p, mask_n = offs_p < N8, offs_n < N
    g = (pid_k * BLOCK_K) // GROUP
    q = tl.load(qw_ptr + kk[:, None] * N8 + offs_p[None, :], mask=mask_p[None, :], other=0)
    z = tl.load(qz_ptr + g * N8 + offs_p, mask=mask_p, other=0)
    s = tl.load(s_ptr + g.to(tl.int64) * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    w = _int4_minus_zero(q, z[None, :], BLOCK_N) * s[None, :]
    tl.store(w_ptr + kk[:, None] * N + offs_n[None, :], w.to(w_ptr.dtype.element_ty), mask=mask_n[None, :])


def _launch(kernel, x, weights: tuple, sizes: tuple, bias, y, n: int, k: int, cfg: tuple, max_block_k: int,
            weight_bytes: int, **meta) -> torch.Tensor:
    """Clip cfg to the shape, pick SPLIT_K, run the kernel (and the split sum)."""
    m = x.shape[0]
    block_m, block_n, block_k, split, warps, stages = cfg[:6]
    late = len(cfg) > 6 and bool(cfg[6]) and block_m == 1
    if block_m > 1:  # tl.dot's smallest tile is 16; no taller than the rows need
        block_m = max(16, min(block_m, triton.next_power_of_2(m)))
        block_n = max(block_n, 16)
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    block_k = max(16, min(block_k, max_block_k))
    k_tiles = triton.cdiv(k, block_k)
    grid_m, grid_n = triton.cdiv(m, block_m), triton.cdiv(n, block_n)
    if split == 0:
        split = split_k(grid_m * grid_n, k_tiles, m * n * 4, weight_bytes, num_sms(x.device))
    k_split = triton.cdiv(k_tiles, max(1, min(split, k_tiles))) * block_k
    split = triton.cdiv(k, k_split)  # no empty splits
    dst = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    kernel[(grid_m, grid_n, split)](
        x, *weights, bias if bias is not None else y, dst, *sizes, k, k_split,
        x.stride(0), n, m * n,
        HAS_BIAS=bias is not None and split == 1, IEEE=x.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, LATE_REDUCE=late,
        num_warps=warps, num_stages=stages, **meta, **pdl.launch_args(),
    )
    if split > 1:
        sum_splits(dst, bias, y)
    return y


def gemv_split_k(col_tiles: int, groups: int, partial_bytes: int, weight_bytes: int, num_sms: int) -> int:
    """K splits for the one-row INT4 walk: doubled while there are fewer than GEMV_PROGRAMS_PER_SM programs per
    SM (a memory-bound walk needs many loads in flight), each split keeps at least 2 groups, and the fp32
    partials (written, then read) stay within an eighth of the weight's bytes."""
    split = 1
    while (col_tiles * split < GEMV_PROGRAMS_PER_SM * num_sms and groups >= 4 * split
           and 4 * split * partial_bytes <= weight_bytes // 8):
        split *= 2
    return split


def _launch_awq_gemv(x, qweight, qzeros, scales, group_size: int, bias, y, cfg: tuple) -> torch.Tensor:
    """A "gemv" config (a program per row) or an "rgemv" one: ("rgemv", BLOCK_P, BLOCK_K, num_warps, ROWS, unpack),
    ROWS rows a program (`_awq_gemv_rows_kernel`; one row walks as "gemv" does)."""
    if cfg[0] == "rgemv":
        _, block_p, block_k, warps, rows = cfg[:5]
        prefetch = False
    else:
        _, block_p, block_k, warps, prefetch = cfg[:5]
        rows = 1
    unpack = cfg[5] if len(cfg) > 5 else 0
    if unpack == 2 and x.dtype == torch.float32:
        unpack = 0  # UNPACK 2 cancels 2**23 * sum x after the dot (~1e-4 relative): fp32 activations get the exact walk
    vec = max(1, min(4, block_p // (32 * warps)))
    m, k = x.shape
    n = y.shape[1]
    n8 = n // 8
    block_p = min(block_p, triton.next_power_of_2(n8))
    block_k = min(block_k, group_size)
    groups = k // group_size
    tiles = triton.cdiv(n8, block_p)
    weight_bytes = k * n // 2 + groups * n // 2 + groups * n * scales.element_size()
    split = gemv_split_k(tiles, groups, m * n * 4, weight_bytes, num_sms(x.device))
    k_split = triton.cdiv(groups, split) * group_size
    split = triton.cdiv(k, k_split)
    dst = y if split == 1 else torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    if rows > 1 and m > 1:
        rows = min(rows, triton.next_power_of_2(m))
        _awq_gemv_rows_kernel[(triton.cdiv(m, rows), tiles, split)](
            x, qweight, qzeros, scales, bias if bias is not None else y, dst, m, n, n8, k, k_split,
            x.stride(0), n, m * n, 0x4B000000, GROUP=group_size, HAS_BIAS=bias is not None and split == 1,
            BLOCK_P=block_p, BLOCK_K=block_k, ROWS=rows, UNPACK=unpack, VEC=vec, num_warps=warps, num_stages=1,
            **pdl.launch_args(),
        )
    else:
        counters = split_counters(x.device, m * tiles) if split > 1 else None
        _awq_gemv_kernel[(m, tiles, split)](
            x, qweight, qzeros, scales, bias if bias is not None else y, dst, y,
            counters if counters is not None else y, n, n8, k, k_split,
            x.stride(0), n, m * n, 0x4B000000, GROUP=group_size, HAS_BIAS=bias is not None and split == 1,
            BLOCK_P=block_p, BLOCK_K=block_k, PREFETCH=bool(prefetch), UNPACK=unpack, VEC=vec,
            FINISH=counters is not None, FINISH_BIAS=bias is not None, FENCE=x.device.type == "cuda",
            num_warps=warps, num_stages=1, **pdl.launch_args(),
        )
        if counters is not None:
            return y
    if split > 1:
        sum_splits(dst, bias, y)
    return y


def awq_kmajor_linear(x: torch.Tensor, qweight_k: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                      group_size: int, bias: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """awq_linear for a K-major qweight (kernels/awq_mma.py, AWQLinear.use_kmajor): this GPU's tuned config for the
    shape and row bucket ("awq_kmajor" in its table, from benchmarks/awq_mma.py --write-tuned), else
    default_mma_config's."""
    cfg = kmajor_config(x.shape[0], qweight_k.shape[1], qweight_k.shape[0] * 8, group_size, x.device)
    return awq_mma_linear(x, qweight_k, qzeros, scales, group_size, bias, cfg, out)


def kmajor_config(m: int, n: int, k: int, group_size: int, device: torch.device) -> tuple:
    """The K-major kernels' config for m rows of an [N, K] layer: the tuned one, else default_mma_config's (a tuned
    tile config serves up to awq_mma.MMA_MAX_ROWS rows, as the default does; above, dequant + cuBLAS). 2-4 rows
    with no "few" entry take the "skinny" one: a 16-row tile costs what one row costs (an H100 replayed 70B's
    decode at 2-4 rows in 20.6-20.9 ms on the default config against 18.9-19.5 at 8-16 on the tuned one, run 31)."""
    bucket, key = row_bucket(m), tuned_key(n, k, group_size)
    cfg = tuned_entry(device, "awq_kmajor", bucket, key)
    if cfg is None and bucket == "few":
        cfg = tuned_entry(device, "awq_kmajor", "skinny", key)
    if cfg is None or (cfg[0] != "dequant" and m > MMA_MAX_ROWS):
        cfg = default_mma_config(m)
    return cfg


def awq_dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                   config: tuple = _DEQUANT[0]) -> torch.Tensor:
    """The INT4 weight as a dense [K, N] tensor in scales' dtype: (q - z) * s, on the GPU in one pass."""
    k = qweight.shape[0] if qweight.dim() else 0  # the checks of awq_linear, for an x with no rows
    check_awq_args(scales.new_empty(0, k), qweight, qzeros, scales, group_size, None, "awq_dequantize")
    if not (qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous()):
        raise ValueError("awq_dequantize: qweight, qzeros and scales must be contiguous")
    return _dequantize(qweight, qzeros, scales, group_size, config)


def _dequantize(qweight, qzeros, scales, group_size: int, config: tuple) -> torch.Tensor:
    """awq_dequantize's launch, for arguments already checked (awq_linear's "dequant" path)."""
    _, block_k, block_n, warps = config[:4]
    k, n = qweight.shape[0], scales.shape[1]
    block_k = min(block_k, group_size)
    block_n = min(block_n, max(16, triton.next_power_of_2(n)))
    w = torch.empty(k, n, dtype=scales.dtype, device=qweight.device)
    _awq_dequant_kernel[(k // block_k, triton.cdiv(n, block_n))](
        qweight, qzeros, scales, w, n, n // 8, GROUP=group_size, BLOCK_K=block_k, BLOCK_N=block_n,
        num_warps=warps, **pdl.launch_args(),
    )
    return w


def _awq_via_dense(x, qweight, qzeros, scales, group_size: int, bias, y, cfg: tuple) -> torch.Tensor:
    w = _dequantize(qweight, qzeros, scales, group_size, cfg)
    if bias is None:
        return torch.matmul(x, w, out=y)
    return torch.addmm(bias, x, w, out=y)


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                config: tuple | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (qweight int8 [N, K] * scales [N, 1]).T (+ bias [N]) -> [M, N] in x's dtype.
    config: an INT8_CONFIGS entry; None takes `default_config`'s (tuned for this GPU, else the bucket's first)."""
    n, k = check_int8_args(x, qweight, scales, bias, "int8_linear")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if not (qweight.is_contiguous() and scales.is_contiguous()):
        raise ValueError("int8_linear: qweight and scales must be contiguous")
    y = output_buffer(x, n, out)
    if x.shape[0] == 0:
        return y
    cfg = config if config is not None else default_config("int8", x.shape[0], n, k, x.device)
    return weight8_linear(x, qweight, scales, bias, y, cfg)


def weight8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                   y: torch.Tensor, config: tuple) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] * scale [N, 1]).T (+ bias) into y: an int8 or float8 E4M3 weight with a scale
    per output feature of any float dtype, x not quantized (the INT8 weight-only kernels, config an INT8_CONFIGS
    entry). The W8A8 layers' decode path where it measures faster than quantizing the rows (`scaled_linear`'s
    "wo" configs): the same bytes of weight, no activation rounding."""
    n, k = weight.shape
    return _launch(_int8_kernel, x, (weight, scale), (x.shape[0], n), bias, y, n, k, config,
                   max_block_k=max(16, triton.next_power_of_2(k)), weight_bytes=n * k + n * scale.element_size())


def awq_linear(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
               group_size: int, bias: torch.Tensor | None = None, config: tuple | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [K, N] (+ bias [N]) -> [M, N] in x's dtype, w dequantized from qweight int32 [K, N // 8],
    qzeros int32 [K // G, N // 8] and scales [K // G, N] (the module docstring has the packing).
    config: an AWQ_CONFIGS entry; None takes `default_config`'s (tuned for this GPU, else the bucket's first)."""
    n, k = check_awq_args(x, qweight, qzeros, scales, group_size, bias, "awq_linear")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if not (qweight.is_contiguous() and qzeros.is_contiguous() and scales.is_contiguous()):
        raise ValueError("awq_linear: qweight, qzeros and scales must be contiguous")
    y = output_buffer(x, n, out)
    if x.shape[0] == 0:
        return y
    cfg = config if config is not None else default_config("awq", x.shape[0], n, k, x.device, group_size)
    if cfg[0] == "mma":
        if k % 128 == 0 and x.dtype in (torch.float16, torch.bfloat16):
            return awq_mma_natural(x, qweight, qzeros, scales, group_size, bias, cfg[1:], y)
        cfg = AWQ_CONFIGS[row_bucket(x.shape[0])][0]  # a shape or dtype it cannot run
    groups = k // group_size
    if cfg[0] in ("gemv", "rgemv"):
        return _launch_awq_gemv(x, qweight, qzeros, scales, group_size, bias, y, cfg)
    if cfg[0] == "dequant":
        return _awq_via_dense(x, qweight, qzeros, scales, group_size, bias, y, cfg)
    return _launch(_awq_kernel, x, (qweight, qzeros, scales), (x.shape[0], n, n // 8), bias, y, n, k, cfg,
                   max_block_k=group_size,
                   weight_bytes=k * n // 2 + groups * n // 2 + groups * n * scales.element_size(), GROUP=group_size)
