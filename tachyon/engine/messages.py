"""What crosses between the engine core and its front end (in one process, or over a pipe to the core's own
process): requests in, per-sequence token deltas and stats out. Small slotted dataclasses: cheap to pickle."""

from __future__ import annotations

from dataclasses import dataclass

from tachyon.sampling_params import SamplingParams

# upper bounds of the tokens-per-step histogram (vLLM's iteration_tokens_total buckets)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(slots=True)
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved by validation
    arrival_time: float


@dataclass(slots=True)
class EngineCoreOutput:
    """One sequence's news from one step: its new token (with logprobs if asked), or how it finished."""

    request_id: str
    index: int  # which of the request's n sequences
    new_token_ids: list[int]
    new_logprobs: list[dict[int, float]] | None = None
    new_sampled_logprobs: list[float] | None = None
    new_sampled_ranks: list[int] | None = None
    # prompt_logprobs, with the sequence's first output: per prompt position 1.. {token_id: logprob} and the
    # prompt token's rank
    prompt_logprobs: list[dict[int, float]] | None = None
    prompt_ranks: list[int] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None
    error: str | None = None
    num_cached_tokens: int = 0
    queued_time: float | None = None  # when the core took the request in
    first_scheduled_time: float | None = None
    token_time: float | None = None  # when the new token reached the host
    finished_time: float | None = None
    num_preemptions: int = 0


@dataclass(slots=True)
class EngineStats:
    """The core's counters and gauges, for /metrics and `tachyon bench`."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_kv_blocks: int = 0
    block_size: int = 16
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_swapped_out: int = 0
    num_recomputed: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_steps: int = 0
    num_failed_requests: int = 0
    # speculative decoding (vLLM's spec_decode counters): sequence-steps that verified proposals, tokens proposed,
    # tokens accepted, and accepted tokens at each proposal position 0 .. k-1
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()
    # tokens each collected step computed: counts per ITERATION_TOKENS_BUCKETS bound (not cumulative; one more
    # for larger steps) and their sum
    iteration_tokens_counts: tuple[int, ...] = (0,) * (len(ITERATION_TOKENS_BUCKETS) + 1)
    iteration_tokens_sum: int = 0

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Accepted over proposed tokens (None before any proposal)."""
        return self.spec_num_accepted_tokens / self.spec_num_draft_tokens if self.spec_num_draft_tokens else None
