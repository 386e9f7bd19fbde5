"""Packed-weight layouts of the quantized linears and their torch references (no Triton: the CPU path and the
oracle of `quant_linear.py`'s kernels).

int8, weight-only: `qweight` int8 [N, K] (like nn.Linear.weight), `scales` [N]; w = qweight * scales[:, None].
int4 (W4A16, AWQ-style), "natural order": `qweight` int32 [K, N // 8], bits 4j..4j+3 of qweight[k, p] hold
q[k, 8p + j]; `qzeros` int32 [K // G, N // 8] the zero points, packed alike; `scales` [K // G, N];
w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n], y = x @ w.
AutoAWQ's checkpoints interleave the eight nibbles (`awq_to_natural` undoes that). The tensor-core kernels
(`awq_mma.py`) read a K-major repacking of qweight (`pack_int4_kmajor`, at the end of this file).

8-bit weights and activations (fp8 E4M3 or SmoothQuant-style int8, "W8A8"): `weight` [N, K] in float8_e4m3fn or
int8, `weight_scale` fp32 [N]; each row of x is quantized with its own scale (dynamic, per token:
s_x = max|x_row| / QMAX, QMAX 448 for E4M3, 127 for int8) or with one static `input_scale` from the checkpoint:
x_q = cast(x / s_x) (E4M3: saturated at +-448, rounded to nearest; int8: rounded half to even, clamped at +-127),
y = (x_q @ weight.T) * s_x[:, None] * weight_scale[None, :] + bias.
"""

from __future__ import annotations

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: nibble i of a packed word holds column AWQ_ORDER[i] of its 8


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[R, C] integers in 0..15 (C % 8 == 0) -> int32 [R, C // 8], nibble j of word p = column 8p + j."""
    if values.dim() != 2 or values.shape[1] % 8:
        raise ValueError(f"pack_int4 takes [R, C] with C a multiple of 8, got {tuple(values.shape)}")
    if values.dtype.is_floating_point or values.dtype == torch.bool:
        raise TypeError(f"pack_int4 takes integer values, got {values.dtype}")
    v = values.to(torch.int64)
    if v.numel() and (int(v.min()) < 0 or int(v.max()) > 15):
        raise ValueError("pack_int4 values must lie in 0..15")
    v = v.view(v.shape[0], -1, 8)
    packed = torch.zeros(v.shape[:2], dtype=torch.int64, device=v.device)
    for j in range(8):
        packed |= v[:, :, j] << (4 * j)
    # words with nibble 7 >= 8 exceed int32's range: store their two's-complement bits
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, P] -> int32 [R, 8P] of values 0..15 (the inverse of pack_int4)."""
    if packed.dim() != 2 or packed.dtype != torch.int32:
        raise TypeError(f"unpack_int4 takes an int32 [R, P] tensor, got {packed.dtype} {tuple(packed.shape)}")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    # >> on int32 copies the sign bit into the high bits; & 0xF keeps only the nibble
    return ((packed.unsqueeze(-1) >> shifts) & 0xF).reshape(packed.shape[0], -1)


def _check_x(x: torch.Tensor, k: int, what: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"{what}: x must be [M, K], got {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{what}: x must be float16, bfloat16 or float32, got {x.dtype}")
    if x.shape[1] != k:
        raise ValueError(f"{what}: x has {x.shape[1]} columns but the weight has K = {k}")


def _check_same_dtype(x: torch.Tensor, t: torch.Tensor | None, name: str, shape: tuple, what: str) -> None:
    if t is None:
        return
    if t.dtype != x.dtype:
        raise TypeError(f"{what}: {name} must be in x's dtype {x.dtype}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{what}: {name} must be {shape}, got {tuple(t.shape)}")


def check_int8_args(x, qweight, scales, bias, what: str) -> tuple[int, int]:
    if qweight.dtype != torch.int8 or qweight.dim() != 2:
        raise TypeError(f"{what}: qweight must be int8 [N, K], got {qweight.dtype} {tuple(qweight.shape)}")
    n, k = qweight.shape
    _check_x(x, k, what)
    _check_same_dtype(x, scales, "scales", (n,), what)
    _check_same_dtype(x, bias, "bias", (n,), what)
    return n, k


def check_awq_args(x, qweight, qzeros, scales, group_size, bias, what: str) -> tuple[int, int]:
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise TypeError(f"{what}: qweight must be int32 [K, N // 8], got {qweight.dtype} {tuple(qweight.shape)}")
    if qzeros.dtype != torch.int32:
        raise TypeError(f"{what}: qzeros must be int32 [K // G, N // 8], got {qzeros.dtype}")
    k, n = qweight.shape[0], qweight.shape[1] * 8
    if group_size < 32 or group_size & (group_size - 1):
        raise ValueError(f"{what}: group_size must be a power of two >= 32 (32, 64, 128), got {group_size}")
    if k % group_size:
        raise ValueError(f"{what}: K = {k} is not a multiple of group_size {group_size}; "
                         f"quantize with a group size that divides K")
    _check_x(x, k, what)
    if tuple(qzeros.shape) != (k // group_size, n // 8):
        raise ValueError(f"{what}: qzeros must be {(k // group_size, n // 8)}, got {tuple(qzeros.shape)}")
    _check_same_dtype(x, scales, "scales", (k // group_size, n), what)
    _check_same_dtype(x, bias, "bias", (n,), what)
    return n, k


def int8_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (qweight [N, K] * scales [N, 1]).T (+ bias), dequantized and computed in fp32 -> x's dtype."""
    check_int8_args(x, qweight, scales, bias, "int8_linear_ref")
    y = x.float() @ (qweight.float() * scales.float()[:, None]).T
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype)


SCALED_QMAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}


def check_scaled_args(x, weight, weight_scale, bias, input_scale, what: str) -> tuple[int, int]:
    if weight.dtype not in SCALED_QMAX or weight.dim() != 2:
        raise TypeError(f"{what}: weight must be float8_e4m3fn or int8 [N, K], got {weight.dtype} "
                        f"{tuple(weight.shape)}")
    n, k = weight.shape
    _check_x(x, k, what)
    if weight_scale.dtype != torch.float32 or tuple(weight_scale.shape) != (n,):
        raise TypeError(f"{what}: weight_scale must be float32 [{n}], got {weight_scale.dtype} "
                        f"{tuple(weight_scale.shape)}")
    if input_scale is not None and (input_scale.dtype != torch.float32 or input_scale.numel() != 1):
        raise TypeError(f"{what}: input_scale must be one float32 value, got {input_scale.dtype} "
                        f"{tuple(input_scale.shape)}")
    _check_same_dtype(x, bias, "bias", (n,), what)
    return n, k


def quantize_rows_ref(x: torch.Tensor, qtype: torch.dtype, input_scale: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (x_q [M, K] in qtype, fp32 scales [M]): per row (max|x_row| / QMAX), or input_scale for all."""
    qmax = SCALED_QMAX[qtype]
    xf = x.float()
    if input_scale is None:
        scales = xf.abs().amax(dim=1).clamp(min=1e-12) / qmax
    else:
        scales = input_scale.float().reshape(1).expand(x.shape[0])
    v = (xf / scales[:, None]).clamp(-qmax, qmax)
    return (torch.round(v) if qtype == torch.int8 else v).to(qtype), scales.contiguous()


def scaled_linear_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                      bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8: x quantized per row (or with input_scale) to weight's type, the product of the 8-bit values
    computed in fp32 and scaled back, -> x's dtype (the layout above)."""
    check_scaled_args(x, weight, weight_scale, bias, input_scale, "scaled_linear_ref")
    xq, xs = quantize_rows_ref(x, weight.dtype, input_scale)
    y = (xq.float() @ weight.float().T) * xs[:, None] * weight_scale[None, :]
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype)


def scaled_weight_only_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                           bias: torch.Tensor | None = None) -> torch.Tensor:
    """A W8A8 layer's weight-only product ("wo" configs): x unquantized @ (weight * weight_scale[:, None]).T in fp32
    (+ bias) -> x's dtype."""
    check_scaled_args(x, weight, weight_scale, bias, None, "scaled_weight_only_ref")
    y = x.float() @ (weight.float() * weight_scale[:, None]).T
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype)


def awq_linear_ref(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                   group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ w [K, N] (+ bias), w = (q - z) * s per group of group_size rows, in fp32 -> x's dtype."""
    check_awq_args(x, qweight, qzeros, scales, group_size, bias, "awq_linear_ref")
    w = dequantize_int4(qweight, qzeros, scales, group_size)
    y = x.float() @ w
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype)



def awq_to_natural(packed: torch.Tensor) -> torch.Tensor:
    """An AutoAWQ-packed int32 tensor (qweight or qzeros) in this module's natural nibble order."""
    u = unpack_int4(packed).reshape(packed.shape[0], -1, 8)
    cols = torch.empty_like(u)
    for i, c in enumerate(AWQ_ORDER):
        cols[:, :, c] = u[:, :, i]
    return pack_int4(cols.reshape(packed.shape[0], -1))


def natural_to_awq(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of awq_to_natural (what `tachyon quantize` writes, so AutoAWQ-format readers load it)."""
    u = unpack_int4(packed).reshape(packed.shape[0], -1, 8)
    nib = torch.empty_like(u)
    for i, c in enumerate(AWQ_ORDER):
        nib[:, :, i] = u[:, :, c]
    return pack_int4(nib.reshape(packed.shape[0], -1))


def dequantize_int4(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense [K, N] weight the int4 tensors stand for."""
    q = unpack_int4(qweight)
    z = unpack_int4(qzeros).repeat_interleave(group_size, dim=0)
    s = scales.to(dtype).repeat_interleave(group_size, dim=0)
    return (q - z).to(dtype) * s


# ---------------------------------------------------------------------------------------------------------------
# int4, K-major (kernels/awq_mma.py's tensor-core kernels): qweight int32 [K // 8, N], a word holds 8 rows of K of
# one output column, 16 rows apart:  word [16 t + i, n], nibble j = q[128 t + 16 j + i, n]  (t a 128-row tile of
# K, i in 0..15); qzeros and scales as in the natural layout. K must be a multiple of 128.

KMAJOR_TILE = 128


def check_awq_kmajor_args(x, qweight_k, qzeros, scales, group_size, bias, what: str) -> tuple[int, int]:
    if qweight_k.dtype != torch.int32 or qweight_k.dim() != 2:
        raise TypeError(f"{what}: qweight must be a K-major int32 [K // 8, N], got {qweight_k.dtype} "
                        f"{tuple(qweight_k.shape)}")
    k, n = qweight_k.shape[0] * 8, qweight_k.shape[1]
    if k % KMAJOR_TILE:
        raise ValueError(f"{what}: K = {k} must be a multiple of {KMAJOR_TILE}")
    if n % 8:
        raise ValueError(f"{what}: N = {n} must be a multiple of 8 (the zero points pack 8 columns a word)")
    # the natural layout's checks (group size, qzeros, scales, bias, x) on a stand-in qweight of its shape
    check_awq_args(x, qweight_k.new_empty(1, 1).expand(k, n // 8), qzeros, scales, group_size, bias, what)
    return n, k


def pack_int4_kmajor(qweight: torch.Tensor) -> torch.Tensor:
    """Natural-order qweight int32 [K, N // 8] -> the K-major int32 [K // 8, N] (above)."""
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise TypeError(f"pack_int4_kmajor takes an int32 [K, N // 8] qweight, got {qweight.dtype} "
                        f"{tuple(qweight.shape)}")
    k = qweight.shape[0]
    if k % KMAJOR_TILE:
        raise ValueError(f"pack_int4_kmajor: K = {k} must be a multiple of {KMAJOR_TILE}")
    q = unpack_int4(qweight)  # [K, N] values 0..15
    n = q.shape[1]
    q = q.view(k // KMAJOR_TILE, 8, 16, n)  # [t, j, i, n]
    packed = torch.zeros(k // KMAJOR_TILE, 16, n, dtype=torch.int64, device=q.device)
    for j in range(8):
        packed |= q[:, j].to(torch.int64) << (4 * j)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # int32 two's complement bits
    return packed.to(torch.int32).view(k // 8, n)


def unpack_int4_kmajor(packed: torch.Tensor) -> torch.Tensor:
    """K-major int32 [K // 8, N] -> int32 [K, N] of values 0..15 (the inverse of pack_int4_kmajor's packing)."""
    k8, n = packed.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    v = (packed.view(k8 // 16, 16, n).unsqueeze(1) >> shifts.view(1, 8, 1, 1)) & 0xF  # [t, j, i, n]
    return v.reshape(k8 * 8, n)


def dequantize_kmajor_ref(qweight_k: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                          group_size: int) -> torch.Tensor:
    """The dense [K, N] weight (q - z) * s in fp32, from the K-major qweight and the natural qzeros/scales."""
    q = unpack_int4_kmajor(qweight_k).float()
    z = unpack_int4(qzeros).float().repeat_interleave(group_size, 0)
    return (q - z) * scales.float().repeat_interleave(group_size, 0)


def awq_kmajor_ref(x: torch.Tensor, qweight_k: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                   group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w (+ bias) with the K-major qweight, dequantized and computed in fp32 -> x's dtype (the CPU path and
    the oracle of kernels/awq_mma.py)."""
    check_awq_kmajor_args(x, qweight_k, qzeros, scales, group_size, bias, "awq_kmajor_ref")
    y = x.float() @ dequantize_kmajor_ref(qweight_k, qzeros, scales, group_size)
    if bias is not None:
        y += bias.float()
    return y.to(x.dtype)
