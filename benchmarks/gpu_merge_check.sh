#!/usr/bin/env bash
# One device call after merging speculative decoding, structured outputs, the vLLM-compatible surface and the
# fp8 KV cache: their GPU tests (Triton kernels in bf16/fp16, fp8 writes, the engine's tiny-model tests on the
# GPU path with CUDA graphs), then llama3-8b (random bf16 weights) single / throughput / decode floors with the KV
# cache in bf16 and in fp8. Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_merge_check.sh
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 170 python -m pytest -q -p no:cacheprovider -x --timeout 120 tests/kernels/test_fp8_kv.py \
  tests/kernels/test_attention.py tests/kernels/test_kv_write.py tests/kernels/test_fused_ops.py \
  tests/kernels/test_piecewise_graphs.py tests/kernels/test_model_triton.py > "$OUT/gpu_kernel_tests.txt" 2>&1
tail -2 "$OUT/gpu_kernel_tests.txt"
timeout 120 python -m pytest -q -p no:cacheprovider --timeout 100 tests/unit/test_spec_decode.py \
  tests/unit/test_fp8_kv_cache.py tests/unit/test_sampler.py -k "not embedded and not copy_prompt" \
  > "$OUT/gpu_engine_tests.txt" 2>&1
tail -2 "$OUT/gpu_engine_tests.txt"
for kv in auto fp8; do
  timeout 140 python benchmarks/gpu_run.py perf --workloads single,throughput,floor --lean-single \
    --kv-cache-dtype $kv --out "$OUT/perf_kv_$kv.json" > "$OUT/perf_kv_$kv.log" 2>&1
  python - "$OUT/perf_kv_$kv.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["kv_cache_dtype"], "blocks", d.get("num_kv_blocks"), "single", round(d.get("single", {}).get("decode_tok_s", 0), 1),
      "throughput", round(d.get("throughput", {}).get("output_tok_s", 0)),
      "floor", [(f["batch"], f["ctx"], round(f["replay_ms"], 3)) for f in d.get("decode_floor", []) if isinstance(f, dict)])
PY
  tail -1 "$OUT/perf_kv_$kv.log" | cut -c1-300
done
