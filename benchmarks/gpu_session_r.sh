#!/usr/bin/env bash
# Next after run 32 (any Hopper card; the bars are H200 figures), in parts (PARTS, default all, in this order):
#   70b:  benchmarks/awq_mma.py for llama3-70b at 64 rows with the "direct" K-major tiles (DIRECT_CONFIGS, never
#         run on a GPU: half the SASS instructions a weight value of the epilogue kernel at 64 rows) -> the "gemm"
#         entries of this GPU's table (and at 256 rows, beside dequant + cuBLAS, reported only); then llama3-70b
#         AWQ `single` and `sweep` 1/16/64/256 on it (run 32: 65.5 tok/s; 61.9 / 511.8 / 587.6 / 813.2 out tok/s;
#         the 64-row step replayed in 56.5 ms)
#   8b:   the same tuning for llama3-8b's AWQ shapes at 1/16/64 rows (8B ran the untuned default in run 32), then
#         llama3-8b AWQ `single` and `throughput` (run 32: 324.5 tok/s, 10,580 out tok/s)
#   spec: the seeds' pairing on the tuned K-major target: 70B AWQ + 8B draft, k = 4, acceptance ~0.8/~0.5, the
#         draft AWQ then bf16 (a draft no longer inherits the target's --quantization)
#   fp8:  issue 15, llama3-8b fp8 `sweep` and `throughput` (the KV pool grew with the budget fix)
# Usage (repo root, GPU machine): OUT=dir [END_S=560] [PARTS="70b 8b spec fp8"] bash benchmarks/gpu_session_r.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
PARTS=${PARTS:-70b 8b spec fp8}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
for part in $PARTS; do
  case $part in
    70b)
      tune_kmajor 70b_m64 ${TUNE70_S:-120} --models llama3-70b --rows 64,256  # 256: reported only (dequant serves it)
      perf_run 70b_awq --model llama3-70b --quantization awq --workloads single,sweep \
        --sweep-concurrency 1,16,64,256 --sweep-out 128 ;;
    8b)
      tune_kmajor 8b ${TUNE8_S:-110} --models llama3-8b --rows 1,16,64
      perf_run 8b_awq --quantization awq --workloads single,throughput ;;
    spec)
      for DQ in awq none; do
        [ $SECONDS -lt $((END - 200)) ] || break
        timeout $((END - SECONDS - 60)) python benchmarks/spec_decode_gpu.py --model benchmarks/models/llama3-70b.json \
          --quantization awq --draft benchmarks/models/llama3-8b.json --draft-quantization $DQ --num-kv-blocks 1000 \
          --batches 1 --k 4 --fidelity 0.92,0.8 --trust-replay --out "$OUT/spec_decode_70b_awq_8b_${DQ}_draft.json" \
          > "$OUT/spec_70b_$DQ.log" 2>&1
        echo "spec 70b, $DQ draft rc=$?"; grep -E "batch|Error|startup" "$OUT/spec_70b_$DQ.log" | cut -c1-220 | tail -6
      done ;;
    fp8)
      perf_run 8b_fp8_curve --quantization fp8 --workloads sweep,throughput ;;
  esac
done
pack_logs
