#!/usr/bin/env bash
# The K-major INT4 path as Hopper's default (no TACHYON_AWQ_MMA set), end to end, on whichever card comes:
#   H200: benchmarks/awq_mma.py at 1/16/64 rows (the 2-warp mma.sync candidates, never timed on an H200) -> this
#         GPU's "awq_kmajor" table (tuned_<GPU>.json), then llama3-70b AWQ `single` and `sweep` 1/16/64/256
#         (512 in / 128 out; vLLM awq_marlin 48.3 tok/s, 46 / 478 / 838 / 1,027)
#   else: llama3-70b AWQ `single` and `sweep` 1/4/16 on the committed table (2-4 rows now take the "skinny" entry),
#         then issue 15's A/B on llama3-8b fp8 `single`: the quantizing norm and activation (TACHYON_FUSED_QUANT=1,
#         after their GPU tests pass) against the linears quantizing their own rows
# Usage (repo root, GPU machine): OUT=dir [END_S=520] [BENCH_S=150] bash benchmarks/gpu_session_q.sh
set -u
export PYTHONPATH=.
unset TACHYON_AWQ_MMA
END=${END_S:-520}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
GPU=$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))")
if [ "$GPU" = NVIDIA_H200 ]; then
  TUNED=tachyon/kernels/quant_tuned/$GPU.json
  timeout ${BENCH_S:-150} python benchmarks/awq_mma.py --models llama3-70b --rows 1,16,64 \
    --budget-s $((${BENCH_S:-150} - 35)) --out "$OUT/awq_mma.json" --write-tuned "$TUNED" > "$OUT/awq_mma.log" 2>&1
  echo "awq_mma rc=$?"; grep -E "M=|Error" "$OUT/awq_mma.log" | cut -c1-330 | head -12
  cp "$TUNED" "$OUT/tuned_$GPU.json"
  perf_run 70b_awq --model llama3-70b --quantization awq --workloads single,sweep --sweep-concurrency 1,16,64,256 \
    --sweep-out 128
else
  perf_run 70b_awq --model llama3-70b --quantization awq --workloads single,sweep --sweep-concurrency 1,4,16 \
    --sweep-out 128
  gpu_tests ${TEST_S:-100} tests/kernels/test_fused_ops.py tests/kernels/test_model_triton.py \
    tests/kernels/test_scaled_linear.py::test_rows_quantized_by_a_producer_replace_the_quantize_launch
  if tail -1 "$OUT/gpu_tests.log" | grep -q " passed" && ! tail -1 "$OUT/gpu_tests.log" | grep -qE "failed|error"; then
    TACHYON_FUSED_QUANT=1 perf_run 8b_fp8_fused --quantization fp8 --workloads single
  fi
  TACHYON_FUSED_QUANT=0 perf_run 8b_fp8_unfused --quantization fp8 --workloads single
fi
pack_logs
