"""Packed-weight layouts of the quantized linears and their torch references (no Triton: the CPU path and the
oracle of `quant_linear.py`'s kernels).

int8, weight-only: `qweight` int8 [N, K] (like nn.Linear.weight), `scales` [N]; w = qweight * scales[:, None].
int4 (W4A16, AWQ-style), "natural order": `qweight` int32 [K, N // 8], bits 4j..4j+3 of qweight[k, p] hold
q[k, 8p + j]; `qzeros` int32 [K // G, N // 8] the zero points, packed alike; `scales` [K // G, N];
w[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n], y = x @ w.
AutoAWQ's checkpoints interleave the eight nibbles (`awq_to_natural` undoes that).
"""

from __future__ import annotations

import torch

_SHIFTS = tuple(range(0, 32, 4))
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: nibble i of a packed word holds column AWQ_ORDER[i] of its 8


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """[R, C] integers 0..15 (C % 8 == 0) -> int32 [R, C // 8], column 8p + j in bits 4j..4j+3 of word p."""
    R, C = values.shape
    if C % 8:
        raise ValueError(f"pack_int4 packs 8 values per int32: {C} columns is not a multiple of 8")
    v = values.to(torch.int32).reshape(R, C // 8, 8)
    out = torch.zeros(R, C // 8, dtype=torch.int32, device=values.device)
    for j, s in enumerate(_SHIFTS):
        out |= (v[:, :, j] & 0xF) << s
    return out


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [R, P] -> int32 [R, 8P] values 0..15 (the inverse of pack_int4)."""
    shifts = torch.tensor(_SHIFTS, dtype=torch.int32, device=packed.device)
    return ((packed.unsqueeze(-1) >> shifts) & 0xF).reshape(packed.shape[0], -1)


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


def int8_linear_ref(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    w = qweight.to(torch.float32) * scales.to(torch.float32)[:, None]
    y = x.to(torch.float32) @ w.T
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def awq_linear_ref(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                   group_size: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = x.to(torch.float32) @ dequantize_int4(qweight, qzeros, scales, group_size)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)
