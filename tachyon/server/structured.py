"""The request fields that ask for structured outputs, turned into one StructuredOutputsParams.

    response_format {"type": "json_object"}                          ─► json_object
    response_format {"type": "json_schema", "json_schema": {"schema": S}} ─► json = S (no schema: json_object)
    structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object": ...}   (vLLM)
    guided_json / guided_regex / guided_choice / guided_grammar                         (vLLM, older names)

At most one of them per request; the grammar is compiled (or found in the cache) in a worker thread before the
request is admitted, so a schema xgrammar refuses is a 400 naming the field, and the event loop never compiles.
"""

from __future__ import annotations

import asyncio

from tachyon.sampling_params import InvalidRequestError, StructuredOutputsParams
from tachyon.server.errors import APIError

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def structured_spec(req) -> tuple[StructuredOutputsParams | None, str | None]:
    """(the spec, the request field it came from), or (None, None); APIError 400 for a malformed one."""
    found: list[tuple[str, dict]] = []
    rf = req.response_format
    if rf is not None and rf != {"type": "text"}:
        kind = rf.get("type")
        if kind == "json_object" and set(rf) == {"type"}:
            found.append(("response_format", {"json_object": True}))
        elif kind == "json_schema" and set(rf) == {"type", "json_schema"} and isinstance(rf["json_schema"], dict):
            schema = rf["json_schema"].get("schema")
            if schema is not None and not isinstance(schema, dict):
                raise APIError(400, "response_format.json_schema.schema must be a JSON schema object",
                               "response_format")
            found.append(("response_format", {"json": schema} if schema is not None else {"json_object": True}))
        else:
            raise APIError(400, "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                                "{\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}",
                           "response_format")
    if req.structured_outputs is not None:
        found.append(("structured_outputs", req.structured_outputs.model_dump(exclude_none=True, by_alias=True)))
    for name, key in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            found.append((name, {key: value}))
    if not found:
        return None, None
    if len(found) > 1:
        raise APIError(400, f"give one way of constraining the output, not {len(found)}: "
                            f"{', '.join(name for name, _ in found)}", found[1][0])
    name, fields = found[0]
    try:
        return StructuredOutputsParams(**fields), name
    except InvalidRequestError as e:
        raise APIError(400, f"{name}: {e}", name) from None


async def compile_off_loop(grammars, spec: StructuredOutputsParams, field: str) -> None:
    """Compile the spec's grammar in a worker thread (a cache hit after the first time): a 400 naming `field`
    if it cannot be compiled."""
    try:
        await asyncio.to_thread(grammars.compile, spec)
    except InvalidRequestError as e:
        raise APIError(400, f"{field}: {e}", field) from None
