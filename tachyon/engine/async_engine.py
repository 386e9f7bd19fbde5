"""The engine for a server: a background thread steps the engine; each request is an async stream.

    asyncio handlers ──add_request──► engine (thread-safe inbox) ◄──step()── engine thread
          ▲                                                                    │
          └──────── per-request asyncio.Queue ◄── loop.call_soon_threadsafe ───┘

The engine is an LLMEngine (core and output processor in this process: tests, small setups) or an
MPEngineClient (the core in its own process: `tachyon serve`), whose step() waits for the core's next
outputs instead of computing them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator

import torch

from tachyon.outputs import RequestOutput
from tachyon.sampling_params import SamplingParams

logger = logging.getLogger("tachyon")


class QueueFullError(RuntimeError):
    """More requests are waiting than the server accepts (`--max-queued-requests`)."""


class EngineDeadError(RuntimeError):
    pass


def _deliver(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for q, item in items:
        q.put_nowait(item)


class AsyncEngine:
    def __init__(self, engine, max_queued_requests: int | None = None):
        self.engine = engine
        self.max_queued_requests = max_queued_requests
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.on_step = None  # callback(outputs, step_seconds) for metrics, run in the engine thread

    # -- lifecycle --------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tachyon-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop; requests still running are aborted and their streams ended."""
        for rid in list(self._streams):
            self.engine.abort_request(rid)
        self._wake.set()
        deadline = time.monotonic() + timeout
        while self._streams and time.monotonic() < deadline and self._thread and self._thread.is_alive():
            time.sleep(0.01)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None
        self.engine.shutdown()

    def wake(self) -> None:
        """Have the loop look at the engine now (after an abort from outside a stream, say)."""
        self._wake.set()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def _loop(self) -> None:
        with torch.inference_mode():
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    if not self.engine.has_unfinished_requests():
                        self._wake.wait(timeout=0.5)
                        self._wake.clear()
                        self.engine.check_alive()  # a core in its own process may have died while idle
                        continue
                    outputs = self.engine.step()
                except BaseException as e:  # the engine is broken: fail every stream, stop
                    logger.exception("engine step failed")
                    self.error = e
                    for rid in list(self._streams):
                        self._push(rid, e)
                    return
                if self.on_step is not None:
                    try:
                        self.on_step(outputs, time.perf_counter() - t0)
                    except Exception:  # a metrics hook must never stop the engine
                        logger.exception("on_step hook failed")
                self._push_many(outputs)

    def _push_many(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs, one wake-up per event loop (not one per request: each costs a syscall and a
        trip through the loop, 256 per step at full batch)."""
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        states = self.engine.processor.states
        for out in outputs:
            entry = self._streams.get(out.request_id)
            if entry is None:
                continue
            if out.finished:
                self._streams.pop(out.request_id, None)
            else:  # no more outputs for this stream until its reader has taken this one (see generate)
                st = states.get(out.request_id)
                if st is not None:
                    st.stream = False
            batches.setdefault(entry[0], []).append((entry[1], out))
        for loop, items in batches.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the event loop is closed
                pass

    def _push(self, rid: str, item) -> None:
        entry = self._streams.get(rid)
        if entry is None:
            return
        loop, q = entry
        if isinstance(item, RequestOutput) and item.finished or isinstance(item, BaseException):
            self._streams.pop(rid, None)
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # the event loop is closed
            pass

    # -- requests ---------------------------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self.engine.num_waiting

    async def generate(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                       params: SamplingParams, stream: bool = True,
                       arrival_time: float | None = None) -> AsyncIterator[RequestOutput]:
        """Stream cumulative outputs. The engine makes a stream's next output only once its reader has taken the
        previous one (outputs are cumulative, so the newest carries every token since): a reader that keeps
        up gets every step's token, a busy one costs the engine no output objects it would not read. If the
        consumer goes away (client disconnect) the request is aborted. stream=False: only the final output.
        arrival_time: the request's arrival on the monotonic clock (the server's, before parsing); default now."""
        if self.error is not None:
            raise EngineDeadError(f"the engine stopped after an error: {self.error!r}")
        if self.max_queued_requests is not None and self.num_waiting >= self.max_queued_requests:
            raise QueueFullError(f"{self.num_waiting} requests are already waiting (limit "
                                 f"{self.max_queued_requests}); retry later")
        q: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), q)
        try:
            self.engine.add_request(request_id, prompt, prompt_token_ids, params, arrival_time, stream=stream)
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        self._wake.set()
        finished = False
        try:
            while True:
                item = await q.get()
                # Outputs are cumulative, so when the consumer has fallen behind (several steps' outputs wait),
                # the newest carries everything the others did: one chunk instead of several, which is what
                # lets a busy event loop catch up instead of falling further behind.
                while not q.empty() and isinstance(item, RequestOutput) and not item.finished:
                    item = q.get_nowait()
                st = self.engine.processor.states.get(request_id)
                if st is not None and stream:  # taken: the engine may make the next output (a plain flag, no lock)
                    st.stream = True
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"the engine stopped after an error: {item!r}")
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            if not finished:
                self._streams.pop(request_id, None)
                self.engine.abort_request(request_id)
                self._wake.set()
