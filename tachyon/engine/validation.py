"""Admission checks that need the engine's shape (vocabulary, context, KV pool): run by the front end before
a request enters, so a bad one is a 400 naming the field and never reaches the core."""

from __future__ import annotations

from tachyon.config import EngineConfig
from tachyon.engine.structured_output import GrammarCompiler
from tachyon.sampling_params import InvalidRequestError, SamplingParams


def validate_request(cfg: EngineConfig, num_kv_blocks: int, prompt_token_ids: list[int],
                     params: SamplingParams, grammars: GrammarCompiler | None = None) -> int:
    """InvalidRequestError naming the field, or the request's resolved max_tokens. With SamplingParams.verify,
    whatever passes can neither break a step nor hold more than its share of the engine. A grammar is compiled
    here (or found in the cache): one that cannot be is refused before the request enters."""
    max_len = cfg.scheduler.max_model_len
    n = len(prompt_token_ids)
    if n == 0:
        raise InvalidRequestError("the prompt is empty: give at least one token of text", "prompt")
    if n >= max_len:
        raise InvalidRequestError(f"the prompt has {n} tokens; this model's context is {max_len} tokens "
                                  f"(prompt + output): shorten the prompt", "prompt")
    vocab = cfg.model.vocab_size
    bad = [t for t in prompt_token_ids if type(t) is not int or not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "prompt")
    if params.n > cfg.max_n:
        raise InvalidRequestError(f"n={params.n} is more than the {cfg.max_n} sequences a request may ask "
                                  f"for (--max-n)", "n")
    if params.logprobs is not None and params.logprobs > cfg.max_logprobs:
        raise InvalidRequestError(f"logprobs={params.logprobs} is more than the {cfg.max_logprobs} top "
                                  f"logprobs a request may ask for (--max-logprobs)", "logprobs")
    if params.prompt_logprobs is not None and params.prompt_logprobs > cfg.max_logprobs:
        raise InvalidRequestError(f"prompt_logprobs={params.prompt_logprobs} is more than the {cfg.max_logprobs} top "
                                  f"logprobs a request may ask for (--max-logprobs)", "prompt_logprobs")
    bad = [t for t in params.stop_token_ids if not 0 <= t < vocab]
    if bad:
        raise InvalidRequestError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {vocab})",
                                  "stop_token_ids")
    for name, ids in (("logit_bias", params.logit_bias or ()), ("allowed_token_ids", params.allowed_token_ids or ()),
                      ("bad_words", [t for w in params.bad_words_token_ids or () for t in w])):
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"{name}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})", name)
    max_tokens = params.max_tokens if params.max_tokens is not None else max_len - n
    if n + max_tokens > max_len:
        raise InvalidRequestError(
            f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds the model's context "
            f"of {max_len} tokens: lower max_tokens to at most {max_len - n}", "max_tokens")
    blocks_needed = -(-(n + max_tokens) // cfg.cache.block_size)
    if blocks_needed > num_kv_blocks:
        raise InvalidRequestError(f"this request needs {blocks_needed} KV blocks but the cache has "
                                  f"{num_kv_blocks}: lower max_tokens or give the KV cache more memory",
                                  "max_tokens")
    if params.structured_outputs is not None:
        if grammars is None:
            raise InvalidRequestError("this engine cannot constrain outputs (no grammar compiler)", "structured_outputs")
        grammars.compile(params.structured_outputs)
    return max_tokens
