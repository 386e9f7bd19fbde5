#!/usr/bin/env bash
# Issue 15 (and 21) in one call, for the next device session:
#   1. issue 21: the gateway's overhead on the device's 16 cores (no GPU; fastapi, starlette, uvicorn, pydantic and
#      opentelemetry-api from .whl: fastapi 0.165 imports opentelemetry)
#   2. GPU tests: the walk, the tensor-core small-rows kernel, the fused GEMM, sampling without stream syncs
#   3. llama3-8b's layers: every small-rows config (1/4/16 rows) and cuBLAS vs the fused GEMM (64/256/4096 rows),
#      written to tachyon/kernels/quant_tuned/<GPU>.json, which the engine then reads (the file comes back to commit)
#   4. llama3-8b fp8 `single` + `throughput`, w8a8 `single` + `throughput`, fp8 with the fp8 KV cache `throughput`
# The device tool returns at most 8 files: logs travel in logs.tgz.
# .whl (gitignored) for the device's Python 3.12, made here with:
#   pip download --python-version 3.12 --only-binary :all: --no-deps -d .whl fastapi==0.165.0 starlette==1.10.0 \
#     uvicorn==0.55.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     opentelemetry-api==1.45.3 xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 httptools==0.9.0 uvloop==0.23.0
# Usage (repo root, GPU machine, carry .whl): OUT=dir [END_S=590] bash benchmarks/gpu_issue15_e.sh
set -u
export PYTHONPATH=.
END=${END_S:-590}
. benchmarks/gpu_lib.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader  # (stdout only: 8 files come back)
install_site
gateway_overhead 80
gpu_tests 60 tests/kernels/test_scaled_linear.py tests/kernels/test_sampler_no_sync.py
tune_scaled 150 1,16,64,256,4096 1,4,16
perf_run 8b_fp8 --quantization fp8 --workloads single,throughput
perf_run 8b_w8a8 --quantization w8a8 --workloads single,throughput
perf_run 8b_fp8_kvfp8 --quantization fp8 --kv-cache-dtype fp8 --workloads throughput
pack_logs
