"""Configuration dataclasses: what the model is, how big the KV cache is, how the scheduler batches."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


# --kv-cache-dtype: "auto" keeps the KV cache in the model's dtype; fp8 stores E4M3 with a scale per layer for K
# and one for V (tachyon.layers.attention says how they are found and applied)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")
FP8_KV_DTYPE = torch.float8_e4m3fn


def parse_kv_cache_dtype(kv_cache_dtype: str | torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type: the model's dtype for "auto", E4M3 for "fp8"/"fp8_e4m3"."""
    if isinstance(kv_cache_dtype, torch.dtype):
        return kv_cache_dtype
    if kv_cache_dtype == "auto":
        return dtype
    if kv_cache_dtype.lower() in ("fp8", "fp8_e4m3", "float8_e4m3fn"):
        return FP8_KV_DTYPE
    raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r} is not supported; use one of {', '.join(KV_CACHE_DTYPES)} "
                     f"(fp8_e5m2 is not implemented)")


QUANTIZATION_METHODS = ("awq", "int8", "fp8", "w8a8")


@dataclass(slots=True, frozen=True)
class QuantConfig:
    """How the linear layers (not embeddings, lm_head or norms) hold their weights.

    method: "awq" (4-bit, groups of `group_size` input features with a scale and a zero point each, 16-bit
    activations), "int8" (8-bit, one scale per output feature), "fp8" (E4M3 weights with a scale per output
    feature, E4M3 activations with a scale per token) or "w8a8" (the same in int8: SmoothQuant). checkpoint_format:
    how the checkpoint stores them: "awq" (AutoAWQ's qweight/qzeros/scales), "compressed-tensors" (llm-compressor's
    pack-quantized weight_packed/weight_scale/weight_zero_point), "int8" (Tachyon's qweight/scales),
    "float-quantized" / "int-quantized" (compressed-tensors' 8-bit weight/weight_scale[/input_scale], what
    llm-compressor and `tachyon quantize --method fp8|w8a8` write), "fp8" (HF's and vLLM's fp8 checkpoints:
    weight/weight_scale[/input_scale]), or "dense" (16/32-bit weights, quantized while they load: int8, fp8, w8a8).
    static_input: the checkpoint gives one activation scale per layer (input_scale) instead of one per token."""

    method: str
    group_size: int = 128
    checkpoint_format: str = "dense"
    symmetric: bool = False  # compressed-tensors W4A16 without zero points (they are 8 then)
    static_input: bool = False

    def __post_init__(self) -> None:
        if self.method not in QUANTIZATION_METHODS:
            raise ValueError(f"unknown quantization {self.method!r}; Tachyon runs {', '.join(QUANTIZATION_METHODS)}")
        if self.method == "awq" and (self.group_size < 32 or self.group_size & (self.group_size - 1)):
            raise ValueError(f"AWQ group size {self.group_size}: Tachyon's kernels take a power of two >= 32")


def quant_config_from_hf(cfg: dict[str, Any]) -> QuantConfig | None:
    """The checkpoint's own quantization (config.json `quantization_config`), None for a dense checkpoint."""
    qc = cfg.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method == "awq":
        bits, version = qc.get("bits", qc.get("w_bit", 4)), str(qc.get("version", "gemm")).lower()
        if bits != 4 or version != "gemm" or not qc.get("zero_point", True):
            raise ValueError(f"AWQ checkpoint with bits={bits}, version={version!r}, zero_point="
                             f"{qc.get('zero_point', True)}: Tachyon loads AutoAWQ's 4-bit GEMM layout with zero points")
        return QuantConfig("awq", int(qc.get("group_size", qc.get("q_group_size", 128))), "awq")
    if method == "int8":
        return QuantConfig("int8", checkpoint_format="int8")
    if method == "fp8":  # HF / vLLM: E4M3 weights with per-tensor scales, dynamic or static activations
        if qc.get("weight_block_size"):
            raise ValueError(f"fp8 checkpoint with weight_block_size {qc['weight_block_size']} (block-wise scales, "
                             f"weight_scale_inv): Tachyon loads per-tensor and per-channel fp8 scales")
        scheme = str(qc.get("activation_scheme", "dynamic")).lower()
        if scheme not in ("dynamic", "static"):
            raise ValueError(f"fp8 checkpoint with activation_scheme {scheme!r}: Tachyon takes dynamic or static")
        return QuantConfig("fp8", checkpoint_format="fp8", static_input=scheme == "static")
    if method == "compressed-tensors":
        fmt = qc.get("format")
        groups = list((qc.get("config_groups") or {}).values())
        if fmt in ("float-quantized", "int-quantized", "naive-quantized") and len(groups) == 1:
            return _compressed_8bit(fmt, groups[0])
        if fmt != "pack-quantized" or len(groups) != 1:
            raise ValueError(f"compressed-tensors checkpoint in format {fmt!r} with {len(groups)} config groups: "
                             f"Tachyon loads one pack-quantized W4A16 group")
        w, acts = groups[0].get("weights") or {}, groups[0].get("input_activations")
        # GPTQ's default actorder "weight" (alias "static") only orders its calibration: the layout is unchanged.
        # "group" ("dynamic") permutes the groups and stores weight_g_idx, which Tachyon does not read.
        if (w.get("num_bits") != 4 or w.get("type", "int") != "int" or w.get("strategy") != "group" or acts
                or w.get("actorder") not in (None, "weight", "static")):
            raise ValueError(f"compressed-tensors scheme {w} (activations {acts}): Tachyon loads 4-bit int weights "
                             f"in groups, 16-bit activations, activation ordering none or 'weight' (W4A16)")
        return QuantConfig("awq", int(w.get("group_size") or 128), "compressed-tensors", bool(w.get("symmetric")))
    raise ValueError(f"the checkpoint is quantized with {method!r}: Tachyon loads awq (AutoAWQ), fp8, "
                     f"compressed-tensors W4A16 / FP8 / INT8 W8A8 and its own int8")


def _compressed_8bit(fmt: str, group: dict) -> QuantConfig:
    """A compressed-tensors W8A8 scheme (FP8 or INT8 weights per channel or tensor, activations per token or
    static per tensor) as a QuantConfig; a ValueError naming what Tachyon does not run otherwise."""
    w, a = group.get("weights") or {}, group.get("input_activations")
    wtype = w.get("type", "int")
    ok = (w.get("num_bits") == 8 and wtype in ("int", "float") and w.get("strategy") in ("channel", "tensor")
          and w.get("symmetric", True) and a is not None and a.get("num_bits") == 8 and a.get("type", "int") == wtype
          and a.get("symmetric", True) and (a.get("dynamic") and a.get("strategy") == "token"
                                            or not a.get("dynamic") and a.get("strategy") == "tensor"))
    if not ok or (fmt == "float-quantized") != (wtype == "float"):
        raise ValueError(f"compressed-tensors {fmt} scheme weights {w}, activations {a}: Tachyon loads 8-bit "
                         f"symmetric weights per channel or tensor with 8-bit symmetric activations of the same type, "
                         f"dynamic per token or static per tensor (FP8 or INT8 W8A8)")
    return QuantConfig("fp8" if wtype == "float" else "w8a8",
                       checkpoint_format="float-quantized" if wtype == "float" else "int-quantized",
                       static_input=not a.get("dynamic"))


def resolve_quantization(cfg: dict[str, Any], requested: str | None) -> QuantConfig | None:
    """What the engine runs: the checkpoint's quantization, or `requested` (--quantization) on a dense one.
    A dense checkpoint quantizes to int8, fp8 or w8a8 (without SmoothQuant's smoothing, which needs calibration:
    `tachyon quantize --method w8a8`) while it loads; awq needs an AWQ checkpoint (`tachyon quantize`)."""
    own = quant_config_from_hf(cfg)
    if requested in (None, "none", "auto"):
        return own
    if own is not None:
        if own.method != requested:
            raise ValueError(f"--quantization {requested}, but the checkpoint is {own.method}-quantized: drop the "
                             f"flag or pass --quantization {own.method}")
        return own
    return QuantConfig(requested, checkpoint_format="dense")


@dataclass(slots=True)
class ModelConfig:
    """The architecture of one Llama-family model, read from an HF `config.json` dict."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    bos_token_id: int | None
    eos_token_ids: list[int]
    sliding_window: int | None = None
    hf_config: dict[str, Any] = field(default_factory=dict, repr=False)
    quantization: QuantConfig | None = None  # the checkpoint's; the engine may set int8 on a dense one

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; Tachyon runs "
                f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))} (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM)"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                               "intermediate_size") if k not in cfg]
        if missing:
            raise ValueError(f"config.json lacks {missing}: is this a causal LM checkpoint?")
        heads = cfg["num_attention_heads"]
        # transformers 5 writes rope_parameters; older configs have rope_theta + rope_scaling.
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or None
        if scaling is None and rope_params.get("rope_type", "default") != "default":
            scaling = dict(rope_params)
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind in (None, "default"):
                scaling = None
            elif kind not in ("llama3", "linear"):
                raise ValueError(f"unsupported rope scaling {kind!r}; Tachyon supports llama3 and linear")
        eos = cfg.get("eos_token_id")
        eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            sliding_window=cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None,
            hf_config=cfg,
            quantization=quant_config_from_hf(cfg),
        )

    @classmethod
    def from_file(cls, path: str) -> ModelConfig:
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path) as f:
                cfg = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"no config.json at {path}: point --model at an HF checkpoint directory") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e})") from None
        return cls.from_dict(cfg)

    @property
    def kv_bytes_per_token_per_dtype_byte(self) -> int:
        """K and V elements per token over all layers (multiply by the cache dtype's size)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def num_params(self) -> int:
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + h


def kv_cache_bytes_per_token(model: ModelConfig, kv_dtype: torch.dtype) -> int:
    """Bytes the paged cache holds for one token (K and V, every layer). Shared by the engine and `tachyon plan`."""
    return model.kv_bytes_per_token_per_dtype_byte * torch.empty((), dtype=kv_dtype).element_size()


def num_kv_blocks_for_budget(model: ModelConfig, kv_dtype: torch.dtype, block_size: int, budget_bytes: int) -> int:
    return int(budget_bytes // (kv_cache_bytes_per_token(model, kv_dtype) * block_size))


# The three below are plain holders: `tachyon.engine_args.EngineArgs` owns every knob's default and builds them
# (`EngineArgs(...).create_engine_config(model, device)`, also in tests).
@dataclass(slots=True)
class CacheConfig:
    block_size: int
    # CPU: the KV pool is this many bytes. GPU: sized from free memory and gpu_memory_utilization.
    kv_cache_bytes: int
    gpu_memory_utilization: float
    num_kv_blocks: int | None  # exact pool size, overrides both
    enable_prefix_caching: bool
    swap_space_gib: float
    dtype: torch.dtype  # of the KV cache: the model's, or float8_e4m3fn (--kv-cache-dtype fp8)


@dataclass(slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    # steps that may be in flight on the device at once (a decode's input may be a token still being sampled)
    num_scheduler_steps: int


SPECULATIVE_METHODS = ("ngram", "draft_model")
_PROMPT_LOOKUP_MIN, _PROMPT_LOOKUP_MAX = 2, 4  # n-gram lengths when not given
DEFAULT_SPEC_BACKOFF_MAX_STEPS = 32  # a proposer that is never right costs one verification per ~33 steps


def _is_int(value) -> bool:
    """An int that is not a bool (JSON's true is Python's True, an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's `--speculative-config` shape): each step, a proposer guesses up to
    `num_speculative_tokens` next tokens of a decoding sequence and the target model verifies them in one forward.

    method "ngram": prompt lookup on the host; the longest suffix of the sequence's tokens (at most
    `prompt_lookup_max`, at least `prompt_lookup_min` tokens) found earlier in it proposes what followed there.
    method "draft_model": `model`, a smaller model with the same tokenizer, proposes greedily with its own paged KV.
    Its weights run as its checkpoint says, or as `quantization` asks (one of QUANTIZATION_METHODS, as
    --quantization does for the target; vLLM's key): a draft never inherits the target's --quantization.

    When speculation does not pay it steps aside: a step with `disable_by_batch_size` or more running sequences
    verifies nothing (vLLM's key: at large batches the verification's extra tokens cost compute that decoding has
    not got to spare); a sequence whose proposals are mostly rejected (fewer than 0.25 tokens accepted per
    verification, as a running mean) decodes plainly for 1, 2, 4, .. up to `backoff_max_steps` steps between
    verifications that accept nothing (plain decode steps run ahead of the host in CUDA graphs; a verification
    waits for its tokens). `backoff_max_steps` 0: always speculate.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = _PROMPT_LOOKUP_MAX
    prompt_lookup_min: int = _PROMPT_LOOKUP_MIN
    model: str | None = None
    disable_by_batch_size: int | None = None
    backoff_max_steps: int = DEFAULT_SPEC_BACKOFF_MAX_STEPS
    quantization: str | None = None  # the draft model's (method "draft_model")

    @classmethod
    def parse(cls, value: str | dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """From the JSON of `--speculative-config` (or a dict); None or "" means off."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            if not value.strip():
                return None
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--speculative-config is not JSON ({e}); give e.g. "
                                 f"'{{\"method\": \"ngram\", \"num_speculative_tokens\": 4}}'") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, not {type(value).__name__}")
        known = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "model",
                 "disable_by_batch_size", "backoff_max_steps", "quantization"}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {sorted(unknown)}; known: {sorted(known)}")
        method = value.get("method")
        if method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config method {method!r} is not supported; use one of "
                             f"{list(SPECULATIVE_METHODS)}")
        k = value.get("num_speculative_tokens")
        if not _is_int(k) or k < 1:
            raise ValueError(f"speculative_config num_speculative_tokens={k!r}: give an integer >= 1")
        lo = value.get("prompt_lookup_min")
        hi = value.get("prompt_lookup_max")
        if lo is None and hi is not None:
            lo = min(hi, _PROMPT_LOOKUP_MIN)
        lo = _PROMPT_LOOKUP_MIN if lo is None else lo
        hi = max(lo, _PROMPT_LOOKUP_MAX) if hi is None else hi
        if not (_is_int(lo) and _is_int(hi) and 1 <= lo <= hi):
            raise ValueError(f"speculative_config prompt_lookup_min={lo!r}, prompt_lookup_max={hi!r}: give "
                             f"integers with 1 <= min <= max")
        model = value.get("model")
        if method == "draft_model" and not model:
            raise ValueError('speculative_config method "draft_model" needs "model": the draft checkpoint '
                             '(same tokenizer as the target)')
        if method == "ngram" and model:
            raise ValueError('speculative_config method "ngram" takes no "model"; use "draft_model" for a draft')
        by_batch = value.get("disable_by_batch_size")
        if by_batch is not None and (not _is_int(by_batch) or by_batch < 1):
            raise ValueError(f"speculative_config disable_by_batch_size={by_batch!r}: give an integer >= 1 (steps "
                             f"with that many running sequences or more do not speculate), or leave it out")
        backoff = value.get("backoff_max_steps", DEFAULT_SPEC_BACKOFF_MAX_STEPS)
        if not _is_int(backoff) or backoff < 0:
            raise ValueError(f"speculative_config backoff_max_steps={backoff!r}: give an integer >= 0 (0: a "
                             f"sequence speculates every step however often its proposals are rejected)")
        quant = value.get("quantization")
        if quant in ("none", "auto"):
            quant = None
        if quant is not None and method != "draft_model":
            raise ValueError(f'speculative_config quantization applies to a draft model (method "draft_model"), '
                             f'not to method {method!r}: leave it out')
        if quant is not None and quant not in QUANTIZATION_METHODS:
            raise ValueError(f"speculative_config quantization {quant!r} is not supported; use one of "
                             f"{list(QUANTIZATION_METHODS)}, or leave it out (the draft checkpoint's own)")
        return cls(method, k, hi, lo, model, by_batch, backoff, quant)


@dataclass(slots=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig
    scheduler: SchedulerConfig
    device: torch.device
    dtype: torch.dtype
    attention_backend: str  # "torch" or "triton", resolved
    enforce_eager: bool
    mixed_cuda_graphs: bool  # steps with prefill tokens as piecewise graphs (tachyon.worker.piecewise_graphs)
    seed: int
    enable_pdl: bool  # the runner switches it on only where tachyon.kernels.pdl.supported
    max_n: int  # sequences one request may ask for (n), as OpenAI's API allows
    max_logprobs: int  # top logprobs one request may ask for per token, as vLLM's default
    speculative: SpeculativeConfig | None = None
