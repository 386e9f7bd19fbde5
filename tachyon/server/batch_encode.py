"""Prompts that arrive together are tokenized together: one batch call, in a worker thread.

A burst of requests (a client opening 16 streams at once) reaches the event loop within a few ms. Encoded one by
one on the loop, each costs the tokenizer's per-call overhead (~1 ms in transformers) plus its text, and the
engine sees the burst trickle in over tens of ms: one prompt alone in a step, then most, then the rest. Encoded
as a batch, the Rust tokenizer spreads the texts over its threads and drops the GIL, the loop stays free to read
the next requests, and the whole burst reaches the engine at once.

    handler ─encode(text)─► pending ─(next loop turn)─► thread: tokenizer(texts) ─► each handler's future

While one batch is in the thread, the texts that arrive meanwhile wait and form the next batch.
"""

from __future__ import annotations

import asyncio


class BatchEncoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._pending: list[tuple[str, bool, asyncio.Future]] = []
        self._drainer: asyncio.Task | None = None
        self.num_batches = 0  # tokenizer calls made (a burst of n prompts should be few of them)

    async def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append((text, add_special_tokens, fut))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._pending:
                await asyncio.sleep(0)  # the handlers woken in this loop turn queue their texts first
                batch, self._pending = self._pending, []
                for flag in (True, False):
                    group = [(text, fut) for text, special, fut in batch if special is flag and not fut.done()]
                    if group:
                        await self._encode_group(group, flag)
        finally:
            self._drainer = None

    async def _encode_group(self, group: list[tuple[str, asyncio.Future]], add_special_tokens: bool) -> None:
        self.num_batches += 1
        try:
            ids = await asyncio.to_thread(self.encode_now, [text for text, _ in group], add_special_tokens)
        except Exception as e:  # the same failure for every text of the batch (a broken tokenizer)
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(e)
            return
        for (_, fut), one in zip(group, ids, strict=True):
            if not fut.done():  # a handler cancelled meanwhile (client gone) no longer waits
                fut.set_result(list(one))

    def encode_now(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        """One tokenizer call for the texts, in the caller's thread."""
        return self.tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
