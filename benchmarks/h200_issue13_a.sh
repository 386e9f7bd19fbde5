#!/usr/bin/env bash
# Issue 13 on the H200, part A: the GPU tests of the one step path (steps in flight with CUDA events,
# piecewise graphs for mixed steps), the Triton-vs-torch logits check of every step kind, and the offline
# llama3-8b workloads. Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_issue13_a.sh
set -u
export PYTHONPATH=.
python -m pytest -q -p no:cacheprovider tests/kernels/test_piecewise_graphs.py tests/kernels/test_model_triton.py \
  tests/unit/test_steps_in_flight.py tests/unit/test_scheduler.py tests/unit/test_engine_wall.py \
  > "$OUT/gpu_tests.txt" 2>&1
grep -E "passed|failed|error" "$OUT/gpu_tests.txt" | tail -3
python benchmarks/gpu_run.py correctness --out "$OUT/corr.json" > "$OUT/corr.log" 2>&1
grep -E "triton_vs_torch|greedy" "$OUT/corr.log" | cut -c1-600
python benchmarks/gpu_run.py perf --workloads single,throughput --out "$OUT/perf.json" > "$OUT/perf.log" 2>&1
python - "$OUT/perf.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("startup", d.get("startup_breakdown"))
print("single", round(d["single"]["decode_tok_s"], 1), "by depth", d["single"].get("by_num_scheduler_steps"))
print("throughput", round(d["throughput"]["output_tok_s"]), d["throughput"].get("steps"))
PY
tail -3 "$OUT/perf.log"
