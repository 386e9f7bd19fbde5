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
