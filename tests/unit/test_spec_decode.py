"""Speculative decoding without a model: the rejection sampler keeps the target distribution (chi-square at a
fixed significance) and is greedy-exact; the scheduler gives 1 + k tokens inside the budget, rolls rejected
positions back to exact blocks, stops on a token inside the accepted ones; n-gram lookup; the config's errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tachyon.config import SchedulerConfig, SpeculativeConfig
from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.ngram_proposer import NgramProposer, ngram_lookup
from tachyon.engine.scheduler import Scheduler
from tachyon.engine.sequence import Sequence, SequenceStatus
from tachyon.interface import ModelRunnerOutput
from tachyon.outputs import RequestMetrics
from tachyon.sampling_params import SamplingParams
from tachyon.worker.sampler import Sampler
from tachyon.worker.spec_decode import verify

ALPHA = 1e-3  # the significance every chi-square test here is run at


def chi2_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's test of observed counts against expected ones (cells with expected < 5 pooled). A count where
    nothing is expected (a token top-k removed) fails outright."""
    assert observed[expected == 0].sum() == 0, "a token outside the target's support was emitted"
    observed, expected = observed[expected > 0], expected[expected > 0]
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    stat = float(((observed - expected) ** 2 / expected).sum())
    df = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def _req(**sp):
    return SimpleNamespace(sampling_params=SamplingParams(**sp), generator=None, grammar=None,
                           eos_token_ids=frozenset(), token_ids=[], output_token_ids=[], num_output_tokens=0)


@pytest.mark.parametrize("params", [dict(temperature=1.0), dict(temperature=0.7, top_k=4)])
def test_rejection_sampling_keeps_the_target_distribution(params):
    V, N = 8, 40000
    gen = torch.Generator().manual_seed(0)
    row_logits = torch.randn(3, V, generator=gen) * 1.5  # p_0, p_1, p_2 for drafts d1, d2
    drafts = [int(row_logits[0].argsort()[-2]), int(row_logits[1].argmax())]  # a likely-ish and a likely one
    sampler = Sampler(V, torch.device("cpu"), seed=1)
    req = _req(**params)
    target = sampler.target_probs(row_logits, [req] * 3, [False] * 3)
    target = (target / target.sum(-1, keepdim=True)).numpy().astype(np.float64)
    tokens, accepted = verify(sampler, row_logits.repeat(N, 1), [req] * N, [drafts] * N, [0] * N)
    tokens, accepted = tokens.numpy(), accepted.numpy()
    # the first output token: d1 where it was accepted, else the token emitted in its place
    first = np.where(accepted >= 1, drafts[0], tokens)
    assert chi2_pvalue(np.bincount(first, minlength=V), N * target[0]) > ALPHA
    # given d1, the second: d2 where accepted, else the emitted one (p_1 is the target given d1)
    second = np.where(accepted >= 2, drafts[1], tokens)[accepted >= 1]
    assert chi2_pvalue(np.bincount(second, minlength=V), len(second) * target[1]) > ALPHA
    # given d1 d2, the bonus token follows p_2
    bonus = tokens[accepted == 2]
    assert chi2_pvalue(np.bincount(bonus, minlength=V), len(bonus) * target[2]) > ALPHA
    # acceptance of d1 happens with probability p_0(d1)
    assert abs((accepted >= 1).mean() - target[0][drafts[0]]) < 4 * np.sqrt(target[0][drafts[0]] / N)


def test_greedy_verification_is_exact():
    V = 10
    argmax = [3, 4, 5, 1, 2, 2, 7, 8, 9]  # rows of three sequences: 3 + 2 + 4 positions
    logits = torch.full((9, V), -5.0)
    logits[torch.arange(9), argmax] = 5.0
    logits[3, 9] = 4.9  # a close second: greedy still rejects it
    # all accepted + bonus; the first rejected; two accepted then the third rejected
    tokens, accepted = verify(Sampler(V, torch.device("cpu")), logits, [_req(temperature=0.0)] * 3,
                              [[3, 4], [9], [2, 7, 0]], [0, 0, 0])
    assert accepted.tolist() == [2, 0, 2] and tokens.tolist() == [5, 1, 8]


def test_min_tokens_masks_eos_at_each_verified_position():
    V, eos = 6, 5
    logits = torch.zeros(3, V)
    logits[:, eos] = 10.0  # the target wants EOS everywhere
    req = _req(temperature=0.0, min_tokens=2)
    req.eos_token_ids = frozenset({eos})
    # output tokens before the first verified position: 0, so EOS is banned at positions 0 and 1, allowed at 2
    sampler = Sampler(V, torch.device("cpu"))
    tokens, accepted = verify(sampler, logits, [req], [[0, 0]], [0])
    assert accepted.tolist() == [2] and tokens.tolist() == [eos]


def test_ngram_lookup_takes_the_longest_suffix_latest_occurrence():
    t = np.array([1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3])
    assert ngram_lookup(t, 1, 3, 3) == [5, 6, 7]  # "2 3" last seen before 5 6 7
    assert ngram_lookup(t, 3, 3, 3) == []  # no earlier "7 2 3"
    assert ngram_lookup(np.array([4, 5, 6, 4, 5]), 2, 2, 5) == [6, 4, 5]
    assert ngram_lookup(np.array([7]), 1, 3, 2) == []


# -- the scheduler ---------------------------------------------------------------------------------------------
class _FixedProposer:
    """Proposes the given tokens (cut to what the scheduler allows)."""

    def __init__(self, tokens, needs_slots=False):
        self.tokens, self.needs_slots, self.calls = tokens, needs_slots, []

    def propose(self, seqs, max_tokens):
        self.calls.append([(s.seq_id, k) for s, k in zip(seqs, max_tokens, strict=True)])
        return [list(self.tokens.get(s.seq_id, []))[:k] for s, k in zip(seqs, max_tokens, strict=True)]


def _seq(sid: str, n_prompt: int, max_tokens: int = 16, **sp) -> Sequence:
    return Sequence(seq_id=sid, request_id=sid, index=0, prompt_token_ids=list(range(100, 100 + n_prompt)),
                    sampling_params=SamplingParams(temperature=0, **sp), max_tokens=max_tokens,
                    eos_token_ids=frozenset({2}), metrics=RequestMetrics(arrival_time=0.0))


def _sched(proposer, k=3, budget=32, blocks=20, block_size=4, **spec) -> Scheduler:
    kv = KVCacheManager(blocks, block_size, enable_prefix_caching=False)
    spec = SpeculativeConfig("ngram", k, **{"backoff_max_steps": 0, **spec})  # the proposer given is what runs
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=64,
                                     num_scheduler_steps=3), kv, proposer, spec)


def _split(out) -> list[tuple]:
    return [(s.seq.seq_id, s.start, s.num_new_tokens, s.sample, s.spec_token_ids) for s in out.seqs]


def _land(sched, out, tokens: dict[str, int], accepted: dict[str, int]) -> None:
    rows = [s.seq for s in out.seqs if s.sample]
    sched.update(out, ModelRunnerOutput(rows, [tokens[r.seq_id] for r in rows], [None] * len(rows),
                                        [None] * len(rows), [accepted.get(r.seq_id, 0) for r in rows]))


def test_scheduler_verifies_proposals_in_the_budget_and_rolls_rejections_back():
    prop = _FixedProposer({"a": [7, 8, 9, 10], "b": [5, 5, 5]})
    s = _sched(prop, k=3, budget=12)
    a, b, c = _seq("a", 6), _seq("b", 5, logprobs=1), _seq("c", 9)
    for q in (a, b):
        s.add(q)
    out = s.schedule()
    assert _split(out) == [("a", 0, 6, True, []), ("b", 0, 5, True, [])] and prop.calls == []  # prefills
    _land(s, out, {"a": 50, "b": 51}, {})
    s.add(c)
    out = s.schedule()
    # a: its last token and 3 proposals (k = 3); b asks for logprobs: a plain decode; c: the budget's rest
    assert _split(out) == [("a", 6, 4, True, [7, 8, 9]), ("b", 5, 1, True, []), ("c", 0, 7, False, [])]
    assert out.max_in_flight == 0 and prop.calls == [[("a", 3)]]
    assert a.num_computed_tokens == 10 and a.block_ids == [1, 2, 5]  # positions 0 .. 9 (b holds 3 and 4)
    # one proposal accepted, then the target's own token: a knows 6 + 3 tokens, 8 of them computed
    _land(s, out, {"a": 60, "b": 61}, {"a": 1})
    assert a.output_token_ids == [50, 7, 60] and a.num_computed_tokens == 8 and a.block_ids == [1, 2]
    assert s.kv.num_free_blocks == 19 - 2 - 2 - 2  # block 5 went back (b and c hold 2 blocks each)
    assert (s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens) == (1, 3, 1)
    assert s.spec_accepted_per_pos == [1, 0, 0]
    s.kv.check_integrity([a, b, c])


def test_proposals_are_cut_by_max_tokens_and_a_stop_token_inside_them_ends_the_sequence():
    prop = _FixedProposer({"a": [7, 2, 9]})  # 2 is EOS
    s = _sched(prop, k=3)
    a = _seq("a", 4, max_tokens=3)
    s.add(a)
    _land(s, s.schedule(), {"a": 50}, {})
    out = s.schedule()
    assert _split(out) == [("a", 4, 2, True, [7])]  # 2 outputs left: at most one proposal and the target's token
    _land(s, out, {"a": 9}, {"a": 1})
    assert a.output_token_ids == [50, 7, 9] and a.status == SequenceStatus.FINISHED_LENGTH
    b = _seq("b", 4)
    s.add(b)
    prop.tokens["b"] = [7, 2, 9]
    _land(s, s.schedule(), {"b": 50}, {})
    out = s.schedule()
    _land(s, out, {"b": 11}, {"b": 3})  # all accepted, but EOS comes second: 9 and 11 are dropped
    assert b.output_token_ids == [50, 7, 2] and b.status == SequenceStatus.FINISHED_STOPPED
    assert s.kv.num_free_blocks == s.kv.num_blocks


def test_a_proposer_that_writes_kv_gets_blocks_first_and_gives_unused_ones_back():
    prop = _FixedProposer({"a": [7]}, needs_slots=True)
    s = _sched(prop, k=4, budget=8)
    a, c = _seq("a", 3), _seq("c", 20)
    s.add(a)
    _land(s, s.schedule(), {"a": 50}, {})
    s.add(c)
    out = s.schedule()
    # a held 1 + 4 slots (positions 3 .. 7, blocks 1 and 2) while proposing; it used 1 + 1: block 2 went back,
    # and the budget it did not use went to c
    assert _split(out) == [("a", 3, 2, True, [7]), ("c", 0, 6, False, [])]
    assert prop.calls == [[("a", 4)]] and a.block_ids == [1, 2] and a.num_computed_tokens == 5
    s.kv.check_integrity([a, c])


def test_speculating_sequence_with_a_token_in_flight_asks_for_sync():
    s = _sched(_FixedProposer({"a": [1, 2]}))
    a = _seq("a", 4)
    s.add(a)
    s.schedule()
    assert s.schedule(num_in_flight=1).sync  # its proposals must follow a token the host does not have yet


def _decode_kinds(s, a, steps: int, accepted: int) -> list[str]:
    """Schedules and lands `steps` decodes of a one at a time: "v" a verification (landed with `accepted`), "p" a
    plain decode (with how many steps it lets run ahead)."""
    kinds = []
    for _ in range(steps):
        out = s.schedule()
        (sched,) = out.seqs
        if sched.spec_token_ids:
            kinds.append("v")
            assert out.max_in_flight == 0  # a verification waits for its tokens
        else:
            kinds.append("p")
            assert out.max_in_flight == 2  # a plain decode runs ahead (num_scheduler_steps 3)
        _land(s, out, {"a": 60}, {"a": accepted} if sched.spec_token_ids else {})
    return kinds


def test_rejected_proposals_back_off_exponentially_and_an_accepted_one_ends_it():
    prop = _FixedProposer({"a": [7, 8]})
    s = _sched(prop, k=2, budget=8, blocks=40, backoff_max_steps=4)
    a = _seq("a", 4, max_tokens=40)
    s.add(a)
    _land(s, s.schedule(), {"a": 50}, {})
    # the running mean of accepted tokens (weight 1/8, from 0.5) falls under 0.25 at the 6th empty verification;
    # from there each one that accepts nothing backs off 1, 2, 4, then 4 (the cap) plain decodes
    kinds = "".join(_decode_kinds(s, a, 16, accepted=0))
    assert kinds == "v" * 5 + "vp" + "vpp" + "vpppp" + "v"
    assert (a.spec_fails, a.spec_skip) == (4, 4) and a.spec_mean_accepted == pytest.approx(0.5 * 0.875 ** 9)
    assert (s.spec_num_drafts, s.spec_num_draft_tokens, s.spec_num_accepted_tokens) == (9, 18, 0)
    _decode_kinds(s, a, 4, accepted=0)  # the back-off's 4 plain decodes
    assert _decode_kinds(s, a, 3, accepted=1) == ["v", "v", "v"]  # one accepted: it speculates every step again
    assert (a.spec_fails, a.spec_skip) == (0, 0)
    s.kv.check_integrity([a])


def test_a_proposer_right_a_third_of_the_time_keeps_speculating():
    s = _sched(_FixedProposer({"a": [7, 8]}), k=2, budget=8, blocks=40, backoff_max_steps=32)
    a = _seq("a", 4, max_tokens=60)
    s.add(a)
    _land(s, s.schedule(), {"a": 50}, {})
    # accepted 1, 0, 0, 1, 0, 0 ..: a mean of 1/3 token per verification, above the back-off's 0.25
    kinds = [k for i in range(12) for k in _decode_kinds(s, a, 1, accepted=1 if i % 3 == 0 else 0)]
    assert kinds == ["v"] * 12 and a.spec_skip == 0


def test_nothing_to_propose_backs_off_too_and_backoff_0_always_speculates():
    prop = _FixedProposer({})
    s = _sched(prop, k=2, budget=8, blocks=40, backoff_max_steps=8)
    a = _seq("a", 4, max_tokens=40)
    s.add(a)
    _land(s, s.schedule(), {"a": 50}, {})
    out = s.schedule()  # the proposer finds nothing: a plain decode (it waited for the host to look), not held
    assert _split(out) == [("a", 4, 1, True, [])] and out.max_in_flight == 2
    _land(s, out, {"a": 60}, {})
    assert _decode_kinds(s, a, 5, accepted=0) == ["p"] * 5  # 6 looks that found nothing: now it backs off
    assert (a.spec_fails, a.spec_skip, len(prop.calls)) == (1, 1, 6)
    _decode_kinds(s, a, 1, accepted=0)
    assert len(prop.calls) == 6  # the back-off's decode did not look
    _decode_kinds(s, a, 1, accepted=0)
    assert (a.spec_fails, a.spec_skip, len(prop.calls)) == (2, 2, 7)
    s2 = _sched(_FixedProposer({"b": [7, 8]}), k=2, budget=8, blocks=40, backoff_max_steps=0)
    b = _seq("b", 4, max_tokens=40)
    s2.add(b)
    _land(s2, s2.schedule(), {"b": 50}, {})
    for _ in range(16):
        out = s2.schedule()
        assert out.seqs[0].spec_token_ids == [7, 8]
        _land(s2, out, {"b": 60}, {"b": 0})
    assert b.spec_skip == 0


def test_disable_by_batch_size_turns_speculation_off_for_large_steps():
    prop = _FixedProposer({"a": [7], "b": [7], "c": [7]})
    s = _sched(prop, k=1, budget=32, blocks=40, disable_by_batch_size=3)
    seqs = [_seq(x, 4) for x in "ab"]
    for q in seqs:
        s.add(q)
    _land(s, s.schedule(), {"a": 50, "b": 51}, {})
    out = s.schedule()  # 2 running: they speculate
    assert [x.spec_token_ids for x in out.seqs] == [[7], [7]]
    _land(s, out, {"a": 60, "b": 61}, {"a": 1, "b": 1})
    c = _seq("c", 4)
    s.add(c)
    out = s.schedule()  # c is admitted in this step: 2 running when it began
    _land(s, out, {"a": 62, "b": 63, "c": 52}, {"a": 1, "b": 1})
    out = s.schedule()  # 3 running: nobody speculates, and the step may run ahead
    assert [x.spec_token_ids for x in out.seqs] == [[], [], []] and out.max_in_flight == 2 and prop.calls[-1] != [
        ("c", 1)]
    s.kv.check_integrity(seqs + [c])


@pytest.mark.parametrize("value, message", [
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method 'eagle' is not supported"),
    ('{"method": "ngram"}', "num_speculative_tokens=None"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "k": 1}', "unknown keys ['k']"),
    ('{"method": "draft_model", "num_speculative_tokens": 2}', 'needs "model"'),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}',
     "1 <= min <= max"),
    ("{method: ngram}", "is not JSON"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}', "disable_by_batch_size=0"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "backoff_max_steps": -1}', "backoff_max_steps=-1"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "backoff_max_steps": true}', "backoff_max_steps=True"),
    ('{"method": "ngram", "num_speculative_tokens": true}', "num_speculative_tokens=True"),  # JSON true is no count
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": true}', "prompt_lookup_max=True"),
    ('{"method": "draft_model", "model": "d", "num_speculative_tokens": 2, "quantization": "gptq"}',
     "quantization 'gptq' is not supported; use one of ['awq', 'int8', 'fp8', 'w8a8']"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "quantization": "int8"}',
     'quantization applies to a draft model (method "draft_model"), not to method \'ngram\''),
])
def test_speculative_config_errors_say_what_to_change(value, message):
    with pytest.raises(ValueError, match=None) as e:
        SpeculativeConfig.parse(value)
    assert message in str(e.value)


def test_speculative_config_defaults_and_dict_form():
    c = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3})
    assert (c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max) == (5, 2, 3)
    assert (c.disable_by_batch_size, c.backoff_max_steps) == (None, 32)
    c = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 32,
                                 "backoff_max_steps": 0})
    assert (c.disable_by_batch_size, c.backoff_max_steps) == (32, 0)
    assert SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 1}').prompt_lookup_max == 4
    draft = {"method": "draft_model", "model": "d", "num_speculative_tokens": 2}
    assert SpeculativeConfig.parse(draft).quantization is None
    assert SpeculativeConfig.parse({**draft, "quantization": "awq"}).quantization == "awq"
    assert SpeculativeConfig.parse({**draft, "quantization": "none"}).quantization is None
    assert NgramProposer(1, 2).propose([SimpleNamespace(token_ids=[1, 2, 1])], [2]) == [[2, 1]]


def test_speculative_config_flag_on_every_engine_command():
    import argparse

    from tachyon.engine_args import EngineArgs

    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    args = EngineArgs.from_cli_args(p.parse_args(
        ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5}']))
    assert SpeculativeConfig.parse(args.speculative_config) == SpeculativeConfig("ngram", 3, 5, 2)
    with pytest.raises(ValueError, match="num_speculative_tokens=0"):  # refused before anything loads
        EngineArgs(speculative_config={"method": "ngram", "num_speculative_tokens": 0})


def test_set_speculation_switches_the_proposer_from_the_next_step():
    s = _sched(None, k=2)  # no proposer: plain decoding whatever the config says
    assert s.num_speculative_tokens == 0 and s.spec_accepted_per_pos == []
    a = _seq("a", 4)
    s.add(a)
    _land(s, s.schedule(), {"a": 50}, {})
    out = s.schedule()
    assert _split(out) == [("a", 4, 1, True, [])]
    _land(s, out, {"a": 51}, {})
    prop = _FixedProposer({"a": [7, 8, 9, 10]})
    s.set_speculation(prop, 3)
    out = s.schedule()
    assert _split(out) == [("a", 5, 4, True, [7, 8, 9])] and s.spec_accepted_per_pos == [0, 0, 0]
    _land(s, out, {"a": 60}, {"a": 2})
    assert s.spec_accepted_per_pos == [1, 1, 0]
    s.set_speculation(None, 3)  # off again: the counters stay
    out = s.schedule()
    assert _split(out) == [("a", 8, 1, True, [])] and s.spec_accepted_per_pos == [1, 1, 0]
    _land(s, out, {"a": 61}, {})
    s.kv.check_integrity([a])
