"""Prefix caching and swap space never change greedy output; hit counts and swap traffic are exact."""

from __future__ import annotations

import pytest

from tachyon import LLM, SamplingParams
from tests.conftest import hf_greedy

SYSTEM = ("You are a meticulous assistant. Answer briefly, cite no sources, and never use more than two "
          "sentences. The user is a busy engineer who reads on a phone.")


def _prompts(tok) -> list[list[int]]:
    questions = ["What is a KV cache?", "Why batch requests?", "Define latency.", "What is a GPU?",
                 "Explain paging in one line.", "What does TTFT mean?"]
    return [tok.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                    add_generation_prompt=True, tokenize=True)["input_ids"] for q in questions]


def _run(llm: LLM, prompts, max_tokens=16):
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def reference(llm, hf_embedded):
    prompts = _prompts(llm.get_tokenizer())
    return prompts, [hf_greedy(hf_embedded, p, 16) for p in prompts]


def test_prefix_caching_on_off_and_after_eviction(reference):
    prompts, ref = reference
    assert all(len(p) > 48 for p in prompts)
    on = LLM(swap_space=0, num_kv_blocks=24)  # 23 usable blocks of 16: later prompts evict earlier blocks
    assert _run(on, prompts) == ref
    first_hits = on.engine.kv.prefix_hits
    assert first_hits > 0, "the shared system prompt should hit"
    assert _run(on, prompts) == ref  # again, from a warm cache
    assert on.engine.kv.prefix_hits - first_hits >= sum(len(p) - 16 for p in prompts) - 16 * len(prompts)
    _run(on, [list(range(3000, 3300))], max_tokens=2)  # 19 blocks: evicts most of the cached ones
    assert on.engine.kv.pool.num_evictions > 0, "the filler should have evicted cached blocks"
    assert _run(on, prompts) == ref  # after eviction
    off = LLM(swap_space=0, num_kv_blocks=24, enable_prefix_caching=False)
    assert _run(off, prompts) == ref
    assert off.engine.kv.prefix_hits == 0 and off.engine.kv.pool.cached == {}


def test_hit_counts_are_exact(llm):
    kv = llm.engine.kv
    base = list(range(2000, 2040))  # 40 tokens: 2 full blocks of 16 get cached
    llm.generate({"prompt_token_ids": base}, SamplingParams(max_tokens=1))
    q0, h0 = kv.prefix_queries, kv.prefix_hits
    # shares 35 tokens: blocks 0 and 1 (32 tokens) hit
    llm.generate({"prompt_token_ids": base[:35] + [7, 8, 9, 10, 11]}, SamplingParams(max_tokens=1))
    assert (kv.prefix_queries - q0, kv.prefix_hits - h0) == (40, 32)
    # exactly 32 tokens: the last token must be computed, so only block 0 may hit
    q1, h1 = kv.prefix_queries, kv.prefix_hits
    out = llm.generate({"prompt_token_ids": base[:32]}, SamplingParams(max_tokens=1))[0]
    assert (kv.prefix_queries - q1, kv.prefix_hits - h1) == (32, 16)
    assert out.num_cached_tokens == 16


@pytest.mark.parametrize("num_blocks", [10, 14])
def test_swap_out_and_in_is_exact(reference, num_blocks):
    prompts, ref = reference
    llm = LLM(swap_space=0.05, num_kv_blocks=num_blocks, max_num_batched_tokens=256, enable_prefix_caching=False)
    s, kv = llm.engine.scheduler, llm.engine.kv
    kv.min_swap_tokens = 16  # these prompts are short: swap even small sequences
    assert _run(llm, prompts) == ref
    assert s.num_preemptions > 0
    assert s.num_swapped_out > 0, "the small pool should have swapped sequences out"
    assert kv.num_cpu_blocks > 0 and kv.num_free_cpu_blocks == kv.num_cpu_blocks and not kv.cpu_held


def test_recompute_when_swap_is_off(reference):
    prompts, ref = reference
    llm = LLM(swap_space=0, num_kv_blocks=14, max_num_batched_tokens=256, enable_prefix_caching=False)
    assert _run(llm, prompts) == ref
    s = llm.engine.scheduler
    assert s.num_recomputed > 0 and s.num_swapped_out == 0


def test_simultaneous_arrivals_compute_a_shared_prefix_once(llm):
    """Requests that arrive together with a shared prefix: the first computes it, the others wait one step and
    take it from the cache (none computes the same blocks in the same step)."""
    kv, sched = llm.engine.kv, llm.engine.scheduler
    shared = list(range(4000, 4064))  # 4 full blocks
    prompts = [shared + [100 + i, 200 + i, 300 + i] for i in range(4)]
    computed = []
    real = sched.schedule

    def spy(num_in_flight=0):
        out = real(num_in_flight)
        computed.append(sum(s.num_new_tokens for s in out.seqs if s.num_new_tokens > 1))
        return out

    sched.schedule = spy
    q0, h0 = kv.prefix_queries, kv.prefix_hits
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=3))
    finally:
        del sched.schedule
    assert computed[:2] == [67, 3 * 3], computed  # step 1: the first prompt only; step 2: the others' tails
    assert (kv.prefix_queries - q0, kv.prefix_hits - h0) == (4 * 67, 3 * 64)
    assert [o.num_cached_tokens for o in outs] == [0, 64, 64, 64]
    assert kv.num_free_blocks == kv.num_blocks


@pytest.mark.timeout(120)
def test_a_tight_pool_with_swap_never_stalls(tmp_path):
    """14 blocks of 8 tokens, 8 prompts of up to 84 tokens, swap on: sequences are swapped out and in over and
    over. A sequence swapped in must also get the block its next token needs, or it holds blocks while it waits
    and one preempted in front of it waits for them forever (this stepped without progress before the fix).
    Same greedy tokens as recompute-only, every block back."""
    import random

    from tests.tiny_checkpoint import write_tiny_qwen2

    path = write_tiny_qwen2(tmp_path, 4, 2)
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(5, 200) for _ in range(rng.randint(10, 84))]} for _ in range(8)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = {}
    for swap in (0, 0.01):
        llm = LLM(model=path, num_kv_blocks=14, block_size=8, swap_space=swap, dtype="float32")
        outs[swap] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
        if swap:
            assert llm.engine.scheduler.num_swapped_out > 0
    assert outs[0.01] == outs[0] and all(len(t) == 16 for t in outs[0])
