"""The engine core in its own process, and the client the HTTP process talks to it through.

    HTTP process                                         engine-core process
    ────────────                                         ───────────────────
    validate, OutputProcessor.add_request ──("add")──►   EngineCore.add_request
    abort / stop string        ──("abort"/"stop")──►     EngineCore.abort_request / stop_sequence
    OutputProcessor.process  ◄──("out", deltas, stats)── EngineCore.step()  (loops while there is work)

Messages are small pickled dataclasses (tachyon.engine.messages) over a multiprocessing pipe. The HTTP
process detokenizes and builds outputs, so neither its event loop nor its threads ever hold the core's GIL.
If the core process dies, the pipe closes: the client fails every open request and says why, and stays dead
(/health answers 503).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import threading
import time
import traceback

from tachyon.engine.messages import EngineStats
from tachyon.engine.output_processor import OutputProcessor
from tachyon.engine.structured_output import GrammarCompiler
from tachyon.engine.validation import validate_request
from tachyon.outputs import RequestOutput
from tachyon.sampling_params import SamplingParams

logger = logging.getLogger("tachyon")


SLOW_STEP_S = 0.25  # a core step (schedule, launch, land) longer than this is logged at debug: the longest
# normal one, an 8,192-token prefill, takes ~0.17 s of device time on an H200


class EngineCoreDeadError(RuntimeError):
    """The engine core process is gone."""


def run_core_loop(core, conn, info: dict) -> None:
    """The body of the engine-core process once its core is built: say ready, then step while there is work
    and read the pipe between steps (without waiting while requests run)."""
    conn.send(("ready", info))
    idle_wait = 0.5
    while True:
        timeout = 0.0 if core.has_unfinished_requests() or core.in_flight else idle_wait
        while conn.poll(timeout):
            msg = conn.recv()
            for kind, arg in msg:
                if kind == "add":
                    core.add_request(arg)
                elif kind == "abort":
                    core.abort_request(arg)
                elif kind == "stop":
                    core.stop_sequence(arg)
                elif kind == "shutdown":
                    core.shutdown()
                    return
            timeout = 0.0
        core.check_runner()  # a dead tensor-parallel worker stops the core even while it is idle
        if core.has_unfinished_requests() or core.in_flight:
            t0 = time.perf_counter()
            outputs = core.step()
            if (took := time.perf_counter() - t0) > SLOW_STEP_S:
                logger.debug("a core step took %.0f ms (%d steps in flight after it, %d outputs)", took * 1e3,
                             len(core.in_flight), len(outputs))
            if outputs:
                conn.send(("out", outputs, core.stats()))


def freeze_heap() -> None:
    """After start-up: what it built (model, tokenizer, graphs, the imported libraries) lives as long as the process,
    so it goes out of the collector's sight, and a full collection mid-run scans only what requests allocate
    (the longest collection of an in-process Poisson run took 189 ms: benchmarks/results/h200/session_20261207c)."""
    gc.collect()
    gc.freeze()


def log_slow_collections(threshold_s: float = 0.02):
    """Log (debug) each garbage collection of this process that takes over threshold_s: a stall that every open
    stream sees. Returns the gc callback (gc.callbacks.remove takes it off)."""
    started: dict[str, float] = {}

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started and (took := time.perf_counter() - started.pop("t")) > threshold_s:
            logger.debug("gc: a generation %d collection took %.1f ms (%d collected)", info.get("generation", -1),
                         took * 1e3, info.get("collected", 0))

    gc.callbacks.append(callback)
    return callback


def watch_compiles() -> bool:
    """From now on, log (warning) every Triton kernel variant this process compiles or loads from the disk cache:
    after start-up each one is a stall of the step that launches it (0.1-1 s for a compile), and a sign that a
    warm-up missed a specialization. Returns whether Triton offers the hooks."""
    try:
        from triton import knobs
    except ImportError:
        return False
    started: dict[str, float] = {}

    def before(*, key, **_) -> bool:
        started[str(key)] = time.perf_counter()
        return False  # (True would skip the compile)

    def after(*, key, repr, compile=None, **_) -> None:
        t0 = started.pop(str(key), None)
        took = "" if t0 is None else f" in {(time.perf_counter() - t0) * 1e3:.0f} ms"
        logger.warning("Triton compiled a kernel variant while serving%s (the step that launched it waited): %s",
                       took, _variant(repr, compile))

    knobs.runtime.jit_cache_hook = before
    knobs.runtime.jit_post_compile_hook = after
    return True


def _variant(repr: str, compile: dict | None) -> str:
    """A compiled variant in words: the kernel and launch options (Triton's repr, up to its argument list), then
    what it was specialized on: each argument's type, the constexprs' values and the attributes Triton inferred
    from the values (an int's divisibility by 16, a pointer's alignment), which name the class that missed."""
    head = repr.split("](", 1)[0] + "]" if "](" in repr else repr
    if not compile:
        return head
    try:
        sig = compile["signature"]  # name -> type; constexprs and attributes are keyed by (argument position,)
        consts = compile.get("constants") or {}
        names = list(sig)
        args = [f"{name}={consts[(i,)]}" if (i,) in consts else f"{name}: {ty}"
                for i, (name, ty) in enumerate(sig.items())]
        attrs = {names[path[0]]: kv for path, kv in (compile.get("configs") or [{}])[0].items()}
        return f"{head}({', '.join(args)}) attributes {attrs}"
    except Exception as e:  # a Triton whose hook payload differs: the repr alone
        return f"{head} (its specialization unreadable: {type(e).__name__})"


def core_process_main(build_core, args, conn, log_level: int = logging.WARNING) -> None:
    """Process entry: build the core with build_core(args) -> (core, info), then loop. A failure to build is
    sent to the parent; a device fault ends the process (the parent sees the pipe close). The process logs at
    the parent's level (a spawned child starts with no logging set up), its records marked [core]."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s[core]: %(message)s")
    try:
        core, info = build_core(args)
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    freeze_heap()
    log_slow_collections()
    watch_compiles()
    try:
        import torch

        with torch.inference_mode():
            run_core_loop(core, conn, info)
    except BaseException as e:
        logger.exception("the engine core stopped")
        try:
            conn.send(("dead", f"{type(e).__name__}: {e}"))
        except Exception:
            pass
        raise SystemExit(1) from None


class MPEngineClient:
    """The front end of an engine core that runs in a child process; the same surface as LLMEngine
    (add_request, abort_request, step, stats, validate), so AsyncEngine runs either."""

    def __init__(self, build_core, args, tokenizer, startup_timeout: float = 1800.0):
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        self._conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=core_process_main, daemon=True, name="tachyon-engine-core",
                                   args=(build_core, args, child, logger.getEffectiveLevel()))
        t0 = time.perf_counter()
        self.process.start()
        child.close()
        self._send_lock = threading.Lock()
        self.tokenizer = tokenizer
        self.processor = OutputProcessor(tokenizer)
        self.grammars: GrammarCompiler | None = None  # made once the core's config is known
        self.error: str | None = None
        self._unread: tuple | None = None  # a message check_alive read from a dead core, for step
        deadline = time.monotonic() + startup_timeout
        while not self._conn.poll(0.5):
            if not self.process.is_alive():
                raise RuntimeError(f"the engine core process exited during start-up (exit code "
                                   f"{self.process.exitcode})")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"the engine core did not start within {startup_timeout:.0f}s")
        kind, info = self._conn.recv()
        if kind == "error":
            self.process.join(timeout=10)
            raise RuntimeError(f"the engine core failed to start: {info}")
        self.config = info["config"]
        self.num_kv_blocks = info["num_kv_blocks"]
        self.grammars = GrammarCompiler(tokenizer, self.config.model.vocab_size, self.config.model.eos_token_ids)
        self.info = info
        self.startup_time_s = time.perf_counter() - t0
        self._stats = EngineStats(num_kv_blocks=self.num_kv_blocks, block_size=self.config.cache.block_size)
        self._added_since_stats = 0

    # -- requests ---------------------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        return validate_request(self.config, self.num_kv_blocks, prompt_token_ids, params, self.grammars)

    def _send(self, msgs: list[tuple]) -> None:
        if self.error is not None:
            raise EngineCoreDeadError(self.error)
        try:
            with self._send_lock:
                self._conn.send(msgs)
        except (OSError, EOFError, ValueError) as e:
            self._dead(f"the engine core process is gone ({e})")
            raise EngineCoreDeadError(self.error) from None

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float | None = None, stream: bool = True) -> None:
        params.verify()
        max_tokens = self.validate(prompt_token_ids, params)
        req = self.processor.admit(max_tokens, request_id, prompt, prompt_token_ids, params, arrival_time, stream)
        try:
            self._send([("add", req)])
        except BaseException:
            self.processor.states.pop(request_id, None)
            raise
        self._added_since_stats += 1

    def abort_request(self, request_id: str) -> None:
        try:
            self._send([("abort", request_id)])
        except EngineCoreDeadError:
            pass

    @property
    def num_waiting(self) -> int:
        return self._stats.num_waiting + self._added_since_stats

    def has_unfinished_requests(self) -> bool:
        return self.processor.has_unfinished_requests()

    def request_ids(self) -> list[str]:
        return list(self.processor.states)

    def stats(self) -> EngineStats:
        return self._stats

    @property
    def num_failed_requests(self) -> int:
        return self._stats.num_failed_requests + self.processor.num_failed_requests

    # -- outputs (one reader thread) ------------------------------------------------------------------------
    def step(self, timeout: float = 0.1) -> list[RequestOutput]:
        """The outputs of the core's next step (waits up to timeout). Raises EngineCoreDeadError once the
        core is gone (after handing out one last error output for every open request: see fail_open)."""
        self.check_alive()
        try:
            if self._unread is not None:
                msg, self._unread = self._unread, None
            elif not self._conn.poll(timeout):
                return []
            else:
                msg = self._conn.recv()
        except (EOFError, OSError) as e:
            self._dead(f"the engine core process exited (exit code {self._exitcode()}): {e or 'pipe closed'}")
            raise EngineCoreDeadError(self.error) from None
        kind = msg[0]
        if kind == "dead":
            self._dead(f"the engine core stopped: {msg[1]}")
            raise EngineCoreDeadError(self.error)
        _, core_outputs, stats = msg
        self._stats = stats
        self._added_since_stats = 0
        outputs, stops, aborts = self.processor.process(core_outputs)
        if stops or aborts:
            try:
                self._send([("stop", s) for s in stops] + [("abort", r) for r in aborts])
            except EngineCoreDeadError:
                pass
        return outputs

    def check_alive(self) -> None:
        if self.error is not None:
            raise EngineCoreDeadError(self.error)
        if self.process.is_alive():
            return
        if self._unread is None and self._conn.poll(0):  # its last words (read here too while no request runs)
            try:
                self._unread = self._conn.recv()
            except (EOFError, OSError):
                pass
        if self._unread is None:
            self._dead(f"the engine core process exited (exit code {self._exitcode()})")
            raise EngineCoreDeadError(self.error)
        if self._unread[0] == "dead":
            self._dead(f"the engine core stopped: {self._unread[1]}")
            raise EngineCoreDeadError(self.error)

    def fail_open(self) -> list[RequestOutput]:
        """Error outputs for every open request (after the core died)."""
        return self.processor.abort_all(self.error or "the engine core is gone")

    def _exitcode(self):
        self.process.join(timeout=1.0)
        return self.process.exitcode

    def _dead(self, why: str) -> None:
        if self.error is None:
            self.error = why
            logger.error("%s", why)

    def shutdown(self, timeout: float = 30.0) -> None:
        try:
            self._send([("shutdown", None)])
        except EngineCoreDeadError:
            pass
        self.process.join(timeout=timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self._conn.close()
