#!/usr/bin/env bash
# One call after gpu_issue19_21_16.sh and gpu_issue15_e.sh:
#   1. issue 21: the gateway's overhead again, the client spread over processes (one httpx process saturated)
#   2. issue 16: speculative decoding with the back-off that follows the running mean of accepted tokens
#   3. issue 15: llama3-8b fp8 `sweep` (1/16/64/256) and `random`, and bf16 the same on the same card (the ratios)
# Usage (repo root, GPU machine, carry .whl): OUT=dir [END_S=540] bash benchmarks/gpu_session_d.sh
set -u
export PYTHONPATH=.
END=${END_S:-540}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
mkdir -p /tmp/site && python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/pydantic-2*.whl .whl/pydantic_core-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl \
  .whl/fastapi-*.whl .whl/starlette-*.whl .whl/uvicorn-*.whl .whl/opentelemetry_api-*.whl > /dev/null 2>&1
PYTHONPATH=.:/tmp/site timeout 100 python benchmarks/gateway_overhead.py --concurrency 64 --requests 1280 --repeats 2 \
  --out "$OUT/gateway_overhead_16cores" > "$OUT/gateway.log" 2>&1
echo "gateway rc=$?"; tail -6 "$OUT/gateway_overhead_16cores.md" 2>/dev/null | cut -c1-300
timeout 200 python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 --fidelity 1,0.3 --backoff 0,32 --trust-replay \
  --out "$OUT/spec_decode.json" > "$OUT/spec_decode.log" 2>&1
echo "spec rc=$?"; grep -E "batch|Error" "$OUT/spec_decode.log" | cut -c1-200 | tail -12
run() {  # name, args...
  local name=$1; shift
  [ $SECONDS -lt $((END - 60)) ] || { echo "== $name: no time left"; return; }
  timeout $((END - SECONDS)) python benchmarks/gpu_run.py perf --lean-single --out "$OUT/perf_$name.json" "$@" \
    > "$OUT/perf_$name.log" 2>&1
  echo "== $name rc=$?"; grep -E "\] (sweep|random) |Error" "$OUT/perf_$name.log" | cut -c1-160 | tail -6
}
run 8b_fp8_sweep_random --quantization fp8 --workloads sweep,random --sweep-concurrency 1,16,64,256
run 8b_bf16_sweep_random --workloads sweep,random --sweep-concurrency 1,16,64,256
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
ls "$OUT"
