"""What the HTTP front end does around the engine, beyond the OpenAI routes: its options (chat template,
response role, default sampling values, CORS, request logging, metric names) and the periodic stats log line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger("tachyon")


@dataclass
class FrontendOptions:
    chat_template: str | None = None  # instead of the tokenizer's
    response_role: str = "assistant"
    default_sampling: dict = field(default_factory=dict)  # SamplingParams fields a request does not set
    enable_log_requests: bool = False
    log_stats_interval: float | None = None  # seconds between stats lines; None: no line
    allowed_origins: list[str] | None = None  # None: no CORS headers
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    metrics_prefix: str = "tachyon"


@dataclass
class _Counts:
    time: float
    prompt_tokens: int
    generation_tokens: int
    prefix_cache_queries: int
    prefix_cache_hits: int


def _counts(stats, now: float) -> _Counts:
    return _Counts(now, stats.prompt_tokens, stats.generation_tokens, stats.prefix_cache_queries,
                   stats.prefix_cache_hits)


def stats_line(before: _Counts, after: _Counts, stats) -> str:
    """vLLM's periodic line: throughput since the last line, the queue, the KV cache, the prefix-cache hit rate."""
    dt = max(after.time - before.time, 1e-9)
    queries = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    return (f"Avg prompt throughput: {(after.prompt_tokens - before.prompt_tokens) / dt:.1f} tokens/s, "
            f"Avg generation throughput: {(after.generation_tokens - before.generation_tokens) / dt:.1f} tokens/s, "
            f"Running: {stats.num_running} reqs, Waiting: {stats.num_waiting} reqs, "
            f"KV cache usage: {100 * stats.kv_cache_usage:.1f}%, "
            f"Prefix cache hit rate: {100 * hits / queries if queries else 0.0:.1f}%")


async def log_stats_forever(served, interval: float) -> None:
    """A stats line per served model every `interval` seconds while it has work or had some since its last line.
    served: () -> [(name, engine)], asked each time (models load, unload and swap at run time); with more than
    one model, each line starts with its model's name."""
    before: dict[int, tuple] = {}  # id(engine) -> (engine, _Counts of its last line or of when it was first seen)
    while True:
        for _, engine in served():
            before.setdefault(id(engine), (engine, _counts(engine.stats(), time.monotonic())))
        await asyncio.sleep(interval)
        now = served()
        for name, engine in now:
            stats = engine.stats()
            after = _counts(stats, time.monotonic())
            prev = before.get(id(engine), (None, None))[1]
            busy = prev is not None and (stats.num_running or stats.num_waiting
                                         or after.prompt_tokens != prev.prompt_tokens
                                         or after.generation_tokens != prev.generation_tokens)
            if busy:
                logger.info("%s%s", f"{name}: " if len(now) > 1 else "", stats_line(prev, after, stats))
            before[id(engine)] = (engine, after)
        live = {id(engine) for _, engine in now}
        for key in [k for k in before if k not in live]:  # unloaded: forget it (and let it go)
            del before[key]
