"""RMSNorm, optionally fused with the residual add (the GPU path swaps in a Triton kernel)."""

from __future__ import annotations

import torch
from torch import nn

from tachyon.layers.linear import QuantizedRows


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.fused = None  # set by the GPU runner: fn(x, residual, weight, eps[, quant]) -> (out, new_residual[, q])
        # set with `fused` where an fp8/w8a8 linear reads the output: (8-bit dtype, static input scale or None)
        self.quantize_for: tuple[torch.dtype, torch.Tensor | None] | None = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without residual: norm(x). With residual: (norm(x + residual), x + residual), as one fused op on the GPU.
        With `quantize_for` (fused only) the norm comes as `QuantizedRows`: its rows quantized for the linear."""
        if self.fused is not None and self.quantize_for is not None:
            out, new_res, (q, scale) = self.fused(x, residual, self.weight, self.eps, self.quantize_for)
            rows = QuantizedRows(out, q, scale)
            return rows if residual is None else (rows, new_res)
        if residual is None:
            if self.fused is not None:
                return self.fused(x, None, self.weight, self.eps)[0]
            return rms_norm_ref(x, self.weight, self.eps)
        if self.fused is not None:
            return self.fused(x, residual, self.weight, self.eps)
        x = x + residual
        return rms_norm_ref(x, self.weight, self.eps), x
