"""The OpenAI-compatible server against a live uvicorn on 127.0.0.1, through the official `openai` client and
raw HTTP. Short generations (8-16 tokens) keep it quick on a 2-core CPU."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

API_KEY = "test-key"  # as in conftest.py
MODEL = "SmolLM2-135M-Instruct"

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def wait_idle(server, timeout: float = 20.0) -> None:
    """Until no request is live and every KV block is back in the pool."""
    engine = server.engine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (not engine.has_unfinished_requests() and not engine.core.live_sequences()
                and engine.kv.num_free_blocks == engine.kv.num_blocks):
            engine.check_integrity()
            return
        time.sleep(0.05)
    raise AssertionError(f"engine not idle: {len(engine.request_ids())} requests, "
                         f"{engine.kv.num_free_blocks}/{engine.kv.num_blocks} blocks free")


def post(server, path: str, body, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    h = {"Content-Type": "application/json", **server.headers(), **(headers or {})}
    return httpx.post(f"{server.url}{path}", content=content, headers=h, timeout=60)


def metrics(server) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(m: dict, name: str, **labels) -> float:
    return m.get((name, tuple(sorted({"model_name": MODEL, **labels}.items()))), 0.0)


# -- discovery ---------------------------------------------------------------------------------------------
def test_models_health_version(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert httpx.get(f"{server.url}/version").json()["version"]


# -- completions -------------------------------------------------------------------------------------------
def test_start_up_does_what_the_first_request_would_pay_for(server):
    # the prompt-length bound reads the whole vocabulary (42 ms for Llama 3's): computed when the app is built, not
    # by the first request (an H100 serve run handed its first request to the core 91 ms after it arrived)
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.server.app import create_app

    serving = create_app(AsyncEngine(server.app.state.engine), MODEL).state.serving
    assert {"_max_prompt_chars", "_batch_encoder"} <= set(vars(serving))
    longest = max(len(t) for t in serving.tokenizer.get_vocab())
    assert serving._max_prompt_chars == serving.engine.config.scheduler.max_model_len * longest


def test_completion(server, client):
    t0 = int(time.time())
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.id.startswith("cmpl-") and r.object == "text_completion" and r.model == MODEL
    assert t0 - 1 <= r.created <= time.time() + 1
    assert len(r.choices) == 1 and r.choices[0].index == 0
    assert r.choices[0].finish_reason == "length" and r.choices[0].text
    n_prompt = len(server.engine.tokenizer.encode(PROMPT))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n_prompt, 8, n_prompt + 8)


def test_completion_stream_equals_full(client):
    full = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == full.usage.completion_tokens
    assert usage.usage.prompt_tokens == full.usage.prompt_tokens


def test_prompt_list_and_token_ids_with_n(server, client):
    ids = server.engine.tokenizer.encode(PROMPT)
    r = client.completions.create(model=MODEL, prompt=[PROMPT, "Hello"], n=2, max_tokens=6, temperature=0.8,
                                  seed=3, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 4 * 6
    r2 = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    r3 = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    assert r2.choices[0].text == r3.choices[0].text and r2.usage.prompt_tokens == len(ids)
    r4 = client.completions.create(model=MODEL, prompt=[ids, ids], max_tokens=4, temperature=0)
    assert [c.text for c in r4.choices] == [r3.choices[0].text[: len(r4.choices[0].text)]] * 2


def test_n_streaming(client):
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, n=3, max_tokens=8, temperature=1.0,
                                            seed=7, stream=True, extra_body={"ignore_eos": True}))
    texts = {i: "" for i in range(3)}
    finish = {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert finish == {0: "length", 1: "length", 2: "length"}
    full = client.completions.create(model=MODEL, prompt=PROMPT, n=3, max_tokens=8, temperature=1.0, seed=7,
                                     extra_body={"ignore_eos": True})
    assert [texts[i] for i in range(3)] == [c.text for c in sorted(full.choices, key=lambda c: c.index)]


def test_seed_reproducible(client):
    def once(seed):
        return client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=1.0,
                                         seed=seed).choices[0].text

    assert once(1234) == once(1234)
    assert len({once(s) for s in (1, 2, 3, 4)}) > 1


def test_stop_string(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    words = base.split()
    stop = words[len(words) // 2]
    want = base[: base.index(stop)]
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.choices[0].stop_reason == stop  # vLLM's extra field
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0, stop=stop,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for value, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert value <= 0 and 2 <= len(top) <= 3
        assert max(top.values()) == pytest.approx(value)  # greedy: the sampled token is the most likely
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]


# -- chat --------------------------------------------------------------------------------------------------
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]


def test_chat(server, client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=8, temperature=0)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert r.choices[0].finish_reason in ("stop", "length")
    ids = server.engine.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens <= len(ids) + 8

    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_chat_n_seed_logprobs(client):
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=1.0, seed=11, n=2)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert sorted(c.index for c in a.choices) == [0, 1]
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
                                       top_logprobs=3, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 4 and "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert bytes(t.bytes).decode("utf-8") == t.token


# -- bad input: exact status and error type; the engine keeps serving -----------------------------------------
@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": ', 400, None),  # invalid JSON
    ("/v1/completions", b'["not", "an", "object"]', 400, None),
    ("/v1/completions", {"model": "gpt-5", "prompt": "hi"}, 404, "model"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "8"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": 42}, 400, "prompt"),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),  # missing
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**6}, 400, "max_tokens"),  # beyond the context
    ("/v1/completions", {"prompt": [5] * 9000, "max_tokens": 4}, 400, "prompt"),  # prompt alone too long
    ("/v1/completions", {"prompt": [10**7]}, 400, "prompt"),  # outside the vocabulary
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stop": [""]}, 400, "stop"),
])
def test_bad_request(server, path, body, status, param):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]
    assert err["code"] == status and err["message"]
    assert err["param"] == param


def test_auth_and_unknown_route(server):
    body = {"prompt": "hi", "max_tokens": 2}
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic test-key"}):
        r = post(server, "/v1/completions", body, headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    r = httpx.get(f"{server.url}/v1/models")
    assert r.status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # operations routes need no key
    r = httpx.get(f"{server.url}/v1/nothing-here", headers=server.headers())
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    r = httpx.get(f"{server.url}/v1/completions", headers=server.headers())
    assert r.status_code == 405 and "error" in r.json()


def test_engine_survives_bad_requests(server, client):
    for _ in range(3):
        post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 10**6})
        post(server, "/v1/completions", b"{")
    assert server.app.state.async_engine.is_running
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.choices[0].text
    wait_idle(server)


# -- concurrency and disconnects -----------------------------------------------------------------------------
def test_32_concurrent_streams(server):
    async def one(aclient, i):
        text, finish = "", None
        stream = await aclient.completions.create(model=MODEL, prompt=f"Story {i}:", max_tokens=8, temperature=0.7,
                                                  seed=i, stream=True, extra_body={"ignore_eos": True})
        async for chunk in stream:
            for ch in chunk.choices:
                text += ch.text
                finish = ch.finish_reason or finish
        return text, finish

    async def main():
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*(one(aclient, i) for i in range(32)))
        finally:
            await aclient.close()

    results = asyncio.run(main())
    assert len(results) == 32 and all(finish == "length" and text for text, finish in results)
    wait_idle(server)


def test_client_killed_mid_stream_frees_blocks(server):
    wait_idle(server)
    before = metrics(server)
    engine = server.engine
    body = {"prompt": PROMPT, "max_tokens": 500, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", f"{server.url}/v1/completions", json=body, headers=server.headers()) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            for line in lines:
                if line.startswith("data: "):
                    got += 1
                    if got == 3:
                        break
            assert engine.kv.num_free_blocks < engine.kv.num_blocks  # the request holds blocks now
        # leaving both blocks closes the connection mid-stream
    wait_idle(server)
    after = metrics(server)
    assert sample(after, "tachyon:request_success_total", finished_reason="abort") == \
        sample(before, "tachyon:request_success_total", finished_reason="abort") + 1
    generated = sample(after, "tachyon:generation_tokens_total") - sample(before, "tachyon:generation_tokens_total")
    assert 3 <= generated < 500


def test_no_max_tokens_is_capped_to_the_kv_cache(server):
    """Chat without max_tokens means "up to the context"; where the KV cache is smaller, up to what it holds."""
    assert server.engine.kv.num_blocks * server.engine.kv.block_size < server.engine.config.scheduler.max_model_len
    body = {"messages": MESSAGES, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=server.headers(),
                      timeout=60) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith("data: "))
    wait_idle(server)


def test_non_streaming_client_disconnect_aborts(server):
    wait_idle(server)
    body = {"prompt": PROMPT, "max_tokens": 500, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=body, headers=server.headers(), timeout=1.5)
    wait_idle(server)


# -- metrics ------------------------------------------------------------------------------------------------
def test_metrics_counters_move(server, client):
    wait_idle(server)
    before = metrics(server)
    ids = list(range(1000, 1023))
    first = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    wait_idle(server)
    mid = metrics(server)
    second = client.completions.create(model=MODEL, prompt=ids, max_tokens=3, n=2, temperature=0.5,
                                       extra_body={"ignore_eos": True})
    wait_idle(server)
    after = metrics(server)

    def delta(name, **labels):
        return sample(after, name, **labels) - sample(before, name, **labels)

    # tokens per engine step (vLLM's iteration_tokens_total): the first request's prefill, then 4 decodes
    cached = first.usage.prompt_tokens_details.cached_tokens
    name = "tachyon:iteration_tokens_total"
    steps = {k: sample(mid, f"{name}_{k}") - sample(before, f"{name}_{k}") for k in ("count", "sum")}
    assert steps == {"count": 5, "sum": len(ids) - cached + 4}
    assert sample(mid, f"{name}_bucket", le="1.0") - sample(before, f"{name}_bucket", le="1.0") == 4
    # the request families: n, max_tokens, the longest choice, running time, prompt tokens computed/cached
    assert delta("tachyon:request_params_n_sum") == 1 + 2 and delta("tachyon:request_params_n_count") == 2
    assert delta("tachyon:request_params_max_tokens_sum") == 5 + 3
    assert delta("tachyon:request_max_num_generation_tokens_sum") == 5 + 3
    assert delta("tachyon:request_inference_time_seconds_count") == 2
    all_cached = cached + second.usage.prompt_tokens_details.cached_tokens
    assert delta("tachyon:prompt_tokens_cached_total") == all_cached
    assert delta("tachyon:request_prefill_kv_computed_tokens_sum") == 2 * len(ids) - all_cached

    assert delta("tachyon:prompt_tokens_total") == 2 * len(ids)
    assert delta("tachyon:generation_tokens_total") == 5 + 2 * 3
    assert delta("tachyon:request_success_total", finished_reason="length") == 3  # one per sequence
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                 "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_time_per_output_token_seconds", "request_prompt_tokens", "request_generation_tokens"):
        assert delta(f"tachyon:{hist}_count") == 2, hist
    assert delta("tachyon:request_prompt_tokens_sum") == 2 * len(ids)
    assert delta("tachyon:request_generation_tokens_sum") == 5 + 6
    assert delta("tachyon:inter_token_latency_seconds_count") == (5 - 1) + 2 * (3 - 1)
    assert delta("tachyon:prefix_cache_queries_total") >= 2 * len(ids)
    assert delta("tachyon:prefix_cache_hits_total") >= 16  # the second request found the first one's block
    assert delta("tachyon:http_requests_total", route="/v1/completions", status="200") == 2
    assert sample(after, "tachyon:num_requests_running") == 0 and sample(after, "tachyon:num_requests_waiting") == 0
    assert sample(after, "tachyon:kv_cache_usage_perc") == 0.0
    for name in ("tachyon:num_preemptions_total", "tachyon:kv_cache_num_blocks"):
        assert (name, (("model_name", MODEL),)) in after


def test_alerts_and_dashboard_use_exposed_metrics(server):
    """Every `tachyon:` series named in deploy/ exists at /metrics (catches renames on either side)."""
    import pathlib
    import re

    assert post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 1}).status_code == 200
    wait_idle(server)
    exposed = {name for name, _ in metrics(server)}
    from tachyon.server.gpu_metrics import SERIES, open_nvml

    if open_nvml() is None:  # GPU series come from NVML only where there is a GPU
        exposed |= set(SERIES)
    root = pathlib.Path(__file__).resolve().parents[2] / "deploy"
    for path in (root / "prometheus" / "alerts.yml", root / "grafana" / "tachyon.json"):
        used = set(re.findall(r"tachyon:[a-z0-9_]+", path.read_text()))
        assert used and used <= exposed, f"{path.name}: {sorted(used - exposed)} not at /metrics"
    json.loads((root / "grafana" / "tachyon.json").read_text())


@pytest.mark.parametrize("route,body", [
    ("/v1/completions", {"prompt": "The capital of France is"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
])
def test_a_request_arrives_when_the_server_takes_it_not_after_tokenizing(server, monkeypatch, route, body):
    # TTFT, queue time and the debug timeline count from the arrival: the engine is handed the moment the route
    # began (before the body was read, parsed and tokenized), not the moment it admitted the request
    engine = server.engine
    seen = []
    real_add = engine.add_request

    def add_request(request_id, prompt, ids, params, arrival_time=None, stream=True):
        seen.append((arrival_time, time.monotonic()))
        return real_add(request_id, prompt, ids, params, arrival_time, stream=stream)

    monkeypatch.setattr(engine, "add_request", add_request)
    before = time.monotonic()
    r = httpx.post(server.url + route, json={"model": MODEL, "max_tokens": 2, **body}, headers=server.headers(),
                   timeout=60)
    assert r.status_code == 200, r.text
    [(arrival, added)] = seen
    assert arrival is not None and before < arrival < added
