"""The model's chat template, applied once for every caller (offline API, server, benchmarks)."""

from __future__ import annotations

# apply_chat_template's own arguments: chat_template_kwargs may not set them
_TEMPLATE_ARGUMENTS = {"conversation", "tools", "documents", "chat_template", "add_generation_prompt",
                       "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                       "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True, *,
                chat_template: str | None = None, continue_final_message: bool = False,
                chat_template_kwargs: dict | None = None, tools: list[dict] | None = None) -> list[int]:
    """Token ids of a conversation through a chat template: `chat_template`, else the tokenizer's (ValueError if
    there is none). `continue_final_message`: the last message stays open, for the model to continue it;
    `chat_template_kwargs`: extra variables the template reads (e.g. enable_thinking); `tools` (OpenAI's function
    entries) go to the template, which renders them its own way."""
    if tokenizer is None:
        raise ValueError("this model has no tokenizer: send token ids instead")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template: send a plain prompt instead")
    taken = sorted(set(chat_template_kwargs or ()) & _TEMPLATE_ARGUMENTS)
    if taken:
        raise ValueError(f"chat_template_kwargs may not set {taken}: they are arguments of the template call itself")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                        chat_template=chat_template, continue_final_message=continue_final_message,
                                        **({"tools": tools} if tools else {}), **(chat_template_kwargs or {}))
    if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)
