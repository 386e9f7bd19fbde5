#!/usr/bin/env bash
# Issues 16 and 19 on the GPU after sampling stopped synchronizing the stream (worker/sampler.py `to_device`,
# index_fill_): the no-sync GPU test, speculative decoding's replay (acceptance 1) and random (acceptance 0)
# proposers at batch 1 and 64, and the structured-outputs overhead at batch 1 and 64 (xgrammar, pydantic from .whl);
# (the gateway's overhead ran in gpu_issue15_e.sh).
# Usage (repo root, GPU machine, carry .whl): OUT=dir bash benchmarks/gpu_issue16_19.sh
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
mkdir -p /tmp/site && python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  .whl/xgrammar-*.whl .whl/apache_tvm_ffi-*.whl .whl/pydantic-2*.whl .whl/pydantic_core-*.whl \
  .whl/annotated_types-*.whl .whl/typing_inspection-*.whl .whl/fastapi-*.whl .whl/starlette-*.whl \
  .whl/uvicorn-*.whl .whl/opentelemetry_api-*.whl > /dev/null 2>&1
timeout 60 python -m pytest -q -p no:cacheprovider tests/kernels/test_sampler_no_sync.py > "$OUT/gpu_tests.txt" 2>&1
tail -2 "$OUT/gpu_tests.txt"
timeout 260 python benchmarks/spec_decode_gpu.py --batches 1,64 --k 4 --fidelity 1,0 --trust-replay \
  --out "$OUT/spec_decode.json" > "$OUT/spec_decode.log" 2>&1
echo "spec rc=$?"; tail -5 "$OUT/spec_decode.log" | cut -c1-300
PYTHONPATH=.:/tmp/site timeout $((580 - SECONDS)) python benchmarks/structured_overhead.py \
  --model benchmarks/models/llama3-8b-structured --load-format dummy --max-tokens 256 --repeats 2 \
  --out "$OUT/structured_overhead" > "$OUT/structured.log" 2>&1
echo "structured rc=$?"; tail -8 "$OUT/structured.log" | cut -c1-300
(cd "$OUT" && tar czf logs.tgz *.log && rm -f *.log)
ls "$OUT"
