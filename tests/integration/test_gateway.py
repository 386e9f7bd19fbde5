"""`tachyon gateway` over fake OpenAI-compatible backends (tachyon/bench/fake_openai.py, uvicorn in threads):
routing by model, version, rule and weighted split; streaming passed through as it comes; least-outstanding
balancing under 64 clients; failover and ejection when a backend goes away, and its return; 503 / 429 from a
backend tried elsewhere; API keys; per-key limits in process and in a real Redis; access logs and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
import socket
import subprocess
import time

import httpx
import pytest

pytest.importorskip("fastapi")
from tachyon.bench.fake_openai import FakeState, create_fake_app  # noqa: E402
from tachyon.gateway.app import create_gateway_app  # noqa: E402
from tachyon.gateway.config import parse_config  # noqa: E402
from tachyon.gateway.limits import RedisBuckets  # noqa: E402
from tests.integration.conftest import _bound_socket, serve_in_thread  # noqa: E402

GOLD, BASIC = "gold-key", "basic-key"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@contextlib.contextmanager
def fakes(*states: FakeState):
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(serve_in_thread(create_fake_app(s))) for s in states]


@contextlib.contextmanager
def gateway(raw: dict, buckets=None):
    app = create_gateway_app(parse_config(raw), buckets, seed=0)
    with serve_in_thread(app) as url:
        yield url, app.state.gateway


@pytest.fixture
def access_log():
    records: list[dict] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda r: records.append(json.loads(r.getMessage()))
    lg = logging.getLogger("tachyon.gateway.access")
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    yield records
    lg.removeHandler(handler)


def complete(url: str, model: str, key: str | None = GOLD, headers: dict | None = None, prompt: str = "hi",
             **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": prompt, **body},
                      headers={**(auth(key) if key else {}), **(headers or {})}, timeout=30)


# -- routing -----------------------------------------------------------------------------------------------------
def test_routing_by_model_version_rule_and_split(access_log):
    a, b, c = FakeState("a", ["smol"]), FakeState("b", ["smol"]), FakeState("c", ["big", "smol"])
    with fakes(a, b, c) as (ua, ub, uc):
        cfg = {
            "pools": {"main": {"backends": [{"url": ua}]}, "canary": {"backends": [{"url": ub + "/v1"}]},
                      "long": {"backends": [{"url": uc}]}},
            "routes": [
                {"model": "smol@v2", "upstream_model": "smol", "pool": "canary"},
                {"model": "smol", "when": {"header": {"X-Scenario": "batch"}}, "pool": "long"},
                {"model": "smol", "when": {"min_prompt_chars": 100}, "pool": "long"},
                {"model": "smol", "when": {"tier": "basic"}, "pool": "canary"},
                {"model": "smol", "split": [{"pool": "main", "weight": 3}, {"pool": "canary", "weight": 1}]},
            ],
            "keys": [{"id": "g", "sha256": sha(GOLD), "tier": "gold"}, {"id": "b", "sha256": sha(BASIC), "tier": "basic"}],
        }
        with gateway(cfg) as (url, _):
            def served_by(*args, **kw) -> str:
                r = complete(url, *args, **kw)
                assert r.status_code == 200, r.text
                return r.headers["x-gateway-backend"]

            assert served_by("smol@v2") == "canary/0"
            assert b.bodies[-1]["model"] == "smol"  # the backend is sent the name it knows
            assert served_by("smol", headers={"x-scenario": "batch"}) == "long/0"
            assert served_by("smol", prompt="x" * 100) == "long/0"
            assert served_by("smol", prompt="x" * 99) in ("main/0", "canary/0")
            assert served_by("smol", key=BASIC) == "canary/0"
            # 3:1, smooth: exactly 6 of 8 to main, never the canary twice in a row
            seq = [served_by("smol") for _ in range(8)]
            assert seq.count("main/0") == 6 and "canary/0, canary/0" not in ", ".join(seq), seq
            # no route names "big": the backend reporting it in /v1/models gets it
            assert served_by("big") == "long/0"
            r = complete(url, "nope")
            assert r.status_code == 404
            assert r.json() == {"error": {
                "message": "the model 'nope' is not served here; models: smol@v2, smol, big", "type": "NotFoundError",
                "param": "model", "code": 404}}
            models = httpx.get(f"{url}/v1/models", headers=auth(GOLD)).json()
            assert [m["id"] for m in models["data"]] == ["smol@v2", "smol", "big"]
    ok = [r for r in access_log if r["status"] == 200]
    assert {r["key_id"] for r in ok} == {"g", "b"} and all(r["prompt_tokens"] == 3 for r in ok)
    assert access_log[-1]["status"] == 404 and access_log[-1]["model"] == "nope"


# -- streaming ---------------------------------------------------------------------------------------------------
def test_stream_passes_each_chunk_as_it_comes():
    slow = FakeState("s", ["m"], ttft_s=0.4, itl_s=0.4, num_chunks=3)
    with fakes(slow) as (us,), gateway({"pools": {"p": {"backends": [{"url": us}]}}}) as (url, _):
        start = time.monotonic()
        seen: list[tuple[float, bytes]] = []
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30,
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line:
                    seen.append((time.monotonic() - start, line))
        data = [json.loads(line[6:]) for _, line in seen if line != "data: [DONE]"]
        assert [d["choices"][0]["delta"]["content"] for d in data] == ["s "] * 3  # the usage chunk is not passed on
        assert seen[-1][1] == "data: [DONE]"
        # chunk i leaves the backend at 0.4 * (i + 1) s, the next 0.4 s later: each arrives before the next is
        # made
        for i, (t, _) in enumerate(seen[:3]):
            assert 0.4 * (i + 1) - 0.05 < t < 0.4 * (i + 1) + 0.35, seen
        # asked for, it is passed on
        with httpx.stream("POST", f"{url}/v1/completions", timeout=30, json={
                "model": "m", "prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}) as r:
            lines = [line for line in r.iter_lines() if line]
        assert json.loads(lines[-2][6:])["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


# -- balancing and failover ----------------------------------------------------------------------------------------
def test_least_outstanding_balancing_under_64_clients():
    a, b = FakeState("a", ["m"], ttft_s=0.2), FakeState("b", ["m"], ttft_s=0.2)
    with fakes(a, b) as (ua, ub), gateway({"pools": {"p": {"backends": [{"url": ua}, {"url": ub}]}}}) as (url, gw):
        async def run():
            async with httpx.AsyncClient(timeout=30) as client:
                body = {"model": "m", "prompt": "hi", "stream": True}
                async def one():
                    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                        return r.status_code, [x async for x in r.aiter_lines() if x][-1]
                return await asyncio.gather(*(one() for _ in range(64)))

        results = asyncio.run(run())
        assert results == [(200, "data: [DONE]")] * 64
        assert a.requests + b.requests == 64 and 24 <= a.requests <= 40, (a.requests, b.requests)
        assert a.max_in_flight <= 40 and b.max_in_flight <= 40
        assert [x.outstanding for x in gw.pools["p"].backends] == [0, 0]


def test_failover_ejects_and_probes_back(access_log):
    a, b = FakeState("a", ["m"]), FakeState("b", ["m"])
    sock = _bound_socket()
    port = sock.getsockname()[1]
    sock.close()
    import uvicorn

    def start_a():
        s = _bound_socket_on(port)
        server = uvicorn.Server(uvicorn.Config(create_fake_app(a), log_level="warning"))
        import threading

        t = threading.Thread(target=server.run, kwargs={"sockets": [s]}, daemon=True)
        t.start()
        while not server.started:
            time.sleep(0.01)
        return server, t, s

    server, thread, s = start_a()
    ua = f"http://127.0.0.1:{port}"
    cfg = {"pools": {"p": {"backends": [{"url": ua}, {"url": "http://127.0.0.1:1"}]}},
           "routes": [{"model": "m", "pool": "p"}],
           "health_check": {"interval_s": 60, "ejected_interval_s": 0.2, "timeout_s": 1}}
    with fakes(b) as (ub,):
        cfg["pools"]["p"]["backends"][1]["url"] = ub
        with gateway(cfg) as (url, gw):
            backend_a = gw.pools["p"].backends[0]
            assert backend_a.healthy
            # healthy backends are probed once a minute: the next requests find `a` gone themselves
            server.should_exit = True
            thread.join(10)
            s.close()
            answers = [complete(url, "m") for _ in range(10)]
            assert [r.status_code for r in answers] == [200] * 10
            assert {r.headers["x-gateway-backend"] for r in answers} == {"p/1"}
            assert not backend_a.healthy
            assert any(r["attempts"] == 2 for r in access_log)
            metrics = httpx.get(f"{url}/metrics").text
            assert 'tachyon_gateway:backend_healthy{backend="p/0",pool="p"} 0.0' in metrics
            assert 'tachyon_gateway:retries_total{backend="p/0",pool="p"} 1.0' in metrics
            # it comes back: the next probe finds it and it takes load again
            server, thread, s = start_a()
            deadline = time.monotonic() + 10
            while not backend_a.healthy and time.monotonic() < deadline:
                time.sleep(0.05)
            assert backend_a.healthy
            assert "p/0" in {complete(url, "m").headers["x-gateway-backend"] for _ in range(4)}
    server.should_exit = True
    thread.join(10)
    s.close()


def _bound_socket_on(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    return s


def test_backend_503_and_429_are_tried_elsewhere_and_last_answer_kept():
    busy, draining, ok = FakeState("x", ["m"], status=429), FakeState("y", ["m"], status=503), FakeState("z", ["m"])
    with fakes(busy, draining, ok) as (ux, uy, uz):
        cfg = {"pools": {"p": {"backends": [{"url": ux}, {"url": uy}, {"url": uz, "weight": 0.01}]},
                         "q": {"backends": [{"url": ux}]}},
               "routes": [{"model": "m", "pool": "p"}, {"model": "only-busy", "upstream_model": "m", "pool": "q"}]}
        with gateway(cfg) as (url, gw):
            r = complete(url, "m")
            assert r.status_code == 200 and r.headers["x-gateway-backend"] == "p/2"
            assert not gw.pools["p"].backends[1].healthy  # 503: ejected until a probe says otherwise
            r = complete(url, "only-busy")
            assert r.status_code == 429 and r.json()["error"]["message"] == "x says 429"


# -- keys and limits -------------------------------------------------------------------------------------------
def _limits_cfg(url: str) -> dict:
    return {"pools": {"p": {"backends": [{"url": url}]}},
            "keys": [{"id": "fast", "sha256": sha(GOLD), "requests_per_second": 2},
                     {"id": "tokens", "sha256": sha(BASIC), "tokens_per_minute": 10}]}


def _check_limits(url: str, other_url: str | None = None) -> None:
    other = other_url or url
    r = complete(url, "m", key="wrong")
    assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    assert complete(url, "m", key=None).status_code == 401
    # 2 requests/s, a burst of 2: the third in the same second is refused, on whichever gateway
    assert complete(url, "m").status_code == 200 and complete(other, "m").status_code == 200
    r = complete(url, "m")
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "1" and 0 < int(r.headers["retry-after-ms"]) <= 500
    assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "RateLimitError", "param": None,
                                  "code": 429}}
    assert r.json()["error"]["message"].startswith("rate limit of key 'fast' reached: requests_per_second = 2;")
    # 10 tokens/min; each answer is 3 + 4 = 7 tokens: the second overdraws, the third waits for the refill
    assert complete(url, "m", key=BASIC).status_code == 200
    assert complete(other, "m", key=BASIC, stream=True).status_code == 200  # streamed: charged from its usage
    r = complete(url, "m", key=BASIC)
    assert r.status_code == 429
    assert 20 < int(r.headers["Retry-After"]) <= 31  # 5 tokens of debt at 10/60 per second: about 30 s
    assert "tokens_per_minute = 10" in r.json()["error"]["message"]


def test_key_limits_in_process():
    with fakes(FakeState("a", ["m"])) as (ua,), gateway(_limits_cfg(ua)) as (url, gw):
        _check_limits(url)
        metrics = httpx.get(f"{url}/metrics").text
        assert 'tachyon_gateway:rate_limited_total{key_id="fast",limit="requests_per_second"} 1.0' in metrics
        assert 'tachyon_gateway:tokens_total{key_id="tokens",kind="completion"} 8.0' in metrics


@pytest.fixture(scope="module")
def redis_url():
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    pytest.importorskip("redis")
    sock = _bound_socket()
    port = sock.getsockname()[1]
    sock.close()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(10)


def test_key_limits_in_redis_shared_by_two_gateways(redis_url):
    with fakes(FakeState("a", ["m"])) as (ua,):
        cfg = _limits_cfg(ua)
        with gateway(cfg, RedisBuckets(redis_url)) as (url1, _), gateway(cfg, RedisBuckets(redis_url)) as (url2, _):
            _check_limits(url1, url2)


# -- model swap ----------------------------------------------------------------------------------------------------
def test_model_version_swap_under_load_loses_nothing(tmp_path):
    """v1 replicas serve `smol`; v2 replicas come up; the route moves to them (POST /admin/reload) while 16 streams
    run on v1: every one of those finishes on v1, every request after the swap goes to v2, none fails."""
    v1, v2 = FakeState("v1", ["smol"], ttft_s=0.1, itl_s=0.2, num_chunks=5), FakeState("v2", ["smol"])
    with fakes(v1, v2) as (u1, u2):
        path = tmp_path / "gateway.yaml"

        def write(pools: dict, pool: str) -> None:
            path.write_text(json.dumps({"pools": pools, "routes": [{"model": "smol", "pool": pool}]}))

        write({"v1": {"backends": [{"url": u1}]}}, "v1")
        from tachyon.gateway.config import load_config

        app = create_gateway_app(load_config(path), config_path=str(path), admin_key="admin")
        with serve_in_thread(app) as url:
            async def run():
                async with httpx.AsyncClient(timeout=30) as client:
                    async def stream():
                        body = {"model": "smol", "prompt": "hi", "stream": True}
                        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                            lines = [x async for x in r.aiter_lines() if x]
                            return r.status_code, r.headers.get("x-gateway-backend"), len(lines), lines[-1]

                    running = [asyncio.create_task(stream()) for _ in range(16)]
                    await asyncio.sleep(0.3)  # all 16 are streaming from v1 now
                    write({"v1": {"backends": [{"url": u1}]}, "v2": {"backends": [{"url": u2}]}}, "v2")
                    denied = await client.post(f"{url}/admin/reload", headers=auth("wrong"))
                    swap = await client.post(f"{url}/admin/reload", headers=auth("admin"))
                    after = await asyncio.gather(*(stream() for _ in range(8)))
                    return denied, swap, await asyncio.gather(*running), after

            denied, swap, before, after = asyncio.run(run())
            assert denied.status_code == 401
            assert swap.status_code == 200 and swap.json() == {"pools": {"v1": 1, "v2": 1}, "routes": 1, "keys": 0}
            assert before == [(200, "v1/0", 6, "data: [DONE]")] * 16  # 5 chunks and [DONE]: nothing cut short
            assert {(s, b) for s, b, _, _ in after} == {(200, "v2/0")}
            assert v1.requests == 16 and v2.requests == 8
            path.write_text("pools: {}\n")
            bad = httpx.post(f"{url}/admin/reload", headers=auth("admin"))
            assert bad.status_code == 400 and "config not reloaded" in bad.json()["error"]["message"]
            assert complete(url, "smol", key=None).headers["x-gateway-backend"] == "v2/0"  # the old config stays


def test_client_leaving_mid_stream_closes_the_backend_stream_and_big_bodies_are_refused():
    slow = FakeState("s", ["m"], itl_s=0.2, num_chunks=20)
    with fakes(slow) as (us,), gateway({"pools": {"p": {"backends": [{"url": us}]}}, "max_request_body_mb": 0.01}) as (
            url, gw):
        with httpx.stream("POST", f"{url}/v1/completions", json={"model": "m", "prompt": "hi", "stream": True},
                          timeout=30) as r:
            first = next(line for line in r.iter_lines() if line)
        assert first.startswith("data: {")
        deadline = time.monotonic() + 1.5  # the stream would run 4 s
        while (slow.in_flight or gw.pools["p"].backends[0].outstanding) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert slow.in_flight == 0 and gw.pools["p"].backends[0].outstanding == 0  # not 4 s later, at its end
        r = complete(url, "m", prompt="x" * 20000)
        assert r.status_code == 413 and "max_request_body_mb" in r.json()["error"]["message"]
        assert slow.requests == 1


def test_limits_store_down_serves_without_limits(caplog):
    pytest.importorskip("redis")
    s = _bound_socket()
    dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"  # bound, never listening: connections are refused
    try:
        with fakes(FakeState("a", ["m"])) as (ua,), gateway(_limits_cfg(ua), RedisBuckets(dead)) as (url, _):
            assert [complete(url, "m").status_code for _ in range(3)] == [200] * 3  # 2/s would refuse the third
        assert "rate limits of key fast not checked: their store failed" in caplog.text
    finally:
        s.close()
