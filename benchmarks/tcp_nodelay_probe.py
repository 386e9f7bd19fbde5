"""Why the in-process test servers set TCP_NODELAY: median latency of a tiny JSON response from uvicorn given a
ready socket (as tests/integration/conftest.py does) without and with the option, and with host/port (as
`tachyon serve` does). Nagle holds the body write behind the header write until the client's delayed ACK.

    python benchmarks/tcp_nodelay_probe.py > benchmarks/results/cpu_tcp_nodelay.txt
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI
from starlette.responses import JSONResponse

app = FastAPI()


@app.post("/x")
async def x():
    return JSONResponse({"a": 1}, status_code=400)


def median_ms(url: str, n: int = 20) -> float:
    with httpx.Client(base_url=url) as c:
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            c.post("/x", content=b"{}")
            ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def serve(sock: socket.socket | None, port: int | None = None) -> str:
    cfg = uvicorn.Config(app, host="127.0.0.1", port=port or 0, log_level="warning")
    kwargs = {"sockets": [sock]} if sock is not None else {}
    threading.Thread(target=uvicorn.Server(cfg).run, kwargs=kwargs, daemon=True).start()
    time.sleep(1.5)
    return f"http://127.0.0.1:{sock.getsockname()[1] if sock is not None else port}"


def main() -> None:
    for nodelay in (False, True):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        if nodelay:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        print(f"ready socket, TCP_NODELAY={nodelay}: {median_ms(serve(sock)):.2f} ms")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    print(f"host/port (tachyon serve): {median_ms(serve(None, port)):.2f} ms")


if __name__ == "__main__":
    main()
