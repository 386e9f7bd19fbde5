#!/usr/bin/env bash
# --kv-cache-dtype fp8 on the GPU: the kernel tests (fp8 writes run only here: the CPU interpreter rounds e4m3
# carries wrongly, bf16 too), the greedy/logits correctness of the GPU path, then llama3-8b (random bf16 weights)
# single / sweep / throughput / decode floors with the KV cache in bf16 and in fp8, same machine, same call.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_fp8_kv.sh
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_fp8_kv.py tests/kernels/test_attention.py \
  tests/kernels/test_kv_write.py tests/kernels/test_fused_ops.py tests/kernels/test_piecewise_graphs.py \
  tests/kernels/test_model_triton.py > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
for kv in auto fp8; do
  timeout 205 python benchmarks/gpu_run.py perf --workloads single,sweep,throughput,floor --lean-single \
    --sweep-concurrency 1,16,64,256 --kv-cache-dtype $kv --out "$OUT/perf_kv_$kv.json" > "$OUT/perf_kv_$kv.log" 2>&1
  python - "$OUT/perf_kv_$kv.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["kv_cache_dtype"], "blocks", d.get("num_kv_blocks"), "single", round(d.get("single", {}).get("decode_tok_s", 0), 1),
      "sweep", {c: round(v["output_tok_s"]) for c, v in d.get("sweep", {}).items()},
      "throughput", round(d.get("throughput", {}).get("output_tok_s", 0)),
      "floor", [(f["batch"], f["ctx"], round(f["replay_ms"], 3)) for f in d.get("decode_floor", []) if isinstance(f, dict)])
PY
  tail -2 "$OUT/perf_kv_$kv.log"
done
