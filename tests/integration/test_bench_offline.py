"""Offline `bench latency/throughput/sweep` with the in-process backends on the embedded model, and Ctrl-C."""

import json

import pytest

from tachyon.bench import backends as bench_backends
from tachyon.bench.backends import Backend, RunResult
from tachyon.bench.metrics import RequestResult
from tachyon.cli import main


def test_throughput_tachyon_and_hf_same_run(tmp_path):
    out = tmp_path / "tp.json"
    rc = main(["bench", "throughput", "--backend", "tachyon", "--backend", "hf", "--num-prompts", "3",
               "--input-len", "8:24", "--output-len", "2:6", "--output", str(out), "--no-progress",
               "--max-num-batched-tokens", "64", "--interleave"])
    assert rc == 0
    res = json.loads(out.read_text())
    runs = {r["backend"]: r for r in res["runs"]}
    assert set(runs) == {"tachyon", "hf"}
    for r in runs.values():
        m = r["metrics"]
        assert m["completed"] == 3 and m["failed"] == 0
    assert runs["tachyon"]["metrics"]["total_output_tokens"] == runs["hf"]["metrics"]["total_output_tokens"]
    assert runs["tachyon"]["metrics"]["total_input_tokens"] == runs["hf"]["metrics"]["total_input_tokens"]
    assert res["ratios"]["tachyon/hf"]["output_throughput"] > 0
    assert res["env"]["versions"]["torch"] and res["env"]["hardware"]["cpu_cores"]
    assert res["argv"].startswith("tachyon bench throughput") and "--backend tachyon --backend hf" in res["argv"] and res["workload"]["name"] == "custom"
    assert runs["tachyon"]["config"]["engine_args"]["enable_prefix_caching"] is False
    assert runs["hf"]["config"]["attn_implementation"] == "sdpa"
    md = (tmp_path / "tp.md").read_text()
    assert "tachyon/hf" in md


def test_latency_chat_prompt(tmp_path):
    out = tmp_path / "lat.json"
    rc = main(["bench", "latency", "--backend", "tachyon", "--chat", "--output-len", "5", "--num-iters", "2",
               "--output", str(out), "--no-progress"])
    assert rc == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["metrics"]["completed"] == 2 and len(run["repeats"]) == 2
    assert run["metrics"]["median_decode_tok_s"] > 0 and run["metrics"]["median_ttft_ms"] > 0
    assert run["metrics"]["total_output_tokens"] == 10


class _InterruptedBackend(Backend):
    """Finishes one run, then is 'interrupted' in the second (as Ctrl-C does)."""

    name = "tachyon"

    def __init__(self):
        self.calls = 0

    vocab_size = 5000

    def run(self, reqs, progress=None):
        self.calls += 1
        results = [RequestResult(r.prompt_len, r.output_len, start=0.0, token_times=[0.1, 0.2], end=0.2,
                                 output_tokens=2, success=True) for r in reqs]
        if self.calls == 1:
            return RunResult(results, 0.2, 0.0)
        results[1:] = [RequestResult(r.prompt_len, r.output_len, error="interrupted") for r in reqs[1:]]
        return RunResult(results, 0.2, 0.0, interrupted=True)

    def config(self):
        return {"fake": True}


def test_ctrl_c_writes_what_finished(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_backends, "make_backend", lambda name, args: _InterruptedBackend())
    out = tmp_path / "sw.json"
    rc = main(["bench", "sweep", "--concurrency", "1,4,16", "--input-len", "4", "--output-len", "2",
               "--num-warmups", "0", "--output", str(out), "--no-progress"])
    assert rc == 130
    res = json.loads(out.read_text())
    assert res["interrupted"] is True
    assert [r["concurrency"] for r in res["runs"]] == [1, 4]
    assert res["runs"][1]["metrics"]["completed"] == 1 and res["runs"][1]["metrics"]["failed"] == 3


def test_bench_without_subcommand_is_a_clear_error(capsys):
    assert main(["bench"]) == 2
    assert "choose one of" in capsys.readouterr().err


@pytest.mark.parametrize("argv, msg", [
    (["bench", "throughput", "--percentiles", "0"], "--percentiles"),
    (["bench", "throughput", "--goodput", "latency:3"], "--goodput"),
    (["bench", "sweep", "--concurrency", "a,b"], "--concurrency"),
])
def test_bad_flags(argv, msg, capsys):
    assert main(argv) == 2
    assert msg in capsys.readouterr().err
