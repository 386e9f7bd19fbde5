#!/usr/bin/env bash
# Issue 14 in one call: the INT4 tensor-core kernels of tachyon/kernels/awq_mma.py.
#   1. their GPU tests (bf16: every config, the PTX nibble path)
#   2. benchmarks/awq_mma.py on llama3-70b's layers at 1/16/64 rows: K-major and natural-layout kernels against
#      today's awq_linear (this GPU's tuned config) and cuBLAS bf16 in the same process; what Triton made of
#      them (MMA kind, shared-memory round trips) from the compiled IR
#   3. benchmarks/quant_kernels.py retunes llama3-70b's AWQ layers at 1 and 16 rows with the "mma" kind among the
#      candidates -> quant_tuned/<GPU>.json (returned as tuned_<GPU>.json)
#   4. end to end with that table: llama3-70b AWQ `single`, then `sweep` at 1/16 (512 in / 128 out)
# Usage (repo root, GPU machine): OUT=dir [END_S=560] bash benchmarks/gpu_session_m.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
export TRITON_CACHE_DIR=/tmp/triton_m
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests ${TEST_S:-70} tests/kernels/test_awq_mma.py
timeout ${BENCH_S:-100} python benchmarks/awq_mma.py --models llama3-70b --rows 1,16,64 --budget-s 60 \
  --out "$OUT/awq_mma.json" > "$OUT/awq_mma.log" 2>&1
echo "awq_mma rc=$?"; grep -E "M=|Error|error" "$OUT/awq_mma.log" | cut -c1-300 | head -16
python - "$TRITON_CACHE_DIR" <<'PY'
import glob, os, sys
for name in ("_awq_mma_kernel", "_awq_mma_natural_kernel"):
    irs = sorted(glob.glob(f"{sys.argv[1]}/**/{name}.ttgir", recursive=True))
    for p in irs[:2]:
        t = open(p).read()
        ptx = open(p[:-5] + "ptx").read() if os.path.exists(p[:-5] + "ptx") else ""
        print(name, {k: t.count(k) for k in ("warp_group_dot ", "local_alloc %a", "elementwise_inline_asm")},
              {k: ptx.count(k) for k in ("wgmma.mma_async", "mma.sync", "st.shared", "cp.async.cg")})
PY
TUNED=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
timeout ${TUNE_S:-130} python benchmarks/quant_kernels.py --no-check --rows 1,16 --formats awq --models llama3-70b \
  --budget-s $((${TUNE_S:-130} - 40)) --write-tuned "$TUNED" --out "$OUT/quant_kernels.json" > "$OUT/quant_kernels.log" 2>&1
echo "quant_kernels rc=$?"; cp "$TUNED" "$OUT/tuned_$(basename "$TUNED")"
python - "$OUT/quant_kernels.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no quant_kernels.json: {e}")
for row in r["timings"]:
    c = {k: v for k, v in row["awq"]["configs"].items() if isinstance(v, float)}
    mma = {k: v for k, v in c.items() if "mma" in k}
    rest = {k: v for k, v in c.items() if "mma" not in k}
    b, m = min(rest, key=rest.get) if rest else None, min(mma, key=mma.get) if mma else None
    print(row["layer"], row["M"], f"best other {b} {rest.get(b, 0):.4f}", f"best mma {m} {mma.get(m, 0):.4f}")
PY
if [ $SECONDS -lt $((END - 180)) ]; then
  timeout $((END - SECONDS)) python benchmarks/gpu_run.py perf --model llama3-70b --quantization awq --lean-single \
    --workloads single,sweep --sweep-concurrency 1,16 --sweep-out 128 --out "$OUT/perf_70b_awq.json" > "$OUT/perf_70b.log" 2>&1
  echo "70b rc=$?"; grep -E "startup|\] (single|sweep) |Error|Traceback" "$OUT/perf_70b.log" | cut -c1-300 | tail -8
fi
pack_logs
