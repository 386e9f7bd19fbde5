"""SmoothQuant W8A8 (Xiao et al. 2022): int8 weights with one scale per output feature, int8 activations with
one scale per token (computed at run time), made less lossy by moving the activations' outlier channels into the
weights first.

Per-token int8 rounds every channel of a token on one scale, set by its largest channel; a few input channels
of an LLM's linears run 10-100x larger than the rest, so the others keep only a few levels. Dividing input
channel j by s_j and multiplying weight column j by s_j leaves the product unchanged,

    y = x W^T = (x / s) (W diag(s))^T,     s_j = max|X_j|^alpha / max|W_:,j|^(1 - alpha)

and evens out the activations (alpha = 1: all of the range moved into the weights, 0: none). max|X_j| is taken
over calibration tokens, max|W_:,j| over every weight reading input j (all of q/k/v, both of gate/up). The
division is folded into the op before (tachyon.quantize.awq.fold_scale), so the model is the same function:

    qkv_proj      <- input_layernorm's weight
    gate_up_proj  <- post_attention_layernorm's weight
    down_proj     <- up_proj's rows (down's input is silu(gate) * up, linear in up)

o_proj is not smoothed (llm-compressor's default Llama mappings). Then every linear's weight is rounded to int8
on quantize_int8's grid (absmax / 127 per output feature): by GPTQ on the smoothed inputs (`--rounding gptq`,
the default; tachyon.quantize.gptq) or to nearest (quantize_int8 itself). Alpha 0.5 (SmoothQuant's) gave a lower
held-out perplexity on the embedded model than 0.8 (llm-compressor's): benchmarks/results/cpu_quant_ppl.md. The checkpoint is llm-compressor's W8A8 layout (compressed-tensors,
int-quantized): `weight` int8 [N, K] and `weight_scale` fp32 [N, 1] per checkpoint linear; the smoothed norms
and up rows go out as the dense tensors.
"""

from __future__ import annotations

import torch
from torch import nn

from tachyon.config import ModelConfig
from tachyon.quantize.awq import fold_scale, scale_groups
from tachyon.quantize.calibration import InputStats, input_stats
from tachyon.quantize.checkpoint import LINEARS, compressed_tensors_config
from tachyon.quantize.gptq import channel_tensors

QUANTIZATION_CONFIG = compressed_tensors_config("int")
DEFAULT_ALPHA = 0.5
SMOOTHED = ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj")
MIN_RANGE = 1e-5  # floor of max|X_j| and max|W_:,j|: a dead channel gets a finite factor


def smoothing_factor(act_max: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """s [K] of a linear with weight w [N, K] whose inputs reach act_max [K] per channel."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"--alpha {alpha}: SmoothQuant's migration strength lies in [0, 1]")
    w_max = w.float().abs().amax(0).clamp(min=MIN_RANGE)
    return act_max.float().clamp(min=MIN_RANGE).pow(alpha) / w_max.pow(1 - alpha)


@torch.no_grad()
def smooth_layer(layer: nn.Module, cfg: ModelConfig, stats: dict[str, InputStats],
                 alpha: float) -> dict[str, torch.Tensor]:
    """Fold the smoothing factors of one decoder layer into it, in place, and make `stats` those of the smoothed
    inputs (x / s); returns the factors."""
    factors = {}
    for name, prev, rows in scale_groups(layer, cfg):
        linear = layer.get_submodule(name)
        factors[name] = s = smoothing_factor(stats[name].abs_max, linear.weight.data, alpha)
        fold_scale(prev, rows, linear, s)
        stats[name] = stats[name].scaled(s)
    return factors


def smooth(lm, samples: list[list[int]], alpha: float = DEFAULT_ALPHA,
           stats: list[dict[str, InputStats]] | None = None) -> list[dict[str, torch.Tensor]]:
    """SmoothQuant on lm.model (a tachyon.eval.ppl.LoadedModel, dense), in place: the same function, activations
    of the smoothed linears evened out. One pass over the calibration text (or `stats`, its InputStats, made
    those of the smoothed inputs here): smoothing one layer leaves the inputs of the others as they were.
    Returns each layer's factors."""
    if stats is None:
        stats = input_stats(lm, samples, SMOOTHED, gram=False)
    return [smooth_layer(layer, lm.model.cfg, st, alpha) for layer, st in zip(lm.model.layers, stats, strict=True)]


def w8a8_tensors(lm, samples: list[list[int]], alpha: float = DEFAULT_ALPHA,
                 rounding: str = "nearest") -> dict[str, torch.Tensor]:
    """Smooth lm.model in place, then round every linear to int8 per output feature (compressed-tensors names):
    rounding "nearest" (quantize_int8) or "gptq" (on the smoothed inputs' Gram matrices)."""
    gptq = rounding == "gptq"
    stats = input_stats(lm, samples, LINEARS if gptq else SMOOTHED, gram=gptq)
    smooth(lm, samples, alpha, stats)
    return channel_tensors(lm.model, "int", stats if gptq else None)
