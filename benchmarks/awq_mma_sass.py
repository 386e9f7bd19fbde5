"""What the INT4 tensor-core kernels compile to on Hopper, without a GPU: Triton compiles for sm_90 on any machine
(its wheel carries ptxas, nvdisasm and cuobjdump), so the IR, the SASS and the register use can be read here.

    PYTHONPATH=. python benchmarks/awq_mma_sass.py [--kernel kmajor|natural|walk] [--block 128] [--rows 16]
        [--warps 4] [--stages 3] [--m1] [--direct] [--out report.json]

Prints, for one config: registers and spills (cuobjdump), shared memory, whether the weight operand goes through
shared memory after its unpacking (a `local_alloc` of it in the TTGIR: the round trip the kernels avoid), the MMA
kind, and the instruction mix of the main loop (the longest backward branch of the SASS) per weight value a thread
handles a loop iteration. --m1 compiles as the runtime does for one row (M specialized to 1). Layer sizes are
runtime arguments, so the code does not depend on them; ints are marked divisible by 16 as the runtime marks them.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.tools.disasm import get_sass

from tachyon.kernels import awq_mma

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
COMMON = {"x_ptr": "*bf16", "qw_ptr": "*i32", "qz_ptr": "*i32", "s_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16"}
DIVISIBLE = ["x_ptr", "qw_ptr", "qz_ptr", "s_ptr", "b_ptr", "out_ptr", "N", "N8", "K", "K_SPLIT", "stride_xm",
             "stride_om", "stride_os"]


def compile_kernel(kind: str, block: int, rows: int, warps: int, stages: int, m1: bool, direct: bool = False):
    """(compiled kernel, weight values a thread handles a loop iteration)."""
    if kind == "walk":
        fn = awq_mma._kmajor_walk_kernel
        sig = {**COMMON, "y_ptr": "*bf16", "cnt_ptr": "*i32",
               **{a: "i32" for a in ("N", "N8", "K", "K_SPLIT", "stride_xm", "stride_om", "stride_os", "magic")}}
        const = {"GROUP": 128, "HAS_BIAS": False, "BLOCK_N": block, "VEC": block // (32 * warps), "PDL": False}
        values = block * 128 // (32 * warps)  # a 128-row tile of BLOCK_N columns
        stages = 1
    else:
        fn = awq_mma._awq_mma_kernel if kind == "kmajor" else awq_mma._awq_mma_natural_kernel
        sig = {**COMMON, **{a: "i32" for a in ("M", "N", "N8", "K", "K_SPLIT", "stride_xm", "stride_om",
                                                "stride_os")}}
        const = {"GROUP": 128, "HAS_BIAS": False, ("BLOCK_N" if kind == "kmajor" else "BLOCK_P"): block,
                 "BLOCK_M": rows, "MAGIC": 0x4300, "OFFSET": 128, "ASM": True, "XTILE": not direct, "PDL": False}
        if direct:
            const["DIRECT"] = True
        outputs = block if kind == "kmajor" else 8 * block
        values = outputs * 128 // (32 * warps)
        if m1:
            const["M"] = 1
    for name in const:
        sig[name] = "constexpr"
    names = list(sig)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in DIVISIBLE if a in sig}
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}), values


def loop_mix(sass: str) -> collections.Counter:
    """Opcodes of the longest loop: the lines between a label and the furthest backward branch to it."""
    lines = sass.splitlines()
    labels = {ln.strip()[:-1].lstrip("."): i for i, ln in enumerate(lines) if re.match(r"^\s*\.?L\w+:\s*$", ln)}
    best = None
    for i, ln in enumerate(lines):
        m = re.search(r"BRA\s+(?:`\()?\.?(L\w+)", ln)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            if best is None or i - labels[m.group(1)] > best[1] - best[0]:
                best = (labels[m.group(1)], i)
    if best is None:
        return collections.Counter()
    ops = collections.Counter()
    for ln in lines[best[0]:best[1] + 1]:
        m = re.match(r"^\S+\t(@!?U?P\w+\s+)?([A-Z0-9_]+)", ln)
        if m:
            ops[m.group(2)] += 1
    return ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("kmajor", "natural", "walk"), default="kmajor")
    ap.add_argument("--block", type=int, default=128, help="BLOCK_N (kmajor, walk) or BLOCK_P (natural)")
    ap.add_argument("--rows", type=int, default=16, help="BLOCK_M (the MMA kernels)")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--m1", action="store_true", help="M specialized to 1, as the runtime compiles one row")
    ap.add_argument("--direct", action="store_true", help="kmajor: the DIRECT variant (a DIRECT_CONFIGS entry)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.direct and args.kernel != "kmajor":
        raise SystemExit("--direct is a variant of --kernel kmajor")
    kernel, values = compile_kernel(args.kernel, args.block, args.rows, args.warps, args.stages, args.m1,
                                    args.direct)
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    cubin = "/tmp/awq_mma_sass.cubin"
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", cubin], capture_output=True, text=True)
    res = next((ln for ln in usage.stdout.splitlines() if "REG:" in ln), "")
    ops = loop_mix(get_sass(kernel.asm["cubin"]))
    total = sum(ops.values())
    report = {
        "config": vars(args), "values_per_thread_per_iteration": values,
        "registers": int(re.search(r"REG:(\d+)", res).group(1)) if res else None,
        "spill_bytes": int(re.search(r"LOCAL:(\d+)", res).group(1)) if res else None,
        "shared_bytes": kernel.metadata.shared,
        "operand_through_shared_memory": "local_alloc %a" in ttgir,
        "mma": "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "none",
        "loop_instructions": total, "instructions_per_value": round(total / values, 2) if total else None,
        "loop_mix": dict(ops.most_common()),
    }
    print(json.dumps({k: v for k, v in report.items() if k != "loop_mix"}, indent=1))
    print("loop mix:", ", ".join(f"{k} {v}" for k, v in ops.most_common(14)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
