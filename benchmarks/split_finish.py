"""A/B of the one-row walks' K-split sum: a second kernel (sum_splits, today's default) against the last split of
each tile summing inside the walk (TACHYON_SPLIT_FINISH=1, kernels/splits.finish_split), on one GPU.

    PYTHONPATH=. python benchmarks/split_finish.py --out $OUT/split_finish.json

Layers: llama3-70b AWQ (G 128) and llama3-8b fp8 (per-channel scales), one row, this GPU's tuned config (the
one `single` runs). Each layer: the two outputs compared bit for bit, then the time of a call with and without
PDL (a CUDA graph of one call a weight copy, copies > 256 MB, median of 10 replays; benchmarks/quant_kernels.py's
graph_ms), and the sum of a decoder layer's four linears at each setting.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quant_kernels import GROUP, L2_DEFEAT_BYTES, graph_ms, make_weights, weight_bytes  # noqa: E402

from tachyon.kernels import pdl  # noqa: E402
from tachyon.kernels.quant_linear import awq_linear  # noqa: E402
from tachyon.kernels.scaled_linear import scaled_linear  # noqa: E402
from tachyon.layers.linear import quantize_fp8  # noqa: E402

LAYERS = [("llama3-70b", "awq", "qkv", 10240, 8192), ("llama3-70b", "awq", "o", 8192, 8192),
          ("llama3-70b", "awq", "gate_up", 57344, 8192), ("llama3-70b", "awq", "down", 8192, 28672),
          ("llama3-8b", "fp8", "qkv", 6144, 4096), ("llama3-8b", "fp8", "o", 4096, 4096),
          ("llama3-8b", "fp8", "gate_up", 28672, 4096), ("llama3-8b", "fp8", "down", 4096, 14336)]


def fp8_weights(n: int, k: int, g: torch.Generator) -> tuple:
    w = torch.randn(n, k, device="cuda", generator=g, dtype=torch.bfloat16) / math.sqrt(k)
    return quantize_fp8(w)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "command": " ".join(sys.argv), "layers": [], "one_layer_linears_ms": {}}
    for model, fmt, layer, n, k in LAYERS:
        wb = weight_bytes("awq", n, k) if fmt == "awq" else n * k + 4 * n
        copies = max(2, -(-L2_DEFEAT_BYTES // wb))
        ws = [make_weights("awq", n, k, torch.bfloat16, g) if fmt == "awq" else fp8_weights(n, k, g)
              for _ in range(copies)]
        x = torch.randn(1, k, device="cuda", generator=g).to(torch.bfloat16)
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)

        def fn(w, x=x, y=y, fmt=fmt):
            if fmt == "awq":
                return awq_linear(x, w[0], w[1], w[2], GROUP, out=y)
            return scaled_linear(x, w[0], w[1], out=y)

        row = {"model": model, "fmt": fmt, "layer": layer, "N": n, "K": k, "weight_bytes": wb}
        outs = {}
        for finish in ("0", "1"):
            os.environ["TACHYON_SPLIT_FINISH"] = finish
            outs[finish] = fn(ws[0]).clone()
            for use_pdl in (False, True):
                pdl.enable(use_pdl)
                ms = graph_ms(fn, ws)
                pdl.enable(False)
                key = f"{'finish' if finish == '1' else 'sum_kernel'}{'_pdl' if use_pdl else ''}"
                row[key + "_ms"] = ms
                row[key + "_GBps"] = wb / ms / 1e6
                report["one_layer_linears_ms"][key] = report["one_layer_linears_ms"].get(key, {})
                report["one_layer_linears_ms"][key][model] = report["one_layer_linears_ms"][key].get(model, 0.0) + ms
        row["bit_equal"] = bool(torch.equal(outs["0"], outs["1"]))
        report["layers"].append(row)
        print(f"{model} {fmt} {layer}: equal {row['bit_equal']} | sum kernel {row['sum_kernel_ms']:.4f} "
              f"(PDL {row['sum_kernel_pdl_ms']:.4f}) | finish {row['finish_ms']:.4f} (PDL {row['finish_pdl_ms']:.4f}) ms",
              flush=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        del ws
        torch.cuda.empty_cache()
    os.environ.pop("TACHYON_SPLIT_FINISH", None)
    print(json.dumps(report["one_layer_linears_ms"], indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
