"""The offline API, in vLLM's shape: `LLM(model).generate(prompts, sampling_params)` and `LLM.chat(...)`.

A script written for vLLM runs unchanged where it uses what Tachyon has: LLM(...) takes EngineArgs' fields (vLLM's
names); one of vLLM's other arguments is a TypeError that names it as not supported. Outputs carry logprobs as
`{token_id: Logprob(logprob, rank, decoded_token)}` per generated token (and per prompt token with
`SamplingParams(prompt_logprobs=N)`), as vLLM's do.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import torch

from tachyon.engine.chat import encode_chat
from tachyon.engine_args import EngineArgs
from tachyon.outputs import Logprob, RequestOutput, logprob_ranks
from tachyon.sampling_params import SamplingParams

logger = logging.getLogger("tachyon")

PromptType = str | dict | list[int]

# vLLM's LLM(...) arguments that Tachyon does not implement: an error names them rather than ignoring them.
VLLM_ONLY_ARGUMENTS = frozenset({
    "tokenizer_mode", "skip_tokenizer_init", "allowed_local_media_path", "pipeline_parallel_size",
    "data_parallel_size", "cpu_offload_gb", "enable_lora", "max_lora_rank",
    "max_loras", "enable_prompt_adapter", "hf_overrides", "hf_token", "mm_processor_kwargs",
    "limit_mm_per_prompt", "compilation_config", "task", "runner", "convert", "override_pooler_config",
    "disable_custom_all_reduce", "max_seq_len_to_capture", "enable_sleep_mode", "code_revision",
    "tokenizer_revision", "rope_scaling", "rope_theta", "disable_async_output_proc", "worker_cls",
    "worker_extension_cls", "logits_processors", "structured_outputs_config", "guided_decoding_backend",
    "enable_expert_parallel", "calculate_kv_scales", "kv_transfer_config", "override_generation_config",
    "model_impl", "enable_reasoning", "reasoning_parser", "max_cpu_loras", "lora_extra_vocab_size",
    "quantization_param_path", "enable_chunked_local_attention", "async_scheduling", "pooler_config"})


class LLM:
    """An engine in this process. `LLM()` runs the embedded SmolLM2-135M-Instruct on the CPU."""

    def __init__(self, model: str | None = None, **kwargs):
        vllm_only = sorted(set(kwargs) & VLLM_ONLY_ARGUMENTS)
        if vllm_only:
            raise TypeError(f"LLM() arguments {vllm_only} are vLLM's and not supported by Tachyon: drop them "
                            f"(supported: {sorted(EngineArgs.field_names())})")
        unknown = set(kwargs) - EngineArgs.field_names()
        if unknown:
            raise TypeError(f"LLM() got unknown arguments {sorted(unknown)}; known: {sorted(EngineArgs.field_names())}")
        self.args = EngineArgs(model=model, **kwargs)
        from tachyon.build import build_engine, default_sampling_values  # engine, worker and models load here

        self.default_sampling = default_sampling_values(self.args)  # the model's generation_config.json
        self.engine = build_engine(self.args)
        self._ids = itertools.count()

    @property
    def llm_engine(self):
        """The engine (vLLM's name for it)."""
        return self.engine

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json values (--generation-config); vLLM's defaults
        elsewhere. `generate` uses it when no sampling params are given."""
        return SamplingParams(**self.default_sampling)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt prefix; False (and nothing changes) while requests are running."""
        return self.engine.kv.pool.reset_prefix_cache()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def _to_token_ids(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            tok = self.engine.tokenizer
            if tok is None:
                raise ValueError("this model has no tokenizer: pass {'prompt_token_ids': [...]} instead of text")
            return prompt, tok.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            if "prompt" in prompt:
                return self._to_token_ids(prompt["prompt"])
            raise ValueError("a prompt dict needs 'prompt' (text) or 'prompt_token_ids'")
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise TypeError(f"a prompt is a string, a list of token ids or a dict, not {type(prompt).__name__}")

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams: give one, or one per prompt")
        # Validate everything before anything enters the engine.
        requests = []
        for p, sp in zip(prompts, params, strict=True):
            text, ids = self._to_token_ids(p)
            sp.verify()
            sp.resolve_bad_words(self.engine.tokenizer)
            self.engine.validate(ids, sp)
            requests.append((text, ids, sp))
        order = []
        for text, ids, sp in requests:
            rid = f"gen-{next(self._ids)}"
            self.engine.add_request(rid, text, ids, sp, stream=False)
            order.append(rid)
        return self._run(order, use_tqdm)

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(order), desc="Processed prompts", dynamic_ncols=True)
        with torch.inference_mode():
            while len(done) < len(order):
                for out in self.engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        if bar is not None:
            bar.close()
        for out in done.values():
            if out.error is not None:  # the others are complete: return them all, this one says what went wrong
                logger.warning("request %s ended with an error: %s", out.request_id, out.error)
        for out in done.values():
            self._logprob_objects(out)
        return [done[r] for r in order]

    def _logprob_objects(self, out: RequestOutput) -> None:
        """Each generated (and, with prompt_logprobs, prompt) token's {token_id: logprob} as vLLM's
        {token_id: Logprob(logprob, rank, decoded_token)}. The top-N tokens' ranks follow from their order (every
        more likely token is among them); the sampled or prompt token's rank the device counted."""
        for c in out.outputs:
            if c.logprobs is None:
                continue
            ranks = c.sampled_ranks or [None] * len(c.logprobs)
            c.logprobs = [self._logprob_entry(token, entry, rank)
                          for token, entry, rank in zip(c.token_ids, c.logprobs, ranks, strict=False)]
        if out.prompt_logprobs is not None:
            out.prompt_logprobs = [None if entry is None else self._logprob_entry(token, entry, rank)
                                   for token, entry, rank in zip(out.prompt_token_ids, out.prompt_logprobs,
                                                                 out.prompt_token_ranks, strict=True)]

    def _logprob_entry(self, token: int, entry: dict[int, float], rank: int | None) -> dict[int, Logprob]:
        tok = self.engine.tokenizer
        ranks = logprob_ranks(entry, token, rank)
        return {t: Logprob(v, ranks[t], tok.decode([t]) if tok is not None else None) for t, v in entry.items()}

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             use_tqdm: bool = True, chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
             tools: list[dict] | None = None) -> list[RequestOutput]:
        """Apply a chat template (`chat_template`, else the model's) to one conversation (or a list of them) and
        generate. `continue_final_message`: the last (assistant) message is continued rather than closed;
        `tools`: OpenAI-style function entries, handed to the template (as vLLM's LLM.chat does)."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [{"prompt": None, "prompt_token_ids": self.encode_chat(
            c, add_generation_prompt, chat_template=chat_template, continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs, tools=tools)} for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, **template) -> list[int]:
        """Token ids of a conversation; `template`: encode_chat's chat_template, continue_final_message,
        chat_template_kwargs."""
        return encode_chat(self.engine.tokenizer, messages, add_generation_prompt, **template)
