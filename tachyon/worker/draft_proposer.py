"""A draft model that proposes tokens for speculative decoding: a second, smaller ModelRunner, greedy.

The draft's paged KV has the target's block count and block size, so the target's block tables address it
too: the KV-cache manager owns one set of blocks, and each block holds the target's K/V in one pool and the
draft's in the other. The draft writes only where the step's blocks are allocated (the scheduler asks after
allocating: `needs_slots`).

Per sequence the proposer remembers how far the draft's KV is valid (D). Each proposal for a sequence of L
known tokens with k to propose:

    catch up:  tokens D .. L-1 (the first time: the whole prompt, in chunks of the budget)   ─► d1 = argmax
    then:      d1 at L, d2 at L+1, ... d_{k-1} at L+k-2, one token per forward      ─► d2 .. dk
    remember:  L and d1 .. d_{k-1}; next time D = L + how many of them the target accepted

A sequence preempted since (recomputed, or swapped to other blocks) starts again from D = 0. Blocks reused
from the prefix cache are recomputed too (another sequence's draft may never have filled them).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from tachyon.interface import ScheduledSeq, SchedulerOutput
from tachyon.sampling_params import SamplingParams

_GREEDY = SamplingParams(temperature=0.0)


@dataclass(eq=False)
class _DraftView:
    """What the draft's runner reads of a sequence: its known tokens, then the proposals made so far."""

    token_ids: list[int]
    block_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams = field(default_factory=lambda: _GREEDY)
    generator: None = None
    grammar: None = None
    wants_prompt_logprobs: bool = False
    eos_token_ids: frozenset = frozenset()
    output_token_ids: list[int] = field(default_factory=list)  # read only with penalties (greedy has none)


@dataclass
class _DraftState:
    num_tokens: int  # L when it last proposed: its KV holds positions 0 .. L-1
    fed: list[int]  # the proposals it then ran at L, L+1, ... (their KV holds if the target accepted them)
    num_preemptions: int


class DraftProposer:
    """tachyon.interface.Proposer with a draft model (a tachyon.worker.model_runner.ModelRunner of its own)."""

    needs_slots = True

    def __init__(self, runner):
        self.runner = runner
        self._state: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _valid_tokens(self, seq) -> int:
        """How many leading positions of seq hold the draft's K/V for seq's current tokens."""
        st = self._state.get(seq)
        if st is None or st.num_preemptions != seq.metrics.num_preemptions:
            return 0
        L, toks = st.num_tokens, seq.token_ids
        m = 0
        while m < len(st.fed) and L + m < len(toks) - 1 and toks[L + m] == st.fed[m]:
            m += 1
        return min(L + m, len(toks) - 1)

    def propose(self, seqs: list, max_tokens: list[int]) -> list[list[int]]:
        views = [_DraftView(list(s.token_ids), s.block_ids, s.num_prompt_tokens) for s in seqs]
        drafts: list[list[int]] = [[] for _ in seqs]
        self._catch_up(views, [self._valid_tokens(s) for s in seqs], drafts)
        for j in range(1, max(max_tokens, default=0)):
            self._run([ScheduledSeq(v, len(v.token_ids) - 1, 1, True)
                       for v, k in zip(views, max_tokens, strict=True) if k > j], views, drafts)
        for s, d in zip(seqs, drafts, strict=True):
            self._state[s] = _DraftState(len(s.token_ids), d[:-1], s.metrics.num_preemptions)
        return drafts

    def _catch_up(self, views: list[_DraftView], valid: list[int], drafts: list[list[int]]) -> None:
        """Run each view's tokens from where its KV is valid, in forwards of at most the token budget (a long
        prompt in chunks, each after the one before); the last chunk of each gives its first proposal."""
        budget = self.runner.config.scheduler.max_num_batched_tokens
        start, end = list(valid), [len(v.token_ids) for v in views]  # (a sampled proposal joins token_ids)
        while any(st < e for st, e in zip(start, end, strict=True)):
            steps, left = [], budget
            for i, v in enumerate(views):
                n = min(end[i] - start[i], left)
                if n <= 0:
                    continue
                steps.append(ScheduledSeq(v, start[i], n, start[i] + n == end[i]))
                start[i] += n
                left -= n
                if not left:
                    break
            self._run(steps, views, drafts)

    def _run(self, steps: list[ScheduledSeq], views: list[_DraftView], drafts: list[list[int]]) -> None:
        """One draft forward; each view's argmax token joins its tokens and its sequence's proposals."""
        if not steps:
            return
        out = self.runner.collect(self.runner.submit(SchedulerOutput(seqs=steps)))
        if out is None:  # only chunks that sample nothing
            return
        index = {id(v): i for i, v in enumerate(views)}  # the runner returns rows in its own order
        for view, token in zip(out.seqs, out.token_ids, strict=True):
            view.token_ids.append(token)
            drafts[index[id(view)]].append(token)
