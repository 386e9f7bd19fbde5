"""Check and time the weight-only quantized linear kernels (tachyon/kernels/quant_linear.py) on one GPU.

    PYTHONPATH=. python benchmarks/quant_kernels.py --out $OUT/quant_kernels.json

Shapes: the linear layers of llama3-8b and llama3-70b (qkv, o, gate_up, down), random packed weights, G = 128.
1. correctness: int8_linear and awq_linear (default configs) against their torch references in bf16 and fp16,
   as ||out - ref|| / ||ref|| and max|out - ref| / max|ref|;
2. timings in bf16 at M = 1, 4, 16 (skinny) and 64, 256, 1024 (GEMM) for every candidate config of the row
   bucket, each first checked against the reference. Each timing is a CUDA graph that runs the layer once per
   weight copy (copies add up to > 256 MB, so nothing is served from L2), replayed 10 times, median over copies.
   GB/s counts the weight's bytes (INT4: K*N/2 + scales and zeros; INT8: K*N + scales; bf16: 2*K*N); cuBLAS is
   torch.mm on a bf16 weight of the same shape.
A time budget (--budget-s) keeps the run short: past it, only the default config is timed.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import time

import torch
import triton

from tachyon.kernels.quant_linear import (
    AWQ_CONFIGS,
    INT8_CONFIGS,
    awq_linear,
    awq_linear_ref,
    int8_linear,
    int8_linear_ref,
    merge_tuned,
    row_bucket,
    tuned_key,
)
from tachyon.kernels.timing import median_replay_ms

SHAPES = [  # (model, layer, N, K)
    ("llama3-8b", "qkv", 6144, 4096), ("llama3-8b", "o", 4096, 4096),
    ("llama3-8b", "gate_up", 28672, 4096), ("llama3-8b", "down", 4096, 14336),
    ("llama3-70b", "qkv", 10240, 8192), ("llama3-70b", "o", 8192, 8192),
    ("llama3-70b", "gate_up", 57344, 8192), ("llama3-70b", "down", 8192, 28672),
]
ROWS = [1, 2, 4, 5, 16, 64, 256, 2048]  # every row bucket: one_row, few, few, skinny (5: a k = 4 verification), skinny, gemm, gemm, prefill
CHECK_ROWS = [1, 16, 64]
GROUP = 128
L2_DEFEAT_BYTES = 256 << 20
DEV = "cuda"
BAD = 2e-2  # a config further than this from the reference (relative norm) is not timed


def rel_errs(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("nan"), float("nan")
    d = out - ref
    return (d.norm() / ref.norm()).item(), (d.abs().max() / ref.abs().max()).item()


def weight_bytes(fmt: str, n: int, k: int) -> int:
    if fmt == "awq":
        return k * n // 2 + (k // GROUP) * n * 2 + (k // GROUP) * n // 2  # weights, bf16 scales, zeros
    if fmt == "int8":
        return k * n + 2 * n
    return 2 * k * n


def make_weights(fmt: str, n: int, k: int, dtype, g: torch.Generator) -> tuple:
    """Random quantized weights: for INT4, random int32 words are random nibbles in any packing order."""
    if fmt == "int8":
        q = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=DEV, generator=g)
        s = (torch.rand(n, device=DEV, generator=g) * 2 - 1) * (2 / 127 / math.sqrt(k))
        return q, s.to(dtype)
    if fmt == "awq":
        q = torch.randint(-2**31, 2**31, (k, n // 8), dtype=torch.int32, device=DEV, generator=g)
        z = torch.randint(-2**31, 2**31, (k // GROUP, n // 8), dtype=torch.int32, device=DEV, generator=g)
        s = torch.randn(k // GROUP, n, device=DEV, generator=g) * (0.3 / math.sqrt(k))
        return q, z, s.to(dtype)
    return (torch.randn(n, k, device=DEV, generator=g, dtype=dtype) / math.sqrt(k),)


def run(fmt: str, x, w: tuple, cfg=None, out=None):
    if fmt == "int8":
        return int8_linear(x, *w, config=cfg, out=out)
    if fmt == "awq":
        return awq_linear(x, w[0], w[1], w[2], GROUP, config=cfg, out=out)
    return torch.mm(x, w[0].t(), out=out)


def ref(fmt: str, x, w: tuple):
    return int8_linear_ref(x, *w) if fmt == "int8" else awq_linear_ref(x, w[0], w[1], w[2], GROUP)


def graph_ms(fn, copies: list, reps: int = 10) -> float:
    """GPU ms per call: one graph runs fn on every weight copy in turn; median of `reps` replays / copies."""
    fn(copies[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for w in copies:
            fn(w)
    torch.cuda.current_stream().wait_stream(stream)
    ms = median_replay_ms(graph, reps) / len(copies)
    del graph
    return ms


def check(report: dict) -> None:
    g = torch.Generator(device=DEV).manual_seed(0)
    rows = []
    for model, layer, n, k in SHAPES:
        for fmt in ("int8", "awq"):
            for dtype in (torch.bfloat16, torch.float16):
                w = make_weights(fmt, n, k, dtype, g)
                for m in CHECK_ROWS:
                    x = torch.randn(m, k, device=DEV, generator=g).to(dtype)
                    row = {"model": model, "layer": layer, "N": n, "K": k, "fmt": fmt,
                           "dtype": str(dtype).removeprefix("torch."), "M": m}
                    try:
                        row["rel_err"], row["max_rel_err"] = rel_errs(run(fmt, x, w), ref(fmt, x, w))
                    except Exception as e:  # recorded, so one broken case does not end the run
                        row["rel_err"] = row["max_rel_err"] = float("nan")
                        row["error"] = f"{type(e).__name__}: {e}"[:300]
                        print(model, layer, fmt, row["dtype"], m, row["error"], flush=True)
                    rows.append(row)
                del w
    torch.cuda.empty_cache()
    report["correctness"] = rows
    worst = {}
    for r in rows:
        key = (r["fmt"], r["dtype"])
        e = max(r["rel_err"], r["max_rel_err"])
        worst[key] = max(worst.get(key, 0.0), e if e == e else float("inf"))  # NaN (an error) shows as inf
    print("correctness, worst over shapes and M", CHECK_ROWS, ":",
          ", ".join(f"{f} {d} {e:.2e}" for (f, d), e in worst.items()), flush=True)


def bench(report: dict, deadline: float, rows: list[int], fmts: tuple[str, ...], shapes=SHAPES) -> None:
    g = torch.Generator(device=DEV).manual_seed(1)
    dtype = torch.bfloat16
    results = []
    print(f"{'shape':<22}{'M':>5} | {'int8 ms':>8} {'GB/s':>6} {'vs cuBLAS':>9} | {'int4 ms':>8} {'GB/s':>6} "
          f"{'vs cuBLAS':>9} | {'bf16 ms':>8} {'GB/s':>6}", flush=True)
    for model, layer, n, k in shapes:
        weights = {}
        for fmt in ("int8", "awq", "bf16"):
            copies = max(1, math.ceil(L2_DEFEAT_BYTES / weight_bytes(fmt, n, k)))
            weights[fmt] = [make_weights(fmt, n, k, dtype, g) for _ in range(copies)]
        for m in rows:
            x = torch.randn(m, k, device=DEV, generator=g).to(dtype)
            y = torch.empty(m, n, device=DEV, dtype=dtype)
            row = {"model": model, "layer": layer, "N": n, "K": k, "M": m}
            cublas = graph_ms(lambda w, x=x, y=y: run("bf16", x, w, out=y), weights["bf16"])
            row["cublas_ms"], row["cublas_GBps"] = cublas, weight_bytes("bf16", n, k) / cublas / 1e6
            for fmt, table in (("int8", INT8_CONFIGS), ("awq", AWQ_CONFIGS)):
                if fmt not in fmts:
                    row[fmt] = {"configs": {}, "default_ms": None, "best_config": None, "best_ms": None}
                    continue
                expect = ref(fmt, x, weights[fmt][0])
                cands = table[row_bucket(m)]
                if time.time() > deadline:
                    cands = cands[:1]
                per_cfg = {}
                for cfg in cands:
                    try:
                        err, _ = rel_errs(run(fmt, x, weights[fmt][0], cfg), expect)
                        if not err <= BAD:
                            per_cfg[str(cfg)] = f"wrong: rel err {err:.3g}"
                            continue
                        per_cfg[str(cfg)] = graph_ms(lambda w, cfg=cfg, x=x, y=y, fmt=fmt: run(fmt, x, w, cfg, y),
                                                     weights[fmt])
                    except Exception as e:  # e.g. out of shared memory: not a candidate on this device
                        per_cfg[str(cfg)] = f"{type(e).__name__}: {e}"[:200]
                timed = {c: t for c, t in per_cfg.items() if isinstance(t, float)}
                best = min(timed, key=timed.get) if timed else None
                row[fmt] = {"configs": per_cfg, "default_ms": timed.get(str(cands[0])), "best_config": best,
                            "best_ms": timed.get(best),
                            "best_GBps": weight_bytes(fmt, n, k) / timed[best] / 1e6 if best else None,
                            "speedup_vs_cublas": cublas / timed[best] if best else None}
            results.append(row)

            def cell(r):
                if r["best_ms"] is None:
                    return f"{'-':>8} {'-':>6} {'-':>9}"
                return f"{r['best_ms']:8.4f} {r['best_GBps']:6.0f} {r['speedup_vs_cublas']:8.2f}x"
            print(f"{model + ' ' + layer:<22}{m:>5} | {cell(row['int8'])} | {cell(row['awq'])} | "
                  f"{cublas:8.4f} {row['cublas_GBps']:6.0f}", flush=True)
        del weights
        torch.cuda.empty_cache()
    report["timings"] = results


def write_tuned(report: dict, path: str) -> None:
    """Per (format, row bucket, N x K): the config with the least total time over the bucket's timed rows (only
    configs timed at every one of them count); merged into what the file already holds."""
    totals: dict = {}
    for row in report["timings"]:
        for fmt in ("int8", "awq"):
            key = tuned_key(row["N"], row["K"], GROUP if fmt == "awq" else None)
            slot = totals.setdefault((fmt, row_bucket(row["M"]), key), {})
            for cfg, t in row[fmt]["configs"].items():
                slot.setdefault(cfg, []).append(t)
    entries = {}
    for slot, per_cfg in totals.items():
        rows = max((len(v) for v in per_cfg.values()), default=0)
        ok = {c: sum(v) for c, v in per_cfg.items() if len(v) == rows and all(isinstance(t, float) for t in v)}
        if ok:
            entries[slot] = list(ast.literal_eval(min(ok, key=ok.get)))
    merge_tuned(path, entries, {"device": report["device"], "torch": report["torch"], "triton": report["triton"],
                                "made_by": "PYTHONPATH=. python benchmarks/quant_kernels.py --write-tuned PATH"}, {})
    print(f"wrote the tuned table {path}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="quant_kernels.json")
    ap.add_argument("--budget-s", type=float, default=200.0, help="past this, only default configs are timed")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M values to time")
    ap.add_argument("--formats", default="int8,awq", help="which quantized formats to time (int8, awq)")
    ap.add_argument("--models", default=",".join(dict.fromkeys(m for m, *_ in SHAPES)),
                    help="whose layers to time (comma-separated: llama3-8b, llama3-70b)")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness pass over the default configs")
    ap.add_argument("--write-tuned", default=None,
                    help="write the fastest config per (format, row bucket, shape) to this JSON, the table "
                         "tachyon/kernels/quant_tuned/<device>.json that the kernels read on this GPU model")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    t0 = time.time()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "group_size": GROUP, "rows": rows, "configs": {"int8": INT8_CONFIGS, "awq": AWQ_CONFIGS}}
    print(report["device"], "torch", report["torch"], "triton", report["triton"], flush=True)
    if not args.no_check:
        check(report)
        print(f"correctness done in {time.time() - t0:.1f} s", flush=True)
    shapes = [s for s in SHAPES if s[0] in args.models.split(",")]
    if not shapes:
        raise SystemExit(f"--models {args.models}: none of {sorted({m for m, *_ in SHAPES})}")
    bench(report, t0 + args.budget_s, rows, tuple(args.formats.split(",")), shapes)
    report["wall_s"] = time.time() - t0
    if args.write_tuned:
        write_tuned(report, args.write_tuned)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}; total wall time {report['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
