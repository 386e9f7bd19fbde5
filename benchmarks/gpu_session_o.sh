#!/usr/bin/env bash
# The new kernels' first GPU run, short (any Hopper card; an H100 when no H200 comes):
#   1. GPU tests: the walks summing their own K splits (TACHYON_SPLIT_FINISH) and tachyon/kernels/awq_mma.py
#   2. benchmarks/split_finish.py: second-kernel sum vs in-walk sum, per layer (70B AWQ, 8B fp8), PDL off/on
#   3. benchmarks/awq_mma.py at 1 and 16 rows for llama3-70b (the 2-warp mma.sync candidates and the K-major walk
#      timed for the first time) -> this GPU's table "awq_kmajor" entries (returned as tuned_<GPU>.json)
# Usage (repo root, GPU machine): OUT=dir [TEST_S=100] [FINISH_S=90] [BENCH_S=130] bash benchmarks/gpu_session_o.sh
set -u
export PYTHONPATH=.
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests ${TEST_S:-100} tests/kernels/test_split_finish.py tests/kernels/test_awq_mma.py
timeout ${FINISH_S:-90} python benchmarks/split_finish.py --out "$OUT/split_finish.json" > "$OUT/split_finish.log" 2>&1
echo "split_finish rc=$?"; grep -vE "^ *[{}]" "$OUT/split_finish.log" | cut -c1-200 | tail -20
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout ${BENCH_S:-130} python benchmarks/awq_mma.py --models llama3-70b --rows 1,16 --budget-s $((${BENCH_S:-130} - 30)) \
  --out "$OUT/awq_mma.json" --write-tuned "$TUNED" > "$OUT/awq_mma.log" 2>&1
echo "awq_mma rc=$?"; grep -E "M=|Error" "$OUT/awq_mma.log" | cut -c1-330 | head -12
[ -f "$TUNED" ] && cp "$TUNED" "$OUT/tuned_$(basename "$TUNED")"
pack_logs
