"""Speculative decoding in the engine: greedy output token-exact against transformers with both proposers, mixed
with plain decodes and prefill chunks, under preemption and prefix-cache hits; sampling at temperature 1 keeps
the distribution of plain sampling (chi-square); every block back after rejections and aborts."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tachyon import LLM, SamplingParams
from tests.conftest import hf_greedy, make_tiny_checkpoint
from tests.unit.test_spec_decode import ALPHA

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_spec")
    hf = make_tiny_checkpoint("llama", str(path), seed=5)
    draft = tmp_path_factory.mktemp("tiny_spec_draft")
    make_tiny_checkpoint("llama", str(draft), seed=6)
    return str(path), hf, str(draft)


MAX_TOKENS = [4, 8, 10, 12, 14, 16]


@pytest.fixture(scope="module")
def greedy_case(tiny):
    """Prompts (a shared prefix on every other one) and transformers' greedy continuations."""
    prompts = _prompts(6, seed=1, shared=16)
    return prompts, [hf_greedy(tiny[1], p, m) for p, m in zip(prompts, MAX_TOKENS, strict=True)]


def _prompts(n: int, seed: int, shared: int = 0) -> list[list[int]]:
    """Prompts that repeat a phrase (so prompt lookup finds matches), some after a shared prefix."""
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 500) for _ in range(shared)]
    out = []
    for i in range(n):
        phrase = [rng.randrange(10, 500) for _ in range(rng.choice([3, 5, 8]))]
        out.append((prefix if i % 2 else []) + phrase * rng.choice([2, 4, 6]))
    return out


def _tiny_llm(path, spec, **kw):
    kw = {"num_kv_blocks": 200, "block_size": 8, "swap_space": 0, "dtype": "float32", **kw}
    return LLM(model=path, speculative_config=spec, **kw)


def _assert_no_leaks(llm: LLM) -> None:
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks, "blocks leaked"


@pytest.mark.parametrize("proposer", ["ngram", "draft", "self_draft"])
def test_greedy_speculation_matches_transformers(tiny, greedy_case, proposer):
    path, _, draft = tiny
    prompts, refs = greedy_case
    spec = {"ngram": NGRAM,
            "draft": {"method": "draft_model", "model": draft, "num_speculative_tokens": 3},
            "self_draft": {"method": "draft_model", "model": path, "num_speculative_tokens": 4}}[proposer]
    # a small pool (preemption), a small budget (chunked prefills beside verification), a shared prefix (hits)
    llm = _tiny_llm(path, spec, num_kv_blocks=12, max_num_batched_tokens=24)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True, logprobs=1 if i == 2 else None)
              for i, m in enumerate(MAX_TOKENS)]  # one request asks for logprobs: it decodes plainly
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [o.outputs[0].token_ids for o in outs] == refs
    st = llm.engine.stats()
    assert st.num_preemptions > 0 and st.prefix_cache_hits > 0
    assert st.spec_num_drafts > 0 and st.spec_num_draft_tokens > 0
    if proposer == "self_draft":  # the target proposing for itself: every proposal is its own greedy choice
        assert st.spec_num_accepted_tokens == st.spec_num_draft_tokens
    assert len(outs[2].outputs[0].logprobs) == MAX_TOKENS[2]
    _assert_no_leaks(llm)


def test_aborts_and_stops_mid_speculation_leave_no_blocks(tiny):
    path, hf, _ = tiny
    # the target as its own draft: every decode verifies k proposals, all accepted
    llm = _tiny_llm(path, {"method": "draft_model", "model": path, "num_speculative_tokens": 3})
    prompts = _prompts(6, seed=2)
    ref = hf_greedy(hf, prompts[0], 20)
    eng = llm.engine
    for i, p in enumerate(prompts):
        stop = [ref[12]] if i == 0 else None
        eng.add_request(f"r{i}", None, p, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                         stop_token_ids=stop))
    for _ in range(3):
        eng.step()
    assert eng.stats().spec_num_drafts > 0
    for i in (1, 3, 5):
        eng.abort_request(f"r{i}")
    done = {o.request_id: o for o in eng.run_until_done()}
    assert done["r1"].outputs[0].finish_reason == "abort"
    first = ref.index(ref[12]) + 1
    assert done["r0"].outputs[0].token_ids == ref[:first] and done["r0"].outputs[0].finish_reason == "stop"
    _assert_no_leaks(llm)


def two_sample_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's chi-square test that two equal-sized samples' category counts come from one distribution."""
    total = a + b
    a, b, total = a[total > 0], b[total > 0], total[total > 0]
    stat = float((((a - total / 2) ** 2 + (b - total / 2) ** 2) / (total / 2)).sum())
    return float(torch.special.gammaincc(torch.tensor((len(total) - 1) / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_sampling_at_temperature_one_keeps_the_distribution(tiny):
    """The 2nd and 3rd output tokens (in 8 classes: token % 8) of n samples, plain and verified (the target as
    its own greedy draft: at temperature 1 a proposal is accepted with the target's probability of it): one
    distribution, by a chi-square test at ALPHA. (tests/unit/test_spec_decode.py tests the sampler's exactness
    with the power this one lacks.)"""
    path, _, _ = tiny
    prompt = [11, 12, 13, 14] * 4 + [15]  # 17 tokens: the n samples share two full blocks, compute one token
    N = 160
    counts = []
    for spec in (None, {"method": "draft_model", "model": path, "num_speculative_tokens": 2}):
        llm = _tiny_llm(path, spec, seed=3 if spec else 4, max_n=N)
        (out,) = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(n=N, temperature=1.0, max_tokens=3,
                                                                             ignore_eos=True))
        counts.append([np.bincount([c.token_ids[i] % 8 for c in out.outputs], minlength=8) for i in (1, 2)])
        if spec:  # max_tokens=3 leaves room for one proposal after the first token
            st = llm.engine.stats()
            assert st.spec_num_drafts > N / 2 and 0 < st.spec_num_accepted_tokens < st.spec_num_draft_tokens
        _assert_no_leaks(llm)
    for plain, verified in zip(*counts, strict=True):
        assert two_sample_pvalue(plain, verified) > ALPHA


def test_embedded_model_copy_prompt_identical_with_prompt_lookup(llm):
    text = ("Tachyon schedules every request against one token budget per step. Prefix caching reuses the "
            "blocks of a prompt seen before, and the scheduler preempts the newest request when blocks run out.")
    msgs = [{"role": "user", "content": "Repeat the following text exactly, word for word:\n\n" + text}]
    sp = SamplingParams(temperature=0, max_tokens=32)
    ref = llm.chat(msgs, sp)[0].outputs[0].token_ids
    spec = LLM(swap_space=0, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    out = spec.chat(msgs, sp)[0].outputs[0].token_ids
    assert out == ref
    st = spec.engine.stats()
    assert st.spec_acceptance_rate > 0.5 and st.num_steps < len(ref) * 0.6
    _assert_no_leaks(spec)
    # the same counters on /metrics, as vLLM names them
    from tachyon.server.metrics import ServerMetrics

    reg = ServerMetrics(spec.engine, "m").registry
    m = {"model_name": "m"}
    assert reg.get_sample_value("tachyon:spec_decode_num_drafts_total", m) == st.spec_num_drafts
    assert reg.get_sample_value("tachyon:spec_decode_num_draft_tokens_total", m) == st.spec_num_draft_tokens
    assert reg.get_sample_value("tachyon:spec_decode_num_accepted_tokens_total", m) == st.spec_num_accepted_tokens
    per_pos = [reg.get_sample_value("tachyon:spec_decode_num_accepted_tokens_per_pos_total", {**m, "position": str(i)})
               for i in range(4)]
    assert per_pos == list(st.spec_accepted_per_pos) and sum(per_pos) == st.spec_num_accepted_tokens


def test_draft_kv_shares_the_pool_budget(tiny):
    """A draft model's paged KV comes out of the same budget as the target's (as vLLM sizes one pool for both):
    target and draft blocks together fit --kv-cache-memory-gib, the draft has the target's block count, and a
    pool sized without a draft holds more blocks."""
    path, _, draft = tiny
    budget_gib = 0.002
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    llm = _tiny_llm(path, spec, num_kv_blocks=None, kv_cache_memory_gib=budget_gib)
    runner, drafter = llm.engine.runner, llm.engine.scheduler.proposer.runner
    blocks = runner.num_blocks  # (the engine's block manager keeps one of them aside)
    assert drafter.num_blocks == blocks
    per_block = runner.kv_bytes_per_block() + drafter.kv_bytes_per_block()
    assert blocks * per_block <= budget_gib * (1 << 30) < (blocks + 1) * per_block
    plain = _tiny_llm(path, None, num_kv_blocks=None, kv_cache_memory_gib=budget_gib)
    assert plain.engine.runner.num_blocks > blocks
    prompt, greedy = [{"prompt_token_ids": [5, 9, 13, 17, 21, 5, 9]}], SamplingParams(temperature=0, max_tokens=6,
                                                                                        ignore_eos=True)
    assert (llm.generate(prompt, greedy)[0].outputs[0].token_ids
            == plain.generate(prompt, greedy)[0].outputs[0].token_ids)
    _assert_no_leaks(llm)


def test_a_draft_that_is_never_right_backs_off_and_catches_up_exactly(tiny):
    """Another model's random weights as the draft: its proposals are rejected, the sequences back off (plain
    decodes the draft does not see), and each later proposal first runs the tokens it missed: greedy output stays
    transformers' and the draft is asked far less often than every decode."""
    path, hf, draft = tiny
    prompts = _prompts(3, seed=4)
    max_tokens = 28
    refs = [hf_greedy(hf, p, max_tokens) for p in prompts]
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "backoff_max_steps": 4}
    llm = _tiny_llm(path, spec)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == refs
    st = llm.engine.stats()
    assert st.spec_num_accepted_tokens < st.spec_num_draft_tokens / 4, "the draft was meant to be mostly wrong"
    # without the back-off every decode but the last verifies: 27 per sequence
    assert 0 < st.spec_num_drafts < len(prompts) * (max_tokens - 1) * 2 // 3
    _assert_no_leaks(llm)


def test_the_draft_runs_its_own_quantization_not_the_targets(tiny):
    """An int8 target with a dense draft checkpoint: the draft stays dense unless the speculative config asks
    (vLLM's "quantization" key); either way greedy output is the int8 target's own."""
    from tachyon.layers.linear import Int8Linear

    path, _, draft = tiny
    prompt = [{"prompt_token_ids": [5, 9, 13, 17, 21, 5, 9, 13]}]
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    plain = _tiny_llm(path, None, quantization="int8").generate(prompt, greedy)[0].outputs[0].token_ids
    for quant, want in ((None, 0), ("int8", 1)):
        spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 3, "backoff_max_steps": 0,
                **({"quantization": quant} if quant else {})}
        llm = _tiny_llm(path, spec, quantization="int8")
        count = lambda m: sum(isinstance(x, Int8Linear) for x in m.modules())  # noqa: E731
        assert count(llm.engine.runner.model) > 0
        assert min(1, count(llm.engine.scheduler.proposer.runner.model)) == want
        assert llm.generate(prompt, greedy)[0].outputs[0].token_ids == plain
        assert llm.engine.stats().spec_num_drafts > 0
        _assert_no_leaks(llm)
