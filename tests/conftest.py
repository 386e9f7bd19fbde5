"""Shared fixtures: the embedded model (Tachyon and the transformers oracle), tiny random checkpoints."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def embedded_dir():
    from tachyon.models.embedded import embedded_model_dir

    return embedded_model_dir()


@pytest.fixture(scope="session")
def hf_embedded(embedded_dir):
    """transformers' own reading of the embedded GGUF, in fp32: the correctness oracle."""
    import transformers
    from transformers import AutoModelForCausalLM

    from tachyon.models.embedded import embedded_gguf_path

    transformers.logging.set_verbosity_error()
    path = embedded_gguf_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def llm():
    from tachyon import LLM

    return LLM(swap_space=0)


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding with transformers' KV cache: argmax every step, EOS ignored."""
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        out = model(ids, use_cache=True)
        past = out.past_key_values
        tokens = []
        nxt = out.logits[0, -1].argmax().item()
        for _ in range(max_new_tokens):
            tokens.append(nxt)
            if len(tokens) == max_new_tokens:
                break
            out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            nxt = out.logits[0, -1].argmax().item()
        return tokens


TINY_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def make_tiny_checkpoint(family: str, path: str, seed: int = 0):
    """A tiny random model of one family, saved as sharded safetensors; returns the transformers model."""
    import transformers

    common = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  initializer_range=0.2, rms_norm_eps=1e-5, tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
    if family == "llama":
        cfg = transformers.LlamaConfig(**common, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64}, rope_theta=500000.0)
        cls = transformers.LlamaForCausalLM
    elif family == "mistral":
        cfg = transformers.MistralConfig(**common, sliding_window=None)
        cls = transformers.MistralForCausalLM
    elif family == "qwen2":
        cfg = transformers.Qwen2Config(**{**common, "tie_word_embeddings": True})
        cls = transformers.Qwen2ForCausalLM
    elif family == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=32)
        cls = transformers.Qwen3ForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    if family == "qwen2":  # give the qkv biases real values
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.2)
    model.save_pretrained(path, max_shard_size="200KB")
    return model
