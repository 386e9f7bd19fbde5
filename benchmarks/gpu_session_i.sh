#!/usr/bin/env bash
# Kernel candidates on whichever Hopper card comes (ratios; the H200 bars need gpu_session_f.sh/h.sh there):
#   1. GPU tests of the scaled kernels (qwalk/qdot included)
#   2. llama3-8b's fp8/w8a8 layers at 1/4/16 rows, every small-rows config (qwalk, qdot, the larger walks), the
#      fastest merged into tachyon/kernels/quant_tuned/<GPU>.json (returned as tuned_<GPU>.json)
#   3. llama3-8b fp8 `single` with that table
#   4. the AWQ table at 2/5/16 rows for llama3-70b's layers ("rgemv" among the candidates), merged the same way
# Usage (repo root, GPU machine): OUT=dir [END_S=560] bash benchmarks/gpu_session_i.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests 60 tests/kernels/test_scaled_linear.py
tune_scaled 200 1,16 1,4,16
perf_run 8b_fp8 --quantization fp8 --workloads single
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
if [ $SECONDS -lt $((END - 60)) ]; then
  timeout $((END - SECONDS - 10)) python benchmarks/quant_kernels.py --no-check --rows 2,5,16 --formats awq \
    --models llama3-70b --budget-s $((END - SECONDS - 30)) --write-tuned "$TUNED" --out "$OUT/quant_kernels.json" \
    > "$OUT/quant_kernels.log" 2>&1
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
fi
pack_logs
