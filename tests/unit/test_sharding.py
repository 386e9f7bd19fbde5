"""Tensor parallelism's split of the Llama family (tachyon.models.sharding), without processes: which heads,
features and vocabulary rows each rank holds, that the parts tile the whole, the sizes refused and what the
error says, and each checkpoint tensor cut to a rank's part (dense, int8, AWQ layouts)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tachyon.config import ModelConfig, QuantConfig
from tachyon.layers.parallel import vocab_shard
from tachyon.models.sharding import plan_shards
from tachyon.plan import kv_heads_per_gpu


def _cfg(heads: int, kv: int, inter: int = 1536, quant: QuantConfig | None = None) -> ModelConfig:
    cfg = ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
                                 "intermediate_size": inter, "num_hidden_layers": 2, "num_attention_heads": heads,
                                 "num_key_value_heads": kv, "head_dim": 64})
    return dataclasses.replace(cfg, quantization=quant)


@pytest.mark.parametrize("heads,kv,size,want", [
    (9, 3, 2, [((0, 3), (0, 1)), ((3, 9), (1, 3))]),  # SmolLM2-135M: KV groups 1 + 2
    (9, 3, 3, [((0, 3), (0, 1)), ((3, 6), (1, 2)), ((6, 9), (2, 3))]),
    (4, 1, 2, [((0, 2), (0, 1)), ((2, 4), (0, 1))]),  # one KV head, replicated; its query heads split
    (8, 2, 4, [((0, 2), (0, 1)), ((2, 4), (0, 1)), ((4, 6), (1, 2)), ((6, 8), (1, 2))]),
    (9, 3, 9, [((r, r + 1), (r // 3, r // 3 + 1)) for r in range(9)]),
])
def test_heads_per_rank(heads, kv, size, want):
    plans = [plan_shards(_cfg(heads, kv), r, size) for r in range(size)]
    assert [(p.q_heads, p.kv_heads) for p in plans] == want
    inter = [p.intermediate for p in plans]
    assert inter[0][0] == 0 and inter[-1][1] == 1536
    assert all(a[1] == b[0] for a, b in zip(inter, inter[1:], strict=False))  # they tile the features
    assert kv_heads_per_gpu(_cfg(heads, kv), size) == max(k1 - k0 for _, (k0, k1) in want)


def test_sizes_the_heads_cannot_take_are_refused_with_the_sizes_that_work():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 does not fit 9 query heads over 3 KV heads.*"
                                         r"sizes that work: \[1, 2, 3, 9\]"):
        plan_shards(_cfg(9, 3), 0, 4)


def test_awq_splits_fall_on_whole_groups():
    awq = QuantConfig("awq", group_size=128, checkpoint_format="awq")
    plans = [plan_shards(_cfg(8, 2, 1536, awq), r, 2) for r in range(2)]
    assert [p.intermediate for p in plans] == [(0, 768), (768, 1536)]
    with pytest.raises(ValueError, match="whole number of AWQ groups of 128"):
        plan_shards(_cfg(9, 3, 1536, awq), 0, 2)  # 3 heads x 64 = 192 input features of o_proj


def test_vocab_shards_are_equal_and_padded():
    assert [vocab_shard(10, r, 3) for r in range(3)] == [(0, 4, 4), (4, 4, 4), (8, 2, 4)]


def test_checkpoint_tensors_are_cut_to_the_rank():
    cfg = _cfg(4, 2, inter=256)
    p1 = plan_shards(cfg, 1, 2)
    w = torch.arange(4 * 64 * 576, dtype=torch.float32).reshape(256, 576)
    assert torch.equal(p1.read("layers.0.self_attn.q_proj.weight", w, cfg), w[128:256])  # column: rows
    assert torch.equal(p1.read("layers.0.mlp.down_proj.weight", w.T, cfg), w.T[:, 128:256])  # row: columns
    assert torch.equal(p1.read("layers.0.input_layernorm.weight", w[0], cfg), w[0])  # whole
    emb = torch.randn(49152, 8)
    assert torch.equal(p1.read("embed_tokens.weight", emb, cfg), emb[24576:])
    # AutoAWQ: qweight [K, N/8] packed along N; scales [K/G, N]; a row shard cuts K, in groups for scales
    awq = dataclasses.replace(cfg, quantization=QuantConfig("awq", group_size=32, checkpoint_format="awq"))
    qweight = torch.arange(576 * 32).reshape(576, 32)  # q_proj: K = 576, N = 256 output features in 32 words
    assert torch.equal(p1.read("layers.0.self_attn.q_proj.qweight", qweight, awq), qweight[:, 16:32])  # N 128..256
    scales = torch.randn(256 // 32, 576)
    assert torch.equal(p1.read("layers.0.self_attn.o_proj.scales", scales, awq), scales[4:8])  # K 128..256
    # int8: per-output-feature scales of a row-parallel layer stay whole
    i8 = dataclasses.replace(cfg, quantization=QuantConfig("int8", checkpoint_format="int8"))
    s = torch.randn(576)
    assert torch.equal(p1.read("layers.0.self_attn.o_proj.scales", s, i8), s)
