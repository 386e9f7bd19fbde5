"""Speculative decoding's verification steps replayed as whole-step CUDA graphs (CudaGraphs with q_len 1 + k)
give transformers' greedy tokens, batch padded to a captured size, rejections rolled back (GPU only, fp32)."""

from __future__ import annotations

import pytest
import torch

from tachyon import LLM, SamplingParams
from tests.conftest import hf_greedy, make_tiny_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_verification_steps_replay_whole_graphs_and_match_transformers(tmp_path):
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=7)
    llm = LLM(model=str(tmp_path), dtype="float32", num_kv_blocks=256, block_size=16, swap_space=0,
              max_num_seqs=8, max_model_len=256,
              speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    runner = llm.engine.runner
    vg = runner.verify_graphs
    assert vg is not None and vg.q_len == 4 and vg.sizes == [1, 2, 4, 8]
    replays = []
    real = vg.replay
    vg.replay = lambda ids, pos, slots, lens, bt: replays.append(len(lens)) or real(ids, pos, slots, lens, bt)
    prompts = [[5 + (7 * i + 3 * j) % 400 for j in range(n)] for i, n in enumerate((9, 21, 40))]
    refs = {tuple(p): hf_greedy(hf, p, 24) for p in prompts}

    class Replay:  # proposes k tokens of transformers' continuation, a third of them wrong: accepts and rejects
        needs_slots = False

        def __init__(self):
            self.n = 0

        def propose(self, seqs, max_tokens):
            out = []
            for s, k in zip(seqs, max_tokens, strict=True):
                ref = refs[tuple(s.prompt_token_ids)] + [0] * k
                m = s.num_output_tokens
                self.n += 1
                out.append([t if (self.n + j) % 3 else (t + 1) % 512 for j, t in enumerate(ref[m:m + k])])
            return out

    llm.engine.scheduler.proposer = Replay()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for p, o in zip(prompts, outs, strict=True):
        assert o.outputs[0].token_ids == refs[tuple(p)]
    assert 3 in replays  # a batch of 3 runs padded to the graph of 4
    stats = llm.engine.stats()
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens  # some rolled back
    eng = llm.engine
    eng.check_integrity()
    assert eng.kv.num_free_blocks == eng.kv.num_blocks
