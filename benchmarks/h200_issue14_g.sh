#!/usr/bin/env bash
# Issue 14 on the H200, part G: the INT4 paths above one row. GPU tests of the "dequant" path (whole weight
# dequantized, then cuBLAS), the AWQ table at 4/16/64/256 rows with the tuned table extended (quant_tuned/
# NVIDIA_H200.json: buckets few, skinny, gemm; copied to $OUT), then llama3-70b AWQ `sweep` (1/16/64/256,
# 512 in / 128 out) reading it.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_issue14_g.sh
set -u
export PYTHONPATH=.
TUNED=tachyon/kernels/quant_tuned/NVIDIA_H200.json
timeout 60 python -m pytest -q -p no:cacheprovider tests/kernels/test_quant_linear.py -k "dequant or row_bucket" \
  > "$OUT/gpu_tests.txt" 2>&1
tail -2 "$OUT/gpu_tests.txt"
timeout 150 python benchmarks/quant_kernels.py --no-check --rows 4,16,64,256 --formats awq --budget-s 110 \
  --write-tuned $TUNED --out "$OUT/quant_kernels.json" > "$OUT/quant_kernels.log" 2>&1
tail -36 "$OUT/quant_kernels.log" | cut -c1-200; cp $TUNED "$OUT/"
python - "$OUT/quant_kernels.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for row in r["timings"]:
    c = row["awq"]["configs"]
    print(row["model"], row["layer"], row["M"], " ".join(f"{k[1:12]}={v:.4f}" if isinstance(v, float) else f"{k[1:12]}=X"
                                                      for k, v in c.items()))
PY
timeout $((575 - SECONDS)) python benchmarks/gpu_run.py perf --model llama3-70b --quantization awq --workloads sweep \
  --sweep-concurrency 1,16,64,256 --sweep-out 128 --out "$OUT/perf_70b_awq_sweep.json" > "$OUT/70b.log" 2>&1
grep -E "startup|sweep|Error|Traceback" "$OUT/70b.log" | cut -c1-420 | grep -v gemv
tail -3 "$OUT/70b.log" | cut -c1-300
