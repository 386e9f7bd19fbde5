"""`gateway.yaml`: what the gateway routes where, who may call it and how often.

```yaml
pools:                       # named groups of OpenAI-compatible backends (Tachyon replicas, vLLM, TGI, ...)
  smol:
    backends:
      - url: http://10.0.0.1:8000
      - {url: http://10.0.0.2:8000, api_key: KEY-THE-BACKEND-WANTS, weight: 2}
  smol-canary:
    backends: [{url: http://10.0.0.3:8000}]
routes:                      # the first route whose conditions all hold wins
  - model: smol@v2           # what the client sends ("*": any model)
    upstream_model: smol     # what the backend is sent (default: unchanged)
    pool: smol-canary
  - model: smol
    when: {tier: gold}       # also: min_prompt_chars, max_prompt_chars, header: {x-scenario: batch}
    pool: smol
  - model: smol
    split: [{pool: smol, weight: 95}, {pool: smol-canary, weight: 5}]   # canary: 1 request in 20
keys:                        # none: the gateway is open
  - id: alice
    sha256: 2bb80d53...      # printf %s "$KEY" | sha256sum  (the key itself is never stored)
    tier: gold
    requests_per_second: 20
    tokens_per_minute: 100000
health_check: {interval_s: 5, timeout_s: 2}
```

A model no route names goes to the backends whose `/v1/models` reports it (the gateway follows what each
backend serves). Prompt length is counted in characters: the gateway does not tokenize.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not silently ignored


class BackendConfig(_Strict):
    url: str = Field(description="base URL of an OpenAI-compatible server, without /v1")
    api_key: str | None = Field(None, description="the key this backend wants (sent as 'Authorization: Bearer')")
    weight: float = Field(1.0, gt=0, description="share of the pool's load relative to its other backends")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not re.match(r"^https?://[^/]+", v):
            raise ValueError(f"{v!r} is not an http(s) URL: write it as http://HOST:PORT")
        v = v.rstrip("/")
        return v[:-3] if v.endswith("/v1") else v


class PoolConfig(_Strict):
    backends: list[BackendConfig] = Field(min_length=1)


class Match(_Strict):
    """Conditions of a route; all given ones must hold."""

    tier: str | None = None
    min_prompt_chars: int | None = Field(None, ge=0)
    max_prompt_chars: int | None = Field(None, ge=0)
    header: dict[str, str] = Field(default_factory=dict, description="header name -> exact value")

    @field_validator("header")
    @classmethod
    def _lower(cls, v: dict[str, str]) -> dict[str, str]:
        return {k.lower(): val for k, val in v.items()}


class SplitTarget(_Strict):
    pool: str
    weight: float = Field(gt=0)


class RouteConfig(_Strict):
    model: str = Field(description="the model the client asks for (name or name@version); '*' for any")
    when: Match = Field(default_factory=Match)
    pool: str | None = None
    split: list[SplitTarget] | None = Field(None, min_length=1)
    upstream_model: str | None = Field(None, description="the model name sent to the backend")

    @model_validator(mode="after")
    def _one_target(self):
        if (self.pool is None) == (self.split is None):
            raise ValueError("give a route either 'pool: NAME' or 'split: [{pool: NAME, weight: W}, ...]', "
                             "not both or neither")
        return self

    def targets(self) -> list[SplitTarget]:
        return self.split if self.split is not None else [SplitTarget(pool=self.pool, weight=1)]


class KeyConfig(_Strict):
    id: str = Field(description="the name access logs and metrics use for this key")
    sha256: str = Field(description="hex sha256 of the key: printf %s \"$KEY\" | sha256sum")
    tier: str = "default"
    requests_per_second: float | None = Field(None, gt=0)
    tokens_per_minute: float | None = Field(None, gt=0)

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = v.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("not a sha256 in hex (64 characters 0-9a-f): store the key's hash, "
                             "printf %s \"$KEY\" | sha256sum, never the key itself")
        return v


class HealthCheckConfig(_Strict):
    interval_s: float = Field(5.0, gt=0, description="how often each healthy backend's /health is probed")
    ejected_interval_s: float = Field(1.0, gt=0, description="how often an ejected backend is probed to bring it back")
    timeout_s: float = Field(2.0, gt=0)
    path: str = "/health"


class GatewayConfig(_Strict):
    pools: dict[str, PoolConfig] = Field(min_length=1)
    routes: list[RouteConfig] = Field(default_factory=list)
    keys: list[KeyConfig] = Field(default_factory=list)
    health_check: HealthCheckConfig = Field(default_factory=HealthCheckConfig)
    connect_timeout_s: float = Field(2.0, gt=0, description="a backend not accepting within this is skipped")
    read_timeout_s: float = Field(600.0, gt=0, description="longest wait for the next byte of an answer")
    max_attempts: int = Field(3, ge=1, description="backends tried for one request before answering 502")
    max_request_body_mb: float = Field(16.0, gt=0, description="larger request bodies are answered 413")
    access_log: Literal["json", "off"] = "json"

    @model_validator(mode="after")
    def _references(self):
        names = ", ".join(sorted(self.pools))
        for i, route in enumerate(self.routes):
            for t in route.targets():
                if t.pool not in self.pools:
                    raise ValueError(f"routes[{i}] (model {route.model!r}) names pool {t.pool!r}, which is not "
                                     f"under 'pools:' (pools: {names})")
        seen: dict[str, str] = {}
        for k in self.keys:
            if k.sha256 in seen:
                raise ValueError(f"keys {seen[k.sha256]!r} and {k.id!r} have the same sha256: each key must differ")
            seen[k.sha256] = k.id
        return self


def load_config(path: str | Path) -> GatewayConfig:
    """The config in `path`, or a ValueError naming each field to fix."""
    text = Path(path).read_text()
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return parse_config(raw, str(path))


def parse_config(raw: object, source: str = "gateway config") -> GatewayConfig:
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: expected a mapping with 'pools:' (and 'routes:', 'keys:'), got "
                         f"{type(raw).__name__}")
    try:
        return GatewayConfig.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field: remove it or check its spelling"
            lines.append(f"  {where}: {msg}")
        raise ValueError(f"{source}: {len(lines)} problem(s):\n" + "\n".join(lines)) from None
