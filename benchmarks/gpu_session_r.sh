#!/usr/bin/env bash
# Next after run 32 (any Hopper card; the bars are H200 figures):
#   1. benchmarks/awq_mma.py for llama3-8b's AWQ shapes at 1/16/64 rows -> this GPU's "awq_kmajor" table (8B ran the
#      default K-major config in run 32 and still beat the natural layout by 10% at one row)
#   2. llama3-8b AWQ `single` and `throughput` on that table (run 32: 324.5 tok/s, 10,580 out tok/s)
#   3. the seeds' pairing on the tuned K-major target: 70B AWQ + 8B draft, k = 4, drafts of acceptance ~0.8/~0.5
#      (a 2-16-row 70B step replays in 17.0-18.1 ms against 15.2 at one row on the H200), the draft AWQ (324.5 tok/s
#      alone) and, with the time left, bf16 (the draft no longer inherits the target's --quantization)
#   4. with the time left, issue 15: llama3-8b fp8 `sweep` and `throughput` (the KV pool grew with the budget fix)
# Usage (repo root, GPU machine): OUT=dir [END_S=560] [BENCH_S=110] bash benchmarks/gpu_session_r.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
GPU=$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))")
TUNED=tachyon/kernels/quant_tuned/$GPU.json
timeout ${BENCH_S:-110} python benchmarks/awq_mma.py --models llama3-8b --rows 1,16,64 \
  --budget-s $((${BENCH_S:-110} - 30)) --out "$OUT/awq_mma_8b.json" --write-tuned "$TUNED" > "$OUT/awq_mma.log" 2>&1
echo "awq_mma rc=$?"; grep -E "M=|Error" "$OUT/awq_mma.log" | cut -c1-330 | head -12
cp "$TUNED" "$OUT/tuned_$GPU.json"
perf_run 8b_awq --quantization awq --workloads single,throughput
for DQ in awq none; do
  [ $SECONDS -lt $((END - 200)) ] || break
  timeout $((END - SECONDS - 60)) python benchmarks/spec_decode_gpu.py --model benchmarks/models/llama3-70b.json \
    --quantization awq --draft benchmarks/models/llama3-8b.json --draft-quantization $DQ --num-kv-blocks 1000 \
    --batches 1 --k 4 --fidelity 0.92,0.8 --trust-replay --out "$OUT/spec_decode_70b_awq_8b_${DQ}_draft.json" \
    > "$OUT/spec_70b_$DQ.log" 2>&1
  echo "spec 70b, $DQ draft rc=$?"; grep -E "batch|Error|startup" "$OUT/spec_70b_$DQ.log" | cut -c1-220 | tail -6
done
perf_run 8b_fp8_curve --quantization fp8 --workloads sweep,throughput
pack_logs
