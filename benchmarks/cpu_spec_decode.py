"""Issue 16 on the CPU: n-gram speculative decoding against plain decoding with the embedded model, greedy, one
request at a time, on a copy-heavy workload (repeat or lightly edit a given text) and a free-form one.

Per request: decode tok/s = (output tokens - 1) / (finish - first token). Plain and speculative engines take
turns prompt by prompt (a busy machine slows both alike), and their greedy outputs must be identical. The first
engine a process builds decodes slower than the next ones (about 1.5x on this machine, with or without
speculation), so an unmeasured one is built first.

    PYTHONPATH=. python benchmarks/cpu_spec_decode.py --out benchmarks/results/cpu_spec_decode.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tachyon import LLM, SamplingParams  # noqa: E402
from tachyon.bench.env import environment  # noqa: E402

TEXTS = [
    "The scheduler keeps one token budget per step. Running requests are served first, then waiting ones in "
    "the order they arrived, and a long prompt is split into chunks so that decodes never wait behind it.",
    "Paged attention stores the keys and values of every request in fixed-size blocks. A request owns a block "
    "table, and the slot of a token is the block id times the block size plus its offset in the block.",
    "Prefix caching names every full block by a hash of its tokens and its parent's hash. When a new request "
    "starts with the same tokens, it takes those blocks instead of computing them again.",
    "To make a cup of tea, boil fresh water, warm the pot, add one spoon of leaves per cup, pour the water over "
    "them and let it steep for three to five minutes before serving it with milk or lemon.",
    "The old lighthouse stood at the edge of the cliff for two hundred years. Every night its keeper climbed the "
    "narrow stairs, lit the great lamp, and watched the ships pass safely through the dark water.",
    "A binary search looks at the middle element of a sorted list. If the target is smaller it continues in the "
    "left half, otherwise in the right half, until it finds the target or the range is empty.",
]
COPY_ASKS = ["Repeat the following text exactly, word for word:\n\n{t}",
             "Quote this paragraph verbatim, then stop:\n\n{t}",
             "Rewrite the following text, replacing every full stop with an exclamation mark:\n\n{t}"]
FREE = ["Write a short story about a robot who learns to paint.",
        "Explain why the sky is blue to a ten-year-old.",
        "Give me three ideas for a weekend trip in the mountains.",
        "What are the advantages and disadvantages of working from home?",
        "Describe your ideal breakfast in detail.",
        "Write a poem about autumn leaves."]


def workload(name: str) -> list[list[dict]]:
    if name == "copy":
        return [[{"role": "user", "content": COPY_ASKS[i % len(COPY_ASKS)].format(t=t)}] for i, t in enumerate(TEXTS)]
    return [[{"role": "user", "content": q}] for q in FREE]


def one(llm: LLM, conv: list[dict], max_tokens: int) -> dict:
    before = llm.engine.stats()
    (o,) = llm.chat(conv, SamplingParams(temperature=0, max_tokens=max_tokens))
    st = llm.engine.stats()
    m, n = o.metrics, len(o.outputs[0].token_ids)
    return {"tokens": o.outputs[0].token_ids, "decode_s": m.finished_time - m.first_token_time,
            "decode_tok_s": (n - 1) / (m.finished_time - m.first_token_time) if n > 1 else None,
            "steps": st.num_steps - before.num_steps,
            "draft_tokens": st.spec_num_draft_tokens - before.spec_num_draft_tokens,
            "accepted_tokens": st.spec_num_accepted_tokens - before.spec_num_accepted_tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--speculative-config", default='{"method": "ngram", "num_speculative_tokens": 4}')
    ap.add_argument("--repeats", type=int, default=1, help="runs of each prompt per engine")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # the first engine built in a process decodes slower than later ones (seen here: ~1.5x; not speculation's
    # doing): build one that is not measured, then the two compared
    unmeasured = LLM(swap_space=0)  # noqa: F841 (kept alive)
    plain = LLM(swap_space=0)
    spec = LLM(swap_space=0, speculative_config=args.speculative_config)
    result = {"command": "PYTHONPATH=. python " + " ".join(sys.argv), **environment(),
              "model": "embedded SmolLM2-135M-Instruct (GGUF Q4_1 dequantized), fp32, torch attention",
              "speculative_config": json.loads(args.speculative_config), "max_tokens": args.max_tokens,
              "torch_threads": args.threads, "load_before": os.getloadavg(),
              "workloads": {}}
    for name in ("copy", "free"):
        rows = []
        for conv in workload(name):
            for _ in range(args.repeats):
                a = one(plain, conv, args.max_tokens)
                b = one(spec, conv, args.max_tokens)
                assert a["tokens"] == b["tokens"], f"greedy outputs differ on {conv[0]['content'][:40]!r}"
                rows.append({"prompt": conv[0]["content"][:60], "output_tokens": len(a["tokens"]),
                             "plain_decode_tok_s": a["decode_tok_s"], "spec_decode_tok_s": b["decode_tok_s"],
                             "plain_steps": a["steps"], "spec_steps": b["steps"],
                             "draft_tokens": b["draft_tokens"], "accepted_tokens": b["accepted_tokens"]})
                print(name, rows[-1], flush=True)
        plain_s = sum((r["output_tokens"] - 1) / r["plain_decode_tok_s"] for r in rows)
        spec_s = sum((r["output_tokens"] - 1) / r["spec_decode_tok_s"] for r in rows)
        toks = sum(r["output_tokens"] - 1 for r in rows)
        drafts = sum(r["draft_tokens"] for r in rows)
        result["workloads"][name] = {
            "requests": rows,
            "plain_decode_tok_s": toks / plain_s, "spec_decode_tok_s": toks / spec_s,
            "speedup": plain_s / spec_s,
            "median_speedup": statistics.median(r["spec_decode_tok_s"] / r["plain_decode_tok_s"] for r in rows),
            "acceptance_rate": sum(r["accepted_tokens"] for r in rows) / drafts if drafts else None,
            "draft_tokens": drafts, "tokens_per_step": toks / sum(r["spec_steps"] for r in rows)}
        w = result["workloads"][name]
        print(f"{name}: plain {w['plain_decode_tok_s']:.1f} tok/s, n-gram {w['spec_decode_tok_s']:.1f} tok/s, "
              f"x{w['speedup']:.2f}, acceptance {w['acceptance_rate']}", flush=True)
    result["load_after"] = os.getloadavg()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
