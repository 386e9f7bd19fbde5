"""Prompts are tokenized in a worker thread, those that arrive together in one batch call.

A burst of requests (a client opening 16 streams at once) reaches the event loop within a few ms. Encoded one by
one on the loop, each costs the tokenizer's per-call overhead (~1 ms in transformers) plus its text, and the loop
cannot read the next requests meanwhile. Here the first prompt goes to the thread at once (so the engine can start
on it while the loop still parses the rest of the burst), and the prompts that arrive while a batch is in the
thread form the next batch: one tokenizer call, which the Rust tokenizer spreads over its threads without the GIL.

    handler ─encode(text)─► nothing in the thread? ─► thread: tokenizer([text]) ─► its handler's future
                                  │ else                       └─ done: the texts queued meanwhile go next
                                  └──► pending

(Waiting for the whole burst before the first call, as this did before, held the first request ~13 ms on an H100
host and ~20 ms on a 2-core CPU; one prefill step for the whole burst is no faster on the device than the steps
it would replace: benchmarks/results/h100/session_20261207f.)
"""

from __future__ import annotations

import asyncio


class BatchEncoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._pending: list[tuple[str, bool, asyncio.Future]] = []
        self._busy: asyncio.AbstractEventLoop | None = None  # the loop whose batch is in the worker thread
        self.num_batches = 0  # tokenizer batches run (a burst of n prompts should be few of them)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((text, add_special_tokens, fut))
        if self._busy is not loop:  # idle, or busy for a loop that has gone (its batch can never report here)
            self._start(loop)
        return await fut

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Send the pending texts (of handlers on this loop still waiting) to the thread now, if any."""
        # (a client gone meanwhile is skipped, and so is a waiter of a loop that has gone)
        batch = [item for item in self._pending if not item[2].done() and item[2].get_loop() is loop]
        self._pending = []
        self._busy = loop if batch else None
        if not batch:
            return
        self.num_batches += 1
        job = loop.run_in_executor(None, self._encode_batch, [(text, special) for text, special, _ in batch])
        job.add_done_callback(lambda done: self._finish(loop, batch, done))

    def _encode_batch(self, items: list[tuple[str, bool]]) -> list[list[int]]:
        """In the worker thread: one tokenizer call per special-token setting, the ids in the items' order."""
        out: list[list[int]] = [[] for _ in items]
        for flag in (True, False):
            where = [i for i, (_, special) in enumerate(items) if special is flag]
            if where:
                for i, ids in zip(where, self.encode_now([items[i][0] for i in where], flag), strict=True):
                    out[i] = list(ids)
        return out

    def _finish(self, loop: asyncio.AbstractEventLoop, batch: list, job: asyncio.Future) -> None:
        try:
            results = job.result()
        except (Exception, asyncio.CancelledError) as e:  # the same failure for every text (a broken tokenizer)
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
        else:
            for (_, _, fut), ids in zip(batch, results, strict=True):
                if not fut.done():  # a handler cancelled meanwhile (client gone) no longer waits
                    fut.set_result(ids)
        self._start(loop)  # the texts that arrived while this batch ran

    def encode_now(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """One tokenizer call for the texts, in the caller's thread."""
        return self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
