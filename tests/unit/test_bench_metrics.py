"""The bench's figures as pure functions of recorded timestamps: exact values, no clocks."""

import json
import math
import random

import pytest

from tachyon.bench import report
from tachyon.bench.backends.openai import arrival_gaps
from tachyon.bench.metrics import RequestResult, parse_goodput, parse_percentiles, percentile, summarize
from tachyon.bench.workloads import NAMED, WorkloadSpec, build, load_jsonl, parse_len


def _req(start, first, gap, n, prompt_len=10, end=None):
    times = [first + i * gap for i in range(n)]
    return RequestResult(prompt_len, n, start=start, token_times=times, end=times[-1] if end is None else end,
                         output_tokens=n, success=True)


def test_percentile_matches_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 99) == pytest.approx(4.96)
    assert percentile(xs, 100) == 5.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 99) == 0.0
    rng = random.Random(0)
    ys = [rng.random() for _ in range(101)]
    assert percentile(ys, 90) == sorted(ys)[90]


def test_summarize_exact_values():
    # Request A: sent at 0, first token at 0.1, then every 20 ms: 5 tokens, last at 0.18.
    # Request B: sent at 0, first token at 0.3, then every 40 ms: 3 tokens, last at 0.38.
    a = _req(0.0, 0.1, 0.02, 5, prompt_len=10)
    b = _req(0.0, 0.3, 0.04, 3, prompt_len=20)
    failed = RequestResult(30, 4, start=0.0, end=0.05, error="HTTP 500: boom")
    s = summarize([a, b, failed], duration=0.4, percentiles=[50, 90, 99], goodput={"ttft": 200})
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["total_input_tokens"] == 30 and s["total_output_tokens"] == 8
    assert s["request_throughput"] == pytest.approx(5.0)
    assert s["output_throughput"] == pytest.approx(20.0)
    assert s["total_token_throughput"] == pytest.approx(95.0)
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_ttft_ms"] == pytest.approx(200.0)
    assert s["p99_ttft_ms"] == pytest.approx(100 + 200 * 0.99)
    assert s["std_ttft_ms"] == pytest.approx(100.0)
    # TPOT = (E2EL - TTFT) / (n - 1): A 80/4 = 20 ms, B 80/2 = 40 ms.
    assert s["mean_tpot_ms"] == pytest.approx(30.0)
    assert s["p90_tpot_ms"] == pytest.approx(20 + 20 * 0.9)
    # ITL pooled: four gaps of 20 ms and two of 40 ms.
    assert s["mean_itl_ms"] == pytest.approx((4 * 20 + 2 * 40) / 6)
    assert s["median_itl_ms"] == pytest.approx(20.0)
    assert s["p99_itl_ms"] == pytest.approx(40.0)
    assert s["mean_e2el_ms"] == pytest.approx((180 + 380) / 2)
    assert s["p50_e2el_ms"] == pytest.approx(280.0)
    assert s["median_decode_tok_s"] == pytest.approx((50.0 + 25.0) / 2)  # (n-1)/(t_last-t_first)
    assert s["request_goodput"] == pytest.approx(1 / 0.4)  # only A meets TTFT <= 200 ms
    assert s["errors"] == {"HTTP 500: boom": 1}
    assert s["max_concurrent_requests"] == 2
    assert s["max_output_tokens_per_s"] == 8.0  # every token falls in the first second


def test_peak_output_throughput_buckets_by_second():
    a = _req(0.0, 0.5, 0.25, 8)  # tokens at 0.5 .. 2.25: 2 in second 0, 4 in second 1, 2 in second 2
    s = summarize([a], 2.25, [99])
    assert s["max_output_tokens_per_s"] == 4.0


def test_single_token_request_has_no_tpot():
    a = _req(0.0, 0.1, 0.0, 1)
    s = summarize([a], 0.1, [99])
    assert s["mean_tpot_ms"] == 0.0 and s["mean_itl_ms"] == 0.0 and s["mean_ttft_ms"] == pytest.approx(100)


def test_nothing_completed():
    s = summarize([RequestResult(5, 5, error="x")], 1.0, [99])
    assert s["completed"] == 0 and s["failed"] == 1 and s["mean_ttft_ms"] == 0.0 and s["output_throughput"] == 0


def test_parse_goodput_and_percentiles():
    assert parse_goodput(["ttft:2000", "e2el:5000"]) == {"ttft": 2000.0, "e2el": 5000.0}
    assert parse_goodput(["ttft:1 tpot:2"]) == {"ttft": 1.0, "tpot": 2.0}
    for bad in (["ttft"], ["foo:1"], ["ttft:x"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
    assert parse_percentiles("50,90,99.9") == [50.0, 90.0, 99.9]
    with pytest.raises(ValueError):
        parse_percentiles("0,101")
    s = summarize([_req(0, 0.1, 0.01, 3)], 1.0, [99.9])
    assert "p99.9_ttft_ms" in s


def test_cpu_batch_workload_is_deterministic_and_in_range():
    reqs = build(NAMED["cpu-batch"], 49152)
    assert len(reqs) == 32
    assert all(16 <= r.prompt_len <= 256 and 16 <= r.output_len <= 128 for r in reqs)
    assert all(1000 <= t < 49152 - 1000 for r in reqs for t in r.prompt_token_ids)
    rng = random.Random(13)
    assert [r.output_len for r in reqs] == [rng.randint(16, 128) for _ in range(32)]
    rng = random.Random(12)
    assert [r.prompt_len for r in reqs] == [rng.randint(16, 256) for _ in range(32)]
    again = build(NAMED["cpu-batch"], 49152)
    assert [r.prompt_token_ids for r in again] == [r.prompt_token_ids for r in reqs]


def test_every_named_workload_builds():
    for name, spec in NAMED.items():
        if spec.num_prompts == 0:
            continue
        small = WorkloadSpec(**{**spec.__dict__, "num_prompts": 2})
        reqs = build(small, 128256, chat_ids=[1, 2, 3])
        assert len(reqs) == 2, name
    prefix = build(WorkloadSpec("p", 3, 8, 4, prefix_len=16), 5000)
    assert prefix[0].prompt_token_ids[:16] == prefix[2].prompt_token_ids[:16]
    assert prefix[0].prompt_token_ids[16:] != prefix[1].prompt_token_ids[16:]
    with pytest.raises(ValueError, match="chat"):
        build(NAMED["cpu-single"], 49152)


def test_parse_len():
    assert parse_len("128") == 128
    assert parse_len("16:256") == (16, 256)
    with pytest.raises(ValueError):
        parse_len("9:3")


def test_jsonl_bad_line_names_file_and_line(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_text('{"prompt": "hello", "output_len": 4}\n\n{"prompt_token_ids": [1, 2], "output_len": 3}\n'
                 '{"prompt": oops}\n')
    with pytest.raises(ValueError, match=r"w.jsonl:4: not valid JSON"):
        load_jsonl(str(p), None)
    p.write_text('{"prompt": "hello"}\n')
    with pytest.raises(ValueError, match=r":1: 'output_len'"):
        load_jsonl(str(p), None)
    assert load_jsonl(str(p), 7)[0].output_len == 7
    p.write_text('{"prompt_token_ids": [1, -2], "output_len": 3}\n')
    with pytest.raises(ValueError, match=":1: 'prompt_token_ids'"):
        load_jsonl(str(p), None)
    with pytest.raises(FileNotFoundError):
        load_jsonl(str(tmp_path / "missing.jsonl"), 4)


def test_arrival_gaps():
    assert arrival_gaps(4, math.inf) == [0.0] * 4
    gaps = arrival_gaps(20000, 10.0, 1.0, seed=1)
    assert sum(gaps) / len(gaps) == pytest.approx(0.1, rel=0.03)
    even = arrival_gaps(20000, 10.0, 100.0, seed=1)  # high gamma shape: nearly constant gaps
    assert max(even) < 0.2 and min(even) > 0.05
    assert arrival_gaps(5, 2.0, seed=3) == arrival_gaps(5, 2.0, seed=3)
    with pytest.raises(ValueError):
        arrival_gaps(3, 0.0)


def _run(backend, c, tok_s, ttft):
    return {"backend": backend, "label": backend, "concurrency": c,
            "metrics": {"output_throughput": tok_s, "median_ttft_ms": ttft, "p99_e2el_ms": ttft * 3,
                        "total_token_throughput": tok_s * 2, "completed": 1}}


def test_ratios_table_json_markdown_and_png(tmp_path):
    from tachyon.bench import plots

    runs = [_run("tachyon", 1, 30.0, 100.0), _run("hf", 1, 10.0, 200.0), _run("tachyon", 4, 80.0, 150.0),
            _run("hf", 4, 20.0, 300.0)]
    rat = report.ratios(runs)
    assert rat["tachyon/hf @1"]["output_throughput"] == pytest.approx(3.0)
    assert rat["tachyon/hf @4"]["median_ttft_ms"] == pytest.approx(0.5)
    text = report.table(runs, [99])
    assert "tachyon @4" in text and "Output token throughput" in text
    res = {"command": "sweep", "argv": "tachyon bench sweep", "runs": runs, "ratios": rat, "percentiles": [99],
           "workload": {"name": "x"}, "env": {}, "extra": math.inf}
    path = tmp_path / "r.json"
    report.write_json(res, str(path))
    assert json.loads(path.read_text())["extra"] == "inf"
    assert "| Output token throughput (tok/s) |" in report.markdown(res)
    png = plots.plot_concurrency({"tachyon": runs[0::2], "hf": runs[1::2]}, str(tmp_path / "s.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    bars = plots.plot_ladder([{"name": "hf fp16 eager", "tok_s": 5.0, "memory_gib": 1.0},
                              {"name": "hf +compile", "error": "no C++ compiler"},
                              {"name": "tachyon", "tok_s": 9.0, "memory_gib": 0.8}], str(tmp_path / "l.png"))
    assert open(bars, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_decode_rate_counts_tokens_not_chunks():
    # 17 tokens in 3 chunks (1 + 8 + 8), 40 ms apart: 16 tokens after the first in 80 ms
    r = RequestResult(10, 17, start=0.0, token_times=[0.1, 0.14, 0.18], end=0.18, output_tokens=17, success=True)
    assert r.decode_tok_s == pytest.approx(16 / 0.08)
    assert r.tpot == pytest.approx(0.08 / 16)
    assert r.itl == pytest.approx([0.04, 0.04])  # ITL stays per chunk, as vLLM's bench reports it


def test_sweep_uses_the_workloads_own_request_counts():
    import argparse

    from tachyon.bench.cli import _prepare, _Slot

    class Backend:
        vocab_size, tokenizer, max_concurrency = 1000, None, None

        def chat_ids(self, message):
            return None

    sizes = {}
    for ppc in (None, 2):
        args = argparse.Namespace(prompts_per_concurrency=ppc, hf_batch_size=None, num_warmups=0)
        for c in (1, 16, 64, 256):
            slot = _Slot("openai", "openai", c)
            backend = Backend()
            _prepare(backend, slot, args, NAMED["serve"], "sweep")
            assert backend.max_concurrency == c
            sizes[ppc, c] = len(slot.reqs)
    assert [sizes[None, c] for c in (1, 16, 64, 256)] == [16, 128, 256, 1000]  # shared/WORKLOADS.md's serve
    assert [sizes[2, c] for c in (1, 16, 64, 256)] == [2, 32, 128, 512]
