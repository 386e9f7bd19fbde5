#!/usr/bin/env bash
# Issue 15 on the GPU, second round: GPU tests, the small-rows configs (walk vs tensor-core dot) measured per shape and
# written to the tuned table the engine reads, then llama3-8b fp8 / w8a8 `single` + `throughput`, bf16 `throughput`,
# fp8 `throughput` with the fp8 KV cache.
# First, issue 21's gateway overhead on the device's 16 cores (no GPU; fastapi/starlette/uvicorn/pydantic from .whl).
# Usage (repo root, GPU machine, carry .whl): OUT=dir [END_S=590] bash benchmarks/gpu_issue15_d.sh
# (END_S: the bf16 and fp8-KV throughput runs only start while 90 s are left before it)
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
# issue 21 first (no GPU): the gateway's overhead where its cores are not shared with other jobs (16 here)
mkdir -p /tmp/site && python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/pydantic-2*.whl .whl/pydantic_core-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl \
  .whl/fastapi-*.whl .whl/starlette-*.whl .whl/uvicorn-*.whl > /dev/null 2>&1
PYTHONPATH=.:/tmp/site timeout 100 python benchmarks/gateway_overhead.py --concurrency 64 --requests 1280 --repeats 2 \
  --out "$OUT/gateway_overhead_16cores" > "$OUT/gateway.log" 2>&1
echo "gateway rc=$?"; tail -2 "$OUT/gateway.log" | cut -c1-300; tail -3 "$OUT/gateway_overhead_16cores.md" | cut -c1-400
timeout 100 python -m pytest -q -p no:cacheprovider tests/kernels/test_scaled_linear.py tests/kernels/test_sampler_no_sync.py \
  > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout 110 python benchmarks/scaled_kernels.py --rows 1,16,256,4096 --budget-s 80 --out "$OUT/scaled_kernels.json" \
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
END=${END_S:-590}
[ $SECONDS -lt $((END - 90)) ] && run 8b_bf16 $((END - SECONDS)) --workloads throughput
[ $SECONDS -lt $((END - 90)) ] && run 8b_fp8_kvfp8 $((END - SECONDS)) --quantization fp8 --kv-cache-dtype fp8 --workloads throughput
