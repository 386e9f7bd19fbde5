"""EngineArgs: every knob a user sets on the engine (vLLM's names), each written once with its default and help.

From these fields come the engine flags of every command (`add_cli_args`, `from_cli_args`), the keyword
arguments `LLM(...)` accepts (`field_names`), and the config dataclasses the engine and the runner read
(`create_engine_config`). The engine itself is built by `tachyon.build.build_engine`.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from tachyon.config import (
    KV_CACHE_DTYPES,
    QUANTIZATION_METHODS,
    CacheConfig,
    EngineConfig,
    ModelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    parse_dtype,
    parse_kv_cache_dtype,
    resolve_quantization,
)

# Step token budget when --max-num-batched-tokens is not given, by device type.
DEFAULT_MAX_NUM_BATCHED_TOKENS = {"cuda": 8192, "cpu": 2048}


def _knob(default: Any, help: str, **cli: Any) -> Any:
    """A field with its help text; `cli` holds extra argparse keywords (choices)."""
    return field(default=default, metadata={"help": help, **cli})


@dataclass
class EngineArgs:
    model: str | None = _knob(None, "HF checkpoint directory, Hugging Face Hub id (org/name, read through the "
                                    "Hub cache), .gguf file, or config.json with --load-format dummy (default: "
                                    "the embedded SmolLM2-135M-Instruct)")
    tokenizer: str | None = _knob(None, "tokenizer directory or Hub id (default: the model's own)")
    revision: str | None = _knob(None, "Hub model: the branch, tag or commit to use (default: main)")
    download_dir: str | None = _knob(None, "Hub model: the cache directory to download into and read from "
                                           "(default: huggingface_hub's, $HF_HOME/hub)")
    trust_remote_code: bool = _knob(False, "let the tokenizer run code shipped with the checkpoint (the model "
                                           "itself is always Tachyon's own implementation)")
    generation_config: str = _knob("auto", "default sampling values: auto (the model's generation_config.json), "
                                           "vllm (none: Tachyon's defaults), or a directory holding a "
                                           "generation_config.json; a request's own values always win")
    dtype: str = _knob("auto", "auto | float32 | float16 | bfloat16 (auto: float32 on the CPU, bfloat16 on a GPU)")
    device: str = _knob("auto", "auto | cpu | cuda (auto: cuda when a GPU is visible)")
    max_model_len: int | None = _knob(None, "longest sequence, prompt and output (default: the model's "
                                            "max_position_embeddings, at most its sliding window)")
    max_num_seqs: int = _knob(256, "most sequences running at once")
    max_num_batched_tokens: int | None = _knob(None, "tokens one step may run (default: "
                                                     f"{DEFAULT_MAX_NUM_BATCHED_TOKENS['cuda']} on a GPU, "
                                                     f"{DEFAULT_MAX_NUM_BATCHED_TOKENS['cpu']} on the CPU)")
    block_size: int = _knob(16, "tokens per KV block")
    kv_cache_dtype: str = _knob("auto", "auto: the KV cache in the model's dtype | fp8 (= fp8_e4m3): E4M3 with a "
                                        "scale per layer for K and for V, half the bytes of bf16, twice the tokens",
                                choices=list(KV_CACHE_DTYPES))
    kv_cache_memory_gib: float = _knob(1.0, "CPU: size of the KV pool in GiB")
    gpu_memory_utilization: float = _knob(0.9, "GPU: the fraction of its memory the engine may use "
                                               "(weights, activations, KV pool)")
    num_kv_blocks: int | None = _knob(None, "exact KV pool size in blocks (overrides the memory-based sizing)")
    enable_prefix_caching: bool = _knob(True, "reuse the KV blocks of a prompt prefix seen before")
    swap_space: float = _knob(4.0, "GiB of CPU memory for preempted sequences' KV (0 = off: recompute them)")
    seed: int = _knob(0, "seed of the random weights (--load-format dummy) and of sampling without a request seed")
    load_format: str = _knob("auto", "auto: read the checkpoint; dummy: random weights, no checkpoint read",
                             choices=["auto", "dummy"])
    quantization: str | None = _knob(None, "weight quantization: awq (4-bit in groups of 128, from an AWQ or "
                                           "compressed-tensors W4A16 checkpoint, or random with --load-format "
                                           "dummy) | int8 (8-bit per output channel; a dense checkpoint is "
                                           "quantized while it loads) | fp8 (E4M3 weights per output channel and "
                                           "activations per token; FP8 checkpoints, or a dense one quantized while "
                                           "it loads) | w8a8 (the same in int8; SmoothQuant checkpoints from "
                                           "`tachyon quantize --method w8a8`). Default: what the checkpoint says",
                                     choices=list(QUANTIZATION_METHODS))
    attention_backend: str = _knob("auto", "auto: triton on a GPU, torch on the CPU",
                                   choices=["auto", "torch", "triton"])
    enforce_eager: bool = _knob(False, "no CUDA graphs")
    mixed_cuda_graphs: bool = _knob(True, "replay steps with prefill tokens as piecewise CUDA graphs (all but "
                                          "attention captured per token-count bucket); off: such steps run "
                                          "eagerly")
    num_scheduler_steps: int | None = _knob(None, "steps that may be in flight on the GPU at once: the host "
                                                  "schedules the next while the device computes (default: 3 with "
                                                  "CUDA graphs, else 1 = one step per round trip)")
    enable_pdl: bool = _knob(True, "programmatic dependent launch of the Triton kernels (sm_90+ GPUs; off "
                                   "elsewhere)")
    max_n: int = _knob(128, "the largest n (choices per request) a request may ask for; more is a 400")
    max_logprobs: int = _knob(20, "the most top logprobs per token a request may ask for; more is a 400")
    speculative_config: str | dict | None = _knob(
        None, 'speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": 4, '
              '"prompt_lookup_max": 4, "prompt_lookup_min": 2} (prompt lookup) or {"method": "draft_model", '
              '"model": DIR, "num_speculative_tokens": 4} (a smaller model with the same tokenizer; its '
              '"quantization" is its checkpoint\'s unless given, never the target\'s); optional '
              '"disable_by_batch_size": N (steps with N running sequences or more do not speculate) and '
              '"backoff_max_steps": 32 (sequences whose proposals are mostly rejected decode plainly up to that '
              'many steps between tries; 0: never back off). Requests with penalties or logprobs decode without it')
    enable_chunked_prefill: bool = _knob(True, "split long prompts into chunks that share steps with decodes "
                                               "(always on: the scheduler has one token budget and no phases)")
    tensor_parallel_size: int = _knob(1, "ranks (GPUs, or CPU processes) one model is split over: heads, MLP and "
                                         "vocabulary sharded, all-reduces over NCCL on GPUs, gloo on the CPU",
                                      aliases=("-tp",))
    distributed_executor_backend: str = _knob("mp", "how the tensor-parallel ranks start: mp (this process "
                                                    "starts ranks 1..N-1 on this host) | external_launcher "
                                                    "(torchrun or another launcher started every rank; see "
                                                    "README)", choices=["mp", "external_launcher"])
    disable_log_stats: bool = _knob(False, "no periodic throughput/queue log line (serve)")

    def __post_init__(self) -> None:
        if self.max_n < 1:
            raise ValueError(f"max_n={self.max_n}: it must be >= 1")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs={self.max_logprobs}: it must be >= 0")
        SpeculativeConfig.parse(self.speculative_config)  # a bad value fails here, before anything loads
        if not self.enable_chunked_prefill:
            raise ValueError("enable_chunked_prefill=False is not supported: prefill is always chunked into the "
                             "step's token budget (drop the flag; --max-num-batched-tokens sets the chunk)")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size}: it must be >= 1")

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    # -- the command line -----------------------------------------------------------------------------------
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, only: typing.Iterable[str] | None = None) -> None:
        """One `--flag-name` per field (or per field in `only`): bools take `--x/--no-x`, the rest a value."""
        group = parser.add_argument_group("engine")
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            if only is not None and f.name not in only:
                continue
            kind = _value_type(hints[f.name])
            kwargs = dict(f.metadata)
            aliases = kwargs.pop("aliases", ())
            if kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif kind is not str:
                kwargs["type"] = kind
            if f.default is not None and "default" not in kwargs["help"]:
                kwargs["help"] += " (default: %(default)s)"
            group.add_argument("--" + f.name.replace("_", "-"), *aliases, default=f.default, **kwargs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> EngineArgs:
        """The fields `add_cli_args` put on the namespace; the others keep their defaults."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)})

    # -- the configs -----------------------------------------------------------------------------------------
    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def create_engine_config(self, model: ModelConfig, device: torch.device) -> EngineConfig:
        """The engine's configs for `model` on `device`, with every `auto`/None knob resolved."""
        gpu = device.type == "cuda"
        model = dataclasses.replace(model, quantization=resolve_quantization(model.hf_config, self.quantization))
        dtype = parse_dtype(self.dtype) if self.dtype != "auto" else (torch.bfloat16 if gpu else torch.float32)
        max_len = self.max_model_len or model.max_position_embeddings
        if model.sliding_window:
            max_len = min(max_len, model.sliding_window)  # no sliding-window attention: stay inside it
        backend = self.attention_backend
        if backend == "auto":
            backend = "triton" if gpu else "torch"
        graphs = gpu and backend == "triton" and not self.enforce_eager
        tokens = self.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS["cuda" if gpu else "cpu"]
        return EngineConfig(
            model=model,
            cache=CacheConfig(block_size=self.block_size, kv_cache_bytes=int(self.kv_cache_memory_gib * (1 << 30)),
                              gpu_memory_utilization=self.gpu_memory_utilization, num_kv_blocks=self.num_kv_blocks,
                              enable_prefix_caching=self.enable_prefix_caching, swap_space_gib=self.swap_space,
                              dtype=parse_kv_cache_dtype(self.kv_cache_dtype, dtype)),
            scheduler=SchedulerConfig(max_num_batched_tokens=max(tokens, 1), max_num_seqs=self.max_num_seqs,
                                      max_model_len=max_len,
                                      num_scheduler_steps=max(1, self.num_scheduler_steps or (3 if graphs else 1))),
            device=device, dtype=dtype, attention_backend=backend, enforce_eager=self.enforce_eager,
            mixed_cuda_graphs=self.mixed_cuda_graphs and graphs, seed=self.seed,
            enable_pdl=self.enable_pdl and backend == "triton", max_n=self.max_n, max_logprobs=self.max_logprobs,
            speculative=SpeculativeConfig.parse(self.speculative_config),
        )


def _value_type(hint: Any) -> type:
    """int for `int | None`, and so on: the type a flag's value is parsed as."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        (hint,) = [str] if str in args else args  # `str | dict`: the command line gives text (JSON)
    return hint
