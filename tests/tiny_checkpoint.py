"""Tiny random Llama-family checkpoints written with torch and safetensors only (no transformers import, which
alone costs seconds; and the GPU image has it, this needs nothing more): tests and GPU check scripts share them.
Also a word-level tokenizer (with `tokenizers` only) whose vocabulary is a few given words."""

from __future__ import annotations

import json
import os

import torch


def write_tiny_qwen2(path, heads: int, kv_heads: int, quant: str | None = None) -> str:
    """A tiny random Qwen2 (qkv bias, tied embeddings) as safetensors, written without transformers (its import
    alone costs seconds); quant "awq": AutoAWQ int4 tensors in groups of 32 in place of the dense projections."""
    from safetensors.torch import save_file

    H, INTER, D, L, V, G = 128, 256, 32, 2, 515, 32
    gen = torch.Generator().manual_seed(0)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=gen) * scale

    tensors = {"model.embed_tokens.weight": rand(V, H), "model.norm.weight": 1 + rand(H, scale=0.1)}
    for i in range(L):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (heads * D, H), "self_attn.k_proj": (kv_heads * D, H),
                  "self_attn.v_proj": (kv_heads * D, H), "self_attn.o_proj": (H, heads * D),
                  "mlp.gate_proj": (INTER, H), "mlp.up_proj": (INTER, H), "mlp.down_proj": (H, INTER)}
        for name, (n, k) in shapes.items():
            if quant == "awq":
                from tachyon.quantize.awq import pack_awq

                tensors.update(pack_awq(p + name, torch.randint(0, 16, (n, k), generator=gen),
                                        torch.randint(6, 10, (n, k // G), generator=gen),
                                        torch.rand(n, k // G, generator=gen) * 0.02))
            else:
                tensors[p + name + ".weight"] = rand(n, k, scale=k ** -0.5)
        for name in ("q", "k", "v"):
            tensors[p + f"self_attn.{name}_proj.bias"] = rand(shapes[f"self_attn.{name}_proj"][0])
        tensors[p + "input_layernorm.weight"] = 1 + rand(H, scale=0.1)
        tensors[p + "post_attention_layernorm.weight"] = 1 + rand(H, scale=0.1)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    cfg = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": V, "hidden_size": H, "intermediate_size": INTER,
           "num_hidden_layers": L, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": D,
           "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "eos_token_id": 2,
           "bos_token_id": 1}
    if quant == "awq":
        cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": G, "zero_point": True,
                                      "version": "gemm"}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return str(path)


def write_wordlevel_tokenizer(path, words: list[str]) -> None:
    """tokenizer.json + tokenizer_config.json in `path`: ids 0, 1, 2 are <unk>, <s>, </s>, then `words` (split on
    whitespace, nothing else): a vocabulary that spells only what its words do."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
                   "eos_token": "</s>"}, f)
