"""Decode attention where serving runs it: split counts, split floors (`min_chunk`), the in-kernel merge.

A decode CUDA graph fixes the split count for its capture's context bound (`num_decode_splits(graph batch, Hkv,
max_model_len)`); at a Poisson load's ~640 tokens of context those splits are ~3 tiles each and stage 1 is
latency-bound (H100: 1.75 TB/s of 3.0 inside a 40-sequence step, benchmarks/results/h100/session_20261207b). This
times, per batch (1-256 sequences; 1-4: the `single` workloads' step) and context (llama3-8b: Hq 32, Hkv 8, D 128,
pages of 16, bf16, random pages of a pool far beyond L2):
- the graph's split count as today, and every split count 1-8 with no floor;
- the graph's split count with floors of 256-1024 tokens (a short context then uses fewer of them; one split
  writes the output itself);
- three stage-1 tile configs;
- the graph's split count with the last split merging them (no second launch), alone and with floors.
Each figure is a CUDA-graph replay of 20 calls (as a decode step runs them), the median of 5.

    PYTHONPATH=. python benchmarks/decode_attention_sweep.py --out $OUT/decode_sweep.json [--budget-s 90]
CPU smoke run (the interpreter, tiny shapes): TRITON_INTERPRET=1 ... --smoke
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import triton

from tachyon.kernels import decode_attention as mod
from tachyon.kernels.decode_attention import decode_attention, num_decode_splits
from tachyon.kernels.quant_linear import merge_tuned
from tachyon.kernels.timing import per_call_ms

HQ, HKV, D, PAGE = 32, 8, 128, 16
CAPTURE_BOUND = 4096  # the decode graphs' max_seq_len (max_model_len of the serve and perf runs)


def graph_ms(fn, calls: int = 20) -> float:
    """ms per call: `calls` calls captured in one CUDA graph, the median of 5 replays (on the CPU: one call)."""
    if not torch.cuda.is_available():
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return per_call_ms(fn, calls)


def batch(b: int, ctx: int, pool_blocks: int, dev: str, dtype: torch.dtype, g: torch.Generator):
    q = torch.randn(b, HQ, D, device=dev, dtype=dtype, generator=g)
    bt = torch.randint(0, pool_blocks, (b, math.ceil(CAPTURE_BOUND / PAGE)), dtype=torch.int32, device=dev,
                       generator=g)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    return q, bt, lens


def time_variant(case: dict, name: str, splits: int, min_chunk: int = 0, cfg: tuple | None = None,
                 merge: bool = False) -> None:
    """Time one variant on case's batch into case["row"]["us"][name], with its error against one split."""
    row, out, ref = case["row"], case["out"], case["ref"]
    default_cfg = mod._split_config
    if cfg is not None:
        mod._split_config = lambda dtype: cfg
    try:
        def fn():
            decode_attention(case["q"], case["kc"], case["vc"], case["bt"], case["lens"], D ** -0.5, CAPTURE_BOUND,
                             out=out, num_splits=splits, min_chunk=min_chunk, merge=merge)

        ms = graph_ms(fn)
        fn()
        err = ((out.float() - ref).norm() / ref.norm()).item()
    finally:
        mod._split_config = default_cfg
    row["us"][name] = round(ms * 1e3, 2)
    row["max_err"] = max(row["max_err"], err)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=90)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter): the script runs end to end")
    ap.add_argument("--write-tuned", default=None, metavar="JSON",
                    help="merge the pick (pick_defaults) into this per-GPU table (tachyon/kernels/quant_tuned/<GPU>.json), "
                         "which decode_attention then reads")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    # the Poisson regime and `single` first: the budget may end the sweep early
    batches, contexts = ((48, 1, 16, 64, 32, 4, 128, 256), (640, 1024, 2048, 4096)) if not args.smoke else ((2,), (40,))
    pool_blocks = 32768 if not args.smoke else 64  # 2 x 1 GiB of bf16 K/V, far beyond L2
    g = torch.Generator(device=dev).manual_seed(0)
    kc = torch.randn(pool_blocks, PAGE, HKV, D, device=dev, dtype=dtype, generator=g)
    vc = torch.randn(pool_blocks, PAGE, HKV, D, device=dev, dtype=dtype, generator=g)
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu (interpreter)", "torch": torch.__version__,
              "triton": triton.__version__, "capture_bound": CAPTURE_BOUND, "rows": []}
    try:
        for b in batches:
            graph_splits = num_decode_splits(b, HKV, CAPTURE_BOUND)
            for ctx in contexts:
                if time.perf_counter() - t0 > args.budget_s:
                    break
                q, bt, lens = batch(b, ctx, pool_blocks, dev, dtype, g)
                out = torch.empty_like(q)
                ref = decode_attention(q, kc, vc, bt, lens, D ** -0.5, CAPTURE_BOUND, num_splits=1).float()
                gb = 2 * b * ctx * HKV * D * kc.element_size() / 1e9
                row = {"batch": b, "ctx": ctx, "graph_splits": graph_splits, "GB": gb, "us": {}, "max_err": 0.0}

                case = {"q": q, "kc": kc, "vc": vc, "bt": bt, "lens": lens, "out": out, "ref": ref, "row": row}
                run = lambda *a, case=case: time_variant(case, *a)  # noqa: E731
                run(f"graph s{graph_splits}", graph_splits)
                for s in (1, 2, 4, 8):
                    if s != graph_splits:
                        run(f"s{s}", s)
                for mc in (256, 512, 1024):
                    if graph_splits > 1:
                        run(f"graph s{graph_splits} min{mc}", graph_splits, mc)
                    if 8 > graph_splits:
                        run(f"s8 min{mc}", 8, mc)
                for cfg in ((32, 4, 3), (64, 4, 2), (128, 8, 2)):
                    run(f"graph s{graph_splits} cfg{cfg}", graph_splits, 0, cfg)
                if graph_splits > 1:  # the last split merges (no stage 2), alone and with the floors
                    run(f"graph s{graph_splits} merge", graph_splits, 0, None, True)
                    for mc in (256, 512):
                        run(f"graph s{graph_splits} min{mc} merge", graph_splits, mc, None, True)
                best = min(row["us"], key=row["us"].get)
                row["best"] = best
                row["graph_TBps"] = gb / row["us"][f"graph s{graph_splits}"] * 1e6 / 1e3
                row["best_TBps"] = gb / row["us"][best] * 1e6 / 1e3
                result["rows"].append(row)
                print(f"B={b:4d} ctx={ctx:5d} graph s{graph_splits}: {row['us'][f'graph s{graph_splits}']:8.2f} us "
                      f"({row['graph_TBps']:.2f} TB/s) | best {best}: {row['us'][best]:8.2f} us "
                      f"({row['best_TBps']:.2f} TB/s) | err {row['max_err']:.1e}", flush=True)
    finally:
        result["wall_s"] = time.perf_counter() - t0
        result["pick"] = pick_defaults(result["rows"])
        print("pick:", json.dumps(result["pick"]), flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.write_tuned:
        write_tuned(args.write_tuned, result)


def pick_defaults(rows: list[dict], gain: float = 0.98, worst: float = 1.05, max_err: float = 2e-2) -> dict:
    """decode_attention's (min_chunk, merge) from the rows that split: the variant of the graph's split count with
    the lowest geometric mean of its time over the unmodified kernel's, kept only if that mean is under `gain` and
    no row is slower than `worst` times; else (0, False), the unmodified kernel. Any row whose variants disagree with
    one split by over max_err (relative) rejects them all."""
    split_rows = [r for r in rows if r["graph_splits"] > 1]
    if any(r["max_err"] > max_err for r in rows):  # some variant disagrees with one split: trust none of them
        return {"min_chunk": 0, "merge": False, "rows": len(split_rows), "scores": {}, "rejected": "max_err"}
    options = {"": (0, False), " merge": (0, True)}
    for mc in (256, 512, 1024):
        options[f" min{mc}"] = (mc, False)
        options[f" min{mc} merge"] = (mc, True)
    scores = {}
    for suffix, choice in options.items():
        ratios = [r["us"][f"graph s{r['graph_splits']}{suffix}"] / r["us"][f"graph s{r['graph_splits']}"]
                  for r in split_rows if f"graph s{r['graph_splits']}{suffix}" in r["us"]]
        if split_rows and len(ratios) == len(split_rows):
            scores[suffix] = (math.exp(sum(map(math.log, ratios)) / len(ratios)), max(ratios), choice)
    good = {k: v for k, v in scores.items() if v[0] < gain and v[1] <= worst}
    min_chunk, merge = options[min(good, key=lambda k: good[k][0])] if good else (0, False)
    return {"min_chunk": min_chunk, "merge": merge, "rows": len(split_rows),
            "scores": {k.strip() or "unmodified": [round(v[0], 4), round(v[1], 4)] for k, v in scores.items()}}


def write_tuned(path: str, result: dict) -> None:
    """Merge the pick into a per-GPU table: configs["decode_attention"]["all"]["HKVxD"] = [min_chunk, merge]."""
    pick = result["pick"]
    merge_tuned(path, {("decode_attention", "all", f"{HKV}x{D}"): [pick["min_chunk"], pick["merge"]]},
                {"decode_attention_made_by": (
                    f"benchmarks/decode_attention_sweep.py --write-tuned ({len(result['rows'])} rows, "
                    f"{result['wall_s']:.0f} s, torch {result['torch']}, triton {result['triton']}): geometric-mean "
                    f"time over the unmodified kernel {json.dumps(pick['scores'])}")},
                {"device": result["device"]})


if __name__ == "__main__":
    main()
