"""Backends, the pools they form, least-outstanding-requests choice, and the health checks that eject and
bring them back.

A backend is healthy when its last probe (`GET /health`) answered 200; a connection that fails while the gateway
proxies a request ejects it at once, and the next probe that succeeds brings it back. Each probe of a healthy
backend also reads its `/v1/models`, so routing can follow what every backend reports it serves.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field

import httpx

from tachyon.gateway.config import GatewayConfig

logger = logging.getLogger("tachyon.gateway")


@dataclass(eq=False)
class Backend:
    id: str  # "pool/index": what logs, metrics and the x-gateway-backend header show (never the URL's key)
    url: str
    api_key: str | None
    weight: float
    healthy: bool = False  # until the first probe says otherwise
    outstanding: int = 0  # requests sent and not finished
    # what its /v1/models reported last: a name clients may send (id, and id@version) -> the id it knows
    models: dict[str, str] = field(default_factory=dict)

    def eject(self, why: str) -> None:
        if self.healthy:
            logger.warning("backend %s (%s) ejected: %s", self.id, self.url, why)
        self.healthy = False


@dataclass
class Pool:
    name: str
    backends: list[Backend]
    rng: random.Random = field(default_factory=random.Random)

    def pick(self, exclude: set[Backend]) -> Backend | None:
        """The healthy backend not in `exclude` with the fewest outstanding requests per unit of weight."""
        best, best_load = [], None
        for b in self.backends:
            if not b.healthy or b in exclude:
                continue
            load = (b.outstanding + 1) / b.weight
            if best_load is None or load < best_load:
                best, best_load = [b], load
            elif load == best_load:
                best.append(b)
        return self.rng.choice(best) if best else None

    def num_healthy(self) -> int:
        return sum(b.healthy for b in self.backends)


def build_pools(config: GatewayConfig, seed: int | None = None) -> dict[str, Pool]:
    rng = random.Random(seed)
    return {name: Pool(name, [Backend(f"{name}/{i}", b.url, b.api_key, b.weight) for i, b in enumerate(p.backends)],
                       rng)
            for name, p in config.pools.items()}


def auth_headers(backend: Backend) -> dict[str, str]:
    return {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}


def model_ids(body: dict) -> dict[str, str]:
    """A name clients may send -> the name the backend is sent. A card {"id": "smol", "version": "v2"} is reached
    as smol and smol@v2; smol@v2 is sent as smol to any OpenAI server, and as smol@v2 to a Tachyon one (its cards
    are owned_by "tachyon"), which then answers from v2 or, once v2 is gone, 404. A Tachyon card of a version that
    is not its name's default carries the version in its id (smol@v3)."""
    ids = {}
    for card in body.get("data") or ():
        if isinstance(card, dict) and isinstance(card.get("id"), str):
            ids[card["id"]] = card["id"]
            version = card.get("version")
            if version and not card["id"].endswith(f"@{version}"):
                versioned = f"{card['id']}@{version}"
                ids[versioned] = versioned if card.get("owned_by") == "tachyon" else card["id"]
    return ids


class HealthChecker:
    def __init__(self, pools: dict[str, Pool], client: httpx.AsyncClient, path: str, interval_s: float,
                 ejected_interval_s: float, timeout_s: float):
        self.pools = pools  # the gateway's own dict: a reload changes it in place
        self.client = client
        self.path = path
        self.interval_s = interval_s
        self.ejected_interval_s = ejected_interval_s
        self.timeout_s = timeout_s

    async def probe(self, b: Backend) -> None:
        try:
            r = await self.client.get(b.url + self.path, headers=auth_headers(b), timeout=self.timeout_s)
            if r.status_code != 200:
                b.eject(f"{self.path} answered {r.status_code}")
                return
            m = await self.client.get(b.url + "/v1/models", headers=auth_headers(b), timeout=self.timeout_s)
            if m.status_code == 200:
                b.models = model_ids(m.json())
        except (httpx.HTTPError, ValueError) as e:
            b.eject(f"{self.path} probe failed: {e!r}")
            return
        if not b.healthy:
            logger.info("backend %s (%s) healthy", b.id, b.url)
        b.healthy = True

    async def probe_all(self, only_ejected: bool = False) -> None:
        backends = [b for p in self.pools.values() for b in p.backends]
        await asyncio.gather(*(self.probe(b) for b in backends if not (only_ejected and b.healthy)))

    async def run(self) -> None:
        """Every backend each interval_s; an ejected one also every ejected_interval_s, to bring it back soon."""
        loop = asyncio.get_running_loop()
        tick = min(self.interval_s, self.ejected_interval_s)
        next_all = loop.time() + self.interval_s
        while True:
            await asyncio.sleep(tick)
            everyone = loop.time() >= next_all
            if everyone:
                next_all = loop.time() + self.interval_s
            await self.probe_all(only_ejected=not everyone)
