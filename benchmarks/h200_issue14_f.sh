#!/usr/bin/env bash
# Issue 14 on the H200, part F: llama3-70b AWQ `single` and `sweep` (1/16/64/256, 512 in / 128 out: vLLM's anchor
# shape) with the committed tuned table (tachyon/kernels/quant_tuned/NVIDIA_H200.json), in one call.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_issue14_f.sh
set -u
export PYTHONPATH=.
timeout 570 python benchmarks/gpu_run.py perf --model llama3-70b --quantization awq --workloads single,sweep \
  --lean-single --single-out 256 --sweep-concurrency 1,16,64,256 --sweep-out 128 \
  --out "$OUT/perf_70b_awq.json" > "$OUT/70b.log" 2>&1
grep -E "startup|single|sweep|Error|Traceback" "$OUT/70b.log" | cut -c1-400 | grep -v gemv
tail -5 "$OUT/70b.log" | cut -c1-400
