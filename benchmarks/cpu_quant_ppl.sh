#!/usr/bin/env bash
# Perplexity of the embedded model, dense and quantized by `tachyon quantize`, on the CPU; one JSON line per case
# into benchmarks/results/cpu_quant_ppl.jsonl. Usage (repo root, the venv active): bash benchmarks/cpu_quant_ppl.sh
set -eu
R=benchmarks/results/cpu_quant_ppl.jsonl
D=${TMPDIR:-/tmp}/tachyon_quant_ppl
: > $R
echo "{\"case\": \"dense\", \"result\": $(tachyon eval ppl --json)}" >> $R
for c in "int8 64" "awq 64" "awq 64 --rounding nearest" "awq 64 --no-search"; do
  set -- $c
  m=$1 g=$2; shift 2
  tachyon quantize --method $m --group-size $g "$@" --no-eval --out $D --overwrite > /dev/null 2>&1
  echo "{\"case\": \"$m g$g $*\", \"result\": $(tachyon eval ppl --model $D --json)}" >> $R
done
cat $R
