"""Tachyon: a Python LLM inference engine with a paged KV cache, continuous batching and an OpenAI-compatible server."""

from tachyon.llm import LLM
from tachyon.outputs import CompletionOutput, RequestOutput
from tachyon.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput"]
__version__ = "0.1.0"
