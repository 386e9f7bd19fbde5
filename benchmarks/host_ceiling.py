"""How many tokens per second the serving stack's host side sustains when the model costs nothing.

`tachyon serve`'s app and engine loop with the model replaced by a runner that returns random tokens at once
(the scheduler, block accounting, batch preparation, detokenization, SSE streaming, metrics and the HTTP
client all run for real), driven by `tachyon bench serve` in another process: the `serve` workload's
512-in / 256-out requests, text prompts through the llama3-8b-serve word tokenizer. The output tok/s is the
ceiling the host puts on serving throughput; compare it with what the GPU step allows at the same batch.

    PYTHONPATH=. python benchmarks/host_ceiling.py --concurrency 64 --num-prompts 128 \
        [--num-scheduler-steps 8] [--out benchmarks/results/host_ceiling_c64.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "models", "llama3-8b-serve")


class InstantRunner:
    """The model runner's interface (tachyon.interface.ModelRunner) with no model: batch preparation runs,
    the tokens are random and land at once."""

    def __init__(self, vocab: int, block_size: int):
        from tachyon.worker.model_runner import ModelRunner
        from tachyon.worker.sampler import Sampler

        self.prepare = ModelRunner.prepare.__get__(self)
        self.block_size = block_size
        self.device = torch.device("cpu")
        self.sampler = Sampler(vocab, torch.device("cpu"))
        self.rng = random.Random(0)
        self.vocab = vocab

    def submit(self, sched):
        from tachyon.interface import ModelRunnerOutput

        x = self.prepare(sched.seqs)
        n = len(x.sample_reqs)
        ids = [self.rng.randrange(1000, self.vocab - 1000) for _ in range(n)]
        return ModelRunnerOutput(x.sample_reqs, ids, [None] * n, [None] * n)

    def collect(self, handle):
        return handle

    def drop_in_flight(self) -> None:
        pass

    def request_generator(self, seed: int):
        return self.sampler.request_generator(seed)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--num-scheduler-steps", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import uvicorn

    from tachyon.config import ModelConfig
    from tachyon.engine.async_engine import AsyncEngine
    from tachyon.engine.engine import LLMEngine
    from tachyon.engine.tokenizer import load_tokenizer
    from tachyon.engine_args import EngineArgs
    from tachyon.server.app import create_app

    mc = ModelConfig.from_file(os.path.join(MODEL, "config.json"))
    cfg = EngineArgs(dtype="bfloat16", block_size=16, num_kv_blocks=80_000, swap_space=0, max_num_batched_tokens=8192,
                     max_num_seqs=256, max_model_len=4096, num_scheduler_steps=args.num_scheduler_steps,
                     ).create_engine_config(mc, torch.device("cpu"))
    runner = InstantRunner(mc.vocab_size, 16)
    runner.config = cfg
    engine = LLMEngine(cfg, load_tokenizer(MODEL), runner, 80_000)
    app = create_app(AsyncEngine(engine), "llama3-8b-serve")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    out = args.out or os.path.join("/tmp", f"host_ceiling_c{args.concurrency}.json")
    cmd = [sys.executable, "-m", "tachyon", "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
           "--tokenizer", MODEL, "--prompt-format", "text", "--workload", "serve", "--no-progress",
           "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency), "--output", out,
           "--load-note", f"host ceiling: instant model runner, num_scheduler_steps={args.num_scheduler_steps}"]
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    server.should_exit = True
    m = json.load(open(out))["runs"][0]["metrics"]
    print(json.dumps({"concurrency": args.concurrency, "num_scheduler_steps": args.num_scheduler_steps,
                      "output_tok_s": m["output_throughput"], "mean_tpot_ms": m["mean_tpot_ms"],
                      "steps": engine.stats().num_steps}))


if __name__ == "__main__":
    main()
