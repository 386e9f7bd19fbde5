"""What generate() returns, in vLLM's shape: RequestOutput with one CompletionOutput per sample."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    admitted_time: float | None = None  # the front end handed it to the engine core (parsed, tokenized, checked)
    queued_time: float | None = None  # the engine core took it into its queue
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first generated token."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time


@dataclass
class Logprob:
    """One token's log probability as vLLM's offline API gives it (`LLM.generate` outputs)."""

    logprob: float
    rank: int | None = None  # 1 = the most likely token at that position
    decoded_token: str | None = None


def logprob_ranks(entry: dict[int, float], token: int, rank: int | None) -> dict[int, int | None]:
    """Each token's rank in one position's {token_id: logprob} (a chosen token and the top-N): the chosen
    token's the device counted; a top-N token's follows from the order (every more likely token is among them)."""
    values = sorted(entry.values(), reverse=True)
    return {t: rank if t == token else 1 + values.index(v) for t, v in entry.items()}


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None  # per generated token: {token_id: logprob}
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    sampled_ranks: list[int | None] | None = None  # per generated token: its rank (1 = the most likely)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0
    error: str | None = None  # why the engine failed this request (finish_reason "error"), else None
    # SamplingParams.prompt_logprobs: None for the first prompt token, then per prompt token {token_id: logprob}
    # of it and the top-N at its position (LLM.generate gives Logprob objects, as vLLM's)
    prompt_logprobs: list[dict | None] | None = None
    prompt_token_ranks: list[int | None] | None = None  # each prompt token's rank at its position
    extra: dict = field(default_factory=dict)
