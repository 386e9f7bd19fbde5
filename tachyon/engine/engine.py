"""The step loop: schedule, run, postprocess. Requests may be added and aborted from other threads.

No request can stop the loop. What a request carries is checked before it enters (`validate`); and when
processing one request raises anyway, that request alone ends with finish_reason "error" (its blocks freed)
while the others go on:

    sampling / forward of a batch raises  ─► each sequence runs alone; those that still raise fail
    a decode run raises                   ─► the run is dropped; the next step is an ordinary one (above)
    detokenizing / stop checks / output   ─► the request it was for fails
    anything the engine cannot pin on one request (the scheduler itself)  ─► every live request fails

Only a fault of the device (a CUDA error: the context is gone) propagates out of `step`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from tachyon.config import EngineConfig
from tachyon.engine.detokenizer import IncrementalDetokenizer
from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.request import Request, RequestStatus
from tachyon.engine.scheduler import Scheduler, SchedulerOutput
from tachyon.outputs import CompletionOutput, RequestMetrics, RequestOutput
from tachyon.sampling_params import InvalidRequestError, SamplingParams

logger = logging.getLogger("tachyon")

_DEVICE_FAULTS = ("CUDA error", "device-side assert", "illegal memory access", "CUBLAS_STATUS", "cuDNN error",
                  "NCCL error", "unspecified launch failure")


def is_device_fault(e: BaseException) -> bool:
    """Whether an exception means the device itself failed (then nothing on it can be trusted any more)."""
    accel = getattr(torch, "AcceleratorError", None)
    if accel is not None and isinstance(e, accel):
        return True
    return isinstance(e, RuntimeError) and not isinstance(e, torch.OutOfMemoryError) and any(
        m in str(e) for m in _DEVICE_FAULTS)


@dataclass
class _Group:
    """A user request: its n sequences and what the user sent."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Request]
    metrics: RequestMetrics
    sampling_params: SamplingParams
    stream: bool = True  # an output every step it gets a token; else only when it finishes


class LLMEngine:
    def __init__(self, config: EngineConfig, tokenizer, runner, num_blocks: int):
        self.config = config
        self.tokenizer = tokenizer
        self.runner = runner
        self.kv = KVCacheManager(num_blocks, config.cache.block_size, config.cache.enable_prefix_caching)
        swapper = None
        if config.cache.swap_space_gib > 0:
            from tachyon.engine.swap import SwapSpace

            swapper = SwapSpace.create(runner, config.cache.swap_space_gib)
        self.scheduler = Scheduler(config.scheduler, self.kv, swapper)
        self.groups: dict[str, _Group] = {}
        self._incoming: deque[_Group] = deque()
        self._aborts: deque[str] = deque()
        self._lock = threading.Lock()
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0, "steps": 0}
        self._run = None  # a decode run in flight (tachyon.worker.decode_run.DecodeRun)
        self._run_ahead_ok = True  # False after a decode run raised, until an ordinary step succeeds
        self.num_failed_requests = 0

    # -- requests ---------------------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Check a request before it enters the engine (InvalidRequestError naming the field); returns its
        resolved max_tokens. With SamplingParams.verify, whatever passes can neither break a step nor hold
        more than its share of the engine."""
        cfg = self.config
        max_len = cfg.scheduler.max_model_len
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty: give at least one token of text", "prompt")
        if n >= max_len:
            raise InvalidRequestError(f"the prompt has {n} tokens; this model's context is {max_len} tokens "
                                      f"(prompt + output): shorten the prompt", "prompt")
        vocab = cfg.model.vocab_size
        bad = [t for t in prompt_token_ids if type(t) is not int or not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "prompt")
        if params.n > cfg.max_n:
            raise InvalidRequestError(f"n={params.n} is more than the {cfg.max_n} sequences a request may ask "
                                      f"for (--max-n)", "n")
        if params.logprobs is not None and params.logprobs > cfg.max_logprobs:
            raise InvalidRequestError(f"logprobs={params.logprobs} is more than the {cfg.max_logprobs} top "
                                      f"logprobs a request may ask for (--max-logprobs)", "logprobs")
        bad = [t for t in params.stop_token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"stop_token_ids {bad[:5]} are outside the vocabulary [0, {vocab})",
                                      "stop_token_ids")
        max_tokens = params.max_tokens if params.max_tokens is not None else max_len - n
        if n + max_tokens > max_len:
            raise InvalidRequestError(
                f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds the model's context "
                f"of {max_len} tokens: lower max_tokens to at most {max_len - n}", "max_tokens")
        blocks_needed = self.kv.blocks_needed(n + max_tokens)
        if blocks_needed > self.kv.num_blocks:
            raise InvalidRequestError(f"this request needs {blocks_needed} KV blocks but the cache has "
                                      f"{self.kv.num_blocks}: lower max_tokens or give the KV cache more memory",
                                      "max_tokens")
        return max_tokens

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float | None = None, stream: bool = True) -> None:
        params.verify()
        max_tokens = self.validate(prompt_token_ids, params)
        if request_id in self.groups:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        now = arrival_time if arrival_time is not None else time.monotonic()
        eos = frozenset(self.config.model.eos_token_ids)
        seqs = []
        for i in range(params.n):
            sp = params
            seq = Request(
                request_id=request_id if params.n == 1 else f"{request_id}#{i}", group_id=request_id, index=i,
                prompt_token_ids=list(prompt_token_ids), sampling_params=sp, max_tokens=max_tokens,
                eos_token_ids=eos, metrics=RequestMetrics(arrival_time=now))
            if sp.seed is not None:
                seq.generator = self.runner.sampler.request_generator(sp.seed + i)
            seq.detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, sp.skip_special_tokens,
                                               sp.stop_strings, sp.include_stop_str_in_output)
            seqs.append(seq)
        seqs[0].pending_forks = seqs[1:]
        group = _Group(request_id, prompt, list(prompt_token_ids), seqs, RequestMetrics(arrival_time=now), params,
                       stream)
        with self._lock:
            self.groups[request_id] = group
            self._incoming.append(group)

    def abort_request(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: in the scheduler's queue or not yet picked up by a step."""
        return len(self.scheduler.waiting) + len(self._incoming)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    def _drain_incoming(self) -> list[RequestOutput]:
        aborted = []
        with self._lock:
            while self._incoming:
                g = self._incoming.popleft()
                self.scheduler.add(g.seqs[0])
                self.stats["prompt_tokens"] += len(g.prompt_token_ids)
            while self._aborts:
                rid = self._aborts.popleft()
                g = self.groups.get(rid)
                if g is None:
                    continue
                for s in g.seqs:
                    self.scheduler.finish(s, RequestStatus.FINISHED_ABORTED)
                aborted.append(self._make_output(g))
                del self.groups[rid]
        return aborted

    # -- the loop ----------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs = self._drain_incoming()
        try:
            return outputs + self._step()
        except Exception as e:
            if is_device_fault(e):
                raise
            logger.exception("an engine step failed in a way no single request explains; failing every live "
                             "request, the engine goes on")
            return outputs + self._fail_all(e)

    def _step(self) -> list[RequestOutput]:
        if self._run is not None:
            return self._run_step()
        sched = self.scheduler.schedule()
        if sched.swap_out or sched.swap_in:
            self.scheduler.swapper.apply(self.runner, sched)
        if sched.is_empty:
            return []
        if self._run_ahead_ok and self._can_run_ahead(sched):
            try:
                self._run = self.runner.start_decode_run(sched)
                self._top_up(self._run)
            except Exception as e:
                self._drop_run(e)  # nothing was consumed: the next step runs these rows as an ordinary one
                return []
            return self._run_step()
        touched: dict[str, _Group] = {}
        failed_outputs: list[RequestOutput] = []
        sampled = {}
        for req, token, logprobs, sampled_logprob in self._execute(sched, failed_outputs):
            sampled[req] = token
            if req.logprobs is not None:
                req.logprobs.append(logprobs)
            if sampled_logprob is not None:
                req.cumulative_logprob += sampled_logprob
        self._run_ahead_ok = True
        self._postprocess(*self.scheduler.update(sched, sampled), touched, failed_outputs)
        outputs = self._outputs(touched, failed_outputs)
        return failed_outputs + outputs

    def _execute(self, sched: SchedulerOutput, failed_outputs: list[RequestOutput]) -> list[tuple]:
        """runner.execute as rows (request, token, logprobs, sampled logprob). If the batch raises, each
        sequence runs alone and only those that still raise fail (the first attempt's KV writes are written
        again with the same values, so it leaves no trace)."""
        try:
            return _rows(*self.runner.execute(sched))
        except Exception as e:
            if is_device_fault(e):
                raise
            first = e
        logger.warning("a batch of %d sequences raised %r; running each alone to find the request at fault",
                       len(sched.seqs), first)
        rows = []
        for s in sched.seqs:
            if s.req.is_finished:  # a sibling of a request that failed earlier in this loop
                continue
            try:
                rows += _rows(*self.runner.execute(SchedulerOutput(seqs=[s])))
            except Exception as e:
                if is_device_fault(e):
                    raise
                failed_outputs.extend(self._fail(s.req.group_id, e))
        return rows

    def _outputs(self, touched: dict[str, _Group], failed_outputs: list[RequestOutput]) -> list[RequestOutput]:
        outputs = []
        for g in touched.values():
            if g.request_id not in self.groups:  # failed (or aborted) during this step
                continue
            try:
                if g.metrics.first_token_time is None:
                    g.metrics.first_token_time = min(s.metrics.first_token_time or float("inf") for s in g.seqs)
                done = g.seqs[0].is_finished if len(g.seqs) == 1 else all(s.is_finished for s in g.seqs)
                if done:
                    g.metrics.finished_time = max(s.metrics.finished_time or 0.0 for s in g.seqs)
                if done or g.stream:
                    outputs.append(self._make_output(g, done))
                if done:
                    del self.groups[g.request_id]
            except Exception as e:
                failed_outputs.extend(self._fail(g.request_id, e))
        return outputs

    # -- failures: one request at a time --------------------------------------------------------------------
    def _fail(self, request_id: str, e: Exception) -> list[RequestOutput]:
        """End a request whose processing raised: finish_reason "error", blocks freed, others untouched."""
        g = self.groups.pop(request_id, None)
        if g is None:
            return []
        self.num_failed_requests += 1
        error = f"{type(e).__name__}: {e}"
        logger.warning("request %s failed and was ended: %s", request_id, error)
        for s in g.seqs:
            self.scheduler.finish(s, RequestStatus.FINISHED_ERROR)
        comps = []  # not _make_output: what raised may be the detokenizer it reads
        for s in g.seqs:
            try:
                text = s.detok.safe_text(True)
            except Exception:
                text = ""
            comps.append(CompletionOutput(index=s.index, text=text, token_ids=s.output_token_ids,
                                          finish_reason=s.status.value))
        g.metrics.finished_time = time.monotonic()
        return [RequestOutput(request_id=g.request_id, prompt=g.prompt, prompt_token_ids=g.prompt_token_ids,
                              outputs=comps, finished=True, metrics=g.metrics, error=error)]

    def _fail_all(self, e: Exception) -> list[RequestOutput]:
        self._run = None
        outputs = []
        for rid in list(self.groups):
            outputs += self._fail(rid, e)
        return outputs

    def _drop_run(self, e: Exception) -> None:
        """A decode run raised: forget it (steps still queued only write KV slots past what the host counts,
        which the next step writes again); ordinary steps until one succeeds, so a culprit is found there."""
        if is_device_fault(e):
            raise e
        logger.warning("a decode run raised %r; going on with ordinary steps", e)
        self._run = None
        self._run_ahead_ok = False

    # -- decode runs: forwards queued on the device ahead of the host -----------------------------------------
    def _admissible(self) -> bool:
        """Someone waits and the batch has room: the next step should be an ordinary one that admits it."""
        sch = self.scheduler
        return bool(sch.waiting or self._incoming) and len(sch.running) < self.config.scheduler.max_num_seqs

    def _can_run_ahead(self, sched) -> bool:
        """Whether this step may start a decode run: every running sequence decodes with plain sampling
        (ids alone; no penalties, logprobs or pending min_tokens), and nobody waiting could be admitted."""
        sch = self.scheduler
        if (self.config.scheduler.num_scheduler_steps <= 1 or sched.preempted or sched.swap_in
                or len(sched.seqs) != len(sch.running) or self._admissible()
                or not hasattr(self.runner, "start_decode_run")):
            return False
        max_len = self.config.scheduler.max_model_len
        needs_history = self.runner.sampler.needs_history
        more = False
        for s in sched.seqs:
            r = s.req
            if s.num_new_tokens != 1 or not s.sample or r.pending_forks or needs_history(r):
                return False
            more = more or min(r.max_tokens - r.num_output_tokens, max_len - r.num_tokens) > 1
        return more  # a batch whose every sequence ends with this token gains nothing from a run

    def _top_up(self, run) -> None:
        """Queue steps until num_scheduler_steps are in flight, unless the run should end: someone can be
        admitted, no live row is left, the batch has thinned out, or the KV pool has no block for a row."""
        depth = self.config.scheduler.num_scheduler_steps
        while not run.stopped and run.in_flight < depth:
            live = run.live_rows()
            n = int(live.sum())
            # the first step is queued whatever arrived since the run was decided (add_request runs on other
            # threads), so a run always has a step to consume
            if (run.launched and self._admissible()) or n == 0 or not run.worth_running(n):
                run.stopped = True
                return
            rows = run.rows_needing_blocks(live)
            if len(rows):
                ahead = run.launched - run.consumed + 1  # tokens from the host's count to this step's slot
                for i in rows:
                    if not self.kv.allocate(run.reqs[i], ahead):
                        run.stopped = True  # the next ordinary step preempts as it must
                        run.note_blocks(rows)
                        return
                run.note_blocks(rows)
            run.launch(live)

    def _run_step(self) -> list[RequestOutput]:
        """Consume the run's oldest step as an ordinary step would (stops cut a sequence off exactly there),
        queue more, and return this token's outputs."""
        run = self._run
        try:
            ids = run.next_ids()
        except Exception as e:
            self._drop_run(e)
            return []
        touched: dict[str, _Group] = {}
        failed_outputs: list[RequestOutput] = []
        self._postprocess(*self.scheduler.update(run.sched, dict(zip(run.reqs, ids, strict=True))), touched,
                          failed_outputs)
        try:
            self._top_up(run)
        except Exception as e:
            self._drop_run(e)
        if self._run is not None and (run.in_flight == 0 or all(r.is_finished for r in run.reqs)):
            self._run = None  # steps still queued only compute dead rows: nobody needs their ids
        outputs = self._outputs(touched, failed_outputs)
        return failed_outputs + outputs

    def _postprocess(self, got: list[Request], failed: list[tuple[Request, Exception]], touched: dict[str, _Group],
                     failed_outputs: list[RequestOutput]) -> None:
        """Detokenize the new tokens, apply stop strings, note which user requests changed; a request whose
        update or text raised fails alone."""
        self.stats["steps"] += 1
        self.stats["generation_tokens"] += len(got)
        has_text = self.tokenizer is not None
        for req in got:
            if has_text:
                try:
                    new = req.detok.add_token(req.token_ids[-1])
                    if not req.is_finished and req.num_output_tokens >= req.sampling_params.min_tokens:
                        hit = req.detok.find_stop(len(new))
                        if hit is not None:
                            req.stop_reason = hit
                            self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
                except Exception as e:
                    failed.append((req, e))
                    continue
            g = self.groups.get(req.group_id)
            if g is not None:
                touched[g.request_id] = g
        for req, e in failed:
            failed_outputs.extend(self._fail(req.group_id, e))

    def _make_output(self, g: _Group, finished: bool | None = None) -> RequestOutput:
        comps = []
        for s in g.seqs:
            comps.append(CompletionOutput(
                index=s.index, text=s.detok.safe_text(s.is_finished), token_ids=s.output_token_ids,  # a fresh list
                cumulative_logprob=s.cumulative_logprob if s.logprobs is not None else None,
                logprobs=list(s.logprobs) if s.logprobs is not None else None,
                finish_reason=s.status.value if s.is_finished else None, stop_reason=s.stop_reason))
        m = g.metrics
        if len(g.seqs) == 1:
            sm = g.seqs[0].metrics
            m.num_preemptions, m.first_scheduled_time, m.last_token_time = (
                sm.num_preemptions, sm.first_scheduled_time, sm.last_token_time)
        else:
            m.num_preemptions = sum(s.metrics.num_preemptions for s in g.seqs)
            scheduled = [s.metrics.first_scheduled_time for s in g.seqs if s.metrics.first_scheduled_time is not None]
            m.first_scheduled_time = min(scheduled) if scheduled else None
            last = [s.metrics.last_token_time for s in g.seqs if s.metrics.last_token_time is not None]
            m.last_token_time = max(last) if last else None
        if finished is None:
            finished = all(s.is_finished for s in g.seqs)
        if finished and m.finished_time is None:  # aborted
            m.finished_time = max(s.metrics.finished_time or 0.0 for s in g.seqs) or None
        return RequestOutput(request_id=g.request_id, prompt=g.prompt, prompt_token_ids=g.prompt_token_ids,
                             outputs=comps, finished=finished, metrics=g.metrics,
                             num_cached_tokens=g.seqs[0].num_cached_tokens)

    # -- introspection -------------------------------------------------------------------------------------
    def live_requests(self) -> list[Request]:
        return list(self.scheduler.running) + list(self.scheduler.waiting)

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.live_requests())

    @torch.inference_mode()
    def run_until_done(self) -> list[RequestOutput]:
        finished = []
        while self.has_unfinished_requests():
            finished.extend(o for o in self.step() if o.finished)
        return finished


def _rows(reqs: list[Request], out) -> list[tuple]:
    """A runner result (sampled requests, SamplerOutput or None) as (request, token, logprobs, logprob) rows."""
    if out is None:
        return []
    return list(zip(reqs, out.token_ids, out.logprobs, out.sampled_logprobs, strict=True))
