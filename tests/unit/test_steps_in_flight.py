"""Steps queued ahead of the host (num_scheduler_steps > 1): a decode's input may be a token the previous step
is still sampling. They give exactly the tokens of one-at-a-time steps, one token per step to the streams,
stop where a stop condition says, admit arrivals without draining, and leave no blocks behind."""

from __future__ import annotations

import random

import pytest

from tachyon import LLM, SamplingParams
from tests.conftest import hf_greedy, make_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_multi")
    hf = make_tiny_checkpoint("llama", str(path), seed=3)
    return str(path), hf


def _spy(llm: LLM) -> list:
    """Every scheduler output, with the number of steps in flight when it was made. Each output gets
    `num_placeholders`: its sequences whose input token was still being sampled on the device."""
    outs: list = []
    sched = llm.engine.scheduler
    real = sched.schedule

    def spy(num_in_flight=0):
        out = real(num_in_flight)
        out.num_placeholders = sum(s.start >= len(s.seq.token_ids) for s in out.seqs)
        outs.append((num_in_flight, out))
        return out

    sched.schedule = spy
    return outs


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 500) for _ in range(rng.choice([5, 19, 33, 70]))] for _ in range(n)]


def _tiny_llm(path, steps, **kw):
    kw = {"num_kv_blocks": 200, "block_size": 8, "swap_space": 0, "dtype": "float32", **kw}
    return LLM(model=path, num_scheduler_steps=steps, **kw)


def test_steps_in_flight_match_transformers(tiny):
    path, hf = tiny
    llm = _tiny_llm(path, 4)
    spied = _spy(llm)
    prompts = _prompts(6, seed=0)
    max_tokens = [1, 2, 7, 10, 13, 21]  # sequences end at many different steps
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens])
    assert max(n for n, _ in spied) == 3, "three steps in flight while the fourth is scheduled"
    # a decode scheduled behind a step in flight takes its input from the device
    assert sum(out.num_placeholders for _, out in spied) > 20
    for p, m, o in zip(prompts, max_tokens, outs, strict=True):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, m)
        assert o.outputs[0].finish_reason == "length"
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks, "blocks leaked"
    assert not llm.engine.core.in_flight


def test_stop_token_with_steps_in_flight(tiny):
    path, hf = tiny
    prompt = _prompts(1, seed=5)[0]
    ref = hf_greedy(hf, prompt, 24)
    stop_at = next(i for i in range(5, 24) if ref[i] not in ref[:i])  # first occurrence, mid-way
    llm = _tiny_llm(path, 8, num_kv_blocks=64)
    spied = _spy(llm)
    (out,) = llm.generate([{"prompt_token_ids": prompt}],
                          SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[ref[stop_at]]))
    assert sum(1 for _, o in spied if o.seqs) > stop_at + 1, "steps past the stop were already queued"
    assert out.outputs[0].token_ids == ref[: stop_at + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == ref[stop_at]
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_seeded_sampling_stop_strings_and_logprobs_as_single_steps(llm):
    prompts = ["Tell me a story about a dragon.", "List three fruits:", "Count: 1, 2,"]
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=30),
              SamplingParams(temperature=0, max_tokens=40, stop=["\n\n", "4."]),
              SamplingParams(temperature=0, max_tokens=12, logprobs=3, min_tokens=6, stop_token_ids=[28])]

    def run(engine_llm):
        return [(o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].logprobs)
                for o in engine_llm.generate(prompts, params)]

    one = run(llm)
    multi = LLM(swap_space=0, num_scheduler_steps=5)
    spied = _spy(multi)
    many = run(multi)
    assert max(n for n, _ in spied) == 4
    assert many == one
    assert multi.engine.kv.num_free_blocks == multi.engine.kv.num_blocks


def test_streams_get_one_token_per_step(tiny):
    """Every token reaches its stream at its own step (no chunks), while later steps are already queued."""
    path, hf = tiny
    llm = _tiny_llm(path, 3, num_kv_blocks=64)
    eng = llm.engine
    prompt = _prompts(1, seed=2)[0]
    eng.add_request("s", None, prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    lengths, depth = [], 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            lengths.append(len(o.outputs[0].token_ids))
        depth = max(depth, len(eng.core.in_flight))
    assert depth == 2
    assert lengths == list(range(1, 13))
    assert o.outputs[0].token_ids == hf_greedy(hf, prompt, 12)


def test_an_arrival_joins_without_draining_the_steps_in_flight(tiny):
    """A request that arrives while decodes are queued ahead is admitted by the very next step, beside them,
    and the steps in flight stay in flight (no host round trip)."""
    path, hf = tiny
    llm = _tiny_llm(path, 3)
    spied = _spy(llm)
    eng = llm.engine
    eng.add_request("a", None, [5, 6, 7], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for _ in range(4):
        eng.step()
    assert len(eng.core.in_flight) == 2
    eng.add_request("b", None, [8, 9, 10, 11], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    eng.step()
    num_in_flight, out = spied[-1]
    assert num_in_flight == 2 and [(s.seq.seq_id, s.num_new_tokens) for s in out.seqs] == [("a", 1), ("b", 4)]
    assert out.max_in_flight == 2 and len(eng.core.in_flight) == 2
    outs = {}
    while eng.has_unfinished_requests():
        outs.update({o.request_id: o.outputs[0].token_ids for o in eng.step() if o.finished})
    assert outs["a"] == hf_greedy(hf, [5, 6, 7], 20) and outs["b"] == hf_greedy(hf, [8, 9, 10, 11], 3)
    assert eng.kv.num_free_blocks == eng.kv.num_blocks


def test_preemption_waits_for_the_steps_in_flight(tiny):
    """A pool too small for every sequence: the scheduler answers sync while steps are in flight, then
    preempts; tokens stay exact, with recompute and with swap."""
    path, hf = tiny
    prompts = [p[:9] for p in _prompts(3, seed=4)]
    for swap in (0, 0.01):
        llm = _tiny_llm(path, 4, num_kv_blocks=14, block_size=4, swap_space=swap)
        llm.engine.kv.min_swap_tokens = 4
        spied = _spy(llm)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0, max_tokens=14, ignore_eos=True))
        sched = llm.engine.scheduler
        assert sched.num_preemptions > 0 and any(o.sync for n, o in spied if n)
        assert all(n == 0 for n, o in spied if o.preempted), "never preempts with steps in flight"
        assert (sched.num_swapped_out > 0) == (swap > 0)
        for p, o in zip(prompts, outs, strict=True):
            assert o.outputs[0].token_ids == hf_greedy(hf, p, 14)
        llm.engine.check_integrity()
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_penalties_run_one_step_ahead_with_deferred_sampling(tiny):
    """A sequence whose sampling reads its own history is scheduled behind its own pending token only with the
    step's sampling deferred, one step ahead at most; its tokens equal those of an engine with no step ahead."""
    path, _ = tiny
    prompts = _prompts(2, seed=8)
    params = [SamplingParams(temperature=0, max_tokens=10, repetition_penalty=1.3, frequency_penalty=0.5,
                             ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)]
    results = []
    for steps in (1, 4):
        llm = _tiny_llm(path, steps)
        spied = _spy(llm)
        results.append([o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                                      params)])
        penalised = [out for _, out in spied if any(s.seq.sampling_params.repetition_penalty != 1.0
                                                    for s in out.seqs)]
        assert all(out.max_in_flight <= 1 and (out.num_placeholders == 0 or out.defer_sampling)
                   for out in penalised)
        if steps > 1:
            assert any(out.num_placeholders and out.defer_sampling for out in penalised)
    assert results[0] == results[1]


def test_n_greater_than_one_and_abort_with_steps_in_flight(tiny):
    """n > 1 siblings (forked after the prompt) give the same tokens with and without steps in flight; an
    abort while steps are in flight frees everything at once."""
    path, _ = tiny
    prompt = _prompts(1, seed=21)[0]
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=14, ignore_eos=True)
    results = []
    for steps in (1, 4):
        llm = _tiny_llm(path, steps, num_kv_blocks=120)
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params)
        results.append([c.token_ids for c in out.outputs])
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    assert results[0] == results[1]
    assert all(len(t) == 14 for t in results[1])

    eng = llm.engine
    eng.add_request("x", None, prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(5):
        eng.step()
    assert len(eng.core.in_flight) == 3 and eng.kv.num_free_blocks < eng.kv.num_blocks
    eng.abort_request("x")
    (out,) = eng.step()
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert 0 < len(out.outputs[0].token_ids) < 40
    assert not eng.has_unfinished_requests() and eng.kv.num_free_blocks == eng.kv.num_blocks
    eng.check_integrity()


def test_never_computes_past_the_context_limit(tiny):
    """No step is scheduled past max_model_len: the sequence ends with 'length' exactly at the limit."""
    path, hf = tiny
    llm = _tiny_llm(path, 4, num_kv_blocks=64, max_model_len=40)
    spied = _spy(llm)
    prompt = [10 + (7 * i) % 400 for i in range(29)]
    (out,) = llm.generate([{"prompt_token_ids": prompt}],
                          SamplingParams(temperature=0, ignore_eos=True, max_tokens=None))  # up to the context
    assert max(s.start + s.num_new_tokens for _, o in spied for s in o.seqs) <= 40 - 1
    assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 40 - 29)
    assert out.outputs[0].finish_reason == "length"
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
