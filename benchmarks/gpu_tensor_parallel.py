"""Issue 17 on 2 GPUs: tensor parallelism's GPU path (NCCL, CUDA graphs and piecewise graphs captured with the
all-reduces and the logits gather inside, 3 steps in flight), which the CPU tests cannot reach.

    correctness  a tiny random checkpoint (6 query / 3 KV heads: an uneven split; and 4 / 1: a replicated KV head)
                 in fp32, greedy, TP=2 against TP=1 with the default GPU settings and with --enforce-eager
    perf         llama3-8b with random bf16 weights: decode tok/s at TP=1 and TP=2 (batch 1, 16, 64), and the
                 bytes all-reduced per layer per token (2 x 4096 x 2 = 16 KiB)

Each configuration runs in its own process (one engine per process frees its GPUs cleanly):

    PYTHONPATH=. python benchmarks/gpu_tensor_parallel.py --out $OUT/gpu_tensor_parallel.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA8B = os.path.join(HERE, "models", "llama3-8b.json")


def one(kind: str, tp: int, extra: dict) -> dict:
    """In this process: one engine, its figures."""
    import torch

    from benchmarks.cpu_tensor_parallel import decode_run
    from tachyon import LLM, SamplingParams

    rng = random.Random(0)
    if kind == "correctness":
        from tests.tiny_checkpoint import write_tiny_qwen2

        path = write_tiny_qwen2(tempfile.mkdtemp(), extra["heads"], extra["kv_heads"])
        llm = LLM(model=path, tensor_parallel_size=tp, dtype="float32", max_num_seqs=32,
                  enforce_eager=extra.get("enforce_eager", False))
        prompts = [{"prompt_token_ids": [rng.randrange(3, 500) for _ in range(rng.choice([5, 40, 130]))]}
                   for _ in range(16)]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
        res = {"tokens": [o.outputs[0].token_ids for o in outs],
               "cuda_graphs": llm.engine.runner.cuda_graphs is not None}
    else:
        llm = LLM(model=LLAMA8B, load_format="dummy", tensor_parallel_size=tp, max_num_seqs=64)
        vocab = llm.engine.config.model.vocab_size
        res = {}
        decode_run(llm, [[rng.randrange(vocab) for _ in range(128)]], 8)  # warm-up
        for batch in (1, 16, 64):
            run = decode_run(llm, [[rng.randrange(vocab) for _ in range(128)] for _ in range(batch)], 128)
            run.pop("outputs")
            res[f"batch_{batch}"] = run
    res["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    llm.engine.shutdown()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_tensor_parallel.json")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child process: JSON of (kind, tp, extra)
    args = p.parse_args(argv)
    if args.one:
        kind, tp, extra = json.loads(args.one)
        print("RESULT " + json.dumps(one(kind, tp, extra)), flush=True)
        return 0
    runs = []
    for kind, tp, extra in [("correctness", 1, {"heads": 6, "kv_heads": 3}),
                            ("correctness", 2, {"heads": 6, "kv_heads": 3}),
                            ("correctness", 2, {"heads": 6, "kv_heads": 3, "enforce_eager": True}),
                            ("correctness", 1, {"heads": 4, "kv_heads": 1}),
                            ("correctness", 2, {"heads": 4, "kv_heads": 1}),
                            ("perf", 1, {}), ("perf", 2, {})]:
        proc = subprocess.run([sys.executable, __file__, "--one", json.dumps([kind, tp, extra])],
                              capture_output=True, text=True, timeout=900)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        result = json.loads(line[7:]) if line else {"error": proc.stderr[-3000:]}
        runs.append({"kind": kind, "tp": tp, **extra, **result})
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "tokens"})[:2000], flush=True)
    for r in runs:  # TP=2 greedy against TP=1 on the same checkpoint
        if r["kind"] == "correctness" and r["tp"] == 2 and "tokens" in r:
            ref = next(x for x in runs if x["kind"] == "correctness" and x["tp"] == 1 and x["heads"] == r["heads"])
            r["prompts_equal_to_tp1"] = sum(a == b for a, b in zip(r["tokens"], ref.get("tokens", []), strict=False))
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(sys.argv), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
