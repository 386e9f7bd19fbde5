#!/usr/bin/env bash
# Issue 14 on the H200, part D: the one-row INT4 walk with the K sum inside each thread, second layout
# (transposed tile, VEC words a thread, pointer increments). GPU gemv tests, the one-row timing table of every AWQ
# config on llama3-8b/70b shapes, then llama3-70b AWQ `single` with the default config (graphs for <= 4 rows).
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_issue14_d.sh
set -u
export PYTHONPATH=.
timeout 60 python -m pytest -q -p no:cacheprovider tests/kernels/test_quant_linear.py -k gemv > "$OUT/gpu_tests.txt" 2>&1
tail -2 "$OUT/gpu_tests.txt"
timeout 170 python benchmarks/quant_kernels.py --no-check --rows 1 --formats awq --budget-s 160 \
  --out "$OUT/quant_kernels_m1.json" > "$OUT/quant_kernels_m1.log" 2>&1
tail -10 "$OUT/quant_kernels_m1.log"
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
prof = s.get("graph_kernels_batch1", {})
print(json.dumps(prof)[:1500])
PY
