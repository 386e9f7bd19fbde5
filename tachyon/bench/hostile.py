"""Hostile requests against an OpenAI-compatible server: the catalogue, and how to judge each answer.

Used by the hostile-input tests (tests/integration/test_hostile.py) and by the measurement
(benchmarks/hostile.py), so both try the same cases and count the same outcome classes:

    for every field of both endpoints:  wrong types, null, negative, zero, huge, out-of-range values
    then malformed bodies:              invalid JSON / UTF-8, deep nesting, wrong shapes, odd numbers

A case is answered well when its status is one it allows (200, or a 4xx whose body is OpenAI's error shape
and whose `param` names the field the case broke); a 5xx, a malformed body or a wrong `param` is a defect.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
BASE = {COMPLETIONS: {"prompt": "Hello", "max_tokens": 2},
        CHAT: {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}}

# Every top-level field each endpoint models (tachyon.server.protocol), plus fields clients send that the
# server must refuse by name; listed here, not imported, so the catalogue also runs against other servers.
SHARED_FIELDS = ["model", "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
                 "skip_special_tokens", "include_stop_str_in_output", "stream", "stream_options", "best_of",
                 "logit_bias", "response_format", "user", "metadata", "store", "service_tier", "max_tokens",
                 "logprobs", "allowed_token_ids", "bad_words", "guided_json", "prompt_logprobs", "no_such_field"]
FIELDS = {COMPLETIONS: ["prompt", *SHARED_FIELDS, "echo", "suffix", "add_special_tokens"],
          CHAT: ["messages", *SHARED_FIELDS, "max_completion_tokens", "top_logprobs", "add_generation_prompt",
                 "tools", "tool_choice", "parallel_tool_calls", "modalities"]}

# The values every field gets: wrong types, null, negative, zero, huge, out of range. QUICK is the tests'
# share (fields both endpoints share get its first four on the chat endpoint: the same model checks them).
VALUES = [None, "x", True, 0, -1, 1.5, 2**63, 1e308, [], {}, "", -1e9, 2**31, 2**64, 10**30, [1], ["x"],
          {"type": "x"}, "9" * 2000]
QUICK = VALUES[:10]

# Values aimed at one field (the engine-side limits: vocabulary, context, --max-n, --max-logprobs).
SPECIAL = {
    "prompt": [[-1], [10**9], [2**63], [[]], [[1], [2]], ["", "a"], [[1], "a"], [True], [1.0]],
    "messages": [[{"role": "user"}], [{"role": "wizard", "content": "hi"}], [{"content": "hi"}],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
                 [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": "hi", "tool_calls": []}],
                 [{"role": "user", "content": "hi"}] * 100, ["hi"], [None]],
    "stop_token_ids": [[10**9], [-5], [2**63], list(range(2000))],
    "stop": [["x"] * 500, [""], [None], "\x00"],
    "n": [129, 2**31],
    "best_of": [129, 2],
    "logprobs": [21, 5],
    "top_logprobs": [21, 5],
    "top_k": [2**62, 10**6],
    "max_tokens": [10**6],
    "min_tokens": [5, 10**6],
    "seed": [-(2**63), 2**63 - 1],
    "logit_bias": [{"5": 100}, {"x": "y"}],
    "response_format": [{"type": "json_object"}, {"type": "text"}],
    "stream_options": [{"include_usage": True}, {"include_usage": "yes"}],
    "tools": [[{"type": "function", "function": {"name": "f"}}]],
    "tool_choice": ["none", "auto", "required"],
    "modalities": [["text"], ["audio"]],
}


@dataclass
class Case:
    name: str
    path: str
    body: bytes
    headers: dict = field(default_factory=lambda: {"Content-Type": "application/json"})
    field: str | None = None  # the field the case breaks: a 4xx must name it as `param`
    allowed: frozenset = frozenset({200, 400})


def _dumps(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


def field_cases(values: list = VALUES, shared_values: list | None = None) -> list[Case]:
    cases = []
    for path, names in FIELDS.items():
        for name in names:
            vals = shared_values if (path == CHAT and name in SHARED_FIELDS and shared_values is not None) else values
            for value in vals + SPECIAL.get(name, []):
                body = {**BASE[path], name: value}
                if path == CHAT and name in ("max_tokens", "max_completion_tokens") and value is None:
                    body = {**body, "max_tokens": None, "max_completion_tokens": 2}  # else: up to the context
                if name == "stream_options" and value not in (None,):
                    body["stream"] = bool(len(cases) % 2)  # half of them without stream: a 400 there
                allowed = frozenset({200, 400, 404}) if name == "model" else frozenset({200, 400})
                shown = repr(value) if len(repr(value)) < 40 else f"{type(value).__name__}[{len(value)}]"
                cases.append(Case(f"{path} {name}={shown}", path, _dumps(body), field=name, allowed=allowed))
    return cases


def body_cases() -> list[Case]:
    """Malformed bodies: each must be a 4xx with an OpenAI-style error body."""
    c = COMPLETIONS
    bad = {
        "invalid JSON": b'{"prompt": "hi", "max_tokens": ',
        "invalid UTF-8": b'{"prompt": "\xff\xfe", "max_tokens": 2}',
        "empty body": b"",
        "JSON null": b"null",
        "JSON array": b'["prompt"]',
        "JSON number": b"42",
        "JSON string": b'"prompt"',
        "deep nesting": b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "deep object nesting": b'{"metadata": ' + b'{"a":' * 50_000 + b"1" + b"}" * 50_000 + b', "prompt": "hi"}',
        "NaN literal": b'{"prompt": "hi", "temperature": NaN}',
        "Infinity literal": b'{"prompt": "hi", "top_p": Infinity}',
        "1e400": b'{"prompt": "hi", "temperature": 1e400}',
        "duplicate keys": b'{"prompt": "hi", "max_tokens": 2, "max_tokens": 10000000}',
        "trailing garbage": b'{"prompt": "hi"} {"prompt": "again"}',
        "10k unknown keys": _dumps({"prompt": "hi", **{f"k{i}": i for i in range(10_000)}}),
        "NUL in prompt": b'{"prompt": "a\\u0000b", "max_tokens": 2}',
        "lone surrogate": b'{"prompt": "\\ud800", "max_tokens": 2}',
    }
    cases = [Case(name, c, body, allowed=frozenset({200, 400})) for name, body in bad.items()]
    cases.append(Case("wrong Content-Type", c, _dumps(BASE[c]), headers={"Content-Type": "text/plain"},
                      allowed=frozenset({415})))
    cases.append(Case("form Content-Type", c, b"prompt=hi", allowed=frozenset({415}),
                      headers={"Content-Type": "application/x-www-form-urlencoded"}))
    return cases


def all_cases(quick: bool = False) -> list[Case]:
    """Every case; quick: the tests' share (every field still gets every kind of value on one endpoint)."""
    fields = field_cases(QUICK, QUICK[:4]) if quick else field_cases()
    return fields + body_cases()


def fuzz_cases():
    """A hypothesis strategy of Cases: either endpoint, random JSON in the shared fields, a random prompt.
    (hypothesis is a dev dependency: imported here, when fuzzing.)"""
    from hypothesis import strategies as st

    leaf = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
            | st.text(max_size=12))
    value = st.recursive(leaf, lambda i: st.lists(i, max_size=3) | st.dictionaries(st.text(max_size=6), i, max_size=3),
                         max_leaves=6)
    prompt = st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(-3, 60_000), min_size=1, max_size=16),
                       value)

    def case(endpoint, extra, p):
        body = {**BASE[endpoint], **extra}
        body["prompt" if endpoint == COMPLETIONS else "messages"] = (
            p if endpoint == COMPLETIONS else [{"role": "user", "content": p}])
        return Case("fuzz", endpoint, json.dumps(body).encode(), allowed=frozenset({200, 400, 404}))

    extra = st.fixed_dictionaries({}, optional={k: value for k in SHARED_FIELDS if k != "max_tokens"})
    return st.builds(case, st.sampled_from([COMPLETIONS, CHAT]), extra, prompt)


def judge(case: Case, r: httpx.Response) -> str:
    """The outcome class of one answer: 'ok 200', 'ok 4xx', or a defect ('5xx', 'bad status', ...)."""
    if r.status_code >= 500:
        return "5xx"
    if r.status_code not in case.allowed:
        return "bad status"
    if r.status_code == 200:
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            lines = [ln for ln in r.text.splitlines() if ln.startswith("data: ")]
            if not lines or lines[-1] != "data: [DONE]":
                return "bad stream"
            if any('"error"' in ln[:12] for ln in lines):
                return "error in stream"
        elif "choices" not in r.json():
            return "bad body"
        return "ok 200"
    try:
        err = r.json()["error"]
    except Exception:
        return "bad error body"
    if not (isinstance(err, dict) and err.get("code") == r.status_code and err.get("message") and "type" in err):
        return "bad error body"
    if case.field is not None and r.status_code == 400:
        param = err.get("param") or ""
        if not param.split(".")[0] == case.field and not _names_related(case.field, param):
            return "wrong param"
    return f"ok {r.status_code}"


# A case that breaks one field may rightly be refused for the field it conflicts with.
_RELATED = {"min_tokens": {"max_tokens"}, "max_tokens": {"min_tokens"}, "best_of": {"n"}, "n": {"best_of"},
            "stream_options": {"stream"}, "logprobs": {"top_logprobs"}, "top_logprobs": {"logprobs"},
            "tools": {"tool_choice"}, "tool_choice": {"tools"}, "echo": {"logprobs"}}


def _names_related(name: str, param: str) -> bool:
    return param.split(".")[0] in _RELATED.get(name, ())


def normal_request(client: httpx.Client) -> tuple[bool, float]:
    """One ordinary request: whether it succeeded, and its latency in seconds."""
    r = client.post(COMPLETIONS, json={"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0})
    return r.status_code == 200 and bool(r.json()["choices"]), r.elapsed.total_seconds()
