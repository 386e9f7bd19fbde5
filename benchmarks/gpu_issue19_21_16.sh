#!/usr/bin/env bash
# Issues 21, 19 and 16 in one call (their figures from the previous session's calls did not come back to the repo):
#   1. issue 21: the gateway's overhead at 64 concurrent streams on the device's 16 cores (no GPU)
#   2. issue 19: structured outputs (xgrammar) vs free decoding at batch 1 and 64, llama3-8b random weights
#   3. issue 16: speculative decoding k=4, replay proposer at acceptance 1 and random proposals (acceptance 0),
#      batch 1 and 64, against plain decode in the same process
# .whl (gitignored) is made as gpu_issue15_e.sh says. At most 8 files come back: logs travel in logs.tgz.
# Usage (repo root, GPU machine, carry .whl): OUT=dir [END_S=585] bash benchmarks/gpu_issue19_21_16.sh
set -u
export PYTHONPATH=.
END=${END_S:-585}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
git log -1 --format=%H >> "$OUT/gpu.txt" 2>/dev/null
install_site .whl/xgrammar-*.whl .whl/apache_tvm_ffi-*.whl
gateway_overhead 80
PYTHONPATH=.:/tmp/site timeout 200 python benchmarks/structured_overhead.py \
  --model benchmarks/models/llama3-8b-structured --load-format dummy --max-tokens 256 --repeats 2 \
  --out "$OUT/structured_overhead" > "$OUT/structured.log" 2>&1
echo "structured rc=$?"; tail -8 "$OUT/structured_overhead.md" 2>/dev/null | cut -c1-300
timeout $((END - SECONDS)) python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 --fidelity 1,0.3 --backoff 0,32 --trust-replay \
  --out "$OUT/spec_decode.json" > "$OUT/spec_decode.log" 2>&1
echo "spec rc=$?"; grep -E "batch|Error" "$OUT/spec_decode.log" | cut -c1-250 | tail -12
pack_logs
