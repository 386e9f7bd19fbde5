"""Tool calling through the official `openai` client against the live server (embedded model): tool_choice
"required" and a named function always give calls that validate against the functions' schemas (greedy and
sampled), the client's stream helpers assemble streamed calls, the history carries calls and their results,
and what cannot be served is a 400 naming the field."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.integration.conftest import API_KEY, MODEL

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "unit": {"enum": ["C", "F"]}},
           "required": ["city", "unit"]}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Add two digits", "parameters": ADD}}]
SCHEMA = {"get_weather": WEATHER, "add": ADD}
MESSAGES = [{"role": "user", "content": "What is the weather in Rome? And what is 2 + 3?"}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


def _valid(calls, names=None):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert names is None or c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMA[c.function.name])


def test_required_and_named_always_give_valid_calls(server):
    async def one(client, tool_choice, seed, parallel):
        kw = {"temperature": 0} if seed is None else {"temperature": 1.3, "seed": seed}
        r = await client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
                                                 max_tokens=80, parallel_tool_calls=parallel, **kw)
        return tool_choice, parallel, r.choices[0]

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)
        named = {"type": "function", "function": {"name": "add"}}
        return await asyncio.gather(*(one(client, tc, seed, par) for tc in ("required", named)
                                      for seed, par in ((None, None), (1, False), (2, None))))

    for tool_choice, parallel, choice in asyncio.run(main()):
        # parallel calls may go on until max_tokens: the whole calls before the cut are still returned
        assert choice.finish_reason == "tool_calls" or (tool_choice, parallel) == ("required", None)
        assert choice.message.content is None
        calls = choice.message.tool_calls
        if tool_choice == "required":
            _valid(calls)
            assert parallel is not False or len(calls) == 1
        else:
            _valid(calls, {"add"})
            assert len(calls) == 1


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_calls_assemble_in_the_client(client, tool_choice):
    kw = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 80,
          "temperature": 0, "parallel_tool_calls": False}
    with client.chat.completions.stream(**kw) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        final = stream.get_final_completion().choices[0]
    whole = client.chat.completions.create(**kw).choices[0]
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    _valid(final.message.tool_calls)
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    firsts = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or []) if tc.id is not None]
    assert [tc.function.name for tc in firsts] == [c.function.name for c in whole.message.tool_calls]
    if tool_choice != "required":  # a named function's arguments stream as they are generated
        assert sum(bool(ch.choices and ch.choices[0].delta.tool_calls) for ch in chunks) > 2


def test_history_with_calls_and_results_and_auto(server, client):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="none", max_tokens=8,
                                       temperature=0)
    assert r.choices[0].message.content and r.choices[0].message.tool_calls is None
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=8)
    err = e.value.response.json()["error"]
    assert err["param"] == "tool_choice" and "--tool-call-parser" in err["message"]
    serving = server.app.state.serving
    serving.tool_call_parser = "hermes"
    try:  # the model answers in words: content, no calls
        r = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=8, temperature=0)
    finally:
        serving.tool_call_parser = None
    assert r.choices[0].message.content and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "length"
