"""The engine core: one step loop over the scheduler, the KV-cache manager and a runner.

    step():  take new requests and aborts ─► schedule ─► submit to the runner ─► collect the oldest step in
             flight once more are queued than the scheduler allows ─► per-sequence outputs

Up to `num_scheduler_steps` steps are in flight on the device at once: while it computes them, the host
collects the oldest, updates the sequences, and schedules and submits the next (a decode's input may be a
token a step in flight is still sampling; the runner takes it from the device). The scheduler decides how
many may stay in flight after each step (none when it preempts, swaps in, or a sequence's sampling reads its
own history), so there is one path for every kind of step.

No request can stop the loop. What a request carries is checked before it enters
(tachyon.engine.validation); and when processing one request raises anyway, that request alone ends with
finish_reason "error" (its blocks freed) while the others go on:

    submitting a batch raises         ─► the steps in flight land, then each sequence runs alone; those that
                                         still raise fail
    collecting a step raises          ─► the requests in that step fail
    updating one sequence raises      ─► its request fails
    anything no request explains (the scheduler itself) ─► every live request fails

Only a fault of the device (a CUDA error: the context is gone) propagates out of `step`.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, wait

import torch

from tachyon.config import EngineConfig
from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.messages import ITERATION_TOKENS_BUCKETS, EngineCoreOutput, EngineCoreRequest, EngineStats
from tachyon.engine.scheduler import Scheduler
from tachyon.engine.sequence import Sequence, SequenceGroup, SequenceStatus
from tachyon.engine.structured_output import GrammarCompiler
from tachyon.interface import ModelRunner, ModelRunnerOutput, Proposer, RunnerFault, SchedulerOutput
from tachyon.outputs import RequestMetrics

logger = logging.getLogger("tachyon")

_DEVICE_FAULTS = ("CUDA error", "device-side assert", "illegal memory access", "CUBLAS_STATUS", "cuDNN error",
                  "NCCL error", "unspecified launch failure")


def is_device_fault(e: BaseException) -> bool:
    """Whether an exception means the device itself failed (then nothing on it can be trusted any more)."""
    if isinstance(e, RunnerFault):
        return True
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(e, accel):
        return True
    return isinstance(e, RuntimeError) and not isinstance(e, torch.OutOfMemoryError) and any(
        m in str(e) for m in _DEVICE_FAULTS)


class EngineCore:
    def __init__(self, config: EngineConfig, runner: ModelRunner, num_blocks: int, num_cpu_blocks: int = 0,
                 proposer: Proposer | None = None, grammars: GrammarCompiler | None = None):
        self.config = config
        self.grammars = grammars  # structured outputs; None: such requests fail with a message saying why
        self.runner = runner
        self.kv = KVCacheManager(num_blocks, config.cache.block_size, config.cache.enable_prefix_caching,
                                 num_cpu_blocks=num_cpu_blocks)
        self.scheduler = Scheduler(config.scheduler, self.kv, proposer, config.speculative)
        self.groups: dict[str, SequenceGroup] = {}
        self.in_flight: deque[tuple[SchedulerOutput, object]] = deque()
        self._incoming: deque[EngineCoreRequest] = deque()
        self._aborts: deque[tuple[str, SequenceStatus]] = deque()  # request ids, or seq ids (stop strings)
        self._lock = threading.Lock()
        self._eos = frozenset(config.model.eos_token_ids)
        self._stats = EngineStats(num_kv_blocks=self.kv.num_blocks, block_size=self.kv.block_size)
        self._iteration_tokens = [0] * (len(ITERATION_TOKENS_BUCKETS) + 1)  # EngineStats.iteration_tokens_counts
        # requests whose grammar is compiling (in the compiler's thread): they join the scheduler when it is ready
        self._awaiting_grammar: list[tuple[SequenceGroup, Future]] = []

    # -- requests (any thread) ------------------------------------------------------------------------------
    def add_request(self, req: EngineCoreRequest) -> None:
        with self._lock:
            self._incoming.append(req)

    def abort_request(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append((request_id, SequenceStatus.FINISHED_ABORTED))

    def stop_sequence(self, seq_id: str) -> None:
        """The front end found a stop string: the sequence ends as "stop" (it already has its final output)."""
        with self._lock:
            self._aborts.append((seq_id, SequenceStatus.FINISHED_STOPPED))

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups or self._incoming)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self._incoming)

    def _make_group(self, req: EngineCoreRequest, now: float) -> SequenceGroup:
        sp = req.sampling_params
        seqs = []
        for i in range(sp.n):
            seq = Sequence(
                seq_id=req.request_id if sp.n == 1 else f"{req.request_id}#{i}", request_id=req.request_id, index=i,
                prompt_token_ids=list(req.prompt_token_ids), sampling_params=sp, max_tokens=req.max_tokens,
                eos_token_ids=self._eos, metrics=RequestMetrics(arrival_time=req.arrival_time, queued_time=now))
            if sp.seed is not None:
                seq.generator = self.runner.request_generator(sp.seed + i)
            seqs.append(seq)
        seqs[0].pending_forks = seqs[1:]
        return SequenceGroup(req.request_id, seqs)

    def _drain_inbox(self) -> list[EngineCoreOutput]:
        outputs = []
        with self._lock:
            incoming, self._incoming = self._incoming, deque()
            aborts, self._aborts = self._aborts, deque()
        now = time.monotonic()
        for req in incoming:
            if req.request_id in self.groups:
                logger.warning("request id %r is already running; the second one is dropped", req.request_id)
                continue
            try:
                g = self._make_group(req, now)
            except Exception as e:  # a seed the generator refuses, say: this request alone
                outputs += [EngineCoreOutput(req.request_id, i, [], finish_reason="error",
                                             error=f"{type(e).__name__}: {e}") for i in range(req.sampling_params.n)]
                continue
            self.groups[req.request_id] = g
            self._stats.prompt_tokens += len(req.prompt_token_ids)
            spec = req.sampling_params.structured_outputs
            if spec is None:
                self.scheduler.add(g.seqs[0])
            elif self.grammars is None:
                outputs += self._fail(req.request_id, ValueError("this engine core has no grammar compiler "
                                                                 "(structured outputs)"))
            else:
                self._awaiting_grammar.append((g, self.grammars.compile_async(spec)))
        for key, status in aborts:
            rid, _, index = key.partition("#")
            g = self.groups.get(rid)
            if g is None:
                continue
            seqs = g.seqs if not index else [s for s in g.seqs if s.seq_id == key]
            live = [s for s in g.seqs if not s.is_finished]
            for s in seqs:
                self.scheduler.finish(s, status)  # an unstarted sibling ends with its parent, as "abort"
            if status == SequenceStatus.FINISHED_ABORTED or len(seqs) < len(live):
                outputs += [self._output(s, []) for s in live if s.status == SequenceStatus.FINISHED_ABORTED]
            if all(s.is_finished for s in g.seqs):
                del self.groups[rid]
        return outputs + self._admit_compiled()

    def _admit_compiled(self) -> list[EngineCoreOutput]:
        """Requests whose grammar is ready enter the scheduler, each sequence with its own matcher."""
        outputs, still = [], []
        for g, future in self._awaiting_grammar:
            if g.seqs[0].is_finished:  # aborted while it compiled
                continue
            if not future.done():
                still.append((g, future))
                continue
            try:
                compiled = future.result()
                for s in g.seqs:
                    s.grammar = self.grammars.matcher(compiled)
            except Exception as e:
                outputs += self._fail(g.request_id, e)
                continue
            self.scheduler.add(g.seqs[0])
        self._awaiting_grammar = still
        if still and not self.scheduler.num_unfinished and not self.in_flight:
            wait([still[0][1]], timeout=0.005)  # nothing else to do: no busy loop while it compiles
        return outputs

    def check_runner(self) -> None:
        """RunnerFault if the runner cannot go on (a tensor-parallel worker died), also while no request runs."""
        fault = getattr(self.runner, "fault", None)
        if fault is not None:
            raise RunnerFault(fault)

    def shutdown(self) -> None:
        """Let the runner's tensor-parallel workers go."""
        stop = getattr(self.runner, "shutdown", None)
        if stop is not None:
            stop()

    # -- the loop ----------------------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        outputs = self._drain_inbox()
        try:
            return outputs + self._step()
        except Exception as e:
            if is_device_fault(e):
                raise
            logger.exception("an engine step failed in a way no single request explains; failing every live "
                             "request, the engine goes on")
            return outputs + self._fail_all(e)

    def _step(self) -> list[EngineCoreOutput]:
        outputs: list[EngineCoreOutput] = []
        sched = self.scheduler.schedule(len(self.in_flight))
        if sched.seqs:
            outputs += self._submit(sched)
        # nothing new to queue (or the scheduler waits for the host): land one step per call, so each token
        # still reaches its stream at its own step
        limit = sched.max_in_flight if sched.seqs else max(0, len(self.in_flight) - 1)
        while len(self.in_flight) > limit:
            outputs += self._collect_oldest()
        if self.in_flight:  # a step whose sampling waited for the ones before it: they have landed
            outputs += self._sample_deferred()
        return outputs

    def _sample_deferred(self) -> list[EngineCoreOutput]:
        """Queue the oldest step's deferred sampling (SchedulerOutput.defer_sampling); if it raises, that step's
        requests fail as a step that cannot be collected does."""
        sched, handle = self.in_flight[0]
        try:
            self.runner.sample_deferred(handle)
            return []
        except Exception as e:
            if is_device_fault(e):
                raise
            self.in_flight.popleft()
            self.runner.collect(handle)  # off the runner's queue too (nothing was sampled: it returns at once)
            return self._fail_step(sched, e)

    def _fail_step(self, sched: SchedulerOutput, e: Exception) -> list[EngineCoreOutput]:
        """A step's tokens are lost: every request with a sequence in it fails."""
        outputs = []
        for rid in dict.fromkeys(s.seq.request_id for s in sched.seqs):
            outputs += self._fail(rid, e)
        return outputs

    def _submit(self, sched: SchedulerOutput) -> list[EngineCoreOutput]:
        """Queue the step. If the batch raises, the steps in flight land and each sequence runs alone; only
        those that still raise fail (a KV write the first attempt made is made again with the same values)."""
        try:
            self.in_flight.append((sched, self.runner.submit(sched)))
            return []
        except Exception as e:
            if is_device_fault(e):
                raise
            first = e
        logger.warning("a batch of %d sequences raised %r; running each alone to find the request at fault",
                       len(sched.seqs), first)
        outputs = []
        while self.in_flight:
            outputs += self._collect_oldest()
        for s in sched.seqs:
            if s.seq.is_finished:  # a sibling of a request that failed earlier in this loop, or just stopped
                continue
            one = SchedulerOutput(seqs=[s])
            try:
                result = self.runner.collect(self.runner.submit(one))
            except Exception as e:
                if is_device_fault(e):
                    raise
                outputs += self._fail(s.seq.request_id, e)
                continue
            outputs += self._finish_step(one, result)
        return outputs

    def _collect_oldest(self) -> list[EngineCoreOutput]:
        sched, handle = self.in_flight.popleft()
        try:
            self.runner.sample_deferred(handle)  # the steps before it landed; a no-op for most steps
            result = self.runner.collect(handle)
        except Exception as e:
            if is_device_fault(e):
                raise
            return self._fail_step(sched, e)
        return self._finish_step(sched, result)

    def _finish_step(self, sched: SchedulerOutput, result: ModelRunnerOutput | None) -> list[EngineCoreOutput]:
        if result is not None and result.prompt_logprobs:
            self._record_prompt_logprobs(result.prompt_logprobs)
        got, failed = self.scheduler.update(sched, result)
        self._stats.num_steps += 1
        self._iteration_tokens[bisect.bisect_left(ITERATION_TOKENS_BUCKETS, sched.num_tokens)] += 1
        self._stats.iteration_tokens_sum += sched.num_tokens
        outputs = []
        for seq, tokens, row in got:
            self._stats.generation_tokens += len(tokens)
            lp = result.logprobs[row]  # none for rows that verified proposals (tachyon.engine.scheduler.may_speculate)
            out = self._output(seq, tokens, None if lp is None else [lp],
                               None if lp is None else [result.sampled_logprobs[row]])
            if lp is not None and result.sampled_ranks is not None:
                out.new_sampled_ranks = [result.sampled_ranks[row]]
            if (seq.sampling_params.prompt_logprobs is not None and seq.index == 0
                    and len(seq.token_ids) - len(tokens) == seq.num_prompt_tokens):  # its first output
                out.prompt_logprobs, out.prompt_ranks = seq.prompt_logprobs, seq.prompt_ranks
            outputs.append(out)
        for seq, e in failed:
            outputs += self._fail(seq.request_id, e)
        for seq, _, _ in got:
            if seq.is_finished:
                g = self.groups.get(seq.request_id)
                if g is not None and all(s.is_finished for s in g.seqs):
                    del self.groups[seq.request_id]
        return outputs

    @staticmethod
    def _record_prompt_logprobs(reported: list) -> None:
        """A step's prompt logprobs onto their sequences, each position once (a prompt recomputed after a
        preemption reports its positions again)."""
        for seq, first, entries, ranks in reported:
            have = len(seq.prompt_logprobs)
            if seq.is_finished or first > have:
                continue
            seq.prompt_logprobs += entries[have - first:]
            seq.prompt_ranks += ranks[have - first:]

    def _output(self, seq: Sequence, tokens: list[int], logprobs=None, sampled=None) -> EngineCoreOutput:
        m = seq.metrics
        return EngineCoreOutput(
            seq.request_id, seq.index, tokens, logprobs, sampled,
            finish_reason=seq.status.value if seq.is_finished else None, stop_reason=seq.stop_reason,
            num_cached_tokens=seq.num_cached_tokens, queued_time=m.queued_time,
            first_scheduled_time=m.first_scheduled_time,
            token_time=m.last_token_time, finished_time=m.finished_time, num_preemptions=m.num_preemptions)

    # -- failures: one request at a time --------------------------------------------------------------------
    def _fail(self, request_id: str, e: Exception) -> list[EngineCoreOutput]:
        """End a request whose processing raised: finish_reason "error", blocks freed, others untouched."""
        g = self.groups.pop(request_id, None)
        if g is None:
            return []
        self._stats.num_failed_requests += 1
        error = f"{type(e).__name__}: {e}"
        logger.warning("request %s failed and was ended: %s", request_id, error)
        outputs = []
        for s in g.seqs:
            self.scheduler.finish(s, SequenceStatus.FINISHED_ERROR)
            out = self._output(s, [])
            out.finish_reason, out.error = "error", error
            outputs.append(out)
        return outputs

    def _fail_all(self, e: Exception) -> list[EngineCoreOutput]:
        self.in_flight.clear()
        self.runner.drop_in_flight()
        outputs = []
        for rid in list(self.groups):
            outputs += self._fail(rid, e)
        return outputs

    # -- introspection -------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        s, sch, kv = self._stats, self.scheduler, self.kv
        s.num_running, s.num_waiting = len(sch.running), self.num_waiting
        s.kv_cache_usage = kv.usage
        s.prefix_cache_queries, s.prefix_cache_hits = kv.prefix_queries, kv.prefix_hits
        s.num_preemptions, s.num_swapped_out, s.num_recomputed = (sch.num_preemptions, sch.num_swapped_out,
                                                                   sch.num_recomputed)
        s.spec_num_drafts, s.spec_num_draft_tokens = sch.spec_num_drafts, sch.spec_num_draft_tokens
        s.spec_num_accepted_tokens, s.spec_accepted_per_pos = (sch.spec_num_accepted_tokens,
                                                               tuple(sch.spec_accepted_per_pos))
        s.iteration_tokens_counts = tuple(self._iteration_tokens)
        return EngineStats(*(getattr(s, f) for f in EngineStats.__slots__))

    def live_sequences(self) -> list[Sequence]:
        return list(self.scheduler.running) + list(self.scheduler.waiting)

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.live_sequences())
