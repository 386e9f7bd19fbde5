#!/usr/bin/env bash
# Issue 14 in one call: the K-major INT4 tensor-core kernels (tachyon/kernels/awq_mma.py).
#   1. their GPU tests (bf16: every config, the PTX nibble path)
#   2. benchmarks/awq_mma.py on llama3-70b's layers at 1/16/64/256 rows: each against today's awq_linear (this GPU's
#      tuned config) and cuBLAS bf16 in the same process; what Triton made of the kernel (MMA kind, shared-memory
#      round trips) from its compiled IR
#   3. end to end with TACHYON_AWQ_MMA=1 (every AWQ layer repacked K-major): llama3-70b AWQ `single`, then `sweep`
#      at 1/16/64 (512 in / 128 out) with the time left; today's figures are in benchmarks/results/*/issue14
# Usage (repo root, GPU machine): OUT=dir [END_S=560] bash benchmarks/gpu_session_m.sh
set -u
export PYTHONPATH=.
END=${END_S:-560}
export TRITON_CACHE_DIR=/tmp/triton_m
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests ${TEST_S:-70} tests/kernels/test_awq_mma.py
timeout ${BENCH_S:-150} python benchmarks/awq_mma.py --models llama3-70b --rows 1,16,64,256 --budget-s 100 \
  --out "$OUT/awq_mma.json" > "$OUT/awq_mma.log" 2>&1
echo "awq_mma rc=$?"; grep -E "M=|Error|error" "$OUT/awq_mma.log" | cut -c1-260 | head -24
python - "$TRITON_CACHE_DIR" "$OUT" <<'PY'
import glob, os, shutil, sys
cache, out = sys.argv[1:]
irs = sorted(glob.glob(f"{cache}/**/_awq_mma_kernel.ttgir", recursive=True))
print(len(irs), "compiled _awq_mma_kernel variants")
for p in irs[:4]:
    t = open(p).read()
    ptx = open(p[:-5] + "ptx").read() if os.path.exists(p[:-5] + "ptx") else ""
    print({k: t.count(k) for k in ("warp_group_dot ", "ttg.local_alloc %a", "elementwise_inline_asm")},
          {k: ptx.count(k) for k in ("wgmma.mma_async", "mma.sync", "st.shared", "cp.async.cg", "cp.async.ca")})
if irs:
    shutil.copy(irs[0], f"{out}/awq_mma_kernel.ttgir.log")
PY
if [ $SECONDS -lt $((END - 200)) ]; then
  TACHYON_AWQ_MMA=1 timeout $((END - SECONDS)) python benchmarks/gpu_run.py perf --model llama3-70b --quantization awq \
    --lean-single --workloads single,sweep --sweep-concurrency 1,16,64 --sweep-out 128 --out "$OUT/perf_70b_awq_mma.json" \
    > "$OUT/perf_70b.log" 2>&1
  echo "70b rc=$?"; grep -E "repacked|startup|\] (single|sweep) |Error|Traceback" "$OUT/perf_70b.log" | cut -c1-300 | tail -8
fi
pack_logs
