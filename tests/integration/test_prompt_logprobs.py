"""prompt_logprobs as vLLM has them, checked against transformers' log_softmax over the same prompt: on the
embedded model through the official `openai` client (/v1/completions per choice, echo with logprobs,
/v1/chat/completions beside the choices, a prompt already in the prefix cache computed again), and offline on a
tiny random Llama whose prompt runs in prefill chunks and is preempted mid-prefill. The offline API with a
tokenizer and steps in flight: tests/integration/test_vllm_cli.py."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests.integration.conftest import API_KEY, MODEL
from tests.integration.test_server import wait_idle

PROMPT = ("The lighthouse keeper climbed the stairs every evening, lit the lamp, and watched the ships pass "
          "the rocks until morning came.")


def reference(hf_model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] log-probabilities: row p scores token p + 1."""
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def check_position(row: torch.Tensor, token: int, entry: dict[int, tuple[float, int]], k: int) -> None:
    """One prompt position: {token_id: (logprob, rank)} holds the prompt token and the top k, values within
    float noise of transformers', ranks between the strictly-more-likely count and the nearly-as-likely one (so
    the top k are transformers' top k, up to ties)."""
    assert token in entry and k <= len(entry) <= k + 1
    assert sorted(rank for t, (_, rank) in entry.items() if t != token or rank <= k)[:k] == list(range(1, k + 1))
    for tid, (lp, rank) in entry.items():
        assert lp == pytest.approx(row[tid].item(), abs=2e-3)
        above, near = int((row > row[tid] + 2e-3).sum()), int((row > row[tid] - 2e-3).sum())
        assert above + 1 <= rank <= near, (tid, rank, above, near)


def _entry(d: dict) -> dict[int, tuple[float, int]]:
    return {int(t): (v["logprob"], v["rank"]) for t, v in d.items()}


def test_prompt_logprobs_on_completions_and_chat(server, hf_embedded):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    tok = server.engine.tokenizer
    ids = tok.encode(PROMPT)
    ref = reference(hf_embedded, ids)
    for _ in range(2):  # the second finds the prompt in the prefix cache, and still computes it
        r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0,
                                      extra_body={"prompt_logprobs": 2})
        assert r.usage.prompt_tokens_details.cached_tokens == 0
    plp = r.choices[0].model_extra["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for p in range(1, len(ids)):
        check_position(ref[p - 1], ids[p], _entry(plp[p]), 2)
        assert plp[p][str(ids[p])]["decoded_token"] == tok.decode([ids[p]])
    # echo with logprobs: the prompt's tokens lead the logprobs, the first without one
    e = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1, echo=True)
    lp = e.choices[0].logprobs
    assert e.choices[0].text.startswith(PROMPT) and len(lp.tokens) == len(ids) + 2
    assert lp.tokens[:len(ids)] == [tok.decode([t]) for t in ids] and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None and lp.text_offset[:2] == [0, len(lp.tokens[0])]
    assert [round(x, 3) for x in lp.token_logprobs[1:len(ids)]] == [
        round(plp[p][str(ids[p])]["logprob"], 3) for p in range(1, len(ids))]
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, logprobs=1,
                                       echo=True, stream=True)
    chunks = [c.choices[0].logprobs for c in stream if c.choices]
    assert sum((c.tokens for c in chunks), []) == lp.tokens
    # chat: beside the choices, as vLLM's ChatCompletionResponse has them
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    c = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, extra_body={"prompt_logprobs": 1})
    chat_plp = c.model_extra["prompt_logprobs"]
    chat_ref = reference(hf_embedded, chat_ids)
    assert len(chat_plp) == len(chat_ids) and chat_plp[0] is None
    for p in range(1, len(chat_ids)):
        check_position(chat_ref[p - 1], chat_ids[p], _entry(chat_plp[p]), 1)
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert plain.model_extra["prompt_logprobs"] is None
    for path, body, words in [
            ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": 1, "stream": True},
             "`prompt_logprobs` are not available when `stream=True`."),
            ("/v1/chat/completions", {"messages": messages, "prompt_logprobs": 21},
             "prompt_logprobs=21 is more than the 20 top logprobs a request may ask for (--max-logprobs)"),
            ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": -1},
             "SamplingParams.prompt_logprobs=-1 is out of range")]:
        bad = httpx.post(server.url + path, json={"model": MODEL, **body}, headers=server.headers(), timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt_logprobs"
        assert bad.json()["error"]["message"].startswith(words), bad.json()
    wait_idle(server)


def test_prompt_logprobs_of_a_prompt_preempted_mid_prefill(tmp_path):
    """A tiny random Llama with 6 KV blocks: the prompt_logprobs request's prefill runs in chunks of 4 tokens, 3
    steps in flight, and is preempted (recompute) midway, so its positions are computed again; each is reported
    once, with transformers' values."""
    from tachyon import LLM, SamplingParams
    from tests.conftest import make_tiny_checkpoint

    hf = make_tiny_checkpoint("llama", str(tmp_path), seed=5)
    llm = LLM(model=str(tmp_path), num_kv_blocks=7, block_size=8, max_num_batched_tokens=4, max_num_seqs=2,
              swap_space=0, max_model_len=128, num_scheduler_steps=3)  # chunks queued back to back, as on a GPU
    decoding, asked = list(range(10, 30)), list(range(100, 132))  # 6 and 5 blocks at their longest
    outs = llm.generate([{"prompt_token_ids": decoding}, {"prompt_token_ids": asked}],
                        [SamplingParams(max_tokens=28, ignore_eos=True, temperature=0),
                         SamplingParams(max_tokens=2, prompt_logprobs=2, temperature=0)], use_tqdm=False)
    out = outs[1]
    assert out.metrics.num_preemptions >= 1 and len(out.prompt_logprobs) == len(asked)
    ref = reference(hf, asked)
    for p in range(1, len(asked)):
        check_position(ref[p - 1], asked[p], {t: (x.logprob, x.rank) for t, x in out.prompt_logprobs[p].items()}, 2)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_blocks
