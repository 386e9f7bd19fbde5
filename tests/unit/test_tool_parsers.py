"""Tool-call parsers (hermes, llama3_json, mistral) on raw model text, and the streamed deltas of a choice
that may call tools: content streams until a call may start, calls arrive in OpenAI's delta shape."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pydantic")

from tachyon.server.tool_parsers import TOOL_PARSERS, ParsedCall  # noqa: E402
from tachyon.server.tools import ToolPlan, ToolStream  # noqa: E402

W = ParsedCall("get_weather", '{"city": "Paris"}')
A = ParsedCall("add", '{"a": 1, "b": 2}')


@pytest.mark.parametrize("name, text, content, calls", [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
               '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', "Let me check.\n", [W, A]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', None, [W]),  # unclosed
    ("hermes", "It is sunny.", "It is sunny.", []),
    ("hermes", "<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "add", "parameters": {"a": 1, "b": 2}}', None, [W, A]),
    ("llama3_json", '{"name": "get_weather", "arguments": {"city": "Paris"}}', None, [W]),
    ("llama3_json", '{"city": "Paris"}', '{"city": "Paris"}', []),  # JSON, but not a call
    ("mistral", 'Sure [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "add", "arguments": {"a": 1, "b": 2}}]', "Sure ", [W, A]),
    ("mistral", "[TOOL_CALLS] oops", "[TOOL_CALLS] oops", []),
])
def test_parsers(name, text, content, calls):
    assert TOOL_PARSERS[name]().parse(text) == (content, calls)


def _stream(plan, pieces):
    st, deltas, text = ToolStream(plan), [], ""
    for i, p in enumerate(pieces):
        text += p
        deltas.append(st.delta(text, i == len(pieces) - 1))
    return st, deltas


def test_auto_streams_content_until_a_call_may_start():
    plan = ToolPlan("auto", [], parser=TOOL_PARSERS["hermes"]())
    st, deltas = _stream(plan, ["Let me ", "check. <tool", "_call>", '{"name": "add", "arguments": {"a": 1, "b": 2}}',
                                "</tool_call>"])
    assert deltas[:4] == [{"content": "Let me "}, {"content": "check. "}, {}, {}]
    assert deltas[4] == {"tool_calls": [{"index": 0, "id": deltas[4]["tool_calls"][0]["id"], "type": "function",
                                         "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    assert st.called
    st, deltas = _stream(plan, ["Hi <tool", " no call after all"])  # a held-back prefix that was content
    assert "".join(d.get("content", "") for d in deltas) == "Hi <tool no call after all" and not st.called


def test_named_function_streams_its_arguments_as_they_come():
    plan = ToolPlan("named", [], function="add")
    st, deltas = _stream(plan, ['{"a": ', "1, ", '"b": 2}'])
    first = deltas[0]["tool_calls"][0]
    assert first == {"index": 0, "id": first["id"], "type": "function", "function": {"name": "add", "arguments": '{"a": '}}
    assert [d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]] == ["1, ", '"b": 2}']
    assert all(set(d["tool_calls"][0]) == {"index", "function"} for d in deltas[1:])


def test_required_calls_come_whole_at_the_end():
    plan = ToolPlan("required", [])
    text = json.dumps([{"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "get_weather", "parameters": {"city": "Paris"}}])
    _, deltas = _stream(plan, [text[:10], text[10:]])
    assert deltas[0] == {}
    calls = deltas[1]["tool_calls"]
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "add", {"a": 1, "b": 2}), (1, "get_weather", {"city": "Paris"})]


def test_required_keeps_the_whole_calls_before_a_cut():
    plan = ToolPlan("required", [])
    assert plan.parse('[{"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "get_we') == (None, [A])
    assert plan.parse('[{"name": "ad') == (None, [])
