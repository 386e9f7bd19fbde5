"""The start-up tuner (`tachyon.kernels.gemv.tune_linears`) on llama3-8b's qkv, o_proj and down_proj shapes, 8 layers
each (bf16, random weights, 0.7-1.0 GB a shape: beyond L2), at chosen row buckets: what it installs and how fast
against cuBLAS, every candidate checked against F.linear first (GPU only). It times the K-split configs too
(TACHYON_GEMV_SPLIT=1, which the engine's start-up leaves off until this has measured them).

    PYTHONPATH=. python benchmarks/gemv_tune_check.py --out gemv_tune.json [--rows 2,16,32,64]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from tachyon.kernels.gemv import tune_linears

SHAPES = [(6144, 4096), (4096, 4096), (4096, 14336)]  # (N, K): qkv, o_proj, down_proj


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="2,16,32,64")
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    os.environ.setdefault("TACHYON_GEMV_SPLIT", "1")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
              for n, k in SHAPES for _ in range(args.layers)]
    model = torch.nn.Sequential(*layers)
    t0 = time.perf_counter()
    report = tune_linears(model, [int(r) for r in args.rows.split(",")])
    took = time.perf_counter() - t0
    for shape, rows in report.items():
        print(shape, json.dumps(rows)[:600], flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tune_s": round(took, 1),
                   "command": f"python benchmarks/gemv_tune_check.py --rows {args.rows} --layers {args.layers}",
                   "report": report}, f, indent=1)
    print(f"tuned in {took:.1f} s")


if __name__ == "__main__":
    main()
