"""Tool-call parsers: a model's raw text in, (content, tool calls) out, one per format (vLLM's names, chosen with
`tachyon serve --tool-call-parser NAME`).

    hermes       Hermes / Qwen:  text <tool_call>{"name": "f", "arguments": {...}}</tool_call> <tool_call>...
    llama3_json  Llama 3.x:      [<|python_tag|>]{"name": "f", "parameters": {...}}; {"name": "g", ...}
    mistral      Mistral:        text [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]

Text that does not parse as the format's calls is content, never an error: the model answered in words.
While streaming, `content_end` says how much of the text so far is surely content (a call may start after it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it


def _call(obj, args_key: str = "arguments") -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json_values(text: str) -> list | None:
    """The JSON values in `text`, separated by whitespace or `;` (None if anything else is there)."""
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and (text[i].isspace() or text[i] == ";"):
            i += 1
        if i == len(text):
            return out
        try:
            value, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)


def _content(text: str) -> str | None:
    """Text before the calls, as the model wrote it (a streamed prefix of it stays a prefix); None if blank."""
    return text if text.strip() else None


def _held_back(text: str, marker: str) -> int:
    """Where `text` may start `marker` (its first occurrence, or a suffix that is a prefix of it); len(text) if
    nowhere."""
    at = text.find(marker)
    if at >= 0:
        return at
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


class ToolParser:
    name = ""
    skip_special_tokens = True  # False where the format's marker is a special token the detokenizer would drop

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        raise NotImplementedError

    def content_end(self, text: str) -> int:
        raise NotImplementedError


class HermesParser(ToolParser):
    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)

    def parse(self, text):
        at = text.find(self.START)
        if at < 0:
            return text, []
        calls = []
        for body in self._BLOCK.findall(text[at:]):
            values = _json_values(body.strip())
            call = _call(values[0]) if values and len(values) == 1 else None
            if call is None:
                return text, []
            calls.append(call)
        return _content(text[:at]), calls

    def content_end(self, text):
        return _held_back(text, self.START)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    skip_special_tokens = False
    TAG = "<|python_tag|>"

    def parse(self, text):
        body = text.strip()
        if body.startswith(self.TAG):
            body = body[len(self.TAG):]
        if not body.lstrip().startswith("{"):
            return text, []
        values = _json_values(body)
        calls = [_call(v, "parameters") for v in values] if values else []
        if not calls or any(c is None for c in calls):
            return text, []
        return None, calls

    def content_end(self, text):
        head = text.lstrip()
        if not head or head.startswith("{") or head.startswith(self.TAG) or self.TAG.startswith(head):
            return 0  # it may be a call: hold it all until it is decided
        return len(text)


class MistralParser(ToolParser):
    name = "mistral"
    skip_special_tokens = False
    START = "[TOOL_CALLS]"

    def parse(self, text):
        at = text.find(self.START)
        if at < 0:
            return text, []
        values = _json_values(text[at + len(self.START):].strip())
        items = values[0] if values and len(values) == 1 and isinstance(values[0], list) else values
        calls = [_call(v) for v in items] if items else []
        if not calls or any(c is None for c in calls):
            return text, []
        return _content(text[:at]), calls

    def content_end(self, text):
        return _held_back(text, self.START)


TOOL_PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)}
