#!/usr/bin/env bash
# Next after session 2026-12-07b (which ran on an H100; every bar is an H200 figure), in parts (PARTS, in order):
#   attn:   benchmarks/decode_attention_sweep.py: decode attention's split counts, split floors (min_chunk), tile
#           configs and the in-kernel merge where serving runs it (1-256 sequences x 640-4,096 tokens, CUDA-graph
#           replays); the H100's Poisson profile had it at 1.92 ms of a 7.7 ms decode step (1.75 TB/s of 3.0).
#           Its pick of (min_chunk, merge) goes into this GPU's table (returned as tuned_<GPU>.json), which the
#           serve13 after it runs with
#   serve13: `tachyon serve` llama3-8b, vLLM's client then `tachyon bench serve`, c16 and Poisson 20 req/s: issue
#           13's table with the piecewise eager policy (H100: c16 p99 TTFT 228.5 -> 210-213 ms) (carry .whl and
#           .peer-bench)
#   diag13: a fresh engine's first request (session 2026-12-07b's in-process Poisson, its first workload, took
#           1.67 s for its first step: the engine or the profiler?), then in-process Poisson with the device
#           timeline after a `single` warm-up (no kernel window: its start stalls the run), and the decode floor
#   70b:    llama3-70b K-major tuning at 64/256 rows (the direct tiles, first time on an H200; the table holds the
#           H100's picks), then 70B AWQ `single` + `sweep` 1/16/64/256 (run 32: 65.5; 61.9 / 511.8 / 587.6 / 813.2)
#   q15:    issue 15: fp8/w8a8 GEMMs above 16 rows tuned on the card, fp8 `sweep` + `throughput`, fp8 + fp8 KV
#           `throughput`, w8a8 and bf16 `throughput`
# Usage (repo root, GPU machine): OUT=dir [END_S=560] PARTS="attn serve13" bash benchmarks/gpu_session_t.sh
# Session 2026-12-07c ran attn + serve13 + diag13 on an H200 (benchmarks/results/h200/session_20261207c). Next:
#   SERVER_ARGS="--log-level debug" PARTS="serve13 kern" (each request's timeline and any slow collection of the
#   server process land in server13.log, inside logs.tgz; startup's gemv_tuning now covers 32/64 rows: see
#   perf_*.json of any perf run), then PARTS="70b", then PARTS="q15".
#   kern:   benchmarks/gpu_kernels.py: prefill attention at 16 x 512 against torch's varlen flash attention (an eager
#           16 x 512 step spends ~6 ms in _prefill_kernel, where SDPA took ~60% of our time at 8 x 512)
# Session 2026-12-07d ran serve13 + kern and q15 on an H100 (benchmarks/results/h100/session_20261207d); no H200 came.
# Next, in this order (an H200 for the bars; carry .whl .peer-bench):
#   1. SERVER_ARGS="--log-level debug" PARTS="serve13 budget2048": the engine-core process now logs every Triton
#      compile after start-up (the H100's 650 ms Poisson stall and its 1.4 s first request: grep "Triton compiled"
#      in server13.log) and the attention kernels no longer specialize on the block table's width; budget2048 is
#      `tachyon serve --max-num-batched-tokens 2048` at c16 (LOADS2048 adds poisson20; 8 files come back a call).
#   2. PARTS="q15": the fp8 "wo" configs compile now (1f245be); the H200's table holds the H100's 2-4096-row picks,
#      which this re-tunes on the card.
#   3. PARTS="70b".
# Session 2026-12-07e ran 1 (twice) and 2 on an H100 (benchmarks/results/h100/session_20261207e): no compile after
#   start-up once 00824ed stopped the row-count specialization (H100 Poisson p99 TTFT 469.5 -> 94.3 ms). Next, on an
#   H200 (the bars): SERVER_ARGS="--log-level debug" PARTS="serve13" (issue 13's table; the timelines now stamp
#   admitted/queued), then PARTS="q15" (the H200's fp8/w8a8 table still holds H100 picks), then PARTS="70b".
# Session 2026-12-07f: a burst gate (a wave's adds held until its last request was tokenized, sent as one message)
#   ran c16 + Poisson + c256 on an H100 (benchmarks/results/h100/session_20261207f/call1_burst_gate) and was not
#   kept: one 8,192-token step took as long as the 2-3 it replaced, and mean TTFT rose. Next, on an H200:
#   SERVER_ARGS="--log-level debug" LOADS13="c16 poisson20 c256" PARTS="serve13 diag13" (diag13 now profiles the
#   decode graph at 16 and 40 rows x 640 and a Poisson-like mixed step, 40 decodes + one 512-token prompt, eager and
#   with the piecewise graphs: where Poisson's TPOT goes), then PARTS="q15", then PARTS="70b".
#   Two H100 calls ran (benchmarks/results/h100/session_20261207f); no H200 came. Next, on any card first:
#   `PYTHONPATH=. python benchmarks/gemv_tune_check.py --out $OUT/gemv_tune.json` (the gemv K-split configs against
#   cuBLAS at 2-64 rows, never run on a GPU: if they win qkv/o_proj, turn TACHYON_GEMV_SPLIT on by default); then on
#   an H200: SERVER_ARGS="--log-level debug" LOADS13="c16 poisson20 c256" PARTS="serve13 diag13", then PARTS="q15"
#   (TUNE15_CONFIG_ROWS=1,4,16: the fp8 "wo" configs were never timed at one row), then PARTS="70b".
# Session 2026-12-08: no device was lent (refused, then paused). Built on the CPU: piecewise buckets from 256 to 2,048
#   tokens chosen by the linears' cost timed every 8 rows at start-up (TACHYON_FINE_BUCKETS=0: the plain grid). Next,
#   first call on any card (carry .whl .peer-bench; ~590 s): SERVER_ARGS="--log-level debug" LOADS13="poisson20"
#   PARTS="gputests gemvcheck serve13 fineab" (the piecewise/gemv tests on the card, the gemv split against cuBLAS,
#   Poisson with the measured buckets, then with the plain grid; server13.log logs the buckets and their costs);
#   then on an H200: LOADS13="c16 poisson20 c256" PARTS="serve13 diag13", then PARTS="q15" (TUNE15_CONFIG_ROWS=1,4,16),
#   then PARTS="70b".
set -u
export PYTHONPATH=.
END=${END_S:-560}
PARTS=${PARTS:-attn serve13}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"; cat "$OUT/gpu.txt"
for part in $PARTS; do
  case $part in
    attn)
      tuned=tachyon/kernels/quant_tuned/$(python -c "import torch; print(torch.cuda.get_device_name().replace(' ', '_'))").json
      timeout ${ATTN_S:-240} python benchmarks/decode_attention_sweep.py --budget-s $((${ATTN_S:-240} - 40)) \
        --out "$OUT/decode_sweep.json" --write-tuned "$tuned" > "$OUT/decode_sweep.log" 2>&1
      echo "decode sweep rc=$?"; grep -E "^(B=|pick)" "$OUT/decode_sweep.log" | cut -c1-200
      cp "$tuned" "$OUT/tuned_$(basename "$tuned")" ;;
    serve13)
      [ $SECONDS -lt $((END - 200)) ] || { echo "== serve13: no time left"; continue; }
      PEER=1 LOADS="${LOADS13:-c16 poisson20}" timeout $((END - SECONDS - 20)) bash benchmarks/h200_serve.sh \
        2>&1 | grep -E "peer|Mean TPOT|P99 TTFT|Mean TTFT|P99 E2EL|Output token" | head -30
      mv "$OUT/server.log" "$OUT/server13.log" ;;
    diag13)
      perf_run 8b_poisson_timeline --workloads cold,single,poisson,floor,profile --poisson-variants fine \
        --poisson-timeline --poisson-prompts 400 ;;
    kern)  # the kernels against torch: prefill attention at 16 x 512 (the c16 burst) beside SDPA and varlen flash
      timeout 240 python benchmarks/gpu_kernels.py --out "$OUT/kernels.json" --budget-s 150 > "$OUT/kernels.log" 2>&1
      echo "gpu_kernels rc=$?"; grep -A5 "^prefill attention" "$OUT/kernels.log" ;;
    budget2048)  # the same serve run with a 2,048-token step budget (server log: budget2048.log)
      [ $SECONDS -lt $((END - 150)) ] || { echo "== budget2048: no time left"; continue; }
      mkdir -p "$OUT/b2048"
      OUT="$OUT/b2048" PEER=1 LOADS="${LOADS2048:-c16}" SERVER_ARGS="${SERVER_ARGS:-} --max-num-batched-tokens 2048" \
        timeout $((END - SECONDS - 20)) bash benchmarks/h200_serve.sh 2>&1 \
        | grep -E "peer|Mean TPOT|P99 TTFT|Mean TTFT|P99 E2EL|Output token" | head -30
      mv "$OUT/b2048/server.log" "$OUT/budget2048.log" ;;
    gputests)  # the piecewise-graph and gemv tests on the card (the cost-chosen buckets' capture among them)
      gpu_tests 150 tests/kernels/test_piecewise_graphs.py tests/kernels/test_gemv.py ;;
    gemvcheck)  # the gemv K-split configs against cuBLAS at 2-64 rows on llama3-8b's qkv/o/down shapes
      timeout 170 python benchmarks/gemv_tune_check.py --out "$OUT/gemv_tune.json" > "$OUT/gemv_tune.log" 2>&1
      echo "gemv_tune_check rc=$?"; cut -c1-400 "$OUT/gemv_tune.log" | tail -4 ;;
    fineab)  # the serve run with the plain bucket grid (TACHYON_FINE_BUCKETS=0), beside serve13's measured buckets
      [ $SECONDS -lt $((END - 150)) ] || { echo "== fineab: no time left"; continue; }
      mkdir -p "$OUT/grid"
      OUT="$OUT/grid" PEER=1 LOADS="${LOADSAB:-poisson20}" TACHYON_FINE_BUCKETS=0 timeout $((END - SECONDS - 20)) \
        bash benchmarks/h200_serve.sh 2>&1 | grep -E "peer|Mean TPOT|P99 TTFT|Mean TTFT|P99 E2EL|Output token" | head -30
      mv "$OUT/grid/server.log" "$OUT/server_grid.log" ;;
    70b) awq70b_direct ;;
    q15) issue15_curves ;;
  esac
done
pack_logs
