"""The periodic stats line of `tachyon serve` (--log-stats-interval): one per served model that has work."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from tachyon.server.frontend import log_stats_forever


class _Engine:
    def __init__(self, running: int):
        self.running, self.generated = running, 0

    def stats(self):
        if self.running:
            self.generated += 10  # 10 tokens between two looks while it runs
        return SimpleNamespace(prompt_tokens=0, generation_tokens=self.generated, prefix_cache_queries=0,
                               prefix_cache_hits=0, num_running=self.running, num_waiting=0, kv_cache_usage=0.5)


def _lines(served, rounds: int, caplog) -> list[str]:
    async def run():
        task = asyncio.ensure_future(log_stats_forever(served, 0.01))
        await asyncio.sleep(0.01 * rounds + 0.005)
        task.cancel()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tachyon"):
        asyncio.run(run())
    return [r.getMessage() for r in caplog.records if "Avg generation throughput" in r.getMessage()]


def test_one_line_per_busy_model_named_when_several(caplog):
    busy, idle, other = _Engine(running=2), _Engine(running=0), _Engine(running=1)
    models = [("a@v1", busy), ("b", idle)]
    lines = _lines(lambda: models, 3, caplog)
    assert lines and all(line.startswith("a@v1: Avg prompt throughput") for line in lines), lines
    assert all("Running: 2 reqs" in line and "KV cache usage: 50.0%" in line for line in lines)

    lines = _lines(lambda: [("a@v1", busy)], 3, caplog)  # one model: no name in front, as vLLM's line
    assert lines and all(line.startswith("Avg prompt throughput") for line in lines), lines

    # a model loaded while the loop runs gets its lines too; one unloaded gets none
    served = [("a@v1", busy)]

    async def swap():
        task = asyncio.ensure_future(log_stats_forever(lambda: list(served), 0.01))
        await asyncio.sleep(0.025)
        served[:] = [("c@v2", other), ("b", idle)]
        caplog.clear()
        await asyncio.sleep(0.04)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="tachyon"):
        asyncio.run(swap())
    after = [r.getMessage() for r in caplog.records if "Avg generation throughput" in r.getMessage()]
    assert after and all(line.startswith("c@v2: ") for line in after), after
