#!/usr/bin/env bash
# Issue 15 on the GPU, part B: llama3-8b w8a8 `single` and `throughput`, bf16 `single` and `throughput` on the
# same machine (the ratios' base), then fp8 `sweep` (1/16/64/256) and `random` as the time left allows.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_issue15_b.sh
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
run() {  # name, seconds, args...
  local name=$1 secs=$2; shift 2
  timeout $secs python benchmarks/gpu_run.py perf --lean-single --out "$OUT/perf_$name.json" "$@" > "$OUT/perf_$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "single|throughput|sweep|random|Error|Traceback" "$OUT/perf_$name.log" | cut -c1-300 | tail -8
}
run 8b_w8a8 170 --quantization w8a8 --workloads single,throughput
run 8b_bf16 150 --workloads single,throughput
run 8b_fp8_sweep_random $((585 - SECONDS)) --quantization fp8 --workloads sweep,random --sweep-concurrency 1,16,64,256
