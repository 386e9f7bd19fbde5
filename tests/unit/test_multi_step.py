"""Multi-step decoding (num_scheduler_steps > 1): several forwards per host round trip give exactly the
tokens of one-at-a-time steps, stop where a stop condition says, and leave no blocks behind."""

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


def _spy_multi(llm: LLM) -> list[int]:
    calls: list[int] = []
    runner = llm.engine.runner
    real = runner.execute_multi

    def spy(sched, n):
        calls.append(n)
        return real(sched, n)

    runner.execute_multi = spy
    return calls


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 500) for _ in range(rng.choice([5, 19, 33, 70]))] for _ in range(n)]


def test_multi_step_greedy_matches_transformers(tiny):
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=200, block_size=8, swap_space=0, num_scheduler_steps=4, dtype="float32")
    calls = _spy_multi(llm)
    prompts = _prompts(6, seed=0)
    max_tokens = [1, 2, 7, 10, 13, 21]  # not multiples of 4; one and two tokens never run multi-step
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens])
    assert calls and max(calls) == 4 and min(calls) >= 2
    for p, m, o in zip(prompts, max_tokens, outs, strict=True):
        assert o.outputs[0].token_ids == hf_greedy(hf, p, m)
        assert o.outputs[0].finish_reason == "length"
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks, "blocks leaked"


def test_multi_step_stops_mid_run_on_stop_token(tiny):
    path, hf = tiny
    prompt = _prompts(1, seed=5)[0]
    ref = hf_greedy(hf, prompt, 24)
    stop_at = next(i for i in range(5, 24) if ref[i] not in ref[:i])  # first occurrence, mid-way through a run
    llm = LLM(model=path, num_kv_blocks=64, block_size=8, swap_space=0, num_scheduler_steps=8, dtype="float32")
    calls = _spy_multi(llm)
    (out,) = llm.generate([{"prompt_token_ids": prompt}],
                          SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[ref[stop_at]]))
    assert calls, "multi-step never ran"
    assert out.outputs[0].token_ids == ref[: stop_at + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == ref[stop_at]
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_multi_step_same_as_single_steps_for_seeded_sampling_and_stop_strings(llm):
    prompts = ["Tell me a story about a dragon.", "List three fruits:"]
    params = [SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=30),
              SamplingParams(temperature=0, max_tokens=40, stop=["\n\n", "4."])]
    one = [(o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason)
           for o in llm.generate(prompts, params)]
    multi = LLM(swap_space=0, num_scheduler_steps=5)
    calls = _spy_multi(multi)
    many = [(o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason)
            for o in multi.generate(prompts, params)]
    assert calls
    assert many == one
    assert multi.engine.kv.num_free_blocks == multi.engine.kv.num_blocks


def test_multi_step_waits_for_admissions(tiny):
    """While a waiting request could be admitted, steps stay single so it is not held back."""
    path, _ = tiny
    llm = LLM(model=path, num_kv_blocks=200, block_size=8, swap_space=0, num_scheduler_steps=4, max_num_seqs=1)
    calls = _spy_multi(llm)
    eng = llm.engine
    eng.add_request("a", None, [5, 6, 7], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    eng.step()
    eng.step()
    assert calls == [4]  # max_num_seqs reached: nobody can be admitted, so a multi-step runs
    eng.add_request("b", None, [8, 9], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    eng.config.scheduler.max_num_seqs = 2
    eng.step()
    assert calls == [4], "b could be admitted: the step must be a single one"
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.kv.num_free_blocks == eng.kv.num_blocks


def test_large_batch_runs_past_finishing_sequences(tiny):
    """16+ sequences: a run is not cut short where one sequence ends; its leftover rows are dropped."""
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=400, block_size=8, swap_space=0, num_scheduler_steps=6, dtype="float32")
    calls = _spy_multi(llm)
    prompts = _prompts(18, seed=9)
    max_tokens = [3 + (i * 5) % 17 for i in range(18)]  # 3..19, finishing at many different sub-steps
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens])
    assert calls and calls[0] == 6, calls  # the first run is not shortened to the smallest remaining (2)
    for p, m, o in zip(prompts, max_tokens, outs, strict=True):
        assert len(o.outputs[0].token_ids) == m
        assert o.outputs[0].token_ids == hf_greedy(hf, p, m)
    llm.engine.check_integrity()
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks


def test_multi_step_n_greater_than_one_and_abort(tiny):
    """n > 1 siblings (forked after the prompt) give the same tokens with and without multi-step; an abort
    between runs frees everything."""
    path, _ = tiny
    prompt = _prompts(1, seed=21)[0]
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=14, ignore_eos=True)
    results = []
    for steps in (1, 4):
        llm = LLM(model=path, num_kv_blocks=120, block_size=8, swap_space=0, num_scheduler_steps=steps,
                  dtype="float32")
        calls = _spy_multi(llm) if steps > 1 else []
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params)
        assert (steps > 1) == bool(calls)
        results.append([c.token_ids for c in out.outputs])
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
    assert results[0] == results[1]
    assert all(len(t) == 14 for t in results[1])

    eng = llm.engine
    eng.add_request("x", None, prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(3):
        eng.step()
    assert calls[-1] == 4 and eng.kv.num_free_blocks < eng.kv.num_blocks
    eng.abort_request("x")
    (out,) = eng.step()
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert 0 < len(out.outputs[0].token_ids) < 40
    assert not eng.has_unfinished_requests() and eng.kv.num_free_blocks == eng.kv.num_blocks
