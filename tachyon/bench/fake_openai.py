"""A fake OpenAI-compatible server with canned answers at a set pace: measures and tests what stands in front of
a backend (the gateway, nginx) without a model's cost or noise.

Each answer is `num_chunks` chunks of the text `"<name> "`: the first after `ttft_s`, then one every `itl_s`.
Streams end with the usage chunk when the request asks `stream_options.include_usage`, then `[DONE]`.
`state` counts requests and the most in flight at once, and keeps every body it was sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse


@dataclass
class FakeState:
    name: str
    models: list[str]
    ttft_s: float = 0.0
    itl_s: float = 0.0
    num_chunks: int = 4
    healthy: bool = True
    status: int = 200  # answer every completion with this status (429/503 to test failover)
    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict] = field(default_factory=list)


def create_fake_app(state: FakeState) -> FastAPI:
    app = FastAPI()
    app.state.fake = state

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state.healthy else 503)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": m, "object": "model"} for m in state.models]}

    async def answer(request: Request, kind: str):
        body = json.loads(await request.body())
        state.requests += 1
        state.bodies.append(body)
        if state.status != 200:
            return JSONResponse({"error": {"message": f"{state.name} says {state.status}", "type": "x",
                                           "param": None, "code": state.status}}, status_code=state.status)
        n = state.num_chunks
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        obj = "chat.completion" if kind == "chat" else "text_completion"
        head = {"id": f"{state.name}-{state.requests}", "created": int(time.time()), "model": body.get("model")}
        state.in_flight += 1
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        if not body.get("stream"):
            try:
                await asyncio.sleep(state.ttft_s + state.itl_s * (n - 1))
            finally:
                state.in_flight -= 1
            text = f"{state.name} " * n
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                      if kind == "chat" else {"index": 0, "text": text, "finish_reason": "length"})
            return {**head, "object": obj, "choices": [choice], "usage": usage}

        def chunk(i: int) -> dict:
            c = ({"index": 0, "delta": {"content": f"{state.name} "}} if kind == "chat"
                 else {"index": 0, "text": f"{state.name} "})
            c["finish_reason"] = "length" if i == n - 1 else None
            return {**head, "object": f"{obj}.chunk" if kind == "chat" else obj, "choices": [c]}

        async def events():
            try:
                await asyncio.sleep(state.ttft_s)
                for i in range(n):
                    if i:
                        await asyncio.sleep(state.itl_s)
                    yield f"data: {json.dumps(chunk(i))}\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({**head, 'object': obj, 'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                state.in_flight -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await answer(request, "chat")

    return app
