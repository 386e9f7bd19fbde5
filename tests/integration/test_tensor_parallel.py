"""Tensor parallelism on the CPU (gloo, two ranks): greedy tokens equal to one rank's on the embedded model
(9 query heads, 3 KV heads: KV groups split 1 + 2) and on tiny checkpoints (KV heads fewer than the ranks:
replicated; an int8 model quantized while it loads; an AutoAWQ int4 checkpoint); the bytes all-reduced per
step as the arithmetic says; the worker processes gone after shutdown; a killed worker stops the engine
(/health 503, the request fails with the cause) and leaves no process behind (three ranks: the third goes too)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tachyon import LLM, SamplingParams
from tests.integration.conftest import API_KEY, serve_in_thread
from tests.tiny_checkpoint import write_tiny_qwen2 as _tiny

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": list(range(5 + i, 21 + 5 * i))} for i in range(3)]


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # our own child: reap it, or it stays a zombie that kill(pid, 0) still finds
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def _tokens(llm: LLM, prompts=PROMPTS, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def test_embedded_model_two_ranks_match_one(llm):
    """SmolLM2-135M: 9 query heads over 3 KV heads; rank 0 holds KV head 0 (q 0-2), rank 1 KV 1-2 (q 3-8)."""
    prompts = ["The capital of France is", "def fibonacci(n):"]
    params = SamplingParams(temperature=0, max_tokens=6)
    want = _tokens(llm, prompts, params)
    tp = LLM(tensor_parallel_size=2, swap_space=0, kv_cache_memory_gib=0.1)
    try:
        model = tp.engine.runner.model
        assert (model.cfg.num_heads, model.cfg.num_kv_heads) == (3, 1)  # rank 0's share
        assert _tokens(tp, prompts, params) == want
        # prompt logprobs: every rank computes the LM head's slices (a gather), rank 0 ranks them
        lp = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
        (one,), (two,) = (m.generate(prompts[:1], lp, use_tqdm=False) for m in (llm, tp))
        assert [sorted(d) for d in two.prompt_logprobs[1:]] == [sorted(d) for d in one.prompt_logprobs[1:]]
        assert all(abs(b[t].logprob - a[t].logprob) < 1e-3 for a, b in
                   zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:], strict=True) for t in a)
        assert tp.engine.kv.num_free_blocks == tp.engine.kv.num_blocks
    finally:
        pids = tp.engine.runner.workers.pids
        tp.engine.shutdown()
    assert all(_gone(p) for p in pids), "a worker process outlived shutdown"


@pytest.mark.parametrize("heads,kv_heads,quant", [(6, 3, "int8"), (4, 1, "awq")],
                         ids=["kv-3-on-2-ranks-int8", "kv-replicated-awq"])
def test_tiny_two_ranks_match_one(tmp_path, heads, kv_heads, quant):
    path = _tiny(tmp_path, heads, kv_heads, quant)
    kw = dict(model=path, swap_space=0, num_kv_blocks=64, block_size=8, max_num_batched_tokens=32,
              quantization=quant)
    want = _tokens(LLM(**kw))
    # two steps in flight: a decode's input id is still being sampled, rank 0 fills it in before the broadcast
    llm = LLM(tensor_parallel_size=2, num_scheduler_steps=2, **kw)
    try:
        runner = llm.engine.runner
        cfg, tp = runner.model.cfg, runner.tp
        if quant is not None:
            assert type(runner.model.layers[0].self_attn.o_proj).__name__ == {"int8": "Int8Linear",
                                                                             "awq": "AWQLinear"}[quant]
        tp.bytes_all_reduced = 0
        assert _tokens(llm) == want
        # every forward token crosses 2 all-reduces per layer and 1 for the embedding, [hidden] fp32 each
        forwarded = sum(len(p["prompt_token_ids"]) + GREEDY.max_tokens - 1 for p in PROMPTS)
        assert tp.bytes_all_reduced == forwarded * (2 * cfg.num_layers + 1) * cfg.hidden_size * 4
    finally:
        pids = llm.engine.runner.workers.pids
        llm.engine.shutdown()
    assert all(_gone(p) for p in pids)


def test_a_killed_worker_stops_the_server_with_503_and_no_orphans(tmp_path):
    pytest.importorskip("fastapi")
    from tachyon.build import build_engine_client
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.engine_args import EngineArgs
    from tachyon.server.app import create_app

    # three ranks (one KV group each): when rank 1 dies, rank 2 must go too
    client = build_engine_client(EngineArgs(model=_tiny(tmp_path, 6, 3), tensor_parallel_size=3, swap_space=0,
                                            num_kv_blocks=64))
    worker, other = client.info["worker_pids"]
    app = create_app(AsyncEngine(client), "tiny", api_key=API_KEY)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}
    try:
        with serve_in_thread(app) as url:
            assert httpx.post(f"{url}/v1/completions", headers=headers, json=body, timeout=30).status_code == 200
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while (health := httpx.get(f"{url}/health")).status_code != 503:
                assert time.monotonic() < deadline, "/health still says ok after a worker died"
                time.sleep(0.1)
            assert "tensor-parallel worker rank 1" in health.json()["error"]["message"]
            r = httpx.post(f"{url}/v1/completions", headers=headers, json=body, timeout=30)
            assert r.status_code == 503 and "engine" in r.json()["error"]["message"]
        assert _gone(client.process.pid) and _gone(worker) and _gone(other), "a process outlived the engine"
    finally:
        client.shutdown(timeout=5)


def test_ctrl_c_mid_generation_ends_every_rank():
    """SIGINT to the process group while two ranks generate: the script stops, and no rank outlives it."""
    import subprocess
    import sys

    # as a terminal starts it: Ctrl-C delivered. A suite started as a shell's background job (`cmd &` without job
    # control) inherits SIGINT ignored, Python keeps it so, and the script would never see the Ctrl-C (this test
    # failed that way whenever .ci/run ran in the background)
    script = ("import faulthandler, signal\n"
              "print('inherited', signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []),\n"
              "      signal.getsignal(signal.SIGINT), flush=True)\n"
              "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "faulthandler.register(signal.SIGUSR1, all_threads=True)  # the stacks, should it hang\n"
              "from tachyon import LLM, SamplingParams\n"
              "llm = LLM(tensor_parallel_size=2, swap_space=0, kv_cache_memory_gib=0.1)\n"
              "print('pids', *llm.engine.runner.workers.pids, flush=True)\n"
              "llm.generate(['Once upon a time'], SamplingParams(max_tokens=1500, ignore_eos=True), use_tqdm=False)\n"
              "print('finished', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("pids "):
                break
        assert lines and lines[-1].startswith("pids "), "".join(lines)[-2000:]
        pids = [int(p) for p in lines[-1].split()[1:]]
        time.sleep(1.0)  # into the generation (1500 tokens take a minute on the CPU)
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rest = proc.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(2)
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"still running 60 s after Ctrl-C ({lines[0].strip()}); its stacks:\n"
                        + proc.communicate()[0][-6000:])
        assert "finished" not in rest and proc.returncode != 0
        assert all(_gone(p) for p in pids), "a rank outlived Ctrl-C"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
