#!/usr/bin/env bash
# Issue 18 on a multi-GPU kind (nvidia-h200-x2 / -x4 / -x8, or the H100 ones): llama3-70b at tensor parallelism TP,
# random weights. One call per TP (a 70B start takes minutes; each call has 10):
#   1. bf16 `single` (rank 0's decode graph profiled: the all-reduce share of a step) and `sweep` at 1/16/64/256
#      (512 in / 128 out), startup time in the JSON
#   2. with AWQ=1 instead: 70B AWQ `single` at this TP (TP=1: 60.0 tok/s on the H200, issue 14)
#   3. CHECK=1 first: gpu_tensor_parallel.py's greedy check, TP=2 against TP=1 on a tiny model (its GPU path)
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0, as the device's notes require).
# Usage (repo root, GPU machine): OUT=dir TP=2 [AWQ=1] [CHECK=1] [END_S=570] bash benchmarks/gpu_issue18.sh
set -u
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
END=${END_S:-570}
TP=${TP:-2}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
NGPU=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
[ "$TP" -le "$NGPU" ] || { echo "TP=$TP needs $TP GPUs, this machine has $NGPU"; exit 2; }
if [ "${CHECK:-0}" = 1 ]; then
  timeout 240 python benchmarks/gpu_tensor_parallel.py --out "$OUT/gpu_tensor_parallel.json" > "$OUT/tp_check.log" 2>&1
  echo "tp check rc=$?"; tail -5 "$OUT/tp_check.log" | cut -c1-200
fi
if [ "${AWQ:-0}" = 1 ]; then
  name=70b_awq_tp$TP; extra=(--quantization awq --workloads single)
else
  name=70b_bf16_tp$TP; extra=(--workloads single,sweep --sweep-concurrency 1,16,64,256 --sweep-out 128)
fi
timeout $((END - SECONDS)) python benchmarks/gpu_run.py perf --model llama3-70b --tensor-parallel-size "$TP" \
  --lean-single "${extra[@]}" --out "$OUT/perf_$name.json" > "$OUT/perf_$name.log" 2>&1
echo "perf rc=$?"; grep -E "startup|\] (single|sweep) |Error|Traceback" "$OUT/perf_$name.log" | cut -c1-300 | grep -v gemv
python - "$OUT/perf_$name.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no perf JSON: {e}")
prof = (r.get("single") or {}).get("graph_kernels_batch1") or {}
kernels = prof.get("kernels") or []
comm = sum(k["ms"] for k in kernels if "nccl" in k["name"].lower() or "allreduce" in k["name"].lower())
total = prof.get("total_kernel_ms") or 0
print(f"startup {r.get('startup_s', 0):.1f} s; single {r.get('single', {}).get('decode_tok_s')} tok/s; "
      f"all-reduce kernels {comm:.3f} of {total:.3f} kernel-ms in rank 0's batch-1 decode graph "
      f"({100 * comm / total if total else float('nan'):.1f}%; PDL overlaps kernel times, so this is an upper bound)")
PY
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log); ls "$OUT"
