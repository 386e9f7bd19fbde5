"""What the engine core and the model runner exchange: a scheduler output goes in, sampled tokens come out.

Both sides import this module and nothing of each other; `tachyon.build` wires them together.

    engine core                                   runner (tachyon.worker.model_runner)
    ───────────                                   ──────
    sched = scheduler.schedule(in_flight)
    handle = runner.submit(sched)     ──────────► copies swapped KV, builds the batch, queues the forward and
                                                  the sampling on the device; returns at once
    ... schedules and submits the next step ...
    out = runner.collect(handle)      ◄────────── waits for that step's tokens, gives them to the host

A scheduled sequence's last input token may be one a step still in flight samples (a placeholder): the runner
takes it from that step's sampled ids on the device, so a step can be queued before the previous one lands.

Speculative decoding is the same step: a decoding sequence is scheduled with 1 + k new tokens, its last known
token and k proposed ones (`spec_token_ids`, from a `Proposer`); the runner verifies them in the one forward
and answers how many proposals it accepted plus one token of its own (the correction, or the bonus token after
k accepted). The scheduler then rolls the rejected positions back (tachyon.engine.scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class ScheduledSeq:
    seq: Any  # tachyon.engine.sequence.Sequence (the runner reads its tokens, blocks and sampling parameters)
    start: int  # its computed tokens before this step: the step computes positions start .. start+n-1
    num_new_tokens: int
    sample: bool  # the step computes the sequence's last token, so a new one is sampled
    # proposed tokens after its last known one (speculative decoding): the step verifies them
    spec_token_ids: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list = field(default_factory=list)  # sequences preempted by this step (recompute or swap)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device block, CPU block) to copy out first
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # (CPU block, device block) to copy in
    # the most steps that may stay in flight once this one is submitted (0: collect it before the next)
    max_in_flight: int = 0
    sync: bool = False  # nothing scheduled: the steps in flight must land first (to preempt, or to speculate)
    # a sequence's sampling reads a token the step in flight is still sampling (a grammar, penalties): the
    # runner queues the forward now and the sampling when the engine says that step has landed
    defer_sampling: bool = False

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not self.seqs


@dataclass(slots=True)
class ModelRunnerOutput:
    """One collected step: a row per sequence that sampled, in the scheduler output's order."""

    seqs: list
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]  # top-N and the sampled token's, for rows that asked
    sampled_logprobs: list[float | None]
    # per row: how many of its proposed tokens were accepted (then token_ids[row] follows them); None: no row
    # verified proposals this step
    num_accepted: list[int] | None = None
    sampled_ranks: list[int | None] | None = None  # rows that asked for logprobs: the sampled token's rank
    # sequences whose prompt positions this step reported (prompt_logprobs): (seq, first position,
    # {token_id: logprob} per position with the prompt token first, the prompt token's rank per position)
    prompt_logprobs: list[tuple[Any, int, list[dict[int, float]], list[int]]] | None = None


class RunnerFault(RuntimeError):
    """The runner cannot go on, whatever the requests (a tensor-parallel worker is gone): the engine stops."""


class ModelRunner(Protocol):
    """What the engine core may ask of a runner (tachyon.worker.model_runner.ModelRunner is the one)."""

    block_size: int
    fault: str | None  # why the runner cannot go on (checked between steps too), else None

    def submit(self, sched: SchedulerOutput) -> object:
        """Queue the step; returns a handle for collect. Raises if the batch cannot run (the engine then
        runs each sequence alone)."""

    def sample_deferred(self, handle: object) -> None:
        """Queue the sampling of a step submitted with `defer_sampling` (every step before it has been
        collected); a no-op for other steps."""

    def collect(self, handle: object) -> ModelRunnerOutput:
        """Wait for a submitted step (in submission order) and return its sampled tokens."""

    def drop_in_flight(self) -> None:
        """Forget every step not yet collected (the engine failed every live request)."""

    def request_generator(self, seed: int) -> object:
        """A random generator for one seeded sequence, on the runner's device."""


class Proposer(Protocol):
    """Proposes tokens for decoding sequences to verify (tachyon.engine.ngram_proposer,
    tachyon.worker.draft_proposer). The scheduler calls it once per step with the sequences that may speculate."""

    # it writes KV at the proposed positions (a draft model): the scheduler allocates the step's blocks first
    needs_slots: bool

    def propose(self, seqs: list, max_tokens: list[int]) -> list[list[int]]:
        """Up to max_tokens[i] tokens to follow seqs[i]'s tokens (all known on the host)."""
