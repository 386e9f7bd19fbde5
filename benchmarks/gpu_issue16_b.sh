#!/usr/bin/env bash
# Issue 16 again after the pinned-staging fix (sampler.to_device could not pin a numpy array: every speculative
# step failed in gpu_issue16_19.sh), plus the bf16 llama3-8b `single` + `throughput` base on the same machine for
# issue 15's quantized ratios.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/gpu_issue16_b.sh
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 60 python -m pytest -q -p no:cacheprovider tests/kernels/test_sampler_no_sync.py > "$OUT/gpu_tests.txt" 2>&1
tail -1 "$OUT/gpu_tests.txt"
timeout 300 python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 --fidelity 1,0 --trust-replay \
  --out "$OUT/spec_decode.json" > "$OUT/spec_decode.log" 2>&1
echo "spec rc=$?"; grep -E "^\[.*batch|Error" "$OUT/spec_decode.log" | cut -c1-250 | tail -12
timeout $((585 - SECONDS)) python benchmarks/gpu_run.py perf --lean-single --out "$OUT/perf_8b_bf16.json" \
  --workloads single,throughput > "$OUT/perf_8b_bf16.log" 2>&1
echo "bf16 rc=$?"; grep -E "\] (single|throughput) |Error" "$OUT/perf_8b_bf16.log" | cut -c1-200 | tail -3
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
