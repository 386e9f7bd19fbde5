#!/usr/bin/env bash
# The short form of gpu_session_f.sh, for a session with ~6 minutes of device time left (issue 15):
#   1. GPU tests of the scaled kernels (the "lwalk" row walk in bf16 and fp8, which the interpreter cannot run)
#   2. llama3-8b's layers at 1/4/16 rows: every small-rows config, the fastest merged into
#      tachyon/kernels/quant_tuned/<GPU>.json (returned as tuned_<GPU>.json); no GEMM rows (cuBLAS stays above 16)
#   3. llama3-8b fp8 `single`, w8a8 `single`, then fp8 `throughput` with the time left
# Usage (repo root, GPU machine): OUT=dir [END_S=330] bash benchmarks/gpu_session_g.sh
set -u
export PYTHONPATH=.
END=${END_S:-330}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests 45 tests/kernels/test_scaled_linear.py
tune_scaled 120 1,16 1,4,16
perf_run 8b_fp8 --quantization fp8 --workloads single
perf_run 8b_w8a8 --quantization w8a8 --workloads single
perf_run 8b_fp8_tp --quantization fp8 --workloads throughput
pack_logs
