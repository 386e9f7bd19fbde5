# Shared by the benchmarks/gpu_*.sh device scripts: `. benchmarks/gpu_lib.sh` from the repo root, with OUT (the
# folder that comes back) and END (seconds the script may run) set. .whl (gitignored) holds the wheels the GPU
# image lacks, for its Python 3.12; the `pip download` line that makes it is in gpu_issue15_e.sh's header.

install_site() {  # the web stack (fastapi imports opentelemetry) and any further wheels given -> /tmp/site
  mkdir -p /tmp/site && python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .whl/pydantic-2*.whl .whl/pydantic_core-*.whl .whl/annotated_types-*.whl .whl/typing_inspection-*.whl \
    .whl/fastapi-*.whl .whl/starlette-*.whl .whl/uvicorn-*.whl .whl/opentelemetry_api-*.whl "$@" > /dev/null 2>&1
}

gateway_overhead() {  # timeout_s: issue 21's gateway vs direct at 64 streams (no GPU involved)
  PYTHONPATH=.:/tmp/site timeout "$1" python benchmarks/gateway_overhead.py --concurrency 64 --requests 1280 \
    --repeats 2 --out "$OUT/gateway_overhead_16cores" > "$OUT/gateway.log" 2>&1
  echo "gateway rc=$?"; tail -7 "$OUT/gateway_overhead_16cores.md" 2>/dev/null | cut -c1-300
}

gpu_tests() {  # timeout_s, test files...: the tests on the card, a summary line and the commonest errors
  local t=$1; shift
  timeout "$t" python -m pytest -q -p no:cacheprovider "$@" > "$OUT/gpu_tests.log" 2>&1
  tail -1 "$OUT/gpu_tests.log"; grep "^E   " "$OUT/gpu_tests.log" | sort | uniq -c | sort -rn | head -5 | cut -c1-200
}

tune_scaled() {  # timeout_s, rows, config rows: llama3-8b's fp8/w8a8 layers timed, the fastest configs merged into
  # tachyon/kernels/quant_tuned/<GPU>.json (which the engine then reads; returned as $OUT/tuned_<GPU>.json)
  local tuned
  tuned=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
  timeout "$1" python benchmarks/scaled_kernels.py --models llama3-8b --rows "$2" --config-rows "$3" \
    --budget-s $(($1 - 20)) --out "$OUT/scaled_kernels.json" --write-tuned "$tuned" > "$OUT/scaled_kernels.log" 2>&1
  echo "scaled_kernels rc=$?"; cp "$tuned" "$OUT/tuned_$(basename "$tuned")"
  grep -E "^(walk|gemm)" "$OUT/scaled_kernels.log" | cut -c1-170
}

tune_kmajor() {  # name, timeout_s, awq_mma.py args...: the K-major INT4 configs timed, the fastest merged into
  # tachyon/kernels/quant_tuned/<GPU>.json under "awq_kmajor" (returned as $OUT/tuned_<GPU>.json)
  local name=$1 t=$2 tuned; shift 2
  tuned=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
  timeout "$t" python benchmarks/awq_mma.py --budget-s $((t - 30)) --out "$OUT/awq_mma_$name.json" \
    --write-tuned "$tuned" "$@" > "$OUT/awq_mma_$name.log" 2>&1
  echo "awq_mma $name rc=$?"; grep -E "M=|Error" "$OUT/awq_mma_$name.log" | cut -c1-330 | head -12
  cp "$tuned" "$OUT/tuned_$(basename "$tuned")"
}

perf_run() {  # name, gpu_run.py perf args...: until END, skipped with under 60 s left
  local name=$1; shift
  [ $SECONDS -lt $((END - 60)) ] || { echo "== $name: no time left"; return; }
  timeout $((END - SECONDS)) python benchmarks/gpu_run.py perf --lean-single --out "$OUT/perf_$name.json" "$@" \
    > "$OUT/perf_$name.log" 2>&1
  echo "== $name rc=$?"
  grep -E "\] (single|throughput|sweep|random) |Error" "$OUT/perf_$name.log" | cut -c1-200 | tail -6
}

pack_logs() {  # at most 8 files come back: the logs travel as one
  (cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
  ls "$OUT"
}

awq70b_direct() {  # llama3-70b's K-major tiles timed at 64/256 rows (the direct ones first), then 70B AWQ
  # `single` and `sweep` 1/16/64/256 (512 in / 128 out) on the table that made
  tune_kmajor 70b_m64 ${TUNE70_S:-120} --models llama3-70b --rows 64,256
  perf_run 70b_awq --model llama3-70b --quantization awq --workloads single,sweep \
    --sweep-concurrency 1,16,64,256 --sweep-out 128
}

issue15_curves() {  # llama3-8b's fp8/w8a8 linears tuned (GEMMs at 64/256/4096 rows, every small-rows config at 4
  # and 16 rows: the weight-only "wo" kind is new), then fp8 sweep + throughput, fp8 with the fp8 KV cache, w8a8 and
  # bf16 throughput
  tune_scaled ${TUNE15_S:-240} ${TUNE15_ROWS:-64,256,4096} "${TUNE15_CONFIG_ROWS-4,16}"
  perf_run 8b_fp8 --quantization fp8 --workloads sweep,throughput
  perf_run 8b_fp8_kvfp8 --quantization fp8 --kv-cache-dtype fp8 --workloads throughput
  perf_run 8b_w8a8 --quantization w8a8 --workloads throughput
  perf_run 8b_bf16 --workloads throughput
}
