"""W8A8 linears on the GPU (kernels/scaled_linear.py): correctness against the torch reference, then per-layer
times of llama3-8b's and llama3-70b's linears at 1..4096 rows for bf16 cuBLAS, int8 weight-only, and fp8 / w8a8
through each path (the row walk, `_scaled_mm` with and without fast accumulation, `_int_mm`); every small-rows
config (walk, tensor-core dot, weight-only) at 1, 4 and 16 rows; above 16 rows cuBLAS against the fused GEMM's and
the weight-only configs (a "wo" config is checked against the weight-only product, `scaled_weight_only_ref`).
`--write-tuned` keeps the fastest per shape and row bucket. Times: median of CUDA-graph replays of 10 calls each,
weights larger than L2 so they come from HBM.

With `--fused` (the default under TACHYON_FUSED_QUANT=1, as the model then runs) the layers whose input comes from
the quantizing norm or activation (qkv, gate_up, down: `install_fused_ops` hands them their rows already quantized)
are timed as they run there: the kinds that quantize first (qdot, qwalk, gemm, cuBLAS) get the quantized rows
(`pre`) and skip `quantize_rows`.

    PYTHONPATH=. python benchmarks/scaled_kernels.py --out scaled_kernels.json [--rows 1,16,64,256,4096]
        [--write-tuned tachyon/kernels/quant_tuned/NVIDIA_H200.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
import triton

from tachyon.kernels.quant_linear import int8_linear, merge_tuned, row_bucket, tuned_key
from tachyon.kernels.scaled_linear import (
    CUBLAS_CONFIG,
    GEMM_CONFIGS,
    MAX_ROW_WALK_ROWS,
    SMALL_CONFIGS,
    cublas_takes,
    quantize_rows,
    scaled_linear,
    scaled_linear_ref,
    scaled_weight_only_ref,
)
from tachyon.kernels.timing import per_call_ms
from tachyon.models.llama import MLP, DecoderLayer

SHAPES = [("llama3-8b", "qkv", 6144, 4096), ("llama3-8b", "o", 4096, 4096),
          ("llama3-8b", "gate_up", 28672, 4096), ("llama3-8b", "down", 4096, 14336),
          ("llama3-70b", "gate_up", 57344, 8192), ("llama3-70b", "down", 8192, 28672)]
CONFIG_ROWS = (1, 4, 16)  # one of each row bucket the small-rows path serves
# the layers whose input rows come quantized from the norm or activation before them (the model's QUANT_FEEDS:
# qkv, gate_up, down)
FED_LAYERS = tuple(linear.rsplit(".", 1)[-1].removesuffix("_proj")
                   for cls in (DecoderLayer, MLP) for _, linear in cls.QUANT_FEEDS)
CALLS = 10


def time_ms(fn) -> float:
    return per_call_ms(fn, CALLS, reps=7)


def rel(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm()).item()


MAX_REL_ERR = 2e-2  # a config whose output is further than this from the reference is never installed


def _try(err: dict, ms: dict, name: str, fn, ref) -> None:
    """err[name] and ms[name] for one config; one that fails (a compile error, too much shared memory) is printed
    and left out with an infinite error, so the rest of the table still comes."""
    try:
        err[name] = rel(fn(), ref)
        ms[name] = time_ms(fn)
    except Exception as e:  # noqa: BLE001 (any failure of one candidate)
        print("FAILED", name, type(e).__name__, str(e)[:200], flush=True)
        err[name], ms[name] = float("inf"), float("inf")


def _fastest_correct(ms: dict, err: dict) -> str:
    """The fastest config whose output agrees with the reference (a fast wrong kernel is a bug, not a win); the
    wrong ones are printed."""
    bad = {c: e for c, e in err.items() if not e <= MAX_REL_ERR}
    if bad:
        print("WRONG", bad, flush=True)
    return min((c for c in ms if c not in bad), key=ms.get)


def _refs(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the W8A8 reference, the weight-only one): a "wo" config is checked against the product it computes (x not
    rounded), the others against x's rows quantized."""
    return scaled_linear_ref(x, q, s), scaled_weight_only_ref(x, q, s)


def _pre(x: torch.Tensor, q: torch.Tensor, layer: str, fused: bool):
    """x's rows quantized for q, as the fused producer before a FED_LAYERS layer hands them; None otherwise."""
    return quantize_rows(x, q.dtype) if fused and layer in FED_LAYERS else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,4,16,17,64,256,1024,4096")
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--config-rows", default=",".join(map(str, CONFIG_ROWS)),
                    help="rows at which every small-rows config is timed (default: one of each row bucket; \"\": none)")
    ap.add_argument("--models", default="llama3-8b,llama3-70b", help="which models' layer shapes")
    ap.add_argument("--write-tuned", default=None,
                    help="merge the fastest small-rows config per (fp8|w8a8, row bucket, shape) into this JSON, the "
                         "table tachyon/kernels/quant_tuned/<device>.json the kernels read on this GPU model")
    ap.add_argument("--fused", action=argparse.BooleanOptionalAction,
                    default=os.environ.get("TACHYON_FUSED_QUANT") == "1",
                    help="time qkv/gate_up/down with their rows quantized by the norm or activation before them, as "
                         "the model runs with TACHYON_FUSED_QUANT=1 (default: as that variable says)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = [int(r) for r in args.rows.split(",")]
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "checks": [], "timings": [],
              "walk_configs": [], "fed_layers": list(FED_LAYERS) if args.fused else []}
    for model, layer, n, k in [s for s in SHAPES if s[0] in args.models.split(",")]:
        w = torch.randn(n, k, device=dev, generator=g) / math.sqrt(k)
        wb = w.to(torch.bfloat16)
        s8 = w.abs().amax(1) / 127
        q8 = torch.round(w / s8[:, None]).clamp(-127, 127).to(torch.int8)
        sf = w.abs().amax(1) / 448
        qf = (w / sf[:, None]).to(torch.float8_e4m3fn)
        del w
        for m in rows:
            if time.perf_counter() - t0 > args.budget_s:
                break
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            row = {"model": model, "layer": layer, "N": n, "K": k, "M": m}
            for name, q, s in (("fp8", qf, sf), ("w8a8", q8, s8)):
                ref = scaled_linear_ref(x, q, s)
                row[f"{name}_err"] = rel(scaled_linear(x, q, s), ref)
                row[f"{name}_walk_err"] = rel(scaled_linear(x, q, s, force_walk=True), ref) if m <= 256 else None
            t = {"bf16": time_ms(lambda x=x, wb=wb: x @ wb.T), "int8_wo": time_ms(lambda x=x, q8=q8, s8=s8: int8_linear(x, q8, s8.bfloat16())),
                 "fp8": time_ms(lambda x=x, qf=qf, sf=sf: scaled_linear(x, qf, sf)), "w8a8": time_ms(lambda x=x, q8=q8, s8=s8: scaled_linear(x, q8, s8))}
            if m <= 256:
                t["fp8_walk"] = time_ms(lambda x=x, qf=qf, sf=sf: scaled_linear(x, qf, sf, force_walk=True))
                t["w8a8_walk"] = time_ms(lambda x=x, q8=q8, s8=s8: scaled_linear(x, q8, s8, force_walk=True))
            xq, xs = quantize_rows(x, torch.float8_e4m3fn)
            t["quantize_rows"] = time_ms(lambda x=x: quantize_rows(x, torch.float8_e4m3fn))
            t["scaled_mm"] = time_ms(lambda xq=xq, xs=xs, qf=qf, sf=sf: torch._scaled_mm(xq, qf.t(), scale_a=xs[:, None], scale_b=sf[None, :],
                                                              out_dtype=torch.bfloat16))
            t["scaled_mm_fast"] = time_ms(lambda xq=xq, xs=xs, qf=qf, sf=sf: torch._scaled_mm(xq, qf.t(), scale_a=xs[:, None],
                                                                   scale_b=sf[None, :], out_dtype=torch.bfloat16,
                                                                   use_fast_accum=True))
            if m > 16:
                xi, _ = quantize_rows(x, torch.int8)
                t["int_mm"] = time_ms(lambda xi=xi, q8=q8: torch._int_mm(xi, q8.t()))
            row["ms"] = t
            if m > MAX_ROW_WALK_ROWS:  # cuBLAS against the fused GEMM's configs, for the tuned table
                for name, q, s in (("fp8", qf, sf), ("w8a8", q8, s8)):
                    refs = _refs(x, q, s)
                    pre = _pre(x, q, layer, args.fused)
                    cfgs = [c for c in GEMM_CONFIGS if c[0] != "cublas" or cublas_takes(x, q)]
                    err, ms = {}, {}
                    for c in cfgs:
                        _try(err, ms, str(c), lambda x=x, q=q, s=s, c=c, pre=pre: scaled_linear(
                            x, q, s, config=c, pre=pre), refs[c[0] == "wo"])
                    best = _fastest_correct(ms, err)
                    result["walk_configs"].append({"model": model, "layer": layer, "N": n, "K": k, "M": m,
                                                   "fmt": name, "ms": ms, "err": err, "best": best})
                    print("gemm", model, layer, m, name, f"best {best} {ms[best]:.4f} ms, cublas "
                          f"{ms.get(str(GEMM_CONFIGS[0]), float('nan')):.4f}, max err {max(err.values()):.1e}",
                          flush=True)
            row["fp8_walk_GBps"] = (n * k + m * k * 2) / (t.get("fp8_walk", float("nan")) * 1e6)
            result["timings"].append(row)
            print(model, layer, m, " ".join(f"{a}={b:.4f}" for a, b in t.items()),
                  f"err fp8 {row['fp8_err']:.2e} w8a8 {row['w8a8_err']:.2e}", flush=True)
        for m in [int(r) for r in args.config_rows.split(",") if r]:  # "" times no small-rows config
            if time.perf_counter() - t0 > args.budget_s:
                break
            x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            for name, q, s in (("fp8", qf, sf), ("w8a8", q8, s8)):
                refs = _refs(x, q, s)
                pre = _pre(x, q, layer, args.fused)
                ms, err = {}, {}
                # cuBLAS (after quantize_rows) beside the walks where it takes the rows: fp8 at any count
                for cfg in SMALL_CONFIGS + ([CUBLAS_CONFIG] if cublas_takes(x, q) else []):
                    _try(err, ms, str(cfg), lambda x=x, q=q, s=s, cfg=cfg, pre=pre: scaled_linear(
                        x, q, s, config=cfg, force_walk=True, pre=pre), refs[cfg[0] == "wo"])
                best = _fastest_correct(ms, err)
                result["walk_configs"].append({"model": model, "layer": layer, "N": n, "K": k, "M": m, "fmt": name,
                                               "ms": ms, "err": err, "best": best})
                print("walk", model, layer, m, name, f"best {best} {ms[best]:.4f} ms "
                      f"({(n * k) / (ms[best] * 1e6):.0f} GB/s), default {ms[str(SMALL_CONFIGS[0])]:.4f}, "
                      f"max err {max(err.values()):.1e}", flush=True)
        del qf, q8, wb
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if args.write_tuned:
        write_tuned(result, args.write_tuned)


def write_tuned(result: dict, path: str) -> None:
    """The fastest config per (format, row bucket, N x K), merged into the table quant_kernels.py also writes."""
    entries = {}
    for row in result["walk_configs"]:
        best = next(c for c in SMALL_CONFIGS + GEMM_CONFIGS if str(c) == row["best"])
        entries[row["fmt"], row_bucket(row["M"]), tuned_key(row["N"], row["K"])] = best
    merge_tuned(path, entries, {"made_by_scaled": "PYTHONPATH=. python benchmarks/scaled_kernels.py --write-tuned PATH"},
                {"device": result["device"], "torch": result["torch"], "triton": triton.__version__})


if __name__ == "__main__":
    main()
