"""The FastAPI app: OpenAI routes, health, version, Prometheus metrics, API keys, OpenAI-style errors.

`create_app(async_engine, model_name)` builds it; the app's lifespan starts the engine loop and, on shutdown,
stops taking requests and aborts whatever is still running (uvicorn has already let in-flight requests
finish for its graceful-shutdown timeout).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import tachyon
from tachyon.engine.async_engine import AsyncEngine
from tachyon.server.errors import APIError, error_body, from_validation_error
from tachyon.server.metrics import ServerMetrics
from tachyon.server.protocol import ChatCompletionRequest, CompletionRequest
from tachyon.server.serving import OpenAIServing

logger = logging.getLogger("tachyon")

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/version", "/metrics")


class _Gate:
    """Pure ASGI middleware (no buffering of streams): API key on /v1 routes, HTTP request counter."""

    def __init__(self, app, api_key: str | None, metrics: ServerMetrics):
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in ROUTES else ("/v1/models" if path.startswith("/v1/models/") else "other")
        status = 500

        async def send_with_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self.api_key is not None and path.startswith("/v1") and not self._authorized(scope):
                body = error_body(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'")
                return await JSONResponse(body, status_code=401,
                                          headers={"WWW-Authenticate": "Bearer"})(scope, receive, send_with_status)
            await self.app(scope, receive, send_with_status)
        finally:
            self.metrics.http.labels(self.metrics.model_name, route, str(status)).inc()

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, key = value.partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), self.api_key)
        return False


def create_app(async_engine: AsyncEngine, model_name: str, api_key: str | None = None,
               model_path: str | None = None) -> FastAPI:
    api_key = api_key or os.environ.get("TACHYON_API_KEY") or None
    serving = OpenAIServing(async_engine, model_name)
    metrics = ServerMetrics(async_engine.engine, model_name)
    async_engine.on_step = metrics.on_step
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        yield
        serving.draining = True
        await asyncio.to_thread(async_engine.shutdown)  # aborts what is left, ends its streams
        logger.info("engine stopped")

    app = FastAPI(title="Tachyon", version=tachyon.__version__, lifespan=lifespan)
    app.state.async_engine = async_engine
    app.state.engine = async_engine.engine
    app.state.serving = serving
    app.state.metrics = metrics
    app.add_middleware(_Gate, api_key=api_key, metrics=metrics)

    # -- errors: always {"error": {...}}, never FastAPI's 422 ----------------------------------------------
    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _request_validation(_, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(error_body(400, f"{param or 'body'}: {first.get('msg', 'invalid request')}", param),
                            status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_, e: StarletteHTTPException):
        message = e.detail if isinstance(e.detail, str) else str(e.detail)
        return JSONResponse(error_body(e.status_code, message), status_code=e.status_code, headers=e.headers)

    @app.exception_handler(Exception)
    async def _internal(_, e: Exception):
        logger.exception("unhandled error")
        return JSONResponse(error_body(500, f"internal error: {e!r}"), status_code=500)

    async def parse(request: Request, model):
        try:
            return model.model_validate_json(await request.body())
        except ValidationError as e:
            raise from_validation_error(e) from None

    # -- OpenAI routes --------------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serving.completions(await parse(request, CompletionRequest), request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serving.chat(await parse(request, ChatCompletionRequest), request)

    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "tachyon",
                "root": model_path or model_name, "parent": None,
                "max_model_len": async_engine.engine.config.scheduler.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        serving.check_model(model)
        return model_card()

    # -- operations -----------------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if not async_engine.is_running or serving.draining:
            reason = "shutting down" if serving.draining else f"the engine is not running ({async_engine.error!r})"
            return JSONResponse(error_body(503, reason), status_code=503)
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": tachyon.__version__}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
