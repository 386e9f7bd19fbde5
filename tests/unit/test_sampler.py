"""Sampling: seeds reproduce, top_k=1 is greedy, logprobs are transformers' log-softmax, filters hold."""

from __future__ import annotations

import pytest
import torch

from tachyon import SamplingParams
from tachyon.engine.sequence import Sequence
from tachyon.outputs import RequestMetrics
from tachyon.worker.sampler import Sampler
from tests.conftest import hf_greedy


def _req(sp: SamplingParams, tokens=(1, 2, 3), gen=None) -> Sequence:
    r = Sequence(seq_id="x", request_id="x", index=0, prompt_token_ids=list(tokens), sampling_params=sp,
                max_tokens=16, eos_token_ids=frozenset({2}), metrics=RequestMetrics(arrival_time=0.0))
    r.generator = gen
    return r


def test_seeded_sampling_is_reproducible_in_any_batch(llm):
    sp = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=1234, ignore_eos=True)
    alone = llm.generate("Tell me about the moon.", sp)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)
    batch = llm.generate(["Hi", "Tell me about the moon.", "Count: 1, 2,"], [others, sp, others])
    assert batch[1].outputs[0].token_ids == alone
    unseeded = [llm.generate("Tell me about the moon.", others)[0].outputs[0].token_ids for _ in range(2)]
    assert unseeded[0] != unseeded[1] or unseeded[0] != alone  # unseeded sampling is random


def test_top_k_1_equals_greedy(llm):
    prompts = ["The capital of Italy is", "def add(a, b):", "Roses are red,"]
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    topk1 = llm.generate(prompts, SamplingParams(temperature=0.8, top_k=1, max_tokens=16, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in topk1]


def test_logprobs_match_transformers_log_softmax(llm, hf_embedded):
    ids = llm.get_tokenizer().encode("The quick brown fox")
    out = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=6, logprobs=5,
                                                                ignore_eos=True))[0].outputs[0]
    assert out.token_ids == hf_greedy(hf_embedded, ids, 6)
    with torch.no_grad():
        logits = hf_embedded(torch.tensor([ids + out.token_ids])).logits[0].float()
    ref = torch.log_softmax(logits, dim=-1)
    total = 0.0
    for step, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        row = ref[len(ids) - 1 + step]
        top = row.topk(5)
        assert set(lp) == set(top.indices.tolist()) | {tok}
        for tid, v in lp.items():  # vLLM's Logprob objects: value, rank in the whole vocabulary, text
            assert abs(v.logprob - row[tid].item()) < 1e-4 and v.decoded_token == llm.get_tokenizer().decode([tid])
            assert 1 + int((row > row[tid] + 1e-4).sum()) <= v.rank <= int((row > row[tid] - 1e-4).sum())
        total += lp[tok].logprob
    assert abs(out.cumulative_logprob - total) < 1e-4


def test_filters_only_keep_allowed_tokens():
    s = Sampler(vocab_size=8, device=torch.device("cpu"), seed=0)
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0]] * 4)
    reqs = [
        _req(SamplingParams(temperature=1.0, top_k=2)),
        _req(SamplingParams(temperature=1.0, top_p=0.5)),  # p(0) = 0.64 > 0.5: only token 0
        _req(SamplingParams(temperature=1.0, min_p=0.3)),  # p(1)/p(0) = 0.37: tokens 0, 1
        _req(SamplingParams(temperature=0.0)),
    ]
    seen = [set() for _ in reqs]
    for _ in range(200):
        for i, t in enumerate(s(logits, reqs).token_ids):
            seen[i].add(t)
    assert seen[0] == {0, 1} and seen[1] == {0} and seen[2] == {0, 1} and seen[3] == {0}


def test_logit_bias_allowed_token_ids_and_bad_words():
    s = Sampler(vocab_size=6, device=torch.device("cpu"), seed=0)
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0, -2.0]])
    greedy = dict(temperature=0)
    assert s(logits, [_req(SamplingParams(**greedy, logit_bias={4: 5.0}))]).token_ids == [4]  # -1 + 5 = 4 > 3
    assert s(logits, [_req(SamplingParams(**greedy, logit_bias={0: -100}))]).token_ids == [1]
    allowed = _req(SamplingParams(temperature=1.0, allowed_token_ids=[3, 5]))
    assert {s(logits, [allowed]).token_ids[0] for _ in range(100)} == {3, 5}
    biased_allowed = _req(SamplingParams(**greedy, allowed_token_ids=[3, 5], logit_bias={5: 3.0}))
    assert s(logits, [biased_allowed]).token_ids == [5]
    # a one-token bad word is never sampled; a two-token one only loses its last token after its first
    one = _req(SamplingParams(**greedy, bad_words_token_ids=[[0]]))
    two = _req(SamplingParams(**greedy, bad_words_token_ids=[[4, 0]]), tokens=(1, 2))
    assert s(logits.repeat(2, 1), [one, two]).token_ids == [1, 0]
    two.token_ids.append(4)  # the output now ends with the word's first token
    assert s(logits.repeat(2, 1), [one, two]).token_ids == [1, 1]
    # logprobs stay the model's own distribution
    lp = s(logits, [_req(SamplingParams(**greedy, logit_bias={4: 5.0}, logprobs=1))]).logprobs[0]
    assert lp[4] == pytest.approx(torch.log_softmax(logits[0], -1)[4].item())


def test_logit_processor_fields_are_checked():
    with pytest.raises(ValueError, match="logit_bias=.*numbers in \\[-100, 100\\]"):
        SamplingParams(logit_bias={1: 101})
    with pytest.raises(ValueError, match="allowed_token_ids=\\[\\]"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="bad_words=\\[''\\]"):
        SamplingParams(bad_words=[""])


def test_penalties_and_min_tokens():
    s = Sampler(vocab_size=4, device=torch.device("cpu"))
    logits = torch.tensor([[2.0, 1.9, 0.0, -5.0]])
    rep = _req(SamplingParams(temperature=0, repetition_penalty=2.0), tokens=(0,))
    assert s(logits, [rep]).token_ids == [1]  # 2.0 / 2 = 1.0 < 1.9
    pres = _req(SamplingParams(temperature=0, presence_penalty=0.5), tokens=(3,))
    pres.token_ids.append(0)  # token 0 was generated once
    assert s(logits, [pres]).token_ids == [1]
    eos_first = torch.tensor([[0.0, 0.0, 5.0, 0.0]])
    mt = _req(SamplingParams(temperature=0, min_tokens=2, max_tokens=8))
    assert s(eos_first, [mt]).token_ids != [2]  # EOS (id 2) banned before min_tokens


def test_n_samples_share_prompt_blocks(llm):
    engine = llm.engine
    prompt = list(range(1000, 1100))
    engine.add_request("fork", None, prompt, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True))
    shared_seen = False
    result = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                result = o
        seqs = [r for r in engine.core.live_sequences() if r.request_id == "fork"]
        if len(seqs) == 3 and all(r.block_ids for r in seqs):
            first = {tuple(r.block_ids[:6]) for r in seqs}
            shared_seen |= len(first) == 1 and engine.kv.pool.blocks[seqs[0].block_ids[0]].ref_cnt >= 3
    assert shared_seen, "the 3 samples should hold the same prompt blocks"
    assert [c.index for c in result.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 8 for c in result.outputs)
    assert len({tuple(c.token_ids) for c in result.outputs}) > 1
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


class _FixedGrammar:
    """A grammar stand-in whose next token may only be one of `allowed` (the sampler calls fill_bitmask)."""

    def __init__(self, allowed):
        self.allowed = allowed

    def fill_bitmask(self, bitmask, row):
        bitmask[row] = 0
        for t in self.allowed:
            bitmask[row, t // 32] |= torch.tensor(1 << (t % 32), dtype=torch.int64).to(torch.int32)

    def fill_bitmasks(self, grammars, bitmask):
        for row, g in enumerate(grammars):
            g.fill_bitmask(bitmask, row)


def test_token_bitmask_keeps_only_allowed_tokens_and_leaves_free_rows_alone():
    from tachyon.worker.sampler import apply_token_bitmask

    V = 70  # three words, the last one partly past the vocabulary
    logits = torch.randn(4, V)
    bitmask = torch.zeros(2, 3, dtype=torch.int32)
    _FixedGrammar([0, 31, 32, 63, 69]).fill_bitmask(bitmask, 0)  # bit 31: the int32 sign bit
    _FixedGrammar([5]).fill_bitmask(bitmask, 1)
    out = apply_token_bitmask(logits, torch.tensor([1, 3]), bitmask)
    assert torch.equal(out[0], logits[0]) and torch.equal(out[2], logits[2])
    assert torch.isfinite(out[1]).nonzero().flatten().tolist() == [0, 31, 32, 63, 69]
    assert torch.equal(out[1, [0, 31, 32, 63, 69]], logits[1, [0, 31, 32, 63, 69]])
    assert torch.isfinite(out[3]).nonzero().flatten().tolist() == [5]
    xgr = __import__("pytest").importorskip("xgrammar")
    ref, full = logits.clone(), torch.full((4, 3), -1, dtype=torch.int32)
    full[[1, 3]] = bitmask  # xgrammar's own kernel: one bitmask row per logits row
    xgr.apply_token_bitmask_inplace(ref, full, indices=[1, 3])
    assert torch.equal(ref, out)


def test_grammar_rows_sample_only_allowed_tokens_in_a_mixed_batch():
    s = Sampler(vocab_size=40, device=torch.device("cpu"), seed=0)
    logits = torch.randn(3, 40)
    free = _req(SamplingParams(temperature=0))
    greedy = _req(SamplingParams(temperature=0))
    greedy.grammar = _FixedGrammar([7, 33])
    sampled = _req(SamplingParams(temperature=1.5, top_p=0.9), gen=s.request_generator(1))
    sampled.grammar = _FixedGrammar([2, 39])
    for _ in range(20):
        tokens = s.sample_tokens(logits, [free, greedy, sampled]).tolist()
        assert tokens[0] == logits[0].argmax().item()
        assert tokens[1] == (7 if logits[1, 7] > logits[1, 33] else 33)
        assert tokens[2] in (2, 39)
