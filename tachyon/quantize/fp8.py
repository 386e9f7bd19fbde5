"""FP8: every linear's [N, K] weight as E4M3 with one absmax scale per output feature (the scale of
tachyon.layers.linear.quantize_fp8); the activations get an E4M3 scale per token at run time. The values are
rounded by GPTQ on the calibration text's inputs (tachyon.quantize.gptq; `--rounding gptq`, the default) or to
nearest (`--rounding nearest`: quantize_fp8 itself, no calibration). The checkpoint is llm-compressor's
FP8_DYNAMIC layout (compressed-tensors, float-quantized): `weight` float8_e4m3fn [N, K] and `weight_scale` fp32
[N, 1] per checkpoint linear."""

from __future__ import annotations

import torch

from tachyon.quantize.checkpoint import compressed_tensors_config
from tachyon.quantize.gptq import channel_tensors

QUANTIZATION_CONFIG = compressed_tensors_config("float")


def fp8_tensors(lm, samples: list[list[int]] | None) -> dict[str, torch.Tensor]:
    """samples: calibration sequences for GPTQ rounding, or None for round-to-nearest."""
    from tachyon.quantize.calibration import input_stats

    return channel_tensors(lm.model, "float", None if samples is None else input_stats(lm, samples))
