"""vLLM's API surface on the live server (the session `server` fixture), through the official `openai` client:
/tokenize, /detokenize, /ping, model cards, cached tokens, request ids, per-request templates, echo, token-id
logprobs, continuous usage, one choice per stream chunk, text-only content parts, CORS and vLLM metric names."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.integration.conftest import API_KEY, MODEL
from tests.integration.test_server import wait_idle

openai = pytest.importorskip("openai")

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=server.headers(), timeout=60)


def test_tokenize_detokenize_ping_and_model_cards(server, client):
    tok = server.engine.tokenizer
    r = post(server, "/tokenize", {"model": MODEL, "prompt": "Hello world", "return_token_strs": True}).json()
    assert r["tokens"] == tok.encode("Hello world") and r["count"] == len(r["tokens"])
    assert r["token_strs"] == tok.convert_ids_to_tokens(r["tokens"]) and r["max_model_len"] == 8192
    assert post(server, "/detokenize", {"tokens": r["tokens"]}).json() == {"prompt": "Hello world"}
    bad = post(server, "/detokenize", {"tokens": [10**9]})
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
    chat = post(server, "/tokenize", {"messages": QUESTION}).json()
    assert chat["tokens"] == tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)["input_ids"]
    usage = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1).usage
    assert usage.prompt_tokens == chat["count"]
    assert httpx.get(server.url + "/ping").json() == {"status": "ok"}
    card = client.models.retrieve(MODEL).model_dump()
    assert card["max_model_len"] == 8192 and card["root"] == MODEL and card["permission"][0]["allow_sampling"]


def test_request_id_header_fingerprint_and_cached_tokens(server, client):
    r = httpx.get(server.url + "/health", headers={"X-Request-Id": "my-id-1"})
    assert r.headers["x-request-id"] == "my-id-1"
    assert len(httpx.get(server.url + "/health").headers["x-request-id"]) == 32  # one made up when none came
    prompt = "Tell me a story about a lighthouse keeper and the ship that came back. " * 3
    first = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    second = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert first.system_fingerprint and second.system_fingerprint == first.system_fingerprint
    block = server.engine.config.cache.block_size
    cached = (second.usage.prompt_tokens - 1) // block * block
    assert second.usage.prompt_tokens_details.cached_tokens == cached
    wait_idle(server)
    metrics = httpx.get(server.url + "/metrics").text
    def value(name: str, label: str = "") -> float:
        return next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith(name) and label in line)

    assert value("tachyon:prompt_tokens_cached_total") >= cached
    assert value("tachyon:request_params_max_tokens_bucket", 'le="1.0"') >= 2  # the two requests above


def test_request_chat_template_kwargs_continue_and_echo(server, client):
    tok = server.engine.tokenizer
    template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    ids = post(server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}], "chat_template": template,
                                     "chat_template_kwargs": {"greeting": "Hello: "}}).json()["tokens"]
    assert tok.decode(ids) == "Hello: hi|"
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                       extra_body={"chat_template": template, "chat_template_kwargs": {"greeting": "Hello: "}})
    assert r.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs may not set \\['tokenize'\\]"):
        client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1,
                                       extra_body={"chat_template_kwargs": {"tokenize": False}})
    # continue the assistant's unfinished answer; echo repeats it in front of the continuation
    partial = [*QUESTION, {"role": "assistant", "content": "The capital of France is"}]
    body = {"continue_final_message": True, "add_generation_prompt": False}
    r = client.chat.completions.create(model=MODEL, messages=partial, max_tokens=3, temperature=0,
                                       extra_body={**body, "echo": True})
    assert r.choices[0].message.content.startswith("The capital of France is Paris")
    ids = post(server, "/tokenize", {"messages": partial, **body}).json()["tokens"]
    assert tok.decode(ids).endswith("<|im_start|>assistant\nThe capital of France is")  # left open
    stream = client.chat.completions.create(model=MODEL, messages=partial, max_tokens=3, temperature=0, stream=True,
                                            extra_body={**body, "echo": True})
    assert "".join(c.choices[0].delta.content or "" for c in stream) == r.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="cannot both be true"):
        client.chat.completions.create(model=MODEL, messages=partial, max_tokens=1,
                                       extra_body={"continue_final_message": True})


def test_token_ids_as_logprob_tokens_and_text_only_parts(server, client):
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, logprobs=2,
                                  temperature=0, extra_body={"return_tokens_as_token_ids": True})
    lp = r.choices[0].logprobs
    ids = server.engine.tokenizer.encode(r.choices[0].text)
    assert lp.tokens == [f"token_id:{i}" for i in ids]
    assert all(k.startswith("token_id:") for top in lp.top_logprobs for k in top)
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                          {"type": "text", "text": "of France?"}]}]
    a = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=4, temperature=0)
    b = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=image, max_tokens=4)
    assert e.value.body["message"] == ("messages.0.content.1: a content part of type 'image_url': this model takes "
                                       "text only") and e.value.body["param"] == "messages.0.content.1"


def test_stream_one_choice_per_chunk_with_continuous_usage(server, client):
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4, n=2, temperature=1.0,
                                            seed=3, stream=True, stream_options={"include_usage": True,
                                                                                 "continuous_usage_stats": True})
    chunks = list(stream)
    assert all(len(c.choices) == 1 for c in chunks[:-1]) and chunks[-1].choices == []
    assert {c.choices[0].index for c in chunks[:-1]} == {0, 1}
    completion = [c.usage.completion_tokens for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 8  # grows with every chunk, to 2 x 4 tokens
    assert all(c.usage.prompt_tokens == chunks[-1].usage.prompt_tokens for c in chunks)
    wait_idle(server)


def test_cors_and_vllm_metric_names(server):
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.server.app import create_app
    from tachyon.server.frontend import FrontendOptions

    options = FrontendOptions(allowed_origins=["https://ui.example"], metrics_prefix="vllm")
    app = create_app(AsyncEngine(server.engine), MODEL, frontend=options)

    async def go():  # no lifespan: the engine loop is not started, and these routes do not need it
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            pre = await c.options("/v1/chat/completions", headers={
                "Origin": "https://ui.example", "Access-Control-Request-Method": "POST"})
            other = await c.options("/v1/chat/completions", headers={
                "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
            return pre, other, (await c.get("/metrics")).text

    pre, other, metrics = asyncio.run(go())
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://ui.example"
    assert other.status_code == 400
    names = {line.split("{")[0].split(" ")[0] for line in metrics.splitlines() if line and line[0] != "#"}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
            "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
            "vllm:e2e_request_latency_seconds_count", "vllm:gpu_cache_usage_perc",
            "vllm:time_per_output_token_seconds_bucket", "vllm:num_requests_waiting_by_reason",
            "vllm:cache_config_info", "vllm:request_params_n_bucket", "vllm:request_inference_time_seconds_sum",
            "vllm:request_prefill_kv_computed_tokens_count", "vllm:request_max_num_generation_tokens_bucket",
            "vllm:prompt_tokens_cached_total", "vllm:request_params_max_tokens_bucket",
            "vllm:iteration_tokens_total_bucket", "vllm:iteration_tokens_total_sum"} <= names
    assert not any(n.startswith("tachyon:") for n in names)


def test_logit_bias_allowed_token_ids_and_bad_words(server, client):
    tok = server.engine.tokenizer
    base = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0)
    assert "Paris" in base.choices[0].message.content
    r = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0,
                                       extra_body={"bad_words": ["Paris"]})
    assert "Paris" not in r.choices[0].message.content
    before = base.choices[0].message.content.split("Paris")[0]
    assert r.choices[0].message.content.startswith(before)
    x = tok.encode(" x", add_special_tokens=False)[0]
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0,
                                  logit_bias={str(x): 100}, extra_body={"ignore_eos": True})
    assert r.choices[0].text == " x" * 4
    yes, no = (tok.encode(w, add_special_tokens=False)[0] for w in (" yes", " no"))
    r = client.completions.create(model=MODEL, prompt="Is the sky blue? Answer:", max_tokens=3, temperature=1.0,
                                  seed=5, extra_body={"allowed_token_ids": [yes, no], "ignore_eos": True})
    assert set(tok.encode(r.choices[0].text, add_special_tokens=False)) <= {yes, no}
    for extra, words in [({"logit_bias": {"abc": 1}}, "the key 'abc' is not a token id"),
                         ({"logit_bias": {"5": 101}}, "numbers in [-100, 100]"),
                         ({"allowed_token_ids": [10**9]}, "outside the vocabulary"),
                         ({"bad_words": [""]}, "non-empty strings")]:
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, extra_body=extra)
        assert words in e.value.body["message"] and e.value.body["param"] == next(iter(extra))
    wait_idle(server)
