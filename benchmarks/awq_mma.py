"""The INT4 tensor-core kernels (tachyon/kernels/awq_mma.py: K-major repacked, and on the natural layout) against
what the engine runs today (awq_linear with this GPU's tuned config) and cuBLAS bf16, on llama3-70b's and
llama3-8b's layers.

    PYTHONPATH=. python benchmarks/awq_mma.py --out $OUT/awq_mma.json [--rows 1,16,64,256] [--budget-s 150]
        [--write-tuned tachyon/kernels/quant_tuned/<GPU>.json]
    python benchmarks/awq_mma.py --from-json awq_mma.json --write-tuned PATH   (no GPU: the table from a result)

Per (layer, M): the relative error of each kernel against awq_linear_ref (bf16), then GPU ms per call (a CUDA
graph over weight copies adding up to > 256 MB, so nothing is served from L2; median of 10 replays) and GB/s of
the weight's bytes (K*N/2 + zeros + bf16 scales). Every K-major MMA_CONFIGS entry (and up to 4 rows every
WALK_CONFIGS entry, from 16 rows every DIRECT_CONFIGS entry) and, up to 16 rows, every NATURAL_CONFIGS entry is
timed while the budget lasts; the best of each is reported beside today's kernel. A config further than 2e-2 from
the reference is not timed.

--write-tuned merges the fastest K-major config per (row bucket of the timed M, layer shape) into the GPU's tuned
table under "awq_kmajor" (what quant_linear.kmajor_config reads for the K-major layers, Hopper's default).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quant_kernels import DEV, GROUP, L2_DEFEAT_BYTES, SHAPES, graph_ms, rel_errs, weight_bytes  # noqa: E402

from tachyon.kernels.awq_mma import (  # noqa: E402
    DIRECT_CONFIGS,
    MMA_CONFIGS,
    MMA_MAX_ROWS,
    NATURAL_CONFIGS,
    WALK_CONFIGS,
    WALK_MAX_ROWS,
    awq_mma_linear,
    awq_mma_natural,
    pack_int4_kmajor,
)
from tachyon.kernels.quant_linear import (  # noqa: E402
    awq_linear,
    awq_linear_ref,
    default_config,
    merge_tuned,
    row_bucket,
    tuned_key,
)


def time_configs(fn, configs: list, ws: list, ref: torch.Tensor, over_budget) -> dict:
    """{str(config): rel_err and ms (or the error)} for fn(config, weight copy); past the budget only the first."""
    out = {}
    for cfg in configs:
        if over_budget() and out:
            break
        try:
            entry = {"rel_err": rel_errs(fn(cfg, ws[0]), ref)[0]}
            if entry["rel_err"] <= 2e-2:
                entry["ms"] = graph_ms(lambda w, cfg=cfg: fn(cfg, w), ws)
        except Exception as e:  # a config that does not compile on this GPU: say so, go on
            entry = {"error": repr(e)[:300]}
        out[str(cfg)] = entry
    return out


def write_tuned(report: dict, path: str) -> None:
    """The fastest K-major config of each timed (M, layer) under "awq_kmajor" -> bucket -> "NxKgG" in path."""
    entries = {}
    for row in report["results"]:
        best = row.get("mma_best")
        # a tile config serves up to MMA_MAX_ROWS rows (kmajor_config): a row count past it only reports
        if best and row["M"] <= MMA_MAX_ROWS:
            key = tuned_key(row["N"], row["K"], report["group"])
            entries["awq_kmajor", row_bucket(row["M"]), key] = list(ast.literal_eval(best["config"]))
    merge_tuned(path, entries, {"awq_kmajor_made_by": ("benchmarks/awq_mma.py --write-tuned (the fastest K-major "
                                                       f"config per row bucket and shape; {report['command']})")},
                {"device": report["gpu"]})
    print("wrote", path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64,256")
    ap.add_argument("--models", default="llama3-70b,llama3-8b")
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--out")
    ap.add_argument("--write-tuned", default=None, help="merge the fastest K-major configs into this tuned table")
    ap.add_argument("--from-json", default=None, help="take the timings from this earlier --out (no GPU needed)")
    args = ap.parse_args()
    if args.from_json:
        if not args.write_tuned:
            raise SystemExit("--from-json only feeds --write-tuned")
        with open(args.from_json) as f:
            write_tuned(json.load(f), args.write_tuned)
        return
    if not args.out:
        raise SystemExit("--out is required when timing")
    rows = [int(r) for r in args.rows.split(",")]
    models = args.models.split(",")
    start = time.monotonic()
    g = torch.Generator(device=DEV).manual_seed(0)
    dtype = torch.bfloat16
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "command": " ".join(sys.argv), "group": GROUP, "results": []}
    for model, layer, n, k in [s for s in SHAPES if s[0] in models]:
        wb = weight_bytes("awq", n, k)
        copies = max(2, -(-L2_DEFEAT_BYTES // wb))
        ws = []
        for _ in range(copies):
            q = torch.randint(-2**31, 2**31, (k, n // 8), dtype=torch.int32, device=DEV, generator=g)
            z = torch.randint(-2**31, 2**31, (k // GROUP, n // 8), dtype=torch.int32, device=DEV, generator=g)
            s = (torch.randn(k // GROUP, n, device=DEV, generator=g) * (0.3 / math.sqrt(k))).to(dtype)
            ws.append((q, z, s, pack_int4_kmajor(q)))
        dense = [torch.randn(n, k, device=DEV, dtype=dtype, generator=g) / math.sqrt(k)
                 for _ in range(max(2, -(-L2_DEFEAT_BYTES // (2 * n * k))))]
        for m in rows:
            x = torch.randn(m, k, device=DEV, generator=g).to(dtype)
            y = torch.empty(m, n, device=DEV, dtype=dtype)
            q, z, s, qk = ws[0]
            ref = awq_linear_ref(x, q, z, s, GROUP)
            row = {"model": model, "layer": layer, "N": n, "K": k, "M": m, "weight_bytes": wb}
            today = default_config("awq", m, n, k, x.device, GROUP)
            row["today"] = {"config": str(today), "rel_err": rel_errs(awq_linear(x, q, z, s, GROUP), ref)[0]}
            row["today"]["ms"] = graph_ms(lambda w, x=x, y=y: awq_linear(x, w[0], w[1], w[2], GROUP, out=y), ws)
            row["cublas_bf16_ms"] = graph_ms(lambda w, x=x, y=y: torch.mm(x, w.t(), out=y), dense)

            def kmajor(cfg, w, x=x, y=y):
                return awq_mma_linear(x, w[3], w[1], w[2], GROUP, config=cfg, out=y)

            def natural(cfg, w, x=x, y=y):
                return awq_mma_natural(x, w[0], w[1], w[2], GROUP, config=cfg, out=y)

            tall = max(16, triton.next_power_of_2(m))  # taller tiles than the rows need: a shorter one's kernel
            walks = WALK_CONFIGS if m <= WALK_MAX_ROWS else []
            tiles = [c for c in MMA_CONFIGS if c[1] <= tall or c is MMA_CONFIGS[0]]
            direct = [c for c in DIRECT_CONFIGS if c[2] <= tall] if m >= 16 else []
            # from 32 rows the direct tiles go first: a budget cut still times them (they are meant for these rows)
            cands = direct + tiles + walks if m >= 32 else tiles + walks + direct
            cfgs = time_configs(kmajor, cands, ws, ref, lambda: time.monotonic() - start > args.budget_s)
            row["mma"] = cfgs
            nat = time_configs(natural, NATURAL_CONFIGS if m <= 16 else [], ws, ref,
                               lambda: time.monotonic() - start > args.budget_s)
            row["natural"] = nat
            for key, table in (("mma_best", cfgs), ("natural_best", nat)):
                timed = {c: v["ms"] for c, v in table.items() if "ms" in v}
                if timed:
                    best = min(timed, key=timed.get)
                    row[key] = {"config": best, "ms": timed[best], "GBps": wb / timed[best] / 1e6,
                                "speedup_vs_today": row["today"]["ms"] / timed[best]}
            row["today"]["GBps"] = wb / row["today"]["ms"] / 1e6
            report["results"].append(row)
            b, nb = row.get("mma_best", {}), row.get("natural_best", {})
            print(f"{model} {layer} M={m}: today {row['today']['ms']:.4f} ms ({row['today']['GBps']:.0f} GB/s, "
                  f"err {row['today']['rel_err']:.1e}) | K-major {b.get('ms', float('nan')):.4f} ms "
                  f"({b.get('GBps', 0):.0f} GB/s, {b.get('config')}) x{b.get('speedup_vs_today', 0):.2f} | "
                  f"natural {nb.get('ms', float('nan')):.4f} ms ({nb.get('GBps', 0):.0f} GB/s, {nb.get('config')}) "
                  f"x{nb.get('speedup_vs_today', 0):.2f} | cuBLAS bf16 {row['cublas_bf16_ms']:.4f} ms", flush=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
        del ws, dense
        torch.cuda.empty_cache()
    print("wrote", args.out)
    if args.write_tuned:
        write_tuned(report, args.write_tuned)


if __name__ == "__main__":
    main()
