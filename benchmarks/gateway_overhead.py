"""What `tachyon gateway` adds: 64 concurrent streams against a fake fast backend, direct and through the gateway.

    PYTHONPATH=. python benchmarks/gateway_overhead.py --concurrency 64 --requests 1280 --out benchmarks/results/gateway_overhead

The backend (tachyon/bench/fake_openai.py under uvicorn, its own process) answers each request with `--chunks` SSE
chunks, the first at once and then one every `--itl-ms`: a model would only add time the gateway does not
touch, so the difference between the two runs is the gateway's own. The gateway runs as `tachyon gateway`
in its own process with one API key (so the key check, the limiter and the JSON access log, written to a file,
are all in the path).
Client, gateway and backend share this machine's cores: on a small machine the three compete, which this
benchmark reports rather than hides (the runs alternate: direct, gateway, direct, gateway). The client is spread
over `--client-procs` processes: one Python process cannot take 64 streams' chunks as fast as the backend sends
them (seen on 16 cores: the direct path's p99 TTFT 0.9-4 s and two runs that disagreed by 30 ms p50).
TTFT is the client's time from sending to the first content chunk; throughput is chunks received per second.
The CPU time the gateway process spends per request (from /proc, so not inflated by other load) says what it
costs where the cores are not shared.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

KEY = "bench-key"

_BACKEND = """
import sys, uvicorn
from tachyon.bench.fake_openai import FakeState, create_fake_app
port, itl, chunks = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
app = create_fake_app(FakeState("b", ["m"], ttft_s=0.0, itl_s=itl, num_chunks=chunks))
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc): unlike wall time, not inflated by other load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_up(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


async def run_load(url: str, concurrency: int, requests: int, headers: dict) -> dict:
    ttfts: list[float] = []
    chunks = 0
    errors = 0
    queue = list(range(requests))
    body = {"model": "m", "prompt": "hi", "max_tokens": 32, "stream": True}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def worker():
            nonlocal chunks, errors
            while queue:
                queue.pop()
                start = time.perf_counter()
                first = None
                try:
                    async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("data: {"):
                                if first is None:
                                    first = time.perf_counter() - start
                                chunks += 1
                        if r.status_code != 200:
                            errors += 1
                except httpx.HTTPError:
                    errors += 1
                if first is not None:
                    ttfts.append(first)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        end = time.perf_counter()
    return {"requests": requests, "errors": errors, "chunks": chunks, "start": start, "end": end, "ttfts": ttfts}


def summarize(parts: list[dict]) -> dict:
    """One run from its client processes' parts (perf_counter is CLOCK_MONOTONIC on Linux: one clock for all)."""
    ttfts = sorted(t for p in parts for t in p["ttfts"])
    wall = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    chunks = sum(p["chunks"] for p in parts)
    return {"requests": sum(p["requests"] for p in parts), "errors": sum(p["errors"] for p in parts),
            "chunks": chunks, "wall_s": wall, "chunks_per_s": chunks / wall, "client_procs": len(parts),
            "ttft_p50_ms": 1000 * statistics.median(ttfts),
            "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))],
            "ttft_mean_ms": 1000 * statistics.fmean(ttfts)}


def _client(url: str, concurrency: int, requests: int, headers: dict, barrier, results) -> None:
    barrier.wait()  # every client process imported and ready: they start together
    results.put(asyncio.run(run_load(url, concurrency, requests, headers)))


def run_clients(url: str, concurrency: int, requests: int, headers: dict, procs: int) -> dict:
    """The load from `procs` client processes (streams and requests split evenly), so that the client is not
    what saturates: one Python process parsing 64 SSE streams tops out below the 6,400 chunks/s offered."""
    if procs <= 1:
        return summarize([asyncio.run(run_load(url, concurrency, requests, headers))])
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    split = [(concurrency * (i + 1) // procs - concurrency * i // procs,
              requests * (i + 1) // procs - requests * i // procs) for i in range(procs)]
    ps = [ctx.Process(target=_client, args=(url, c, r, headers, barrier, results)) for c, r in split]
    for p in ps:
        p.start()
    parts = [results.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    return summarize(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=1280, help="per run")
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--client-procs", type=int, default=max(1, min(8, ((os.cpu_count() or 1) - 4) // 2)),
                    help="client processes sharing the streams (default: (cores - 4) / 2, at most 8, at least 1)")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args()

    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "."))
    bport, gport = free_port(), free_port()
    backend = subprocess.Popen([sys.executable, "-c", _BACKEND, str(bport), str(args.itl_ms / 1000), str(args.chunks)],
                               env=env)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "gateway.yaml"
        cfg.write_text(json.dumps({
            "pools": {"p": {"backends": [{"url": f"http://127.0.0.1:{bport}"}]}},
            "routes": [{"model": "m", "pool": "p"}],
            "keys": [{"id": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                      "requests_per_second": 1e6, "tokens_per_minute": 1e9}]}))
        access_log = open(Path(tmp) / "access.log", "w")  # noqa: SIM115 (closed with the directory)
        gateway = subprocess.Popen([sys.executable, "-m", "tachyon.cli", "gateway", "--config", str(cfg),
                                    "--port", str(gport), "--log-level", "info"], env=env, stderr=access_log)
        try:
            direct_url, gw_url = f"http://127.0.0.1:{bport}", f"http://127.0.0.1:{gport}"
            wait_up(direct_url, backend)
            wait_up(gw_url, gateway)
            headers = {"Authorization": f"Bearer {KEY}"}
            run_clients(gw_url, args.concurrency, args.concurrency * 2, headers, args.client_procs)  # warm-up
            run_clients(direct_url, args.concurrency, args.concurrency * 2, headers, args.client_procs)
            runs = []
            for _ in range(args.repeats):
                for name, url in (("direct", direct_url), ("gateway", gw_url)):
                    cpu0 = cpu_seconds(gateway.pid), cpu_seconds(backend.pid)
                    r = run_clients(url, args.concurrency, args.requests, headers, args.client_procs)
                    r["path"] = name
                    r["gateway_cpu_s"] = cpu_seconds(gateway.pid) - cpu0[0]
                    r["backend_cpu_s"] = cpu_seconds(backend.pid) - cpu0[1]
                    runs.append(r)
                    print(json.dumps(r), flush=True)
        finally:
            for p in (gateway, backend):
                p.terminate()
                p.wait(10)
            access_log.close()

    def med(path: str, field: str) -> float:
        return statistics.median(r[field] for r in runs if r["path"] == path)

    summary = {
        "added_ttft_p50_ms": med("gateway", "ttft_p50_ms") - med("direct", "ttft_p50_ms"),
        "added_ttft_p99_ms": med("gateway", "ttft_p99_ms") - med("direct", "ttft_p99_ms"),
        "throughput_ratio": med("gateway", "chunks_per_s") / med("direct", "chunks_per_s"),
    }
    gw_runs = [r for r in runs if r["path"] == "gateway"]
    summary["gateway_cpu_ms_per_request"] = 1000 * sum(r["gateway_cpu_s"] for r in gw_runs) / sum(
        r["requests"] for r in gw_runs)
    summary["backend_cpu_ms_per_request"] = 1000 * sum(r["backend_cpu_s"] for r in gw_runs) / sum(
        r["requests"] for r in gw_runs)
    summary["meets_bar"] = summary["added_ttft_p50_ms"] < 2 and summary["throughput_ratio"] >= 0.97
    import fastapi
    import uvicorn

    result = {"benchmark": "gateway_overhead", "command": "PYTHONPATH=. python " + " ".join(sys.argv),
              "config": vars(args), "summary": summary, "runs": runs,
              "hardware": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "load_avg_at_end": os.getloadavg()},
              "versions": {"python": platform.python_version(), "httpx": httpx.__version__,
                           "uvicorn": uvicorn.__version__, "fastapi": fastapi.__version__}}
    print(json.dumps(summary))
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
        rows = "\n".join(f"| {r['path']} | {r['ttft_p50_ms']:.2f} | {r['ttft_p99_ms']:.2f} | {r['chunks_per_s']:.0f} | "
                         f"{r['errors']} |" for r in runs)
        Path(args.out + ".md").write_text(
            f"# Gateway overhead: {args.concurrency} concurrent streams, fake backend ({args.chunks} chunks, "
            f"{args.itl_ms:g} ms apart)\n\n`{result['command']}`\n\n"
            f"{os.cpu_count()} cores shared by client ({args.client_procs} processes), gateway and backend; load "
            f"average at the end "
            f"{os.getloadavg()[0]:.1f}.\n\n| path | TTFT p50 ms | TTFT p99 ms | chunks/s | errors |\n|---|---|---|---|---|\n"
            f"{rows}\n\nAdded by the gateway (medians of the runs): p50 TTFT {summary['added_ttft_p50_ms']:+.2f} ms, "
            f"p99 TTFT {summary['added_ttft_p99_ms']:+.2f} ms, throughput {100 * summary['throughput_ratio']:.1f}% "
            f"of direct. CPU time per request: gateway {summary['gateway_cpu_ms_per_request']:.2f} ms, the fake "
            f"backend {summary['backend_cpu_ms_per_request']:.2f} ms. Bar (< 2 ms p50 added, >= 97% throughput): "
            f"{'met' if summary['meets_bar'] else 'NOT met'}.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
