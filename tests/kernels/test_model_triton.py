"""The whole model on the Triton path (paged attention kernels plus every fused op, rotary + KV write in one
kernel included) gives transformers' greedy tokens: on the CPU through Triton's interpreter, in fp32."""

from __future__ import annotations

import pytest
import torch

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


@pytest.mark.parametrize("method", ["w8a8", pytest.param("fp8", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the interpreter has no float8"))])
def test_norms_and_activation_hand_8bit_linears_their_rows_quantized(tmp_path, device, monkeypatch, method):
    # an fp8/w8a8 model on the Triton path: each RMSNorm before qkv_proj or gate_up_proj, and the MLP's activation
    # before down_proj, hands the linear its rows quantized as well (QuantizedRows), exactly what the linear's own
    # `quantize_rows` makes of the rows it reads; the tokens are those of the path without
    from tachyon.kernels.scaled_linear import quantize_rows
    from tachyon.layers.linear import ScaledLinear

    monkeypatch.delenv("TACHYON_FUSED_QUANT", raising=False)
    make_tiny_checkpoint("llama", str(tmp_path), seed=5)
    llm = LLM(model=str(tmp_path), quantization=method, attention_backend="triton", dtype="float32",
              num_kv_blocks=64, block_size=8, swap_space=0, max_num_batched_tokens=32, enforce_eager=True)
    model = llm.engine.runner.model
    seen = []
    matmul = ScaledLinear._matmul

    def checked(self, x, pre=None):
        if pre is not None:
            q, s = quantize_rows(x, self.weight.dtype)
            assert torch.equal(pre[0].view(torch.int8), q.view(torch.int8)) and torch.equal(pre[1], s)
            seen.append(self)
        return matmul(self, x, pre)

    monkeypatch.setattr(ScaledLinear, "_matmul", checked)
    prompts = [{"prompt_token_ids": [5 + (11 * i + 3 * j) % 400 for j in range(n)]} for i, n in enumerate((4, 37))]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    install_fused_ops(model)  # off by default (TACHYON_FUSED_QUANT unset)
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert not seen
    install_fused_ops(model, quantized_inputs=True)
    fused = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert fused == plain
    linears = {id(m) for layer in model.layers
               for m in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)}
    assert {id(m) for m in seen} == linears  # o_proj reads the attention's output: not among them
