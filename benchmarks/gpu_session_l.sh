#!/usr/bin/env bash
# The quantizing norm and activation on a GPU in a short call: their GPU tests, then their per-call times against
# the two launches they replace (benchmarks/fused_quant_ops.py).
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_session_l.sh
set -u
export PYTHONPATH=.
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests ${TEST_S:-80} -k "quantize or w8a8 or producer or norm or silu" tests/kernels/test_fused_ops.py \
  tests/kernels/test_model_triton.py tests/kernels/test_scaled_linear.py
timeout ${OPS_S:-60} python benchmarks/fused_quant_ops.py --out "$OUT/fused_quant_ops.json" 2>&1 | tail -12
