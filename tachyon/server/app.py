"""The FastAPI app: OpenAI routes, health, version, Prometheus metrics, API keys, OpenAI-style errors.

`create_app(async_engine, model_name)` builds it; the app's lifespan starts the engine loop and, on shutdown,
stops taking requests and aborts whatever is still running (uvicorn has already let in-flight requests
finish for its graceful-shutdown timeout). With an admin key and a model loader, `/admin/models/...` loads,
unloads and swaps models at run time (tachyon.server.models): each request goes to the model it names.

Hostile or broken input is answered before it costs anything: a missing key (401), a body over the limit
(413, from its Content-Length before a byte is read, or as soon as a chunked body passes it), a body that is
not JSON (415); a client that leaves mid-body is dropped quietly and nothing reaches the engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

import tachyon
from tachyon.engine.async_engine import AsyncEngine
from tachyon.server.errors import APIError, error_body, from_validation_error
from tachyon.server.frontend import FrontendOptions, log_stats_forever
from tachyon.server.frontend_routes import add_frontend_middleware, add_tokenizer_routes, model_permission
from tachyon.server.metrics import ServerMetrics
from tachyon.server.models import (
    Loader,
    LoadModelRequest,
    MergedMetrics,
    ModelRegistry,
    ServedModel,
    SwapModelRequest,
    UnloadModelRequest,
)
from tachyon.server.protocol import ChatCompletionRequest, CompletionRequest
from tachyon.server.serving import OpenAIServing

logger = logging.getLogger("tachyon")

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/version", "/metrics", "/ping",
          "/tokenize", "/detokenize")


class _BodyTooLarge(Exception):
    def __init__(self, received: int):
        self.received = received


class _Gate:
    """Pure ASGI middleware (no buffering of streams): API keys, request body limit, HTTP request counter.

    What it refuses is refused from the headers, before the app runs, or (a chunked body over the limit) at the
    `receive()` that passes the limit, so the app never reads the rest.
    """

    def __init__(self, app, api_keys: Sequence[str], keyed_paths: frozenset[str], max_body_bytes: int | None,
                 metrics: ServerMetrics):
        self.app = app
        # Digests, so every comparison is of equal length and its time says nothing about the keys.
        self.key_digests = [hashlib.sha256(k.encode()).digest() for k in api_keys]
        self.keyed_paths = keyed_paths
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in ROUTES else ("/v1/models" if path.startswith("/v1/models/") else "other")
        status = None  # none sent: the app raised, and ServerErrorMiddleware answers 500
        received = 0

        async def send_with_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def receive_counted():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request" and self.max_body_bytes is not None:
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge(received)
            return message

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                return await refusal(scope, receive, send_with_status)
            await self.app(scope, receive_counted, send_with_status)
        except _BodyTooLarge as e:
            if status is not None:
                raise
            await self._closing(413, self._too_large(f"at least {e.received}"))(scope, receive, send_with_status)
        finally:
            self.metrics.http.labels(self.metrics.model_name, route, str(status or 500)).inc()

    def _refusal(self, scope) -> Response | None:
        """The answer to a request its headers already rule out, or None to let it in."""
        path = scope["path"]
        if self.key_digests and (path.startswith("/v1") or path in self.keyed_paths) and not self._authorized(scope):
            body = error_body(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'")
            return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        if self.max_body_bytes is not None:
            for name, value in scope["headers"]:
                if name != b"content-length":
                    continue
                # Digits only (int() would also take " +1_0"); a hundred digits is no real size.
                size = int(value) if value.isdigit() and len(value) < 100 else None
                if size is None:
                    shown = value.decode("latin-1")[:40]
                    return self._closing(400, f"the Content-Length header {shown!r} is not a number of bytes")
                if size > self.max_body_bytes:
                    return self._closing(413, self._too_large(str(size)))
        return None

    def _too_large(self, size: str) -> str:
        return (f"the request body is {size} bytes; this server accepts at most {self.max_body_bytes} bytes "
                "(--max-request-body-mb)")

    @staticmethod
    def _closing(status: int, message: str) -> JSONResponse:
        # The unread rest of the body is not worth draining: the server closes the connection after answering.
        return JSONResponse(error_body(status, message), status_code=status, headers={"Connection": "close"})

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, key = value.partition(b" ")
                digest = hashlib.sha256(key.strip()).digest()
                # Compare with every key, no early exit: the time taken does not say which key matched.
                matches = [hmac.compare_digest(digest, k) for k in self.key_digests]
                return scheme.lower() == b"bearer" and any(matches)
        return False


def _api_keys(api_key: str | Sequence[str] | None) -> list[str]:
    """The keys given (one or several), else those in $TACHYON_API_KEY (comma-separated); [] means no auth."""
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    keys = [k for k in keys if k]
    return keys or [k.strip() for k in os.environ.get("TACHYON_API_KEY", "").split(",") if k.strip()]


def _is_json(content_type: str) -> bool:
    media_type = content_type.partition(";")[0].strip().lower()
    # application/json, or a JSON-based type such as application/merge-patch+json
    return media_type == "application/json" or (media_type.startswith("application/")
                                                and media_type.endswith("+json"))


def create_app(async_engine: AsyncEngine, model_name: str | Sequence[str], api_key: str | Sequence[str] | None = None,
               model_path: str | None = None, *, max_request_body_bytes: int | None = 16 * 2**20,
               metrics_require_api_key: bool = False, request_timeout: float | None = None,
               model_version: str | None = None, frontend: FrontendOptions | None = None,
               tool_call_parser: str | None = None, admin_api_key: str | None = None,
               model_loader: Loader | None = None,
               derive_names: Callable[[str], list[str]] | None = None) -> FastAPI:
    """`model_name`: the name clients send, or several (the first is the one responses carry).
    `api_key`: one key or several (default: $TACHYON_API_KEY, comma-separated); with any, /v1 routes and the
    API docs need one, and /metrics too if `metrics_require_api_key`. `max_request_body_bytes=None`: no limit.
    `request_timeout`: seconds from arrival after which a request is aborted (None: no limit). `model_version`: shown
    in the model card, so a gateway can route NAME@VERSION to this server.
    `frontend`: chat template, response role, default sampling values, CORS, logging, metric names.
    `tool_call_parser`: the format tool_choice "auto" reads (tachyon.server.tool_parsers).
    `admin_api_key`: turns on /admin/models/{load,unload,swap} (Authorization: Bearer ADMIN_KEY); `model_loader`
    builds the engine of a checkpoint for them, `derive_names` the names of a checkpoint loaded without any."""
    api_keys = _api_keys(api_key)
    names = [model_name] if isinstance(model_name, str) else list(model_name)
    model_name = names[0]
    frontend = frontend or FrontendOptions()

    def make_model(engine: AsyncEngine, options: FrontendOptions, names: list[str], version: str | None,
                   root: str | None, metrics_label: str | None = None) -> ServedModel:
        keys = [f"{n}@{version}" for n in names] if version else []
        serving = OpenAIServing(engine, names + keys, request_timeout=request_timeout, options=options,
                                tool_call_parser=tool_call_parser)
        serving.warm_up()
        metrics = ServerMetrics(engine.engine, metrics_label or (keys or names)[0], options.metrics_prefix)
        engine.on_step = metrics.on_step
        serving.on_admit = metrics.on_admit
        return ServedModel(names, version, root, engine, serving, metrics)

    first = make_model(async_engine, frontend, names, model_version, model_path, metrics_label=model_name)
    serving, metrics = first.serving, first.metrics
    models = ModelRegistry(make_model, model_loader, derive_names or (lambda m: [m]))
    models.add(first)
    http_family = {f"{metrics.prefix}:http_requests"}
    # the first model's registry also counts HTTP requests (the gate's counter): kept once the model is gone
    exposition = MergedMetrics(lambda: [(m.metrics.registry, None) for m in models.models]
                               + [(metrics.registry, None if first in models.models else http_family)])
    admin_digest = hashlib.sha256(admin_api_key.encode()).digest() if admin_api_key else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        stats_task = None
        if frontend.log_stats_interval:
            stats_task = asyncio.ensure_future(log_stats_forever(
                lambda: [(m.keys[0], m.async_engine.engine) for m in models.models], frontend.log_stats_interval))
        yield
        if stats_task is not None:
            stats_task.cancel()
        models.begin_shutdown()
        for m in models.everything():
            await asyncio.to_thread(m.async_engine.shutdown)  # aborts what is left, ends its streams
        logger.info("engine stopped")

    app = FastAPI(title="Tachyon", version=tachyon.__version__, lifespan=lifespan)
    app.state.async_engine = async_engine
    app.state.engine = async_engine.engine
    app.state.serving = serving  # the first model's (the one the server started with)
    app.state.metrics = metrics
    app.state.models = models
    docs = {app.docs_url, app.redoc_url, app.openapi_url, app.swagger_ui_oauth2_redirect_url} - {None}
    keyed_paths = frozenset(docs | ({"/metrics"} if metrics_require_api_key else set()))
    app.add_middleware(_Gate, api_keys=api_keys, keyed_paths=keyed_paths, max_body_bytes=max_request_body_bytes,
                       metrics=metrics)
    add_frontend_middleware(app, frontend)

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

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, _):
        logger.debug("%s %s: the client left before sending the whole body", request.method, request.url.path)
        return Response(status_code=499)  # nginx's "client closed request": uvicorn drops it, the counter keeps it

    @app.exception_handler(Exception)
    async def _internal(_, e: Exception):
        logger.exception("unhandled error")
        return JSONResponse(error_body(500, f"internal error: {e!r}"), status_code=500)

    async def parse(request: Request, model):
        content_type = request.headers.get("content-type")
        if content_type and not _is_json(content_type):
            raise APIError(415, "the request body must be JSON: send the header 'Content-Type: application/json' "
                                f"(got {content_type[:80]!r})")
        body = await request.body()
        try:
            if len(body) >= 1 << 20:  # a large body parses in a thread, so /health and the streams go on
                return await asyncio.to_thread(model.model_validate_json, body)
            return model.model_validate_json(body)
        except ValidationError as e:
            raise from_validation_error(e) from None

    # -- OpenAI routes --------------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request):
        request.state.received = time.monotonic()  # the request's arrival: before its body is read and tokenized
        req = await parse(request, CompletionRequest)
        with models.use(req.model) as m:
            return await m.serving.completions(req, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        request.state.received = time.monotonic()
        req = await parse(request, ChatCompletionRequest)
        with models.use(req.model) as m:
            return await m.serving.chat(req, request)

    def model_card(name: str, m: ServedModel) -> dict:  # vLLM's ModelCard fields
        return {"id": name, "object": "model", "created": m.created, "owned_by": "tachyon",
                "root": m.root or m.names[0], "parent": None,
                "max_model_len": m.async_engine.engine.config.scheduler.max_model_len,
                "permission": [model_permission(name, m.created)],
                **({"version": m.version} if m.version else {})}

    @app.get("/v1/models")
    async def list_models():
        # NAME for a name's default version, NAME@VERSION for the others (a gateway reads both)
        cards = [model_card(n if models.defaults.get(n) is m else k, m)
                 for m in models.models for n, k in zip(m.names, m.keys, strict=True)]
        return {"object": "list", "data": cards}

    @app.get("/v1/models/{model:path}")
    async def model(model: str):
        return model_card(model, models.resolve(model))

    add_tokenizer_routes(app, lambda name: models.resolve(name).serving, parse)

    # -- model management -------------------------------------------------------------------------------------
    def admin(request: Request) -> JSONResponse | None:
        """The refusal of a request without the admin key, or None."""
        if admin_digest is None:
            return JSONResponse(error_body(404, "the admin API is off: start the server with --admin-api-key "
                                                "(or $TACHYON_ADMIN_KEY)"), status_code=404)
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return JSONResponse(error_body(401, "the admin API needs the header 'Authorization: Bearer ADMIN_KEY' "
                                                "(--admin-api-key)"),
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(hashlib.sha256(key.strip().encode()).digest(), admin_digest):
            return JSONResponse(error_body(403, "this key may not use the admin API: send the admin key "
                                                "(--admin-api-key)"), status_code=403)
        return None

    @app.get("/admin/models")
    async def admin_models(request: Request):
        refusal = admin(request)
        return refusal or {"data": [m.describe(models.default_for(m)) for m in models.everything()]}

    @app.post("/admin/models/load")
    async def admin_load(request: Request):
        return admin(request) or await models.load(await parse(request, LoadModelRequest))

    @app.post("/admin/models/unload")
    async def admin_unload(request: Request):
        return admin(request) or await models.unload(await parse(request, UnloadModelRequest))

    @app.post("/admin/models/swap")
    async def admin_swap(request: Request):
        return admin(request) or await models.swap(await parse(request, SwapModelRequest))

    # -- operations -----------------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        dead = next((m for m in models.models if not m.async_engine.is_running), None)
        if dead is not None or models.draining or serving.draining:
            reason = ("shutting down" if models.draining or serving.draining
                      else f"the engine of {dead.label} is not running ({dead.async_engine.error!r})")
            return JSONResponse(error_body(503, reason), status_code=503)
        return {"status": "ok"}

    @app.get("/ping")
    @app.post("/ping")
    async def ping():  # SageMaker's health check, as vLLM serves it
        return await health()

    @app.get("/version")
    async def version():
        return {"version": tachyon.__version__}

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(exposition.registry), media_type=CONTENT_TYPE_LATEST)

    return app
