#!/usr/bin/env bash
# One GPU call that checks the kernels and the engine on the device and A/B-times a change: the GPU tests, greedy
# agreement with transformers, then `single` + `floor` of llama3-8b with and without PDL (each a fresh process).
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_probe.sh
set -u
export PYTHONPATH=.
python -m pytest -q -p no:cacheprovider tests/kernels tests/unit/test_multi_step.py tests/unit/test_async_engine.py \
  -k "not seeded_sampling" > "$OUT/gpu_tests.txt" 2>&1; tail -3 "$OUT/gpu_tests.txt"
python benchmarks/gpu_run.py correctness --greedy-only --trained --out "$OUT/corr.json" > "$OUT/corr.log" 2>&1
tail -2 "$OUT/corr.log"
python benchmarks/gpu_run.py perf --workloads single,floor --out "$OUT/pdl_on.json" > "$OUT/pdl_on.log" 2>&1
tail -1 "$OUT/pdl_on.log"
python benchmarks/gpu_run.py perf --workloads single,floor --no-pdl --out "$OUT/pdl_off.json" > "$OUT/pdl_off.log" 2>&1
tail -1 "$OUT/pdl_off.log"
python - "$OUT" <<'PY'
import json, sys
for name in ("pdl_on", "pdl_off"):
    try:
        d = json.load(open(f"{sys.argv[1]}/{name}.json"))
        s = d["single"]
        print(name, d.get("pdl"), "single", round(s["decode_tok_s"], 1), "replay1", round(s["graph_replay_ms_batch1"], 3),
              "floor", [(f["batch"], round(f["replay_ms"], 3)) for f in d.get("decode_floor", []) if isinstance(f, dict)])
    except Exception as e:
        print(name, "failed", e)
PY
