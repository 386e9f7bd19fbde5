"""SamplingParams: how one request samples and when it stops (vLLM's names, so users can switch)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None = up to the model's context
    min_tokens: int = 0
    logprobs: int | None = None  # top-N logprobs of each generated token (plus the sampled one)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop_strings: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.stop_strings = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == 0:
            self.top_k = -1
        self.verify()

    def verify(self) -> None:
        """Raise ValueError naming the field and the allowed range, before the request reaches the engine."""
        def bad(name, value, allowed):
            raise ValueError(f"SamplingParams.{name}={value!r} is out of range: {allowed}")

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", self.n, "it must be an integer >= 1")
        if self.temperature < 0:
            bad("temperature", self.temperature, "it must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "it must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            bad("top_k", self.top_k, "it must be -1 (off) or a positive integer")
        if not 0 <= self.min_p <= 1:
            bad("min_p", self.min_p, "it must be in [0, 1]")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", self.repetition_penalty, "it must be > 0 (1 = off)")
        if not -2 <= self.presence_penalty <= 2:
            bad("presence_penalty", self.presence_penalty, "it must be in [-2, 2]")
        if not -2 <= self.frequency_penalty <= 2:
            bad("frequency_penalty", self.frequency_penalty, "it must be in [-2, 2]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad("max_tokens", self.max_tokens, "it must be an integer >= 1, or None for up to the context length")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            bad("min_tokens", self.min_tokens, "it must be >= 0 and <= max_tokens")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            bad("logprobs", self.logprobs, "it must be in [0, 20]")
        if any(not s for s in self.stop_strings):
            bad("stop", self.stop, "stop strings must be non-empty")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", self.seed, "it must be an integer")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def clone(self) -> SamplingParams:
        import copy

        return copy.deepcopy(self)
