"""EngineArgs: every knob a user sets (the same names as vLLM's), and the one place that builds an engine."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, fields

import torch

from tachyon.config import CacheConfig, EngineConfig, SchedulerConfig, num_kv_blocks_for_budget, parse_dtype

logger = logging.getLogger("tachyon")


@dataclass
class EngineArgs:
    model: str | None = None  # None = the embedded SmolLM2-135M-Instruct
    tokenizer: str | None = None
    dtype: str = "auto"  # auto: float32 on the CPU, bfloat16 on a GPU
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    kv_cache_memory_gib: float = 1.0  # CPU: the KV pool's size
    gpu_memory_utilization: float = 0.9
    num_kv_blocks: int | None = None  # exact KV pool size in blocks (overrides the memory-based sizing)
    enable_prefix_caching: bool = True
    swap_space: float = 4.0  # GiB of CPU memory for preempted sequences' KV; 0 = recompute only
    seed: int = 0
    load_format: str = "auto"  # auto | dummy (random weights, no checkpoint read)
    attention_backend: str = "auto"  # auto | torch | triton
    enforce_eager: bool = False
    num_scheduler_steps: int | None = None  # None: 3 with CUDA graphs, else 1
    enable_pdl: bool = True  # programmatic dependent launch where the GPU has it (sm_90+, Triton kernels)
    max_n: int = 128  # the largest n (and best_of) one request may ask for
    max_logprobs: int = 20  # the most top logprobs one request may ask for per token

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    def create_engine(self):
        from tachyon.engine.engine import LLMEngine
        from tachyon.models.loader import load_config, resolve_model_path
        from tachyon.worker.model_runner import ModelRunner

        t0 = time.perf_counter()
        if self.max_n < 1:
            raise ValueError(f"max_n={self.max_n}: it must be >= 1")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs={self.max_logprobs}: it must be >= 0")
        device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if self.device == "auto" else self.device)
        if self.load_format == "dummy" and self.model is not None and self.model.endswith(".json"):
            path = self.model  # a bare config.json: random weights made where the model runs
        else:
            path = resolve_model_path(self.model)
        if path.endswith(".gguf"):
            from tachyon.models.gguf_loader import converted_dir

            path = converted_dir(path)
        model_cfg = load_config(path)
        dtype = parse_dtype(self.dtype) if self.dtype != "auto" else (
            torch.bfloat16 if device.type == "cuda" else torch.float32)
        max_len = self.max_model_len or model_cfg.max_position_embeddings
        if model_cfg.sliding_window:
            max_len = min(max_len, model_cfg.sliding_window)  # no sliding-window attention: stay inside it
        default_tokens = 8192 if device.type == "cuda" else 2048
        backend = self.attention_backend
        if backend == "auto":
            backend = "triton" if device.type == "cuda" else "torch"
        config = EngineConfig(
            model=model_cfg,
            cache=CacheConfig(block_size=self.block_size, kv_cache_bytes=int(self.kv_cache_memory_gib * (1 << 30)),
                              gpu_memory_utilization=self.gpu_memory_utilization,
                              num_kv_blocks=self.num_kv_blocks,
                              enable_prefix_caching=self.enable_prefix_caching, swap_space_gib=self.swap_space),
            scheduler=SchedulerConfig(max_num_batched_tokens=max(self.max_num_batched_tokens or default_tokens, 1),
                                      max_num_seqs=self.max_num_seqs, max_model_len=max_len,
                                      num_scheduler_steps=max(1, self.num_scheduler_steps or (
                                          3 if device.type == "cuda" and backend == "triton"
                                          and not self.enforce_eager else 1))),
            device=device, dtype=dtype, attention_backend=backend, enforce_eager=self.enforce_eager, seed=self.seed,
            enable_pdl=self.enable_pdl and backend == "triton", max_n=self.max_n, max_logprobs=self.max_logprobs,
        )
        tokenizer = load_tokenizer(self.tokenizer or (None if path.endswith(".json") else path))
        if self.load_format == "dummy" and path.endswith(".json"):
            path = None
        runner = ModelRunner(config, path, self.load_format)
        num_blocks = self._num_blocks(config, runner)
        runner.allocate_kv_cache(num_blocks)
        if hasattr(runner, "warm_up"):
            runner.warm_up()
        engine = LLMEngine(config, tokenizer, runner, num_blocks)
        engine.startup_time_s = time.perf_counter() - t0
        logger.info("engine ready in %.1fs: %d KV blocks of %d tokens", engine.startup_time_s, num_blocks,
                    self.block_size)
        return engine

    def _num_blocks(self, config: EngineConfig, runner) -> int:
        if config.cache.num_kv_blocks:
            return config.cache.num_kv_blocks
        if config.device.type == "cuda":
            return runner.profile_num_blocks()
        return num_kv_blocks_for_budget(config.model, config.dtype, config.cache.block_size,
                                        config.cache.kv_cache_bytes)


def load_tokenizer(path: str | None):
    """The model's own tokenizer (and chat template) through transformers; None if the model has none."""
    if path is None:
        return None
    if not (os.path.isdir(path) and any(f.startswith("tokenizer") for f in os.listdir(path))):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
