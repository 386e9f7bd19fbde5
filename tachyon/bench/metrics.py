"""Per-request timings in, `vllm bench serve`-compatible figures out. Pure functions of recorded timestamps.

Definitions (all clocks are one monotonic clock, seconds; reported in ms):
    TTFT  = first token time - request start (send time, or arrival for offline runs)
    E2EL  = end time - request start
    TPOT  = (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token
    ITL   = gaps between consecutive token (or streamed chunk) times, pooled over all requests
    decode tok/s = (n - 1) / (t(last token) - t(first token))
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestResult:
    prompt_len: int
    output_len: int  # what the request asked for
    start: float = 0.0
    token_times: list[float] = field(default_factory=list)  # one per received token (or chunk)
    end: float = 0.0
    output_tokens: int = 0  # what it got (server usage, or tokens counted)
    success: bool = False
    error: str = ""
    generated_text: str = ""  # what came back (the openai backend; vLLM's result JSON carries it)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.start if self.token_times else None

    @property
    def e2el(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        if self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def itl(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first over the time from the first chunk to the last (a chunk may carry several
        tokens, as from a server that decodes several steps per round trip)."""
        t = self.token_times
        if len(t) < 2 or t[-1] <= t[0]:
            return None
        return (max(self.output_tokens, len(t)) - 1) / (t[-1] - t[0])


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), p in [0, 100]."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def pct_key(p: float) -> str:
    return f"p{int(p) if float(p).is_integer() else p}"


def parse_percentiles(text: str) -> list[float]:
    ps = [float(x) for x in text.replace(" ", "").split(",") if x]
    if not ps or any(not 0 < p <= 100 for p in ps):
        raise ValueError(f"--percentiles {text!r}: give comma-separated numbers in (0, 100], e.g. 50,90,99")
    return ps


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """['ttft:2000', 'e2el:5000'] -> {'ttft': 2000.0, 'e2el': 5000.0} (milliseconds)."""
    slos = {}
    for item in items or []:
        for part in item.split():
            name, sep, value = part.partition(":")
            if not sep or name not in ("ttft", "tpot", "e2el"):
                raise ValueError(f"--goodput {part!r}: use NAME:MS with NAME one of ttft, tpot, e2el")
            try:
                slos[name] = float(value)
            except ValueError:
                raise ValueError(f"--goodput {part!r}: {value!r} is not a number of milliseconds") from None
            if slos[name] <= 0:
                raise ValueError(f"--goodput {part!r}: the SLO must be > 0 ms")
    return slos


def meets_slos(r: RequestResult, slos: dict[str, float]) -> bool:
    for name, limit_ms in slos.items():
        v = getattr(r, name)
        if v is not None and v * 1000.0 > limit_ms:
            return False
    return True


def peak_output_throughput(results: list[RequestResult], t0: float) -> float:
    """The most tokens received in any one-second bucket since t0."""
    buckets: dict[int, int] = {}
    for r in results:
        for t in r.token_times:
            b = int(t - t0)
            buckets[b] = buckets.get(b, 0) + 1
    return float(max(buckets.values())) if buckets else 0.0


def max_concurrent(results: list[RequestResult]) -> int:
    events = sorted([(r.start, 1) for r in results] + [(r.end, -1) for r in results], key=lambda e: (e[0], e[1]))
    now = best = 0
    for _, d in events:
        now += d
        best = max(best, now)
    return best


def summarize(results: list[RequestResult], duration: float, percentiles: list[float] = (99.0,),
              goodput: dict[str, float] | None = None, t0: float | None = None) -> dict:
    """The result fields of `vllm bench serve` (same names), from the requests of one run."""
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    dur = max(duration, 1e-9)
    series = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [g for r in ok for g in r.itl],
        "e2el": [r.e2el for r in ok],
    }
    out = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        "max_output_tokens_per_s": peak_output_throughput(ok, min((r.start for r in ok), default=0.0)
                                                          if t0 is None else t0),
        "max_concurrent_requests": max_concurrent(ok),
    }
    if goodput:
        out["request_goodput"] = sum(meets_slos(r, goodput) for r in ok) / dur
        out["goodput_slos_ms"] = dict(goodput)
    for name in METRICS:
        ms = [v * 1000.0 for v in series[name]]
        out[f"mean_{name}_ms"] = statistics.fmean(ms) if ms else 0.0
        out[f"median_{name}_ms"] = percentile(ms, 50)
        out[f"std_{name}_ms"] = statistics.pstdev(ms) if ms else 0.0
        for p in percentiles:
            out[f"{pct_key(p)}_{name}_ms"] = percentile(ms, p)
    decode = [d for d in (r.decode_tok_s for r in ok) if d is not None]
    if decode:
        out["median_decode_tok_s"] = statistics.median(decode)
    errors = [r.error for r in results if not r.success and r.error]
    if errors:
        out["errors"] = _count(errors)
    return out


def per_request_arrays(results: list[RequestResult]) -> dict:
    """vLLM's per-request lists, seconds as it writes them: input_lens, output_lens, ttfts, itls,
    generated_texts, errors."""
    return {"input_lens": [r.prompt_len for r in results], "output_lens": [r.output_tokens for r in results],
            "ttfts": [r.ttft or 0.0 for r in results], "itls": [r.itl for r in results],
            "generated_texts": [r.generated_text for r in results], "errors": [r.error for r in results]}


def _count(errors: list[str]) -> dict[str, int]:
    c: dict[str, int] = {}
    for e in errors:
        c[e[:200]] = c.get(e[:200], 0) + 1
    return c
