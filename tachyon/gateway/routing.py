"""Which pool answers a request: the first route whose model and conditions match, its split, or else the
backends that report the model.

Weighted splits use smooth weighted round-robin (nginx's): with weights 95 and 5, request 20k+10 (say) goes
to the canary, exactly 1 in 20, spread evenly rather than in bursts, and the same on every run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tachyon.gateway.backends import Pool
from tachyon.gateway.config import GatewayConfig, Match, RouteConfig


@dataclass(frozen=True)
class RequestFacts:
    model: str
    tier: str | None
    prompt_chars: int
    headers: Mapping[str, str]  # lower-case names


@dataclass(frozen=True)
class Decision:
    pools: list[Pool]  # tried in order: the chosen pool first, then the route's other split targets
    upstream_model: str
    route: str  # what the access log shows: "routes[2]" or "reported"


def prompt_chars(body: dict) -> int:
    """Characters of the prompt (completions) or of the messages' text (chat)."""
    if "messages" in body:
        n = 0
        for m in body.get("messages") or ():
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                n += len(content)
            elif isinstance(content, list):
                n += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
        return n
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(len(p) if isinstance(p, (str, list)) else 1 for p in prompt)
    return 0


def _matches(when: Match, facts: RequestFacts) -> bool:
    if when.tier is not None and facts.tier != when.tier:
        return False
    if when.min_prompt_chars is not None and facts.prompt_chars < when.min_prompt_chars:
        return False
    if when.max_prompt_chars is not None and facts.prompt_chars > when.max_prompt_chars:
        return False
    return all(facts.headers.get(name) == value for name, value in when.header.items())


class _SmoothWeighted:
    def __init__(self, weights: list[float]):
        self.weights = weights
        self.current = [0.0] * len(weights)

    def next(self) -> int:
        total = sum(self.weights)
        for i, w in enumerate(self.weights):
            self.current[i] += w
        best = max(range(len(self.weights)), key=lambda i: self.current[i])
        self.current[best] -= total
        return best


class Router:
    def __init__(self, config: GatewayConfig, pools: dict[str, Pool]):
        self.routes: list[RouteConfig] = config.routes
        self.pools = pools
        self._splits = [_SmoothWeighted([t.weight for t in r.targets()]) for r in self.routes]

    def route(self, facts: RequestFacts) -> Decision | None:
        for i, r in enumerate(self.routes):
            if r.model not in ("*", facts.model) or not _matches(r.when, facts):
                continue
            targets = r.targets()
            first = self._splits[i].next()
            order = [targets[first].pool] + [t.pool for j, t in enumerate(targets) if j != first]
            return Decision([self.pools[p] for p in dict.fromkeys(order)], r.upstream_model or facts.model,
                            f"routes[{i}]")
        reporting = [b for p in self.pools.values() for b in p.backends if facts.model in b.models]
        if not reporting:
            return None
        # "smol@v2" reported as id "smol", version "v2": the backend is sent the id it knows
        rng = next(iter(self.pools.values())).rng
        return Decision([Pool("reported", reporting, rng)], reporting[0].models[facts.model], "reported")

    def known_models(self) -> list[str]:
        named = [r.model for r in self.routes if r.model != "*"]
        reported = [m for p in self.pools.values() for b in p.backends if b.healthy for m in b.models]
        return list(dict.fromkeys(named + sorted(reported)))
