"""Server metrics from the engine thread: per-token latency when one step delivers several tokens."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("prometheus_client")

from tachyon.outputs import CompletionOutput, RequestMetrics, RequestOutput  # noqa: E402
from tachyon.server import metrics as metrics_mod  # noqa: E402


def _out(n: int, finished: bool = False) -> RequestOutput:
    m = RequestMetrics(arrival_time=0.0, first_scheduled_time=0.0, first_token_time=1.0)
    return RequestOutput("r", None, [1, 2], [CompletionOutput(0, "", list(range(n)))], finished, m)


def test_itl_shares_a_multi_token_gap_out_per_token(llm, monkeypatch):
    sm = metrics_mod.ServerMetrics(llm.engine, "m")
    clock = iter([1.0, 1.04, 1.08])  # first token, then 8 more after 40 ms, then 2 more after 40 ms
    monkeypatch.setattr(metrics_mod.time, "monotonic", lambda: next(clock))
    sm.on_step([_out(1)], 0.01)
    sm.on_step([_out(9)], 0.04)
    sm.on_step([_out(11)], 0.04)
    count = sm.registry.get_sample_value("tachyon:inter_token_latency_seconds_count", {"model_name": "m"})
    total = sm.registry.get_sample_value("tachyon:inter_token_latency_seconds_sum", {"model_name": "m"})
    assert count == 10
    assert total == pytest.approx(0.08)  # 8 x 5 ms + 2 x 20 ms: the wall time between the first and last token


def test_itl_of_a_request_seen_only_at_its_end(llm, monkeypatch):
    """A non-streaming request's only output carries all its tokens: its first token came at
    first_token_time, the rest share the time since."""
    sm = metrics_mod.ServerMetrics(llm.engine, "m")
    monkeypatch.setattr(metrics_mod.time, "monotonic", lambda: 1.5)
    sm.on_step([_out(11, finished=True)], 0.01)
    count = sm.registry.get_sample_value("tachyon:inter_token_latency_seconds_count", {"model_name": "m"})
    total = sm.registry.get_sample_value("tachyon:inter_token_latency_seconds_sum", {"model_name": "m"})
    assert count == 10
    assert total == pytest.approx(0.5)  # first token at 1.0, the last at 1.5


def test_debug_log_gives_each_finished_request_its_timeline(llm, monkeypatch, caplog):
    # `tachyon serve --log-level debug`: a line per finished request, its times from arrival at the server (how a
    # burst's TTFT splits into queueing, the step, and the way back to the server process)
    import logging

    sm = metrics_mod.ServerMetrics(llm.engine, "m")
    clock = iter([1.25, 2.0, 2.5])
    monkeypatch.setattr(metrics_mod.time, "monotonic", lambda: next(clock))
    m = RequestMetrics(arrival_time=0.5, first_scheduled_time=0.75, first_token_time=1.0, finished_time=2.0,
                       admitted_time=0.5125, queued_time=0.625)
    first = RequestOutput("r7", None, [1, 2, 3], [CompletionOutput(0, "", [4])], False, m, num_cached_tokens=2)
    last = RequestOutput("r7", None, [1, 2, 3], [CompletionOutput(0, "", [4, 5, 6])], True, m, num_cached_tokens=2)
    with caplog.at_level(logging.DEBUG, logger="tachyon"):
        sm.on_step([first], 0.01)
        sm.on_step([last], 0.01)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request r7")]
    assert line == ("request r7: arrived 0.5000, admitted +12.5 ms, queued +125.0 ms, scheduled +250.0 ms, first "
                    "token +500.0 ms (server has it +750.0 "
                    "ms), finished +1500.0 ms; prompt 3 tokens (2 cached), output 3")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tachyon"):  # not at the default level
        sm.on_step([RequestOutput("r8", None, [1], [CompletionOutput(0, "", [4])], True, m)], 0.01)
    assert not [r for r in caplog.records if "r8" in r.getMessage()]


def test_slow_collections_are_logged_at_debug(caplog):
    # a collection that takes over the threshold is a stall every stream sees: `--log-level debug` names it
    import gc
    import logging

    from tachyon.engine.core_client import log_slow_collections

    callback = log_slow_collections(threshold_s=0.0)
    try:
        with caplog.at_level(logging.DEBUG, logger="tachyon"):
            gc.collect(1)
    finally:
        gc.callbacks.remove(callback)
    assert any(r.getMessage().startswith("gc: a generation 1 collection took") for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="tachyon"):
        gc.collect(1)  # removed: no more lines
    assert not any(r.getMessage().startswith("gc:") for r in caplog.records)


def test_kernel_compiles_after_start_up_are_logged(caplog):
    # the engine core installs this once warm: every Triton variant compiled later stalls a step, and the warning
    # says which (Triton calls the first hook before a compile, the second after; the first must not skip it)
    import logging

    pytest.importorskip("triton")
    from triton import knobs

    from tachyon.engine.core_client import watch_compiles

    saved = knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook
    # what Triton 3.6 hands the hooks (JITFunction._call_hook): a repr whose argument list it garbles, and the
    # compile's signature, constexprs and inferred attributes, keyed by argument position
    repr_ = "_gemv_kernel[num_warps=4, num_stages=4](x_ptr: ()"
    compile = {"signature": {"x_ptr": "*bf16", "M": "i32", "N": "i32", "BLOCK_N": "constexpr"},
               "constants": {(3,): 32}, "configs": [{(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}]}
    try:
        assert watch_compiles()
        with caplog.at_level(logging.WARNING, logger="tachyon"):
            assert not knobs.runtime.jit_cache_hook(key="k1", repr=repr_, fn=None, compile=compile,
                                                    is_manual_warmup=False, already_compiled=False)
            knobs.runtime.jit_post_compile_hook(key="k1", repr=repr_, fn=None, compile=compile,
                                                is_manual_warmup=False, already_compiled=False)
    finally:
        knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook = saved
    [record] = [r for r in caplog.records if "Triton compiled" in r.getMessage()]
    assert record.levelno == logging.WARNING
    # M carries no divisibility attribute: a row count that is not a multiple of 16 compiled this variant
    assert re.fullmatch(r"Triton compiled a kernel variant while serving in \d+ ms \(the step that launched it "
                        r"waited\): _gemv_kernel\[num_warps=4, num_stages=4\]\(x_ptr: \*bf16, M: i32, N: i32, "
                        r"BLOCK_N=32\) attributes \{'x_ptr': \[\['tt.divisibility', 16\]\], 'N': "
                        r"\[\['tt.divisibility', 16\]\]\}", record.getMessage())


def test_a_request_carries_its_admit_and_queue_times_in_order(llm):
    # the debug timeline splits a burst's TTFT at these stamps: the front end's admit (after tokenizing), the
    # core's queue, the first schedule, the first token; each is set once and none comes before the one above it
    import time

    from tachyon.sampling_params import SamplingParams

    engine = llm.engine
    arrival = time.monotonic()
    engine.add_request("stamps", None, [1, 2, 3, 4], SamplingParams(max_tokens=3, ignore_eos=True),
                       arrival_time=arrival)
    done = None
    while done is None:
        done = next((o for o in engine.step() if o.request_id == "stamps" and o.finished), None)
    m = done.metrics
    assert None not in (m.admitted_time, m.queued_time, m.first_scheduled_time, m.first_token_time)
    assert arrival <= m.admitted_time <= m.queued_time <= m.first_scheduled_time <= m.first_token_time
