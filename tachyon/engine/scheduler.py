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
    a sequence speculates                               ─► its proposals continue its known tokens

A sequence whose sampling reads its own history (penalties, a grammar: its next mask follows from every token
before) does not need the host to have its tokens for the *forward*, only for the *sampling*. Such a step may
be queued while the step before it is in flight (`defer_sampling`): its forward runs on the device while that
step lands and the host updates the grammars and outputs; then the engine queues its sampling (still before
the forward ends when the host keeps up). It keeps one step ahead, no more (its sampling waits for the step
before to land).

Speculative decoding (a `Proposer` given): a decoding sequence whose tokens are all on the host gets up to k
proposed tokens after its last one, inside the same budget, and the step verifies them (not in a step with
`disable_by_batch_size` running sequences or more, and not while the sequence backs off: once its proposals are
mostly rejected (or missing), each verification that accepts nothing doubles a run of plain decodes, up to
`backoff_max_steps`, which run ahead in CUDA graphs). Its update appends the
accepted proposals and the runner's own token one at a time (each may stop it), and rolls the rejected
positions back: `num_computed_tokens` drops by their number and the KV-cache manager takes back the blocks
only they used.

    step:    inputs  [x  d1 d2 d3]   positions L-1 .. L+2 computed (1 + k = 4 new tokens)
    result:  d1 accepted, d2 rejected, t = the target's token in d2's place
    after:   tokens  [.. x d1 t]     num_computed_tokens = L + 1 (x and d1); d2 and d3's slots are stale
"""

from __future__ import annotations

import time
from collections import deque

from tachyon.config import SchedulerConfig, SpeculativeConfig
from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.sequence import Sequence, SequenceStatus
from tachyon.interface import ModelRunnerOutput, Proposer, ScheduledSeq, SchedulerOutput

# speculative decoding's back-off (Scheduler._spec_outcome): a sequence backs off while its running mean of accepted
# tokens per verification is under this: below it a verification costs more than its accepted tokens save (the
# measured costs: benchmarks/results/h100/session_20261206c/README.md).
SPEC_BACKOFF_BELOW = 0.25
SPEC_MEAN_WEIGHT = 1 / 8


def reads_history(seq: Sequence) -> bool:
    """Whether sampling this sequence reads its own output tokens (penalties, bad words of several tokens, a
    grammar's matcher): then it needs them all known."""
    sp = seq.sampling_params
    return (seq.grammar is not None or sp.repetition_penalty != 1.0 or sp.presence_penalty != 0.0
            or sp.frequency_penalty != 0.0 or any(len(w) > 1 for w in sp.bad_words_token_ids or ()))


def may_speculate(seq: Sequence) -> bool:
    """Whether a sequence's decodes may verify proposals: not when its sampling reads its history (penalties,
    a grammar), nor when it asks for logprobs (the verification reports none)."""
    return not reads_history(seq) and seq.sampling_params.logprobs is None


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, proposer: Proposer | None = None,
                 spec: SpeculativeConfig | None = None):
        self.config = config
        self.kv = kv
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_swapped_out = 0
        self.num_recomputed = 0
        # speculative decoding, as vLLM counts it: verified sequence-steps, proposed and accepted tokens, and
        # how often the proposal at each position (0 .. k-1) was accepted (set_speculation sizes the list)
        self.spec_num_drafts = 0
        self.spec_num_draft_tokens = 0
        self.spec_num_accepted_tokens = 0
        self.spec_accepted_per_pos: list[int] = []
        spec = spec if proposer is not None else None  # speculation needs both
        self.set_speculation(proposer, spec.num_speculative_tokens if spec else 0,
                             spec.backoff_max_steps if spec else 0, spec.disable_by_batch_size if spec else None)

    def set_speculation(self, proposer: Proposer | None, num_speculative_tokens: int, backoff_max_steps: int = 0,
                        disable_by_batch_size: int | None = None) -> None:
        """The proposer (None: plain decoding) and how it is used from the next step on: k tokens a verification,
        the back-off's longest pause (0: verify every step), the batch size from which nobody speculates. The
        acceptance counters carry over (the per-position list grows to k)."""
        self.proposer = proposer
        self.num_speculative_tokens = num_speculative_tokens if proposer is not None else 0
        self.backoff_max_steps = backoff_max_steps
        self.disable_by_batch_size = disable_by_batch_size
        self.spec_accepted_per_pos += [0] * (self.num_speculative_tokens - len(self.spec_accepted_per_pos))

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
        history = verify = False
        max_len = self.config.max_model_len
        late: list[tuple[ScheduledSeq, int]] = []  # speculating sequences a proposer that writes KV serves last
        speculate = bool(self.num_speculative_tokens) and (self.disable_by_batch_size is None
                                                           or len(self.running) < self.disable_by_batch_size)
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if seq.num_pending_tokens and (seq.num_remaining_tokens <= 0 or seq.num_tokens >= max_len):
                i += 1  # its last token is being sampled: nothing left to compute
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            sample = seq.num_computed_tokens + n == seq.num_tokens
            k = self._spec_cap(seq, budget) if speculate and seq.num_tokens - seq.num_computed_tokens == 1 else 0
            if k:
                if seq.num_pending_tokens:
                    return SchedulerOutput(sync=True)
            elif reads_history(seq):
                history = True
                if seq.num_pending_tokens:  # its token of the step in flight: known to the host before sampling
                    out.defer_sampling = True
            drafts = []
            if k and not self.proposer.needs_slots:  # proposals first, so only the tokens proposed get blocks
                drafts = self.proposer.propose([seq], [k])[0][:k]
                if not drafts:  # nothing to verify: a plain decode, which may run ahead
                    self._spec_outcome(seq, 0)
            verify |= bool(drafts) or bool(k and self.proposer.needs_slots)
            n += k if k and self.proposer.needs_slots else len(drafts)
            while not self.kv.allocate(seq, n):
                if num_in_flight:
                    return SchedulerOutput(sync=True)
                victim = self.running.pop()
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                sched = ScheduledSeq(seq, seq.num_computed_tokens, n, sample, drafts)
                out.seqs.append(sched)
                if k and self.proposer.needs_slots:
                    late.append((sched, k))
                budget -= n
                i += 1
                continue
            break
        budget += self._propose_late(late)
        if not out.preempted:
            history |= self._admit(out, budget)
        for s in out.seqs:  # the step is decided: its tokens count as computed, its samples as pending
            s.seq.num_computed_tokens += s.num_new_tokens
            if s.sample:
                s.seq.num_pending_tokens += 1
        if not (verify or out.preempted or out.swap_in):
            ahead = self.config.num_scheduler_steps - 1
            out.max_in_flight = min(ahead, 1) if history else ahead
        return out

    def _spec_cap(self, seq: Sequence, budget: int) -> int:
        """How many proposals a decode of seq may verify: k, within its max_tokens, the context and the budget
        (the step gives it at most 1 + k tokens: the accepted proposals and the target's own); 0 while it backs
        off (this decode counts down its back-off)."""
        if not self.num_speculative_tokens or not may_speculate(seq):
            return 0
        if seq.spec_skip:
            seq.spec_skip -= 1
            return 0
        room = min(seq.num_remaining_tokens, self.config.max_model_len - seq.num_tokens, budget) - 1
        return max(0, min(self.num_speculative_tokens, room))

    def _spec_outcome(self, seq: Sequence, accepted: int) -> None:
        """After a verification (or a proposer that found nothing: accepted 0). The sequence's running mean of
        accepted tokens per verification (exponential, weight 1/8, from 0.5) says whether speculation pays: a
        verification that accepted nothing while the mean is below `SPEC_BACKOFF_BELOW` is the j-th failure in a
        row and backs it off for min(2^(j-1), backoff_max_steps) decodes; one accepted token ends the run of
        failures. A proposer right a third of the time (mean ~0.4 accepted) keeps speculating; one never right
        verifies 6 times, then ever more rarely (~17 verifications in 256 tokens at the default cap of 32)."""
        seq.spec_mean_accepted += (accepted - seq.spec_mean_accepted) * SPEC_MEAN_WEIGHT
        if accepted:
            seq.spec_fails = 0
        elif self.backoff_max_steps and seq.spec_mean_accepted < SPEC_BACKOFF_BELOW:
            seq.spec_fails += 1
            seq.spec_skip = min(1 << min(seq.spec_fails - 1, 30), self.backoff_max_steps)

    def _propose_late(self, late: list[tuple[ScheduledSeq, int]]) -> int:
        """A proposer that writes KV (a draft model) proposes for the step's speculating sequences in one call,
        their blocks already allocated; tokens and blocks it did not use go back. Returns the unused budget."""
        if not late:
            return 0
        drafts = self.proposer.propose([s.seq for s, _ in late], [k for _, k in late])
        unused = 0
        for (s, k), d in zip(late, drafts, strict=True):
            s.spec_token_ids = list(d[:k])
            if not s.spec_token_ids:
                self._spec_outcome(s.seq, 0)
            unused += k - len(s.spec_token_ids)
            s.num_new_tokens = 1 + len(s.spec_token_ids)
            self.kv.shrink(s.seq, s.start + s.num_new_tokens)
        return unused

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
            swapped_in = seq.status == SequenceStatus.SWAPPED
            if swapped_in:
                # its parked blocks and a block for its next token, or it stays parked: swapped in and then left
                # waiting, it would hold blocks no one runs, and a sequence preempted in front of it could
                # wait for them forever (an engine that steps without progress)
                if kv.blocks_needed(seq.num_computed_tokens + 1) > kv.num_free_blocks:
                    break
                out.swap_in.extend(kv.swap_in(seq))
                seq.status = SequenceStatus.PREEMPTED  # its KV is back: no second swap-in if it waits on
            shared: list[int] = []
            # prompt logprobs need logits at every prompt position: such a prompt is computed, not looked up
            looked_up = seq.num_computed_tokens == 0 and not seq.block_ids and not seq.wants_prompt_logprobs
            if looked_up:
                shared = kv.find_cached_prefix(seq, count=False)
                nxt = len(shared)
                if filling and nxt < len(seq.block_hashes) and seq.block_hashes[nxt] in filling:
                    break
            n = min(seq.num_tokens - seq.num_computed_tokens - len(shared) * kv.block_size, budget)
            if swapped_in:  # as many of its tokens as its blocks and the free ones hold (at least one: above)
                n = min(n, (len(seq.block_ids) + kv.num_free_blocks) * kv.block_size - seq.num_computed_tokens)
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
        Returns (sequence, new tokens, row in result) for those that got tokens, and those whose update raised
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
                stop = None
                if s.sample:
                    seq.num_pending_tokens -= 1
                    row = sampled[id(seq)]
                    tokens, stop = self._append_tokens(s, result, row)
                if min(seq.num_computed_tokens, len(seq.token_ids)) >= (seq.num_registered_blocks + 1) * bs:
                    self.kv.cache_computed_blocks(seq)  # a block just filled up
                if not s.sample:
                    continue
                if seq.metrics.first_token_time is None:
                    seq.metrics.first_token_time = now
                seq.metrics.last_token_time = now
                if seq.pending_forks:
                    self._fork(seq)
                got.append((seq, tokens, row))
                if stop is not None:
                    self.finish(seq, stop)
            except Exception as e:
                failed.append((seq, e))
        return got, failed

    def _append_tokens(self, s: ScheduledSeq, result: ModelRunnerOutput, row: int
                       ) -> tuple[list[int], SequenceStatus | None]:
        """The step's new tokens for one sequence (accepted proposals, then the runner's token), appended one at
        a time until one stops it; rejected proposals' positions rolled back first. Returns (tokens, stop)."""
        seq = s.seq
        tokens = [result.token_ids[row]]
        if s.spec_token_ids:
            k, accepted = len(s.spec_token_ids), result.num_accepted[row]
            self.spec_num_drafts += 1
            self.spec_num_draft_tokens += k
            self.spec_num_accepted_tokens += accepted
            for pos in range(accepted):
                self.spec_accepted_per_pos[pos] += 1
            self._spec_outcome(seq, accepted)
            tokens = s.spec_token_ids[:accepted] + tokens
            seq.num_computed_tokens -= k - accepted
            self.kv.shrink(seq, seq.num_computed_tokens)
        for n, token in enumerate(tokens, 1):
            seq.token_ids.append(token)
            if seq.grammar is not None:
                seq.grammar.accept(token)
            stop = self._token_stop(seq, token)
            if stop is not None:
                return tokens[:n], stop
        return tokens, None

    def _token_stop(self, seq: Sequence, token: int) -> SequenceStatus | None:
        """Whether the token just appended ends the sequence, and how."""
        sp = seq.sampling_params
        n_out = seq.num_output_tokens
        if seq.grammar is not None and seq.grammar.is_terminated:  # it took a stop token its grammar allowed
            return SequenceStatus.FINISHED_STOPPED
        if n_out >= sp.min_tokens:
            if not sp.ignore_eos and token in seq.eos_token_ids:
                return SequenceStatus.FINISHED_STOPPED
            if token in sp.stop_token_ids:
                seq.stop_reason = token
                return SequenceStatus.FINISHED_STOPPED
        if n_out >= seq.max_tokens or len(seq.token_ids) >= self.config.max_model_len:
            return SequenceStatus.FINISHED_LENGTH
        return None

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
