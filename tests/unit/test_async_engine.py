"""AsyncEngine: the engine thread behind the server's event loop."""

from __future__ import annotations

import asyncio
import time

from tachyon import SamplingParams
from tachyon.build import build_engine
from tachyon.engine.async_engine import AsyncEngine
from tachyon.engine_args import EngineArgs
from tests.conftest import hf_greedy, make_tiny_checkpoint


def test_a_consumer_that_falls_behind_gets_the_newest_output(tmp_path):
    """Outputs are cumulative: a stream whose reader is busy while several steps land gets one output with
    all their tokens (one SSE chunk instead of many), nothing is lost, and the engine does not build the
    outputs in between."""
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=6)
    engine = build_engine(EngineArgs(model=str(tmp_path), num_kv_blocks=64, block_size=8, swap_space=0,
                                     dtype="float32"))
    ae = AsyncEngine(engine)
    made = []
    ae.on_step = lambda outputs, _: made.extend(len(o.outputs[0].token_ids) for o in outputs)
    ae.start()
    prompt = [11, 42, 7, 300, 5]

    async def read():
        gen = ae.generate("r", None, prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
        first = await gen.__anext__()
        deadline = time.monotonic() + 60
        while "r" in ae._streams and time.monotonic() < deadline:  # the reader is busy until the last output
            await asyncio.sleep(0.01)                               # has been handed to this loop
        await asyncio.sleep(0.01)  # ... and delivered into the queue
        return first, [o async for o in gen]

    try:
        first, rest = asyncio.run(read())
    finally:
        ae.shutdown()
    assert 1 <= len(first.outputs[0].token_ids) < 12
    assert len(rest) == 1, "the steps that landed meanwhile come as one output"
    assert rest[0].finished and rest[0].outputs[0].token_ids == hf_greedy(hf, prompt, 12)
    assert len(made) <= 3, f"the engine made outputs nobody took: token counts {made}"


def test_a_reader_that_keeps_up_gets_every_token_as_it_comes(tmp_path):
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=6)
    engine = build_engine(EngineArgs(model=str(tmp_path), num_kv_blocks=64, block_size=8, swap_space=0,
                                     dtype="float32"))
    step = engine.step

    def slow_step():  # each step starts 20 ms after the last one's outputs were handed over: the reader has
        time.sleep(0.02)  # taken them by the time this step decides whether to make the next output
        return step()

    engine.step = slow_step
    ae = AsyncEngine(engine)
    ae.start()
    prompt = [3, 99, 250, 17]

    async def read():
        gen = ae.generate("k", None, prompt, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
        return [o async for o in gen]

    try:
        outs = asyncio.run(read())
    finally:
        ae.shutdown()
    assert [len(o.outputs[0].token_ids) for o in outs] == list(range(1, 11))
    assert outs[-1].outputs[0].token_ids == hf_greedy(hf, prompt, 10)


def test_a_non_streaming_request_gets_only_its_final_output(tmp_path):
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=6)
    engine = build_engine(EngineArgs(model=str(tmp_path), num_kv_blocks=64, block_size=8, swap_space=0,
                                     dtype="float32"))
    ae = AsyncEngine(engine)
    made = []
    ae.on_step = lambda outputs, _: made.extend(outputs)
    ae.start()
    prompt = [8, 77, 123]

    async def read():
        gen = ae.generate("n", None, prompt, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),
                          stream=False)
        return [o async for o in gen]

    try:
        outs = asyncio.run(read())
    finally:
        ae.shutdown()
    assert len(outs) == 1 and outs[0].finished and len(made) == 1
    assert outs[0].outputs[0].token_ids == hf_greedy(hf, prompt, 9)
