"""`tachyon serve`'s shape: the engine core in its own process, the HTTP process detokenizing and streaming.
Same tokens as the engine in one process; a dead core turns /health into 503 and every open request into an
error, never a hang."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from tachyon import SamplingParams
from tests.integration.conftest import API_KEY, serve_in_thread

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def reference(llm):
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24))
    prompt_lp = llm.generate(PROMPTS[0], SamplingParams(max_tokens=1, prompt_logprobs=1))[0].prompt_logprobs
    return [o.outputs[0].text for o in outs], prompt_lp


@pytest.fixture(scope="module")
def proc_server():
    from tachyon.build import build_engine_client
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.engine_args import EngineArgs
    from tachyon.server.app import create_app

    client = build_engine_client(EngineArgs(swap_space=0, kv_cache_memory_gib=0.25))
    app = create_app(AsyncEngine(client), "SmolLM2-135M-Instruct", api_key=API_KEY)
    with serve_in_thread(app) as url:
        yield url, client


def test_the_core_runs_in_another_process_and_gives_the_same_tokens(proc_server, reference):
    import os

    reference, prompt_lp = reference
    url, client = proc_server
    assert client.process.is_alive() and client.process.pid != os.getpid()
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
    results = [None] * len(PROMPTS)

    def one(i):  # concurrently, so the core batches them
        results[i] = oa.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPTS[i], max_tokens=24,
                                           temperature=0).choices[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == reference
    # streaming with a stop string found by the front end: the text ends before it, finish_reason "stop"
    stop = reference[1][len(reference[1]) // 2:][:3]
    chunks = list(oa.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPTS[1], max_tokens=24,
                                        temperature=0, stream=True, stop=[stop]))
    text = "".join(c.choices[0].text for c in chunks)
    assert reference[1].startswith(text) and stop not in text and chunks[-1].choices[0].finish_reason == "stop"
    metrics = httpx.get(f"{url}/metrics").text
    line = next(x for x in metrics.splitlines() if x.startswith("tachyon:generation_tokens_total"))
    assert float(line.split()[-1]) >= 3 * 24
    line = next(x for x in metrics.splitlines() if x.startswith("tachyon:iteration_tokens_total_count"))
    assert float(line.split()[-1]) >= 24  # the core's steps, counted in its process
    # prompt logprobs cross the pipe with the first token: the in-process engine's values
    r = oa.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPTS[0], max_tokens=1,
                              extra_body={"prompt_logprobs": 1})
    got = r.choices[0].model_extra["prompt_logprobs"]
    assert got[0] is None and len(got) == len(prompt_lp)
    for entry, ref in zip(got[1:], prompt_lp[1:], strict=True):
        assert {int(t): v["rank"] for t, v in entry.items()} == {t: x.rank for t, x in ref.items()}
        assert all(v["logprob"] == pytest.approx(ref[int(t)].logprob, abs=1e-4) for t, v in entry.items())


def test_grammars_compile_in_the_core_process(proc_server):
    """The core process loads the tokenizer for xgrammar itself and compiles the spec it is sent."""
    pytest.importorskip("xgrammar")
    url, _ = proc_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    r = client.completions.create(model="SmolLM2-135M-Instruct", prompt="JSON:", max_tokens=20, temperature=0,
                                  extra_body={"guided_json": schema})
    value = json.loads(r.choices[0].text)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and value["n"] in (1, 2, 3)


def test_a_dead_core_fails_open_requests_and_health_says_503(proc_server):
    url, client = proc_server
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "Tell me a long story.", "max_tokens": 2000,
            "temperature": 0, "ignore_eos": True, "stream": True}
    events = []
    with httpx.stream("POST", f"{url}/v1/completions", headers=headers, content=json.dumps(body), timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 3:
                client.process.kill()  # the core dies mid-request
            if line == "data: [DONE]":
                break
    errors = [json.loads(e) for e in events if e != "[DONE]" and "error" in json.loads(e)]
    assert events[-1] == "[DONE]" and errors, events[-3:]
    assert "engine" in errors[0]["error"]["message"]
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/health").status_code != 503:
        assert time.monotonic() < deadline, "/health still says ok after the core died"
        time.sleep(0.1)
    r = httpx.post(f"{url}/v1/completions", headers=headers,
                   content=json.dumps({"model": "SmolLM2-135M-Instruct", "prompt": "hi", "max_tokens": 4}))
    assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
