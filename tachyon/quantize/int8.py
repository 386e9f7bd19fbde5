"""int8 weight-only: every linear's [N, K] weight as int8 with one absmax scale per output feature
(tachyon.layers.linear.quantize_int8, the same rounding as `--quantization int8` on a dense checkpoint)."""

from __future__ import annotations

import torch
from torch import nn

from tachyon.layers.linear import quantize_int8
from tachyon.quantize.checkpoint import linears, parts

QUANTIZATION_CONFIG = {"quant_method": "int8", "bits": 8, "symmetric": True, "strategy": "channel",
                       "modules_to_not_convert": ["lm_head"]}


def int8_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """`qweight` int8 [N, K] and `scales` fp32 [N] per checkpoint linear (Int8Linear.load's int8 format)."""
    out = {}
    for i, name, linear in linears(model):
        for part in parts(model.cfg, i, name):
            q, s = quantize_int8(linear.weight.data[part.start:part.start + part.size])
            out[part.hf_name + ".qweight"], out[part.hf_name + ".scales"] = q.cpu(), s.cpu()
    return out
