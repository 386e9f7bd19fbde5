"""The scheduler: one token budget per step, no prefill or decode phase.

Every sequence has `num_computed_tokens` (its tokens with K/V in the cache) and `num_tokens` (prompt +
output). A step gives each sequence up to `num_tokens - num_computed_tokens` new tokens out of one budget
(`max_num_batched_tokens`): running sequences first (decodes and unfinished prefill chunks), then waiting
ones in arrival order. When a running sequence needs a block and none is free, the newest running
sequence is preempted: its blocks are freed and it recomputes later (or its KV is swapped out to the CPU).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from tachyon.config import SchedulerConfig
from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.request import Request, RequestStatus


@dataclass
class ScheduledSeq:
    req: Request
    num_new_tokens: int
    sample: bool  # the step computes the sequence's last known token, so a new one is sampled


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swap_out: list[tuple[Request, list[int]]] = field(default_factory=list)  # (req, device blocks) -> CPU
    swap_in: list[tuple[Request, list[int]]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, swapper=None):
        self.config = config
        self.kv = kv
        self.swapper = swapper  # tachyon.engine.swap.SwapSpace or None (recompute only)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.num_swapped_out = 0
        self.num_recomputed = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # -- one step ---------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.kv.allocate(req, n):
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is req:
                    break
            else:
                out.seqs.append(ScheduledSeq(req, n, req.num_computed_tokens + n == req.num_tokens))
                budget -= n
                i += 1
                continue
            break
        if out.preempted:
            return out
        # hashes of the blocks this step's admissions fill: a request that needs one of them next waits a step
        # and then finds it in the cache, instead of computing the same prefix twice in one step (requests that
        # arrive together with a shared system prompt)
        filling: set[int] = set()
        caching = self.kv.enable_prefix_caching
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.status == RequestStatus.SWAPPED:
                if not self.swapper.can_swap_in(req, self.kv):
                    break
                out.swap_in.append((req, self.swapper.swap_in(req, self.kv)))
            shared: list[int] = []
            looked_up = req.num_computed_tokens == 0 and not req.block_ids
            if looked_up:
                shared = self.kv.find_cached_prefix(req, count=False)
                nxt = len(shared)
                if filling and nxt < len(req.block_hashes) and req.block_hashes[nxt] in filling:
                    break
            n = min(req.num_tokens - req.num_computed_tokens - len(shared) * self.kv.block_size, budget)
            if not self.kv.allocate(req, n, shared):
                break
            if looked_up:
                self.kv.count_prefix_query(req.num_tokens, len(shared) * self.kv.block_size)
                if req.num_output_tokens == 0:
                    req.num_cached_tokens = len(shared) * self.kv.block_size
            if caching:
                bs = self.kv.block_size
                first = req.num_computed_tokens // bs
                filling.update(req.block_hashes[first:min((req.num_computed_tokens + n) // bs, len(req.block_hashes))])
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = time.monotonic()
            self.running.append(req)
            out.seqs.append(ScheduledSeq(req, n, req.num_computed_tokens + n == req.num_tokens))
            budget -= n
        return out

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.num_preemptions += 1
        req.metrics.num_preemptions += 1
        out.preempted.append(req)
        if self.swapper is not None and self.swapper.should_swap(req, self.kv):
            out.swap_out.append((req, self.swapper.swap_out(req, self.kv)))
            req.status = RequestStatus.SWAPPED
            self.num_swapped_out += 1
        else:
            self.kv.free(req)
            req.num_computed_tokens = 0
            req.status = RequestStatus.PREEMPTED
            self.num_recomputed += 1
        self.waiting.appendleft(req)

    def update(self, out: SchedulerOutput, sampled: dict[Request, int]
               ) -> tuple[list[Request], list[tuple[Request, Exception]]]:
        """Advance computed-token counts, append sampled tokens, stop finished sequences. Returns those that
        got a new token this step, and those whose update raised (the engine fails them; the rest go on)."""
        now = time.monotonic()
        got_token, failed = [], []
        for s in out.seqs:
            req = s.req
            req.num_computed_tokens += s.num_new_tokens
            if req.is_finished:  # aborted (or failed) while the step ran
                continue
            try:
                if req.num_computed_tokens >= (req.num_registered_blocks + 1) * self.kv.block_size:
                    self.kv.cache_computed_blocks(req)  # a block just filled up
                if not s.sample:
                    continue
                token = sampled[req]
                req.append_token(token)
                if req.metrics.first_token_time is None:
                    req.metrics.first_token_time = now
                req.metrics.last_token_time = now
                if req.pending_forks:
                    self._fork(req)
                got_token.append(req)
                self._check_token_stop(req, token)
            except Exception as e:
                failed.append((req, e))
        return got_token, failed

    def _check_token_stop(self, req: Request, token: int) -> None:
        sp = req.sampling_params
        n_out = len(req.token_ids) - len(req.prompt_token_ids)
        if n_out >= sp.min_tokens:
            if not sp.ignore_eos and token in req.eos_token_ids:
                return self.finish(req, RequestStatus.FINISHED_STOPPED)
            if token in sp.stop_token_ids:
                req.stop_reason = token
                return self.finish(req, RequestStatus.FINISHED_STOPPED)
        if n_out >= req.max_tokens or len(req.token_ids) >= self.config.max_model_len:
            self.finish(req, RequestStatus.FINISHED_LENGTH)

    def _fork(self, parent: Request) -> None:
        """n > 1: the siblings share the parent's full prompt blocks and compute only the rest."""
        bs = self.kv.block_size
        shared = parent.block_ids[: (parent.num_prompt_tokens - 1) // bs]
        for child in parent.pending_forks:
            for b in shared:
                self.kv.pool.touch(b)
            child.block_ids = list(shared)
            child.block_hashes = parent.block_hashes[: len(shared)]
            child.num_registered_blocks = len(shared)
            child.num_computed_tokens = len(shared) * bs
            child.num_cached_tokens = parent.num_cached_tokens
        self.waiting.extendleft(reversed(parent.pending_forks))
        parent.pending_forks = []

    def finish(self, req: Request, status: RequestStatus) -> None:
        if req.is_finished:
            return
        req.status = status
        req.is_finished = True
        req.metrics.finished_time = time.monotonic()
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        if self.swapper is not None:
            self.swapper.discard(req)
        self.kv.free(req)
        for child in req.pending_forks:  # never started (the group was aborted): they end with their parent
            child.status = RequestStatus.FINISHED_ABORTED
            child.is_finished = True
            child.metrics.finished_time = req.metrics.finished_time
        req.pending_forks = []
