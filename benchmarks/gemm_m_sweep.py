"""cuBLAS bf16 GEMM time against the row count M, for llama3-8b's four linear shapes (GPU only).

Why: a Poisson 20 req/s mixed step (~40 decodes + one 512-token prompt, ~550 rows) took 15.0 ms on the H200 where
its FLOPs at the card's 8192-size matmul rate (801.6 TFLOP/s, ../shared/anchors/h200.json) are ~9.5 ms. If the
time steps up at tile multiples of M (64 or 128 rows), a step whose token count sits just past one pays for a tile
of padding in every linear, and the scheduler could chunk prompts so that steps end on a tile boundary.

    PYTHONPATH=. python benchmarks/gemm_m_sweep.py --out gemm_m.json [--lo 384 --hi 1152 --step 8]

Prints, per M, the four layers' time per layer (us) and the 32-layer total (ms), and the per-token marginal cost.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from tachyon.kernels.timing import per_call_ms

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # (N, K)
LAYERS = 32


def time_mm(x: torch.Tensor, w: torch.Tensor, reps: int) -> float:
    """ms of x @ w.T: 10 back-to-back products in one CUDA graph, the median of `reps` replays over 10."""
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    return per_call_ms(lambda: torch.mm(x, w.t(), out=out), calls=10, reps=reps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lo", type=int, default=384)
    ap.add_argument("--hi", type=int, default=1152)
    ap.add_argument("--step", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--budget-s", type=float, default=90)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    weights = {k: torch.randn(n, kk, dtype=torch.bfloat16, device=dev) * 0.02 for k, (n, kk) in SHAPES.items()}
    xmax = {k: torch.randn(args.hi, kk, dtype=torch.bfloat16, device=dev) for k, (n, kk) in SHAPES.items()}
    t0 = time.perf_counter()
    rows = []
    for m in range(args.lo, args.hi + 1, args.step):
        if time.perf_counter() - t0 > args.budget_s:
            print(f"budget reached at M={m}")
            break
        per = {k: time_mm(xmax[k][:m], weights[k], args.reps) for k in SHAPES}
        flops = 2 * m * sum(n * kk for n, kk in SHAPES.values())
        total = sum(per.values())
        rows.append({"M": m, "us": {k: round(v * 1e3, 2) for k, v in per.items()},
                     "step_linears_ms": round(total * LAYERS, 3), "TFLOPs": round(flops / total / 1e9, 1)})
        print(f"M={m:5d} " + " ".join(f"{k} {v * 1e3:7.1f}" for k, v in per.items())
              + f"  x{LAYERS}: {total * LAYERS:6.2f} ms  {flops / total / 1e9:6.1f} TFLOP/s", flush=True)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": SHAPES, "layers": LAYERS,
           "command": "python benchmarks/gemm_m_sweep.py " + " ".join(f"--{k.replace('_', '-')} {v}"
                                                                     for k, v in vars(args).items()),
           "rows": rows}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
