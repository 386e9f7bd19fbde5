"""The gateway over two real replicas: `server` (conftest: the embedded model in this process) and a `tachyon serve`
subprocess started with --model-version v2. The official client through the gateway gets the replicas' own greedy
answers (streamed and not); a header rule routes to one replica; MODEL@v2 finds the replica that reports v2; 16
streams spread over both; the subprocess is SIGKILLed mid-run and none of the 16 requests started afterwards sees
an error; the in-process replica ends with every KV block free. (64 clients: test_gateway.py, on fake backends.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
from tachyon.gateway.app import create_gateway_app  # noqa: E402
from tachyon.gateway.config import parse_config  # noqa: E402
from tests.integration.conftest import API_KEY, MODEL, _bound_socket, _wait_healthy, serve_in_thread  # noqa: E402
from tests.integration.test_server import wait_idle  # noqa: E402

MESSAGES = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def replica():
    sock = _bound_socket()
    port = sock.getsockname()[1]
    sock.close()
    cmd = [sys.executable, "-m", "tachyon.cli", "serve", "--port", str(port), "--kv-cache-memory-gib", "0.1",
           "--swap-space", "0", "--log-level", "warning", "--model-version", "v2",
           # one process: with the engine core in its own, the first requests took 17-20 s on the 2 loaded cores
           "--no-engine-process"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, TACHYON_API_KEY=API_KEY), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", 180, proc)
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_gateway_over_two_replicas_with_one_killed_mid_run(server, replica):
    replica_url, proc = replica
    cfg = {"pools": {"replicas": {"backends": [{"url": server.url, "api_key": API_KEY},
                                               {"url": replica_url, "api_key": API_KEY}]},
                     "local": {"backends": [{"url": server.url, "api_key": API_KEY}]}},
           "routes": [{"model": MODEL, "when": {"header": {"x-scenario": "local"}}, "pool": "local"},
                      {"model": MODEL, "pool": "replicas"}],
           "health_check": {"interval_s": 30, "ejected_interval_s": 30}}
    app = create_gateway_app(parse_config(cfg), seed=0)
    with serve_in_thread(app) as url:
        direct = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)
        gw = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        want = direct.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
        want_text = want.choices[0].message.content
        # a rule: the header picks the in-process replica
        raw = gw.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=8,
                                                            temperature=0, extra_headers={"x-scenario": "local"})
        assert raw.headers["x-gateway-backend"] == "local/0"
        assert raw.parse().choices[0].message.content == want_text
        # no route names MODEL@v2: the replica whose /v1/models card says version v2 gets it, sent as MODEL
        raw = gw.completions.with_raw_response.create(model=f"{MODEL}@v2", prompt="Hi", max_tokens=2)
        assert raw.headers["x-gateway-backend"] == "replicas/1" and raw.parse().model == MODEL
        assert f"{MODEL}@v2" in [m.id for m in gw.models.list()]
        # streamed through the gateway by either replica: the same greedy text
        chunks = list(gw.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                                 stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want_text
        assert all(c.usage is None for c in chunks)  # the usage chunk the gateway asked for is not passed on

        async def run_and_kill() -> list[tuple[str, str, list, bool]]:
            """16 streams; once one streams from the subprocess replica, it is SIGKILLed and 16 more start.
            Each: (before/after, backend, lines, ended with [DONE] and no error event)."""
            streaming_from_replica = asyncio.Event()
            async with httpx.AsyncClient(timeout=60) as client:
                async def one(i: int):
                    body = {"model": MODEL, "prompt": f"Count to {i}:", "max_tokens": 8, "stream": True}
                    try:
                        async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                            backend = r.headers.get("x-gateway-backend", "-")
                            lines = []
                            async for x in r.aiter_lines():
                                if x:
                                    lines.append(x)
                                    if backend == "replicas/1":
                                        streaming_from_replica.set()
                            ok = r.status_code == 200 and lines[-1] == "data: [DONE]" and not any(
                                x.startswith('data: {"error"') for x in lines)
                            return backend, lines, ok
                    except httpx.HTTPError as e:
                        return "-", [repr(e)], False

                async def kill_then_more():
                    await asyncio.wait_for(streaming_from_replica.wait(), 60)
                    proc.send_signal(signal.SIGKILL)
                    await asyncio.to_thread(proc.wait, 10)
                    return await asyncio.gather(*(one(i) for i in range(16)))

                before, after = await asyncio.gather(asyncio.gather(*(one(i) for i in range(16))), kill_then_more())
                return [("before", *b) for b in before] + [("after", *a) for a in after]

        t0 = time.monotonic()
        results = asyncio.run(run_and_kill())
        early = [r for r in results if r[0] == "before"]
        assert {"replicas/0", "replicas/1"} <= {r[1] for r in early}  # least outstanding: both take a share
        assert all(r[3] for r in early if r[1] == "replicas/0")  # the surviving replica's streams are untouched
        late = [r for r in results if r[0] == "after"]
        assert len(late) == 16 and all(r[3] for r in late), [r for r in late if not r[3]][:2]
        assert {r[1] for r in late} == {"replicas/0"}
        # those on the killed replica end (with an error event or a 502), none hangs
        assert time.monotonic() - t0 < 60
        metrics = httpx.get(f"{url}/metrics").text
        assert 'tachyon_gateway:backend_healthy{backend="replicas/1",pool="replicas"} 0.0' in metrics
    wait_idle(server)
