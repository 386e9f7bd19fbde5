"""--kv-cache-dtype fp8 in the engine: E4M3 pages with calibrated scales per layer, twice the blocks of a 16-bit
cache (four times fp32's), and the same tokens whatever the batch's history (chunking, preemption with swap or
recompute, prefix-cache hits), with every block back at the end."""

from __future__ import annotations

import pytest
import torch

from tachyon import LLM, SamplingParams
from tests.conftest import make_tiny_checkpoint

PROMPTS = [[(7 * i + 3 * j) % 500 + 3 for j in range(n)] for i, n in enumerate((9, 23, 40, 5, 31, 17))]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_fp8")
    make_tiny_checkpoint("llama", str(path), seed=5)
    return str(path)


def _llm(path, **kw):
    kw = {"dtype": "float32", "swap_space": 0, "block_size": 4, "num_kv_blocks": 400, "kv_cache_dtype": "fp8", **kw}
    return LLM(model=path, **kw)


def _greedy(llm, max_tokens=12):
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


def test_fp8_pages_and_calibrated_scales(tiny):
    llm = _llm(tiny)
    runner = llm.engine.runner
    assert runner._kv.dtype == torch.float8_e4m3fn
    attn = [layer.self_attn for layer in runner.model.layers]
    assert runner.kv_scales == [(a.k_scale, a.v_scale) for a in attn] and len(attn) == 2
    # HEADROOM * max|K| / 448 from the calibration forward: far from the 1.0 default, and positive
    assert all(0 < s < 0.5 for pair in runner.kv_scales for s in pair)
    bf16 = LLM(model=tiny, dtype="bfloat16", swap_space=0, kv_cache_memory_gib=0.01)
    fp8 = LLM(model=tiny, dtype="bfloat16", swap_space=0, kv_cache_memory_gib=0.01, kv_cache_dtype="fp8")
    assert fp8.engine.kv.pool.num_blocks == 2 * bf16.engine.kv.pool.num_blocks
    assert fp8.engine.runner.kv_bytes_per_block() * 2 == bf16.engine.runner.kv_bytes_per_block()


def test_unknown_kv_cache_dtype_says_what_to_use(tiny):
    with pytest.raises(ValueError, match="fp8_e5m2 is not implemented"):
        _llm(tiny, kv_cache_dtype="fp8_e5m2")


def test_same_tokens_under_chunking_preemption_swap_and_prefix_hits(tiny):
    ref = _greedy(_llm(tiny))
    chunked = _llm(tiny, max_num_batched_tokens=8)
    assert _greedy(chunked) == ref
    for swap in (0, 0.01):  # a pool too small for all six: recompute, then swap through byte copies
        small = _llm(tiny, num_kv_blocks=24, swap_space=swap)
        small.engine.kv.min_swap_tokens = 4
        assert _greedy(small) == ref
        sched = small.engine.scheduler
        assert sched.num_preemptions > 0 and (sched.num_swapped_out > 0) == (swap > 0)
        assert small.engine.kv.num_free_blocks == small.engine.kv.num_blocks
    cached = _llm(tiny)
    _greedy(cached)
    assert _greedy(cached) == ref and cached.engine.kv.prefix_hits > 0
    assert cached.engine.kv.num_free_blocks == cached.engine.kv.num_blocks
