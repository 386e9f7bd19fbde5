"""What every bench backend is: `Backend` (load, run a list of BenchRequests, close) and its `RunResult`."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from tachyon.bench.metrics import RequestResult
from tachyon.bench.workloads import BenchRequest
from tachyon.engine.chat import encode_chat


@dataclass
class RunResult:
    results: list[RequestResult]
    duration: float
    t0: float
    interrupted: bool = False
    extra: dict = field(default_factory=dict)


class Backend(ABC):
    name = "base"

    def load(self) -> None:  # noqa: B027  (an optional hook: a backend with nothing to build keeps it)
        """Build the model; records `startup_s`."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    def tokenizer(self):
        return None

    def chat_ids(self, message: str) -> list[int]:
        try:
            return encode_chat(self.tokenizer, [{"role": "user", "content": message}])
        except ValueError as e:
            raise ValueError(f"backend {self.name}: {e} (a chat workload needs one)") from None

    @abstractmethod
    def run(self, reqs: list[BenchRequest], progress=None) -> RunResult: ...

    def config(self) -> dict:
        return {}

    def memory(self) -> dict:
        return peak_memory()

    def close(self) -> None:  # noqa: B027  (an optional hook: nothing to release by default)
        pass


def peak_memory() -> dict:
    """Peak GPU memory allocated by torch, and the peak resident memory of this whole process (every backend
    it ran so far: `ladder` runs each step in its own process for a per-step figure)."""
    out = {}
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["gpu_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
    except Exception:
        pass
    try:
        import resource

        out["process_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    except Exception:
        pass
    return out


def now() -> float:
    return time.perf_counter()
