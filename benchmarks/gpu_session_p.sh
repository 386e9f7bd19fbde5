#!/usr/bin/env bash
# Issue 14 on the H200: the K-major INT4 path with the 2-warp mma.sync candidates (run 30 on an H100: they won most
# layers at 1 and 16 rows, and K-major beat the one-row walk there by 1.5-1.7x a layer), end to end:
#   1. the GPU tests of tachyon/kernels/awq_mma.py (bf16 on the card, every config compiled)
#   2. benchmarks/awq_mma.py at 1/16/64 rows for llama3-70b -> this GPU's "awq_kmajor" table (tuned_<GPU>.json)
#   3. TACHYON_AWQ_MMA=1 llama3-70b AWQ `single` and `sweep` 1/16/64/256 (512 in / 128 out; vLLM awq_marlin:
#      48.3 tok/s, 46 / 478 / 838 / 1,027)
# Usage (repo root, GPU machine): OUT=dir [END_S=560] [TEST_S=80] [BENCH_S=150] bash benchmarks/gpu_session_p.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests ${TEST_S:-80} tests/kernels/test_awq_mma.py
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout ${BENCH_S:-150} python benchmarks/awq_mma.py --models llama3-70b --rows 1,16,64 --budget-s $((${BENCH_S:-150} - 35)) \
  --out "$OUT/awq_mma.json" --write-tuned "$TUNED" > "$OUT/awq_mma.log" 2>&1
echo "awq_mma rc=$?"; grep -E "M=|Error" "$OUT/awq_mma.log" | cut -c1-330 | head -12
[ -f "$TUNED" ] && cp "$TUNED" "$OUT/tuned_$(basename "$TUNED")"
TACHYON_AWQ_MMA=1 perf_run 70b_awq_kmajor --model llama3-70b --quantization awq --workloads single,sweep \
  --sweep-concurrency 1,16,64,256 --sweep-out 128
pack_logs
