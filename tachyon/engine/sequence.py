"""One sequence in the engine core: its tokens, how many of them have KV in the cache, its blocks, its state.

A user's request is a `SequenceGroup` (vLLM's word): its n sequences share the prompt and the sampling
parameters. A step may be queued on the device before the previous one's sampled tokens reach the host, so a
sequence can have sampled tokens that are not known here yet (`num_pending_tokens`):

    token_ids (known on the host)      pending (being sampled on the device)
    [p0 p1 ... p9 | o0 o1 o2]          [o3 o4]
    num_tokens = 15; num_computed_tokens = 14 (o3 is the input of a step in flight, which samples o4)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from tachyon.outputs import RequestMetrics
from tachyon.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # back in the waiting queue; recomputes (or swaps in) when there is room
    SWAPPED = "swapped"  # KV parked in CPU memory
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"  # processing this request raised; it alone ends, the engine goes on


@dataclass(eq=False)
class Sequence:
    """One sequence. A request with n > 1 is n of these (`index` 0..n-1) sharing its `request_id`."""

    seq_id: str  # request_id for n == 1, else f"{request_id}#{index}"
    request_id: str
    index: int
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved: never None here
    eos_token_ids: frozenset[int]
    metrics: RequestMetrics
    token_ids: list[int] = field(default_factory=list)  # prompt + output known on the host
    num_pending_tokens: int = 0  # sampled by steps in flight, not yet known here
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache or being written by a step in flight
    num_cached_tokens: int = 0  # of the prompt, found in the prefix cache
    block_ids: list[int] = field(default_factory=list)  # written only by the KVCacheManager
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks of token_ids
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    status: SequenceStatus = SequenceStatus.WAITING
    is_finished: bool = False  # kept beside status: read several times per sequence per step
    stop_reason: int | str | None = None
    generator: torch.Generator | None = None
    # structured outputs: tachyon.engine.structured_output.GrammarMatcher, advanced by each token the host learns
    grammar: object | None = None
    # prompt_logprobs: per prompt position 1.. its {token_id: logprob} (the prompt token and the top-N) and the
    # prompt token's rank, filled by the engine core as the prefill's steps land (the request's first sequence)
    prompt_logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_ranks: list[int] = field(default_factory=list)
    # speculative decoding's back-off (Scheduler._spec_cap / _spec_outcome): decodes left without proposals,
    # failed verifications in a row, and the running mean of accepted tokens per verification
    spec_skip: int = 0
    spec_fails: int = 0
    spec_mean_accepted: float = 0.5
    # n > 1: siblings wait until this sequence's prompt is in the cache, then share its blocks
    pending_forks: list[Sequence] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Known and pending tokens: what the next step may compute up to."""
        return len(self.token_ids) + self.num_pending_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        """Output tokens known on the host."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Whether its steps compute logprobs at prompt positions (the request's first sequence, until it has
        them all): then its prompt is computed, never taken from the prefix cache."""
        return (self.sampling_params.prompt_logprobs is not None and self.index == 0
                and len(self.prompt_logprobs) < self.num_prompt_tokens - 1)

    @property
    def num_remaining_tokens(self) -> int:
        """Output tokens it may still get beyond those known and pending (max_tokens)."""
        return self.max_tokens - self.num_output_tokens - self.num_pending_tokens


@dataclass(eq=False)
class SequenceGroup:
    """A user's request in the engine core: its n sequences."""

    request_id: str
    seqs: list[Sequence]
