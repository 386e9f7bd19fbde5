"""`tachyon serve` as a user starts it: the queue limit answers 429 at once, SIGTERM shuts down cleanly."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")

API_KEY = "test-key"  # as in conftest.py


def _headers():
    return {"Authorization": f"Bearer {API_KEY}"}


def test_queue_limit_answers_429(cli_server):
    """One running sequence, at most one waiting: of 6 requests at once some get 429 fast, the rest finish."""
    body = {"prompt": "Count to ten:", "max_tokens": 12, "ignore_eos": True, "temperature": 0}

    async def one(client):
        t0 = time.monotonic()
        r = await client.post("/v1/completions", json=body)
        return r, time.monotonic() - t0

    async def main():
        async with httpx.AsyncClient(base_url=cli_server.url, headers=_headers(), timeout=120) as client:
            return await asyncio.gather(*(one(client) for _ in range(6)))

    results = asyncio.run(main())
    statuses = [r.status_code for r, _ in results]
    assert set(statuses) <= {200, 429} and statuses.count(429) >= 1 and statuses.count(200) >= 1, statuses
    slowest_ok = max(dt for r, dt in results if r.status_code == 200)
    for r, dt in results:
        if r.status_code == 429:
            err = r.json()["error"]
            assert err["type"] == "RateLimitError" and err["code"] == 429 and "retry" in err["message"]
            assert r.headers.get("retry-after")
            assert dt < slowest_ok / 2  # answered at once, not after waiting in line
        else:
            assert r.json()["usage"]["completion_tokens"] == 12
    assert httpx.get(f"{cli_server.url}/health").status_code == 200
    r = httpx.post(f"{cli_server.url}/v1/completions", json=body, headers=_headers(), timeout=60)
    assert r.status_code == 200  # the server stays up


def test_sigterm_finishes_or_aborts_and_exits_0(cli_server):
    proc = cli_server.process
    body = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    events: list[str] = []
    first = threading.Event()

    def stream():
        try:
            with httpx.stream("POST", f"{cli_server.url}/v1/completions", json=body, headers=_headers(),
                              timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        events.append(line)
                        first.set()
        except httpx.HTTPError as e:
            events.append(f"error: {e!r}")
        first.set()

    t = threading.Thread(target=stream)
    t.start()
    assert first.wait(60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
    t.join(timeout=10)
    assert not t.is_alive()
    # the long request was aborted after the grace period (2 s): its stream ended cleanly, the port is closed
    assert events[-1] == "data: [DONE]" and '"finish_reason":"abort"' in events[-2], events[-3:]
    assert len(events) < 2000
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{cli_server.url}/health", timeout=2)
