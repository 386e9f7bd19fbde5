"""The scheduler: one token budget per step, no prefill or decode phase, and how far ahead steps may run.

Every sequence has `num_computed_tokens` (tokens with K/V in the cache, or being written by a step in flight)
and `num_tokens` (prompt + output, counting tokens still being sampled on the device). A step gives each
sequence up to `num_tokens - num_computed_tokens` new tokens out of one budget (`max_num_batched_tokens`):
running sequences first (decodes and unfinished prefill chunks), then waiting ones in arrival order.

Steps are queued on the device ahead of the host (up to `num_scheduler_steps` in flight): a decode's input
may be a token the previous step is still sampling. Two things need the host to have every token first, so
the scheduler answers `sync` and the engine lets the steps in flight land:

    a running sequence needs a block and none is free   ─► preempt the newest running sequence (its blocks
                                                            are freed and it recomputes later, or its KV is
                                                            swapped out to the CPU)
    a sequence's sampling reads its own history         ─► penalties, or a grammar (its next mask follows from
                                                            every token before): it runs with nothing else in
                                                            flight
"""

from __future__ import annotations

import time
from collections import deque

from tachyon.config import SchedulerConfig
from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.sequence import Sequence, SequenceStatus
from tachyon.interface import ModelRunnerOutput, ScheduledSeq, SchedulerOutput


def reads_history(seq: Sequence) -> bool:
    """Whether sampling this sequence reads its own output tokens (penalties, a grammar's matcher): then it
    needs them all known."""
    sp = seq.sampling_params
    return (seq.grammar is not None or sp.repetition_penalty != 1.0 or sp.presence_penalty != 0.0
            or sp.frequency_penalty != 0.0)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_swapped_out = 0
        self.num_recomputed = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    # -- one step ---------------------------------------------------------------------------------------
    def schedule(self, num_in_flight: int = 0) -> SchedulerOutput:
        """The next step. With steps in flight, it never preempts: it answers `sync` instead."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        history = False
        max_len = self.config.max_model_len
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_pending_tokens and (seq.num_remaining_tokens <= 0 or seq.num_tokens >= max_len):
                i += 1  # its last token is being sampled: nothing left to compute
                continue
            if reads_history(seq):
                if seq.num_pending_tokens:
                    return SchedulerOutput(sync=True)
                history = True
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.kv.allocate(seq, n):
                if num_in_flight:
                    return SchedulerOutput(sync=True)
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                out.seqs.append(ScheduledSeq(seq, seq.num_computed_tokens, n, seq.num_computed_tokens + n == seq.num_tokens))
                budget -= n
                i += 1
                continue
            break
        if not out.preempted:
            history |= self._admit(out, budget)
        for s in out.seqs:  # the step is decided: its tokens count as computed, its samples as pending
            s.seq.num_computed_tokens += s.num_new_tokens
            if s.sample:
                s.seq.num_pending_tokens += 1
        if not (history or out.preempted or out.swap_in):
            out.max_in_flight = self.config.num_scheduler_steps - 1
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> bool:
        """Waiting sequences in arrival order while the budget lasts; whether one reads its history."""
        # hashes of the blocks this step's admissions fill: a sequence that needs one of them next waits a step
        # and then finds it in the cache, instead of computing the same prefix twice in one step (requests that
        # arrive together with a shared system prompt)
        filling: set[int] = set()
        kv = self.kv
        history = False
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if seq.status == SequenceStatus.SWAPPED:
                if not kv.can_swap_in(seq):
                    break
                out.swap_in.extend(kv.swap_in(seq))
                seq.status = SequenceStatus.PREEMPTED  # its KV is back: no second swap-in if it waits on
            shared: list[int] = []
            looked_up = seq.num_computed_tokens == 0 and not seq.block_ids
            if looked_up:
                shared = kv.find_cached_prefix(seq, count=False)
                nxt = len(shared)
                if filling and nxt < len(seq.block_hashes) and seq.block_hashes[nxt] in filling:
                    break
            n = min(seq.num_tokens - seq.num_computed_tokens - len(shared) * kv.block_size, budget)
            if not kv.allocate(seq, n, shared):
                break
            if looked_up:
                kv.count_prefix_query(seq.num_tokens, len(shared) * kv.block_size)
                if seq.num_output_tokens == 0:
                    seq.num_cached_tokens = len(shared) * kv.block_size
            if kv.enable_prefix_caching:
                bs = kv.block_size
                first = seq.num_computed_tokens // bs
                filling.update(seq.block_hashes[first:min((seq.num_computed_tokens + n) // bs, len(seq.block_hashes))])
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = time.monotonic()
            self.running.append(seq)
            out.seqs.append(ScheduledSeq(seq, seq.num_computed_tokens, n, seq.num_computed_tokens + n == seq.num_tokens))
            history |= reads_history(seq)
            budget -= n
        return history

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.num_preemptions += 1
        seq.metrics.num_preemptions += 1
        out.preempted.append(seq)
        if self.kv.should_swap(seq):
            out.swap_out.extend(self.kv.swap_out(seq))
            seq.status = SequenceStatus.SWAPPED
            self.num_swapped_out += 1
        else:
            self.kv.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.PREEMPTED
            self.num_recomputed += 1
        self.waiting.appendleft(seq)

    def update(self, out: SchedulerOutput, result: ModelRunnerOutput | None
               ) -> tuple[list[tuple[Sequence, int, int]], list[tuple[Sequence, Exception]]]:
        """A collected step: append its sampled tokens, name newly full blocks, stop finished sequences.
        Returns (sequence, token, row in result) for those that got a token, and those whose update raised
        (the engine fails them; the rest go on)."""
        now = time.monotonic()
        sampled = {} if result is None else {id(s): i for i, s in enumerate(result.seqs)}
        got, failed = [], []
        bs = self.kv.block_size
        for s in out.seqs:
            seq = s.seq
            if seq.is_finished:  # aborted, stopped or failed while the step ran
                continue
            try:
                if s.sample:
                    seq.num_pending_tokens -= 1
                    row = sampled[id(seq)]
                    token = result.token_ids[row]
                    seq.token_ids.append(token)
                    if seq.grammar is not None:
                        seq.grammar.accept(token)
                if min(seq.num_computed_tokens, len(seq.token_ids)) >= (seq.num_registered_blocks + 1) * bs:
                    self.kv.cache_computed_blocks(seq)  # a block just filled up
                if not s.sample:
                    continue
                if seq.metrics.first_token_time is None:
                    seq.metrics.first_token_time = now
                seq.metrics.last_token_time = now
                if seq.pending_forks:
                    self._fork(seq)
                got.append((seq, token, row))
                self._check_token_stop(seq, token)
            except Exception as e:
                failed.append((seq, e))
        return got, failed

    def _check_token_stop(self, seq: Sequence, token: int) -> None:
        sp = seq.sampling_params
        n_out = seq.num_output_tokens
        if seq.grammar is not None and seq.grammar.is_terminated:  # it took a stop token its grammar allowed
            return self.finish(seq, SequenceStatus.FINISHED_STOPPED)
        if n_out >= sp.min_tokens:
            if not sp.ignore_eos and token in seq.eos_token_ids:
                return self.finish(seq, SequenceStatus.FINISHED_STOPPED)
            if token in sp.stop_token_ids:
                seq.stop_reason = token
                return self.finish(seq, SequenceStatus.FINISHED_STOPPED)
        if n_out >= seq.max_tokens or len(seq.token_ids) >= self.config.max_model_len:
            self.finish(seq, SequenceStatus.FINISHED_LENGTH)

    def _fork(self, parent: Sequence) -> None:
        """n > 1: the siblings share the parent's full prompt blocks and compute only the rest."""
        for child in parent.pending_forks:
            self.kv.fork(parent, child)
        self.waiting.extendleft(reversed(parent.pending_forks))
        parent.pending_forks = []

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        if seq.is_finished:
            return
        seq.status = status
        seq.is_finished = True
        seq.metrics.finished_time = time.monotonic()
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        for child in seq.pending_forks:  # never started (the request was aborted): they end with their parent
            child.status = SequenceStatus.FINISHED_ABORTED
            child.is_finished = True
            child.metrics.finished_time = seq.metrics.finished_time
        seq.pending_forks = []
