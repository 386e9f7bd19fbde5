#!/usr/bin/env bash
# Issues 14 and 16: the AWQ walk with several rows a program ("rgemv", _awq_gemv_rows_kernel), next device session.
#   1. GPU tests of the AWQ kernels (every config of each bucket in bf16, "rgemv" included)
#   2. the AWQ table at 2/4/5/16 rows (few, skinny; 5 = a k = 4 verification) for llama3-70b's layers,
#      the fastest per shape merged into tachyon/kernels/quant_tuned/<GPU>.json (returned as tuned_<GPU>.json)
#   3. the seeds' pairing again with that table: llama3-70b AWQ + llama3-8b draft, acceptance ~0.8 / ~0.5
#      (measured before at 1.38x / 1.02x on an H100 with a 5-token verification at 1.92 decode steps)
#   4. llama3-70b AWQ `sweep` at 1/16 (512 in / 128 out) with the time left (vLLM awq_marlin: 46 / 478)
# Usage (repo root, GPU machine): OUT=dir [END_S=560] bash benchmarks/gpu_session_h.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests 90 tests/kernels/test_quant_linear.py -k awq
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout 170 python benchmarks/quant_kernels.py --no-check --rows 2,4,5,16 --formats awq --models llama3-70b --budget-s 150 \
  --write-tuned "$TUNED" --out "$OUT/quant_kernels.json" > "$OUT/quant_kernels.log" 2>&1
echo "quant_kernels rc=$?"; cp "$TUNED" "$OUT/tuned_$(basename "$TUNED")"
python - "$OUT/quant_kernels.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for row in r["timings"]:
    c = {k: v for k, v in row["awq"]["configs"].items() if isinstance(v, float)}
    best = min(c, key=c.get)
    rg = {k: v for k, v in c.items() if "rgemv" in k}
    rbest = min(rg, key=rg.get) if rg else None
    print(row["model"], row["layer"], row["M"], f"best {best} {c[best]:.4f} ms",
          f"rgemv {rbest} {rg[rbest]:.4f} ms" if rbest else "rgemv -")
PY
timeout $((END - 150 - SECONDS)) python benchmarks/spec_decode_gpu.py --model benchmarks/models/llama3-70b.json \
  --quantization awq --draft benchmarks/models/llama3-8b.json --num-kv-blocks 1000 --batches 1 --k 4 \
  --fidelity 0.92,0.8 --trust-replay --out "$OUT/spec_decode_70b_awq_8b_draft.json" > "$OUT/spec_70b.log" 2>&1
echo "spec 70b rc=$?"; grep -E "batch|Error|startup" "$OUT/spec_70b.log" | cut -c1-220 | tail -6
if [ $SECONDS -lt $((END - 120)) ]; then
  timeout $((END - SECONDS)) python benchmarks/gpu_run.py perf --model llama3-70b --quantization awq --workloads sweep \
    --sweep-concurrency 1,16 --sweep-out 128 --out "$OUT/perf_70b_awq_sweep.json" > "$OUT/70b.log" 2>&1
  grep -E "startup|sweep|Error|Traceback" "$OUT/70b.log" | cut -c1-300 | grep -v gemv
fi
pack_logs
