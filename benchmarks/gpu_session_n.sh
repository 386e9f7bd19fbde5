#!/usr/bin/env bash
# Issue 14, the K-major INT4 path end to end with the per-layer table of run 29 (quant_tuned/<GPU>.json "awq_kmajor"):
#   1. the GPU tests of tachyon/kernels/awq_mma.py (run 29 cut them at 70 s after 29 passed) and of the walks
#      summing their own K splits (TACHYON_SPLIT_FINISH); benchmarks/split_finish.py: that A/B per layer
#   1b. benchmarks/awq_mma.py at 1/2/4/16 rows (the K-major one-row walk "walk" is new: never timed) -> the table's
#      "awq_kmajor" entries (returned as tuned_<GPU>.json)
#   2. TACHYON_AWQ_MMA=1 llama3-70b AWQ `single` and `sweep` 1/16/64/256 (512 in / 128 out; vLLM awq_marlin:
#      48.3 tok/s, 46 / 478 / 838 / 1,027)
#   3. with the time left, the seeds' pairing again on the K-major target: 70B AWQ + 8B draft, acceptance ~0.8/~0.5
#      (the verification of 5 tokens cost 1.92 decode steps with the old kernels)
# Usage (repo root, GPU machine): OUT=dir [END_S=570] bash benchmarks/gpu_session_n.sh
set -u
export PYTHONPATH=.
END=${END_S:-570}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests ${TEST_S:-100} tests/kernels/test_split_finish.py tests/kernels/test_awq_mma.py
timeout ${FINISH_S:-90} python benchmarks/split_finish.py --out "$OUT/split_finish.json" > "$OUT/split_finish.log" 2>&1
echo "split_finish rc=$?"; grep -E "equal|Error" "$OUT/split_finish.log" | cut -c1-200 | head -10
# the 70B runs below sum their K splits inside the walks if that measured >= 2% faster for 70B's layers (with PDL)
if python - "$OUT/split_finish.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["one_layer_linears_ms"]
sys.exit(0 if d["finish_pdl"]["llama3-70b"] < 0.98 * d["sum_kernel_pdl"]["llama3-70b"] else 1)
PY
then export TACHYON_SPLIT_FINISH=1; echo "== the 70B runs with TACHYON_SPLIT_FINISH=1"; fi
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout ${BENCH_S:-110} python benchmarks/awq_mma.py --models llama3-70b --rows 1,2,4,16 --budget-s 80 \
  --out "$OUT/awq_mma.json" --write-tuned "$TUNED" > "$OUT/awq_mma.log" 2>&1
echo "awq_mma rc=$?"; grep -E "M=|Error" "$OUT/awq_mma.log" | cut -c1-300 | head -16; cp "$TUNED" "$OUT/tuned_$(basename "$TUNED")"
export TACHYON_AWQ_MMA=1
timeout $((END - SECONDS - 200)) python benchmarks/gpu_run.py perf --model llama3-70b --quantization awq --lean-single \
  --workloads single,sweep --sweep-concurrency 1,16,64,256 --sweep-out 128 --out "$OUT/perf_70b_awq_kmajor.json" \
  > "$OUT/perf_70b.log" 2>&1
echo "70b rc=$?"; grep -E "startup|\] (single|sweep) |Error|Traceback" "$OUT/perf_70b.log" | cut -c1-300 | tail -8
if [ $SECONDS -lt $((END - 150)) ]; then
  timeout $((END - SECONDS)) python benchmarks/spec_decode_gpu.py --model benchmarks/models/llama3-70b.json \
    --quantization awq --draft benchmarks/models/llama3-8b.json --num-kv-blocks 1000 --batches 1 --k 4 \
    --fidelity 0.92,0.8 --trust-replay --out "$OUT/spec_decode_70b_awq_kmajor_8b_draft.json" > "$OUT/spec_70b.log" 2>&1
  echo "spec 70b rc=$?"; grep -E "batch|Error|startup" "$OUT/spec_70b.log" | cut -c1-220 | tail -6
fi
pack_logs
