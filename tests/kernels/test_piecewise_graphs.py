"""Steps with prefill tokens replayed as piecewise CUDA graphs (tachyon.worker.piecewise_graphs) give
transformers' greedy tokens, with arrivals joining running decodes and steps in flight (GPU only, fp32)."""

from __future__ import annotations

import pytest
import torch

from tachyon import LLM, SamplingParams
from tachyon.worker.piecewise_graphs import piecewise_buckets
from tests.conftest import hf_greedy, make_tiny_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def run_arrivals(eng, hf, prompts, max_tokens):
    """One arrival per step (each joins the decodes already running); asserts transformers' greedy tokens for
    every prompt and the block accounting back to zero."""
    done = {}
    pending = list(enumerate(prompts))
    while pending or eng.has_unfinished_requests():
        if pending:
            i, p = pending.pop(0)
            eng.add_request(f"r{i}", None, p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        done.update({o.request_id: o.outputs[0].token_ids for o in eng.step() if o.finished})
    for i, p in enumerate(prompts):
        assert done[f"r{i}"] == hf_greedy(hf, p, max_tokens), i
    eng.check_integrity()
    assert eng.kv.num_free_blocks == eng.kv.num_blocks


def test_mixed_steps_in_piecewise_graphs_match_transformers(tmp_path):
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=6)
    llm = LLM(model=str(tmp_path), dtype="float32", num_kv_blocks=256, block_size=16, swap_space=0,
              max_num_batched_tokens=64, max_model_len=256)
    runner = llm.engine.runner
    pw = runner.piecewise_graphs
    assert pw is not None and pw.sizes == [16, 32, 48, 64]  # multiples of 16 up to 128
    replays = []
    real = pw.replay
    pw.replay = lambda ids, pos, slots, meta: replays.append(len(pos)) or real(ids, pos, slots, meta)
    eng = llm.engine
    prompts = [[5 + (7 * i + 3 * j) % 400 for j in range(n)] for i, n in enumerate((3, 21, 40, 90, 7, 33))]
    run_arrivals(eng, hf, prompts, 12)
    assert len(replays) >= len(prompts) and any(n > 32 for n in replays) and any(n < 16 for n in replays)


def test_padded_steps_run_eagerly_at_their_own_size_and_match_transformers(tmp_path):
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=7)
    llm = LLM(model=str(tmp_path), dtype="float32", num_kv_blocks=256, block_size=16, swap_space=0,
              max_num_batched_tokens=64, max_model_len=256)
    pw = llm.engine.runner.piecewise_graphs
    assert pw.calibration["eager_from"] >= 1 and pw.calibration["launch_ms"] > 0  # measured at capture
    pw.eager_from = 17  # a tiny model's steps never hide their launches: make every padded step from 17 eager
    replays, eager = [], []
    real_replay, real_model = pw.replay, llm.engine.runner.model.forward
    pw.replay = lambda ids, pos, slots, meta: replays.append(len(pos)) or real_replay(ids, pos, slots, meta)

    def model(ids, *a, **k):
        eager.append(ids.shape[0])
        return real_model(ids, *a, **k)

    llm.engine.runner.model.forward = model
    eng = llm.engine
    prompts = [[5 + (5 * i + 3 * j) % 400 for j in range(n)] for i, n in enumerate((3, 21, 40, 90, 7, 33))]
    run_arrivals(eng, hf, prompts, 12)
    assert any(n > 17 and n % 16 for n in eager), eager  # padded sizes ran eagerly
    assert all(n < 17 or n % 16 == 0 for n in replays), replays  # only exact buckets (or small steps) replayed


def test_buckets_by_measured_cost_replay_steps_that_match_transformers(tmp_path):
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=8)
    llm = LLM(model=str(tmp_path), dtype="float32", num_kv_blocks=256, block_size=16, swap_space=0,
              max_num_batched_tokens=512, max_model_len=512)
    pw = llm.engine.runner.piecewise_graphs
    assert sorted(pw.costs) == list(range(256, 513, 8)) and all(c > 0 for c in pw.costs.values())
    assert 512 in pw.sizes and [s for s in pw.sizes if s < 256] == list(range(16, 256, 16))
    grid = set(piecewise_buckets(512))
    fine = [s for s in pw.sizes if s >= 256]
    assert all(pw.costs[a] < (1 if a in grid else 0.95) * pw.costs[b] for a, b in zip(fine, fine[1:], strict=False))
    eng = llm.engine
    prompts = [[5 + (3 * i + 7 * j) % 400 for j in range(n)] for i, n in enumerate((300, 20, 260, 170))]
    replays = []
    real = pw.replay
    pw.replay = lambda ids, pos, slots, meta: replays.append(len(pos)) or real(ids, pos, slots, meta)
    run_arrivals(eng, hf, prompts, 8)
    assert any(n > 256 for n in replays), replays
