"""Issue-6 measurements on the CPU with the embedded model, in one run:
  * the `prefix` workload, shortened (N requests of a shared prefix + a unique tail): time until every request
    has its first token (max_tokens=1), mean TTFT and output tok/s, prefix caching on vs off;
  * a long queue that forces preemption in a small KV pool: swap space vs recompute.

    PYTHONPATH=. python benchmarks/cpu_prefix_swap.py --out benchmarks/results/cpu_prefix_swap.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tachyon import LLM, SamplingParams  # noqa: E402
from tachyon.bench.workloads import WorkloadSpec, build  # noqa: E402


def run(llm: LLM, reqs, max_tokens: int | None = None) -> dict:
    sps = [SamplingParams(temperature=0, max_tokens=max_tokens or r.output_len, ignore_eos=True) for r in reqs]
    t0 = time.monotonic()
    outs = llm.generate([{"prompt_token_ids": r.prompt_token_ids} for r in reqs], sps)
    dur = max(o.metrics.finished_time for o in outs) - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"duration_s": dur, "output_tok_s": n_out / dur,
            "mean_ttft_s": sum(o.metrics.first_token_time - t0 for o in outs) / len(outs),
            "time_to_all_first_tokens_s": max(o.metrics.first_token_time for o in outs) - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--unique-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(2)
    res = {"command": " ".join(sys.argv), "python": platform.python_version(), "torch": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "load_before": os.getloadavg(), "model": "embedded SmolLM2-135M-Instruct, fp32"}
    prefix = {}
    for on in (True, False):
        llm = LLM(swap_space=0, enable_prefix_caching=on)
        spec = WorkloadSpec("prefix-cpu", args.num_prompts, args.unique_len, args.output_len,
                            prefix_len=args.prefix_len, seed=100 + on)  # a fresh shared prefix per measurement
        first = run(llm, build(spec, 49152), max_tokens=1)
        spec.seed = 200 + on
        full = run(llm, build(spec, 49152))
        prefix["on" if on else "off"] = {"time_to_all_first_tokens_s": first["duration_s"], **full,
                                         "prefix_hit_tokens": llm.engine.kv.prefix_hits}
        print("prefix caching", "on" if on else "off", prefix["on" if on else "off"], flush=True)
        del llm
    prefix["speedup_first_tokens"] = prefix["off"]["time_to_all_first_tokens_s"] / prefix["on"]["time_to_all_first_tokens_s"]
    prefix["speedup_output_tok_s"] = prefix["on"]["output_tok_s"] / prefix["off"]["output_tok_s"]
    res["prefix"] = {"workload": f"{args.num_prompts} x ({args.prefix_len} shared + {args.unique_len} unique), "
                                 f"{args.output_len} out", **prefix}
    # long queue, small pool: 24 requests of 200 + 48 tokens in 40 blocks of 16 (640 tokens)
    queue = build(WorkloadSpec("long-queue", 24, 200, 48, seed=7), 49152)
    swap = {}
    for mode, gib in (("swap", 1.0), ("recompute", 0.0)):
        llm = LLM(enable_prefix_caching=False, swap_space=gib, num_kv_blocks=41, max_num_batched_tokens=512)
        if llm.engine.kv.num_cpu_blocks:
            llm.engine.kv.min_swap_tokens = 16
        r = run(llm, queue)
        s = llm.engine.scheduler
        r.update(preemptions=s.num_preemptions, swapped_out=s.num_swapped_out, recomputed=s.num_recomputed)
        swap[mode] = r
        print(mode, r, flush=True)
        del llm
    swap["swap_over_recompute_tok_s"] = swap["swap"]["output_tok_s"] / swap["recompute"]["output_tok_s"]
    res["preemption"] = {"workload": "24 x (200 in, 48 out), 40 usable KV blocks of 16 tokens", **swap}
    res["load_after"] = os.getloadavg()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res[k] for k in ("prefix", "preemption")}, indent=1))


if __name__ == "__main__":
    main()
