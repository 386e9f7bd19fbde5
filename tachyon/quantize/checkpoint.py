"""From Tachyon's dense model back to a checkpoint in HF's names: the fused projections split into the layers
the checkpoint names (q/k/v_proj, gate/up_proj), the unquantized tensors, and the output directory.

    Tachyon:  layers.{i}.self_attn.qkv_proj   rows [0, q) | [q, q + kv) | [q + kv, q + 2 kv)
    HF:       model.layers.{i}.self_attn.q_proj / k_proj / v_proj
    Tachyon:  layers.{i}.mlp.gate_up_proj     rows [0, I) | [I, 2 I)
    HF:       model.layers.{i}.mlp.gate_proj / up_proj
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from tachyon.config import ModelConfig

LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
# files of a checkpoint directory that travel with the weights (tokenizer, chat template, generation defaults)
SIDE_FILES = ("tokenizer", "special_tokens_map", "added_tokens", "vocab", "merges", "chat_template",
              "generation_config")


@dataclass(frozen=True)
class Part:
    """One checkpoint linear inside a fused Tachyon linear: output rows [start, start + size)."""

    hf_name: str  # model.layers.0.self_attn.q_proj
    start: int
    size: int


def parts(cfg: ModelConfig, layer: int, linear: str) -> list[Part]:
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    pre = f"model.layers.{layer}."
    if linear == "self_attn.qkv_proj":
        return [Part(pre + "self_attn.q_proj", 0, q), Part(pre + "self_attn.k_proj", q, kv),
                Part(pre + "self_attn.v_proj", q + kv, kv)]
    if linear == "mlp.gate_up_proj":
        return [Part(pre + "mlp.gate_proj", 0, inter), Part(pre + "mlp.up_proj", inter, inter)]
    out = cfg.hidden_size
    return [Part(pre + linear, 0, out)]


def linears(model: nn.Module) -> Iterator[tuple[int, str, nn.Linear]]:
    """(layer index, LINEARS name, the dense module) of every linear that gets quantized."""
    for i, layer in enumerate(model.layers):
        for name in LINEARS:
            yield i, name, layer.get_submodule(name)


def compressed_tensors_config(num_type: str) -> dict:
    """config.json's quantization_config for 8-bit weights with a scale per output feature and 8-bit activations
    with a scale per token computed at run time, as llm-compressor writes it (compressed-tensors' W8A8 and
    FP8_DYNAMIC schemes). num_type: "int" or "float" (E4M3)."""
    if num_type not in ("int", "float"):
        raise ValueError(f"num_type {num_type!r}: int or float")
    args = {"num_bits": 8, "type": num_type, "symmetric": True}
    return {"quant_method": "compressed-tensors", "format": f"{num_type}-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {**args, "strategy": "channel", "dynamic": False},
                                          "input_activations": {**args, "strategy": "token", "dynamic": True}}},
            "ignore": ["lm_head"]}


def compressed_tensors(model: nn.Module, quantize) -> dict[str, torch.Tensor]:
    """`weight` (8-bit [N, K]) and `weight_scale` (fp32 [N, 1]) per checkpoint linear, compressed-tensors'
    int-/float-quantized layout. quantize(layer index, LINEARS name, the fused linear's dense weight [N, K]) ->
    (8-bit [N, K], scales [N]); one scale per output feature, so each part is its rows."""
    out = {}
    for i, name, linear in linears(model):
        q, s = quantize(i, name, linear.weight.data)
        for part in parts(model.cfg, i, name):
            rows = slice(part.start, part.start + part.size)
            out[part.hf_name + ".weight"] = q[rows].cpu().clone()
            out[part.hf_name + ".weight_scale"] = s[rows].float()[:, None].cpu().clone()
    return out


def dense_tensors(model: nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Everything the quantized checkpoint keeps dense, in HF's names: embeddings, norms, lm_head, biases."""
    cfg: ModelConfig = model.cfg
    quantized = {f"layers.{i}.{name}.weight" for i, name, _ in linears(model)}
    out = {}
    for name, p in model.named_parameters():
        if name in quantized or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        if name.endswith(".bias") and name.removesuffix(".bias") + ".weight" in quantized:
            i, linear = int(name.split(".")[1]), name.split(".", 2)[2].removesuffix(".bias")
            for part in parts(cfg, i, linear):
                out[part.hf_name + ".bias"] = p.data[part.start:part.start + part.size].to(dtype).contiguous()
            continue
        out[name if name == "lm_head.weight" else "model." + name] = p.data.to(dtype).contiguous()
    return out


def checkpoint_dtype(hf_config: dict) -> torch.dtype:
    from tachyon.config import parse_dtype

    name = hf_config.get("torch_dtype") or hf_config.get("dtype") or "float32"
    try:
        return parse_dtype(name)
    except ValueError:
        return torch.float32


def prepare_out_dir(out: str, src: str, overwrite: bool) -> None:
    if os.path.abspath(out) == os.path.abspath(src):
        raise ValueError(f"--out {out} is the input checkpoint: write the quantized one elsewhere")
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise ValueError(f"--out {out} exists and is not empty: pass --overwrite or choose another directory")
        for f in os.listdir(out):
            if f.endswith(".safetensors") or f in ("config.json", "model.safetensors.index.json"):
                os.remove(os.path.join(out, f))
    os.makedirs(out, exist_ok=True)


def write_checkpoint(out: str, src: str, tensors: dict[str, torch.Tensor], hf_config: dict,
                     quantization_config: dict, dtype: torch.dtype) -> None:
    """model.safetensors + config.json (with quantization_config) + the tokenizer files of `src`."""
    from safetensors.torch import save_file

    save_file({k: v.cpu().contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"),
              metadata={"format": "pt"})
    cfg = dict(hf_config)
    for key in ("torch_dtype", "dtype") if "dtype" in cfg else ("torch_dtype",):  # transformers 5 writes dtype
        cfg[key] = str(dtype).removeprefix("torch.")
    cfg["quantization_config"] = quantization_config
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in sorted(os.listdir(src)):
        if name.startswith(SIDE_FILES) and os.path.isfile(os.path.join(src, name)):
            shutil.copy2(os.path.join(src, name), os.path.join(out, name))
