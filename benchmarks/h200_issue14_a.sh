#!/usr/bin/env bash
# Issue 14 on the H200, part A: the quantized-linear kernels' GPU tests (bf16/fp16), then `single` decode for
# llama3-70b AWQ (512 in / 256 out, as vLLM's anchor) and llama3-8b AWQ and int8 (512 / 512), random packed
# weights, each with the per-kernel profile of one batch-1 decode graph; then the kernel timing table.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_issue14_a.sh
set -u
export PYTHONPATH=.
timeout 100 python -m pytest -q -p no:cacheprovider tests/kernels/test_quant_linear.py > "$OUT/gpu_tests.txt" 2>&1
tail -4 "$OUT/gpu_tests.txt"
P="python benchmarks/gpu_run.py perf --workloads single --lean-single"
timeout 210 $P --model llama3-70b --quantization awq --single-out 256 --out "$OUT/perf_70b_awq.json" > "$OUT/70b.log" 2>&1
grep -E "startup|single|Error|error" "$OUT/70b.log" | cut -c1-600 | grep -v gemv | tail -4
for q in awq int8; do
  timeout 80 $P --model llama3-8b --quantization $q --out "$OUT/perf_8b_$q.json" > "$OUT/8b_$q.log" 2>&1
  grep -E "single|Error|error" "$OUT/8b_$q.log" | cut -c1-400 | tail -2
done
timeout 70 python benchmarks/quant_kernels.py --budget-s 40 --out "$OUT/quant_kernels.json" > "$OUT/quant_kernels.log" 2>&1
tail -30 "$OUT/quant_kernels.log"
