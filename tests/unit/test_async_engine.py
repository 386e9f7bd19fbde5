"""AsyncEngine: the engine thread behind the server's event loop."""

from __future__ import annotations

import asyncio
import time

from tachyon import SamplingParams
from tachyon.engine.args import EngineArgs
from tachyon.engine.async_engine import AsyncEngine
from tests.conftest import hf_greedy, make_tiny_checkpoint


def test_a_consumer_that_falls_behind_gets_the_newest_output(tmp_path):
    """Outputs are cumulative: a stream whose reader is busy while several steps land gets one output with
    all their tokens (one SSE chunk instead of many), and nothing is lost."""
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=6)
    engine = EngineArgs(model=str(tmp_path), num_kv_blocks=64, block_size=8, swap_space=0,
                        dtype="float32").create_engine()
    ae = AsyncEngine(engine)
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
