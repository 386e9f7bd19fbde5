"""vLLM's routes and headers beyond OpenAI's: /tokenize, /detokenize, the model card's permission list, CORS,
and X-Request-Id echoed on every response."""

from __future__ import annotations

import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from tachyon.server.errors import APIError
from tachyon.server.frontend import FrontendOptions
from tachyon.server.protocol import ChatMessage


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TokenizeCompletionRequest(_Body):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Body):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def model_permission(name: str, created: int) -> dict:
    """The permission entry vLLM's model cards carry (clients written for it read these fields)."""
    return {"id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_URL, name).hex}", "object": "model_permission",
            "created": created, "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}


def add_tokenizer_routes(app, serving_for, parse) -> None:
    """POST /tokenize (a prompt, or messages through the chat template) and POST /detokenize, as vLLM has them.
    `serving_for(model)`: the OpenAIServing of the model a request names (404 if none)."""
    def tokenizer(serving):
        if serving.tokenizer is None:
            raise APIError(400, "this model has no tokenizer")
        return serving.tokenizer

    @app.post("/tokenize")
    async def tokenize(request: Request):
        try:
            chat = "messages" in json.loads(await request.body())
        except (ValueError, TypeError):
            chat = False  # not a JSON object: parse() says what is wrong with it
        req = await parse(request, TokenizeChatRequest if chat else TokenizeCompletionRequest)
        serving = serving_for(req.model)
        serving.check_model(req.model)
        if chat:
            ids = serving._apply_chat_template(req)
        else:
            ids = tokenizer(serving).encode(req.prompt, add_special_tokens=req.add_special_tokens)
        strs = tokenizer(serving).convert_ids_to_tokens(ids) if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": serving.engine.config.scheduler.max_model_len, "tokens": ids,
                "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await parse(request, DetokenizeRequest)
        serving = serving_for(req.model)
        serving.check_model(req.model)
        vocab = serving.engine.config.model.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary [0, {vocab})", "tokens")
        return {"prompt": tokenizer(serving).decode(req.tokens)}


def add_frontend_middleware(app, options: FrontendOptions) -> None:
    """CORS (--allowed-origins) and X-Request-Id: the client's, echoed, else a new one on every response."""
    if options.allowed_origins is not None:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=options.allowed_origins,
                           allow_methods=options.allowed_methods, allow_headers=options.allowed_headers,
                           allow_credentials=options.allow_credentials)
    app.add_middleware(_RequestId)


class _RequestId:
    """Pure ASGI (streams pass through unbuffered): adds X-Request-Id to the response's headers."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope["headers"] if k == b"x-request-id"), None)
        request_id = given[:200] if given else uuid.uuid4().hex.encode()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)
