#!/usr/bin/env bash
# Issue 15 on the GPU in one call: GPU tests of the W8A8 kernels and of sampling without stream syncs, a short
# per-layer table (scaled_kernels.py), then llama3-8b fp8 `single` + `throughput`, w8a8 `single`, bf16 `single`.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_issue15_c.sh
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
timeout 110 python -m pytest -q -p no:cacheprovider tests/kernels/test_scaled_linear.py tests/kernels/test_sampler_no_sync.py \
  > "$OUT/gpu_tests.txt" 2>&1
tail -4 "$OUT/gpu_tests.txt"
timeout 90 python benchmarks/scaled_kernels.py --rows 1,16,64,256,4096 --budget-s 60 --out "$OUT/scaled_kernels.json" \
  > "$OUT/scaled_kernels.log" 2>&1
grep -v "^walk" "$OUT/scaled_kernels.log" | cut -c1-330 | tail -14
run() {  # name, seconds, args...
  local name=$1 secs=$2; shift 2
  timeout $secs python benchmarks/gpu_run.py perf --lean-single --out "$OUT/perf_$name.json" "$@" > "$OUT/perf_$name.log" 2>&1
  echo "== $name rc=$?"; grep -iE "single|throughput|Error|Traceback" "$OUT/perf_$name.log" | cut -c1-250 | tail -5
}
run 8b_fp8 200 --quantization fp8 --workloads single,throughput
run 8b_w8a8 $(( (590 - SECONDS) / 2 )) --quantization w8a8 --workloads single
run 8b_bf16 $((590 - SECONDS)) --workloads single
