"""The gateway's own Prometheus metrics (prefix `tachyon_gateway:`), in a registry of its own.

Backend state (healthy, outstanding requests) is read when Prometheus scrapes; per-request series are
observed when a request ends.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from tachyon.gateway.backends import Pool

_LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                    80.0, 160.0, 640.0]


class _BackendCollector:
    def __init__(self, pools: dict[str, Pool]):
        self.pools = pools

    def collect(self):
        healthy = GaugeMetricFamily("tachyon_gateway:backend_healthy", "1 if the backend's last health probe "
                                    "succeeded and no request since failed to connect.", labels=["pool", "backend"])
        outstanding = GaugeMetricFamily("tachyon_gateway:backend_outstanding_requests", "Requests sent to the "
                                        "backend and not finished.", labels=["pool", "backend"])
        for pool in self.pools.values():
            for b in pool.backends:
                healthy.add_metric([pool.name, b.id], float(b.healthy))
                outstanding.add_metric([pool.name, b.id], b.outstanding)
        yield healthy
        yield outstanding


class GatewayMetrics:
    def __init__(self, pools: dict[str, Pool]):
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_BackendCollector(pools))
        r = self.registry
        self.requests = Counter("tachyon_gateway:requests", "Requests answered, by model, pool, backend and status.",
                                ["model", "pool", "backend", "status"], registry=r)
        self.ttft = Histogram("tachyon_gateway:time_to_first_token_seconds", "Arrival at the gateway to the first "
                              "byte of a streamed answer's first token.", ["model", "pool"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("tachyon_gateway:e2e_request_latency_seconds", "Arrival at the gateway to the last "
                             "byte of the answer.", ["model", "pool"], buckets=_LATENCY_BUCKETS, registry=r)
        self.retries = Counter("tachyon_gateway:retries", "Attempts that failed before the first byte and were "
                               "tried on another backend.", ["pool", "backend"], registry=r)
        self.rate_limited = Counter("tachyon_gateway:rate_limited", "Requests refused with 429 by a key's limit.",
                                    ["key_id", "limit"], registry=r)
        self.tokens = Counter("tachyon_gateway:tokens", "Tokens the backends reported (usage), by key.",
                              ["key_id", "kind"], registry=r)
