#!/usr/bin/env bash
# Issue 14 on the H200, part B (what run 23 ran out of time for): every GPU kernel test of the quantized linears,
# the kernel timing table on llama3-8b/70b shapes, then llama3-70b AWQ `single` and `sweep` (1/16/64/256,
# 512 in / 128 out: vLLM's anchor shape) and llama3-8b AWQ / int8 `throughput`. Two calls if one runs past 10 min:
# PART=kernels or PART=models.
# Usage (repo root, GPU machine): OUT=dir [PART=kernels|models] bash benchmarks/h200_issue14_b.sh
set -u
export PYTHONPATH=.
if [ "${PART:-kernels}" = kernels ]; then
  timeout 300 python -m pytest -q -p no:cacheprovider tests/kernels/test_quant_linear.py > "$OUT/gpu_tests.txt" 2>&1
  tail -4 "$OUT/gpu_tests.txt"
  timeout 240 python benchmarks/quant_kernels.py --budget-s 180 --out "$OUT/quant_kernels.json" > "$OUT/quant_kernels.log" 2>&1
  tail -40 "$OUT/quant_kernels.log"
else
  timeout 420 python benchmarks/gpu_run.py perf --model llama3-70b --quantization awq --workloads single,sweep \
    --lean-single --single-out 256 --sweep-concurrency 1,16,64,256 --sweep-out 128 \
    --out "$OUT/perf_70b_awq.json" > "$OUT/70b.log" 2>&1
  grep -E "startup|single|sweep|Error" "$OUT/70b.log" | cut -c1-400 | grep -v gemv
  for q in awq int8; do
    timeout 90 python benchmarks/gpu_run.py perf --quantization $q --workloads throughput \
      --out "$OUT/perf_8b_$q.json" > "$OUT/8b_$q.log" 2>&1
    grep -E "throughput|Error" "$OUT/8b_$q.log" | cut -c1-300
  done
fi
