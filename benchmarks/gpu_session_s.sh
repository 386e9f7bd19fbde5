#!/usr/bin/env bash
# Session 2026-12-07b, in parts (PARTS, in the order given):
#   tests13: the GPU tests of the piecewise graphs (padded steps run eagerly at their own size) and decode graphs
#   serve13: `tachyon serve` llama3-8b measured by vLLM's client and `tachyon bench serve`, c16 and Poisson 20
#            req/s (LOADS13), as issue 13's run 22 (carry .whl and .peer-bench)
#   diag13: issue 13's Poisson point in-process (llama3-8b bf16, 20 req/s, 512 in / 256 out) with the device
#           timeline (each step's device time, the idle time between steps, a kernel profile of 40 steps mid-run)
#           and the decode floor (graph replays at batch x context), to split run 22's 7.01 ms TPOT into decode
#           steps, mixed steps and idle device time
#   70b:    gpu_session_r.sh's: llama3-70b's K-major tuning at 64/256 rows with the "direct" tiles, then 70B AWQ
#           `single` and `sweep` 1/16/64/256
#   q15:    issue 15: llama3-8b's fp8/w8a8 GEMMs above 16 rows tuned on this card (64/256/4096 rows: cuBLAS against
#           the fused GEMM; run 2026-12-06b timed 1-16 rows only), then fp8 `sweep` + `throughput`, fp8 with the fp8
#           KV cache `throughput`, w8a8 `throughput` and bf16 `throughput` beside it
#   8b:     gpu_session_r.sh's: llama3-8b's AWQ shapes into the K-major table, then 8B AWQ `single` + `throughput`
# Usage (repo root, GPU machine): OUT=dir [END_S=560] PARTS="diag13 70b" bash benchmarks/gpu_session_s.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
PARTS=${PARTS:-diag13 70b}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
for part in $PARTS; do
  case $part in
    diag13)
      perf_run 8b_poisson_timeline --workloads poisson,floor --poisson-variants fine --poisson-timeline \
        --poisson-prompts 300
      python - "$OUT/perf_8b_poisson_timeline.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1])).get("poisson", {}).get("fine", {})
print("tpot", p.get("tpot_ms"), "ttft", p.get("ttft_ms"))
print(json.dumps(p.get("device_timeline"))[:1500])
for k in (p.get("kernel_window") or {}).get("kernels", [])[:14]:
    print(k)
PY
      ;;
    tests13)
      gpu_tests ${TESTS_S:-150} tests/kernels/test_piecewise_graphs.py ;;
    serve13)  # carry .whl and .peer-bench: vLLM's client then `tachyon bench serve`, c16 and Poisson 20 req/s
      [ $SECONDS -lt $((END - 200)) ] || { echo "== serve13: no time left"; continue; }
      PEER=1 LOADS="${LOADS13:-c16 poisson20}" timeout $((END - SECONDS - 20)) bash benchmarks/h200_serve.sh \
        2>&1 | tail -30
      grep -iE "eagerly|error" "$OUT/server.log" | head -5; mv "$OUT/server.log" "$OUT/server13.log" ;;
    70b) awq70b_direct ;;
    q15) issue15_curves ;;
    8b)
      tune_kmajor 8b ${TUNE8_S:-110} --models llama3-8b --rows 1,16,64
      perf_run 8b_awq --quantization awq --workloads single,throughput ;;
  esac
done
pack_logs
