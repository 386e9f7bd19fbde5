#!/usr/bin/env bash
# Issue 15 on the GPU, part A: the W8A8 kernels' GPU tests (bf16, fp8), the per-layer timing table
# (benchmarks/scaled_kernels.py), then llama3-8b fp8 `single` and `throughput` (random E4M3 weights).
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_issue15.sh
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
timeout 150 python -m pytest -q -p no:cacheprovider tests/kernels/test_scaled_linear.py > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
timeout 200 python benchmarks/scaled_kernels.py --out "$OUT/scaled_kernels.json" --budget-s 150 > "$OUT/scaled_kernels.log" 2>&1
tail -5 "$OUT/scaled_kernels.log" | cut -c1-400
timeout $((580 - SECONDS)) python benchmarks/gpu_run.py perf --quantization fp8 --workloads ${WORKLOADS:-single,throughput} \
  --lean-single --out "$OUT/perf_8b_fp8.json" > "$OUT/perf_fp8.log" 2>&1
grep -E "startup|single|throughput|Error|Traceback|tok/s" "$OUT/perf_fp8.log" | cut -c1-300 | tail -12
tail -3 "$OUT/perf_fp8.log" | cut -c1-300
