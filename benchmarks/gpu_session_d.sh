#!/usr/bin/env bash
# One call after gpu_issue19_21_16.sh and gpu_issue15_e.sh:
#   1. issue 21: the gateway's overhead again, the client spread over processes (one httpx process saturated)
#   2. issue 16: speculative decoding with the back-off that follows the running mean of accepted tokens
#   3. issue 15: llama3-8b fp8 `sweep` (1/16/64/256) and `random`, and bf16 the same on the same card (the ratios)
# Usage (repo root, GPU machine, carry .whl): OUT=dir [END_S=540] bash benchmarks/gpu_session_d.sh
set -u
export PYTHONPATH=.
END=${END_S:-540}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
install_site
gateway_overhead 100
timeout 200 python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 --fidelity 1,0.3 --backoff 0,32 --trust-replay \
  --out "$OUT/spec_decode.json" > "$OUT/spec_decode.log" 2>&1
echo "spec rc=$?"; grep -E "batch|Error" "$OUT/spec_decode.log" | cut -c1-200 | tail -12
perf_run 8b_fp8_sweep_random --quantization fp8 --workloads sweep,random --sweep-concurrency 1,16,64,256
perf_run 8b_bf16_sweep_random --workloads sweep,random --sweep-concurrency 1,16,64,256
pack_logs
