"""The step loop: schedule, run, postprocess. Requests may be added and aborted from other threads."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from tachyon.config import EngineConfig
from tachyon.engine.detokenizer import IncrementalDetokenizer
from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.request import Request, RequestStatus
from tachyon.engine.scheduler import Scheduler
from tachyon.outputs import CompletionOutput, RequestMetrics, RequestOutput
from tachyon.sampling_params import SamplingParams


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

    # -- requests ---------------------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Check a request before it enters the engine; returns its resolved max_tokens."""
        max_len = self.config.scheduler.max_model_len
        n = len(prompt_token_ids)
        if n == 0:
            raise ValueError("the prompt is empty: give at least one token of text")
        vocab = self.config.model.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        if n >= max_len:
            raise ValueError(f"the prompt has {n} tokens; this model's context is {max_len} tokens "
                             f"(prompt + output): shorten the prompt")
        max_tokens = params.max_tokens if params.max_tokens is not None else max_len - n
        if n + max_tokens > max_len:
            raise ValueError(f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds the "
                             f"model's context of {max_len} tokens: lower max_tokens to at most {max_len - n}")
        blocks_needed = self.kv.blocks_needed(n + max_tokens)
        if blocks_needed > self.kv.num_blocks:
            raise ValueError(f"this request needs {blocks_needed} KV blocks but the cache has {self.kv.num_blocks}: "
                             f"lower max_tokens or give the KV cache more memory")
        return max_tokens

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, arrival_time: float | None = None, stream: bool = True) -> None:
        params.verify()
        max_tokens = self.validate(prompt_token_ids, params)
        if request_id in self.groups:
            raise ValueError(f"request id {request_id!r} is already in use")
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
        if self._run is not None:
            return outputs + self._run_step()
        sched = self.scheduler.schedule()
        if sched.swap_out or sched.swap_in:
            self.scheduler.swapper.apply(self.runner, sched)
        if sched.is_empty:
            return outputs
        if self._can_run_ahead(sched):
            self._run = self.runner.start_decode_run(sched)
            self._top_up(self._run)
            return outputs + self._run_step()
        touched: dict[str, _Group] = {}
        sample_reqs, sampler_out = self.runner.execute(sched)
        sampled = {}
        if sampler_out is not None:
            for i, req in enumerate(sample_reqs):
                sampled[req] = sampler_out.token_ids[i]
                if req.logprobs is not None:
                    req.logprobs.append(sampler_out.logprobs[i])
                if sampler_out.sampled_logprobs[i] is not None:
                    req.cumulative_logprob += sampler_out.sampled_logprobs[i]
        self._postprocess(self.scheduler.update(sched, sampled), touched)
        return outputs + self._outputs(touched)

    def _outputs(self, touched: dict[str, _Group]) -> list[RequestOutput]:
        outputs = []
        for g in touched.values():
            if g.metrics.first_token_time is None:
                g.metrics.first_token_time = min(s.metrics.first_token_time or float("inf") for s in g.seqs)
            done = g.seqs[0].is_finished if len(g.seqs) == 1 else all(s.is_finished for s in g.seqs)
            if done:
                g.metrics.finished_time = max(s.metrics.finished_time or 0.0 for s in g.seqs)
                del self.groups[g.request_id]
            if done or g.stream:
                outputs.append(self._make_output(g, done))
        return outputs

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
        ids = run.next_ids()
        touched: dict[str, _Group] = {}
        self._postprocess(self.scheduler.update(run.sched, dict(zip(run.reqs, ids, strict=True))), touched)
        self._top_up(run)
        if run.in_flight == 0 or all(r.is_finished for r in run.reqs):
            self._run = None  # steps still queued only compute dead rows: nobody needs their ids
        return self._outputs(touched)

    def _postprocess(self, got: list[Request], touched: dict[str, _Group]) -> None:
        """Detokenize the new tokens, apply stop strings, note which user requests changed."""
        self.stats["steps"] += 1
        self.stats["generation_tokens"] += len(got)
        has_text = self.tokenizer is not None
        for req in got:
            if has_text:
                new = req.detok.add_token(req.token_ids[-1])
                if not req.is_finished and req.num_output_tokens >= req.sampling_params.min_tokens:
                    hit = req.detok.find_stop(len(new))
                    if hit is not None:
                        req.stop_reason = hit
                        self.scheduler.finish(req, RequestStatus.FINISHED_STOPPED)
            g = self.groups.get(req.group_id)
            if g is not None:
                touched[g.request_id] = g

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
