"""The whole model on the Triton path (paged attention kernels plus every fused op, rotary + KV write in one
kernel included) gives transformers' greedy tokens: on the CPU through Triton's interpreter, in fp32."""

from __future__ import annotations

from tachyon import LLM, SamplingParams
from tachyon.layers.triton_backend import install_fused_ops
from tests.conftest import hf_greedy, make_tiny_checkpoint


def test_triton_path_greedy_matches_transformers(tmp_path, device):
    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=4)
    llm = LLM(model=str(tmp_path), attention_backend="triton", dtype="float32", num_kv_blocks=64, block_size=8,
              swap_space=0, max_num_batched_tokens=32, enforce_eager=True)
    runner = llm.engine.runner
    install_fused_ops(runner.model)  # the CPU runner leaves them out; the GPU runner puts them in
    calls = []
    fused = runner.backend.forward_rotary
    runner.backend.forward_rotary = lambda *a: calls.append(1) or fused(*a)
    prompts = [[5 + (7 * i + 3 * j) % 400 for j in range(n)] for i, n in enumerate((3, 21, 40))]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    for p, o in zip(prompts, outs, strict=True):  # a 32-token budget: the 40-token prompt runs in two chunks
        assert o.outputs[0].token_ids == hf_greedy(hf, p, 6)
    assert calls, "the fused rotary + KV write path never ran"
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
