"""Probe: a burst of N streaming /v1/completions (prompts of W random words, aiohttp, as vLLM's client sends them)
against a `tachyon serve --port 8031 --log-level debug` whose log is /tmp/cpuserve.log: per request, the time from
the client's send to the server's admit (its timeline's arrival, before 53f5850) and from the core's first token to the
client's first chunk.    python benchmarks/front_burst_probe.py W N
MODEL: the served model's name (default the embedded one); VOCAB: a tokenizer.json whose words the prompts are drawn
from (the word tokenizer of benchmarks/models/llama3-8b-serve, served with random weights from a tiny config:
session 2026-12-07e admitted a 16 x 512-word burst in 10-17 ms on this CPU, 13 ms on the H100's host).
"""
import asyncio
import json
import random
import re
import sys
import time

import aiohttp

MODEL = __import__("os").environ.get("MODEL", "SmolLM2-135M-Instruct")
URL = "http://127.0.0.1:8031/v1/completions"
words = [f"w{i}" for i in range(5000)]
if __import__("os").environ.get("VOCAB"):  # a tokenizer.json whose vocabulary the prompts are drawn from
    vocab = json.load(open(__import__("os").environ["VOCAB"]))["model"]["vocab"]
    words = [w for w in (vocab if isinstance(vocab, dict) else [v[0] for v in vocab]) if w.isalnum()][1000:6000]


async def one(session, i, res):
    prompt = " ".join(random.choice(words) for _ in range(int(sys.argv[1])))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True, "ignore_eos": True}
    t0 = time.monotonic()
    async with session.post(URL, json=body) as r:
        first = None
        async for line in r.content:
            line = line.strip()
            if line.startswith(b"data: {") and first is None:
                first = time.monotonic()
                rid = json.loads(line[6:])["id"]
        res.append((rid, t0, first))
async def main():
    res = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        await asyncio.gather(*(one(s, i, res) for i in range(int(sys.argv[2]))))
    arr = {}
    for line in open('/tmp/cpuserve.log'):
        m = re.search(r'request (\S+): arrived ([\d.]+), admitted \S+ ms, queued \S+ ms, scheduled \+([\d.]+) ms, first token \+([\d.]+) ms \(server has it \+([\d.]+)', line)
        if m:
            arr[m.group(1)] = (float(m.group(2)), float(m.group(5)))
    t00 = min(r[1] for r in res)
    for rid, t0, first in sorted(res, key=lambda r: r[1]):
        a, has = arr.get(rid, (float('nan'),)*2)
        print(f"sent +{(t0-t00)*1e3:6.1f}  admit-sent {(a-t0)*1e3:6.1f} ms  client-first - (admit+has) {(first-(a+has/1e3))*1e3:6.1f} ms")
asyncio.run(main())
