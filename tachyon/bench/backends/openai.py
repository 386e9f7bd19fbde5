"""An HTTP client for any OpenAI-compatible server: streaming /v1/completions, arrivals, concurrency cap.

Each request records its send time, the arrival time of every streamed chunk that carries text, and the
time the stream ended; the server's `usage.completion_tokens` (when it sends it) is the output count.
"""

from __future__ import annotations

import asyncio
import json
import math
import random

from tachyon.bench.backends.base import Backend, RunResult, now
from tachyon.bench.metrics import RequestResult
from tachyon.bench.workloads import BenchRequest


class ServerUnreachable(ConnectionError):
    pass


def arrival_gaps(n: int, request_rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds to wait before each request: 0 for all-at-once (rate inf), else gamma with mean 1/rate.

    burstiness 1 is a Poisson process; < 1 is burstier, > 1 more even (gamma shape = burstiness).
    """
    if math.isinf(request_rate):
        return [0.0] * n
    if request_rate <= 0 or burstiness <= 0:
        raise ValueError("--request-rate and --burstiness must be > 0")
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)
    return [rng.gammavariate(burstiness, theta) for _ in range(n)]


def _httpx():
    try:
        import httpx
    except ImportError:
        raise ValueError("the openai backend and `bench serve` need httpx: pip install httpx") from None
    return httpx


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, args):
        self.base_url = (getattr(args, "base_url", None) or "http://127.0.0.1:8000").rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.endpoint = getattr(args, "endpoint", None) or "/v1/completions"
        self.model_name = getattr(args, "served_model_name", None)
        self.model_arg = getattr(args, "model", None)
        self.tokenizer_arg = getattr(args, "tokenizer", None)
        self.vocab_arg = getattr(args, "vocab_size", None)
        self.prompt_format = getattr(args, "prompt_format", "auto")
        self.request_rate = getattr(args, "request_rate", math.inf)
        self.burstiness = getattr(args, "burstiness", 1.0)
        self.max_concurrency = getattr(args, "max_concurrency", None)
        self.timeout = getattr(args, "request_timeout", 600.0)
        self.seed = getattr(args, "seed", 0) or 0
        self.api_key = getattr(args, "api_key", None)
        self.ignore_eos = getattr(args, "ignore_eos", True)
        self._tok = None
        self._vocab = None
        self.startup_s = 0.0
        self.server_models: list[str] = []

    # -- setup ----------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Check that the server answers, pick its model name, and find a tokenizer for the vocabulary."""
        httpx = _httpx()
        try:
            r = httpx.get(self.base_url + "/v1/models", timeout=10.0, headers=self._headers())
        except httpx.HTTPError as e:
            raise ServerUnreachable(f"cannot reach {self.base_url}: {type(e).__name__}: {e or 'no answer'}") from None
        if r.status_code == 200:
            try:
                self.server_models = [m["id"] for m in r.json().get("data", [])]
            except Exception:
                self.server_models = []
        if self.model_name is None:
            self.model_name = self.server_models[0] if self.server_models else (self.model_arg or "default")
        self._load_tokenizer()

    def _load_tokenizer(self) -> None:
        import os

        path = self.tokenizer_arg or self.model_arg
        if path is None and self.vocab_arg is None:
            try:
                from tachyon.models.embedded import embedded_model_dir

                path = embedded_model_dir()  # `tachyon serve` with no --model serves the embedded model
            except Exception:
                path = None
        if path and os.path.isdir(path) and any(f.startswith("tokenizer") for f in os.listdir(path)):
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(path)
            self._vocab = len(self._tok)
        elif path and (path.endswith(".json") or os.path.isdir(path)):
            cfg = path if path.endswith(".json") else os.path.join(path, "config.json")
            with open(cfg) as f:
                self._vocab = json.load(f)["vocab_size"]
        if self.vocab_arg:
            self._vocab = self.vocab_arg

    def _headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def vocab_size(self) -> int:
        if self._vocab is None:
            raise ValueError("random prompts need the vocabulary size: pass --tokenizer DIR or --vocab-size N")
        return self._vocab

    @property
    def tokenizer(self):
        return self._tok

    def _prompt(self, r: BenchRequest):
        if r.prompt is not None and not r.prompt_token_ids:
            return r.prompt
        fmt = self.prompt_format
        if fmt == "auto":
            fmt = "text" if self._tok is not None and self.tokenizer_arg else "ids"
        if fmt == "text":
            if r.prompt is not None:
                return r.prompt
            if self._tok is None:
                raise ValueError("--prompt-format text needs --tokenizer")
            return self._tok.decode(r.prompt_token_ids)
        return list(r.prompt_token_ids)

    def body(self, r: BenchRequest) -> dict:
        return {"model": self.model_name, "prompt": self._prompt(r), "max_tokens": r.output_len,
                "temperature": 0.0, "stream": True, "ignore_eos": self.ignore_eos,
                "stream_options": {"include_usage": True}}

    # -- running ----------------------------------------------------------------------------------------------
    async def _one(self, client, r: BenchRequest, res: RequestResult) -> None:
        httpx = _httpx()
        res.start = now()
        text_chunks = 0
        pieces: list[str] = []
        try:
            async with client.stream("POST", self.base_url + self.endpoint, json=self.body(r),
                                     headers=self._headers()) as resp:
                if resp.status_code != 200:
                    body = (await resp.aread()).decode(errors="replace").strip()
                    res.error = f"HTTP {resp.status_code}: {body[:300]}"
                    res.end = now()
                    return
                async for line in resp.aiter_lines():
                    line = line.strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    t = now()
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        res.error = f"bad stream chunk: {data[:200]}"
                        res.end = t
                        return
                    if "error" in chunk and not chunk.get("choices"):
                        res.error = f"server error in stream: {json.dumps(chunk['error'])[:300]}"
                        res.end = t
                        return
                    for ch in chunk.get("choices") or []:
                        piece = ch.get("text")
                        if piece is None:
                            piece = (ch.get("delta") or {}).get("content")
                        if piece:
                            res.token_times.append(t)
                            text_chunks += 1
                            pieces.append(piece)
                    usage = chunk.get("usage")
                    if usage and usage.get("completion_tokens") is not None:
                        res.output_tokens = int(usage["completion_tokens"])
            res.end = now()
            res.generated_text = "".join(pieces)
            if not res.output_tokens:
                res.output_tokens = text_chunks
            if not res.token_times:
                res.error = "the stream ended without any token"
                return
            res.success = True
        except httpx.HTTPError as e:
            res.end = now()
            res.error = f"{type(e).__name__}: {e or 'connection failed'}"
        except asyncio.CancelledError:
            res.end = now()
            res.error = "interrupted"
            raise

    async def _run_async(self, reqs: list[BenchRequest], results: list[RequestResult], progress, t0_box: list):
        httpx = _httpx()
        gaps = arrival_gaps(len(reqs), self.request_rate, self.burstiness, self.seed)
        sem = asyncio.Semaphore(self.max_concurrency) if self.max_concurrency else None
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        timeout = httpx.Timeout(self.timeout, connect=10.0)

        async def limited(client, r, res):
            if sem is None:
                await self._one(client, r, res)
            else:
                async with sem:
                    await self._one(client, r, res)
            if progress is not None:
                progress.update(1)

        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            t0_box.append(now())
            tasks = []
            for r, res, gap in zip(reqs, results, gaps, strict=False):
                if gap:
                    await asyncio.sleep(gap)
                tasks.append(asyncio.create_task(limited(client, r, res)))
            await asyncio.gather(*tasks)

    def run(self, reqs: list[BenchRequest], progress=None) -> RunResult:
        results = [RequestResult(r.prompt_len, r.output_len) for r in reqs]
        t0_box: list[float] = []
        interrupted = False
        try:
            asyncio.run(self._run_async(reqs, results, progress, t0_box))
        except KeyboardInterrupt:
            interrupted = True
            for res in results:
                if not res.success and not res.error:
                    res.error = "interrupted"
        t0 = t0_box[0] if t0_box else now()
        ends = [r.end for r in results if r.end]
        duration = (max(ends) if ends else now()) - t0
        return RunResult(results, duration, t0, interrupted)

    def config(self) -> dict:
        return {"base_url": self.base_url, "endpoint": self.endpoint, "model": self.model_name,
                "server_models": self.server_models, "request_rate": self.request_rate,
                "burstiness": self.burstiness, "max_concurrency": self.max_concurrency,
                "prompt_format": self.prompt_format}
