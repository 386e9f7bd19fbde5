"""Per-key limits on requests/s and tokens/min: token buckets, in this process or in Redis.

One primitive serves both limits. A bucket holds up to `capacity` and refills at `rate` per second;
`take(name, rate, capacity, cost, need)` succeeds when the level is at least `need`, and then removes `cost`:

    requests/s   take(cost=1, need=1)                before the request
    tokens/min   take(cost=0, need=1)                before the request: refused while the bucket is in debt
                 take(cost=tokens, need=-inf)        after it, with the tokens its answer counted

So a request that uses more tokens than are left still finishes; the key then waits until the debt is paid.
A refusal returns how long until the bucket would allow it (the Retry-After). The Redis store runs the same
arithmetic in one Lua script on Redis' own clock, so several gateways share one budget per key. While the store
fails (Redis down), the gateway serves without limits and logs it, rather than refusing everyone.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from tachyon.gateway.config import KeyConfig

_ALWAYS = -1e18  # a `need` every level meets


@dataclass
class _Bucket:
    level: float
    updated: float


class MemoryBuckets:
    """Buckets in this process (one gateway replica)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}

    async def take(self, name: str, rate: float, capacity: float, cost: float, need: float) -> float:
        now = self.clock()
        b = self._buckets.get(name)
        if b is None:
            b = self._buckets[name] = _Bucket(capacity, now)
        b.level = min(capacity, b.level + (now - b.updated) * rate)
        b.updated = now
        if b.level < need:
            return (need - b.level) / rate
        b.level -= cost
        return 0.0

    async def close(self) -> None:
        pass


_TAKE_LUA = """
local rate, cap, cost, need = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local s = redis.call('HMGET', KEYS[1], 'level', 'ts')
local level = tonumber(s[1]) or cap
local ts = tonumber(s[2]) or now
level = math.min(cap, level + math.max(0, now - ts) * rate)
local wait = 0
if level < need then wait = (need - level) / rate else level = level - cost end
redis.call('HSET', KEYS[1], 'level', tostring(level), 'ts', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(cap / rate) + 60)
return tostring(wait)
"""


class RedisBuckets:
    """Buckets in Redis (`--redis-url`): every gateway replica sees the same levels."""

    def __init__(self, url: str, prefix: str = "tachyon-gateway:"):
        import redis.asyncio as redis  # only a gateway given --redis-url needs the client

        self.client = redis.Redis.from_url(url)
        self.prefix = prefix
        self._take = self.client.register_script(_TAKE_LUA)

    async def take(self, name: str, rate: float, capacity: float, cost: float, need: float) -> float:
        return float(await self._take(keys=[self.prefix + name], args=[rate, capacity, cost, need]))

    async def close(self) -> None:
        await self.client.aclose()


@dataclass(frozen=True)
class Refusal:
    limit: str  # "requests_per_second" or "tokens_per_minute"
    retry_after: float  # seconds

    def message(self, key: KeyConfig) -> str:
        value = getattr(key, self.limit)
        return (f"rate limit of key {key.id!r} reached: {self.limit} = {value:g}; retry after "
                f"{self.retry_after:.2f} s")

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after))),
                "retry-after-ms": str(max(1, math.ceil(self.retry_after * 1000)))}


class KeyLimiter:
    def __init__(self, buckets):
        self.buckets = buckets

    async def admit(self, key: KeyConfig) -> Refusal | None:
        """None if the key may send a request now (which counts it), else why not and for how long."""
        if key.tokens_per_minute:  # first: it takes nothing, so a refusal here spends no request
            wait = await self.buckets.take(f"{key.id}:tpm", key.tokens_per_minute / 60, key.tokens_per_minute,
                                           0, 1)
            if wait > 0:
                return Refusal("tokens_per_minute", wait)
        if key.requests_per_second:
            rps = key.requests_per_second
            wait = await self.buckets.take(f"{key.id}:rps", rps, max(1.0, rps), 1, 1)
            if wait > 0:
                return Refusal("requests_per_second", wait)
        return None

    async def charge(self, key: KeyConfig, tokens: int) -> None:
        if key.tokens_per_minute and tokens > 0:
            await self.buckets.take(f"{key.id}:tpm", key.tokens_per_minute / 60, key.tokens_per_minute, tokens,
                                    _ALWAYS)
