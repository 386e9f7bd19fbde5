#!/usr/bin/env bash
# The `serve` workload of shared/WORKLOADS.md on the GPU machine: `tachyon serve` (llama3-8b, random bf16 weights,
# word tokenizer) and `tachyon bench serve` against it over HTTP, one JSON per load point under $OUT.
# The GPU image has no fastapi/uvicorn/pydantic: they come as py3.12 wheels from .whl/ (the README says how to fill it).
# Usage (repo root, on the GPU machine, with .whl/ carried): OUT=dir bash benchmarks/h200_serve.sh
#   LOADS="c1 c16 c64 c256 poisson20" (default: all five) picks the load points;
#   PEER=1 also measures each with vLLM's own client (benchmark_serving.py, copied from ../shared/peer-bench
#   into the git-ignored .peer-bench/ and carried) right before `tachyon bench serve`;
#   SERVER_ARGS="..." adds flags to `tachyon serve` (e.g. --log-level debug).
set -u
SITE=/tmp/tachyon_site
# .whl/ is git-ignored: pass it to the device tool with carry=[".whl"]. A wheel is a zip: unpack the ones whose
# module the image lacks (no pip needed, the image's own packages stay as they are).
python - "$SITE" <<'PY'
import glob, importlib.util, os, sys, zipfile
site = sys.argv[1]
os.makedirs(site, exist_ok=True)
for whl in sorted(glob.glob(".whl/*.whl")):
    with zipfile.ZipFile(whl) as z:
        tops = {n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith((".dist-info", ".data"))}
        mods = {t.removesuffix(".py") for t in tops}
        if all(importlib.util.find_spec(m) is not None for m in mods):
            continue
        z.extractall(site)
        print("unpacked", os.path.basename(whl))
PY
export PYTHONPATH=".:$SITE"
MODEL=benchmarks/models/llama3-8b-serve
python -m tachyon serve --model $MODEL --load-format dummy --max-model-len 4096 --port 8011 ${SERVER_ARGS:-} > "$OUT/server.log" 2>&1 &
SERVER=$!
for i in $(seq 240); do
  kill -0 $SERVER 2>/dev/null || { echo "server exited:"; tail -5 "$OUT/server.log"; exit 1; }
  python - <<'PY' && break
import sys, urllib.request
try:
    urllib.request.urlopen("http://127.0.0.1:8011/health", timeout=1)
except Exception:
    sys.exit(1)
PY
  sleep 1
done
B="python -m tachyon bench serve --base-url http://127.0.0.1:8011 --tokenizer $MODEL --prompt-format text \
   --workload serve --no-progress --goodput ttft:2000 e2el:5000 --percentiles 50,90,99"
peer() {  # N CONC RATE NAME: vLLM's client, same lengths (512 in, 256 out, ignore_eos)
  [ "${PEER:-0}" = 1 ] || return 0
  local dir="$OUT/peer_$4"  # before the call: its OUT=256 (output length) would shadow $OUT here
  IN=512 OUT=256 N=$1 CONC=$2 RATE=$3 RESULT_DIR="$dir" bash .peer-bench/run_foreign_bench.sh \
    http://127.0.0.1:8011 auto "$PWD/$MODEL" > "$OUT/peer_$4.log" 2>&1
  grep -E "Output token throughput|Mean TPOT|P99 TTFT|P99 E2EL|Mean TTFT|Failed" "$OUT/peer_$4.log" | sed "s/^/peer $4: /"
  mv "$OUT"/peer_$4/*.json "$OUT/peer_$4.json" 2>/dev/null; rm -rf "$OUT/peer_$4" "$OUT/peer_$4.log"
}
for load in ${LOADS:-c1 c16 c64 c256 poisson20}; do
  case $load in
    c1) peer 16 1 inf c1; $B --num-prompts 16 --max-concurrency 1 --output "$OUT/serve_c1.json" ;;
    c16) peer 128 16 inf c16; $B --num-prompts 128 --max-concurrency 16 --output "$OUT/serve_c16.json" ;;
    c64) peer 256 64 inf c64; $B --num-prompts 256 --max-concurrency 64 --output "$OUT/serve_c64.json" ;;
    c256) peer 1000 256 inf c256; $B --num-prompts 1000 --max-concurrency 256 --output "$OUT/serve_c256.json" ;;
    poisson20) peer 600 1000 20 poisson20; $B --num-prompts 600 --request-rate 20 --output "$OUT/serve_poisson20.json" ;;
  esac
done
kill -TERM $SERVER; wait $SERVER
tail -5 "$OUT/server.log"
# the device tool brings back 8 files per call: keep the five JSONs and the log (`tachyon bench --compare` on the
# JSONs makes the tables and the plot again)
rm -f "$OUT"/serve_*.md
