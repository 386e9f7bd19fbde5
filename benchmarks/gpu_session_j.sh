#!/usr/bin/env bash
# Issue 15 on an H200 in one call, every workload it names (no GPU test run: the tuner checks each config's output
# against the reference and installs none that disagrees):
#   1. llama3-8b's layers: small-rows configs at 1/4/16 rows (qwalk/qdot, larger walks, cuBLAS among them) and the
#      GEMM configs at 256/4096 rows, merged into tachyon/kernels/quant_tuned/<GPU>.json (returned as tuned_<GPU>.json)
#   2. llama3-8b fp8 `single`, `sweep`, `throughput`, `random`
#   3. llama3-8b w8a8 `single`, `throughput`
#   4. llama3-8b fp8, then w8a8, with the fp8 KV cache `throughput`
#   5. llama3-8b w8a8 `sweep`, `random` (each step runs only with a minute left before END_S)
# Usage (repo root, GPU machine): OUT=dir [END_S=580] [TUNE_S=220] [TUNE_ROWS=1,256,4096] [TUNE_CFG_ROWS=1,4,16]
#   [FP8_WL=single,sweep,throughput,random] bash benchmarks/gpu_session_j.sh
set -u
export PYTHONPATH=.
END=${END_S:-580}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
tune_scaled ${TUNE_S:-220} ${TUNE_ROWS:-1,256,4096} ${TUNE_CFG_ROWS:-1,4,16}
grep -E "^(WRONG|FAILED)" "$OUT/scaled_kernels.log" | cut -c1-200 | head -5
perf_run 8b_fp8 --quantization fp8 --workloads ${FP8_WL:-single,sweep,throughput,random}
perf_run 8b_w8a8 --quantization w8a8 --workloads single,throughput
perf_run 8b_fp8_kvfp8 --quantization fp8 --kv-cache-dtype fp8 --workloads throughput
perf_run 8b_w8a8_kvfp8 --quantization w8a8 --kv-cache-dtype fp8 --workloads throughput
perf_run 8b_w8a8_curve --quantization w8a8 --workloads sweep,random
pack_logs
