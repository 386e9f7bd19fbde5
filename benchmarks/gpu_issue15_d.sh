#!/usr/bin/env bash
# Issue 15 on the GPU, second round: GPU tests, the small-rows configs (walk vs tensor-core dot) measured per shape and
# written to the tuned table the engine reads, then llama3-8b fp8 / w8a8 `single` + `throughput`, bf16 `throughput`,
# fp8 `throughput` with the fp8 KV cache.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_issue15_d.sh
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
timeout 100 python -m pytest -q -p no:cacheprovider tests/kernels/test_scaled_linear.py tests/kernels/test_sampler_no_sync.py \
  > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout 170 python benchmarks/scaled_kernels.py --rows 1,16,256,4096 --budget-s 140 --out "$OUT/scaled_kernels.json" \
  --write-tuned "$TUNED" > "$OUT/scaled_kernels.log" 2>&1
echo "scaled_kernels rc=$?"; cp "$TUNED" "$OUT/"
grep -v "^walk" "$OUT/scaled_kernels.log" | cut -c1-300 | tail -8; grep "^walk" "$OUT/scaled_kernels.log" | cut -c1-160
run() {  # name, seconds, args...
  local name=$1 secs=$2; shift 2
  timeout $secs python benchmarks/gpu_run.py perf --lean-single --out "$OUT/perf_$name.json" "$@" > "$OUT/perf_$name.log" 2>&1
  echo "== $name rc=$?"; grep -iE "\] (single|throughput) |Error|Traceback" "$OUT/perf_$name.log" | cut -c1-200 | tail -4
}
run 8b_fp8 130 --quantization fp8 --workloads single,throughput
run 8b_w8a8 120 --quantization w8a8 --workloads single,throughput
run 8b_bf16 100 --workloads throughput
run 8b_fp8_kvfp8 $((590 - SECONDS)) --quantization fp8 --kv-cache-dtype fp8 --workloads throughput
