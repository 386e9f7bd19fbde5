"""The offline API, in vLLM's shape: `LLM(model).generate(prompts, sampling_params)` and `LLM.chat(...)`."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import torch

from tachyon.engine.chat import encode_chat
from tachyon.engine_args import EngineArgs
from tachyon.outputs import RequestOutput
from tachyon.sampling_params import SamplingParams

logger = logging.getLogger("tachyon")

PromptType = str | dict | list[int]


class LLM:
    """An engine in this process. `LLM()` runs the embedded SmolLM2-135M-Instruct on the CPU."""

    def __init__(self, model: str | None = None, **kwargs):
        unknown = set(kwargs) - EngineArgs.field_names()
        if unknown:
            raise TypeError(f"LLM() got unknown arguments {sorted(unknown)}; known: {sorted(EngineArgs.field_names())}")
        self.args = EngineArgs(model=model, **kwargs)
        from tachyon.build import build_engine  # engine, worker and models load when an engine is built

        self.engine = build_engine(self.args)
        self._ids = itertools.count()

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
                 use_tqdm: bool = False) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams: give one, or one per prompt")
        # Validate everything before anything enters the engine.
        requests = []
        for p, sp in zip(prompts, params):
            text, ids = self._to_token_ids(p)
            sp.verify()
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
        return [done[r] for r in order]

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params: SamplingParams | None = None,
             add_generation_prompt: bool = True, use_tqdm: bool = False) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them) and generate."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [{"prompt": None, "prompt_token_ids": self.encode_chat(c, add_generation_prompt)} for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        return encode_chat(self.engine.tokenizer, messages, add_generation_prompt)
