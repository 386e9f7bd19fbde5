"""The quantizing norm and activation on the GPU (kernels/fused_ops.py `*_quant`) against the two launches they
replace: residual add + RMSNorm then `quantize_rows`, and SiLU-and-mul then `quantize_rows`, for llama3-8b's widths
(hidden 4096, intermediate 14336), fp8 and int8, at several row counts; checks that both give the same bytes.
Times: median of CUDA-graph replays of 20 calls each (as a decode graph launches them), per call, us.

    PYTHONPATH=. python benchmarks/fused_quant_ops.py --out fused_quant_ops.json [--rows 1,16,256,4096]
"""

from __future__ import annotations

import argparse
import json

import torch

from tachyon.kernels.fused_ops import fused_add_rms_norm, silu_and_mul, silu_and_mul_quant
from tachyon.kernels.scaled_linear import quantize_rows
from tachyon.kernels.timing import per_call_ms

CALLS = 20


def time_us(fn) -> float:
    return per_call_ms(fn, CALLS, reps=7) * 1000


def _cases(x, res, w, g, qtype) -> dict:
    return {"norm_then_quantize": lambda: quantize_rows(fused_add_rms_norm(x, res, w, 1e-5)[0], qtype),
            "norm_quant": lambda: fused_add_rms_norm(x, res, w, 1e-5, (qtype, None)),
            "norm_alone": lambda: fused_add_rms_norm(x, res, w, 1e-5),
            "silu_then_quantize": lambda: quantize_rows(silu_and_mul(g), qtype),
            "silu_quant": lambda: silu_and_mul_quant(g, qtype),
            "silu_alone": lambda: silu_and_mul(g)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,16,256,4096")
    args = ap.parse_args()
    dev, hidden, inter = "cuda", 4096, 14336
    w = torch.rand(hidden, device=dev, dtype=torch.bfloat16) + 0.5
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for m in [int(r) for r in args.rows.split(",")]:
        x = torch.randn(m, hidden, device=dev, dtype=torch.bfloat16)
        res = torch.randn(m, hidden, device=dev, dtype=torch.bfloat16)
        g = torch.randn(m, 2 * inter, device=dev, dtype=torch.bfloat16)
        for qtype in (torch.float8_e4m3fn, torch.int8):
            out, _, (q, s) = fused_add_rms_norm(x, res, w, 1e-5, (qtype, None))
            q_ref, s_ref = quantize_rows(out, qtype)
            act, (qa, sa) = silu_and_mul_quant(g, qtype)
            qa_ref, sa_ref = quantize_rows(act, qtype)
            same = (torch.equal(q.view(torch.int8), q_ref.view(torch.int8)) and torch.equal(s, s_ref)
                    and torch.equal(qa.view(torch.int8), qa_ref.view(torch.int8)) and torch.equal(sa, sa_ref))
            row = {"M": m, "qtype": str(qtype).removeprefix("torch."), "same_bytes": same,
                   "us": {name: time_us(fn) for name, fn in _cases(x, res, w, g, qtype).items()}}
            result["rows"].append(row)
            print(m, row["qtype"], "same" if same else "DIFFERENT",
                  " ".join(f"{k}={v:.2f}" for k, v in row["us"].items()), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
