"""Tachyon: a Python LLM inference engine with a paged KV cache, continuous batching and an OpenAI-compatible server.

The engine's names load on first use (PEP 562), so what does not run a model (`tachyon gateway`, `tachyon --help`,
`tachyon plan`) starts without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"

_HOME = {"LLM": "tachyon.llm", "CompletionOutput": "tachyon.outputs", "RequestOutput": "tachyon.outputs",
         "SamplingParams": "tachyon.sampling_params", "StructuredOutputsParams": "tachyon.sampling_params"}

if TYPE_CHECKING:
    from tachyon.llm import LLM
    from tachyon.outputs import CompletionOutput, RequestOutput
    from tachyon.sampling_params import SamplingParams, StructuredOutputsParams


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tachyon' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
