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
timeout 45 python -m pytest -q -p no:cacheprovider tests/kernels/test_scaled_linear.py > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"; grep "^E   " "$OUT/gpu_tests.log" | sort | uniq -c | sort -rn | head -5 | cut -c1-200
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout 120 python benchmarks/scaled_kernels.py --models llama3-8b --rows 1,16 --config-rows 1,4,16 \
  --budget-s 100 --out "$OUT/scaled_kernels.json" --write-tuned "$TUNED" > "$OUT/scaled_kernels.log" 2>&1
echo "scaled_kernels rc=$?"; cp "$TUNED" "$OUT/tuned_$(basename "$TUNED")"
grep -E "^walk" "$OUT/scaled_kernels.log" | grep " 1 " | cut -c1-150
perf_run 8b_fp8 --quantization fp8 --workloads single
perf_run 8b_w8a8 --quantization w8a8 --workloads single
perf_run 8b_fp8_tp --quantization fp8 --workloads throughput
pack_logs
