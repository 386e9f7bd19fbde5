"""Backends run a list of BenchRequests and return one RequestResult per request.

`tachyon` (the engine in this process), `hf` (transformers `generate`, static padded batches: the
"PyTorch native" baseline) and `openai` (any OpenAI-compatible server over HTTP). Each is imported only
when asked for, so `bench latency --backend hf` needs neither fastapi nor httpx.
"""

from __future__ import annotations

from tachyon.bench.backends.base import Backend, RunResult, now, peak_memory

__all__ = ["BACKENDS", "Backend", "RunResult", "make_backend", "now", "peak_memory"]

BACKENDS = ("tachyon", "hf", "openai")


def make_backend(name: str, args) -> Backend:
    if name == "tachyon":
        from tachyon.bench.backends.tachyon import TachyonBackend

        return TachyonBackend(args)
    if name == "hf":
        from tachyon.bench.backends.hf import HFBackend

        return HFBackend(args)
    if name == "openai":
        from tachyon.bench.backends.openai import OpenAIBackend

        return OpenAIBackend(args)
    raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
