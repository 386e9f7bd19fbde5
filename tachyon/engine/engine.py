"""LLMEngine: the engine core and its front end (output processor) in one process, for the offline `LLM`,
the CLI and tests. `step()` runs one core step and turns its token deltas into RequestOutputs.

    add_request ─► validate ─► OutputProcessor.add_request + EngineCore.add_request
    step()      ─► EngineCore.step() ─► OutputProcessor.process() ─► RequestOutputs
                                         └─ stop strings / failed text ─► EngineCore.stop_sequence / abort

`tachyon serve` runs the same two halves in two processes (tachyon.engine.core_client).
"""

from __future__ import annotations

import torch

from tachyon.config import EngineConfig
from tachyon.engine.core import EngineCore
from tachyon.engine.messages import EngineStats
from tachyon.engine.output_processor import OutputProcessor
from tachyon.engine.structured_output import GrammarCompiler
from tachyon.engine.validation import validate_request
from tachyon.interface import ModelRunner, Proposer
from tachyon.outputs import RequestOutput
from tachyon.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer, runner: ModelRunner, num_blocks: int, num_cpu_blocks: int = 0,
                 proposer: Proposer | None = None):
        self.config = config
        self.tokenizer = tokenizer
        # one compiler for both halves: the core's compile of a grammar the front end checked is a cache hit
        self.grammars = GrammarCompiler(tokenizer, config.model.vocab_size, config.model.eos_token_ids)
        self.core = EngineCore(config, runner, num_blocks, num_cpu_blocks, proposer, self.grammars)
        self.processor = OutputProcessor(tokenizer)
        self.num_kv_blocks = self.core.kv.num_blocks

    # -- requests ---------------------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """InvalidRequestError naming the field, or the request's resolved max_tokens."""
        return validate_request(self.config, self.num_kv_blocks, prompt_token_ids, params, self.grammars)

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float | None = None, stream: bool = True) -> None:
        params.verify()
        max_tokens = self.validate(prompt_token_ids, params)
        self.core.add_request(self.processor.admit(max_tokens, request_id, prompt, prompt_token_ids, params,
                                                   arrival_time, stream))

    def abort_request(self, request_id: str) -> None:
        self.core.abort_request(request_id)

    @property
    def num_waiting(self) -> int:
        return self.core.num_waiting

    def has_unfinished_requests(self) -> bool:
        return self.processor.has_unfinished_requests()

    def request_ids(self) -> list[str]:
        return list(self.processor.states)

    # -- the loop ----------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, stops, aborts = self.processor.process(self.core.step())
        for seq_id in stops:
            self.core.stop_sequence(seq_id)
        for rid in aborts:
            self.core.abort_request(rid)
        return outputs

    @torch.inference_mode()
    def run_until_done(self) -> list[RequestOutput]:
        finished = []
        while self.has_unfinished_requests():
            finished.extend(o for o in self.step() if o.finished)
        return finished

    def check_alive(self) -> None:
        """In one process the engine is alive as long as its caller and its runner: RunnerFault once a
        tensor-parallel worker is gone (tachyon.engine.core_client differs)."""
        self.core.check_runner()

    def shutdown(self) -> None:
        """Let the runner's tensor-parallel workers go (nothing else to stop in one process)."""
        self.core.shutdown()

    # -- introspection -------------------------------------------------------------------------------------
    @property
    def kv(self):
        return self.core.kv

    @property
    def scheduler(self):
        return self.core.scheduler

    @property
    def runner(self):
        return self.core.runner

    @property
    def num_failed_requests(self) -> int:
        return self.core.stats().num_failed_requests + self.processor.num_failed_requests

    def stats(self) -> EngineStats:
        return self.core.stats()

    def check_integrity(self) -> None:
        self.core.check_integrity()
