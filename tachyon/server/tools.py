"""Tool calling on /v1/chat/completions: what `tools` and `tool_choice` ask for, and the answer's `tool_calls`.

    tool_choice    prompt (the model's own template)   grammar                          the text is read as
    none           no tools                            -                                content
    auto           tools                               -                                --tool-call-parser's format
    required       tools                               JSON array of {"name", "parameters"}  those calls (1..n)
    {function: f}  tools                               f's parameters schema            f's arguments

`required` and a named function are enforced by the grammar, so they always parse, whatever the model or its
template (vLLM does the same). With `parallel_tool_calls: false`, `required` makes exactly one call. A template
that never mentions `tools` gets them described in a system message instead, so the model still sees them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from tachyon.sampling_params import StructuredOutputsParams
from tachyon.server.errors import APIError
from tachyon.server.tool_parsers import TOOL_PARSERS, ParsedCall, ToolParser


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolPlan:
    mode: str  # "auto" | "required" | "named"
    tools: list[dict]  # OpenAI's {"type": "function", "function": {...}} entries, as sent
    parser: ToolParser | None = None  # auto
    function: str | None = None  # named
    spec: StructuredOutputsParams | None = None  # required / named

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content, calls) of a finished text."""
        if self.mode == "named":
            return None, [ParsedCall(self.function, text)]
        if self.mode == "required":
            return None, [ParsedCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False))
                          for c in _complete_items(text)]
        return self.parser.parse(text)


def _complete_items(text: str) -> list:
    """The whole items of a JSON array the grammar produced, even if max_tokens cut it off after some."""
    dec, items, i = json.JSONDecoder(), [], text.find("[") + 1
    while 0 < i < len(text):
        while i < len(text) and text[i] in " \n\t,":
            i += 1
        try:
            item, i = dec.raw_decode(text, i)
        except ValueError:
            break
        items.append(item)
    return items


def plan_tools(req, parser_name: str | None) -> ToolPlan | None:
    """The request's tool plan (None: no tools, or tool_choice "none"); APIError 400 for what cannot be served."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or ()]
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if choice == "none":
        return None
    if not tools:
        raise APIError(400, "tool_choice needs tools: give the functions the model may call", "tool_choice")
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tools: every function needs its own name", "tools")
    params = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"} for t in tools}
    if choice == "auto":
        if parser_name is None:
            raise APIError(400, 'tool_choice "auto" needs a tool-call parser: start the server with '
                                '--tool-call-parser {' + ",".join(TOOL_PARSERS) + '}, or send tool_choice '
                                '"required" or a named function (enforced by a grammar)', "tool_choice")
        return ToolPlan("auto", tools, parser=TOOL_PARSERS[parser_name]())
    if choice == "required":
        item = {"anyOf": [{"type": "object", "properties": {"name": {"enum": [n]}, "parameters": params[n]},
                           "required": ["name", "parameters"], "additionalProperties": False} for n in names]}
        schema = {"type": "array", "items": item, "minItems": 1}
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
        return ToolPlan("required", tools, spec=StructuredOutputsParams(json=schema))
    name = choice.function.name
    if name not in params:
        raise APIError(400, f"tool_choice names the function {name!r}, which is not among the tools "
                            f"({', '.join(names)})", "tool_choice")
    return ToolPlan("named", tools, function=name, spec=StructuredOutputsParams(json=params[name]))


def template_messages(messages: list[dict], tools: list[dict] | None, chat_template: str) -> list[dict]:
    """The conversation for the template; tools as a system message if the template does not render them."""
    if not tools or "tools" in chat_template:
        return messages
    text = ("You may call these functions. To call one, answer with a JSON object "
            '{"name": <function name>, "arguments": <its arguments>} inside <tool_call></tool_call> tags.\n'
            + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    if messages and messages[0]["role"] in ("system", "developer"):
        return [{**messages[0], "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def history_tool_calls(calls) -> list[dict]:
    """An assistant message's tool_calls, for the template: arguments as objects where they parse (what
    transformers' templates expect)."""
    out = []
    for c in calls:
        try:
            args = json.loads(c.function.arguments)
        except ValueError:
            args = c.function.arguments
        out.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
    return out


def message_with_calls(plan: ToolPlan, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """The non-streamed choice's message and its finish_reason ("tool_calls" when the model called)."""
    content, calls = plan.parse(text)
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": call_id(), "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        if finish_reason == "stop":
            finish_reason = "tool_calls"
    return msg, finish_reason


@dataclass
class ToolStream:
    """One streamed choice: cumulative text in, OpenAI delta fields out. A named function streams its arguments
    as they come; `required` and parsed calls come whole when the choice ends; `auto` streams the text that is
    surely content before that."""

    plan: ToolPlan
    sent: int = 0  # characters of text (named: arguments) already sent
    ids: list[str] = field(default_factory=list)
    called: bool = False

    def delta(self, text: str, finished: bool) -> dict:
        plan = self.plan
        if plan.mode == "named":
            piece = text[self.sent:]
            self.sent = len(text)
            if not self.ids:
                self.ids.append(call_id())
                self.called = True
                return {"tool_calls": [{"index": 0, "id": self.ids[0], "type": "function",
                                        "function": {"name": plan.function, "arguments": piece}}]}
            return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if piece else {}
        if not finished:
            if plan.mode == "required":
                return {}
            end = plan.parser.content_end(text)
            piece = text[self.sent:end] if end > self.sent else ""
            self.sent = max(self.sent, end)
            return {"content": piece} if piece else {}
        content, calls = plan.parse(text)
        out: dict = {}
        if calls:
            rest = (content or "")[self.sent:]
            self.called = True
            out["tool_calls"] = [{"index": i, "id": call_id(), "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]
        else:
            rest = text[self.sent:]
        if rest:
            out["content"] = rest
        self.sent = len(text)
        return out
