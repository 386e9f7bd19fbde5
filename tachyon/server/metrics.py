"""Prometheus metrics, named like vLLM's with a `tachyon:` prefix (or `vllm:`, --metrics-prefix) and a `model_name`
label.

Two sources:
  * the engine's own state (queue lengths, KV use, prefix-cache and token counters), read at scrape time by
    `EngineCollector`, so there is nothing to keep in sync;
  * per-token and per-request timings, observed in the engine thread by `ServerMetrics.on_step` (the
    AsyncEngine's step hook), so aborted and finished requests are counted whichever handler ran them.
Each app has its own CollectorRegistry, so tests can run several servers in one process.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from tachyon.engine.messages import ITERATION_TOKENS_BUCKETS
from tachyon.outputs import RequestOutput
from tachyon.server.gpu_metrics import GPUCollector, open_nvml

logger = logging.getLogger("tachyon")

_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0]
_TOKEN_LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                          2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
_REQUEST_LATENCY_BUCKETS = [0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                            40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def token_count_buckets(max_model_len: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to the context length."""
    buckets, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return buckets
            buckets.append(m * scale)
        scale *= 10


class EngineCollector:
    """Gauges and counters read from the engine when Prometheus scrapes."""

    def __init__(self, engine, model_name: str, prefix: str = "tachyon"):
        self.engine = engine
        self.model_name = model_name
        self.prefix = prefix

    def _one(self, family, value: float):
        family.add_metric([self.model_name], value)
        return family

    def collect(self):
        st = self.engine.stats()
        m = ["model_name"]
        yield self._one(GaugeMetricFamily(f"{self.prefix}:num_requests_running", "Sequences in the running batch.",
                                          labels=m), st.num_running)
        yield self._one(GaugeMetricFamily(f"{self.prefix}:num_requests_waiting", "Sequences waiting to be scheduled "
                                          "(including preempted ones).", labels=m),
                        self.engine.num_waiting)
        yield self._one(GaugeMetricFamily(f"{self.prefix}:kv_cache_usage_perc", "Fraction of KV-cache blocks in use "
                                          "(1 = full).", labels=m), st.kv_cache_usage)
        yield self._one(GaugeMetricFamily(f"{self.prefix}:kv_cache_num_blocks", "KV-cache blocks in the pool.",
                                          labels=m), st.num_kv_blocks)
        yield self._one(CounterMetricFamily(f"{self.prefix}:prefix_cache_queries", "Prompt tokens looked up in the "
                                            "prefix cache.", labels=m), st.prefix_cache_queries)
        yield self._one(CounterMetricFamily(f"{self.prefix}:prefix_cache_hits", "Prompt tokens found in the prefix "
                                            "cache.", labels=m), st.prefix_cache_hits)
        yield self._one(CounterMetricFamily(f"{self.prefix}:num_preemptions", "Sequences preempted for lack of KV "
                                            "blocks.", labels=m), st.num_preemptions)
        by_mode = CounterMetricFamily(f"{self.prefix}:num_preemptions_by_mode", "Preemptions by how the KV was "
                                      "given back: swap (to CPU memory) or recompute.", labels=m + ["mode"])
        by_mode.add_metric([self.model_name, "swap"], st.num_swapped_out)
        by_mode.add_metric([self.model_name, "recompute"], st.num_recomputed)
        yield by_mode
        yield self._one(CounterMetricFamily(f"{self.prefix}:prompt_tokens", "Prompt tokens admitted.", labels=m),
                        st.prompt_tokens)
        yield self._one(CounterMetricFamily(f"{self.prefix}:generation_tokens", "Tokens generated.", labels=m),
                        st.generation_tokens)
        yield self._one(CounterMetricFamily(f"{self.prefix}:spec_decode_num_drafts", "Sequence-steps that verified "
                                            "proposed tokens (speculative decoding).", labels=m), st.spec_num_drafts)
        yield self._one(CounterMetricFamily(f"{self.prefix}:spec_decode_num_draft_tokens", "Proposed tokens verified.",
                                            labels=m), st.spec_num_draft_tokens)
        yield self._one(CounterMetricFamily(f"{self.prefix}:spec_decode_num_accepted_tokens", "Proposed tokens accepted.",
                                            labels=m), st.spec_num_accepted_tokens)
        per_pos = CounterMetricFamily(f"{self.prefix}:spec_decode_num_accepted_tokens_per_pos", "Proposed tokens accepted "
                                      "at each proposal position (0 = the first after the last known token).",
                                      labels=m + ["position"])
        for pos, n in enumerate(st.spec_accepted_per_pos):
            per_pos.add_metric([self.model_name, str(pos)], n)
        yield per_pos
        steps = HistogramMetricFamily(f"{self.prefix}:iteration_tokens_total", "Tokens each engine step computed "
                                      "(prefill chunks, decodes and verified proposals of the batch).", labels=m)
        cumulative, buckets = 0, []
        for bound, count in zip((*ITERATION_TOKENS_BUCKETS, "+Inf"), st.iteration_tokens_counts, strict=True):
            cumulative += count
            buckets.append((str(float(bound)) if bound != "+Inf" else bound, cumulative))
        steps.add_metric([self.model_name], buckets, sum_value=st.iteration_tokens_sum)
        yield steps
        if self.prefix == "vllm":  # the older name vLLM's published Grafana dashboard still reads
            yield self._one(GaugeMetricFamily("vllm:gpu_cache_usage_perc", "Fraction of KV-cache blocks in use "
                                              "(kv_cache_usage_perc's older name).", labels=m), st.kv_cache_usage)
        by_reason = GaugeMetricFamily(f"{self.prefix}:num_requests_waiting_by_reason", "Waiting requests by why "
                                      "they wait: capacity (token budget, sequences or KV blocks) or deferred.",
                                      labels=m + ["reason"])
        by_reason.add_metric([self.model_name, "capacity"], self.engine.num_waiting)
        by_reason.add_metric([self.model_name, "deferred"], 0)  # nothing here defers a request
        yield by_reason
        cache = self.engine.config.cache
        info = GaugeMetricFamily(f"{self.prefix}:cache_config_info", "The KV cache's configuration (value 1).",
                                 labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype",
                                         "gpu_memory_utilization", "swap_space_bytes"])
        kv_dtype = "auto" if cache.dtype == self.engine.config.dtype else "fp8"
        info.add_metric([str(cache.block_size), str(st.num_kv_blocks), str(cache.enable_prefix_caching),
                         kv_dtype, str(cache.gpu_memory_utilization), str(int(cache.swap_space_gib * (1 << 30)))], 1)
        yield info


@dataclass
class _Seen:
    """What on_step remembers about a request between steps."""

    first_scheduled_time: float | None
    num_tokens: dict[int, int]  # choice index -> tokens seen
    last_token_time: dict[int, float]  # choice index -> when its last token came
    first_seen: float = 0.0  # when this process had the request's first output (after the core's first token)


def request_timeline(out: RequestOutput, first_scheduled: float | None, first_seen: float, now: float) -> str:
    """One finished request's times (`--log-level debug`), in ms from its arrival at the server (its route's
    start): when this process handed it to the engine core (parsed, tokenized, checked), when the core took it into
    its queue, when the core first scheduled it, when the core had its first token, when this process had that
    output, when it finished; the arrival itself on the monotonic clock, so that a burst's requests line up."""
    m = out.metrics

    def ms(t: float | None) -> str:
        return "-" if t is None else f"{(t - m.arrival_time) * 1e3:.1f}"

    finished = m.finished_time if m.finished_time is not None else now
    return (f"request {out.request_id}: arrived {m.arrival_time:.4f}, admitted +{ms(m.admitted_time)} ms, queued "
            f"+{ms(m.queued_time)} ms, scheduled +{ms(first_scheduled)} ms, "
            f"first token +{ms(m.first_token_time)} ms (server has it +{ms(first_seen)} ms), finished "
            f"+{ms(finished)} ms; prompt {len(out.prompt_token_ids)} tokens ({out.num_cached_tokens} cached), "
            f"output {sum(len(c.token_ids) for c in out.outputs)}")


class ServerMetrics:
    """`prefix`: the names' prefix, "tachyon" or "vllm" (vLLM's own names, for its Grafana dashboards)."""

    def __init__(self, engine, model_name: str, prefix: str = "tachyon"):
        self.engine = engine
        self.model_name = model_name
        self.prefix = prefix
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(EngineCollector(engine, model_name, prefix))
        self.registry.register(GPUCollector(model_name, open_nvml()))
        self._seen: dict[str, _Seen] = {}
        token_buckets = token_count_buckets(engine.config.scheduler.max_model_len)

        def hist(name: str, doc: str, buckets: list) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=buckets, registry=self.registry).labels(model_name)

        self.ttft = hist(f"{self.prefix}:time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS)
        self.itl = hist(f"{self.prefix}:inter_token_latency_seconds", "Time between two tokens of a sequence.",
                        _TOKEN_LATENCY_BUCKETS)
        # vLLM's dashboard reads the inter-token latency under its older name
        self.itl_legacy = hist("vllm:time_per_output_token_seconds", "Time between two tokens of a sequence "
                               "(inter_token_latency_seconds' older name).", _TOKEN_LATENCY_BUCKETS) \
            if prefix == "vllm" else None
        self.tpot = hist(f"{self.prefix}:request_time_per_output_token_seconds", "Decode time per output token of "
                         "each request (after the first token).", _TOKEN_LATENCY_BUCKETS)
        self.e2e = hist(f"{self.prefix}:e2e_request_latency_seconds", "Arrival to finish.", _REQUEST_LATENCY_BUCKETS)
        self.queue = hist(f"{self.prefix}:request_queue_time_seconds", "Arrival to first scheduled.",
                          _REQUEST_LATENCY_BUCKETS)
        self.prefill = hist(f"{self.prefix}:request_prefill_time_seconds", "First scheduled to first token.",
                            _REQUEST_LATENCY_BUCKETS)
        self.decode = hist(f"{self.prefix}:request_decode_time_seconds", "First token to finish.",
                           _REQUEST_LATENCY_BUCKETS)
        self.prompt_len = hist(f"{self.prefix}:request_prompt_tokens", "Prompt length of each request.", token_buckets)
        self.gen_len = hist(f"{self.prefix}:request_generation_tokens", "Tokens generated for each request (all n "
                            "choices).", token_buckets)
        self.max_gen_len = hist(f"{self.prefix}:request_max_num_generation_tokens", "The longest choice of "
                                "each request, in tokens.", token_buckets)
        self.params_max_tokens = hist(f"{self.prefix}:request_params_max_tokens", "The max_tokens of each "
                                      "request (resolved: up to the context when it set none).", token_buckets)
        self.params_n = hist(f"{self.prefix}:request_params_n", "The n (choices) of each request.",
                             [1, 2, 5, 10, 20])
        self.inference = hist(f"{self.prefix}:request_inference_time_seconds", "First scheduled to finish.",
                              _REQUEST_LATENCY_BUCKETS)
        self.prefill_kv = hist(f"{self.prefix}:request_prefill_kv_computed_tokens", "Prompt tokens each request "
                               "computed (not found in the prefix cache).", token_buckets)
        self.cached = Counter(f"{self.prefix}:prompt_tokens_cached", "Prompt tokens found in the prefix cache, "
                              "of finished requests.", ["model_name"], registry=self.registry).labels(model_name)
        self.success = Counter(f"{self.prefix}:request_success", "Finished sequences by finish reason (stop, length, "
                               "abort).", ["model_name", "finished_reason"], registry=self.registry)
        self.http = Counter(f"{self.prefix}:http_requests", "HTTP requests by route and status.",
                            ["model_name", "route", "status"], registry=self.registry)

    def on_admit(self, max_tokens: int) -> None:
        """A request was let in (the server's thread): its resolved max_tokens."""
        self.params_max_tokens.observe(max_tokens)

    # -- the engine thread -------------------------------------------------------------------------------
    def on_step(self, outputs: list[RequestOutput], step_seconds: float) -> None:
        try:
            self._on_step(outputs, step_seconds)
        except Exception:  # metrics must never stop the engine loop
            logger.exception("metrics: on_step failed")

    def _on_step(self, outputs: list[RequestOutput], step_seconds: float) -> None:
        now = time.monotonic()
        for out in outputs:
            seen = self._seen.get(out.request_id)
            if seen is None:
                n = sum(len(c.token_ids) for c in out.outputs)
                seen = _Seen(self._first_scheduled(out, now - step_seconds, n), {}, {}, now)
                self._seen[out.request_id] = seen
            for c in out.outputs:  # inter-token latency per sequence: its first token is not one
                n, before = len(c.token_ids), seen.num_tokens.get(c.index, 0)
                if n > before:
                    # several tokens in one output (a reader that was busy, or a non-streaming request seen only
                    # at its end): the gap since the last token seen is shared out over them
                    last = seen.last_token_time.get(c.index) if before else out.metrics.first_token_time
                    if last is not None and n > max(before, 1):
                        gap = (now - last) / (n - max(before, 1))
                        for _ in range(n - max(before, 1)):
                            self.itl.observe(gap)
                            if self.itl_legacy is not None:
                                self.itl_legacy.observe(gap)
                    seen.num_tokens[c.index], seen.last_token_time[c.index] = n, now
            if out.finished:
                del self._seen[out.request_id]
                self._observe_finished(out, seen.first_scheduled_time, now)
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug("%s", request_timeline(out, seen.first_scheduled_time, seen.first_seen, now))

    def _first_scheduled(self, out: RequestOutput, step_start: float, num_tokens: int) -> float | None:
        if out.metrics.first_scheduled_time is not None:
            return out.metrics.first_scheduled_time
        return step_start if num_tokens else None  # finished in its first step: scheduled when it began

    def _observe_finished(self, out: RequestOutput, first_scheduled: float | None, now: float) -> None:
        m = out.metrics
        finished = m.finished_time if m.finished_time is not None else now  # aborts carry no finish time
        for c in out.outputs:
            self.success.labels(self.model_name, c.finish_reason or "abort").inc()
        self.prompt_len.observe(len(out.prompt_token_ids))
        self.gen_len.observe(sum(len(c.token_ids) for c in out.outputs))
        self.max_gen_len.observe(max((len(c.token_ids) for c in out.outputs), default=0))
        self.params_n.observe(len(out.outputs))
        self.cached.inc(out.num_cached_tokens)
        self.prefill_kv.observe(max(0, len(out.prompt_token_ids) - out.num_cached_tokens))
        self.e2e.observe(finished - m.arrival_time)
        if first_scheduled is not None:
            self.queue.observe(max(0.0, first_scheduled - m.arrival_time))
            self.inference.observe(max(0.0, finished - first_scheduled))
        if m.first_token_time is None:
            return
        self.ttft.observe(m.first_token_time - m.arrival_time)
        if first_scheduled is not None:
            self.prefill.observe(max(0.0, m.first_token_time - first_scheduled))
        decode = finished - m.first_token_time
        self.decode.observe(decode)
        longest = max(len(c.token_ids) for c in out.outputs)
        if longest > 1:
            self.tpot.observe(decode / (longest - 1))
