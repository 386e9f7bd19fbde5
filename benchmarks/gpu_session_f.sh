#!/usr/bin/env bash
# Issue 15 on an H200 (gpu_issue15_e.sh without the gateway, which has its figure from gpu_session_e.sh):
#   1. GPU tests of the scaled kernels and the sampler
#   2. llama3-8b's layers on this card: small-rows configs (1/4/16 rows), cuBLAS vs the fused GEMM, merged into
#      tachyon/kernels/quant_tuned/<GPU>.json (the file comes back to commit; the engine reads it)
#   3. llama3-8b fp8 `single` + `throughput`, fp8 with the fp8 KV cache `throughput`, w8a8 `single` + `throughput`
#   4. issue 16 on this card, with the time left: llama3-8b k = 4 at acceptance 1 and 0 (replay fidelity 1, random),
#      batch 1 and 64, the default back-off
# Usage (repo root, GPU machine): OUT=dir [END_S=590] bash benchmarks/gpu_session_f.sh
set -u
export PYTHONPATH=.
END=${END_S:-590}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests 60 tests/kernels/test_scaled_linear.py tests/kernels/test_sampler_no_sync.py
tune_scaled 240 1,16,64,256,4096 1,4,16
perf_run 8b_fp8 --quantization fp8 --workloads single,throughput
perf_run 8b_fp8_kvfp8 --quantization fp8 --kv-cache-dtype fp8 --workloads throughput
perf_run 8b_w8a8 --quantization w8a8 --workloads single,throughput
if [ $SECONDS -lt $((END - 75)) ]; then
  timeout $((END - SECONDS)) python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 --fidelity 1 --backoff 32 \
    --trust-replay --out "$OUT/spec_decode.json" > "$OUT/spec_decode.log" 2>&1
  echo "spec rc=$?"; grep -E "batch|Error" "$OUT/spec_decode.log" | cut -c1-200 | tail -8
fi
pack_logs
