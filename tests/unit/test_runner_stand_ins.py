"""The runner's stand-ins for a sequence (the GPU memory profile's step, the draft model's view) run through
ModelRunner.submit/collect on the CPU: a field the runner starts reading from sequences must exist on them too
(twice a merge broke this where only a GPU start would see it: every engine start on a GPU failed)."""

from __future__ import annotations

from tachyon import LLM
from tachyon.engine.scheduler import ScheduledSeq, SchedulerOutput
from tachyon.worker.draft_proposer import _DraftView
from tachyon.worker.gpu_profile import profile_step
from tests.conftest import make_tiny_checkpoint


def test_the_profile_step_and_a_draft_view_run_through_the_runner(tmp_path):
    make_tiny_checkpoint("llama", str(tmp_path), seed=1)
    llm = LLM(model=str(tmp_path), dtype="float32", num_kv_blocks=64, block_size=8, swap_space=0,
              max_num_batched_tokens=48, max_num_seqs=4)
    runner = llm.engine.runner
    sched, scratch = profile_step(runner.config, runner.block_size)
    assert sum(s.num_new_tokens for s in sched.seqs) == 48 and len(sched.seqs) == 4
    runner.allocate_kv_cache(scratch)
    out = runner.collect(runner.submit(sched))
    assert len(out.token_ids) == 4
    view = _DraftView(token_ids=[5, 6, 7], block_ids=[1], num_prompt_tokens=3)
    out = runner.collect(runner.submit(SchedulerOutput(seqs=[ScheduledSeq(view, 0, 3, True)])))
    assert len(out.token_ids) == 1
