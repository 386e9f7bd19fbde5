#!/usr/bin/env bash
# Issue 15 on an H200 in one call, with the quantizing norm and activation (fused_ops `*_quant`):
#   1. GPU tests of the fused ops, the scaled kernels and the model on the Triton path; if they pass, the runs
#      below take TACHYON_FUSED_QUANT=1 (the tuner times and the engine runs the quantizing norm and activation),
#      else the default (the linears quantize their rows themselves)
#   2. llama3-8b's fp8/w8a8 layers tuned at 1/4/16 rows and 256 rows (TUNE_ROWS) -> quant_tuned/<GPU>.json (tuned_<GPU>.json)
#   3. llama3-8b fp8 `single`, then with TACHYON_FUSED_QUANT=0 (the A/B), with TACHYON_SPLIT_FINISH=1 (the walks
#      sum their own K splits), then fp8 `sweep`, `throughput`
#   4. with the time left: fp8 + fp8 KV cache `throughput`, w8a8 `single`/`throughput`, w8a8 + fp8 KV `throughput`
# Usage (repo root, GPU machine): OUT=dir [END_S=560] [TUNE_S=200] [TUNE_ROWS=1,256] [TUNE_CFG_ROWS=1,4,16]
#   [TEST_S=100] [TEST_K=pytest -k expression] bash benchmarks/gpu_session_k.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests ${TEST_S:-100} -k "${TEST_K:-not nothing}" tests/kernels/test_fused_ops.py tests/kernels/test_model_triton.py \
  tests/kernels/test_scaled_linear.py::test_rows_quantized_by_a_producer_replace_the_quantize_launch
if tail -1 "$OUT/gpu_tests.log" | grep -q " passed" && ! tail -1 "$OUT/gpu_tests.log" | grep -qE "failed|error"; then
  export TACHYON_FUSED_QUANT=1
else
  echo "== tests did not all pass: the runs below without TACHYON_FUSED_QUANT=1"
fi
tune_scaled ${TUNE_S:-200} ${TUNE_ROWS:-1,256} ${TUNE_CFG_ROWS:-1,4,16}
grep -E "^(WRONG|FAILED)" "$OUT/scaled_kernels.log" | cut -c1-200 | head -5
perf_run 8b_fp8 --quantization fp8 --workloads single
TACHYON_FUSED_QUANT=0 perf_run 8b_fp8_unfused --quantization fp8 --workloads single
TACHYON_SPLIT_FINISH=1 perf_run 8b_fp8_finish --quantization fp8 --workloads single
perf_run 8b_fp8_curve --quantization fp8 --workloads sweep,throughput
perf_run 8b_fp8_kvfp8 --quantization fp8 --kv-cache-dtype fp8 --workloads throughput
perf_run 8b_w8a8 --quantization w8a8 --workloads single,throughput
perf_run 8b_w8a8_kvfp8 --quantization w8a8 --kv-cache-dtype fp8 --workloads throughput
pack_logs
