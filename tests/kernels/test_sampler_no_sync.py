"""Sampling and speculative verification queue their work without waiting for the GPU: no host list becomes a
device tensor through a synchronizing copy, so the host keeps queuing while the forward before them runs.
(torch.cuda.set_sync_debug_mode("error") raises at any operation that synchronizes the stream.) GPU only."""

import pytest
import torch

from tachyon import SamplingParams
from tachyon.engine.sequence import Sequence
from tachyon.outputs import RequestMetrics
from tachyon.worker.sampler import Sampler, to_device
from tachyon.worker.spec_decode import verify

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
V = 1000


def _req(sp: SamplingParams, gen=None) -> Sequence:
    r = Sequence(seq_id="x", request_id="x", index=0, prompt_token_ids=[1, 2, 3, 4], sampling_params=sp,
                 max_tokens=16, eos_token_ids=frozenset({2}), metrics=RequestMetrics(arrival_time=0.0))
    r.token_ids.extend([5, 6, 5])  # three output tokens (penalties and bad words read them)
    r.generator = gen
    return r


PARAMS = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05),
          SamplingParams(temperature=1.0, repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3,
                         logit_bias={7: 5.0}, bad_words_token_ids=[[9], [5, 8]], min_tokens=10)]


def test_sampling_and_verification_do_not_synchronize():
    dev = torch.device("cuda")
    sampler = Sampler(V, dev, seed=0)
    reqs = [_req(sp) for sp in PARAMS] + [_req(PARAMS[1], sampler.request_generator(3))]
    logits = torch.randn(len(reqs), V, device=dev)
    drafts = [[3, 4], [5], [6, 7, 8], [9]]
    rows = torch.randn(sum(len(d) + 1 for d in drafts), V, device=dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = sampler.sample_tokens(logits, reqs)
        out = sampler.sample(logits[:2], [_req(SamplingParams(temperature=0.5, logprobs=3))] * 2)
        vt, accepted = verify(sampler, rows, reqs, drafts, [3] * len(reqs))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.shape == (len(reqs),) and out.token_ids.shape == (2,)
    assert accepted.tolist()[0] <= 2 and vt.shape == (len(reqs),)
    torch.testing.assert_close(to_device([1.5, 2.5], dev), torch.tensor([1.5, 2.5], device=dev))
