"""Hostile and broken input at a live server, answered fast and exactly: bodies over the limit (413, before
the body is read), bodies that are not JSON (415), a client that leaves mid-body (quiet, nothing reaches the
engine), several API keys, the docs and /metrics behind the key. After each bad case a normal request works.

`server` (conftest) has the defaults: one key, 16 MiB, /metrics open. `gated` is this module's own server:
two keys, a 4 KiB body limit, /metrics behind the key.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import time

import httpx
import pytest

pytest.importorskip("fastapi")
from tests.integration.conftest import API_KEY, MODEL, LiveServer, serve_in_thread  # noqa: E402

KEYS = ("key-one", "key-two")
LIMIT = 4096
OK_BODY = {"prompt": "hi", "max_tokens": 2}


class GatedServer(LiveServer):
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {KEYS[0]}"}


@pytest.fixture(scope="module")
def gated():
    from tachyon.build import build_engine
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.engine_args import EngineArgs
    from tachyon.server.app import create_app

    engine = build_engine(EngineArgs(kv_cache_memory_gib=0.1, swap_space=0))
    app = create_app(AsyncEngine(engine), MODEL, api_key=list(KEYS), max_request_body_bytes=LIMIT,
                     metrics_require_api_key=True)
    with serve_in_thread(app) as url:
        yield GatedServer(url, app)


@pytest.fixture
def logs():
    """Every record the app, uvicorn and asyncio log during the test, debug lines included."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("tachyon", "uvicorn.error", "asyncio")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
    logging.getLogger("tachyon").setLevel(logging.DEBUG)
    yield records
    for lg, level in zip(loggers, levels, strict=True):
        lg.removeHandler(handler)
        lg.setLevel(level)


def assert_ok(live) -> None:
    """The server still serves a normal request."""
    r = httpx.post(f"{live.url}/v1/completions", json=OK_BODY, headers=live.headers(), timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def assert_error(body: bytes | str, status: int, type_: str) -> str:
    err = json.loads(body)["error"]
    assert (err["type"], err["code"], err["param"]) == (type_, status, None), err
    return err["message"]


def connect(live) -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def head(headers: dict) -> bytes:
    lines = ["POST /v1/completions HTTP/1.1", "Host: test", *(f"{k}: {v}" for k, v in headers.items())]
    return "\r\n".join([*lines, "", ""]).encode()


def raw(live, headers: dict, body: bytes = b"") -> tuple[int, dict, bytes]:
    """One POST /v1/completions written by hand; reads until the server closes the connection."""
    with connect(live) as sock:
        sock.sendall(head(headers) + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, content = data.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, content


def http_requests(live, status: str) -> float:
    text = httpx.get(f"{live.url}/metrics", headers=live.headers(), timeout=10).text
    want = f'tachyon:http_requests_total{{model_name="{MODEL}",route="/v1/completions",status="{status}"}} '
    return next((float(line[len(want):]) for line in text.splitlines() if line.startswith(want)), 0.0)


# -- body size -------------------------------------------------------------------------------------------------
def test_content_length_over_the_limit_is_refused_before_the_body(gated, server):
    for live, size, limit in ((gated, 10**10, LIMIT), (server, 16 * 2**20 + 1, 16 * 2**20)):
        t0 = time.monotonic()
        # Headers only: the promised body never comes, so an answer proves the server did not wait for it.
        status, headers, body = raw(live, {**live.headers(), "Content-Type": "application/json",
                                           "Content-Length": size})
        assert time.monotonic() - t0 < 2
        assert status == 413 and headers["connection"] == "close"
        message = assert_error(body, 413, "RequestTooLargeError")
        assert f"is {size} bytes" in message and f"at most {limit} bytes" in message
        assert "--max-request-body-mb" in message
        assert_ok(live)


def test_chunked_body_over_the_limit(gated):
    def body():
        for _ in range(8):
            yield b" " * 1024

    r = httpx.post(f"{gated.url}/v1/completions", content=body(), timeout=10,
                   headers={**gated.headers(), "Content-Type": "application/json"})
    assert r.status_code == 413 and r.headers["connection"] == "close"
    assert "content-length" not in r.request.headers  # it went chunked
    received = int(re.search(r"is at least (\d+) bytes", assert_error(r.text, 413, "RequestTooLargeError"))[1])
    assert LIMIT < received <= 8 * 1024
    assert_ok(gated)


def test_chunked_body_is_refused_as_soon_as_it_passes_the_limit(gated):
    # 5 KiB in chunks and no closing chunk: the 413 comes while the body is still open.
    chunks = b"".join(b"400\r\n" + b" " * 1024 + b"\r\n" for _ in range(5))
    status, headers, body = raw(gated, {**gated.headers(), "Transfer-Encoding": "chunked"}, chunks)
    assert status == 413 and headers["connection"] == "close"
    assert "is at least" in assert_error(body, 413, "RequestTooLargeError")
    assert_ok(gated)


def test_chunked_body_under_the_limit_is_served(gated):
    data = json.dumps(OK_BODY).encode()
    r = httpx.post(f"{gated.url}/v1/completions", content=(data[i:i + 5] for i in range(0, len(data), 5)),
                   headers=gated.headers(), timeout=60)
    assert r.status_code == 200, r.text


def test_malformed_content_length(gated):
    status, headers, _ = raw(gated, {**gated.headers(), "Content-Length": "12abc"}, b"{}")
    assert status == 400 and headers["connection"] == "close"  # uvicorn's h11 refuses it before the app runs

    async def call(app) -> list[dict]:
        """The app as an ASGI server that passes the header through would call it."""
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
                 "headers": [(b"authorization", f"Bearer {KEYS[0]}".encode()), (b"content-length", b"12abc")]}
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        return sent

    start, body = asyncio.run(call(gated.app))
    assert start["status"] == 400 and (b"connection", b"close") in start["headers"]
    assert "12abc" in assert_error(body["body"], 400, "BadRequestError")
    assert_ok(gated)


# -- content type ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_415(server, path, content_type):
    r = httpx.post(f"{server.url}{path}", content=json.dumps(OK_BODY), timeout=10,
                   headers={**server.headers(), "Content-Type": content_type})
    assert r.status_code == 415, r.text
    message = assert_error(r.text, 415, "UnsupportedMediaTypeError")
    assert "Content-Type: application/json" in message and content_type in message
    assert_ok(server)


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "Application/JSON",
                                          "application/merge-patch+json", None])
def test_json_content_types_and_none_are_accepted(server, content_type):
    headers = {**server.headers(), **({"Content-Type": content_type} if content_type else {})}
    r = httpx.post(f"{server.url}/v1/completions", content=json.dumps(OK_BODY), headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.request.headers.get("content-type") == content_type


# -- a client that leaves mid-body -------------------------------------------------------------------------
def test_client_leaving_mid_body_is_dropped_quietly(server, logs):
    left, failed = http_requests(server, "499"), http_requests(server, "500")
    with connect(server) as sock:
        headers = {**server.headers(), "Content-Type": "application/json", "Content-Length": 1000}
        sock.sendall(head(headers) + b'{"prompt":')  # 10 of the 1000 bytes, then gone
    deadline = time.monotonic() + 10
    while http_requests(server, "499") == left and time.monotonic() < deadline:
        time.sleep(0.05)
    assert http_requests(server, "499") == left + 1 and http_requests(server, "500") == failed
    assert any("left before sending the whole body" in r.getMessage() for r in logs)
    loud = [r for r in logs if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [r.getMessage() for r in loud]
    assert not server.engine.has_unfinished_requests() and not server.engine.core.live_sequences()
    assert_ok(server)


# -- keys ------------------------------------------------------------------------------------------------------
def test_every_key_is_accepted_and_nothing_else(gated):
    for key in KEYS:
        r = httpx.post(f"{gated.url}/v1/completions", json=OK_BODY, headers={"Authorization": f"Bearer {key}"},
                       timeout=60)
        assert r.status_code == 200, r.text
    for headers in ({}, {"Authorization": "Bearer key-three"}, {"Authorization": "Bearer key-one-two"},
                    {"Authorization": "Bearer key-on"}, {"Authorization": "Basic key-one"},
                    {"Authorization": f"Bearer {API_KEY}"}):
        r = httpx.post(f"{gated.url}/v1/completions", json=OK_BODY, headers=headers, timeout=10)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", headers
        assert "Authorization: Bearer KEY" in assert_error(r.text, 401, "AuthenticationError")
    assert_ok(gated)


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_docs_need_the_key(gated, server, path):
    for live in (gated, server):
        r = httpx.get(f"{live.url}{path}", timeout=10)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert_error(r.text, 401, "AuthenticationError")
        assert httpx.get(f"{live.url}{path}", headers=live.headers(), timeout=10).status_code == 200


def test_metrics_need_the_key_only_with_the_flag(gated, server):
    r = httpx.get(f"{gated.url}/metrics", timeout=10)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert_error(r.text, 401, "AuthenticationError")
    r = httpx.get(f"{gated.url}/metrics", headers={"Authorization": f"Bearer {KEYS[1]}"}, timeout=10)
    assert r.status_code == 200 and "tachyon:http_requests_total" in r.text
    assert httpx.get(f"{server.url}/metrics", timeout=10).status_code == 200
    for live in (gated, server):
        assert httpx.get(f"{live.url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{live.url}/version", timeout=10).status_code == 200


def test_keys_from_the_environment_and_open_docs_without_keys(server, monkeypatch):
    """$TACHYON_API_KEY holds a comma-separated list; with no key at all the docs are open."""
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.server.app import create_app

    async def statuses(app) -> list[int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return [(await client.get("/openapi.json", headers=h)).status_code
                    for h in ({}, {"Authorization": "Bearer b"}, {"Authorization": "Bearer a, b"})]

    # No lifespan runs: the engine loop is not started, and these routes do not need it.
    monkeypatch.setenv("TACHYON_API_KEY", "a, b")
    assert asyncio.run(statuses(create_app(AsyncEngine(server.engine), MODEL))) == [401, 200, 401]
    monkeypatch.delenv("TACHYON_API_KEY")
    assert asyncio.run(statuses(create_app(AsyncEngine(server.engine), MODEL))) == [200, 200, 200]


# -- flags -----------------------------------------------------------------------------------------------------
def test_serve_flags(capsys):
    from tachyon.cli import build_parser, main

    args = build_parser().parse_args(["serve", "--api-key", "a", "b", "--api-key", "c", "--request-timeout", "2.5",
                                      "--max-request-body-mb", "0.5", "--metrics-require-api-key"])
    assert (args.api_key, args.request_timeout, args.max_request_body_mb) == (["a", "b", "c"], 2.5, 0.5)
    assert args.metrics_require_api_key
    args = build_parser().parse_args(["serve"])
    assert (args.api_key, args.request_timeout, args.max_request_body_mb) == (None, None, 16.0)
    assert not args.metrics_require_api_key
    for flag, value in (("--request-timeout", "0"), ("--max-request-body-mb", "-1")):
        assert main(["serve", flag, value]) == 2  # refused before any model loads
        assert f"{flag}={float(value)}: it must be > 0" in capsys.readouterr().err
