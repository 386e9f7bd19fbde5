#!/usr/bin/env bash
# One device call after merging speculative decoding, structured outputs, the vLLM-compatible surface and the
# fp8 KV cache (issues 15, 16, 19, 20): their GPU tests, then the GPU figures each issue asks for, in order of
# need, each under its own time limit and all inside one call:
#   1. tests: fp8 KV writes (GPU only), the Triton model vs torch, piecewise graphs, speculative decoding's units;
#      prompt_logprobs' CUDA path (benchmarks/prompt_logprobs_gpu.py)
#   2. speculative decoding, llama3-8b random bf16: replay (acceptance ~1 .. lower) and random proposers, batch 1, 64
#   3. structured outputs overhead, llama3-8b, batch 1 and 64 (xgrammar and pydantic from the carried .whl)
#   4. llama3-8b single / throughput with the KV cache in bf16 and in fp8
# Usage (repo root, GPU machine, carry .whl): OUT=dir bash benchmarks/gpu_merge_check.sh
set -u
export PYTHONPATH=.
END=$((SECONDS + ${BUDGET_S:-530}))
left() { echo $((END - SECONDS)); }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 110 python -m pytest -q -p no:cacheprovider --timeout 100 tests/kernels/test_fp8_kv.py \
  tests/kernels/test_model_triton.py tests/kernels/test_piecewise_graphs.py tests/unit/test_spec_decode.py \
  > "$OUT/gpu_tests.txt" 2>&1
tail -2 "$OUT/gpu_tests.txt"
timeout 100 python benchmarks/prompt_logprobs_gpu.py --out "$OUT/prompt_logprobs.json" > "$OUT/prompt_logprobs.log" 2>&1
tail -3 "$OUT/prompt_logprobs.log" | cut -c1-300
timeout $(( $(left) > 170 ? 150 : $(left) - 20 )) python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 \
  --fidelity 1,0.8,0.6 --trust-replay --out "$OUT/spec_decode.json" > "$OUT/spec_decode.log" 2>&1
tail -4 "$OUT/spec_decode.log" | cut -c1-400
mkdir -p /tmp/site && python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/xgrammar-*.whl .whl/apache_tvm_ffi-*.whl .whl/pydantic-2*.whl .whl/pydantic_core-*.whl \
  .whl/annotated_types-*.whl .whl/typing_inspection-*.whl > /dev/null 2>&1
[ $(left) -gt 60 ] && PYTHONPATH=.:/tmp/site timeout $(( $(left) > 140 ? 120 : $(left) - 20 )) \
  python benchmarks/structured_overhead.py --model benchmarks/models/llama3-8b-structured --load-format dummy \
  --max-tokens 256 --repeats 2 --out "$OUT/structured_overhead" > "$OUT/structured.log" 2>&1
tail -6 "$OUT/structured.log" | cut -c1-300
for kv in auto fp8; do
  [ $(left) -gt 70 ] || break
  timeout $(( $(left) - 10 )) python benchmarks/gpu_run.py perf --workloads single,throughput --lean-single \
    --kv-cache-dtype $kv --out "$OUT/perf_kv_$kv.json" > "$OUT/perf_kv_$kv.log" 2>&1
  grep -E "single|throughput" "$OUT/perf_kv_$kv.log" | cut -c1-300 | tail -2
done
# the device tool brings back 8 files: the logs travel as one archive
(cd "$OUT" && tar czf logs.tgz *.log gpu*.txt && rm -f *.log gpu*.txt)
ls "$OUT"
