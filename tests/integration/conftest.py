"""Live servers on 127.0.0.1 for the integration tests.

`server`: the embedded model served in this process (uvicorn in a thread), so tests can reach the engine
through `server.engine` (KV blocks, live requests). `cli_server`: `tachyon serve` as a subprocess with a
queue limit of one, for the 429 and SIGTERM tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

API_KEY = "test-key"
MODEL = "SmolLM2-135M-Instruct"


@dataclass
class LiveServer:
    url: str
    app: object = None
    process: subprocess.Popen | None = None

    @property
    def engine(self):
        return self.app.state.engine

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {API_KEY}"}


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # accepted connections inherit it: uvicorn given a ready socket writes a response's headers and body
    # separately, and without it Nagle holds the body ~40 ms for the client's delayed ACK (what
    # `tachyon serve --port` gets from asyncio's create_server anyway)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _wait_healthy(url: str, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not healthy after {timeout}s")


@contextlib.contextmanager
def serve_in_thread(app):
    """The app under uvicorn in a thread of this process, on a free port; yields its URL once healthy."""
    import uvicorn

    sock = _bound_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait_healthy(url, 60)
        yield url
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="session")
def server():
    pytest.importorskip("fastapi")
    from tachyon.build import build_engine
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.engine_args import EngineArgs
    from tachyon.server.app import create_app

    engine = build_engine(EngineArgs(kv_cache_memory_gib=0.25, swap_space=0))
    app = create_app(AsyncEngine(engine), MODEL, api_key=API_KEY)
    with serve_in_thread(app) as url:
        yield LiveServer(url, app)


@pytest.fixture(scope="module")
def cli_server():
    """`tachyon serve` in a subprocess: one running sequence at a time, at most one waiting."""
    pytest.importorskip("fastapi")
    sock = _bound_socket()
    port = sock.getsockname()[1]
    sock.close()
    cmd = [sys.executable, "-m", "tachyon.cli", "serve", "--port", str(port), "--max-num-seqs", "1",
           "--max-queued-requests", "1", "--kv-cache-memory-gib", "0.1", "--swap-space", "0",
           "--shutdown-timeout", "2", "--log-level", "warning"]
    env = dict(os.environ, TACHYON_API_KEY=API_KEY)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, 180, proc)
        yield LiveServer(url, process=proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
