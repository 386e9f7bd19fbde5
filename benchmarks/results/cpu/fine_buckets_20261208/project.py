"""What choose_buckets would have picked from the H100's measured cuBLAS curve (gemm_m.json: llama3-8b's linears,
384-1,152 rows every 8), and what each step size then costs against the plain grid: a projection from a measured
curve, not a run of the engine. Run from the repo root:

    python benchmarks/results/cpu/fine_buckets_20261208/project.py > benchmarks/results/cpu/fine_buckets_20261208/output.txt
"""
import json

from tachyon.worker.piecewise_graphs import choose_buckets, piecewise_buckets

curve = json.load(open("benchmarks/results/h100/session_20261207f/call2_diag_early_encode/gemm_m.json"))
cost = {r["M"]: r["step_linears_ms"] for r in curve["rows"]}
grid = piecewise_buckets(8192)
sizes, costs = choose_buckets(grid, cost.__getitem__, fine=(384, 1152, 8))


def bucket(bs, t):
    return next(s for s in bs if s >= t)


print("kept from 384 to 1152:", " ".join(f"{s}:{cost[s]:.2f}" for s in sizes if 384 <= s <= 1152))
print("grid from 384 to 1152:", " ".join(f"{s}:{cost[s]:.2f}" for s in grid if 384 <= s <= 1152))
for name, lo, hi in (("Poisson steps: a 512-token prompt + 20-60 decodes", 532, 572), ("every size 385-1152", 385, 1152)):
    g = [cost[bucket(grid, t)] for t in range(lo, hi + 1)]
    m = [cost[bucket(sizes, t)] for t in range(lo, hi + 1)]
    print(f"{name}: linears {sum(g) / len(g):.2f} ms a step on the grid, {sum(m) / len(m):.2f} on the measured "
          f"buckets ({100 * (1 - sum(m) / sum(g)):.1f}% less); worst step {max(g):.2f} -> {max(m):.2f}")
