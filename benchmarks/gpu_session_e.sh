#!/usr/bin/env bash
# One call for issues 16 and 21 (steps in this order):
#   1. issue 16: llama3-8b with the back-off that follows the running mean of accepted tokens, batch 1 and 64
#      (plain, replay fidelity 0.3, random; the back-off at its default 32)
#   2. issue 16, the seeds' pairing: llama3-70b AWQ target + llama3-8b draft (random weights; the draft's forwards
#      and KV run, its tokens replaced by replayed ones of fidelity 0.92 / 0.8 ~ acceptance 0.8 / 0.6), batch 1,
#      with the time left but 60 s (its JSON is written after every case)
#   3. issue 21: the gateway's overhead at 64 streams, the client spread over processes (one httpx process
#      saturated in gpu_issue19_21_16.sh / gpu_issue15_e.sh, so those runs measured the client); uvicorn with
#      httptools and uvloop, as the gateway extra installs it
# Usage (repo root, GPU machine, carry .whl): OUT=dir [END_S=450] [PAIRING=0] [GATEWAY=0] bash benchmarks/gpu_session_e.sh
set -u
export PYTHONPATH=.
END=${END_S:-450}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
install_site .whl/httptools-*.whl .whl/uvloop-*.whl  # uvicorn[standard]'s parser and loop, as the gateway extra
timeout ${SPEC_S:-120} python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 --fidelity 0.3 --backoff 32 \
  --trust-replay --out "$OUT/spec_decode.json" > "$OUT/spec_decode.log" 2>&1
echo "spec 8b rc=$?"; grep -E "batch|Error" "$OUT/spec_decode.log" | cut -c1-200 | tail -12
if [ "${PAIRING:-1}" = 1 ]; then  # PAIRING=0 leaves step 2 out
  timeout $((END - 60 - SECONDS)) python benchmarks/spec_decode_gpu.py --model benchmarks/models/llama3-70b.json \
    --quantization awq --draft benchmarks/models/llama3-8b.json --num-kv-blocks 1000 --batches 1 --k 4 \
    --fidelity 0.92,0.8 --trust-replay --out "$OUT/spec_decode_70b_awq_8b_draft.json" > "$OUT/spec_70b.log" 2>&1
  echo "spec 70b rc=$?"; grep -E "batch|Error|startup" "$OUT/spec_70b.log" | cut -c1-220 | tail -6
fi
if [ "${GATEWAY:-1}" = 1 ]; then  # GATEWAY=0 leaves step 3 out
  gateway_overhead "${GW_S:-60}"
fi
pack_logs
