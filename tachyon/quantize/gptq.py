"""GPTQ (Frantar et al. 2022): round a weight [N, K] one input column at a time, each column's rounding error
spread over the columns not yet rounded through the inverse Gram matrix of the calibration inputs, so that the
error of the outputs x W^T on those inputs stays small, not that of each weight:

    H = X^T X + damp,  U = chol(H^-1) (upper)
    for column k:  q_k = round(w_k);  e = (w_k - q_k) / U_kk;  w_j -= e * U_kj  (j > k)

Blocks of GPTQ_BLOCK columns are done at a time; the columns after a block are updated once at its end.
The rounding grid is the caller's (`round_column`): AWQ's int4 groups (tachyon.quantize.awq), or 8 bits with one
scale per output feature (`gptq_channel`: int8 or E4M3, the scale of tachyon.layers.linear's quantize_int8 /
quantize_fp8, fixed from the dense weight)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from tachyon.layers.linear import FP8_MAX, quantize_fp8, quantize_int8

GPTQ_DAMP = 0.01  # added to the Gram matrix's diagonal, times its mean, before it is inverted
GPTQ_BLOCK = 128  # columns rounded between two updates of the rest of the weight


def gptq(w: torch.Tensor, gram: torch.Tensor, round_column: Callable[[int, torch.Tensor], torch.Tensor],
         block: int = GPTQ_BLOCK) -> None:
    """GPTQ's loop over the columns of w [N, K] with Gram matrix gram [K, K]. round_column(k, rest) gets the
    weights not yet rounded, rest [N, columns left in the block] (column k first, as updated by the errors so
    far), and returns column k rounded (in w's units); it keeps what it rounded to itself."""
    N, K = w.shape
    W = w.double().clone()
    H = gram.double().clone()
    dead = H.diagonal() == 0  # inputs that were always 0: their weights do not matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H.diagonal().add_(GPTQ_DAMP * H.diagonal().mean())
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    for b0 in range(0, K, block):
        b1 = min(b0 + block, K)
        W1, E1, h1 = W[:, b0:b1].clone(), torch.zeros(N, b1 - b0, dtype=torch.float64, device=w.device), hinv[b0:b1, b0:b1]
        for i in range(b1 - b0):
            err = (W1[:, i] - round_column(b0 + i, W1[:, i:])) / h1[i, i]
            W1[:, i:] -= err[:, None] * h1[i, i:][None, :]
            E1[:, i] = err
        W[:, b1:] -= E1 @ hinv[b0:b1, b1:]


def round_to_grid(x: torch.Tensor, num_type: str) -> torch.Tensor:
    """x in units of its scale -> the nearest 8-bit value (int8 in -127..127, or E4M3), in x's dtype."""
    if num_type == "int":
        return torch.round(x).clamp(-127, 127)
    return x.clamp(-FP8_MAX, FP8_MAX).float().to(torch.float8_e4m3fn).to(x.dtype)


def gptq_channel(w: torch.Tensor, gram: torch.Tensor, num_type: str) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (int8 or float8_e4m3fn [N, K], fp32 scales [N]) as quantize_int8 / quantize_fp8 give them
    (the same scales), the values rounded by GPTQ."""
    quantize, dtype = (quantize_int8, torch.int8) if num_type == "int" else (quantize_fp8, torch.float8_e4m3fn)
    _, scales = quantize(w)
    s = scales.double()
    q = torch.zeros(w.shape, dtype=torch.float32, device=w.device)

    def round_column(col: int, rest: torch.Tensor) -> torch.Tensor:
        qi = round_to_grid(rest[:, 0] / s, num_type)
        q[:, col] = qi.float()
        return qi * s

    gptq(w, gram, round_column)
    return q.to(dtype), scales


def channel_tensors(model, num_type: str, stats: list[dict] | None, progress: bool = True) -> dict[str, torch.Tensor]:
    """Every linear of model as 8-bit per output feature in compressed-tensors' names (checkpoint.
    compressed_tensors), rounded by GPTQ on stats[layer][linear].gram (tachyon.quantize.calibration.InputStats
    of its inputs, as the model's weights now see them), or to nearest where stats is None."""
    from tachyon.quantize.checkpoint import compressed_tensors

    if stats is None:
        nearest = quantize_int8 if num_type == "int" else quantize_fp8
        return compressed_tensors(model, lambda i, name, w: nearest(w))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(stats) * len(stats[0]), desc="GPTQ", unit="linear", dynamic_ncols=True)

    def quantize(i: int, name: str, w: torch.Tensor):
        out = gptq_channel(w, stats[i][name].gram, num_type)
        if bar is not None:
            bar.update()
        return out

    try:
        return compressed_tensors(model, quantize)
    finally:
        if bar is not None:
            bar.close()
