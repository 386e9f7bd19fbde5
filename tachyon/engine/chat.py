"""The model's chat template, applied once for every caller (offline API, server, benchmarks)."""

from __future__ import annotations


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                tools: list[dict] | None = None) -> list[int]:
    """Token ids of a conversation through the tokenizer's chat template (ValueError if it has none); `tools`
    (OpenAI's function entries) go to the template, which renders them its own way."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template: send a plain prompt instead")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        **({"tools": tools} if tools else {}))
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
