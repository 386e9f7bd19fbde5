"""compile a kernel for sm_90 with launch-like divisibility attrs; print regs/spills and load kinds"""
import os
import re
import subprocess

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

os.makedirs("/tmp/ptx", exist_ok=True)
PTXAS = triton.knobs.nvidia.ptxas.path

def compile_report(fn, types, consts, div16, warps, stages, tag=""):
    names = [p.name for p in fn.params]
    sg = {n: ("constexpr" if n in consts else types[n]) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div16}
    k = triton.compile(ASTSource(fn, sg, consts, attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps, "num_stages": stages})
    ptx = k.asm["ptx"]
    open("/tmp/ptx/k.ptx", "w").write(ptx)
    r = subprocess.run([PTXAS, "-v", "--gpu-name", "sm_90a", "/tmp/ptx/k.ptx", "-o", "/tmp/ptx/k.cubin"],
                       capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    cnt = {p: ptx.count(p) for p in ["ld.global.v4", "ld.global.nc.v4", "cp.async.cg", "cp.async.ca", "cp.async.bulk", "ld.global.b32", "ld.global.b16", "wgmma.mma_async"]}
    print(tag, f"w{warps} s{stages}", "regs", regs and regs.group(1), "spill", spill and spill.group(1), "smem", k.metadata.shared, cnt, flush=True)
    return k

def sass_loop_stats(tag):
    """disassemble /tmp/ptx/k.cubin; for each loop (a branch back to an earlier label) count its instruction kinds"""
    import collections
    nvdisasm = PTXAS.replace("ptxas", "nvdisasm")
    lines = subprocess.run([nvdisasm, "-c", "/tmp/ptx/k.cubin"], capture_output=True, text=True).stdout.splitlines()
    instrs, label_at, pending = [], {}, []
    for line in lines:
        m = re.match(r"\.L_x_(\d+):", line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                label_at[name] = addr
            pending = []
            instrs.append((addr, m.group(2).strip()))
    index = {a: i for i, (a, _) in enumerate(instrs)}
    loops = []
    for i, (a, ins) in enumerate(instrs):
        m = re.search(r"BRA.*\.L_x_(\d+)", ins)
        if m and label_at.get(m.group(1), a) < a:
            body = [x for _, x in instrs[index[label_at[m.group(1)]]:i + 1]]
            kinds = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", x).split()[0].split(".")[0] for x in body)
            loops.append((len(body), dict(kinds.most_common(14))))
    for n, kinds in loops:
        print(tag, "loop", n, "instrs", kinds)
    return loops
