"""Turn the JSON that benchmarks/gpu_run.py wrote on the H200 into the committed summary: ratios against
vLLM 0.26 (../shared/anchors/h200.json, copied below) and the card's ceilings, plus the sweep plot.

    python benchmarks/h200_report.py benchmarks/results/h200/llama3-8b_perf_run3.json
"""

from __future__ import annotations

import json
import os
import sys

VLLM = {  # vLLM 0.26 on the same card kind, same workloads (shared/anchors/h200.json)
    "single_decode_tok_s": 214.0, "single_ttft_s": 0.0161,
    "sweep": {"1": 212.0, "4": 799.6, "16": 2737.3, "64": 6779.0, "256": 9973.5},
    "throughput_out_tok_s": 11966.9, "random_out_tok_s": 10674.5,
    "prefix_on": {"time_to_all_first_tokens_s": 1.04, "out_tok_s": 8852.6},
    "prefix_off": {"time_to_all_first_tokens_s": 12.94, "out_tok_s": 1992.0},
}
HF_ANCHOR_SWEEP_512_128 = {"1": 35.5, "4": 59.3, "16": 200.1, "64": 860.0, "256": 2757.0}


def main(path: str) -> None:
    d = json.load(open(path))
    out_dir = os.path.dirname(path)
    rows = []
    s = d.get("single")
    if s:
        rows.append(("single decode tok/s", s["decode_tok_s"], VLLM["single_decode_tok_s"]))
        rows.append(("single TTFT ms", s["ttft_s"] * 1e3, VLLM["single_ttft_s"] * 1e3))
    for c, v in d.get("sweep", {}).items():
        rows.append((f"sweep c={c} out tok/s", v["output_tok_s"], VLLM["sweep"][c]))
    if "throughput" in d:
        rows.append(("throughput out tok/s", d["throughput"]["output_tok_s"], VLLM["throughput_out_tok_s"]))
    if "random" in d:
        rows.append(("random out tok/s", d["random"]["output_tok_s"], VLLM["random_out_tok_s"]))
    for mode in ("on", "off"):
        p = d.get("prefix", {}).get(mode)
        if p:
            v = VLLM[f"prefix_{mode}"]
            rows.append((f"prefix {mode}: all first tokens s", p["time_to_all_first_tokens_s"], v["time_to_all_first_tokens_s"]))
            rows.append((f"prefix {mode}: out tok/s", p["output_tok_s"], v["out_tok_s"]))
    lines = ["# Tachyon on one H200, llama3-8b (random bf16 weights)", "",
             f"Source: `{os.path.basename(path)}` ({d.get('command', '')}); {d['env']}", "",
             f"Copy bandwidth measured in the same run: {d['copy_bandwidth_TBps']:.3f} TB/s (read + write).", ""]
    if s:
        lines += [f"`single`: {s['decode_tok_s']:.1f} decode tok/s = {100 * s['fraction_of_ceiling']:.0f}% of the "
                  f"{s['ceiling_tok_s']:.0f} tok/s ceiling ({s['bytes_per_step_GB']:.2f} GB of weights + KV per step); "
                  f"one CUDA-graph replay alone takes {s.get('graph_replay_ms_batch1') or float('nan'):.2f} ms of the "
                  f"{s.get('step_ms') or float('nan'):.2f} ms step.", ""]
    lines += ["| metric | Tachyon | vLLM 0.26 | Tachyon / vLLM |", "|---|---|---|---|"]
    for name, ours, theirs in rows:
        better_low = "ms" in name or " s" in name
        ratio = theirs / ours if better_low else ours / theirs
        lines.append(f"| {name} | {ours:,.1f} | {theirs:,.1f} | {ratio:.2f}{' (time: vLLM/ours)' if better_low else ''} |")
    hf = d.get("hf_sweep")
    if hf and "error" not in hf:
        lines += ["", "transformers `generate` (bf16, sdpa, static batch, 512 in / 256 out), same run:", "",
                  "| concurrency | transformers out tok/s | Tachyon out tok/s | Tachyon / transformers |", "|---|---|---|---|"]
        for c, v in hf.items():
            t = d.get("sweep", {}).get(c, {}).get("output_tok_s")
            lines.append(f"| {c} | {v['output_tok_s']:.1f} | {t or float('nan'):.1f} | "
                         f"{(t / v['output_tok_s']) if t else float('nan'):.1f}x |")
    prof = d.get("profile")
    if prof and "error" not in prof:
        for name in ("decode", "prefill"):
            p = prof[name]
            lines += ["", f"Per-kernel GPU time, one eager {name} step ({p['batch']} sequences), total "
                          f"{p['total_kernel_ms']:.2f} ms:", "", "| kernel | ms | count |", "|---|---|---|"]
            lines += [f"| `{k['name'][:70]}` | {k['ms']:.3f} | {k['count']} |" for k in p["kernels"][:10]]
    md = os.path.join(out_dir, "llama3-8b_summary.md")
    with open(md, "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        cs = sorted(d.get("sweep", {}), key=int)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([int(c) for c in cs], [d["sweep"][c]["output_tok_s"] for c in cs], "o-", label="Tachyon")
        ax.plot([int(c) for c in VLLM["sweep"]], list(VLLM["sweep"].values()), "s--", label="vLLM 0.26 (anchor)")
        if hf and "error" not in hf:
            hc = sorted(hf, key=int)
            ax.plot([int(c) for c in hc], [hf[c]["output_tok_s"] for c in hc], "^:", label="transformers generate")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrent requests (512 in / 256 out)")
        ax.set_ylabel("output tok/s")
        ax.set_title("llama3-8b on one H200")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "llama3-8b_sweep.png"), dpi=120)
    except ImportError:
        pass
    print(open(md).read())


if __name__ == "__main__":
    main(sys.argv[1])
