"""prompt_logprobs on a GPU (issue 20): the runner's CUDA path (prompt rows copied to pinned memory behind the step,
the decode CUDA graphs skipped for such steps, piecewise graphs for mixed ones), checked and timed.

llama3-8b with random weights (--load-format dummy), bf16. Three parts:

  1. consistency: greedy generation with logprobs (decode steps: CUDA graphs), then the prompt + that output as a
     new prompt with prompt_logprobs, prefilled in chunks beside plain requests that decode: the prompt logprob of
     each teacher-forced output token equals its logprob when it was generated (bf16 noise: max |diff| printed,
     a failure above --tolerance), and its rank is 1 (greedy) up to near-ties;
  2. cost: a prefill-heavy batch (max_tokens=1) with and without prompt_logprobs (fresh prompts each, so the
     prefix cache plays no part), seconds and prompt tok/s;
  3. the KV pool is whole again afterwards.

    PYTHONPATH=. python benchmarks/prompt_logprobs_gpu.py --out $OUT/prompt_logprobs.json
    # smoke test on a CPU, a tiny random config:
    PYTHONPATH=. python benchmarks/prompt_logprobs_gpu.py --model /tmp/tiny.json --prompt-len 40 --prompts 2 \
        --max-num-batched-tokens 16 --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tachyon import LLM, SamplingParams  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA8B = os.path.join(HERE, "models", "llama3-8b.json")


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=LLAMA8B)
    p.add_argument("--device", default="auto")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=1000)
    p.add_argument("--gen", type=int, default=16, help="greedy tokens then teacher-forced")
    p.add_argument("--k", type=int, default=5, help="prompt_logprobs / logprobs")
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--tolerance", type=float, default=0.1, help="max |logprob difference| allowed (bf16)")
    p.add_argument("--out", default=None)
    args = p.parse_args()

    t0 = time.perf_counter()
    llm = LLM(model=args.model, load_format="dummy", device=args.device, seed=0, swap_space=0,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.prompt_len + args.gen + 64)
    log(f"engine ready in {time.perf_counter() - t0:.1f} s")
    eng = llm.engine
    vocab = eng.config.model.vocab_size
    rng = random.Random(0)

    def prompts(n):
        return [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(n)]

    # 1. consistency: decode-path logprobs against prefill-path prompt logprobs of the same tokens
    base = prompts(args.prompts)
    gen = llm.generate([{"prompt_token_ids": q} for q in base],
                       SamplingParams(temperature=0, max_tokens=args.gen, logprobs=args.k, ignore_eos=True),
                       use_tqdm=False)
    forced = [q + g.outputs[0].token_ids for q, g in zip(base, gen, strict=True)]
    plain = SamplingParams(max_tokens=64, ignore_eos=True, temperature=0)  # decoding beside the chunked prefills
    outs = llm.generate([{"prompt_token_ids": q} for q in forced + base],
                        [SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=args.k)] * len(forced)
                        + [plain] * len(base), use_tqdm=False)
    diffs, ranks, cached = [], [], []
    for g, o in zip(gen, outs[:len(forced)], strict=True):
        cached.append(o.num_cached_tokens)
        assert len(o.prompt_logprobs) == len(o.prompt_token_ids) and o.prompt_logprobs[0] is None
        for j, tok in enumerate(g.outputs[0].token_ids):
            entry = o.prompt_logprobs[args.prompt_len + j]
            diffs.append(abs(entry[tok].logprob - g.outputs[0].logprobs[j][tok].logprob))
            ranks.append(entry[tok].rank)
    max_diff = max(diffs)
    log(f"consistency: {len(diffs)} tokens, max |diff| {max_diff:.4f}, mean {sum(diffs) / len(diffs):.4f}, "
        f"ranks {sorted(set(ranks))[:8]}, cached tokens of the prompt_logprobs requests {set(cached)}")

    # 2. cost of prompt_logprobs on a prefill-heavy batch
    timings = {}
    for name, k in (("plain", None), ("prompt_logprobs", args.k), ("plain_again", None)):
        batch = prompts(args.prompts)
        sync()
        t = time.perf_counter()
        llm.generate([{"prompt_token_ids": q} for q in batch], SamplingParams(max_tokens=1, prompt_logprobs=k),
                     use_tqdm=False)
        sync()
        timings[name] = time.perf_counter() - t
        log(f"{name}: {timings[name]:.3f} s, {args.prompts * args.prompt_len / timings[name]:,.0f} prompt tok/s")

    # 3. the pool is whole again
    free, total = eng.kv.num_free_blocks, eng.kv.num_blocks
    log(f"KV blocks free {free}/{total}")
    result = {"model": args.model, "device": str(eng.config.device),
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "torch": torch.__version__, "prompts": args.prompts, "prompt_len": args.prompt_len, "gen": args.gen,
              "k": args.k, "max_num_batched_tokens": args.max_num_batched_tokens,
              "max_abs_logprob_diff": max_diff, "mean_abs_logprob_diff": sum(diffs) / len(diffs),
              "teacher_forced_ranks": sorted(set(ranks)), "cached_tokens": sorted(set(cached)),
              "seconds": timings, "kv_free_blocks": free, "kv_blocks": total,
              "command": " ".join(sys.argv)}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    ok = max_diff <= args.tolerance and free == total and set(cached) == {0}
    log("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
