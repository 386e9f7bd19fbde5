"""Hostile input against a live server: every field of both endpoints with wrong types, null, negative, zero,
huge and out-of-range values, malformed bodies, property-based fuzzing of the request bodies, and OpenAI's
field semantics (null, unsupported fields, stream_options). After every case a normal request still succeeds
and, at the end, nothing is left running and every KV block is free. (Body size, Content-Type, disconnects
mid-body and auth: test_server_gate.py. The soak: test_soak.py.)"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from tachyon.bench.hostile import (
    BASE,
    CHAT,
    COMPLETIONS,
    all_cases,
    fuzz_cases,
    judge,
    normal_request,
)
from tests.integration.test_server import MESSAGES, MODEL, post, wait_idle


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=120) as c:
        yield c


def test_every_field_and_malformed_bodies(server, http):
    outcomes: Counter = Counter()
    defects = []
    since_check: list[str] = []
    for case in all_cases(quick=True):
        r = http.post(case.path, content=case.body, headers=case.headers)
        outcome = judge(case, r)
        outcomes[outcome] += 1
        if not outcome.startswith("ok"):
            defects.append((case.name, outcome, r.status_code, r.text[:300]))
        # after every 8 cases the engine ran (anything but a 400: those are refused before the engine sees
        # them), a normal request still succeeds (a broken engine stays broken, so the check finds it, and names
        # the cases since the last one)
        since_check += [case.name] if r.status_code != 400 else []
        if len(since_check) == 8:
            if not normal_request(http)[0]:
                defects.append((since_check, "a normal request failed after these"))
            since_check = []
    if not normal_request(http)[0]:
        defects.append(("all cases", "a normal request failed after them"))
    assert not defects, defects[:10]
    print(dict(outcomes))
    assert outcomes["ok 200"] >= 50 and outcomes["ok 400"] >= 300  # both answers are exercised
    assert server.app.state.async_engine.is_running
    wait_idle(server)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=fuzz_cases())
def test_fuzzed_bodies_never_break_the_server(server, http, case):
    r = http.post(case.path, content=case.body, headers=case.headers)
    assert judge(case, r).startswith("ok"), (case.body[:300], r.status_code, r.text[:300])
    if r.status_code == 400:  # the param named is a field the body has
        param = r.json()["error"]["param"]
        assert param is None or param.split(".")[0] in json.loads(case.body), (param, case.body[:300])
    assert normal_request(http)[0]


# -- OpenAI's field semantics ------------------------------------------------------------------------------
def test_null_means_the_default(server, http):
    body = {"prompt": "Once upon a time", "ignore_eos": True, "temperature": 0, "max_tokens": None, "n": None,
            "top_p": None, "stop": None, "seed": None, "logprobs": None, "stream": None, "stream_options": None,
            "presence_penalty": None, "frequency_penalty": None, "user": None, "echo": None, "best_of": None}
    r = http.post(COMPLETIONS, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16  # OpenAI's default for completions
    chat = {"messages": MESSAGES, "max_tokens": 3, "max_completion_tokens": None, "logprobs": None,
            "top_logprobs": None, "temperature": None, "tools": None, "tool_choice": None, "ignore_eos": True}
    r = http.post(CHAT, json=chat)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


@pytest.mark.parametrize("path, extra, param, words", [
    (COMPLETIONS, {"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream"),
    (COMPLETIONS, {"response_format": {"type": "xml"}}, "response_format", "must be {\"type\": \"text\"}"),
    (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format", 'the JSON schema cannot be compiled: Unsupported type "objectx"'),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice", "needs a tool-call parser"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {
        "type": "function", "function": {"name": "g"}}}, "tool_choice", "'g', which is not among the tools (f)"),
    (CHAT, {"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
    (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
            "response_format": {"type": "json_object"}}, "response_format", "constrains the output itself"),
    (COMPLETIONS, {"guided_json": "{not json"}, "guided_json", "the JSON schema cannot be compiled"),
    (COMPLETIONS, {"guided_regex": "a("}, "guided_regex", "the regex cannot be compiled: Regex parsing error"),
    (COMPLETIONS, {"structured_outputs": {"grammar": "root ::= foo"}}, "structured_outputs",
     'the EBNF grammar cannot be compiled: EBNF parser error at line 1, column 10: Rule "foo" is not defined'),
    (COMPLETIONS, {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs", "exactly one of"),
    (COMPLETIONS, {"guided_regex": "a+", "guided_choice": ["x"]}, "guided_choice", "one way of constraining"),
    (COMPLETIONS, {"guided_regex": "a+", "min_tokens": 2}, "min_tokens", "must be 0 with structured outputs"),
    (COMPLETIONS, {"prompt_logprobs": 21}, "prompt_logprobs", "--max-logprobs"),
    (CHAT, {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "not available when `stream=True`"),
    (CHAT, {"use_beam_search": True}, "use_beam_search", "not supported"),
    (COMPLETIONS, {"frobnicate": 1}, "frobnicate", "does not know this field"),
    (CHAT, {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages.0",
     "tool_calls belong to assistant messages"),
    (COMPLETIONS, {"stop_token_ids": [10**9], "min_tokens": 1}, "stop_token_ids", "outside the vocabulary"),
    (COMPLETIONS, {"top_k": 2**63, "temperature": 0.8}, "top_k", "out of range"),
    (COMPLETIONS, {"seed": 2**64}, "seed", "int64"),
    (COMPLETIONS, {"n": 129}, "n", "--max-n"),
    (COMPLETIONS, {"logprobs": 21}, "logprobs", "--max-logprobs"),
    (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "--max-logprobs"),
    (CHAT, {"max_completion_tokens": 10**6}, "max_completion_tokens", "exceeds the model's context"),
    (CHAT, {"messages": [{"role": "user", "content": "hi " * 20_000}]}, "messages", "context"),
    (COMPLETIONS, {"prompt": "hello " * 2_000_000}, "prompt", "shorten the prompt"),  # 12 MB: never tokenized
])
def test_refused_with_the_field_named(server, http, path, extra, param, words):
    r = http.post(path, json={**BASE[path], **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err == {"message": err["message"], "type": "BadRequestError", "param": param, "code": 400}
    assert words in err["message"]


def test_accepted_fields_that_change_nothing(http):
    for path, extra in [(COMPLETIONS, {"user": "u", "metadata": {"k": "v"}, "store": False}),
                        (CHAT, {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none",
                                "parallel_tool_calls": False, "modalities": ["text"],
                                "response_format": {"type": "text"}})]:
        r = http.post(path, json={**BASE[path], **extra})
        assert r.status_code == 200, r.text


# -- bounded work ----------------------------------------------------------------------------------------------
def test_request_timeout_aborts_and_answers_504(server, http):
    serving = server.app.state.serving
    serving.request_timeout = 0.5
    try:
        body = {"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True}
        r = http.post(COMPLETIONS, json=body)
        assert r.status_code == 504, r.text
        err = r.json()["error"]
        assert err["type"] == "GatewayTimeoutError" and "--request-timeout" in err["message"]
        with http.stream("POST", COMPLETIONS, json={**body, "stream": True}) as resp:
            lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and '"code":504' in lines[-2]
        assert '"finish_reason":"abort"' in lines[-3]
        assert http.post(COMPLETIONS, json=BASE[COMPLETIONS]).status_code == 200  # short ones still finish
    finally:
        serving.request_timeout = None
    wait_idle(server)


def test_health_answers_while_a_huge_prompt_is_refused(server, http):
    """A 12 MB prompt (inside the 16 MiB body limit) is refused without tokenizing it, and /health answers
    while it is on its way."""
    answered = []

    def probe():
        for _ in range(20):
            answered.append(httpx.get(f"{server.url}/health", timeout=30).status_code)
            time.sleep(0.02)

    t = threading.Thread(target=probe)
    t.start()
    r = http.post(COMPLETIONS, json={"prompt": "lorem ipsum " * 1_000_000, "max_tokens": 2})
    t.join()
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert answered == [200] * 20


def test_engine_failure_is_a_500_for_that_request_only(server, http):
    """The second wall through HTTP: a request whose sampling raises inside the engine gets a 500 (a stream:
    an error event and [DONE]); the one beside it finishes; the engine keeps serving."""
    sampler = server.engine.runner.sampler
    real = sampler.sample_tokens

    def sample_tokens(logits, reqs, num_outputs=None):
        if any(r.sampling_params.seed == 666 for r in reqs):
            raise RuntimeError("injected fault")
        return real(logits, reqs, num_outputs)

    sampler.sample_tokens = sample_tokens
    try:
        r = http.post(COMPLETIONS, json={**BASE[COMPLETIONS], "seed": 666})
        assert r.status_code == 500 and "injected fault" in r.json()["error"]["message"]
        with http.stream("POST", COMPLETIONS, json={**BASE[COMPLETIONS], "seed": 666, "stream": True}) as resp:
            lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and '"code":500' in lines[-2]
        assert post(server, COMPLETIONS, {**BASE[COMPLETIONS], "model": MODEL}).status_code == 200
    finally:
        sampler.sample_tokens = real
    assert server.app.state.async_engine.is_running
    wait_idle(server)
