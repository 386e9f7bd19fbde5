"""One sequence in the engine: its tokens, how many of them have KV in the cache, its blocks, its state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from tachyon.outputs import RequestMetrics
from tachyon.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue; recomputes (or swaps in) when there is room
    SWAPPED = "swapped"  # KV parked in CPU memory
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # processing this request raised; it alone ends, the engine goes on


@dataclass(eq=False)
class Request:
    """One sequence. A user request with n > 1 becomes n of these (`index` 0..n-1) sharing a `group_id`."""

    request_id: str
    group_id: str
    index: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved: never None here
    eos_token_ids: frozenset[int]
    metrics: RequestMetrics
    token_ids: list[int] = field(default_factory=list)  # prompt + output
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # of the prompt, found in the prefix cache
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks of token_ids
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    status: RequestStatus = RequestStatus.WAITING
    is_finished: bool = False  # kept beside status: read several times per sequence per step
    stop_reason: int | str | None = None
    generator: torch.Generator | None = None
    logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float = 0.0
    # n > 1: siblings wait until this sequence's prompt is in the cache, then share its blocks
    pending_forks: list[Request] = field(default_factory=list)
    detok: object = None  # tachyon.engine.detokenizer.IncrementalDetokenizer

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        if self.sampling_params.logprobs is not None:
            self.logprobs = []

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
