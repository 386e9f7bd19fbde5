"""How far each K-major config runs from each layer's best, averaged over a model's four layers, per row count,
from benchmarks/awq_mma.py results (no GPU): how MMA_CONFIGS[0], the default of untuned shapes, was chosen.

    python benchmarks/awq_mma_rank.py RESULT.json [RESULT.json ...] [--top 5]
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--top", type=int, default=5)
    args = ap.parse_args()
    for path in args.results:
        with open(path) as f:
            report = json.load(f)
        layers = {r["layer"] for r in report["results"]}
        for m in sorted({r["M"] for r in report["results"]}):
            ratios: dict[str, list[float]] = {}
            for r in report["results"]:
                if r["M"] == m:
                    timed = {c: v["ms"] for c, v in r["mma"].items() if isinstance(v, dict) and v.get("ms")}
                    for c, ms in timed.items():
                        ratios.setdefault(c, []).append(ms / min(timed.values()))
            mean = sorted((sum(v) / len(v), c) for c, v in ratios.items() if len(v) == len(layers))
            print(f"{report['gpu']} M={m}:", " | ".join(f"{c} {x:.3f}" for x, c in mean[:args.top]))


if __name__ == "__main__":
    main()
