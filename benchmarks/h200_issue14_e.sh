#!/usr/bin/env bash
# Issue 14 on the H200, part E: the one-row INT4 walk without the FADD (UNPACK 2). GPU tests of the quantized
# linears' one-row paths, the M=1 AWQ table over every one-row config with the tuned table written
# (tachyon/kernels/quant_tuned/NVIDIA_H200.json, copied to $OUT), then llama3-70b AWQ `single` reading that table,
# then llama3-8b AWQ and int8 `throughput` while time is left.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_issue14_e.sh
set -u
export PYTHONPATH=.
TUNED=tachyon/kernels/quant_tuned/NVIDIA_H200.json
timeout 70 python -m pytest -q -p no:cacheprovider tests/kernels/test_quant_linear.py -k "gemv or one_row or tuned" \
  > "$OUT/gpu_tests.txt" 2>&1
tail -2 "$OUT/gpu_tests.txt"
timeout 170 python benchmarks/quant_kernels.py --no-check --rows 1 --formats awq --budget-s 160 --write-tuned $TUNED \
  --out "$OUT/quant_kernels_m1.json" > "$OUT/quant_kernels_m1.log" 2>&1
tail -10 "$OUT/quant_kernels_m1.log"; cp $TUNED "$OUT/" 2>/dev/null
python - "$OUT/quant_kernels_m1.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for row in r["timings"]:
    c = row["awq"]["configs"]
    print(row["model"], row["layer"], " ".join(f"{k[8:30]}={v:.4f}" if isinstance(v, float) else f"{k[8:30]}={v[:30]}"
                                          for k, v in c.items()))
PY
timeout 250 python benchmarks/gpu_run.py perf --model llama3-70b --quantization awq --workloads single \
  --lean-single --single-out 256 --max-num-seqs 4 --max-num-batched-tokens 1024 \
  --out "$OUT/perf_70b_awq_single.json" > "$OUT/70b.log" 2>&1
grep -E "startup|single|Error" "$OUT/70b.log" | cut -c1-300 | grep -v gemv
python - "$OUT/perf_70b_awq_single.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])).get("single", {})
print({k: s.get(k) for k in ("decode_tok_s", "ceiling_tok_s", "fraction_of_ceiling", "graph_replay_ms_batch1")})
print(json.dumps(s.get("graph_kernels_batch1", {}))[:1200])
PY
for q in awq int8; do
  [ $SECONDS -lt 480 ] || break
  timeout $((570 - SECONDS)) python benchmarks/gpu_run.py perf --quantization $q --workloads throughput \
    --out "$OUT/perf_8b_$q.json" > "$OUT/8b_$q.log" 2>&1
  grep -E "throughput|Error" "$OUT/8b_$q.log" | cut -c1-300
done
