"""`tachyon plan`: a capacity planner. Weight bytes, KV bytes per token, KV blocks, how many sequences of a given
context length run at once, and whether the model fits at all, before any GPU is rented.

It uses the engine's own arithmetic (`tachyon.config.kv_cache_bytes_per_token`, `num_kv_blocks_for_budget`,
`ModelConfig.num_params`), so its block count is the one the engine allocates for the same KV budget.

Model of one GPU with tensor parallelism t (one replica = t GPUs; gpus // t replicas):

    weights/GPU   = (linear + embedding + lm_head bytes) / t + norms (replicated)
    KV/token/GPU  = layers x (kv_heads / t) x head_dim x 2 (K and V) x kv dtype bytes
                    (t > kv_heads: each GPU holds one replicated KV head, t must be a multiple of kv_heads)
    KV budget/GPU = gpu_mem x gpu_memory_utilization - weights/GPU - activation reserve
    activation reserve (default, state it with --activation-gib to override)
                  = 1 GiB fixed (CUDA context, cuBLAS workspace, CUDA graphs, allocator slack)
                    + max_num_batched_tokens x per-token activations of one layer (residual, qkv, attention out,
                      gate/up, act, in the model dtype) + max_num_seqs x vocab x 8 (fp32 logits and a sampler copy)
    blocks/GPU    = num_kv_blocks_for_budget(...) = budget // (block_size x KV/token/GPU)
    usable blocks = blocks - 1: the engine reserves block 0 as the null block (KVCacheManager.num_blocks)
    KV tokens     = usable blocks x block_size per replica (every GPU of a replica holds its heads of the same tokens)
    concurrency   = usable blocks // ceil(context / block_size), times the number of replicas

Exit code: 0 when the model fits (weights + reserve under the cap and room for at least one sequence of the
context length), 1 when it does not (the JSON says "fits": false and "why_not"), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

import torch

from tachyon.config import (
    KV_CACHE_DTYPES,
    ModelConfig,
    kv_cache_bytes_per_token,
    num_kv_blocks_for_budget,
    parse_dtype,
    parse_kv_cache_dtype,
)
from tachyon.engine_args import DEFAULT_MAX_NUM_BATCHED_TOKENS, EngineArgs

GiB = 1 << 30
KiB = 1 << 10
MiB = 1 << 20

FIXED_RESERVE_GIB = 1.0
AWQ_GROUP = 128
QUANTIZATIONS = ("none", "awq", "int8", "fp8", "w8a8")

_FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2, "float8_e5m2": torch.float8_e5m2}

# The seeds' worked example: Llama-3-70B, FP16, 4 x A100-80G, 8K context, "about 0.5 MB of KV per token", 45 sequences.
SEED_KV_BYTES_PER_TOKEN = 0.5e6
SEED_CONCURRENCY = 45


def add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="HF checkpoint directory, config.json, or .gguf (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="bf16", help="weight/activation dtype: bf16 | fp16 | fp32 (auto = bf16)")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="auto (= --dtype) | fp8 (E4M3, as the engine's --kv-cache-dtype fp8: half the KV bytes of bf16) | "
                        "bf16 | fp16 | fp32 | fp8_e5m2 (what-ifs the engine does not run)")
    p.add_argument("--quantization", default="none", choices=QUANTIZATIONS,
                   help="weight quantization: awq = 4-bit, group 128, a 4-bit zero and a 16-bit scale per group (~4.16 "
                        "bits/linear weight); int8, fp8 and w8a8 = 8-bit + a scale per output channel (fp32 for fp8 "
                        "and w8a8), as the engine holds them. Embeddings and lm_head stay 16-bit")
    p.add_argument("--gpu-mem", type=float, default=80.0, help="memory of one GPU in GiB (default 80)")
    p.add_argument("--gpus", type=int, default=1, help="number of GPUs (default 1)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: --gpus, one replica)")
    p.add_argument("--context-len", type=int, default=None,
                   help="context length to count concurrent sequences at (default: --max-model-len)")
    gpu_tokens = DEFAULT_MAX_NUM_BATCHED_TOKENS["cuda"]
    p.add_argument("--max-num-batched-tokens", type=int, default=gpu_tokens,
                   help=f"tokens in the largest step; sizes the activation reserve (engine default on a GPU: "
                        f"{gpu_tokens})")
    # the engine's own flags, defaults and help, for the knobs the plan shares with it
    EngineArgs.add_cli_args(p, only=("max_model_len", "gpu_memory_utilization", "block_size", "max_num_seqs"))
    p.add_argument("--activation-gib", type=float, default=None,
                   help="activation reserve per GPU in GiB (default: 1 GiB + an estimate from max-num-batched-tokens)")
    p.add_argument("--kv-budget-gib", type=float, default=None,
                   help="explicit KV budget per GPU in GiB instead of the memory arithmetic (e.g. the CPU engine's "
                        "--kv-cache-memory-gib)")
    p.add_argument("--json", action="store_true", help="print one JSON object with every number")


# -- arithmetic -------------------------------------------------------------------------------------------------


def load_model_config(model: str | None) -> ModelConfig:
    if model is None:
        from tachyon.models.embedded import embedded_model_dir

        model = embedded_model_dir()
    from tachyon.models.loader import load_config, resolve_model_path

    return load_config(resolve_model_path(model))


def parse_kv_dtype(kv_dtype: str | torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """What the engine would hold (auto, fp8), or a what-if dtype (bf16, fp8_e5m2, ...)."""
    if isinstance(kv_dtype, torch.dtype) or kv_dtype.lower() in KV_CACHE_DTYPES + ("float8_e4m3fn",):
        return parse_kv_cache_dtype(kv_dtype, dtype)
    if kv_dtype.lower() in _FP8:
        return _FP8[kv_dtype.lower()]
    return parse_dtype(kv_dtype)


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def weight_breakdown(cfg: ModelConfig, dtype: torch.dtype, quantization: str = "none") -> dict[str, int]:
    """Parameter counts and bytes, split into linear layers (quantizable), embedding + lm_head, norms.
    The three parts add up to `ModelConfig.num_params()`."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    linear = cfg.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * i)
    embed = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    norms = cfg.num_layers * 2 * h + h
    assert linear + embed + norms == cfg.num_params()
    b = _elem(dtype)
    # (in, out) of each linear of a layer, as the engine holds them (fused qkv and gate/up)
    shapes = [(h, q + 2 * kv), (q, h), (h, 2 * i), (i, h)]
    if quantization == "none":
        linear_bytes = linear * b
    elif quantization == "awq":  # layers/linear.py AWQLinear: int4 weights, per group a 4-bit zero and a scale
        linear_bytes = cfg.num_layers * sum(K * N // 2 + (K // AWQ_GROUP) * N * (b + 0.5) for K, N in shapes)
    elif quantization == "int8":  # Int8Linear: int8 weights + a scale per output feature
        linear_bytes = cfg.num_layers * sum(K * N + N * b for K, N in shapes)
    elif quantization in ("fp8", "w8a8"):  # ScaledLinear: 8-bit weights + an fp32 scale per output feature
        linear_bytes = cfg.num_layers * sum(K * N + N * 4 for K, N in shapes)
    else:
        raise ValueError(f"unknown quantization {quantization!r}; use one of {QUANTIZATIONS}")
    linear_bytes = int(linear_bytes)
    return {"params": linear + embed + norms, "linear_params": linear, "embedding_params": embed, "norm_params": norms,
            "linear_bytes": linear_bytes, "embedding_bytes": embed * b, "norm_bytes": norms * b,
            "total_bytes": linear_bytes + embed * b + norms * b}


def kv_heads_per_gpu(cfg: ModelConfig, tp: int) -> int:
    """The most KV heads a GPU holds under the engine's own split (tachyon.models.sharding: whole KV groups per
    rank, or each KV head replicated when tp exceeds them); every rank's pool has the same block count, so the
    fullest rank sizes it. A ValueError naming the sizes that work when tp fits no split."""
    from tachyon.models.sharding import plan_shards

    spans = [plan_shards(cfg, r, tp).kv_heads for r in range(tp)]
    return max(b - a for a, b in spans)


def activation_reserve_bytes(cfg: ModelConfig, dtype: torch.dtype, tp: int, max_num_batched_tokens: int,
                             max_num_seqs: int) -> dict[str, int]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    per_token = _elem(dtype) * (2 * h + (q + 2 * kv) // tp + q // tp + 3 * i // tp)
    logits = min(max_num_seqs, max_num_batched_tokens) * cfg.vocab_size * 8
    fixed = int(FIXED_RESERVE_GIB * GiB)
    return {"fixed_bytes": fixed, "per_token_bytes": per_token, "tokens_bytes": per_token * max_num_batched_tokens,
            "logits_bytes": logits, "total_bytes": fixed + per_token * max_num_batched_tokens + logits}


def _llama3_70b_shaped(cfg: ModelConfig) -> bool:
    return (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (80, 8192, 64, 8, 128)


def make_plan(cfg: ModelConfig, *, dtype: str | torch.dtype = "bf16", kv_cache_dtype: str | torch.dtype = "auto",
              quantization: str = "none", gpu_mem_gib: float = 80.0, gpus: int = 1, tp: int | None = None,
              max_model_len: int | None = None, context_len: int | None = None,
              gpu_memory_utilization: float = EngineArgs.gpu_memory_utilization,
              block_size: int = EngineArgs.block_size,
              max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS["cuda"],
              max_num_seqs: int = EngineArgs.max_num_seqs, activation_gib: float | None = None,
              kv_budget_bytes: int | None = None, model_name: str | None = None) -> dict[str, Any]:
    """Every number of the plan as a dict (what `--json` prints). kv_budget_bytes: an explicit per-GPU KV budget
    that replaces the memory arithmetic (the CPU engine's kv_cache_memory_gib * 2**30)."""
    dtype = torch.bfloat16 if dtype == "auto" else parse_dtype(dtype)
    kv_dtype = parse_kv_dtype(kv_cache_dtype, dtype)
    tp = tp or gpus
    if tp < 1 or gpus < 1:
        raise ValueError("--gpus and --tp must be at least 1")
    if gpus % tp:
        raise ValueError(f"--gpus {gpus} is not a multiple of --tp {tp}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError("--gpu-memory-utilization must be in (0, 1]")
    if block_size < 1:
        raise ValueError("--block-size must be at least 1")
    replicas = gpus // tp
    max_model_len = max_model_len or cfg.max_position_embeddings
    context_len = context_len or max_model_len
    if context_len < 1:
        raise ValueError("--context-len must be at least 1")

    w = weight_breakdown(cfg, dtype, quantization)
    weights_per_gpu = math.ceil((w["linear_bytes"] + w["embedding_bytes"]) / tp) + w["norm_bytes"]
    kv_heads = kv_heads_per_gpu(cfg, tp)
    kv_per_token = kv_cache_bytes_per_token(cfg, kv_dtype)  # the whole model, as the engine computes it
    per_gpu_cfg = dataclasses.replace(cfg, num_kv_heads=kv_heads)
    kv_per_token_gpu = kv_cache_bytes_per_token(per_gpu_cfg, kv_dtype)
    mha_per_token = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * _elem(kv_dtype)

    if activation_gib is not None:
        reserve = {"fixed_bytes": None, "per_token_bytes": None, "tokens_bytes": None, "logits_bytes": None,
                   "total_bytes": int(activation_gib * GiB), "source": "--activation-gib"}
    else:
        reserve = {**activation_reserve_bytes(cfg, dtype, tp, max_num_batched_tokens, max_num_seqs),
                   "source": f"{FIXED_RESERVE_GIB:g} GiB fixed + {max_num_batched_tokens} batched tokens x "
                             f"per-token activations + fp32 logits for {min(max_num_seqs, max_num_batched_tokens)} rows"}
    cap = int(gpu_mem_gib * gpu_memory_utilization * GiB)
    if kv_budget_bytes is None:
        budget = cap - weights_per_gpu - reserve["total_bytes"]
        budget_source = "gpu_mem x utilization - weights/GPU - activation reserve"
    else:
        budget = int(kv_budget_bytes)
        budget_source = "explicit (--kv-budget-gib)"
    num_blocks = max(0, num_kv_blocks_for_budget(per_gpu_cfg, kv_dtype, block_size, max(budget, 0)))
    usable_blocks = max(0, num_blocks - 1)  # block 0 is the engine's reserved null block
    blocks_per_seq = -(-context_len // block_size)
    per_replica = usable_blocks // blocks_per_seq
    concurrency = per_replica * replicas

    why_not: list[str] = []
    advice: list[str] = []
    if kv_budget_bytes is None and weights_per_gpu + reserve["total_bytes"] > cap:
        why_not.append(f"weights ({weights_per_gpu / GiB:.1f} GiB/GPU) + activation reserve "
                       f"({reserve['total_bytes'] / GiB:.1f} GiB) exceed {gpu_memory_utilization:g} x {gpu_mem_gib:g} GiB "
                       f"= {cap / GiB:.1f} GiB")
    elif per_replica < 1:
        why_not.append(f"the KV cache holds {usable_blocks * block_size} tokens per replica, less than one sequence of "
                       f"{context_len} tokens ({blocks_per_seq} blocks)")
    if context_len > max_model_len:
        why_not.append(f"--context-len {context_len} is longer than --max-model-len {max_model_len}")
    fits = not why_not
    if not fits:
        def fits_with(weights: dict[str, int], t: int) -> bool:
            try:
                kvh = kv_heads_per_gpu(cfg, t)
            except ValueError:
                return False
            per_gpu = math.ceil((weights["linear_bytes"] + weights["embedding_bytes"]) / t) + weights["norm_bytes"]
            res = reserve["total_bytes"] if activation_gib is not None else activation_reserve_bytes(
                cfg, dtype, t, max_num_batched_tokens, max_num_seqs)["total_bytes"]
            left = cap - per_gpu - res
            return left > 0 and num_kv_blocks_for_budget(dataclasses.replace(cfg, num_kv_heads=kvh), kv_dtype,
                                                         block_size, left) - 1 >= blocks_per_seq

        if kv_budget_bytes is None:
            bigger = next((t for t in (2, 4, 8, 16, 32, 64) if t > tp and fits_with(w, t)), None)
            if bigger:
                advice.append(f"more GPUs: --tp {bigger} (--gpus {bigger * replicas}) fits")
            if quantization == "none":
                qz = next((qz for qz in ("fp8", "awq") if fits_with(weight_breakdown(cfg, dtype, qz), tp)), None)
                if qz:
                    advice.append(f"quantize the weights: --quantization {qz} fits at TP={tp}")
            if gpu_memory_utilization < 0.95:
                advice.append("raise --gpu-memory-utilization (e.g. 0.95) if nothing else shares the GPU")
        else:
            advice.append("raise the KV budget (--kv-budget-gib)")
        if kv_dtype.itemsize > 1:
            advice.append("--kv-cache-dtype fp8 halves the KV bytes per token")
        advice.append("a shorter --max-model-len / --context-len needs fewer KV blocks per sequence")

    notes = [f"KV bytes/token = {cfg.num_layers} layers x {cfg.num_kv_heads} KV heads x {cfg.head_dim} head_dim "
             f"x 2 (K and V) x {_elem(kv_dtype)} B = {kv_per_token} B ({kv_per_token / KiB:g} KiB)"]
    if cfg.num_kv_heads < cfg.num_heads:
        notes.append(f"GQA: {cfg.num_kv_heads} KV heads for {cfg.num_heads} query heads, so the KV cache is "
                     f"{cfg.num_heads // cfg.num_kv_heads}x smaller than multi-head attention would need "
                     f"({mha_per_token / MiB:g} MiB/token)")
    notes.append("usable blocks = allocated blocks - 1: block 0 is the engine's reserved null block")
    if quantization != "none" or kv_dtype.itemsize == 1:
        notes.append("what-if: the engine today loads 16/32-bit weights and keeps KV in the model dtype")
    seed = None
    if _llama3_70b_shaped(cfg):
        seed_kv_fix = int(((4 * 80 - 140) * 1e9) // (8192 * kv_per_token)) if kv_per_token else 0
        seed = {"seed_kv_bytes_per_token": SEED_KV_BYTES_PER_TOKEN, "seed_concurrency": SEED_CONCURRENCY,
                "seed_arithmetic": "45 matches (4 x 80 GB - 140 GB weights) / (8192 tokens x 0.5 MB)",
                "seed_arithmetic_with_config_kv": seed_kv_fix}
        notes.append(
            f"seed comparison: the seed assumed ~0.5 MB of KV per token and got {SEED_CONCURRENCY} sequences for "
            f"Llama-3-70B FP16 on 4x A100-80G at 8K (45 matches (4 x 80 GB - 140 GB) / (8192 x 0.5 MB)). From the config the "
            f"KV is {kv_per_token / KiB:g} KiB = {kv_per_token / MiB:g} MiB/token "
            f"({SEED_KV_BYTES_PER_TOKEN / kv_per_token:.2f}x less than 0.5 MB; MHA would be {mha_per_token / MiB:g} MiB). "
            f"The seed's own arithmetic with {kv_per_token / KiB:g} KiB gives {seed_kv_fix}; this plan gets {concurrency} for "
            f"its inputs because it also caps memory at the utilization, keeps the activation reserve, counts GiB "
            f"(not GB) and leaves out the null block")

    return {
        "model": model_name, "architecture": cfg.architecture,
        "config": {"num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size, "num_heads": cfg.num_heads,
                   "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size,
                   "intermediate_size": cfg.intermediate_size, "max_position_embeddings": cfg.max_position_embeddings},
        "dtype": str(dtype).removeprefix("torch."), "kv_cache_dtype": str(kv_dtype).removeprefix("torch."),
        "quantization": quantization,
        "gpus": gpus, "tp": tp, "replicas": replicas, "gpu_mem_gib": gpu_mem_gib,
        "gpu_memory_utilization": gpu_memory_utilization, "usable_bytes_per_gpu": cap,
        "max_model_len": max_model_len, "context_len": context_len, "block_size": block_size,
        "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
        "params": w["params"], "weight_bytes": w["total_bytes"], "weight_gib": w["total_bytes"] / GiB,
        "weights": w, "weight_bytes_per_gpu": weights_per_gpu, "weight_gib_per_gpu": weights_per_gpu / GiB,
        "activation_reserve": reserve, "activation_reserve_bytes_per_gpu": reserve["total_bytes"],
        "kv_bytes_per_token": kv_per_token, "kv_kib_per_token": kv_per_token / KiB,
        "kv_bytes_per_token_mha": mha_per_token,
        "kv_heads_per_gpu": kv_heads, "kv_bytes_per_token_per_gpu": kv_per_token_gpu,
        "kv_bytes_per_block_per_gpu": kv_per_token_gpu * block_size,
        "kv_budget_bytes_per_gpu": budget, "kv_budget_gib_per_gpu": budget / GiB, "kv_budget_source": budget_source,
        "num_blocks_per_gpu": num_blocks, "usable_blocks_per_gpu": usable_blocks,
        "kv_tokens_per_replica": usable_blocks * block_size, "kv_tokens_total": usable_blocks * block_size * replicas,
        "blocks_per_sequence": blocks_per_seq,
        "max_concurrent_seqs_per_replica": per_replica, "max_concurrent_seqs": concurrency,
        "max_concurrent_seqs_scheduled": min(concurrency, max_num_seqs * replicas),
        "fits": fits, "why_not": why_not, "advice": advice, "notes": notes, "seed": seed,
    }


# -- output ---------------------------------------------------------------------------------------------------


def format_plan(p: dict[str, Any]) -> str:
    r = p["activation_reserve"]
    rows = [
        ("model", f"{p['model']} ({p['architecture']}, {p['params'] / 1e9:.2f} B params)"),
        ("layout", f"{p['gpus']} GPU(s) x {p['gpu_mem_gib']:g} GiB, TP={p['tp']}, {p['replicas']} replica(s)"),
        ("dtype / KV dtype / quant", f"{p['dtype']} / {p['kv_cache_dtype']} / {p['quantization']}"),
        ("weights (total)", f"{p['weight_gib']:.2f} GiB ({p['weight_bytes']:,} B)"),
        ("weights per GPU", f"{p['weight_gib_per_gpu']:.2f} GiB"),
        ("usable per GPU", f"{p['usable_bytes_per_gpu'] / GiB:.2f} GiB "
                           f"({p['gpu_memory_utilization']:g} x {p['gpu_mem_gib']:g} GiB)"),
        ("activation reserve / GPU", f"{r['total_bytes'] / GiB:.2f} GiB ({r['source']})"),
        ("KV bytes per token", f"{p['kv_bytes_per_token']:,} B = {p['kv_kib_per_token']:g} KiB (whole model)"),
        ("KV bytes per token / GPU", f"{p['kv_bytes_per_token_per_gpu']:,} B = "
                                     f"{p['kv_bytes_per_token_per_gpu'] / KiB:g} KiB ({p['kv_heads_per_gpu']} KV head(s)/GPU)"),
        ("KV budget per GPU", f"{p['kv_budget_gib_per_gpu']:.2f} GiB ({p['kv_budget_source']})"),
        ("KV blocks per GPU", f"{p['num_blocks_per_gpu']:,} allocated, {p['usable_blocks_per_gpu']:,} usable "
                              f"(x {p['block_size']} tokens, {p['kv_bytes_per_block_per_gpu'] / KiB:g} KiB each)"),
        ("KV tokens", f"{p['kv_tokens_per_replica']:,} per replica, {p['kv_tokens_total']:,} total"),
        ("context length", f"{p['context_len']:,} tokens = {p['blocks_per_sequence']} blocks "
                           f"(max-model-len {p['max_model_len']:,})"),
        ("max concurrent sequences", f"{p['max_concurrent_seqs']:,} ({p['max_concurrent_seqs_per_replica']:,} per "
                                     f"replica; scheduler cap max-num-seqs {p['max_num_seqs']} -> "
                                     f"{p['max_concurrent_seqs_scheduled']:,})"),
        ("fits", "yes" if p["fits"] else "no"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    for label, items in (("why not", p["why_not"]), ("what to change", p["advice"]), ("notes", p["notes"])):
        if items:
            lines.append("")
            lines.append(f"{label}:")
            lines.extend(f"  - {s}" for s in items)
    return "\n".join(lines)


def run_plan(args: argparse.Namespace) -> int:
    cfg = load_model_config(args.model)
    plan = make_plan(
        cfg, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization,
        gpu_mem_gib=args.gpu_mem, gpus=args.gpus, tp=args.tp, max_model_len=args.max_model_len,
        context_len=args.context_len, gpu_memory_utilization=args.gpu_memory_utilization,
        block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, activation_gib=args.activation_gib,
        kv_budget_bytes=None if args.kv_budget_gib is None else int(args.kv_budget_gib * GiB),
        model_name=args.model or "embedded SmolLM2-135M-Instruct",
    )
    if args.json:
        json.dump(plan, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_plan(plan))
    return 0 if plan["fits"] else 1
