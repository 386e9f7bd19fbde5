"""The gateway app: API keys, per-key limits, routing, least-outstanding balancing with failover, streaming
passed through as it comes, JSON access logs, its own /metrics.

One request:

    key (401) -> limits (429 + Retry-After) -> route (404 if no route and no backend reports the model)
      -> pick the healthy backend with the fewest outstanding requests -> send
           connection fails before the answer's first byte: eject it, try the next one (up to max_attempts)
           429 / 503 from the backend: try the next one; if none is left, that answer goes to the client
           404 from a backend chosen because it reported the model: re-read its /v1/models, try the next one
      -> stream the answer through, one SSE event at a time, as the backend sends it
      -> access log line, metrics, tokens charged to the key

A streamed request is sent with `stream_options.include_usage`, so the gateway learns its token counts; the
usage-only last chunk is passed on only to a client that asked for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import httpx
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tachyon.gateway.backends import Backend, HealthChecker, auth_headers, build_pools
from tachyon.gateway.config import GatewayConfig, KeyConfig, load_config
from tachyon.gateway.limits import KeyLimiter, MemoryBuckets
from tachyon.gateway.metrics import GatewayMetrics
from tachyon.gateway.routing import Decision, RequestFacts, Router, prompt_chars
from tachyon.server.errors import error_body

logger = logging.getLogger("tachyon.gateway")
access_logger = logging.getLogger("tachyon.gateway.access")

# Requests go to the backends through aiohttp, whose HTTP parser is C: with httpx's pure-Python stack the gateway
# spent 4.9 ms of CPU per 16-chunk stream, with aiohttp 2.9 (benchmarks/results/gateway_overhead_cpu_nice_*.md).
# The health checks, a few per second, go through httpx.
# failures where the backend sent nothing back: safe to send the request elsewhere
_UNREACHABLE = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)  # nobody listens there: eject it
_RETRYABLE = (*_UNREACHABLE, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
_DEFAULT_KEY = KeyConfig(id="-", sha256="0" * 64)  # no keys configured: everyone is "-", without limits


def _error(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


async def _read_body(request: Request, limit_mb: float) -> bytes | None:
    """The body, or None as soon as it passes the limit (the rest is not read)."""
    limit = int(limit_mb * 2**20)
    size = request.headers.get("content-length", "")
    if size.isdigit() and int(size) > limit:
        return None
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass
class _Record:
    """One request as the access log and the metrics see it."""

    request_id: str
    key: KeyConfig
    model: str
    arrival: float
    stream: bool
    route: str = "-"
    pool: str = "-"
    backend: str = "-"
    status: int = 0
    attempts: int = 0
    ttft: float | None = None
    usage: dict = field(default_factory=dict)

    def log_line(self, e2e: float) -> str:
        return json.dumps({
            "ts": round(time.time(), 3), "request_id": self.request_id, "key_id": self.key.id, "model": self.model,
            "route": self.route, "pool": self.pool, "backend": self.backend, "status": self.status,
            "stream": self.stream, "attempts": self.attempts,
            "prompt_tokens": self.usage.get("prompt_tokens"), "completion_tokens": self.usage.get("completion_tokens"),
            "ttft_ms": None if self.ttft is None else round(self.ttft * 1000, 2), "e2e_ms": round(e2e * 1000, 2)})


class SSEUsage:
    """Splits a byte stream into SSE events (separated by a blank line: \\n\\n, \\r\\n\\r\\n or \\r\\r) and hands
    each complete one on at once; finds the usage chunk, and drops it if the client did not ask for it."""

    _END = re.compile(rb"\r\n\r\n|\n\n|\r\r")

    def __init__(self, drop_usage_chunk: bool):
        self.drop = drop_usage_chunk
        self.buf = b""
        self.usage: dict | None = None

    def feed(self, chunk: bytes) -> bytes:
        self.buf += chunk
        ends = [m.end() for m in self._END.finditer(self.buf)]
        if not ends:
            return b""
        events, self.buf = self.buf[:ends[-1]], self.buf[ends[-1]:]
        if b'"usage":{' not in events and b'"usage": {' not in events:
            return events
        kept, start = [], 0
        for end in ends:
            ev = events[start:end]
            start = end
            if not self._is_usage_chunk(ev):
                kept.append(ev)
        return b"".join(kept)

    def _is_usage_chunk(self, ev: bytes) -> bool:
        """Reads the usage of a data event that carries one; True if that event is to be dropped."""
        field, _, value = ev.strip().partition(b":")
        if field != b"data" or (b'"usage":{' not in value and b'"usage": {' not in value):
            return False
        try:
            obj = json.loads(value)
        except ValueError:
            return False
        self.usage = obj.get("usage") or self.usage
        return self.drop and not obj.get("choices")

    def rest(self) -> bytes:
        rest, self.buf = self.buf, b""
        return rest


class Gateway:
    def __init__(self, config: GatewayConfig, buckets=None, seed: int | None = None):
        self.config = config
        self.pools = build_pools(config, seed)
        self.router = Router(config, self.pools)
        self.keys = {k.sha256: k for k in config.keys}
        self.limiter = KeyLimiter(buckets or MemoryBuckets())
        self.metrics = GatewayMetrics(self.pools)
        self.session: aiohttp.ClientSession | None = None
        self.health_client: httpx.AsyncClient | None = None
        self.health: HealthChecker | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------
    async def start(self) -> None:
        c = self.config
        tls = httpx.create_ssl_context()  # one for both: making one costs ~0.2 s
        self.session = aiohttp.ClientSession(
            # idle connections are dropped before uvicorn's 5 s keep-alive timeout closes them under a request
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0, ssl=tls),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=c.connect_timeout_s, sock_read=c.read_timeout_s))
        self.health_client = httpx.AsyncClient(verify=tls)
        hc = c.health_check
        self.health = HealthChecker(self.pools, self.health_client, hc.path, hc.interval_s, hc.ejected_interval_s,
                                    hc.timeout_s)
        await self.health.probe_all()  # route from the first request on with what the backends say

    async def reload(self, config: GatewayConfig) -> dict:
        """Routes, pools and keys from `config`, swapped in at once: requests in flight finish where they are
        (they hold their backend), new ones follow the new routes. A backend kept (same pool, place and URL)
        keeps its state; a new one is probed before the swap, so it takes requests only if it is healthy."""
        kept = {(b.id, b.url): b for p in self.pools.values() for b in p.backends}
        pools = build_pools(config)
        fresh = []
        for pool in pools.values():
            backends = []
            for new in pool.backends:
                old = kept.get((new.id, new.url))
                if old is None:
                    fresh.append(new)
                else:
                    old.api_key, old.weight = new.api_key, new.weight
                backends.append(old or new)
            pool.backends = backends
        await asyncio.gather(*(self.health.probe(b) for b in fresh))
        self.config = config
        self.pools.clear()
        self.pools.update(pools)
        self.router = Router(config, self.pools)
        self.keys = {k.sha256: k for k in config.keys}
        logger.info("gateway config reloaded: %d pool(s), %d route(s), %d key(s)", len(pools), len(config.routes),
                    len(config.keys))
        return {"pools": {name: p.num_healthy() for name, p in pools.items()}, "routes": len(config.routes),
                "keys": len(config.keys)}

    async def stop(self) -> None:
        await self.session.close()
        await self.health_client.aclose()
        await self.limiter.buckets.close()

    # -- one request ------------------------------------------------------------------------------------------
    def key_of(self, request: Request) -> KeyConfig | None:
        if not self.keys:
            return _DEFAULT_KEY
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.keys.get(hashlib.sha256(token.strip().encode()).hexdigest())

    async def proxy(self, request: Request, path: str) -> Response:
        arrival = time.monotonic()
        key = self.key_of(request)
        if key is None:
            return _error(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'",
                          headers={"WWW-Authenticate": "Bearer"})
        raw = await _read_body(request, self.config.max_request_body_mb)
        if raw is None:
            return _error(413, f"the request body is larger than this gateway accepts "
                               f"({self.config.max_request_body_mb:g} MiB: max_request_body_mb in its config)",
                          headers={"Connection": "close"})
        try:
            body = json.loads(raw)
        except ValueError as e:
            return _error(400, f"the request body is not valid JSON: {e}")
        if not isinstance(body, dict):
            return _error(400, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return _error(400, "model: a model name is required (GET /v1/models lists them)", "model")
        rec = _Record(request.headers.get("x-request-id") or uuid.uuid4().hex, key, model, arrival,
                      body.get("stream") is True)
        try:
            refusal = await self.limiter.admit(key)
        except Exception:  # the limits' store (Redis) is down: serve without limits rather than not at all
            logger.exception("rate limits of key %s not checked: their store failed", key.id)
            refusal = None
        if refusal is not None:
            self.metrics.rate_limited.labels(key.id, refusal.limit).inc()
            rec.status = 429
            self._finish(rec)
            return _error(429, refusal.message(key), headers=refusal.headers())
        decision = self.router.route(RequestFacts(model, key.tier, prompt_chars(body), request.headers))
        if decision is None:
            rec.status = 404
            self._finish(rec)
            return _error(404, f"the model {model!r} is not served here; models: "
                               f"{', '.join(self.router.known_models()) or '(none)'}", "model")
        rec.route = decision.route
        asked_usage = bool(isinstance(body.get("stream_options"), dict) and body["stream_options"].get("include_usage"))
        body["model"] = decision.upstream_model
        if rec.stream:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        payload = json.dumps(body).encode()
        return await self._send(rec, decision, path, payload, drop_usage_chunk=not asked_usage)

    async def _send(self, rec: _Record, decision: Decision, path: str, payload: bytes,
                    drop_usage_chunk: bool) -> Response:
        tried: set[Backend] = set()
        last_answer: tuple[int, bytes, str] | None = None  # a 429/503 kept in case no other backend answers
        failures = []
        reused_once = False
        for pool in decision.pools:
            while rec.attempts < self.config.max_attempts:
                backend = pool.pick(tried)
                if backend is None:
                    break
                tried.add(backend)
                rec.attempts += 1
                rec.pool, rec.backend = pool.name, backend.id
                backend.outstanding += 1
                headers = {"content-type": "application/json", "x-request-id": rec.request_id,
                           **auth_headers(backend)}
                try:
                    resp = await self.session.post(backend.url + path, data=payload, headers=headers,
                                                   allow_redirects=False)
                except _RETRYABLE as e:
                    backend.outstanding -= 1
                    self.metrics.retries.labels(pool.name, backend.id).inc()
                    failures.append(f"{backend.id}: {type(e).__name__}")
                    if isinstance(e, _UNREACHABLE):
                        backend.eject(repr(e))
                    elif not reused_once:
                        # a kept-alive connection the backend had just closed: once, the same backend again on a
                        # new connection, without ejecting it (its probes decide whether it is down)
                        reused_once = True
                        tried.discard(backend)
                    continue
                except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # after the request went out: it may run
                    backend.outstanding -= 1
                    rec.status = 504 if isinstance(e, asyncio.TimeoutError) else 502
                    self._finish(rec)
                    return _error(rec.status, f"backend {backend.id} failed: {e!r}")
                # 404 where the backends' own /v1/models chose them: the model left that backend since its last
                # probe (unloaded, swapped): read its list again now, and try the others that report the model
                stale = resp.status == 404 and decision.route == "reported"
                if resp.status in (429, 503) or stale:
                    try:
                        content = await resp.read()
                    except (aiohttp.ClientError, asyncio.TimeoutError):
                        content = b""
                    finally:
                        resp.close()
                        backend.outstanding -= 1
                    if resp.status == 503:
                        backend.eject("answered 503")
                    if stale:
                        await self.health.probe(backend)
                    last_answer = (resp.status, content, resp.headers.get("content-type", "application/json"))
                    failures.append(f"{backend.id}: {resp.status}")
                    continue
                return await self._answer(rec, backend, resp, drop_usage_chunk)
        if last_answer is not None:
            rec.status = last_answer[0]
            self._finish(rec)
            return Response(last_answer[1], status_code=last_answer[0], media_type=last_answer[2])
        rec.status = 502 if failures else 503
        self._finish(rec)
        names = ", ".join(p.name for p in decision.pools)
        if failures:
            return _error(502, f"no backend of pool {names} answered: {'; '.join(failures)}")
        return _error(503, f"no healthy backend in pool {names}; the gateway probes them every "
                           f"{self.config.health_check.interval_s:g} s")

    async def _answer(self, rec: _Record, backend: Backend, resp: aiohttp.ClientResponse,
                      drop_usage_chunk: bool) -> Response:
        rec.status = resp.status
        headers = {"x-request-id": rec.request_id, "x-gateway-backend": backend.id}
        media_type = resp.headers.get("content-type", "application/json")
        if not (rec.stream and resp.status == 200):
            try:
                content = await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                rec.status = 502
                backend.eject(repr(e))
                return _error(502, f"backend {backend.id} failed mid-answer: {e!r}")
            finally:
                resp.close()
                backend.outstanding -= 1
            rec.ttft = time.monotonic() - rec.arrival
            if resp.status == 200:
                with contextlib.suppress(ValueError, AttributeError):
                    rec.usage = json.loads(content).get("usage") or {}
            await self._charge_and_finish(rec)
            return Response(content, status_code=resp.status, media_type=media_type, headers=headers)

        sse = SSEUsage(drop_usage_chunk)

        async def events():
            try:
                async for chunk in resp.content.iter_any():
                    if rec.ttft is None:
                        rec.ttft = time.monotonic() - rec.arrival
                    out = sse.feed(chunk)
                    if out:
                        yield out
                yield sse.rest()
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # the backend died mid-stream: an error event
                rec.status = 502
                backend.eject(repr(e))
                yield (b"data: " + json.dumps(error_body(502, f"backend {backend.id} failed mid-stream: {e!r}"))
                       .encode() + b"\n\ndata: [DONE]\n\n")
            finally:
                resp.close()  # a client that left mid-stream: the backend sees its connection close, and aborts
                backend.outstanding -= 1
                rec.usage = sse.usage or {}
                await self._charge_and_finish(rec)

        return StreamingResponse(events(), status_code=200, media_type=media_type, headers=headers)

    async def _charge_and_finish(self, rec: _Record) -> None:
        tokens = 0
        for kind in ("prompt_tokens", "completion_tokens"):
            n = rec.usage.get(kind)
            if isinstance(n, int) and n > 0:
                tokens += n
                self.metrics.tokens.labels(rec.key.id, kind.removesuffix("_tokens")).inc(n)
        try:
            await self.limiter.charge(rec.key, tokens)
        except Exception:  # a Redis outage must not fail an answer already given
            logger.exception("could not charge %d tokens to key %s", tokens, rec.key.id)
        self._finish(rec)

    def _finish(self, rec: _Record) -> None:
        e2e = time.monotonic() - rec.arrival
        m = self.metrics
        m.requests.labels(rec.model, rec.pool, rec.backend, str(rec.status)).inc()
        if rec.status == 200:
            m.e2e.labels(rec.model, rec.pool).observe(e2e)
            if rec.ttft is not None:
                m.ttft.labels(rec.model, rec.pool).observe(rec.ttft)
        if self.config.access_log == "json" and access_logger.isEnabledFor(logging.INFO):
            access_logger.info(rec.log_line(e2e))

    # -- the rest ---------------------------------------------------------------------------------------------
    def models(self) -> dict:
        return {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "tachyon-gateway"}
                                           for m in self.router.known_models()]}

    def health_answer(self) -> JSONResponse:
        pools = {name: p.num_healthy() for name, p in self.pools.items()}
        if not any(pools.values()):
            return _error(503, "no healthy backend in any pool")
        return JSONResponse({"status": "ok", "healthy_backends": pools})


def create_gateway_app(config: GatewayConfig, buckets=None, seed: int | None = None, *, config_path: str | None = None,
                       admin_key: str | None = None) -> FastAPI:
    """`buckets`: where the per-key limits live (MemoryBuckets by default, RedisBuckets for several gateways).
    With `admin_key` and `config_path`, `POST /admin/reload` (Authorization: Bearer ADMIN_KEY) re-reads the config:
    how a new model version takes over (new replicas in a pool, the route moved to it) with nothing in flight lost."""
    gw = Gateway(config, buckets, seed)
    admin_digest = hashlib.sha256(admin_key.encode()).digest() if admin_key else None

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await gw.start()
        task = asyncio.create_task(gw.health.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await gw.stop()

    app = FastAPI(title="Tachyon gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await gw.proxy(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await gw.proxy(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models(request: Request):
        if gw.key_of(request) is None:
            return _error(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'")
        return gw.models()

    @app.post("/admin/reload")
    async def reload(request: Request):
        if admin_digest is None or config_path is None:
            return _error(404, "no admin API: start the gateway with --admin-key")
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if not (scheme.lower() == "bearer" and hmac.compare_digest(hashlib.sha256(token.encode()).digest(), admin_digest)):
            return _error(401, "the admin API needs 'Authorization: Bearer ADMIN_KEY' (--admin-key)",
                          headers={"WWW-Authenticate": "Bearer"})
        try:
            config = load_config(config_path)
        except (OSError, ValueError) as e:  # the running config stays
            return _error(400, f"config not reloaded: {e}")
        return await gw.reload(config)

    @app.get("/health")
    async def health():
        return gw.health_answer()

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
