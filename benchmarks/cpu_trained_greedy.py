"""The bf16 greedy check of `gpu_run.py correctness --trained`, scaled down to run on the CPU: a tiny Llama
trained here for ~100 s on the repeated-segment task, then Tachyon (torch backend) vs transformers greedy in
fp32 and bf16 on prompts that repeat a segment. A random-weight model cannot make this check: its logits are
so close to tied that bf16 rounding changes its greedy tokens in any implementation.

    PYTHONPATH=. python benchmarks/cpu_trained_greedy.py --out benchmarks/results/cpu_trained_greedy.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--prompts", type=int, default=16)
    args = ap.parse_args()
    d = tempfile.mkdtemp()
    res = {"env": gpu_run.env_info(), "command": " ".join(sys.argv), "torch_threads": torch.get_num_threads(),
           "trained_model": gpu_run.trained_copy_llama(d, "cpu", vocab=512, hidden=128, layers=2, steps=args.steps,
                                                       batch=32, seq=96)}
    res.update(gpu_run.greedy_both_dtypes(d, "trained_greedy_vs_transformers", gpu_run._cycle_prompts(args.prompts, 512),
                                          device="cpu"))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
