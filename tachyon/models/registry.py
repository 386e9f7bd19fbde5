from __future__ import annotations

from tachyon.config import ModelConfig
from tachyon.models.llama import LlamaForCausalLM

# One parameterized implementation serves the whole family; ModelConfig carries the differences.
_MODELS = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


def model_class(cfg: ModelConfig):
    return _MODELS[cfg.architecture]
