"""GGUF checkpoints through the `gguf` package: config from the metadata, tensors dequantized to float32.

A GGUF file is converted once into an HF-style directory (config.json, model.safetensors, tokenizer files)
under ~/.cache/tachyon/, so later starts only read safetensors.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np
import torch

_ARCHS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
          "qwen3": "Qwen3ForCausalLM"}

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _reader(path: str):
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # the reader raises ValueError, struct errors, numpy errors ...
        raise ValueError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def gguf_config(path: str, reader=None) -> dict:
    """An HF config.json dict built from the GGUF metadata."""
    r = reader or _reader(path)
    arch = _field(r, "general.architecture")
    if arch not in _ARCHS:
        raise ValueError(f"unsupported GGUF architecture {arch!r} in {path}; Tachyon reads {sorted(_ARCHS)}")
    k = lambda name, default=None: _field(r, f"{arch}.{name}", default)
    names = {t.name for t in r.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(f"{path} bakes RoPE scaling into a rope_freqs tensor, which Tachyon does not read yet; "
                         f"use the HF checkpoint directory instead")
    heads = k("attention.head_count")
    hidden = k("embedding_length")
    tokens = _field(r, "tokenizer.ggml.tokens")
    cfg = {
        "architectures": [_ARCHS[arch]],
        "model_type": arch,
        "vocab_size": k("vocab_size") or (len(tokens) if tokens else None),
        "hidden_size": hidden,
        "intermediate_size": k("feed_forward_length"),
        "num_hidden_layers": k("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": k("attention.head_count_kv", heads),
        "head_dim": k("attention.key_length", hidden // heads),
        "rms_norm_eps": float(k("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(k("rope.freq_base", 10000.0)),
        "max_position_embeddings": k("context_length", 4096),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(r, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(r, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    scaling = k("rope.scaling.type")
    if scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(k("rope.scaling.factor"))}
    if None in (cfg["vocab_size"], cfg["hidden_size"], cfg["num_hidden_layers"], heads, cfg["intermediate_size"]):
        raise ValueError(f"{path} lacks model metadata (block count, embedding length, heads ...)")
    return cfg


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp interleaves the rotary halves of q/k rows for llama; put them back in HF's rotate-half order."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def iter_gguf_tensors(path: str, reader=None) -> Iterator[tuple[str, torch.Tensor]]:
    from gguf import quants

    r = reader or _reader(path)
    arch = _field(r, "general.architecture")
    heads = _field(r, f"{arch}.attention.head_count")
    kv_heads = _field(r, f"{arch}.attention.head_count_kv", heads)
    for t in r.tensors:
        base, _, suffix = t.name.rpartition(".")  # suffix: weight / bias
        parts = base.split(".")
        if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
            name = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
        elif base in _TOP_NAMES:
            name = f"{_TOP_NAMES[base]}.{suffix}"
        else:
            raise ValueError(f"unexpected tensor {t.name} in {path}")
        try:
            arr = quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ValueError(f"{t.name} in {path} uses {t.tensor_type.name}, which the gguf package cannot "
                             f"dequantize; convert the file to F16, Q8_0, Q4_0/1 or a K-quant") from None
        arr = np.array(arr, dtype=np.float32)  # a writable copy, not a view of the memory map
        if arch == "llama" and parts[-1] in ("attn_q", "attn_k"):
            arr = _unpermute(arr, heads if parts[-1] == "attn_q" else kv_heads)
        yield name, torch.from_numpy(arr)


def _cache_root() -> str:
    return os.environ.get("TACHYON_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "tachyon"))


def converted_dir(gguf_path: str) -> str:
    """Convert a GGUF file into a cached HF directory once; return the directory."""
    gguf_path = os.path.abspath(gguf_path)
    st = os.stat(gguf_path)
    key = hashlib.sha256(f"{gguf_path}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = os.path.basename(gguf_path).removesuffix(".gguf")
    out = os.path.join(_cache_root(), f"{stem}-{key}")
    if os.path.exists(os.path.join(out, "DONE")):
        return out
    os.makedirs(_cache_root(), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=_cache_root(), prefix=".convert-")
    try:
        reader = _reader(gguf_path)
        cfg = gguf_config(gguf_path, reader)
        from safetensors.torch import save_file

        from tachyon.models.progress import progress

        tensors = progress(iter_gguf_tensors(gguf_path, reader), len(reader.tensors),
                           f"Converting {os.path.basename(gguf_path)} (first start only)", unit="tensor")
        save_file(dict(tensors), os.path.join(tmp, "model.safetensors"))
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path))
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, "SOURCE"), "w") as f:
            f.write(gguf_path + "\n")
        open(os.path.join(tmp, "DONE"), "w").close()
        # one rename makes the whole directory appear. Another process (a second server's first start, a parallel
        # test worker) may have converted the same file meanwhile: then the rename fails (out is not empty) and
        # its directory, which may be in use, stays; only a leftover without DONE (a conversion killed before the
        # old layout's rename) is removed
        try:
            os.replace(tmp, out)
        except OSError:  # out is there and not empty
            if not os.path.exists(os.path.join(out, "DONE")):
                shutil.rmtree(out, ignore_errors=True)
                os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return out
