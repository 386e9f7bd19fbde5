"""Greedy output is token-for-token transformers' greedy output, whatever the batching does."""

from __future__ import annotations

import random

import pytest

from tachyon import LLM, SamplingParams
from tests.conftest import TINY_FAMILIES, hf_greedy, make_tiny_checkpoint

TEXTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the mountains, there lived an old clockmaker who",
    "1, 2, 3, 4,",
    "Translate to French: I would like a cup of coffee, please.",
    "The three primary colors are",
    "Q: What is the boiling point of water at sea level?\nA:",
]


def _prompts(tokenizer, vocab: int, n_random: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prompts = [tokenizer.encode(t) for t in TEXTS] if tokenizer is not None else []
    for _ in range(n_random):
        length = rng.choice([3, 17, 40, 90, 150, 230])
        prompts.append([rng.randrange(10, vocab - 10) for _ in range(length)])
    return prompts


def _run_staggered(llm: LLM, prompts: list[list[int]], max_tokens: list[int]) -> list[list[int]]:
    """Add requests at different steps (two per step) and run to completion; return output ids per prompt."""
    engine = llm.engine
    pending = list(enumerate(prompts))
    results: dict[str, list[int]] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        for _ in range(2):
            if pending:
                i, p = pending.pop(0)
                engine.add_request(f"r{i}", None, p, SamplingParams(temperature=0, max_tokens=max_tokens[i],
                                                                      ignore_eos=True))
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        step += 1
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks, "blocks leaked"
    return [results[f"r{i}"] for i in range(len(prompts))]


def test_embedded_matches_transformers_with_chunks_and_preemption(hf_embedded):
    # 24 tokens of KV per block-16 budget: 40 blocks for 16 prompts forces preemption; 64-token budget chunks.
    llm = LLM(num_kv_blocks=40, max_num_batched_tokens=64, swap_space=0)
    prompts = _prompts(llm.get_tokenizer(), llm.engine.config.model.vocab_size, n_random=8)
    assert len(prompts) == 16
    max_tokens = [12 + (i % 4) * 4 for i in range(len(prompts))]
    got = _run_staggered(llm, prompts, max_tokens)
    assert llm.engine.scheduler.num_preemptions > 0, "the KV budget was meant to force preemptions"
    for p, mt, g in zip(prompts, max_tokens, got, strict=True):
        assert g == hf_greedy(hf_embedded, p, mt), f"mismatch for prompt of {len(p)} tokens"


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_tiny_families_match_transformers(tmp_path, family):
    hf = make_tiny_checkpoint(family, str(tmp_path))
    assert (tmp_path / "model.safetensors.index.json").exists(), "the checkpoint should be sharded"
    llm = LLM(model=str(tmp_path), num_kv_blocks=48, max_num_batched_tokens=48, block_size=8, swap_space=0)
    prompts = _prompts(None, 512, n_random=16, seed=1)
    max_tokens = [10 + (i % 3) * 5 for i in range(len(prompts))]
    got = _run_staggered(llm, prompts, max_tokens)
    assert llm.engine.scheduler.num_preemptions > 0
    for p, mt, g in zip(prompts, max_tokens, got, strict=True):
        assert g == hf_greedy(hf, p, mt), f"{family}: mismatch for prompt of {len(p)} tokens"


def test_generate_api_shapes(llm):
    outs = llm.generate(["Hello", {"prompt_token_ids": [1, 2, 3]}, [5, 6, 7]],
                        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4, 4]
    assert outs[0].prompt == "Hello" and outs[2].prompt_token_ids == [5, 6, 7]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    assert all(o.metrics.ttft is not None and o.metrics.e2e >= o.metrics.ttft for o in outs)
    one = llm.generate([1, 2, 3], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(one) == 1 and one[0].outputs[0].token_ids == outs[1].outputs[0].token_ids


def test_chat_applies_template_and_stops_at_eos(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=40))[0]
    assert "Paris" in out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"
    tok = llm.get_tokenizer()
    assert tok.decode(out.prompt_token_ids).startswith("<|im_start|>system")


def test_one_token_prefill_chunks(tmp_path):
    """A budget of 2 tokens: while one sequence decodes, the other's prompt goes in one token per step."""
    hf = make_tiny_checkpoint("llama", str(tmp_path))
    llm = LLM(model=str(tmp_path), max_num_batched_tokens=2, swap_space=0)
    prompts = [[11, 12, 13], list(range(40, 60))]
    got = _run_staggered(llm, prompts, [12, 6])
    assert got == [hf_greedy(hf, p, n) for p, n in zip(prompts, [12, 6], strict=True)]
