"""Programmatic dependent launch changes when a kernel's programs are placed, never what they compute: a
chain of dependent kernels under PDL, captured in a CUDA graph, gives bit for bit what plain launches give
(a kernel that read its input before the grid before it had finished would not)."""

from __future__ import annotations

import pytest
import torch

from tachyon import LLM, SamplingParams
from tachyon.kernels import pdl
from tachyon.kernels.fused_ops import fused_add_rms_norm, silu_and_mul
from tachyon.kernels.gemv import gemv
from tests.conftest import make_tiny_checkpoint

gpu = pytest.mark.skipif(not (torch.cuda.is_available() and pdl.supported(torch.device("cuda"))),
                         reason="needs an sm_90+ GPU")


@pytest.fixture
def pdl_off_after():
    yield
    pdl.enable(False)


def test_pdl_is_off_on_the_cpu(tmp_path, pdl_off_after):
    assert not pdl.supported(torch.device("cpu"))
    assert pdl.launch_args() == {"PDL": False}
    make_tiny_checkpoint("llama", str(tmp_path), seed=1)
    llm = LLM(model=str(tmp_path), device="cpu", attention_backend="triton", num_kv_blocks=16, swap_space=0)
    assert llm.engine.runner.pdl is False and not pdl.enabled()
    pdl.enable(True)
    assert pdl.launch_args() == {"PDL": True, "launch_pdl": True}


def _chain(x, ws, norm_w):
    """40 dependent kernels: norm -> gemv -> silu -> gemv, ten times (each reads what the one before wrote)."""
    res = x
    for w_up, w_down in ws:
        h, res = fused_add_rms_norm(x, res, norm_w, 1e-5)
        x = gemv(silu_and_mul(gemv(h, w_up, config=(8, 512, 4, 4))), w_down, config=(32, 256, 4, 4))
    return x + res


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
def test_pdl_chain_in_a_cuda_graph_is_bitwise_the_plain_chain(rows, pdl_off_after):
    torch.manual_seed(0)
    H, inter = 2048, 4096
    ws = [(torch.randn(2 * inter, H, device="cuda", dtype=torch.bfloat16) / 40,
           torch.randn(H, inter, device="cuda", dtype=torch.bfloat16) / 60) for _ in range(10)]
    norm_w = torch.rand(H, device="cuda", dtype=torch.bfloat16) + 0.5
    x = torch.randn(rows, H, device="cuda", dtype=torch.bfloat16)
    pdl.enable(False)
    want = _chain(x, ws, norm_w)
    pdl.enable(True)
    assert torch.equal(_chain(x, ws, norm_w), want)  # eager
    static_x = x.clone()
    _chain(static_x, ws, norm_w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _chain(static_x, ws, norm_w)
    for seed in range(3):  # new inputs through the same graph
        static_x.copy_(torch.randn(rows, H, generator=torch.Generator(device="cuda").manual_seed(seed),
                                   device="cuda", dtype=torch.bfloat16))
        pdl.enable(False)
        want = _chain(static_x, ws, norm_w)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, want)


@gpu
@pytest.mark.gpu
def test_engine_with_pdl_gives_the_tokens_of_the_engine_without(tmp_path, pdl_off_after):
    make_tiny_checkpoint("llama", str(tmp_path), seed=3)
    prompts = [[5 + (7 * i + 3 * j) % 400 for j in range(n)] for i, n in enumerate((3, 70, 129, 17))]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    got = {}
    for on in (True, False):
        llm = LLM(model=str(tmp_path), dtype="bfloat16", num_kv_blocks=256, swap_space=0, enable_pdl=on,
                  max_num_seqs=8)
        graphs = llm.engine.runner.cuda_graphs
        assert llm.engine.runner.pdl is on and not pdl.enabled()  # eager steps launch plainly
        assert all(set(ms) == ({"pdl", "plain"} if on else set()) for ms in graphs.replay_ms.values())
        assert len(graphs.replay_ms) == (len(graphs.sizes) if on else 0) and set(graphs.pdl_sizes) <= set(graphs.sizes)
        got[on] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
        assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
        del llm
    assert got[True] == got[False]
