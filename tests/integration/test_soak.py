"""Soak: hundreds of requests with random disconnects and aborts, through `tachyon serve` and through the offline
engine. Afterwards nothing runs or waits, every KV block is back in the pool, and resident memory has not grown
past a stated margin. Each test prints its outcome counts and RSS numbers (see them with `pytest -s`).

Prompts are short and a third share a 55-token prefix, so the prefix cache hands the same blocks to many
requests while others abort. Up to 64 sequences run at once in a pool of 0.1 GiB (144 blocks of 16 tokens).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest

from tests.integration.conftest import API_KEY, MODEL, _bound_socket, _wait_healthy

NUM_REQUESTS = 480  # within CI's 10-minute budget for the whole suite
NUM_OFFLINE_REQUESTS = 360  # the offline soak (same budget); the RSS margins are those set for 600 requests
NUM_WARMUP = 60
CONCURRENCY = 64
MAX_TOKENS = 8  # short generations keep the soaks within about a minute on 2 cores
MIB = 1024

SHARED = ("You are a careful assistant. Answer in one short sentence, use plain words, avoid lists, do not "
          "repeat the question, and never make up facts you are not sure about. If a question has no good "
          "answer, say so briefly. Here is the question for you:")
SHORT = ["The capital of France is", "Once upon a time", "def fib(n):", "Two plus two is", "Hello, my name is",
         "The sky looks", "A haiku about rain:", "List three fruits:", "In 1969,", "Water boils at"]
PROBE = "The three primary colors are"  # under one block: no prefix-cache hit changes its greedy output


def _prompt(rng: random.Random, i: int) -> str:
    if rng.random() < 1 / 3:
        return f"{SHARED} what is {rng.randint(1, 99)} plus {i % 7}?"
    return f"{rng.choice(SHORT)} {i}"


def _sampling_kwargs(rng: random.Random) -> dict:
    """max_tokens, ignore_eos, temperature and seed of one request: the HTTP body and SamplingParams alike."""
    kw = {"max_tokens": rng.randint(1, MAX_TOKENS), "ignore_eos": rng.random() < 0.3}
    if rng.random() < 0.5:
        return {**kw, "temperature": 0.0}
    return {**kw, "temperature": 0.8, "seed": rng.randint(0, 2**31)}


def _rss_kib(pid: int | str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _rss_margin_kib(before: int) -> int:
    """RSS growth allowed over the requests after the warm-up: 64 MiB or 10%, whichever is larger
    (about 100 MiB for these ~1 GiB processes). Without a leak RSS still rises in steps, as the allocators
    reach new high-water marks, by up to ~40 MiB in a run, then stays flat; a leak of 100 KiB a request
    (a KV tensor, a request's state with its token lists) goes past. The offline test also counts Request
    objects, which finds smaller leaks there."""
    return max(64 * MIB, before // 10)


# -- over HTTP -------------------------------------------------------------------------------------------------
KINDS = ("stream", "disconnect", "timeout", "close", "full", "chat")


def _plan(rng: random.Random, n: int) -> list[dict]:
    """What each client does, drawn up front so the run is the same every time (up to timing)."""
    items = []
    for i in range(n):
        kind = rng.choice(KINDS)
        body = _sampling_kwargs(rng)
        if kind == "chat":
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": _prompt(rng, i)}]
        else:
            path = "/v1/completions"
            body["prompt"] = _prompt(rng, i)
        body["stream"] = kind in ("stream", "disconnect", "chat") or (kind == "close" and rng.random() < 0.5)
        items.append({"kind": kind, "path": path, "body": body, "chunks": rng.randint(1, 4),
                      "timeout": rng.uniform(0.05, 1.5)})
    return items


def _stream_problem(lines: list[str]) -> str | None:
    """What is wrong with a stream read to its end, or None: it ends with [DONE], every chunk before is JSON
    without an error, and some choice has a finish_reason."""
    if not lines or lines[-1] != "data: [DONE]":
        return f"no [DONE] at the end: {lines[-2:]}"
    chunks = [json.loads(line[len("data: "):]) for line in lines[:-1]]
    if any("error" in c for c in chunks):
        return f"error chunk: {next(c for c in chunks if 'error' in c)}"
    if not any(ch.get("finish_reason") for c in chunks for ch in c["choices"]):
        return f"no finish_reason in {len(chunks)} chunks"
    return None


async def _send_and_close(url: str, path: str, body: dict) -> None:
    """The whole request on a raw socket, then close it before any answer."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
    _, writer = await asyncio.open_connection(host, int(port))
    writer.write(head.encode() + data)
    await writer.drain()
    writer.close()
    await writer.wait_closed()


async def _one(client: httpx.AsyncClient, url: str, item: dict) -> tuple[str, str | None]:
    """(outcome, problem or None) of one client."""
    kind, path, body = item["kind"], item["path"], item["body"]
    if kind == "close":
        await _send_and_close(url, path, body)
        return "close:sent", None
    if kind == "timeout":
        try:
            r = await client.post(path, json=body, timeout=item["timeout"])
        except httpx.TimeoutException:
            return "timeout:timed_out", None
        return "timeout:done", None if r.status_code == 200 else f"timeout: {r.status_code} {r.text[:200]}"
    if kind == "full":
        r = await client.post(path, json=body)
        if r.status_code != 200:
            return "full:error", f"full: {r.status_code} {r.text[:200]}"
        reason = r.json()["choices"][0]["finish_reason"]
        return "full:done", None if reason in ("stop", "length") else f"full: finish_reason {reason!r}"
    lines = []
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return f"{kind}:error", f"{kind}: {r.status_code} {(await r.aread())[:200]!r}"
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                lines.append(line)
                if kind == "disconnect" and len(lines) == item["chunks"] and line != "data: [DONE]":
                    return "disconnect:closed", None  # leaving the block closes the connection mid-stream
    problem = _stream_problem(lines)
    return f"{kind}:done", None if problem is None else f"{kind}: {problem}"


async def _drive(url: str, plan: list[dict]) -> tuple[Counter, list[str]]:
    sem = asyncio.Semaphore(CONCURRENCY)
    outcomes: Counter = Counter()
    problems: list[str] = []
    limits = httpx.Limits(max_connections=2 * CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=300,
                                 limits=limits) as client:
        async def guarded(item):
            async with sem:
                try:
                    outcome, problem = await _one(client, url, item)
                except httpx.HTTPError as e:  # a dropped connection or a timeout nobody asked for
                    outcome, problem = f"{item['kind']}:exception", f"{item['kind']}: {e!r}"
            outcomes[outcome] += 1
            if problem is not None:
                problems.append(problem)

        await asyncio.gather(*(guarded(item) for item in plan))
    return outcomes, problems


def _metrics(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _gauges(url: str) -> dict[str, float]:
    m = _metrics(url)
    names = ("tachyon:num_requests_running", "tachyon:num_requests_waiting", "tachyon:kv_cache_usage_perc")
    return {name: m[(name, (("model_name", MODEL),))] for name in names}


def _wait_drained(url: str, timeout: float = 60.0) -> dict[str, float]:
    """The three gauges once they read 0, or as they read when the time is up (the caller asserts)."""
    deadline = time.monotonic() + timeout
    while True:
        gauges = _gauges(url)
        if not any(gauges.values()) or time.monotonic() > deadline:
            return gauges
        time.sleep(0.2)


def _server_5xx(url: str) -> dict[str, float]:
    return {f"{dict(labels)['route']} {dict(labels)['status']}": v for (name, labels), v in _metrics(url).items()
            if name == "tachyon:http_requests_total" and dict(labels)["status"].startswith("5") and v}


def _greedy_probe(url: str) -> str:
    body = {"prompt": PROBE, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory):
    """`tachyon serve` in a subprocess, its output in a file: (url, process, log path)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("prometheus_client")
    sock = _bound_socket()
    port = sock.getsockname()[1]
    sock.close()
    log = tmp_path_factory.mktemp("soak") / "server.log"
    cmd = [sys.executable, "-m", "tachyon.cli", "serve", "--port", str(port), "--max-num-seqs", str(CONCURRENCY),
           "--kv-cache-memory-gib", "0.1", "--swap-space", "0", "--log-level", "warning"]
    # one intra-op thread: the clients need the other core, and two OpenMP threads sharing one core spin
    # against each other (a step becomes many times slower)
    env = dict(os.environ, TACHYON_API_KEY=API_KEY, OMP_NUM_THREADS="1")
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_healthy(url, 180, proc)
        yield url, proc, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.slow
def test_http_soak(soak_server):
    url, proc, log = soak_server
    rng = random.Random(0)
    probe = _greedy_probe(url)
    _, warm_problems = asyncio.run(_drive(url, _plan(rng, NUM_WARMUP)))
    assert not warm_problems, warm_problems[:10]
    assert not any(_wait_drained(url).values())
    rss_before = _rss_kib(proc.pid)
    before = _metrics(url)

    outcomes, problems = asyncio.run(_drive(url, _plan(rng, NUM_REQUESTS)))
    gauges = _wait_drained(url)
    rss_after = _rss_kib(proc.pid)
    after = _metrics(url)

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted({"model_name": MODEL, **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    finished = delta("tachyon:e2e_request_latency_seconds_count")
    aborts = delta("tachyon:request_success_total", finished_reason="abort")
    print(f"\nhttp soak: {dict(sorted(outcomes.items()))}")
    print(f"http soak: engine requests finished {finished:.0f} (aborted {aborts:.0f}), preemptions "
          f"{delta('tachyon:num_preemptions_total'):.0f}, prefix-cache hit tokens "
          f"{delta('tachyon:prefix_cache_hits_total'):.0f}; RSS {rss_before / MIB:.1f} -> {rss_after / MIB:.1f} MiB")

    assert sum(outcomes.values()) == NUM_REQUESTS
    assert not problems, f"{len(problems)} problems, the first: {problems[:10]}"
    assert all(outcomes[k] for k in ("stream:done", "disconnect:closed", "timeout:timed_out", "close:sent",
                                     "full:done", "chat:done")), outcomes  # every path was taken
    assert not any(gauges.values()), f"not drained 60 s after the last client: {gauges}"
    # each HTTP request is one engine request (n=1, one prompt): none finished twice; a client that closed
    # at once may have left before its request entered the engine
    assert NUM_REQUESTS - outcomes["close:sent"] <= finished <= NUM_REQUESTS
    assert aborts > 0  # clients that left had their requests aborted, not run to the end
    assert not _server_5xx(url), _server_5xx(url)
    assert httpx.get(f"{url}/health", timeout=30).status_code == 200
    assert _greedy_probe(url) == probe  # the KV pool still computes what it did before the soak
    margin = _rss_margin_kib(rss_before)
    assert rss_after - rss_before < margin, (
        f"server RSS grew {(rss_after - rss_before) / MIB:.1f} MiB ({rss_before / MIB:.1f} -> "
        f"{rss_after / MIB:.1f} MiB) over {NUM_REQUESTS} requests; the margin is {margin / MIB:.0f} MiB")
    assert proc.poll() is None
    text = log.read_text()
    assert "Traceback" not in text, text[text.index("Traceback") - 200:][:3000]


# -- offline ---------------------------------------------------------------------------------------------------
def _sampling(rng: random.Random, n: int = 1):
    from tachyon import SamplingParams

    return SamplingParams(n=n, **_sampling_kwargs(rng))


def _check_finished(out, params, aborted: bool) -> list[str]:
    """The outcome of each choice of a finished output ("length", "stop", "abort"), checked against what
    the request asked for."""
    assert out.finished and len(out.outputs) == params.n, out
    reasons = []
    for c in out.outputs:
        assert c.finish_reason in ("stop", "length", "abort"), c
        assert len(c.token_ids) <= params.max_tokens, (c, params)
        assert c.finish_reason != "length" or len(c.token_ids) == params.max_tokens, (c, params)
        assert c.finish_reason != "stop" or not params.ignore_eos, (c, params)
        assert c.finish_reason != "abort" or aborted, f"{out.request_id} finished with abort but nobody aborted it"
        reasons.append(c.finish_reason)
    return reasons


def _stepped_wave(llm, rng: random.Random, ids: list[list[int]], tag: str) -> Counter:
    """Add the requests a few at a time while stepping, keeping about CONCURRENCY of them live; abort about
    30% some steps after they went in (some have finished by then: that abort is a no-op). Every request gets
    exactly one finished output."""
    engine = llm.engine
    todo = [(f"{tag}-{i}", p, _sampling(rng)) for i, p in enumerate(ids)]
    params = {rid: sp for rid, _, sp in todo}
    abort_at: dict[int, list[str]] = {}
    aborted: set[str] = set()
    finished: dict[str, list[str]] = {}
    outcomes: Counter = Counter()
    step = 0
    while todo or engine.has_unfinished_requests():
        live = len(params) - len(todo) - len(finished)
        if todo and live < CONCURRENCY and (rng.random() < 0.7 or live == 0):
            for _ in range(min(len(todo), rng.randint(1, 16))):
                rid, p, sp = todo.pop()
                engine.add_request(rid, None, p, sp, stream=rng.random() < 0.5)
                if rng.random() < 0.3:
                    abort_at.setdefault(step + rng.randint(0, sp.max_tokens + 2), []).append(rid)
        for rid in abort_at.pop(step, []):
            engine.abort_request(rid)
            aborted.add(rid)
        for out in engine.step():
            assert out.request_id not in finished, f"an output for {out.request_id} after its finished one"
            if out.finished:
                finished[out.request_id] = _check_finished(out, params[out.request_id], out.request_id in aborted)
                outcomes.update(f"stepped:{r}" for r in finished[out.request_id])
        step += 1
        assert step < 20 * len(ids) + 1000, "the engine does not finish its requests"
    for rid in (r for rids in abort_at.values() for r in rids):
        engine.abort_request(rid)  # aborts of requests that finished before their moment: no output, no harm
    assert not engine.step()
    assert sorted(finished) == sorted(params), "a request got no finished output"
    return outcomes


def _offline_rounds(llm, rng: random.Random, n: int, tag: str) -> Counter:
    """n requests: waves of 100-200 stepped ones with aborts, each followed by a batch of 16-48 through
    LLM.generate (n=1 and n=2 mixed)."""
    tok = llm.get_tokenizer()
    outcomes: Counter = Counter()
    done = 0
    batch = True
    while done < n:
        batch = not batch
        size = min(n - done, rng.randint(16, 48) if batch else rng.randint(100, 200))
        prompts = [_prompt(rng, done + i) for i in range(size)]
        if batch:
            params = [_sampling(rng, n=rng.choice([1, 2])) for _ in prompts]
            for out, sp in zip(llm.generate(prompts, params), params, strict=True):
                outcomes.update(f"generate:n={sp.n}:{r}" for r in _check_finished(out, sp, aborted=False))
        else:
            outcomes += _stepped_wave(llm, rng, [tok.encode(p) for p in prompts], f"{tag}{done}")
        done += size
    return outcomes


@pytest.fixture
def one_thread():
    """One intra-op thread for this test: two OpenMP threads on a core another process uses spin against
    each other (tests often run beside others on 2 cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_offline_soak(one_thread):
    import torch

    from tachyon import LLM, SamplingParams
    from tachyon.engine.sequence import Sequence

    llm = LLM(kv_cache_memory_gib=0.1, swap_space=0, max_num_seqs=CONCURRENCY)
    engine = llm.engine
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    probe = llm.generate(PROBE, greedy)[0].outputs[0].token_ids
    rng = random.Random(0)
    with torch.inference_mode():
        _offline_rounds(llm, rng, NUM_WARMUP, "warm")
        rss_before = _rss_kib("self")
        outcomes = _offline_rounds(llm, rng, NUM_OFFLINE_REQUESTS, "soak")
    rss_after = _rss_kib("self")
    print(f"\noffline soak: {dict(sorted(outcomes.items()))}")
    print(f"offline soak: preemptions {engine.scheduler.num_preemptions}, prefix-cache hit tokens "
          f"{engine.kv.prefix_hits}; RSS {rss_before / MIB:.1f} -> {rss_after / MIB:.1f} MiB")

    assert outcomes["stepped:abort"] and outcomes["stepped:length"] and outcomes["generate:n=2:length"], outcomes
    assert not engine.has_unfinished_requests() and not engine.core.live_sequences()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    engine.check_integrity()
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is Sequence], "Sequence objects outlived their requests"
    assert llm.generate(PROBE, greedy)[0].outputs[0].token_ids == probe
    margin = _rss_margin_kib(rss_before)
    assert rss_after - rss_before < margin, (
        f"RSS grew {(rss_after - rss_before) / MIB:.1f} MiB ({rss_before / MIB:.1f} -> {rss_after / MIB:.1f} MiB) "
        f"over {NUM_OFFLINE_REQUESTS} requests; the margin is {margin / MIB:.0f} MiB")
