"""The scheduler on tiny pools, driven step by step: exact token splits, preemption victims, swap block
pairs, and how far ahead steps may be queued (lookahead, sync)."""

from __future__ import annotations

from tachyon.config import SchedulerConfig
from tachyon.engine.kv_cache import KVCacheManager
from tachyon.engine.scheduler import Scheduler
from tachyon.engine.sequence import Sequence, SequenceStatus
from tachyon.interface import ModelRunnerOutput
from tachyon.outputs import RequestMetrics
from tachyon.sampling_params import SamplingParams


def _seq(sid: str, n_prompt: int, max_tokens: int = 8, **sp) -> Sequence:
    return Sequence(seq_id=sid, request_id=sid, index=0, prompt_token_ids=list(range(100, 100 + n_prompt)),
                    sampling_params=SamplingParams(temperature=0, ignore_eos=True, **sp), max_tokens=max_tokens,
                    eos_token_ids=frozenset(), metrics=RequestMetrics(arrival_time=0.0))


def _sched(budget=10, blocks=20, block_size=4, steps=3, cpu_blocks=0, max_len=64) -> Scheduler:
    kv = KVCacheManager(blocks, block_size, enable_prefix_caching=False, num_cpu_blocks=cpu_blocks, min_swap_tokens=4)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=max_len,
                                     num_scheduler_steps=steps), kv)


def _split(out) -> list[tuple]:
    return [(s.seq.seq_id, s.start, s.num_new_tokens, s.sample) for s in out.seqs]


def _land(sched: Scheduler, out, tokens: dict[str, int]) -> None:
    rows = [s.seq for s in out.seqs if s.sample]
    sched.update(out, ModelRunnerOutput(rows, [tokens[r.seq_id] for r in rows], [None] * len(rows),
                                        [None] * len(rows)))


def test_one_budget_running_first_then_waiting_in_order_with_chunks():
    s = _sched(budget=10)
    a, b, c = _seq("a", 6), _seq("b", 7), _seq("c", 9)
    for q in (a, b, c):
        s.add(q)
    out1 = s.schedule()
    assert _split(out1) == [("a", 0, 6, True), ("b", 0, 4, False)]  # b's prompt is chunked by the budget
    assert (a.num_computed_tokens, a.num_pending_tokens, b.num_computed_tokens, b.num_pending_tokens) == (6, 1, 4, 0)
    assert a.block_ids == [1, 2] and b.block_ids == [3] and out1.max_in_flight == 2
    # behind step 1 (in flight): a decodes its pending token, b finishes its prompt, c gets the rest
    out2 = s.schedule(num_in_flight=1)
    assert _split(out2) == [("a", 6, 1, True), ("b", 4, 3, True), ("c", 0, 6, False)]
    assert a.num_tokens == 8 and len(a.token_ids) == 6 and a.num_pending_tokens == 2
    _land(s, out1, {"a": 7})
    assert a.token_ids[-1] == 7 and a.num_pending_tokens == 1 and a.num_output_tokens == 1
    _land(s, out2, {"a": 8, "b": 9})
    assert a.output_token_ids == [7, 8] and b.output_token_ids == [9]
    out3 = s.schedule()
    assert _split(out3) == [("a", 7, 1, True), ("b", 7, 1, True), ("c", 6, 3, True)]


def test_lookahead_stops_at_max_tokens_and_the_context():
    s = _sched(max_len=64)
    a, b = _seq("a", 5, max_tokens=2), _seq("b", 62, max_tokens=10)
    s.add(a)
    s.add(b)
    s.config.max_num_batched_tokens = 100
    out1 = s.schedule()
    assert _split(out1) == [("a", 0, 5, True), ("b", 0, 62, True)]
    out2 = s.schedule(num_in_flight=1)
    assert _split(out2) == [("a", 5, 1, True), ("b", 62, 1, True)]
    # a's last token (max_tokens=2) and b's (the context: 62 + 2 = 64) are pending: nothing left to run
    out3 = s.schedule(num_in_flight=2)
    assert out3.seqs == [] and not out3.sync
    _land(s, out1, {"a": 1, "b": 1})
    assert not a.is_finished and not b.is_finished
    _land(s, out2, {"a": 2, "b": 2})
    assert a.status == b.status == SequenceStatus.FINISHED_LENGTH and not a.block_ids and not b.block_ids
    assert s.kv.num_free_blocks == s.kv.num_blocks and not s.running


def test_preemption_takes_the_newest_running_sequence_and_waits_for_steps_in_flight():
    s = _sched(budget=32, blocks=6, block_size=4)  # 5 usable blocks
    a, b, c = _seq("a", 8), _seq("b", 8), _seq("c", 3)
    for q in (a, b, c):
        s.add(q)
    out = s.schedule()
    assert _split(out) == [("a", 0, 8, True), ("b", 0, 8, True), ("c", 0, 3, True)]
    assert (a.block_ids, b.block_ids, c.block_ids) == ([1, 2], [3, 4], [5]) and s.kv.num_free_blocks == 0
    # a and b need a third block for position 8: with a step in flight the answer is sync, nothing changes
    assert s.schedule(num_in_flight=1).sync
    assert (a.block_ids, b.block_ids, c.block_ids) == ([1, 2], [3, 4], [5]) and not s.num_preemptions
    _land(s, out, {"a": 1, "b": 1, "c": 1})
    out = s.schedule()
    # c (the newest) gives a its block; then b needs one and is itself the newest left
    assert [q.seq_id for q in out.preempted] == ["c", "b"]
    assert _split(out) == [("a", 8, 1, True)] and a.block_ids == [1, 2, 5] and out.max_in_flight == 0
    for q in (b, c):
        assert q.status == SequenceStatus.PREEMPTED and q.num_computed_tokens == 0 and not q.block_ids
    assert list(s.waiting) == [b, c] and s.num_recomputed == 2
    _land(s, out, {"a": 2})
    out = s.schedule()  # b would need 3 blocks for its 9 tokens; 2 are free: it waits
    assert _split(out) == [("a", 9, 1, True)] and not out.preempted
    s.kv.check_integrity([a, b, c])


def test_swap_out_and_in_name_exact_block_pairs():
    s = _sched(budget=32, blocks=7, block_size=4, cpu_blocks=8)
    a, b = _seq("a", 11), _seq("b", 10)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert (a.block_ids, b.block_ids) == ([1, 2, 3], [4, 5, 6])
    _land(s, out, {"a": 1, "b": 1})
    out = s.schedule()  # a's position 11 fits block 3; b's position 10 too
    _land(s, out, {"a": 2, "b": 2})
    out = s.schedule()  # a needs a 4th block at position 12: b (newest) is swapped out
    assert [q.seq_id for q in out.preempted] == ["b"] and b.status == SequenceStatus.SWAPPED
    assert out.swap_out == [(4, 0), (5, 1), (6, 2)]
    assert b.num_computed_tokens == 12 - 1 and s.kv.cpu_held[b] == [0, 1, 2]
    assert _split(out) == [("a", 12, 1, True)] and a.block_ids == [1, 2, 3, 6]
    _land(s, out, {"a": 3})
    s.finish(a, SequenceStatus.FINISHED_STOPPED)
    out = s.schedule()
    # the pool's free list, oldest first, is [5, 4] (b's tail-first) then a's blocks, tail first
    assert out.swap_in == [(0, 5), (1, 4), (2, 6)]
    assert _split(out) == [("b", 11, 1, True)] and b.block_ids == [5, 4, 6]
    assert out.max_in_flight == 0  # the copy-in runs with nothing else in flight
    s.kv.check_integrity([b])


def test_penalties_run_one_step_ahead_with_their_sampling_deferred():
    s = _sched()
    a = _seq("a", 5, repetition_penalty=1.2)
    s.add(a)
    out = s.schedule()
    # the prompt's step reads no pending token: sampled at once, and one step (not two) may follow it
    assert _split(out) == [("a", 0, 5, True)] and out.max_in_flight == 1 and not out.defer_sampling
    nxt = s.schedule(num_in_flight=1)  # its input is the token the step in flight samples
    assert _split(nxt) == [("a", 5, 1, True)] and nxt.defer_sampling and nxt.max_in_flight == 1
    assert a.num_pending_tokens == 2
    _land(s, out, {"a": 1})
    _land(s, nxt, {"a": 2})
    assert a.output_token_ids == [1, 2] and a.num_pending_tokens == 0
    assert _split(s.schedule()) == [("a", 6, 1, True)]
