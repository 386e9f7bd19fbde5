#!/usr/bin/env bash
# Issue 13 on the H200, part B: the offline llama3-8b workloads (single, throughput), the Poisson point in-process
# by piecewise bucket policy (fine: 8 buckets per doubling, the default; coarse: run 20's), then the serve table:
# vLLM's own client and `tachyon bench serve` against `tachyon serve` (engine core in its own process) at
# max-concurrency 16, 256 and Poisson 20 req/s. Carry .whl and .peer-bench.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_issue13_b.sh
set -u
export PYTHONPATH=.
python benchmarks/gpu_run.py perf --workloads single,throughput,poisson --poisson-variants fine,fine_depth2,coarse --out "$OUT/perf.json" > /tmp/perf.log 2>&1
grep -E "startup|single|throughput|poisson|Error" /tmp/perf.log | cut -c1-900 | grep -v gemv
OUT=$OUT PEER=1 LOADS="c16 c256 poisson20" bash benchmarks/h200_serve.sh 2>&1 | grep -vE "^\s*$" | tail -40
grep -E "piecewise|capture|ready" "$OUT/server.log" | head -5
