#!/usr/bin/env bash
# Everything one GPU session measures, in one device call (the device tool returns at most 8 files):
# the PDL GPU tests, `gpu_run.py perf` (all llama3-8b workloads but `prefix`, `random` three times),
# greedy agreement of the trained model with transformers, then the `serve` workload over HTTP.
# Usage (repo root, GPU machine, .whl/ carried for the server): OUT=dir bash benchmarks/h200_session.sh
set -u
export PYTHONPATH=.
python -m pytest -q -p no:cacheprovider tests/kernels/test_pdl.py > /tmp/tests.txt 2>&1
tail -2 /tmp/tests.txt | tee "$OUT/perf.log"
python benchmarks/gpu_run.py perf --workloads single,sweep,throughput,random,floor,profile --random-runs 3 \
  --out "$OUT/perf.json" >> "$OUT/perf.log" 2>&1
python - "$OUT/perf.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("pdl sizes", d.get("pdl_graph_sizes"))
print("single", round(d["single"]["decode_tok_s"], 1), "replay1", round(d["single"]["graph_replay_ms_batch1"], 3))
print("sweep", {k: round(v["output_tok_s"]) for k, v in d["sweep"].items()})
print("throughput", round(d["throughput"]["output_tok_s"]), "random", round(d["random"]["output_tok_s"]), d.get("random_repeats_prefix_cache_off_output_tok_s"))
PY
python benchmarks/gpu_run.py correctness --greedy-only --trained-only --out "$OUT/corr.json" > /tmp/corr.log 2>&1
grep -E "trained_greedy|trained_model" /tmp/corr.log | cut -c1-400
OUT=$OUT bash benchmarks/h200_serve.sh 2>&1 | grep -E "Output token throughput|Mean TTFT|Successful|Failed|exited|Error" | head -40
