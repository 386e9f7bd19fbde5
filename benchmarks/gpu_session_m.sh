#!/usr/bin/env bash
# A short call for two unmeasured kernels:
#   1. issue 14: the K-major INT4 tensor-core prototype (tachyon/kernels/awq_mma.py): its GPU tests (bf16, every
#      config), then benchmarks/awq_mma.py on llama3-70b's layers at 1/16/64/256 rows against today's awq_linear
#      and cuBLAS bf16; what Triton made of it (MMA kind, shared-memory round trips) from the compiled kernel
#   2. issue 15: the quantizing norm and activation (gpu_session_l.sh): GPU tests, per-call times
# Usage (repo root, GPU machine): OUT=dir [END_S=420] bash benchmarks/gpu_session_m.sh
set -u
export PYTHONPATH=.
END=${END_S:-420}
export TRITON_CACHE_DIR=/tmp/triton_m
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
gpu_tests ${TEST_S:-90} tests/kernels/test_awq_mma.py; mv "$OUT/gpu_tests.log" "$OUT/gpu_tests_mma.log"
timeout ${BENCH_S:-190} python benchmarks/awq_mma.py --models llama3-70b --rows 1,16,64,256 --budget-s 120 \
  --out "$OUT/awq_mma.json" > "$OUT/awq_mma.log" 2>&1
echo "awq_mma rc=$?"; grep -E "M=|Error|error" "$OUT/awq_mma.log" | cut -c1-260 | head -24
python - "$TRITON_CACHE_DIR" "$OUT" <<'PY'
import glob, os, shutil, sys
cache, out = sys.argv[1:]
irs = sorted(glob.glob(f"{cache}/**/_awq_mma_kernel.ttgir", recursive=True))
print(len(irs), "compiled _awq_mma_kernel variants")
for p in irs[:3]:
    t = open(p).read()
    ptx = open(p[:-5] + "ptx").read() if os.path.exists(p[:-5] + "ptx") else ""
    print(os.path.basename(os.path.dirname(p))[:12], {k: t.count(k) for k in
          ("warp_group_dot", "ttg.local_alloc", "ttg.local_load", "ttg.convert_layout", "tt.dot ")},
          {k: ptx.count(k) for k in ("wgmma.mma_async", "mma.sync", "ldmatrix", "st.shared", "ld.shared", "cp.async")})
if irs:
    shutil.copy(irs[0], f"{out}/awq_mma_kernel.ttgir.log")
PY
if [ $SECONDS -lt $((END - 150)) ]; then
  gpu_tests ${TEST_S:-80} -k "quantize or w8a8 or producer or norm or silu" tests/kernels/test_fused_ops.py \
    tests/kernels/test_model_triton.py tests/kernels/test_scaled_linear.py
  timeout 60 python benchmarks/fused_quant_ops.py --out "$OUT/fused_quant_ops.json" 2>&1 | tail -12
fi
pack_logs
