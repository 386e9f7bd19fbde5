"""The fp8 kernels compiled for Hopper (sm_90) on the CPU, down to its machine code.

Triton's interpreter cannot load or cast float8, so the CPU suite never runs them; a kernel that does not compile
for the GPU (an int `other=` cast to float8 did: every fp8 "wo" config failed on the H100) would only show on a GPU
run. Triton's CUDA backend compiles for a named target without a GPU (its own ptxas), so here it does, in a
subprocess: the kernels tests' TRITON_INTERPRET=1 makes every @triton.jit an interpreted function."""

import json
import os
import subprocess
import sys

import pytest

COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tachyon.kernels.quant_linear import _int8_kernel

sig = {"x_ptr": "*bf16", "w_ptr": None, "s_ptr": "*fp32", "b_ptr": "*bf16", "out_ptr": "*bf16",
       "M": "i32", "N": "i32", "K": "i32", "K_SPLIT": "i32", "stride_xm": "i32", "stride_om": "i32",
       "stride_os": "i32", "HAS_BIAS": "constexpr", "IEEE": "constexpr", "BLOCK_M": "constexpr",
       "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "LATE_REDUCE": "constexpr", "PDL": "constexpr"}
result = {}
for weight, block_m in json.loads(sys.argv[1]):
    consts = {"HAS_BIAS": True, "IEEE": False, "BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_K": 128,
              "LATE_REDUCE": block_m == 1, "PDL": False}
    try:
        k = triton.compile(ASTSource(_int8_kernel, dict(sig, w_ptr=weight), consts),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
        result[f"{weight} {block_m}"] = "ok" if k.asm.get("cubin") else "no cubin"
    except Exception as e:
        result[f"{weight} {block_m}"] = f"{type(e).__name__}: {e}"[:2000]
print(json.dumps(result))
"""


def _without_interpreter(code: str, *args: str):
    """Run code in a Python without TRITON_INTERPRET (this repo first on its path); its last stdout line, as JSON."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_weight_only_kernel_compiles_for_fp8_and_int8_weights():
    # the W8A8 layers' "wo" configs: bf16 x, a float8 E4M3 or int8 weight, fp32 scales; the one-row walk (BLOCK_M 1)
    # and the tensor-core dot (16, 64)
    cases = [[w, m] for w in ("*fp8e4nv", "*i8") for m in (1, 16, 64)]
    result = _without_interpreter(COMPILE, json.dumps(cases))
    if any("ptxas" in v.lower() and "not found" in v.lower() for v in result.values()):
        pytest.skip(f"this Triton has no ptxas to compile for sm_90: {result}")
    assert result == {f"{w} {m}": "ok" for w, m in cases}


SPECIALIZED = r"""
import importlib, json, pkgutil
import triton
import tachyon.kernels as kernels
got = {}
for m in pkgutil.iter_modules(kernels.__path__):
    mod = importlib.import_module("tachyon.kernels." + m.name)
    for name, fn in vars(mod).items():
        if (isinstance(fn, triton.runtime.jit.JITFunction) and fn.__module__ == mod.__name__
                and name.endswith("_kernel")):
            got[name] = {"not_specialized": [p.name for p in fn.params if p.do_not_specialize],
                         "ints": [p.name for p in fn.params if not p.is_constexpr]}
print(json.dumps(got))
"""

# the int arguments that change from step to step: the rows of an eager or piecewise step (M; MN = M x N) and what
# follows the batch mix (the prefill kernel's first sequence and query blocks, the block table's width)
PER_STEP = {"M", "MN", "seq_start", "num_q_blocks", "stride_bt"}


def test_kernels_do_not_specialize_on_what_changes_every_step():
    # Triton compiles a variant per value class of each int argument (1, a multiple of 16, other) unless told not
    # to, and start-up compiles only the classes its warm-up meets. An eager step's block table is as wide as its
    # longest context in blocks, so specializing on its stride compiled new attention variants mid-run as contexts
    # grew; a piecewise step of 17-63 rows compiled a new _gemv_kernel (the tuner runs 32 and 64 rows, multiples
    # of 16), which stalled an H100 serve run's step for 255 ms (session 2026-12-07e)
    got = _without_interpreter(SPECIALIZED)
    off = {name: k["not_specialized"] for name, k in got.items()}
    assert off["_decode_split_kernel"] == ["stride_bt"]
    assert off["_prefill_kernel"] == ["seq_start", "num_q_blocks", "stride_bt"]
    for name in ["_gemv_kernel", "_int8_kernel", "_awq_kernel", "_awq_gemv_rows_kernel", "_awq_mma_kernel",
                 "_awq_mma_natural_kernel", "_w8a8_dot_kernel", "_int_epilogue_kernel", "_w8a8_gemm_kernel"]:
        assert off[name] == ["M"], name
    assert off["_sum_splits_kernel"] == ["MN"]
    left = {name: sorted(set(k["ints"]) & PER_STEP - set(k["not_specialized"])) for name, k in got.items()}
    assert not {name: v for name, v in left.items() if v}, "kernels that specialize on a per-step argument"
