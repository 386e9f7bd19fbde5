#!/usr/bin/env bash
# A short call (the session's last device minutes): issue 21's gateway overhead on the device's 16 cores, the GPU
# tests of the tensor-core small-rows kernel and of sampling without stream syncs, the small-rows configs of
# llama3-8b's shapes (written to the tuned table), and llama3-8b fp8 `single` with that table.
# Usage (repo root, GPU machine, carry .whl): OUT=dir bash benchmarks/gpu_issue15_e.sh  (at most 8 files under $OUT)
set -u
export PYTHONPATH=.
mkdir -p /tmp/site && python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/pydantic-2*.whl .whl/pydantic_core-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl \
  .whl/fastapi-*.whl .whl/starlette-*.whl .whl/uvicorn-*.whl .whl/opentelemetry_api-*.whl > /dev/null 2>&1
PYTHONPATH=.:/tmp/site timeout 75 python benchmarks/gateway_overhead.py --concurrency 64 --requests 1280 --repeats 2 \
  --out "$OUT/gateway_overhead_16cores" > /tmp/gateway.log 2>&1
echo "gateway rc=$?"; tail -3 /tmp/gateway.log | cut -c1-200; tail -2 "$OUT/gateway_overhead_16cores.md" | cut -c1-400
timeout 50 python -m pytest -q -p no:cacheprovider tests/kernels/test_scaled_linear.py tests/kernels/test_sampler_no_sync.py \
  > "$OUT/gpu_tests.txt" 2>&1
tail -3 "$OUT/gpu_tests.txt"; grep "^E   " "$OUT/gpu_tests.txt" | sort | uniq -c | sort -rn | head -5 | cut -c1-200
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout 75 python benchmarks/scaled_kernels.py --rows 1 --config-rows 1 --models llama3-8b --budget-s 55 --out "$OUT/scaled_kernels.json" \
  --write-tuned "$TUNED" > "$OUT/scaled_kernels.log" 2>&1
echo "scaled_kernels rc=$?"; cp "$TUNED" "$OUT/"; grep "^walk\|^llama" "$OUT/scaled_kernels.log" | cut -c1-250
timeout $((300 - SECONDS)) python benchmarks/gpu_run.py perf --lean-single --quantization fp8 --workloads single \
  --out "$OUT/perf_8b_fp8.json" > "$OUT/perf_8b_fp8.log" 2>&1
echo "fp8 rc=$?"; grep -E "\] single |Error" "$OUT/perf_8b_fp8.log" | cut -c1-250
