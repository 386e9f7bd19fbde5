"""Hostile traffic against `tachyon serve` on the embedded model (CPU): the measured table of issue 12.

    PYTHONPATH=. python benchmarks/hostile.py --out benchmarks/results/cpu_hostile.json

Starts the server as a user would, measures a normal request's latency alone, then sends every case of
tachyon.bench.hostile's catalogue (full value set), property-based fuzzed bodies, oversized bodies and
clients that leave mid-body, while a prober keeps sending normal requests. Counts the outcome classes, engine
deaths (/health not 200 after a case), leaks (requests running or KV blocks in use at the end, RSS growth),
and the prober's latency percentiles. Writes JSON and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tachyon.bench.hostile import COMPLETIONS, Case, all_cases, fuzz_cases, judge  # noqa: E402

KEY = "bench-key"


def start_server(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tachyon.cli", "serve", "--port", str(port), "--kv-cache-memory-gib", "0.25",
           "--swap-space", "0", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, TACHYON_API_KEY=KEY), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    raise TimeoutError("the server did not come up")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def percentiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if not xs:
        return {}
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]
    return {"n": len(xs), "p50_ms": pick(0.5) * 1e3, "p90_ms": pick(0.9) * 1e3, "p99_ms": pick(0.99) * 1e3,
            "max_ms": xs[-1] * 1e3, "mean_ms": statistics.fmean(xs) * 1e3}


class Prober(threading.Thread):
    """A normal user: one short completion after another; records latency and failures."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.latencies, self.failures = url, threading.Event(), [], 0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                r = c.post(COMPLETIONS, json={"prompt": "The capital of France is", "max_tokens": 4,
                                              "temperature": 0, "ignore_eos": True})
                dt = time.perf_counter() - t0
                if r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4:
                    self.latencies.append(dt)
                else:
                    self.failures += 1
                time.sleep(0.05)


def leave_mid_body(port: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
    s.close()


def fuzz_bodies(n: int) -> list[Case]:
    from hypothesis import HealthCheck, given, settings

    out: list[Case] = []

    @settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=fuzz_cases())
    def collect(case):
        out.append(case)

    collect()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/cpu_hostile.json")
    ap.add_argument("--fuzz", type=int, default=500, help="property-based fuzzed bodies")
    ap.add_argument("--baseline-s", type=float, default=20.0, help="seconds of the prober alone")
    args = ap.parse_args()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}"
    t_start = time.time()
    proc = start_server(port)
    try:
        headers = {"Authorization": f"Bearer {KEY}"}
        prober = Prober(url)
        prober.start()
        time.sleep(args.baseline_s)
        alone = list(prober.latencies)
        prober.latencies.clear()
        rss_before = rss_mib(proc.pid)

        cases = all_cases() + fuzz_bodies(args.fuzz)
        cases.append(Case("17 MiB body", COMPLETIONS, b'{"prompt": "' + b"a" * (17 << 20) + b'"}',
                          allowed=frozenset({413})))
        outcomes: Counter = Counter()
        defects, deaths = [], 0
        t0 = time.perf_counter()
        with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
            for case in cases:
                try:
                    r = c.post(case.path, content=case.body, headers=case.headers)
                    outcome = judge(case, r)
                except httpx.HTTPError as e:
                    outcome, r = f"connection error ({type(e).__name__})", None
                outcomes[outcome] += 1
                if not outcome.startswith("ok"):
                    defects.append({"case": case.name, "outcome": outcome,
                                    "status": r.status_code if r is not None else None,
                                    "body": r.text[:300] if r is not None else None})
                if httpx.get(f"{url}/health", timeout=30).status_code != 200:
                    deaths += 1
            for _ in range(50):
                leave_mid_body(port)
                outcomes["client left mid-body"] += 1
        hostile_s = time.perf_counter() - t0
        prober.stop.set()
        prober.join()
        during = list(prober.latencies)

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = httpx.get(f"{url}/metrics", timeout=10).text
            gauges = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in m.splitlines()
                      if line.startswith(("tachyon:num_requests_running", "tachyon:num_requests_waiting",
                                          "tachyon:kv_cache_usage_perc"))}
            if not any(gauges.values()):
                break
            time.sleep(0.5)
        rss_after = rss_mib(proc.pid)
        healthy = httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        proc.terminate()
        log = proc.communicate(timeout=60)[0]
    import tachyon

    result = {
        "command": "PYTHONPATH=. python benchmarks/hostile.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime(t_start)), "tachyon": tachyon.__version__,
        "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (CPU only)",
        "python": platform.python_version(), "model": "SmolLM2-135M-Instruct (embedded), fp32, CPU",
        "cases": sum(outcomes.values()), "outcomes": dict(outcomes), "defects": defects,
        "engine_deaths": deaths, "healthy_at_end": healthy, "gauges_at_end": gauges,
        "leaks": {"requests_running": gauges.get("tachyon:num_requests_running"),
                  "requests_waiting": gauges.get("tachyon:num_requests_waiting"),
                  "kv_cache_usage": gauges.get("tachyon:kv_cache_usage_perc"),
                  "rss_mib_before": round(rss_before, 1), "rss_mib_after": round(rss_after, 1)},
        "hostile_seconds": round(hostile_s, 1),
        "normal_request": {"alone": percentiles(alone), "during_hostile": percentiles(during),
                           "failures": prober.failures,
                           "what": "completion, 6-token prompt, 4 tokens, one after another"},
        "tracebacks_in_server_log": log.count("Traceback"),
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    md = args.out.rsplit(".", 1)[0] + ".md"
    with open(md, "w") as f:
        f.write(f"# Hostile traffic against `tachyon serve` ({result['model']})\n\n`{result['command']}`, "
                f"{result['date']} UTC, {result['hardware']}\n\n| measure | value |\n|---|---|\n")
        f.write(f"| cases tried | {result['cases']} ({len(all_cases())} catalogue, {args.fuzz} fuzzed, "
                f"1 oversized body, 50 clients leaving mid-body) |\n")
        for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]):
            f.write(f"| outcome: {k} | {v} |\n")
        f.write(f"| defects (5xx, wrong status, wrong param, malformed body) | {len(defects)} |\n")
        f.write(f"| engine deaths (/health not 200 after a case) | {deaths} |\n")
        lk = result["leaks"]
        f.write(f"| leaks at the end: running / waiting / KV in use | {lk['requests_running']:g} / "
                f"{lk['requests_waiting']:g} / {lk['kv_cache_usage']:g} |\n")
        f.write(f"| server RSS before / after the hostile traffic | {lk['rss_mib_before']} / {lk['rss_mib_after']} MiB |\n")
        f.write(f"| tracebacks in the server log | {result['tracebacks_in_server_log']} |\n")
        for label, key in (("alone", "alone"), ("while hostile traffic runs", "during_hostile")):
            p = result["normal_request"][key]
            f.write(f"| normal request {label}: p50 / p99 / max (n) | {p['p50_ms']:.0f} / {p['p99_ms']:.0f} / "
                    f"{p['max_ms']:.0f} ms ({p['n']}) |\n")
        f.write(f"| normal requests that failed | {prober.failures} |\n")
    print(open(md).read())
    return 0 if not defects and not deaths else 1


if __name__ == "__main__":
    sys.exit(main())
