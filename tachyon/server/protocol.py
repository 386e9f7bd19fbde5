"""The OpenAI request bodies as pydantic models (strict: a string where a number belongs is a 400, not a cast).

Only the request side is modelled; responses are plain dicts built in serving.py (they are hot on the
streaming path and need no validation). Ranges are checked once, by SamplingParams and LLMEngine.validate,
so the offline API and the server give the same messages.

Three rules about fields, as OpenAI's API has them:
  * `null` means "not given": the field's default (`max_tokens: null` on completions is 16).
  * A field nobody here knows is a 400 naming it (OpenAI: "Unrecognized request argument"), and so is a
    known field whose meaning is not implemented (`functions`, `use_beam_search`, ...): a silent 200 would answer
    a different question than the one asked.
  * Fields that change nothing about the answer (`user`, `metadata`, `store`, ...) are accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Fields OpenAI or vLLM define whose meaning this server does not implement yet: the message a client gets.
UNSUPPORTED = {
    "guided_decoding_backend": "the structured-outputs backend is always xgrammar",
    "guided_whitespace_pattern": "guided_whitespace_pattern is not supported (JSON is generated compactly)",
    "json_schema": "json_schema belongs inside response_format: {\"type\": \"json_schema\", \"json_schema\": ...}",
    "functions": "function calling is not supported yet",
    "function_call": "function calling is not supported yet",
    "logits_processors": "logits processors are not supported",
    "use_beam_search": "beam search is not supported",
    "length_penalty": "length_penalty (beam search) is not supported",
    "truncate_prompt_tokens": "truncate_prompt_tokens is not supported: shorten the prompt",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "reasoning_effort": "reasoning_effort is not supported by this model server",
    "documents": "documents are not supported",
    "mm_processor_kwargs": "multimodal inputs are not supported",
    "priority": "request priorities are not supported",
    "spaces_between_special_tokens": "spaces_between_special_tokens is not supported",
    "lora_request": "LoRA adapters are not supported",
}


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fields = cls.model_fields
            return {k: v for k, v in data.items() if not (v is None and k in fields and not fields[k].is_required())}
        return data


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` object: exactly one of these."""

    json_schema: dict[str, Any] | str | None = Field(None, alias="json")  # `json` would shadow BaseModel.json
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


class _SamplingFields(_Strict):
    """The fields both endpoints share (OpenAI's plus vLLM's extras: top_k, min_p, repetition_penalty, ...)."""

    model: str | None = None  # None: the one model this server serves
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    best_of: int | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string, as OpenAI sends it) -> bias
    allowed_token_ids: list[int] | None = None  # vLLM's
    bad_words: list[str] | None = None  # vLLM's
    prompt_logprobs: int | None = None  # vLLM's: top-N logprobs at each prompt position (not with stream)
    response_format: dict[str, Any] | None = None  # text, json_object, json_schema (tachyon.server.structured)
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # accepted and ignored: they change nothing about the answer
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    request_id: str | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = 16  # OpenAI's default for /v1/completions
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True  # vLLM's: the tokenizer's BOS before the text
    return_tokens_as_token_ids: bool = False  # vLLM's: logprob tokens as "token_id:N"


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ContentPart(BaseModel):
    """Any OpenAI content part (text, image_url, input_audio, ...): the server says which it cannot read."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: which call this is the result of

    @model_validator(mode="after")
    def _tool_fields_fit_the_role(self):
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("tool_call_id belongs to tool messages")
        return self


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # None: up to the context length
    max_completion_tokens: int | None = None  # OpenAI's newer name; wins over max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    # vLLM's chat extras (tachyon/server/chat_extras.py)
    continue_final_message: bool = False  # the last (assistant) message is continued, not closed
    chat_template: str | None = None  # this request's Jinja chat template instead of the model's
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables for the template
    echo: bool = False  # the response repeats the last message if it has the response role
    return_tokens_as_token_ids: bool = False
    tools: list[Tool] | None = None  # tachyon.server.tools
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[str] | None = None  # only ["text"]
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
