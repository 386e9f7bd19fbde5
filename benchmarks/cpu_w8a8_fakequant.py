"""Held-out perplexity of fp8 / w8a8 checkpoints written by `tachyon quantize`, run as a fake-quant model on the
CPU: the dense model with every linear's weight replaced by the checkpoint's dequantized one (weight *
weight_scale) and its input rounded to 8 bits with one absmax scale per token (int8: round(x / s) * s,
s = max|x| / 127; fp8: E4M3 of x / s, s = max|x| / 448), the rest (smoothed norms included) from the
checkpoint. This is what the engine's W8A8Linear / Fp8Linear compute, in fp32 torch, without the engine's layers.

    python benchmarks/cpu_w8a8_fakequant.py DIR [DIR ...]   # checkpoints from tachyon quantize --method fp8|w8a8

A `--method int8` checkpoint (weight-only, no smoothing) runs with int8 activations too: W8A8 without SmoothQuant.

One JSON line per checkpoint (and one for the dense model) on stdout; same text and windows as `tachyon eval ppl`.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from safetensors.torch import load_file

from tachyon.engine_args import EngineArgs
from tachyon.eval.ppl import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_SEQ_LEN,
    HELDOUT_DESCRIPTION,
    encode,
    heldout_text,
    load_model,
    perplexity,
)
from tachyon.quantize.checkpoint import LINEARS


def per_token(x: torch.Tensor, num_type: str) -> torch.Tensor:
    top = 127.0 if num_type == "int" else 448.0
    s = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / top
    if num_type == "int":
        return torch.round(x / s).clamp(-127, 127) * s
    return (x / s).to(torch.float8_e4m3fn).float() * s


def fake_quant(lm, ckpt: str) -> str:
    """Load checkpoint `ckpt` (compressed-tensors int-/float-quantized) into the dense lm.model as fake-quant."""
    qc = json.load(open(os.path.join(ckpt, "config.json")))["quantization_config"]
    tensors = load_file(os.path.join(ckpt, "model.safetensors"))
    if qc["quant_method"] == "int8":  # Tachyon's int8 weight-only layout: w8a8 without smoothing
        num_type = "int"
        tensors = {k.replace(".qweight", ".weight").replace(".scales", ".weight_scale"): v[:, None]
                   if k.endswith(".scales") else v for k, v in tensors.items()}
    else:
        num_type = qc["config_groups"]["group_0"]["input_activations"]["type"]
    dense = {}
    for name, t in tensors.items():
        if name.endswith(".weight_scale"):
            continue
        scale = tensors.get(name + "_scale")
        dense[name] = t.float() * scale.float() if scale is not None else t.float()
    lm.model.load_weights(dense.items())
    for layer in lm.model.layers:
        for name in LINEARS:
            layer.get_submodule(name).register_forward_pre_hook(lambda m, args: (per_token(args[0], num_type),))
    return num_type


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="*")
    p.add_argument("--model", default=None, help="the dense model they were made from (default: embedded)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN)
    p.add_argument("--no-dense", action="store_true")
    args = p.parse_args()

    def ppl(lm) -> dict:
        ids = encode(lm.tokenizer, heldout_text(), "held-out")[:args.max_tokens or None]
        return perplexity(lm, ids, args.seq_len).to_dict()

    source = EngineArgs(model=args.model, dtype="float32")
    if not args.no_dense:
        print(json.dumps({"case": "dense", "text": HELDOUT_DESCRIPTION, **ppl(load_model(source))}), flush=True)
    for ckpt in args.checkpoints:
        lm = load_model(source)
        num_type = fake_quant(lm, ckpt)
        print(json.dumps({"case": f"fake-quant {ckpt} ({num_type} weights, {num_type} activations per token)",
                          "text": HELDOUT_DESCRIPTION, **ppl(lm)}), flush=True)


if __name__ == "__main__":
    main()
