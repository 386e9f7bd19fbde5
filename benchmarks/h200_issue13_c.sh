#!/usr/bin/env bash
# Issue 13, run C: admission that coalesces arrivals (commit e2da1de) against the tree before it (e699b45), same
# machine, same call: `tachyon serve` llama3-8b (random bf16) measured by vLLM's own client and `tachyon bench
# serve` at max-concurrency 16 and Poisson 20 req/s (h200_serve.sh). Carry .whl and .peer-bench.
# Usage (repo root, GPU machine): OUT=dir bash benchmarks/h200_issue13_c.sh   -> $OUT/ab.json, $OUT/logs.txt
# The change lost (benchmarks/results/h100/issue13_coalesce_ab) and was reverted: to repeat the A/B, check out 5c0b6b6.
set -u
BASE=${BASE:-e699b45}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
rm -rf /tmp/base && mkdir -p /tmp/base && git archive "$BASE" | tar -x -C /tmp/base && cp -r .whl .peer-bench /tmp/base/
mkdir -p /tmp/ab/base /tmp/ab/new
for variant in ${VARIANTS:-base new}; do
  dir=$PWD; [ "$variant" = base ] && dir=/tmp/base
  echo "== $variant ($dir)"
  (cd "$dir" && OUT=/tmp/ab/$variant PEER=1 LOADS="${LOADS:-c16 poisson20}" bash benchmarks/h200_serve.sh 2>&1 | grep -vE "^\s*$" | tail -14)
done
python - "$OUT" <<'PY'
import glob, json, os, sys, subprocess
out = {"gpu": open(os.path.join(sys.argv[1], "gpu.txt")).read().strip(),
       "git": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
       "base": os.environ.get("BASE", "e699b45"), "command": "OUT=$OUT bash benchmarks/h200_issue13_c.sh"}
keep = ("mean_ttft_ms", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_e2el_ms",
        "p99_e2el_ms", "output_throughput", "completed", "ttfts_ms", "ttfts")
for f in sorted(glob.glob("/tmp/ab/*/peer_*.json")):  # tachyon bench serve's JSONs keep their own layout
    d = json.load(open(f))
    if "ttfts" in d and "ttfts_ms" not in d:
        d["ttfts_ms"] = [round(t * 1e3, 1) for t in d["ttfts"]]
    slim = {k: v for k, v in d.items() if k in keep and k != "ttfts"}
    out.setdefault(f.split("/")[-2], {})[os.path.basename(f)[:-5]] = slim
json.dump(out, open(os.path.join(sys.argv[1], "ab.json"), "w"), indent=1)
for v in ("base", "new"):
    for k, d in sorted(out.get(v, {}).items()):
        if k.startswith("peer_"):
            print(v, k, {m: round(d[m], 2) for m in ("mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_e2el_ms",
                                                     "output_throughput") if m in d})
PY
for v in base new; do echo "== $v server.log"; grep -vE "GET /health|POST /v1" /tmp/ab/$v/server.log | tail -8; done > "$OUT/logs.txt"
