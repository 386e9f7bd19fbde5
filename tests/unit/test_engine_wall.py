"""The second wall: when processing one request raises anyway, that request alone ends with finish_reason
"error" (blocks freed) and everyone else's tokens are exactly what they would have been. Faults are injected
into the real engine's sampler, runner, detokenizer and scheduler; only a device fault stops the engine."""

from __future__ import annotations

import asyncio

import pytest

from tachyon import LLM, SamplingParams
from tests.conftest import hf_greedy, make_tiny_checkpoint

POISON = 13  # the seed that marks the request a fault is injected for


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_wall")
    hf = make_tiny_checkpoint("llama", str(path), seed=5)
    return str(path), hf


def _poison(obj, name: str, reqs_of, error: Exception) -> None:
    """Make obj.name raise `error` whenever its call involves the marked request (reqs_of: args -> requests)."""
    real = getattr(obj, name)

    def poisoned(*args):
        if any(r.sampling_params.seed == POISON for r in reqs_of(*args)):
            raise error
        return real(*args)

    setattr(obj, name, poisoned)


def _run(llm, prompts, params) -> dict:
    engine = llm.engine
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", None, p, sp)
    done = {}
    for _ in range(500):
        for o in engine.step():
            if o.finished:
                assert o.request_id not in done, "one final output per request"
                done[o.request_id] = o
        if not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests()
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    return done


PROMPTS = [[5, 17, 300, 41, 9], list(range(20, 53)), [7] * 19, list(range(100, 170))]


@pytest.mark.parametrize("steps", [1, 4])  # one step at a time, and steps queued ahead of the host
@pytest.mark.parametrize("where", ["sampler", "forward"])
def test_a_request_that_breaks_its_batch_fails_alone(tiny, steps, where):
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=120, block_size=8, swap_space=0, num_scheduler_steps=steps, dtype="float32")
    runner = llm.engine.runner
    if where == "sampler":
        _poison(runner.sampler, "sample_tokens", lambda logits, reqs, num_outputs: reqs,
                RuntimeError("injected sampler fault"))
    else:
        _poison(runner, "submit", lambda sched: [s.seq for s in sched.seqs], IndexError("injected forward fault"))
    max_tokens = [6, 12, 9, 15]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    # the poisoned one joins after a few tokens (greedy: its seed changes nothing but the marker)
    params[2] = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, seed=POISON)
    done = _run(llm, PROMPTS, params)
    bad = done["r2"]
    assert bad.outputs[0].finish_reason == "error" and "injected" in bad.error
    for i in (0, 1, 3):
        out = done[f"r{i}"]
        assert out.error is None and out.outputs[0].finish_reason == "length"
        assert out.outputs[0].token_ids == hf_greedy(hf, PROMPTS[i], max_tokens[i])
    assert llm.engine.num_failed_requests == 1
    # the engine goes on: a new request after the failure runs normally
    again = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert again.outputs[0].token_ids == hf_greedy(hf, PROMPTS[0], 4)


def test_a_request_whose_text_raises_fails_alone(llm):
    engine = llm.engine
    ref = llm.generate(["Once upon a time", "The capital of France is"],
                       SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.add_request("ok", "Once upon a time", ref[0].prompt_token_ids,
                       SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    engine.add_request("bad", "The capital of France is", ref[1].prompt_token_ids,
                       SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))

    def broken(token_id):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer fault")

    engine.processor.states["bad"].seqs[0].detok.add_token = broken
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert done["bad"].outputs[0].finish_reason == "error" and "injected" in done["bad"].error
    assert done["ok"].outputs[0].text == ref[0].outputs[0].text and done["ok"].error is None
    engine.check_integrity()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks


def test_a_fault_no_request_explains_fails_the_live_ones_and_the_engine_goes_on(llm):
    engine = llm.engine
    real = engine.scheduler.schedule
    calls = {"n": 0}

    def schedule(num_in_flight=0):
        calls["n"] += 1
        if calls["n"] == 3:
            raise AssertionError("injected scheduler fault")
        return real(num_in_flight)

    engine.scheduler.schedule = schedule
    try:
        outs = llm.generate([[1, 2, 3], [4, 5, 6, 7]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    finally:
        engine.scheduler.schedule = real
    assert [o.outputs[0].finish_reason for o in outs] == ["error", "error"]
    assert all("injected scheduler fault" in o.error for o in outs)
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert out.outputs[0].finish_reason == "length" and len(out.outputs[0].token_ids) == 4


def test_a_device_fault_stops_the_engine_and_says_so(llm):
    from tachyon.engine.async_engine import AsyncEngine, EngineDeadError

    engine = llm.engine
    real = engine.runner.submit
    engine.runner.submit = lambda sched: (_ for _ in ()).throw(
        RuntimeError("CUDA error: an illegal memory access was encountered"))
    aengine = AsyncEngine(engine)
    aengine.start()

    async def main():
        with pytest.raises(EngineDeadError, match="illegal memory access"):
            async for _ in aengine.generate("dev", None, [1, 2, 3], SamplingParams(max_tokens=4)):
                pass
        with pytest.raises(EngineDeadError):
            async for _ in aengine.generate("after", None, [1, 2, 3], SamplingParams(max_tokens=4)):
                pass

    try:
        asyncio.run(main())
        assert not aengine.is_running and "illegal memory access" in repr(aengine.error)
    finally:
        engine.runner.submit = real
        aengine.shutdown(timeout=5)
        engine.abort_request("dev")
        engine.step()


def test_an_abort_lands_within_one_step_of_a_long_prefill(tiny):
    """A prompt that needs many chunks: aborted after its first chunk, the next step ends it and frees
    every block, and the request beside it is untouched."""
    path, hf = tiny
    llm = LLM(model=path, num_kv_blocks=120, block_size=8, swap_space=0, max_num_batched_tokens=32, dtype="float32")
    engine = llm.engine
    long_prompt = [(7 * i) % 400 + 10 for i in range(200)]  # 7 chunks of 32
    engine.add_request("long", None, long_prompt, SamplingParams(temperature=0, max_tokens=5))
    engine.add_request("short", None, PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    engine.step()
    long_req = engine.core.groups["long"].seqs[0]
    assert 0 < long_req.num_computed_tokens < len(long_prompt)  # mid-prefill
    engine.abort_request("long")
    outs = engine.step()
    assert [o.outputs[0].finish_reason for o in outs if o.request_id == "long"] == ["abort"]
    assert "long" not in engine.core.groups and not long_req.block_ids
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert done["short"].outputs[0].token_ids == hf_greedy(hf, PROMPTS[0], 6)
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
